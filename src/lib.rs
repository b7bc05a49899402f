//! # shareflow
//!
//! A Flink-style streaming runtime whose sources read Kafka share groups and commit
//! their acknowledgements together with the sink output, once per checkpoint, in one
//! transaction `{groupId}-{prefix}-{checkpointId}` (KIP-1289).
//!
//! This crate re-exports the three parts:
//! - [`connector`]: the share-group contract, the embedded broker, sources and sinks;
//! - [`runtime`]: the dataflow runtime;
//! - [`checkpoint`]: checkpoint storage and its durable format.

pub use shareflow_checkpoint as checkpoint;
pub use shareflow_connector as connector;
pub use shareflow_runtime as runtime;
