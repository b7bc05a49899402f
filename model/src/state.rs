//! The state the model checker explores: instances, their processes, the instance
//! registry, the checkpoint store and the broker.

use std::collections::{BTreeMap, BTreeSet};

use shareflow_broker::model::ModelBroker;

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
    /// The instance being adopted.
    pub(crate) fn victim(&self) -> u8 {
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
    /// (Stateful) the keyed state: records processed, as restored plus since.
    pub count: u64,
    /// (Stateful) the count changed since it was last emitted.
    pub changed: bool,
    /// (Stateful) the count at the last barrier: the state its manifest records.
    pub snap: u64,
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
        /// (Stateful) the restored count, and whether it counts as changed.
        count: u64,
        /// Whether the restored count is to be emitted again (only `Bug::EmitTwice`).
        changed: bool,
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
    /// (Stateful) the state each manifest records: (instance, checkpoint id) -> count.
    pub states: BTreeMap<(u8, u64), u64>,
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
