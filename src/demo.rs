//! The main job: share source -> SQL -> transactional topic sink on the embedded
//! broker, with checkpoints to object storage, crashes injected at random fault points,
//! and an independent exactly-once check at the end.
//!
//! A run starts afresh (it clears `--dir`) or, with [`DemoOptions::resume`], continues
//! the run a stopped or killed process left in `--dir`: it finishes producing the input
//! if that was cut short, recovers the job from its checkpoints and the broker's
//! journal, runs it to the end and checks the result against the whole input.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shareflow_checkpoint::CheckpointStore;
use shareflow_connector::broker::{BrokerMetrics, BrokerOptions, EmbeddedBroker};
use shareflow_connector::embedded::BrokerTransactions;
use shareflow_connector::embedded::ShareGroupSource;
use shareflow_connector::embedded::TopicSink;
use shareflow_connector::share::{AcknowledgementMode, ProducerRecord, ShareConfig, TopicPartition};
use shareflow_connector::verify::{check_exactly_once, ExactlyOnceReport};
use shareflow_connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow_runtime::failpoint::points as runtime_points;
use shareflow_runtime::{JobBuilder, JobConfig, JobSettings, RestartStrategy};

mod instances;
mod lone;
mod summary;

use instances::run_instances;
use lone::run_lone;
pub(crate) use summary::{CrashCost, DemoSummary, InstanceSummary};

/// The fault points the demo crashes at. The recovery points are left out:
/// `recovery.mid` is reached only when an earlier crash left decided work, so a schedule
/// naming it alone would never fire; the failure-recovery tests and the seeded campaign
/// cover it, and `recovery.after` too (`--crash-at recovery.after` names it).
pub(crate) const FAULT_POINTS: &[&str] = &[
    shareflow_connector::points::SOURCE_AFTER_POLL,
    shareflow_connector::points::SOURCE_AFTER_LOCK,
    shareflow_connector::points::SINK_AFTER_WRITE,
    runtime_points::AFTER_STATE_BEFORE_MANIFEST,
    runtime_points::AFTER_MANIFEST,
    runtime_points::COMMIT_BEFORE,
    runtime_points::COMMIT_MID,
    runtime_points::COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
];

/// The demo's share group (and job id).
pub(crate) const GROUP: &str = "demo";
/// The demo's input topic.
pub(crate) const INPUT: &str = "demo-input";
/// The demo's output topic.
pub(crate) const OUTPUT: &str = "demo-output";
/// Bytes of every input value ([`value_of`]`(id, VALUE_LEN)`).
pub(crate) const VALUE_LEN: usize = 100;
/// Checkpoints that may fail in a row before an attempt fails, in every demo job.
pub(crate) const TOLERABLE_FAILURES: u32 = 3;

/// Records per produce call.
const PRODUCE_CHUNK: usize = 20_000;

/// `group.share.delivery.count.limit` of the demo's group: the highest the broker
/// allows, so that a run killed and resumed many times does not archive records that
/// each killed attempt delivered and never committed.
pub(crate) const DELIVERY_LIMIT: u16 = 10;

/// The file in the demo directory that names the input of the run started there, written
/// before anything is produced. `--resume` reads it, so it knows the whole input even
/// when the first run was stopped while producing it.
pub(crate) const INPUT_MARKER: &str = "demo-input.json";

