//! The checkpoint coordinator: triggers barriers, collects acknowledgements, prepares
//! the participants, writes the manifest (the decision), commits, and notifies.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use shareflow_checkpoint::protocol::{plan_completion, CollectReason, RecoveryDecision, RecoveryPlan};
use shareflow_checkpoint::{CheckpointId, ParticipantState, TransactionRecord};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::channel::Barrier;
use crate::config::JobConfig;
use crate::error::{Result, RuntimeError};
#[cfg(feature = "testing")]
use crate::failpoint::Broken;
use crate::failpoint::{points, Failpoints};
use crate::instance::Instance;
use crate::metrics::{CheckpointOutcome, JobMetrics};
use crate::operator::{Participant, PrepareOutcome, StateItems, TransactionTemplate};
use crate::task::{Control, Report};

pub(crate) struct Coordinator<'a> {
    pub(crate) config: &'a JobConfig,
    pub(crate) participants: &'a [Participant],
    pub(crate) template: TransactionTemplate,
    pub(crate) failpoints: Failpoints,
    pub(crate) metrics: JobMetrics,
    pub(crate) triggers: Vec<mpsc::UnboundedSender<Barrier>>,
    pub(crate) controls: Vec<mpsc::UnboundedSender<Control>>,
    pub(crate) reports: mpsc::UnboundedReceiver<Report>,
    /// Subtasks that acknowledge each barrier.
    pub(crate) subtasks: usize,
    /// Node index -> operator name.
    pub(crate) node_names: Vec<String>,
    /// The id the next checkpoint gets; the rows of checkpoint `next_id` are flowing.
    pub(crate) next_id: CheckpointId,
    /// Checkpoints whose transaction is begun and not yet committed.
    pub(crate) uncommitted: BTreeSet<CheckpointId>,
    /// This job's registration as an instance of the group: it beats and adopts.
    pub(crate) instance: Option<&'a mut Instance>,
    /// `true` once a graceful stop is asked for.
    pub(crate) stop: tokio::sync::watch::Receiver<bool>,
    /// Savepoints asked for, taken from the next checkpoint that completes.
    pub(crate) savepoints: crate::savepoint::Requests,
}

struct InFlight {
    barrier: Barrier,
    started: Instant,
    acks: BTreeMap<(usize, u32), StateItems>,
}

