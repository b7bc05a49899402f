//! The embedded broker: the pure [`BrokerState`] behind a lock, a durable [`Journal`],
//! a clock, metrics, and the async APIs of the KIP contract.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::sync::Notify;

mod acknowledger;
mod clients;
mod dead_letters;
mod fetched;
mod options;
mod reload;
mod retention;

pub use acknowledger::TransactionalShareAcknowledger;
pub use clients::{EmbeddedShareConsumer, EmbeddedTransactionCoordinator};
pub use dead_letters::DeadLetterTarget;
pub use fetched::FetchedRecord;
pub use options::{BrokerOptions, DEFAULT_RETENTION_CHECK, DEFAULT_RETENTION_MS};
use options::{DirLock, MAX_BATCH_BYTES};

use super::batch;
use super::clock::{Clock, SystemClock};
use super::journal::{Durability, Journal, JournalCore, Opened, Tuning};
use super::log::{LogRecord, Retention};
use super::metrics::{Metrics, MetricsSnapshot};
use super::share_partition::MemberKey;
use super::state::{BrokerState, Command, Entry, Outcome, RecordStatus};
use shareflow_share::{
    validate_group_id, validate_prefix, AcknowledgeType, AcknowledgementMode, IsolationLevel, MemberId,
    PendingTransaction, ProducerEpoch, ProducerRecord, Record, RecordState, ShareAcknowledgements, ShareConfig,
    ShareConsumer, ShareTransactionCoordinator, ShareTransactionalProducer, TopicPartition, TransactionHandle,
    TransactionId, TransactionState,
};
use shareflow_share::{Error, Result};

/// Size figures of one share partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharePartitionInfo {
    /// One past the highest offset ever acquired (Kafka's share-partition end offset);
    /// an acquisition taken back because its records could not be read still counts.
    pub fetched_end: i64,
    /// ACQUIRED plus LOCKED records (what `group.share.partition.max.record.locks` caps).
    pub in_flight: u64,
    /// Runs of equal state the partition stores; memory follows this, not the records.
    pub run_count: usize,
}

/// Records of a topic by state, for one share group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backlog {
    /// AVAILABLE, including records never delivered.
    pub available: u64,
    /// ACQUIRED by a member, not yet acknowledged.
    pub acquired: u64,
    /// LOCKED in a transaction.
    pub locked: u64,
    /// ACKNOWLEDGED: done, their output (if any) committed.
    pub acknowledged: u64,
    /// ARCHIVED: done without output (rejected, or past the delivery limit).
    pub archived: u64,
}

impl Backlog {
    /// Nothing left to deliver or to hold: every record is LOCKED or done.
    pub fn drained(&self) -> bool {
        self.available == 0 && self.acquired == 0
    }
}

/// A transaction as the broker sees it, for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionInfo {
    /// Its id, `{groupId}-{prefix}-{checkpointId}`.
    pub id: TransactionId,
    /// KIP-1289 state: ONGOING, PREPARE, COMMITTED or ABORTED.
    pub state: TransactionState,
    /// Epoch that began it.
    pub epoch: ProducerEpoch,
    /// Acknowledged offsets staged (0 once decided).
    pub pending_ack_records: u64,
    /// Records produced into it.
    pub produced_records: u64,
    /// Its timeout: an ONGOING transaction older than this aborts; a PREPARE one waits.
    pub timeout: std::time::Duration,
    /// When it began, ms since the Unix epoch on the broker's clock.
    pub created_at_ms: u64,
}

