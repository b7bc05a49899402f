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

/// The job graph as it runs, for a dashboard: each node with its subtasks, each edge
/// with how it partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobGraph {
    /// Sources and operators, in the order they were added.
    pub nodes: Vec<GraphNode>,
    /// Edges, by node index.
    pub edges: Vec<GraphEdge>,
}

/// One node of a [`JobGraph`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNode {
    /// Its name (the operator label of its metrics).
    pub name: String,
    /// Whether it is a source.
    pub source: bool,
    /// Its subtasks.
    pub parallelism: u32,
    /// Whether its state is keyed.
    pub keyed_state: bool,
}

/// One edge of a [`JobGraph`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphEdge {
    /// Index of the upstream node.
    pub from: usize,
    /// Index of the downstream node.
    pub to: usize,
    /// How rows are spread: `forward`, `round-robin`, or `hash(cols)`.
    pub partitioning: String,
}

impl GraphSpec {
    /// The graph as it runs, with each node's `parallelism` and each edge's
    /// `partitioning` as the job resolved them.
    pub(crate) fn graph(&self, parallelism: &[u32], partitioning: &[Partitioning]) -> JobGraph {
        JobGraph {
            nodes: self
                .nodes
                .iter()
                .zip(parallelism)
                .map(|(n, &p)| GraphNode {
                    name: n.name.clone(),
                    source: matches!(n.kind, NodeKind::Source(_)),
                    parallelism: p,
                    keyed_state: n.keyed_state,
                })
                .collect(),
            edges: self
                .edges
                .iter()
                .zip(partitioning)
                .map(|(e, p)| GraphEdge {
                    from: e.from,
                    to: e.to,
                    partitioning: match p {
                        Partitioning::Forward => "forward".into(),
                        Partitioning::RoundRobin => "round-robin".into(),
                        Partitioning::Hash(c) => format!("hash({c})"),
                        Partitioning::Keys(c) => format!("hash({})", c.join(", ")),
                    },
                })
                .collect(),
        }
    }
}
