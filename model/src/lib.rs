//! # shareflow-model
//!
//! A [`stateright`] model of shareflow's commit protocol (docs/design.md §3-4, decisions 0005
//! and 0007) that drives the real pure cores:
//! - the embedded broker's state machine, through `shareflow_broker::model::ModelBroker`,
//!   which runs every step as a journal entry through the real `BrokerState::apply`;
//! - the checkpoint planners `plan_completion`, `plan_recovery`, `resolve`,
//!   `plan_adoption` and `check_instance_start` of `shareflow_checkpoint::protocol`.
//!
//! Only I/O is abstracted: the checkpoint store is a map with conditional create (and
//! two faults: an error, and a write applied whose answer timed out), and time is two
//! nondeterministic events (lock expiry, transaction timeout). See `docs/model.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shareflow_broker::model::ModelBroker;
use shareflow_checkpoint::manifest::{Manifest, ParticipantState, TransactionRecord};
use shareflow_checkpoint::protocol::{
    check_instance_start, plan_adoption, plan_completion, plan_recovery, resolve, AdoptionStep, InstanceView,
    ManifestStatus, Observed, ObservedCheckpoint, PendingTxn, RetentionPolicy, TxnAction,
};
use shareflow_share::{
    AcknowledgeType, AcknowledgementMode, RecordState, ShareConfig, TopicPartition, TransactionId, TransactionState,
};
use stateright::{Model, Property};

pub mod trace;
pub use trace::{Trace, TraceError};

/// The share group.
pub const GROUP: &str = "g";
/// The input topic (one partition).
pub const INPUT: &str = "in";
/// The output topic (one partition).
pub const OUTPUT: &str = "out";
/// Instance prefixes, by index.
pub const PREFIXES: [&str; 2] = ["a", "b"];
/// `group.share.record.lock.duration.ms` (the minimum allowed).
pub const LOCK_MS: u64 = 1_000;
/// `share.transaction.timeout.ms`: far above every lock expiry the model can add up.
pub const TXN_TIMEOUT_MS: u64 = 60_000;
/// The adoption timeout given to `plan_adoption` (silence is abstract: a crashed
/// instance is silent for twice this long, a live one for zero).
pub const ADOPTION_TIMEOUT: Duration = Duration::from_secs(30);

/// A deliberately broken variant of the protocol (test-only switch); `None` is the
/// real protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The real protocol.
    None,
    /// The coordinator commits T(k) after prepare, before writing the manifest.
    CommitBeforeManifest,
    /// A restart reuses the old producer epoch instead of `InitProducer`.
    SkipFencing,
    /// Recovery aborts what `plan_recovery` says to commit.
    RecoveryAbortsDecided,
    /// The source acknowledges (ACCEPT, outside any transaction) as it polls, instead of
    /// staging the acknowledgement into T(n).
    AckBeforeStaging,
    /// The adopter decides the dead instance's transactions without bumping its epoch.
    AdoptWithoutFence,
    /// Recovery (and adoption) abort T(n) without first creating the tombstone
    /// `chk-{n}/_aborted` (the runtime before finding 1 was fixed).
    NoTombstone,
    /// Recovery leaves PREPARE transactions as they are (decides only ONGOING ones).
    RecoveryLeavesPrepared,
}

/// The size of a configuration and the bug it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Job instances (1 or 2).
    pub instances: u8,
    /// Input records.
    pub records: u8,
    /// The highest checkpoint id a barrier may start.
    pub checkpoints: u64,
    /// Crashes (an instance dies at any step; it may be restarted or adopted).
    pub crashes: u8,
    /// Pauses: the instance stops without dying; an older incarnation ("zombie") keeps its
    /// state and may act again later, while a new incarnation starts or an adopter takes over.
    pub pauses: u8,
    /// Lock-expiry events.
    pub lock_expiries: u8,
    /// Transaction-timeout events.
    pub txn_timeouts: u8,
    /// Store faults on the manifest write (error, or applied-then-timeout).
    pub store_faults: u8,
    /// `group.share.delivery.count.limit`.
    pub delivery_limit: u16,
    /// The variant.
    pub bug: Bug,
}

impl Config {
    /// CI: one instance.
    pub fn ci_one() -> Self {
        Config {
            instances: 1,
            records: 2,
            checkpoints: 3,
            crashes: 1,
            pauses: 0,
            lock_expiries: 1,
            txn_timeouts: 1,
            store_faults: 1,
            delivery_limit: 2,
            bug: Bug::None,
        }
    }

    /// CI: one instance that may be paused and come back (fencing).
    pub fn ci_pause() -> Self {
        Config { records: 1, pauses: 1, crashes: 1, txn_timeouts: 0, store_faults: 0, ..Self::ci_one() }
    }

    /// CI: two instances, adoption of one that crashed or paused.
    pub fn ci_two() -> Self {
        Config {
            instances: 2,
            records: 1,
            checkpoints: 2,
            crashes: 1,
            pauses: 0,
            lock_expiries: 1,
            txn_timeouts: 0,
            store_faults: 0,
            delivery_limit: 3,
            bug: Bug::None,
        }
    }

    /// `SHAREFLOW_MODEL_DEPTH=deep`: one instance, larger.
    pub fn deep_one() -> Self {
        Config { records: 3, checkpoints: 4, crashes: 2, ..Self::ci_one() }
    }

    /// `SHAREFLOW_MODEL_DEPTH=deep`: two instances, larger.
    pub fn deep_two() -> Self {
        Config { records: 2, checkpoints: 3, ..Self::ci_two() }
    }

    /// The same size with another variant.
    pub fn with_bug(self, bug: Bug) -> Self {
        Config { bug, ..self }
    }
}

/// Which process takes a step: the live incarnation of instance `i`, or its paused
/// older incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who {
    /// The live incarnation of instance i.
    Live(u8),
    /// The paused, older incarnation of instance i.
    Zombie(u8),
}

