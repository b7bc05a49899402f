//! Exactly-once cost and recovery time on the embedded broker (release build, 2 cores).
//!
//! - EOS throughput (transactional acknowledgement) against at-least-once (explicit
//!   acknowledgement, ACCEPT on checkpoint completion) of the demo pipeline (the
//!   `shareflow demo` binary built with this bench's profile, read from its `--json`
//!   summary), in pairs that take turns going first, 5 rounds after one warm-up pair
//!   that is not counted (its order alternates from interval to interval), at checkpoint
//!   intervals 100 ms, 1 s and 10 s;
//!   each at full speed (until the sink had taken in every record) and to the end (the
//!   last checkpoint committed, which an at-least-once run reaches up to one interval
//!   later: its sources finish only once a periodic checkpoint accepted their last
//!   records);
//! - recovery time: from restart to the first new output, with 100,000 LOCKED records of
//!   a crashed instance pending; split into the job's recovery (its own metric) and what
//!   follows it, with the broker's fencing abort of those locks timed alone beside it.
//!
//! `cargo bench --bench eos_cost` (`-- recovery`: the recovery rounds only, written to
//! `eos_cost_recovery.jsonl`)

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arrow::record_batch::RecordBatch;
use shareflow::connector::share::AcknowledgementMode;
use shareflow::runtime::{
    async_trait, CheckpointId, Collector, Operator, Result as JobResult, Source, SourceEvent, StateItems,
    SubtaskContext,
};

#[path = "support/demo.rs"]
mod demo;
#[path = "support/results.rs"]
mod results;

/// Runs of each measurement; figures are medians with min and max.
const ROUNDS: usize = 5;
/// Recovery rounds are cheap (about a second each) and jitter more: more of them.
const RECOVERY_ROUNDS: usize = 11;

/// (median, min, max) of `values`.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2], values[0], values[values.len() - 1])
}

/// One `shareflow demo` run without crashes, in records per second: to its end (the
/// last checkpoint committed), and until the sink had taken in every record (the job at
/// full speed, without the tail an at-least-once run spends waiting for a periodic
/// checkpoint to accept its last records).
#[derive(Debug, Clone, Copy)]
struct Rates {
    to_end: f64,
    processed: f64,
}

