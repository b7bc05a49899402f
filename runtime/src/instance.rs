//! A job as one instance of several in a share group (decision 0007): it registers,
//! beats, adopts silent instances, and retires when it stops gracefully.
//!
//! What to adopt is decided by `shareflow_checkpoint::protocol::plan_adoption`, and an
//! adopted instance's transactions by `plan_recovery`, the same rule as a restart's
//! recovery; this module observes and carries out.

use std::collections::BTreeSet;

use shareflow_checkpoint::instances::{Heartbeat, InstanceRegistry, SilenceTracker};
use shareflow_checkpoint::protocol::{
    held_prefixes, plan_adoption, plan_recovery, resolve, AdoptionStep, PendingTxn, RetentionPolicy, TxnAction,
};
use shareflow_checkpoint::{CheckpointId, CheckpointStore};

use crate::config::InstanceConfig;
use crate::error::{Result, RuntimeError};
#[cfg(feature = "testing")]
use crate::failpoint::Broken;
use crate::failpoint::{points, Failpoints};
use crate::metrics::JobMetrics;
use crate::operator::{Participant, PrepareOutcome, TransactionTemplate};

/// This process's registration as one instance of the group.
pub(crate) struct Instance {
    registry: InstanceRegistry,
    storage: CheckpointStore,
    config: InstanceConfig,
    template: TransactionTemplate,
    incarnation: u64,
    beats: std::sync::atomic::AtomicU64,
    tracker: SilenceTracker,
}

impl Instance {
    /// Registers a new incarnation of the job's prefix: refused if another instance
    /// adopted it; fences an older incarnation of the same prefix.
    pub(crate) async fn register(
        storage: CheckpointStore,
        config: InstanceConfig,
        template: TransactionTemplate,
    ) -> Result<Self> {
        let registry = storage.registry();
        let prefix = template.prefix().to_string();
        let incarnation = registry.register(&prefix).await?;
        tracing::info!(%prefix, incarnation, "registered as an instance of the group");
        Ok(Self {
            registry,
            storage,
            config,
            template,
            incarnation,
            beats: Default::default(),
            tracker: SilenceTracker::new(),
        })
    }

    /// Fails (kind Fenced) if a newer incarnation or an adopter took this prefix over.
    /// A job checks this after its participants opened, before it commits anything: an
    /// adopter that fenced us earlier is seen here, and one that fences us later fences
    /// what we just opened (decision 0008, rule R1).
    pub(crate) async fn ensure_current(&self) -> Result<()> {
        self.registry.record(self.template.prefix()).await?.ensure_current(self.incarnation)?;
        Ok(())
    }

    fn next_beat(&self, checkpoint_id: Option<CheckpointId>) -> Heartbeat {
        let beat = self.beats.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Heartbeat { incarnation: self.incarnation, beat, checkpoint_id }
    }

    /// Runs `work` (a recovery) while beating every interval, so that a recovery that
    /// takes longer than the adoption timeout does not look like silence. Beats only:
    /// the fencing check stays with the job's ticks and `ensure_current`.
    pub(crate) async fn beating<T>(&self, work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let mut work = std::pin::pin!(work);
        let mut every = tokio::time::interval(self.config.heartbeat_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            tokio::select! {
                r = &mut work => return r,
                _ = every.tick() => {
                    let beat = self.next_beat(None);
                    if let Err(e) = self.registry.write_heartbeat(self.template.prefix(), beat).await {
                        tracing::warn!(error = %e, "cannot write a heartbeat while recovering, adopting or committing");
                    }
                }
            }
        }
    }

    /// The prefixes this instance holds: finished adoptions by it, transitively.
    pub(crate) async fn held(&self) -> Result<Vec<String>> {
        let records = self.registry.observe().await?;
        let views = SilenceTracker::new().views(&records, std::time::Instant::now());
        Ok(held_prefixes(self.template.prefix(), &views).into_iter().collect())
    }

    /// How often to beat and look around.
    pub(crate) fn interval(&self) -> std::time::Duration {
        self.config.heartbeat_interval
    }

