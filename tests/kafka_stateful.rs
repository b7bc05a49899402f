//! Stateful SQL on Kafka 4.x: a keyed count whose checkpoint completed but whose
//! transaction the broker then aborted (the job was down longer than the transaction
//! timeout) is not counted twice: recovery sees the transaction lost
//! (`TransactionParticipant::committed`), tombstones that checkpoint and restores the
//! one before, and the ledger replays the lost records into it once.

#![allow(clippy::unwrap_used)]

#[path = "support/kafka.rs"]
mod kafka;

#[path = "support/kafka_counts.rs"]
mod kafka_counts;
use kafka_counts::{counting_job, Counts};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow::connector::kafka::KafkaCluster;
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{Job, RuntimeError};

const RECORDS: u64 = 3_000;
const KEYS: u64 = 10;
const TXN_TIMEOUT: Duration = Duration::from_secs(8);

fn job(cluster: &KafkaCluster, group: &str, input: &str, output: &str, root: &str, drain: bool) -> Job {
    let counts = Counts {
        parallelism: 1,
        drain,
        restarts: 0,
        transaction_timeout: Some(TXN_TIMEOUT),
        savepoint: None,
        rate: 1_000,
    };
    counting_job(cluster, (group, input, output), root, &counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_whose_transaction_the_broker_aborted_is_not_counted_twice() {
    let Some(cluster) = kafka::cluster().await else { return };
    let (group, input, output) = (kafka::unique("stf"), kafka::unique("stf-in"), kafka::unique("stf-out"));
    cluster.ensure_topic(&input, 2, &[]).await.unwrap();
    cluster.ensure_topic(&output, 1, &[]).await.unwrap();
    let records = (0..RECORDS).map(|i| (Some(Bytes::from(format!("k{}", i % KEYS))), Bytes::from(i.to_string())));
    cluster.produce(&input, records).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = format!("file://{}", dir.path().display());

    // The first run dies right after its third manifest: T(n) is prepared and decided.
    let first = job(&cluster, &group, &input, &output, &root, false);
    first.failpoints().arm(points::AFTER_MANIFEST, 2);
    let err = tokio::time::timeout(Duration::from_secs(120), first.run()).await.expect("ends").unwrap_err();
    assert!(matches!(err, RuntimeError::InjectedCrash(_)), "{err}");
    drop(first);
    let partial = cluster.read_committed(&output).await.unwrap().len();
    assert!(partial > 0, "the first run committed some counts before the crash");

    // Down past the transaction timeout: the broker aborts T(n) (it checks every 10 s
    // by default). Wait until no transaction of the job is open any more.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open = kafka::transactional_ids(&cluster, &format!("{group}-counts"))
            .await
            .into_iter()
            .filter(|(_, state)| state == "Ongoing")
            .count();
        if open == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the broker did not abort the open transaction within 60 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The restart drains the input; every key ends at its count, never above it.
    let second = job(&cluster, &group, &input, &output, &root, true);
    tokio::time::timeout(Duration::from_secs(180), second.run()).await.expect("ends").unwrap();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for (_, _, key, value) in cluster.read_committed(&output).await.unwrap() {
        let key = String::from_utf8(key.unwrap().to_vec()).unwrap();
        last.insert(key, String::from_utf8(value.unwrap().to_vec()).unwrap().parse().unwrap());
    }
    let expected: BTreeMap<String, u64> = (0..KEYS).map(|k| (format!("k{k}"), RECORDS / KEYS)).collect();
    assert_eq!(last, expected, "each key's last committed count");
}
