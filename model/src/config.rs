//! The model's constants, the configurations it is checked in, and the deliberately
//! broken variants of the protocol.

use std::time::Duration;

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
    /// (Stateful) a restore marks the restored count as changed, so the next checkpoint
    /// emits a value the output already holds: a result emitted twice.
    EmitTwice,
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
    /// The job keeps keyed state: a running count of the records it processed,
    /// snapshotted into each manifest, restored by recovery, and emitted (upsert) into
    /// T(n) at barrier n when it changed, as the stateful SQL operator does.
    pub stateful: bool,
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
            stateful: false,
            bug: Bug::None,
        }
    }

    /// CI: one instance with keyed state (a count emitted at each barrier).
    pub fn ci_stateful() -> Self {
        Config { stateful: true, ..Self::ci_one() }
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
            stateful: false,
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
