//! The model: its initial state, the actions enabled in a state, and the checker's
//! entry points (`Model` for stateright, plus the helpers the tests and traces use).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shareflow_broker::model::ModelBroker;
use shareflow_share::{AcknowledgementMode, ShareConfig};
use stateright::{Model, Property};

use crate::sys::tp;
use crate::{
    Action, Adopting, Bug, Config, Coord, Held, Life, Registry, Slot, Store, Sys, Who, ACTION_KINDS, INPUT, LOCK_MS,
    OUTPUT, TXN_TIMEOUT_MS,
};

/// The model.
pub struct ProtocolModel {
    /// Its configuration.
    pub cfg: Config,
    proto: Sys,
    share: ShareConfig,
    /// How often each action kind was taken (successfully) while checking.
    pub coverage: Arc<[AtomicU64; 20]>,
}

impl ProtocolModel {
    /// A model of `cfg`. The broker prototype is built once: every initial state is a
    /// clone of it, so states are hashed identically on every replay.
    pub fn new(cfg: Config) -> Self {
        let share = ShareConfig::builder()
            .acknowledgement_mode(AcknowledgementMode::Transactional)
            .record_lock_duration(Duration::from_millis(LOCK_MS))
            .transaction_timeout(Duration::from_millis(TXN_TIMEOUT_MS))
            .delivery_count_limit(cfg.delivery_limit)
            .build()
            .expect("valid share config");
        // Bug::AckBeforeStaging acknowledges outside transactions, which a group in
        // transactional mode refuses: that variant runs the group in explicit mode.
        let group_config = if cfg.bug == Bug::AckBeforeStaging {
            share.clone().with_acknowledgement_mode(AcknowledgementMode::Explicit)
        } else {
            share.clone()
        };
        let mut broker = ModelBroker::new(group_config);
        broker.create_topic(0, INPUT, 1).expect("topic");
        broker.create_topic(0, OUTPUT, 1).expect("topic");
        for r in 0..cfg.records {
            broker.produce(0, &tp(INPUT), &[format!("in-{r}").into_bytes()], None).expect("input");
        }
        let n = cfg.instances as usize;
        let proto = Sys {
            states: BTreeMap::new(),
            now: 0,
            broker,
            store: BTreeMap::new(),
            tombstones: BTreeSet::new(),
            slots: vec![Slot { life: Life::Down, zombie: None, last_epoch: 0 }; n],
            registry: vec![Registry::default(); n],
            budget: [cfg.crashes, cfg.pauses, cfg.lock_expiries, cfg.txn_timeouts, cfg.store_faults],
            owner: vec![0; n],
            violations: BTreeSet::new(),
        };
        Self { cfg, proto, share, coverage: Arc::new(Default::default()) }
    }

    /// Coverage: (action kind, times taken).
    pub fn coverage(&self) -> Vec<(&'static str, u64)> {
        ACTION_KINDS.iter().zip(self.coverage.iter()).map(|(k, c)| (*k, c.load(Ordering::Relaxed))).collect()
    }

    /// The share configuration a member joins with.
    pub(crate) fn member_config(&self) -> ShareConfig {
        if self.cfg.bug == Bug::AckBeforeStaging {
            self.share.clone().with_acknowledgement_mode(AcknowledgementMode::Explicit)
        } else {
            self.share.clone()
        }
    }
}

impl Model for ProtocolModel {
    type State = Sys;
    type Action = Action;

