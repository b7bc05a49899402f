//! The record state machine of one share partition, as a pure value.
//!
//! Every method takes the current time as an argument and returns what changed; I/O,
//! clocks and locks live outside. Records are stored as runs of equal state
//! ([`RunMap`]), so cost follows the number of state changes, not of records.

use serde::{Deserialize, Serialize};

use super::log::PartitionLog;
use super::run_map::RunMap;
use super::txn::TxnKey;
use shareflow_share::{AcknowledgeType, ArchiveReason, RecordState};

/// A member of a group, by broker-wide number.
pub(crate) type MemberKey = u64;

/// The state of a run of records, with what each state needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Slot {
    /// Deliverable. `deliveries` < the delivery limit.
    Available { deliveries: u16 },
    /// Held by `member` until `deadline_ms`.
    Acquired { member: MemberKey, deliveries: u16, deadline_ms: u64 },
    /// Staged in transaction `txn`: ACCEPT (`accept`) or REJECT on commit.
    Locked { txn: TxnKey, accept: bool, deliveries: u16 },
    /// Done.
    Acknowledged,
    /// Done without processing.
    Archived(ArchiveReason),
}

impl Slot {
    pub(crate) fn record_state(&self) -> RecordState {
        match self {
            Slot::Available { .. } => RecordState::Available,
            Slot::Acquired { .. } => RecordState::Acquired,
            Slot::Locked { .. } => RecordState::Locked,
            Slot::Acknowledged => RecordState::Acknowledged,
            Slot::Archived(_) => RecordState::Archived,
        }
    }

    fn in_flight(&self) -> bool {
        matches!(self, Slot::Acquired { .. } | Slot::Locked { .. })
    }

    pub(crate) fn deliveries(&self) -> u16 {
        match *self {
            Slot::Available { deliveries } | Slot::Acquired { deliveries, .. } | Slot::Locked { deliveries, .. } => {
                deliveries
            }
            Slot::Acknowledged | Slot::Archived(_) => 0,
        }
    }
}

/// Group settings the partition needs for a transition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) lock_duration_ms: u64,
    pub(crate) delivery_limit: u16,
    pub(crate) max_record_locks: u64,
    pub(crate) read_committed: bool,
}

/// What a transition did, for metrics and for waking pollers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Changes {
    pub(crate) acquired: u64,
    pub(crate) redelivered: u64,
    pub(crate) acknowledged: u64,
    pub(crate) archived_rejected: u64,
    pub(crate) archived_delivery_limit: u64,
    pub(crate) archived_aborted_txn: u64,
    pub(crate) released: u64,
}

impl Changes {
    pub(crate) fn add(&mut self, o: Changes) {
        self.acquired += o.acquired;
        self.redelivered += o.redelivered;
        self.acknowledged += o.acknowledged;
        self.archived_rejected += o.archived_rejected;
        self.archived_delivery_limit += o.archived_delivery_limit;
        self.archived_aborted_txn += o.archived_aborted_txn;
        self.released += o.released;
    }

    fn count(&mut self, old: &Slot, new: &Slot, n: u64) {
        match (old, new) {
            (_, Slot::Acknowledged) => self.acknowledged += n,
            (_, Slot::Archived(ArchiveReason::Rejected)) => self.archived_rejected += n,
            (_, Slot::Archived(ArchiveReason::DeliveryLimit)) => self.archived_delivery_limit += n,
            (_, Slot::Archived(ArchiveReason::AbortedTransaction)) => self.archived_aborted_txn += n,
            (Slot::Acquired { .. } | Slot::Locked { .. }, Slot::Available { .. }) => self.released += n,
            _ => {}
        }
    }

    pub(crate) fn any(&self) -> bool {
        *self != Changes::default()
    }
}

/// A range handed to a member by [`SharePartition::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AcquiredRange {
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) deliveries: u16,
}

/// Why a range cannot take a requested transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeError {
    /// Offsets from `from` on were never delivered.
    NeverDelivered { from: i64 },
    /// `offset` is in a state that does not allow it.
    WrongState { offset: i64, slot: Slot },
}

/// One share partition: the state of every delivered record, as runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SharePartition {
    /// Covers every offset delivered at least once; beyond `runs.end()` all is AVAILABLE
    /// and never delivered.
    runs: RunMap<Slot>,
    /// ACQUIRED plus LOCKED records.
    in_flight: u64,
    /// No AVAILABLE run starts below this offset.
    available_floor: i64,
    /// No ACQUIRED run has an earlier deadline.
    min_deadline_ms: u64,
    /// Ranges archived at the delivery limit by the command running now, for the broker
    /// to log and dead-letter; drained after each command, never stored.
    #[serde(skip)]
    limit_archived: Vec<(i64, i64)>,
}

