//! The one public error type of the share-group contract, the embedded broker and the
//! connector.

use std::sync::Arc;

use crate::{RecordState, TransactionState};

pub use shareflow_checkpoint::ErrorKind;

/// Result alias for the share-group crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the share-group contract, the embedded broker and its journal.
///
/// Messages name the thing at fault (transaction id, offsets, member, config key, path)
/// and, where there is one, what to do about it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value breaks its rule.
    #[error("invalid config {key}={value}: {rule}")]
    InvalidConfig {
        /// The configuration key, as in Kafka (`share.transaction.timeout.ms`).
        key: String,
        /// The offending value.
        value: String,
        /// The rule, with the allowed range.
        rule: String,
    },
    /// A checkpoint-layer error: a malformed transaction id, group id or prefix, or
    /// checkpoint storage.
    #[error(transparent)]
    Checkpoint(#[from] shareflow_checkpoint::CheckpointError),
    /// The transaction is not known to the coordinator.
    #[error(
        "unknown transaction {txn}: it was never begun, belongs to another broker, or was decided and then \
         removed after share.transaction.retention.ms"
    )]
    UnknownTransaction {
        /// The transaction id.
        txn: String,
    },
    /// A transaction operation that the state machine forbids.
    #[error("cannot {op} transaction {txn}: it is {state}{}", illegal_hint(.op, .state))]
    IllegalTransition {
        /// The transaction id.
        txn: String,
        /// The operation: begin, prepare, commit, abort, acknowledge, produce.
        op: &'static str,
        /// The state the transaction is in.
        state: TransactionState,
    },
    /// `share.transaction.max.pending` is reached for the group.
    #[error(
        "cannot begin {txn}: group {group} already has {pending} pending transactions \
         (share.transaction.max.pending={max}); commit or abort one of [{ids}] first"
    )]
    TooManyPendingTransactions {
        /// The transaction that could not begin.
        txn: String,
        /// The share group.
        group: String,
        /// How many are pending.
        pending: usize,
        /// The configured maximum.
        max: u32,
        /// The pending transaction ids.
        ids: String,
    },
    /// An acknowledgement names offsets that this member does not hold.
    #[error(
        "member {member} cannot acknowledge {topic}-{partition} offsets {first}..={last} \
         in group {group}: offset {offset} is {state}{detail}"
    )]
    NotAcquired {
        /// The share group.
        group: String,
        /// The member that sent the acknowledgement.
        member: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// First offset of the acknowledged range.
        first: i64,
        /// Last offset of the acknowledged range.
        last: i64,
        /// The first offending offset.
        offset: i64,
        /// The state that offset is in.
        state: RecordState,
        /// Extra detail (owner, transaction).
        detail: String,
    },
    /// An acknowledgement names offsets that were never delivered to anyone.
    #[error(
        "cannot acknowledge {topic}-{partition} offsets {first}..={last} in group {group}: \
         offsets from {from} on were never delivered"
    )]
    NeverDelivered {
        /// The share group.
        group: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// First offset of the acknowledged range.
        first: i64,
        /// Last offset of the acknowledged range.
        last: i64,
        /// First offset that was never delivered.
        from: i64,
    },
    /// The request itself is malformed (overlapping ranges, wrong group, bad mode).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A topic or partition that does not exist.
    #[error("unknown topic or partition {topic}-{partition}: create the topic first")]
    UnknownTopicPartition {
        /// Topic.
        topic: String,
        /// Partition, or -1 when the topic itself is unknown.
        partition: i32,
    },
    /// A stale instance tried to use a transactional prefix a newer one owns.
    #[error(
        "fenced: {what} uses epoch {epoch} of group {group} prefix {prefix}, but epoch \
         {current} now owns it; another instance with the same prefix started. Stop this one, \
         or give each instance its own prefix"
    )]
    Fenced {
        /// The share group.
        group: String,
        /// The transactional prefix.
        prefix: String,
        /// The epoch the caller holds.
        epoch: u32,
        /// The epoch that owns the prefix now.
        current: u32,
        /// What was attempted, with the transaction id.
        what: String,
    },
    /// The object store failed or the journal is unusable until the broker is reopened.
    #[error("storage unavailable at {path}: {reason}")]
    Storage {
        /// The object path.
        path: String,
        /// What failed.
        reason: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<Arc<object_store::Error>>,
    },
    /// The disk under the broker directory is full. The write that failed was cut back:
    /// nothing acknowledged is lost. Until the broker has read its directory again (it
    /// tries on its next call, at most once a second) every call fails with this error.
    #[error(
        "no space left on the device of broker directory {dir}: a journal write of {needed} bytes failed \
         ({free}). Nothing acknowledged was lost. Free space on that device (or move the directory): \
         the broker then reads its directory again on its next call and serves again"
    )]
    DiskFull {
        /// The broker directory.
        dir: String,
        /// The bytes the failed write needed.
        needed: u64,
        /// What the device has left, as far as the broker could tell.
        free: String,
    },
    /// Another broker holds the directory: a second read-write open would fork its
    /// journal and lose what it writes.
    #[error(
        "broker directory {dir} is in use by {holder}; only one broker may open it read-write. \
         Stop that process first, or open it read-only to inspect it (shareflow txn list does)"
    )]
    DirectoryLocked {
        /// The broker directory.
        dir: String,
        /// Who holds it, as recorded in the lock file (`pid N`), when known.
        holder: String,
    },
    /// A write was tried on a broker opened read-only.
    #[error("{what} is not allowed: this broker was opened read-only for inspection")]
    ReadOnly {
        /// What was attempted.
        what: String,
    },
    /// The broker or consumer was closed.
    #[error("{what} is closed")]
    Closed {
        /// What was closed.
        what: String,
    },
    /// Durable bytes are corrupt.
    #[error("corrupt data in {path}: {reason}")]
    Corrupt {
        /// The object path.
        path: String,
        /// What check failed.
        reason: String,
    },
    /// A call to a real Kafka cluster failed.
    #[error("kafka {op} failed: {reason}")]
    Kafka {
        /// What was attempted, with the topic, group or transaction id.
        op: String,
        /// What the client or broker said, and what to do.
        reason: String,
        /// The cause, as what to do: Invalid (fix the input or config), Unavailable
        /// (retry; a job restart does), Fenced (stop this instance), Data (corrupt
        /// bytes), Internal (a shareflow bug).
        kind: ErrorKind,
        /// The client's error, when the failure came from the client (not from a check
        /// of the connector's own). Shared so that the error stays `Clone`; it is opaque
        /// on purpose: match on [`Error::kind`], not on the client's variants.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// A shareflow bug.
    #[error("internal error (a shareflow bug, please report it): {0}")]
    Internal(String),
}

