//! [`KafkaTransactions`]: the transactional participant on Kafka. T(n) is a real Kafka
//! transaction; the participant also recovers transactions a crash left open: what to
//! do with each is decided by [`super::recovery::plan`], and carried out here. The
//! ledger's I/O is [`super::ledger_log`]; DescribeTransactions, ListTransactions and
//! EndTxn are calls of [`KafkaCluster`], and queueing records on a producer is
//! [`super::client`]'s.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use krafka::producer::{DeliveryHandle, Producer, TransactionalProducer};
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{
    PendingTransaction, PrepareOutcome, Result, RuntimeError, TransactionParticipant, TransactionTemplate,
};

use super::client::{await_all, enqueue_all, CachedProducer, KafkaTxnDescription, KafkaTxnState};
use super::ledger::{AckLedger, LedgerEntry, LedgerPlan, LedgerRange};
use super::ledger_log::LedgerLog;
use super::recovery::{plan, RecoveryAction, Request};
use super::{kafka_error, KafkaCluster};
use crate::error::runtime_error;
use crate::error::Error;
use crate::share::Record;

const NAME: &str = "kafka";

/// The broker config that caps `transaction.timeout.ms`.
const BROKER_MAX_TIMEOUT: &str = "transaction.max.timeout.ms";

/// Producer batches: one batch per partition is in flight at a time, so small batches
/// cap throughput at batch / round trip. 1 MiB matches the broker's default fetch size.
const BATCH_BYTES: usize = 1 << 20;
/// How long a producer waits to fill a batch.
const LINGER: Duration = Duration::from_millis(2);

/// Settings of [`KafkaTransactions`]: start from `KafkaTransactionsConfig::default()`
/// and change what differs.
///
/// ```
/// # use std::time::Duration;
/// # use shareflow_connector::kafka::KafkaTransactionsConfig;
/// let config = KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(120));
/// assert!(config.exactly_once);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KafkaTransactionsConfig {
    /// Exactly-once (a Kafka transaction per checkpoint) or at-least-once (idempotent
    /// writes flushed at each checkpoint; a crash may repeat output since the last one).
    pub exactly_once: bool,
    /// `transaction.timeout.ms` of each T(n). The broker aborts a transaction open this
    /// long, so it must exceed checkpoint interval plus checkpoint timeout, and fit the
    /// broker's `transaction.max.timeout.ms`. A job down longer than this between a
    /// checkpoint and its commit loses that epoch's output, which the ledger then
    /// replays.
    pub transaction_timeout: Duration,
    /// The ledger topic; by default `{group}-{prefix}-ledger`.
    pub ledger_topic: Option<String>,
}

impl Default for KafkaTransactionsConfig {
    fn default() -> Self {
        Self { exactly_once: true, transaction_timeout: Duration::from_secs(600), ledger_topic: None }
    }
}

impl KafkaTransactionsConfig {
    /// Exactly-once (`true`, the default) or at-least-once.
    pub fn exactly_once(mut self, exactly_once: bool) -> Self {
        self.exactly_once = exactly_once;
        self
    }

    /// `transaction.timeout.ms` of each T(n) (default 600 s).
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// The ledger topic, instead of `{group}-{prefix}-ledger`.
    pub fn ledger_topic(mut self, topic: impl Into<String>) -> Self {
        self.ledger_topic = Some(topic.into());
        self
    }
}

struct Live {
    producer: Arc<TransactionalProducer>,
    handles: Vec<DeliveryHandle>,
    /// Flushed, with its commit entry: a checkpoint may have decided it.
    prepared: bool,
}

