//! [`KafkaShareSource`]: a runtime source whose subtasks are members of one share group
//! on a real Kafka cluster, exactly-once through the ledger of [`KafkaTransactions`].
//!
//! Per poll: records the ledger already names (a redelivery of something this job
//! processed) are accepted and dropped; the rest get an intent entry in the ledger,
//! are accepted at the share group, and are emitted in the current checkpoint. On open,
//! a subtask first replays its share of the offsets whose checkpoints never committed.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{
    CheckpointId, ErrorKind, Result, RuntimeError, Source, SourceEvent, StateItems, SubtaskContext,
};

use super::ledger::to_ranges;
use super::ledger::GroupLedger;
use super::{JoinGate, KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig, KafkaTransactions};
use crate::common::runtime_error;
use crate::common::{points, records_to_batch, RateLimit, SourceMetrics, SourceSettings};
use shareflow_share::{AcknowledgeType, Record, ShareConsumer};

/// One subtask of a share-group source on real Kafka.
pub struct KafkaShareSource {
    cluster: KafkaCluster,
    txns: Arc<KafkaTransactions>,
    config: SourceSettings,
    consumer: Option<KafkaShareConsumer>,
    ledger: Option<Arc<GroupLedger>>,
    parallelism: u32,
    replay: VecDeque<Record>,
    subtask: u32,
    idle_since: Option<tokio::time::Instant>,
    /// When the consumer's buffer was last known empty (a poll returned fewer records
    /// than asked): every record handed out since was acquired after this instant.
    buffer_empty_at: tokio::time::Instant,
    rate: RateLimit,
    last_drain_check: Option<tokio::time::Instant>,
    metrics: Arc<SourceMetrics>,
    failpoints: Failpoints,
    task: String,
    /// Shared by the subtasks of this source: none polls before each holds an
    /// assignment that counts them all.
    gate: Arc<std::sync::OnceLock<JoinGate>>,
    /// The job's dead letters, for what the decoder refuses.
    dead_letters: Option<shareflow_runtime::DeadLetters>,
}

impl KafkaShareSource {
    /// A factory for the job builder: subtasks consume as `settings` says. `txns` must
    /// also be a participant of the job.
    pub fn factory(
        cluster: KafkaCluster,
        txns: Arc<KafkaTransactions>,
        settings: SourceSettings,
        metrics: Arc<SourceMetrics>,
    ) -> impl Fn(&SubtaskContext) -> KafkaShareSource + Send + Sync {
        let gate: Arc<std::sync::OnceLock<JoinGate>> = Arc::default();
        move |ctx| KafkaShareSource {
            gate: gate.clone(),
            cluster: cluster.clone(),
            txns: txns.clone(),
            rate: RateLimit::new(settings.max_records_per_second),
            config: settings.clone(),
            consumer: None,
            ledger: None,
            replay: VecDeque::new(),
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
            idle_since: None,
            buffer_empty_at: tokio::time::Instant::now(),
            last_drain_check: None,
            metrics: metrics.clone(),
            failpoints: ctx.failpoints.clone(),
            task: ctx.task_name(),
            dead_letters: ctx.dead_letters.clone(),
        }
    }

    fn consumer(&mut self) -> Result<&mut KafkaShareConsumer> {
        self.consumer.as_mut().ok_or_else(|| RuntimeError::Internal("kafka source polled before open".into()))
    }

