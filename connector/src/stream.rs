//! [`ShareStream`]: exactly-once share consumption for a caller's own loop, without the
//! runtime's job graph.
//!
//! The stream is a [`futures::Stream`] of Arrow [`RecordBatch`]es (the schema of
//! [`record_schema`](crate::record_schema)). Every batch it yields is already bound to
//! the open transaction T(n) (on the embedded broker its acknowledgements are staged in
//! T(n); on Kafka an intent in the group's ledger names them), and so is every record the
//! caller [`send`](ShareStream::send)s. The caller's loop takes checkpoints the way the
//! runtime's coordinator does:
//!
//! 1. [`checkpoint`](ShareStream::checkpoint) prepares T(n), opens T(n+1), and returns a
//!    [`StreamCheckpoint`] handle.
//! 2. The caller persists the handle with its own state, in one write of its own store.
//!    **That write is the decision**, as the manifest is for a job: a T(n) whose handle
//!    was persisted commits, even after a crash; one whose handle was not aborts.
//! 3. [`commit`](ShareStream::commit) commits T(n): the acknowledgements and the output
//!    become visible in one step.
//!
//! After a restart (or on the very first start, with `None`),
//! [`ShareStream::embedded`] or [`ShareStream::kafka`] take the last persisted handle and
//! recover: they fence any older incarnation of the prefix, commit every prepared
//! transaction the handle covers, abort the rest (their records come back), and start
//! T(handle + 1). The plan is `shareflow_checkpoint::protocol::plan_recovery`, the same
//! rules a job follows.
//!
//! ```
//! use std::time::Duration;
//! use futures::StreamExt;
//! use shareflow_connector::broker::{BrokerOptions, EmbeddedBroker};
//! use shareflow_connector::share::{IsolationLevel, ProducerRecord, TopicPartition};
//! use shareflow_connector::stream::{ShareStream, StreamCheckpoint, StreamOptions};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let broker = EmbeddedBroker::open(BrokerOptions::in_memory()).await?;
//! broker.create_topic("in", 1).await?;
//! broker.create_topic("out", 1).await?;
//! broker.produce((0..10).map(|i| ProducerRecord::new("in", 0, format!("r{i}"))).collect()).await?;
//!
//! // The caller's own store: the last handle and the state that goes with it.
//! let mut saved: Option<(StreamCheckpoint, u64)> = None;
//!
//! let mut options = StreamOptions::new("orders", "worker-1", &["in"]);
//! options.source.stop_when_drained = true;
//! let last = saved.as_ref().map(|(h, _)| h);
//! let mut stream = ShareStream::embedded(&broker, options, last).await?;
//! let mut rows = saved.as_ref().map_or(0, |(_, n)| *n);
//! while let Some(batch) = stream.next().await {
//!     let batch = batch?;
//!     rows += batch.num_rows() as u64;
//!     stream.send(vec![ProducerRecord::new("out", 0, format!("{} rows", batch.num_rows()))]).await?;
//!     let handle = stream.checkpoint().await?; // T(n) prepared
//!     saved = Some((handle.clone(), rows)); // persist the handle with the state: the decision
//!     stream.commit(&handle).await?; // acknowledgements and output, in one step
//! }
//! stream.close().await?;
//! assert_eq!(rows, 10);
//! let out = broker.fetch_all(&TopicPartition::new("out", 0), IsolationLevel::ReadCommitted).await?;
//! assert!(!out.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! Where exactly-once ends: the caller's persisted handle is the decision, so the
//! caller's store must refuse a handle from an instance that was fenced (compare
//! [`StreamCheckpoint::fencing_epoch`], which grows with every recovery of the prefix),
//! or run at most one process per prefix. A T(n) that aborts by itself (its
//! transaction timeout passed before the handle was committed, or on Kafka another
//! instance claimed its records first) fails [`checkpoint`](ShareStream::checkpoint):
//! roll the caller's state back to the last persisted handle and recover.

use std::collections::BTreeSet;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use serde::{Deserialize, Serialize};
use shareflow_checkpoint::protocol::plan_completion;
use shareflow_checkpoint::{CheckpointId, TransactionId};
use shareflow_runtime::failpoint::Failpoints;
use shareflow_runtime::{
    ErrorKind, JobMetrics, Participant, PrepareOutcome, RecoveryMarks, Result, RuntimeError, Source, SourceEvent,
    SubtaskContext, TransactionTemplate,
};

