//! Soak: the demo's exactly-once pipeline on the embedded broker at full rate for a
//! long time, with topic retention, and what memory and the broker's snapshots do.
//!
//! A producer task keeps writing 100-byte records to `in` (4 partitions) as fast as the
//! job takes them (it stays at most 1,500,000 records ahead: about two checkpoints' worth
//! at full rate, so the job never waits for input; at 200,000 ahead it did, as a checkpoint
//! commits only every 500 ms); the job runs share source
//! -> SQL -> transactional topic sink into `out`, parallelism 2, checkpoints every
//! 500 ms, broker journal in a local directory. Both topics keep 60 s (`log.retention.ms`,
//! standing in for an hour). Every 10 s it prints the records committed, the rate, the
//! process's resident memory, the newest snapshot's size and the bytes the logs hold.
//! After the first retention period the last three must stay flat.
//!
//! The job runs in a child process, with `MALLOC_ARENA_MAX=2` unless the environment
//! sets it (decision 0033). At the end the bench kills it with SIGKILL, reopens
//! the broker directory in its own process, times that, and checks that every output
//! record the child had reported committed is there. Each kill waits until at least
//! 128 MiB of journal follow the newest snapshot, so the reopens it compares (one at
//! 1 GiB held, one at the end) replay about as much journal.
//!
//! `cargo bench --bench broker_soak -- [MINUTES] [RETENTION_SECONDS]` (default 30 and 60)

#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, Opened, Retention};
use shareflow::connector::embedded::{BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow::connector::share::*;
use shareflow::connector::{record_schema, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig};

#[path = "support/results.rs"]
mod results;

const PARTITIONS: i32 = 4;
const AHEAD: i64 = 1_500_000;
/// Records per produce call, as the demo's input (src/demo.rs).
const CHUNK: i64 = 20_000;
/// Produce calls in flight at once.
const IN_FLIGHT: usize = 4;

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

/// Bytes of journal segments written wholly after the newest snapshot began, in MiB:
/// what a reopen now would replay, give or take the segment the snapshot's lsn lies in.
fn journal_after_snapshot_mib(dir: &std::path::Path) -> f64 {
    let lsns = |sub: &str, suffix: &str| -> Vec<(u64, u64)> {
        let Ok(entries) = std::fs::read_dir(dir.join("broker").join(sub)) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                Some((name.strip_suffix(suffix)?.parse().ok()?, e.metadata().ok()?.len()))
            })
            .collect()
    };
    let snapshot = lsns("snapshot", ".snap").iter().map(|(lsn, _)| *lsn).max().unwrap_or(0);
    let bytes: u64 = lsns("wal", ".seg").iter().filter(|(first, _)| *first > snapshot).map(|(_, b)| b).sum();
    bytes as f64 / (1u64 << 20) as f64
}

/// Where in the snapshot cycle the bench kills a child: once at least this much journal
/// follows the newest snapshot, so that the two reopens it compares replay about as much
/// journal, and their difference is what grows with the records held. A reopen replays
/// at most 256 MiB (`REPLAY_BOUND_BYTES`) whenever the kill lands.
const KILL_AFTER_JOURNAL_MIB: f64 = 128.0;

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

/// The child's environment variable: the broker directory to soak in.
const CHILD_DIR: &str = "SHAREFLOW_SOAK_DIR";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let minutes: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(30.0);
    let retention_s: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(60);
    let retention = Retention { ms: Some(retention_s * 1000), bytes: None };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    match std::env::var_os(CHILD_DIR) {
        Some(dir) => runtime.block_on(child(std::path::PathBuf::from(dir), retention)),
        None => runtime.block_on(parent(args, minutes, retention_s, retention)),
    }
}

