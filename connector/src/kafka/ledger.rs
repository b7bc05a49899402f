//! The acknowledgement ledger: how exactly-once works on stock Kafka.
//!
//! Two kinds of entries live in one ledger topic per `(group, prefix)`:
//!
//! - **Intent** (written without a transaction, before the records are acknowledged):
//!   "subtask s of epoch n processes these offsets". Only after the intent is durable
//!   does the source ACCEPT the records at the share group.
//! - **Commit** (written inside T(n)): "epoch n is committed". It becomes visible to a
//!   `read_committed` reader exactly when the output of epoch n does.
//!
//! An offset is **done** when some intent naming it belongs to a committed epoch. Every
//! other offset some intent names must be **replayed** from the topic's log: the share
//! group will not deliver it again (it was accepted), and its output was aborted.
//! [`LedgerPlan::from_entries`] computes both sets; the sources replay their share of
//! the second before reading anything new.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::common::ranges::OffsetRanges;

/// The first bytes of every ledger record value.
const MAGIC: &[u8; 4] = b"SFL1";

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
    /// Subtask `subtask` processes these offsets in epoch `epoch`.
    Intent {
        /// The epoch (checkpoint id) whose transaction carries the output.
        epoch: u64,
        /// The source subtask.
        subtask: u32,
        /// The offsets, as ranges.
        ranges: Vec<LedgerRange>,
    },
    /// Epoch `epoch` is committed (written inside its transaction).
    Commit {
        /// The epoch.
        epoch: u64,
    },
}

impl LedgerEntry {
    /// The record value: magic, then postcard. Fails (kind Internal) only if postcard
    /// cannot encode the entry, which a plain enum of integers, strings and vectors
    /// never makes it do: an empty record would read back as corruption.
    pub(crate) fn encode(&self) -> crate::Result<Vec<u8>> {
        frame(&self.describe(), self)
    }

    /// "intent of epoch n" or "commit of epoch n", for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            LedgerEntry::Intent { epoch, .. } => format!("an intent of epoch {epoch}"),
            LedgerEntry::Commit { epoch } => format!("the commit of epoch {epoch}"),
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

/// The result of reading the whole ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LedgerPlan {
    /// Every offset some intent names, per topic partition.
    pub covered: HashMap<(Arc<str>, i32), RangeSet>,
    /// Offsets to replay from the log: named by intents, none of them committed.
    pub replay: Vec<LedgerRange>,
    /// The committed epochs.
    pub committed_epochs: BTreeSet<u64>,
    /// The highest epoch any entry names.
    pub highest_epoch: Option<u64>,
}

impl LedgerPlan {
    /// Computes the plan from every entry of the ledger, in any order.
    pub(crate) fn from_entries<'a>(entries: impl IntoIterator<Item = &'a LedgerEntry>) -> Self {
        let entries: Vec<&LedgerEntry> = entries.into_iter().collect();
        let mut plan = LedgerPlan::default();
        for e in &entries {
            let epoch = match e {
                LedgerEntry::Commit { epoch } => {
                    plan.committed_epochs.insert(*epoch);
                    *epoch
                }
                LedgerEntry::Intent { epoch, .. } => *epoch,
            };
            plan.highest_epoch = Some(plan.highest_epoch.map_or(epoch, |h| h.max(epoch)));
        }
        let mut done: HashMap<(Arc<str>, i32), RangeSet> = HashMap::new();
        for e in &entries {
            if let LedgerEntry::Intent { epoch, ranges, .. } = e {
                for r in ranges {
                    let key = (Arc::<str>::from(r.topic.as_str()), r.partition);
                    plan.covered.entry(key.clone()).or_default().insert(r.first, r.last);
                    if plan.committed_epochs.contains(epoch) {
                        done.entry(key).or_default().insert(r.first, r.last);
                    }
                }
            }
        }
        let empty = RangeSet::default();
        let mut keys: Vec<&(Arc<str>, i32)> = plan.covered.keys().collect();
        keys.sort();
        for key in keys {
            for (first, last) in plan.covered[key].minus(done.get(key).unwrap_or(&empty)) {
                plan.replay.push(LedgerRange { topic: key.0.to_string(), partition: key.1, first, last });
            }
        }
        plan
    }

    /// The replay ranges subtask `subtask` of `parallelism` owns: whole partitions, by
    /// a stable hash, so two subtasks never replay the same offsets.
    pub(crate) fn replay_share(&self, subtask: u32, parallelism: u32) -> Vec<LedgerRange> {
        self.replay.iter().filter(|r| owner(&r.topic, r.partition, parallelism) == subtask).cloned().collect()
    }
}

fn owner(topic: &str, partition: i32, parallelism: u32) -> u32 {
    // FNV-1a: stable across processes and versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic.bytes().chain(partition.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(parallelism.max(1))) as u32
}

/// The job-wide view of the ledger that every source subtask of one process shares.
#[derive(Debug, Default)]
pub(crate) struct AckLedger {
    inner: Mutex<Option<LedgerPlan>>,
}