/// The outcome of the conditional create of a manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Store {
    /// Created.
    Ok,
    /// The store answered an error; nothing was written.
    Error,
    /// The object was written, but the answer timed out: the coordinator sees a failure.
    AppliedThenTimeout,
}

/// One event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Start (or restart) instance i: `check_instance_start`, then `InitProducer` (the fence).
    Restart(u8),
    /// Recovery of instance i: `resolve` over its manifests, `plan_recovery` over its
    /// pending transactions, carried out on the broker.
    Recover(u8),
    /// Instance i joins the group and begins T(next).
    Start(u8),
    /// The source acquires one record.
    Poll(Who),
    /// The source stages the record's ACCEPT into T(n).
    Stage(Who),
    /// The sink produces the record's output into T(n).
    Sink(Who),
    /// Barrier n: T(n+1) begins, the epoch moves on.
    Barrier(Who),
    /// Prepare every uncommitted T(k), k <= n.
    Prepare(Who),
    /// Write the manifest of n (conditional create).
    WriteManifest(Who, Store),
    /// Commit per `plan_completion`, then notify.
    Commit(Who),
    /// Instance i dies.
    Crash(u8),
    /// Instance i pauses: it looks dead, but its state lives on as a zombie.
    Pause(u8),
    /// Time passes beyond the acquisition lock.
    LockExpiry,
    /// Time passes beyond the transaction timeout.
    TxnTimeout,
    /// Instance i runs `plan_adoption` and claims (create-only) or resumes an adoption.
    AdoptClaim(u8),
    /// The adopter fences the adopted prefix (`InitProducer`).
    AdoptFence(u8),
    /// The adopter records its plan (create-only) and decides the adopted prefix's
    /// pending transactions with `plan_recovery`.
    AdoptDecide(u8),
    /// The adopter records the adoption done.
    AdoptDone(u8),
    /// The fair clock: when nothing else can happen and the state is not quiescent,
    /// time moves on to the next deadline (a lock, then a transaction timeout), if that
    /// expires anything. It is the liveness check's fairness: time never stops.
    Time,
    /// The paused incarnation of instance i never comes back: its process ends.
    Vanish(u8),
}

/// Action kinds, for coverage counters.
pub const ACTION_KINDS: [&str; 20] = [
    "Restart",
    "Recover",
    "Start",
    "Poll",
    "Stage",
    "Sink",
    "Barrier",
    "Prepare",
    "WriteManifest",
    "Commit",
    "Crash",
    "Pause",
    "LockExpiry",
    "TxnTimeout",
    "AdoptClaim",
    "AdoptFence",
    "AdoptDecide",
    "AdoptDone",
    "Time",
    "Vanish",
];

impl Action {
    fn kind(&self) -> usize {
        match self {
            Action::Restart(_) => 0,
            Action::Recover(_) => 1,
            Action::Start(_) => 2,
            Action::Poll(_) => 3,
            Action::Stage(_) => 4,
            Action::Sink(_) => 5,
            Action::Barrier(_) => 6,
            Action::Prepare(_) => 7,
            Action::WriteManifest(..) => 8,
            Action::Commit(_) => 9,
            Action::Crash(_) => 10,
            Action::Pause(_) => 11,
            Action::LockExpiry => 12,
            Action::TxnTimeout => 13,
            Action::AdoptClaim(_) => 14,
            Action::AdoptFence(_) => 15,
            Action::AdoptDecide(_) => 16,
            Action::AdoptDone(_) => 17,
            Action::Time => 18,
            Action::Vanish(_) => 19,
        }
    }
}

/// Where the record in the source's hands is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Held {
    /// Acquired, not yet staged.
    Polled,
    /// Staged into T(n), output not yet produced.
    Staged,
}

/// The coordinator's step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Coord {
    /// No checkpoint in progress.
    Idle,
    /// Barrier n passed.
    Barriered(u64),
    /// Every uncommitted T(k <= n) prepared; `txns` are the ids the manifest will list.
    Prepared(u64, Vec<u64>),
    /// Manifest n written.
    Manifested(u64),
    /// (Bug `CommitBeforeManifest`) committed, manifest not yet written.
    CommittedEarly(u64, Vec<u64>),
}

/// An adoption in progress, as the adopter holds it in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Adopting {
    /// Claimed (or resumed) the adoption of this instance.
    Claimed(u8),
    /// Fenced it: the epoch to decide with, and the ownership token taken.
    Fenced(u8, u32, u8),
    /// Decided its transactions.
    Decided(u8),
}

impl Adopting {
    fn victim(&self) -> u8 {
        match *self {
            Adopting::Claimed(v) | Adopting::Fenced(v, ..) | Adopting::Decided(v) => v,
        }
    }
}

/// A running incarnation's memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proc {
    /// Ownership token of its prefix (ghost: see `Sys::owner`).
    pub token: u8,
    /// Its producer epoch.
    pub epoch: u32,
    /// Its member key in the group.
    pub member: u64,
    /// The epoch being written: T(cur) is ONGOING.
    pub cur: u64,
    /// Something was written into T(cur).
    pub dirty: bool,
    /// Transactions it began and has not committed.
    pub uncommitted: BTreeSet<u64>,
    /// The record in the source's hands.
    pub rec: Option<(i64, Held)>,
    /// The coordinator.
    pub coord: Coord,
    /// An adoption in progress.
    pub adopt: Option<Adopting>,
}

/// An instance's life.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Life {
    /// Not running (never started, crashed, or failed): it may start again.
    Down,
    /// Refused to start: it was adopted.
    Dead,
    /// Fenced (`InitProducer`), recovery not yet carried out.
    Recovering {
        /// Its new epoch.
        epoch: u32,
        /// Its ownership token.
        token: u8,
    },
    /// Recovered; about to join and begin T(next).
    Recovered {
        /// Its epoch.
        epoch: u32,
        /// Its ownership token.
        token: u8,
        /// The next checkpoint id.
        next: u64,
    },
    /// Running.
    Running(Proc),
}

