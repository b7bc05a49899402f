//! What both backends share: the row schema and its conversions, the failpoint names,
//! the source settings and metrics, the offset-range set, and small helpers. Nothing in
//! here knows which broker it talks to; `embedded/` and `kafka/` never import each
//! other, only this.

pub(crate) mod ranges;
