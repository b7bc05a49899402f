//! The acknowledgement ledger: how exactly-once works on stock Kafka (decisions
//! `kafka-exactly-once.md` and 0008).
//!
//! Two kinds of entries, in two kinds of topics:
//!
//! - **Intent**, in the group's intents topic `{group}-intents` (written without a
//!   transaction, before the records are acknowledged): "claimant c processes these
//!   offsets in checkpoint n". Every instance of the group tails it: the first intent
//!   naming an offset owns it ([`super::claims`]).
//! - **Commit**, in the prefix's commits topic `{group}-{prefix}-ledger` (written inside
//!   T(n), the Kafka transaction of checkpoint n): "generation g committed checkpoint n
//!   on slot s". It becomes visible to a `read_committed` reader exactly when the output
//!   does.
//!
//! The entries are postcard, which writes no field names; the fields that hold a
//! checkpoint id keep the serde name `epoch` they were written with all the same.
//!
//! An offset is **done** when some intent naming it belongs to a committed checkpoint. An
//! offset owned by a claimant the current attempt holds, and not done, is **replayed**
//! from the topic's log.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use shareflow_checkpoint::CheckpointId;
use shareflow_share::ranges::OffsetRanges;

/// One job attempt of one instance: its prefix and the attempt's generation. Every
/// attempt has a generation of its own, higher than any its prefix used before.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Claimant {
    /// The instance's prefix.
    pub prefix: String,
    /// The attempt's generation.
    pub generation: u32,
}

impl Claimant {
    /// `prefix` at `generation`.
    pub fn new(prefix: impl Into<String>, generation: u32) -> Self {
        Self { prefix: prefix.into(), generation }
    }
}

impl std::fmt::Display for Claimant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/g{}", self.prefix, self.generation)
    }
}

/// The first bytes of every ledger record value.
const MAGIC: &[u8; 4] = b"SFL2";

/// One offset range of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LedgerRange {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset, inclusive.
    pub first: i64,
    /// Last offset, inclusive.
    pub last: i64,
}

/// A ledger record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum LedgerEntry {
    /// `by`'s subtask `subtask` processes these offsets in checkpoint `checkpoint_id`
    /// (intents topic).
    Intent {
        /// The attempt that wrote it.
        by: Claimant,
        /// The checkpoint whose transaction carries the output.
        #[serde(rename = "epoch")]
        checkpoint_id: CheckpointId,
        /// The source subtask.
        subtask: u32,
        /// The offsets, as ranges.
        ranges: Vec<LedgerRange>,
    },
    /// Generation `generation` of the topic's prefix committed checkpoint `checkpoint_id`
    /// (commits topic, written inside the checkpoint's transaction on slot `slot`).
    Commit {
        /// The attempt's generation.
        generation: u32,
        /// The checkpoint.
        #[serde(rename = "epoch")]
        checkpoint_id: CheckpointId,
        /// The transactional-id slot that carried it (`{group}-{prefix}-g{generation}-s{slot}`).
        slot: u16,
    },
    /// `by` committed checkpoint `checkpoint_id` (intents topic, written after the
    /// commit): every offset its intents name is done. A note only; the commits topic
    /// stays the truth, and a note lost in a crash is written again by the next take-over.
    Committed {
        /// The attempt that committed.
        by: Claimant,
        /// The checkpoint.
        #[serde(rename = "epoch")]
        checkpoint_id: CheckpointId,
    },
    /// What every entry of the intents topic below offset `upto` amounts to (intents
    /// topic): the ledger is trimmed below `upto` once this is durable, and a reader
    /// that starts above offset 0 starts from it.
    Summary(LedgerSummary),
}

/// The state of a group's claims after every entry of the intents topic below `upto`:
/// what is done, what is still open, and the highest numbers each prefix used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LedgerSummary {
    /// It describes the entries below this offset of the intents topic.
    pub upto: i64,
    /// Offsets some committed intent names: their output is committed.
    pub done: Vec<LedgerRange>,
    /// The intents not yet done, in log order.
    pub open: Vec<OpenIntent>,
    /// Per prefix, the highest generation and checkpoint id its intents named.
    pub highest: Vec<PrefixHighest>,
}

