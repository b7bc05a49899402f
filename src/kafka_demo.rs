//! The main job on a real Kafka 4.x broker: share source -> SQL -> transactional Kafka
//! sink, checkpoints on object storage, exactly-once through the acknowledgement ledger
//! (`docs/decisions/kafka-exactly-once.md`), and an exactly-once check at the end.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shareflow_checkpoint::CheckpointStore;
use shareflow_connector::kafka::{KafkaCluster, KafkaTransactions, KafkaTransactionsConfig};
use shareflow_connector::SourceMetrics;
use shareflow_runtime::failpoint::points as runtime_points;
use shareflow_runtime::{InstanceConfig, JobConfig, JobSettings, RestartStrategy};

use crate::demo::{identity, value_of, DELIVERY_LIMIT};
use crate::kafka_job::{input_topic, output_topic, pipeline, progress_line, serve_job_metrics, source_settings};
use crate::running::run_job;

/// The demo's silence before adoption beyond a checkpoint's interval and timeout: it
/// runs alone, so only a second start of its name could adopt it, after that long.
const DEMO_ADOPTION_MARGIN: Duration = Duration::from_secs(30);

/// The fault points an in-process Kafka run can crash at (docs/design.md §4).
pub(crate) const FAULT_POINTS: &[&str] = &[
    shareflow_connector::points::SOURCE_AFTER_POLL,
    shareflow_connector::points::SOURCE_AFTER_LOCK,
    shareflow_connector::points::SINK_AFTER_WRITE,
    runtime_points::AFTER_STATE_BEFORE_MANIFEST,
    runtime_points::AFTER_MANIFEST,
    runtime_points::COMMIT_BEFORE,
    runtime_points::COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
];

/// Settings of one run against a real broker.
#[derive(Debug, Clone)]
pub(crate) struct KafkaDemoOptions {
    /// `host:port` of the broker.
    pub(crate) bootstrap: String,
    /// Names the group (`{name}`), the topics (`{name}-input`, `{name}-output`) and the
    /// checkpoint job. A run with the same name resumes the same job.
    pub(crate) name: String,
    /// Records to produce first (0: produce nothing; resume or consume what is there).
    pub(crate) records: u64,
    /// Bytes per record value (at least 16).
    pub(crate) value_len: usize,
    /// Checkpoint interval.
    pub(crate) interval: Duration,
    /// Partitions of new topics.
    pub(crate) partitions: u32,
    /// Job parallelism.
    pub(crate) parallelism: u32,
    /// Checkpoint storage URL; `None`: `file://target/shareflow-kafka-demo/{name}`.
    pub(crate) checkpoints: Option<String>,
    /// Exactly-once (Kafka transactions) or at-least-once.
    pub(crate) exactly_once: bool,
    /// In-process crashes at fault points: `(point, skip)`, all armed at once, each
    /// firing on hit `skip + 1` of its own point.
    pub(crate) crashes: Vec<(String, u32)>,
    /// Check the output against the input at the end.
    pub(crate) verify: bool,
    /// Print progress to stderr every second.
    pub(crate) progress: bool,
    /// At most this many records per second through the job; `None`: unlimited.
    pub(crate) max_rate: Option<u64>,
    /// Serve Prometheus metrics on this `HOST:PORT`.
    pub(crate) metrics_addr: Option<String>,
}

impl KafkaDemoOptions {
    /// A fresh run on `bootstrap` with a unique name.
    pub(crate) fn new(bootstrap: &str) -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        Self {
            bootstrap: bootstrap.to_string(),
            name: format!("shareflow-demo-{nanos}"),
            records: 100_000,
            value_len: 100,
            interval: Duration::from_secs(1),
            partitions: 4,
            parallelism: 2,
            checkpoints: None,
            exactly_once: true,
            crashes: Vec::new(),
            verify: true,
            progress: true,
            max_rate: None,
            metrics_addr: None,
        }
    }
}

