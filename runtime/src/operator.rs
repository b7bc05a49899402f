//! The operator lifecycle, as Flink's `CheckpointedFunction` and `CheckpointListener`.
//!
//! Every subtask of every operator goes through: `open` (with its restored state),
//! `process_batch` for each input batch, `snapshot_state` when barrier n has arrived on
//! all its inputs, `notify_checkpoint_complete(n)` (which also covers every earlier
//! checkpoint whose notification was lost), `notify_checkpoint_aborted(n)`, and `close`.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use shareflow_checkpoint::{CheckpointId, TransactionId};

use crate::channel::Collector;
use crate::error::Result;
use crate::failpoint::Failpoints;

/// Who a subtask is and what it runs in.
#[derive(Debug, Clone)]
pub struct SubtaskContext {
    /// Job name.
    pub job: String,
    /// Operator name.
    pub operator: String,
    /// This subtask's index.
    pub subtask: u32,
    /// The operator's parallelism.
    pub parallelism: u32,
    /// The first checkpoint this attempt processes: data before barrier
    /// `first_checkpoint_id` belongs to checkpoint `first_checkpoint_id`.
    pub first_checkpoint_id: CheckpointId,
    /// The job's transaction id template: `transaction(n)` is T(n).
    pub transactions: TransactionTemplate,
    /// The failpoints of the job (tests arm them).
    pub failpoints: Failpoints,
    /// Where records this subtask cannot process go ([`crate::JobBuilder::dead_letters`]);
    /// `None`: the job has no dead-letter topic, and such a record fails the attempt.
    pub dead_letters: Option<crate::DeadLetters>,
}

impl SubtaskContext {
    /// `operator[subtask]`, for errors and logs.
    pub fn task_name(&self) -> String {
        format!("{}[{}]", self.operator, self.subtask)
    }
}

/// Makes T(n) = `{group}-{prefix}-{n}` for the job instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionTemplate {
    base: TransactionId,
}

impl TransactionTemplate {
    /// The template of `group` and `prefix`.
    pub fn new(group: &str, prefix: &str) -> Result<Self> {
        Ok(Self { base: TransactionId::new(group, prefix, 0)? })
    }

    /// T(n).
    pub fn transaction(&self, checkpoint_id: CheckpointId) -> TransactionId {
        self.base.with_checkpoint(checkpoint_id)
    }

    /// The group id.
    pub fn group_id(&self) -> &str {
        self.base.group_id()
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        self.base.prefix()
    }
}

/// State of one subtask: a list of independent items. On restore at another
/// parallelism, the items of all old subtasks are pooled and dealt round-robin to the
/// new ones (Flink's split redistribution of operator list state).
pub type StateItems = Vec<Bytes>;

/// What a participant checks a job against before its first attempt
/// ([`TransactionParticipant::validate_job`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobSettings {
    /// The share group of the job's transactions.
    pub group: String,
    /// The checkpoint interval; `None` without periodic checkpoints.
    pub checkpoint_interval: Option<std::time::Duration>,
    /// How long a checkpoint may take before it is aborted.
    pub checkpoint_timeout: std::time::Duration,
    /// Checkpoints that may fail in a row before the attempt fails.
    pub tolerable_checkpoint_failures: u32,
    /// Instances of the job in the group: this one and every other the registry shows
    /// not retired and not adopted (1 for a job that is not an instance).
    pub instances: u32,
    /// How the job restarts after a failed attempt.
    pub restart: crate::RestartStrategy,
}

impl JobSettings {
    /// The settings of a job in `group`; see the fields.
    pub fn new(
        group: impl Into<String>,
        checkpoint_interval: Option<std::time::Duration>,
        checkpoint_timeout: std::time::Duration,
        tolerable_checkpoint_failures: u32,
        instances: u32,
    ) -> Self {
        Self {
            group: group.into(),
            checkpoint_interval,
            checkpoint_timeout,
            tolerable_checkpoint_failures,
            instances,
            restart: crate::RestartStrategy::None,
        }
    }

    /// These settings with the job's restart strategy.
    pub fn with_restart(mut self, restart: crate::RestartStrategy) -> Self {
        self.restart = restart;
        self
    }

