//! One conformance suite for `TransactionParticipant` (issue 10, item 4), run against
//! every implementation: the embedded broker (`BrokerTransactions`), the file sink
//! (`FileCommitter`), the runtime's test participant (`CollectSink`), and, when a Kafka
//! broker is reachable, the Kafka participant (`KafkaTransactions`). Without
//! `SHAREFLOW_KAFKA_BOOTSTRAP` the Kafka backend is left out with the reason printed;
//! under `SHAREFLOW_REQUIRE_SERVERS=1` (or CI) its absence fails the run.
//!
//! The contract, as the coordinator and recovery rely on it:
//! - `begin`, `prepare`, `commit` and `abort` are idempotent by transaction id;
//! - `prepare` of an aborted transaction answers `false` (it cannot commit);
//! - a prepared transaction is listed by `pending` and commits after a restart;
//! - `abort` of an unknown id is harmless: `Ok`, or an `Invalid` error, never a panic;
//! - a stale instance can decide nothing, as far as the participant fences
//!   ([`Fencing`]: the embedded broker by prefix, Kafka by transactional id).

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::kafka::{KafkaTransactions, KafkaTransactionsConfig};
use shareflow::connector::FileCommitter;
use shareflow::runtime::testing::CollectSink;
use shareflow::runtime::{ErrorKind, Participant, PrepareOutcome, TransactionTemplate};

const GROUP: &str = "conformance";
const PREFIX: &str = "job";

/// How a participant keeps a stale instance (docs/design.md §4, I7) from deciding anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fencing {
    /// It has no notion of instances: the file sink and the collect sink rely on the
    /// checkpoint store's `Create` and on one job per prefix.
    None,
    /// By prefix (the embedded broker): opening a new instance fences every older one,
    /// for every transaction, begun or not.
    Prefix,
    /// By transactional id (Kafka): a new producer with T(n)'s id fences the producer
    /// that held it, and a new instance's `open` fences the transactions it finds open
    /// and unprepared. A stale instance can still begin an id nobody else uses, and a
    /// transaction it begun but wrote nothing into is invisible to the broker, so
    /// nothing can fence it before it is used again. The stale producer's refusal may
    /// come as `Unavailable` rather than `Fenced`: Kafka answers its writes with
    /// InvalidProducerEpoch, which the client reports as "abort the transaction",
    /// because a bumped epoch may also be a transaction timeout's abort.
    TransactionId,
}

impl Fencing {
    /// The kinds a stale instance's refused call may have.
    fn refusals(self) -> &'static [ErrorKind] {
        match self {
            Fencing::None => &[],
            Fencing::Prefix => &[ErrorKind::Fenced],
            Fencing::TransactionId => &[ErrorKind::Fenced, ErrorKind::Unavailable],
        }
    }
}

/// A participant implementation under test: `instance()` makes a new instance on the
/// same durable backing (a restart of the job), used with `template`.
struct Backend {
    name: &'static str,
    instance: Box<dyn Fn() -> Participant>,
    template: TransactionTemplate,
    fencing: Fencing,
}

async fn backends() -> Vec<Backend> {
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory()).await.unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let collect = CollectSink::new();
    let mut all = vec![
        Backend {
            name: "embedded broker",
            instance: Box::new(move || BrokerTransactions::new(broker.clone(), Duration::from_secs(60)) as Participant),
            template: template(),
            fencing: Fencing::Prefix,
        },
        Backend {
            name: "file sink",
            instance: Box::new(move || FileCommitter::new(store.clone(), "files") as Participant),
            template: template(),
            fencing: Fencing::None,
        },
        Backend {
            name: "collect sink",
            instance: Box::new(move || collect.participant()),
            template: template(),
            fencing: Fencing::None,
        },
    ];
    if let Some(cluster) = support::kafka::cluster().await {
        let config = KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(60));
        all.push(Backend {
            name: "kafka",
            instance: Box::new(move || KafkaTransactions::new(cluster.clone(), config.clone()) as Participant),
            // The broker outlives the test: a group of its own keeps runs and tests
            // apart (T(1) of another test is not this one's).
            template: TransactionTemplate::new(&support::kafka::unique(GROUP), PREFIX).unwrap(),
            fencing: Fencing::TransactionId,
        });
    }
    all
}

fn template() -> TransactionTemplate {
    TransactionTemplate::new(GROUP, PREFIX).unwrap()
}

async fn opened(backend: &Backend) -> Participant {
    let p = (backend.instance)();
    p.open(&backend.template).await.unwrap();
    p
}

