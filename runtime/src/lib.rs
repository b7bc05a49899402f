//! # shareflow-runtime
//!
//! The dataflow runtime: graphs of operators exchanging Arrow batches, checkpoint
//! barriers, the checkpoint coordinator and two-phase-commit sinks. Under construction;
//! it builds on [`shareflow_checkpoint`].

pub use shareflow_checkpoint as checkpoint;
