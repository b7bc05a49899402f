//! Stateful SQL on Kafka 4.x: a keyed count whose checkpoint completed but whose
//! transaction the broker then aborted (the job was down longer than the transaction
//! timeout) is not counted twice: recovery sees the transaction lost
//! (`TransactionParticipant::committed`), tombstones that checkpoint and restores the
//! one before, and the ledger replays the lost records into it once.

#![allow(clippy::unwrap_used)]

#[path = "support/kafka.rs"]
mod kafka;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::kafka::{
    KafkaCluster, KafkaShareSource, KafkaSink, KafkaTransactions, KafkaTransactionsConfig,
};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{Job, JobBuilder, JobConfig, RestartStrategy, RuntimeError};

const RECORDS: u64 = 3_000;
const KEYS: u64 = 10;
const TXN_TIMEOUT: Duration = Duration::from_secs(8);

fn job(cluster: &KafkaCluster, group: &str, input: &str, output: &str, root: &str, drain: bool) -> Job {
    let txns =
        KafkaTransactions::new(cluster.clone(), KafkaTransactionsConfig::default().transaction_timeout(TXN_TIMEOUT));
    let mut source = SourceSettings::new(group, &[input]);
    source.from_earliest = true;
    source.stop_when_drained = drain;
    // Spread over a few seconds: the crash leaves part of the input in the lost
    // checkpoint, and part for later.
    source.max_poll_records = 50;
    source.max_records_per_second = Some(1_000);
    let builder = JobBuilder::new();
    builder
        .source(
            "share-source",
            record_schema(),
            KafkaShareSource::factory(cluster.clone(), txns.clone(), source, Arc::new(SourceMetrics::default())),
        )
        .sql("count", "SELECT CAST(key AS VARCHAR) AS key, CAST(count(*) AS VARCHAR) AS value FROM input GROUP BY key")
        .sink("kafka-sink", KafkaSink::factory(txns.clone(), output))
        .participant(txns);
    let storage = CheckpointStore::from_url(root, &[], "counts").unwrap();
    let mut config = JobConfig::new(storage, group, "counts")
        .checkpoint_interval(Duration::from_millis(300))
        .checkpoint_timeout(Duration::from_secs(5))
        .restart(RestartStrategy::FixedDelay { attempts: 0, delay: Duration::from_millis(10) });
    // A cold broker may time the first checkpoints out while the group forms.
    config.tolerable_checkpoint_failures = 2;
    builder.build(config).unwrap()
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