impl Error {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Checkpoint(e) => e.kind(),
            Error::InvalidConfig { .. }
            | Error::UnknownTransaction { .. }
            | Error::IllegalTransition { .. }
            | Error::NotAcquired { .. }
            | Error::NeverDelivered { .. }
            | Error::InvalidRequest(_)
            | Error::UnknownTopicPartition { .. }
            | Error::ReadOnly { .. } => ErrorKind::Invalid,
            Error::Fenced { .. } => ErrorKind::Fenced,
            Error::TooManyPendingTransactions { .. }
            | Error::Storage { .. }
            | Error::DiskFull { .. }
            | Error::Closed { .. }
            | Error::DirectoryLocked { .. } => ErrorKind::Unavailable,
            Error::Corrupt { .. } => ErrorKind::Data,
            Error::Internal(_) => ErrorKind::Internal,
            Error::Kafka { kind, .. } => *kind,
        }
    }

    /// A storage failure at `path` (for the broker and the connector's crates).
    #[doc(hidden)]
    pub fn storage(path: impl ToString, reason: impl ToString, source: Option<object_store::Error>) -> Self {
        Error::Storage { path: path.to_string(), reason: reason.to_string(), source: source.map(Arc::new) }
    }

    /// A Kafka failure the connector itself detected (no client error behind it).
    #[doc(hidden)]
    pub fn kafka(op: impl Into<String>, reason: impl Into<String>, kind: ErrorKind) -> Self {
        Error::Kafka { op: op.into(), reason: reason.into(), kind, source: None }
    }

    /// Damaged data at `path` (for the broker and the connector's crates).
    #[doc(hidden)]
    pub fn corrupt(path: impl ToString, reason: impl ToString) -> Self {
        Error::Corrupt { path: path.to_string(), reason: reason.to_string() }
    }
}

/// What to do instead, for the illegal transitions a caller meets by following another
/// flow than the coordinator's.
fn illegal_hint(op: &str, state: &crate::TransactionState) -> &'static str {
    match (op, state) {
        ("commit", &crate::TransactionState::Ongoing) => {
            "; commit is the second phase: prepare_transaction first (decision 0003), or commit in one call with \
             commit_one_phase (KIP-1289's commitTransaction)"
        }
        _ => "",
    }
}
