//! [`KafkaTransactions`]: the transactional participant on Kafka. T(n) is a real Kafka
//! transaction on one of a bounded pool of transactional ids (decision 0008: the
//! generation's slot `n mod K`); the participant also recovers transactions a crash left
//! open, and takes over a dead or adopted instance's work. What to do with each
//! transaction it finds is decided by [`super::ledger::recovery::plan`], which claims lost and
//! which offsets to replay by [`super::claims`]; this module carries the decisions out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use krafka::producer::{DeliveryHandle, Producer, TransactionState, TransactionalProducer};
use krafka::CloseOptions;
use shareflow_checkpoint::{CheckpointId, TransactionId};
use shareflow_runtime::{
    JobSettings, Participant, PendingTransaction, PrepareOutcome, Result, RuntimeError, TransactionParticipant,
    TransactionTemplate,
};

use super::client::{
    await_all, enqueue_all, kafka_error, CachedProducer, KafkaCluster, KafkaTxnState, OUTPUT_BATCH_BYTES, OUTPUT_LINGER,
};
use super::ledger::recovery::{plan, RecoveryAction, Request};
use super::ledger::{Claimant, GroupLedger, LedgerEntry, LedgerLog, LedgerRange};
mod participant;

use super::txn_config::KafkaTransactionsConfig;
use super::txn_config::{check_slots, check_transaction_timeout, parse_slot_id, slot_for, slot_id, BROKER_MAX_TIMEOUT};
use crate::common::runtime_error;
use shareflow_share::sync::lock;
use shareflow_share::Record;
use shareflow_share::{Error, ErrorKind};

const NAME: &str = "kafka";

/// The configs of the intents and ledger topics. Nothing expires by time: an entry is
/// needed until compaction trims it (DeleteRecords). Compaction only moves the log's
/// start offset; the broker frees the disk a whole segment at a time, and never the
/// active one, so a segment rolls every 2 minutes (or 16 MiB) and what was trimmed
/// leaves the disk at the broker's next retention check (decision 0037).
const LEDGER_TOPIC_CONFIGS: &[(&str, &str)] =
    &[("retention.ms", "-1"), ("cleanup.policy", "delete"), ("segment.ms", "120000"), ("segment.bytes", "16777216")];

/// How long the intents tailer may take to catch up or to pass an intent.
const TAIL_TIMEOUT: Duration = Duration::from_secs(60);

struct Live {
    slot: u16,
    handles: Vec<DeliveryHandle>,
    /// Flushed, with its commit entry: a checkpoint may have decided it.
    prepared: bool,
}

/// The intents the current attempt wrote for one checkpoint.
#[derive(Default)]
struct CheckpointIntents {
    ranges: Vec<LedgerRange>,
    /// The highest offset of the intents topic they landed at.
    last_offset: i64,
}

/// The job's transactional participant on a real Kafka cluster: one Kafka transaction
/// per checkpoint on a bounded pool of transactional ids, the output of every sink
/// subtask in it, and the ledger that makes share acknowledgements exactly-once without
/// KIP-1289, across every shareflow instance of the share group (decision 0008).
pub struct KafkaTransactions {
    cluster: KafkaCluster,
    config: KafkaTransactionsConfig,
    template: Mutex<Option<TransactionTemplate>>,
    /// False for an adopter: it decides another prefix's transactions and owns nothing.
    owner: bool,
    /// The current attempt's generation (0 before the first `open`).
    generation: Mutex<u32>,
    /// One transactional producer per slot, initialised when the attempt opened.
    slots: Mutex<Vec<Arc<TransactionalProducer>>>,
    /// Producers of earlier attempts whose transaction was prepared when the attempt
    /// ended, by slot id: recovery's decision goes through them (closing one before
    /// would abort its transaction).
    held: Mutex<BTreeMap<String, Arc<TransactionalProducer>>>,
    live: Mutex<BTreeMap<CheckpointId, Live>>,
    intents: Mutex<BTreeMap<CheckpointId, CheckpointIntents>>,
    /// Open transactions of earlier attempts (or of an adopted prefix), by checkpoint
    /// id: the slot id that carries each.
    recovered: Mutex<BTreeMap<CheckpointId, String>>,
    /// The highest checkpoint id the commits topic names (open transactions included).
    highest_commit: Mutex<Option<CheckpointId>>,
    /// At-least-once writes: idempotent, not transactional.
    plain: CachedProducer,
    /// The ledger topics' reads and writes, and the replay reader.
    log: Arc<LedgerLog>,
    plain_handles: Mutex<Vec<DeliveryHandle>>,
    group: Arc<GroupLedger>,
    /// The commit notes being written after commits (and the compactions after them):
    /// closing waits for them, so that a retired instance leaves every commit noted.
    notes: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for KafkaTransactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransactions").field("cluster", &self.cluster).field("config", &self.config).finish()
    }
}