use crate::common::runtime_error;
use crate::common::{SourceMetrics, SourceSettings};
use crate::embedded::{BrokerTransactions, ShareGroupSource};
use shareflow_broker::EmbeddedBroker;
use shareflow_share::{AcknowledgementMode, ProducerRecord, ShareTransactionalProducer};

/// The name errors of the stream carry.
const NAME: &str = "share-stream";

/// What a [`ShareStream`] consumes and under which prefix it commits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StreamOptions {
    /// The share group, topics and poll settings. A stream has no dead letters: a
    /// `decoder` works on the embedded broker only, whose source REJECTs what it refuses.
    pub source: SourceSettings,
    /// The transactional prefix: transactions are `{group}-{prefix}-{n}`. One live
    /// stream per prefix; a second one fences the first.
    pub prefix: String,
    /// How long T(n) may stay open (ONGOING) before the broker aborts it. `None`: the
    /// embedded group's `share.transaction.timeout.ms` (default 60 s), or 600 s on
    /// Kafka. Checkpoint more often than this.
    pub transaction_timeout: Option<Duration>,
}

impl StreamOptions {
    /// Consumes `topics` as `group`, committing under `prefix`, with the source
    /// defaults of [`SourceSettings::new`].
    pub fn new(group: &str, prefix: &str, topics: &[&str]) -> Self {
        Self { source: SourceSettings::new(group, topics), prefix: prefix.to_string(), transaction_timeout: None }
    }

    /// Sets [`transaction_timeout`](Self::transaction_timeout).
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = Some(timeout);
        self
    }

    fn template(&self) -> Result<TransactionTemplate> {
        if self.transaction_timeout == Some(Duration::ZERO) {
            return Err(RuntimeError::InvalidConfig {
                key: "transaction_timeout".into(),
                value: "0".into(),
                rule: "must be positive: T(n) stays open from one checkpoint to the next".into(),
            });
        }
        TransactionTemplate::new(&self.source.group, &self.prefix)
    }
}

/// The handle [`ShareStream::checkpoint`] returns: T(n) is prepared, and it commits
/// exactly if the caller persists this handle (with its own state) and then calls
/// [`ShareStream::commit`], or passes it to the next recovery.
///
/// Store it as bytes ([`to_bytes`](Self::to_bytes) and [`from_bytes`](Self::from_bytes)),
/// or with serde in any format.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StreamCheckpoint {
    group: String,
    prefix: String,
    checkpoint_id: CheckpointId,
    /// The fencing epoch ([`fencing_epoch`](Self::fencing_epoch)).
    epoch: u32,
}

/// The first bytes of [`StreamCheckpoint::to_bytes`]: a name and a format version.
const HANDLE_MAGIC: &[u8; 4] = b"SFS1";

impl StreamCheckpoint {
    /// The transaction this handle decides, T(n). A handle decoded with serde from
    /// something else can name an invalid group or prefix: that is an `Invalid` error.
    pub fn transaction(&self) -> Result<TransactionId> {
        Ok(TransactionTemplate::new(&self.group, &self.prefix)?.transaction(self.checkpoint_id))
    }

    /// The checkpoint id n of the transaction T(n) this handle decides.
    pub fn checkpoint_id(&self) -> CheckpointId {
        self.checkpoint_id
    }

    /// The share group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The transactional prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The fencing epoch of the stream that took it. Every recovery of the prefix takes a
    /// higher one, so a store can refuse a handle older than the newest it holds: the
    /// writer was fenced.
    pub fn fencing_epoch(&self) -> u32 {
        self.epoch
    }

    /// A compact, versioned encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = HANDLE_MAGIC.to_vec();
        // Encoding a struct of strings and integers into a Vec cannot fail.
        out.extend(postcard::to_allocvec(self).unwrap_or_default());
        out
    }

    /// Decodes [`to_bytes`](Self::to_bytes). Anything else is a `Data` error naming what
    /// is wrong; the handle's names are validated as the stream validates them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let corrupt = |reason: String| {
            runtime_error(
                NAME,
                crate::Error::corrupt(
                    "a stream checkpoint handle",
                    format!("{reason}; it was not written by to_bytes"),
                ),
            )
        };
        let body = bytes
            .strip_prefix(HANDLE_MAGIC.as_slice())
            .ok_or_else(|| corrupt(format!("{} bytes without the SFS1 header", bytes.len())))?;
        let handle: StreamCheckpoint =
            postcard::from_bytes(body).map_err(|e| corrupt(format!("the body does not decode: {e}")))?;
        TransactionTemplate::new(&handle.group, &handle.prefix).map_err(|e| corrupt(e.to_string()))?;
        Ok(handle)
    }
}

