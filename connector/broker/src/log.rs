//! Topic partition logs: batches of records, some produced inside transactions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::txn::TxnKey;

/// One record as a producer hands it over (and as journals of format 3 and snapshots of
/// versions 2-4 hold it); stored, it becomes part of a batch buffer (see [`super::batch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogRecord {
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) timestamp_ms: i64,
    /// Headers travel in batch buffers of version 2 only: the journals and snapshots that
    /// hold `LogRecord`s themselves are older than headers.
    #[serde(skip)]
    pub(crate) headers: Vec<(String, Bytes)>,
}

/// Where a batch's records are: in memory, or in the journal entry that appended them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum BatchData {
    /// The batch buffer itself (brokers on object stores, and batches whose journal
    /// entry is not written yet or came from an older format).
    Inline(Bytes),
    /// In the `Append` journal entry of this lsn, on disk; the journal's record index
    /// says where.
    Stored(u64),
}

/// Records appended together; all in one producer transaction or none. Only metadata
/// lives here when the records sit on disk ([`BatchData::Stored`]).
#[derive(Debug, Clone)]
pub(crate) struct LogBatch {
    pub(crate) base_offset: i64,
    pub(crate) count: u32,
    pub(crate) max_timestamp_ms: i64,
    /// Bytes of keys and values (what `retention.bytes` counts).
    pub(crate) bytes: u64,
    /// Never changed once appended but for where it lives, which is not state: two
    /// batches that differ only there are equal.
    pub(crate) data: BatchData,
    /// The producer transaction it was written in, while undecided.
    pub(crate) txn: Option<TxnKey>,
    /// Its transaction aborted: read_committed readers skip it. Kept in the batch so
    /// that it outlives the transaction, which retention removes.
    pub(crate) aborted: bool,
}

impl PartialEq for LogBatch {
    fn eq(&self, o: &Self) -> bool {
        (self.base_offset, self.count, self.max_timestamp_ms, self.bytes, self.txn, self.aborted)
            == (o.base_offset, o.count, o.max_timestamp_ms, o.bytes, o.txn, o.aborted)
    }
}

impl Eq for LogBatch {}

impl LogBatch {
    pub(crate) fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.count) - 1
    }
}

/// A batch as snapshots of version 5 hold it.
#[derive(Serialize, Deserialize)]
struct BatchRepr {
    base_offset: i64,
    count: u32,
    max_timestamp_ms: i64,
    bytes: u64,
    data: BatchData,
    txn: Option<TxnKey>,
    aborted: bool,
}

/// A batch as snapshots of versions 2-4 hold it: its records inline.
#[derive(Deserialize)]
struct LegacyBatch {
    base_offset: i64,
    records: Vec<LogRecord>,
    txn: Option<TxnKey>,
    aborted: bool,
}

thread_local! {
    static LEGACY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a snapshot's decoding) reading batches in the layout of snapshot versions
/// 2-4, with their records inline; they load as [`BatchData::Inline`].
pub(crate) fn with_legacy_batches<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            LEGACY.with(|l| l.set(self.0));
        }
    }
    let _reset = Reset(LEGACY.with(|l| l.replace(true)));
    f()
}

impl Serialize for LogBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        BatchRepr {
            base_offset: self.base_offset,
            count: self.count,
            max_timestamp_ms: self.max_timestamp_ms,
            bytes: self.bytes,
            data: self.data.clone(),
            txn: self.txn,
            aborted: self.aborted,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for LogBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        if LEGACY.with(|l| l.get()) {
            let b = LegacyBatch::deserialize(d)?;
            let data = super::batch::encode(&b.records);
            let meta = super::batch::meta(&data).map_err(serde::de::Error::custom)?;
            return Ok(LogBatch {
                base_offset: b.base_offset,
                count: meta.count,
                max_timestamp_ms: meta.max_timestamp_ms,
                bytes: meta.bytes,
                data: BatchData::Inline(data),
                txn: b.txn,
                aborted: b.aborted,
            });
        }
        let r = BatchRepr::deserialize(d)?;
        Ok(LogBatch {
            base_offset: r.base_offset,
            count: r.count,
            max_timestamp_ms: r.max_timestamp_ms,
            bytes: r.bytes,
            data: r.data,
            txn: r.txn,
            aborted: r.aborted,
        })
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

fn batch_bytes(b: &LogBatch) -> u64 {
    b.bytes
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
            let newest = b.max_timestamp_ms;
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
        gone.iter().map(|b| u64::from(b.count)).sum()
    }

    /// The last stable offset: no read_committed reader passes it.
    pub(crate) fn last_stable_offset(&self) -> i64 {
        self.open_txn_batches.keys().next().copied().unwrap_or(self.end)
    }

    /// Appends a batch buffer (see [`super::batch`]) whose header is `meta`, returning
    /// the base offset.
    pub(crate) fn append(&mut self, data: Bytes, meta: super::batch::BatchMeta, txn: Option<TxnKey>) -> i64 {
        let base_offset = self.end;
        self.end += i64::from(meta.count);
        if let Some(b) = self.bytes.get() {
            self.bytes.set(b + meta.bytes);
        }
        if let Some(t) = txn {
            self.open_txn_batches.insert(base_offset, t);
        }
        self.batches.push(LogBatch {
            base_offset,
            count: meta.count,
            max_timestamp_ms: meta.max_timestamp_ms,
            bytes: meta.bytes,
            data: BatchData::Inline(data),
            txn,
            aborted: false,
        });
        base_offset
    }

    /// Records that the batch at `base_offset` is stored in journal entry `lsn`, so its
    /// buffer leaves memory.
    pub(crate) fn store_batch(&mut self, base_offset: i64, lsn: u64) {
        let i = self.batches.partition_point(|b| b.base_offset < base_offset);
        if let Some(batch) = self.batches.get_mut(i).filter(|b| b.base_offset == base_offset) {
            batch.data = BatchData::Stored(lsn);
        }
    }

    /// Every batch, oldest first.
    pub(crate) fn batches(&self) -> &[LogBatch] {
        &self.batches
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
        LogRecord { key: None, value: Some(Bytes::from(vec![b'x'; bytes])), timestamp_ms: ts, headers: Vec::new() }
    }

    /// Three batches of 10 records of 10 bytes, written at 1,000, 2,000 and 3,000 ms.
    fn append(l: &mut PartitionLog, records: Vec<LogRecord>, txn: Option<TxnKey>) -> i64 {
        let data = crate::batch::encode(&records);
        let meta = crate::batch::meta(&data).unwrap();
        l.append(data, meta, txn)
    }

    fn log() -> PartitionLog {
        let mut l = PartitionLog::default();
        for t in [1_000, 2_000, 3_000] {
            append(&mut l, (0..10).map(|_| rec(t, 10)).collect(), None);
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
        append(&mut l, vec![rec(4_000, 5)], None);
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
        append(&mut l, vec![rec(0, 1)], Some(TxnKey(1)));
        append(&mut l, vec![rec(0, 1)], None);
        assert_eq!(l.retention_point(1_000_000, &Retention { ms: Some(1), bytes: None }, i64::MAX), None);
    }
}
