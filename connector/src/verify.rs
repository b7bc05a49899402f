//! The exactly-once checker: invariants I1-I4 and I8 of docs/design.md §4, checked from outside the
//! pipeline (the demo and the failure-recovery tests use it).
//!
//! It holds sets of ids, not records: [`IdSet`] keeps ids in chunks of 65,536, each a
//! sorted list while sparse and a bitmap once dense, so the ids of a 20,000,000-record
//! run (dense, as the demo's are) take about 5 MiB. Topics are read in pages, and the
//! share partition's states as runs.

use std::collections::BTreeMap;

use shareflow_broker::EmbeddedBroker;
use shareflow_share::Result;
use shareflow_share::{IsolationLevel, RecordState, TopicPartition};

/// Records read per fetch while checking: what the checker holds of a topic at once.
const PAGE: usize = 16_384;

/// Violation lines a report keeps; past them it counts (a broken run of millions of
/// records must not take the checker's memory with it).
pub const MAX_VIOLATION_LINES: usize = 1_000;

/// A set of `u64` ids in chunks of 2^16: a chunk is a sorted `Vec<u16>` up to 4,096
/// ids, a 8 KiB bitmap beyond (as roaring bitmaps do), so memory follows the ids held
/// whether they are dense or sparse.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdSet {
    chunks: BTreeMap<u64, Chunk>,
    len: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Chunk {
    Sparse(Vec<u16>),
    Dense(Box<[u64; 1024]>),
}

/// Past this many ids a chunk turns into a bitmap (then the smaller form).
const SPARSE_MAX: usize = 4_096;

impl IdSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `id`; `false` if it was there already.
    pub fn insert(&mut self, id: u64) -> bool {
        let (key, low) = (id >> 16, (id & 0xffff) as u16);
        let chunk = self.chunks.entry(key).or_insert_with(|| Chunk::Sparse(Vec::new()));
        let added = match chunk {
            Chunk::Sparse(ids) => match ids.binary_search(&low) {
                Ok(_) => false,
                Err(at) => {
                    ids.insert(at, low);
                    if ids.len() > SPARSE_MAX {
                        let mut bits = Box::new([0u64; 1024]);
                        for &i in ids.iter() {
                            bits[usize::from(i) / 64] |= 1 << (i % 64);
                        }
                        *chunk = Chunk::Dense(bits);
                    }
                    true
                }
            },
            Chunk::Dense(bits) => {
                let (word, bit) = (usize::from(low) / 64, 1u64 << (low % 64));
                let fresh = bits[word] & bit == 0;
                bits[word] |= bit;
                fresh
            }
        };
        self.len += u64::from(added);
        added
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u64) -> bool {
        let (key, low) = (id >> 16, (id & 0xffff) as u16);
        match self.chunks.get(&key) {
            None => false,
            Some(Chunk::Sparse(ids)) => ids.binary_search(&low).is_ok(),
            Some(Chunk::Dense(bits)) => bits[usize::from(low) / 64] & (1 << (low % 64)) != 0,
        }
    }

    /// How many ids the set holds.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ids, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().flat_map(|(&key, chunk)| {
            let ids: Box<dyn Iterator<Item = u16> + '_> = match chunk {
                Chunk::Sparse(ids) => Box::new(ids.iter().copied()),
                Chunk::Dense(bits) => {
                    Box::new((0..=u16::MAX).filter(|i| bits[usize::from(*i) / 64] & (1 << (i % 64)) != 0))
                }
            };
            ids.map(move |low| (key << 16) | u64::from(low))
        })
    }
}

/// What the checker found, from outside the pipeline: the input topic's records and
/// their share-partition states, and the output topic read with read_committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExactlyOnceReport {
    /// Records in the input topic, over all partitions.
    pub produced: u64,
    /// Output records visible to read_committed readers.
    pub committed_output: u64,
    /// Input records whose output is committed exactly once and that are ACKNOWLEDGED.
    pub exactly_once: u64,
    /// Extra copies of committed output.
    pub duplicates: u64,
    /// Input records neither done (ACKNOWLEDGED or ARCHIVED) nor output.
    pub lost: u64,
    /// Input records ARCHIVED, by reason.
    pub archived: BTreeMap<String, u64>,
    /// Input records AVAILABLE with no output: never delivered, or given back. At
    /// quiescence that breaks I1 (one summary line in `violations`); after a stopped run
    /// it is what a resumed run still has to do.
    pub available: u64,
    /// The broken invariants, one line each (I1-I4 and I8 of docs/design.md §4), the
    /// first [`MAX_VIOLATION_LINES`] of them; then one line saying how many more.
    pub violations: Vec<String>,
    /// Broken invariants the checker found, in all (past the lines kept too).
    pub violation_count: u64,
}

