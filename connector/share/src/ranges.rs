//! Disjoint inclusive offset ranges with a value each, equal neighbours merged.
//!
//! The one implementation behind the acknowledgement ranges of a request
//! ([`AckRanges`](crate::AckRanges)), the record-state runs of the embedded
//! broker's share partitions, and the offset sets of the Kafka acknowledgement ledger.
//! Cost follows the number of ranges, never the number of offsets: a million contiguous
//! offsets with one value are one entry, and adding at either end of a range is
//! O(log n).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Disjoint inclusive ranges `first -> (last, value)`.
///
/// Invariants, kept by every method: ranges never overlap, and two ranges that touch
/// (`last + 1 == next first`) have different values. So the ranges are exactly the
/// maximal runs of offsets holding the same value.
///
/// Serializes exactly like the `BTreeMap<i64, (i64, V)>` it wraps (`serde(transparent)`):
/// the embedded broker's journal and snapshots hold it, so its format must not change.
/// Deserializing does not check the invariants; the journal's checksums guard its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OffsetRanges<V> {
    /// first offset -> (last offset inclusive, value)
    map: BTreeMap<i64, (i64, V)>,
}

impl<V> Default for OffsetRanges<V> {
    fn default() -> Self {
        Self { map: BTreeMap::new() }
    }
}

/// [`OffsetRanges::insert`] refused a range: these offsets are already present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    /// First offset present in both, inclusive.
    pub first: i64,
    /// Last offset present in both, inclusive.
    pub last: i64,
}

impl<V> OffsetRanges<V> {
    /// No ranges.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of stored ranges.
    pub fn range_count(&self) -> usize {
        self.map.len()
    }

    /// Number of offsets covered, saturating at `u64::MAX` (only the whole `i64` domain
    /// has more).
    pub fn offset_count(&self) -> u64 {
        self.map.iter().fold(0u64, |n, (&first, &(last, _))| n.saturating_add(last.abs_diff(first).saturating_add(1)))
    }

    /// True when no offset is covered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The range holding `offset`: `(first, last, value)`.
    pub fn get(&self, offset: i64) -> Option<(i64, i64, &V)> {
        let (&first, (last, value)) = self.map.range(..=offset).next_back()?;
        (*last >= offset).then_some((first, *last, value))
    }

    /// All ranges in offset order: `(first, last, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (i64, i64, &V)> + '_ {
        self.map.iter().map(|(&first, (last, value))| (first, *last, value))
    }

    /// The ranges overlapping `first..=last`, clipped to it, in offset order. Nothing
    /// when `first > last`.
    pub fn overlapping(&self, first: i64, last: i64) -> impl Iterator<Item = (i64, i64, &V)> + '_ {
        // Start at the range holding `first`, if any; later ones start inside the span.
        let start = (first <= last).then(|| self.map.range(..=first).next_back().map_or(first, |(&s, _)| s));
        start
            .into_iter()
            .flat_map(move |start| self.map.range(start..=last))
            .filter(move |(_, (l, _))| *l >= first)
            .map(move |(&f, (l, value))| (f.max(first), (*l).min(last), value))
    }
}

impl<V: Clone + PartialEq> OffsetRanges<V> {
    /// Adds `first..=last` holding `value`, merging with equal neighbours. Refuses, and
    /// changes nothing, when an offset of the span is already present: the error is the
    /// part of the span inside the highest present range it overlaps. An empty span
    /// (`first > last`) adds nothing.
    pub fn insert(&mut self, first: i64, last: i64, value: V) -> Result<(), Overlap> {
        if first > last {
            return Ok(());
        }
        if let Some((&start, &(end, _))) = self.map.range(..=last).next_back() {
            // Every range starting at or before `last` ends before this one starts, so
            // when this one misses the span all of them do.
            if end >= first {
                return Err(Overlap { first: first.max(start), last: last.min(end) });
            }
        }
        self.put_merged(first, last, value);
        Ok(())
    }

    /// Sets every offset of `first..=last` to `value`, present or not: ranges are cut at
    /// the span's ends, what lies inside is replaced, and equal neighbours merge. An
    /// empty span changes nothing.
    pub fn assign(&mut self, first: i64, last: i64, value: V) {
        if first > last {
            return;
        }
        self.split_at(first);
        if let Some(after) = last.checked_add(1) {
            self.split_at(after);
        }
        while let Some((&start, _)) = self.map.range(first..=last).next() {
            self.map.remove(&start);
        }
        self.put_merged(first, last, value);
    }

