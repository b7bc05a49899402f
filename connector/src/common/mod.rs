//! What both backends share: the row schema and its conversions, the failpoint names,
//! the source settings and metrics, the offset-range set, and small helpers. Nothing in
//! here knows which broker it talks to; `embedded/` and `kafka/` never import each
//! other, only this.

pub mod points;
pub(crate) mod ranges;
mod rows;
mod settings;
pub(crate) mod sync;

pub(crate) use rows::key_values;
pub use rows::{record_schema, records_to_batch};
pub(crate) use settings::RateLimit;
pub use settings::{Decoder, SourceMetrics, SourceSettings, DEFAULT_MAX_POLL_RECORDS, DEFAULT_POLL_TIMEOUT};