    async fn drained(&mut self) -> Result<bool> {
        let now = tokio::time::Instant::now();
        if self.last_drain_check.is_some_and(|t| now.duration_since(t) < Duration::from_millis(500)) {
            return Ok(false);
        }
        self.last_drain_check = Some(now);
        for topic in &self.config.topics {
            let b = self
                .cluster
                .share_group_backlog(&self.config.group, topic)
                .await
                .map_err(|e| runtime_error(&self.task, e))?;
            if !b.drained() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Renews the locks of `records` and returns those the broker renewed; records of a
    /// partition whose renewal was refused are released (their locks may be gone).
    async fn renew(&mut self, records: Vec<Record>) -> Result<Vec<Record>> {
        let task = self.task.clone();
        for r in &records {
            self.consumer()?.acknowledge(r, AcknowledgeType::Renew).await.map_err(|e| runtime_error(&task, e))?;
        }
        let refused = self.consumer()?.commit_outcome().await.map_err(|e| runtime_error(&task, e))?;
        // A record whose partition went to another member is settled already: its lock
        // was not renewed, so it must not get an intent; it returns to the group.
        let consumer = self.consumer()?;
        let records: Vec<Record> = records.into_iter().filter(|r| consumer.is_unsettled(r)).collect();
        let (kept, lost): (Vec<Record>, Vec<Record>) = records
            .into_iter()
            .partition(|r| !refused.iter().any(|(t, p, _)| t.as_str() == r.topic.as_ref() && *p == r.partition));
        for r in &lost {
            self.consumer()?.acknowledge(r, AcknowledgeType::Release).await.map_err(|e| runtime_error(&task, e))?;
        }
        if !lost.is_empty() {
            tracing::warn!(
                task = %task,
                records = lost.len(),
                reasons = ?refused,
                "locks could not be renewed before the intent; released (delivery count raised)"
            );
            self.metrics.records_released_late.fetch_add(lost.len() as u64, Ordering::Relaxed);
        }
        Ok(kept)
    }

    /// Moves the replay work queued for this subtask (by a recovery, an adoption, or a
    /// held claimant's late intent) into the replay queue, reading its records from
    /// their topics' logs.
    async fn take_replay(&mut self) -> Result<()> {
        let Some(ledger) = self.ledger.clone() else { return Ok(()) };
        let share = ledger.take_replay(self.subtask, self.parallelism, &self.config.topics);
        if !share.is_empty() {
            let records = self.txns.read_ranges(&share).await?;
            tracing::info!(task = %self.task, records = records.len(), ranges = share.len(), "replaying records nobody committed");
            self.replay.extend(records);
        }
        Ok(())
    }

    /// Gives up this subtask's seat at the join gate: a restarted attempt's subtask of
    /// this index joins afresh.
    fn leave_gate(&self) {
        if let (Some(gate), Some(consumer)) = (self.gate.get(), self.consumer.as_ref()) {
            gate.leave(self.subtask as usize, &consumer.member_id().0);
        }
    }

    /// Emits `records` of checkpoint `checkpoint_id`; those the decoder refuses go to
    /// the dead letters in T(n) instead (their offsets are in the intent all the same:
    /// they are acknowledged with the checkpoint).
    async fn emit(&mut self, checkpoint_id: CheckpointId, mut records: Vec<Record>) -> Result<SourceEvent> {
        if let (Some(decoder), Some(letters)) = (&self.config.decoder, &self.dead_letters) {
            let mut dead = Vec::new();
            records.retain(|r| match decoder(r) {
                Ok(()) => true,
                Err(why) => {
                    dead.push(crate::common::dead_letters::decode_letter(r, why, &self.task));
                    false
                }
            });
            if !dead.is_empty() {
                let n = dead.len() as u64;
                self.metrics.records_poison.fetch_add(n, Ordering::Relaxed);
                letters.write(checkpoint_id, dead).await?;
                self.metrics.records_dead_lettered.fetch_add(n, Ordering::Relaxed);
            }
        }
        self.rate.emitted(records.len() as u64);
        self.metrics.records_emitted.fetch_add(records.len() as u64, Ordering::Relaxed);
        let batch = records_to_batch(&records).map_err(|e| RuntimeError::task(&self.task, ErrorKind::Internal, e))?;
        Ok(SourceEvent::Batch(batch))
    }
}

#[async_trait]
impl Source for KafkaShareSource {
    async fn open(&mut self, ctx: &SubtaskContext, _restored: StateItems) -> Result<()> {
        self.config.validate("kafka").map_err(|e| runtime_error(&self.task, e))?;
        if self.config.decoder.is_some() && ctx.dead_letters.is_none() {
            return Err(runtime_error(
                &self.task,
                crate::Error::InvalidConfig {
                    key: "decoder".into(),
                    value: "set, without dead letters".into(),
                    rule: "on Kafka the records a decoder refuses go to the job's dead-letter topic (a share \
                           acknowledgement cannot REJECT inside a transaction); configure dead letters \
                           ([dead_letters] in a job file, JobBuilder::dead_letters in Rust)"
                        .into(),
                },
            ));
        }
        let mut group_configs = Vec::new();
        if self.config.from_earliest {
            group_configs.push(("share.auto.offset.reset", "earliest"));
        }
        if self.config.read_committed {
            group_configs.push(("share.isolation.level", "read_committed"));
        }
        if !group_configs.is_empty() {
            self.cluster
                .set_group_configs(&self.config.group, &group_configs)
                .await
                .map_err(|e| runtime_error(&self.task, e))?;
        }
        self.ledger = Some(self.txns.group().clone());
        self.take_replay().await?;
        let mut consumer_config = KafkaShareConsumerConfig::new(&self.config.group);
        consumer_config.fetch_max_records = self.config.max_poll_records;
        consumer_config.fetch_max_wait = self.config.poll_timeout;
        // Kept at once, not after joining: an attempt that fails while this subtask
        // waits for its siblings abandons (closes) the member it has.
        let consumer = self.consumer.insert(
            KafkaShareConsumer::new(&self.cluster, consumer_config).await.map_err(|e| runtime_error(&self.task, e))?,
        );
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).await.map_err(|e| runtime_error(&self.task, e))?;
        let gate = self.gate.get_or_init(|| JoinGate::new(self.parallelism as usize, JOIN_GATE_LIMIT));
        let passed = gate.settle(self.subtask as usize, consumer).await.map_err(|e| runtime_error(&self.task, e))?;
        tracing::debug!(task = %self.task, ?passed, assignment = ?consumer.assignment(), "joined the share group");
        self.buffer_empty_at = tokio::time::Instant::now();
        Ok(())
    }

    async fn poll_next(&mut self, checkpoint_id: CheckpointId) -> Result<SourceEvent> {
        self.rate.throttle().await;
        if self.replay.is_empty() {
            self.take_replay().await?;
        }
        if !self.replay.is_empty() {
            let n = self.replay.len().min(self.config.max_poll_records);
            let records: Vec<Record> = self.replay.drain(..n).collect();
            let ranges = to_ranges(records.iter().map(|r| (r.topic.as_ref(), r.partition, r.offset)));
            timed(&self.metrics.intent_wait_nanos, self.txns.write_intent(checkpoint_id, self.subtask, ranges)).await?;
            self.metrics.intents_written.fetch_add(1, Ordering::Relaxed);
            self.metrics.records_replayed.fetch_add(records.len() as u64, Ordering::Relaxed);
            return self.emit(checkpoint_id, records).await;
        }
        let (max, timeout) = (self.config.max_poll_records, self.config.poll_timeout);
        let task = self.task.clone();
        let polled_at = tokio::time::Instant::now();
        let records = self.consumer()?.poll(max, timeout).await.map_err(|e| runtime_error(&task, e))?;
        let returned_at = tokio::time::Instant::now();
        // Waits for records only: an empty poll is an idle source, not a slow one.
        if !records.is_empty() {
            add_nanos(&self.metrics.poll_wait_nanos, returned_at - polled_at);
        }
        // Every record of this poll was acquired after the buffer was last empty.
        let mut acquired_after = self.buffer_empty_at;
        if records.len() < max {
            self.buffer_empty_at = returned_at;
        }
        if records.is_empty() {
            if self.config.stop_when_drained {
                let idle = *self.idle_since.get_or_insert(returned_at);
                if idle.elapsed() > Duration::from_millis(300) && self.drained().await? {
                    return Ok(SourceEvent::Finished);
                }
            }
            return Ok(SourceEvent::Idle);
        }
        self.idle_since = None;
        self.metrics.count_redelivered(&records);
        self.failpoints.hit(points::SOURCE_AFTER_POLL)?;
        let ledger = self.ledger.clone().ok_or_else(|| RuntimeError::Internal("kafka source without ledger".into()))?;
        // Every delivery, not only redeliveries: the ledger is the authority.
        let covered = ledger.covered(records.iter().map(|r| (&r.topic, r.partition, r.offset)));
        let mut fresh = Vec::with_capacity(records.len());
        let mut skipped = 0u64;
        for (r, covered) in records.into_iter().zip(covered) {
            if covered {
                self.consumer()?.acknowledge(&r, AcknowledgeType::Accept).await.map_err(|e| runtime_error(&task, e))?;
                skipped += 1;
            } else {
                fresh.push(r);
            }
        }
        self.metrics.records_skipped.fetch_add(skipped, Ordering::Relaxed);
        if fresh.is_empty() {
            return Ok(SourceEvent::Idle);
        }
        // The intent must be durable while we still hold the locks; otherwise another
        // member may get the records before the ledger names them. Half the lock is
        // the budget. Past it, renew the locks first, and give back what the broker
        // will not renew.
        let lock = self.consumer()?.lock_duration().unwrap_or(Duration::from_secs(15));
        if acquired_after.elapsed() > lock / 2 {
            fresh = self.renew(fresh).await?;
            acquired_after = tokio::time::Instant::now();
            if fresh.is_empty() {
                return Ok(SourceEvent::Idle);
            }
        }
        let ranges = to_ranges(fresh.iter().map(|r| (r.topic.as_ref(), r.partition, r.offset)));
        let budget = lock / 2 - acquired_after.elapsed().min(lock / 2);
        let write = tokio::time::timeout(budget, self.txns.write_intent(checkpoint_id, self.subtask, ranges));
        match timed(&self.metrics.intent_wait_nanos, write).await {
            Ok(r) => r?,
            Err(_) => {
                tracing::error!(
                    task = %task,
                    records = fresh.len(),
                    "the ledger intent was not durable within half the acquisition lock; restarting so the ledger stays \
                     exact (the records return with their delivery count raised)"
                );
                return Err(RuntimeError::task_message(
                    &task,
                    ErrorKind::Unavailable,
                    format!(
                        "writing the ledger intent took longer than half the acquisition lock ({lock:?}); \
                         restarting so the ledger stays exact"
                    ),
                ));
            }
        }
        self.metrics.intents_written.fetch_add(1, Ordering::Relaxed);
        self.failpoints.hit(points::SOURCE_AFTER_LOCK)?;
        for r in &fresh {
            self.consumer()?.acknowledge(r, AcknowledgeType::Accept).await.map_err(|e| runtime_error(&task, e))?;
        }
        self.emit(checkpoint_id, fresh).await
    }

    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId) -> Result<StateItems> {
        // Nothing to keep: intents are in the ledger, acknowledgements at the broker.
        // Send the acknowledgements now rather than with the next fetch.
        let task = self.task.clone();
        if let Some(c) = self.consumer.as_mut() {
            let refused = c.commit_outcome().await.map_err(|e| runtime_error(&task, e))?;
            for (topic, partition, reason) in refused {
                tracing::debug!(%topic, partition, %reason, "acknowledgement refused; the ledger covers a redelivery");
            }
        }
        Ok(Vec::new())
    }

