//! Topic partition logs: batches of records, some produced inside transactions.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::txn::TxnKey;

/// One stored record; its offset is implied by its batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogRecord {
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) timestamp_ms: i64,
}

/// Records appended together; all in one producer transaction or none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogBatch {
    pub(crate) base_offset: i64,
    pub(crate) records: Vec<LogRecord>,
    /// The producer transaction it was written in, while undecided.
    pub(crate) txn: Option<TxnKey>,
    /// Its transaction aborted: read_committed readers skip it. Kept in the batch so
    /// that it outlives the transaction, which retention removes.
    #[serde(default)]
    pub(crate) aborted: bool,
}

impl LogBatch {
    pub(crate) fn last_offset(&self) -> i64 {
        self.base_offset + self.records.len() as i64 - 1
    }
}

/// One partition of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PartitionLog {
    batches: Vec<LogBatch>,
    end: i64,
    /// base offset -> transaction, for batches whose transaction is undecided. The
    /// smallest key is the last stable offset.
    open_txn_batches: BTreeMap<i64, TxnKey>,
}

impl PartitionLog {
    /// One past the last offset (the high watermark; single replica).
    pub(crate) fn end(&self) -> i64 {
        self.end
    }

    /// The last stable offset: no read_committed reader passes it.
    pub(crate) fn last_stable_offset(&self) -> i64 {
        self.open_txn_batches.keys().next().copied().unwrap_or(self.end)
    }

    /// Appends records, returning the base offset.
    pub(crate) fn append(&mut self, records: Vec<LogRecord>, txn: Option<TxnKey>) -> i64 {
        let base_offset = self.end;
        self.end += records.len() as i64;
        if let Some(t) = txn {
            self.open_txn_batches.insert(base_offset, t);
        }
        self.batches.push(LogBatch { base_offset, records, txn, aborted: false });
        base_offset
    }

    /// Marks a transaction's batch as decided: committed, or aborted.
    pub(crate) fn close_txn_batch(&mut self, base_offset: i64, aborted: bool) {
        self.open_txn_batches.remove(&base_offset);
        let i = self.batches.partition_point(|b| b.base_offset < base_offset);
        if let Some(batch) = self.batches.get_mut(i).filter(|b| b.base_offset == base_offset) {
            batch.txn = None;
            batch.aborted = aborted;
        }
    }

    /// The batch holding `offset`.
    pub(crate) fn batch_at(&self, offset: i64) -> Option<&LogBatch> {
        let i = self.batches.partition_point(|b| b.last_offset() < offset);
        self.batches.get(i).filter(|b| b.base_offset <= offset)
    }

    /// Batches from the one holding `offset` on.
    pub(crate) fn batches_from(&self, offset: i64) -> impl Iterator<Item = &LogBatch> + '_ {
        let i = self.batches.partition_point(|b| b.last_offset() < offset);
        self.batches[i..].iter()
    }
}
