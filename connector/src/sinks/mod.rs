//! Sinks that work with either backend: files on object storage and PostgreSQL tables
//! and Parquet or Delta tables on object storage (each its own transactional
//! participant), and a print sink.

mod file;
pub mod postgres;
mod print;
pub mod table;

pub use file::{FileCommitter, FileSink};
pub use print::PrintSink;
