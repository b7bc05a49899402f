//! Test helpers behind the `testing` feature: a replayable source and an in-memory
//! two-phase-commit sink whose committed output is the ground truth of a test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use arrow::array::{BinaryArray, Int32Array, Int64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use bytes::Bytes;
use shareflow_checkpoint::{CheckpointId, TransactionId};

use crate::channel::Collector;
use crate::error::{Result, RuntimeError};
use crate::operator::{
    Operator, Participant, PendingTransaction, PrepareOutcome, Source, SourceEvent, StateItems, SubtaskContext,
    TransactionParticipant, TransactionTemplate,
};

/// A bounded, replayable source: `splits` sequences of `rows_per_split` rows each.
/// Its state is the next offset of each split, so it restores at any parallelism.
#[derive(Debug)]
pub struct SequenceSource {
    splits: u32,
    rows_per_split: u64,
    batch_size: usize,
    value_len: usize,
    /// (split, next offset)
    owned: Vec<(u32, u64)>,
    cursor: usize,
    task: String,
    delay: std::time::Duration,
}

impl SequenceSource {
    /// Columns: `split: Int32`, `offset: Int64`, `value: Binary`.
    pub fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("split", DataType::Int32, false),
            Field::new("offset", DataType::Int64, false),
            Field::new("value", DataType::Binary, false),
        ]))
    }

    /// A factory for the builder, with 16-byte values.
    pub fn factory(
        splits: u32,
        rows_per_split: u64,
        batch_size: usize,
    ) -> impl Fn(&SubtaskContext) -> SequenceSource + Send + Sync {
        Self::factory_with_values(splits, rows_per_split, batch_size, 16)
    }

    /// A factory whose subtasks wait `delay` (tokio time) before each batch, so a test
    /// on a paused clock sees time pass and periodic checkpoints happen.
    pub fn factory_throttled(
        splits: u32,
        rows_per_split: u64,
        batch_size: usize,
        delay: std::time::Duration,
    ) -> impl Fn(&SubtaskContext) -> SequenceSource + Send + Sync {
        let inner = Self::factory(splits, rows_per_split, batch_size);
        move |ctx| SequenceSource { delay, ..inner(ctx) }
    }

    /// A factory with `value_len`-byte values.
    pub fn factory_with_values(
        splits: u32,
        rows_per_split: u64,
        batch_size: usize,
        value_len: usize,
    ) -> impl Fn(&SubtaskContext) -> SequenceSource + Send + Sync {
        move |ctx| SequenceSource {
            delay: std::time::Duration::ZERO,
            splits,
            rows_per_split,
            batch_size: batch_size.max(1),
            value_len,
            owned: Vec::new(),
            cursor: 0,
            task: ctx.task_name(),
        }
    }

    fn batch(&self, split: u32, from: u64, n: usize) -> Result<RecordBatch> {
        let mut values = Vec::with_capacity(n * self.value_len);
        let mut offsets = Vec::with_capacity(n);
        for o in from..from + n as u64 {
            offsets.push(o as i64);
            let tag = format!("{split}:{o}:");
            let mut v = tag.into_bytes();
            v.resize(self.value_len.max(v.len()), b'x');
            values.push(v);
        }
        let values = BinaryArray::from_iter_values(values.iter());
        RecordBatch::try_new(
            Self::schema(),
            vec![
                Arc::new(Int32Array::from(vec![split as i32; n])),
                Arc::new(Int64Array::from(offsets)),
                Arc::new(values),
            ],
        )
        .map_err(|e| RuntimeError::arrow(&self.task, e))
    }
}

#[async_trait]
impl Source for SequenceSource {
    async fn open(&mut self, ctx: &SubtaskContext, restored: StateItems) -> Result<()> {
        self.owned = if restored.is_empty() {
            (0..self.splits).filter(|s| s % ctx.parallelism == ctx.subtask).map(|s| (s, 0)).collect()
        } else {
            restored
                .iter()
                .map(|b| postcard::from_bytes::<(u32, u64)>(b))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| {
                    RuntimeError::task_message(&self.task, crate::ErrorKind::Data, format!("bad split state: {e}"))
                })?
        };
        Ok(())
    }

    async fn poll_next(&mut self, _checkpoint_id: CheckpointId) -> Result<SourceEvent> {
        for _ in 0..self.owned.len() {
            let i = self.cursor % self.owned.len();
            self.cursor = self.cursor.wrapping_add(1);
            let (split, next) = self.owned[i];
            if next < self.rows_per_split {
                if !self.delay.is_zero() {
                    tokio::time::sleep(self.delay).await;
                }
                let n = (self.rows_per_split - next).min(self.batch_size as u64) as usize;
                let batch = self.batch(split, next, n)?;
                self.owned[i].1 += n as u64;
                return Ok(SourceEvent::Batch(batch));
            }
        }
        Ok(SourceEvent::Finished)
    }

    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId) -> Result<StateItems> {
        self.owned
            .iter()
            .map(|s| postcard::to_allocvec(s).map(Bytes::from))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| RuntimeError::Internal(format!("cannot encode split state: {e}")))
    }
}

