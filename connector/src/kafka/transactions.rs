//! [`KafkaTransactions`]: the transactional participant on Kafka. T(n) is a real Kafka
//! transaction; the participant also recovers transactions a crash left open. The
//! ledger's I/O is [`super::ledger_log`]; DescribeTransactions, ListTransactions and
//! EndTxn are calls of [`KafkaCluster`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use krafka::producer::{DeliveryHandle, Producer, TransactionalProducer};
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{
    PendingTransaction, PrepareOutcome, Result, RuntimeError, TransactionParticipant, TransactionTemplate,
};

use super::client::{CachedProducer, KafkaTxnDescription, KafkaTxnState};
use super::ledger::{AckLedger, LedgerEntry, LedgerPlan, LedgerRange};
use super::ledger_log::LedgerLog;
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

/// Settings of [`KafkaTransactions`].
#[derive(Debug, Clone)]
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
            let handles = enqueue_all(records, &format!(" in T({epoch})"), |r| p.enqueue(r)).await?;
            if let Some(l) = lock(&self.live).get_mut(&epoch) {
                l.handles.extend(handles);
            }
        } else {
            let producer = self.plain_producer().await?;
            let p = &*producer;
            let handles = enqueue_all(records, "", |r| p.enqueue(r)).await?;
            lock(&self.plain_handles).extend(handles);
        }
        Ok(())
    }

    /// A ledger entry as a record of the ledger topic's only partition.
    fn ledger_record(&self, entry: &LedgerEntry) -> Result<krafka::Record> {
        LedgerLog::record(&self.ledger_topic()?, entry).map_err(rt)
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
    pub async fn ledger(&self) -> Result<(Arc<AckLedger>, LedgerPlan)> {
        let _g = self.load.lock().await;
        if let Some(plan) = self.ledger.plan() {
            return Ok((self.ledger.clone(), plan));
        }
        let plan = self.read_ledger(true).await?;
        self.ledger.install(plan.clone());
        Ok((self.ledger.clone(), plan))
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
    pub async fn read_ranges(&self, ranges: &[LedgerRange]) -> Result<Vec<Record>> {
        self.log.read_ranges(ranges).await.map_err(rt)
    }

    /// Aborts whatever transaction `id` has open: a new producer with the id fences
    /// the old one and aborts its transaction.
    async fn fence(&self, id: &str) -> Result<()> {
        let p = self
            .cluster
            .client()
            .producer()
            .transaction_timeout(self.config.transaction_timeout)
            .build_transactional(id.to_string())
            .await
            .map_err(|e| runtime_error(NAME, kafka_error(format!("abort {id}"), e)))?;
        let _ = p.close().await;
        Ok(())
    }

    async fn await_handles(handles: Vec<DeliveryHandle>, what: &str) -> Result<()> {
        for h in handles {
            let _ = h.await.map_err(|e| runtime_error(NAME, kafka_error(format!("deliver {what}"), e)))?;
        }
        Ok(())
    }

    /// DescribeTransactions for T(n): `None` when the broker does not know its id.
    async fn describe(&self, txn: &TransactionId) -> Result<Option<KafkaTxnDescription>> {
        self.cluster.describe_transaction(&txn.to_string()).await.map_err(rt)
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
                self.fence(&template.transaction(n).to_string()).await?;
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
            .map_err(|e| runtime_error(NAME, e))
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
            .map_err(|e| runtime_error(NAME, kafka_error(format!("begin {txn}"), e)))?;
        producer.begin().map_err(|e| runtime_error(NAME, kafka_error(format!("begin {txn}"), e)))?;
        lock(&self.live).insert(n, Live { producer: Arc::new(producer), handles: Vec::new(), prepared: false });
        Ok(())
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        let n = txn.checkpoint_id();
        if !self.config.exactly_once {
            let handles = std::mem::take(&mut *lock(&self.plain_handles));
            return Self::await_handles(handles, "output").await.map(|_| PrepareOutcome::Prepared);
        }
        let (producer, handles) = {
            let mut live = lock(&self.live);
            let Some(l) = live.get_mut(&n) else {
                return Err(RuntimeError::Internal(format!("prepare of {txn}, which this instance did not begin")));
            };
            (l.producer.clone(), std::mem::take(&mut l.handles))
        };
        // The commit entry rides in T(n): visible exactly when the output is.
        let entry = self.ledger_record(&LedgerEntry::Commit { epoch: n })?;
        let p = &*producer;
        let mut handles = handles;
        handles.extend(enqueue_all(vec![entry], &format!(" in {txn}"), |r| p.enqueue(r)).await?);
        Self::await_handles(handles, &format!("the output of {txn}")).await?;
        producer.flush().await.map_err(|e| runtime_error(NAME, kafka_error(format!("flush {txn}"), e)))?;
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
            return self.write_ledger(&LedgerEntry::Commit { epoch: n }).await;
        }
        let live = lock(&self.live).remove(&n);
        if let Some(l) = live {
            l.producer.commit().await.map_err(|e| runtime_error(NAME, kafka_error(format!("commit {txn}"), e)))?;
            // Nothing is left to send; closing only releases its tasks.
            tokio::spawn(async move {
                let _ = l.producer.close().await;
            });
            return Ok(());
        }
        // Recovery: a crash left T(n) open after its checkpoint completed.
        match self.describe(txn).await? {
            Some(d) if d.state == KafkaTxnState::Ongoing => {
                self.cluster.end_txn(&txn.to_string(), d.producer_id, d.producer_epoch, true).await.map_err(rt)?;
                tracing::info!(%txn, producer_id = d.producer_id, epoch = d.producer_epoch, "recovery: committed by producer id and epoch");
                Ok(())
            }
            Some(d) if d.state.is_committing() => Ok(()),
            other => {
                tracing::warn!(
                    %txn,
                    state = ?other.as_ref().map(|d| d.state.as_str()),
                    "recovery: the broker already aborted this transaction (transaction timeout?); its output is lost \
                     and its records are replayed from the log through the ledger"
                );
                Ok(())
            }
        }
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        if !self.config.exactly_once {
            return Ok(());
        }
        let live = lock(&self.live).remove(&txn.checkpoint_id());
        if let Some(l) = live {
            let r = l.producer.abort().await;
            let _ = l.producer.close().await;
            return r.map_err(|e| runtime_error(NAME, kafka_error(format!("abort {txn}"), e)));
        }
        if let Some(d) = self.describe(txn).await? {
            if d.state == KafkaTxnState::Ongoing {
                self.fence(&txn.to_string()).await?;
            }
        }
        Ok(())
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        if !self.config.exactly_once {
            return Ok(Vec::new());
        }
        let open = self.listed(template, &[KafkaTxnState::Ongoing]).await?;
        let ledger = self.ledger_topic()?;
        let mut pending = Vec::new();
        for (id, _) in open {
            if lock(&self.live).contains_key(&id.checkpoint_id()) {
                continue;
            }
            // Prepare writes the commit entry into the ledger: a transaction without the
            // ledger among its partitions never prepared, so no checkpoint covers it.
            let prepared = self.describe(&id).await?.is_some_and(|d| d.topics.contains(&ledger));
            if prepared {
                pending.push(PendingTransaction { id, prepared: true });
            } else {
                tracing::info!(txn = %id, "recovery: aborting a transaction that never prepared");
                self.fence(&id.to_string()).await?;
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

/// Queues `records` with `enqueue`, one producer's `enqueue`; `context` ends the error
/// message (" in T(n)").
async fn enqueue_all<F, Fut>(records: Vec<krafka::Record>, context: &str, enqueue: F) -> Result<Vec<DeliveryHandle>>
where
    F: Fn(krafka::Record) -> Fut,
    Fut: std::future::Future<Output = krafka::Result<DeliveryHandle>>,
{
    let mut handles = Vec::with_capacity(records.len());
    for r in records {
        let topic = r.topic.clone();
        handles.push(
            enqueue(r).await.map_err(|e| runtime_error(NAME, kafka_error(format!("write to {topic}{context}"), e)))?,
        );
    }
    Ok(handles)
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
