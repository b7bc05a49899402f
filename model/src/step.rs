//! The step function: the state each [`Action`] leads to. `step` only dispatches; each
//! action's logic is in its own function.

use shareflow_checkpoint::protocol::{
    check_instance_start, plan_adoption, plan_completion, resolve, AdoptionStep, RetentionPolicy,
};
use shareflow_share::{AcknowledgeType, TransactionState};
use stateright::Model;

use crate::sys::{tp, txn};
use crate::{
    Action, Adopting, Bug, Coord, Held, Life, Proc, ProtocolModel, Store, Sys, Who, ADOPTION_TIMEOUT, GROUP, INPUT,
    LOCK_MS, OUTPUT, PREFIXES, TXN_TIMEOUT_MS,
};

fn who_inst(who: Who) -> u8 {
    match who {
        Who::Live(i) | Who::Zombie(i) => i,
    }
}

impl ProtocolModel {
    /// The state `action` leads to from `s`, or `None` when it cannot happen there.
    pub(crate) fn step(&self, s: &Sys, action: Action) -> Option<Sys> {
        let s = s.clone();
        match action {
            Action::Restart(i) => self.step_restart(s, i),
            Action::Recover(i) => self.step_recover(s, i),
            Action::Start(i) => self.step_start(s, i),
            Action::Poll(who) => self.step_poll(s, who),
            Action::Stage(who) => self.step_stage(s, who),
            Action::Sink(who) => self.step_sink(s, who),
            Action::Barrier(who) => self.step_barrier(s, who),
            Action::Prepare(who) => self.step_prepare(s, who),
            Action::WriteManifest(who, outcome) => self.step_write_manifest(s, who, outcome),
            Action::Commit(who) => self.step_commit(s, who),
            Action::Crash(i) => self.step_crash(s, i),
            Action::Pause(i) => self.step_pause(s, i),
            Action::LockExpiry => self.step_lock_expiry(s),
            Action::TxnTimeout => self.step_txn_timeout(s),
            Action::AdoptClaim(i) => self.step_adopt_claim(s, i),
            Action::AdoptFence(i) => self.step_adopt_fence(s, i),
            Action::AdoptDecide(i) => self.step_adopt_decide(s, i),
            Action::AdoptDone(i) => self.step_adopt_done(s, i),
            Action::Vanish(i) => self.step_vanish(s, i),
            Action::Time => self.step_time(s),
        }
    }

    /// `Restart(i)`: `check_instance_start`, then `InitProducer` (the fence).
    fn step_restart(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let now = s.now;
        let bug = self.cfg.bug;
        let views = s.views();
        if check_instance_start(Some(&views[i as usize])).is_err() {
            s.slots[i as usize].life = Life::Dead;
        } else {
            let last = s.slots[i as usize].last_epoch;
            let epoch = if bug == Bug::SkipFencing && last > 0 {
                last
            } else {
                match s.broker.init_producer(now, GROUP, PREFIXES[i as usize]) {
                    Ok(e) => e,
                    Err(_) => return None,
                }
            };
            s.owner[i as usize] += 1;
            let token = s.owner[i as usize];
            s.slots[i as usize].last_epoch = epoch;
            s.slots[i as usize].life = Life::Recovering { epoch, token };
        }
        Some(s)
    }

    /// `Recover(i)`: `resolve`, then `plan_recovery` carried out on the broker.
    fn step_recover(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let bug = self.cfg.bug;
        let Life::Recovering { epoch, token } = s.slots[i as usize].life else { return None };
        let plan = resolve(&s.observed(i), &RetentionPolicy::default());
        if let Some(m) = plan.restored_id() {
            let aborted: Vec<u64> = s.store[&(i, m)]
                .iter()
                .copied()
                .filter(|&k| s.broker.txn_state(&txn(i, k)) == TransactionState::Aborted)
                .collect();
            if !aborted.is_empty() {
                s.violations.insert(format!(
                    "recovery of {} restored checkpoint {m}, whose transactions {aborted:?} were aborted",
                    PREFIXES[i as usize]
                ));
            }
        }
        let actions = s.recovery_plan(i, plan.restored_id(), bug);
        if s.carry_out(i, &actions, epoch, token, bug).is_err() {
            s.slots[i as usize].life = Life::Down;
        } else {
            let highest = s.broker.highest_checkpoint(GROUP, PREFIXES[i as usize]).unwrap_or(0);
            let next = plan.next_checkpoint_id.max(highest + 1);
            // The keyed state of the restored checkpoint (none: empty).
            let count = plan.restored_id().and_then(|m| s.states.get(&(i, m)).copied()).unwrap_or(0);
            let changed = self.cfg.stateful && bug == Bug::EmitTwice && count > 0;
            s.slots[i as usize].life = Life::Recovered { epoch, token, next, count, changed };
        }
        Some(s)
    }