#[derive(Debug, Default)]
struct CollectState {
    staged: BTreeMap<TransactionId, Vec<RecordBatch>>,
    prepared: BTreeSet<TransactionId>,
    decided: BTreeMap<TransactionId, bool>,
    committed: Vec<RecordBatch>,
}

/// An in-memory transactional sink: output staged per transaction, visible in
/// [`committed`](Self::committed) only after its transaction commits. It stands for an
/// external system, so it survives job restarts.
#[derive(Debug, Clone, Default)]
pub struct CollectSink {
    state: Arc<Mutex<CollectState>>,
}

impl CollectSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CollectState> {
        shareflow_checkpoint::sync::lock(&self.state)
    }

    /// A factory for the builder.
    pub fn factory(&self) -> impl Fn(&SubtaskContext) -> CollectSinkOperator + Send + Sync {
        let sink = self.clone();
        move |ctx| CollectSinkOperator { sink: sink.clone(), template: ctx.transactions.clone() }
    }

    /// The participant to register with the job.
    pub fn participant(&self) -> Participant {
        Arc::new(self.clone())
    }

    /// Committed batches, in commit order.
    pub fn committed(&self) -> Vec<RecordBatch> {
        self.lock().committed.clone()
    }

    /// Rows committed.
    pub fn committed_rows(&self) -> usize {
        self.lock().committed.iter().map(RecordBatch::num_rows).sum()
    }

    /// Every committed row rendered as text, sorted: order-free comparison of outputs.
    pub fn committed_sorted(&self) -> Vec<String> {
        let mut rows = Vec::new();
        for batch in self.committed() {
            let options = FormatOptions::default();
            let formatters: Vec<_> =
                batch.columns().iter().filter_map(|c| ArrayFormatter::try_new(c.as_ref(), &options).ok()).collect();
            for r in 0..batch.num_rows() {
                rows.push(formatters.iter().map(|f| f.value(r).to_string()).collect::<Vec<_>>().join("|"));
            }
        }
        rows.sort();
        rows
    }

    /// Transactions not decided yet.
    pub fn undecided(&self) -> usize {
        let s = self.lock();
        s.staged.keys().filter(|k| !s.decided.contains_key(*k)).count()
    }
}

#[async_trait]
impl TransactionParticipant for CollectSink {
    fn name(&self) -> &str {
        "collect-sink"
    }

    /// The same collected state: the sink's transactions are keyed by id, so another
    /// instance's are decided through the same store.
    fn adopter(&self) -> Option<Participant> {
        Some(self.participant())
    }

    async fn begin(&self, txn: &TransactionId) -> Result<()> {
        let mut s = self.lock();
        if s.decided.contains_key(txn) {
            return Err(RuntimeError::Internal(format!("begin of decided transaction {txn}")));
        }
        s.staged.entry(txn.clone()).or_default();
        Ok(())
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        let mut s = self.lock();
        match s.decided.get(txn) {
            Some(false) => Ok(PrepareOutcome::AlreadyAborted),
            Some(true) => Ok(PrepareOutcome::Prepared),
            None => {
                s.prepared.insert(txn.clone());
                Ok(PrepareOutcome::Prepared)
            }
        }
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        let mut s = self.lock();
        match s.decided.get(txn) {
            Some(true) => return Ok(()),
            Some(false) => return Err(RuntimeError::Internal(format!("commit of aborted transaction {txn}"))),
            None => {}
        }
        if !s.prepared.contains(txn) {
            return Err(RuntimeError::Internal(format!("commit of {txn}, which is not prepared")));
        }
        let batches = s.staged.remove(txn).unwrap_or_default();
        s.committed.extend(batches);
        s.decided.insert(txn.clone(), true);
        Ok(())
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        let mut s = self.lock();
        if s.decided.contains_key(txn) {
            return Ok(());
        }
        s.staged.remove(txn);
        s.decided.insert(txn.clone(), false);
        Ok(())
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        let s = self.lock();
        Ok(s.staged
            .keys()
            .filter(|id| {
                id.group_id() == template.group_id() && id.prefix() == template.prefix() && !s.decided.contains_key(*id)
            })
            .map(|id| PendingTransaction { id: id.clone(), prepared: s.prepared.contains(id) })
            .collect())
    }
}

/// A subtask of [`CollectSink`].
#[derive(Debug)]
pub struct CollectSinkOperator {
    sink: CollectSink,
    template: TransactionTemplate,
}

#[async_trait]
impl Operator for CollectSinkOperator {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let txn = self.template.transaction(out.checkpoint_id());
        let mut s = self.sink.lock();
        if s.decided.contains_key(&txn) {
            return Err(RuntimeError::Internal(format!("write into decided transaction {txn}")));
        }
        s.staged.entry(txn).or_default().push(batch);
        Ok(())
    }

    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        Ok(Vec::new())
    }
}