#[tokio::test]
async fn begin_prepare_commit_abort_are_idempotent() {
    for b in backends().await {
        let p = opened(&b).await;
        let t1 = b.template.transaction(1);
        p.begin(&t1).await.unwrap();
        p.begin(&t1).await.unwrap();
        assert_eq!(p.prepare(&t1).await.unwrap(), PrepareOutcome::Prepared, "{}", b.name);
        assert_eq!(p.prepare(&t1).await.unwrap(), PrepareOutcome::Prepared, "{}: prepare twice", b.name);
        p.commit(&t1).await.unwrap();
        p.commit(&t1).await.unwrap();
        p.abort(&t1).await.unwrap_or_else(|e| panic!("{}: abort of a committed transaction is a no-op: {e}", b.name));
        let pending = p.pending(&b.template).await.unwrap();
        assert!(pending.iter().all(|t| t.id != t1), "{}: a committed transaction is not pending", b.name);

        let t2 = b.template.transaction(2);
        p.begin(&t2).await.unwrap();
        p.abort(&t2).await.unwrap();
        p.abort(&t2).await.unwrap();
        assert_eq!(
            p.prepare(&t2).await.unwrap(),
            PrepareOutcome::AlreadyAborted,
            "{}: an aborted transaction cannot prepare",
            b.name
        );
        let pending = p.pending(&b.template).await.unwrap();
        assert!(pending.iter().all(|t| t.id != t2), "{}: an aborted transaction is not pending", b.name);
    }
}

#[tokio::test]
async fn a_prepared_transaction_commits_after_a_restart() {
    for b in backends().await {
        let first = opened(&b).await;
        let t = b.template.transaction(3);
        first.begin(&t).await.unwrap();
        assert_eq!(first.prepare(&t).await.unwrap(), PrepareOutcome::Prepared);
        drop(first);
        let second = opened(&b).await;
        let pending = second.pending(&b.template).await.unwrap();
        assert!(pending.iter().any(|p| p.id == t && p.prepared), "{}: {pending:?}", b.name);
        second.commit(&t).await.unwrap();
        let pending = second.pending(&b.template).await.unwrap();
        assert!(pending.iter().all(|p| p.id != t), "{}: committed after the restart", b.name);
    }
}

#[tokio::test]
async fn abort_of_an_unknown_id_is_harmless() {
    for b in backends().await {
        let p = opened(&b).await;
        match p.abort(&b.template.transaction(99)).await {
            Ok(()) => {}
            Err(e) => assert_eq!(e.kind(), ErrorKind::Invalid, "{}: {e}", b.name),
        }
    }
}

#[tokio::test]
async fn a_stale_instance_can_decide_nothing() {
    for b in backends().await.into_iter().filter(|b| b.fencing == Fencing::Prefix) {
        let stale = opened(&b).await;
        let t = b.template.transaction(4);
        stale.begin(&t).await.unwrap();
        let fresh = opened(&b).await;
        for (op, result) in [
            ("prepare", stale.prepare(&t).await.map(|_| ())),
            ("commit", stale.commit(&t).await),
            ("abort", stale.abort(&t).await),
            ("begin", stale.begin(&b.template.transaction(5)).await),
        ] {
            let err = result.err().unwrap_or_else(|| panic!("{}: a stale {op} was accepted", b.name));
            assert_eq!(b.fencing.refusals(), [err.kind()], "{}: {op}: {err}", b.name);
        }
        fresh.begin(&b.template.transaction(5)).await.unwrap();
    }
}

#[tokio::test]
async fn a_stale_instance_can_decide_nothing_once_its_transaction_id_is_taken() {
    for b in backends().await.into_iter().filter(|b| b.fencing == Fencing::TransactionId) {
        let stale = opened(&b).await;
        let t = b.template.transaction(6);
        stale.begin(&t).await.unwrap();
        let fresh = opened(&b).await;
        // The fresh instance begins the same transaction: its producer takes the id.
        fresh.begin(&t).await.unwrap();
        for (op, result) in [("prepare", stale.prepare(&t).await.map(|_| ())), ("commit", stale.commit(&t).await)] {
            let err = result.err().unwrap_or_else(|| panic!("{}: a stale {op} was accepted", b.name));
            assert!(b.fencing.refusals().contains(&err.kind()), "{}: {op}: {err}", b.name);
            assert!(err.to_string().contains(&format!("failed to {op} {t}")), "{}: {err}", b.name);
        }
        // The id is the fresh instance's now.
        assert_eq!(fresh.prepare(&t).await.unwrap(), PrepareOutcome::Prepared, "{}", b.name);
        fresh.commit(&t).await.unwrap();
    }
}