/// One instance slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The live incarnation.
    pub life: Life,
    /// A paused older incarnation, if any.
    pub zombie: Option<Proc>,
    /// The epoch of the latest incarnation (used only by `Bug::SkipFencing`).
    pub last_epoch: u32,
}

/// The instance registry entry of one prefix (create-only objects, decision 0007).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Registry {
    /// `adoption-claim`: who adopts it.
    pub claim: Option<u8>,
    /// `adoption-plan`: the checkpoint the adopter decides from.
    pub plan: Option<Option<u64>>,
    /// `adoption-done`.
    pub done: bool,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sys {
    /// Broker time (ms).
    pub now: u64,
    /// The real broker state machine.
    pub broker: ModelBroker,
    /// The checkpoint store: (instance, checkpoint id) -> the transaction ids its
    /// manifest lists.
    pub store: BTreeMap<(u8, u64), Vec<u64>>,
    /// Tombstones `chk-{n}/_aborted` in the checkpoint store: (instance, checkpoint id).
    /// A tombstoned checkpoint decides nothing, whatever manifest appears there.
    pub tombstones: BTreeSet<(u8, u64)>,
    /// Instances.
    pub slots: Vec<Slot>,
    /// Instance registry.
    pub registry: Vec<Registry>,
    /// Budgets left: crashes, pauses, lock expiries, transaction timeouts, store faults.
    pub budget: [u8; 5],
    /// Ghost: the ownership token of each prefix, bumped whenever a new owner takes it
    /// over (a new incarnation, or an adopter), fenced or not.
    pub owner: Vec<u8>,
    /// Ghost: violations seen while carrying out a step.
    pub violations: BTreeSet<String>,
}

/// The model.
pub struct ProtocolModel {
    /// Its configuration.
    pub cfg: Config,
    proto: Sys,
    share: ShareConfig,
    /// How often each action kind was taken (successfully) while checking.
    pub coverage: Arc<[AtomicU64; 20]>,
}

fn tp(topic: &str) -> TopicPartition {
    TopicPartition::new(topic, 0)
}

fn txn(i: u8, k: u64) -> TransactionId {
    TransactionId::new(GROUP, PREFIXES[i as usize], k).expect("valid id")
}

fn decode_offset(v: &[u8]) -> i64 {
    std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()).unwrap_or(-1)
}

impl ProtocolModel {
    /// A model of `cfg`. The broker prototype is built once: every initial state is a
    /// clone of it, so states are hashed identically on every replay.
    pub fn new(cfg: Config) -> Self {
        let share = ShareConfig::builder()
            .acknowledgement_mode(AcknowledgementMode::Transactional)
            .record_lock_duration(Duration::from_millis(LOCK_MS))
            .transaction_timeout(Duration::from_millis(TXN_TIMEOUT_MS))
            .delivery_count_limit(cfg.delivery_limit)
            .build()
            .expect("valid share config");
        // Bug::AckBeforeStaging acknowledges outside transactions, which a group in
        // transactional mode refuses: that variant runs the group in explicit mode.
        let group_config = if cfg.bug == Bug::AckBeforeStaging {
            share.clone().with_acknowledgement_mode(AcknowledgementMode::Explicit)
        } else {
            share.clone()
        };
        let mut broker = ModelBroker::new(group_config);
        broker.create_topic(0, INPUT, 1).expect("topic");
        broker.create_topic(0, OUTPUT, 1).expect("topic");
        for r in 0..cfg.records {
            broker.produce(0, &tp(INPUT), &[format!("in-{r}").into_bytes()], None).expect("input");
        }
        let n = cfg.instances as usize;
        let proto = Sys {
            now: 0,
            broker,
            store: BTreeMap::new(),
            tombstones: BTreeSet::new(),
            slots: vec![Slot { life: Life::Down, zombie: None, last_epoch: 0 }; n],
            registry: vec![Registry::default(); n],
            budget: [cfg.crashes, cfg.pauses, cfg.lock_expiries, cfg.txn_timeouts, cfg.store_faults],
            owner: vec![0; n],
            violations: BTreeSet::new(),
        };
        Self { cfg, proto, share, coverage: Arc::new(Default::default()) }
    }

    /// Coverage: (action kind, times taken).
    pub fn coverage(&self) -> Vec<(&'static str, u64)> {
        ACTION_KINDS.iter().zip(self.coverage.iter()).map(|(k, c)| (*k, c.load(Ordering::Relaxed))).collect()
    }

    fn member_config(&self) -> ShareConfig {
        if self.cfg.bug == Bug::AckBeforeStaging {
            self.share.clone().with_acknowledgement_mode(AcknowledgementMode::Explicit)
        } else {
            self.share.clone()
        }
    }
}

// ---- observations, shared by properties and traces ----

impl Sys {
    /// The state of each input record (offset = index).
    pub fn records(&self, n: u8) -> Vec<RecordState> {
        (0..n as i64)
            .map(|o| self.broker.record_status(GROUP, &tp(INPUT), o).map_or(RecordState::Available, |s| s.state))
            .collect()
    }

    /// How often each input record appears in committed output (committed
    /// transactions, whether or not the last stable offset lets a reader see them yet).
    pub fn outputs(&self, n: u8) -> Vec<usize> {
        self.count(n, self.broker.committed_values(&tp(OUTPUT)))
    }

    /// How often each input record appears to a read_committed reader.
    pub fn readable_outputs(&self, n: u8) -> Vec<usize> {
        self.count(n, self.broker.read_committed(&tp(OUTPUT)))
    }

    fn count(&self, n: u8, values: Vec<Vec<u8>>) -> Vec<usize> {
        let mut count = vec![0; n as usize];
        for v in values {
            if let Some(c) = usize::try_from(decode_offset(&v)).ok().and_then(|o| count.get_mut(o)) {
                *c += 1;
            }
        }
        count
    }

    fn has_manifest_at_or_above(&self, i: u8, k: u64) -> bool {
        self.store.range((i, k)..=(i, u64::MAX)).next().is_some()
    }

