//! [`ShareGroupSource`]: a runtime source whose subtasks are members of one share group
//! of the embedded broker.
//!
//! - **Transactional** (exactly-once): every polled record is acknowledged into the
//!   transaction T(n) of the open checkpoint n right away (ACQUIRED -> LOCKED), as
//!   ACCEPT, or as REJECT when the decoder refuses it. T(n) commits with the checkpoint:
//!   the acknowledgements and the sinks' output of checkpoint n become visible in one step.
//! - **Explicit** (at-least-once, FLIP-573 style): acknowledgements wait per checkpoint,
//!   as merged offset ranges, and are sent as ACCEPT when the checkpoint completes;
//!   meanwhile the locks are renewed. Each is one call for all the ranges, never one
//!   per record.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{
    CheckpointId, ErrorKind, Result, RuntimeError, Source, SourceEvent, StateItems, SubtaskContext,
};

use super::BrokerTransactions;
use crate::common::runtime_error;
use crate::common::{points, records_to_batch, RateLimit, SourceMetrics, SourceSettings};
use shareflow_broker::{EmbeddedBroker, EmbeddedShareConsumer};
use shareflow_share::{
    AcknowledgeType, AcknowledgementBatch, AcknowledgementMode, Record, ShareAcknowledgements, ShareConfig,
    ShareConsumer,
};

/// One subtask of a share-group source.
pub struct ShareGroupSource {
    broker: EmbeddedBroker,
    txns: Option<Arc<BrokerTransactions>>,
    config: SourceSettings,
    share: ShareConfig,
    consumer: Option<EmbeddedShareConsumer>,
    ctx: Option<SubtaskContext>,
    /// Explicit mode: the offset ranges waiting for their checkpoint, per checkpoint id.
    waiting: BTreeMap<CheckpointId, ShareAcknowledgements>,
    last_renew: tokio::time::Instant,
    rate: RateLimit,
    metrics: Arc<SourceMetrics>,
    failpoints: Failpoints,
    task: String,
}

/// A source dropped without `close` belongs to an attempt that failed (its task was
/// stopped where it was): its consumer leaves the group, so the records it held ACQUIRED
/// are redelivered to the next attempt at once rather than after their lock expires.
impl Drop for ShareGroupSource {
    fn drop(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            consumer.abandon();
        }
    }
}

