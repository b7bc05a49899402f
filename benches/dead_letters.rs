//! Dead letters on the embedded broker (release build, 2 cores): the rate of one
//! exactly-once pipeline (share source -> `CAST(value AS BIGINT) * 2` -> topic sink,
//! parallelism 2, 100 ms checkpoints, one broker on local disk) over 1,000,000 records,
//!
//! - **plain**: without dead letters, no poison;
//! - **dlq**: with dead letters, no poison (target >= 0.97x plain);
//! - **dlq-1%**: with dead letters and 1 % of the values not numbers, each found by
//!   bisection and dead-lettered inside its checkpoint's transaction (target >= 0.9x).
//!
//! Rounds take turns in order after one unmeasured round; medians are compared.
//! `cargo bench --bench dead_letters [-- ROUNDS]`; results in
//! `docs/results/dead_letters.jsonl`.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::{BrokerDeadLetters, BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow::connector::share::{AcknowledgementMode, ProducerRecord, ShareConfig};
use shareflow::connector::{record_schema, DeadLetterSettings, SourceMetrics, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy};

#[path = "support/results.rs"]
mod results;

const RECORDS: u64 = 1_000_000;
const QUERY: &str = "SELECT key, CAST(CAST(CAST(value AS VARCHAR) AS BIGINT) * 2 AS VARCHAR) AS value FROM input";

fn records() -> u64 {
    std::env::var("SHAREFLOW_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(RECORDS)
}

fn group_config() -> ShareConfig {
    ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .record_lock_duration(Duration::from_secs(2))
        .partition_max_record_locks(1_000_000)
        .max_pending_transactions(16)
        .build()
        .unwrap()
}

/// A broker under `dir` with `n` records: the id as the value, or (one in `poison_every`)
/// a value that is not a number.
async fn broker(dir: &std::path::Path, n: u64, poison_every: Option<u64>) -> EmbeddedBroker {
    let broker =
        EmbeddedBroker::open(BrokerOptions::local_dir(dir.join("broker")).unwrap().default_config(group_config()))
            .await
            .unwrap();
    for topic in ["in", "out", "dlq"] {
        broker.create_topic(topic, 4).await.unwrap();
    }
    let mut batch = Vec::with_capacity(20_000);
    for i in 0..n {
        let value = match poison_every {
            Some(k) if i % k == k / 2 => format!("oops-{i}"),
            _ => i.to_string(),
        };
        batch.push(ProducerRecord {
            partition: Some((i % 4) as i32),
            ..ProducerRecord::new("in", 0, value.into_bytes()).with_key(format!("key-{:08}", i % 10_000).into_bytes())
        });
        if batch.len() == 20_000 {
            broker.produce(std::mem::take(&mut batch)).await.unwrap();
        }
    }
    broker.produce(batch).await.unwrap();
    broker
}

/// One run to the end of the input; the seconds it took and the dead letters written.
async fn run(broker: &EmbeddedBroker, dir: &std::path::Path, dead_letters: bool) -> (f64, u64) {
    broker.configure_group("g", group_config()).await.unwrap();
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new("g", &["in"]);
    source.max_poll_records = 2_000;
    let metrics = Arc::new(SourceMetrics::default());
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, group_config(), metrics.clone()),
    )
    .parallelism(2)
    .sql("transform", QUERY)
    .parallelism(2)
    .sink("sink", TopicSink::factory(broker.clone(), Some(txns.clone()), "out"))
    .parallelism(2)
    .participant(txns.clone());
    if dead_letters {
        job.dead_letters(BrokerDeadLetters::new(broker.clone(), Some(txns), DeadLetterSettings::new("dlq")));
    }
    let storage = CheckpointStore::from_url(&format!("file://{}/chk", dir.display()), &[], "g").unwrap();
    let mut config = JobConfig::new(storage, "g", "g")
        .checkpoint_interval(Duration::from_millis(100))
        .checkpoint_timeout(Duration::from_secs(10))
        .restart(RestartStrategy::None);
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = 3;
    let job = job.build(config).unwrap();
    let stop = job.stop_handle();
    let started = Instant::now();
    let n = records();
    let watch = async {
        while metrics.records_emitted.load(std::sync::atomic::Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.stop();
    };
    let (report, ()) = tokio::join!(job.run(), watch);
    report.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    (seconds, job.dead_letters().map_or(0, |d| d.counts().iter().sum()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(3);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut results =
        results::Results::create("dead_letters", serde_json::json!({"rounds": rounds, "records": records()}));
    let variants: [(&str, bool, Option<u64>); 3] =
        [("plain", false, None), ("dlq", true, None), ("dlq-1%", true, Some(100))];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    runtime.block_on(async {
        for round in 0..=rounds {
            for k in 0..variants.len() {
                let i = (k + round) % variants.len();
                let (name, dead_letters, poison) = variants[i];
                let dir = tempfile::tempdir().unwrap();
                let broker = broker(dir.path(), records(), poison).await;
                let (seconds, dead) = run(&broker, dir.path(), dead_letters).await;
                broker.close();
                let rate = records() as f64 / seconds;
                eprintln!("round {round} {name}: {rate:.0} records/s ({seconds:.2} s, {dead} dead letters)");
                if round > 0 {
                    rates[i].push(rate);
                    results.record(serde_json::json!({"kind": "rate", "variant": name, "round": round, "records_per_s": rate, "dead_letters": dead}));
                }
            }
        }
    });
    if rounds == 0 {
        return;
    }
    let m: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
    eprintln!(
        "median: plain {:.0}/s, dlq {:.0}/s ({:.3}x), dlq-1% {:.0}/s ({:.3}x)",
        m[0],
        m[1],
        m[1] / m[0],
        m[2],
        m[2] / m[0]
    );
    results.record(serde_json::json!({"kind": "rate_summary", "plain_per_s": m[0], "dlq_per_s": m[1], "dlq_poison_per_s": m[2], "dlq_ratio": m[1] / m[0], "poison_ratio": m[2] / m[0]}));
}