/// The job's transactional participant on a real Kafka cluster: one Kafka transaction
/// T(n) = `{group}-{prefix}-{n}` per checkpoint, the output of every sink subtask in it,
/// and the ledger that makes share acknowledgements exactly-once without KIP-1289.
pub struct KafkaTransactions {
    cluster: KafkaCluster,
    config: KafkaTransactionsConfig,
    template: Mutex<Option<TransactionTemplate>>,
    live: Mutex<BTreeMap<u64, Live>>,
    /// At-least-once writes: idempotent, not transactional.
    plain: CachedProducer,
    /// The ledger topic's reads and writes, and the replay reader.
    log: LedgerLog,
    plain_handles: Mutex<Vec<DeliveryHandle>>,
    ledger: Arc<AckLedger>,
    load: tokio::sync::Mutex<()>,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KafkaTransactions {
    /// A participant on `cluster`.
    pub fn new(cluster: KafkaCluster, config: KafkaTransactionsConfig) -> Arc<Self> {
        let log = LedgerLog::new(cluster.clone(), config.transaction_timeout);
        Arc::new(Self {
            cluster,
            config,
            template: Mutex::new(None),
            live: Mutex::new(BTreeMap::new()),
            plain: CachedProducer::new(LINGER, BATCH_BYTES),
            log,
            plain_handles: Mutex::new(Vec::new()),
            ledger: AckLedger::new(),
            load: tokio::sync::Mutex::new(()),
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

    /// Checks the transaction timeout against the job's checkpointing and the broker's
    /// `transaction.max.timeout.ms`. Call it before running the job.
    pub async fn validate(&self, checkpoint_interval: Duration, checkpoint_timeout: Duration) -> crate::Result<()> {
        let timeout = self.config.transaction_timeout;
        // Checked before asking the broker: a timeout too short fails without a cluster.
        check_transaction_timeout(timeout, checkpoint_interval + checkpoint_timeout, None)?;
        let broker_max = self.cluster.broker_config(BROKER_MAX_TIMEOUT).await?;
        check_transaction_timeout(timeout, checkpoint_interval + checkpoint_timeout, broker_max.as_deref())
    }

    fn template(&self) -> Result<TransactionTemplate> {
        lock(&self.template).clone().ok_or_else(|| RuntimeError::Internal("kafka transactions used before open".into()))
    }

    /// The ledger topic of this job.
    pub fn ledger_topic(&self) -> Result<String> {
        if let Some(t) = &self.config.ledger_topic {
            return Ok(t.clone());
        }
        let t = self.template()?;
        Ok(format!("{}-{}-ledger", t.group_id(), t.prefix()))
    }

    async fn plain_producer(&self) -> Result<Arc<Producer>> {
        self.plain.get(&self.cluster).await.map_err(rt)
    }

    /// Writes records of epoch `epoch` to their topics: into T(epoch) in exactly-once
    /// mode, idempotently otherwise. Returns once they are queued; the checkpoint waits
    /// for their acknowledgement before it completes.
    pub async fn send(&self, epoch: u64, records: Vec<crate::share::ProducerRecord>) -> Result<()> {
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
        self.send_records(epoch, records).await
    }

    /// [`send`](Self::send) for records already in the client's form (the sink's path).
    pub(crate) async fn send_records(&self, epoch: u64, records: Vec<krafka::Record>) -> Result<()> {
        if self.config.exactly_once {
            let producer = lock(&self.live).get(&epoch).map(|l| l.producer.clone()).ok_or_else(|| {
                RuntimeError::Internal(format!("T({epoch}) is not open on kafka; the sink ran ahead of its epoch"))
            })?;
            let p = &*producer;
            let handles = enqueue_all(records, &format!(" in T({epoch})"), |r| p.enqueue(r)).await.map_err(rt)?;
            if let Some(l) = lock(&self.live).get_mut(&epoch) {
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

    /// Writes `entry` outside any transaction and waits until it is durable.
    async fn write_ledger(&self, entry: &LedgerEntry) -> Result<()> {
        self.log.write(&self.ledger_topic()?, entry).await.map_err(rt)
    }

    /// Durably records that `subtask` processes `ranges` in epoch `epoch`. The source
    /// acknowledges the records at the share group only after this returns.
    pub async fn write_intent(&self, epoch: u64, subtask: u32, ranges: Vec<LedgerRange>) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        let entry = LedgerEntry::Intent { epoch, subtask, ranges };
        self.write_ledger(&entry).await?;
        if let LedgerEntry::Intent { ranges, .. } = &entry {
            self.ledger.cover(ranges);
        }
        Ok(())
    }

    /// The ledger, read from its topic once per attempt: what to replay, and which
    /// offsets a redelivery may skip.
    pub(crate) async fn ledger(&self) -> Result<(Arc<AckLedger>, LedgerPlan)> {
        let _g = self.load.lock().await;
        if let Some(plan) = self.ledger.plan() {
            return Ok((self.ledger.clone(), plan));
        }
        let plan = self.read_ledger(true).await?;
        self.ledger.install(plan.clone());
        Ok((self.ledger.clone(), plan))
    }

    /// The epochs whose `Commit` entry the ledger holds: checkpoints whose T(n) committed
    /// (read_committed, once per attempt, like the source's replay plan).
    pub async fn committed_epochs(&self) -> Result<std::collections::BTreeSet<u64>> {
        Ok(self.ledger().await?.1.committed_epochs)
    }

    /// Reads the ledger. `stable`: wait until no transaction holds it open and read
    /// only committed entries (what the replay plan needs); otherwise read everything
    /// written, open transactions included (enough to know every epoch ever used).
    async fn read_ledger(&self, stable: bool) -> Result<LedgerPlan> {
        self.log.read(&self.ledger_topic()?, stable).await.map_err(rt)
    }

    /// Reads the records of `ranges` from their topics' logs, for replay. Offsets the log
    /// no longer holds (retention deleted them) are reported and skipped: their output
    /// is lost, the one case the ledger cannot repair.
    pub(crate) async fn read_ranges(&self, ranges: &[LedgerRange]) -> Result<Vec<Record>> {
        self.log.read_ranges(ranges).await.map_err(rt)
    }

    /// Fences `txn`: a new producer with its transactional id aborts whatever
    /// transaction the id has open, and the producer that began it can write nothing
    /// more.
    async fn fence(&self, txn: &TransactionId) -> crate::Result<()> {
        let p = self
            .cluster
            .client()
            .producer()
            .transaction_timeout(self.config.transaction_timeout)
            .build_transactional(txn.to_string())
            .await
            .map_err(|e| kafka_error(format!("fence {txn} (a new producer with its id aborts it)"), e))?;
        let _ = p.close().await;
        Ok(())
    }

    /// The recovery step of a new attempt: aborts every transaction of ours the broker
    /// holds open that never prepared. No checkpoint can cover such a transaction (the
    /// manifest is written only after every prepare returned), and left open it would
    /// hold its topics' read_committed readers back until the transaction timeout. The
    /// prepared ones are left for the runtime to decide
    /// ([`TransactionParticipant::pending`]).
    async fn fence_unprepared(&self, template: &TransactionTemplate) -> Result<()> {
        let ledger = self.ledger_topic()?;
        for (txn, described) in self.open_transactions(template).await? {
            if plan(Request::Found, described.as_ref(), &ledger) == RecoveryAction::Fence {
                tracing::info!(%txn, "recovery: aborting a transaction that never prepared");
                self.fence(&txn).await.map_err(|e| failed("abort", &txn, e))?;
            }
        }
        Ok(())
    }

    /// Our transactions the broker lists as Ongoing and this instance does not hold
    /// live, each with what DescribeTransactions says about it now. Observes only.
    async fn open_transactions(
        &self,
        template: &TransactionTemplate,
    ) -> Result<Vec<(TransactionId, Option<KafkaTxnDescription>)>> {
        let mut out = Vec::new();
        for (txn, _) in self.listed(template, &[KafkaTxnState::Ongoing]).await? {
            if lock(&self.live).contains_key(&txn.checkpoint_id()) {
                continue;
            }
            let described = self.describe(&txn).await.map_err(rt)?;
            out.push((txn, described));
        }
        Ok(out)
    }

    /// Prepare of a transaction this instance does not hold live: what the broker says
    /// decides ([`plan`]). A transaction an earlier instance prepared is prepared; one
    /// the broker aborted, or never knew, answers that it is aborted.
    async fn prepare_not_live(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        let described = self.describe(txn).await.map_err(|e| failed("prepare", txn, e))?;
        match plan(Request::Prepare, described.as_ref(), &self.ledger_topic()?) {
            RecoveryAction::AwaitDecision | RecoveryAction::AlreadyCommitted => Ok(PrepareOutcome::Prepared),
            RecoveryAction::AlreadyAborted => Ok(PrepareOutcome::AlreadyAborted),
            RecoveryAction::CannotPrepare { state } => Err(failed(
                "prepare",
                txn,
                Error::kafka(
                    format!("prepare {txn}"),
                    format!(
                        "the broker holds it {state} without the commit entry, and this instance did not begin it: \
                         the producer that wrote it is gone with whatever it still held, so it cannot prepare. \
                         Abort it; its epoch is replayed through the ledger"
                    ),
                    // As before the plan existed: recovery cannot go on, and nothing
                    // the caller changes makes it prepare.
                    crate::error::ErrorKind::Internal,
                ),
            )),
            other => Err(plan_bug("prepare", txn, &other)),
        }
    }

    /// DescribeTransactions for T(n): `None` when the broker does not know its id.
    async fn describe(&self, txn: &TransactionId) -> crate::Result<Option<KafkaTxnDescription>> {
        self.cluster.describe_transaction(&txn.to_string()).await
    }

    /// Our transactional ids, with their states, as the broker lists them: only those
    /// in `states` unless it is empty. Lists only: it fences nothing.
    async fn listed(
        &self,
        template: &TransactionTemplate,
        states: &[KafkaTxnState],
    ) -> Result<Vec<(TransactionId, KafkaTxnState)>> {
        let mut out = Vec::new();
        for (txn_id, state) in self.cluster.list_transactions(states).await.map_err(rt)? {
            let Ok(id) = TransactionId::parse(&txn_id, template.group_id()) else { continue };
            if id.group_id() == template.group_id() && id.prefix() == template.prefix() {
                out.push((id, state));
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl TransactionParticipant for KafkaTransactions {
    fn name(&self) -> &str {
        NAME
    }

    /// The transaction timeout must outlast a checkpoint and fit the broker's maximum.
    async fn validate(&self, checkpoint_interval: Option<Duration>, checkpoint_timeout: Duration) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        KafkaTransactions::validate(self, checkpoint_interval.unwrap_or_default(), checkpoint_timeout)
            .await
            .map_err(|e| runtime_error(NAME, e))
    }

    async fn open(&self, template: &TransactionTemplate) -> Result<()> {
        *lock(&self.template) = Some(template.clone());
        // A new attempt. Live transactions of the last attempt that prepared are left
        // to recovery, which commits them if their checkpoint completed (nothing of
        // theirs is buffered any more). The others can never commit: abort them now, so
        // buffered writes cannot open them again behind recovery's back. The ledger is
        // read again.
        let stale: Vec<(u64, Live)> = std::mem::take(&mut *lock(&self.live)).into_iter().collect();
        for (n, l) in stale {
            if l.prepared {
                continue;
            }
            let aborted = tokio::time::timeout(Duration::from_secs(10), l.producer.abort()).await;
            if !matches!(aborted, Ok(Ok(()))) {
                let txn = template.transaction(n);
                self.fence(&txn).await.map_err(|e| failed("abort", &txn, e))?;
            }
            tokio::spawn(async move {
                let _ = l.producer.close().await;
            });
        }
        lock(&self.plain_handles).clear();
        self.ledger.reset();
        let topic = self.ledger_topic()?;
        self.cluster
            // One partition, kept forever: entries are needed until replayed.
            .ensure_topic(&topic, 1, &[("retention.ms", "-1"), ("cleanup.policy", "delete")])
            .await
            .map_err(|e| runtime_error(NAME, e))?;
        if self.config.exactly_once {
            // Taking over the prefix: what the last instance left open and never
            // prepared can never commit.
            self.fence_unprepared(template).await?;
        }
        Ok(())
    }

    async fn begin(&self, txn: &TransactionId) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        let n = txn.checkpoint_id();
        if lock(&self.live).contains_key(&n) {
            return Ok(());
        }
        let producer = self
            .cluster
            .client()
            .producer()
            .transaction_timeout(self.config.transaction_timeout)
            .linger(LINGER)
            .batch_size(BATCH_BYTES)
            .build_transactional(txn.to_string())
            .await
            .map_err(|e| failed("begin", txn, kafka_error(format!("begin {txn}"), e)))?;
        producer.begin().map_err(|e| failed("begin", txn, kafka_error(format!("begin {txn}"), e)))?;
        lock(&self.live).insert(n, Live { producer: Arc::new(producer), handles: Vec::new(), prepared: false });
        Ok(())
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        let n = txn.checkpoint_id();
        if !self.config.exactly_once {
            let handles = std::mem::take(&mut *lock(&self.plain_handles));
            await_all(handles, "output").await.map_err(|e| failed("prepare", txn, e))?;
            return Ok(PrepareOutcome::Prepared);
        }
        let live = lock(&self.live).get_mut(&n).map(|l| (l.producer.clone(), std::mem::take(&mut l.handles)));
        let Some((producer, mut handles)) = live else {
            return self.prepare_not_live(txn).await;
        };
        // The commit entry rides in T(n): visible exactly when the output is.
        let entry = LedgerLog::record(&self.ledger_topic()?, &LedgerEntry::Commit { epoch: n })
            .map_err(|e| failed("prepare", txn, e))?;
        let p = &*producer;
        let enqueued = enqueue_all(vec![entry], &format!(" in {txn}"), |r| p.enqueue(r)).await;
        handles.extend(enqueued.map_err(|e| failed("prepare", txn, e))?);
        await_all(handles, &format!("the output of {txn}")).await.map_err(|e| failed("prepare", txn, e))?;
        producer.flush().await.map_err(|e| failed("prepare", txn, kafka_error(format!("flush {txn}"), e)))?;
        if let Some(l) = lock(&self.live).get_mut(&n) {
            l.prepared = true;
        }
        Ok(PrepareOutcome::Prepared)
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        let n = txn.checkpoint_id();
        if !self.config.exactly_once {
            // At-least-once: the commit entry is written after the checkpoint; a crash
            // before it replays epoch n (duplicates, never loss).
            let entry = LedgerEntry::Commit { epoch: n };
            let written = self.log.write(&self.ledger_topic()?, &entry).await;
            return written.map_err(|e| failed("commit", txn, e));
        }
        let live = lock(&self.live).remove(&n);
        if let Some(l) = live {
            l.producer.commit().await.map_err(|e| failed("commit", txn, kafka_error(format!("commit {txn}"), e)))?;
            // Nothing is left to send; closing only releases its tasks.
            tokio::spawn(async move {
                let _ = l.producer.close().await;
            });
            return Ok(());
        }
        // Recovery: a crash left T(n) open after its checkpoint completed.
        let described = self.describe(txn).await.map_err(|e| failed("commit", txn, e))?;
        match plan(Request::Commit, described.as_ref(), &self.ledger_topic()?) {
            RecoveryAction::CommitByProducerId { producer_id, epoch } => {
                self.cluster
                    .end_txn(&txn.to_string(), producer_id, epoch, true)
                    .await
                    .map_err(|e| failed("commit", txn, e))?;
                tracing::info!(%txn, producer_id, epoch, "recovery: committed by producer id and epoch");
            }
            RecoveryAction::AlreadyCommitted => {}
            RecoveryAction::Lost { state } => tracing::warn!(
                %txn,
                state = ?state.as_ref().map(KafkaTxnState::as_str),
                "recovery: the broker already aborted this transaction (transaction timeout?); its output is lost \
                 and its records are replayed from the log through the ledger"
            ),
            other => return Err(plan_bug("commit", txn, &other)),
        }
        Ok(())
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        let live = lock(&self.live).remove(&txn.checkpoint_id());
        if let Some(l) = live {
            let r = l.producer.abort().await;
            let _ = l.producer.close().await;
            return r.map_err(|e| failed("abort", txn, kafka_error(format!("abort {txn}"), e)));
        }
        // Recovery, or a repeated abort: an open transaction whose producer is gone is
        // aborted by fencing its id.
        let described = self.describe(txn).await.map_err(|e| failed("abort", txn, e))?;
        match plan(Request::Abort, described.as_ref(), &self.ledger_topic()?) {
            RecoveryAction::Fence => self.fence(txn).await.map_err(|e| failed("abort", txn, e)),
            RecoveryAction::AlreadyAborted | RecoveryAction::AlreadyCommitted => Ok(()),
            other => Err(plan_bug("abort", txn, &other)),
        }
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        if !self.config.exactly_once {
            return Ok(Vec::new());
        }
        // Lists only: `open` already fenced what never prepared. One that shows up
        // unprepared now (begun since by another instance of the same prefix) is
        // reported as such, and the runtime aborts it, which fences it.
        let ledger = self.ledger_topic()?;
        let mut pending = Vec::new();
        for (id, described) in self.open_transactions(template).await? {
            match plan(Request::Found, described.as_ref(), &ledger) {
                RecoveryAction::AwaitDecision => pending.push(PendingTransaction { id, prepared: true }),
                RecoveryAction::Fence => pending.push(PendingTransaction { id, prepared: false }),
                _ => {}
            }
        }
        Ok(pending)
    }

    async fn highest_checkpoint_id(&self, template: &TransactionTemplate) -> Result<Option<u64>> {
        // Every epoch the ledger names, open transactions included: an epoch number
        // must never be used twice, or an old intent would pass for a new one.
        let ledger = self.read_ledger(false).await?.highest_epoch;
        let listed = if self.config.exactly_once {
            self.listed(template, &[]).await?.iter().map(|(id, _)| id.checkpoint_id()).max()
        } else {
            None
        };
        Ok(ledger.max(listed))
    }
}

/// A plan answered `action` to a request that cannot yield it: a shareflow bug.
fn plan_bug(op: &'static str, txn: &TransactionId, action: &RecoveryAction) -> RuntimeError {
    RuntimeError::Internal(format!("kafka recovery planned {action:?} for the {op} of {txn}"))
}

/// Checks `transaction.timeout.ms` (`timeout`): it must exceed checkpoint interval plus
/// checkpoint timeout (`needed`), and not exceed the broker's
/// `transaction.max.timeout.ms` (`broker_max`, as the broker reports it; `None` when
/// unknown). A broker value that is not a whole number of milliseconds is an invalid
/// config naming the broker's key and value, never a limit that lets anything pass.
fn check_transaction_timeout(timeout: Duration, needed: Duration, broker_max: Option<&str>) -> crate::Result<()> {
    if timeout <= needed {
        return Err(Error::InvalidConfig {
            key: "transaction.timeout.ms".into(),
            value: timeout.as_millis().to_string(),
            rule: format!(
                "must exceed checkpoint interval plus checkpoint timeout ({} ms), or the broker aborts T(n) \
                 before its checkpoint can commit it",
                needed.as_millis()
            ),
        });
    }
    let Some(max) = broker_max else { return Ok(()) };
    let max: u128 = max.trim().parse().map_err(|e| Error::InvalidConfig {
        key: BROKER_MAX_TIMEOUT.into(),
        value: max.to_string(),
        rule: format!(
            "the broker reports it, but it is not a whole number of milliseconds ({e}); fix the broker's config"
        ),
    })?;
    if timeout.as_millis() > max {
        return Err(Error::InvalidConfig {
            key: "transaction.timeout.ms".into(),
            value: timeout.as_millis().to_string(),
            rule: format!(
                "must not exceed the broker's transaction.max.timeout.ms ({max} ms); lower it or raise the broker's"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_timeout_must_outlast_a_checkpoint() {
        let err = check_transaction_timeout(S(5), S(6), Some("900000")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert!(err.to_string().contains("checkpoint interval plus checkpoint timeout (6000 ms)"), "{err}");
        check_transaction_timeout(S(7), S(6), None).expect("no broker maximum known");
    }

    #[test]
    fn the_timeout_must_fit_the_broker_maximum() {
        check_transaction_timeout(S(60), S(31), Some("60000")).expect("equal fits");
        let err = check_transaction_timeout(S(3_600), S(61), Some("900000")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert!(err.to_string().contains("transaction.max.timeout.ms (900000 ms)"), "{err}");
    }

    #[test]
    fn an_unparsable_broker_maximum_is_an_error_naming_its_key_and_value() {
        for bad in ["", "15m", "-1", "9e5"] {
            let err = check_transaction_timeout(S(60), S(31), Some(bad)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Invalid, "{bad:?}");
            match &err {
                Error::InvalidConfig { key, value, .. } => {
                    assert_eq!((key.as_str(), value.as_str()), (BROKER_MAX_TIMEOUT, bad));
                }
                other => panic!("{bad:?}: {other:?}"),
            }
            assert!(err.to_string().contains(&format!("invalid config transaction.max.timeout.ms={bad}:")), "{err}");
        }
    }
}