impl fmt::Display for StreamCheckpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{} (fencing epoch {})", self.group, self.prefix, self.checkpoint_id, self.epoch)
    }
}

/// The backend the stream runs on.
enum Backend {
    Embedded(Arc<BrokerTransactions>),
    #[cfg(feature = "kafka")]
    Kafka(Arc<crate::kafka::KafkaTransactions>),
}

impl Backend {
    fn participant(&self) -> Participant {
        match self {
            Backend::Embedded(t) => t.clone(),
            #[cfg(feature = "kafka")]
            Backend::Kafka(t) => t.clone(),
        }
    }

    fn fencing_epoch(&self) -> Result<u32> {
        match self {
            Backend::Embedded(t) => {
                use shareflow_share::ShareTransactionCoordinator;
                Ok(t.coordinator()?.epoch())
            }
            #[cfg(feature = "kafka")]
            Backend::Kafka(t) => Ok(t.generation()),
        }
    }

    async fn send(&self, txn: TransactionId, records: Vec<ProducerRecord>) -> Result<()> {
        match self {
            Backend::Embedded(t) => {
                let handle = t.handle(txn)?;
                t.coordinator()?.send(&handle, records).await.map(|_| ()).map_err(|e| runtime_error(NAME, e))
            }
            #[cfg(feature = "kafka")]
            Backend::Kafka(t) => t.send(txn.checkpoint_id(), records).await,
        }
    }
}

type InFlight = BoxFuture<'static, (Box<dyn Source>, Result<SourceEvent>)>;

/// A share-group consumer whose batches, and the output the caller sends with them,
/// commit exactly once with the caller's own checkpoints. See the [module](self) for the
/// protocol and an example.
///
/// Misuse gets an `Invalid` error and leaves the stream usable. Any failure of the
/// broker, the source or a transaction leaves it broken: every later call fails, and the
/// caller recovers from its last persisted handle with a new stream.
pub struct ShareStream {
    backend: Backend,
    template: TransactionTemplate,
    /// `None` while a poll is in flight (it owns the source).
    source: Option<Box<dyn Source>>,
    in_flight: Option<InFlight>,
    /// A batch a poll returned that the caller has not read yet.
    unread: Option<RecordBatch>,
    /// The checkpoint whose transaction, T(checkpoint_id), is open.
    checkpoint_id: CheckpointId,
    fencing_epoch: u32,
    /// Prepared by a checkpoint, not committed yet.
    prepared: BTreeSet<CheckpointId>,
    /// The highest checkpoint committed (by `commit` or by the recovery).
    committed: Option<CheckpointId>,
    finished: bool,
    /// Why the stream cannot go on, once something failed.
    broken: Option<String>,
    metrics: Arc<SourceMetrics>,
}

impl fmt::Debug for ShareStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShareStream")
            .field("transaction", &self.template.transaction(self.checkpoint_id).to_string())
            .field("prepared", &self.prepared)
            .field("committed", &self.committed)
            .field("broken", &self.broken)
            .finish()
    }
}

impl ShareStream {
    /// Recovers and opens a stream on the embedded broker. `last` is the handle the
    /// caller persisted last (`None` on a first start, or if it never persisted one):
    /// prepared transactions up to it commit, every other one of the prefix aborts.
    pub async fn embedded(
        broker: &EmbeddedBroker,
        options: StreamOptions,
        last: Option<&StreamCheckpoint>,
    ) -> Result<Self> {
        let template = options.template()?;
        let group = broker.group_config(&options.source.group).await.map_err(|e| runtime_error(NAME, e))?;
        let timeout = options.transaction_timeout.unwrap_or(group.transaction_timeout());
        let share = group.with_acknowledgement_mode(AcknowledgementMode::Transactional);
        let txns = BrokerTransactions::new(broker.clone(), timeout);
        let metrics = Arc::new(SourceMetrics::default());
        let factory =
            ShareGroupSource::factory(broker.clone(), Some(txns.clone()), options.source, share, metrics.clone());
        Self::recover(Backend::Embedded(txns), template, last, metrics, move |ctx| Box::new(factory(ctx))).await
    }

