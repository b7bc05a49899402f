//! Topic partition logs: batches of records, some produced inside transactions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    /// Never changed once appended, and shared: cloning the broker state for a snapshot
    /// copies no records (it serializes as the sequence a `Vec` would).
    pub(crate) records: Arc<[LogRecord]>,
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

/// How long and how much a topic's log keeps (Kafka's `retention.ms` and
/// `retention.bytes`; the broker-wide defaults are `log.retention.ms` and
/// `log.retention.bytes`). `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete records whose batch is older than this many milliseconds.
    pub ms: Option<u64>,
    /// Delete the oldest batches while the partition holds more than this many bytes
    /// of keys and values.
    pub bytes: Option<u64>,
}

impl Retention {
    /// True if it limits anything.
    pub fn limits(&self) -> bool {
        self.ms.is_some() || self.bytes.is_some()
    }
}

/// The bytes of keys and values a log holds, counted once when first asked (after a
/// load it is unknown) and kept up to date after. Not part of the state: it never
/// makes two logs unequal, and it is not serialized.
#[derive(Debug, Default)]
struct ByteCount(AtomicU64);

/// Unknown: not counted since the log was loaded.
const UNCOUNTED: u64 = u64::MAX;

impl ByteCount {
    fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|&b| b != UNCOUNTED)
    }
    fn set(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Relaxed);
    }
}

impl Clone for ByteCount {
    fn clone(&self) -> Self {
        Self(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

impl PartialEq for ByteCount {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ByteCount {}

fn uncounted() -> ByteCount {
    ByteCount(AtomicU64::new(UNCOUNTED))
}

/// The bytes retention counts for one record: its key and value.
fn record_bytes(r: &LogRecord) -> u64 {
    (r.key.as_ref().map_or(0, |k| k.len()) + r.value.as_ref().map_or(0, |v| v.len())) as u64
}

fn batch_bytes(b: &LogBatch) -> u64 {
    b.records.iter().map(record_bytes).sum()
}

/// One partition of a topic. Retention deletes whole batches from its start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PartitionLog {
    batches: Vec<LogBatch>,
    end: i64,
    /// base offset -> transaction, for batches whose transaction is undecided. The
    /// smallest key is the last stable offset.
    open_txn_batches: BTreeMap<i64, TxnKey>,
    #[serde(skip, default = "uncounted")]
    bytes: ByteCount,
}

impl Default for PartitionLog {
    fn default() -> Self {
        Self { batches: Vec::new(), end: 0, open_txn_batches: BTreeMap::new(), bytes: ByteCount(AtomicU64::new(0)) }
    }
}

impl PartitionLog {
    /// One past the last offset (the high watermark; single replica).
    pub(crate) fn end(&self) -> i64 {
        self.end
    }

    /// The first offset the log still holds (Kafka's log start offset): retention
    /// deleted everything below it.
    pub(crate) fn start(&self) -> i64 {
        self.batches.first().map_or(self.end, |b| b.base_offset)
    }

    /// The bytes of keys and values the log holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.get().unwrap_or_else(|| {
            let b = self.batches.iter().map(batch_bytes).sum();
            self.bytes.set(b);
            b
        })
    }

    /// How many batches the log holds.
    #[cfg(test)]
    pub(crate) fn batch_count(&self) -> usize {
        self.batches.len()
    }

    /// The offset below which `retention` deletes at `now_ms`: whole batches from the
    /// oldest on, while the batch's newest record is older than `now_ms - ms`, or while
    /// the log holds more than `bytes`. It never deletes a batch that reaches `keep_from`
    /// or beyond (the last stable offset, or a record a share group has in flight).
    /// `None`: nothing to delete.
    pub(crate) fn retention_point(&self, now_ms: u64, retention: &Retention, keep_from: i64) -> Option<i64> {
        let cutoff = retention.ms.map(|ms| i64::try_from(now_ms.saturating_sub(ms)).unwrap_or(i64::MAX));
        let mut left = retention.bytes.map(|_| self.bytes());
        let mut point = None;
        for b in &self.batches {
            if b.last_offset() >= keep_from || b.txn.is_some() {
                break;
            }
            let newest = b.records.iter().map(|r| r.timestamp_ms).max().unwrap_or(i64::MIN);
            let too_old = cutoff.is_some_and(|c| newest < c);
            let too_big = matches!((left, retention.bytes), (Some(l), Some(max)) if l > max);
            if !(too_old || too_big) {
                break;
            }
            if let Some(l) = left.as_mut() {
                *l -= batch_bytes(b);
            }
            point = Some(b.last_offset() + 1);
        }
        point
    }

