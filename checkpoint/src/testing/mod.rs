//! Test helpers behind the `testing` feature: the fault-injecting store and the
//! storage conformance suite.

pub mod conformance;
mod fault;

pub use fault::{Fault, FaultRule, FaultyStore, StoreOp};