/// Reports a connector error as this participant's runtime error.
fn rt(e: Error) -> RuntimeError {
    runtime_error(NAME, e)
}

/// Reports a failed `op` (begin, prepare, commit, abort) of `txn` as the other
/// participants do: naming the participant, the operation and the transaction, with
/// the error's kind and the error as the source.
fn failed(op: &'static str, txn: &TransactionId, e: Error) -> RuntimeError {
    RuntimeError::participant(NAME, op, txn, e.kind(), e)
}

impl KafkaTransactions {
    /// A participant on `cluster`.
    pub fn new(cluster: KafkaCluster, config: KafkaTransactionsConfig) -> Arc<Self> {
        Self::build(cluster, config, true)
    }

    fn build(cluster: KafkaCluster, config: KafkaTransactionsConfig, owner: bool) -> Arc<Self> {
        let log = Arc::new(LedgerLog::new(cluster.clone(), config.transaction_timeout));
        Arc::new(Self {
            group: GroupLedger::new(cluster.clone(), log.clone()),
            cluster,
            config,
            template: Mutex::new(None),
            owner,
            generation: Mutex::new(0),
            slots: Mutex::new(Vec::new()),
            held: Mutex::new(BTreeMap::new()),
            live: Mutex::new(BTreeMap::new()),
            intents: Mutex::new(BTreeMap::new()),
            recovered: Mutex::new(BTreeMap::new()),
            highest_commit: Mutex::new(None),
            plain: CachedProducer::new(OUTPUT_LINGER, OUTPUT_BATCH_BYTES),
            log,
            plain_handles: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
        })
    }

    /// The cluster.
    pub fn cluster(&self) -> &KafkaCluster {
        &self.cluster
    }

    /// True in exactly-once mode.
    pub fn exactly_once(&self) -> bool {
        self.config.exactly_once
    }

    /// The current attempt's generation: its transactional ids are
    /// `{group}-{prefix}-g{generation}-s{slot}`. 0 before the first `open`.
    pub fn generation(&self) -> u32 {
        *lock(&self.generation)
    }

    /// Checks the transaction timeout against the job's checkpointing and the broker's
    /// `transaction.max.timeout.ms`, and the slot count. Call it before running the job.
    pub async fn validate(&self, checkpoint_interval: Duration, checkpoint_timeout: Duration) -> crate::Result<()> {
        if self.config.slots < 2 {
            return Err(Error::InvalidConfig {
                key: "slots".into(),
                value: self.config.slots.to_string(),
                rule: "must be at least 2: T(n+1) begins before T(n) commits".into(),
            });
        }
        let timeout = self.config.transaction_timeout;
        // Checked before asking the broker: a timeout too short fails without a cluster.
        check_transaction_timeout(timeout, checkpoint_interval + checkpoint_timeout, None)?;
        let broker_max = self.cluster.broker_config(BROKER_MAX_TIMEOUT).await?;
        check_transaction_timeout(timeout, checkpoint_interval + checkpoint_timeout, broker_max.as_deref())
    }

    fn template(&self) -> Result<TransactionTemplate> {
        lock(&self.template).clone().ok_or_else(|| RuntimeError::Internal("kafka transactions used before open".into()))
    }

    /// The commits topic of this job's prefix: `{group}-{prefix}-ledger`.
    pub fn ledger_topic(&self) -> Result<String> {
        Ok(commits_topic(&self.template()?))
    }

    /// The group's intents topic: `{group}-intents`.
    pub(crate) fn intents_topic(&self) -> Result<String> {
        Ok(intents_topic(self.template()?.group_id()))
    }

    fn me(&self) -> Result<Claimant> {
        Ok(Claimant::new(self.template()?.prefix(), self.generation()))
    }

    async fn plain_producer(&self) -> Result<Arc<Producer>> {
        self.plain.get(&self.cluster).await.map_err(rt)
    }

    fn slot_producer(&self, slot: u16) -> Result<Arc<TransactionalProducer>> {
        lock(&self.slots).get(usize::from(slot)).cloned().ok_or_else(|| {
            RuntimeError::Internal(format!("kafka slot {slot} has no producer; the attempt was not opened"))
        })
    }