impl ExactlyOnceReport {
    /// No invariant is broken.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Records a broken invariant.
    fn violation(&mut self, line: String) {
        self.violation_count += 1;
        if self.violations.len() < MAX_VIOLATION_LINES {
            self.violations.push(line);
        }
    }

    /// Counts one input record by its state and its committed copies; `true` for an
    /// ARCHIVED one, whose reason the caller asks for on its own.
    fn tally(&mut self, tp: &TopicPartition, offset: i64, id: u64, state: RecordState, copies: u64) -> bool {
        if copies > 1 {
            self.duplicates += copies - 1;
            self.violation(format!("I2: input {tp}@{offset} (id {id}) has {copies} committed outputs"));
        }
        match (state, copies) {
            (RecordState::Acknowledged, 1) => self.exactly_once += 1,
            (RecordState::Acknowledged, 0) => {
                self.lost += 1;
                self.violation(format!("I3: {tp}@{offset} is ACKNOWLEDGED without committed output"));
            }
            // Two or more outputs: I2 above says so; it is done, not redelivered.
            (RecordState::Acknowledged, _) => {}
            (RecordState::Archived, _) => return true,
            // Summed up in one line at the end.
            (RecordState::Available, 0) => {
                self.lost += 1;
                self.available += 1;
            }
            (state, 0) => {
                self.lost += 1;
                self.violation(format!("I1: {tp}@{offset} is {state} at quiescence, with no output"));
            }
            (state, _) => {
                self.violation(format!(
                    "I4: {tp}@{offset} has committed output but is {state}: it would be redelivered"
                ));
            }
        }
        false
    }

    /// The line that sums up the AVAILABLE records, if any.
    pub fn available_line(&self) -> Option<&String> {
        self.violations.iter().find(|v| v.starts_with("I1: ") && v.contains(" AVAILABLE at quiescence"))
    }

    /// Forgives the AVAILABLE records: a stopped run leaves them for the next one.
    /// Returns how many there were.
    pub fn leave_available(&mut self) -> u64 {
        let n = self.available;
        if n > 0 {
            self.violations.retain(|v| !(v.starts_with("I1: ") && v.contains(" AVAILABLE at quiescence")));
            self.violation_count -= 1;
            self.lost -= n.min(self.lost);
            self.available = 0;
        }
        n
    }
}

/// Calls `each` on every record of `tp` as `isolation` shows it, a page at a time.
async fn for_each_record(
    broker: &EmbeddedBroker,
    tp: &TopicPartition,
    isolation: IsolationLevel,
    mut each: impl FnMut(&shareflow_broker::FetchedRecord),
) -> Result<()> {
    let mut offset = broker.start_offset(tp).await?;
    loop {
        let page = broker.fetch(tp, offset, PAGE, isolation).await?;
        let Some(last) = page.last() else { return Ok(()) };
        offset = last.offset + 1;
        page.iter().for_each(&mut each);
    }
}

/// How many committed copies each output id has: one set per count, and the exact
/// count only for the (rare, faulty) ids seen three times or more.
#[derive(Default)]
struct Copies {
    once: IdSet,
    twice: IdSet,
    more: BTreeMap<u64, u64>,
}

impl Copies {
    fn add(&mut self, id: u64) {
        if self.once.insert(id) {
            return;
        }
        if self.twice.insert(id) {
            return;
        }
        *self.more.entry(id).or_insert(2) += 1;
    }

    fn of(&self, id: u64) -> u64 {
        match self.more.get(&id) {
            Some(&n) => n,
            None => u64::from(self.once.contains(id)) + u64::from(self.twice.contains(id)),
        }
    }
}

