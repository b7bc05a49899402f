//! What the broker state answers without changing: transactions, record states, the
//! records of a range or a fetch, and where each batch lives.

use bytes::Bytes;

use super::*;
use crate::batch::{self, BatchRecord};
use crate::log::{LogBatch, PartitionLog};
use crate::share_partition::{AcquiredRange, MemberKey, SharePartition, Slot};
use crate::txn::Txn;
use shareflow_share::{Error, Result};
use shareflow_share::{IsolationLevel, RecordState, ShareConfig, TopicPartition, TransactionId};

impl BrokerState {
    pub(crate) fn txn(&self, id: &TransactionId) -> Option<&Txn> {
        self.txns.get_by_id(id)
    }

    /// The highest checkpoint id ever begun by `(group, prefix)`, decided and removed
    /// ones included.
    pub(crate) fn highest_checkpoint(&self, group: &str, prefix: &str) -> Option<u64> {
        self.groups.get(group).and_then(|g| g.highest_checkpoint.get(prefix)).copied()
    }

    /// The group's configuration, or the default for a group never configured.
    pub(crate) fn group_config(&self, group: &str) -> &ShareConfig {
        self.groups.get(group).map_or(&self.default_config, |g| &g.config)
    }

    /// Every transaction still known: pending ones, and decided ones within retention.
    pub(crate) fn txns(&self) -> impl Iterator<Item = &Txn> + '_ {
        self.txns.iter().map(|(_, t)| t)
    }

    /// ONGOING and PREPARE transactions; walks only those.
    pub(crate) fn pending_txns(&self) -> impl Iterator<Item = &Txn> + '_ {
        self.txns.pending().map(|(_, t)| t)
    }

    /// Transactions in the table, decided ones within retention included.
    pub(crate) fn txn_count(&self) -> usize {
        self.txns.len()
    }

    pub(crate) fn is_member(&self, group: &str, member: MemberKey) -> bool {
        self.groups.get(group).is_some_and(|g| g.members.contains_key(&member))
    }

    /// The state of one record for `group`, or `None` if the offset does not exist.
    pub(crate) fn record_status(&self, group: &str, tp: &TopicPartition, offset: i64) -> Option<RecordStatus> {
        let log = self.log(tp).ok()?;
        // Below the log start the record was deleted (retention): it has no state.
        if offset < log.start() || offset >= log.end() {
            return None;
        }
        let slot = self.groups.get(group).and_then(|g| g.partitions.get(tp)).and_then(|sp| sp.slot(offset));
        let slot = slot.unwrap_or(Slot::Available { deliveries: 0 });
        Some(RecordStatus {
            state: slot.record_state(),
            delivery_count: slot.deliveries(),
            archive_reason: match slot {
                Slot::Archived(r) => Some(r),
                _ => None,
            },
            transaction: match slot {
                Slot::Locked { txn, .. } => self.txns.get(txn).map(|t| t.id.clone()),
                _ => None,
            },
        })
    }

    /// Runs of one share partition: (first, last, state), for inspection.
    pub(crate) fn share_partition_runs(&self, group: &str, tp: &TopicPartition) -> Vec<(i64, i64, RecordState)> {
        self.groups
            .get(group)
            .and_then(|g| g.partitions.get(tp))
            .map(|sp| sp.runs().map(|(f, l, s)| (f, l, s.record_state())).collect())
            .unwrap_or_default()
    }

    pub(crate) fn share_partition(&self, group: &str, tp: &TopicPartition) -> Option<&SharePartition> {
        self.groups.get(group).and_then(|g| g.partitions.get(tp))
    }

    /// `group`'s delivery limit (the default group config's for a group never seen).
    pub(crate) fn delivery_limit(&self, group: &str) -> u16 {
        self.groups.get(group).map_or(&self.default_config, |g| &g.config).delivery_count_limit()
    }

    /// The records of an acquired range, ready to hand to a consumer. `load` gives a
    /// batch's buffer, checked, wherever it lives.
    pub(crate) fn delivered_records(
        &self,
        tp: &TopicPartition,
        range: &AcquiredRange,
        load: LoadBatch<'_>,
        out: &mut Vec<shareflow_share::Record>,
    ) -> std::result::Result<(), Box<Unreadable>> {
        let Ok(log) = self.log(tp) else { return Ok(()) };
        for batch in log.batches_from(range.first) {
            if batch.base_offset > range.last {
                break;
            }
            let from = range.first.max(batch.base_offset);
            let to = range.last.min(batch.last_offset());
            let unreadable = |error| Box::new(Unreadable { error, first: from, last: to });
            let data = load(tp, batch).map_err(unreadable)?;
            let records =
                batch::records(&data).skip((from - batch.base_offset) as usize).take((to - from + 1) as usize);
            for (o, r) in (from..).zip(records) {
                let r = r.map_err(|e| unreadable(damaged(tp, batch, e)))?;
                out.push(shareflow_share::Record {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    offset: o,
                    key: r.key,
                    value: r.value,
                    timestamp_ms: r.timestamp_ms,
                    delivery_count: range.deliveries as i16,
                    headers: r.headers,
                });
            }
        }
        Ok(())
    }

    /// Plain fetch: records from `offset`, at most `max`, honouring isolation.
    pub(crate) fn read(
        &self,
        tp: &TopicPartition,
        offset: i64,
        max: usize,
        isolation: IsolationLevel,
        load: LoadBatch<'_>,
    ) -> Result<(Vec<(i64, BatchRecord)>, i64)> {
        let log = self.log(tp)?;
        let end = match isolation {
            IsolationLevel::ReadCommitted => log.last_stable_offset(),
            IsolationLevel::ReadUncommitted => log.end(),
        };
        let mut out = Vec::new();
        let mut next = offset.max(0);
        for batch in log.batches_from(next) {
            if out.len() >= max || batch.base_offset >= end {
                break;
            }
            let aborted = batch.aborted;
            let last = batch.last_offset().min(end - 1);
            if isolation == IsolationLevel::ReadCommitted && aborted {
                next = last + 1;
                continue;
            }
            let from = next.max(batch.base_offset);
            let data = load(tp, batch)?;
            let records = batch::records(&data).skip((from - batch.base_offset) as usize);
            for (o, r) in (from..=last).zip(records) {
                if out.len() >= max {
                    break;
                }
                out.push((o, r.map_err(|e| damaged(tp, batch, e))?));
                next = o + 1;
            }
        }
        Ok((out, next))
    }

    /// Every log, for the journal's record index and snapshots.
    pub(crate) fn logs(&self) -> impl Iterator<Item = (TopicPartition, &PartitionLog)> + '_ {
        self.topics.iter().flat_map(|(topic, logs)| {
            logs.iter().enumerate().map(move |(p, l)| (TopicPartition { topic: topic.clone(), partition: p as i32 }, l))
        })
    }

    /// Records that the batch of `tp` at `base_offset` is stored in journal entry `lsn`.
    pub(crate) fn store_batch(&mut self, tp: &TopicPartition, base_offset: i64, lsn: u64) {
        if let Ok(log) = self.log_mut(tp) {
            log.store_batch(base_offset, lsn);
        }
    }
}

