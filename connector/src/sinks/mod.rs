//! Sinks that work with either backend: files on object storage and PostgreSQL tables
//! and Parquet or Delta tables on object storage (each its own transactional
//! participant), and a print sink. The PostgreSQL sink needs the `postgres` feature, the
//! table sink the `tables` feature (decision 0046).

mod file;
#[cfg(feature = "postgres")]
pub mod postgres;
mod print;
#[cfg(feature = "tables")]
pub mod table;

pub use file::{FileCommitter, FileSink};
pub use print::PrintSink;
