//! The properties the checker verifies: the safety invariants, the liveness property
//! and the `sometimes` properties that show the interesting states are reached.

use shareflow_share::{RecordState, TransactionState};
use stateright::Property;

use crate::sys::txn;
use crate::ProtocolModel;

impl ProtocolModel {
    /// The properties of the model, in the order the checker reports them (what
    /// `Model::properties` returns).
    pub(crate) fn all_properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::<Self>::always("every record in committed output at most once", |m, s| {
                s.outputs(m.cfg.records).iter().all(|&c| c <= 1)
            }),
            Property::<Self>::always("acks and output visible together", |m, s| {
                let n = m.cfg.records;
                s.records(n).iter().zip(s.outputs(n)).all(|(st, out)| (*st == RecordState::Acknowledged) == (out >= 1))
            }),
            Property::<Self>::always("no commit without a manifest that decided it", |_, s| {
                !s.violations.iter().any(|v| v.contains("no manifest"))
            }),
            Property::<Self>::always("no two owners commit for one prefix", |_, s| {
                !s.violations.iter().any(|v| v.contains("stale owner"))
            }),
            Property::<Self>::always("a manifest's transactions are never aborted", |_, s| {
                // A tombstoned checkpoint decides nothing: a fenced zombie may still
                // create its manifest after recovery aborted its transactions. Recovery
                // itself never aborts (nor tombstones) what a manifest already decided.
                !s.violations.iter().any(|v| v.contains("which manifest"))
                    && s.store.iter().filter(|(key, _)| !s.tombstones.contains(key)).all(|(&(i, _), ks)| {
                        ks.iter().all(|&k| s.broker.txn_state(&txn(i, k)) != TransactionState::Aborted)
                    })
            }),
            Property::<Self>::always("recovery never restores a checkpoint whose transactions aborted", |_, s| {
                !s.violations.iter().any(|v| v.contains("restored checkpoint"))
            }),
            Property::<Self>::always("at quiescence: exactly once or archived, nothing locked, no PREPARE", |m, s| {
                let n = m.cfg.records;
                if !s.quiescent(n) {
                    return true;
                }
                let ok_records = s.records(n).iter().zip(s.outputs(n)).all(|(st, out)| match st {
                    RecordState::Acknowledged => out == 1,
                    RecordState::Archived => out == 0,
                    _ => false,
                });
                ok_records
                    && s.readable_outputs(n) == s.outputs(n)
                    && s.broker.all_pending().iter().all(|p| p.state != TransactionState::Prepare)
            }),
            // Liveness. The state graph is finite and acyclic (the test
            // `the_state_graph_has_no_cycle` checks it), so every path ends in a state
            // where nothing can happen. If every such state is quiescent, then by the
            // property above every PREPARE transaction is eventually decided, on every
            // path, with no fairness assumption needed.
            // A live instance past the configuration's last checkpoint id stops polling:
            // that is the model's bound, not the protocol's, so such a state may end a
            // path, but never with a PREPARE transaction left.
            Property::<Self>::always("a state where no event can happen is quiescent (no deadlock)", |m, s| {
                s.quiescent(m.cfg.records) || m.can_move(s) || (s.at_bound(m.cfg.checkpoints) && !s.any_prepared())
            }),
            Property::<Self>::eventually("every PREPARE transaction is eventually decided", |m, s| {
                (s.quiescent(m.cfg.records) || s.at_bound(m.cfg.checkpoints)) && !s.any_prepared()
            }),
            Property::<Self>::sometimes("quiescent with every record output", |m, s| {
                s.quiescent(m.cfg.records) && s.outputs(m.cfg.records).iter().all(|&c| c == 1)
            }),
        ];
        if self.cfg.stateful {
            props.push(Property::<Self>::always("a result is emitted at most once", |_, s| {
                // Each upsert row is a new running count: a value twice is a result
                // emitted twice (a window emitted again, for a windowed query).
                let counts = s.committed_counts();
                counts.windows(2).all(|w| w[0] < w[1])
            }));
            props.push(Property::<Self>::always(
                "at quiescence: the last count is the records acknowledged",
                |m, s| {
                    if !s.quiescent(m.cfg.records) {
                        return true;
                    }
                    let acked = s.records(m.cfg.records).iter().filter(|st| **st == RecordState::Acknowledged).count();
                    s.committed_counts().last().copied().unwrap_or(0) == acked as u64
                },
            ));
            props.push(Property::<Self>::sometimes("quiescent after a crash with the count restored", |m, s| {
                s.budget[0] < m.cfg.crashes && s.quiescent(m.cfg.records) && s.committed_counts().len() > 1
            }));
        }
        if self.cfg.crashes > 0 {
            props.push(Property::<Self>::sometimes("quiescent after a crash", |m, s| {
                s.budget[0] < m.cfg.crashes && s.quiescent(m.cfg.records)
            }));
        }
        if self.cfg.pauses > 0 {
            props.push(Property::<Self>::sometimes("quiescent after a paused incarnation stopped", |m, s| {
                s.budget[1] < m.cfg.pauses && s.quiescent(m.cfg.records)
            }));
        }
        if self.cfg.delivery_limit == 2 && self.cfg.lock_expiries > 0 && self.cfg.crashes > 0 {
            props.push(Property::<Self>::sometimes("a record archived at the delivery limit", |m, s| {
                s.records(m.cfg.records).contains(&RecordState::Archived)
            }));
        }
        if self.cfg.instances > 1 {
            props.push(Property::<Self>::sometimes("an adoption done", |_, s| s.registry.iter().any(|r| r.done)));
        }
        props
    }
}