impl Coordinator<'_> {
    fn txn_error(&self, op: &'static str, k: CheckpointId, e: RuntimeError) -> RuntimeError {
        tracing::error!(checkpoint = k, op, error = %e, "transaction step failed");
        e
    }

    /// Begins T(n) on every participant.
    pub(crate) async fn begin(&mut self, n: CheckpointId) -> Result<()> {
        let txn = self.template.transaction(n);
        for p in self.participants {
            p.begin(&txn).await.map_err(|e| self.txn_error("begin", n, e))?;
        }
        self.uncommitted.insert(n);
        self.count_open();
        Ok(())
    }

    /// Sets the open-transactions gauge from what is begun and not yet decided.
    fn count_open(&self) {
        let open = (self.uncommitted.len() * self.participants.len()) as u64;
        self.metrics.checkpoints(|c| c.transactions_open = open);
    }

    async fn trigger(&mut self, is_final: bool, end_of_input: bool) -> Result<InFlight> {
        let id = self.next_id;
        if !is_final {
            // The rows of checkpoint id + 1 start when barrier id passes; its transaction must exist first.
            self.begin(id + 1).await?;
        }
        self.next_id = id + 1;
        let barrier = Barrier { checkpoint_id: id, is_final, end_of_input };
        tracing::debug!(checkpoint = id, is_final, "triggering checkpoint");
        for t in &self.triggers {
            let _ = t.send(barrier);
        }
        Ok(InFlight { barrier, started: Instant::now(), acks: BTreeMap::new() })
    }

    fn notify(&self, control: Control) {
        for c in &self.controls {
            let _ = c.send(control);
        }
    }

    /// Runs until the final checkpoint completed and every task finished.
    pub(crate) async fn run(mut self) -> Result<()> {
        let sources = self.triggers.len();
        let mut in_flight: Option<InFlight> = None;
        let mut sources_finished = 0;
        let mut tasks_finished = 0;
        let mut final_triggered = false;
        let mut final_done = false;
        let mut consecutive_failures = 0;
        let mut retained: VecDeque<CheckpointId> = VecDeque::new();
        let interval = self.config.checkpoint_interval;
        let mut next_trigger = interval.map(|i| Instant::now() + i);
        // An instance beats (and looks for silent instances) at once, then every interval.
        let mut next_tick = self.instance.as_ref().map(|_| Instant::now());
        let mut last_completed = None;
        loop {
            if final_done && tasks_finished >= self.subtasks {
                return Ok(());
            }
            let stopping = *self.stop.borrow();
            if in_flight.is_none() && !final_triggered && (sources_finished >= sources || stopping) {
                if stopping && sources_finished < sources {
                    tracing::info!("stop asked for: taking a final checkpoint");
                }
                in_flight = Some(self.trigger(true, sources_finished >= sources).await?);
                final_triggered = true;
            }
            let mut tick_due = false;
            let wake = match &in_flight {
                Some(f) => Some(f.started + self.config.checkpoint_timeout),
                None if !final_triggered => next_trigger,
                None => None,
            };
            tokio::select! {
                report = self.reports.recv() => match report {
                    None => return Err(RuntimeError::Internal("every task is gone".into())),
                    Some(Report::Failed(e)) => return Err(e),
                    Some(Report::SourceFinished) => sources_finished += 1,
                    Some(Report::Finished) => tasks_finished += 1,
                    Some(Report::Ack { checkpoint_id, node, subtask, state }) => {
                        let Some(f) = in_flight.as_mut().filter(|f| f.barrier.checkpoint_id == checkpoint_id) else {
                            continue; // an aborted checkpoint's late acknowledgement
                        };
                        f.acks.insert((node, subtask), state);
                        if f.acks.len() == self.subtasks {
                            let Some(done) = in_flight.take() else { continue };
                            let (id, acks, started) = (done.barrier.checkpoint_id, done.acks, done.started);
                            self.complete_beating(id, acks, started).await?;
                            // Before the collection below may delete the checkpoint.
                            let storage = &self.config.storage;
                            self.savepoints.serve(storage, id, done.barrier.is_final, &self.failpoints).await?;
                            last_completed = Some(done.barrier.checkpoint_id);
                            consecutive_failures = 0;
                            retained.push_back(done.barrier.checkpoint_id);
                            self.collect_garbage(&mut retained).await;
                            if done.barrier.is_final {
                                final_done = true;
                                self.controls.clear(); // no more notifications: tasks may end
                            }
                            next_trigger = interval.map(|i| Instant::now() + i.max(self.config.min_pause_between_checkpoints));
                        }
                    }
                },
                // The job owns the sender and outlives this loop, so this never errs.
                _ = self.stop.changed(), if !stopping && !final_triggered => {}
                _ = sleep_until(next_tick), if next_tick.is_some() => tick_due = true,
                _ = sleep_until(wake), if wake.is_some() => {
                    match in_flight.take() {
                        Some(f) if Instant::now() >= f.started + self.config.checkpoint_timeout => {
                            consecutive_failures += 1;
                            self.abort_timed_out(&f, consecutive_failures)?;
                            next_trigger = interval.map(|i| Instant::now() + i.max(self.config.min_pause_between_checkpoints));
                        }
                        Some(f) => in_flight = Some(f),
                        None => {
                            if next_trigger.is_some_and(|t| Instant::now() >= t) && !final_triggered {
                                in_flight = Some(self.trigger(false, false).await?);
                            }
                        }
                    }
                }
            }
            if tick_due {
                self.tick(last_completed).await?;
                next_tick = self.instance.as_ref().map(|i| Instant::now() + i.interval());
            }
        }
    }

    /// Completes checkpoint n (see `complete`). An instance beats while its checkpoint
    /// commits: a broker or store slow to answer must not look like silence (an 8 s
    /// broker stall got a live instance adopted).
    async fn complete_beating(
        &mut self,
        n: CheckpointId,
        acks: BTreeMap<(usize, u32), StateItems>,
        started: Instant,
    ) -> Result<()> {
        match self.instance.take() {
            Some(i) => {
                let r = i.beating(self.complete(n, acks, started)).await;
                self.instance = Some(i);
                r
            }
            None => self.complete(n, acks, started).await,
        }
    }

    /// Checkpoint `f` timed out: aborts it. The job fails if it was the final checkpoint,
    /// or if more checkpoints than tolerated failed in a row (`failures`, this one
    /// included).
    fn abort_timed_out(&self, f: &InFlight, failures: u32) -> Result<()> {
        let n = f.barrier.checkpoint_id;
        tracing::warn!(
            checkpoint = n,
            acks = f.acks.len(),
            expected = self.subtasks,
            "checkpoint timed out; aborting it"
        );
        self.notify(Control::Aborted(n));
        let outcome = CheckpointOutcome {
            id: n,
            transaction: self.template.transaction(n).to_string(),
            duration: f.started.elapsed(),
            size_bytes: 0,
            aborted: Some(format!("timed out with {} of {} acknowledgements", f.acks.len(), self.subtasks)),
        };
        self.metrics.checkpoints(|c| {
            c.aborted += 1;
            c.remember(outcome);
        });
        if f.barrier.is_final {
            return Err(RuntimeError::Cancelled(format!("the final checkpoint {n} timed out")));
        }
        if failures > self.config.tolerable_checkpoint_failures {
            return Err(RuntimeError::Cancelled(format!(
                "{failures} consecutive checkpoints failed, more than the {} tolerated",
                self.config.tolerable_checkpoint_failures
            )));
        }
        Ok(())
    }

    /// An instance's heartbeat and look around (decision 0007).
    async fn tick(&mut self, last_completed: Option<CheckpointId>) -> Result<()> {
        let participants = self.participants;
        let (metrics, failpoints) = (self.metrics.clone(), self.failpoints.clone());
        if let Some(instance) = self.instance.as_deref_mut() {
            instance.tick(last_completed, participants, &metrics, &failpoints).await?;
        }
        Ok(())
    }

    /// Every subtask acknowledged barrier n: prepare, write the decision, commit, notify.
    async fn complete(
        &mut self,
        n: CheckpointId,
        acks: BTreeMap<(usize, u32), StateItems>,
        started: Instant,
    ) -> Result<()> {
        tracing::debug!(checkpoint = n, "all subtasks acknowledged");
        let aligned = started.elapsed();
        let to_commit = plan_completion(n, &self.uncommitted);
        // Phase one: every pending checkpoint up to n, on every participant.
        let mut refused = Vec::new();
        for &k in &to_commit {
            let txn = self.template.transaction(k);
            for p in self.participants {
                if p.prepare(&txn).await.map_err(|e| self.txn_error("prepare", k, e))? == PrepareOutcome::AlreadyAborted
                {
                    refused.push(k);
                }
            }
        }
        let prepared = started.elapsed() - aligned;
        if let Some(&k) = refused.first() {
            for &k in &refused {
                let txn = self.template.transaction(k);
                for p in self.participants {
                    p.abort(&txn).await.map_err(|e| self.txn_error("abort", k, e))?;
                }
                self.uncommitted.remove(&k);
                self.metrics.checkpoints(|c| {
                    c.transactions_aborted += 1;
                    c.transactions_timed_out += 1;
                });
            }
            self.count_open();
            return Err(RuntimeError::Cancelled(format!(
                "transaction {} was aborted before it could prepare (its timeout passed?); restarting from the last checkpoint",
                self.template.transaction(k)
            )));
        }
        // State, then the manifest: the commit decision.
        let mut states = Vec::with_capacity(acks.len());
        for ((node, subtask), items) in acks {
            let bytes = postcard::to_allocvec(&items).map_err(|e| {
                RuntimeError::Internal(format!("cannot encode state of {}[{subtask}]: {e}", self.node_names[node]))
            })?;
            states.push((self.node_names[node].clone(), subtask, Bytes::from(bytes)));
        }
        let storage = &self.config.storage;
        let files = storage.stage_states(n, &states, self.config.inline_state_limit).await?;
        let size: u64 = files.iter().map(|f| f.size).sum();
        self.failpoints.hit(points::AFTER_STATE_BEFORE_MANIFEST)?;
        let mut transactions = Vec::new();
        for &k in &to_commit {
            for p in self.participants {
                transactions.push(TransactionRecord {
                    participant: p.name().to_string(),
                    transaction_id: self.template.transaction(k).to_string(),
                    state: ParticipantState::Prepared,
                });
            }
        }
        let manifest = shareflow_checkpoint::Manifest {
            job_id: storage.paths().job_id().to_string(),
            checkpoint_id: n,
            created_at_ms: shareflow_checkpoint::now_ms(),
            state_files: files,
            transactions,
        };
        // A broken variant (feature `testing` only) commits before the decision is written.
        #[cfg(feature = "testing")]
        let early = self.failpoints.is_broken(Broken::CommitBeforeManifest);
        #[cfg(not(feature = "testing"))]
        let early = false;
        let mut committed_in = if early { self.commit_phase(&to_commit).await? } else { Default::default() };
        storage.publish_manifest(&manifest).await?;
        self.failpoints.hit(points::AFTER_MANIFEST)?;
        if !early {
            committed_in = self.commit_phase(&to_commit).await?;
        }
        self.notify(Control::Complete(n));
        let elapsed = started.elapsed();
        self.record_completion(n, to_commit.len() as u64, size, [elapsed, aligned, prepared, committed_in]);
        tracing::info!(checkpoint = n, ?elapsed, size, "checkpoint complete");
        Ok(())
    }

    /// Counts checkpoint n complete, with its `committed` transactions, state `size` and
    /// times (whole, alignment, prepare, commit), in the job's metrics and history.
    fn record_completion(&self, n: CheckpointId, committed: u64, size: u64, times: [std::time::Duration; 4]) {
        let [elapsed, aligned, prepared, committed_in] = times;
        self.metrics.checkpoints(|c| {
            c.completed += 1;
            c.last_duration = elapsed;
            c.max_duration = c.max_duration.max(elapsed);
            c.total_duration += elapsed;
            c.duration.record(elapsed);
            c.alignment.record(aligned);
            c.prepare.record(prepared);
            c.commit.record(committed_in);
            c.last_size_bytes = size;
            c.last_completed_id = Some(n);
            c.transactions_committed += committed * self.participants.len() as u64;
            c.remember(CheckpointOutcome {
                id: n,
                transaction: self.template.transaction(n).to_string(),
                duration: elapsed,
                size_bytes: size,
                aborted: None,
            });
        });
    }

    /// Phase two: commits every T(k) of `to_commit` on every participant. Returns how
    /// long it took.
    async fn commit_phase(&mut self, to_commit: &[CheckpointId]) -> Result<std::time::Duration> {
        let phase_two = Instant::now();
        self.failpoints.hit(points::COMMIT_BEFORE)?;
        let mut first = true;
        for &k in to_commit {
            let txn = self.template.transaction(k);
            for p in self.participants {
                p.commit(&txn).await.map_err(|e| self.txn_error("commit", k, e))?;
                if first {
                    first = false;
                    self.failpoints.hit(points::COMMIT_MID)?;
                }
            }
            self.uncommitted.remove(&k);
        }
        let committed_in = phase_two.elapsed();
        self.count_open();
        self.failpoints.hit(points::COMMIT_AFTER_BROKER_BEFORE_NOTIFY)?;
        Ok(committed_in)
    }

    /// Deletes complete checkpoints beyond retention. Failures only warn: the next
    /// checkpoint (or restart) tries again.
    async fn collect_garbage(&self, retained: &mut VecDeque<CheckpointId>) {
        let keep = self.config.retained_checkpoints.max(1);
        let mut collect = Vec::new();
        while retained.len() > keep {
            if let Some(id) = retained.pop_front() {
                collect.push((id, CollectReason::Superseded));
            }
        }
        if collect.is_empty() {
            return;
        }
        let plan =
            RecoveryPlan { decision: RecoveryDecision::Fresh, collect, skipped: Vec::new(), next_checkpoint_id: 0 };
        if let Err(e) = self.config.storage.collect_garbage(&plan).await {
            tracing::warn!(error = %e, "cannot delete old checkpoints; will retry after the next one");
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