/// Percentile `q` (0..=1) of `values`, by nearest rank.
fn percentile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0)
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Runs the child for `minutes`, records its samples, kills it, reopens its directory.
async fn parent(args: Vec<String>, minutes: f64, retention_s: u64, retention: Retention) {
    let mut results = results::Results::create(
        "broker_soak",
        serde_json::json!({"minutes": minutes, "retention_s": retention_s, "record_bytes": 100,
            "partitions": PARTITIONS, "parallelism": 2, "checkpoint_interval_ms": 500}),
    );
    let dir = tempfile::tempdir().unwrap();
    println!(
        "soak: {minutes} min, retention {retention_s} s, 100-byte records, 4 partitions, parallelism 2, 500 ms checkpoints"
    );
    println!(
        "{:>6} {:>12} {:>10} {:>9} {:>13} {:>12}",
        "secs", "out offsets", "rec/s", "RSS MiB", "snapshot KiB", "log MiB"
    );
    let started = Instant::now();
    let mut samples: Vec<serde_json::Value> = Vec::new();
    // First until the logs hold 1 GiB, then to the end: a SIGKILL and a timed reopen at
    // each, so the two reopen times compare.
    let small = soak_until(&args, dir.path(), started, &mut samples, &mut results, |s| {
        s["log_mib"].as_f64().unwrap_or(0.0) >= 1024.0 || started.elapsed().as_secs_f64() >= minutes * 60.0 / 2.0
    });
    let (reopen_small_s, _, held_small, opened_small) = reopen(dir.path(), retention, small).await;
    println!(
        "killed at {:.2} GiB held; reopened in {reopen_small_s:.3} s ({})",
        held_small as f64 / (1u64 << 30) as f64,
        describe(&opened_small)
    );
    let reported = soak_until(&args, dir.path(), started, &mut samples, &mut results, |_| {
        started.elapsed().as_secs_f64() >= minutes * 60.0
    });
    let secs = started.elapsed().as_secs_f64();
    let snapshot_kib = newest_snapshot_kib(dir.path());
    let (reopen_s, committed, held, opened) = reopen(dir.path(), retention, reported).await;
    let held_gib = held as f64 / (1u64 << 30) as f64;
    // The rate and memory over the run, after its first minute.
    let col = |k: &str, from: f64, to: f64| -> Vec<f64> {
        samples
            .iter()
            .filter(|s| (from..to).contains(&s["secs"].as_f64().unwrap_or(0.0)))
            .filter_map(|s| s[k].as_f64())
            .collect()
    };
    let rates = col("records_per_second", 60.0, f64::MAX);
    let (rate_median, rate_p10) = (percentile(&rates, 0.5), percentile(&rates, 0.1));
    let rss = col("rss_mib", 0.0, f64::MAX);
    let rss_max = rss.iter().copied().fold(0.0, f64::max);
    let end = minutes * 60.0;
    let (rss_5_10, rss_last_10) = (mean(&col("rss_mib", 300.0, 600.0)), mean(&col("rss_mib", end - 600.0, f64::MAX)));
    let snapshot_share = snapshot_kib * 1024.0 / held.max(1) as f64;
    println!(
        "{committed} output records in {secs:.0} s ({:.0} records/s); killed with {held_gib:.2} GiB of records held; \
         reopened from a {:.2} MiB snapshot ({:.4} % of them) and the journal in {reopen_s:.3} s",
        committed as f64 / secs,
        snapshot_kib / 1024.0,
        snapshot_share * 100.0
    );
    println!(
        "10 s rate after the first minute: median {rate_median:.0}, p10 {rate_p10:.0} ({:.2} x median); \
         RSS max {rss_max:.0} MiB, minutes 5-10 {rss_5_10:.0} MiB, last 10 minutes {rss_last_10:.0} MiB",
        rate_p10 / rate_median.max(1.0)
    );
    println!(
        "reopen at {held_gib:.2} GiB held {reopen_s:.3} s ({}), at {:.2} GiB {reopen_small_s:.3} s ({:.2} x)",
        describe(&opened),
        held_small as f64 / (1u64 << 30) as f64,
        reopen_s / reopen_small_s.max(1e-9)
    );
    let parts = |o: &Opened| {
        serde_json::json!({"snapshot_mib": o.snapshot_bytes as f64 / MIB, "snapshot_s": o.snapshot_secs,
            "journal_mib": o.journal_bytes as f64 / MIB, "journal_entries": o.journal_entries,
            "journal_s": o.journal_secs})
    };
    results.record(serde_json::json!({"kind": "summary", "committed": committed, "secs": secs,
        "reopen_s": reopen_s, "snapshot_kib": snapshot_kib, "held_gib": held_gib,
        "reopen_small_s": reopen_small_s, "held_small_gib": held_small as f64 / (1u64 << 30) as f64,
        "reopen_parts": parts(&opened), "reopen_small_parts": parts(&opened_small),
        "rate_median": rate_median, "rate_p10": rate_p10, "rss_max_mib": rss_max,
        "rss_minutes_5_10_mib": rss_5_10, "rss_last_10_minutes_mib": rss_last_10}));
}

