//! A built job: recovery, deployment of subtasks, the coordinator, and restarts.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::Arc;

use bytes::Bytes;
use shareflow_checkpoint::instances::{InstanceRecord, Standing};
use shareflow_checkpoint::protocol::{plan_keyed_restore, KeyedRestore, RetentionPolicy};
use shareflow_checkpoint::{CheckpointId, Recovery, TransactionId};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::channel::{Barrier, Collector, OutEdge, Tagged};
use crate::config::JobConfig;
use crate::coordinator::Coordinator;
use crate::error::{ErrorKind, Result, RuntimeError};
use crate::failpoint::{points, Failpoints};
use crate::instance::{self, Instance};
use crate::metrics::{JobMetrics, JobMetricsSnapshot};
use crate::operator::{JobSettings, StateItems, SubtaskContext, TransactionTemplate};
use crate::partition::Partitioning;
use crate::spec::{GraphSpec, NodeKind};
use crate::task::{self, Inputs, Report, TaskIo};

/// A validated job, ready to run (and to run again: every run recovers from storage).
pub struct Job {
    spec: GraphSpec,
    config: JobConfig,
    template: TransactionTemplate,
    failpoints: Failpoints,
    metrics: JobMetrics,
    /// Resolved parallelism per node.
    parallelism: Vec<u32>,
    /// Resolved partitioning per edge.
    partitioning: Vec<Partitioning>,
    /// Set by [`StopHandle::stop`]: take a final checkpoint and end.
    stop: tokio::sync::watch::Sender<bool>,
    savepoints: crate::savepoint::Requests,
}

/// Stops a running job gracefully: it takes a final checkpoint, commits it, closes its
/// sources (a share-group member leaves its group) and, as an instance of a group,
/// records that it retired, so nobody adopts it. [`Job::run`] then returns `Ok`.
#[derive(Debug, Clone)]
pub struct StopHandle(tokio::sync::watch::Sender<bool>);

impl StopHandle {
    /// Asks the job to stop; returns at once. Stopping twice is harmless.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct JobReport {
    /// Attempts, 1 if nothing failed.
    pub attempts: u32,
    /// The checkpoint the last attempt restored, if any.
    pub restored_from: Option<CheckpointId>,
    /// Metrics at the end.
    pub metrics: JobMetricsSnapshot,
}

struct Wiring {
    receivers: Vec<Vec<Option<mpsc::Receiver<Tagged>>>>,
    out_edges: Vec<Vec<Vec<OutEdge>>>,
    input_edge: Vec<Vec<Vec<usize>>>,
}

/// Restored state: operator name -> (old subtask -> items).
type SavedStates = BTreeMap<String, BTreeMap<u32, StateItems>>;

/// What recovery found and did before an attempt.
struct Recovered {
    restored_from: Option<CheckpointId>,
    /// operator name -> (old subtask -> items)
    states: BTreeMap<String, BTreeMap<u32, StateItems>>,
    first_checkpoint_id: CheckpointId,
}

impl Job {
    pub(crate) fn new(spec: GraphSpec, config: JobConfig) -> Result<Self> {
        let template = TransactionTemplate::new(&config.transaction_group, &config.transaction_prefix)?;
        let parallelism: Vec<u32> =
            spec.nodes.iter().map(|n| n.parallelism.unwrap_or(config.default_parallelism)).collect();
        let mut partitioning = Vec::new();
        for e in &spec.edges {
            let (p_from, p_to) = (parallelism[e.from], parallelism[e.to]);
            let p = match &e.partitioning {
                Some(Partitioning::Forward) | None if p_from == p_to => Partitioning::Forward,
                None => Partitioning::RoundRobin,
                Some(Partitioning::Forward) => {
                    return Err(RuntimeError::InvalidGraph(format!(
                        "forward edge {} -> {} needs equal parallelism, not {p_from} and {p_to}",
                        spec.nodes[e.from].name, spec.nodes[e.to].name
                    )))
                }
                Some(p) => p.clone(),
            };
            partitioning.push(p);
        }
        Ok(Self {
            spec,
            config,
            template,
            failpoints: Failpoints::new(),
            metrics: JobMetrics::default(),
            parallelism,
            partitioning,
            stop: tokio::sync::watch::channel(false).0,
            savepoints: Default::default(),
        })
    }

