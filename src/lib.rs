#![doc = include_str!("../README.md")]
//!
//! ## Crates
//!
//! - [`connector`]: the share-group contract, the embedded broker, sources and sinks;
//! - [`runtime`]: the dataflow runtime;
//! - [`checkpoint`]: checkpoint storage and its durable format;
//! - [`prometheus`]: a metrics endpoint for a job, its sources and the embedded broker;
//! - [`dashboard`]: a job's web dashboard and its JSON endpoints, on that endpoint;
//! - [`control`]: savepoints and stops of a running job, on that endpoint.

#![forbid(missing_docs)]

pub mod control;
pub mod dashboard;
pub mod prometheus;

// The Rust examples of the documents under docs/ run as doctests, as the README's do.
#[cfg(doctest)]
#[doc = include_str!("../docs/guarantees.md")]
mod guarantees_doctests {}

#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
mod operations_doctests {}

pub use shareflow_checkpoint as checkpoint;
pub use shareflow_connector as connector;
pub use shareflow_runtime as runtime;