/// Runs a child on `dir` until `done` says so of one of its samples, then kills it with
/// SIGKILL; its samples go to `samples` and `results`. Returns the committed output
/// records it last reported.
fn soak_until(
    args: &[String],
    dir: &std::path::Path,
    started: Instant,
    samples: &mut Vec<serde_json::Value>,
    results: &mut results::Results,
    done: impl Fn(&serde_json::Value) -> bool,
) -> u64 {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child.args(args).env(CHILD_DIR, dir).stdout(std::process::Stdio::piped());
    // glibc's malloc: two arenas, as docs/operations.md advises for a long run (decision
    // 0033), unless the caller's environment chooses.
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        child.env("MALLOC_ARENA_MAX", "2");
    }
    let mut child = child.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(json) = line.strip_prefix("SAMPLE ") {
                let _ = tx.send(serde_json::from_str(json).unwrap());
            }
        }
    });
    let mut reported = 0;
    loop {
        let mut sample = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(sample) => sample,
            Err(e) => panic!("the soak's child sent no sample for 2 minutes ({e})"),
        };
        // Seconds since the soak started, across children.
        sample["secs"] = serde_json::json!(started.elapsed().as_secs_f64());
        let f = |k: &str| sample[k].as_f64().unwrap_or(0.0);
        println!(
            "{:>6.0} {:>12.0} {:>10.0} {:>9.1} {:>13.1} {:>12.1}",
            f("secs"),
            f("committed"),
            f("records_per_second"),
            f("rss_mib"),
            f("snapshot_kib"),
            f("log_mib")
        );
        reported = sample["committed"].as_u64().unwrap_or(reported);
        results.record(sample.clone());
        let stop = done(&sample);
        samples.push(sample);
        if stop {
            break;
        }
    }
    // Wait for the same point of the snapshot cycle each time (at most 30 s), then
    // SIGKILL: what the directory holds is what a crash leaves.
    let waiting = Instant::now();
    while journal_after_snapshot_mib(dir) < KILL_AFTER_JOURNAL_MIB && waiting.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("killing the child with {:.0} MiB of journal after its newest snapshot", journal_after_snapshot_mib(dir));
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    reported
}

const MIB: f64 = (1u64 << 20) as f64;

/// Where a reopen's time went: the snapshot, then the journal written after it.
fn describe(o: &Opened) -> String {
    format!(
        "snapshot {:.2} MiB in {:.3} s, then {:.1} MiB of journal ({} entries) in {:.3} s",
        o.snapshot_bytes as f64 / MIB,
        o.snapshot_secs,
        o.journal_bytes as f64 / MIB,
        o.journal_entries,
        o.journal_secs
    )
}

