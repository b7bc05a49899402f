//! The groups of the stateful SQL operator and their accumulators: one group per key
//! and window (per key and session, or per key without a window), each aggregate held
//! by one DataFusion `GroupsAccumulator` over all groups.
//!
//! A checkpoint takes the accumulators' state (`state(EmitTo::All)` empties them),
//! evaluates the groups it emits from a copy merged into fresh accumulators, merges
//! the groups it keeps back, and returns the kept groups' state rows for the snapshot.
//! Sessions that merged are folded then: until a checkpoint a merged session keeps
//! its rows in its own group, and `parent` points it at the session it joined.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, UInt16Array, UInt32Array};
use arrow::compute::take;
use arrow::row::{Row, RowConverter, Rows, SortField};
use datafusion_expr::{EmitTo, GroupsAccumulator};
use hashbrown::HashTable;

use super::window::{sessions_touched, Session};
use crate::partition::key_group_of;

type DfResult<T> = datafusion_common::Result<T>;

/// Makes a fresh, empty accumulator of each aggregate, in order.
pub(crate) type NewAccumulators = Arc<dyn Fn() -> DfResult<Vec<Box<dyn GroupsAccumulator>>> + Send + Sync>;

/// Groups and their accumulators.
pub(crate) struct Store {
    fields: Vec<SortField>,
    converter: RowConverter,
    keys: Rows,
    /// (key, window start) -> group; sessions: key -> index into `sessions`.
    table: HashTable<u32>,
    /// Per group: the hash of its key columns, the table hash, window bounds, parent
    /// (itself for a root) and whether it changed since the last checkpoint.
    key_hash: Vec<u64>,
    start: Vec<i64>,
    end: Vec<i64>,
    parent: Vec<u32>,
    changed: Vec<bool>,
    /// Sessions mode: per key, the key's first group (for its row) and its open roots.
    sessions: Option<Vec<(u32, Vec<u32>)>>,
    accs: Vec<Box<dyn GroupsAccumulator>>,
    new_accs: NewAccumulators,
}

/// Groups a checkpoint emitted: their key columns, bounds and aggregate values.
pub(crate) struct Emitted {
    pub(crate) keys: Vec<ArrayRef>,
    pub(crate) start: Vec<i64>,
    pub(crate) values: Vec<ArrayRef>,
}

/// The state rows a checkpoint keeps: key group, bounds, key columns, and each
/// aggregate's state columns. Several rows may belong to one group (a merged session).
pub(crate) struct Kept {
    pub(crate) key_group: UInt16Array,
    pub(crate) start: Int64Array,
    pub(crate) end: Int64Array,
    pub(crate) keys: Vec<ArrayRef>,
    pub(crate) states: Vec<Vec<ArrayRef>>,
}