/// Gives a batch's buffer, checked, wherever it lives (memory, or a journal segment).
pub(crate) type LoadBatch<'a> = &'a dyn Fn(&TopicPartition, &LogBatch) -> Result<Bytes>;

/// Loads only batches held in memory: for the model, which keeps no journal.
#[cfg(feature = "model")]
pub(crate) fn load_inline(tp: &TopicPartition, batch: &LogBatch) -> Result<Bytes> {
    match &batch.data {
        crate::log::BatchData::Inline(data) => Ok(data.clone()),
        crate::log::BatchData::Stored(lsn) => Err(Error::Internal(format!(
            "the batch of {tp} at offset {} is stored in journal entry {lsn}, and no journal was given to read it",
            batch.base_offset
        ))),
    }
}

/// A batch of an acquired range that could not be read: the error, and the offsets of
/// the range that lie in that batch.
#[derive(Debug)]
pub(crate) struct Unreadable {
    pub(crate) error: Error,
    pub(crate) first: i64,
    pub(crate) last: i64,
}

fn damaged(tp: &TopicPartition, batch: &LogBatch, e: batch::BatchError) -> Error {
    Error::Corrupt {
        path: format!("{tp}"),
        reason: format!(
            "the batch of offsets {}..={} does not decode ({e}); the broker directory is damaged: restore it from a \
             copy, or start a new directory",
            batch.base_offset,
            batch.last_offset()
        ),
    }
}