    /// A handle that stops this job gracefully, e.g. from a SIGTERM handler.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    /// A handle that asks the running job for savepoints ([`crate::savepoint`]).
    pub fn savepoint_handle(&self) -> crate::SavepointHandle {
        crate::SavepointHandle { requests: self.savepoints.clone(), stop: self.stop_handle() }
    }

    /// The failpoints of this job, for tests to arm.
    pub fn failpoints(&self) -> &Failpoints {
        &self.failpoints
    }

    /// Rows the job's stateful SQL operators dropped as late (their windows had been
    /// emitted), over every attempt so far.
    pub fn late_rows(&self) -> u64 {
        self.spec.stateful.iter().map(|(_, late)| late.get()).sum()
    }

    /// Rows dropped as late by each stateful SQL operator, by operator name (for an
    /// exporter: the counters are live).
    pub fn late_rows_by_operator(&self) -> Vec<(String, Arc<crate::sql::LateRows>)> {
        self.spec.stateful.clone()
    }

    /// The job's dead-letter handle, if it has one ([`JobBuilder::dead_letters`]): its
    /// counts by cause are live, over every attempt so far (a checkpoint that aborted and
    /// came back counts its dead letters again).
    ///
    /// [`JobBuilder::dead_letters`]: crate::JobBuilder::dead_letters
    pub fn dead_letters(&self) -> Option<&crate::DeadLetters> {
        self.spec.dead_letters.as_ref()
    }

    /// Whether the job keeps keyed state (a stateful SQL operator or an operator marked
    /// [`keyed_state`](crate::Stream::keyed_state)).
    pub fn is_keyed(&self) -> bool {
        self.spec.nodes.iter().any(|n| n.keyed_state)
    }

    /// The job graph as it runs: nodes with their parallelism, edges with their
    /// partitioning.
    pub fn graph(&self) -> crate::spec::JobGraph {
        self.spec.graph(&self.parallelism, &self.partitioning)
    }

    /// Live metrics.
    pub fn metrics(&self) -> JobMetricsSnapshot {
        self.metrics.snapshot()
    }

    /// The live metrics themselves, cheap to clone, to read while the job runs (an
    /// exporter holds one).
    pub fn metrics_handle(&self) -> JobMetrics {
        self.metrics.clone()
    }

    /// The job's configuration.
    pub fn config(&self) -> &JobConfig {
        &self.config
    }

    /// Runs the job to the end of its input. On a failure, restarts from the latest
    /// complete checkpoint as the restart strategy allows. However it ends, the
    /// participants are closed ([`TransactionParticipant::close`](crate::operator::TransactionParticipant::close)) before it returns.
    pub async fn run(&self) -> Result<JobReport> {
        self.savepoints.open();
        let result = self.run_attempts().await;
        self.savepoints.fail_all();
        for p in &self.spec.participants {
            if let Err(e) = p.close().await {
                tracing::warn!(participant = p.name(), error = %e, "closing the participant failed");
            }
        }
        result
    }