    fn init_states(&self) -> Vec<Sys> {
        vec![self.proto.clone()]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let bug = self.cfg.bug;
        for (i, slot) in s.slots.iter().enumerate() {
            let i = i as u8;
            match &slot.life {
                Life::Down => out.push(Action::Restart(i)),
                Life::Dead => {}
                Life::Recovering { .. } => out.push(Action::Recover(i)),
                Life::Recovered { .. } => out.push(Action::Start(i)),
                Life::Running(p) => {
                    if p.adopt.is_none() && s.slots.len() > 1 {
                        out.push(Action::AdoptClaim(i));
                    }
                    match p.adopt {
                        Some(Adopting::Claimed(_)) => out.push(Action::AdoptFence(i)),
                        Some(Adopting::Fenced(..)) => out.push(Action::AdoptDecide(i)),
                        Some(Adopting::Decided(_)) => out.push(Action::AdoptDone(i)),
                        None => {}
                    }
                    if s.budget[1] > 0 && slot.zombie.is_none() {
                        out.push(Action::Pause(i));
                    }
                }
            }
            if matches!(slot.life, Life::Running(_) | Life::Recovering { .. } | Life::Recovered { .. })
                && s.budget[0] > 0
            {
                out.push(Action::Crash(i));
            }
            if slot.zombie.is_some() {
                out.push(Action::Vanish(i));
            }
            for who in [Who::Live(i), Who::Zombie(i)] {
                let Some(p) = s.proc(who) else { continue };
                match p.rec {
                    None if p.cur <= self.cfg.checkpoints => out.push(Action::Poll(who)),
                    Some((_, Held::Polled)) => out.push(Action::Stage(who)),
                    Some((_, Held::Staged)) => out.push(Action::Sink(who)),
                    _ => {}
                }
                match &p.coord {
                    Coord::Idle => {
                        // Past the last checkpoint id the source polls no more, but the
                        // coordinator still checkpoints to finish earlier transactions
                        // (a failed manifest write leaves T(n) prepared for the next
                        // checkpoint to commit), as the runtime's timer would.
                        let earlier = p.uncommitted.iter().any(|&k| k < p.cur);
                        // Keyed state to emit is work too (only `Bug::EmitTwice` restores
                        // a count marked changed).
                        let work = p.dirty || earlier || p.changed;
                        if p.rec.is_none() && (p.cur <= self.cfg.checkpoints || earlier) && work {
                            out.push(Action::Barrier(who));
                        }
                    }
                    Coord::Barriered(_) => out.push(Action::Prepare(who)),
                    Coord::Prepared(..) | Coord::CommittedEarly(..) => {
                        if bug == Bug::CommitBeforeManifest && matches!(p.coord, Coord::Prepared(..)) {
                            out.push(Action::Commit(who));
                        } else {
                            out.push(Action::WriteManifest(who, Store::Ok));
                            if s.budget[4] > 0 {
                                out.push(Action::WriteManifest(who, Store::Error));
                                out.push(Action::WriteManifest(who, Store::AppliedThenTimeout));
                            }
                        }
                    }
                    Coord::Manifested(_) => out.push(Action::Commit(who)),
                }
            }
        }
        if s.budget[2] > 0 {
            out.push(Action::LockExpiry);
        }
        if s.budget[3] > 0 {
            out.push(Action::TxnTimeout);
        }
        if !s.quiescent(self.cfg.records) {
            out.push(Action::Time);
        }
    }

    fn next_state(&self, s: &Sys, action: Action) -> Option<Sys> {
        let next = self.step(s, action);
        if next.is_some() {
            self.coverage[action.kind()].fetch_add(1, Ordering::Relaxed);
        }
        next
    }

    fn properties(&self) -> Vec<Property<Self>> {
        self.all_properties()
    }
}

impl ProtocolModel {
    /// Some event can still happen in `s` (it is not a terminal state).
    pub fn can_move(&self, s: &Sys) -> bool {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.into_iter().any(|a| self.step(s, a).is_some())
    }

    /// Every state `s` can move to, for the cycle search of the liveness test.
    pub fn successors(&self, s: &Sys) -> Vec<Sys> {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        actions.into_iter().filter_map(|a| self.step(s, a)).collect()
    }

    /// A readable trace: each action, then the state it led to.
    pub fn explain(&self, path: &stateright::Path<Sys, Action>) -> String {
        let mut out = String::new();
        let states = path.clone().into_vec();
        let _ = writeln!(out, "  init: {}", states[0].0.summary(self.cfg.records));
        for (step, (_, action)) in states.iter().enumerate() {
            let Some(action) = action else { continue };
            let next = &states[step + 1].0;
            let _ = writeln!(out, "  {:>2}. {action:?}\n      -> {}", step + 1, next.summary(self.cfg.records));
        }
        if let Some((last, _)) = states.last() {
            for v in &last.violations {
                let _ = writeln!(out, "  violation: {v}");
            }
        }
        out
    }
}
