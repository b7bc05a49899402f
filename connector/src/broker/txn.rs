//! The transaction state machine of KIP-1289, as a pure table.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::share::{ProducerEpoch, ShareAcknowledgements, TopicPartition, TransactionId, TransactionState};

/// Index of a transaction in the table; stable for the table's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct TxnKey(pub(crate) u32);

/// One transaction and everything staged in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Txn {
    pub(crate) id: TransactionId,
    pub(crate) state: TransactionState,
    pub(crate) epoch: ProducerEpoch,
    pub(crate) timeout_ms: u64,
    pub(crate) create_time_ms: u64,
    pub(crate) prepare_time_ms: Option<u64>,
    /// Acknowledgements staged in the transaction; cleared once it is decided.
    pub(crate) acks: ShareAcknowledgements,
    /// Batches produced into it: partition and base offset.
    pub(crate) produced: Vec<(TopicPartition, i64)>,
    pub(crate) produced_records: u64,
}

impl Txn {
    pub(crate) fn deadline_ms(&self) -> u64 {
        self.create_time_ms.saturating_add(self.timeout_ms)
    }
}

/// What a coordinator call does, decided from the current state alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Change state and apply the effects.
    Apply,
    /// Already there: an idempotent repeat.
    NoOp,
}

/// The idempotency table of DESIGN.md §3 for one operation on one state.
pub(crate) fn decide(op: &'static str, id: &TransactionId, state: TransactionState) -> Result<Step> {
    use TransactionState::*;
    let step = match (op, state) {
        ("begin", Empty) => Some(Step::Apply),
        ("begin", Ongoing) => Some(Step::NoOp),
        ("prepare", Ongoing) => Some(Step::Apply),
        ("prepare", Prepare) => Some(Step::NoOp),
        ("commit", Prepare) => Some(Step::Apply),
        ("commit", Committed) => Some(Step::NoOp),
        ("abort", Ongoing | Prepare) => Some(Step::Apply),
        ("abort", Aborted | Committed) => Some(Step::NoOp),
        ("acknowledge" | "produce", Ongoing) => Some(Step::Apply),
        _ => None,
    };
    match (step, state) {
        (Some(step), _) => Ok(step),
        (None, Empty) => Err(Error::UnknownTransaction { txn: id.to_string() }),
        (None, state) => Err(Error::IllegalTransition { txn: id.to_string(), op, state }),
    }
}

/// Every transaction the broker knows, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TxnTable {
    txns: Vec<Txn>,
    by_id: HashMap<TransactionId, TxnKey>,
    /// No ONGOING transaction has an earlier deadline.
    min_deadline_ms: u64,
}

impl TxnTable {
    pub(crate) fn key(&self, id: &TransactionId) -> Option<TxnKey> {
        self.by_id.get(id).copied()
    }

    pub(crate) fn state_of(&self, id: &TransactionId) -> TransactionState {
        self.key(id).map_or(TransactionState::Empty, |k| self.txns[k.0 as usize].state)
    }

    pub(crate) fn get(&self, key: TxnKey) -> &Txn {
        &self.txns[key.0 as usize]
    }

    pub(crate) fn get_mut(&mut self, key: TxnKey) -> &mut Txn {
        &mut self.txns[key.0 as usize]
    }

    pub(crate) fn insert(&mut self, txn: Txn) -> TxnKey {
        let key = TxnKey(self.txns.len() as u32);
        if self.txns.is_empty() {
            self.min_deadline_ms = u64::MAX;
        }
        self.min_deadline_ms = self.min_deadline_ms.min(txn.deadline_ms());
        self.by_id.insert(txn.id.clone(), key);
        self.txns.push(txn);
        key
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (TxnKey, &Txn)> + '_ {
        self.txns.iter().enumerate().map(|(i, t)| (TxnKey(i as u32), t))
    }

    /// ONGOING transactions whose timeout has passed.
    pub(crate) fn timed_out(&mut self, now_ms: u64) -> Vec<TxnKey> {
        if self.txns.is_empty() || now_ms < self.min_deadline_ms {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut next = u64::MAX;
        for (key, t) in self.iter() {
            if t.state == TransactionState::Ongoing {
                if t.deadline_ms() <= now_ms {
                    out.push(key);
                } else {
                    next = next.min(t.deadline_ms());
                }
            }
        }
        self.min_deadline_ms = next;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransactionState::*;

    /// Every row of seed 000's transition list and idempotency list.
    #[test]
    fn transition_table() {
        let id = TransactionId::new("g", "p", 1).unwrap();
        let ok = |s| Ok::<Step, ()>(s);
        let rows: &[(&str, TransactionState, Result<Step, ()>)] = &[
            ("begin", Empty, ok(Step::Apply)),
            ("begin", Ongoing, ok(Step::NoOp)),
            ("begin", Prepare, Err(())),
            ("begin", Committed, Err(())),
            ("begin", Aborted, Err(())),
            ("prepare", Empty, Err(())),
            ("prepare", Ongoing, ok(Step::Apply)),
            ("prepare", Prepare, ok(Step::NoOp)),
            ("prepare", Committed, Err(())),
            ("prepare", Aborted, Err(())),
            ("commit", Empty, Err(())),
            ("commit", Ongoing, Err(())),
            ("commit", Prepare, ok(Step::Apply)),
            ("commit", Committed, ok(Step::NoOp)),
            ("commit", Aborted, Err(())),
            ("abort", Empty, Err(())),
            ("abort", Ongoing, ok(Step::Apply)),
            ("abort", Prepare, ok(Step::Apply)),
            ("abort", Committed, ok(Step::NoOp)),
            ("abort", Aborted, ok(Step::NoOp)),
            ("acknowledge", Ongoing, ok(Step::Apply)),
            ("acknowledge", Prepare, Err(())),
            ("acknowledge", Committed, Err(())),
            ("acknowledge", Aborted, Err(())),
            ("acknowledge", Empty, Err(())),
            ("produce", Ongoing, ok(Step::Apply)),
            ("produce", Prepare, Err(())),
        ];
        for (op, state, expected) in rows {
            let got = decide(op, &id, *state);
            match (expected, &got) {
                (Ok(step), Ok(g)) => assert_eq!(step, g, "{op} on {state}"),
                (Err(()), Err(Error::UnknownTransaction { .. })) => assert_eq!(*state, Empty, "{op}"),
                (Err(()), Err(Error::IllegalTransition { state: s, .. })) => assert_eq!(s, state),
                _ => panic!("{op} on {state}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn illegal_transition_message_names_txn_and_state() {
        let id = TransactionId::new("orders", "job", 7).unwrap();
        let err = decide("commit", &id, Aborted).unwrap_err();
        assert_eq!(err.to_string(), "cannot commit transaction orders-job-7: it is ABORTED");
    }
}
