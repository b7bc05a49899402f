//! The events the model checker may take, and who takes them.

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
    /// The index of this action's kind in [`ACTION_KINDS`].
    pub(crate) fn kind(&self) -> usize {
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
