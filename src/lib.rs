#![doc = include_str!("../README.md")]
//!
//! ## Crates
//!
//! - [`connector`]: the share-group contract, the embedded broker, sources and sinks;
//! - [`runtime`]: the dataflow runtime;
//! - [`checkpoint`]: checkpoint storage and its durable format.

pub use shareflow_checkpoint as checkpoint;
pub use shareflow_connector as connector;
pub use shareflow_runtime as runtime;
