//! What the model reads off a state (shared by the properties, the steps and the
//! traces), and the operations on a state that several steps share.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use shareflow_checkpoint::manifest::{Manifest, ParticipantState, TransactionRecord};
use shareflow_checkpoint::protocol::{
    plan_recovery, InstanceView, ManifestStatus, Observed, ObservedCheckpoint, PendingTxn, TxnAction,
};
use shareflow_share::{RecordState, TopicPartition, TransactionId, TransactionState};

use crate::{Bug, Coord, Life, Proc, Sys, Who, ADOPTION_TIMEOUT, GROUP, INPUT, OUTPUT, PREFIXES};

/// Partition 0 of `topic`.
pub(crate) fn tp(topic: &str) -> TopicPartition {
    TopicPartition::new(topic, 0)
}

/// The transaction id T(k) of instance i.
pub(crate) fn txn(i: u8, k: u64) -> TransactionId {
    TransactionId::new(GROUP, PREFIXES[i as usize], k).expect("valid id")
}

/// The input offset an output value names (-1 if it names none).
fn decode_offset(v: &[u8]) -> i64 {
    std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()).unwrap_or(-1)
}

impl Sys {
    /// The state of each input record (offset = index).
    pub fn records(&self, n: u8) -> Vec<RecordState> {
        (0..n as i64)
            .map(|o| self.broker.record_status(GROUP, &tp(INPUT), o).map_or(RecordState::Available, |s| s.state))
            .collect()
    }

    /// How often each input record appears in committed output (committed
    /// transactions, whether or not the last stable offset lets a reader see them yet).
    pub fn outputs(&self, n: u8) -> Vec<usize> {
        self.count(n, self.broker.committed_values(&tp(OUTPUT)))
    }

    /// (Stateful) the committed upsert rows' counts, in log order.
    pub fn committed_counts(&self) -> Vec<u64> {
        self.broker
            .committed_values(&tp(OUTPUT))
            .iter()
            .filter_map(|v| std::str::from_utf8(v).ok()?.strip_prefix("count=")?.parse().ok())
            .collect()
    }

    /// How often each input record appears to a read_committed reader.
    pub fn readable_outputs(&self, n: u8) -> Vec<usize> {
        self.count(n, self.broker.read_committed(&tp(OUTPUT)))
    }

    fn count(&self, n: u8, values: Vec<Vec<u8>>) -> Vec<usize> {
        let mut count = vec![0; n as usize];
        for v in values {
            if let Some(c) = usize::try_from(decode_offset(&v)).ok().and_then(|o| count.get_mut(o)) {
                *c += 1;
            }
        }
        count
    }

    fn has_manifest_at_or_above(&self, i: u8, k: u64) -> bool {
        self.store.range((i, k)..=(i, u64::MAX)).next().is_some()
    }

    /// What `CheckpointStore::observe` reports for instance i: its manifests, with a
    /// tombstone deciding over whatever manifest sits under it.
    pub(crate) fn observed(&self, i: u8) -> Observed {
        let mut ids: BTreeSet<u64> = self.store.range((i, 0)..=(i, u64::MAX)).map(|(&(_, id), _)| id).collect();
        ids.extend(self.tombstones.range((i, 0)..=(i, u64::MAX)).map(|&(_, id)| id));
        let checkpoints = ids
            .into_iter()
            .map(|id| ObservedCheckpoint {
                checkpoint_id: id,
                manifest: match self.store.get(&(i, id)) {
                    _ if self.tombstones.contains(&(i, id)) => ManifestStatus::Aborted,
                    None => ManifestStatus::Missing,
                    Some(txns) => ManifestStatus::Valid(Manifest {
                        job_id: PREFIXES[i as usize].into(),
                        checkpoint_id: id,
                        created_at_ms: 0,
                        state_files: vec![],
                        transactions: txns
                            .iter()
                            .map(|&k| TransactionRecord {
                                participant: "broker".into(),
                                transaction_id: txn(i, k).to_string(),
                                state: ParticipantState::Prepared,
                            })
                            .collect(),
                    }),
                },
                files: BTreeMap::new(),
            })
            .collect();
        Observed { checkpoints, failed_verification: BTreeMap::new() }
    }

