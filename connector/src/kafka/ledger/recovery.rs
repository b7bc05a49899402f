//! The recovery rules of the Kafka participant, as one pure function: from what the
//! broker says about a transaction T(n) that this instance does not hold live (a crash,
//! or an earlier attempt, left it behind) and what was asked of it, to what to do.
//! [`super::transactions`] observes (DescribeTransactions, ListTransactions) and
//! carries the action out; nothing here does I/O.
//!
//! What decides (`docs/decisions/kafka-exactly-once.md`, step 4):
//! - **Prepared** means the ledger topic is among T(n)'s partitions: prepare writes the
//!   commit entry into T(n), and nothing else writes to the ledger transactionally.
//! - Without KIP-939 a transaction whose producer is gone can only be committed by
//!   EndTxn with its producer id and epoch, and aborted by a new producer with its
//!   transactional id (a fence: InitProducerId aborts the open transaction).
//! - A transaction the broker no longer holds open (aborted by a timeout or a fence,
//!   expired, or never written to) can only be aborted: its output is gone.

use crate::kafka::client::{KafkaTxnDescription, KafkaTxnState};

/// What was asked about T(n), which this instance does not hold live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// Found open at the start of an attempt; nothing has decided it yet. `open` fences
    /// what can never commit, `pending` reports what waits for the runtime's decision.
    Found,
    /// Prepare it (the runtime's `PrepareAndCommit`, or a retried prepare).
    Prepare,
    /// Commit it: a completed checkpoint decided it.
    Commit,
    /// Abort it: no completed checkpoint covers it.
    Abort,
}

/// What to do with T(n).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecoveryAction {
    /// It is open and prepared: it waits for the runtime's decision (listed as pending
    /// and prepared; a prepare answers that it is prepared).
    AwaitDecision,
    /// EndTxn(commit) with the producer id and epoch the broker described.
    CommitByProducerId {
        /// The producer id the coordinator assigned to the transactional id.
        producer_id: i64,
        /// That producer's epoch, which EndTxn must name.
        epoch: i16,
    },
    /// Fence the transactional id: a new producer with it aborts the open transaction,
    /// and the old producer can write nothing more.
    Fence,
    /// The coordinator already decided to commit it: nothing to do.
    AlreadyCommitted,
    /// Nothing is open under the id (aborted, fenced, expired, or never written to):
    /// nothing to abort, and nothing left that could commit.
    AlreadyAborted,
    /// A checkpoint decided it, but the broker no longer holds it open (a transaction
    /// timeout shorter than the downtime): its output is lost, and the ledger replays
    /// its epoch. `state` is what the broker said (`None`: it does not know the id).
    Lost {
        /// The state the broker described.
        state: Option<KafkaTxnState>,
    },
    /// It is open, but never prepared and its producer is gone: what that producer
    /// still held is lost, so it cannot prepare (`state` as described), and a state
    /// this connector does not know is not guessed at.
    CannotPrepare {
        /// The state the broker described.
        state: KafkaTxnState,
    },
}

