//! One conformance suite for `TransactionParticipant` (issue 10, item 4), run against
//! every implementation that needs no server: the embedded broker (`BrokerTransactions`),
//! the file sink (`FileCommitter`) and the runtime's test participant (`CollectSink`).
//!
//! The contract, as the coordinator and recovery rely on it:
//! - `begin`, `prepare`, `commit` and `abort` are idempotent by transaction id;
//! - `prepare` of an aborted transaction answers `false` (it cannot commit);
//! - a prepared transaction is listed by `pending` and commits after a restart;
//! - `abort` of an unknown id is harmless: `Ok`, or an `Invalid` error, never a panic;
//! - where the participant fences (the broker), a stale instance can decide nothing.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::FileCommitter;
use shareflow::runtime::testing::CollectSink;
use shareflow::runtime::{ErrorKind, Participant, PrepareOutcome, TransactionTemplate};

const GROUP: &str = "conformance";
const PREFIX: &str = "job";

/// A participant implementation under test: `instance()` makes a new instance on the
/// same durable backing (a restart of the job).
struct Backend {
    name: &'static str,
    instance: Box<dyn Fn() -> Participant>,
    fences: bool,
}

async fn backends() -> Vec<Backend> {
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory()).await.unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let collect = CollectSink::new();
    vec![
        Backend {
            name: "embedded broker",
            instance: Box::new(move || BrokerTransactions::new(broker.clone(), Duration::from_secs(60)) as Participant),
            fences: true,
        },
        Backend {
            name: "file sink",
            instance: Box::new(move || FileCommitter::new(store.clone(), "files") as Participant),
            fences: false,
        },
        Backend { name: "collect sink", instance: Box::new(move || collect.participant()), fences: false },
    ]
}

fn template() -> TransactionTemplate {
    TransactionTemplate::new(GROUP, PREFIX).unwrap()
}

async fn opened(backend: &Backend) -> Participant {
    let p = (backend.instance)();
    p.open(&template()).await.unwrap();
    p
}

#[tokio::test]
async fn begin_prepare_commit_abort_are_idempotent() {
    for b in backends().await {
        let p = opened(&b).await;
        let t1 = template().transaction(1);
        p.begin(&t1).await.unwrap();
        p.begin(&t1).await.unwrap();
        assert_eq!(p.prepare(&t1).await.unwrap(), PrepareOutcome::Prepared, "{}", b.name);
        assert_eq!(p.prepare(&t1).await.unwrap(), PrepareOutcome::Prepared, "{}: prepare twice", b.name);
        p.commit(&t1).await.unwrap();
        p.commit(&t1).await.unwrap();
        p.abort(&t1).await.unwrap_or_else(|e| panic!("{}: abort of a committed transaction is a no-op: {e}", b.name));
        let pending = p.pending(&template()).await.unwrap();
        assert!(pending.iter().all(|t| t.id != t1), "{}: a committed transaction is not pending", b.name);

        let t2 = template().transaction(2);
        p.begin(&t2).await.unwrap();
        p.abort(&t2).await.unwrap();
        p.abort(&t2).await.unwrap();
        assert_eq!(
            p.prepare(&t2).await.unwrap(),
            PrepareOutcome::AlreadyAborted,
            "{}: an aborted transaction cannot prepare",
            b.name
        );
        let pending = p.pending(&template()).await.unwrap();
        assert!(pending.iter().all(|t| t.id != t2), "{}: an aborted transaction is not pending", b.name);
    }
}

#[tokio::test]
async fn a_prepared_transaction_commits_after_a_restart() {
    for b in backends().await {
        let first = opened(&b).await;
        let t = template().transaction(3);
        first.begin(&t).await.unwrap();
        assert_eq!(first.prepare(&t).await.unwrap(), PrepareOutcome::Prepared);
        drop(first);
        let second = opened(&b).await;
        let pending = second.pending(&template()).await.unwrap();
        assert!(pending.iter().any(|p| p.id == t && p.prepared), "{}: {pending:?}", b.name);
        second.commit(&t).await.unwrap();
        let pending = second.pending(&template()).await.unwrap();
        assert!(pending.iter().all(|p| p.id != t), "{}: committed after the restart", b.name);
    }
}

#[tokio::test]
async fn abort_of_an_unknown_id_is_harmless() {
    for b in backends().await {
        let p = opened(&b).await;
        match p.abort(&template().transaction(99)).await {
            Ok(()) => {}
            Err(e) => assert_eq!(e.kind(), ErrorKind::Invalid, "{}: {e}", b.name),
        }
    }
}

#[tokio::test]
async fn a_stale_instance_can_decide_nothing() {
    for b in backends().await.into_iter().filter(|b| b.fences) {
        let stale = opened(&b).await;
        let t = template().transaction(4);
        stale.begin(&t).await.unwrap();
        let fresh = opened(&b).await;
        for (op, result) in [
            ("prepare", stale.prepare(&t).await.map(|_| ())),
            ("commit", stale.commit(&t).await),
            ("abort", stale.abort(&t).await),
            ("begin", stale.begin(&template().transaction(5)).await),
        ] {
            let err = result.err().unwrap_or_else(|| panic!("{}: a stale {op} was accepted", b.name));
            assert_eq!(err.kind(), ErrorKind::Fenced, "{}: {op}: {err}", b.name);
        }
        fresh.begin(&template().transaction(5)).await.unwrap();
    }
}
