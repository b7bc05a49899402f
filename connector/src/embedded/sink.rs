//! [`TopicSink`]: the transactional topic sink on the embedded broker.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{CheckpointId, Collector, Operator, Result, StateItems, SubtaskContext, TransactionTemplate};

use super::BrokerTransactions;
use crate::common::dead_letters::sink_rows;
use crate::common::runtime_error;
use crate::common::{key_values, points};
use shareflow_broker::EmbeddedBroker;
use shareflow_share::{ProducerRecord, ShareTransactionalProducer};

/// Writes each row's `value` (and `key`, if present) to a topic of the embedded broker.
/// With a [`BrokerTransactions`] participant the output of checkpoint n goes into T(n)
/// and is visible to read_committed readers only once checkpoint n commits; without, it
/// is produced at once (at-least-once pipelines). A row over
/// [`MAX_RECORD_BYTES`](crate::dead_letters::MAX_RECORD_BYTES) is a dead letter (cause
/// `sink`) when the job has dead letters, and fails the attempt when not.
pub struct TopicSink {
    broker: EmbeddedBroker,
    txns: Option<Arc<BrokerTransactions>>,
    topic: Arc<str>,
    template: TransactionTemplate,
    failpoints: Failpoints,
    task: String,
    dead_letters: Option<shareflow_runtime::DeadLetters>,
}

impl TopicSink {
    /// A factory for the job builder.
    pub fn factory(
        broker: EmbeddedBroker,
        txns: Option<Arc<BrokerTransactions>>,
        topic: &str,
    ) -> impl Fn(&SubtaskContext) -> TopicSink + Send + Sync {
        let topic: Arc<str> = topic.into();
        move |ctx| TopicSink {
            broker: broker.clone(),
            txns: txns.clone(),
            topic: topic.clone(),
            template: ctx.transactions.clone(),
            failpoints: ctx.failpoints.clone(),
            task: ctx.task_name(),
            dead_letters: ctx.dead_letters.clone(),
        }
    }
}

#[async_trait]
impl Operator for TopicSink {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        let rows = key_values(&batch, &self.task, "topic sink")?;
        let rows = sink_rows(rows, self.dead_letters.as_ref(), &self.task, out.checkpoint_id()).await?;
        let records: Vec<ProducerRecord> = rows
            .into_iter()
            // The broker keeps what it is given for the topic's retention: each row gets
            // bytes of its own, not a slice that would keep the whole batch's buffer.
            .map(|(key, value)| ProducerRecord {
                topic: self.topic.clone(),
                partition: None,
                key: key.map(|k| Bytes::copy_from_slice(&k)),
                value: value.map(|v| Bytes::copy_from_slice(&v)),
                timestamp_ms: 0,
                headers: Vec::new(),
            })
            .collect();
        match &self.txns {
            Some(txns) => {
                let handle = txns.handle(self.template.transaction(out.checkpoint_id()))?;
                txns.coordinator()?.send(&handle, records).await.map_err(|e| runtime_error(&self.task, e))?;
            }
            None => {
                self.broker.produce(records).await.map_err(|e| runtime_error(&self.task, e))?;
            }
        }
        self.failpoints.hit(points::SINK_AFTER_WRITE)
    }

    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        // Every send already returned durable: nothing to flush for T(n).
        Ok(Vec::new())
    }
}
