//! What both backends share: the row schema and its conversions, the failpoint names,
//! the source settings and metrics, and small helpers (the offset-range set and the
//! error type live in `shareflow-share`, below both). Nothing in
//! here knows which broker it talks to; `embedded/` and `kafka/` never import each
//! other, only this.

pub mod dead_letters;
pub mod points;
mod rows;
mod runtime_error;
mod settings;

pub(crate) use rows::key_values;
pub use rows::{record_schema, records_to_batch};
pub(crate) use runtime_error::runtime_error;
pub(crate) use settings::RateLimit;
pub use settings::{Decoder, SourceMetrics, SourceSettings, DEFAULT_MAX_POLL_RECORDS, DEFAULT_POLL_TIMEOUT};
