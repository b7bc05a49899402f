//! The transaction state machine of KIP-1289, as a pure table.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use shareflow_share::{Error, Result};
use shareflow_share::{ProducerEpoch, ShareAcknowledgements, TopicPartition, TransactionId, TransactionState};

/// A transaction's number in the table; never reused, so a key that outlives its
/// transaction (removed after retention) cannot name another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct TxnKey(pub(crate) u64);

/// One transaction and everything staged in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Txn {
    pub(crate) id: TransactionId,
    pub(crate) state: TransactionState,
    pub(crate) epoch: ProducerEpoch,
    pub(crate) timeout_ms: u64,
    pub(crate) create_time_ms: u64,
    pub(crate) prepare_time_ms: Option<u64>,
    /// When it was committed or aborted.
    pub(crate) end_time_ms: Option<u64>,
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

/// A KIP-1289 coordinator operation, or a write into a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnOp {
    /// ShareBeginTransaction.
    Begin,
    /// SharePrepareTransaction.
    Prepare,
    /// ShareCommitTransaction.
    Commit,
    /// ShareAbortTransaction.
    Abort,
    /// ShareAcknowledgeTransactional: acknowledgements join the transaction.
    Acknowledge,
    /// Output produced into the transaction.
    Produce,
}

impl TxnOp {
    /// The verb used in messages.
    pub(crate) fn verb(self) -> &'static str {
        match self {
            TxnOp::Begin => "begin",
            TxnOp::Prepare => "prepare",
            TxnOp::Commit => "commit",
            TxnOp::Abort => "abort",
            TxnOp::Acknowledge => "acknowledge",
            TxnOp::Produce => "produce",
        }
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

/// The idempotency table of docs/design.md §3 ("Idempotency") for one operation on
/// one state.
///
/// `begin` of a PREPARE transaction returns the existing one, as the seed says
/// ("returns existing if already started"); nothing can be written into it any more.
/// `begin` of a decided id is an error: checkpoint ids are never reused.
pub(crate) fn step(op: TxnOp, id: &TransactionId, state: TransactionState) -> Result<Step> {
    use TransactionState as S;
    let step = match (op, state) {
        (TxnOp::Begin, S::Empty) => Some(Step::Apply),
        (TxnOp::Begin, S::Ongoing | S::Prepare) => Some(Step::NoOp),
        (TxnOp::Prepare, S::Ongoing) => Some(Step::Apply),
        (TxnOp::Prepare, S::Prepare) => Some(Step::NoOp),
        (TxnOp::Commit, S::Prepare) => Some(Step::Apply),
        (TxnOp::Commit, S::Committed) => Some(Step::NoOp),
        (TxnOp::Abort, S::Ongoing | S::Prepare) => Some(Step::Apply),
        (TxnOp::Abort, S::Aborted | S::Committed) => Some(Step::NoOp),
        (TxnOp::Acknowledge | TxnOp::Produce, S::Ongoing) => Some(Step::Apply),
        _ => None,
    };
    match (step, state) {
        (Some(step), _) => Ok(step),
        (None, S::Empty) => Err(Error::UnknownTransaction { txn: id.to_string() }),
        (None, state) => Err(Error::IllegalTransition { txn: id.to_string(), op: op.verb(), state }),
    }
}

/// Every transaction the broker knows, by id: the embedded broker's counterpart of the
/// state KIP-1289 keeps in `ShareTransactionState` records of `__share_group_state`,
/// which `ShareCoordinatorShard.replayEndTransactionMarker()` replays; here the journal
/// replays it. Indexes keep every call off the decided ones: `pending` holds ONGOING and PREPARE, `expiry` orders decided ones by
/// the time retention removes them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TxnTable {
    txns: BTreeMap<TxnKey, Txn>,
    by_id: HashMap<TransactionId, TxnKey>,
    pending: BTreeSet<TxnKey>,
    expiry: BTreeSet<(u64, TxnKey)>,
    next_key: u64,
    /// No ONGOING transaction has an earlier deadline.
    min_deadline_ms: u64,
}

impl TxnTable {
    pub(crate) fn key(&self, id: &TransactionId) -> Option<TxnKey> {
        self.by_id.get(id).copied()
    }

    pub(crate) fn state_of(&self, id: &TransactionId) -> TransactionState {
        self.get_by_id(id).map_or(TransactionState::Empty, |t| t.state)
    }

    pub(crate) fn get_by_id(&self, id: &TransactionId) -> Option<&Txn> {
        self.key(id).and_then(|k| self.txns.get(&k))
    }

    pub(crate) fn get(&self, key: TxnKey) -> Option<&Txn> {
        self.txns.get(&key)
    }

    pub(crate) fn get_mut(&mut self, key: TxnKey) -> Option<&mut Txn> {
        self.txns.get_mut(&key)
    }

