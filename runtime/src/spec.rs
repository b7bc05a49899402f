//! The job graph as data: nodes (sources and operators, with their factories), edges
//! and participants. The builder (`graph.rs`) fills it; the job (`job.rs`) runs it.
//! Neither depends on the other through it.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;

use crate::error::RuntimeError;
use crate::operator::{Operator, Participant, Source, SubtaskContext};
use crate::partition::Partitioning;

/// Makes one source subtask per call.
pub type SourceFactory = Arc<dyn Fn(&SubtaskContext) -> Box<dyn Source> + Send + Sync>;
/// Makes one operator subtask per call.
pub type OperatorFactory = Arc<dyn Fn(&SubtaskContext) -> Box<dyn Operator> + Send + Sync>;

#[derive(Clone)]
pub(crate) enum NodeKind {
    Source(SourceFactory),
    Operator(OperatorFactory),
}

#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) kind: NodeKind,
    pub(crate) parallelism: Option<u32>,
    pub(crate) schema: Option<SchemaRef>,
    /// Its state items are keyed ([`crate::keyed::KeyedItem`]): on restore each goes
    /// to every subtask whose key groups it covers, not round-robin.
    pub(crate) keyed_state: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Edge {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) partitioning: Option<Partitioning>,
    /// Which input of `to` this edge is (0 for the first).
    pub(crate) input: usize,
}

#[derive(Default)]
pub(crate) struct GraphSpec {
    pub(crate) nodes: Vec<Node>,
    pub(crate) edges: Vec<Edge>,
    pub(crate) participants: Vec<Participant>,
    pub(crate) errors: Vec<RuntimeError>,
    /// The stateful SQL operators by name, with their late-row counters.
    pub(crate) stateful: Vec<(String, Arc<crate::sql::LateRows>)>,
    /// Where records the job cannot process go, if anywhere.
    pub(crate) dead_letters: Option<crate::DeadLetters>,
}
