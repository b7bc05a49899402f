//! The runtime end to end: golden output across parallelism and restarts, checkpoint
//! timeouts, notifications, and a crash at every runtime failpoint.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use shareflow::checkpoint::CheckpointStore;
use shareflow::runtime::async_trait;
use shareflow::runtime::failpoint::points;
use shareflow::runtime::testing::{CollectSink, SequenceSource};
use shareflow::runtime::{
    Collector, JobBuilder, JobConfig, Operator, RestartStrategy, Result, RuntimeError, StateItems, SubtaskContext,
};

const SPLITS: u32 = 6;
const ROWS: u64 = 600;
const QUERY: &str = r#"SELECT split, "offset", length(value) AS len FROM input WHERE "offset" % 3 <> 0"#;

/// A fresh in-memory checkpoint store per call (tests share the process).
fn storage(name: &str) -> CheckpointStore {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CheckpointStore::from_url(&format!("memory://runtime-{name}-{n}/checkpoints"), &[], "golden").unwrap()
}

/// source -> sql -> collect sink, the source throttled so time passes on a paused clock.
fn pipeline(sink: &CollectSink, parallelism: u32) -> JobBuilder {
    let job = JobBuilder::new();
    job.source(
        "numbers",
        SequenceSource::schema(),
        SequenceSource::factory_throttled(SPLITS, ROWS, 50, Duration::from_millis(1)),
    )
    .parallelism(parallelism)
    .sql("transform", QUERY)
    .parallelism(parallelism)
    .key_by("split")
    .sink("collect", sink.factory())
    .participant(sink.participant());
    job
}

fn expected_rows() -> usize {
    (SPLITS as u64 * (ROWS - ROWS.div_ceil(3))) as usize
}

async fn straight_through() -> Vec<String> {
    let sink = CollectSink::new();
    let config = JobConfig::new(storage("straight"), "golden", "straight");
    pipeline(&sink, 1).build(config).unwrap().run().await.unwrap();
    assert_eq!(sink.committed_rows(), expected_rows());
    sink.committed_sorted()
}

#[tokio::test(start_paused = true)]
async fn golden_output_is_identical_straight_checkpointed_and_rescaled() {
    let golden = straight_through().await;
    let sorted_unique = {
        let mut g = golden.clone();
        g.dedup();
        g.len()
    };
    assert_eq!(sorted_unique, golden.len(), "no duplicates in the golden output");

    // With checkpoints at parallelism 2, stopped by a crash after the third checkpoint...
    let sink = CollectSink::new();
    let store = storage("rescaled");
    let config = JobConfig::new(store.clone(), "golden", "rescaled").checkpoint_interval(Duration::from_millis(5));
    let job = pipeline(&sink, 2).build(config).unwrap();
    job.failpoints().arm(points::COMMIT_BEFORE, 3);
    let err = job.run().await.unwrap_err();
    assert!(matches!(err, RuntimeError::InjectedCrash(_)), "{err}");
    let partial = sink.committed_rows();
    assert!(partial > 0 && partial < expected_rows(), "stopped mid-way: {partial} rows committed");

    // ...then restored at parallelism 3 from the same storage: identical output.
    let config = JobConfig::new(store, "golden", "rescaled").checkpoint_interval(Duration::from_millis(5));
    let report = pipeline(&sink, 3).build(config).unwrap().run().await.unwrap();
    assert_eq!(report.restored_from, Some(4), "restores checkpoint 4, whose manifest was written before the crash");
    assert!(report.metrics.checkpoints.transactions_recovered >= 1, "recovery committed the decided transaction");
    assert_eq!(sink.committed_sorted(), golden);
    assert_eq!(sink.undecided(), 0);
}

/// An operator that records its notifications and can stall one snapshot.
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
    stall: Option<(u64, Duration)>,
}