impl ShareGroupSource {
    /// A factory for the job builder: subtasks consume as `settings` says, with the
    /// group's `share` config (its acknowledgement mode decides exactly-once or
    /// at-least-once). `txns` is required in transactional mode.
    pub fn factory(
        broker: EmbeddedBroker,
        txns: Option<Arc<BrokerTransactions>>,
        settings: SourceSettings,
        share: ShareConfig,
        metrics: Arc<SourceMetrics>,
    ) -> impl Fn(&SubtaskContext) -> ShareGroupSource + Send + Sync {
        move |ctx| ShareGroupSource {
            broker: broker.clone(),
            txns: txns.clone(),
            config: settings.clone(),
            share: share.clone(),
            rate: RateLimit::new(settings.max_records_per_second),
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
        self.share.acknowledgement_mode() == AcknowledgementMode::Transactional
    }

    async fn stage(&mut self, checkpoint_id: CheckpointId, records: &[Record]) -> Result<Vec<Record>> {
        let ctx = self.ctx.as_ref().ok_or_else(|| RuntimeError::Internal("no context".into()))?;
        let txn_id = ctx.transactions.transaction(checkpoint_id);
        let txns = self.txns.clone().ok_or_else(|| RuntimeError::InvalidConfig {
            key: "share.acknowledgement.mode".into(),
            value: "transactional".into(),
            rule: "a transactional share source needs the job's BrokerTransactions participant".into(),
        })?;
        let handle = txns.handle(txn_id)?;
        let mut acks = ShareAcknowledgements::new();
        let mut good = Vec::with_capacity(records.len());
        let mut dead = Vec::new();
        let dead_letters = ctx.dead_letters.clone();
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
                    match &dead_letters {
                        Some(_) => {
                            // Dead-lettered inside T(n): the record is done when its checkpoint commits.
                            dead.push(crate::common::dead_letters::decode_letter(r, why, &self.task));
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
        if let (Some(letters), false) = (&dead_letters, dead.is_empty()) {
            let n = dead.len() as u64;
            letters.write(checkpoint_id, dead).await?;
            self.metrics.records_dead_lettered.fetch_add(n, Ordering::Relaxed);
        }
        self.consumer()?
            .acknowledge_batches_transactional(&acks, &handle)
            .await
            .map_err(|e| runtime_error(&self.task, e))?;
        Ok(good)
    }

    async fn renew_waiting(&mut self) -> Result<()> {
        let lock = self.share.record_lock_duration();
        if self.waiting.is_empty() || self.last_renew.elapsed() < lock / 3 {
            return Ok(());
        }
        self.last_renew = tokio::time::Instant::now();
        let renew = settle(self.waiting.values(), AcknowledgeType::Renew).map_err(|e| self.err(e))?;
        let consumer = self.consumer()?;
        consumer.acknowledge_ranges(&renew).await.map_err(|e| runtime_error("share-source", e))?;
        consumer.commit().await.map_err(|e| runtime_error("share-source", e))
    }
}

/// The union of `sets`' offset ranges, every one settled as `ack_type`.
fn settle<'a>(
    sets: impl IntoIterator<Item = &'a ShareAcknowledgements>,
    ack_type: AcknowledgeType,
) -> crate::Result<ShareAcknowledgements> {
    let mut out = ShareAcknowledgements::new();
    for (tp, ranges) in sets.into_iter().flat_map(ShareAcknowledgements::partitions) {
        for b in ranges.batches() {
            out.add(tp.clone(), AcknowledgementBatch::new(b.first_offset, b.last_offset, ack_type))?;
        }
    }
    Ok(out)
}

#[async_trait]
impl Source for ShareGroupSource {
    async fn open(&mut self, ctx: &SubtaskContext, _restored: StateItems) -> Result<()> {
        // Nothing to restore: the broker holds the truth, and recovery already committed
        // or aborted every transaction of earlier attempts.
        self.config.validate("embedded broker").map_err(|e| self.err(e))?;
        if !self.config.from_earliest {
            return Err(self.err(crate::Error::InvalidConfig {
                key: "from_earliest".into(),
                value: "false".into(),
                rule: "the embedded broker starts a new share group at the log start; leave from_earliest true".into(),
            }));
        }
        if self.config.read_committed && self.share.isolation_level() != shareflow_share::IsolationLevel::ReadCommitted
        {
            return Err(self.err(crate::Error::InvalidConfig {
                key: "read_committed".into(),
                value: "true".into(),
                rule: format!(
                    "the embedded broker reads as the group's config says, and group {} reads uncommitted \
                     ({:?}): build its ShareConfig with isolation_level(IsolationLevel::ReadCommitted)",
                    self.config.group,
                    self.share.isolation_level()
                ),
            }));
        }
        let mut consumer =
            self.broker.consumer(&self.config.group, self.share.clone()).await.map_err(|e| self.err(e))?;
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).await.map_err(|e| self.err(e))?;
        self.consumer = Some(consumer);
        self.ctx = Some(ctx.clone());
        Ok(())
    }

    async fn poll_next(&mut self, checkpoint_id: CheckpointId) -> Result<SourceEvent> {
        if !self.transactional() {
            self.renew_waiting().await?;
        }
        self.rate.throttle().await;
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
        self.failpoints.hit(points::SOURCE_AFTER_POLL)?;
        self.metrics.count_redelivered(&records);
        let emit = if self.transactional() {
            let good = self.stage(checkpoint_id, &records).await?;
            self.failpoints.hit(points::SOURCE_AFTER_LOCK)?;
            good
        } else {
            let waiting = self.waiting.entry(checkpoint_id).or_default();
            let added = records.iter().try_for_each(|r| {
                waiting.add(r.topic_partition(), AcknowledgementBatch::new(r.offset, r.offset, AcknowledgeType::Accept))
            });
            added.map_err(|e| self.err(e))?;
            records
        };
        self.metrics.records_emitted.fetch_add(emit.len() as u64, Ordering::Relaxed);
        self.rate.emitted(emit.len() as u64);
        if emit.is_empty() {
            return Ok(SourceEvent::Idle);
        }
        let batch = records_to_batch(&emit).map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
        Ok(SourceEvent::Batch(batch))
    }

    /// Nothing to snapshot: T(n) in the broker holds checkpoint n's acknowledgements, and
    /// recovery decides it from the manifest (decision 0005).
    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId) -> Result<StateItems> {
        Ok(Vec::new())
    }

    async fn notify_checkpoint_complete(&mut self, checkpoint_id: CheckpointId) -> Result<()> {
        // Completing n covers every earlier checkpoint, even if its notification was lost.
        if !self.transactional() {
            let rest = checkpoint_id.checked_add(1).map(|next| self.waiting.split_off(&next)).unwrap_or_default();
            let done = std::mem::replace(&mut self.waiting, rest);
            let accept = settle(done.values(), AcknowledgeType::Accept).map_err(|e| self.err(e))?;
            let consumer = self.consumer()?;
            consumer.acknowledge_ranges(&accept).await.map_err(|e| runtime_error("share-source", e))?;
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