    async fn close(&mut self) -> Result<()> {
        self.leave_gate();
        if let Some(mut c) = self.consumer.take() {
            c.close().await.map_err(|e| runtime_error(&self.task, e))?;
        }
        Ok(())
    }

    /// The attempt failed: the member leaves its group at once. Acknowledgements it
    /// still keeps are sent (each record's intent is durable before its Accept, so the
    /// ledger covers them either way), and what it holds unsettled goes back now
    /// rather than when its acquisition lock expires.
    async fn abandon(&mut self) -> Result<()> {
        self.close().await
    }
}

impl Drop for KafkaShareSource {
    fn drop(&mut self) {
        self.leave_gate();
    }
}

/// How long a subtask waits at the [`JoinGate`] for its siblings at most: they join
/// within milliseconds of each other unless one failed to open.
const JOIN_GATE_LIMIT: Duration = Duration::from_secs(10);

/// Adds `d` to a nanosecond counter.
fn add_nanos(counter: &std::sync::atomic::AtomicU64, d: Duration) {
    counter.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Runs `f` and adds how long it took to `counter`, whatever it returned: a write that
/// failed or ran out of time was waited for all the same, and the metrics outlive the
/// restart that follows.
async fn timed<F: std::future::Future>(counter: &std::sync::atomic::AtomicU64, f: F) -> F::Output {
    let started = tokio::time::Instant::now();
    let out = f.await;
    add_nanos(counter, started.elapsed());
    out
}