/// What a run did and what the check found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct KafkaDemoSummary {
    /// Records in the input topic.
    pub(crate) input_records: u64,
    /// Output records visible to read_committed readers.
    pub(crate) output_records: u64,
    /// Extra copies in the output.
    pub(crate) duplicates: u64,
    /// Input records missing from the output.
    pub(crate) lost: u64,
    /// Records replayed from the log (checkpoints that never committed).
    pub(crate) replayed: u64,
    /// Redeliveries the ledger skipped.
    pub(crate) skipped: u64,
    /// Records the sources polled with a delivery count above 1.
    pub(crate) redelivered: u64,
    /// Crashes injected in process.
    pub(crate) crashes: usize,
    /// Job attempts.
    pub(crate) attempts: u32,
    /// Checkpoints completed.
    pub(crate) checkpoints_completed: u64,
    /// Transactions committed by recovery.
    pub(crate) transactions_recovered: u64,
    /// Records per second through the job (produce excluded).
    pub(crate) records_per_second: f64,
    /// Seconds the job ran.
    pub(crate) seconds: f64,
}

impl KafkaDemoSummary {
    /// One JSON object: the summary, serialized.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Human-readable lines.
    pub(crate) fn to_text(&self) -> String {
        format!(
            "input records:          {}\noutput (read_committed): {}\nduplicates:             {}\nlost:                   {}\n\
             replayed from the log:  {}\nredelivered records:    {}\nredeliveries skipped:   {}\n\
             crashes injected:       {}\nattempts:               {}\n\
             checkpoints completed:  {}\ntxns committed by recovery: {}\nthroughput:             {:.0} records/s ({:.2} s)",
            self.input_records,
            self.output_records,
            self.duplicates,
            self.lost,
            self.replayed,
            self.redelivered,
            self.skipped,
            self.crashes,
            self.attempts,
            self.checkpoints_completed,
            self.transactions_recovered,
            self.records_per_second,
            self.seconds
        )
    }
}

/// Counts duplicates and losses of output values against ids `0..input`.
pub(crate) fn check(input: u64, output: &[Bytes]) -> (u64, u64) {
    let mut seen: HashMap<u64, u64> = HashMap::new();
    let mut duplicates = 0;
    for v in output {
        match identity(v) {
            Some(id) => {
                let n = seen.entry(id).or_default();
                *n += 1;
                if *n > 1 {
                    duplicates += 1;
                }
            }
            None => duplicates += 1,
        }
    }
    let lost = (0..input).filter(|id| !seen.contains_key(id)).count() as u64;
    (duplicates, lost)
}