    /// What `CheckpointStore::observe` reports for instance i: its manifests, with a
    /// tombstone deciding over whatever manifest sits under it.
    fn observed(&self, i: u8) -> Observed {
        let mut ids: BTreeSet<u64> = self.store.range((i, 0)..=(i, u64::MAX)).map(|(&(_, id), _)| id).collect();
        ids.extend(self.tombstones.range((i, 0)..=(i, u64::MAX)).map(|&(_, id)| id));
        let checkpoints = ids
            .into_iter()
            .map(|id| ObservedCheckpoint {
                checkpoint_id: id,
                manifest: match self.store.get(&(i, id)) {
                    _ if self.tombstones.contains(&(i, id)) => ManifestStatus::Aborted,
                    None => ManifestStatus::Missing,
                    Some(txns) => ManifestStatus::Valid(Manifest {
                        job_id: PREFIXES[i as usize].into(),
                        checkpoint_id: id,
                        created_at_ms: 0,
                        state_files: vec![],
                        transactions: txns
                            .iter()
                            .map(|&k| TransactionRecord {
                                participant: "broker".into(),
                                transaction_id: txn(i, k).to_string(),
                                state: ParticipantState::Prepared,
                            })
                            .collect(),
                    }),
                },
                files: BTreeMap::new(),
            })
            .collect();
        Observed { checkpoints, failed_verification: BTreeMap::new() }
    }

    fn views(&self) -> Vec<InstanceView> {
        self.slots
            .iter()
            .enumerate()
            .map(|(v, s)| InstanceView {
                prefix: PREFIXES[v].into(),
                silent_for: match s.life {
                    Life::Down | Life::Dead => ADOPTION_TIMEOUT * 2,
                    _ => Duration::ZERO,
                },
                retired: false,
                adopted_by: self.registry[v].claim.map(|a| PREFIXES[a as usize].to_string()),
                adoption_done: self.registry[v].done,
            })
            .collect()
    }

    /// A commit of T(k) of instance i by an owner holding `token` was applied: check it.
    fn note_commit(&mut self, i: u8, k: u64, token: u8) {
        if !self.has_manifest_at_or_above(i, k) {
            self.violations.insert(format!("commit of {} with no manifest >= {k} in the store", txn(i, k)));
        }
        if token != self.owner[i as usize] {
            self.violations.insert(format!(
                "commit of {} by a stale owner (token {token}, prefix owned by token {})",
                txn(i, k),
                self.owner[i as usize]
            ));
        }
    }

