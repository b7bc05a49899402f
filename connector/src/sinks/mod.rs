//! Sinks that work with either backend: files on object storage and PostgreSQL tables
//! (each its own transactional participant), and a print sink.

mod file;
pub mod postgres;
mod print;

pub use file::{FileCommitter, FileSink};
pub use print::PrintSink;