    /// [`run`](Self::run) without closing the participants.
    async fn run_attempts(&self) -> Result<JobReport> {
        // A configuration a participant refuses fails now, not after a restart loop.
        let settings = self.settings().await?;
        for p in &self.spec.participants {
            p.validate_job(&settings).await?;
            if self.config.instance.is_some() && p.adopter().is_none() {
                return Err(RuntimeError::InvalidConfig {
                    key: "participant".into(),
                    value: p.name().into(),
                    rule: "cannot decide another instance's transactions (no adopter); run this job alone, without \
                           JobConfig::instance"
                        .into(),
                });
            }
        }
        let mut instance = None;
        if let Some(mut c) = self.config.instance.clone() {
            c.heartbeat_interval = c.beat_every(self.config.checkpoint_interval);
            let storage = self.config.storage.clone();
            instance = Some(Instance::register(storage, c, self.template.clone()).await?);
            if self.is_keyed() {
                if let Err(e) = self.others_beside_keyed().await {
                    if let Some(i) = &instance {
                        i.retire().await?;
                    }
                    return Err(e);
                }
            }
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            let span = tracing::info_span!("attempt", job = %self.config.storage.paths().job_id(), attempt = attempts);
            let result = {
                let _enter = span.enter();
                tracing::info!("starting");
                drop(_enter);
                self.attempt(instance.as_mut()).await
            };
            match result {
                Ok(restored_from) => {
                    if let Some(i) = &instance {
                        i.retire().await?;
                    }
                    return Ok(JobReport { attempts, restored_from, metrics: self.metrics.snapshot() });
                }
                Err(e) => {
                    // Another instance took this prefix over (a newer incarnation, or an
                    // adopter): a restart would take it back and fence that one. The
                    // registry says who, even when the failure only says "fenced" or
                    // does not say it at all.
                    if let Some(fenced) = Self::fenced_meanwhile(instance.as_ref(), &e).await {
                        tracing::error!(error = %fenced, cause = %e, attempts, "fenced; stopping without a restart");
                        return Err(fenced);
                    }
                    if e.kind() == ErrorKind::Fenced {
                        tracing::error!(error = %e, attempts, "fenced; stopping without a restart");
                        return Err(e);
                    }
                    let allowed = self.config.restart.attempts();
                    let Some(delay) = self.config.restart.delay_before(attempts) else {
                        tracing::error!(error = %e, attempts, "job failed; no restarts left");
                        return Err(if allowed == 0 {
                            e
                        } else {
                            RuntimeError::RestartsExhausted { attempts, last: Box::new(e) }
                        });
                    };
                    tracing::warn!(error = %e, attempt = attempts, ?delay, "job failed; restarting from the latest complete checkpoint");
                    self.metrics.restarted(delay);
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// The settings participants check the job against: its own, and the instances of
    /// its group the registry shows (not retired, not adopted), this one included.
    async fn settings(&self) -> Result<JobSettings> {
        let mut instances = 1;
        if self.config.instance.is_some() {
            if self.is_keyed() {
                self.config.storage.registry().mark_keyed(self.template.prefix()).await?;
            }
            instances += self.others_beside_keyed().await?;
        }
        Ok(JobSettings {
            group: self.template.group_id().to_string(),
            checkpoint_interval: self.config.checkpoint_interval,
            checkpoint_timeout: self.config.checkpoint_timeout,
            tolerable_checkpoint_failures: self.config.tolerable_checkpoint_failures,
            instances,
            restart: self.config.restart,
        })
    }

    /// The other instances of the group the registry shows registered (neither retired
    /// nor adopted); fails if keyed state forbids running beside them
    /// (`check_keyed_instances`). Checked before the first attempt and again once this
    /// instance registered, so that two keyed instances starting together both see each
    /// other at the second look.
    async fn others_beside_keyed(&self) -> Result<u32> {
        let records = self.config.storage.registry().observe().await?;
        let registered = |r: &&InstanceRecord| {
            r.prefix != self.template.prefix() && r.incarnation > 0 && r.standing() == Standing::Registered
        };
        let others: Vec<(String, bool)> =
            records.iter().filter(registered).map(|r| (r.prefix.clone(), r.keyed_state)).collect();
        shareflow_checkpoint::protocol::check_keyed_instances(self.is_keyed(), &others).map_err(|rule| {
            RuntimeError::InvalidConfig { key: "instances".into(), value: self.template.prefix().into(), rule }
        })?;
        Ok(others.len() as u32)
    }

    /// Whether a failed attempt's instance was fenced meanwhile: a newer incarnation of
    /// its name or an adopter took the prefix over. The failure itself may not say so
    /// (on Kafka the broker answers the older producer `InvalidProducerEpoch`, which the
    /// client reports as an abortable transaction). A restart would take the prefix back
    /// for a moment and fence the live instance; the job stops instead. A registry that
    /// cannot be read says nothing here: the next attempt checks again.
    async fn fenced_meanwhile(instance: Option<&Instance>, failure: &RuntimeError) -> Option<RuntimeError> {
        let instance = instance?;
        match instance.ensure_current().await {
            Err(fenced) if fenced.kind() == ErrorKind::Fenced => Some(fenced),
            Err(e) => {
                tracing::warn!(error = %e, cause = %failure, "cannot read the registry after a failure");
                None
            }
            Ok(()) => None,
        }
    }

    /// docs/design.md §3 step 7: restore the newest complete checkpoint, then commit the
    /// PREPARE transactions it covers and abort everything else. Idempotent.
    async fn recover(&self, instance: Option<&Instance>) -> Result<Recovered> {
        for p in &self.spec.participants {
            p.open(&self.template).await?;
        }
        // Opened first, checked second: an adopter that claims us from now on fences
        // what we just opened (decision 0008, rule R1).
        if let Some(i) = instance {
            i.ensure_current().await?;
        }
        let storage = &self.config.storage;
        let policy = RetentionPolicy { retain: self.config.retained_checkpoints, protected: BTreeSet::new() };
        let recovery = storage.recover(&policy).await?;
        let restored = recovery.plan.restored_id();
        let mut highest = recovery.plan.next_checkpoint_id.saturating_sub(1);
        for p in &self.spec.participants {
            if let Some(h) = p.highest_checkpoint_id(&self.template).await? {
                highest = highest.max(h);
            }
        }
        // The commit rules are decided in one place (checkpoint::protocol); this only
        // carries the plan out.
        let marks =
            instance::RecoveryMarks { checkpoints: Some(storage), metrics: &self.metrics, mid: Some(&self.failpoints) };
        let decided = instance::decide(&self.spec.participants, &self.template, restored, marks).await?;
        highest = highest.max(decided.highest.unwrap_or(0));
        // Everything of our prefix, and of every prefix we adopted, is decided: the
        // participants take the rest of their work over before any task starts.
        let held = match instance {
            Some(i) => i.held().await?,
            None => Vec::new(),
        };
        for p in &self.spec.participants {
            p.take_over(&self.template).await?;
            for prefix in &held {
                p.take_over(&TransactionTemplate::new(self.template.group_id(), prefix)?).await?;
            }
        }
        let recovery = if self.is_keyed() { self.keyed_restore(recovery, &policy).await? } else { recovery };
        let restored = recovery.plan.restored_id();
        // Nothing PREPARE is left, so old checkpoints may go.
        if let Err(e) = storage.collect_garbage(&recovery.plan).await {
            tracing::warn!(error = %e, "cannot delete old checkpoints during recovery");
        }
        let mut states: BTreeMap<String, BTreeMap<u32, StateItems>> = BTreeMap::new();
        if let Some(r) = &recovery.restored {
            for ((operator, subtask), bytes) in &r.states {
                let items: Vec<Bytes> =
                    postcard::from_bytes(bytes).map_err(|e| shareflow_checkpoint::CheckpointError::Corrupt {
                        path: storage.paths().checkpoint_dir(r.manifest.checkpoint_id).to_string(),
                        reason: format!("state of {operator}-{subtask} does not decode: {e}"),
                    })?;
                states.entry(operator.clone()).or_default().insert(*subtask, items);
            }
        }
        let own_ms = recovery.restored.as_ref().map(|r| r.manifest.created_at_ms);
        if let Some((id, from)) = self.savepoint_states(own_ms).await? {
            // Its transaction ids are used: the next checkpoint's comes after them.
            highest = highest.max(id);
            states = from;
        }
        self.failpoints.hit(points::AFTER_RECOVERY)?;
        Ok(Recovered { restored_from: restored, states, first_checkpoint_id: highest + 1 })
    }

    /// The state of the savepoint the job starts from, if any and if it is newer than
    /// the job's own newest checkpoint (taken at `own_ms`), checked against the graph: a
    /// state of an operator the job does not have is refused by name.
    async fn savepoint_states(&self, own_ms: Option<u64>) -> Result<Option<(CheckpointId, SavedStates)>> {
        let Some(url) = &self.config.savepoint else { return Ok(None) };
        let savepoint = shareflow_checkpoint::CheckpointStore::read_savepoint_url(url, &[]).await.map_err(|e| {
            RuntimeError::InvalidConfig {
                key: "savepoint".into(),
                value: url.clone(),
                rule: format!("cannot read it as a savepoint ({e}); give the directory `shareflow savepoint` printed"),
            }
        })?;
        if !crate::savepoint::restore_savepoint(savepoint.manifest.created_at_ms, own_ms) {
            tracing::info!(savepoint = %url, "the job checkpointed after its savepoint: restoring its own checkpoint");
            return Ok(None);
        }
        let mut states: BTreeMap<String, BTreeMap<u32, StateItems>> = BTreeMap::new();
        for ((operator, subtask), bytes) in &savepoint.states {
            if !self.spec.nodes.iter().any(|n| &n.name == operator) {
                return Err(RuntimeError::InvalidConfig {
                    key: "savepoint".into(),
                    value: url.clone(),
                    rule: format!(
                        "it holds state of operator {operator:?}, which this job does not have (renamed or removed?); \
                         give the operator its old name, or start without the savepoint"
                    ),
                });
            }
            let items: Vec<Bytes> = postcard::from_bytes(bytes).map_err(|e| RuntimeError::InvalidConfig {
                key: "savepoint".into(),
                value: url.clone(),
                rule: format!("the state of {operator}-{subtask} does not decode: {e}"),
            })?;
            states.entry(operator.clone()).or_default().insert(*subtask, items);
        }
        tracing::info!(savepoint = %url, checkpoint = savepoint.manifest.checkpoint_id, "restoring a savepoint");
        Ok(Some((savepoint.manifest.checkpoint_id, states)))
    }

    /// Keyed state must be that of checkpoints whose transactions all committed
    /// (`plan_keyed_restore`): while the restored checkpoint's transactions were lost
    /// (the broker aborted them after the checkpoint completed), it is tombstoned and an
    /// older one restored; their records come back and are counted once, from it.
    async fn keyed_restore(&self, mut recovery: Recovery, policy: &RetentionPolicy) -> Result<Recovery> {
        let storage = &self.config.storage;
        // Each round tombstones one checkpoint: at most as many rounds as are retained.
        for _ in 0..=self.config.retained_checkpoints.max(1) {
            let Some(r) = &recovery.restored else { return Ok(recovery) };
            let mut answers = Vec::new();
            for t in &r.manifest.transactions {
                let Ok(txn) = TransactionId::parse(&t.transaction_id, self.template.group_id()) else { continue };
                for p in self.spec.participants.iter().filter(|p| p.name() == t.participant) {
                    answers.push((txn.checkpoint_id(), p.committed(&txn).await?));
                }
            }
            let checkpoint = r.manifest.checkpoint_id;
            match plan_keyed_restore(&answers) {
                KeyedRestore::Keep => return Ok(recovery),
                KeyedRestore::FallBack => {
                    tracing::warn!(
                        checkpoint,
                        "the broker aborted the transactions of the restored checkpoint after it completed (the job was \
                         down longer than the transaction timeout?): its keyed state counts records that come back, so \
                         an older checkpoint is restored"
                    );
                    storage.mark_aborted(checkpoint).await?;
                    recovery = storage.recover(policy).await?;
                }
                KeyedRestore::Inconsistent { committed, lost } => {
                    return Err(RuntimeError::Internal(format!(
                        "checkpoint {checkpoint} decided transactions of checkpoints {committed:?}, which committed, and \
                         {lost:?}, which the broker aborted after the checkpoint completed (a job down longer than the \
                         transaction timeout): no checkpoint holds the keyed state of exactly what committed. Restart \
                         the stateful job from a savepoint or with empty state (a new checkpoint root), and raise the \
                         transaction timeout above the longest downtime"
                    )));
                }
            }
        }
        Err(RuntimeError::Internal("every retained checkpoint holds transactions the broker aborted".into()))
    }

    /// The restored items of `operator`, dealt round-robin to `parallelism` subtasks.
    fn redistribute(
        states: &BTreeMap<String, BTreeMap<u32, StateItems>>,
        operator: &str,
        parallelism: u32,
    ) -> Vec<StateItems> {
        let mut out = vec![Vec::new(); parallelism as usize];
        let all = states.get(operator).into_iter().flat_map(|m| m.values()).flatten();
        for (i, item) in all.enumerate() {
            out[i % parallelism as usize].push(item.clone());
        }
        out
    }

    /// Channels and edges of one attempt: a merged input channel per operator subtask;
    /// for every subtask its outgoing edges; for every input index the logical input.
    fn wire(&self) -> Wiring {
        let nodes = &self.spec.nodes;
        let cap = self.config.channel_capacity;
        let p = |i: usize| self.parallelism[i] as usize;
        let mut senders: Vec<Vec<mpsc::Sender<Tagged>>> = Vec::new();
        let mut receivers = Vec::new();
        for i in 0..nodes.len() {
            let (tx, rx): (Vec<_>, Vec<_>) = (0..p(i)).map(|_| mpsc::channel(cap)).map(|(t, r)| (t, Some(r))).unzip();
            senders.push(tx);
            receivers.push(rx);
        }
        let mut out_edges: Vec<Vec<Vec<OutEdge>>> =
            (0..nodes.len()).map(|i| (0..p(i)).map(|_| Vec::new()).collect()).collect();
        let mut input_edge: Vec<Vec<Vec<usize>>> = (0..nodes.len()).map(|i| vec![Vec::new(); p(i)]).collect();
        let mut order: Vec<usize> = (0..self.spec.edges.len()).collect();
        order.sort_by_key(|&e| (self.spec.edges[e].to, self.spec.edges[e].input));
        for e in order {
            let edge = &self.spec.edges[e];
            let partitioning = &self.partitioning[e];
            for (up, outs) in out_edges[edge.from].iter_mut().enumerate() {
                let targets: Vec<usize> = match partitioning {
                    Partitioning::Forward => vec![up],
                    _ => (0..p(edge.to)).collect(),
                };
                let targets = targets
                    .into_iter()
                    .map(|t| {
                        // The raw input index at `t` is the count of inputs wired to it so far.
                        let inputs = &mut input_edge[edge.to][t];
                        inputs.push(edge.input);
                        (senders[edge.to][t].clone(), inputs.len() - 1)
                    })
                    .collect();
                outs.push(OutEdge { partitioning: partitioning.clone(), targets, next: up });
            }
        }
        Wiring { receivers, out_edges, input_edge }
    }

    async fn attempt(&self, instance: Option<&mut Instance>) -> Result<Option<CheckpointId>> {
        let recovering = std::time::Instant::now();
        let recovered = match instance.as_deref() {
            Some(i) => i.beating(self.recover(Some(i))).await?,
            None => self.recover(None).await?,
        };
        let took = recovering.elapsed();
        self.metrics.checkpoints(|c| c.recovery.record(took));
        // T(first checkpoint id) must exist before any task writes into it.
        let first = self.template.transaction(recovered.first_checkpoint_id);
        for p in &self.spec.participants {
            p.begin(&first).await?;
        }
        let nodes = &self.spec.nodes;
        let Wiring { mut receivers, mut out_edges, mut input_edge } = self.wire();
        let (report_tx, report_rx) = mpsc::unbounded_channel();
        let mut controls = Vec::new();
        let mut triggers = Vec::new();
        let mut handles = Vec::new();
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let mut subtasks = 0;
        for (i, node) in nodes.iter().enumerate() {
            let p = self.parallelism[i];
            let restored = if node.keyed_state {
                crate::keyed::redistribute(&recovered.states, &node.name, p)?
            } else {
                Self::redistribute(&recovered.states, &node.name, p)
            };
            let metrics = self.metrics.operator(&node.name);
            for s in 0..p {
                subtasks += 1;
                let ctx = SubtaskContext {
                    job: self.config.storage.paths().job_id().to_string(),
                    operator: node.name.clone(),
                    subtask: s,
                    parallelism: p,
                    first_checkpoint_id: recovered.first_checkpoint_id,
                    transactions: self.template.clone(),
                    failpoints: self.failpoints.clone(),
                    dead_letters: self.spec.dead_letters.as_ref().map(|d| d.bound(self.template.clone())),
                };
                let (control_tx, control_rx) = mpsc::unbounded_channel();
                controls.push(control_tx);
                let edges = std::mem::take(&mut out_edges[i][s as usize]);
                let io = TaskIo {
                    out: Collector::new(ctx.task_name(), edges, metrics.clone(), ctx.first_checkpoint_id),
                    ctx,
                    node: i,
                    restored: restored[s as usize].clone(),
                    control: control_rx,
                    report: report_tx.clone(),
                    metrics: metrics.clone(),
                };
                let handle = Self::spawn_task(
                    &node.kind,
                    io,
                    &cancelled,
                    &mut receivers[i][s as usize],
                    &mut input_edge[i][s as usize],
                    &mut triggers,
                )?;
                handles.push((handle, matches!(node.kind, NodeKind::Source(_))));
            }
        }
        drop(report_tx);
        let mut coordinator = Coordinator {
            config: &self.config,
            participants: &self.spec.participants,
            template: self.template.clone(),
            failpoints: self.failpoints.clone(),
            metrics: self.metrics.clone(),
            triggers,
            controls,
            reports: report_rx,
            subtasks,
            node_names: nodes.iter().map(|n| n.name.clone()).collect(),
            next_id: recovered.first_checkpoint_id,
            uncommitted: BTreeSet::new(),
            instance,
            stop: self.stop.subscribe(),
            savepoints: self.savepoints.clone(),
        };
        coordinator.uncommitted.insert(recovered.first_checkpoint_id);
        let result = coordinator.run().await;
        join_tasks(handles, result.is_err().then_some(cancel)).await;
        result.map(|()| recovered.restored_from)
    }

    /// Spawns the task of one subtask of a node of `kind`: a source gets the channel its
    /// barriers come through (its sender pushed to `triggers`); an operator takes its
    /// receiver and the input edges of its inputs.
    fn spawn_task(
        kind: &NodeKind,
        io: TaskIo,
        cancelled: &tokio::sync::watch::Receiver<bool>,
        receiver: &mut Option<mpsc::Receiver<Tagged>>,
        input_edge: &mut Vec<usize>,
        triggers: &mut Vec<mpsc::UnboundedSender<Barrier>>,
    ) -> Result<JoinHandle<()>> {
        let report = io.report.clone();
        let handle = match kind {
            NodeKind::Source(factory) => {
                let (trigger_tx, trigger_rx) = mpsc::unbounded_channel();
                triggers.push(trigger_tx);
                let source = factory(&io.ctx);
                let cancelled = cancelled.clone();
                tokio::spawn(async move {
                    if let Err(e) = task::run_source(source, trigger_rx, io, cancelled).await {
                        let _ = report.send(Report::Failed(e));
                    }
                })
            }
            NodeKind::Operator(factory) => {
                let op = factory(&io.ctx);
                let rx = receiver.take().ok_or_else(|| RuntimeError::Internal("receiver taken twice".into()))?;
                let edge_of = std::mem::take(input_edge);
                let inputs = Inputs::new(rx, edge_of.len(), edge_of);
                tokio::spawn(async move {
                    if let Err(e) = task::run_operator(op, inputs, io).await {
                        let _ = report.send(Report::Failed(e));
                    }
                })
            }
        };
        Ok(handle)
    }
}

/// Waits for the tasks to end once the coordinator returned. After a failure (`cancel`
/// given) they stop where they are, as in a crash, and recovery sorts out the rest:
/// operators are aborted, sources are cancelled and release their clients
/// ([`Source::abandon`](crate::operator::Source::abandon), bounded by
/// [`task::ABANDON_LIMIT`]), and a source still running after that is aborted too.
async fn join_tasks(handles: Vec<(JoinHandle<()>, bool)>, cancel: Option<tokio::sync::watch::Sender<bool>>) {
    if let Some(cancel) = cancel {
        cancel.send_replace(true);
        for (h, is_source) in &handles {
            if !is_source {
                h.abort();
            }
        }
        let deadline = tokio::time::Instant::now() + task::ABANDON_LIMIT + std::time::Duration::from_secs(1);
        for (h, _) in handles {
            let abort = h.abort_handle();
            if tokio::time::timeout_at(deadline, h).await.is_err() {
                abort.abort();
            }
        }
        return;
    }
    for (h, _) in handles {
        let _ = h.await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::InstanceConfig;
    use crate::operator::TransactionTemplate;

    /// A failure after a newer start of the same prefix registered is the fencing, named,
    /// not a failure to restart from; before that, and for the newer start, it is not.
    #[tokio::test]
    async fn a_failure_after_a_newer_start_registered_is_fenced() {
        let storage = shareflow_checkpoint::CheckpointStore::from_url("memory://", &[], "same").unwrap();
        let template = TransactionTemplate::new("group", "same").unwrap();
        let config = InstanceConfig::new(Duration::from_secs(60));
        let failure = RuntimeError::InjectedCrash("sink.after_write".into());
        let first = Instance::register(storage.clone(), config.clone(), template.clone()).await.unwrap();
        assert!(Job::fenced_meanwhile(Some(&first), &failure).await.is_none(), "nobody else started yet");
        assert!(Job::fenced_meanwhile(None, &failure).await.is_none(), "a job without an instance");
        let second = Instance::register(storage, config, template).await.unwrap();
        let fenced = Job::fenced_meanwhile(Some(&first), &failure).await.expect("the first is fenced");
        assert_eq!(fenced.kind(), ErrorKind::Fenced, "{fenced}");
        assert!(fenced.to_string().contains("started after this one"), "names the newer start: {fenced}");
        assert!(Job::fenced_meanwhile(Some(&second), &failure).await.is_none(), "the newer one is current");
    }
}
