//! [`ShareGroupSource`]: a runtime source whose subtasks are members of one share group.
//!
//! - **Transactional** (exactly-once): every polled record is acknowledged into the
//!   open epoch's transaction T(n) right away (ACQUIRED -> LOCKED), as ACCEPT, or as
//!   REJECT when the decoder refuses it. T(n) commits with the checkpoint: the
//!   acknowledgements and the sinks' output of epoch n become visible in one step.
//! - **Explicit** (at-least-once, FLIP-573 style): acknowledgements wait per epoch and are
//!   sent as ACCEPT when the checkpoint completes; meanwhile the locks are renewed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    ArrayRef, BinaryBuilder, Int16Array, Int32Array, Int64Array, StringArray, TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{ErrorKind, Result, RuntimeError, Source, SourceEvent, StateItems, SubtaskContext};

use crate::broker::{EmbeddedBroker, EmbeddedShareConsumer};
use crate::participant::{runtime_error, BrokerTransactions};
use crate::share::{
    AcknowledgeType, AcknowledgementBatch, AcknowledgementMode, ProducerRecord, Record, ShareAcknowledgements,
    ShareConfig, ShareConsumer, ShareTransactionalProducer,
};

/// Failpoints of the share source.
pub mod points {
    /// Records were polled (ACQUIRED), not yet acknowledged into the transaction.
    pub const AFTER_POLL: &str = "source.after_poll";
    /// Records are LOCKED in T(n), not yet emitted.
    pub const AFTER_LOCK: &str = "source.after_lock";
}

/// The schema of the batches a share source emits (DESIGN.md §2).
pub fn record_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        Field::new("delivery_count", DataType::Int16, false),
    ]))
}

/// Builds a batch of the [`record_schema`] from records.
pub fn records_to_batch(records: &[Record]) -> std::result::Result<RecordBatch, arrow::error::ArrowError> {
    let mut keys = BinaryBuilder::new();
    let mut values = BinaryBuilder::new();
    for r in records {
        keys.append_option(r.key.as_deref());
        values.append_option(r.value.as_deref());
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(records.iter().map(|r| r.topic.as_ref()))),
        Arc::new(Int32Array::from_iter_values(records.iter().map(|r| r.partition))),
        Arc::new(Int64Array::from_iter_values(records.iter().map(|r| r.offset))),
        Arc::new(keys.finish()),
        Arc::new(values.finish()),
        Arc::new(TimestampMillisecondArray::from_iter_values(records.iter().map(|r| r.timestamp_ms))),
        Arc::new(Int16Array::from_iter_values(records.iter().map(|r| r.delivery_count))),
    ];
    RecordBatch::try_new(record_schema(), columns)
}

/// Decides whether a record can be processed; `Err` names why not (a poison record).
pub type Decoder = Arc<dyn Fn(&Record) -> std::result::Result<(), String> + Send + Sync>;

/// Counters shared by a source's subtasks.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    /// Records emitted.
    pub records_emitted: AtomicU64,
    /// Records the decoder refused.
    pub records_poison: AtomicU64,
    /// Poison records sent to the dead-letter topic.
    pub records_dead_lettered: AtomicU64,
    /// Redeliveries seen (delivery count > 1).
    pub records_redelivered: AtomicU64,
}

/// Settings of a share source.
#[derive(Clone)]
pub struct ShareSourceConfig {
    /// The share group.
    pub group: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Acknowledgement mode and the rest.
    pub share: ShareConfig,
    /// Records per poll.
    pub max_poll_records: usize,
    /// How long one poll may wait.
    pub poll_timeout: Duration,
    /// Refuses poison records.
    pub decoder: Option<Decoder>,
    /// Poison records go here (inside the transaction) instead of being REJECTed.
    pub dead_letter_topic: Option<String>,
    /// End when the topics are drained (every record LOCKED or done): for bounded runs.
    pub stop_when_drained: bool,
}