fn table_hash(key_hash: u64, start: i64) -> u64 {
    key_hash ^ (start as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
}

fn take_all(arrays: &[ArrayRef], rows: &UInt32Array) -> DfResult<Vec<ArrayRef>> {
    arrays.iter().map(|a| take(a.as_ref(), rows, None).map_err(Into::into)).collect()
}

impl Store {
    /// An empty store for keys of `key_fields` (their sort fields); `sessions` for
    /// session windows.
    pub(crate) fn new(key_fields: Vec<SortField>, sessions: bool, new_accs: NewAccumulators) -> DfResult<Self> {
        let converter = RowConverter::new(key_fields.clone())?;
        let keys = converter.empty_rows(0, 0);
        Ok(Self {
            fields: key_fields,
            converter,
            keys,
            table: HashTable::new(),
            key_hash: Vec::new(),
            start: Vec::new(),
            end: Vec::new(),
            parent: Vec::new(),
            changed: Vec::new(),
            sessions: sessions.then(Vec::new),
            accs: new_accs()?,
            new_accs,
        })
    }

    /// Groups held.
    pub(crate) fn len(&self) -> usize {
        self.start.len()
    }

    /// The key rows of `columns`.
    pub(crate) fn rows(&self, columns: &[ArrayRef]) -> DfResult<Rows> {
        Ok(self.converter.convert_columns(columns)?)
    }

    /// Bytes held, about.
    pub(crate) fn size(&self) -> usize {
        self.keys.size()
            + self.table.capacity() * 4
            + self.len() * (8 * 3 + 4 + 1)
            + self.accs.iter().map(|a| a.size()).sum::<usize>()
            + self.sessions.as_ref().map_or(0, |s| s.len() * 40)
    }

    fn push_group(&mut self, row: Row<'_>, key_hash: u64, start: i64, end: i64) -> u32 {
        let g = self.len() as u32;
        self.keys.push(row);
        self.key_hash.push(key_hash);
        self.start.push(start);
        self.end.push(end);
        self.parent.push(g);
        self.changed.push(true);
        g
    }

    /// The group of `row` in the window starting at `start` (ending at `end`), made if
    /// new. Not for sessions.
    pub(crate) fn window_group(&mut self, row: Row<'_>, key_hash: u64, start: i64, end: i64) -> u32 {
        let h = table_hash(key_hash, start);
        let (keys, starts) = (&self.keys, &self.start);
        if let Some(g) = self.table.find(h, |&g| starts[g as usize] == start && keys.row(g as usize) == row) {
            let g = *g;
            self.changed[g as usize] = true;
            return g;
        }
        let g = self.push_group(row, key_hash, start, end);
        let (key_hash, starts) = (&self.key_hash, &self.start);
        self.table.insert_unique(h, g, |&x| table_hash(key_hash[x as usize], starts[x as usize]));
        g
    }

    /// The index into `sessions` of the key of `row`, made if new (with `first` as the
    /// group that stands for the key's row).
    fn session_list(&mut self, row: Row<'_>, key_hash: u64, first: impl FnOnce(&mut Self) -> u32) -> usize {
        let h = table_hash(key_hash, 0);
        let sessions = self.sessions.as_ref().map_or(&[][..], Vec::as_slice);
        let keys = &self.keys;
        if let Some(i) = self.table.find(h, |&i| keys.row(sessions[i as usize].0 as usize) == row) {
            return *i as usize;
        }
        let g = first(self);
        let sessions = self.sessions.get_or_insert_with(Vec::new);
        sessions.push((g, Vec::new()));
        let i = (sessions.len() - 1) as u32;
        let (key_hash, sessions) = (&self.key_hash, self.sessions.as_ref().map_or(&[][..], Vec::as_slice));
        self.table.insert_unique(h, i, |&x| table_hash(key_hash[sessions[x as usize].0 as usize], 0));
        i as usize
    }

    fn find(&mut self, g: u32) -> u32 {
        let mut root = g;
        while self.parent[root as usize] != root {
            root = self.parent[root as usize];
        }
        let mut at = g;
        while self.parent[at as usize] != root {
            let next = self.parent[at as usize];
            self.parent[at as usize] = root;
            at = next;
        }
        root
    }

    /// The session group of `row` at event time `t` with `gap`: joins, grows or merges
    /// the key's open sessions ([`sessions_touched`]).
    pub(crate) fn session_group(&mut self, row: Row<'_>, key_hash: u64, t: i64, gap: i64) -> u32 {
        let end = t.saturating_add(gap);
        let mut made = None;
        let list = self.session_list(row, key_hash, |s| {
            let g = s.push_group(row, key_hash, t, end);
            made = Some(g);
            g
        });
        let roots = self.sessions.as_ref().map(|s| s[list].1.clone()).unwrap_or_default();
        let open: Vec<Session> =
            roots.iter().map(|&g| Session { start: self.start[g as usize], end: self.end[g as usize] }).collect();
        let touched = sessions_touched(&open, t, gap);
        let g = match touched.split_first() {
            None => match made {
                Some(g) => g,
                None => self.push_group(row, key_hash, t, end),
            },
            Some((&first, rest)) => {
                let root = roots[first];
                let (mut lo, mut hi) = (self.start[root as usize].min(t), self.end[root as usize].max(end));
                for &i in rest {
                    let other = roots[i];
                    lo = lo.min(self.start[other as usize]);
                    hi = hi.max(self.end[other as usize]);
                    self.parent[other as usize] = root;
                }
                self.start[root as usize] = lo;
                self.end[root as usize] = hi;
                self.changed[root as usize] = true;
                root
            }
        };
        if let Some(sessions) = self.sessions.as_mut() {
            let roots = &mut sessions[list].1;
            if touched.is_empty() {
                roots.push(g);
            } else {
                let gone: Vec<u32> = touched[1..].iter().map(|&i| roots[i]).collect();
                roots.retain(|r| !gone.contains(r));
            }
        }
        g
    }

    /// Adds rows to groups: `args[i]` are aggregate i's argument columns, one row per
    /// entry of `groups`.
    pub(crate) fn update(&mut self, args: &[Vec<ArrayRef>], groups: &[usize]) -> DfResult<()> {
        let total = self.len();
        for (acc, values) in self.accs.iter_mut().zip(args) {
            acc.update_batch(values, groups, None, total)?;
        }
        Ok(())
    }

    /// Merges state rows into groups: `states[i]` are aggregate i's state columns.
    fn merge(&mut self, states: &[Vec<ArrayRef>], groups: &[usize]) -> DfResult<()> {
        let total = self.len();
        for (acc, values) in self.accs.iter_mut().zip(states) {
            acc.merge_batch(values, groups, total)?;
        }
        Ok(())
    }

    /// Restores state rows (from [`Kept`]): `keys` are their key columns.
    pub(crate) fn restore(
        &mut self,
        keys: &[ArrayRef],
        start: &Int64Array,
        end: &Int64Array,
        states: &[Vec<ArrayRef>],
    ) -> DfResult<()> {
        let rows = self.rows(keys)?;
        let hashes =
            crate::partition::hash_rows(keys, start.len()).map_err(datafusion_common::DataFusionError::Execution)?;
        let mut groups = Vec::with_capacity(start.len());
        for (i, &hash) in hashes.iter().enumerate().take(start.len()) {
            let (s, e) = (start.value(i), end.value(i));
            let g = if self.sessions.is_some() {
                let mut made = None;
                let list = self.session_list(rows.row(i), hash, |st| {
                    let g = st.push_group(rows.row(i), hash, s, e);
                    made = Some(g);
                    g
                });
                let existing = self
                    .sessions
                    .as_ref()
                    .and_then(|x| x[list].1.iter().copied().find(|&g| self.start[g as usize] == s));
                match (made, existing) {
                    (_, Some(g)) => g,
                    (made, None) => {
                        let g = made.unwrap_or_else(|| self.push_group(rows.row(i), hash, s, e));
                        if let Some(x) = self.sessions.as_mut() {
                            x[list].1.push(g);
                        }
                        g
                    }
                }
            } else {
                self.window_group(rows.row(i), hash, s, e)
            };
            groups.push(g as usize);
        }
        self.merge(states, &groups)?;
        self.changed.iter_mut().for_each(|c| *c = false);
        Ok(())
    }

    /// A checkpoint: emits the root groups `emit` picks (given end and changed), drops
    /// the ones `keep` refuses, and returns the emitted groups and the kept state rows.
    pub(crate) fn checkpoint(
        &mut self,
        emit: &dyn Fn(i64, bool) -> bool,
        keep: &dyn Fn(i64) -> bool,
    ) -> DfResult<(Option<Emitted>, Kept)> {
        let n = self.len();
        let states: Vec<Vec<ArrayRef>> = self.accs.iter_mut().map(|a| a.state(EmitTo::All)).collect::<DfResult<_>>()?;
        let roots: Vec<u32> = (0..n as u32).map(|g| self.find(g)).collect();
        let mut changed = vec![false; n];
        for g in 0..n {
            changed[roots[g] as usize] |= self.changed[g];
        }
        let is_root = |g: usize| roots[g] as usize == g;
        let emitted_roots: Vec<u32> =
            (0..n).filter(|&g| is_root(g) && emit(self.end[g], changed[g])).map(|g| g as u32).collect();
        let emitted =
            if emitted_roots.is_empty() { None } else { Some(self.evaluate(&states, &roots, &emitted_roots)?) };
        let kept_root: Vec<bool> = (0..n).map(|g| is_root(g) && keep(self.end[g])).collect();
        let all_kept = (0..n).all(|g| kept_root[g]);
        let kept_rows: Vec<u32> = (0..n as u32).filter(|&g| kept_root[roots[g as usize] as usize]).collect();
        let kept_rows = UInt32Array::from(kept_rows);
        let kept_states: Vec<Vec<ArrayRef>> = if all_kept {
            states.clone()
        } else {
            states.iter().map(|s| take_all(s, &kept_rows)).collect::<DfResult<_>>()?
        };
        let of_root =
            |v: &Vec<i64>| -> Vec<i64> { kept_rows.values().iter().map(|&g| v[roots[g as usize] as usize]).collect() };
        let start = of_root(&self.start);
        let end = of_root(&self.end);
        let key_rows: Vec<Row<'_>> =
            kept_rows.values().iter().map(|&g| self.keys.row(roots[g as usize] as usize)).collect();
        let keys = self.converter.convert_rows(key_rows)?;
        let key_group: UInt16Array =
            kept_rows.values().iter().map(|&g| key_group_of(self.key_hash[roots[g as usize] as usize])).collect();
        if all_kept {
            self.accs = (self.new_accs)()?;
            let identity: Vec<usize> = (0..n).collect();
            self.merge(&states, &identity)?;
            self.changed.iter_mut().for_each(|c| *c = false);
        } else {
            self.rebuild(&keys, &start, &end, &kept_states)?;
        }
        let kept =
            Kept { key_group, start: Int64Array::from(start), end: Int64Array::from(end), keys, states: kept_states };
        Ok((emitted, kept))
    }

    /// Evaluates the groups `emitted` (roots) from `states`, folding merged sessions in.
    fn evaluate(&self, states: &[Vec<ArrayRef>], roots: &[u32], emitted: &[u32]) -> DfResult<Emitted> {
        let mut slot = vec![u32::MAX; roots.len()];
        for (i, &r) in emitted.iter().enumerate() {
            slot[r as usize] = i as u32;
        }
        let rows: Vec<u32> =
            (0..roots.len() as u32).filter(|&g| slot[roots[g as usize] as usize] != u32::MAX).collect();
        let groups: Vec<usize> = rows.iter().map(|&g| slot[roots[g as usize] as usize] as usize).collect();
        let rows = UInt32Array::from(rows);
        let mut values = Vec::with_capacity(states.len());
        for (mut acc, state) in (self.new_accs)()?.into_iter().zip(states) {
            acc.merge_batch(&take_all(state, &rows)?, &groups, emitted.len())?;
            values.push(acc.evaluate(EmitTo::All)?);
        }
        let keys = self.converter.convert_rows(emitted.iter().map(|&g| self.keys.row(g as usize)))?;
        Ok(Emitted { keys, start: emitted.iter().map(|&g| self.start[g as usize]).collect(), values })
    }

    /// Replaces every group by the kept state rows.
    fn rebuild(&mut self, keys: &[ArrayRef], start: &[i64], end: &[i64], states: &[Vec<ArrayRef>]) -> DfResult<()> {
        let fresh = Store::new(self.fields.clone(), self.sessions.is_some(), self.new_accs.clone())?;
        *self = fresh;
        self.restore(keys, &Int64Array::from(start.to_vec()), &Int64Array::from(end.to_vec()), states)
    }
}

/// The key columns' row encoding fields of `types`.
pub(crate) fn sort_fields(types: &[arrow::datatypes::DataType]) -> Vec<SortField> {
    types.iter().map(|t| SortField::new(t.clone())).collect()
}

/// The rows of `array` for `indices` (a hopping window repeats rows).
pub(crate) fn repeat_rows(arrays: &[ArrayRef], indices: &[u32]) -> DfResult<Vec<ArrayRef>> {
    take_all(arrays, &UInt32Array::from(indices.to_vec()))
}
