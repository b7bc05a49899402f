//! [`JoinGate`]: the members one job starts in a share group wait, before their first
//! poll, until each holds an assignment that counts all of them.
//!
//! Why: a share group moves a partition from one member to another at once, with no
//! revocation step. The member learns of it at its next heartbeat, and its client then
//! forgets the records of that partition it polled and has not settled yet. Their locks
//! stay held until they expire (30 s by default), and a partition holds at most
//! `group.share.partition.max.record.locks` (2,000 by default) locked records: one
//! stranded poll can stop a partition for a whole lock duration.
//!
//! A job's members join one after the other, and in a group that already has its
//! partitions initialised the first to join gets every partition at once. Without the
//! gate it polls them, the next member joins, and the group takes partitions from it
//! with a poll in hand. With the gate, each member waits until every member of the job
//! holds partitions, heartbeating ahead of its interval while it holds none or while
//! another holds a newer epoch. Only then does it poll, and later assignments only give
//! it partitions (while no other instance joins or leaves the group).
//!
//! The rule is [`gate_step`], a pure function; [`JoinGate::settle`] carries it out.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::KafkaShareConsumer;
use shareflow_share::Result;
use shareflow_share::ShareConsumer;

/// What a member at the gate does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateStep {
    /// Some other member of the job has not joined yet, or holds no partition yet:
    /// wait for it.
    Wait,
    /// This member holds no partition yet, or another holds a newer epoch: heartbeat
    /// now to get the coordinator's latest assignment.
    Heartbeat,
    /// Every member holds partitions, and this one's assignment is of the newest
    /// epoch: poll.
    Poll,
}

/// A member as the gate sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seat {
    /// Its member epoch: 0 while it joins or rejoins.
    pub epoch: i32,
    /// Whether its assignment holds a partition.
    pub assigned: bool,
}

/// The next step of member `me`, given how each member of the job last reported
/// (`None`: not at the gate yet).
///
/// The coordinator computes a new target assignment a while after a member joins, not
/// in the answer to its join: the newcomer holds nothing until then, and the members
/// before it keep their old assignment (all the partitions, for the first) until they
/// heartbeat after it. So a member polls only once every member holds partitions and
/// its own epoch is the newest of them.
pub(crate) fn gate_step(seats: &[Option<Seat>], me: usize) -> GateStep {
    let Some(Some(mine)) = seats.get(me).copied() else {
        return GateStep::Wait;
    };
    if mine.epoch == 0 {
        return GateStep::Wait;
    }
    if !mine.assigned {
        return GateStep::Heartbeat;
    }
    let ready: Option<Vec<i32>> =
        seats.iter().map(|s| s.filter(|s| s.epoch > 0 && s.assigned).map(|s| s.epoch)).collect();
    let Some(epochs) = ready else {
        return GateStep::Wait;
    };
    if epochs.iter().any(|&e| e > mine.epoch) {
        GateStep::Heartbeat
    } else {
        GateStep::Poll
    }
}

/// How a member passed the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatePassed {
    /// False when the time limit passed first: the member polls all the same, and a
    /// partition moved from it later may strand one poll until the locks expire.
    pub settled: bool,
    /// Heartbeats sent ahead of the interval.
    pub heartbeats: u32,
    /// Time spent at the gate.
    pub waited: Duration,
}

/// The gate that the members of one job (one source's subtasks, say) share. See the
/// module documentation.
#[derive(Debug)]
pub struct JoinGate {
    /// Per member: the member id at the gate, and how it last reported.
    seats: Mutex<Vec<Option<(String, Seat)>>>,
    changed: Notify,
    limit: Duration,
}

/// Between two heartbeats ahead of the interval. The coordinator computes a new target
/// assignment at most once per `group.share.assignment.interval.ms` (1 s by default),
/// so a newcomer asks about ten times before it gets its share.
const HEARTBEAT_PAUSE: Duration = Duration::from_millis(100);

impl JoinGate {
    /// A gate for `members` members that lets each pass after `limit` at the latest.
    pub fn new(members: usize, limit: Duration) -> Self {
        Self { seats: Mutex::new(vec![None; members]), changed: Notify::new(), limit }
    }

    /// How many members the gate waits for.
    pub fn members(&self) -> usize {
        self.seats().len()
    }