/// Why a demo run could not start.
#[derive(Debug)]
pub(crate) enum DemoError {
    /// `--resume` on a directory where no demo run was started.
    NothingToResume {
        /// The directory.
        dir: PathBuf,
    },
    /// The input marker of a run does not parse.
    BadMarker {
        /// The marker file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `--resume` asked for another acknowledgement mode than the run it resumes.
    ModeMismatch {
        /// The directory.
        dir: PathBuf,
        /// The mode of the run in the directory.
        started: AcknowledgementMode,
        /// The mode asked for now.
        asked: AcknowledgementMode,
    },
    /// A partition of the input topic holds more records than the run produces there.
    UnexpectedInput {
        /// The partition.
        partition: i32,
        /// Records found.
        found: i64,
        /// Records the run produces there.
        expected: u64,
    },
    /// More crashes asked for than there are fault points.
    TooManyCrashes {
        /// Crashes asked for.
        asked: usize,
        /// Fault points.
        points: usize,
    },
    /// `--instances N` with a mode or option it cannot run with.
    Instances {
        /// What is wrong and what to do.
        reason: &'static str,
    },
    /// A file operation on the demo directory failed.
    Io {
        /// What was done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for DemoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DemoError::NothingToResume { dir } => write!(
                f,
                "nothing to resume in {}: no demo run was started there ({INPUT_MARKER} is missing); \
                 start one with `shareflow demo --dir {}` (without --resume)",
                dir.display(),
                dir.display()
            ),
            DemoError::BadMarker { path, reason } => write!(
                f,
                "cannot resume: {} is damaged ({reason}); start the run afresh without --resume",
                path.display()
            ),
            DemoError::ModeMismatch { dir, started, asked } => write!(
                f,
                "the run in {} uses {started} acknowledgement, not {asked}: resume it in the mode it started in",
                dir.display()
            ),
            DemoError::UnexpectedInput { partition, found, expected } => write!(
                f,
                "partition {partition} of {INPUT} holds {found} records, more than the {expected} this run \
                 produces there: the directory holds another run's input; start afresh without --resume"
            ),
            DemoError::TooManyCrashes { asked, points } => {
                write!(f, "--crashes {asked} is more than the {points} fault points")
            }
            DemoError::Instances { reason } => write!(f, "--instances: {reason}"),
            DemoError::Io { action, path, source } => write!(f, "cannot {action} {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for DemoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DemoError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The input of a demo run: what its [`INPUT_MARKER`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DemoInput {
    /// Input records: ids `0..records`.
    pub(crate) records: u64,
    /// Partitions of the topics; id `i` goes to partition `i % partitions`.
    pub(crate) partitions: u32,
    /// The acknowledgement mode of the run.
    pub(crate) mode: AcknowledgementMode,
}

/// The marker file's JSON form.
#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    records: u64,
    partitions: u32,
    mode: String,
}

impl DemoInput {
    /// Writes the marker into `dir` durably: a temporary file, fsynced, renamed into
    /// place, and the directory fsynced.
    pub(crate) fn save(&self, dir: &Path) -> Result<(), DemoError> {
        let path = dir.join(INPUT_MARKER);
        let tmp = dir.join(format!("{INPUT_MARKER}.tmp"));
        let marker = Marker { records: self.records, partitions: self.partitions, mode: self.mode.to_string() };
        let text = serde_json::to_string(&marker).unwrap_or_default();
        fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DemoError + 'a {
            move |source| DemoError::Io { action, path: path.to_path_buf(), source }
        }
        let mut file = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
        file.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
        file.sync_all().map_err(io("fsync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("rename into place", &path))?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("fsync the directory", dir))
    }

    /// Reads the marker of the run in `dir`.
    pub(crate) fn load(dir: &Path) -> Result<Self, DemoError> {
        let path = dir.join(INPUT_MARKER);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DemoError::NothingToResume { dir: dir.to_path_buf() })
            }
            Err(source) => return Err(DemoError::Io { action: "read", path, source }),
        };
        let bad = |reason: String| DemoError::BadMarker { path: path.clone(), reason };
        let marker: Marker = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let records = marker.records;
        let partitions = Some(marker.partitions)
            .filter(|p| *p >= 1)
            .ok_or_else(|| bad("\"partitions\" must be 1..=4294967295".into()))?;
        let mode = marker.mode.parse().map_err(|e| bad(format!("bad \"mode\": {e}")))?;
        Ok(Self { records, partitions, mode })
    }

    /// Input records of `partition`.
    pub(crate) fn records_in(&self, partition: u32) -> u64 {
        let p = u64::from(self.partitions);
        self.records / p + u64::from(u64::from(partition) < self.records % p)
    }
}

/// Produces the part of `input` that its topic does not hold yet, and returns how many
/// records that was. Record `i` goes to partition `i % partitions` and ids are produced
/// in order, so every partition holds a prefix of its ids, and a run stopped while
/// producing is finished by producing the rest.
pub(crate) async fn produce_input(
    broker: &EmbeddedBroker,
    input: &DemoInput,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let mut present = Vec::with_capacity(input.partitions as usize);
    for p in 0..input.partitions {
        let partition = i32::try_from(p)?;
        let found = broker.end_offset(&TopicPartition::new(INPUT, partition)).await?;
        let expected = input.records_in(p);
        if found < 0 || found as u64 > expected {
            return Err(DemoError::UnexpectedInput { partition, found, expected }.into());
        }
        present.push(found as u64);
    }
    let partitions = u64::from(input.partitions);
    let mut batch = Vec::with_capacity(PRODUCE_CHUNK);
    let mut produced = 0;
    for id in 0..input.records {
        let p = id % partitions;
        if id / partitions < present[p as usize] {
            continue;
        }
        batch.push(ProducerRecord {
            partition: Some(i32::try_from(p)?),
            ..ProducerRecord::new(INPUT, 0, value_of(id, VALUE_LEN))
        });
        if batch.len() == PRODUCE_CHUNK {
            produced += batch.len() as u64;
            broker.produce(std::mem::take(&mut batch)).await?;
        }
    }
    produced += batch.len() as u64;
    if !batch.is_empty() {
        broker.produce(batch).await?;
    }
    Ok(produced)
}

