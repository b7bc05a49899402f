//! Soak: the demo's exactly-once pipeline on the embedded broker at full rate for a
//! long time, with topic retention, and what memory and the broker's snapshots do.
//!
//! A producer task keeps writing 100-byte records to `in` (4 partitions) as fast as the
//! job takes them (it stays at most 200,000 records ahead); the job runs share source
//! -> SQL -> transactional topic sink into `out`, parallelism 2, checkpoints every
//! 500 ms, broker journal in a local directory. Both topics keep 60 s (`log.retention.ms`,
//! standing in for an hour). Every 10 s it prints the records committed, the rate, the
//! process's resident memory, the newest snapshot's size and the bytes the logs hold.
//! After the first retention period the last three must stay flat.
//!
//! `cargo bench --bench broker_soak -- [MINUTES] [RETENTION_SECONDS]` (default 30 and 60)

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, Retention};
use shareflow::connector::embedded::{BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow::connector::share::*;
use shareflow::connector::{record_schema, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig};

#[path = "support/results.rs"]
mod results;

const PARTITIONS: i32 = 4;
const AHEAD: i64 = 200_000;

/// Resident memory of this process, in MiB (Linux).
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0.0);
    pages * 4096.0 / (1 << 20) as f64
}

/// The newest snapshot file's size under the broker directory, in KiB.
fn newest_snapshot_kib(dir: &std::path::Path) -> f64 {
    let Ok(entries) = std::fs::read_dir(dir.join("broker").join("snapshot")) else { return 0.0 };
    let mut files: Vec<(String, u64)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().to_string(), e.metadata().ok()?.len())))
        .filter(|(n, _)| n.ends_with(".snap"))
        .collect();
    files.sort();
    files.last().map_or(0.0, |(_, b)| *b as f64 / 1024.0)
}

async fn total(broker: &EmbeddedBroker, topic: &str, f: impl Fn(i64, i64, u64) -> u64) -> u64 {
    let mut sum = 0;
    for p in 0..PARTITIONS {
        let tp = TopicPartition::new(topic, p);
        let (s, e, b) = (
            broker.start_offset(&tp).await.unwrap(),
            broker.end_offset(&tp).await.unwrap(),
            broker.log_bytes(&tp).await.unwrap(),
        );
        sum += f(s, e, b);
    }
    sum
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let minutes: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(30.0);
    let retention_s: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(60);
    let mut results = results::Results::create(
        "broker_soak",
        serde_json::json!({"minutes": minutes, "retention_s": retention_s, "record_bytes": 100,
            "partitions": PARTITIONS, "parallelism": 2, "checkpoint_interval_ms": 500}),
    );
    let dir = tempfile::tempdir().unwrap();
    // The demo's group settings (src/demo.rs). With Kafka's default of 2,000 record locks
    // per partition, a transaction per 500 ms checkpoint caps the job at 4 x 2,000 records
    // per checkpoint (about 16 k records/s), which is what earlier soaks measured.
    let config = ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .record_lock_duration(Duration::from_secs(2))
        .partition_max_record_locks(1_000_000)
        .build()
        .unwrap();
    let retention = Retention { ms: Some(retention_s * 1000), bytes: None };
    let broker = EmbeddedBroker::open(
        BrokerOptions::local_dir(dir.path()).unwrap().default_config(config.clone()).log_retention(retention),
    )
    .await
    .unwrap();
    broker.create_topic("in", PARTITIONS as u32).await.unwrap();
    broker.create_topic("out", PARTITIONS as u32).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (broker, stop) = (broker.clone(), stop.clone());
        async move {
            let value = vec![b'v'; 100];
            let mut n: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let committed = total(&broker, "out", |_, e, _| e as u64).await as i64;
                if n - committed > AHEAD {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let batch: Vec<ProducerRecord> =
                    (0..5_000).map(|i| ProducerRecord::new("in", ((n + i) % 4) as i32, value.clone())).collect();
                broker.produce(batch).await.unwrap();
                n += 5_000;
            }
        }
    });

    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    // The demo's settings (src/demo.rs): 2,000 records per poll, 8 batches per channel.
    let mut source = SourceSettings::new("soak", &["in"]);
    source.max_poll_records = 2_000;
    let job = JobBuilder::new();
    job.source(
        "in",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, config, Default::default()),
    )
    .parallelism(2)
    .sql("upper", "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input")
    .parallelism(2)
    .sink("out", TopicSink::factory(broker.clone(), Some(txns.clone()), "out"))
    .parallelism(2)
    .participant(txns);
    let storage = CheckpointStore::from_url("memory://soak/checkpoints", &[], "soak").unwrap();
    let mut config = JobConfig::new(storage, "soak", "soak").checkpoint_interval(Duration::from_millis(500));
    config.channel_capacity = 8;
    let job = job.build(config).unwrap();
    let handle = job.stop_handle();
    let started = Instant::now();
    println!(
        "soak: {minutes} min, retention {retention_s} s, 100-byte records, 4 partitions, parallelism 2, 500 ms checkpoints"
    );
    println!(
        "{:>6} {:>12} {:>10} {:>9} {:>13} {:>12}",
        "secs", "out offsets", "rec/s", "RSS MiB", "snapshot KiB", "log MiB"
    );
    let report = tokio::spawn({
        let broker = broker.clone();
        async move {
            let mut last = (0u64, Instant::now());
            while started.elapsed().as_secs_f64() < minutes * 60.0 {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let committed = total(&broker, "out", |_, e, _| e as u64).await;
                let bytes = total(&broker, "in", |_, _, b| b).await + total(&broker, "out", |_, _, b| b).await;
                let rate = (committed - last.0) as f64 / last.1.elapsed().as_secs_f64();
                last = (committed, Instant::now());
                let (secs, rss, snapshot, log) = (
                    started.elapsed().as_secs_f64(),
                    rss_mib(),
                    newest_snapshot_kib(dir.path()),
                    bytes as f64 / (1 << 20) as f64,
                );
                println!("{secs:>6.0} {committed:>12} {rate:>10.0} {rss:>9.1} {snapshot:>13.1} {log:>12.1}");
                results.record(serde_json::json!({"kind": "sample", "secs": secs, "committed": committed,
                    "records_per_second": rate, "rss_mib": rss, "snapshot_kib": snapshot, "log_mib": log}));
            }
            handle.stop();
            (dir, results)
        }
    });
    job.run().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    let (dir, mut results) = report.await.unwrap();
    // The directory it leaves must open again, with every committed record (a snapshot
    // of more than 1 GiB once could not be read back).
    let committed = total(&broker, "out", |_, e, _| e as u64).await;
    let snapshot_kib = newest_snapshot_kib(dir.path());
    broker.close();
    drop(broker);
    let reopening = Instant::now();
    let broker = EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap().log_retention(retention))
        .await
        .unwrap_or_else(|e| panic!("the soak's broker directory does not open again: {e}"));
    let reopen_s = reopening.elapsed().as_secs_f64();
    let reopened = total(&broker, "out", |_, e, _| e as u64).await;
    assert_eq!(reopened, committed, "the reopened broker has every output record");
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{committed} output records in {secs:.0} s ({:.0} records/s); reopened from the {:.0} MiB snapshot and the journal in {reopen_s:.1} s",
        committed as f64 / secs,
        snapshot_kib / 1024.0
    );
    results.record(serde_json::json!({"kind": "summary", "committed": committed, "secs": secs,
        "reopen_s": reopen_s, "snapshot_kib": snapshot_kib}));
}