    pub(crate) fn views(&self) -> Vec<InstanceView> {
        self.slots
            .iter()
            .enumerate()
            .map(|(v, s)| InstanceView {
                prefix: PREFIXES[v].into(),
                silent_for: match s.life {
                    Life::Down | Life::Dead => ADOPTION_TIMEOUT * 2,
                    _ => Duration::ZERO,
                },
                retired: false,
                adopted_by: self.registry[v].claim.map(|a| PREFIXES[a as usize].to_string()),
                adoption_done: self.registry[v].done,
            })
            .collect()
    }

    /// A commit of T(k) of instance i by an owner holding `token` was applied: check it.
    pub(crate) fn note_commit(&mut self, i: u8, k: u64, token: u8) {
        if !self.has_manifest_at_or_above(i, k) {
            self.violations.insert(format!("commit of {} with no manifest >= {k} in the store", txn(i, k)));
        }
        if token != self.owner[i as usize] {
            self.violations.insert(format!(
                "commit of {} by a stale owner (token {token}, prefix owned by token {})",
                txn(i, k),
                self.owner[i as usize]
            ));
        }
    }

    /// Carries out a recovery plan for instance i's transactions with `epoch`. Before it
    /// aborts T(n) it creates the tombstone of checkpoint n, as the runtime's recovery
    /// does (unless `bug` is `NoTombstone`).
    pub(crate) fn carry_out(
        &mut self,
        i: u8,
        plan: &[TxnAction],
        epoch: u32,
        token: u8,
        bug: Bug,
    ) -> Result<(), String> {
        let now = self.now;
        for a in plan {
            let id = txn(i, a.checkpoint_id());
            match *a {
                TxnAction::Commit { checkpoint_id, .. } => {
                    if self.broker.commit(now, &id, epoch).map_err(|e| e.to_string())? {
                        self.note_commit(i, checkpoint_id, token);
                    }
                }
                TxnAction::PrepareAndCommit { checkpoint_id, .. } => {
                    self.broker.prepare(now, &id, epoch).map_err(|e| e.to_string())?;
                    if self.broker.commit(now, &id, epoch).map_err(|e| e.to_string())? {
                        self.note_commit(i, checkpoint_id, token);
                    }
                }
                TxnAction::Abort { checkpoint_id, .. } => {
                    // A tombstone may only mark a checkpoint no manifest decided yet:
                    // recovery never aborts what a manifest committed to.
                    if self.store.contains_key(&(i, checkpoint_id)) {
                        self.violations.insert(format!("abort of {id}, which manifest {checkpoint_id} decided"));
                    }
                    if bug != Bug::NoTombstone {
                        self.tombstones.insert((i, checkpoint_id));
                    }
                    self.broker.abort(now, &id, epoch).map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn recovery_plan(&self, i: u8, restored: Option<u64>, bug: Bug) -> Vec<TxnAction> {
        let pending: Vec<PendingTxn> = self
            .broker
            .pending(GROUP, PREFIXES[i as usize])
            .into_iter()
            .map(|p| PendingTxn {
                participant: 0,
                checkpoint_id: p.id.checkpoint_id(),
                prepared: p.state == TransactionState::Prepare,
            })
            .collect();
        let mut plan = plan_recovery(restored, &pending);
        if bug == Bug::RecoveryLeavesPrepared {
            let prepared: BTreeSet<u64> = pending.iter().filter(|p| p.prepared).map(|p| p.checkpoint_id).collect();
            plan.retain(|a| !prepared.contains(&a.checkpoint_id()));
        }
        if bug == Bug::RecoveryAbortsDecided {
            return plan
                .into_iter()
                .map(|a| TxnAction::Abort { participant: 0, checkpoint_id: a.checkpoint_id() })
                .collect();
        }
        plan
    }

    pub(crate) fn proc_mut(&mut self, who: Who) -> Option<&mut Proc> {
        match who {
            Who::Live(i) => match &mut self.slots[i as usize].life {
                Life::Running(p) => Some(p),
                _ => None,
            },
            Who::Zombie(i) => self.slots[i as usize].zombie.as_mut(),
        }
    }

    pub(crate) fn proc(&self, who: Who) -> Option<&Proc> {
        match who {
            Who::Live(i) => match &self.slots[i as usize].life {
                Life::Running(p) => Some(p),
                _ => None,
            },
            Who::Zombie(i) => self.slots[i as usize].zombie.as_ref(),
        }
    }

    /// The process fails (an error from the broker): a live one goes down and restarts
    /// later; a zombie stops for good.
    pub(crate) fn fail(&mut self, who: Who) {
        match who {
            Who::Live(i) => self.slots[i as usize].life = Life::Down,
            Who::Zombie(i) => self.slots[i as usize].zombie = None,
        }
    }

    /// Everything is settled: every instance recovered and idle (or adopted), nothing
    /// left to poll, no zombie.
    pub fn quiescent(&self, n: u8) -> bool {
        let idle = self.slots.iter().enumerate().all(|(i, s)| {
            s.zombie.is_none()
                && match &s.life {
                    Life::Running(p) => {
                        p.rec.is_none()
                            && p.coord == Coord::Idle
                            && p.adopt.is_none()
                            && !p.dirty
                            && p.uncommitted.iter().all(|&k| k == p.cur)
                    }
                    Life::Down | Life::Dead => self.registry[i].done,
                    _ => false,
                }
        });
        idle && self.records(n).iter().all(|s| !matches!(s, RecordState::Available | RecordState::Acquired))
    }

    /// A live instance has begun a transaction past the configuration's last checkpoint
    /// id, so it polls no more: the model's bound.
    pub fn at_bound(&self, checkpoints: u64) -> bool {
        self.slots.iter().any(|s| matches!(&s.life, Life::Running(p) if p.cur > checkpoints))
    }

    /// Some transaction is PREPARE.
    pub fn any_prepared(&self) -> bool {
        self.broker.all_pending().iter().any(|p| p.state == TransactionState::Prepare)
    }

    /// A short, readable summary of the state, for traces.
    pub fn summary(&self, n: u8) -> String {
        let mut s = String::new();
        let recs: Vec<String> = self
            .records(n)
            .iter()
            .zip(self.outputs(n))
            .enumerate()
            .map(|(o, (st, out))| format!("r{o}:{st:?}/out×{out}"))
            .collect();
        let _ = write!(s, "t={}ms records[{}]", self.now, recs.join(" "));
        let pending: Vec<String> =
            self.broker.all_pending().iter().map(|p| format!("{}:{:?}@e{}", p.id, p.state, p.epoch)).collect();
        let _ = write!(s, " pending[{}]", pending.join(" "));
        let store: Vec<String> =
            self.store.iter().map(|((i, id), t)| format!("{}/chk-{id}{:?}", PREFIXES[*i as usize], t)).collect();
        let _ = write!(s, " store[{}]", store.join(" "));
        if !self.tombstones.is_empty() {
            let t: Vec<String> =
                self.tombstones.iter().map(|(i, id)| format!("{}/chk-{id}", PREFIXES[*i as usize])).collect();
            let _ = write!(s, " tombstones[{}]", t.join(" "));
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let life = match &slot.life {
                Life::Running(p) => format!(
                    "running(e{} cur={} unc={:?} rec={:?} {:?}{})",
                    p.epoch,
                    p.cur,
                    p.uncommitted,
                    p.rec,
                    p.coord,
                    p.adopt.map(|a| format!(" adopting {a:?}")).unwrap_or_default()
                ),
                other => format!("{other:?}"),
            };
            let _ = write!(s, " | {}: {life}", PREFIXES[i]);
            if let Some(z) = &slot.zombie {
                let _ = write!(s, " zombie(e{} cur={} rec={:?} {:?})", z.epoch, z.cur, z.rec, z.coord);
            }
            let r = &self.registry[i];
            if r.claim.is_some() {
                let _ =
                    write!(s, " claim={:?} plan={:?} done={}", r.claim.map(|c| PREFIXES[c as usize]), r.plan, r.done);
            }
        }
        s
    }
}
