//! Ordered claims: who owns the output of an input offset when several shareflow
//! instances share one share group on stock Kafka (decision 0008). Pure: the tailer of
//! the group's intents topic feeds [`ClaimIndex::apply`] in log order, and the
//! transactional participant asks it three questions:
//!
//! - **covered**: does any intent name this offset? A delivery of it is accepted and
//!   dropped (its output is committed, or some instance replays it).
//! - **lost**: which offsets of my intents did another instance claim first? My
//!   checkpoint must then abort: exactly one owner per offset.
//! - **replay**: which offsets owned by claimants I hold (my own earlier generations,
//!   instances I adopted) have no committed intent? I replay them from the input log.
//!
//! The first intent naming an offset in the intents log owns it. A later intent naming
//! it is valid only if its writer holds the owner; every other later intent loses.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::entries::{Claimant, LedgerRange, LedgerSummary, OpenIntent, PrefixHighest, RangeSet};
use shareflow_checkpoint::CheckpointId;
use shareflow_share::ranges::OffsetRanges;

/// What the current attempt owns: itself, the earlier generations of its prefix, and
/// every prefix it (or an instance it adopted) adopted. The claims of all but itself
/// are final: their transactions are decided and their ids fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holdings {
    /// The current attempt.
    pub me: Claimant,
    /// Adopted prefixes: every generation of each is held.
    pub adopted: BTreeSet<String>,
}

impl Holdings {
    /// The current attempt, holding only its own earlier generations.
    pub(crate) fn new(me: Claimant) -> Self {
        Self { me, adopted: BTreeSet::new() }
    }

    /// True if `c` is held: an earlier generation of my prefix, or an adopted prefix.
    /// Not the current attempt itself, and never a later generation of my prefix (a
    /// newer process took my prefix over; I am the zombie).
    pub(crate) fn holds(&self, c: &Claimant) -> bool {
        if c.prefix == self.me.prefix {
            c.generation < self.me.generation
        } else {
            self.adopted.contains(&c.prefix)
        }
    }

    /// True if an intent of mine naming an offset `owner` claimed first is valid.
    pub(crate) fn may_reclaim(&self, owner: &Claimant) -> bool {
        *owner == self.me || self.holds(owner)
    }
}

/// One intent, as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Intent {
    by: Arc<Claimant>,
    checkpoint_id: CheckpointId,
    ranges: Vec<LedgerRange>,
}

/// Partition key of the index.
type Tp = (Arc<str>, i32);

/// The group-wide claims, built from the intents topic in log order.
///
/// Bounded: an offset some committed intent names is **done** (a commit note says so).
/// Done offsets collapse into one range set per partition and leave the owner map, and
/// an intent whose every offset is done is dropped. What stays is the work in flight
/// or waiting for replay, and a [`LedgerSummary`] of it lets the topic be trimmed.
#[derive(Debug, Default, Clone)]
pub(crate) struct ClaimIndex {
    /// Who claimed each offset first, for offsets not done.
    owners: HashMap<Tp, OffsetRanges<Arc<Claimant>>>,
    /// Offsets a committed intent names.
    done: HashMap<Tp, RangeSet>,
    /// The intents with an offset not done, in log order.
    intents: Vec<Intent>,
    claimants: BTreeSet<Arc<Claimant>>,
    /// Per prefix, the highest generation and checkpoint id its intents named.
    highest: BTreeMap<String, (u32, CheckpointId)>,
}

impl ClaimIndex {
    /// An empty index.
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The index a summary describes: its done offsets, then its open intents applied
    /// in their log order.
    pub(crate) fn from_summary(summary: &LedgerSummary) -> Self {
        let mut ix = Self::default();
        for r in &summary.done {
            ix.done.entry((Arc::from(r.topic.as_str()), r.partition)).or_default().insert(r.first, r.last);
        }
        for h in &summary.highest {
            ix.highest.insert(h.prefix.clone(), (h.generation, h.checkpoint_id));
        }
        for i in &summary.open {
            ix.apply(&i.by, i.checkpoint_id, &i.ranges);
        }
        ix
    }