/// An intent a [`LedgerSummary`] keeps: some offset it names is not done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OpenIntent {
    /// The attempt that wrote it.
    pub by: Claimant,
    /// Its checkpoint.
    #[serde(rename = "epoch")]
    pub checkpoint_id: CheckpointId,
    /// The offsets it names.
    pub ranges: Vec<LedgerRange>,
}

/// The highest generation and checkpoint id the intents of one prefix named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PrefixHighest {
    /// The prefix.
    pub prefix: String,
    /// Its highest generation.
    pub generation: u32,
    /// Its highest checkpoint id.
    #[serde(rename = "epoch")]
    pub checkpoint_id: CheckpointId,
}

impl LedgerEntry {
    /// The record value: magic, then postcard. Fails (kind Internal) only if postcard
    /// cannot encode the entry, which a plain enum of integers, strings and vectors
    /// never makes it do: an empty record would read back as corruption.
    pub(crate) fn encode(&self) -> crate::Result<Vec<u8>> {
        frame(&self.describe(), self)
    }

    /// "an intent of checkpoint n" or "the commit of checkpoint n", for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            LedgerEntry::Intent { by, checkpoint_id, .. } => format!("an intent of {by} checkpoint {checkpoint_id}"),
            LedgerEntry::Commit { generation, checkpoint_id, .. } => {
                format!("the commit of g{generation} checkpoint {checkpoint_id}")
            }
            LedgerEntry::Committed { by, checkpoint_id } => {
                format!("the commit note of {by} checkpoint {checkpoint_id}")
            }
            LedgerEntry::Summary(s) => format!("the summary of the entries below offset {}", s.upto),
        }
    }

    /// Parses a record value; `Err` says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
        let body = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(|| {
            format!("it does not start with the ledger magic {MAGIC:?} (is another application writing to this topic?)")
        })?;
        postcard::from_bytes(body).map_err(|e| format!("its body does not decode: {e}"))
    }
}

/// `value` as a ledger record value: magic, then postcard; `what` names it in the error.
fn frame<T: Serialize>(what: &str, value: &T) -> crate::Result<Vec<u8>> {
    let body = postcard::to_allocvec(value)
        .map_err(|e| crate::Error::Internal(format!("cannot encode {what} for the ledger: {e}")))?;
    let mut out = MAGIC.to_vec();
    out.extend(body);
    Ok(out)
}

/// Inclusive offset ranges of one partition, merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    /// first -> last.
    ranges: OffsetRanges<()>,
}

impl RangeSet {
    /// Adds `first..=last`, merging with neighbours (a union: offsets already present
    /// are fine). An empty range (`first > last`) adds nothing.
    pub(crate) fn insert(&mut self, first: i64, last: i64) {
        self.ranges.assign(first, last, ());
    }

    /// True if `offset` is in the set.
    pub(crate) fn contains(&self, offset: i64) -> bool {
        self.ranges.get(offset).is_some()
    }

    /// The ranges of `self` not in `other`, in order.
    pub(crate) fn minus(&self, other: &RangeSet) -> Vec<(i64, i64)> {
        self.ranges.minus(&other.ranges).iter().map(|(first, last, ())| (first, last)).collect()
    }

    /// The ranges as [`OffsetRanges`], to subtract from other range maps.
    pub(crate) fn as_offset_ranges(&self) -> &OffsetRanges<()> {
        &self.ranges
    }

    /// True if every offset of `first..=last` is in the set.
    pub(crate) fn contains_all(&self, first: i64, last: i64) -> bool {
        let mut span = OffsetRanges::new();
        span.assign(first, last, ());
        span.minus(&self.ranges).range_count() == 0
    }

    /// How many ranges.
    pub(crate) fn range_count(&self) -> usize {
        self.ranges.range_count()
    }

    /// The ranges, in order.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ranges.iter().map(|(first, last, ())| (first, last))
    }

    /// How many offsets (saturating at `u64::MAX`).
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        self.ranges.offset_count()
    }
}