impl TransactionInfo {
    fn of(t: &super::txn::Txn) -> Self {
        Self {
            id: t.id.clone(),
            state: t.state,
            epoch: t.epoch,
            pending_ack_records: t.acks.record_count(),
            produced_records: t.produced_records,
            timeout: std::time::Duration::from_millis(t.timeout_ms),
            created_at_ms: t.create_time_ms,
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: Mutex<BrokerState>,
    journal: Journal,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    wake: Notify,
    round_robin: AtomicU64,
    closed: AtomicBool,
    read_only: bool,
    /// The exclusive lock on a local broker directory, held until close or drop.
    dir_lock: Mutex<Option<DirLock>>,
    /// Retention, broker-wide and per topic; `None` if nothing is limited.
    retention: Option<(Retention, BTreeMap<String, Retention>)>,
    /// Broker time at which retention next looks at the logs.
    retention_due_ms: AtomicU64,
    /// Broker time between retention passes.
    retention_every_ms: u64,
    /// What the open read, and how long it took.
    opened: Opened,
    /// The group config a reload starts its state from (as a reopen does).
    default_config: ShareConfig,
    /// When the last reload after a full disk was tried; one reload at a time.
    reloaded_at: tokio::sync::Mutex<Option<Instant>>,
    /// Groups whose records archived at the delivery limit are dead-lettered.
    dead_letter_targets: Mutex<BTreeMap<String, DeadLetterTarget>>,
}

/// An in-process broker implementing KIP-932 share groups and KIP-1289 transactional
/// acknowledgements, durable through its journal. Cheap to clone.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use shareflow_broker::{BrokerOptions, EmbeddedBroker};
/// use shareflow_share::*;
///
/// let broker = EmbeddedBroker::open(BrokerOptions::in_memory()).await?;
/// broker.create_topic("in", 1).await?;
/// broker.create_topic("out", 1).await?;
/// broker.produce(vec![ProducerRecord::new("in", 0, "hello")]).await?;
///
/// let config = ShareConfig::builder().acknowledgement_mode(AcknowledgementMode::Transactional).build()?;
/// let mut consumer = broker.consumer("group", config).await?;
/// consumer.subscribe(&["in"]).await?;
/// let coordinator = broker.transaction_coordinator("group", "job").await?;
///
/// let txn = coordinator.begin_transaction(&TransactionId::new("group", "job", 1)?, Duration::from_secs(60)).await?;
/// let records = consumer.poll(500, Duration::from_secs(1)).await?;
/// coordinator.send(&txn, vec![ProducerRecord::new("out", 0, "HELLO")]).await?;
/// consumer.acknowledge_batches_transactional(&ShareAcknowledgements::from_records(&records, AcknowledgeType::Accept)?, &txn).await?;
/// coordinator.prepare_transaction(&txn.id).await?;
/// coordinator.commit_transaction(&txn.id).await?;
///
/// assert_eq!(broker.record_status("group", &TopicPartition::new("in", 0), 0).await?.state, RecordState::Acknowledged);
/// assert_eq!(broker.fetch(&TopicPartition::new("out", 0), 0, 10, IsolationLevel::ReadCommitted).await?.len(), 1);
/// # Ok::<(), shareflow_share::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct EmbeddedBroker {
    inner: Arc<Inner>,
}

impl EmbeddedBroker {
    /// Opens the broker, recovering whatever its journal holds (decision 0003,
    /// "Restart": ACQUIRED records come back AVAILABLE, or ARCHIVED at the delivery
    /// limit; everything else is as it was).
    ///
    /// A local directory is locked for the broker's life: a second read-write open,
    /// from this process or another, fails with [`Error::DirectoryLocked`]. Use
    /// [`open_read_only`](Self::open_read_only) to inspect a directory a live broker
    /// holds. A lock this process just released but a child being spawned still holds a
    /// copy of (until its `exec`) is waited for, up to 3 s.
    pub async fn open(options: BrokerOptions) -> Result<Self> {
        let dir_lock = match &options.local {
            Some((dir, _)) => {
                let dir = dir.clone();
                // Blocking: it may wait out a spawning child's copy of the lock.
                let acquired = tokio::task::spawn_blocking(move || DirLock::acquire(&dir)).await;
                Some(acquired.map_err(|e| Error::Internal(format!("the directory lock task failed: {e}")))??)
            }
            None => None,
        };
        let default_config = options.default_config.clone();
        default_config.validate()?;
        let broker = Self::recover(options, dir_lock, false).await?;
        broker.execute(Command::Restarted { default_config }).await?;
        if broker.inner.journal.stores_records() {
            broker.move_inline_batches().await?;
        }
        Ok(broker)
    }

