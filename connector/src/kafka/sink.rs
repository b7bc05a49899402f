//! [`KafkaSink`]: writes rows to a Kafka topic inside T(n) (exactly-once) or
//! idempotently (at-least-once), through the job's [`KafkaTransactions`].

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{CheckpointId, Collector, Operator, Result, StateItems, SubtaskContext};

use super::KafkaTransactions;
use crate::common::dead_letters::sink_rows;
use crate::common::{key_values, points};

/// Writes each row's `value` (and `key`, if the batch has one) to a topic.
///
/// The output of checkpoint n goes into T(n) and becomes visible to read_committed readers
/// when checkpoint n commits. In at-least-once mode it is written at once and flushed
/// before checkpoint n completes. A row over
/// [`MAX_RECORD_BYTES`](crate::dead_letters::MAX_RECORD_BYTES), which Kafka would refuse,
/// is a dead letter (cause `sink`) when the job has dead letters, and fails the attempt
/// when not.
pub struct KafkaSink {
    txns: Arc<KafkaTransactions>,
    topic: String,
    failpoints: Failpoints,
    task: String,
    dead_letters: Option<shareflow_runtime::DeadLetters>,
}

impl KafkaSink {
    /// A factory for the job builder. `txns` must also be a participant of the job.
    pub fn factory(txns: Arc<KafkaTransactions>, topic: &str) -> impl Fn(&SubtaskContext) -> KafkaSink + Send + Sync {
        let topic = topic.to_string();
        move |ctx| KafkaSink {
            txns: txns.clone(),
            topic: topic.clone(),
            failpoints: ctx.failpoints.clone(),
            task: ctx.task_name(),
            dead_letters: ctx.dead_letters.clone(),
        }
    }
}

#[async_trait]
impl Operator for KafkaSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let rows = key_values(&batch, &self.task, "kafka sink")?;
        let rows = sink_rows(rows, self.dead_letters.as_ref(), &self.task, out.checkpoint_id()).await?;
        let records = rows
            .into_iter()
            .map(|(key, value)| {
                // A NULL value is a null record (a tombstone), as on the embedded broker.
                let mut r = krafka::Record::new(self.topic.as_str(), bytes::Bytes::new());
                r.value = value;
                match key {
                    Some(k) => r.key(k),
                    None => r,
                }
            })
            .collect();
        self.txns.send_records(out.checkpoint_id(), records).await?;
        self.failpoints.hit(points::SINK_AFTER_WRITE)
    }

    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        // Output of the next checkpoint goes into the next transaction (the runtime moves
        // the collector's checkpoint id on); this one is flushed when the checkpoint prepares.
        Ok(Vec::new())
    }
}
