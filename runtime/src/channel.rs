//! What flows between subtasks, and the [`Collector`] through which an operator emits:
//! batches, barriers and end-of-stream on bounded channels, partitioned per edge.

use std::sync::Arc;
use std::time::Instant;

use arrow::record_batch::RecordBatch;
use shareflow_checkpoint::CheckpointId;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::error::{Result, RuntimeError};
use crate::metrics::OperatorMetrics;
use crate::partition::{split_by_hash, Partitioning};

/// A checkpoint barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Barrier {
    pub(crate) checkpoint_id: CheckpointId,
    /// The last checkpoint: sources end after it.
    pub(crate) is_final: bool,
    /// The final checkpoint of inputs that ended (not of a stop): event time ends
    /// here, and windowed operators emit every window.
    pub(crate) end_of_input: bool,
}

/// The watermark of an input that has had no rows yet: the minimum over the inputs is
/// then this, and the operator's watermark stays where it is.
pub(crate) const HOLD_WATERMARK: i64 = i64::MIN;

/// What flows on an edge.
#[derive(Debug, Clone)]
pub(crate) enum Message {
    Batch(RecordBatch),
    Barrier(Barrier),
    /// The sender's event-time watermark, in ms since the Unix epoch, sent before the
    /// barrier that ends a checkpoint's rows; `None`: the sender was idle in that period.
    Watermark(Option<i64>),
    End,
}

/// A message tagged with the receiving subtask's input index.
#[derive(Debug)]
pub(crate) struct Tagged {
    pub(crate) input: usize,
    pub(crate) message: Message,
}

/// One downstream connection of a subtask.
#[derive(Debug)]
pub(crate) struct OutEdge {
    pub(crate) partitioning: Partitioning,
    /// Per downstream subtask reached: its sender and this edge's input index there.
    pub(crate) targets: Vec<(mpsc::Sender<Tagged>, usize)>,
    /// Round-robin position.
    pub(crate) next: usize,
}

/// Where an operator's output goes. Sending waits when a downstream channel is full,
/// which is how backpressure reaches the sources.
#[derive(Debug)]
pub struct Collector {
    task: String,
    edges: Vec<OutEdge>,
    metrics: Arc<OperatorMetrics>,
    checkpoint_id: CheckpointId,
}

impl Collector {
    pub(crate) fn new(
        task: String,
        edges: Vec<OutEdge>,
        metrics: Arc<OperatorMetrics>,
        first_checkpoint_id: CheckpointId,
    ) -> Self {
        Self { task, edges, metrics, checkpoint_id: first_checkpoint_id }
    }

    /// The checkpoint id of the rows being processed: they arrived after barrier
    /// `checkpoint_id - 1`, so they belong to checkpoint `checkpoint_id` and their output
    /// goes into T(checkpoint_id). The runtime keeps it; an operator never counts
    /// barriers itself.
    pub fn checkpoint_id(&self) -> CheckpointId {
        self.checkpoint_id
    }

    /// The checkpoint id of the rows being processed: the old name of
    /// [`checkpoint_id`](Self::checkpoint_id).
    #[deprecated(note = "renamed checkpoint_id: the checkpoint id of the rows being processed")]
    pub fn epoch(&self) -> CheckpointId {
        self.checkpoint_id()
    }

    /// Barrier `checkpoint_id` passed: what comes next belongs to the next checkpoint.
    pub(crate) fn barrier_passed(&mut self, checkpoint_id: CheckpointId) {
        self.checkpoint_id = checkpoint_id + 1;
    }

    async fn send(task: &str, metrics: &OperatorMetrics, tx: &mpsc::Sender<Tagged>, tagged: Tagged) -> Result<()> {
        match tx.try_send(tagged) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(tagged)) => {
                let started = Instant::now();
                let sent = tx.send(tagged).await;
                metrics.add_backpressure(started.elapsed());
                sent.map_err(|_| RuntimeError::Cancelled(format!("{task}: downstream is gone")))
            }
            Err(TrySendError::Closed(_)) => Err(RuntimeError::Cancelled(format!("{task}: downstream is gone"))),
        }
    }

    /// Emits a batch to every downstream operator, partitioned per edge.
    pub async fn emit(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.metrics.add_rows_out(batch.num_rows() as u64);
        for edge in &mut self.edges {
            let batch = batch.clone();
            match &edge.partitioning {
                Partitioning::Forward => {
                    // A forward edge has exactly one target: the subtask of the same index.
                    let (tx, input) = &edge.targets[0];
                    Self::send(&self.task, &self.metrics, tx, Tagged { input: *input, message: Message::Batch(batch) })
                        .await?;
                }
                Partitioning::RoundRobin => {
                    let (tx, input) = &edge.targets[edge.next % edge.targets.len()];
                    edge.next = edge.next.wrapping_add(1);
                    Self::send(&self.task, &self.metrics, tx, Tagged { input: *input, message: Message::Batch(batch) })
                        .await?;
                }
                Partitioning::Hash(_) | Partitioning::Keys(_) => {
                    let columns = match &edge.partitioning {
                        Partitioning::Hash(column) => std::slice::from_ref(column),
                        Partitioning::Keys(columns) => columns.as_slice(),
                        _ => &[],
                    };
                    let parts = split_by_hash(&batch, columns, edge.targets.len(), &self.task)?;
                    for (target, part) in parts {
                        let (tx, input) = &edge.targets[target];
                        Self::send(
                            &self.task,
                            &self.metrics,
                            tx,
                            Tagged { input: *input, message: Message::Batch(part) },
                        )
                        .await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends this subtask's event-time watermark (ms since the Unix epoch; `None`: idle,
    /// no rows in this checkpoint's period; `Some(i64::MIN)`: no rows yet, so every
    /// downstream watermark stays where it is) to every downstream subtask. An operator
    /// sends it from [`snapshot_state`](crate::Operator::snapshot_state), just before the
    /// barrier; a downstream operator sees the minimum over its inputs
    /// ([`on_watermark`](crate::Operator::on_watermark)).
    pub async fn watermark(&mut self, event_time_ms: Option<i64>) -> Result<()> {
        self.broadcast(Message::Watermark(event_time_ms)).await
    }

    /// Sends a barrier or end-of-stream to every downstream subtask.
    pub(crate) async fn broadcast(&mut self, message: Message) -> Result<()> {
        for edge in &self.edges {
            for (tx, input) in &edge.targets {
                Self::send(&self.task, &self.metrics, tx, Tagged { input: *input, message: message.clone() }).await?;
            }
        }
        Ok(())
    }
}