    /// Beats (failing, kind Fenced, if a newer incarnation or an adopter took over), then
    /// adopts every instance the plan says to.
    pub(crate) async fn tick(
        &mut self,
        checkpoint_id: Option<CheckpointId>,
        participants: &[Participant],
        metrics: &JobMetrics,
        failpoints: &Failpoints,
    ) -> Result<()> {
        // One look at the registry serves both the fencing check and the adoption plan.
        let records = self.registry.observe().await?;
        let me = self.template.prefix().to_string();
        match records.iter().find(|r| r.prefix == me) {
            Some(own) => own.ensure_current(self.incarnation)?,
            None => return Err(RuntimeError::Internal(format!("instance {me} is missing from the registry"))),
        }
        let beat = self.next_beat(checkpoint_id);
        self.registry.write_heartbeat(&me, beat).await?;
        let views = self.tracker.views(&records, std::time::Instant::now());
        for step in plan_adoption(&me, &views, self.config.adoption_timeout) {
            let prefix = step.prefix().to_string();
            if let AdoptionStep::Claim { .. } = step {
                let holder = self.registry.claim(&prefix, &me).await?;
                if holder != me {
                    tracing::info!(%prefix, %holder, "another instance claimed this adoption first");
                    continue;
                }
                tracing::warn!(%prefix, "adopting a silent instance");
            } else {
                tracing::warn!(%prefix, "resuming an unfinished adoption");
            }
            // An adoption can outlast the adoption timeout: beat meanwhile.
            self.beating(self.adopt(&prefix, participants, metrics, failpoints)).await?;
        }
        Ok(())
    }

    /// Fences `prefix` on every participant, decides its transactions from its own
    /// manifests, and records the adoption done.
    async fn adopt(
        &self,
        prefix: &str,
        participants: &[Participant],
        metrics: &JobMetrics,
        failpoints: &Failpoints,
    ) -> Result<()> {
        let template = TransactionTemplate::new(self.template.group_id(), prefix)?;
        let mut adopters = Vec::with_capacity(participants.len());
        for p in participants {
            let Some(q) = p.adopter() else {
                return Err(RuntimeError::InvalidConfig {
                    key: "participant".into(),
                    value: p.name().to_string(),
                    rule: "cannot adopt another instance's transactions; this job cannot run as an instance".into(),
                });
            };
            adopters.push(q);
        }
        let result = self.adopt_with(prefix, &template, &adopters, participants, metrics, failpoints).await;
        for q in &adopters {
            if let Err(e) = q.close().await {
                tracing::warn!(participant = q.name(), %prefix, error = %e, "closing an adopter failed");
            }
        }
        result
    }

    /// [`adopt`](Self::adopt) with `adopters`, one per participant, which it opens.
    async fn adopt_with(
        &self,
        prefix: &str,
        template: &TransactionTemplate,
        adopters: &[Participant],
        participants: &[Participant],
        metrics: &JobMetrics,
        failpoints: &Failpoints,
    ) -> Result<()> {
        for q in adopters {
            // Opening with the adopted prefix fences it: it can decide nothing more.
            q.open(template).await?;
        }
        // Decided once: a resumed adoption never decides from a manifest the adopted
        // instance wrote after the first plan.
        let theirs = self.storage.sibling(prefix)?;
        let observed = theirs.observe().await.map_err(|e| adoption_error(prefix, e))?;
        let latest = resolve(&observed, &RetentionPolicy::default()).restored_id();
        let restored = self.registry.record_plan(prefix, latest).await?;
        failpoints.hit(points::ADOPTION_MID)?;
        let marks = RecoveryMarks { checkpoints: Some(&theirs), metrics, mid: None };
        let decided = decide(adopters, template, restored, marks).await?.checkpoints;
        // Its transactions are decided: fence what is left of it and take its work over,
        // with that of every instance it held (holding is transitive).
        let records = self.registry.observe().await?;
        let views = SilenceTracker::new().views(&records, std::time::Instant::now());
        let mut taken = vec![template.clone()];
        for theirs in held_prefixes(prefix, &views) {
            taken.push(TransactionTemplate::new(self.template.group_id(), &theirs)?);
        }
        for p in participants {
            for t in &taken {
                p.take_over(t).await?;
            }
        }
        self.registry.finish_adoption(prefix).await?;
        metrics.checkpoints(|c| c.instances_adopted += 1);
        tracing::warn!(%prefix, restored = ?restored, transactions = decided, "adopted: every transaction of the instance is decided");
        Ok(())
    }

