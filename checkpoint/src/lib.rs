//! # shareflow-checkpoint
//!
//! Durable bytes for shareflow. Every file the project writes to object storage (the
//! broker journal, checkpoint state, manifests) is wrapped in one versioned
//! [`envelope`]: magic bytes, format version, payload length and a CRC-32C checksum,
//! followed by the payload (postcard for structs, Arrow IPC for batches).
//!
//! The envelope is the only thing that decides whether bytes read back from storage are
//! trustworthy. A decode never panics, whatever the input; it returns a
//! [`EnvelopeError`] that says which check failed.
//!
//! ```
//! use shareflow_checkpoint::envelope::{self, Magic};
//!
//! const STATE: Magic = Magic(*b"SFST");
//! let bytes = envelope::encode(STATE, 1, b"payload");
//! let decoded = envelope::decode(STATE, 1, &bytes).unwrap();
//! assert_eq!(decoded, b"payload");
//! ```

pub mod envelope;

pub use envelope::EnvelopeError;