#[async_trait]
impl Operator for Recorder {
    async fn process_batch(&mut self, batch: RecordBatch, _input: usize, out: &mut Collector) -> Result<()> {
        out.emit(batch).await
    }
    async fn snapshot_state(&mut self, n: u64, _out: &mut Collector) -> Result<StateItems> {
        if let Some((at, wait)) = self.stall {
            if at == n {
                tokio::time::sleep(wait).await;
            }
        }
        Ok(Vec::new())
    }
    async fn notify_checkpoint_complete(&mut self, n: u64) -> Result<()> {
        self.log.lock().unwrap().push(format!("complete {n}"));
        Ok(())
    }
    async fn notify_checkpoint_aborted(&mut self, n: u64) -> Result<()> {
        self.log.lock().unwrap().push(format!("aborted {n}"));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_checkpoint_is_aborted_and_the_next_completion_covers_it() {
    let sink = CollectSink::new();
    let log = Arc::new(Mutex::new(Vec::new()));
    let job = JobBuilder::new();
    let l = log.clone();
    job.source(
        "numbers",
        SequenceSource::schema(),
        SequenceSource::factory_throttled(2, 400, 20, Duration::from_millis(1)),
    )
    .operator("recorder", Some(SequenceSource::schema()), move |_: &SubtaskContext| Recorder {
        log: l.clone(),
        stall: Some((1, Duration::from_millis(150))),
    })
    .sink("collect", sink.factory())
    .participant(sink.participant());
    let mut config = JobConfig::new(storage("timeout"), "golden", "timeout")
        .checkpoint_interval(Duration::from_millis(10))
        .checkpoint_timeout(Duration::from_millis(100));
    config.tolerable_checkpoint_failures = 1;
    let report = job.build(config).unwrap().run().await.unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(log.first().map(String::as_str), Some("aborted 1"), "{log:?}");
    assert!(!log.contains(&"complete 1".to_string()), "checkpoint 1 never completes: {log:?}");
    assert!(report.metrics.checkpoints.aborted >= 1 && report.metrics.checkpoints.completed >= 1);
    // Epoch 1's output was not lost with its checkpoint: a later completion committed it.
    assert_eq!(sink.committed_rows(), 800);
    assert_eq!(sink.undecided(), 0);
}

#[tokio::test(start_paused = true)]
async fn too_many_failed_checkpoints_fail_the_job_with_a_clear_error() {
    let sink = CollectSink::new();
    let job = JobBuilder::new();
    job.source(
        "numbers",
        SequenceSource::schema(),
        SequenceSource::factory_throttled(1, 1000, 10, Duration::from_millis(1)),
    )
    .operator("stall", Some(SequenceSource::schema()), |_: &SubtaskContext| Recorder {
        log: Arc::default(),
        stall: Some((1, Duration::from_secs(10))),
    })
    .sink("collect", sink.factory())
    .participant(sink.participant());
    let config = JobConfig::new(storage("too-many"), "golden", "toomany")
        .checkpoint_interval(Duration::from_millis(10))
        .checkpoint_timeout(Duration::from_millis(50));
    let err = job.build(config).unwrap().run().await.unwrap_err();
    assert!(err.to_string().contains("consecutive checkpoints failed"), "{err}");
}

/// A crash at each runtime failpoint, then a restart: the output is exactly the
/// golden output, and the right checkpoint was restored.
#[tokio::test(start_paused = true)]
async fn a_crash_at_every_runtime_failpoint_recovers_exactly_once() {
    let golden = straight_through().await;
    for (i, point) in points::ALL.iter().enumerate() {
        let sink = CollectSink::new();
        let config = JobConfig::new(storage(&format!("fp-{i}")), "golden", "fp")
            .checkpoint_interval(Duration::from_millis(20))
            .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(5) });
        let job = pipeline(&sink, 2).build(config).unwrap();
        // Recovery only has work after a crash that leaves a decided transaction: the
        // recovery points crash in the recovery that follows one.
        let in_recovery = [points::RECOVERY_MID, points::AFTER_RECOVERY].contains(point);
        if in_recovery {
            job.failpoints().arm(points::COMMIT_BEFORE, 1);
        }
        // recovery.after is reached by the first start too: let that one pass.
        job.failpoints().arm(point, if *point == points::RECOVERY_MID { 0 } else { 1 });
        let report = job.run().await.unwrap();
        assert!(job.failpoints().fired().contains(&point.to_string()), "{point} fired");
        let expected_attempts = if in_recovery { 3 } else { 2 };
        assert_eq!(report.attempts, expected_attempts, "{point}");
        // Each restart waited the strategy's 5 ms, and the metrics say so.
        let restarts = u64::from(expected_attempts - 1);
        assert_eq!(report.metrics.restarts, restarts, "{point}");
        assert_eq!(report.metrics.restart_delay, Duration::from_millis(5 * restarts), "{point}");
        // Crash during checkpoint 2 (skip 1): before its manifest, 1 is restored; after
        // it, 2 is restored and its transaction is committed by recovery.
        let first_restore = if *point == points::AFTER_STATE_BEFORE_MANIFEST { 1 } else { 2 };
        assert!(report.restored_from >= Some(first_restore), "{point}: restored {:?}", report.restored_from);
        assert_eq!(sink.committed_sorted(), golden, "{point}: output differs from the golden run");
        assert_eq!(sink.undecided(), 0, "{point}: a transaction was left undecided");
    }
}