    /// Replaces the value of every present offset of `first..=last` by
    /// `f(piece_first, piece_last, old)`, called once per present piece of the span (the
    /// ranges clipped to it), in offset order. Offsets that are absent stay absent.
    /// Equal neighbours merge afterwards.
    pub fn update(&mut self, first: i64, last: i64, mut f: impl FnMut(i64, i64, &V) -> V) {
        if first > last {
            return;
        }
        self.split_at(first);
        if let Some(after) = last.checked_add(1) {
            self.split_at(after);
        }
        for (&start, (end, value)) in self.map.range_mut(first..=last) {
            *value = f(start, *end, value);
        }
        self.coalesce(first, last);
    }

    /// The offsets of `self` that `other` does not cover, with their values from `self`.
    pub fn minus<W>(&self, other: &OffsetRanges<W>) -> OffsetRanges<V> {
        let mut out = OffsetRanges::new();
        for (first, last, value) in self.iter() {
            // The next offset of first..=last not yet known to be covered by `other`;
            // None once past `last` (or past i64::MAX).
            let mut next = Some(first);
            for (of, ol, _) in other.overlapping(first, last) {
                let Some(start) = next else { break };
                if of > start {
                    out.put_merged(start, of - 1, value.clone());
                }
                next = ol.checked_add(1);
            }
            if let Some(start) = next.filter(|&s| s <= last) {
                out.put_merged(start, last, value.clone());
            }
        }
        out
    }

    /// Cuts the range holding `offset` into `..offset - 1` and `offset..`, unless it
    /// starts at `offset` (or no range holds it).
    fn split_at(&mut self, offset: i64) {
        let Some((&first, (last, value))) = self.map.range_mut(..offset).next_back() else { return };
        if *last >= offset {
            // first < offset, so offset - 1 does not overflow.
            let tail = (*last, value.clone());
            *last = offset - 1;
            debug_assert!(first < offset);
            self.map.insert(offset, tail);
        }
    }

    /// Stores `first..=last` (no offset of which is present), merging it with an equal
    /// range ending at `first - 1` and one starting at `last + 1`. O(log n).
    fn put_merged(&mut self, first: i64, last: i64, value: V) {
        debug_assert!(first <= last);
        debug_assert!(self.overlapping(first, last).next().is_none(), "{first}..={last} is present");
        let right = last.checked_add(1).and_then(|after| match self.map.get(&after) {
            Some((end, v)) if *v == value => Some((after, *end)),
            _ => None,
        });
        let last = match right {
            Some((after, end)) => {
                self.map.remove(&after);
                end
            }
            None => last,
        };
        if let Some((_, (end, v))) = self.map.range_mut(..first).next_back() {
            // `end < first` (nothing is present in the span), so `end + 1` fits.
            if *end + 1 == first && *v == value {
                *end = last;
                return;
            }
        }
        self.map.insert(first, (last, value));
    }

