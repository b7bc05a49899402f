//! Stateful SQL on the embedded broker (release build, 2 cores):
//!
//! - **rate**: a tumbling 10 s count per key over 1,000,000 records and 10,000 keys
//!   (event times over 100 s), against the demo's stateless pipeline (share source ->
//!   `upper(value)` -> topic sink) over the same input, on one broker on local disk,
//!   with the demo's settings (parallelism 2, 100 ms checkpoints, exactly-once), in
//!   rounds that take turns going first, after one unmeasured pair;
//! - **state**: a job holding 1,000,000 keys of count state (a 1 h window that never
//!   closes) on `file://` checkpoints: the longest checkpoint, the checkpoint's bytes,
//!   the state's memory per key (resident memory before and after), and the restore of
//!   a second run from the last checkpoint.
//!
//! `cargo bench --bench stateful_sql [-- ROUNDS]`; results in
//! `docs/results/stateful_sql.jsonl`.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, Retention};
use shareflow::connector::embedded::{BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow::connector::share::{AcknowledgementMode, ProducerRecord, ShareConfig};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig, JobReport, RestartStrategy};

#[path = "support/results.rs"]
mod results;

const RECORDS: u64 = 1_000_000;
/// `SHAREFLOW_BENCH_RECORDS` scales both parts down, for a quick look.
fn scaled(n: u64) -> u64 {
    std::env::var("SHAREFLOW_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(n)
}
const KEYS: u64 = 10_000;
const STATE_KEYS: u64 = 1_000_000;
const INPUT: &str = "in";
const BASE_MS: i64 = 1_700_000_000_000;

const STATELESS: &str = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input";
const TUMBLE: &str = "SELECT key, CAST(count(*) AS VARCHAR) AS value FROM input \
                      GROUP BY key, tumble(timestamp, INTERVAL '10 seconds')";
const HELD: &str = "SELECT key, CAST(count(*) AS VARCHAR) AS value FROM input \
                    GROUP BY key, tumble(timestamp, INTERVAL '1 hour')";

fn group_config() -> ShareConfig {
    ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .record_lock_duration(Duration::from_secs(2))
        .partition_max_record_locks(1_000_000)
        .max_pending_transactions(16)
        .build()
        .unwrap()
}

/// A broker on local disk under `dir` with `records` input records over `keys` keys,
/// event times spread over 100 s, values as the demo's (100 bytes).
async fn broker(dir: &std::path::Path, records: u64, keys: u64) -> EmbeddedBroker {
    let broker =
        // No retention: the input's event times (2023) are past the default 7 days.
        EmbeddedBroker::open(
            BrokerOptions::local_dir(dir.join("broker"))
                .unwrap()
                .default_config(group_config())
                .log_retention(Retention::default()),
        )
            .await
            .unwrap();
    broker.create_topic(INPUT, 4).await.unwrap();
    let mut batch = Vec::with_capacity(20_000);
    for i in 0..records {
        let mut value = format!("rec-{i:010}-").into_bytes();
        value.resize(100, b'x');
        batch.push(ProducerRecord {
            partition: Some((i % 4) as i32),
            timestamp_ms: BASE_MS + (i * 100_000 / records) as i64,
            ..ProducerRecord::new(INPUT, 0, value).with_key(format!("key-{:08}", i % keys).into_bytes())
        });
        if batch.len() == 20_000 {
            broker.produce(std::mem::take(&mut batch)).await.unwrap();
        }
    }
    broker.produce(batch).await.unwrap();
    broker
}

/// Runs `query` over the whole input as share group `group` into topic `output`;
/// returns the report and the seconds it took.
async fn run(
    broker: &EmbeddedBroker,
    group: &str,
    query: &str,
    checkpoints: &str,
    stop_after: Option<u64>,
) -> (JobReport, f64) {
    broker.configure_group(group, group_config()).await.unwrap();
    let output = format!("{group}-out");
    if broker.partition_count(&output).is_err() {
        broker.create_topic(&output, 4).await.unwrap();
    }
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(group, &[INPUT]);
    source.max_poll_records = 2_000;
    let metrics = Arc::new(SourceMetrics::default());
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, group_config(), metrics.clone()),
    )
    .parallelism(2)
    .sql("transform", query)
    .parallelism(2)
    .sink("sink", TopicSink::factory(broker.clone(), Some(txns.clone()), &output))
    .parallelism(2)
    .participant(txns);
    let storage = CheckpointStore::from_url(checkpoints, &[], group).unwrap();
    let mut config = JobConfig::new(storage, group, group)
        .checkpoint_interval(Duration::from_millis(100))
        .checkpoint_timeout(Duration::from_secs(10))
        .restart(RestartStrategy::FixedDelay { attempts: 0, delay: Duration::from_millis(10) });
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = 3;
    let job = job.build(config).unwrap();
    let started = Instant::now();
    let stop = job.stop_handle();
    let progress = async {
        // A line every 5 s for a run that takes long.
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            eprintln!(
                "  {group}: {} records emitted after {:.0} s",
                metrics.records_emitted.load(std::sync::atomic::Ordering::Relaxed),
                started.elapsed().as_secs_f64()
            );
        }
    };
    let watch = async {
        if let Some(n) = stop_after {
            while metrics.records_emitted.load(std::sync::atomic::Ordering::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Every record emitted: the final checkpoint takes the rest in (and keeps the
            // open windows' state).
            stop.stop();
        }
    };
    let report = tokio::select! {
        (report, ()) = async { tokio::join!(job.run(), watch) } => report,
        () = progress => unreachable!("the progress loop never ends"),
    };
    (report.unwrap(), started.elapsed().as_secs_f64())
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn rates(results: &mut results::Results, rounds: usize) {
    let (mut stateless, mut stateful) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let order = if round % 2 == 0 {
            [("stateless", STATELESS), ("tumble", TUMBLE)]
        } else {
            [("tumble", TUMBLE), ("stateless", STATELESS)]
        };
        let only = std::env::var("SHAREFLOW_BENCH_ONLY").ok();
        for (name, query) in order {
            if only.as_deref().is_some_and(|o| o != name) {
                continue;
            }
            // A broker of its own for each run, so that each starts alike. (A second
            // share group over one broker's topic used to stall part-way here: the
            // input's 2023 event times are past the default 7 days of retention, and
            // retention, then checked every second, deleted it once the first group had
            // nothing in flight. These brokers keep everything now.)
            let dir = tempfile::tempdir().unwrap();
            let broker = broker(dir.path(), scaled(RECORDS), KEYS).await;
            let group = format!("{name}-{round}");
            let url = format!("file://{}/chk-{group}", dir.path().display());
            // Stopped once every record was emitted: the final checkpoint waits for all of
            // them to be processed and commits them (the same end for both queries).
            let (report, seconds) = run(&broker, &group, query, &url, Some(scaled(RECORDS))).await;
            broker.close();
            let rate = scaled(RECORDS) as f64 / seconds;
            eprintln!(
                "round {round} {name}: {rate:.0} records/s ({seconds:.2} s, {} checkpoints)",
                report.metrics.checkpoints.completed
            );
            if round > 0 {
                if name == "stateless" {
                    stateless.push(rate)
                } else {
                    stateful.push(rate)
                }
                results.record(serde_json::json!({"kind": "rate", "query": name, "round": round, "records_per_s": rate, "seconds": seconds}));
            }
        }
    }
    if stateless.is_empty() || stateful.is_empty() {
        return;
    }
    let (a, b) = (median(&mut stateless), median(&mut stateful));
    eprintln!("median: stateless {a:.0}/s, tumbling count {b:.0}/s: {:.2}x", b / a);
    results
        .record(serde_json::json!({"kind": "rate_summary", "stateless_per_s": a, "tumble_per_s": b, "ratio": b / a}));
}

async fn state(results: &mut results::Results) {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path(), scaled(STATE_KEYS), scaled(STATE_KEYS)).await;
    let url = format!("file://{}/chk", dir.path().display());
    let before = rss_bytes();
    let (report, seconds) = run(&broker, "held", HELD, &url, Some(scaled(STATE_KEYS))).await;
    let after = rss_bytes();
    let c = &report.metrics.checkpoints;
    let per_key = (after.saturating_sub(before)) as f64 / scaled(STATE_KEYS) as f64;
    eprintln!(
        "1,000,000 keys held: longest checkpoint {:.3} s, last checkpoint {:.1} MiB, resident memory +{:.0} MiB ({per_key:.0} B per key), run {seconds:.1} s",
        c.max_duration.as_secs_f64(),
        c.last_size_bytes as f64 / 1048576.0,
        (after.saturating_sub(before)) as f64 / 1048576.0
    );
    // A second run restores the 1,000,000 keys from the last checkpoint, then stops.
    // It recovers, opens its operators with the restored state (while its final
    // barrier waits for them), takes its final checkpoint of all the keys again and
    // commits: the whole run bounds the restore.
    let (again, again_seconds) = run(&broker, "held", HELD, &url, Some(0)).await;
    eprintln!(
        "restore of 1,000,000 keys and one more checkpoint of them: {again_seconds:.3} s in all (from checkpoint \
         {:?}; the recovery step {:.3} s, the checkpoint, restore included, {:.3} s)",
        again.restored_from,
        again.metrics.checkpoints.recovery.max_ms / 1000.0,
        again.metrics.checkpoints.max_duration.as_secs_f64()
    );
    results.record(serde_json::json!({
        "kind": "state",
        "keys": STATE_KEYS,
        "checkpoint_max_s": c.max_duration.as_secs_f64(),
        "checkpoint_bytes": c.last_size_bytes,
        "rss_per_key_bytes": per_key,
        "restore_and_checkpoint_s": again_seconds,
    }));
}

fn main() {
    if let Ok(filter) = std::env::var("SHAREFLOW_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(3);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut results = results::Results::create(
        "stateful_sql",
        serde_json::json!({"rounds": rounds, "records": RECORDS, "keys": KEYS}),
    );
    runtime.block_on(async {
        // The state first, in a process that has done nothing else: its memory figure
        // is the growth of resident memory.
        state(&mut results).await;
        rates(&mut results, rounds).await;
    });
}