    /// Recovers and opens a stream on a Kafka 4.x cluster, exactly-once through the
    /// group's acknowledgement ledger (as a job on Kafka is). `last` as for
    /// [`embedded`](Self::embedded). At most 3 checkpoints may wait for their commit
    /// at once (the transactional-id pool of `KafkaTransactionsConfig::slots`).
    #[cfg(feature = "kafka")]
    pub async fn kafka(
        cluster: &crate::kafka::KafkaCluster,
        options: StreamOptions,
        last: Option<&StreamCheckpoint>,
    ) -> Result<Self> {
        use crate::kafka::{KafkaShareSource, KafkaTransactions, KafkaTransactionsConfig};
        let template = options.template()?;
        let mut config = KafkaTransactionsConfig::default();
        if let Some(t) = options.transaction_timeout {
            config = config.transaction_timeout(t);
        }
        let txns = KafkaTransactions::new(cluster.clone(), config);
        let metrics = Arc::new(SourceMetrics::default());
        let factory = KafkaShareSource::factory(cluster.clone(), txns.clone(), options.source, metrics.clone());
        Self::recover(Backend::Kafka(txns), template, last, metrics, move |ctx| Box::new(factory(ctx))).await
    }

    async fn recover(
        backend: Backend,
        template: TransactionTemplate,
        last: Option<&StreamCheckpoint>,
        metrics: Arc<SourceMetrics>,
        source: impl FnOnce(&SubtaskContext) -> Box<dyn Source>,
    ) -> Result<Self> {
        if let Some(h) = last {
            if h.group != template.group_id() || h.prefix != template.prefix() {
                return Err(RuntimeError::InvalidConfig {
                    key: "last".into(),
                    value: h.to_string(),
                    rule: format!(
                        "the handle belongs to group {} prefix {}, but this stream is group {} prefix {}; pass the \
                         handle this prefix persisted, or None",
                        h.group,
                        h.prefix,
                        template.group_id(),
                        template.prefix()
                    ),
                });
            }
        }
        let p = backend.participant();
        p.validate(None, Duration::ZERO).await?;
        // Taking the prefix fences every older incarnation first.
        p.open(&template).await?;
        let restored = last.map(StreamCheckpoint::checkpoint_id);
        let mut highest = restored.unwrap_or(0);
        if let Some(h) = p.highest_checkpoint_id(&template).await? {
            highest = highest.max(h);
        }
        // The commit rules and the loop that carries them out are the job's
        // (`shareflow_runtime::decide`); the caller keeps its checkpoint handles, so no
        // checkpoint is tombstoned here.
        let marks = RecoveryMarks { checkpoints: None, metrics: &JobMetrics::default(), mid: None };
        let decided = shareflow_runtime::decide(std::slice::from_ref(&p), &template, restored, marks).await?;
        highest = highest.max(decided.highest.unwrap_or(0));
        p.take_over(&template).await?;
        let checkpoint_id = highest + 1;
        p.begin(&template.transaction(checkpoint_id)).await?;
        let ctx = SubtaskContext {
            job: template.prefix().to_string(),
            operator: NAME.to_string(),
            subtask: 0,
            parallelism: 1,
            first_checkpoint_id: checkpoint_id,
            transactions: template.clone(),
            failpoints: Failpoints::new(),
            dead_letters: None,
        };
        let mut source = source(&ctx);
        source.open(&ctx, Vec::new()).await?;
        let fencing_epoch = backend.fencing_epoch()?;
        Ok(Self {
            backend,
            template,
            source: Some(source),
            in_flight: None,
            unread: None,
            checkpoint_id,
            fencing_epoch,
            prepared: BTreeSet::new(),
            committed: restored,
            finished: false,
            broken: None,
            metrics,
        })
    }

    /// The open transaction, T(n): what the next batches and sends belong to.
    pub fn transaction(&self) -> TransactionId {
        self.template.transaction(self.checkpoint_id)
    }

    /// The source's counters (records emitted, redelivered, replayed, ...).
    pub fn metrics(&self) -> &SourceMetrics {
        &self.metrics
    }