    /// Writes records of checkpoint `checkpoint_id` to their topics: into
    /// T(checkpoint_id) in exactly-once mode, idempotently otherwise. Returns once they
    /// are queued; the checkpoint waits for their acknowledgement before it completes.
    pub async fn send(&self, checkpoint_id: CheckpointId, records: Vec<shareflow_share::ProducerRecord>) -> Result<()> {
        let records = records
            .into_iter()
            .map(|r| {
                let mut k = match r.value {
                    Some(v) => krafka::Record::new(r.topic.as_ref(), v),
                    None => krafka::Record::new(r.topic.as_ref(), bytes::Bytes::new()).without_value(),
                };
                if let Some(key) = r.key {
                    k = k.key(key);
                }
                if let Some(p) = r.partition {
                    k = k.partition(p);
                }
                k
            })
            .collect();
        self.send_records(checkpoint_id, records).await
    }

    /// [`send`](Self::send) for records already in the client's form (the sink's path).
    pub(crate) async fn send_records(&self, checkpoint_id: CheckpointId, records: Vec<krafka::Record>) -> Result<()> {
        if self.config.exactly_once {
            let slot = lock(&self.live).get(&checkpoint_id).map(|l| l.slot).ok_or_else(|| {
                RuntimeError::Internal(format!(
                    "T({checkpoint_id}) is not open on kafka; the sink ran ahead of its checkpoint"
                ))
            })?;
            let producer = self.slot_producer(slot)?;
            let p = &*producer;
            let handles =
                enqueue_all(records, &format!(" in T({checkpoint_id})"), |r| p.enqueue(r)).await.map_err(rt)?;
            if let Some(l) = lock(&self.live).get_mut(&checkpoint_id) {
                l.handles.extend(handles);
            }
        } else {
            let producer = self.plain_producer().await?;
            let p = &*producer;
            let handles = enqueue_all(records, "", |r| p.enqueue(r)).await.map_err(rt)?;
            lock(&self.plain_handles).extend(handles);
        }
        Ok(())
    }