    /// What the index holds, as the summary of the entries below `upto`.
    pub(crate) fn summary(&self, upto: i64) -> LedgerSummary {
        let mut keys: Vec<&Tp> = self.done.keys().collect();
        keys.sort();
        let done = keys
            .into_iter()
            .flat_map(|k| {
                self.done[k].ranges().map(|(first, last)| LedgerRange {
                    topic: k.0.to_string(),
                    partition: k.1,
                    first,
                    last,
                })
            })
            .collect();
        let open = self
            .intents
            .iter()
            .map(|i| OpenIntent { by: (*i.by).clone(), checkpoint_id: i.checkpoint_id, ranges: i.ranges.clone() })
            .collect();
        let highest = self
            .highest
            .iter()
            .map(|(prefix, &(generation, id))| PrefixHighest { prefix: prefix.clone(), generation, checkpoint_id: id })
            .collect();
        LedgerSummary { upto, done, open, highest }
    }

    /// Applies the next intent of the log: `by` owns every offset of `ranges` that
    /// nobody claimed before and that is not done.
    pub(crate) fn apply(&mut self, by: &Claimant, checkpoint_id: CheckpointId, ranges: &[LedgerRange]) {
        let high = self.highest.entry(by.prefix.clone()).or_insert((by.generation, checkpoint_id));
        *high = (high.0.max(by.generation), high.1.max(checkpoint_id));
        let by = match self.claimants.get(by) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(by.clone());
                self.claimants.insert(c.clone());
                c
            }
        };
        let empty = RangeSet::default();
        let mut open = false;
        for r in ranges {
            let key: Tp = (Arc::from(r.topic.as_str()), r.partition);
            let done = self.done.get(&key).unwrap_or(&empty);
            let owners = self.owners.entry(key.clone()).or_default();
            let mut span = OffsetRanges::new();
            span.assign(r.first, r.last, ());
            let undone = span.minus(done.as_offset_ranges());
            open |= undone.range_count() > 0;
            let free: Vec<(i64, i64)> = undone.minus(owners).iter().map(|(f, l, ())| (f, l)).collect();
            for (f, l) in free {
                owners.assign(f, l, by.clone());
            }
        }
        // An intent naming only done offsets lost everywhere and decides nothing.
        if open {
            self.intents.push(Intent { by, checkpoint_id, ranges: ranges.to_vec() });
        }
    }

    /// `by` committed checkpoint `checkpoint_id`: every offset its intents name is done.
    /// Those offsets leave the owner map, and intents left with nothing undone are dropped.
    pub(crate) fn committed(&mut self, by: &Claimant, checkpoint_id: CheckpointId) {
        let mut touched: BTreeSet<Tp> = BTreeSet::new();
        for i in self.intents.iter().filter(|i| *i.by == *by && i.checkpoint_id == checkpoint_id) {
            for r in &i.ranges {
                let key: Tp = (Arc::from(r.topic.as_str()), r.partition);
                self.done.entry(key.clone()).or_default().insert(r.first, r.last);
                touched.insert(key);
            }
        }
        if touched.is_empty() {
            return;
        }
        for key in &touched {
            if let (Some(owners), Some(done)) = (self.owners.get_mut(key), self.done.get(key)) {
                *owners = owners.minus(done.as_offset_ranges());
                if owners.range_count() == 0 {
                    self.owners.remove(key);
                }
            }
        }
        let done = &self.done;
        self.intents.retain(|i| {
            i.ranges.iter().any(|r| {
                done.get(&(Arc::from(r.topic.as_str()), r.partition)).is_none_or(|d| !d.contains_all(r.first, r.last))
            })
        });
        self.claimants.retain(|c| Arc::strong_count(c) > 1);
    }

    /// The claimant that owns `offset` of `topic`-`partition`, if any intent names it
    /// and it is not done.
    pub(crate) fn owner(&self, topic: &Arc<str>, partition: i32, offset: i64) -> Option<&Claimant> {
        self.owners.get(&(topic.clone(), partition))?.get(offset).map(|(_, _, c)| &**c)
    }

    /// True if some intent names `offset` of `topic`-`partition`: it is done, or owned.
    pub(crate) fn covered(&self, topic: &Arc<str>, partition: i32, offset: i64) -> bool {
        self.owner(topic, partition, offset).is_some()
            || self.done.get(&(topic.clone(), partition)).is_some_and(|d| d.contains(offset))
    }

    /// The `(claimant, checkpoint id)` pairs of the intents still open, among `pairs`.
    pub(crate) fn open_among<'a>(
        &self,
        pairs: impl IntoIterator<Item = &'a (Claimant, CheckpointId)>,
    ) -> Vec<(Claimant, CheckpointId)> {
        let open: BTreeSet<(&Claimant, CheckpointId)> =
            self.intents.iter().map(|i| (&*i.by, i.checkpoint_id)).collect();
        pairs.into_iter().filter(|(c, e)| open.contains(&(c, *e))).cloned().collect()
    }

    /// The pieces of `ranges` (intents of the current attempt, already applied) that
    /// another claimant owns and `holdings` does not hold. An offset nobody owns is lost
    /// too: it is done (another intent committed it), or the tailer has not seen the
    /// intent yet, so nothing can be claimed for it.
    pub(crate) fn lost(&self, holdings: &Holdings, ranges: &[LedgerRange]) -> Vec<LedgerRange> {
        let mut out = Vec::new();
        for r in ranges {
            let key: Tp = (Arc::from(r.topic.as_str()), r.partition);
            let mut next = Some(r.first);
            let mut push = |first: i64, last: i64| {
                out.push(LedgerRange { topic: r.topic.clone(), partition: r.partition, first, last })
            };
            if let Some(owners) = self.owners.get(&key) {
                for (f, l, owner) in owners.overlapping(r.first, r.last) {
                    if let Some(n) = next.filter(|&n| f > n) {
                        push(n, f - 1);
                    }
                    if !holdings.may_reclaim(owner) {
                        push(f, l);
                    }
                    next = l.checked_add(1);
                }
            }
            if let Some(n) = next.filter(|&n| n <= r.last) {
                push(n, r.last);
            }
        }
        out
    }

    /// The offsets the current attempt must replay: owned by a claimant `holdings`
    /// holds, not named by an intent of a `committed` checkpoint, not named by an intent
    /// of the current attempt (those are in flight), and not in `scheduled` (already
    /// queued). `committed` holds `(claimant, checkpoint id)` pairs.
    pub(crate) fn replay(
        &self,
        holdings: &Holdings,
        committed: &BTreeSet<(Claimant, CheckpointId)>,
        scheduled: &HashMap<Tp, RangeSet>,
    ) -> Vec<LedgerRange> {
        let mut excluded: HashMap<Tp, RangeSet> = scheduled.clone();
        for i in &self.intents {
            if *i.by == holdings.me || committed.contains(&((*i.by).clone(), i.checkpoint_id)) {
                for r in &i.ranges {
                    excluded.entry((Arc::from(r.topic.as_str()), r.partition)).or_default().insert(r.first, r.last);
                }
            }
        }
        let empty = RangeSet::default();
        let mut keys: Vec<&Tp> = self.owners.keys().collect();
        keys.sort();
        let mut out = Vec::new();
        for key in keys {
            let mut held = RangeSet::default();
            for (f, l, owner) in self.owners[key].iter() {
                if holdings.holds(owner) {
                    held.insert(f, l);
                }
            }
            for (first, last) in held.minus(excluded.get(key).unwrap_or(&empty)) {
                out.push(LedgerRange { topic: key.0.to_string(), partition: key.1, first, last });
            }
        }
        out
    }

    /// The prefixes, other than `prefix`, whose intents name an offset a claimant of
    /// `prefix` owns: the later holders that replayed its work (its adopter, that
    /// adopter's adopter, ...), or instances whose claim on it lost. A replay plan for
    /// `prefix`'s offsets must know the committed checkpoints of every one of them, or it
    /// replays work a holder already committed.
    pub(crate) fn reclaimers(&self, prefix: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for i in &self.intents {
            if i.by.prefix == prefix || out.contains(&i.by.prefix) {
                continue;
            }
            let names_theirs = i.ranges.iter().any(|r| {
                self.owners
                    .get(&(Arc::from(r.topic.as_str()), r.partition))
                    .is_some_and(|o| o.overlapping(r.first, r.last).any(|(_, _, owner)| owner.prefix == prefix))
            });
            if names_theirs {
                out.insert(i.by.prefix.clone());
            }
        }
        out
    }

    /// The highest checkpoint id any intent of `prefix` named.
    pub(crate) fn highest_checkpoint_id(&self, prefix: &str) -> Option<CheckpointId> {
        self.highest.get(prefix).map(|h| h.1)
    }

    /// The highest generation any intent of `prefix` named.
    pub(crate) fn highest_generation(&self, prefix: &str) -> Option<u32> {
        self.highest.get(prefix).map(|h| h.0)
    }

    /// How many intents the index holds (those with an offset not done).
    pub(crate) fn intent_count(&self) -> usize {
        self.intents.len()
    }

    /// How many ranges the owner map and the done sets hold: the index's size.
    pub(crate) fn range_count(&self) -> usize {
        self.owners.values().map(OffsetRanges::range_count).sum::<usize>()
            + self.done.values().map(RangeSet::range_count).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(first: i64, last: i64) -> LedgerRange {
        LedgerRange { topic: "in".into(), partition: 0, first, last }
    }

    fn c(prefix: &str, generation: u32) -> Claimant {
        Claimant::new(prefix, generation)
    }

    fn t() -> Arc<str> {
        Arc::from("in")
    }

    #[test]
    fn the_first_intent_owns_and_later_ones_never_take_over() {
        let mut ix = ClaimIndex::new();
        ix.apply(&c("a", 1), 5, &[r(0, 9)]);
        ix.apply(&c("b", 1), 3, &[r(5, 14)]);
        ix.apply(&c("a", 1), 6, &[r(0, 20)]); // the owner's own second intent changes nothing
        assert_eq!(ix.owner(&t(), 0, 0), Some(&c("a", 1)));
        assert_eq!(ix.owner(&t(), 0, 9), Some(&c("a", 1)));
        assert_eq!(ix.owner(&t(), 0, 10), Some(&c("b", 1)));
        assert_eq!(ix.owner(&t(), 0, 14), Some(&c("b", 1)));
        assert_eq!(ix.owner(&t(), 0, 15), Some(&c("a", 1)));
        assert_eq!(ix.owner(&t(), 0, 21), None);
        assert_eq!(ix.owner(&t(), 1, 0), None);
        assert_eq!(ix.owner(&Arc::from("other"), 0, 0), None);
    }

    #[test]
    fn holdings_cover_earlier_generations_and_adopted_prefixes_only() {
        let mut h = Holdings::new(c("a", 3));
        h.adopted.insert("x".into());
        // (claimant, held, may reclaim)
        let table = [
            (c("a", 1), true, true),
            (c("a", 2), true, true),
            (c("a", 3), false, true),  // myself: in flight, not held
            (c("a", 4), false, false), // a newer process took my prefix
            (c("x", 1), true, true),
            (c("x", 9), true, true),
            (c("b", 1), false, false),
        ];
        for (claimant, held, may) in table {
            assert_eq!(h.holds(&claimant), held, "{claimant}");
            assert_eq!(h.may_reclaim(&claimant), may, "{claimant}");
        }
    }

    #[test]
    fn an_intent_loses_where_an_unheld_claimant_was_first() {
        let mut ix = ClaimIndex::new();
        ix.apply(&c("b", 1), 1, &[r(10, 19)]); // live instance b
        ix.apply(&c("a", 1), 2, &[r(30, 39)]); // my previous generation
        ix.apply(&c("x", 1), 1, &[r(40, 49)]); // adopted
        ix.apply(&c("a", 3), 7, &[r(50, 59)]); // a newer process of my prefix
        let mine = [r(0, 12), r(30, 45), r(50, 51), r(60, 61)];
        ix.apply(&c("a", 2), 4, &mine);
        let mut h = Holdings::new(c("a", 2));
        h.adopted.insert("x".into());
        // 0..=9 are mine, 10..=12 b's, 30..=45 held, 50..=51 the newer generation's.
        assert_eq!(ix.lost(&h, &mine), vec![r(10, 12), r(50, 51)]);
        // Without adopting x, x's offsets are lost too.
        let h = Holdings::new(c("a", 2));
        assert_eq!(ix.lost(&h, &mine), vec![r(10, 12), r(40, 45), r(50, 51)]);
        // An offset nobody owns yet (the tailer is behind) counts as lost.
        assert_eq!(ix.lost(&h, &[r(100, 101)]), vec![r(100, 101)]);
        assert_eq!(ix.lost(&h, &[r(5, 5), r(99, 100)]), vec![r(99, 100)]);
        let other = LedgerRange { topic: "in".into(), partition: 3, first: 0, last: 0 };
        assert_eq!(ix.lost(&h, std::slice::from_ref(&other)), vec![other]);
    }

    #[test]
    fn replay_is_held_offsets_without_a_committed_intent_minus_work_in_flight() {
        let mut ix = ClaimIndex::new();
        ix.apply(&c("a", 1), 1, &[r(0, 9)]); // committed
        ix.apply(&c("a", 1), 2, &[r(10, 19)]); // never committed
        ix.apply(&c("x", 4), 8, &[r(20, 29)]); // adopted x, never committed
        ix.apply(&c("a", 2), 3, &[r(10, 14)]); // my second generation replayed 10..=14, committed
        ix.apply(&c("b", 1), 1, &[r(30, 39)]); // another live instance
        ix.apply(&c("a", 3), 9, &[r(16, 17), r(40, 44)]); // the current attempt, in flight
        ix.apply(&c("x", 4), 9, &[r(45, 49)]); // a late zombie intent of x
        let committed = BTreeSet::from([(c("a", 1), 1), (c("a", 2), 3)]);
        let mut h = Holdings::new(c("a", 3));
        assert_eq!(ix.replay(&h, &committed, &HashMap::new()), vec![r(15, 15), r(18, 19)]);
        h.adopted.insert("x".into());
        assert_eq!(ix.replay(&h, &committed, &HashMap::new()), vec![r(15, 15), r(18, 29), r(45, 49)]);
        let mut scheduled: HashMap<Tp, RangeSet> = HashMap::new();
        scheduled.entry((t(), 0)).or_default().insert(18, 29);
        assert_eq!(ix.replay(&h, &committed, &scheduled), vec![r(15, 15), r(45, 49)]);
        // x's checkpoint 8 committed after all (its adopter committed it by producer id).
        let committed = BTreeSet::from([(c("a", 1), 1), (c("a", 2), 3), (c("x", 4), 8)]);
        assert_eq!(ix.replay(&h, &committed, &HashMap::new()), vec![r(15, 15), r(18, 19), r(45, 49)]);
        // A zombie (generation 1 while 3 exists) holds nothing of the newer ones.
        let zombie = Holdings::new(c("a", 1));
        assert!(ix.replay(&zombie, &committed, &HashMap::new()).is_empty());
    }

    #[test]
    fn reclaimers_are_every_other_prefix_naming_an_owned_offset() {
        let mut ix = ClaimIndex::new();
        ix.apply(&c("i1", 1), 7, &[r(0, 9)]); // i1 owns 0..=9, dies
        ix.apply(&c("b", 1), 1, &[r(20, 29)]); // b owns 20..=29
        ix.apply(&c("i2", 2), 12, &[r(0, 4)]); // i2 adopted i1 and replays a part
        ix.apply(&c("i4", 1), 30, &[r(5, 9), r(25, 25)]); // i4 adopted i2, replays the rest; a lost claim on b's
        ix.apply(&c("i1", 2), 8, &[r(3, 3)]); // a late zombie intent of i1 itself
        ix.apply(&c("x", 1), 2, &[r(40, 49)]); // unrelated
                                               // (prefix, reclaimers)
        let table: [(&str, &[&str]); 5] = [
            ("i1", &["i2", "i4"]),
            ("b", &["i4"]),
            ("i2", &[]), // i2 owns nothing: its intents all re-claim i1's
            ("x", &[]),
            ("nobody", &[]),
        ];
        for (prefix, want) in table {
            let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
            assert_eq!(ix.reclaimers(prefix), want, "{prefix}");
        }
    }

    #[test]
    fn committed_offsets_are_done_and_leave_the_index() {
        let mut ix = ClaimIndex::new();
        ix.apply(&c("a", 1), 1, &[r(0, 9)]);
        ix.apply(&c("b", 1), 1, &[r(10, 19)]);
        ix.apply(&c("a", 1), 2, &[r(20, 29)]);
        ix.apply(&c("b", 1), 2, &[r(5, 12)]); // a lost claim on a's and a claim of its own
        ix.committed(&c("a", 1), 1);
        // 0..=9 are done: covered, owned by nobody, lost to anyone naming them.
        assert!(ix.covered(&t(), 0, 0) && ix.covered(&t(), 0, 9));
        assert_eq!(ix.owner(&t(), 0, 5), None);
        // (one piece per owner: done, then b's)
        assert_eq!(ix.lost(&Holdings::new(c("a", 2)), &[r(8, 10)]), vec![r(8, 9), r(10, 10)]);
        // a's second generation replays only checkpoint 2, and nothing done.
        assert_eq!(ix.replay(&Holdings::new(c("a", 2)), &BTreeSet::new(), &HashMap::new()), vec![r(20, 29)]);
        assert_eq!(ix.intent_count(), 3);
        ix.committed(&c("b", 1), 1);
        // b's checkpoint 2 names 5..=12, all done now: dropped.
        assert_eq!(ix.intent_count(), 1);
        ix.committed(&c("a", 1), 2);
        assert_eq!(ix.intent_count(), 0);
        assert_eq!(ix.range_count(), 1, "0..=29 is one done range");
        assert!(ix.covered(&t(), 0, 29) && !ix.covered(&t(), 0, 30));
        // A note for a checkpoint with no intents left changes nothing.
        ix.committed(&c("x", 1), 7);
        assert_eq!(ix.range_count(), 1);
        assert_eq!((ix.highest_checkpoint_id("a"), ix.highest_generation("b")), (Some(2), Some(1)));
    }

    #[test]
    fn an_intent_naming_only_done_offsets_owns_nothing_and_is_not_kept() {
        let mut ix = ClaimIndex::new();
        ix.apply(&c("a", 1), 1, &[r(0, 9)]);
        ix.committed(&c("a", 1), 1);
        ix.apply(&c("b", 1), 4, &[r(3, 4)]);
        assert_eq!(ix.intent_count(), 0);
        assert_eq!(ix.owner(&t(), 0, 3), None);
        assert_eq!(ix.lost(&Holdings::new(c("b", 1)), &[r(3, 4)]), vec![r(3, 4)]);
        // Its numbers still count.
        assert_eq!((ix.highest_generation("b"), ix.highest_checkpoint_id("b")), (Some(1), Some(4)));
    }

    #[test]
    fn a_long_run_of_committed_checkpoints_keeps_the_index_small() {
        let mut ix = ClaimIndex::new();
        for checkpoint_id in 1..=10_000u64 {
            let first = (checkpoint_id as i64 - 1) * 50;
            for (k, who) in ["a", "b", "c"].iter().enumerate() {
                ix.apply(
                    &c(who, 1),
                    checkpoint_id,
                    &[LedgerRange { topic: "in".into(), partition: k as i32, first, last: first + 49 }],
                );
            }
            // The checkpoint before this one committed on every instance: two in flight.
            if checkpoint_id > 1 {
                for who in ["a", "b", "c"] {
                    ix.committed(&c(who, 1), checkpoint_id - 1);
                }
            }
        }
        assert_eq!(ix.intent_count(), 3, "only the last checkpoint of each instance is open");
        // Per partition: one done range and one owned range.
        assert_eq!(ix.range_count(), 6);
        assert!(ix.summary(1).open.len() == 3 && ix.summary(1).done.len() == 3);
    }

    /// A small deterministic generator (xorshift), for the summary property below.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Every question the participant asks of the index, over a fixed grid.
    fn answers(ix: &ClaimIndex) -> Vec<String> {
        let mut out = Vec::new();
        let claimants = [c("a", 1), c("a", 2), c("b", 1), c("x", 3)];
        for o in 0..130 {
            out.push(format!("{o}: {:?} {}", ix.owner(&t(), 0, o), ix.covered(&t(), 0, o)));
        }
        for me in &claimants {
            for adopted in [None, Some("x"), Some("b")] {
                let mut h = Holdings::new(me.clone());
                h.adopted.extend(adopted.map(String::from));
                let committed = BTreeSet::from([(c("a", 1), 3), (c("x", 3), 2)]);
                out.push(format!("{me} {adopted:?} lost {:?}", ix.lost(&h, &[r(0, 129)])));
                out.push(format!("{me} {adopted:?} replay {:?}", ix.replay(&h, &committed, &HashMap::new())));
            }
        }
        for p in ["a", "b", "x", "zz"] {
            out.push(format!(
                "{p}: {:?} {:?} {:?}",
                ix.reclaimers(p),
                ix.highest_checkpoint_id(p),
                ix.highest_generation(p)
            ));
        }
        out
    }

    /// The summary is the index: rebuilt from it, an index answers every question the
    /// same way, and goes on answering the same after the same later entries.
    #[test]
    fn an_index_rebuilt_from_its_summary_answers_the_same() {
        let claimants = [c("a", 1), c("a", 2), c("b", 1), c("x", 3)];
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let step = |ix: &mut ClaimIndex, rng: &mut Rng| {
                let who = &claimants[rng.below(4) as usize];
                let checkpoint_id = rng.below(5);
                if rng.below(3) == 0 {
                    ix.committed(who, checkpoint_id);
                } else {
                    let first = rng.below(120) as i64;
                    ix.apply(who, checkpoint_id, &[r(first, first + rng.below(10) as i64)]);
                }
            };
            let mut ix = ClaimIndex::new();
            for _ in 0..rng.below(40) {
                step(&mut ix, &mut rng);
            }
            let mut rebuilt = ClaimIndex::from_summary(&ix.summary(99));
            assert_eq!(answers(&rebuilt), answers(&ix), "seed {seed}");
            let mut later = Rng(seed);
            let mut later2 = Rng(seed);
            for _ in 0..20 {
                step(&mut ix, &mut later);
                step(&mut rebuilt, &mut later2);
            }
            assert_eq!(answers(&rebuilt), answers(&ix), "seed {seed}, after later entries");
        }
    }

    #[test]
    fn highest_checkpoint_id_and_generation_are_per_prefix() {
        let mut ix = ClaimIndex::new();
        assert_eq!((ix.highest_checkpoint_id("a"), ix.highest_generation("a")), (None, None));
        ix.apply(&c("a", 2), 7, &[r(0, 0)]);
        ix.apply(&c("a", 5), 3, &[r(1, 1)]);
        ix.apply(&c("b", 9), 99, &[r(2, 2)]);
        assert_eq!((ix.highest_checkpoint_id("a"), ix.highest_generation("a")), (Some(7), Some(5)));
        assert_eq!(ix.intent_count(), 3);
    }
}