impl SharePartition {
    pub(crate) fn new(start_offset: i64) -> Self {
        Self {
            runs: RunMap::starting_at(start_offset),
            in_flight: 0,
            available_floor: i64::MAX,
            min_deadline_ms: u64::MAX,
            limit_archived: Vec::new(),
        }
    }

    /// One past the highest offset ever acquired (Kafka's share-partition end offset):
    /// records below it that a taken-back acquisition left are AVAILABLE with no delivery.
    pub(crate) fn fetched_end(&self) -> i64 {
        self.runs.end()
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The first offset an ACQUIRED or LOCKED record holds: retention keeps it.
    pub(crate) fn first_in_flight(&self) -> Option<i64> {
        if self.in_flight == 0 {
            return None;
        }
        self.runs.iter().find(|(_, _, s)| s.in_flight()).map(|(f, _, _)| f)
    }

    /// The log was trimmed below `start` (retention): the states below it are gone, and
    /// delivery goes on from `start` (Kafka: the share-partition start offset advances
    /// to the log start). Nothing in flight is below `start`: retention stops there.
    pub(crate) fn advance_start(&mut self, start: i64) {
        self.runs.trim_front(start);
        if self.available_floor < start {
            self.available_floor = start;
        }
    }

    pub(crate) fn run_count(&self) -> usize {
        self.runs.run_count()
    }

    /// The slot of `offset`, or `None` when it was never delivered.
    pub(crate) fn slot(&self, offset: i64) -> Option<Slot> {
        self.runs.get(offset).map(|(_, _, s)| *s)
    }

    /// All runs, for inspection and tests.
    pub(crate) fn runs(&self) -> impl Iterator<Item = (i64, i64, Slot)> + '_ {
        self.runs.iter().map(|(f, l, s)| (f, l, *s))
    }

    /// Replaces `[first, last]` slot by slot, keeping the caches right.
    fn set(&mut self, first: i64, last: i64, changes: &mut Changes, mut f: impl FnMut(&Slot) -> Slot) {
        let mut in_flight = self.in_flight;
        let mut floor = self.available_floor;
        let mut min_deadline = self.min_deadline_ms;
        let limit_archived = &mut self.limit_archived;
        self.runs.update(first, last, |start, end, old| {
            let new = f(old);
            let n = (end - start + 1) as u64;
            if old.in_flight() {
                in_flight -= n;
            }
            if new.in_flight() {
                in_flight += n;
            }
            match new {
                Slot::Available { .. } => floor = floor.min(start),
                Slot::Acquired { deadline_ms, .. } => min_deadline = min_deadline.min(deadline_ms),
                _ => {}
            }
            changes.count(old, &new, n);
            if new == Slot::Archived(ArchiveReason::DeliveryLimit) && *old != new {
                limit_archived.push((start, end));
            }
            new
        });
        self.in_flight = in_flight;
        self.available_floor = floor;
        self.min_deadline_ms = min_deadline;
    }

    /// Takes the ranges archived at the delivery limit since the last call.
    pub(crate) fn take_limit_archived(&mut self) -> Vec<(i64, i64)> {
        std::mem::take(&mut self.limit_archived)
    }

    /// The runs archived at the delivery limit and not dead-lettered yet.
    pub(crate) fn archived_at_limit(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.runs.iter().filter(|(_, _, s)| **s == Slot::Archived(ArchiveReason::DeliveryLimit)).map(|(f, l, _)| (f, l))
    }

    /// ARCHIVED at the delivery limit -> ARCHIVED as dead-lettered, for `[first, last]`,
    /// all of it archived at the limit (KIP-1191's ARCHIVING -> ARCHIVED).
    pub(crate) fn dead_letter(&mut self, first: i64, last: i64) -> Result<Changes, RangeError> {
        self.check(first, last, |s| *s == Slot::Archived(ArchiveReason::DeliveryLimit))?;
        let mut changes = Changes::default();
        self.set(first, last, &mut changes, |_| Slot::Archived(ArchiveReason::DeadLettered));
        Ok(changes)
    }