    /// `Start(i)`: the instance joins the group and begins T(next).
    fn step_start(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let now = s.now;
        let Life::Recovered { epoch, token, next, count, changed } = s.slots[i as usize].life else { return None };
        let started = match s.broker.join(now, GROUP, &[INPUT], &self.member_config()) {
            Ok(member) => s.broker.begin(now, &txn(i, next), epoch, 0).map(|_| member),
            Err(e) => Err(e),
        };
        s.slots[i as usize].life = match started {
            Ok(member) => Life::Running(Proc {
                token,
                epoch,
                member,
                cur: next,
                dirty: false,
                uncommitted: [next].into(),
                rec: None,
                coord: Coord::Idle,
                adopt: None,
                count,
                changed,
                snap: count,
            }),
            Err(_) => Life::Down,
        };
        Some(s)
    }

    /// `Poll(who)`: the source acquires one record.
    fn step_poll(&self, mut s: Sys, who: Who) -> Option<Sys> {
        let now = s.now;
        let bug = self.cfg.bug;
        let p = s.proc(who)?.clone();
        let got = s.broker.acquire(now, GROUP, p.member, 1);
        let Ok(got) = got else {
            s.fail(who);
            return Some(s);
        };
        let (_, offset, _) = got.first()?.clone();
        let mut held = Held::Polled;
        if bug == Bug::AckBeforeStaging {
            if s.broker.acknowledge(now, GROUP, p.member, &tp(INPUT), offset, AcknowledgeType::Accept).is_err() {
                s.fail(who);
                return Some(s);
            }
            held = Held::Staged;
        }
        s.proc_mut(who)?.rec = Some((offset, held));
        Some(s)
    }

    /// `Stage(who)`: the source stages the record's ACCEPT into T(n).
    fn step_stage(&self, mut s: Sys, who: Who) -> Option<Sys> {
        let now = s.now;
        let p = s.proc(who)?.clone();
        let (offset, _) = p.rec?;
        let r = s.broker.ack_in_txn(
            now,
            &txn(who_inst(who), p.cur),
            p.epoch,
            p.member,
            &tp(INPUT),
            offset,
            AcknowledgeType::Accept,
        );
        match r {
            Ok(()) => {
                let p = s.proc_mut(who)?;
                p.rec = Some((offset, Held::Staged));
                p.dirty = true;
            }
            Err(_) => s.fail(who),
        }
        Some(s)
    }

    /// `Sink(who)`: the sink produces the record's output into T(n).
    fn step_sink(&self, mut s: Sys, who: Who) -> Option<Sys> {
        let now = s.now;
        let p = s.proc(who)?.clone();
        let (offset, _) = p.rec?;
        let id = txn(who_inst(who), p.cur);
        match s.broker.produce(now, &tp(OUTPUT), &[offset.to_string().into_bytes()], Some((&id, p.epoch))) {
            Ok(_) => {
                let stateful = self.cfg.stateful;
                let p = s.proc_mut(who)?;
                p.rec = None;
                p.dirty = true;
                if stateful {
                    p.count += 1;
                    p.changed = true;
                }
            }
            Err(_) => s.fail(who),
        }
        Some(s)
    }

    /// `Barrier(who)`: with keyed state, the count is emitted into T(n) if it changed
    /// and snapshotted; then T(n+1) begins, the epoch moves on.
    fn step_barrier(&self, mut s: Sys, who: Who) -> Option<Sys> {
        let now = s.now;
        let p = s.proc(who)?.clone();
        let id = txn(who_inst(who), p.cur);
        if self.cfg.stateful && p.changed {
            let row = format!("count={}", p.count).into_bytes();
            if s.broker.produce(now, &tp(OUTPUT), &[row], Some((&id, p.epoch))).is_err() {
                s.fail(who);
                return Some(s);
            }
            let p = s.proc_mut(who)?;
            p.changed = false;
            p.dirty = true;
        }
        let p = s.proc(who)?.clone();
        match s.broker.begin(now, &txn(who_inst(who), p.cur + 1), p.epoch, 0) {
            Ok(_) => {
                let p = s.proc_mut(who)?;
                p.snap = p.count;
                p.uncommitted.insert(p.cur + 1);
                p.coord = Coord::Barriered(p.cur);
                p.cur += 1;
                p.dirty = false;
            }
            Err(_) => s.fail(who),
        }
        Some(s)
    }