    /// Produces `records` into the open transaction: visible to read_committed readers
    /// exactly when the checkpoint that covers them commits. On the embedded broker the
    /// topics are on that broker; on Kafka, on the cluster.
    pub async fn send(&mut self, records: Vec<ProducerRecord>) -> Result<()> {
        self.usable()?;
        let txn = self.transaction();
        let sent = self.backend.send(txn, records).await;
        self.guard(sent)
    }

    /// Prepares the open transaction T(n) and opens T(n+1). Returns the handle that
    /// decides T(n): persist it with the state that reflects every batch read so far,
    /// then [`commit`](Self::commit) it.
    ///
    /// A poll the stream still has in flight (a `next()` the caller dropped, in a
    /// `select!`) is finished first. If it returned records, they belong to T(n) but the
    /// caller has not seen them: the call fails with `Invalid`, and the caller reads
    /// them with `next()` and checkpoints again.
    pub async fn checkpoint(&mut self) -> Result<StreamCheckpoint> {
        self.usable()?;
        self.settle().await?;
        if self.unread.is_some() {
            return Err(RuntimeError::task_message(
                NAME,
                ErrorKind::Invalid,
                format!(
                    "a poll returned records of {} that the caller has not read yet; read them with next() (they \
                     belong to this checkpoint), then call checkpoint() again",
                    self.transaction()
                ),
            ));
        }
        let n = self.checkpoint_id;
        let p = self.backend.participant();
        let result: Result<PrepareOutcome> = async {
            if let Some(source) = self.source.as_mut() {
                source.snapshot_state(n).await?;
            }
            p.begin(&self.template.transaction(n + 1)).await?;
            p.prepare(&self.template.transaction(n)).await
        }
        .await;
        match self.guard(result)? {
            PrepareOutcome::Prepared => {}
            PrepareOutcome::AlreadyAborted => {
                let why = format!(
                    "{} was aborted before it could prepare (its transaction timeout passed, or on Kafka another \
                     instance claimed some of its records first): its records come back and its output is \
                     discarded. Roll the caller's state back to the last persisted handle and recover",
                    self.template.transaction(n)
                );
                self.broken = Some(why.clone());
                return Err(RuntimeError::task_message(NAME, ErrorKind::Unavailable, why));
            }
        }
        self.prepared.insert(n);
        self.checkpoint_id = n + 1;
        Ok(StreamCheckpoint {
            group: self.template.group_id().to_string(),
            prefix: self.template.prefix().to_string(),
            checkpoint_id: n,
            epoch: self.fencing_epoch,
        })
    }

    /// Commits T(n) of `handle`, and every earlier prepared one not committed yet:
    /// acknowledgements and output become visible together. Idempotent. Call it only
    /// after the handle is persisted; a handle of an earlier run goes to the recovery
    /// instead.
    pub async fn commit(&mut self, handle: &StreamCheckpoint) -> Result<()> {
        self.usable()?;
        let foreign = handle.group != self.template.group_id() || handle.prefix != self.template.prefix();
        if foreign || handle.epoch != self.fencing_epoch {
            return Err(RuntimeError::task_message(
                NAME,
                ErrorKind::Invalid,
                format!(
                    "handle {handle} was not taken by this stream ({}, fencing epoch {}); a handle of an earlier run \
                     is passed to the recovery, not committed",
                    self.transaction(),
                    self.fencing_epoch
                ),
            ));
        }
        let n = handle.checkpoint_id;
        if self.committed.is_some_and(|c| n <= c) {
            return Ok(());
        }
        if !self.prepared.contains(&n) {
            return Err(RuntimeError::task_message(
                NAME,
                ErrorKind::Invalid,
                format!("handle {handle} names a checkpoint this stream never took"),
            ));
        }
        let p = self.backend.participant();
        for k in plan_completion(n, &self.prepared) {
            let committed = p.commit(&self.template.transaction(k)).await;
            self.guard(committed)?;
            self.prepared.remove(&k);
            self.committed = Some(k);
        }
        let notified = match self.source.as_mut() {
            Some(source) => source.notify_checkpoint_complete(n).await,
            None => Ok(()),
        };
        self.guard(notified)
    }

    /// Leaves the group: aborts the open transaction (its records come back at once),
    /// releases what the consumer still holds, and leaves prepared transactions to the
    /// next recovery, which decides them by the handle it is given.
    pub async fn close(mut self) -> Result<()> {
        if self.broken.is_none() {
            self.settle().await?;
            self.backend.participant().abort(&self.transaction()).await?;
        }
        match self.source.take() {
            Some(mut source) => source.close().await,
            None => Ok(()),
        }
    }