impl AckLedger {
    /// An empty, unloaded ledger.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<LedgerPlan>> {
        crate::common::sync::lock(&self.inner)
    }

    /// Installs the plan read from the ledger topic.
    pub(crate) fn install(&self, plan: LedgerPlan) {
        *self.lock() = Some(plan);
    }

    /// Forgets everything: the next attempt reads the topic again.
    pub(crate) fn reset(&self) {
        *self.lock() = None;
    }

    /// The loaded plan, if any.
    pub(crate) fn plan(&self) -> Option<LedgerPlan> {
        self.lock().clone()
    }

    /// Records that an intent naming these ranges is durable.
    pub(crate) fn cover(&self, ranges: &[LedgerRange]) {
        let mut g = self.lock();
        let plan = g.get_or_insert_with(LedgerPlan::default);
        for r in ranges {
            plan.covered.entry((Arc::from(r.topic.as_str()), r.partition)).or_default().insert(r.first, r.last);
        }
    }

    /// For each `(topic, partition, offset)`, whether an intent names it: its output is
    /// committed or will be replayed, so a delivery of it is accepted, not processed.
    /// One lock for the whole poll.
    pub(crate) fn covered<'a>(&self, records: impl IntoIterator<Item = (&'a Arc<str>, i32, i64)>) -> Vec<bool> {
        let g = self.lock();
        let covered = g.as_ref().map(|p| &p.covered);
        records
            .into_iter()
            .map(|(t, p, o)| covered.and_then(|c| c.get(&(t.clone(), p))).is_some_and(|s| s.contains(o)))
            .collect()
    }
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

    fn intent(epoch: u64, ranges: Vec<LedgerRange>) -> LedgerEntry {
        LedgerEntry::Intent { epoch, subtask: 0, ranges }
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
        let c = LedgerEntry::Commit { epoch: 3 };
        assert_eq!(LedgerEntry::decode(&c.encode().unwrap()), Ok(c));
        let err = LedgerEntry::decode(b"hello").unwrap_err();
        assert!(err.contains("magic"), "{err}");
        let err = LedgerEntry::decode(b"SFL1\xff\xff\xff").unwrap_err();
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
        assert_eq!(err.kind(), crate::error::ErrorKind::Internal);
        assert!(err.to_string().contains("cannot encode the test value for the ledger"), "{err}");
    }

    #[test]
    fn offsets_of_uncommitted_epochs_are_replayed_unless_a_committed_intent_names_them() {
        // Epoch 1 committed 0..=9. Epoch 2 (aborted) had 10..=19; its replay in epoch 3
        // committed 10..=14 only before the next crash. Epoch 4 (aborted) had 20..=29.
        let entries = vec![
            intent(1, vec![r(0, 9)]),
            LedgerEntry::Commit { epoch: 1 },
            intent(2, vec![r(10, 19)]),
            intent(3, vec![r(10, 14)]),
            LedgerEntry::Commit { epoch: 3 },
            intent(4, vec![r(20, 29)]),
        ];
        let plan = LedgerPlan::from_entries(&entries);
        // 15..=19 (epoch 2, never redone) and 20..=29 (epoch 4) touch: one merged range.
        assert_eq!(plan.replay, vec![r(15, 29)]);
        assert_eq!(plan.committed_epochs, BTreeSet::from([1, 3]));
        assert_eq!(plan.highest_epoch, Some(4));
        assert_eq!(plan.covered[&(Arc::from("in"), 0)].ranges().collect::<Vec<_>>(), vec![(0, 29)]);
    }

    #[test]
    fn a_commit_entry_alone_replays_nothing_and_order_does_not_matter() {
        let entries = [LedgerEntry::Commit { epoch: 2 }, intent(2, vec![r(0, 4)])];
        assert!(LedgerPlan::from_entries(&entries).replay.is_empty());
        assert!(LedgerPlan::from_entries(&[]).replay.is_empty());
    }

    #[test]
    fn replay_shares_partition_the_work() {
        let mut plan = LedgerPlan::default();
        for p in 0..16 {
            plan.replay.push(LedgerRange { topic: "in".into(), partition: p, first: 0, last: 1 });
        }
        let mut all: Vec<LedgerRange> = (0..3).flat_map(|s| plan.replay_share(s, 3)).collect();
        all.sort();
        let mut expected = plan.replay.clone();
        expected.sort();
        assert_eq!(all, expected);
    }

    #[test]
    fn lookups_see_installed_and_covered_ranges() {
        let ledger = AckLedger::new();
        let t: Arc<str> = "in".into();
        assert_eq!(ledger.covered([(&t, 0, 3)]), vec![false]);
        ledger.install(LedgerPlan::from_entries(&[intent(1, vec![r(0, 4)])]));
        assert_eq!(ledger.covered([(&t, 0, 3)]), vec![true]);
        ledger.cover(&[r(10, 10)]);
        assert_eq!(ledger.covered([(&t, 0, 10), (&t, 1, 10)]), vec![true, false]);
        assert_eq!(ledger.covered([(&t, 0, 3), (&t, 0, 7), (&t, 0, 10)]), vec![true, false, true]);
        ledger.reset();
        assert_eq!(ledger.covered([(&t, 0, 3)]), vec![false]);
        let ranges = to_ranges([("in", 0, 3), ("in", 0, 1), ("in", 0, 2), ("x", 1, 9)]);
        assert_eq!(ranges, vec![r(1, 3), LedgerRange { topic: "x".into(), partition: 1, first: 9, last: 9 }]);
    }
}