/// Settings of one demo run.
#[derive(Debug, Clone)]
pub(crate) struct DemoOptions {
    /// Where the broker journal (and, by default, checkpoints) live. Cleared first,
    /// unless [`resume`](Self::resume) is set.
    pub(crate) dir: PathBuf,
    /// Records to produce. A resumed run takes the number of the run it resumes.
    pub(crate) records: u64,
    /// Checkpoint interval.
    pub(crate) interval: Duration,
    /// Crashes to inject (at most one per fault point).
    pub(crate) crashes: usize,
    /// Seed for the crash schedule.
    pub(crate) seed: u64,
    /// The crash schedule itself (`--crash-at`): `(point, skip)`, each firing on hit
    /// `skip + 1` of its point. When set, [`crashes`](Self::crashes) and
    /// [`seed`](Self::seed) are not used.
    pub(crate) schedule: Option<Vec<(String, u32)>>,
    /// Checkpoint storage URL; `None`: `file://{dir}/checkpoints`.
    pub(crate) checkpoints: Option<String>,
    /// Partitions of the topics. A resumed run takes the number of the run it resumes.
    pub(crate) partitions: u32,
    /// Parallelism of the job.
    pub(crate) parallelism: u32,
    /// Print progress to stderr every second.
    pub(crate) progress: bool,
    /// Exactly-once (transactional) or at-least-once (explicit) acknowledgement.
    pub(crate) mode: AcknowledgementMode,
    /// Continue the run in `dir` instead of starting afresh: keep the broker and the
    /// checkpoints, produce only what the first run had not produced of its input, run
    /// the job to the end and check it against the whole input.
    pub(crate) resume: bool,
    /// Run the job as this many instances of the share group in this process
    /// (decision 0007); 1: one lone job.
    pub(crate) instances: u32,
    /// Serve Prometheus metrics on this `HOST:PORT`.
    pub(crate) metrics_addr: Option<String>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("target/shareflow-demo"),
            records: 1_000_000,
            // Short enough that a crash redoes little (an epoch whose manifest a crash
            // prevented is processed again whole), long enough to cost ~3 % of the
            // crash-free rate against 500 ms (decision 0018).
            interval: Duration::from_millis(100),
            crashes: 3,
            seed: 1,
            schedule: None,
            instances: 1,
            checkpoints: None,
            partitions: 4,
            parallelism: 2,
            progress: true,
            mode: AcknowledgementMode::Transactional,
            resume: false,
            metrics_addr: None,
        }
    }
}

/// How a demo job restarts, `attempts` times at most: at once after a one-off crash
/// (10 ms), ever more slowly when crashes repeat (20 ms, 40 ms, ... up to 1 s).
pub(crate) fn restart_strategy(attempts: u32) -> RestartStrategy {
    RestartStrategy::ExponentialDelay { attempts, initial: Duration::from_millis(10), max: Duration::from_secs(1) }
}

/// The identity of a record, carried from the input value to the output value.
pub(crate) fn identity(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value.get(4..14)?).ok()?;
    if !value[..4].eq_ignore_ascii_case(b"rec-") {
        return None;
    }
    text.parse().ok()
}

/// The value of input record `id`: `rec-{id:010}-` padded with `x` to `len` bytes (at
/// least 16), which [`identity`] reads back.
pub(crate) fn value_of(id: u64, len: usize) -> Vec<u8> {
    let mut v = format!("rec-{id:010}-").into_bytes();
    v.resize(len.max(16), b'x');
    v
}

/// The demo's transform. It keeps each record's identity (upper-casing `rec-` is fine
/// for [`identity`]).
pub(crate) const TRANSFORM_SQL: &str = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input";

/// The demo pipeline's sink operator.
const SINK: &str = "topic-sink";

/// A small deterministic generator for the crash schedule.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The crash schedule of a seed: distinct fault points, each after a few hits.
pub(crate) fn crash_schedule(seed: u64, crashes: usize) -> Vec<(&'static str, u32)> {
    schedule_from(FAULT_POINTS, seed, crashes)
}