/// The rates of one crash-free demo run in `mode`.
async fn throughput(mode: AcknowledgementMode, interval: Duration, records: u64) -> Rates {
    let (records, interval) = (records.to_string(), interval.as_millis().to_string());
    let mut args =
        vec!["--records".to_string(), records, "--interval".into(), interval, "--crashes".into(), "0".into()];
    if mode == AcknowledgementMode::Explicit {
        args.push("--at-least-once".into());
    }
    let run = tokio::task::spawn_blocking(move || demo::run(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap();
    if mode == AcknowledgementMode::Transactional {
        assert!(run.success && run.summary["violations"] == 0, "{}", run.summary);
    }
    let rate = |key: &str| {
        run.summary[key]
            .as_f64()
            .unwrap_or_else(|| panic!("a crash-free run's summary has a number {key}: {}", run.summary))
    };
    Rates { to_end: rate("records_per_second"), processed: rate("processed_per_second") }
}

/// One run in each mode, exactly-once first if `eos_first`; returns (exactly-once,
/// at-least-once).
async fn pair(eos_first: bool, interval: Duration, records: u64) -> (Rates, Rates) {
    let (eos, alo) = (AcknowledgementMode::Transactional, AcknowledgementMode::Explicit);
    if eos_first {
        let eos = throughput(eos, interval, records).await;
        (eos, throughput(alo, interval, records).await)
    } else {
        let alo = throughput(alo, interval, records).await;
        (throughput(eos, interval, records).await, alo)
    }
}

/// Where recovery to first output goes, one run.
struct RecoveryRun {
    /// Restart to the first new output record.
    first_output: Duration,
    /// Restart to the sources' first emitted batch (polled and staged in T(n)).
    first_emit: Duration,
    /// Of that, the job's recovery (restore, decide the pending transactions), from its
    /// own metric.
    recovery: Duration,
}

/// A source or sink that marks when it first emitted a batch (a source) or first wrote
/// one (a sink), and otherwise is `inner`.
struct Marked<T> {
    inner: T,
    first: Arc<OnceLock<Instant>>,
}

/// `factory`'s subtasks, marked into `first`.
fn marked<T, F>(factory: F, first: Arc<OnceLock<Instant>>) -> impl Fn(&SubtaskContext) -> Marked<T> + Send + Sync
where
    F: Fn(&SubtaskContext) -> T + Send + Sync,
{
    move |ctx| Marked { inner: factory(ctx), first: first.clone() }
}

#[async_trait]
impl<S: Source> Source for Marked<S> {
    async fn open(&mut self, ctx: &SubtaskContext, restored: StateItems) -> JobResult<()> {
        self.inner.open(ctx, restored).await
    }

    async fn poll_next(&mut self, checkpoint_id: CheckpointId) -> JobResult<SourceEvent> {
        let event = self.inner.poll_next(checkpoint_id).await?;
        if matches!(event, SourceEvent::Batch(_)) {
            let _ = self.first.set(Instant::now());
        }
        Ok(event)
    }

    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId) -> JobResult<StateItems> {
        self.inner.snapshot_state(checkpoint_id).await
    }

    async fn notify_checkpoint_complete(&mut self, checkpoint_id: CheckpointId) -> JobResult<()> {
        self.inner.notify_checkpoint_complete(checkpoint_id).await
    }

    async fn notify_checkpoint_aborted(&mut self, checkpoint_id: CheckpointId) -> JobResult<()> {
        self.inner.notify_checkpoint_aborted(checkpoint_id).await
    }

    async fn close(&mut self) -> JobResult<()> {
        self.inner.close().await
    }
}

#[async_trait]
impl<O: Operator> Operator for Marked<O> {
    async fn open(&mut self, ctx: &SubtaskContext, restored: StateItems) -> JobResult<()> {
        self.inner.open(ctx, restored).await
    }

    async fn process_batch(&mut self, batch: RecordBatch, input: usize, out: &mut Collector) -> JobResult<()> {
        self.inner.process_batch(batch, input, out).await?;
        let _ = self.first.set(Instant::now());
        Ok(())
    }

    async fn snapshot_state(&mut self, checkpoint_id: CheckpointId, out: &mut Collector) -> JobResult<StateItems> {
        self.inner.snapshot_state(checkpoint_id, out).await
    }

    async fn notify_checkpoint_complete(&mut self, checkpoint_id: CheckpointId) -> JobResult<()> {
        self.inner.notify_checkpoint_complete(checkpoint_id).await
    }

    async fn notify_checkpoint_aborted(&mut self, checkpoint_id: CheckpointId) -> JobResult<()> {
        self.inner.notify_checkpoint_aborted(checkpoint_id).await
    }

    async fn close(&mut self, out: &mut Collector) -> JobResult<()> {
        self.inner.close(out).await
    }
}

/// 100,000 records LOCKED by a crashed instance's ONGOING transaction `g-job-1`, on a
/// fresh broker in `dir`; returns the broker and the share config.
async fn crashed_instance(
    dir: &std::path::Path,
) -> (shareflow::connector::broker::EmbeddedBroker, shareflow::connector::share::ShareConfig) {
    use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
    use shareflow::connector::share::*;

    let config = ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .partition_max_record_locks(1_000_000)
        .transaction_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let broker =
        EmbeddedBroker::open(BrokerOptions::local_dir(dir.join("broker")).unwrap().default_config(config.clone()))
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
    (broker, config)
}

/// The broker's part alone, as the restarted job's participant does it: a new
/// coordinator for the prefix fences the crashed producer (InitProducer), which aborts its
/// open transaction and so releases the 100,000 locks.
async fn abort_time() -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let (broker, _) = crashed_instance(dir.path()).await;
    assert_eq!(broker.backlog("g", "in").await.unwrap().locked, 100_000, "the locks are held before the timer");
    let started = Instant::now();
    let _coordinator = broker.transaction_coordinator("g", "job").await.unwrap();
    let took = started.elapsed();
    assert_eq!(broker.backlog("g", "in").await.unwrap().locked, 0, "fencing aborted the crashed transaction");
    took
}