    /// Adds a new ONGOING transaction.
    pub(crate) fn insert(&mut self, txn: Txn) -> TxnKey {
        let key = TxnKey(self.next_key);
        self.next_key += 1;
        if self.pending.is_empty() {
            self.min_deadline_ms = u64::MAX;
        }
        self.min_deadline_ms = self.min_deadline_ms.min(txn.deadline_ms());
        self.by_id.insert(txn.id.clone(), key);
        self.pending.insert(key);
        self.txns.insert(key, txn);
        key
    }

    /// Every transaction, decided ones included, in the order they began.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TxnKey, &Txn)> + '_ {
        self.txns.iter().map(|(k, t)| (*k, t))
    }

    /// ONGOING and PREPARE transactions only.
    pub(crate) fn pending(&self) -> impl Iterator<Item = (TxnKey, &Txn)> + '_ {
        self.pending.iter().filter_map(|k| self.txns.get(k).map(|t| (*k, t)))
    }

    /// Records that `key` was decided at `now_ms`; retention removes it at `remove_at_ms`.
    pub(crate) fn decided(&mut self, key: TxnKey, now_ms: u64, remove_at_ms: u64) {
        if let Some(t) = self.txns.get_mut(&key) {
            t.end_time_ms = Some(now_ms);
        }
        self.pending.remove(&key);
        self.expiry.insert((remove_at_ms, key));
    }

    /// Removes decided transactions whose retention has passed; returns their ids.
    pub(crate) fn purge(&mut self, now_ms: u64) -> Vec<TransactionId> {
        let mut removed = Vec::new();
        while let Some(&(at, key)) = self.expiry.first() {
            if at > now_ms {
                break;
            }
            self.expiry.pop_first();
            if let Some(t) = self.txns.remove(&key) {
                self.by_id.remove(&t.id);
                removed.push(t.id);
            }
        }
        removed
    }

    /// Transactions in the table, decided ones included.
    pub(crate) fn len(&self) -> usize {
        self.txns.len()
    }

    /// ONGOING transactions whose timeout has passed. Walks the pending ones only, and
    /// only once the earliest deadline has come.
    pub(crate) fn timed_out(&mut self, now_ms: u64) -> Vec<TxnKey> {
        if self.pending.is_empty() || now_ms < self.min_deadline_ms {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut next = u64::MAX;
        for (key, t) in self.pending() {
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

    /// Every row of KIP-1289's transition list and idempotency list.
    #[test]
    fn transition_table() {
        let id = TransactionId::new("g", "p", 1).unwrap();
        let ok = |s| Ok::<Step, ()>(s);
        let rows: &[(TxnOp, TransactionState, Result<Step, ()>)] = &[
            (TxnOp::Begin, Empty, ok(Step::Apply)),
            (TxnOp::Begin, Ongoing, ok(Step::NoOp)),
            (TxnOp::Begin, Prepare, ok(Step::NoOp)),
            (TxnOp::Begin, Committed, Err(())),
            (TxnOp::Begin, Aborted, Err(())),
            (TxnOp::Prepare, Empty, Err(())),
            (TxnOp::Prepare, Ongoing, ok(Step::Apply)),
            (TxnOp::Prepare, Prepare, ok(Step::NoOp)),
            (TxnOp::Prepare, Committed, Err(())),
            (TxnOp::Prepare, Aborted, Err(())),
            (TxnOp::Commit, Empty, Err(())),
            (TxnOp::Commit, Ongoing, Err(())),
            (TxnOp::Commit, Prepare, ok(Step::Apply)),
            (TxnOp::Commit, Committed, ok(Step::NoOp)),
            (TxnOp::Commit, Aborted, Err(())),
            (TxnOp::Abort, Empty, Err(())),
            (TxnOp::Abort, Ongoing, ok(Step::Apply)),
            (TxnOp::Abort, Prepare, ok(Step::Apply)),
            (TxnOp::Abort, Committed, ok(Step::NoOp)),
            (TxnOp::Abort, Aborted, ok(Step::NoOp)),
            (TxnOp::Acknowledge, Ongoing, ok(Step::Apply)),
            (TxnOp::Acknowledge, Prepare, Err(())),
            (TxnOp::Acknowledge, Committed, Err(())),
            (TxnOp::Acknowledge, Aborted, Err(())),
            (TxnOp::Acknowledge, Empty, Err(())),
            (TxnOp::Produce, Ongoing, ok(Step::Apply)),
            (TxnOp::Produce, Prepare, Err(())),
        ];
        for (op, state, expected) in rows {
            let got = step(*op, &id, *state);
            match (expected, &got) {
                (Ok(step), Ok(g)) => assert_eq!(step, g, "{op:?} on {state}"),
                (Err(()), Err(Error::UnknownTransaction { .. })) => assert_eq!(*state, Empty, "{op:?}"),
                (Err(()), Err(Error::IllegalTransition { state: s, .. })) => assert_eq!(s, state),
                _ => panic!("{op:?} on {state}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn illegal_transition_message_names_txn_and_state() {
        let id = TransactionId::new("orders", "job", 7).unwrap();
        let err = step(TxnOp::Commit, &id, Aborted).unwrap_err();
        assert_eq!(err.to_string(), "cannot commit transaction orders-job-7: it is ABORTED");
    }
}