    /// Merges equal touching neighbours among the ranges from the one before `first`
    /// through the one starting at `last + 1`. O(k log n) for k ranges in that window.
    fn coalesce(&mut self, first: i64, last: i64) {
        let stop = last.saturating_add(1);
        let mut current =
            self.map.range(..first).next_back().or_else(|| self.map.range(first..).next()).map(|(&s, _)| s);
        while let Some(cur) = current {
            let Some(&(cur_last, ref cur_value)) = self.map.get(&cur) else { return };
            let Some(next_first) = cur_last.checked_add(1) else { return };
            let Some((&next, &(next_last, ref next_value))) = self.map.range(next_first..).next() else { return };
            if next > stop {
                return;
            }
            if next == next_first && cur_value == next_value {
                self.map.remove(&next);
                if let Some((end, _)) = self.map.get_mut(&cur) {
                    *end = next_last;
                }
            } else {
                current = Some(next);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ranges<V: Clone>(r: &OffsetRanges<V>) -> Vec<(i64, i64, V)> {
        r.iter().map(|(f, l, v)| (f, l, v.clone())).collect()
    }

    fn of(list: &[(i64, i64, char)]) -> OffsetRanges<char> {
        let mut r = OffsetRanges::new();
        for &(f, l, v) in list {
            r.insert(f, l, v).unwrap();
        }
        r
    }

    #[test]
    fn insert_merges_equal_neighbours_on_both_sides_only() {
        let mut r = of(&[(0, 4, 'a'), (10, 14, 'a')]);
        r.insert(5, 9, 'a').unwrap();
        assert_eq!(ranges(&r), vec![(0, 14, 'a')]);
        r.insert(15, 15, 'b').unwrap();
        r.insert(17, 20, 'b').unwrap();
        r.insert(16, 16, 'c').unwrap();
        assert_eq!(ranges(&r), vec![(0, 14, 'a'), (15, 15, 'b'), (16, 16, 'c'), (17, 20, 'b')]);
        // A gap between equal values is not bridged.
        r.insert(30, 30, 'b').unwrap();
        assert_eq!(r.range_count(), 5);
        assert_eq!(r.offset_count(), 15 + 1 + 1 + 4 + 1);
    }

    #[test]
    fn insert_refuses_overlap_naming_the_shared_offsets_and_changes_nothing() {
        let mut r = of(&[(10, 20, 'a'), (30, 40, 'b')]);
        let before = r.clone();
        assert_eq!(r.insert(15, 25, 'a'), Err(Overlap { first: 15, last: 20 }));
        assert_eq!(r.insert(0, 10, 'a'), Err(Overlap { first: 10, last: 10 }));
        // Overlapping both: the higher range is named.
        assert_eq!(r.insert(12, 35, 'c'), Err(Overlap { first: 30, last: 35 }));
        // Inside one range.
        assert_eq!(r.insert(32, 33, 'b'), Err(Overlap { first: 32, last: 33 }));
        assert_eq!(r, before);
        // Touching but not overlapping is fine.
        r.insert(21, 29, 'c').unwrap();
        assert_eq!(ranges(&r), vec![(10, 20, 'a'), (21, 29, 'c'), (30, 40, 'b')]);
    }

    #[test]
    fn empty_spans_change_nothing() {
        let mut r = of(&[(0, 9, 'a')]);
        let before = r.clone();
        assert_eq!(r.insert(5, 4, 'b'), Ok(()));
        r.assign(5, 4, 'b');
        r.update(5, 4, |_, _, _| 'b');
        assert_eq!(r, before);
        assert_eq!(r.overlapping(5, 4).count(), 0);
    }

    #[test]
    fn assign_splits_replaces_and_recoalesces() {
        let mut r = of(&[(0, 99, 'a')]);
        r.assign(10, 19, 'b');
        assert_eq!(ranges(&r), vec![(0, 9, 'a'), (10, 19, 'b'), (20, 99, 'a')]);
        r.assign(10, 19, 'a');
        assert_eq!(ranges(&r), vec![(0, 99, 'a')]);
        // Across a gap and several ranges: the gap is filled.
        let mut r = of(&[(0, 4, 'a'), (8, 9, 'b'), (12, 20, 'c')]);
        r.assign(3, 14, 'd');
        assert_eq!(ranges(&r), vec![(0, 2, 'a'), (3, 14, 'd'), (15, 20, 'c')]);
        r.assign(-5, 25, 'c');
        assert_eq!(ranges(&r), vec![(-5, 25, 'c')]);
    }

    #[test]
    fn update_touches_present_pieces_only_and_recoalesces() {
        let mut r = of(&[(0, 4, 'a'), (5, 9, 'b'), (20, 29, 'a')]);
        let mut seen = Vec::new();
        r.update(3, 24, |f, l, v| {
            seen.push((f, l, *v));
            'a'
        });
        // Pieces clipped to 3..=24; the gap 10..=19 is not visited and stays absent.
        assert_eq!(seen, vec![(3, 4, 'a'), (5, 9, 'b'), (20, 24, 'a')]);
        assert_eq!(ranges(&r), vec![(0, 9, 'a'), (20, 29, 'a')]);
        r.update(5, 5, |_, _, _| 'x');
        assert_eq!(ranges(&r), vec![(0, 4, 'a'), (5, 5, 'x'), (6, 9, 'a'), (20, 29, 'a')]);
        r.update(0, 100, |_, _, _| 'y');
        assert_eq!(ranges(&r), vec![(0, 9, 'y'), (20, 29, 'y')]);
    }

    #[test]
    fn get_and_overlapping_clip_to_the_span() {
        let r = of(&[(0, 9, 'a'), (10, 19, 'b'), (30, 39, 'c')]);
        assert_eq!(r.get(9), Some((0, 9, &'a')));
        assert_eq!(r.get(10), Some((10, 19, &'b')));
        assert_eq!(r.get(25), None);
        assert_eq!(r.get(-1), None);
        let got: Vec<_> = r.overlapping(5, 32).map(|(f, l, v)| (f, l, *v)).collect();
        assert_eq!(got, vec![(5, 9, 'a'), (10, 19, 'b'), (30, 32, 'c')]);
        assert_eq!(r.overlapping(20, 29).count(), 0);
        assert_eq!(r.overlapping(39, i64::MAX).map(|(f, l, v)| (f, l, *v)).collect::<Vec<_>>(), vec![(39, 39, 'c')]);
    }

    #[test]
    fn minus_keeps_values_and_handles_every_overlap_shape() {
        let a = of(&[(0, 9, 'a'), (10, 19, 'b'), (30, 49, 'c')]);
        let mut b: OffsetRanges<()> = OffsetRanges::new();
        b.insert(2, 3, ()).unwrap(); // inside
        b.insert(8, 12, ()).unwrap(); // across a boundary of two values
        b.insert(25, 31, ()).unwrap(); // over a start
        b.insert(45, 60, ()).unwrap(); // over an end
        let got = ranges(&a.minus(&b));
        assert_eq!(got, vec![(0, 1, 'a'), (4, 7, 'a'), (13, 19, 'b'), (32, 44, 'c')]);
        assert_eq!(ranges(&a.minus(&OffsetRanges::<()>::new())), ranges(&a));
        assert!(OffsetRanges::<char>::new().minus(&a).is_empty());
        assert!(a.minus(&a).is_empty());
    }

    #[test]
    fn the_ends_of_i64_do_not_overflow() {
        let (min, max) = (i64::MIN, i64::MAX);
        let mut r = OffsetRanges::new();
        r.insert(max - 1, max, 'a').unwrap();
        r.insert(max - 3, max - 2, 'a').unwrap();
        assert_eq!(ranges(&r), vec![(max - 3, max, 'a')]);
        assert_eq!(r.insert(max, max, 'a'), Err(Overlap { first: max, last: max }));
        r.insert(min, min, 'a').unwrap();
        r.insert(min + 1, min + 1, 'a').unwrap();
        assert_eq!(ranges(&r), vec![(min, min + 1, 'a'), (max - 3, max, 'a')]);
        r.assign(max, max, 'b');
        r.assign(min, min, 'b');
        assert_eq!(
            ranges(&r),
            vec![(min, min, 'b'), (min + 1, min + 1, 'a'), (max - 3, max - 1, 'a'), (max, max, 'b')]
        );
        r.update(max - 1, max, |_, _, _| 'a');
        r.update(min, min + 1, |_, _, _| 'a');
        assert_eq!(ranges(&r), vec![(min, min + 1, 'a'), (max - 3, max, 'a')]);
        let mut full: OffsetRanges<()> = OffsetRanges::new();
        full.assign(min, max, ());
        assert_eq!(full.offset_count(), u64::MAX, "2^64 offsets saturate");
        assert!(r.minus(&full).is_empty());
        assert_eq!(ranges(&full.minus(&r)), vec![(min + 2, max - 4, ())]);
        assert_eq!(full.overlapping(max, max).count(), 1);
    }

    #[test]
    fn a_million_contiguous_inserts_and_assigns_stay_one_range() {
        let mut r = OffsetRanges::new();
        let mut s = OffsetRanges::new();
        for o in 0..1_000_000 {
            r.insert(o, o, 'a').unwrap();
            s.assign(o, o, ());
        }
        assert_eq!(ranges(&r), vec![(0, 999_999, 'a')]);
        assert_eq!(ranges(&s), vec![(0, 999_999, ())]);
        assert_eq!(r.offset_count(), 1_000_000);
    }

    #[test]
    fn serializes_exactly_like_the_map_it_wraps() {
        #[derive(Serialize)]
        struct Old {
            ranges: BTreeMap<i64, (i64, char)>,
            n: u64,
        }
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct New {
            ranges: OffsetRanges<char>,
            n: u64,
        }
        let old = Old { ranges: BTreeMap::from([(-3, (7, 'a')), (9, (9, 'b')), (100, (i64::MAX, 'a'))]), n: 42 };
        let new = New { ranges: of(&[(-3, 7, 'a'), (9, 9, 'b'), (100, i64::MAX, 'a')]), n: 42 };
        let old_bytes = postcard::to_allocvec(&old).unwrap();
        assert_eq!(postcard::to_allocvec(&new).unwrap(), old_bytes);
        assert_eq!(postcard::from_bytes::<New>(&old_bytes).unwrap(), new);
    }

    /// One step of the property test, on structure `a` or `b`.
    #[derive(Debug, Clone)]
    enum Op {
        Insert { on_b: bool, first: i64, last: i64, value: u8 },
        Assign { on_b: bool, first: i64, last: i64, value: u8 },
        Update { on_b: bool, first: i64, last: i64, add: u8 },
    }

    /// Offsets the model covers: `base..=base + (WIDTH - 1)`.
    const WIDTH: i64 = 24;

    fn op() -> impl Strategy<Value = Op> {
        let span = (any::<bool>(), 0..WIDTH, 0..WIDTH, 0u8..3);
        prop_oneof![
            span.clone().prop_map(|(on_b, f, l, value)| Op::Insert { on_b, first: f, last: l, value }),
            span.clone().prop_map(|(on_b, f, l, value)| Op::Assign { on_b, first: f, last: l, value }),
            span.prop_map(|(on_b, f, l, add)| Op::Update { on_b, first: f, last: l, add }),
        ]
    }

    type Model = BTreeMap<i64, u8>;

    /// The maximal runs of consecutive offsets holding one value.
    fn runs(model: &Model) -> Vec<(i64, i64, u8)> {
        let mut out: Vec<(i64, i64, u8)> = Vec::new();
        for (&o, &v) in model {
            match out.last_mut() {
                Some((_, l, lv)) if *l + 1 == o && *lv == v => *l = o,
                _ => out.push((o, o, v)),
            }
        }
        out
    }

    /// What `insert` must refuse: the part of the span inside the highest run it meets.
    fn model_overlap(model: &Model, first: i64, last: i64) -> Option<Overlap> {
        let (&high, &v) = model.range(first..=last).next_back()?;
        let mut low = high;
        while low > first && model.get(&(low - 1)) == Some(&v) {
            low -= 1;
        }
        Some(Overlap { first: low, last: high })
    }

    fn apply(op: &Op, base: i64, sets: &mut [OffsetRanges<u8>; 2], models: &mut [Model; 2]) {
        let (on_b, first, last) = match *op {
            Op::Insert { on_b, first, last, .. }
            | Op::Assign { on_b, first, last, .. }
            | Op::Update { on_b, first, last, .. } => (on_b, base + first, base + last),
        };
        let (set, model) = (&mut sets[usize::from(on_b)], &mut models[usize::from(on_b)]);
        match *op {
            Op::Insert { value, .. } => {
                let expected =
                    if first > last { Ok(()) } else { model_overlap(model, first, last).map_or(Ok(()), Err) };
                assert_eq!(set.insert(first, last, value), expected, "{op:?}");
                if expected.is_ok() && first <= last {
                    model.extend((first..=last).map(|o| (o, value)));
                }
            }
            Op::Assign { value, .. } => {
                set.assign(first, last, value);
                if first <= last {
                    model.extend((first..=last).map(|o| (o, value)));
                }
            }
            Op::Update { add, .. } => {
                set.update(first, last, |_, _, v| (v + add) % 3);
                if first <= last {
                    for v in model.range_mut(first..=last).map(|(_, v)| v) {
                        *v = (*v + add) % 3;
                    }
                }
            }
        }
    }

    fn check(base: i64, sets: &[OffsetRanges<u8>; 2], models: &[Model; 2], probe: (i64, i64)) {
        for (set, model) in sets.iter().zip(models) {
            assert_eq!(ranges(set), runs(model));
            assert_eq!(set.range_count(), runs(model).len());
            assert_eq!(set.offset_count(), model.len() as u64);
            for o in base..=base + (WIDTH - 1) {
                assert_eq!(set.get(o).map(|(_, _, v)| *v), model.get(&o).copied(), "offset {o}");
            }
            let (pf, pl) = (base + probe.0, base + probe.1);
            let clipped: Vec<_> = set.overlapping(pf, pl).map(|(f, l, v)| (f, l, *v)).collect();
            let expected: Model =
                if pf <= pl { model.range(pf..=pl).map(|(&o, &v)| (o, v)).collect() } else { Model::new() };
            assert_eq!(clipped, runs(&expected), "overlapping({pf}, {pl})");
        }
        let difference: Model =
            models[0].iter().filter(|(o, _)| !models[1].contains_key(o)).map(|(&o, &v)| (o, v)).collect();
        assert_eq!(ranges(&sets[0].minus(&sets[1])), runs(&difference));
    }

    proptest! {
        #[test]
        fn agrees_with_a_map_per_offset(
            base in prop_oneof![Just(i64::MIN), Just(-10i64), Just(i64::MAX - (WIDTH - 1))],
            ops in proptest::collection::vec((op(), 0..WIDTH, 0..WIDTH), 1..60),
        ) {
            let mut sets = [OffsetRanges::new(), OffsetRanges::new()];
            let mut models = [Model::new(), Model::new()];
            for (op, pf, pl) in &ops {
                apply(op, base, &mut sets, &mut models);
                check(base, &sets, &models, (*pf, *pl));
            }
        }
    }
}
