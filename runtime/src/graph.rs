//! The job graph and its fluent builder.
//!
//! ```text
//! source -> .sql("SELECT ...") / .map(..) / .filter(..) / .key_by(..) -> sink
//! ```

use std::sync::{Arc, Mutex};

use arrow::array::BooleanArray;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;

use crate::channel::Collector;
use crate::config::JobConfig;
use crate::error::{Result, RuntimeError};
use crate::job::Job;
use crate::operator::{Operator, Participant, Source, SubtaskContext};
use crate::partition::Partitioning;
use crate::spec::{Edge, GraphSpec, Node, NodeKind, OperatorFactory, SourceFactory};
use crate::sql::{AggregateOperator, KeyStage, LateRows, QueryPlan, SqlOptions};

/// Builds a job graph. Clone-free fluent API: each call returns a [`Stream`].
///
/// Errors in the chain (an unknown column in `.sql`, a bad name) are collected and
/// returned by [`build`](Self::build), so the chain reads straight through.
#[derive(Clone, Default)]
pub struct JobBuilder {
    spec: Arc<Mutex<GraphSpec>>,
}

/// The output of an operator, to which more operators attach.
#[derive(Clone)]
pub struct Stream {
    builder: JobBuilder,
    node: usize,
    next_partitioning: Option<Partitioning>,
}

impl JobBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut GraphSpec) -> T) -> T {
        f(&mut shareflow_checkpoint::sync::lock(&self.spec))
    }

    fn add(&self, name: &str, kind: NodeKind, schema: Option<SchemaRef>) -> usize {
        self.with(|g| {
            if let Err(e) = shareflow_checkpoint::CheckpointPaths::state_file_name(name, 0) {
                g.errors.push(RuntimeError::InvalidGraph(format!("operator name: {e}")));
            }
            if g.nodes.iter().any(|n| n.name == name) {
                g.errors.push(RuntimeError::InvalidGraph(format!(
                    "two operators are named {name:?}; names must be unique"
                )));
            }
            g.nodes.push(Node { name: name.to_string(), kind, parallelism: None, schema, keyed_state: false });
            g.nodes.len() - 1
        })
    }

    /// Adds a source whose batches have `schema`.
    pub fn source<S, F>(&self, name: &str, schema: SchemaRef, factory: F) -> Stream
    where
        S: Source,
        F: Fn(&SubtaskContext) -> S + Send + Sync + 'static,
    {
        let factory: SourceFactory = Arc::new(move |ctx| Box::new(factory(ctx)) as Box<dyn Source>);
        let node = self.add(name, NodeKind::Source(factory), Some(schema));
        Stream { builder: self.clone(), node, next_partitioning: None }
    }

    /// Registers a job-level transactional participant (a sink's committer, a source's
    /// acknowledgement coordinator). Every checkpoint commits all of them together.
    pub fn participant(&self, participant: Participant) -> &Self {
        self.with(|g| g.participants.push(participant));
        self
    }

    /// Sends the records the job cannot process to `writer` (a backend's dead-letter
    /// topic, written in each checkpoint's transaction) instead of failing the attempt:
    /// rows a SQL transform fails on, and whatever a source or sink dead-letters through
    /// its [`SubtaskContext::dead_letters`]. Decision 0040.
    pub fn dead_letters(&self, writer: Arc<dyn crate::DeadLetterWriter>) -> &Self {
        self.with(|g| g.dead_letters = Some(crate::DeadLetters::new(writer)));
        self
    }

    /// Validates the graph and the configuration.
    pub fn build(&self, config: JobConfig) -> Result<Job> {
        config.validate()?;
        let spec = self.with(|g| GraphSpec {
            nodes: g.nodes.clone(),
            edges: g.edges.clone(),
            participants: g.participants.clone(),
            errors: std::mem::take(&mut g.errors),
            stateful: g.stateful.clone(),
            dead_letters: g.dead_letters.clone(),
        });
        if let Some(e) = spec.errors.into_iter().next() {
            return Err(e);
        }
        if !spec.nodes.iter().any(|n| matches!(n.kind, NodeKind::Source(_))) {
            return Err(RuntimeError::InvalidGraph("a job needs at least one source".into()));
        }
        for (i, n) in spec.nodes.iter().enumerate() {
            let has_input = spec.edges.iter().any(|e| e.to == i);
            if matches!(n.kind, NodeKind::Operator(_)) && !has_input {
                return Err(RuntimeError::InvalidGraph(format!("operator {} has no input", n.name)));
            }
            if n.parallelism == Some(0) {
                return Err(RuntimeError::InvalidGraph(format!("operator {} has parallelism 0", n.name)));
            }
        }
        Job::new(
            GraphSpec {
                nodes: spec.nodes,
                edges: spec.edges,
                participants: spec.participants,
                errors: Vec::new(),
                stateful: spec.stateful,
                dead_letters: spec.dead_letters,
            },
            config,
        )
    }
}