    /// Transactions one attempt of this job keeps pending at most: those of the
    /// checkpoints that failed in a row, the one completing and the next one begun.
    pub fn pending_per_instance(&self) -> u32 {
        Self::pending_for(self.tolerable_checkpoint_failures)
    }

    /// Transactions one attempt keeps pending at most with `tolerable_checkpoint_failures`
    /// (that many failed checkpoints, the one completing, the next one begun): what a
    /// group's `share.transaction.max.pending` or Kafka's slot pool must hold per instance.
    pub const fn pending_for(tolerable_checkpoint_failures: u32) -> u32 {
        tolerable_checkpoint_failures.saturating_add(2)
    }
}

/// A transforming operator (or a sink, which emits nothing).
#[async_trait]
pub trait Operator: Send + 'static {
    /// Called once per attempt, with this subtask's share of the restored state.
    async fn open(&mut self, _ctx: &SubtaskContext, _restored: StateItems) -> Result<()> {
        Ok(())
    }

    /// Processes one batch from input `input` (0 for single-input operators).
    async fn process_batch(&mut self, batch: RecordBatch, input: usize, out: &mut Collector) -> Result<()>;

    /// Barrier n arrived on every input, and `watermark` is the minimum of the event-time
    /// watermarks (ms since the Unix epoch) that the inputs not idle in checkpoint n's
    /// period sent before it ([`Collector::watermark`]); if every input was idle, the
    /// newest of the last watermarks they sent. Called just before
    /// [`snapshot_state`](Self::snapshot_state), and only if some input ever sent one.
    async fn on_watermark(&mut self, _watermark: i64) -> Result<()> {
        Ok(())
    }

    /// Barrier n arrived on every input: every row of checkpoint n has been processed.
    /// Flush what must be durable for n and return the state to store.
    async fn snapshot_state(&mut self, _checkpoint_id: CheckpointId, _out: &mut Collector) -> Result<StateItems> {
        Ok(Vec::new())
    }

    /// Checkpoint n completed; covers every earlier checkpoint too.
    async fn notify_checkpoint_complete(&mut self, _checkpoint_id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Checkpoint n was aborted (timeout, decline, failure). Its rows will be committed
    /// by the next checkpoint that completes.
    async fn notify_checkpoint_aborted(&mut self, _checkpoint_id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// All inputs ended; emit anything left.
    async fn close(&mut self, _out: &mut Collector) -> Result<()> {
        Ok(())
    }
}

/// What a source returned from one poll.
#[derive(Debug)]
pub enum SourceEvent {
    /// Records to emit.
    Batch(RecordBatch),
    /// Nothing right now; the runtime checks for barriers and polls again.
    Idle,
    /// A bounded source has nothing more, ever.
    Finished,
}

/// A parallel source. `poll_next` must return within a short time (return
/// [`SourceEvent::Idle`] rather than wait long): barriers are injected between polls.
#[async_trait]
pub trait Source: Send + 'static {
    /// Called once per attempt, with this subtask's share of the restored state.
    async fn open(&mut self, ctx: &SubtaskContext, restored: StateItems) -> Result<()>;

    /// The next batch, or idle, or finished. `checkpoint_id` is the checkpoint the rows
    /// it returns belong to.
    async fn poll_next(&mut self, checkpoint_id: CheckpointId) -> Result<SourceEvent>;

    /// Barrier n is being emitted: every row of checkpoint n was emitted. Return the state.
    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId) -> Result<StateItems>;

    /// Checkpoint n completed; covers every earlier checkpoint too.
    async fn notify_checkpoint_complete(&mut self, _checkpoint_id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Checkpoint n was aborted.
    async fn notify_checkpoint_aborted(&mut self, _checkpoint_id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// The job is stopping.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }

    /// The attempt failed and this subtask stops where it is, as in a crash: release the
    /// clients the source holds, deciding nothing (recovery decides). Called at most
    /// once, instead of [`close`](Self::close), and given a few seconds. The default
    /// does nothing: the source is dropped.
    async fn abandon(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A transaction the recovery protocol found undecided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTransaction {
    /// Its id.
    pub id: TransactionId,
    /// Whether it reached PREPARE.
    pub prepared: bool,
}

/// What [`TransactionParticipant::prepare`] found: phase one succeeded, or the
/// transaction was aborted before it could prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareOutcome {
    /// PREPARE, durably (or it already was): it can commit.
    Prepared,
    /// Already ABORTED (its timeout passed, or it was aborted): it can never commit.
    AlreadyAborted,
}

/// A job-level transactional resource: one transaction T(n) per checkpoint, shared by
/// all subtasks. The coordinator begins T(n) before the rows of checkpoint n flow,
/// prepares it once every subtask has acknowledged barrier n, writes the manifest (the
/// decision), then commits. Every call must be idempotent by transaction id.
#[async_trait]
pub trait TransactionParticipant: Send + Sync + 'static {
    /// A name for logs and the manifest.
    fn name(&self) -> &str;

    /// Called once before the job's first attempt with the job's settings: refuse a
    /// configuration this participant or its broker cannot honour. The default checks
    /// only what [`validate`](Self::validate) checks.
    async fn validate_job(&self, job: &JobSettings) -> Result<()> {
        self.validate(job.checkpoint_interval, job.checkpoint_timeout).await
    }

    /// Called once before the job's first attempt: refuse a configuration this
    /// participant cannot honour (for example a transaction timeout shorter than a
    /// checkpoint can take). `checkpoint_interval` is `None` without periodic checkpoints.
    async fn validate(
        &self,
        _checkpoint_interval: Option<std::time::Duration>,
        _checkpoint_timeout: std::time::Duration,
    ) -> Result<()> {
        Ok(())
    }

    /// Called once per attempt before anything else: take ownership of the prefix
    /// (fencing older instances).
    async fn open(&self, _template: &TransactionTemplate) -> Result<()> {
        Ok(())
    }

    /// EMPTY -> ONGOING. Idempotent.
    async fn begin(&self, txn: &TransactionId) -> Result<()>;

    /// ONGOING -> PREPARE, durably. [`PrepareOutcome::AlreadyAborted`] means the
    /// transaction is already ABORTED (for example by its timeout) and cannot commit.
    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome>;

    /// PREPARE -> COMMITTED. Idempotent.
    async fn commit(&self, txn: &TransactionId) -> Result<()>;

    /// -> ABORTED. Idempotent.
    async fn abort(&self, txn: &TransactionId) -> Result<()>;

    /// This job instance's undecided transactions (same group and prefix).
    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>>;

    /// A new participant on the same backend, not yet opened, for deciding the
    /// transactions of another instance of the group (adoption, decision 0007). Opening
    /// it with the other instance's template must fence that instance. `None`: this
    /// participant cannot adopt, and the job cannot run as an instance.
    fn adopter(&self) -> Option<Participant> {
        None
    }

    /// Called once every transaction of `template`'s prefix is decided: by a restart's
    /// recovery for this job's own prefix (before any task starts), and by an adoption
    /// for the adopted prefix (decision 0008). The participant fences whatever of that
    /// prefix could still commit, and takes over its remaining work. A backend whose
    /// aborted transactions give their records back (the embedded broker) has nothing
    /// to do.
    async fn take_over(&self, _template: &TransactionTemplate) -> Result<()> {
        Ok(())
    }

    /// Whether `txn`, which a checkpoint decided to commit and recovery committed, did
    /// commit. `Some(false)`: the broker aborted it after its checkpoint completed (on
    /// Kafka, a job down longer than the transaction timeout), so its output is gone and
    /// its records come back. A job with keyed state then restores an older checkpoint
    /// (`plan_keyed_restore`). `None`, the default: this participant cannot tell, or a
    /// decided transaction cannot be lost on its backend.
    async fn committed(&self, _txn: &TransactionId) -> Result<Option<bool>> {
        Ok(None)
    }

    /// The highest checkpoint id of any transaction of this group and prefix, decided or
    /// not, so that a restarted job never reuses an id (a decided id cannot begin again).
    async fn highest_checkpoint_id(&self, _template: &TransactionTemplate) -> Result<Option<CheckpointId>> {
        Ok(None)
    }

    /// Called once when the job stops, however it stops (finished, stopped, fenced,
    /// failed), and when an adoption is done with an adopter: release the clients the
    /// participant holds. A transaction still prepared stays for the next incarnation's
    /// recovery. The default does nothing.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

/// A shared participant.
pub type Participant = Arc<dyn TransactionParticipant>;