    /// Carries out a recovery plan for instance i's transactions with `epoch`. Before it
    /// aborts T(n) it creates the tombstone of checkpoint n, as the runtime's recovery
    /// does (unless `bug` is `NoTombstone`).
    fn carry_out(&mut self, i: u8, plan: &[TxnAction], epoch: u32, token: u8, bug: Bug) -> Result<(), String> {
        let now = self.now;
        for a in plan {
            let id = txn(i, a.checkpoint_id());
            match *a {
                TxnAction::Commit { checkpoint_id, .. } => {
                    if self.broker.commit(now, &id, epoch).map_err(|e| e.to_string())? {
                        self.note_commit(i, checkpoint_id, token);
                    }
                }
                TxnAction::PrepareAndCommit { checkpoint_id, .. } => {
                    self.broker.prepare(now, &id, epoch).map_err(|e| e.to_string())?;
                    if self.broker.commit(now, &id, epoch).map_err(|e| e.to_string())? {
                        self.note_commit(i, checkpoint_id, token);
                    }
                }
                TxnAction::Abort { checkpoint_id, .. } => {
                    // A tombstone may only mark a checkpoint no manifest decided yet:
                    // recovery never aborts what a manifest committed to.
                    if self.store.contains_key(&(i, checkpoint_id)) {
                        self.violations.insert(format!("abort of {id}, which manifest {checkpoint_id} decided"));
                    }
                    if bug != Bug::NoTombstone {
                        self.tombstones.insert((i, checkpoint_id));
                    }
                    self.broker.abort(now, &id, epoch).map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    fn recovery_plan(&self, i: u8, restored: Option<u64>, bug: Bug) -> Vec<TxnAction> {
        let pending: Vec<PendingTxn> = self
            .broker
            .pending(GROUP, PREFIXES[i as usize])
            .into_iter()
            .map(|p| PendingTxn {
                participant: 0,
                checkpoint_id: p.id.checkpoint_id(),
                prepared: p.state == TransactionState::Prepare,
            })
            .collect();
        let mut plan = plan_recovery(restored, &pending);
        if bug == Bug::RecoveryLeavesPrepared {
            let prepared: BTreeSet<u64> = pending.iter().filter(|p| p.prepared).map(|p| p.checkpoint_id).collect();
            plan.retain(|a| !prepared.contains(&a.checkpoint_id()));
        }
        if bug == Bug::RecoveryAbortsDecided {
            return plan
                .into_iter()
                .map(|a| TxnAction::Abort { participant: 0, checkpoint_id: a.checkpoint_id() })
                .collect();
        }
        plan
    }

    fn proc_mut(&mut self, who: Who) -> Option<&mut Proc> {
        match who {
            Who::Live(i) => match &mut self.slots[i as usize].life {
                Life::Running(p) => Some(p),
                _ => None,
            },
            Who::Zombie(i) => self.slots[i as usize].zombie.as_mut(),
        }
    }

    fn proc(&self, who: Who) -> Option<&Proc> {
        match who {
            Who::Live(i) => match &self.slots[i as usize].life {
                Life::Running(p) => Some(p),
                _ => None,
            },
            Who::Zombie(i) => self.slots[i as usize].zombie.as_ref(),
        }
    }

    /// The process fails (an error from the broker): a live one goes down and restarts
    /// later; a zombie stops for good.
    fn fail(&mut self, who: Who) {
        match who {
            Who::Live(i) => self.slots[i as usize].life = Life::Down,
            Who::Zombie(i) => self.slots[i as usize].zombie = None,
        }
    }

    /// Everything is settled: every instance recovered and idle (or adopted), nothing
    /// left to poll, no zombie.
    pub fn quiescent(&self, n: u8) -> bool {
        let idle = self.slots.iter().enumerate().all(|(i, s)| {
            s.zombie.is_none()
                && match &s.life {
                    Life::Running(p) => {
                        p.rec.is_none()
                            && p.coord == Coord::Idle
                            && p.adopt.is_none()
                            && !p.dirty
                            && p.uncommitted.iter().all(|&k| k == p.cur)
                    }
                    Life::Down | Life::Dead => self.registry[i].done,
                    _ => false,
                }
        });
        idle && self.records(n).iter().all(|s| !matches!(s, RecordState::Available | RecordState::Acquired))
    }

    /// A live instance has begun a transaction past the configuration's last checkpoint
    /// id, so it polls no more: the model's bound.
    pub fn at_bound(&self, checkpoints: u64) -> bool {
        self.slots.iter().any(|s| matches!(&s.life, Life::Running(p) if p.cur > checkpoints))
    }

    /// Some transaction is PREPARE.
    pub fn any_prepared(&self) -> bool {
        self.broker.all_pending().iter().any(|p| p.state == TransactionState::Prepare)
    }

    /// A short, readable summary of the state, for traces.
    pub fn summary(&self, n: u8) -> String {
        let mut s = String::new();
        let recs: Vec<String> = self
            .records(n)
            .iter()
            .zip(self.outputs(n))
            .enumerate()
            .map(|(o, (st, out))| format!("r{o}:{st:?}/out×{out}"))
            .collect();
        let _ = write!(s, "t={}ms records[{}]", self.now, recs.join(" "));
        let pending: Vec<String> =
            self.broker.all_pending().iter().map(|p| format!("{}:{:?}@e{}", p.id, p.state, p.epoch)).collect();
        let _ = write!(s, " pending[{}]", pending.join(" "));
        let store: Vec<String> =
            self.store.iter().map(|((i, id), t)| format!("{}/chk-{id}{:?}", PREFIXES[*i as usize], t)).collect();
        let _ = write!(s, " store[{}]", store.join(" "));
        if !self.tombstones.is_empty() {
            let t: Vec<String> =
                self.tombstones.iter().map(|(i, id)| format!("{}/chk-{id}", PREFIXES[*i as usize])).collect();
            let _ = write!(s, " tombstones[{}]", t.join(" "));
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let life = match &slot.life {
                Life::Running(p) => format!(
                    "running(e{} cur={} unc={:?} rec={:?} {:?}{})",
                    p.epoch,
                    p.cur,
                    p.uncommitted,
                    p.rec,
                    p.coord,
                    p.adopt.map(|a| format!(" adopting {a:?}")).unwrap_or_default()
                ),
                other => format!("{other:?}"),
            };
            let _ = write!(s, " | {}: {life}", PREFIXES[i]);
            if let Some(z) = &slot.zombie {
                let _ = write!(s, " zombie(e{} cur={} rec={:?} {:?})", z.epoch, z.cur, z.rec, z.coord);
            }
            let r = &self.registry[i];
            if r.claim.is_some() {
                let _ =
                    write!(s, " claim={:?} plan={:?} done={}", r.claim.map(|c| PREFIXES[c as usize]), r.plan, r.done);
            }
        }
        s
    }
}

impl Model for ProtocolModel {
    type State = Sys;
    type Action = Action;

    fn init_states(&self) -> Vec<Sys> {
        vec![self.proto.clone()]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let bug = self.cfg.bug;
        for (i, slot) in s.slots.iter().enumerate() {
            let i = i as u8;
            match &slot.life {
                Life::Down => out.push(Action::Restart(i)),
                Life::Dead => {}
                Life::Recovering { .. } => out.push(Action::Recover(i)),
                Life::Recovered { .. } => out.push(Action::Start(i)),
                Life::Running(p) => {
                    if p.adopt.is_none() && s.slots.len() > 1 {
                        out.push(Action::AdoptClaim(i));
                    }
                    match p.adopt {
                        Some(Adopting::Claimed(_)) => out.push(Action::AdoptFence(i)),
                        Some(Adopting::Fenced(..)) => out.push(Action::AdoptDecide(i)),
                        Some(Adopting::Decided(_)) => out.push(Action::AdoptDone(i)),
                        None => {}
                    }
                    if s.budget[1] > 0 && slot.zombie.is_none() {
                        out.push(Action::Pause(i));
                    }
                }
            }
            if matches!(slot.life, Life::Running(_) | Life::Recovering { .. } | Life::Recovered { .. })
                && s.budget[0] > 0
            {
                out.push(Action::Crash(i));
            }
            if slot.zombie.is_some() {
                out.push(Action::Vanish(i));
            }
            for who in [Who::Live(i), Who::Zombie(i)] {
                let Some(p) = s.proc(who) else { continue };
                match p.rec {
                    None if p.cur <= self.cfg.checkpoints => out.push(Action::Poll(who)),
                    Some((_, Held::Polled)) => out.push(Action::Stage(who)),
                    Some((_, Held::Staged)) => out.push(Action::Sink(who)),
                    _ => {}
                }
                match &p.coord {
                    Coord::Idle => {
                        // Past the last checkpoint id the source polls no more, but the
                        // coordinator still checkpoints to finish earlier transactions
                        // (a failed manifest write leaves T(n) prepared for the next
                        // checkpoint to commit), as the runtime's timer would.
                        let earlier = p.uncommitted.iter().any(|&k| k < p.cur);
                        let work = p.dirty || earlier;
                        if p.rec.is_none() && (p.cur <= self.cfg.checkpoints || earlier) && work {
                            out.push(Action::Barrier(who));
                        }
                    }
                    Coord::Barriered(_) => out.push(Action::Prepare(who)),
                    Coord::Prepared(..) | Coord::CommittedEarly(..) => {
                        if bug == Bug::CommitBeforeManifest && matches!(p.coord, Coord::Prepared(..)) {
                            out.push(Action::Commit(who));
                        } else {
                            out.push(Action::WriteManifest(who, Store::Ok));
                            if s.budget[4] > 0 {
                                out.push(Action::WriteManifest(who, Store::Error));
                                out.push(Action::WriteManifest(who, Store::AppliedThenTimeout));
                            }
                        }
                    }
                    Coord::Manifested(_) => out.push(Action::Commit(who)),
                }
            }
        }
        if s.budget[2] > 0 {
            out.push(Action::LockExpiry);
        }
        if s.budget[3] > 0 {
            out.push(Action::TxnTimeout);
        }
        if !s.quiescent(self.cfg.records) {
            out.push(Action::Time);
        }
    }

    fn next_state(&self, s: &Sys, action: Action) -> Option<Sys> {
        let next = self.step(s, action);
        if next.is_some() {
            self.coverage[action.kind()].fetch_add(1, Ordering::Relaxed);
        }
        next
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::<Self>::always("every record in committed output at most once", |m, s| {
                s.outputs(m.cfg.records).iter().all(|&c| c <= 1)
            }),
            Property::<Self>::always("acks and output visible together", |m, s| {
                let n = m.cfg.records;
                s.records(n).iter().zip(s.outputs(n)).all(|(st, out)| (*st == RecordState::Acknowledged) == (out >= 1))
            }),
            Property::<Self>::always("no commit without a manifest that decided it", |_, s| {
                !s.violations.iter().any(|v| v.contains("no manifest"))
            }),
            Property::<Self>::always("no two owners commit for one prefix", |_, s| {
                !s.violations.iter().any(|v| v.contains("stale owner"))
            }),
            Property::<Self>::always("a manifest's transactions are never aborted", |_, s| {
                // A tombstoned checkpoint decides nothing: a fenced zombie may still
                // create its manifest after recovery aborted its transactions. Recovery
                // itself never aborts (nor tombstones) what a manifest already decided.
                !s.violations.iter().any(|v| v.contains("which manifest"))
                    && s.store.iter().filter(|(key, _)| !s.tombstones.contains(key)).all(|(&(i, _), ks)| {
                        ks.iter().all(|&k| s.broker.txn_state(&txn(i, k)) != TransactionState::Aborted)
                    })
            }),
            Property::<Self>::always("recovery never restores a checkpoint whose transactions aborted", |_, s| {
                !s.violations.iter().any(|v| v.contains("restored checkpoint"))
            }),
            Property::<Self>::always("at quiescence: exactly once or archived, nothing locked, no PREPARE", |m, s| {
                let n = m.cfg.records;
                if !s.quiescent(n) {
                    return true;
                }
                let ok_records = s.records(n).iter().zip(s.outputs(n)).all(|(st, out)| match st {
                    RecordState::Acknowledged => out == 1,
                    RecordState::Archived => out == 0,
                    _ => false,
                });
                ok_records
                    && s.readable_outputs(n) == s.outputs(n)
                    && s.broker.all_pending().iter().all(|p| p.state != TransactionState::Prepare)
            }),
            // Liveness. The state graph is finite and acyclic (the test
            // `the_state_graph_has_no_cycle` checks it), so every path ends in a state
            // where nothing can happen. If every such state is quiescent, then by the
            // property above every PREPARE transaction is eventually decided, on every
            // path, with no fairness assumption needed.
            // A live instance past the configuration's last checkpoint id stops polling:
            // that is the model's bound, not the protocol's, so such a state may end a
            // path, but never with a PREPARE transaction left.
            Property::<Self>::always("a state where no event can happen is quiescent (no deadlock)", |m, s| {
                s.quiescent(m.cfg.records) || m.can_move(s) || (s.at_bound(m.cfg.checkpoints) && !s.any_prepared())
            }),
            Property::<Self>::eventually("every PREPARE transaction is eventually decided", |m, s| {
                (s.quiescent(m.cfg.records) || s.at_bound(m.cfg.checkpoints)) && !s.any_prepared()
            }),
            Property::<Self>::sometimes("quiescent with every record output", |m, s| {
                s.quiescent(m.cfg.records) && s.outputs(m.cfg.records).iter().all(|&c| c == 1)
            }),
        ];
        if self.cfg.crashes > 0 {
            props.push(Property::<Self>::sometimes("quiescent after a crash", |m, s| {
                s.budget[0] < m.cfg.crashes && s.quiescent(m.cfg.records)
            }));
        }
        if self.cfg.pauses > 0 {
            props.push(Property::<Self>::sometimes("quiescent after a paused incarnation stopped", |m, s| {
                s.budget[1] < m.cfg.pauses && s.quiescent(m.cfg.records)
            }));
        }
        if self.cfg.delivery_limit == 2 && self.cfg.lock_expiries > 0 && self.cfg.crashes > 0 {
            props.push(Property::<Self>::sometimes("a record archived at the delivery limit", |m, s| {
                s.records(m.cfg.records).contains(&RecordState::Archived)
            }));
        }
        if self.cfg.instances > 1 {
            props.push(Property::<Self>::sometimes("an adoption done", |_, s| s.registry.iter().any(|r| r.done)));
        }
        props
    }
}

fn who_inst(who: Who) -> u8 {
    match who {
        Who::Live(i) | Who::Zombie(i) => i,
    }
}

impl ProtocolModel {
    fn done(&self, s: Sys, _action: Action) -> Option<Sys> {
        Some(s)
    }

    /// Some event can still happen in `s` (it is not a terminal state).
    pub fn can_move(&self, s: &Sys) -> bool {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.into_iter().any(|a| self.step(s, a).is_some())
    }

    /// Every state `s` can move to, for the cycle search of the liveness test.
    pub fn successors(&self, s: &Sys) -> Vec<Sys> {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.into_iter().filter_map(|a| self.step(s, a)).collect()
    }

    /// The state `action` leads to from `s`, or `None` when it cannot happen there.
    fn step(&self, s: &Sys, action: Action) -> Option<Sys> {
        let mut s = s.clone();
        let bug = self.cfg.bug;
        let now = s.now;
        match action {
            Action::Restart(i) => {
                let views = s.views();
                if check_instance_start(Some(&views[i as usize])).is_err() {
                    s.slots[i as usize].life = Life::Dead;
                } else {
                    let last = s.slots[i as usize].last_epoch;
                    let epoch = if bug == Bug::SkipFencing && last > 0 {
                        last
                    } else {
                        match s.broker.init_producer(now, GROUP, PREFIXES[i as usize]) {
                            Ok(e) => e,
                            Err(_) => return None,
                        }
                    };
                    s.owner[i as usize] += 1;
                    let token = s.owner[i as usize];
                    s.slots[i as usize].last_epoch = epoch;
                    s.slots[i as usize].life = Life::Recovering { epoch, token };
                }
            }
            Action::Recover(i) => {
                let Life::Recovering { epoch, token } = s.slots[i as usize].life else { return None };
                let plan = resolve(&s.observed(i), &RetentionPolicy::default());
                if let Some(m) = plan.restored_id() {
                    let aborted: Vec<u64> = s.store[&(i, m)]
                        .iter()
                        .copied()
                        .filter(|&k| s.broker.txn_state(&txn(i, k)) == TransactionState::Aborted)
                        .collect();
                    if !aborted.is_empty() {
                        s.violations.insert(format!(
                            "recovery of {} restored checkpoint {m}, whose transactions {aborted:?} were aborted",
                            PREFIXES[i as usize]
                        ));
                    }
                }
                let actions = s.recovery_plan(i, plan.restored_id(), bug);
                if s.carry_out(i, &actions, epoch, token, bug).is_err() {
                    s.slots[i as usize].life = Life::Down;
                } else {
                    let highest = s.broker.highest_checkpoint(GROUP, PREFIXES[i as usize]).unwrap_or(0);
                    let next = plan.next_checkpoint_id.max(highest + 1);
                    s.slots[i as usize].life = Life::Recovered { epoch, token, next };
                }
            }
            Action::Start(i) => {
                let Life::Recovered { epoch, token, next } = s.slots[i as usize].life else { return None };
                let started = match s.broker.join(now, GROUP, &[INPUT], &self.member_config()) {
                    Ok(member) => s.broker.begin(now, &txn(i, next), epoch, 0).map(|_| member),
                    Err(e) => Err(e),
                };
                s.slots[i as usize].life = match started {
                    Ok(member) => Life::Running(Proc {
                        token,
                        epoch,
                        member,
                        cur: next,
                        dirty: false,
                        uncommitted: [next].into(),
                        rec: None,
                        coord: Coord::Idle,
                        adopt: None,
                    }),
                    Err(_) => Life::Down,
                };
            }
            Action::Poll(who) => {
                let p = s.proc(who)?.clone();
                let got = s.broker.acquire(now, GROUP, p.member, 1);
                let Ok(got) = got else {
                    s.fail(who);
                    return self.done(s, action);
                };
                let (_, offset, _) = got.first()?.clone();
                let mut held = Held::Polled;
                if bug == Bug::AckBeforeStaging {
                    if s.broker.acknowledge(now, GROUP, p.member, &tp(INPUT), offset, AcknowledgeType::Accept).is_err()
                    {
                        s.fail(who);
                        return self.done(s, action);
                    }
                    held = Held::Staged;
                }
                s.proc_mut(who)?.rec = Some((offset, held));
            }
            Action::Stage(who) => {
                let p = s.proc(who)?.clone();
                let (offset, _) = p.rec?;
                let r = s.broker.ack_in_txn(
                    now,
                    &txn(who_inst(who), p.cur),
                    p.epoch,
                    p.member,
                    &tp(INPUT),
                    offset,
                    AcknowledgeType::Accept,
                );
                match r {
                    Ok(()) => {
                        let p = s.proc_mut(who)?;
                        p.rec = Some((offset, Held::Staged));
                        p.dirty = true;
                    }
                    Err(_) => s.fail(who),
                }
            }
            Action::Sink(who) => {
                let p = s.proc(who)?.clone();
                let (offset, _) = p.rec?;
                let id = txn(who_inst(who), p.cur);
                match s.broker.produce(now, &tp(OUTPUT), &[offset.to_string().into_bytes()], Some((&id, p.epoch))) {
                    Ok(_) => {
                        let p = s.proc_mut(who)?;
                        p.rec = None;
                        p.dirty = true;
                    }
                    Err(_) => s.fail(who),
                }
            }
            Action::Barrier(who) => {
                let p = s.proc(who)?.clone();
                match s.broker.begin(now, &txn(who_inst(who), p.cur + 1), p.epoch, 0) {
                    Ok(_) => {
                        let p = s.proc_mut(who)?;
                        p.uncommitted.insert(p.cur + 1);
                        p.coord = Coord::Barriered(p.cur);
                        p.cur += 1;
                        p.dirty = false;
                    }
                    Err(_) => s.fail(who),
                }
            }
            Action::Prepare(who) => {
                let p = s.proc(who)?.clone();
                let Coord::Barriered(n) = p.coord else { return None };
                let ks: Vec<u64> = p.uncommitted.range(..=n).copied().collect();
                for &k in &ks {
                    if s.broker.prepare(now, &txn(who_inst(who), k), p.epoch).is_err() {
                        s.fail(who);
                        return self.done(s, action);
                    }
                }
                s.proc_mut(who)?.coord = Coord::Prepared(n, ks);
            }
            Action::WriteManifest(who, outcome) => {
                let i = who_inst(who);
                let p = s.proc(who)?.clone();
                let (n, ks) = match &p.coord {
                    Coord::Prepared(n, ks) | Coord::CommittedEarly(n, ks) => (*n, ks.clone()),
                    _ => return None,
                };
                if outcome != Store::Ok {
                    s.budget[4] -= 1;
                }
                let created = match outcome {
                    Store::Error => false,
                    Store::Ok | Store::AppliedThenTimeout => {
                        // A create-only put: an existing key stays as it is.
                        match s.store.entry((i, n)) {
                            std::collections::btree_map::Entry::Occupied(_) => false,
                            std::collections::btree_map::Entry::Vacant(v) => {
                                v.insert(ks);
                                outcome == Store::Ok
                            }
                        }
                    }
                };
                let early = matches!(p.coord, Coord::CommittedEarly(..));
                s.proc_mut(who)?.coord = if created && !early { Coord::Manifested(n) } else { Coord::Idle };
            }
            Action::Commit(who) => {
                let i = who_inst(who);
                let p = s.proc(who)?.clone();
                let (n, ks) = match &p.coord {
                    Coord::Manifested(n) => (*n, vec![]),
                    Coord::Prepared(n, ks) if bug == Bug::CommitBeforeManifest => (*n, ks.clone()),
                    _ => return None,
                };
                for k in plan_completion(n, &p.uncommitted) {
                    match s.broker.commit(now, &txn(i, k), p.epoch) {
                        Ok(true) => s.note_commit(i, k, p.token),
                        Ok(false) => {}
                        Err(_) => {
                            s.fail(who);
                            return self.done(s, action);
                        }
                    }
                    s.proc_mut(who)?.uncommitted.remove(&k);
                }
                s.proc_mut(who)?.coord =
                    if matches!(p.coord, Coord::Manifested(_)) { Coord::Idle } else { Coord::CommittedEarly(n, ks) };
            }
            Action::Crash(i) => {
                s.budget[0] -= 1;
                s.slots[i as usize].life = Life::Down;
            }
            Action::Pause(i) => {
                s.budget[1] -= 1;
                let slot = &mut s.slots[i as usize];
                let Life::Running(p) = std::mem::replace(&mut slot.life, Life::Down) else { return None };
                slot.zombie = Some(p);
            }
            Action::LockExpiry => {
                s.budget[2] -= 1;
                s.now += LOCK_MS + 1;
                s.broker.tick(s.now);
            }
            Action::TxnTimeout => {
                s.budget[3] -= 1;
                s.now += TXN_TIMEOUT_MS + 1;
                s.broker.tick(s.now);
            }
            Action::AdoptClaim(i) => {
                let steps = plan_adoption(PREFIXES[i as usize], &s.views(), ADOPTION_TIMEOUT);
                let step = steps.first()?;
                let v = PREFIXES.iter().position(|p| *p == step.prefix())? as u8;
                if let AdoptionStep::Claim { .. } = step {
                    if s.registry[v as usize].claim.is_some() {
                        return None;
                    }
                    s.registry[v as usize].claim = Some(i);
                }
                s.proc_mut(Who::Live(i))?.adopt = Some(Adopting::Claimed(v));
            }
            Action::AdoptFence(i) => {
                let Some(Adopting::Claimed(v)) = s.proc(Who::Live(i))?.adopt else { return None };
                let epoch = if bug == Bug::AdoptWithoutFence {
                    // Decide with whatever epoch the adopted prefix's transactions carry.
                    s.broker.pending(GROUP, PREFIXES[v as usize]).first().map_or(0, |p| p.epoch)
                } else {
                    match s.broker.init_producer(now, GROUP, PREFIXES[v as usize]) {
                        Ok(e) => e,
                        Err(_) => {
                            s.fail(Who::Live(i));
                            return self.done(s, action);
                        }
                    }
                };
                s.owner[v as usize] += 1;
                let token = s.owner[v as usize];
                s.proc_mut(Who::Live(i))?.adopt = Some(Adopting::Fenced(v, epoch, token));
            }
            Action::AdoptDecide(i) => {
                let Some(Adopting::Fenced(v, epoch, token)) = s.proc(Who::Live(i))?.adopt else { return None };
                let restored = match s.registry[v as usize].plan {
                    Some(plan) => plan,
                    None => {
                        let plan = resolve(&s.observed(v), &RetentionPolicy::default()).restored_id();
                        s.registry[v as usize].plan = Some(plan);
                        plan
                    }
                };
                let actions = s.recovery_plan(v, restored, Bug::None);
                if s.carry_out(v, &actions, epoch, token, bug).is_err() {
                    s.fail(Who::Live(i));
                } else {
                    s.proc_mut(Who::Live(i))?.adopt = Some(Adopting::Decided(v));
                }
            }
            Action::AdoptDone(i) => {
                let a = s.proc(Who::Live(i))?.adopt?;
                s.registry[a.victim() as usize].done = true;
                s.proc_mut(Who::Live(i))?.adopt = None;
            }
            Action::Vanish(i) => {
                s.slots[i as usize].zombie.take()?;
            }
            Action::Time => {
                let mut others = Vec::new();
                self.actions(&s, &mut others);
                if others.into_iter().any(|a| a != Action::Time && self.step(&s, a).is_some()) {
                    return None;
                }
                let lock = s.now + LOCK_MS + 1;
                if s.broker.tick(lock) {
                    s.now = lock;
                } else {
                    let timeout = s.now + TXN_TIMEOUT_MS + 1;
                    if !s.broker.tick(timeout) {
                        return None;
                    }
                    s.now = timeout;
                }
            }
        }
        self.done(s, action)
    }

    /// A readable trace: each action, then the state it led to.
    pub fn explain(&self, path: &stateright::Path<Sys, Action>) -> String {
        let mut out = String::new();
        let states = path.clone().into_vec();
        let _ = writeln!(out, "  init: {}", states[0].0.summary(self.cfg.records));
        for (step, (_, action)) in states.iter().enumerate() {
            let Some(action) = action else { continue };
            let next = &states[step + 1].0;
            let _ = writeln!(out, "  {:>2}. {action:?}\n      -> {}", step + 1, next.summary(self.cfg.records));
        }
        if let Some((last, _)) = states.last() {
            for v in &last.violations {
                let _ = writeln!(out, "  violation: {v}");
            }
        }
        out
    }
}
