//! A map from offsets to states that stores runs of equal state as one entry.
//!
//! This is what keeps a million contiguous LOCKED records at a few bytes: a share
//! partition is a handful of runs, not a slot per record.

use serde::{Deserialize, Serialize};

use shareflow_share::ranges::OffsetRanges;

/// Runs covering `[0, end)` with no gaps; equal neighbours are merged after each update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunMap<S> {
    /// first offset -> (last offset inclusive, state); serialized as that map.
    runs: OffsetRanges<S>,
    end: i64,
}

impl<S: Clone + PartialEq> RunMap<S> {
    /// A map covering nothing, starting at offset `start` (offsets below it are absent).
    pub(crate) fn starting_at(start: i64) -> Self {
        Self { runs: OffsetRanges::new(), end: start }
    }

    /// One past the last covered offset.
    pub(crate) fn end(&self) -> i64 {
        self.end
    }

    /// Forgets every offset below `start`: the map then starts there (and ends there,
    /// if it ended below).
    pub(crate) fn trim_front(&mut self, start: i64) {
        if self.end <= start {
            *self = Self::starting_at(start);
            return;
        }
        let mut kept = OffsetRanges::new();
        for (f, l, s) in self.runs.overlapping(start, self.end - 1) {
            kept.assign(f.max(start), l, s.clone());
        }
        self.runs = kept;
    }

    /// Number of stored runs.
    pub(crate) fn run_count(&self) -> usize {
        self.runs.range_count()
    }

    /// Appends `[end, last]` in `state`, merging it into an equal last run.
    pub(crate) fn push(&mut self, last: i64, state: S) {
        debug_assert!(last >= self.end);
        let first = self.end;
        self.end = last.saturating_add(1);
        // Nothing is stored from `first` on, so this only appends (O(log n)).
        self.runs.assign(first, last, state);
    }

    /// The run holding `offset`: (first, last, state).
    pub(crate) fn get(&self, offset: i64) -> Option<(i64, i64, &S)> {
        self.runs.get(offset)
    }

    /// Runs overlapping `[first, last]`, clipped to it.
    pub(crate) fn overlapping(&self, first: i64, last: i64) -> impl Iterator<Item = (i64, i64, &S)> + '_ {
        self.runs.overlapping(first, last)
    }

    /// All runs from `from` on, clipped.
    pub(crate) fn from(&self, from: i64) -> impl Iterator<Item = (i64, i64, &S)> + '_ {
        self.overlapping(from, i64::MAX)
    }

    /// All runs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i64, i64, &S)> + '_ {
        self.runs.iter()
    }

    /// Replaces the state of every offset in `[first, last]` by `f(old)`. The range
    /// must be covered (callers check with [`overlapping`](Self::overlapping) first).
    pub(crate) fn update(&mut self, first: i64, last: i64, f: impl FnMut(i64, i64, &S) -> S) {
        debug_assert!(first <= last && last < self.end, "update {first}..={last} outside [0, {})", self.end);
        self.runs.update(first, last, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(m: &RunMap<char>) -> Vec<(i64, i64, char)> {
        m.iter().map(|(f, l, s)| (f, l, *s)).collect()
    }

    #[test]
    fn trim_front_forgets_what_is_below_and_clips_the_run_across() {
        let mut m = RunMap::starting_at(0);
        m.push(4, 'a');
        m.push(9, 'b');
        m.trim_front(2);
        assert_eq!(runs(&m), vec![(2, 4, 'a'), (5, 9, 'b')]);
        m.trim_front(5);
        assert_eq!(runs(&m), vec![(5, 9, 'b')]);
        m.trim_front(20);
        assert_eq!((runs(&m), m.end()), (vec![], 20));
        m.push(21, 'c');
        assert_eq!(runs(&m), vec![(20, 21, 'c')]);
        m.trim_front(3); // below the start: nothing changes
        assert_eq!(runs(&m), vec![(20, 21, 'c')]);
    }

    #[test]
    fn push_merges_equal_tail() {
        let mut m = RunMap::starting_at(0);
        m.push(4, 'a');
        m.push(9, 'a');
        m.push(10, 'b');
        assert_eq!(runs(&m), vec![(0, 9, 'a'), (10, 10, 'b')]);
        assert_eq!(m.end(), 11);
    }

    #[test]
    fn update_splits_and_remerges() {
        let mut m = RunMap::starting_at(0);
        m.push(99, 'a');
        m.update(10, 19, |_, _, _| 'b');
        assert_eq!(runs(&m), vec![(0, 9, 'a'), (10, 19, 'b'), (20, 99, 'a')]);
        m.update(10, 19, |_, _, _| 'a');
        assert_eq!(runs(&m), vec![(0, 99, 'a')]);
        assert_eq!(m.get(50), Some((0, 99, &'a')));
        assert_eq!(m.get(100), None);
    }

    #[test]
    fn overlapping_clips() {
        let mut m = RunMap::starting_at(0);
        m.push(9, 'a');
        m.push(19, 'b');
        let got: Vec<_> = m.overlapping(5, 12).map(|(f, l, s)| (f, l, *s)).collect();
        assert_eq!(got, vec![(5, 9, 'a'), (10, 12, 'b')]);
    }

    #[test]
    fn the_serialized_form_is_still_the_plain_map() {
        use std::collections::BTreeMap;
        // The journal and snapshot format before the shared range type.
        #[derive(Serialize)]
        struct Old {
            runs: BTreeMap<i64, (i64, char)>,
            end: i64,
        }
        let mut m = RunMap::starting_at(5);
        m.push(9, 'a');
        m.push(12, 'b');
        m.update(7, 7, |_, _, _| 'c');
        let old = Old { runs: BTreeMap::from([(5, (6, 'a')), (7, (7, 'c')), (8, (9, 'a')), (10, (12, 'b'))]), end: 13 };
        let old_bytes = postcard::to_allocvec(&old).unwrap();
        assert_eq!(postcard::to_allocvec(&m).unwrap(), old_bytes);
        assert_eq!(postcard::from_bytes::<RunMap<char>>(&old_bytes).unwrap(), m);
    }

    #[test]
    fn a_million_contiguous_pushes_are_one_run() {
        let mut m = RunMap::starting_at(0);
        for o in 0..1_000_000 {
            m.push(o, 'a');
        }
        assert_eq!(runs(&m), vec![(0, 999_999, 'a')]);
        assert_eq!(m.end(), 1_000_000);
    }
}
