//! Sinks that work with either backend: files on object storage (their own
//! transactional participant) and a print sink.

mod file;
mod print;

pub use file::{FileCommitter, FileSink};
pub use print::PrintSink;
