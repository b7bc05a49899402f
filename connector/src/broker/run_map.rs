//! A map from offsets to states that stores runs of equal state as one entry.
//!
//! This is what keeps a million contiguous LOCKED records at a few bytes: a share
//! partition is a handful of runs, not a slot per record.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Runs covering `[0, end)` with no gaps; equal neighbours are merged after each update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunMap<S> {
    /// first offset -> (last offset inclusive, state)
    runs: BTreeMap<i64, (i64, S)>,
    end: i64,
}

impl<S: Clone + PartialEq> RunMap<S> {
    /// A map covering nothing, starting at offset `start` (offsets below it are absent).
    pub(crate) fn starting_at(start: i64) -> Self {
        Self { runs: BTreeMap::new(), end: start }
    }

    /// One past the last covered offset.
    pub(crate) fn end(&self) -> i64 {
        self.end
    }

    /// Number of stored runs.
    pub(crate) fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Appends `[end, last]` in `state`.
    pub(crate) fn push(&mut self, last: i64, state: S) {
        debug_assert!(last >= self.end);
        let first = self.end;
        self.end = last + 1;
        if let Some((_, (prev_last, prev))) = self.runs.iter_mut().next_back() {
            if *prev == state && *prev_last + 1 == first {
                *prev_last = last;
                return;
            }
        }
        self.runs.insert(first, (last, state));
    }

    /// The run holding `offset`: (first, last, state).
    pub(crate) fn get(&self, offset: i64) -> Option<(i64, i64, &S)> {
        let (&first, (last, state)) = self.runs.range(..=offset).next_back()?;
        (*last >= offset).then_some((first, *last, state))
    }

    /// Runs overlapping `[first, last]`, clipped to it.
    pub(crate) fn overlapping(&self, first: i64, last: i64) -> impl Iterator<Item = (i64, i64, &S)> + '_ {
        let start = self.runs.range(..=first).next_back().map_or(first, |(&s, _)| s);
        self.runs
            .range(start..=last.max(start))
            .filter(move |(_, (l, _))| *l >= first)
            .map(move |(&f, (l, s))| (f.max(first), (*l).min(last), s))
    }

    /// All runs from `from` on, clipped.
    pub(crate) fn from(&self, from: i64) -> impl Iterator<Item = (i64, i64, &S)> + '_ {
        self.overlapping(from, i64::MAX)
    }

    /// All runs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (i64, i64, &S)> + '_ {
        self.runs.iter().map(|(&f, (l, s))| (f, *l, s))
    }

    fn split_at(&mut self, offset: i64) {
        let Some((&first, &(last, _))) = self.runs.range(..offset).next_back() else { return };
        if last >= offset && first < offset {
            let (_, state) = self.runs.get(&first).cloned().expect("run exists");
            if let Some(run) = self.runs.get_mut(&first) {
                run.0 = offset - 1;
            }
            self.runs.insert(offset, (last, state));
        }
    }

    /// Replaces the state of every offset in `[first, last]` by `f(old)`. The range
    /// must be covered (callers check with [`overlapping`](Self::overlapping) first).
    pub(crate) fn update(&mut self, first: i64, last: i64, mut f: impl FnMut(i64, i64, &S) -> S) {
        debug_assert!(first <= last && last < self.end, "update {first}..={last} outside [0, {})", self.end);
        self.split_at(first);
        self.split_at(last + 1);
        for (&start, (end, state)) in self.runs.range_mut(first..=last) {
            *state = f(start, *end, state);
        }
        self.coalesce(first, last);
    }

    /// Merges equal neighbours in and around `[first, last]`.
    fn coalesce(&mut self, first: i64, last: i64) {
        let from = self.runs.range(..first).next_back().map_or(first, |(&s, _)| s);
        let keys: Vec<i64> = self.runs.range(from..=last.saturating_add(1)).map(|(&k, _)| k).collect();
        let mut current: Option<i64> = None;
        for key in keys {
            if let Some(cur) = current {
                let (cur_last, cur_state) = self.runs[&cur].clone();
                let (next_last, next_state) = &self.runs[&key];
                if cur_last + 1 == key && cur_state == *next_state {
                    let next_last = *next_last;
                    self.runs.remove(&key);
                    if let Some(run) = self.runs.get_mut(&cur) {
                        run.0 = next_last;
                    }
                    continue;
                }
            }
            current = Some(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(m: &RunMap<char>) -> Vec<(i64, i64, char)> {
        m.iter().map(|(f, l, s)| (f, l, *s)).collect()
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
}