    /// Durably records that `subtask` processes `ranges` in checkpoint `checkpoint_id`,
    /// in the group's intents topic. The source acknowledges the records at the share
    /// group only after this returns.
    pub async fn write_intent(
        &self,
        checkpoint_id: CheckpointId,
        subtask: u32,
        ranges: Vec<LedgerRange>,
    ) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        let entry = LedgerEntry::Intent { by: self.me()?, checkpoint_id, subtask, ranges };
        let offset = self.log.write(&self.intents_topic()?, &entry).await.map_err(rt)?;
        if let LedgerEntry::Intent { ranges, .. } = entry {
            self.group.cover_own(&ranges);
            let mut intents = lock(&self.intents);
            let e = intents.entry(checkpoint_id).or_default();
            e.last_offset = e.last_offset.max(offset);
            e.ranges.extend(ranges);
        }
        Ok(())
    }

    /// The group's claims, for the source: which deliveries are covered, and what to
    /// replay.
    pub(crate) fn group(&self) -> &Arc<GroupLedger> {
        &self.group
    }

    /// The replay work queued for this job's sources and not taken yet: offsets a
    /// recovery, an adoption, or a held claimant's late intent left to replay.
    pub fn queued_replay(&self) -> Vec<LedgerRange> {
        self.group.queued()
    }

    /// What the ledger reads of this participant cost so far: records read from the
    /// intents and commits topics, and their value bytes.
    pub fn ledger_reads(&self) -> LedgerReads {
        let (intents_entries, intents_bytes) = self.group.read_stats();
        let (commit_entries, commit_bytes) = self.log.read_stats();
        let (open_intents, index_ranges) = self.group.index_size();
        LedgerReads {
            entries: intents_entries + commit_entries,
            bytes: intents_bytes + commit_bytes,
            open_intents,
            index_ranges,
        }
    }

    /// Summarises and trims the ledger now, whatever was written since the last summary
    /// (a compaction otherwise runs after a commit once
    /// [`KafkaTransactionsConfig::ledger_summary_every`] entries were written). Returns
    /// the offset the intents topic now starts at, or `None` if nothing was done.
    pub async fn compact_ledger(&self) -> Result<Option<i64>> {
        let template = lock(&self.template).clone();
        let commits = template.as_ref().map(|t| (commits_topic(t), t.prefix().to_string()));
        let done = self.group.compact(commits.as_ref().map(|(t, p)| (t.as_str(), p.as_str()))).await.map_err(rt)?;
        Ok(done.map(|c| c.upto))
    }

    /// After a commit of checkpoint `checkpoint_id`: the note that it committed, and a
    /// compaction when enough was written since the last. Both run in the background: a
    /// lost note only delays trimming until the next take-over writes it again.
    fn after_commit(&self, checkpoint_id: CheckpointId) {
        let Ok(me) = self.me() else { return };
        let group = self.group.clone();
        let every = i64::try_from(self.config.ledger_summary_every).unwrap_or(i64::MAX);
        let template = lock(&self.template).clone();
        let owner = self.owner;
        let note = tokio::spawn(async move {
            if let Err(e) = group.write_note(me.clone(), checkpoint_id).await {
                tracing::warn!(claimant = %me, checkpoint = checkpoint_id, error = %e, "could not write a commit note");
                return;
            }
            if !owner || group.unsummarised_entries() < every {
                return;
            }
            let commits = template.as_ref().map(|t| (commits_topic(t), t.prefix().to_string()));
            if let Err(e) = group.compact(commits.as_ref().map(|(t, p)| (t.as_str(), p.as_str()))).await {
                tracing::warn!(error = %e, "could not compact the ledger; it is tried again after a later commit");
            }
        });
        let mut notes = lock(&self.notes);
        notes.retain(|h| !h.is_finished());
        notes.push(note);
    }

    /// The checkpoint ids of this job's prefix whose `Commit` entry is visible
    /// read_committed: checkpoints whose T(n) committed.
    pub async fn committed_checkpoints(&self) -> Result<BTreeSet<CheckpointId>> {
        let topic = self.ledger_topic()?;
        Ok(self.log.commits(&topic, true).await.map_err(rt)?.into_iter().map(|(_, e, _)| e).collect())
    }

    /// Reads the records of `ranges` from their topics' logs, for replay. Offsets the log
    /// no longer holds (retention deleted them) are reported and skipped: their output
    /// is lost, the one case the ledger cannot repair.
    pub(crate) async fn read_ranges(&self, ranges: &[LedgerRange]) -> Result<Vec<Record>> {
        self.log.read_ranges(ranges).await.map_err(rt)
    }

    /// Fences the transactional id `id`: a new producer with it aborts whatever
    /// transaction the id has open, and the producer that held it can write nothing
    /// more.
    async fn fence(&self, id: &str) -> crate::Result<()> {
        let p = self
            .cluster
            .client()
            .producer()
            .transaction_timeout(self.config.transaction_timeout)
            .build_transactional(id.to_string())
            .await
            .map_err(|e| kafka_error(format!("fence {id} (a new producer with its id aborts it)"), e))?;
        let _ = p.close().await;
        Ok(())
    }

    /// Fences every id of `ids` at once.
    async fn fence_all(&self, ids: &[String]) -> crate::Result<()> {
        let results = futures::future::join_all(ids.iter().map(|id| self.fence(id))).await;
        results.into_iter().collect()
    }

    /// The slot ids of `template`'s prefix the broker knows, with generation, slot and
    /// state: only those in `states` unless it is empty. Lists only.
    async fn listed(
        &self,
        template: &TransactionTemplate,
        states: &[KafkaTxnState],
    ) -> Result<Vec<(String, u32, u16, KafkaTxnState)>> {
        let mut out = Vec::new();
        for (id, state) in self.cluster.list_transactions(states).await.map_err(rt)? {
            if let Some((generation, slot)) = parse_slot_id(&id, template) {
                out.push((id, generation, slot, state));
            }
        }
        Ok(out)
    }

    /// True if `generation` is this attempt's own (its ids are live here).
    fn is_current(&self, template: &TransactionTemplate, generation: u32) -> bool {
        self.owner && generation == self.generation() && lock(&self.template).as_ref() == Some(template)
    }

    /// Aborts every open transaction of `template`'s prefix (other than this attempt's)
    /// that never prepared: no checkpoint can cover it, and left open it would hold its
    /// topics' read_committed readers back. Reports the prepared ones, by checkpoint id,
    /// and remembers which slot id carries each.
    ///
    /// `read_only` (a dry run of `txn resolve`) fences nothing: what never prepared is
    /// left as it is (opening the prefix aborts it) and not reported.
    async fn scan_open(&self, template: &TransactionTemplate, read_only: bool) -> Result<Vec<CheckpointId>> {
        let commits_topic = commits_topic(template);
        let mut commits: Option<Vec<(u32, CheckpointId, u16)>> = None;
        let mut prepared = Vec::new();
        for (id, generation, slot, _) in self.listed(template, &[KafkaTxnState::Ongoing]).await? {
            if self.is_current(template, generation) {
                continue;
            }
            let described = self.cluster.describe_transaction(&id).await.map_err(rt)?;
            match plan(Request::Found, described.as_ref(), &commits_topic) {
                RecoveryAction::AwaitDecision => {
                    if commits.is_none() {
                        commits = Some(self.log.commits(&commits_topic, false).await.map_err(rt)?);
                    }
                    // The open transaction of a slot is the last one begun on it: its
                    // commit entry names the highest checkpoint id of that slot.
                    let n = commits
                        .iter()
                        .flatten()
                        .filter(|(g, _, s)| *g == generation && *s == slot)
                        .map(|(_, e, _)| *e)
                        .max();
                    match n {
                        Some(n) => {
                            lock(&self.recovered).insert(n, id);
                            prepared.push(n);
                        }
                        None if read_only => {}
                        None => {
                            tracing::warn!(%id, "recovery: prepared but its commit entry is missing; aborting it");
                            self.fence(&id).await.map_err(rt)?;
                        }
                    }
                }
                RecoveryAction::Fence if read_only => {}
                RecoveryAction::Fence => {
                    tracing::info!(%id, "recovery: aborting a transaction that never prepared");
                    self.fence(&id).await.map_err(rt)?;
                }
                _ => {}
            }
        }
        Ok(prepared)
    }

    /// The slot id that carries T(n) of `txn`'s prefix, found by a scan if not known.
    async fn recovered_id(&self, txn: &TransactionId) -> Result<Option<String>> {
        let n = txn.checkpoint_id();
        if let Some(id) = lock(&self.recovered).get(&n) {
            return Ok(Some(id.clone()));
        }
        let template = TransactionTemplate::new(txn.group_id(), txn.prefix())?;
        self.scan_open(&template, false).await?;
        Ok(lock(&self.recovered).get(&n).cloned())
    }

    /// Prepare of a transaction this attempt does not hold live: what the broker says
    /// decides ([`plan`]).
    async fn prepare_not_live(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        let Some(id) = self.recovered_id(txn).await? else { return Ok(PrepareOutcome::AlreadyAborted) };
        let described = self.cluster.describe_transaction(&id).await.map_err(|e| failed("prepare", txn, e))?;
        let template = TransactionTemplate::new(txn.group_id(), txn.prefix())?;
        match plan(Request::Prepare, described.as_ref(), &commits_topic(&template)) {
            RecoveryAction::AwaitDecision | RecoveryAction::AlreadyCommitted => Ok(PrepareOutcome::Prepared),
            RecoveryAction::AlreadyAborted => Ok(PrepareOutcome::AlreadyAborted),
            RecoveryAction::CannotPrepare { state } => Err(failed(
                "prepare",
                txn,
                Error::kafka(
                    format!("prepare {txn}"),
                    format!(
                        "the broker holds {id} {state} without the commit entry, and this instance did not begin \
                         it: the producer that wrote it is gone with whatever it still held, so it cannot \
                         prepare. Abort it; its checkpoint's records are replayed through the ledger"
                    ),
                    ErrorKind::Internal,
                ),
            )),
            other => Err(plan_bug("prepare", txn, &other)),
        }
    }

    /// The job stopped: closes every client this participant holds. The attempt retires
    /// as before a new one ([`retire_attempt`](Self::retire_attempt)); then the prepared
    /// transactions it held stay open for the next incarnation ([`leave_prepared`]). The
    /// participant may open again afterwards: its clients are built anew.
    async fn close_clients(&self) {
        self.group.stop().await;
        // The template stays: the ledger can still be read (committed checkpoints).
        let template = lock(&self.template).clone();
        if let Some(t) = &template {
            if let Err(e) = self.retire_attempt(t).await {
                tracing::warn!(error = %e, "closing: an unprepared transaction could not be aborted; its timeout will");
            }
        }
        for (id, producer) in std::mem::take(&mut *lock(&self.held)) {
            leave_prepared(producer, &id);
        }
        // Every commit gets its note before the ledger's producer closes: the ledger
        // topic of a retired instance may be deleted, and the notes then say what it
        // committed (decision 0036).
        let notes = std::mem::take(&mut *lock(&self.notes));
        if tokio::time::timeout(CLOSE_LIMIT, futures::future::join_all(notes)).await.is_err() {
            tracing::warn!("commit notes still unwritten after {CLOSE_LIMIT:?}; the next take-over writes them");
        }
        self.plain.close(CLOSE_LIMIT).await;
        self.log.close(CLOSE_LIMIT).await;
    }

    /// Takes the producer held for slot id `id` (see `held`), if any.
    fn take_held(&self, id: &str) -> Option<Arc<TransactionalProducer>> {
        lock(&self.held).remove(id)
    }

    /// Closes this attempt's producers and forgets its transactions: a new attempt.
    /// Unprepared live transactions are aborted (buffered writes could otherwise open
    /// them again); prepared ones are left to recovery, which commits them if their
    /// checkpoint completed.
    async fn retire_attempt(&self, template: &TransactionTemplate) -> Result<()> {
        let stale: Vec<(CheckpointId, Live)> = std::mem::take(&mut *lock(&self.live)).into_iter().collect();
        let slots = std::mem::take(&mut *lock(&self.slots));
        let mut keep = BTreeSet::new();
        for (n, l) in stale {
            let Some(producer) = slots.get(usize::from(l.slot)) else { continue };
            if l.prepared {
                keep.insert(l.slot);
                continue;
            }
            let aborted = tokio::time::timeout(Duration::from_secs(10), producer.abort()).await;
            if !matches!(aborted, Ok(Ok(()))) {
                let id = slot_id(template, self.generation(), l.slot);
                self.fence(&id).await.map_err(|e| failed("abort", &template.transaction(n), e))?;
            }
        }
        let mut closing = Vec::new();
        for (slot, producer) in slots.into_iter().enumerate() {
            // A producer whose prepared transaction waits for recovery's decision is
            // held, not closed: closing would abort it.
            if keep.contains(&(slot as u16)) {
                lock(&self.held).insert(slot_id(template, self.generation(), slot as u16), producer);
            } else {
                closing.push(close_producer(producer));
            }
        }
        futures::future::join_all(closing).await;
        lock(&self.intents).clear();
        lock(&self.recovered).clear();
        lock(&self.plain_handles).clear();
        Ok(())
    }
}