/// A crash schedule over `points`: `crashes` distinct points in a seeded order; per-batch
/// points (sources, sinks) after a few hits, checkpoint points on their first hit.
/// [`Failpoints::schedule`](shareflow_runtime::Failpoints::schedule) arms them all at
/// once, so each fires when the run reaches it, whatever the order.
pub(crate) fn schedule_from(points: &[&'static str], seed: u64, crashes: usize) -> Vec<(&'static str, u32)> {
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
    out
}

/// Clears the run in `dir`, if any, and records `input` as the new one. The marker goes
/// first and comes back last, so a process stopped in between leaves a directory that
/// `--resume` refuses rather than one it would resume with another run's data.
fn start_afresh(dir: &Path, input: &DemoInput) -> Result<(), DemoError> {
    let marker = dir.join(INPUT_MARKER);
    match std::fs::remove_file(&marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(DemoError::Io { action: "remove", path: marker, source }),
    }
    for sub in ["broker", "checkpoints"] {
        let path = dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(|source| DemoError::Io { action: "clear", path, source })?;
        }
    }
    input.save(dir)
}

/// Runs the demo and checks the result.
pub(crate) async fn run(options: &DemoOptions) -> Result<DemoSummary, Box<dyn std::error::Error + Send + Sync>> {
    check_options(options)?;
    // A checkpoint URL that cannot open fails before anything is produced.
    if let Some(url) = &options.checkpoints {
        CheckpointStore::from_url(url, &[], "demo")?;
    }
    let endpoint = crate::running::metrics_endpoint(options.metrics_addr.as_deref()).await?;
    let (input, dir) = prepare_dir(options)?;
    let (broker, group_config) = open_broker(&dir, &input, options.instances).await?;

    // Input: all of it, or on a resume what the first run did not produce.
    produce_and_report(options, &broker, &input, &dir).await?;

    if options.instances > 1 {
        return run_instances(options, &broker, &dir, group_config, input.records).await;
    }
    run_lone(options, &broker, &dir, group_config, &input, endpoint.as_ref()).await
}

/// Refuses options the demo cannot run with: more crashes than fault points, or
/// `--instances N` with at-least-once mode, `--resume` or `--metrics-addr`.
fn check_options(options: &DemoOptions) -> Result<(), DemoError> {
    if options.schedule.is_none() && options.crashes > FAULT_POINTS.len() {
        return Err(DemoError::TooManyCrashes { asked: options.crashes, points: FAULT_POINTS.len() });
    }
    if options.instances > 1 {
        if options.mode != AcknowledgementMode::Transactional {
            return Err(DemoError::Instances { reason: "instances need exactly-once mode; drop --at-least-once" });
        }
        if options.resume {
            return Err(DemoError::Instances { reason: "a run of several instances cannot be resumed; drop --resume" });
        }
        if options.metrics_addr.is_some() {
            return Err(DemoError::Instances {
                reason: "--metrics-addr serves one job; run each instance with `shareflow run --metrics-addr`",
            });
        }
    }
    Ok(())
}

/// Prepares `--dir` for the run. With `--resume`, reads the input of the run started
/// there and checks its mode is the one asked for; otherwise creates the directory and
/// starts afresh there, unless a live demo's broker holds it. Returns the input and the
/// directory's canonical path.
fn prepare_dir(options: &DemoOptions) -> Result<(DemoInput, PathBuf), Box<dyn std::error::Error + Send + Sync>> {
    let input = if options.resume {
        if !options.dir.is_dir() {
            return Err(DemoError::NothingToResume { dir: options.dir.clone() }.into());
        }
        let input = DemoInput::load(&options.dir)?;
        if input.mode != options.mode {
            return Err(
                DemoError::ModeMismatch { dir: options.dir.clone(), started: input.mode, asked: options.mode }.into()
            );
        }
        input
    } else {
        std::fs::create_dir_all(&options.dir).map_err(|source| DemoError::Io {
            action: "create",
            path: options.dir.clone(),
            source,
        })?;
        let input = DemoInput { records: options.records, partitions: options.partitions, mode: options.mode };
        // Never clear a directory a live demo's broker holds.
        if options.dir.join("broker").exists() {
            BrokerOptions::local_dir(options.dir.join("broker"))?.check_not_in_use()?;
        }
        start_afresh(&options.dir, &input)?;
        input
    };
    let dir = std::fs::canonicalize(&options.dir).map_err(|source| DemoError::Io {
        action: "resolve",
        path: options.dir.clone(),
        source,
    })?;
    Ok((input, dir))
}

