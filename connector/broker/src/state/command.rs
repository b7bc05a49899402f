//! The journal's entries: the commands the broker state applies, the time each ran at,
//! what each returns, and the counts of what happened.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::log::LogRecord;
use crate::share_partition::{AcquiredRange, Changes, MemberKey};
use shareflow_share::{ProducerEpoch, ShareAcknowledgements, ShareConfig, TopicPartition, TransactionId};

/// One journaled operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Command {
    CreateTopic {
        name: String,
        partitions: u32,
    },
    Produce {
        tp: TopicPartition,
        records: Vec<LogRecord>,
        txn: Option<(TransactionId, ProducerEpoch)>,
    },
    ConfigureGroup {
        group: String,
        config: ShareConfig,
    },
    /// A new member joins with its own configuration: the mode is its own, every other
    /// key must agree with the group's.
    Join {
        group: String,
        topics: Vec<String>,
        config: ShareConfig,
    },
    Subscribe {
        group: String,
        member: MemberKey,
        topics: Vec<String>,
    },
    Leave {
        group: String,
        member: MemberKey,
    },
    /// Acquire, visiting the member's partitions from `start_partition` on (the
    /// consumer rotates it so that members spread over partitions).
    Acquire {
        group: String,
        member: MemberKey,
        max_records: u64,
        start_partition: u32,
    },
    Acknowledge {
        group: String,
        member: MemberKey,
        acks: ShareAcknowledgements,
    },
    InitProducer {
        group: String,
        prefix: String,
    },
    Begin {
        id: TransactionId,
        epoch: ProducerEpoch,
        timeout_ms: u64,
    },
    AckInTxn {
        id: TransactionId,
        epoch: ProducerEpoch,
        member: MemberKey,
        acks: ShareAcknowledgements,
    },
    Prepare {
        id: TransactionId,
        epoch: ProducerEpoch,
    },
    Commit {
        id: TransactionId,
        epoch: ProducerEpoch,
    },
    Abort {
        id: TransactionId,
        epoch: ProducerEpoch,
    },
    /// Only time passed: expire locks and transactions.
    Tick,
    /// The broker restarted: members are gone and their records come back. It carries
    /// the configuration of groups nobody configured, as the broker was opened with it:
    /// replay must not depend on how the journal is opened later.
    Restarted {
        default_config: ShareConfig,
    },
    /// Retention deleted the records of `tp` below `before` (whole batches): the log
    /// starts there, and so does every share partition of it.
    Trim {
        tp: TopicPartition,
        before: i64,
    },
    /// Appends one batch buffer (see [`super::batch`]): what `Produce` does, in the
    /// stored form. The buffer is the entry's last field, so it ends where the entry's
    /// frame ends, and the journal can point at it there (decision 0020). Journal format
    /// 4.
    Append {
        tp: TopicPartition,
        txn: Option<(TransactionId, ProducerEpoch)>,
        batch: Bytes,
    },
    /// Writes the buffer of the batch at `base_offset` again, so that it moves from
    /// memory into a segment: batches of older formats, whose records sat in snapshots,
    /// move on the first open. Changes nothing else; the buffer is the last field, as
    /// in `Append`.
    Rewrite {
        tp: TopicPartition,
        base_offset: i64,
        batch: Bytes,
    },
    /// Takes back what an `Acquire` handed `member` when the broker could not read those
    /// records (a damaged batch): each `(tp, first, last)` it still holds goes back to
    /// AVAILABLE with the delivery count it had before, so the failed poll charges no
    /// record, the readable ones of other partitions included, a delivery.
    Unacquire {
        group: String,
        member: MemberKey,
        ranges: Vec<(TopicPartition, i64, i64)>,
    },
    /// KIP-1191's ARCHIVING -> ARCHIVED, in one entry: `[first, last]` of `source`, all
    /// archived at `group`'s delivery limit, becomes dead-lettered, and `batch` (their
    /// dead letters) is appended to `tp`, the dead-letter topic's partition. The buffer
    /// is the last field, as in `Append`. Journal format 4 reads it; older ones never
    /// wrote it.
    DeadLetter {
        group: String,
        source: TopicPartition,
        first: i64,
        last: i64,
        tp: TopicPartition,
        batch: Bytes,
    },
}

/// A command and the broker time it ran at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) now_ms: u64,
    pub(crate) command: Command,
}

/// What a command returns to its caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Outcome {
    #[default]
    Done,
    Produced {
        base_offset: i64,
    },
    Joined {
        member: MemberKey,
    },
    /// The ranges handed out, and whether records were archived on the way (aborted
    /// producer transactions, or the delivery limit): that changes state even when no
    /// range is handed out.
    Acquired {
        ranges: Vec<(TopicPartition, AcquiredRange)>,
        archived: bool,
    },
    /// Nothing changed.
    Unchanged,
    Epoch(ProducerEpoch),
    /// A transaction step, and whether it changed anything.
    Txn {
        applied: bool,
        epoch: ProducerEpoch,
    },
}

impl Outcome {
    /// Whether the command changed the state and so must be journaled.
    pub(crate) fn changed_state(&self) -> bool {
        match self {
            Outcome::Acquired { ranges, archived } => !ranges.is_empty() || *archived,
            Outcome::Txn { applied, .. } => *applied,
            Outcome::Unchanged => false,
            _ => true,
        }
    }
}

/// Counts of what happened, drained by the broker shell for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Events {
    pub(crate) records: Changes,
    pub(crate) txn_committed: u64,
    pub(crate) txn_aborted: u64,
    pub(crate) txn_timed_out: u64,
    /// Records retention deleted.
    pub(crate) retention_deleted: u64,
    /// Something became available to poll: wake waiting consumers.
    pub(crate) wake: bool,
    /// What was archived at the delivery limit: group, partition, first and last offset.
    pub(crate) limit_archived: Vec<(String, TopicPartition, i64, i64)>,
}