    /// `Prepare(who)`: every uncommitted T(k), k <= n, is prepared.
    fn step_prepare(&self, mut s: Sys, who: Who) -> Option<Sys> {
        let now = s.now;
        let p = s.proc(who)?.clone();
        let Coord::Barriered(n) = p.coord else { return None };
        let ks: Vec<u64> = p.uncommitted.range(..=n).copied().collect();
        for &k in &ks {
            if s.broker.prepare(now, &txn(who_inst(who), k), p.epoch).is_err() {
                s.fail(who);
                return Some(s);
            }
        }
        s.proc_mut(who)?.coord = Coord::Prepared(n, ks);
        Some(s)
    }

    /// `WriteManifest(who, outcome)`: the conditional create of manifest n.
    fn step_write_manifest(&self, mut s: Sys, who: Who, outcome: Store) -> Option<Sys> {
        let i = who_inst(who);
        let p = s.proc(who)?.clone();
        let (n, ks) = match &p.coord {
            Coord::Prepared(n, ks) | Coord::CommittedEarly(n, ks) => (*n, ks.clone()),
            _ => return None,
        };
        if outcome != Store::Ok {
            s.budget[4] -= 1;
        }
        let created = match outcome {
            Store::Error => false,
            Store::Ok | Store::AppliedThenTimeout => {
                // A create-only put: an existing key stays as it is.
                match s.store.entry((i, n)) {
                    std::collections::btree_map::Entry::Occupied(_) => false,
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(ks);
                        if self.cfg.stateful {
                            s.states.insert((i, n), p.snap);
                        }
                        outcome == Store::Ok
                    }
                }
            }
        };
        let early = matches!(p.coord, Coord::CommittedEarly(..));
        s.proc_mut(who)?.coord = if created && !early { Coord::Manifested(n) } else { Coord::Idle };
        Some(s)
    }

    /// `Commit(who)`: commits per `plan_completion`, then notifies.
    fn step_commit(&self, mut s: Sys, who: Who) -> Option<Sys> {
        let now = s.now;
        let bug = self.cfg.bug;
        let i = who_inst(who);
        let p = s.proc(who)?.clone();
        let (n, ks) = match &p.coord {
            Coord::Manifested(n) => (*n, vec![]),
            Coord::Prepared(n, ks) if bug == Bug::CommitBeforeManifest => (*n, ks.clone()),
            _ => return None,
        };
        for k in plan_completion(n, &p.uncommitted) {
            match s.broker.commit(now, &txn(i, k), p.epoch) {
                Ok(true) => s.note_commit(i, k, p.token),
                Ok(false) => {}
                Err(_) => {
                    s.fail(who);
                    return Some(s);
                }
            }
            s.proc_mut(who)?.uncommitted.remove(&k);
        }
        s.proc_mut(who)?.coord =
            if matches!(p.coord, Coord::Manifested(_)) { Coord::Idle } else { Coord::CommittedEarly(n, ks) };
        Some(s)
    }

    /// `Crash(i)`: the instance dies.
    fn step_crash(&self, mut s: Sys, i: u8) -> Option<Sys> {
        s.budget[0] -= 1;
        s.slots[i as usize].life = Life::Down;
        Some(s)
    }

    /// `Pause(i)`: the instance pauses; its state lives on as a zombie.
    fn step_pause(&self, mut s: Sys, i: u8) -> Option<Sys> {
        s.budget[1] -= 1;
        let slot = &mut s.slots[i as usize];
        let Life::Running(p) = std::mem::replace(&mut slot.life, Life::Down) else { return None };
        slot.zombie = Some(p);
        Some(s)
    }

    /// `LockExpiry`: time passes beyond the acquisition lock.
    fn step_lock_expiry(&self, mut s: Sys) -> Option<Sys> {
        s.budget[2] -= 1;
        s.now += LOCK_MS + 1;
        s.broker.tick(s.now);
        Some(s)
    }

    /// `TxnTimeout`: time passes beyond the transaction timeout.
    fn step_txn_timeout(&self, mut s: Sys) -> Option<Sys> {
        s.budget[3] -= 1;
        s.now += TXN_TIMEOUT_MS + 1;
        s.broker.tick(s.now);
        Some(s)
    }

    /// `AdoptClaim(i)`: `plan_adoption`, then claim (create-only) or resume an adoption.
    fn step_adopt_claim(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let steps = plan_adoption(PREFIXES[i as usize], &s.views(), ADOPTION_TIMEOUT);
        let step = steps.first()?;
        let v = PREFIXES.iter().position(|p| *p == step.prefix())? as u8;
        if let AdoptionStep::Claim { .. } = step {
            if s.registry[v as usize].claim.is_some() {
                return None;
            }
            s.registry[v as usize].claim = Some(i);
        }
        s.proc_mut(Who::Live(i))?.adopt = Some(Adopting::Claimed(v));
        Some(s)
    }

    /// `AdoptFence(i)`: the adopter fences the adopted prefix (`InitProducer`).
    fn step_adopt_fence(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let now = s.now;
        let bug = self.cfg.bug;
        let Some(Adopting::Claimed(v)) = s.proc(Who::Live(i))?.adopt else { return None };
        let epoch = if bug == Bug::AdoptWithoutFence {
            // Decide with whatever epoch the adopted prefix's transactions carry.
            s.broker.pending(GROUP, PREFIXES[v as usize]).first().map_or(0, |p| p.epoch)
        } else {
            match s.broker.init_producer(now, GROUP, PREFIXES[v as usize]) {
                Ok(e) => e,
                Err(_) => {
                    s.fail(Who::Live(i));
                    return Some(s);
                }
            }
        };
        s.owner[v as usize] += 1;
        let token = s.owner[v as usize];
        s.proc_mut(Who::Live(i))?.adopt = Some(Adopting::Fenced(v, epoch, token));
        Some(s)
    }

    /// `AdoptDecide(i)`: the adopter records its plan and decides the adopted prefix's transactions.
    fn step_adopt_decide(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let bug = self.cfg.bug;
        let Some(Adopting::Fenced(v, epoch, token)) = s.proc(Who::Live(i))?.adopt else { return None };
        let restored = match s.registry[v as usize].plan {
            Some(plan) => plan,
            None => {
                let plan = resolve(&s.observed(v), &RetentionPolicy::default()).restored_id();
                s.registry[v as usize].plan = Some(plan);
                plan
            }
        };
        let actions = s.recovery_plan(v, restored, Bug::None);
        if s.carry_out(v, &actions, epoch, token, bug).is_err() {
            s.fail(Who::Live(i));
        } else {
            s.proc_mut(Who::Live(i))?.adopt = Some(Adopting::Decided(v));
        }
        Some(s)
    }

    /// `AdoptDone(i)`: the adopter records the adoption done.
    fn step_adopt_done(&self, mut s: Sys, i: u8) -> Option<Sys> {
        let a = s.proc(Who::Live(i))?.adopt?;
        s.registry[a.victim() as usize].done = true;
        s.proc_mut(Who::Live(i))?.adopt = None;
        Some(s)
    }

    /// `Vanish(i)`: the paused incarnation never comes back.
    fn step_vanish(&self, mut s: Sys, i: u8) -> Option<Sys> {
        s.slots[i as usize].zombie.take()?;
        Some(s)
    }

    /// `Time`: the fair clock, when nothing else can happen (see `Action::Time`).
    fn step_time(&self, mut s: Sys) -> Option<Sys> {
        let mut others = Vec::new();
        self.actions(&s, &mut others);
        if others.into_iter().any(|a| a != Action::Time && self.step(&s, a).is_some()) {
            return None;
        }
        let lock = s.now + LOCK_MS + 1;
        if s.broker.tick(lock) {
            s.now = lock;
        } else {
            let timeout = s.now + TXN_TIMEOUT_MS + 1;
            if !s.broker.tick(timeout) {
                return None;
            }
            s.now = timeout;
        }
        Some(s)
    }
}