    /// Opens the broker's journal for inspection only: it takes no lock, changes
    /// nothing on disk (a torn tail is read up to its last good entry and left alone),
    /// and works while a live broker holds the directory. Every write fails with
    /// [`Error::ReadOnly`]. What it shows is the durable state as of the open, with
    /// the passage of time applied in memory (timed-out transactions show ABORTED).
    pub async fn open_read_only(options: BrokerOptions) -> Result<Self> {
        // A live broker may delete a segment between our listing and our read of it
        // (after a snapshot): list again.
        let mut last_error = None;
        for _ in 0..5 {
            match Self::recover(options.clone(), None, true).await {
                Ok(broker) => return Ok(broker),
                Err(e @ Error::Storage { .. }) => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Internal("read-only open did not run".into())))
    }

    /// Batches of an older format sat in its snapshots, in memory: one `Rewrite` entry
    /// each moves them into a segment, all in one group commit, so that the next
    /// snapshot holds no records (decision 0020).
    async fn move_inline_batches(&self) -> Result<()> {
        let last = {
            let mut st = self.state()?;
            let inline = st.inline_batches();
            if inline.is_empty() {
                return Ok(());
            }
            tracing::info!(batches = inline.len(), "moving the records of an older broker format into segments");
            let now_ms = self.inner.clock.now_ms().max(st.last_now_ms);
            let mut last = None;
            for (tp, base_offset, batch) in inline {
                let entry = Entry { now_ms, command: Command::Rewrite { tp: tp.clone(), base_offset, batch } };
                let (result, expired) = st.apply(&entry);
                // As `execute` journals: the entry carries its expiry; a Tick carries an
                // expiry alone.
                if matches!(result?, Outcome::Produced { .. }) {
                    let written = self.inner.journal.append(&entry)?;
                    st.store_batch(&tp, base_offset, written.lsn);
                    last = Some(written);
                } else if expired {
                    last = Some(self.inner.journal.append(&Entry { now_ms, command: Command::Tick })?);
                }
            }
            let events = std::mem::take(&mut st.events);
            drop(st);
            self.publish(&events);
            last
        };
        match last {
            Some(written) => self.inner.journal.sync(written).await,
            None => Ok(()),
        }
    }