/// Opens `dir` after a kill, timed, and checks that it has the `reported` output records
/// at least. Returns the seconds it took, the output records, the bytes the logs hold,
/// and what the open read.
async fn reopen(dir: &std::path::Path, retention: Retention, reported: u64) -> (f64, u64, u64, Opened) {
    let reopening = Instant::now();
    let broker = EmbeddedBroker::open(
        BrokerOptions::local_dir(dir)
            .unwrap()
            .log_retention(retention)
            .log_retention_check_interval(Duration::from_secs(1)),
    )
    .await
    .unwrap_or_else(|e| panic!("the soak's broker directory does not open again: {e}"));
    let reopen_s = reopening.elapsed().as_secs_f64();
    let committed = total(&broker, "out", |_, e, _| e as u64).await;
    assert!(committed >= reported, "the reopened broker has {committed} output records; the child reported {reported}");
    let held = total(&broker, "in", |_, _, b| b).await + total(&broker, "out", |_, _, b| b).await;
    let opened = broker.opened();
    broker.close();
    (reopen_s, committed, held, opened)
}

/// The soak itself, until it is killed.
async fn child(dir: std::path::PathBuf, retention: Retention) {
    // The demo's group settings (src/demo.rs). With Kafka's default of 2,000 record locks
    // per partition, a transaction per 500 ms checkpoint caps the job at 4 x 2,000 records
    // per checkpoint (about 16 k records/s), which is what earlier soaks measured.
    let config = ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .record_lock_duration(Duration::from_secs(2))
        .partition_max_record_locks(1_000_000)
        .build()
        .unwrap();
    let broker = EmbeddedBroker::open(
        BrokerOptions::local_dir(&dir)
            .unwrap()
            .default_config(config.clone())
            .log_retention(retention)
            .log_retention_check_interval(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    broker.create_topic("in", PARTITIONS as u32).await.unwrap();
    broker.create_topic("out", PARTITIONS as u32).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (broker, stop) = (broker.clone(), stop.clone());
        async move {
            // One topic name and one value, shared by every record: the soak measures the
            // broker and the job, not the allocator. Up to IN_FLIGHT produce calls at once,
            // as a Kafka producer keeps several requests in flight: one call at a time
            // waits out each journal sync and held the job under its rate.
            let (topic, value): (Arc<str>, Bytes) = (Arc::from("in"), Bytes::from(vec![b'v'; 100]));
            // A child that follows a killed one counts what that one produced.
            let mut n = total(&broker, "in", |_, e, _| e as u64).await as i64;
            let mut committed = 0;
            let mut in_flight: tokio::task::JoinSet<shareflow::connector::Result<_>> = tokio::task::JoinSet::new();
            while !stop.load(Ordering::Relaxed) {
                if in_flight.len() >= IN_FLIGHT {
                    in_flight.join_next().await.unwrap().unwrap().unwrap();
                    continue;
                }
                // The committed output is read only when the producer may be too far
                // ahead: a read waits until the journal is durable.
                if n - committed > AHEAD {
                    committed = total(&broker, "out", |_, e, _| e as u64).await as i64;
                    if n - committed > AHEAD {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
                let batch: Vec<ProducerRecord> = (0..CHUNK)
                    .map(|i| ProducerRecord::new(topic.clone(), ((n + i) % 4) as i32, value.clone()))
                    .collect();
                let broker = broker.clone();
                in_flight.spawn(async move { broker.produce(batch).await });
                n += CHUNK;
            }
            while let Some(done) = in_flight.join_next().await {
                done.unwrap().unwrap();
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
    let started = Instant::now();
    tokio::spawn({
        let broker = broker.clone();
        async move {
            // A child that follows a killed one starts from what that one committed.
            let mut last = (total(&broker, "out", |_, e, _| e as u64).await, Instant::now());
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let committed = total(&broker, "out", |_, e, _| e as u64).await;
                let bytes = total(&broker, "in", |_, _, b| b).await + total(&broker, "out", |_, _, b| b).await;
                let rate = (committed - last.0) as f64 / last.1.elapsed().as_secs_f64();
                last = (committed, Instant::now());
                let sample = serde_json::json!({"kind": "sample", "secs": started.elapsed().as_secs_f64(),
                    "committed": committed, "records_per_second": rate, "rss_mib": rss_mib(),
                    "snapshot_kib": newest_snapshot_kib(&dir), "log_mib": bytes as f64 / (1 << 20) as f64});
                println!("SAMPLE {sample}");
            }
        }
    });
    job.run().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
}