    /// The seats; a panic elsewhere while they were locked leaves them usable.
    fn seats(&self) -> MutexGuard<'_, Vec<Option<(String, Seat)>>> {
        shareflow_share::sync::lock(&self.seats)
    }

    /// Seats `member_id` as member `member`, as it is now, and returns its next step.
    fn report(&self, member: usize, member_id: &str, now: Seat) -> GateStep {
        let mut seats = self.seats();
        if let Some(seat) = seats.get_mut(member) {
            if seat.as_ref().is_none_or(|(id, s)| id != member_id || *s != now) {
                *seat = Some((member_id.to_string(), now));
                self.changed.notify_waiters();
            }
        }
        let view: Vec<Option<Seat>> = seats.iter().map(|s| s.as_ref().map(|(_, s)| *s)).collect();
        gate_step(&view, member)
    }

    /// Waits until `consumer`, subscribed as member `member` of this gate, holds an
    /// assignment that counts every member of the gate, or until the gate's limit.
    /// Call it after `subscribe` and before the first poll. A member index outside the
    /// gate passes at once, unsettled.
    pub async fn settle(&self, member: usize, consumer: &mut KafkaShareConsumer) -> Result<GatePassed> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.limit;
        let mut heartbeats = 0;
        if member >= self.members() {
            return Ok(GatePassed { settled: false, heartbeats, waited: Duration::ZERO });
        }
        loop {
            let changed = self.changed.notified();
            let id = consumer.member_id().0.clone();
            let now = Seat { epoch: consumer.member_epoch(), assigned: !consumer.assignment().is_empty() };
            match self.report(member, &id, now) {
                GateStep::Poll => {
                    return Ok(GatePassed { settled: true, heartbeats, waited: started.elapsed() });
                }
                _ if tokio::time::Instant::now() >= deadline => break,
                GateStep::Heartbeat => {
                    if heartbeats > 0 {
                        tokio::time::sleep(HEARTBEAT_PAUSE).await;
                    }
                    consumer.heartbeat_now().await?;
                    heartbeats += 1;
                }
                GateStep::Wait => {
                    // Woken when a member reports; the timeout also catches this
                    // member's own epoch changing on a background heartbeat.
                    let _ = tokio::time::timeout(HEARTBEAT_PAUSE, changed).await;
                }
            }
        }
        tracing::warn!(
            group = %consumer.group(),
            member,
            members = self.members(),
            limit = ?self.limit,
            "the job's members did not all join the share group within the limit; polling without a settled \
             assignment (a partition moved later may hold one poll's records until their locks expire)"
        );
        Ok(GatePassed { settled: false, heartbeats, waited: started.elapsed() })
    }

    /// Member `member`, `member_id`, left (its subtask closed or failed): the next
    /// member of that index starts at the gate afresh. A member that took the seat since
    /// keeps it.
    pub fn leave(&self, member: usize, member_id: &str) {
        let mut seats = self.seats();
        if let Some(seat) = seats.get_mut(member) {
            if seat.as_ref().is_some_and(|(id, _)| id == member_id) {
                *seat = None;
                self.changed.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GateStep::*;

    fn at(epoch: i32) -> Option<Seat> {
        Some(Seat { epoch, assigned: true })
    }

    fn empty(epoch: i32) -> Option<Seat> {
        Some(Seat { epoch, assigned: false })
    }

    #[test]
    fn a_member_polls_once_every_member_holds_partitions_and_its_epoch_is_the_newest() {
        #[rustfmt::skip]
        let cases: &[(&str, &[Option<Seat>], usize, GateStep)] = &[
            ("alone, assigned",                             &[at(3)],                   0, Poll),
            ("alone, not joined yet",                       &[None],                    0, Wait),
            ("alone, rejoining after a fence",              &[at(0)],                   0, Wait),
            ("alone, joined, nothing assigned yet",         &[empty(3)],                0, Heartbeat),
            ("the first of two, the other not there",       &[at(3), None],             0, Wait),
            ("the second of two, the first not there",      &[None, at(4)],             1, Wait),
            ("the first, the newcomer not assigned yet",    &[at(5), empty(5)],         0, Wait),
            ("the newcomer, not assigned yet",              &[at(5), empty(5)],         1, Heartbeat),
            ("the first, its epoch older",                  &[at(5), at(6)],            0, Heartbeat),
            ("the newest epoch polls",                      &[at(5), at(6)],            1, Poll),
            ("both at one epoch",                           &[at(6), at(6)],            0, Poll),
            ("another member rejoining",                    &[at(6), at(0)],            0, Wait),
            ("three, the oldest",                           &[at(5), at(7), at(6)],     0, Heartbeat),
            ("three, the middle one",                       &[at(5), at(7), at(6)],     2, Heartbeat),
            ("three, the newest",                           &[at(5), at(7), at(6)],     1, Poll),
            ("three, the newest, one not assigned yet",     &[at(5), at(7), empty(7)],  1, Wait),
            ("ahead of the others",                         &[at(9), at(7)],            0, Poll),
            ("an index outside the job",                    &[at(3)],                   1, Wait),
        ];
        for (case, seats, me, want) in cases {
            assert_eq!(gate_step(seats, *me), *want, "{case}: {seats:?}, member {me}");
        }
    }

    #[test]
    fn a_member_that_leaves_makes_the_others_wait_for_its_successor() {
        let gate = JoinGate::new(2, Duration::from_secs(1));
        let seat = |epoch| Seat { epoch, assigned: true };
        assert_eq!(gate.report(0, "a", seat(4)), Wait);
        assert_eq!(gate.report(1, "b", seat(5)), Poll);
        assert_eq!(gate.report(0, "a", seat(5)), Poll);
        gate.leave(1, "b");
        assert_eq!(gate.report(0, "a", seat(5)), Wait, "member 1 left: its successor has not joined");
        assert_eq!(gate.report(1, "c", seat(6)), Poll);
        assert_eq!(gate.report(0, "a", seat(5)), Heartbeat, "member 1's successor joined at a newer epoch");
        gate.leave(1, "b");
        assert_eq!(gate.report(0, "a", seat(6)), Poll, "a member gone earlier does not unseat its successor");
    }
}
