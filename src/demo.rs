//! The main job: share source -> SQL -> transactional topic sink on the embedded
//! broker, with checkpoints to object storage, crashes injected at random fault points,
//! and an independent exactly-once check at the end.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shareflow_checkpoint::CheckpointStore;
use shareflow_connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow_connector::participant::BrokerTransactions;
use shareflow_connector::share::{AcknowledgementMode, ProducerRecord, ShareConfig};
use shareflow_connector::sink::TopicSink;
use shareflow_connector::source::{record_schema, ShareGroupSource, ShareSourceConfig, SourceMetrics};
use shareflow_connector::verify::{check_exactly_once, ExactlyOnceReport};
use shareflow_runtime::failpoint::points as runtime_points;
use shareflow_runtime::{JobBuilder, JobConfig, RestartStrategy, RuntimeError};

/// The fault points the demo crashes at. `recovery.mid` is left out: it is reached only
/// when a crash left decided work, so a schedule could wait on it forever; the
/// failure-recovery tests cover it.
pub const FAULT_POINTS: &[&str] = &[
    shareflow_connector::source::points::AFTER_POLL,
    shareflow_connector::source::points::AFTER_LOCK,
    shareflow_connector::sink::points::AFTER_WRITE,
    runtime_points::AFTER_STATE_BEFORE_MANIFEST,
    runtime_points::AFTER_MANIFEST,
    runtime_points::COMMIT_BEFORE,
    runtime_points::COMMIT_MID,
    runtime_points::COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
];

const GROUP: &str = "demo";
const INPUT: &str = "demo-input";
const OUTPUT: &str = "demo-output";
const VALUE_LEN: usize = 100;

/// Settings of one demo run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Where the broker journal (and, by default, checkpoints) live. Cleared first.
    pub dir: PathBuf,
    /// Records to produce.
    pub records: u64,
    /// Checkpoint interval.
    pub interval: Duration,
    /// Crashes to inject (at most one per fault point).
    pub crashes: usize,
    /// Seed for the crash schedule.
    pub seed: u64,
    /// Checkpoint storage URL; `None`: `file://{dir}/checkpoints`.
    pub checkpoints: Option<String>,
    /// Partitions of the topics.
    pub partitions: u32,
    /// Parallelism of the job.
    pub parallelism: u32,
    /// Print progress to stderr every second.
    pub progress: bool,
    /// Exactly-once (transactional) or at-least-once (explicit) acknowledgement.
    pub mode: AcknowledgementMode,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("target/shareflow-demo"),
            records: 1_000_000,
            interval: Duration::from_millis(500),
            crashes: 3,
            seed: 1,
            checkpoints: None,
            partitions: 4,
            parallelism: 2,
            progress: true,
            mode: AcknowledgementMode::Transactional,
        }
    }
}

/// The summary of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoSummary {
    /// Records produced to the input topic.
    pub records_produced: u64,
    /// Output records visible to read_committed readers.
    pub records_committed: u64,
    /// Extra copies of output.
    pub duplicates: u64,
    /// Records neither done nor output.
    pub lost: u64,
    /// Records archived (all reasons).
    pub archived: u64,
    /// Crashes injected (failpoints that fired).
    pub crashes: usize,
    /// The failpoints that fired, in order.
    pub crash_points: Vec<String>,
    /// Checkpoints completed.
    pub checkpoints_completed: u64,
    /// Checkpoints aborted.
    pub checkpoints_aborted: u64,
    /// Broker transactions committed.
    pub transactions_committed: u64,
    /// Broker transactions aborted.
    pub transactions_aborted: u64,
    /// Transactions committed by recovery.
    pub transactions_recovered: u64,
    /// Job attempts.
    pub attempts: u32,
    /// Records per second through the job (produce excluded).
    pub records_per_second: f64,
    /// Seconds the job ran.
    pub seconds: f64,
    /// Invariant violations found by the checker.
    pub violations: Vec<String>,
}