impl ShareSourceConfig {
    /// Transactional consumption of `topics` by `group`, 500 records per poll.
    pub fn new(group: &str, topics: &[&str], share: ShareConfig) -> Self {
        Self {
            group: group.to_string(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            share,
            max_poll_records: 500,
            poll_timeout: Duration::from_millis(5),
            decoder: None,
            dead_letter_topic: None,
            stop_when_drained: false,
        }
    }
}

/// One subtask of a share-group source.
pub struct ShareGroupSource {
    broker: EmbeddedBroker,
    txns: Option<Arc<BrokerTransactions>>,
    config: ShareSourceConfig,
    consumer: Option<EmbeddedShareConsumer>,
    ctx: Option<SubtaskContext>,
    /// Explicit mode: records waiting for their checkpoint, per epoch.
    waiting: BTreeMap<u64, Vec<Record>>,
    last_renew: tokio::time::Instant,
    metrics: Arc<SourceMetrics>,
    failpoints: Failpoints,
    task: String,
}

impl ShareGroupSource {
    /// A factory for the job builder. `txns` is required in transactional mode.
    pub fn factory(
        broker: EmbeddedBroker,
        txns: Option<Arc<BrokerTransactions>>,
        config: ShareSourceConfig,
        metrics: Arc<SourceMetrics>,
    ) -> impl Fn(&SubtaskContext) -> ShareGroupSource + Send + Sync {
        move |ctx| ShareGroupSource {
            broker: broker.clone(),
            txns: txns.clone(),
            config: config.clone(),
            consumer: None,
            ctx: None,
            waiting: BTreeMap::new(),
            last_renew: tokio::time::Instant::now(),
            metrics: metrics.clone(),
            failpoints: ctx.failpoints.clone(),
            task: ctx.task_name(),
        }
    }

    fn err(&self, e: crate::Error) -> RuntimeError {
        runtime_error(&self.task, e)
    }

    fn consumer(&mut self) -> Result<&mut EmbeddedShareConsumer> {
        self.consumer.as_mut().ok_or_else(|| RuntimeError::Internal("share source polled before open".into()))
    }

    fn transactional(&self) -> bool {
        self.config.share.acknowledgement_mode() == AcknowledgementMode::Transactional
    }

    async fn stage(&mut self, epoch: u64, records: &[Record]) -> Result<Vec<Record>> {
        let ctx = self.ctx.as_ref().ok_or_else(|| RuntimeError::Internal("no context".into()))?;
        let txn_id = ctx.transactions.transaction(epoch);
        let txns = self.txns.clone().ok_or_else(|| RuntimeError::InvalidConfig {
            key: "share.acknowledgement.mode".into(),
            value: "transactional".into(),
            rule: "a transactional share source needs the job's BrokerTransactions participant".into(),
        })?;
        let handle = txns.handle(txn_id)?;
        let mut acks = ShareAcknowledgements::new();
        let mut good = Vec::with_capacity(records.len());
        let mut dead = Vec::new();
        for r in records {
            let verdict = self.config.decoder.as_ref().map_or(Ok(()), |d| d(r));
            let tp = r.topic_partition();
            match verdict {
                Ok(()) => {
                    acks.add(tp, AcknowledgementBatch::new(r.offset, r.offset, AcknowledgeType::Accept))
                        .map_err(|e| self.err(e))?;
                    good.push(r.clone());
                }
                Err(why) => {
                    self.metrics.records_poison.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(topic = %r.topic, partition = r.partition, offset = r.offset, reason = %why, "poison record");
                    match &self.config.dead_letter_topic {
                        Some(topic) => {
                            // Dead-lettered inside T(n): the record is done when its checkpoint commits.
                            dead.push(ProducerRecord {
                                topic: topic.as_str().into(),
                                partition: None,
                                key: r.key.clone(),
                                value: r.value.clone(),
                                timestamp_ms: r.timestamp_ms,
                            });
                            acks.add(tp, AcknowledgementBatch::new(r.offset, r.offset, AcknowledgeType::Accept))
                                .map_err(|e| self.err(e))?;
                        }
                        None => acks
                            .add(tp, AcknowledgementBatch::new(r.offset, r.offset, AcknowledgeType::Reject))
                            .map_err(|e| self.err(e))?,
                    }
                }
            }
        }
        if !dead.is_empty() {
            let n = dead.len() as u64;
            txns.coordinator()?.send(&handle, dead).await.map_err(|e| self.err(e))?;
            self.metrics.records_dead_lettered.fetch_add(n, Ordering::Relaxed);
        }
        self.consumer()?
            .acknowledge_batches_transactional(&acks, &handle)
            .await
            .map_err(|e| runtime_error(&self.task, e))?;
        Ok(good)
    }

