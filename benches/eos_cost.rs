//! Exactly-once cost and recovery time on the embedded broker (release build, 2 cores).
//!
//! - EOS throughput (transactional acknowledgement) against at-least-once (explicit
//!   acknowledgement, ACCEPT on checkpoint completion) of the demo pipeline (the
//!   `shareflow demo` binary built with this bench's profile, read from its `--json`
//!   summary), run alternately, 5 rounds, at checkpoint intervals 100 ms, 1 s and 10 s;
//! - recovery time: from restart to the first new output, with 100,000 LOCKED records of
//!   a crashed instance pending.
//!
//! `cargo bench --bench eos_cost`

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use shareflow::connector::share::AcknowledgementMode;

#[path = "support/results.rs"]
mod results;

/// Runs of each measurement; figures are medians with min and max.
const ROUNDS: usize = 5;

/// (median, min, max) of `values`.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2], values[0], values[values.len() - 1])
}

/// Records per second of one `shareflow demo` run without crashes.
async fn throughput(mode: AcknowledgementMode, interval: Duration, records: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"));
    cmd.arg("demo").arg("--dir").arg(dir.path());
    cmd.args(["--records", &records.to_string(), "--interval", &interval.as_millis().to_string()]);
    cmd.args(["--crashes", "0", "--json"]);
    if mode == AcknowledgementMode::Explicit {
        cmd.arg("--at-least-once");
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value =
        stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| {
            panic!("no summary from shareflow demo: {stdout}{}", String::from_utf8_lossy(&out.stderr))
        });
    if mode == AcknowledgementMode::Transactional {
        assert!(out.status.success() && summary["violations"] == 0, "{summary}");
    }
    summary["records_per_second"].as_f64().unwrap()
}

async fn recovery_time() -> Duration {
    use std::sync::Arc;

    use shareflow::checkpoint::CheckpointStore;
    use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
    use shareflow::connector::embedded::BrokerTransactions;
    use shareflow::connector::embedded::ShareGroupSource;
    use shareflow::connector::embedded::TopicSink;
    use shareflow::connector::share::*;
    use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
    use shareflow::runtime::{JobBuilder, JobConfig};

    let dir = tempfile::tempdir().unwrap();
    let config = ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .partition_max_record_locks(1_000_000)
        .transaction_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let broker = EmbeddedBroker::open(
        BrokerOptions::local_dir(dir.path().join("broker")).unwrap().default_config(config.clone()),
    )
    .await
    .unwrap();
    broker.create_topic("in", 2).await.unwrap();
    broker.create_topic("out", 2).await.unwrap();
    for chunk in 0..20 {
        let records = (0..10_000u64)
            .map(|i| ProducerRecord {
                partition: Some((i % 2) as i32),
                ..ProducerRecord::new("in", 0, format!("rec-{:010}-", chunk * 10_000 + i))
            })
            .collect();
        broker.produce(records).await.unwrap();
    }
    // A crashed instance: 100,000 records LOCKED in its ONGOING transaction.
    {
        let coordinator = broker.transaction_coordinator("g", "job").await.unwrap();
        let txn = coordinator
            .begin_transaction(&TransactionId::new("g", "job", 1).unwrap(), Duration::from_secs(600))
            .await
            .unwrap();
        let mut consumer = broker.consumer("g", config.clone()).await.unwrap();
        consumer.subscribe(&["in"]).await.unwrap();
        let mut locked = 0;
        while locked < 100_000 {
            let records = consumer.poll(5_000.min(100_000 - locked), Duration::ZERO).await.unwrap();
            locked += records.len();
            consumer
                .acknowledge_batches_transactional(
                    &ShareAcknowledgements::from_records(&records, AcknowledgeType::Accept).unwrap(),
                    &txn,
                )
                .await
                .unwrap();
        }
        assert_eq!(broker.backlog("g", "in").await.unwrap().locked, 100_000);
        // The crash: the consumer vanishes without closing.
        std::mem::forget(consumer);
    }
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new("g", &["in"]);
    source.stop_when_drained = true;
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(
            broker.clone(),
            Some(txns.clone()),
            source,
            config,
            Arc::new(SourceMetrics::default()),
        ),
    )
    .parallelism(2)
    .sink("topic-sink", TopicSink::factory(broker.clone(), Some(txns.clone()), "out"))
    .parallelism(2)
    .participant(txns);
    let storage =
        CheckpointStore::from_url(&format!("file://{}", dir.path().join("chk").display()), &[], "rec").unwrap();
    let job = job.build(JobConfig::new(storage, "g", "job").checkpoint_interval(Duration::from_millis(500))).unwrap();
    let started = Instant::now();
    let watch = async {
        loop {
            let mut written = 0;
            for p in 0..2 {
                written += broker.end_offset(&TopicPartition::new("out", p)).await.unwrap();
            }
            if written > 0 {
                break started.elapsed();
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    };
    let (result, first_output) = tokio::join!(job.run(), watch);
    result.unwrap();
    let mut committed = 0;
    for p in 0..2 {
        committed +=
            broker.fetch_all(&TopicPartition::new("out", p), IsolationLevel::ReadCommitted).await.unwrap().len();
    }
    assert_eq!(committed, 200_000, "every record, the 100,000 recovered ones included, committed once");
    first_output
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut results = results::Results::create("eos_cost", serde_json::json!({"rounds": ROUNDS}));
    rt.block_on(async {
        // Runs long against the interval where it matters: an at-least-once run finishes
        // only once a checkpoint accepted its last records, which a short run pays for
        // with up to one interval. At 10 s the 2,000,000-record runs stay under one
        // interval, so that pair shows the bound, not the modes.
        for (interval, records) in [
            (Duration::from_millis(100), 2_000_000),
            (Duration::from_secs(1), 10_000_000),
            (Duration::from_secs(10), 2_000_000),
        ] {
            let mut ratios = Vec::new();
            let (mut eos_rates, mut alo_rates) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let eos = throughput(AcknowledgementMode::Transactional, interval, records).await;
                let alo = throughput(AcknowledgementMode::Explicit, interval, records).await;
                println!(
                    "interval {interval:?}, {records} records, round {round}: exactly-once {:.0} rec/s, at-least-once {:.0} rec/s, ratio {:.3}",
                    eos,
                    alo,
                    eos / alo
                );
                results.record(serde_json::json!({"kind": "throughput", "interval_ms": interval.as_millis() as u64,
                    "records": records, "round": round, "exactly_once": eos, "at_least_once": alo}));
                ratios.push(eos / alo);
                eos_rates.push(eos);
                alo_rates.push(alo);
            }
            let (r, e, a) = (spread(&mut ratios), spread(&mut eos_rates), spread(&mut alo_rates));
            println!(
                "interval {interval:?}: EOS / at-least-once median {:.3} (min {:.3}, max {:.3}); exactly-once median {:.0} rec/s ({:.0}-{:.0}), at-least-once {:.0} ({:.0}-{:.0}), {ROUNDS} rounds",
                r.0, r.1, r.2, e.0, e.1, e.2, a.0, a.1, a.2
            );
        }
        let mut times = Vec::new();
        for _ in 0..ROUNDS {
            let time = recovery_time().await;
            results.record(serde_json::json!({"kind": "recovery", "locked": 100_000, "seconds": time.as_secs_f64()}));
            times.push(time);
        }
        times.sort();
        println!(
            "recovery with 100,000 LOCKED records pending: restart to first new output {:?} (median of {ROUNDS}: {times:?})",
            times[ROUNDS / 2]
        );
    });
}