    fn usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(RuntimeError::task_message(
                NAME,
                ErrorKind::Unavailable,
                format!("the stream failed earlier ({why}); open a new one with the last persisted handle"),
            )),
            None => Ok(()),
        }
    }

    /// Marks the stream broken when `result` failed.
    fn guard<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
        }
        result
    }

    /// Waits for a poll in flight and keeps what it returned.
    async fn settle(&mut self) -> Result<()> {
        if let Some(f) = self.in_flight.take() {
            let (source, event) = f.await;
            self.source = Some(source);
            match self.guard(event)? {
                SourceEvent::Batch(b) => self.unread = Some(b),
                SourceEvent::Idle => {}
                SourceEvent::Finished => self.finished = true,
            }
        }
        Ok(())
    }
}

impl Stream for ShareStream {
    type Item = Result<RecordBatch>;

    /// The next batch of records, bound to the open transaction. The stream ends when
    /// [`SourceSettings::stop_when_drained`] is set and the topics are drained. After an
    /// error it ends.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(batch) = this.unread.take() {
            return Poll::Ready(Some(Ok(batch)));
        }
        if this.broken.is_some() || this.finished {
            return Poll::Ready(None);
        }
        loop {
            let f = match this.in_flight.as_mut() {
                Some(f) => f,
                None => {
                    let Some(mut source) = this.source.take() else {
                        this.broken = Some("the source is gone".into());
                        return Poll::Ready(Some(Err(RuntimeError::Internal(
                            "share stream polled without its source".into(),
                        ))));
                    };
                    let checkpoint_id = this.checkpoint_id;
                    this.in_flight.insert(
                        async move {
                            let event = source.poll_next(checkpoint_id).await;
                            (source, event)
                        }
                        .boxed(),
                    )
                }
            };
            let (source, event) = match f.poll_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(done) => done,
            };
            this.in_flight = None;
            this.source = Some(source);
            match event {
                Ok(SourceEvent::Batch(b)) => return Poll::Ready(Some(Ok(b))),
                Ok(SourceEvent::Idle) => continue,
                Ok(SourceEvent::Finished) => {
                    this.finished = true;
                    return Poll::Ready(None);
                }
                Err(e) => {
                    this.broken = Some(e.to_string());
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> StreamCheckpoint {
        StreamCheckpoint { group: "orders".into(), prefix: "w-1".into(), checkpoint_id: 7, epoch: 3 }
    }

    #[test]
    fn a_handle_round_trips_and_names_its_transaction() {
        let h = handle();
        assert_eq!(StreamCheckpoint::from_bytes(&h.to_bytes()).expect("decodes"), h);
        assert_eq!(h.transaction().expect("valid").to_string(), "orders-w-1-7");
        assert_eq!(h.to_string(), "orders-w-1-7 (fencing epoch 3)");
    }

    #[test]
    fn damaged_handles_are_data_errors_that_say_what_is_wrong() {
        let good = handle().to_bytes();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("empty", Vec::new(), "0 bytes without the SFS1 header"),
            ("no header", good[4..].to_vec(), "without the SFS1 header"),
            ("truncated", good[..good.len() - 1].to_vec(), "the body does not decode"),
            (
                "bad prefix",
                {
                    let bad = StreamCheckpoint { prefix: "-x".into(), ..handle() };
                    bad.to_bytes()
                },
                "prefix",
            ),
        ];
        for (name, bytes, expected) in cases {
            let err = StreamCheckpoint::from_bytes(&bytes).expect_err(name);
            assert_eq!(err.kind(), ErrorKind::Data, "{name}: {err}");
            assert!(err.to_string().contains(expected), "{name}: {err}");
            assert!(err.to_string().contains("stream checkpoint handle"), "{name}: {err}");
        }
    }

    #[test]
    fn options_refuse_a_zero_timeout_and_bad_names() {
        let zero = StreamOptions::new("orders", "w", &["in"]).transaction_timeout(Duration::ZERO);
        assert!(zero.template().expect_err("zero").to_string().contains("transaction_timeout"));
        let bad = StreamOptions::new("orders", "-w", &["in"]);
        assert!(bad.template().is_err());
    }
}