    /// Deletes every batch that ends below `before`; returns how many records went.
    pub(crate) fn trim(&mut self, before: i64) -> u64 {
        let n = self.batches.partition_point(|b| b.last_offset() < before);
        let gone: Vec<LogBatch> = self.batches.drain(..n).collect();
        if let Some(b) = self.bytes.get() {
            self.bytes.set(b - gone.iter().map(batch_bytes).sum::<u64>());
        }
        for g in &gone {
            self.open_txn_batches.remove(&g.base_offset);
        }
        gone.iter().map(|b| b.records.len() as u64).sum()
    }

    /// The last stable offset: no read_committed reader passes it.
    pub(crate) fn last_stable_offset(&self) -> i64 {
        self.open_txn_batches.keys().next().copied().unwrap_or(self.end)
    }

    /// Appends records, returning the base offset.
    pub(crate) fn append(&mut self, records: Vec<LogRecord>, txn: Option<TxnKey>) -> i64 {
        let base_offset = self.end;
        self.end += records.len() as i64;
        if let Some(b) = self.bytes.get() {
            self.bytes.set(b + records.iter().map(record_bytes).sum::<u64>());
        }
        if let Some(t) = txn {
            self.open_txn_batches.insert(base_offset, t);
        }
        self.batches.push(LogBatch { base_offset, records: records.into(), txn, aborted: false });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ts: i64, bytes: usize) -> LogRecord {
        LogRecord { key: None, value: Some(Bytes::from(vec![b'x'; bytes])), timestamp_ms: ts }
    }

    /// Three batches of 10 records of 10 bytes, written at 1,000, 2,000 and 3,000 ms.
    fn log() -> PartitionLog {
        let mut l = PartitionLog::default();
        for t in [1_000, 2_000, 3_000] {
            l.append((0..10).map(|_| rec(t, 10)).collect(), None);
        }
        l
    }

    #[test]
    fn time_retention_deletes_whole_batches_older_than_the_limit() {
        let l = log();
        let ms = |ms| Retention { ms: Some(ms), bytes: None };
        // (now, retention ms, keep from) -> first offset kept
        let table = [
            (2_500, 1_000, i64::MAX, Some(10)), // the 1,000 ms batch is older than 1,500
            (3_500, 1_000, i64::MAX, Some(20)),
            (9_000, 1_000, i64::MAX, Some(30)), // everything
            (1_500, 1_000, i64::MAX, None),     // nothing old enough
            (9_000, 1_000, 15, Some(10)),       // offset 15 is in flight: its batch stays
            (9_000, 1_000, 0, None),
        ];
        for (now, r, keep, want) in table {
            assert_eq!(l.retention_point(now, &ms(r), keep), want, "now {now}, keep {keep}");
        }
        assert_eq!(l.retention_point(9_000, &Retention::default(), i64::MAX), None);
    }

    #[test]
    fn size_retention_deletes_the_oldest_batches_while_over_the_limit() {
        let l = log();
        assert_eq!(l.bytes(), 300);
        let bytes = |b| Retention { ms: None, bytes: Some(b) };
        assert_eq!(l.retention_point(0, &bytes(300), i64::MAX), None);
        assert_eq!(l.retention_point(0, &bytes(299), i64::MAX), Some(10));
        assert_eq!(l.retention_point(0, &bytes(100), i64::MAX), Some(20));
        assert_eq!(l.retention_point(0, &bytes(0), i64::MAX), Some(30));
    }

    #[test]
    fn a_trim_moves_the_start_and_keeps_the_counts() {
        let mut l = log();
        assert_eq!((l.start(), l.end()), (0, 30));
        assert_eq!(l.trim(15), 10, "only whole batches below 15 go");
        assert_eq!((l.start(), l.end(), l.bytes(), l.batch_count()), (10, 30, 200, 2));
        assert!(l.batch_at(5).is_none() && l.batch_at(10).is_some());
        l.append(vec![rec(4_000, 5)], None);
        assert_eq!(l.bytes(), 205);
        assert_eq!(l.trim(100), 21);
        assert_eq!((l.start(), l.end(), l.bytes()), (31, 31, 0));
        // A loaded log counts its bytes when first asked.
        let loaded: PartitionLog = postcard::from_bytes(&postcard::to_allocvec(&log()).unwrap()).unwrap();
        assert_eq!(loaded.bytes(), 300);
        assert_eq!(loaded, log());
    }

    #[test]
    fn an_open_transactions_batch_is_never_deleted() {
        let mut l = PartitionLog::default();
        l.append(vec![rec(0, 1)], Some(TxnKey(1)));
        l.append(vec![rec(0, 1)], None);
        assert_eq!(l.retention_point(1_000_000, &Retention { ms: Some(1), bytes: None }, i64::MAX), None);
    }
}
