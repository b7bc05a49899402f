//! The two state machines of KIP-1289: per record and per transaction.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The state of one transaction (KIP-1289, "Transaction States Transitions").
///
/// ```text
/// EMPTY -> ONGOING -> PREPARE -> COMMITTED
///                             -> ABORTED
///          ONGOING -> ABORTED
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransactionState {
    /// Not begun: the coordinator has no record of it.
    Empty,
    /// Begun; acknowledgements and output may join it. Aborted at its timeout.
    Ongoing,
    /// Phase one done. Only the coordinator decides it; no timeout aborts it.
    Prepare,
    /// Acknowledgements applied and output visible.
    Committed,
    /// Records released and output discarded.
    Aborted,
}

impl TransactionState {
    /// ONGOING or PREPARE: not yet decided.
    pub fn is_pending(self) -> bool {
        matches!(self, TransactionState::Ongoing | TransactionState::Prepare)
    }
}

impl fmt::Display for TransactionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransactionState::Empty => "EMPTY",
            TransactionState::Ongoing => "ONGOING",
            TransactionState::Prepare => "PREPARE",
            TransactionState::Committed => "COMMITTED",
            TransactionState::Aborted => "ABORTED",
        })
    }
}

/// The state of one record in a share partition.
///
/// ```text
/// AVAILABLE  -poll->                 ACQUIRED
/// ACQUIRED   -ack in txn->           LOCKED
/// ACQUIRED   -lock timeout->         AVAILABLE (or ARCHIVED at the delivery limit)
/// LOCKED     -commit->               ACKNOWLEDGED (ACCEPT) / ARCHIVED (REJECT)
/// LOCKED     -abort or txn timeout-> AVAILABLE
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RecordState {
    /// Can be delivered.
    Available,
    /// Delivered to one member, held under the acquisition lock.
    Acquired,
    /// Acknowledged into a transaction that is not decided yet. Governed by the
    /// transaction timeout, not the acquisition lock. The KIP-1289 draft PR calls this
    /// state `TX_PENDING`.
    Locked,
    /// Done: accepted, by itself or by a committed transaction.
    Acknowledged,
    /// Done without processing; see [`ArchiveReason`].
    Archived,
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordState::Available => "AVAILABLE",
            RecordState::Acquired => "ACQUIRED",
            RecordState::Locked => "LOCKED",
            RecordState::Acknowledged => "ACKNOWLEDGED",
            RecordState::Archived => "ARCHIVED",
        })
    }
}

/// Why a record was archived. Kept durably with the record's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ArchiveReason {
    /// A consumer rejected it (REJECT, directly or through a committed transaction).
    Rejected,
    /// Its delivery count reached `group.share.delivery.count.limit`.
    DeliveryLimit,
    /// It belongs to an aborted producer transaction and the group reads committed.
    AbortedTransaction,
    /// Its delivery count reached the limit, and the broker wrote it to the group's
    /// dead-letter topic in the same journaled step (KIP-1191's ARCHIVING, then
    /// ARCHIVED; embedded broker only).
    DeadLettered,
}

impl fmt::Display for ArchiveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArchiveReason::Rejected => "rejected",
            ArchiveReason::DeliveryLimit => "delivery_limit",
            ArchiveReason::AbortedTransaction => "aborted_transaction",
            ArchiveReason::DeadLettered => "dead_lettered",
        })
    }
}