    /// Checks that every offset in `[first, last]` satisfies `ok`.
    pub(crate) fn check(&self, first: i64, last: i64, ok: impl Fn(&Slot) -> bool) -> Result<(), RangeError> {
        if last >= self.runs.end() {
            return Err(RangeError::NeverDelivered { from: first.max(self.runs.end()) });
        }
        for (start, _, slot) in self.runs.overlapping(first, last) {
            if !ok(slot) {
                return Err(RangeError::WrongState { offset: start, slot: *slot });
            }
        }
        Ok(())
    }

    /// ACQUIRED -> AVAILABLE (or ARCHIVED at the limit) for every lock past its deadline.
    pub(crate) fn expire_locks(&mut self, now_ms: u64, limits: &Limits) -> Changes {
        let mut changes = Changes::default();
        if now_ms < self.min_deadline_ms {
            return changes;
        }
        let expired: Vec<(i64, i64)> = self
            .runs
            .iter()
            .filter(|(_, _, s)| matches!(s, Slot::Acquired { deadline_ms, .. } if *deadline_ms <= now_ms))
            .map(|(f, l, _)| (f, l))
            .collect();
        self.min_deadline_ms = u64::MAX;
        for (first, last) in expired {
            self.set(first, last, &mut changes, |s| release(s, limits));
        }
        // Recompute the bound over the locks still held.
        self.min_deadline_ms = self
            .runs
            .iter()
            .filter_map(|(_, _, s)| match s {
                Slot::Acquired { deadline_ms, .. } => Some(*deadline_ms),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX);
        changes
    }

    /// Releases every record `member` holds when it leaves the group: a failed
    /// delivery, archived at the limit.
    pub(crate) fn release_member(&mut self, member: MemberKey, limits: &Limits) -> Changes {
        self.release_held(Some(member), |s| release(s, limits))
    }

    /// After a broker restart every ACQUIRED record becomes AVAILABLE with its delivery
    /// count, as in Kafka. The delivery the restart cut short counts: at the limit the
    /// record is ARCHIVED (decision 0003, "Restart").
    pub(crate) fn release_all_after_restart(&mut self, limits: &Limits) -> Changes {
        self.release_held(None, |s| release(s, limits))
    }

    fn release_held(&mut self, member: Option<MemberKey>, to: impl Fn(&Slot) -> Slot) -> Changes {
        let mut changes = Changes::default();
        let held: Vec<(i64, i64)> = self
            .runs
            .iter()
            .filter(|(_, _, s)| matches!(s, Slot::Acquired { member: m, .. } if member.is_none_or(|x| x == *m)))
            .map(|(f, l, _)| (f, l))
            .collect();
        for (first, last) in held {
            self.set(first, last, &mut changes, &to);
        }
        changes
    }

    /// AVAILABLE -> ACQUIRED for up to `max_records`, lowest offsets first: first the
    /// redeliveries, then new records up to the log end (read_uncommitted) or the last
    /// stable offset (read_committed), where aborted transactions' records are archived.
    pub(crate) fn acquire(
        &mut self,
        member: MemberKey,
        max_records: u64,
        now_ms: u64,
        limits: &Limits,
        log: &PartitionLog,
    ) -> (Vec<AcquiredRange>, Changes) {
        let mut changes = Changes::default();
        let changes = &mut changes;
        let mut budget = max_records.min(limits.max_record_locks.saturating_sub(self.in_flight));
        let mut out = Vec::new();
        let deadline_ms = now_ms.saturating_add(limits.lock_duration_ms);
        // Redeliveries.
        while budget > 0 && self.available_floor < self.runs.end() {
            let next = self.runs.from(self.available_floor).find_map(|(f, l, s)| match s {
                Slot::Available { deliveries } => Some((f, l, *deliveries)),
                _ => None,
            });
            let Some((first, last, deliveries)) = next else {
                self.available_floor = i64::MAX;
                break;
            };
            self.available_floor = first;
            if deliveries >= limits.delivery_limit {
                // Only reachable when the group's limit was lowered: never deliver past it.
                self.set(first, last, changes, |_| Slot::Archived(ArchiveReason::DeliveryLimit));
                continue;
            }
            let last = last.min(first + budget as i64 - 1);
            let d = deliveries + 1;
            self.set(first, last, changes, |_| Slot::Acquired { member, deliveries: d, deadline_ms });
            changes.acquired += (last - first + 1) as u64;
            if deliveries > 0 {
                // Not a redelivery: a first delivery taken back (`unacquire`).
                changes.redelivered += (last - first + 1) as u64;
            }
            budget -= (last - first + 1) as u64;
            out.push(AcquiredRange { first, last, deliveries: d });
        }
        // New records.
        let limit_end = if limits.read_committed { log.last_stable_offset() } else { log.end() };
        while budget > 0 && self.runs.end() < limit_end {
            let first = self.runs.end();
            let Some(batch) = log.batch_at(first) else { break };
            let batch_last = batch.last_offset().min(limit_end - 1);
            if limits.read_committed && batch.aborted {
                let n = (batch_last - first + 1) as u64;
                self.runs.push(batch_last, Slot::Archived(ArchiveReason::AbortedTransaction));
                changes.archived_aborted_txn += n;
                continue;
            }
            let last = batch_last.min(first + budget as i64 - 1);
            self.runs.push(last, Slot::Acquired { member, deliveries: 1, deadline_ms });
            let n = (last - first + 1) as u64;
            self.in_flight += n;
            self.min_deadline_ms = self.min_deadline_ms.min(deadline_ms);
            changes.acquired += n;
            budget -= n;
            match out.last_mut() {
                Some(r) if r.last + 1 == first && r.deliveries == 1 => r.last = last,
                _ => out.push(AcquiredRange { first, last, deliveries: 1 }),
            }
        }
        (out, *changes)
    }

    /// Takes back a delivery that never reached `member` (the broker could not read the
    /// records it acquired): what `member` still holds of `[first, last]` goes back to
    /// AVAILABLE with one delivery less, as before the acquisition. Records settled or
    /// held by another member in the meantime stay as they are.
    pub(crate) fn unacquire(&mut self, member: MemberKey, first: i64, last: i64) -> Changes {
        let mut changes = Changes::default();
        if first > last || first >= self.runs.end() {
            return changes;
        }
        // Only the runs still there: retention may have trimmed the front since.
        let held: Vec<(i64, i64)> = self
            .runs
            .overlapping(first, last.min(self.runs.end() - 1))
            .filter(|(_, _, s)| matches!(s, Slot::Acquired { member: m, .. } if *m == member))
            .map(|(f, l, _)| (f.max(first), l.min(last)))
            .collect();
        for (f, l) in held {
            self.set(f, l, &mut changes, |s| match *s {
                Slot::Acquired { deliveries, .. } => Slot::Available { deliveries: deliveries.saturating_sub(1) },
                other => other,
            });
        }
        changes
    }

    /// Whether `member` holds all of `[first, last]`.
    pub(crate) fn check_held(&self, member: MemberKey, first: i64, last: i64) -> Result<(), RangeError> {
        self.check(first, last, |s| matches!(s, Slot::Acquired { member: m, .. } if *m == member))
    }

    /// Settles `[first, last]`, held by its member, outside any transaction.
    /// Call [`check_held`](Self::check_held) first.
    pub(crate) fn acknowledge(
        &mut self,
        first: i64,
        last: i64,
        ack: AcknowledgeType,
        now_ms: u64,
        limits: &Limits,
    ) -> Changes {
        let mut changes = Changes::default();
        self.set(first, last, &mut changes, |s| match ack {
            AcknowledgeType::Accept => Slot::Acknowledged,
            AcknowledgeType::Reject => Slot::Archived(ArchiveReason::Rejected),
            AcknowledgeType::Release => release(s, limits),
            AcknowledgeType::Renew => match *s {
                Slot::Acquired { member, deliveries, .. } => {
                    Slot::Acquired { member, deliveries, deadline_ms: now_ms.saturating_add(limits.lock_duration_ms) }
                }
                other => other,
            },
        });
        changes
    }

    /// ACQUIRED -> LOCKED in `txn`. Call [`check_held`](Self::check_held) first.
    pub(crate) fn lock(&mut self, first: i64, last: i64, txn: TxnKey, accept: bool) {
        let mut changes = Changes::default();
        self.set(first, last, &mut changes, |s| Slot::Locked { txn, accept, deliveries: s.deliveries() });
    }

    /// LOCKED in `txn` -> ACKNOWLEDGED (accept) or ARCHIVED (reject).
    pub(crate) fn commit_locked(&mut self, first: i64, last: i64, txn: TxnKey) -> Changes {
        let mut changes = Changes::default();
        self.set(first, last, &mut changes, |s| match *s {
            Slot::Locked { txn: t, accept, .. } if t == txn => {
                if accept {
                    Slot::Acknowledged
                } else {
                    Slot::Archived(ArchiveReason::Rejected)
                }
            }
            other => {
                debug_assert!(false, "commit of {txn:?} found {other:?}");
                other
            }
        });
        changes
    }

    /// LOCKED in `txn` -> AVAILABLE (or ARCHIVED at the delivery limit).
    pub(crate) fn abort_locked(&mut self, first: i64, last: i64, txn: TxnKey, limits: &Limits) -> Changes {
        let mut changes = Changes::default();
        self.set(first, last, &mut changes, |s| match *s {
            Slot::Locked { txn: t, .. } if t == txn => release(s, limits),
            other => {
                debug_assert!(false, "abort of {txn:?} found {other:?}");
                other
            }
        });
        changes
    }
}

/// A failed delivery: back to AVAILABLE, or ARCHIVED once the limit is reached.
fn release(slot: &Slot, limits: &Limits) -> Slot {
    let deliveries = slot.deliveries();
    if deliveries >= limits.delivery_limit {
        Slot::Archived(ArchiveReason::DeliveryLimit)
    } else {
        Slot::Available { deliveries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch;
    use crate::log::LogRecord;

    fn limits() -> Limits {
        Limits { lock_duration_ms: 1_000, delivery_limit: 5, max_record_locks: 1_000, read_committed: false }
    }

    fn log(batches: &[usize]) -> PartitionLog {
        let mut log = PartitionLog::default();
        for &n in batches {
            let records: Vec<LogRecord> = (0..n)
                .map(|_| LogRecord {
                    key: None,
                    value: Some(bytes::Bytes::from_static(b"v")),
                    timestamp_ms: 0,
                    headers: Vec::new(),
                })
                .collect();
            let data = batch::encode(&records);
            let meta = batch::meta(&data).unwrap();
            log.append(data, meta, None);
        }
        log
    }

    fn deliveries(sp: &SharePartition, offsets: std::ops::RangeInclusive<i64>) -> Vec<(i64, Option<Slot>)> {
        offsets.map(|o| (o, sp.slot(o))).collect()
    }

    #[test]
    fn unacquire_takes_back_a_first_delivery_and_a_redelivery() {
        let log = log(&[4, 4]);
        let mut sp = SharePartition::new(0);
        let (ranges, _) = sp.acquire(7, 100, 0, &limits(), &log);
        assert_eq!(ranges, vec![AcquiredRange { first: 0, last: 7, deliveries: 1 }]);
        sp.unacquire(7, 0, 7);
        assert_eq!(sp.in_flight(), 0);
        assert!(deliveries(&sp, 0..=7).iter().all(|(_, s)| *s == Some(Slot::Available { deliveries: 0 })));
        // Acquired again, it is a first delivery again, not counted as a redelivery.
        let (ranges, changes) = sp.acquire(7, 100, 0, &limits(), &log);
        assert_eq!(ranges, vec![AcquiredRange { first: 0, last: 7, deliveries: 1 }]);
        assert_eq!((changes.acquired, changes.redelivered), (8, 0));
        // A redelivery (released once) taken back keeps the one delivery it had.
        sp.acknowledge(0, 3, AcknowledgeType::Release, 0, &limits());
        let (ranges, _) = sp.acquire(8, 4, 0, &limits(), &log);
        assert_eq!(ranges, vec![AcquiredRange { first: 0, last: 3, deliveries: 2 }]);
        sp.unacquire(8, 0, 3);
        assert_eq!(sp.slot(0), Some(Slot::Available { deliveries: 1 }));
        assert_eq!(sp.in_flight(), 4, "offsets 4..=7 are still held by member 7");
    }

    #[test]
    fn unacquire_leaves_what_the_member_no_longer_holds() {
        let log = log(&[6]);
        let mut sp = SharePartition::new(0);
        sp.acquire(7, 100, 0, &limits(), &log);
        sp.acknowledge(0, 1, AcknowledgeType::Accept, 0, &limits());
        // Another member's records and offsets past the end are left alone.
        sp.unacquire(9, 2, 5);
        assert!(matches!(sp.slot(2), Some(Slot::Acquired { member: 7, .. })));
        sp.unacquire(7, 0, 100);
        assert_eq!(sp.slot(0), Some(Slot::Acknowledged));
        assert_eq!(sp.slot(1), Some(Slot::Acknowledged));
        assert!(deliveries(&sp, 2..=5).iter().all(|(_, s)| *s == Some(Slot::Available { deliveries: 0 })));
        assert_eq!(sp.in_flight(), 0);
    }
}