impl DemoSummary {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "records_produced": self.records_produced,
            "records_committed": self.records_committed,
            "duplicates": self.duplicates,
            "lost": self.lost,
            "archived": self.archived,
            "crashes": self.crashes,
            "crash_points": self.crash_points,
            "checkpoints_completed": self.checkpoints_completed,
            "checkpoints_aborted": self.checkpoints_aborted,
            "transactions_committed": self.transactions_committed,
            "transactions_aborted": self.transactions_aborted,
            "transactions_recovered": self.transactions_recovered,
            "attempts": self.attempts,
            "records_per_second": self.records_per_second.round(),
            "seconds": (self.seconds * 1000.0).round() / 1000.0,
            "violations": self.violations.len(),
        })
        .to_string()
    }

    /// A human summary.
    pub fn to_text(&self) -> String {
        format!(
            "records: produced {}, committed output {}, duplicated {}, lost {}, archived {}\n\
             crashes: {} at {:?}; job attempts {}\n\
             checkpoints: completed {}, aborted {}\n\
             transactions: committed {}, aborted {}, recovered {}\n\
             throughput: {:.0} records/s over {:.2} s\n\
             exactly-once check: {}",
            self.records_produced,
            self.records_committed,
            self.duplicates,
            self.lost,
            self.archived,
            self.crashes,
            self.crash_points,
            self.attempts,
            self.checkpoints_completed,
            self.checkpoints_aborted,
            self.transactions_committed,
            self.transactions_aborted,
            self.transactions_recovered,
            self.records_per_second,
            self.seconds,
            if self.violations.is_empty() {
                "passed".to_string()
            } else {
                format!(
                    "{} violations: {:?}",
                    self.violations.len(),
                    self.violations.iter().take(5).collect::<Vec<_>>()
                )
            },
        )
    }
}

/// The identity of a record, carried from the input value to the output value.
pub fn identity(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value.get(4..14)?).ok()?;
    if !value[..4].eq_ignore_ascii_case(b"rec-") {
        return None;
    }
    text.parse().ok()
}

/// The value of input record `id`: `rec-{id:010}-` padded with `x` to `len` bytes (at
/// least 16), which [`identity`] reads back.
pub fn value_of(id: u64, len: usize) -> Vec<u8> {
    let mut v = format!("rec-{id:010}-").into_bytes();
    v.resize(len.max(16), b'x');
    v
}

/// The demo's transform. It keeps each record's identity (upper-casing `rec-` is fine
/// for [`identity`]).
pub const TRANSFORM_SQL: &str = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input";

/// A progress line, made when asked.
pub(crate) type ProgressLine = std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + 'static>>;

/// Runs `job` to its end, printing the line `progress` makes every second if given.
/// Returns the report and how many seconds the job ran.
pub(crate) async fn run_job(
    job: &shareflow_runtime::Job,
    progress: Option<impl Fn() -> ProgressLine + Send + 'static>,
) -> Result<(shareflow_runtime::JobReport, f64), Box<dyn std::error::Error + Send + Sync>> {
    let started = Instant::now();
    let printer = progress.map(|line| {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Some(l) = line().await {
                    eprintln!("{l}");
                }
            }
        })
    });
    let outcome = job.run().await;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(p) = printer {
        p.abort();
    }
    match outcome {
        Ok(r) => Ok((r, seconds)),
        Err(RuntimeError::RestartsExhausted { attempts, last }) => {
            Err(format!("the job failed {attempts} times; last error: {last}").into())
        }
        Err(e) => Err(e.into()),
    }
}

/// A small deterministic generator for the crash schedule.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The crash schedule of a seed: distinct fault points, each after a few hits.
pub fn crash_schedule(seed: u64, crashes: usize) -> Vec<(&'static str, u32)> {
    schedule_from(FAULT_POINTS, seed, crashes)
}