/// Checks invariants I1-I4 and I8 at quiescence. `identity` extracts the input record's id
/// from an input value and from an output value (the pipeline must carry it through).
pub async fn check_exactly_once(
    broker: &EmbeddedBroker,
    group: &str,
    input_topic: &str,
    output_topic: &str,
    identity: impl Fn(&[u8]) -> Option<u64>,
) -> Result<ExactlyOnceReport> {
    let mut report = ExactlyOnceReport::default();
    let mut outputs = Copies::default();
    for p in 0..broker.partition_count(output_topic)? as i32 {
        let tp = TopicPartition::new(output_topic, p);
        for_each_record(broker, &tp, IsolationLevel::ReadCommitted, |r| {
            report.committed_output += 1;
            match r.value.as_deref().and_then(&identity) {
                Some(id) => outputs.add(id),
                None => report.violation(format!("output {tp} offset {} has no input identity", r.offset)),
            }
        })
        .await?;
    }
    let mut seen = IdSet::new();
    let mut first_available = None;
    for p in 0..broker.partition_count(input_topic)? as i32 {
        let tp = TopicPartition::new(input_topic, p);
        // The states as runs: a few per partition at quiescence, not one per record.
        let runs = broker.share_partition_runs(group, &tp).await?;
        let mut run = runs.iter().peekable();
        let mut archived = Vec::new();
        for_each_record(broker, &tp, IsolationLevel::ReadUncommitted, |r| {
            report.produced += 1;
            let Some(id) = r.value.as_deref().and_then(&identity) else {
                report.violation(format!("input {tp} offset {} has no identity", r.offset));
                return;
            };
            seen.insert(id);
            let copies = outputs.of(id);
            while run.next_if(|(_, last, _)| *last < r.offset).is_some() {}
            let state = match run.peek() {
                Some((first, _, state)) if *first <= r.offset => *state,
                _ => RecordState::Available,
            };
            if report.tally(&tp, r.offset, id, state, copies) {
                archived.push((r.offset, copies));
            }
            if state == RecordState::Available && copies == 0 {
                first_available.get_or_insert_with(|| format!("{tp}@{}", r.offset));
            }
        })
        .await?;
        // Archived records are few: each one's reason is asked for on its own.
        for (offset, copies) in archived {
            let status = broker.record_status(group, &tp, offset).await?;
            let reason = status.archive_reason.map_or("unknown".to_string(), |r| r.to_string());
            *report.archived.entry(reason.clone()).or_default() += 1;
            if copies > 0 {
                report.violation(format!("I4: {tp}@{offset} is ARCHIVED ({reason}) yet has committed output"));
            }
        }
    }
    if let Some(first) = first_available {
        let n = report.available;
        report.violation(format!(
            "I1: {n} input records are AVAILABLE at quiescence, with no output (the first: {first})"
        ));
    }
    for id in outputs.once.iter().filter(|id| !seen.contains(*id)) {
        report.violation(format!("output id {id} matches no input record"));
    }
    for t in broker.transactions().await? {
        if t.state.is_pending() && t.id.group_id() == group {
            report.violation(format!("I8: transaction {} is still {} at quiescence", t.id, t.state));
        }
    }
    if report.violation_count > report.violations.len() as u64 {
        let more = report.violation_count - report.violations.len() as u64;
        report.violations.push(format!("... and {more} more"));
    }
    debug_assert!(
        report.violations.iter().any(|v| v.starts_with("I2") || v.starts_with("I4") || v.starts_with("output"))
            || report.exactly_once + report.duplicates == report.committed_output,
        "acknowledged records and committed outputs must pair up"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_set_holds_sparse_and_dense_ids_exactly() {
        let mut set = IdSet::new();
        let mut want = std::collections::BTreeSet::new();
        // Dense from 0, sparse far away, across a chunk's change to a bitmap.
        let ids = (0..10_000u64).chain((0..50).map(|i| u64::MAX - i * 1_000_003)).chain([65_535, 65_536, 1 << 40]);
        for id in ids {
            assert_eq!(set.insert(id), want.insert(id), "{id}");
        }
        for id in [0, 9_999, 65_535, 65_536, 1 << 40, u64::MAX] {
            assert!(!set.insert(id), "{id} twice");
        }
        assert_eq!(set.len(), want.len() as u64);
        assert_eq!(set.iter().collect::<Vec<_>>(), want.iter().copied().collect::<Vec<_>>());
        for probe in [10_000, 65_537, 1 << 39, u64::MAX - 1] {
            assert_eq!(set.contains(probe), want.contains(&probe), "{probe}");
        }
        assert!(matches!(set.chunks[&0], Chunk::Dense(_)));
        assert!(matches!(set.chunks[&(u64::MAX >> 16)], Chunk::Sparse(_)));
    }

    #[test]
    fn copies_count_past_two() {
        let mut c = Copies::default();
        for id in [7, 7, 7, 7, 9, 9, 11] {
            c.add(id);
        }
        assert_eq!((c.of(7), c.of(9), c.of(11), c.of(12)), (4, 2, 1, 0));
    }
}