/// What to do with T(n), asked `request`, when DescribeTransactions says `described`
/// (`None`: the broker does not know the transactional id) and the job's ledger topic is
/// `ledger_topic`.
pub(crate) fn plan(request: Request, described: Option<&KafkaTxnDescription>, ledger_topic: &str) -> RecoveryAction {
    use KafkaTxnState as S;
    let state = described.map(|d| &d.state);
    let prepared = described.is_some_and(|d| d.topics.iter().any(|t| t == ledger_topic));
    match (request, described) {
        (Request::Commit, Some(d)) if d.state == S::Ongoing => {
            RecoveryAction::CommitByProducerId { producer_id: d.producer_id, epoch: d.producer_epoch }
        }
        (_, Some(d)) if d.state.is_committing() => RecoveryAction::AlreadyCommitted,
        (Request::Commit, _) => RecoveryAction::Lost { state: state.cloned() },
        (Request::Abort, Some(d)) if d.state == S::Ongoing => RecoveryAction::Fence,
        (Request::Abort, _) => RecoveryAction::AlreadyAborted,
        (Request::Found | Request::Prepare, Some(d)) if d.state == S::Ongoing && prepared => {
            RecoveryAction::AwaitDecision
        }
        (Request::Found, Some(d)) if d.state == S::Ongoing => RecoveryAction::Fence,
        (Request::Prepare, Some(d)) if matches!(d.state, S::Ongoing | S::Unknown(_)) => {
            RecoveryAction::CannotPrepare { state: d.state.clone() }
        }
        (Request::Found | Request::Prepare, _) => RecoveryAction::AlreadyAborted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEDGER: &str = "g-job-ledger";

    fn described(state: KafkaTxnState, topics: &[&str]) -> KafkaTxnDescription {
        KafkaTxnDescription {
            state,
            producer_id: 7001,
            producer_epoch: 3,
            topics: topics.iter().map(|t| t.to_string()).collect(),
        }
    }

    /// Every state the broker can describe, with the partitions an open transaction
    /// would have: a prepared one has the ledger among them.
    fn states() -> Vec<(&'static str, Option<KafkaTxnDescription>)> {
        use KafkaTxnState as S;
        vec![
            ("unknown id", None),
            ("empty", Some(described(S::Empty, &[]))),
            ("ongoing, unprepared", Some(described(S::Ongoing, &["out", "out"]))),
            ("ongoing, prepared", Some(described(S::Ongoing, &["out", LEDGER]))),
            ("prepare commit", Some(described(S::PrepareCommit, &["out", LEDGER]))),
            ("complete commit", Some(described(S::CompleteCommit, &[]))),
            ("prepare abort", Some(described(S::PrepareAbort, &["out"]))),
            ("complete abort", Some(described(S::CompleteAbort, &[]))),
            ("epoch fence", Some(described(S::PrepareEpochFence, &["out"]))),
            ("dead", Some(described(S::Dead, &[]))),
            ("unknown state", Some(described(S::Unknown("Preparing2PC".into()), &[LEDGER]))),
        ]
    }

    /// The expected action per request, one row per state of [`states`]. Derived from
    /// the protocol: only an Ongoing transaction can still be committed by producer id
    /// or aborted by a fence; PrepareCommit/CompleteCommit are decided commits; every
    /// other state ends aborted (or was never written), so its output is gone.
    #[test]
    fn the_plan_for_every_state_and_request() {
        use RecoveryAction as A;
        let commit = A::CommitByProducerId { producer_id: 7001, epoch: 3 };
        let lost = |s: Option<KafkaTxnState>| A::Lost { state: s };
        let table: Vec<[A; 4]> = {
            use KafkaTxnState as S;
            vec![
                // Found, Prepare, Commit, Abort
                [A::AlreadyAborted, A::AlreadyAborted, lost(None), A::AlreadyAborted],
                [A::AlreadyAborted, A::AlreadyAborted, lost(Some(S::Empty)), A::AlreadyAborted],
                // Open and never prepared: no checkpoint can cover it, so an attempt's
                // start fences it; a decided commit still commits it by producer id
                // (the runtime prepares first, and that prepare refuses).
                [A::Fence, A::CannotPrepare { state: S::Ongoing }, commit.clone(), A::Fence],
                [A::AwaitDecision, A::AwaitDecision, commit.clone(), A::Fence],
                [A::AlreadyCommitted, A::AlreadyCommitted, A::AlreadyCommitted, A::AlreadyCommitted],
                [A::AlreadyCommitted, A::AlreadyCommitted, A::AlreadyCommitted, A::AlreadyCommitted],
                [A::AlreadyAborted, A::AlreadyAborted, lost(Some(S::PrepareAbort)), A::AlreadyAborted],
                [A::AlreadyAborted, A::AlreadyAborted, lost(Some(S::CompleteAbort)), A::AlreadyAborted],
                [A::AlreadyAborted, A::AlreadyAborted, lost(Some(S::PrepareEpochFence)), A::AlreadyAborted],
                [A::AlreadyAborted, A::AlreadyAborted, lost(Some(S::Dead)), A::AlreadyAborted],
                // A state this connector does not know: nothing is fenced or committed
                // on a guess, and a prepare refuses rather than claims.
                [
                    A::AlreadyAborted,
                    A::CannotPrepare { state: S::Unknown("Preparing2PC".into()) },
                    lost(Some(S::Unknown("Preparing2PC".into()))),
                    A::AlreadyAborted,
                ],
            ]
        };
        let requests = [Request::Found, Request::Prepare, Request::Commit, Request::Abort];
        let states = states();
        assert_eq!(states.len(), table.len());
        for ((name, d), expected) in states.iter().zip(table) {
            for (request, want) in requests.iter().zip(expected) {
                assert_eq!(plan(*request, d.as_ref(), LEDGER), want, "{name}, asked {request:?}");
            }
        }
    }

    #[test]
    fn prepared_means_the_ledger_of_this_job_among_the_partitions() {
        let other_ledger = described(KafkaTxnState::Ongoing, &["out", "g-other-ledger"]);
        assert_eq!(plan(Request::Found, Some(&other_ledger), LEDGER), RecoveryAction::Fence);
        let ours = described(KafkaTxnState::Ongoing, &[LEDGER]);
        assert_eq!(plan(Request::Found, Some(&ours), LEDGER), RecoveryAction::AwaitDecision);
    }

    #[test]
    fn a_commit_names_the_described_producer_id_and_epoch() {
        let d =
            KafkaTxnDescription { producer_epoch: i16::MAX, producer_id: -5, ..described(KafkaTxnState::Ongoing, &[]) };
        assert_eq!(
            plan(Request::Commit, Some(&d), LEDGER),
            RecoveryAction::CommitByProducerId { producer_id: -5, epoch: i16::MAX }
        );
    }
}