/// The piece of `range` that subtask `subtask` of `parallelism` replays.
///
/// The range is cut into `parallelism` contiguous pieces of near-equal length, so an
/// adopted instance's replay runs on every subtask at once: whole partitions per subtask
/// put 1,164 records of one adoption on one of 2 subtasks, and under a rate limit the
/// replay took twice as long. Piece i goes to subtask `(base + i) mod parallelism`, with
/// `base` a stable hash of the range's topic, partition and first offset, so that short
/// ranges (empty pieces) still spread. The pieces of all subtasks are disjoint and cover
/// the range: no offset is replayed twice, none is left out.
pub(crate) fn replay_piece(range: &LedgerRange, subtask: u32, parallelism: u32) -> Option<LedgerRange> {
    let p = i128::from(parallelism.max(1));
    // FNV-1a: stable across processes and versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in range.topic.bytes().chain(range.partition.to_le_bytes()).chain(range.first.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let base = i128::from(h % parallelism.max(1) as u64);
    let piece = (i128::from(subtask) - base).rem_euclid(p);
    let n = i128::from(range.last) - i128::from(range.first) + 1;
    if n <= 0 {
        return None;
    }
    let first = i128::from(range.first) + n * piece / p;
    let last = i128::from(range.first) + n * (piece + 1) / p - 1;
    (last >= first).then(|| LedgerRange {
        topic: range.topic.clone(),
        partition: range.partition,
        first: first as i64,
        last: last as i64,
    })
}