impl Stream {
    /// The schema of this stream, when known.
    pub fn schema(&self) -> Option<SchemaRef> {
        self.builder.with(|g| g.nodes[self.node].schema.clone())
    }

    /// Sets the parallelism of the operator that produces this stream.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.builder.with(|g| g.nodes[self.node].parallelism = Some(parallelism));
        self
    }

    /// Marks the operator that produces this stream as keeping keyed state: every state
    /// item it returns is a [`KeyedItem`](crate::KeyedItem), and a restore gives each
    /// item to every subtask whose key groups it covers (at any parallelism), rather
    /// than dealing items round-robin.
    pub fn keyed_state(self) -> Self {
        self.builder.with(|g| g.nodes[self.node].keyed_state = true);
        self
    }

    /// Partitions the next edge by the hash of `column`.
    pub fn key_by(mut self, column: &str) -> Self {
        if let Some(schema) = self.schema() {
            if schema.index_of(column).is_err() {
                self.builder.with(|g| {
                    g.errors.push(RuntimeError::InvalidGraph(format!(
                        "key_by: column {column:?} is not in the schema {schema:?}"
                    )))
                });
            }
        }
        self.next_partitioning = Some(Partitioning::Hash(column.to_string()));
        self
    }

    /// Deals whole batches round-robin over the next operator's subtasks.
    pub fn rebalance(mut self) -> Self {
        self.next_partitioning = Some(Partitioning::RoundRobin);
        self
    }

    /// Adds an operator with this stream as its only input.
    pub fn operator<O, F>(self, name: &str, schema: Option<SchemaRef>, factory: F) -> Stream
    where
        O: Operator,
        F: Fn(&SubtaskContext) -> O + Send + Sync + 'static,
    {
        let input = (self.node, self.next_partitioning);
        add_operator(self.builder, &[input], name, schema, factory)
    }

    /// Adds an operator with two inputs: this stream (input 0) and `other` (input 1).
    /// Barriers are aligned across both.
    pub fn connect<O, F>(self, other: Stream, name: &str, schema: Option<SchemaRef>, factory: F) -> Stream
    where
        O: Operator,
        F: Fn(&SubtaskContext) -> O + Send + Sync + 'static,
    {
        let inputs = [(self.node, self.next_partitioning), (other.node, other.next_partitioning)];
        add_operator(self.builder, &inputs, name, schema, factory)
    }

    /// Merges this stream and `other` (same schema) into one.
    pub fn union(self, other: Stream, name: &str) -> Stream {
        let schema = self.schema();
        self.connect(other, name, schema, |_| Union)
    }

    /// Keeps the rows for which `predicate` is true.
    pub fn filter<F>(self, name: &str, predicate: F) -> Stream
    where
        F: Fn(&RecordBatch) -> Result<BooleanArray> + Send + Sync + 'static,
    {
        let schema = self.schema();
        let predicate = Arc::new(predicate);
        self.operator(name, schema, move |ctx| Filter { predicate: predicate.clone(), task: ctx.task_name() })
    }

    /// Transforms each batch, keeping the schema.
    pub fn map<F>(self, name: &str, f: F) -> Stream
    where
        F: Fn(RecordBatch) -> Result<RecordBatch> + Send + Sync + 'static,
    {
        let schema = self.schema();
        self.map_to(name, schema, f)
    }

    /// Transforms each batch into `schema` (`None`: unknown, so no `.sql` after it).
    pub fn map_to<F>(self, name: &str, schema: Option<SchemaRef>, f: F) -> Stream
    where
        F: Fn(RecordBatch) -> Result<RecordBatch> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.operator(name, schema, move |_| Map { f: f.clone() })
    }

    /// A SQL transformation, planned once now against this stream's schema. The input
    /// table is called `input`. A stateless query runs on each batch; one with `GROUP
    /// BY` or aggregates keeps keyed state in the checkpoints ([`sql_with`](Self::sql_with),
    /// docs/sql.md), with the default [`SqlOptions`].
    pub fn sql(self, name: &str, query: &str) -> Stream {
        self.sql_with(name, query, SqlOptions::default())
    }

    /// [`sql`](Self::sql) with options. A stateful query becomes two operators: `name`
    /// (the aggregate, whose parallelism `.parallelism` sets, with keyed state) fed by
    /// `{name}-keys` (the group keys, event time and arguments, at the default
    /// parallelism), exchanged by the hash of the group keys.
    pub fn sql_with(self, name: &str, query: &str, options: SqlOptions) -> Stream {
        let Some(schema) = self.schema() else {
            self.builder.with(|g| {
                g.errors.push(RuntimeError::Sql {
                    query: query.to_string(),
                    message: "the input schema is unknown (after map_to without a schema)".into(),
                })
            });
            return self.operator(name, None, |_| Map { f: Arc::new(Ok) });
        };
        match crate::sql::plan_query(query, schema, options) {
            Ok(QueryPlan::Stateless(plan)) => {
                let plan = Arc::new(plan);
                let out = plan.output_schema();
                self.operator(name, Some(out), move |ctx| crate::sql::SqlOperator::new(plan.clone(), ctx))
            }
            Ok(QueryPlan::Stateful(plan)) => {
                let plan = Arc::new(plan);
                let late = Arc::new(LateRows::default());
                self.builder.with(|g| g.stateful.push((name.to_string(), late.clone())));
                let keys_plan = plan.clone();
                // The key stage runs beside its input, subtask for subtask, so that each
                // upstream subtask's event time makes a watermark of its own.
                let upstream = self.builder.with(|g| g.nodes[self.node].parallelism);
                let mut keys = self.operator(&format!("{name}-keys"), Some(plan.exchange.clone()), move |ctx| {
                    KeyStage::new(keys_plan.clone(), ctx)
                });
                if let Some(p) = upstream {
                    keys = keys.parallelism(p);
                }
                keys.next_partitioning = Some(Partitioning::Keys(plan.key_columns()));
                let out = plan.output_schema();
                keys.operator(name, Some(out), move |ctx| {
                    StatefulOrFailed::new(AggregateOperator::new(plan.clone(), ctx, late.clone()))
                })
                .keyed_state()
            }
            Err(e) => {
                self.builder.with(|g| g.errors.push(e));
                self.operator(name, None, |_| Map { f: Arc::new(Ok) })
            }
        }
    }

    /// Ends the stream in a sink (an operator that emits nothing). The returned stream
    /// only serves to set the sink's parallelism.
    pub fn sink<O, F>(self, name: &str, factory: F) -> Stream
    where
        O: Operator,
        F: Fn(&SubtaskContext) -> O + Send + Sync + 'static,
    {
        self.operator(name, None, factory)
    }

    /// Registers a job-level transactional participant (see [`JobBuilder::participant`]).
    pub fn participant(self, participant: Participant) -> Self {
        self.builder.participant(participant);
        self
    }
}