/// Opens the embedded broker under `dir` with the demo group's configuration (room for
/// the open transactions of `instances` instances), creates the topics of `input` and
/// configures the group. Returns the broker and the group's configuration.
async fn open_broker(
    dir: &Path,
    input: &DemoInput,
    instances: u32,
) -> Result<(EmbeddedBroker, ShareConfig), Box<dyn std::error::Error + Send + Sync>> {
    let lock = Duration::from_secs(2);
    let group_config = ShareConfig::builder()
        .acknowledgement_mode(input.mode)
        .record_lock_duration(lock)
        .delivery_count_limit(DELIVERY_LIMIT)
        .partition_max_record_locks(1_000_000)
        // Per group: each instance, live or dead until adopted, keeps its pending
        // transactions (checked when a job starts), and one more instance joins late.
        .max_pending_transactions(JobSettings::pending_for(TOLERABLE_FAILURES) * (instances + 1))
        .build()?;
    let broker =
        EmbeddedBroker::open(BrokerOptions::local_dir(dir.join("broker"))?.default_config(group_config.clone()))
            .await?;
    broker.create_topic(INPUT, input.partitions).await?;
    broker.create_topic(OUTPUT, input.partitions).await?;
    broker.configure_group(GROUP, group_config.clone()).await?;
    Ok((broker, group_config))
}

/// Produces what the input topic lacks of `input` ([`produce_input`]) and, with progress
/// on, says how many records that was and how long it took; on a resume, also which run
/// in `dir` it continues.
async fn produce_and_report(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    input: &DemoInput,
    dir: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let produce_started = Instant::now();
    let produced = produce_input(broker, input).await?;
    if options.progress {
        let seconds = produce_started.elapsed().as_secs_f64();
        if options.resume {
            eprintln!(
                "resuming the run in {}: {} input records, {produced} of them produced now ({seconds:.2} s)",
                dir.display(),
                input.records
            );
        } else {
            eprintln!("produced {produced} records in {seconds:.2} s");
        }
    }
    Ok(())
}

/// The demo's pipeline: share source -> [`TRANSFORM_SQL`] -> topic sink, at
/// `parallelism`; with `txns`, acknowledgements and output join T(n) (exactly-once).
fn pipeline(
    broker: &EmbeddedBroker,
    txns: Option<Arc<BrokerTransactions>>,
    source: SourceSettings,
    group_config: ShareConfig,
    parallelism: u32,
    metrics: Arc<SourceMetrics>,
) -> JobBuilder {
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), txns.clone(), source, group_config, metrics),
    )
    .parallelism(parallelism)
    .sql("transform", TRANSFORM_SQL)
    .parallelism(parallelism)
    .sink(SINK, TopicSink::factory(broker.clone(), txns.clone(), OUTPUT))
    .parallelism(parallelism);
    if let Some(t) = txns {
        job.participant(t);
    }
    job
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn marker_round_trips_and_counts_records_per_partition() {
        let tmp = tempfile::tempdir().unwrap();
        let input = DemoInput { records: 10, partitions: 4, mode: AcknowledgementMode::Explicit };
        input.save(tmp.path()).unwrap();
        assert_eq!(DemoInput::load(tmp.path()).unwrap(), input);
        assert!(!tmp.path().join(format!("{INPUT_MARKER}.tmp")).exists());
        assert_eq!((0..4).map(|p| input.records_in(p)).collect::<Vec<_>>(), vec![3, 3, 2, 2]);
    }

    /// A prefix of the input produced, then the rest: each id once, in its partition.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn produce_input_produces_only_what_the_topic_lacks() {
        let broker = EmbeddedBroker::open(BrokerOptions::in_memory()).await.unwrap();
        broker.create_topic(INPUT, 3).await.unwrap();
        let whole = DemoInput { records: 3_000, partitions: 3, mode: AcknowledgementMode::Transactional };
        let part = DemoInput { records: 1_001, ..whole };
        assert_eq!(produce_input(&broker, &part).await.unwrap(), 1_001);
        // Ids 0, 3, ..., 999 in partition 0.
        assert_eq!(broker.end_offset(&TopicPartition::new(INPUT, 0)).await.unwrap(), 334);
        assert_eq!(produce_input(&broker, &whole).await.unwrap(), 1_999);
        assert_eq!(produce_input(&broker, &whole).await.unwrap(), 0);
        let foreign = DemoInput { records: 100, ..whole };
        let e = produce_input(&broker, &foreign).await.unwrap_err();
        assert!(
            matches!(
                e.downcast_ref::<DemoError>(),
                Some(DemoError::UnexpectedInput { expected: 34, found: 1_000, .. })
            ),
            "{e}"
        );
    }
}