    async fn renew_waiting(&mut self) -> Result<()> {
        let lock = self.config.share.record_lock_duration();
        if self.waiting.is_empty() || self.last_renew.elapsed() < lock / 3 {
            return Ok(());
        }
        self.last_renew = tokio::time::Instant::now();
        let records: Vec<Record> = self.waiting.values().flatten().cloned().collect();
        let consumer = self.consumer()?;
        for r in &records {
            consumer.acknowledge(r, AcknowledgeType::Renew).await.map_err(|e| runtime_error("share-source", e))?;
        }
        consumer.commit().await.map_err(|e| runtime_error("share-source", e))
    }
}

#[async_trait]
impl Source for ShareGroupSource {
    async fn open(&mut self, ctx: &SubtaskContext, _restored: StateItems) -> Result<()> {
        // Nothing to restore: the broker holds the truth, and recovery already committed
        // or aborted every transaction of earlier attempts.
        let mut consumer =
            self.broker.consumer(&self.config.group, self.config.share.clone()).await.map_err(|e| self.err(e))?;
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).await.map_err(|e| self.err(e))?;
        self.consumer = Some(consumer);
        self.ctx = Some(ctx.clone());
        Ok(())
    }

    async fn poll_next(&mut self, epoch: u64) -> Result<SourceEvent> {
        if !self.transactional() {
            self.renew_waiting().await?;
        }
        let (max, timeout) = (self.config.max_poll_records, self.config.poll_timeout);
        let records = self.consumer()?.poll(max, timeout).await.map_err(|e| runtime_error("share-source", e))?;
        if records.is_empty() {
            if self.config.stop_when_drained {
                let mut drained = true;
                for topic in &self.config.topics {
                    drained &= self.broker.backlog(&self.config.group, topic).await.map_err(|e| self.err(e))?.drained();
                }
                if drained {
                    return Ok(SourceEvent::Finished);
                }
            }
            return Ok(SourceEvent::Idle);
        }
        self.failpoints.hit(points::AFTER_POLL)?;
        let redelivered = records.iter().filter(|r| r.delivery_count > 1).count() as u64;
        self.metrics.records_redelivered.fetch_add(redelivered, Ordering::Relaxed);
        let emit = if self.transactional() {
            let good = self.stage(epoch, &records).await?;
            self.failpoints.hit(points::AFTER_LOCK)?;
            good
        } else {
            self.waiting.entry(epoch).or_default().extend(records.iter().cloned());
            records
        };
        self.metrics.records_emitted.fetch_add(emit.len() as u64, Ordering::Relaxed);
        if emit.is_empty() {
            return Ok(SourceEvent::Idle);
        }
        let batch = records_to_batch(&emit).map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
        Ok(SourceEvent::Batch(batch))
    }

    /// Nothing to snapshot: T(n) in the broker holds epoch n's acknowledgements, and
    /// recovery decides it from the manifest (decision 0005).
    async fn snapshot_state(&mut self, _checkpoint_id: u64) -> Result<StateItems> {
        Ok(Vec::new())
    }

    async fn notify_checkpoint_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        // Completing n covers every earlier epoch, even if its notification was lost.
        if !self.transactional() {
            let done: Vec<u64> = self.waiting.range(..=checkpoint_id).map(|(e, _)| *e).collect();
            let mut records = Vec::new();
            for e in done {
                records.extend(self.waiting.remove(&e).unwrap_or_default());
            }
            let consumer = self.consumer()?;
            for r in &records {
                consumer.acknowledge(r, AcknowledgeType::Accept).await.map_err(|e| runtime_error("share-source", e))?;
            }
            consumer.commit().await.map_err(|e| runtime_error("share-source", e))?;
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if let Some(mut c) = self.consumer.take() {
            c.close().await.map_err(|e| runtime_error("share-source", e))?;
        }
        Ok(())
    }
}