    /// Records that this incarnation stopped gracefully: nobody adopts it.
    pub(crate) async fn retire(&self) -> Result<()> {
        self.registry.retire(self.template.prefix(), self.incarnation).await?;
        Ok(())
    }
}

fn adoption_error(prefix: &str, e: shareflow_checkpoint::CheckpointError) -> RuntimeError {
    RuntimeError::InvalidConfig {
        key: "checkpoints".into(),
        value: prefix.into(),
        rule: format!(
            "cannot read the checkpoints of instance {prefix} to adopt it ({e}); every instance of a group must \
             read the same checkpoint root"
        ),
    }
}

/// One decision [`resolve_pending`] took (or, in a dry run, would take).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Resolution {
    /// The transaction, `{groupId}-{prefix}-{checkpointId}`.
    pub transaction: String,
    /// The participant that holds it.
    pub participant: String,
    /// `commit` (a complete checkpoint decided it), `prepare and commit`, or `abort`
    /// (no complete checkpoint covers it).
    pub action: &'static str,
}

/// Decides the transactions a job that is not running left pending, as its restart
/// would: commits those a complete checkpoint of `storage` covers, aborts the rest
/// (tombstoning their checkpoints first). It plans from what the participants answer
/// to `pending` before they are opened (the embedded broker's does), then opens them,
/// taking the prefix as a restart does, and decides. With `dry_run` it opens nothing and
/// only says what it would do.
/// The same plan ([`plan_recovery`]) a recovery carries out; what `shareflow txn
/// resolve` runs.
pub async fn resolve_pending(
    participants: &[Participant],
    template: &TransactionTemplate,
    storage: &CheckpointStore,
    dry_run: bool,
) -> Result<Vec<Resolution>> {
    let policy = RetentionPolicy { retain: 1, protected: BTreeSet::new() };
    let restored = storage.recover(&policy).await?.plan.restored_id();
    // Planned before the participants open: opening takes the prefix, and that alone
    // may abort what was ONGOING, which the plan must still name.
    let mut pending = Vec::new();
    for (index, p) in participants.iter().enumerate() {
        for t in p.pending(template).await? {
            pending.push(PendingTxn { participant: index, checkpoint_id: t.id.checkpoint_id(), prepared: t.prepared });
        }
    }
    let plan: Vec<Resolution> = plan_recovery(restored, &pending)
        .iter()
        .map(|a| {
            let (index, action) = match *a {
                TxnAction::Commit { participant, .. } => (participant, "commit"),
                TxnAction::PrepareAndCommit { participant, .. } => (participant, "prepare and commit"),
                TxnAction::Abort { participant, .. } => (participant, "abort"),
            };
            Resolution {
                transaction: template.transaction(a.checkpoint_id()).to_string(),
                participant: participants[index].name().to_string(),
                action,
            }
        })
        .collect();
    if !dry_run {
        // Take the prefix, as a restart does: whatever still holds it is fenced.
        for p in participants {
            p.open(template).await?;
        }
        let marks = RecoveryMarks { checkpoints: Some(storage), metrics: &JobMetrics::default(), mid: None };
        decide(participants, template, restored, marks).await?;
    }
    Ok(plan)
}