/// Runs the job until the group has consumed its input.
pub(crate) async fn run(
    options: &KafkaDemoOptions,
) -> Result<KafkaDemoSummary, Box<dyn std::error::Error + Send + Sync>> {
    if options.partitions == 0 || options.parallelism == 0 {
        return Err("partitions and parallelism must be >= 1".into());
    }
    // A checkpoint URL that cannot open fails before anything is produced.
    let checkpoints = options.checkpoints.clone().unwrap_or_else(|| default_checkpoints(&options.name));
    let storage = CheckpointStore::from_url(&checkpoints, &[], &options.name)?;
    let endpoint = crate::running::metrics_endpoint(options.metrics_addr.as_deref()).await?;
    let cluster = KafkaCluster::connect(&options.bootstrap).await?;
    let (input, output) = (input_topic(&options.name), output_topic(&options.name));
    cluster.ensure_topic(&input, options.partitions as i32, &[]).await?;
    cluster.ensure_topic(&output, options.partitions as i32, &[]).await?;
    demo_group_limits(&cluster, &options.name).await?;
    if options.records > 0 {
        let started = Instant::now();
        let chunk = 20_000;
        let mut id = 0;
        while id < options.records {
            let n = chunk.min(options.records - id);
            cluster.produce(&input, (id..id + n).map(|i| (None, Bytes::from(value_of(i, options.value_len))))).await?;
            id += n;
        }
        if options.progress {
            eprintln!("produced {} records to {input} in {:.2} s", options.records, started.elapsed().as_secs_f64());
        }
    }

    let txns = KafkaTransactions::new(
        cluster.clone(),
        KafkaTransactionsConfig::default()
            .exactly_once(options.exactly_once)
            // A slot per transaction one attempt keeps open.
            .slots(JobSettings::pending_for(crate::demo::TOLERABLE_FAILURES) as u16),
    );
    // An instance of its name (its prefix, and its job id), so that a second start of the
    // same --name fences this one for good (exit code 3) rather than into a restart that
    // fences the other back.
    let mut config = JobConfig::new(storage, &options.name, &options.name)
        .checkpoint_interval(options.interval)
        .restart(RestartStrategy::FixedDelay {
            attempts: options.crashes.len() as u32 + 3,
            delay: Duration::from_millis(100),
        });
    let adoption = options.interval + config.checkpoint_timeout + DEMO_ADOPTION_MARGIN;
    config = config.instance(InstanceConfig::new(adoption));
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = crate::demo::TOLERABLE_FAILURES;

    let metrics = Arc::new(SourceMetrics::default());
    let mut source_config = source_settings(&options.name, &[&input], options.parallelism, options.max_rate);
    source_config.stop_when_drained = true;
    let job = pipeline(&cluster, &txns, source_config, &output, options.parallelism, &metrics);
    let job = job.build(config)?;
    job.failpoints().schedule(options.crashes.clone());
    if let Some(server) = &endpoint {
        serve_job_metrics(server, &job, &metrics, &cluster, &[&input]);
    }

    let progress = options.progress.then(|| progress_line(&metrics));
    let (report, seconds) = run_job(&job, progress).await?;
    let emitted = metrics.records_emitted.load(Ordering::Relaxed);
    let input_records: u64 = cluster.end_offsets(&input, false).await?.iter().map(|&o| o.max(0) as u64).sum();
    let (output_records, duplicates, lost) = if options.verify {
        // The last commit returned before its markers were written.
        cluster.wait_stable(&output, Duration::from_secs(30)).await?;
        let out: Vec<Bytes> = cluster.read_committed(&output).await?.into_iter().filter_map(|(_, _, _, v)| v).collect();
        let (d, l) = check(input_records, &out);
        (out.len() as u64, d, l)
    } else {
        (0, 0, 0)
    };
    Ok(KafkaDemoSummary {
        input_records,
        output_records,
        duplicates,
        lost,
        replayed: metrics.records_replayed.load(Ordering::Relaxed),
        skipped: metrics.records_skipped.load(Ordering::Relaxed),
        redelivered: metrics.records_redelivered.load(Ordering::Relaxed),
        crashes: job.failpoints().fired().len(),
        attempts: report.attempts,
        checkpoints_completed: report.metrics.checkpoints.completed,
        transactions_recovered: report.metrics.checkpoints.transactions_recovered,
        records_per_second: emitted as f64 / seconds,
        seconds,
    })
}

/// The demo's share group redelivers a record up to [`DELIVERY_LIMIT`] times, as the
/// embedded demo's does: each crash of a run gives back what its members held, with the
/// delivery count raised, and a run with many crashes must not archive the records at
/// the head of a partition (Kafka's default limit is 5).
pub(crate) async fn demo_group_limits(cluster: &KafkaCluster, group: &str) -> shareflow_connector::Result<()> {
    cluster.set_group_configs(group, &[("share.delivery.count.limit", &DELIVERY_LIMIT.to_string())]).await
}

/// The checkpoint root of a Kafka demo named `name` without `--checkpoints`.
pub(crate) fn default_checkpoints(name: &str) -> String {
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
    format!("file://{cwd}/target/shareflow-kafka-demo/{name}")
}