/// Turns offsets into merged ranges per partition.
pub(crate) fn to_ranges<'a>(offsets: impl IntoIterator<Item = (&'a str, i32, i64)>) -> Vec<LedgerRange> {
    let mut sets: BTreeMap<(String, i32), RangeSet> = BTreeMap::new();
    for (t, p, o) in offsets {
        sets.entry((t.to_string(), p)).or_default().insert(o, o);
    }
    let mut out = Vec::new();
    for ((topic, partition), set) in sets {
        for (first, last) in set.ranges() {
            out.push(LedgerRange { topic: topic.clone(), partition, first, last });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(first: i64, last: i64) -> LedgerRange {
        LedgerRange { topic: "in".into(), partition: 0, first, last }
    }

    fn intent(checkpoint_id: CheckpointId, ranges: Vec<LedgerRange>) -> LedgerEntry {
        LedgerEntry::Intent { by: Claimant::new("a", 1), checkpoint_id, subtask: 0, ranges }
    }

    #[test]
    fn range_set_merges_and_subtracts() {
        let mut s = RangeSet::default();
        s.insert(5, 9);
        s.insert(0, 3);
        s.insert(4, 4);
        assert_eq!(s.ranges().collect::<Vec<_>>(), vec![(0, 9)]);
        s.insert(20, 25);
        assert!(s.contains(0) && s.contains(9) && s.contains(22));
        assert!(!s.contains(10) && !s.contains(26) && !s.contains(-1));
        let mut o = RangeSet::default();
        o.insert(2, 3);
        o.insert(8, 21);
        assert_eq!(s.minus(&o), vec![(0, 1), (4, 7), (22, 25)]);
        assert_eq!(s.len(), 16);
    }

    #[test]
    fn range_set_insert_is_a_union_and_survives_the_ends_of_i64() {
        let mut s = RangeSet::default();
        s.insert(0, 9);
        s.insert(3, 5); // inside: nothing changes
        s.insert(8, 12); // overlapping the end: extends
        s.insert(7, 3); // empty: ignored
        assert_eq!(s.ranges().collect::<Vec<_>>(), vec![(0, 12)]);
        s.insert(i64::MAX - 1, i64::MAX);
        s.insert(i64::MIN, i64::MIN);
        assert!(s.contains(i64::MAX) && s.contains(i64::MIN) && !s.contains(i64::MIN + 1));
        assert_eq!(s.len(), 13 + 2 + 1);
        let mut all = RangeSet::default();
        all.insert(i64::MIN, i64::MAX);
        assert_eq!(all.minus(&s), vec![(i64::MIN + 1, -1), (13, i64::MAX - 2)]);
        assert!(s.minus(&all).is_empty());
        assert_eq!(all.len(), u64::MAX);
    }

    #[test]
    fn entries_round_trip_and_foreign_bytes_are_refused() {
        let e = intent(7, vec![r(1, 2)]);
        assert_eq!(LedgerEntry::decode(&e.encode().unwrap()), Ok(e));
        let c = LedgerEntry::Commit { generation: 2, checkpoint_id: 3, slot: 1 };
        assert_eq!(LedgerEntry::decode(&c.encode().unwrap()), Ok(c));
        let err = LedgerEntry::decode(b"hello").unwrap_err();
        assert!(err.contains("magic"), "{err}");
        let err = LedgerEntry::decode(b"SFL2\xff\xff\xff").unwrap_err();
        assert!(err.contains("does not decode"), "{err}");
    }

    #[test]
    fn a_value_postcard_cannot_encode_is_an_internal_error_not_an_empty_record() {
        struct Unencodable;
        impl Serialize for Unencodable {
            fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no encoding"))
            }
        }
        let err = frame("the test value", &Unencodable).unwrap_err();
        assert_eq!(err.kind(), shareflow_share::ErrorKind::Internal);
        assert!(err.to_string().contains("cannot encode the test value for the ledger"), "{err}");
    }

    #[test]
    fn replay_pieces_cover_each_range_once_and_spread() {
        let range = |first, last| LedgerRange { topic: "in".into(), partition: 2, first, last };
        // (range, parallelism): the pieces of all subtasks, in offset order, tile it.
        for (first, last, p) in [(0, 1163, 2), (100, 100, 2), (5, 6, 3), (0, 9, 1), (40, 1_000_039, 4), (7, 7, 1)] {
            let r = range(first, last);
            let mut pieces: Vec<(u32, LedgerRange)> =
                (0..p).filter_map(|s| replay_piece(&r, s, p).map(|x| (s, x))).collect();
            pieces.sort_by_key(|(_, x)| x.first);
            let mut next = first;
            for (_, x) in &pieces {
                assert_eq!(x.first, next, "{first}..={last} on {p}: {pieces:?}");
                assert!(x.last >= x.first);
                next = x.last + 1;
            }
            assert_eq!(next, last + 1, "{first}..={last} on {p}: {pieces:?}");
            // Near-equal: no piece longer than another by more than one offset.
            let lens: Vec<i64> = pieces.iter().map(|(_, x)| x.last - x.first + 1).collect();
            let n = last - first + 1;
            if n >= i64::from(p) {
                assert_eq!(pieces.len(), p as usize, "every subtask gets a piece of {n} offsets");
                assert!(lens.iter().max().expect("some") - lens.iter().min().expect("some") <= 1, "{lens:?}");
            }
        }
        // 1,164 offsets on 2 subtasks: 582 each, not all on one.
        let r = range(0, 1163);
        let lens: Vec<i64> = (0..2).map(|s| replay_piece(&r, s, 2).map_or(0, |x| x.last - x.first + 1)).collect();
        assert_eq!(lens, vec![582, 582]);
        // Single offsets spread over the subtasks (by the hash of the first offset).
        let owners: std::collections::BTreeSet<u32> =
            (0..32).map(|o| (0..3).find(|&s| replay_piece(&range(o, o), s, 3).is_some()).expect("one owner")).collect();
        assert_eq!(owners.len(), 3, "{owners:?}");
        // Parallelism 0 is read as 1; an empty range has no pieces.
        assert_eq!(replay_piece(&range(3, 9), 0, 0), Some(range(3, 9)));
        assert_eq!(replay_piece(&range(9, 3), 0, 1), None);
    }

    #[test]
    fn ranges_merge_per_partition() {
        let ranges = to_ranges([("in", 0, 3), ("in", 0, 1), ("in", 0, 2), ("x", 1, 9)]);
        assert_eq!(ranges, vec![r(1, 3), LedgerRange { topic: "x".into(), partition: 1, first: 9, last: 9 }]);
    }
}