/// Adds an operator fed by `inputs` (upstream node, partitioning), in input order.
fn add_operator<O, F>(
    builder: JobBuilder,
    inputs: &[(usize, Option<Partitioning>)],
    name: &str,
    schema: Option<SchemaRef>,
    factory: F,
) -> Stream
where
    O: Operator,
    F: Fn(&SubtaskContext) -> O + Send + Sync + 'static,
{
    let factory: OperatorFactory = Arc::new(move |ctx| Box::new(factory(ctx)) as Box<dyn Operator>);
    let node = builder.add(name, NodeKind::Operator(factory), schema);
    builder.with(|g| {
        for (input, (from, partitioning)) in inputs.iter().enumerate() {
            g.edges.push(Edge { from: *from, to: node, partitioning: partitioning.clone(), input });
        }
    });
    Stream { builder, node, next_partitioning: None }
}

/// An aggregate operator, or the error that making it gave (reported at `open`).
enum StatefulOrFailed {
    Ready(Box<AggregateOperator>),
    Failed(RuntimeError),
}

impl StatefulOrFailed {
    fn new(made: Result<AggregateOperator>) -> Self {
        match made {
            Ok(op) => Self::Ready(Box::new(op)),
            Err(e) => Self::Failed(e),
        }
    }

    fn ready(&mut self) -> Result<&mut AggregateOperator> {
        match self {
            Self::Ready(op) => Ok(op),
            Self::Failed(e) => Err(RuntimeError::Internal(e.to_string())),
        }
    }
}

#[async_trait]
impl Operator for StatefulOrFailed {
    async fn open(&mut self, ctx: &SubtaskContext, restored: crate::StateItems) -> Result<()> {
        self.ready()?.open(ctx, restored).await
    }

    async fn process_batch(&mut self, batch: RecordBatch, input: usize, out: &mut Collector) -> Result<()> {
        self.ready()?.process_batch(batch, input, out).await
    }

    async fn on_watermark(&mut self, watermark: i64) -> Result<()> {
        self.ready()?.on_watermark(watermark).await
    }

    async fn snapshot_state(
        &mut self,
        checkpoint_id: crate::CheckpointId,
        out: &mut Collector,
    ) -> Result<crate::StateItems> {
        self.ready()?.snapshot_state(checkpoint_id, out).await
    }
}

struct Union;

#[async_trait]
impl Operator for Union {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        out.emit(batch).await
    }
}

type Predicate = Arc<dyn Fn(&RecordBatch) -> Result<BooleanArray> + Send + Sync>;

struct Filter {
    predicate: Predicate,
    task: String,
}

#[async_trait]
impl Operator for Filter {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let keep = (self.predicate)(&batch)?;
        let filtered =
            arrow::compute::filter_record_batch(&batch, &keep).map_err(|e| RuntimeError::arrow(&self.task, e))?;
        out.emit(filtered).await
    }
}

type MapFn = Arc<dyn Fn(RecordBatch) -> Result<RecordBatch> + Send + Sync>;

struct Map {
    f: MapFn,
}

#[async_trait]
impl Operator for Map {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        out.emit((self.f)(batch)?).await
    }
}