/// What carrying out a recovery plan marks besides the participants' transactions.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryMarks<'a> {
    /// The prefix's checkpoints: before T(n) aborts, checkpoint n is tombstoned there, so
    /// that a manifest a fenced, paused incarnation writes later is never restored. The
    /// Stream API, whose caller keeps its own checkpoint handles, has none.
    pub checkpoints: Option<&'a CheckpointStore>,
    /// Counts the transactions committed and aborted.
    pub metrics: &'a JobMetrics,
    /// Hit (`recovery.mid`) after the first decision.
    pub mid: Option<&'a Failpoints>,
}

/// What [`decide`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    /// Checkpoints whose transactions it committed or aborted.
    pub checkpoints: usize,
    /// The highest checkpoint id among the pending transactions it found, if any: a
    /// new attempt begins above it.
    pub highest: Option<CheckpointId>,
}

/// The one loop that carries out the recovery half of the commit rules
/// (`shareflow_checkpoint::protocol::plan_recovery`) for `template`'s pending
/// transactions on `participants`: what a job's restart does for its own prefix, an
/// adopter for another's, and the Stream API when it opens. `restored` is the newest
/// complete checkpoint (or handle).
pub async fn decide(
    participants: &[Participant],
    template: &TransactionTemplate,
    restored: Option<CheckpointId>,
    marks: RecoveryMarks<'_>,
) -> Result<Decided> {
    let RecoveryMarks { checkpoints, metrics, mid } = marks;
    let mut pending = Vec::new();
    for (index, p) in participants.iter().enumerate() {
        for t in p.pending(template).await? {
            pending.push(PendingTxn { participant: index, checkpoint_id: t.id.checkpoint_id(), prepared: t.prepared });
        }
    }
    let plan = plan_recovery(restored, &pending);
    // A broken variant (feature `testing` only): every pending transaction aborted.
    #[cfg(feature = "testing")]
    let plan = if mid.is_some_and(|f| f.is_broken(Broken::RecoveryAbortsDecided)) {
        plan.into_iter()
            .map(|a| match a {
                TxnAction::Commit { participant, checkpoint_id }
                | TxnAction::PrepareAndCommit { participant, checkpoint_id }
                | TxnAction::Abort { participant, checkpoint_id } => TxnAction::Abort { participant, checkpoint_id },
            })
            .collect()
    } else {
        plan
    };
    let decided: BTreeSet<CheckpointId> = plan.iter().map(TxnAction::checkpoint_id).collect();
    for (i, action) in plan.into_iter().enumerate() {
        let (index, commit, prepare) = match action {
            TxnAction::Commit { participant, .. } => (participant, true, false),
            TxnAction::PrepareAndCommit { participant, .. } => (participant, true, true),
            TxnAction::Abort { participant, .. } => (participant, false, false),
        };
        let p = &participants[index];
        let txn = template.transaction(action.checkpoint_id());
        if prepare && p.prepare(&txn).await? == PrepareOutcome::AlreadyAborted {
            return Err(RuntimeError::Internal(format!(
                "{txn} of {} is covered by checkpoint {restored:?} but the broker already aborted it: its records \
                 come back and its output is gone; the restored state includes work that did not commit",
                p.name()
            )));
        }
        if commit {
            tracing::info!(txn = %txn, participant = p.name(), "committing a transaction its checkpoint decided");
            p.commit(&txn).await?;
            metrics.checkpoints(|c| c.transactions_recovered += 1);
        } else {
            // Tombstone first: a manifest for it that a fenced, paused incarnation writes
            // later must never be restored (docs/model.md, finding 1).
            if let Some(storage) = checkpoints {
                storage.mark_aborted(action.checkpoint_id()).await?;
            }
            tracing::info!(txn = %txn, participant = p.name(), "aborting an undecided transaction");
            p.abort(&txn).await?;
            metrics.checkpoints(|c| c.transactions_aborted += 1);
        }
        if i == 0 {
            if let Some(f) = mid {
                f.hit(points::RECOVERY_MID)?;
            }
        }
    }
    let highest = pending.iter().map(|t| t.checkpoint_id).max();
    Ok(Decided { checkpoints: decided.len(), highest })
}