/// A crash schedule over `points`: `crashes` distinct points in a seeded order, per-batch
/// points (sources, sinks) first and after a few hits, checkpoint points after them.
pub fn schedule_from(points: &[&'static str], seed: u64, crashes: usize) -> Vec<(&'static str, u32)> {
    let per_batch = |p: &str| p.contains("source.") || p.starts_with("sink.");
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut points: Vec<&'static str> = points.to_vec();
    let mut out = Vec::new();
    for _ in 0..crashes.min(points.len()) {
        let i = (next(&mut s) % points.len() as u64) as usize;
        let point = points.remove(i);
        // Source and sink points are hit per batch, checkpoint points once per checkpoint.
        let skip = if per_batch(point) { next(&mut s) % 8 } else { 0 };
        out.push((point, skip as u32));
    }
    // Per-batch points first: they come round fast, so a short run still reaches the
    // checkpoint points after them.
    out.sort_by_key(|(p, _)| !per_batch(p));
    out
}

/// Runs the demo and checks the result.
pub async fn run(options: &DemoOptions) -> Result<DemoSummary, Box<dyn std::error::Error + Send + Sync>> {
    if options.crashes > FAULT_POINTS.len() {
        return Err(
            format!("--crashes {} is more than the {} fault points", options.crashes, FAULT_POINTS.len()).into()
        );
    }
    for sub in ["broker", "checkpoints"] {
        let path = options.dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| format!("cannot clear {}: {e}", path.display()))?;
        }
    }
    std::fs::create_dir_all(&options.dir).map_err(|e| format!("cannot create {}: {e}", options.dir.display()))?;
    let dir = std::fs::canonicalize(&options.dir)?;
    let lock = Duration::from_secs(2);
    let group_config = ShareConfig::builder()
        .acknowledgement_mode(options.mode)
        .record_lock_duration(lock)
        .partition_max_record_locks(1_000_000)
        .build()?;
    let broker =
        EmbeddedBroker::open(BrokerOptions::local_dir(dir.join("broker"))?.default_config(group_config.clone()))
            .await?;
    broker.create_topic(INPUT, options.partitions).await?;
    broker.create_topic(OUTPUT, options.partitions).await?;
    broker.configure_group(GROUP, group_config.clone()).await?;

    // Input.
    let produce_started = Instant::now();
    let chunk = 20_000;
    let mut id = 0;
    while id < options.records {
        let n = chunk.min(options.records - id);
        let records = (id..id + n)
            .map(|i| ProducerRecord {
                partition: Some((i % options.partitions as u64) as i32),
                ..ProducerRecord::new(INPUT, 0, value_of(i, VALUE_LEN))
            })
            .collect();
        broker.produce(records).await?;
        id += n;
    }
    if options.progress {
        eprintln!("produced {} records in {:.2} s", options.records, produce_started.elapsed().as_secs_f64());
    }

    // The job.
    let transactional = options.mode == AcknowledgementMode::Transactional;
    let checkpoints_url =
        options.checkpoints.clone().unwrap_or_else(|| format!("file://{}", dir.join("checkpoints").display()));
    let storage = CheckpointStore::from_url(&checkpoints_url, &[], "demo")?;
    let txns = transactional.then(|| BrokerTransactions::new(broker.clone(), Duration::from_secs(60)));
    let metrics = Arc::new(SourceMetrics::default());
    let mut source_config = ShareSourceConfig::new(GROUP, &[INPUT], group_config);
    source_config.stop_when_drained = true;
    source_config.max_poll_records = 2_000;
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), txns.clone(), source_config, metrics.clone()),
    )
    .parallelism(options.parallelism)
    .sql("transform", TRANSFORM_SQL)
    .parallelism(options.parallelism)
    .sink("topic-sink", TopicSink::factory(broker.clone(), txns.clone(), OUTPUT))
    .parallelism(options.parallelism);
    if let Some(t) = &txns {
        job.participant(t.clone());
    }
    let mut config = JobConfig::new(storage, GROUP, "demo").checkpoint_interval(options.interval).restart(
        RestartStrategy::FixedDelay { attempts: options.crashes as u32 + 3, delay: Duration::from_millis(50) },
    );
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = 3;
    let job = job.build(config)?;
    let schedule = crash_schedule(options.seed, options.crashes);
    job.failpoints().schedule(schedule.iter().map(|(p, s)| (p.to_string(), *s)).collect());

    let progress = options.progress.then(|| {
        let broker = broker.clone();
        let total = options.records;
        move || -> ProgressLine {
            let broker = broker.clone();
            Box::pin(async move {
                let b = broker.backlog(GROUP, INPUT).await.ok()?;
                Some(format!(
                    "progress: {:>6.1}% done ({} acknowledged, {} locked in open checkpoints)",
                    100.0 * (b.acknowledged + b.archived) as f64 / total.max(1) as f64,
                    b.acknowledged,
                    b.locked
                ))
            })
        }
    });
    let (report, seconds) = run_job(&job, progress).await?;
    // Independent check: the output topic read_committed, and every share-partition state.
    let check: ExactlyOnceReport = check_exactly_once(&broker, GROUP, INPUT, OUTPUT, identity).await?;
    let broker_metrics = broker.metrics().await?;
    let fired = job.failpoints().fired();
    Ok(DemoSummary {
        records_produced: check.produced,
        records_committed: check.committed_output,
        duplicates: check.duplicates,
        lost: check.lost,
        archived: check.archived.values().sum(),
        crashes: fired.len(),
        crash_points: fired,
        checkpoints_completed: report.metrics.checkpoints.completed,
        checkpoints_aborted: report.metrics.checkpoints.aborted,
        transactions_committed: broker_metrics.transaction_commit_total,
        transactions_aborted: broker_metrics.transaction_abort_total,
        transactions_recovered: report.metrics.checkpoints.transactions_recovered,
        attempts: report.attempts,
        records_per_second: options.records as f64 / seconds,
        seconds,
        violations: check.violations,
    })
}