#[tokio::test]
async fn bad_graphs_and_configs_are_refused_at_build_time() {
    let sink = CollectSink::new();
    let cases: Vec<(JobBuilder, JobConfig, &str)> = vec![
        (JobBuilder::new(), JobConfig::new(storage("bad"), "g", "p"), "at least one source"),
        (
            {
                let job = JobBuilder::new();
                job.source("s", SequenceSource::schema(), SequenceSource::factory(1, 1, 1))
                    .sql("q", "SELECT missing FROM input")
                    .sink("k", sink.factory());
                job
            },
            JobConfig::new(storage("bad"), "g", "p"),
            "missing",
        ),
        (
            {
                let job = JobBuilder::new();
                job.source("s", SequenceSource::schema(), SequenceSource::factory(1, 1, 1))
                    .key_by("nope")
                    .sink("k", sink.factory());
                job
            },
            JobConfig::new(storage("bad"), "g", "p"),
            "nope",
        ),
        (
            {
                let job = JobBuilder::new();
                job.source("s", SequenceSource::schema(), SequenceSource::factory(1, 1, 1)).sink("s", sink.factory());
                job
            },
            JobConfig::new(storage("bad"), "g", "p"),
            "unique",
        ),
        (pipeline(&sink, 1), JobConfig::new(storage("bad"), "g", "ends-with-dash-"), "prefix"),
        (
            pipeline(&sink, 1),
            JobConfig::new(storage("bad"), "g", "p").checkpoint_interval(Duration::ZERO),
            "checkpoint.interval",
        ),
    ];
    for (job, config, needle) in cases {
        let err = job.build(config).err().expect("refused");
        assert_eq!(err.kind(), shareflow::runtime::ErrorKind::Invalid, "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    }
}

#[tokio::test(start_paused = true)]
async fn metrics_count_rows_and_checkpoints() {
    let sink = CollectSink::new();
    let config = JobConfig::new(storage("metrics"), "golden", "metrics").checkpoint_interval(Duration::from_millis(20));
    let report = pipeline(&sink, 2).build(config).unwrap().run().await.unwrap();
    let m = &report.metrics;
    assert_eq!(m.operators["numbers"].rows_out, SPLITS as u64 * ROWS);
    assert_eq!(m.operators["transform"].rows_in, SPLITS as u64 * ROWS);
    assert_eq!(m.operators["transform"].rows_out, expected_rows() as u64);
    assert_eq!(m.operators["collect"].rows_in, expected_rows() as u64);
    assert!(m.checkpoints.completed >= 2, "{:?}", m.checkpoints);
    assert!(m.checkpoints.last_completed_id.is_some());
}

/// What the runtime called on the sources and the participant of one job.
#[derive(Default)]
struct Ends {
    closed: std::sync::atomic::AtomicU32,
    abandoned: std::sync::atomic::AtomicU32,
    participant_closed: std::sync::atomic::AtomicU32,
}

/// A [`SequenceSource`] that counts how it ended.
struct Watched(shareflow::runtime::testing::SequenceSource, Arc<Ends>);

#[async_trait]
impl shareflow::runtime::Source for Watched {
    async fn open(&mut self, ctx: &SubtaskContext, restored: StateItems) -> Result<()> {
        self.0.open(ctx, restored).await
    }
    async fn poll_next(&mut self, checkpoint_id: u64) -> Result<shareflow::runtime::SourceEvent> {
        self.0.poll_next(checkpoint_id).await
    }
    async fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<StateItems> {
        self.0.snapshot_state(checkpoint_id).await
    }
    async fn close(&mut self) -> Result<()> {
        self.1.closed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.close().await
    }
    async fn abandon(&mut self) -> Result<()> {
        self.1.abandoned.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// A participant with no transactions of its own that counts its closes.
struct ClosingWitness(Arc<Ends>);

#[async_trait]
impl shareflow::runtime::TransactionParticipant for ClosingWitness {
    fn name(&self) -> &str {
        "witness"
    }
    async fn begin(&self, _txn: &shareflow::checkpoint::TransactionId) -> Result<()> {
        Ok(())
    }
    async fn prepare(&self, _txn: &shareflow::checkpoint::TransactionId) -> Result<shareflow::runtime::PrepareOutcome> {
        Ok(shareflow::runtime::PrepareOutcome::Prepared)
    }
    async fn commit(&self, _txn: &shareflow::checkpoint::TransactionId) -> Result<()> {
        Ok(())
    }
    async fn abort(&self, _txn: &shareflow::checkpoint::TransactionId) -> Result<()> {
        Ok(())
    }
    async fn pending(
        &self,
        _template: &shareflow::runtime::TransactionTemplate,
    ) -> Result<Vec<shareflow::runtime::PendingTransaction>> {
        Ok(Vec::new())
    }
    async fn close(&self) -> Result<()> {
        self.0.participant_closed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// source (watched) -> collect sink, with the witness participant; `crash_at` arms a
/// crash before that commit, with no restarts.
async fn run_watched(crash_at: Option<u32>) -> (std::result::Result<(), RuntimeError>, Arc<Ends>) {
    let ends = Arc::new(Ends::default());
    let sink = CollectSink::new();
    let job = JobBuilder::new();
    let inner = SequenceSource::factory_throttled(2, 2_000, 20, Duration::from_millis(1));
    let watched = ends.clone();
    job.source("numbers", SequenceSource::schema(), move |ctx: &SubtaskContext| Watched(inner(ctx), watched.clone()))
        .parallelism(2)
        .sink("collect", sink.factory())
        .participant(sink.participant())
        .participant(Arc::new(ClosingWitness(ends.clone())));
    let config = JobConfig::new(storage("ends"), "golden", "ends")
        .checkpoint_interval(Duration::from_millis(5))
        .restart(RestartStrategy::None);
    let job = job.build(config).unwrap();
    if let Some(n) = crash_at {
        job.failpoints().arm(points::COMMIT_BEFORE, n);
    }
    (job.run().await.map(|_| ()), ends)
}

/// A job that ends closes its sources and its participants; a failed attempt abandons
/// its sources (they release their clients without deciding anything), and the job
/// still closes its participants on the way out.
#[tokio::test(start_paused = true)]
async fn sources_close_or_abandon_and_participants_close_however_the_job_ends() {
    use std::sync::atomic::Ordering::SeqCst;
    let (result, ends) = run_watched(None).await;
    result.unwrap();
    assert_eq!(ends.closed.load(SeqCst), 2, "both source subtasks closed");
    assert_eq!(ends.abandoned.load(SeqCst), 0);
    assert_eq!(ends.participant_closed.load(SeqCst), 1);

    let (result, ends) = run_watched(Some(2)).await;
    assert!(matches!(result, Err(RuntimeError::InjectedCrash(_))), "{result:?}");
    assert_eq!(ends.abandoned.load(SeqCst), 2, "both source subtasks abandoned");
    assert_eq!(ends.closed.load(SeqCst), 0, "a failed attempt closes nothing");
    assert_eq!(ends.participant_closed.load(SeqCst), 1, "closed once on the way out");
}