    async fn recover(options: BrokerOptions, dir_lock: Option<DirLock>, read_only: bool) -> Result<Self> {
        let fresh = BrokerState::new(options.default_config.clone());
        let (journal, recovered) =
            JournalCore::recover(options.store, options.root, options.local, fresh, read_only, options.tuning).await?;
        if let Some(tail) = &recovered.truncated_tail {
            tracing::warn!(%tail, read_only, "embedded broker recovered after cutting back a torn journal tail");
        }
        let o = recovered.opened;
        tracing::info!(
            snapshot_mib = o.snapshot_bytes as f64 / (1 << 20) as f64,
            snapshot_secs = o.snapshot_secs,
            journal_mib = o.journal_bytes as f64 / (1 << 20) as f64,
            journal_entries = o.journal_entries,
            journal_secs = o.journal_secs,
            read_only,
            "embedded broker opened"
        );
        let first_retention_ms = retention::retention_first_due(
            options.clock.now_ms(),
            recovered.state.last_now_ms,
            options.retention_check_ms,
        );
        Ok(EmbeddedBroker {
            inner: Arc::new(Inner {
                state: Mutex::new(recovered.state),
                journal,
                clock: options.clock,
                metrics: Metrics::default(),
                wake: Notify::new(),
                round_robin: AtomicU64::new(0),
                closed: AtomicBool::new(false),
                read_only,
                dir_lock: Mutex::new(dir_lock),
                retention: (options.retention.limits() || options.topic_retention.values().any(Retention::limits))
                    .then_some((options.retention, options.topic_retention)),
                retention_due_ms: AtomicU64::new(first_retention_ms),
                retention_every_ms: options.retention_check_ms,
                opened: recovered.opened,
                default_config: options.default_config,
                reloaded_at: tokio::sync::Mutex::new(None),
                dead_letter_targets: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The state, for a call that may change it or read it: fails once the broker is
    /// closed, or once a journal write failed (memory may then be ahead of storage).
    fn state(&self) -> Result<MutexGuard<'_, BrokerState>> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed { what: "embedded broker".into() });
        }
        self.inner.journal.check_healthy()?;
        self.inner.state.lock().map_err(|_| Error::Internal("broker state lock poisoned".into()))
    }

    fn publish(&self, events: &super::state::Events) {
        self.inner.metrics.record(events);
        if events.wake {
            self.inner.wake.notify_waiters();
        }
    }

    /// Runs one command: expire by time, apply, journal, wait until durable. The
    /// caller sees the outcome only once it is durable; if the journal write fails,
    /// the journal is poisoned and every later call, reads included, fails.
    async fn execute(&self, command: Command) -> Result<Outcome> {
        if self.inner.read_only {
            return Err(Error::ReadOnly { what: format!("{command:?}") });
        }
        self.reload_after_disk_full().await?;
        let (result, written, wrote, events) = {
            let mut st = self.state()?;
            st.admit(&command)?;
            let now_ms = self.inner.clock.now_ms().max(st.last_now_ms);
            let entry = Entry { now_ms, command };
            let (result, expired) = st.apply(&entry);
            // A command that changed nothing still answers from a state that may hold
            // others' entries not yet durable (a no-op commit after another caller's
            // commit): it waits for them too, which costs nothing once they are.
            let (mut written, mut wrote) = if matches!(&result, Ok(outcome) if outcome.changed_state()) {
                let written = self.inner.journal.append(&entry)?;
                if let (
                    Command::Append { tp, .. } | Command::Rewrite { tp, .. } | Command::DeadLetter { tp, .. },
                    Ok(Outcome::Produced { base_offset }),
                ) = (&entry.command, &result)
                {
                    if self.inner.journal.stores_records() {
                        // The journal has the buffer now: the state keeps where it lies.
                        st.store_batch(tp, *base_offset, written.lsn);
                    }
                }
                (written, true)
            } else if expired {
                (self.inner.journal.append(&Entry { now_ms, command: Command::Tick })?, true)
            } else {
                (self.inner.journal.last_written(), false)
            };
            if let Some(last) = self.apply_retention(&mut st, now_ms)? {
                (written, wrote) = (last, true);
            }
            if let Some(last) = self.after_limit_archived(&mut st, now_ms)? {
                (written, wrote) = (last, true);
            }
            (result, written, wrote, std::mem::take(&mut st.events))
        };
        self.publish(&events);
        self.inner.journal.sync(written).await?;
        // The command is durable: a failed snapshot must not turn it into an error (the
        // caller would retry what is done). The journal simply grows until the next one.
        if wrote {
            if let Err(e) = self.maybe_snapshot() {
                tracing::warn!(error = %e, "journal snapshot failed; will try again later");
            }
        }
        result
    }

    /// Reads the state once it is durable: first the passage of time (a `Tick`, which
    /// journals only what expired and waits until everything applied so far is durable),
    /// then `f` on a state with nothing undurable in it. A read never shows what a
    /// reopen would roll back. A read-only broker applies the time in memory only.
    async fn read<R>(&self, f: impl Fn(&BrokerState) -> R) -> Result<R> {
        if self.inner.read_only {
            let mut st = self.state()?;
            let now_ms = self.inner.clock.now_ms().max(st.last_now_ms);
            st.expire(now_ms);
            st.events = Default::default();
            return Ok(f(&st));
        }
        // Writers that keep appending between the tick and the lock can make a reader go
        // round a few times, never forever.
        const ROUNDS: usize = 10_000;
        for _ in 0..ROUNDS {
            self.execute(Command::Tick).await?;
            let st = self.state()?;
            if self.inner.journal.durable_lsn() >= self.inner.journal.next_lsn().saturating_sub(1) {
                return Ok(f(&st));
            }
        }
        Err(Error::Storage {
            path: "journal".into(),
            reason: format!("a read waited {ROUNDS} group commits for the journal to catch up; retry"),
            source: None,
        })
    }

    /// Starts a snapshot when the journal has grown enough, and returns at once. Under
    /// the state lock it only clones the state (the records are shared, not copied); the
    /// encoding and the write run in the background, so neither the broker nor the
    /// caller (often a source whose records' locks are ticking) waits the seconds a
    /// large snapshot takes.
    fn maybe_snapshot(&self) -> Result<()> {
        if !self.inner.journal.wants_snapshot() || !self.inner.journal.begin_snapshot() {
            return Ok(());
        }
        let snapshot = self.state().map(|st| (self.inner.journal.last_written(), st.clone()));
        match snapshot {
            Ok((lsn, state)) => {
                self.inner.journal.snapshot_detached(lsn, state);
                Ok(())
            }
            Err(e) => {
                self.inner.journal.abandon_snapshot();
                Err(e)
            }
        }
    }

    /// What opening the broker directory read (the snapshot, then the journal after it)
    /// and how long each part took: a reopen's cost does not grow with the records held,
    /// only with the metadata in the snapshot and the journal written since it.
    pub fn opened(&self) -> Opened {
        self.inner.opened
    }

    /// Processes timeouts now (lock expiry, transaction timeout, retention) without
    /// other work. Writes to the journal only when something expired.
    pub async fn tick(&self) -> Result<()> {
        self.execute(Command::Tick).await.map(|_| ())
    }

    /// Stops the broker and releases its directory lock; later calls fail with
    /// [`Error::Closed`]. Everything acknowledged to a caller is already durable, so
    /// there is nothing to flush.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.journal.close();
        self.inner.wake.notify_waiters();
        if let Ok(mut lock) = self.inner.dir_lock.lock() {
            lock.take();
        }
    }

    /// The lsn of the last journal entry, for tests that check what is journaled.
    #[doc(hidden)]
    pub fn journal_last_lsn(&self) -> u64 {
        self.inner.journal.next_lsn().saturating_sub(1)
    }

    /// Transactions the broker still keeps, decided ones within retention included.
    pub async fn transaction_count(&self) -> Result<usize> {
        self.read(|st| st.txn_count()).await
    }

    /// Creates a topic; creating it again with the same partition count is a no-op.
    pub async fn create_topic(&self, name: &str, partitions: u32) -> Result<()> {
        self.execute(Command::CreateTopic { name: name.to_string(), partitions }).await.map(|_| ())
    }

    /// Sets a group's configuration (lock duration, delivery limit, caps). The config
    /// is checked by [`ShareConfig::validate`] however it was made.
    pub async fn configure_group(&self, group: &str, config: ShareConfig) -> Result<()> {
        validate_group_id(group)?;
        config.validate()?;
        self.execute(Command::ConfigureGroup { group: group.to_string(), config }).await.map(|_| ())
    }

    fn partition_for(&self, record: &ProducerRecord, partitions: usize) -> i32 {
        match (&record.partition, &record.key) {
            (Some(p), _) => *p,
            (None, Some(key)) => (crc32c_of(key) % partitions as u32) as i32,
            (None, None) => (self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % partitions as u64) as i32,
        }
    }

    async fn produce_inner(
        &self,
        records: Vec<ProducerRecord>,
        txn: Option<&TransactionHandle>,
    ) -> Result<Vec<(TopicPartition, i64)>> {
        // After a full disk the directory is read again here, not only in `execute`:
        // the partition counts below come from the state, which refuses reads while the
        // journal is failed.
        self.reload_after_disk_full().await?;
        // Group consecutive records by partition, keeping order within each partition.
        let mut batches: Vec<(TopicPartition, Vec<LogRecord>, Vec<usize>)> = Vec::new();
        {
            let st = self.state()?;
            // A record without a timestamp gets the broker's time, as Kafka's producers
            // stamp one: time retention counts from it.
            let now_ms = i64::try_from(self.inner.clock.now_ms().max(st.last_now_ms)).unwrap_or(i64::MAX);
            for (i, r) in records.into_iter().enumerate() {
                let n = st
                    .partition_count(&r.topic)
                    .ok_or_else(|| Error::UnknownTopicPartition { topic: r.topic.to_string(), partition: -1 })?;
                let tp = TopicPartition::new(r.topic.clone(), self.partition_for(&r, n));
                let timestamp_ms = if r.timestamp_ms == 0 { now_ms } else { r.timestamp_ms };
                let rec = LogRecord { key: r.key, value: r.value, timestamp_ms, headers: r.headers };
                match batches.iter_mut().find(|(t, _, _)| *t == tp) {
                    Some((_, recs, idx)) => {
                        recs.push(rec);
                        idx.push(i);
                    }
                    None => batches.push((tp, vec![rec], vec![i])),
                }
            }
        }
        let total: usize = batches.iter().map(|b| b.2.len()).sum();
        let mut out = vec![(TopicPartition::new("", 0), 0); total];
        for (tp, recs, idx) in batches {
            let txn = txn.map(|h| (h.id.clone(), h.epoch));
            let batch = batch::encode(&recs);
            drop(recs);
            if batch.len() > MAX_BATCH_BYTES {
                return Err(Error::InvalidRequest(format!(
                    "a produce of {} bytes to {tp} is larger than the {MAX_BATCH_BYTES} bytes one journal entry holds; \
                     send it in smaller calls",
                    batch.len()
                )));
            }
            match self.execute(Command::Append { tp: tp.clone(), txn, batch }).await? {
                Outcome::Produced { base_offset } => {
                    for (k, i) in idx.into_iter().enumerate() {
                        out[i] = (tp.clone(), base_offset + k as i64);
                    }
                }
                other => return Err(Error::Internal(format!("produce returned {other:?}"))),
            }
        }
        Ok(out)
    }

    /// Appends records outside any transaction; returns each one's partition and offset.
    pub async fn produce(&self, records: Vec<ProducerRecord>) -> Result<Vec<(TopicPartition, i64)>> {
        self.produce_inner(records, None).await
    }

    /// A plain fetch from `offset`: up to `max` records, read_committed or not.
    pub async fn fetch(
        &self,
        tp: &TopicPartition,
        offset: i64,
        max: usize,
        isolation: IsolationLevel,
    ) -> Result<Vec<FetchedRecord>> {
        let journal = &self.inner.journal;
        self.read(|st| {
            let (records, _) = st.read(tp, offset, max, isolation, &|tp, b| journal.read_batch(tp, b))?;
            Ok(records.into_iter().map(|(offset, r)| FetchedRecord::new(offset, r)).collect())
        })
        .await?
    }

    /// Reads a whole partition from the start (read_committed or not). For checkers.
    pub async fn fetch_all(&self, tp: &TopicPartition, isolation: IsolationLevel) -> Result<Vec<FetchedRecord>> {
        self.fetch(tp, 0, usize::MAX, isolation).await
    }

    /// One past the last offset of a partition.
    pub async fn end_offset(&self, tp: &TopicPartition) -> Result<i64> {
        self.read(|st| st.log(tp).map(|l| l.end())).await?
    }

    /// The log start offset of a partition: retention deleted everything below it.
    pub async fn start_offset(&self, tp: &TopicPartition) -> Result<i64> {
        self.read(|st| st.log(tp).map(|l| l.start())).await?
    }

    /// The bytes of keys and values a partition's log holds (what `retention.bytes`
    /// counts).
    pub async fn log_bytes(&self, tp: &TopicPartition) -> Result<u64> {
        self.read(|st| st.log(tp).map(|l| l.bytes())).await?
    }

    /// The last stable offset: read_committed readers stop before open transactions.
    pub async fn last_stable_offset(&self, tp: &TopicPartition) -> Result<i64> {
        self.read(|st| st.log(tp).map(|l| l.last_stable_offset())).await?
    }

    /// Number of partitions of a topic.
    pub fn partition_count(&self, topic: &str) -> Result<usize> {
        self.state()?
            .partition_count(topic)
            .ok_or_else(|| Error::UnknownTopicPartition { topic: topic.to_string(), partition: -1 })
    }

    /// The state of one record in a group; an error when the offset does not exist.
    pub async fn record_status(&self, group: &str, tp: &TopicPartition, offset: i64) -> Result<RecordStatus> {
        self.read(|st| {
            st.record_status(group, tp, offset).ok_or_else(|| Error::UnknownTopicPartition {
                topic: format!("{} (offset {offset} does not exist in)", tp.topic),
                partition: tp.partition,
            })
        })
        .await?
    }

    /// The runs of equal state of one share partition: `(first, last, state)`.
    pub async fn share_partition_runs(&self, group: &str, tp: &TopicPartition) -> Result<Vec<(i64, i64, RecordState)>> {
        self.read(|st| st.share_partition_runs(group, tp)).await
    }

    /// Size figures of one share partition; `None` if the group never fetched from it.
    pub async fn share_partition_info(&self, group: &str, tp: &TopicPartition) -> Result<Option<SharePartitionInfo>> {
        self.read(|st| {
            st.share_partition(group, tp).map(|sp| SharePartitionInfo {
                fetched_end: sp.fetched_end(),
                in_flight: sp.in_flight(),
                run_count: sp.run_count(),
            })
        })
        .await
    }

    /// How many records of `topic` are in each state for `group`.
    pub async fn backlog(&self, group: &str, topic: &str) -> Result<Backlog> {
        self.read(|st| {
            let partitions = st
                .partition_count(topic)
                .ok_or_else(|| Error::UnknownTopicPartition { topic: topic.to_string(), partition: -1 })?;
            let mut b = Backlog::default();
            for p in 0..partitions as i32 {
                let tp = TopicPartition::new(topic, p);
                let log = st.log(&tp)?;
                let (start, end) = (log.start(), log.end());
                let mut covered = 0;
                for (first, last, state) in st.share_partition_runs(group, &tp) {
                    let n = (last - first + 1) as u64;
                    covered += n;
                    match state {
                        RecordState::Available => b.available += n,
                        RecordState::Acquired => b.acquired += n,
                        RecordState::Locked => b.locked += n,
                        RecordState::Acknowledged => b.acknowledged += n,
                        RecordState::Archived => b.archived += n,
                    }
                }
                // Never delivered: from the log start (retention deletes the rest) on.
                b.available += (end.saturating_sub(start) as u64).saturating_sub(covered);
            }
            Ok(b)
        })
        .await?
    }

    /// The highest checkpoint id `(group, prefix)` ever began a transaction for,
    /// including transactions removed after retention: the next one must be higher.
    pub async fn highest_checkpoint_id(&self, group: &str, prefix: &str) -> Result<Option<u64>> {
        self.read(|st| st.highest_checkpoint(group, prefix)).await
    }

    /// The configuration of `group`: what [`configure_group`](Self::configure_group)
    /// set, or the broker's default. A member joins with it, choosing only its mode:
    /// `broker.consumer(g, broker.group_config(g).await?.with_acknowledgement_mode(m))`.
    pub async fn group_config(&self, group: &str) -> Result<ShareConfig> {
        self.read(|st| st.group_config(group).clone()).await
    }

    /// Every transaction the broker knows: pending ones, and decided ones until
    /// `share.transaction.retention.ms` has passed.
    pub async fn transactions(&self) -> Result<Vec<TransactionInfo>> {
        self.read(|st| st.txns().map(TransactionInfo::of).collect()).await
    }

    /// The ONGOING and PREPARE transactions of every group. PREPARE ones wait for
    /// their coordinator, forever if need be: this is how an operator finds them.
    pub async fn pending_transactions(&self) -> Result<Vec<TransactionInfo>> {
        self.read(|st| st.pending_txns().map(TransactionInfo::of).collect()).await
    }

    /// The state of one transaction (`Empty` if unknown, or removed after retention).
    pub async fn transaction_state(&self, id: &TransactionId) -> Result<TransactionState> {
        self.read(|st| st.txn(id).map_or(TransactionState::Empty, |t| t.state)).await
    }

    /// A snapshot of the metrics (KIP-1289's five, under their names, and more).
    pub async fn metrics(&self) -> Result<MetricsSnapshot> {
        let (active, prepared) = self
            .read(|st| {
                let mut active = 0;
                let mut prepared = 0;
                for t in st.pending_txns() {
                    active += 1;
                    prepared += u64::from(t.state == TransactionState::Prepare);
                }
                (active, prepared)
            })
            .await?;
        Ok(self.inner.metrics.snapshot(active, prepared))
    }

    /// A new member of `group`. `config` supplies the member's acknowledgement mode;
    /// every other key must equal the group's configuration (from
    /// [`configure_group`](Self::configure_group), or the broker's default), or the
    /// join fails with [`Error::InvalidConfig`] naming the key. A member in
    /// transactional mode is refused ACCEPT outside a transaction by the broker itself.
    pub async fn consumer(&self, group: &str, config: ShareConfig) -> Result<EmbeddedShareConsumer> {
        validate_group_id(group)?;
        config.validate()?;
        let mode = config.acknowledgement_mode();
        let join = Command::Join { group: group.to_string(), topics: Vec::new(), config };
        let member = match self.execute(join).await? {
            Outcome::Joined { member } => member,
            other => return Err(Error::Internal(format!("join returned {other:?}"))),
        };
        Ok(EmbeddedShareConsumer {
            broker: self.clone(),
            group: group.to_string(),
            mode,
            member,
            member_id: MemberId(format!("member-{member}")),
            pending: ShareAcknowledgements::new(),
            implicit: Vec::new(),
            cursor: member as u32,
            closed: false,
        })
    }

    /// The transaction coordinator for `(group, prefix)`. Creating it bumps the
    /// prefix's epoch: older coordinators and their transactions' writers are fenced,
    /// and their ONGOING transactions are aborted. PREPARE ones are left for this one to
    /// decide.
    pub async fn transaction_coordinator(&self, group: &str, prefix: &str) -> Result<EmbeddedTransactionCoordinator> {
        validate_group_id(group)?;
        validate_prefix(prefix)?;
        match self.execute(Command::InitProducer { group: group.to_string(), prefix: prefix.to_string() }).await? {
            Outcome::Epoch(epoch) => Ok(EmbeddedTransactionCoordinator {
                broker: self.clone(),
                group: group.to_string(),
                prefix: prefix.to_string(),
                epoch,
            }),
            other => Err(Error::Internal(format!("init returned {other:?}"))),
        }
    }

    /// The ONGOING and PREPARE transactions of `group`; a read, fine on a read-only
    /// broker.
    pub async fn pending(&self, group: &str) -> Result<Vec<PendingTransaction>> {
        self.read(|st| {
            st.pending_txns()
                .filter(|t| t.id.group_id() == group)
                .map(|t| PendingTransaction {
                    id: t.id.clone(),
                    state: t.state,
                    epoch: t.epoch,
                    create_time_ms: t.create_time_ms,
                    prepare_time_ms: t.prepare_time_ms,
                    pending_acks: t.acks.clone(),
                    produced_records: t.produced_records,
                })
                .collect()
        })
        .await
    }

    fn member_key(&self, group: &str, member: &MemberId) -> Result<MemberKey> {
        member
            .0
            .strip_prefix("member-")
            .and_then(|n| n.parse().ok())
            .filter(|&k| self.state().is_ok_and(|st| st.is_member(group, k)))
            .ok_or_else(|| Error::InvalidRequest(format!("{member} is not a member of share group {group}")))
    }
}

fn crc32c_of(bytes: &[u8]) -> u32 {
    // A stable hash, so a key always maps to the same partition across restarts.
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}