async fn recovery_time() -> RecoveryRun {
    use shareflow::checkpoint::CheckpointStore;
    use shareflow::connector::embedded::BrokerTransactions;
    use shareflow::connector::embedded::ShareGroupSource;
    use shareflow::connector::embedded::TopicSink;
    use shareflow::connector::share::*;
    use shareflow::connector::{record_schema, SourceSettings};
    use shareflow::runtime::{JobBuilder, JobConfig};

    let dir = tempfile::tempdir().unwrap();
    let (broker, config) = crashed_instance(dir.path()).await;
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    // When the first batch left a source, and the first output was written: marked by
    // the subtasks themselves, so no watcher competes with the job for the two cores.
    let (first_batch, first_write) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
    let mut source = SourceSettings::new("g", &["in"]);
    source.stop_when_drained = true;
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        marked(
            ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, config, Default::default()),
            first_batch.clone(),
        ),
    )
    .parallelism(2)
    .sink("topic-sink", marked(TopicSink::factory(broker.clone(), Some(txns.clone()), "out"), first_write.clone()))
    .parallelism(2)
    .participant(txns);
    let storage =
        CheckpointStore::from_url(&format!("file://{}", dir.path().join("chk").display()), &[], "rec").unwrap();
    let job = job.build(JobConfig::new(storage, "g", "job").checkpoint_interval(Duration::from_millis(500))).unwrap();
    let started = Instant::now();
    job.run().await.unwrap();
    let at = |first: &Arc<OnceLock<Instant>>| first.get().expect("the job wrote output").duration_since(started);
    let (first_emit, first_output) = (at(&first_batch), at(&first_write));
    let mut committed = 0;
    for p in 0..2 {
        committed +=
            broker.fetch_all(&TopicPartition::new("out", p), IsolationLevel::ReadCommitted).await.unwrap().len();
    }
    assert_eq!(committed, 200_000, "every record, the 100,000 recovered ones included, committed once");
    let recovery = job.metrics().checkpoints.recovery;
    assert_eq!(recovery.count, 1, "one attempt, one recovery");
    RecoveryRun { first_output, first_emit, recovery: Duration::from_secs_f64(recovery.sum_ms / 1e3) }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    // `-- recovery`: the recovery rounds only, into a file of their own (the full run's
    // file, which the generated tables read, stays as it is).
    let recovery_only = std::env::args().any(|a| a == "recovery");
    let bench = if recovery_only { "eos_cost_recovery" } else { "eos_cost" };
    let mut results =
        results::Results::create(bench, serde_json::json!({"rounds": ROUNDS, "recovery_rounds": RECOVERY_ROUNDS}));
    rt.block_on(async {
        // Runs long against the interval where it matters: an at-least-once run finishes
        // only once a checkpoint accepted its last records, which a short run pays for
        // with up to one interval (the full-speed rate leaves that tail out; the rate to
        // the end keeps it). At 10 s the 2,000,000-record runs stay under one interval,
        // so their rates to the end show the bound, not the modes.
        let intervals = [
            (Duration::from_millis(100), 2_000_000),
            (Duration::from_secs(1), 10_000_000),
            (Duration::from_secs(10), 2_000_000),
        ];
        for (index, (interval, records)) in intervals.into_iter().filter(|_| !recovery_only).enumerate() {
            let (mut ratios, mut processed_ratios) = (Vec::new(), Vec::new());
            let (mut eos_rates, mut alo_rates) = (Vec::new(), Vec::new());
            // A warm-up pair, not counted: the first 10 M-record runs of the first run of
            // this bench were the slowest of their interval, and they were always
            // exactly-once's. The warm-up's order alternates from interval to interval,
            // and its rates are kept as rows of their own ("warmup").
            let warm_eos_first = index % 2 == 0;
            let (eos, alo) = pair(warm_eos_first, interval, records).await;
            let warm = if warm_eos_first { [(true, eos), (false, alo)] } else { [(false, alo), (true, eos)] };
            for (i, (eos, rates)) in warm.iter().enumerate() {
                let mode = if *eos { "exactly_once" } else { "at_least_once" };
                println!(
                    "interval {interval:?}, {records} records, warm-up run {} ({mode}, not counted): {:.0} processed",
                    i + 1,
                    rates.processed
                );
                results.record(serde_json::json!({"kind": "warmup", "interval_ms": interval.as_millis() as u64,
                    "records": records, "mode": mode, "order": i + 1, "processed": rates.processed,
                    "to_end": rates.to_end}));
            }
            for round in 0..ROUNDS {
                // The modes take turns going first, so neither always follows the other's
                // run (and its deleted gigabytes).
                let eos_first = round % 2 == 0;
                let (eos, alo) = pair(eos_first, interval, records).await;
                println!(
                    "interval {interval:?}, {records} records, round {round}: exactly-once {:.0} rec/s ({:.0} processed), at-least-once {:.0} rec/s ({:.0} processed), ratio {:.3} (processed {:.3})",
                    eos.to_end,
                    eos.processed,
                    alo.to_end,
                    alo.processed,
                    eos.to_end / alo.to_end,
                    eos.processed / alo.processed,
                );
                results.record(serde_json::json!({"kind": "throughput", "interval_ms": interval.as_millis() as u64,
                    "records": records, "round": round, "exactly_once": eos.to_end, "at_least_once": alo.to_end,
                    "exactly_once_processed": eos.processed, "at_least_once_processed": alo.processed,
                    "first": if eos_first { "exactly_once" } else { "at_least_once" }}));
                ratios.push(eos.to_end / alo.to_end);
                processed_ratios.push(eos.processed / alo.processed);
                eos_rates.push(eos.processed);
                alo_rates.push(alo.processed);
            }
            let (r, p, e, a) =
                (spread(&mut ratios), spread(&mut processed_ratios), spread(&mut eos_rates), spread(&mut alo_rates));
            println!(
                "interval {interval:?}: EOS / at-least-once at full speed (processed) median {:.3} (min {:.3}, max {:.3}), to the end {:.3} ({:.3}-{:.3}); processed: exactly-once median {:.0} rec/s ({:.0}-{:.0}), at-least-once {:.0} ({:.0}-{:.0}), {ROUNDS} rounds",
                p.0, p.1, p.2, r.0, r.1, r.2, e.0, e.1, e.2, a.0, a.1, a.2
            );
        }
        // Recovery to first output, split: the job's recovery (restore, decide the
        // crashed transaction: the broker's fencing abort of its 100,000 locks is also
        // timed alone, on a broker of its own); then to the sources' first batch (T(n) begun,
        // tasks deployed, first poll, staged in T(n)); then to the first output record
        // (channel hop, the sink's transactional produce).
        let mut split: [Vec<f64>; 5] = Default::default();
        for round in 0..RECOVERY_ROUNDS {
            let run = recovery_time().await;
            let abort = abort_time().await;
            let to_emit = run.first_emit.saturating_sub(run.recovery);
            let to_output = run.first_output.saturating_sub(run.first_emit);
            println!(
                "recovery round {round}: first output {:?}: recovery {:?}, then first batch {:?}, then first output {:?}; the fencing abort alone {:?}",
                run.first_output, run.recovery, to_emit, to_output, abort
            );
            results.record(serde_json::json!({"kind": "recovery", "locked": 100_000, "round": round,
                "seconds": run.first_output.as_secs_f64(), "recovery_seconds": run.recovery.as_secs_f64(),
                "to_first_batch_seconds": to_emit.as_secs_f64(), "to_first_output_seconds": to_output.as_secs_f64(),
                "abort_seconds": abort.as_secs_f64()}));
            for (v, d) in split.iter_mut().zip([run.first_output, run.recovery, to_emit, to_output, abort]) {
                v.push(d.as_secs_f64() * 1e3);
            }
        }
        let [first, recovery, to_emit, to_output, abort] = split.map(|mut v| {
            let (m, lo, hi) = spread(&mut v);
            format!("{m:.2} ms ({lo:.2}-{hi:.2})")
        });
        println!(
            "recovery with 100,000 LOCKED records pending, {RECOVERY_ROUNDS} rounds: restart to first new output {first}; \
             the job's recovery {recovery}, then to the sources' first batch {to_emit}, then to the first output \
             {to_output}; the broker's fencing abort alone {abort}"
        );
    });
}