/// Closes a transactional producer that holds no prepared transaction: an open one is
/// aborted first (what never prepared can never commit), then the producer is closed,
/// each step bounded.
async fn close_producer(producer: Arc<TransactionalProducer>) {
    if producer.state() == TransactionState::Open {
        let _ = tokio::time::timeout(CLOSE_LIMIT, producer.abort()).await;
    }
    let _ = producer.close_with(CloseOptions::new().timeout(CLOSE_LIMIT)).await;
}

/// Leaves the producer of a prepared transaction to the process's end when the job
/// stops: closing it would abort a transaction that the next incarnation's recovery may
/// commit (by its producer id and epoch), and Kafka without KIP-939 offers no way to
/// hand a transaction over. Dropping it would say "dropped without close()", as if this
/// were an accident; it is not, so it is forgotten on purpose. Its connections go with
/// the process, or with the transaction's timeout at the broker.
fn leave_prepared(producer: Arc<TransactionalProducer>, id: &str) {
    tracing::info!(%id, "leaving a prepared transaction to the next incarnation's recovery");
    std::mem::forget(producer);
}

/// The longest a closing client waits for each step.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// What a participant's ledger reads cost ([`KafkaTransactions::ledger_reads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerReads {
    /// Records read from the intents and commits topics.
    pub entries: u64,
    /// Their value bytes.
    pub bytes: u64,
    /// Intents the claim index holds: some offset they name is not done.
    pub open_intents: usize,
    /// Offset ranges the claim index holds.
    pub index_ranges: usize,
}

/// The commits topic of `template`'s prefix.
fn commits_topic(template: &TransactionTemplate) -> String {
    super::ledger::ledger_topic(template.group_id(), template.prefix())
}

/// The intents topic of share group `group`.
fn intents_topic(group: &str) -> String {
    format!("{group}-intents")
}

/// A plan answered `action` to a request that cannot yield it: a shareflow bug.
fn plan_bug(op: &'static str, txn: &TransactionId, action: &RecoveryAction) -> RuntimeError {
    RuntimeError::Internal(format!("kafka recovery planned {action:?} for the {op} of {txn}"))
}
