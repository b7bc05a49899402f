//! Savepoints on Kafka 4.x: a keyed count stopped with a savepoint restarts from it, in
//! a job with a checkpoint root of its own, at another parallelism (1 -> 3 and 3 -> 1).
//! Every key ends at its count: no record counted twice, none lost, across the stop.

#![allow(clippy::unwrap_used)]

#[path = "support/kafka.rs"]
mod kafka;

#[path = "support/kafka_counts.rs"]
mod kafka_counts;
use kafka_counts::{counting_job, Counts};

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use shareflow::connector::kafka::KafkaCluster;
use shareflow::runtime::Job;

const RECORDS: u64 = 3_000;
const KEYS: u64 = 10;

/// The keyed count of `group`, checkpoints under `root`, `p` subtasks each, started
/// from `savepoint` (and then to the end of the input) if given.
fn job(cluster: &KafkaCluster, topics: (&str, &str), group: &str, root: &str, p: u32, savepoint: Option<&str>) -> Job {
    let counts = Counts {
        parallelism: p,
        drain: savepoint.is_some(),
        restarts: 2,
        transaction_timeout: None,
        savepoint: savepoint.map(str::to_string),
        // The first run reads slowly (300 records/s at 3 subtasks: 10 s of input), so
        // that it is surely stopped mid-way, however late its first commit comes on a
        // loaded machine; the second runs to the end at 1,000 per subtask.
        rate: if savepoint.is_some() { 1_000 } else { 100 },
    };
    counting_job(cluster, (group, topics.0, topics.1), root, &counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_count_stopped_with_a_savepoint_restarts_at_another_parallelism_exactly_once() {
    let Some(cluster) = kafka::cluster().await else { return };
    for (before, after) in [(1, 3), (3, 1)] {
        let (group, input, output) = (kafka::unique("spk"), kafka::unique("spk-in"), kafka::unique("spk-out"));
        cluster.ensure_topic(&input, 3, &[]).await.unwrap();
        cluster.ensure_topic(&output, 1, &[]).await.unwrap();
        let records = (0..RECORDS).map(|i| (Some(Bytes::from(format!("k{}", i % KEYS))), Bytes::from(i.to_string())));
        cluster.produce(&input, records).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let first_root = format!("file://{}/first", dir.path().display());

        // The first run, stopped with a savepoint once some counts are out.
        let first = job(&cluster, (&input, &output), &group, &first_root, before, None);
        let handle = first.savepoint_handle();
        let (ran, taken) = tokio::join!(tokio::time::timeout(Duration::from_secs(120), first.run()), async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while cluster.read_committed(&output).await.unwrap().is_empty() {
                assert!(tokio::time::Instant::now() < deadline, "no count committed in 60 s");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            handle.stop_with("sp").await
        });
        let report = ran.expect("the first run stops").unwrap();
        let taken = taken.unwrap();
        let read = report.metrics.operators["share-source"].rows_out;
        assert!(read < RECORDS, "{before} -> {after}: the first run stopped mid-way ({read} records read)");
        let url = shareflow::control::savepoint_url(&first_root, &taken.path);

        // The second, from the savepoint, in a checkpoint root of its own, to the end.
        let second_root = format!("file://{}/second", dir.path().display());
        let second = job(&cluster, (&input, &output), &group, &second_root, after, Some(&url));
        tokio::time::timeout(Duration::from_secs(180), second.run()).await.expect("ends").unwrap();
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for (_, _, key, value) in cluster.read_committed(&output).await.unwrap() {
            let key = String::from_utf8(key.unwrap().to_vec()).unwrap();
            last.insert(key, String::from_utf8(value.unwrap().to_vec()).unwrap().parse().unwrap());
        }
        let expected: BTreeMap<String, u64> = (0..KEYS).map(|k| (format!("k{k}"), RECORDS / KEYS)).collect();
        assert_eq!(last, expected, "{before} -> {after}: each key's last committed count");
    }
}
