//! `shareflow run JOB.toml` on an embedded broker directory (`broker = "DIR"` in the
//! file), and `shareflow produce --dir DIR --topic T`, which loads its input: a user's
//! own pipeline with no server at all. The directory belongs to one process at a time
//! (it is locked), so a job file on it runs as one instance; `produce` appends through
//! that process while it runs ([`crate::live`]).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shareflow_checkpoint::CheckpointStore;
use shareflow_connector::broker::{BrokerOptions, DeadLetterTarget, EmbeddedBroker};
use shareflow_connector::embedded::{BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow_connector::share::{AcknowledgementMode, IsolationLevel, ProducerRecord, ShareConfig};
use shareflow_connector::{record_schema, FileCommitter, FileSink, PrintSink, SourceMetrics, SourceSettings};
use shareflow_runtime::{JobConfig, JobSettings, RestartStrategy};

use crate::job_file::{JobFile, SinkSpec};
use crate::running::{run_job, stop_signal};

/// Errors: what failed, with the path or value, and what to do.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Checkpoints that may fail in a row before an attempt fails.
const TOLERABLE_FAILURES: u32 = 2;

/// How long a transaction of the job may stay open on the broker.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// What a run did before it stopped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct EmbeddedRunSummary {
    pub(crate) broker: String,
    pub(crate) emitted: u64,
    pub(crate) attempts: u32,
    pub(crate) checkpoints_completed: u64,
    pub(crate) transactions_recovered: u64,
    #[serde(rename = "stopped")]
    pub(crate) stopped_by_signal: bool,
    pub(crate) seconds: f64,
}

impl EmbeddedRunSummary {
    /// One JSON object: the summary, serialized.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(crate) fn to_text(&self) -> String {
        format!(
            "job on {}: {} records emitted, {} checkpoints, {} transactions recovered, {} attempts, {:.1} s{}",
            self.broker,
            self.emitted,
            self.checkpoints_completed,
            self.transactions_recovered,
            self.attempts,
            self.seconds,
            if self.stopped_by_signal { "; stopped by a signal" } else { "" }
        )
    }
}

/// The group's settings: the file's mode, with the locks and limits the demo uses, and
/// room for many instances' pending transactions.
fn group_config(file: &JobFile) -> Result<ShareConfig, BoxError> {
    let mode = if file.exactly_once { AcknowledgementMode::Transactional } else { AcknowledgementMode::Explicit };
    // An exactly-once job never reads what a transaction may still take back: its input
    // may be another job's output, or a dead-letter topic (a redrive).
    let isolation = if file.exactly_once { IsolationLevel::ReadCommitted } else { IsolationLevel::ReadUncommitted };
    Ok(ShareConfig::builder()
        .acknowledgement_mode(mode)
        .isolation_level(isolation)
        .record_lock_duration(Duration::from_secs(30))
        .partition_max_record_locks(1_000_000)
        // Room for 16 instances' pending transactions (checked when the job starts):
        // instances that died under other names stay registered until one is adopted.
        .max_pending_transactions(16 * JobSettings::pending_for(TOLERABLE_FAILURES))
        .build()?)
}

/// Creates `topic` with `partitions` unless it exists; returns its partition count.
async fn ensure_topic(broker: &EmbeddedBroker, topic: &str, partitions: u32) -> Result<u32, BoxError> {
    match broker.partition_count(topic) {
        Ok(n) => Ok(n as u32),
        Err(_) => {
            broker.create_topic(topic, partitions).await?;
            Ok(partitions)
        }
    }
}

/// Opens the broker directory `dir` (creating it), with `config` for groups.
async fn open_broker(dir: &Path, config: ShareConfig) -> Result<EmbeddedBroker, BoxError> {
    Ok(EmbeddedBroker::open(BrokerOptions::local_dir(dir)?.default_config(config)).await?)
}

/// Runs the job file `file` on its broker directory `dir` until SIGTERM or Ctrl-C (a
/// final checkpoint, then the broker closes). Checkpoints go to `checkpoints`, under the
/// job id `instance`.
///
/// While it runs, the process serves its metrics, its dashboard and produce requests
/// ([`crate::live`]) at `options.metrics_addr`, or at a free port of 127.0.0.1, whose
/// address it writes to `DIR/endpoint`.
pub(crate) async fn run(file: &JobFile, dir: &Path, options: &RunOn<'_>) -> Result<EmbeddedRunSummary, BoxError> {
    // From here on a SIGTERM stops the run gracefully, also while it starts.
    let signal = stop_signal();
    let storage = CheckpointStore::from_url(options.checkpoints, &[], options.instance)?;
    let config = group_config(file)?;
    let server = match options.metrics_addr {
        Some(addr) => crate::running::metrics_endpoint(Some(addr)).await?,
        None => Some(shareflow::prometheus::MetricsServer::bind("127.0.0.1:0").await?),
    }
    .ok_or("no endpoint")?;
    let broker = open_broker(dir, config.clone()).await?;
    let result = async {
        let _endpoint = crate::live::serve(&server, &broker, dir)?;
        run_on(file, &broker, storage, config, options, &server, signal).await
    }
    .await;
    broker.close();
    let mut summary = result?;
    summary.broker = dir.display().to_string();
    Ok(summary)
}

/// Where and how [`run`] runs a job file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunOn<'a> {
    /// The checkpoint root.
    pub(crate) checkpoints: &'a str,
    /// The job id (instance name).
    pub(crate) instance: &'a str,
    /// Where to serve metrics, the dashboard and produce requests (default: any free
    /// port of 127.0.0.1).
    pub(crate) metrics_addr: Option<&'a str>,
    /// Crashes to inject, for tests (`--crash-at`).
    pub(crate) crashes: &'a [(String, u32)],
    /// The savepoint to start from (`--from-savepoint`).
    pub(crate) savepoint: Option<&'a str>,
}

async fn run_on(
    file: &JobFile,
    broker: &EmbeddedBroker,
    storage: CheckpointStore,
    group: ShareConfig,
    options: &RunOn<'_>,
    server: &shareflow::prometheus::MetricsServer,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<EmbeddedRunSummary, BoxError> {
    let instance = options.instance;
    for topic in &file.topics {
        ensure_topic(broker, topic, file.partitions).await?;
    }
    broker.configure_group(&file.group, group.clone()).await?;
    let txns = file.exactly_once.then(|| BrokerTransactions::new(broker.clone(), TRANSACTION_TIMEOUT));
    let metrics = Arc::new(SourceMetrics::default());
    let topics: Vec<&str> = file.topics.iter().map(String::as_str).collect();
    let mut source = SourceSettings::new(&file.group, &topics);
    source.max_records_per_second = file.max_rate.map(|r| (r / u64::from(file.parallelism)).max(1));
    source.stop_when_drained = file.stop_when_drained;
    source.read_committed = file.exactly_once;
    let job = shareflow_runtime::JobBuilder::new();
    let mut stream = job
        .source(
            "share-source",
            record_schema(),
            ShareGroupSource::factory(broker.clone(), txns.clone(), source, group, metrics.clone()),
        )
        .parallelism(file.parallelism);
    for (name, sql, options) in &file.transforms {
        stream = stream.sql_with(name, sql, *options).parallelism(file.parallelism);
    }
    add_sink(file, broker, &txns, stream, &job).await?;
    if let Some(t) = txns {
        job.participant(t);
    }
    let mut config = JobConfig::new(storage, &file.group, instance)
        .checkpoint_interval(file.interval)
        .checkpoint_timeout(file.checkpoint_timeout)
        .restart(RestartStrategy::FixedDelay { attempts: file.restarts, delay: Duration::from_millis(500) });
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = TOLERABLE_FAILURES;
    if let Some(url) = options.savepoint {
        config = config.from_savepoint(url);
    }
    let job = job.build(config)?;
    job.failpoints().schedule(options.crashes.to_vec());
    shareflow::control::serve(server, &job, options.checkpoints);
    let on_usr1 = shareflow::control::savepoint_on_signal(&job, options.checkpoints);
    server.add(shareflow::prometheus::job_source(&job));
    shareflow::dashboard::Dashboard::new(&job).with_embedded_broker(broker, &topics).serve(server);
    let stopped = Arc::new(AtomicBool::new(false));
    let on_signal = tokio::spawn({
        let (stop, stopped) = (job.stop_handle(), stopped.clone());
        async move {
            signal.await;
            stopped.store(true, Ordering::SeqCst);
            stop.stop();
        }
    });
    let progress = {
        let metrics = metrics.clone();
        move || -> crate::running::ProgressLine {
            let done = metrics.records_emitted.load(Ordering::Relaxed);
            let line = format!("progress: {done} records emitted");
            Box::pin(async move { Some(crate::progress::ProgressState { done, total: None, lag: None, line }) })
        }
    };
    let result = run_job(&job, Some(progress)).await;
    on_signal.abort();
    on_usr1.abort();
    let (report, seconds) = result?;
    Ok(EmbeddedRunSummary {
        broker: String::new(),
        emitted: metrics.records_emitted.load(Ordering::Relaxed),
        attempts: report.attempts,
        checkpoints_completed: report.metrics.checkpoints.completed,
        transactions_recovered: report.metrics.checkpoints.transactions_recovered,
        stopped_by_signal: stopped.load(Ordering::SeqCst),
        seconds,
    })
}

/// The file's sink at the end of `stream`, and its dead letters: a participant for
/// each sink that needs one.
async fn add_sink(
    file: &JobFile,
    broker: &EmbeddedBroker,
    txns: &Option<Arc<BrokerTransactions>>,
    stream: shareflow_runtime::Stream,
    job: &shareflow_runtime::JobBuilder,
) -> Result<(), BoxError> {
    match &file.sink {
        SinkSpec::Topic { topic } => {
            ensure_topic(broker, topic, file.partitions).await?;
            stream
                .sink("topic-sink", TopicSink::factory(broker.clone(), txns.clone(), topic))
                .parallelism(file.parallelism);
        }
        SinkSpec::Files { url } => {
            let (store, root) = shareflow_checkpoint::open_url(url, &[])?;
            let files = FileCommitter::new(store, root.as_ref());
            stream.sink("file-sink", FileSink::factory(files.clone())).parallelism(file.parallelism);
            job.participant(files);
        }
        #[cfg(feature = "tables")]
        SinkSpec::Table(settings) => {
            use shareflow_connector::table::{TableCommitter, TableSink};
            let committer = TableCommitter::new(settings.clone())?;
            stream.sink("table-sink", TableSink::factory(committer.clone())).parallelism(file.parallelism);
            job.participant(committer);
        }
        #[cfg(feature = "postgres")]
        SinkSpec::Postgres(settings) => {
            use shareflow_connector::postgres::{PostgresCommitter, PostgresSink};
            stream.sink("postgres-sink", PostgresSink::factory(settings.clone())).parallelism(file.parallelism);
            job.participant(PostgresCommitter::new(settings.clone()));
        }
        SinkSpec::Print => {
            stream.sink("print", PrintSink::factory(&format!("{}:", file.group))).parallelism(file.parallelism);
        }
    }
    if let Some(d) = &file.dead_letters {
        ensure_topic(broker, &d.topic, 1).await?;
        // What the group archives at its delivery limit goes there too (decision 0041).
        let target = DeadLetterTarget { topic: d.topic.clone(), copy_record: d.copy_record };
        let archived = broker.dead_letter_archived(&file.group, target).await?;
        if archived > 0 {
            eprintln!("dead-lettered {archived} records the group had archived at its delivery limit");
        }
        job.dead_letters(shareflow_connector::embedded::BrokerDeadLetters::new(
            broker.clone(),
            txns.clone(),
            d.clone(),
        ));
    }
    Ok(())
}

/// `produce --dir DIR --topic T [--partitions N]`: each line of `input` becomes one
/// record (its value; no key) of topic `topic`, created with `partitions` if missing,
/// spread over its partitions in turn. Returns how many records went in.
pub(crate) async fn produce(dir: &Path, topic: &str, partitions: u32, input: impl BufRead) -> Result<u64, BoxError> {
    const BATCH: usize = 10_000;
    if let Some(addr) = crate::live::live_endpoint(dir).await {
        return crate::live::produce_through(&addr, topic, partitions, input).await;
    }
    let broker = open_broker(dir, ShareConfig::default()).await?;
    let result = async {
        let partitions = ensure_topic(&broker, topic, partitions).await?;
        let mut n = 0u64;
        let mut batch = Vec::with_capacity(BATCH);
        for line in input.lines() {
            let line = line.map_err(|e| format!("reading the records from standard input: {e}"))?;
            let partition = (n % u64::from(partitions)) as i32;
            batch.push(ProducerRecord::new(topic, partition, line.into_bytes()));
            n += 1;
            if batch.len() == BATCH {
                broker.produce(std::mem::take(&mut batch)).await?;
            }
        }
        if !batch.is_empty() {
            broker.produce(batch).await?;
        }
        Ok::<u64, BoxError>(n)
    }
    .await;
    broker.close();
    result
}

/// The options of `produce`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProduceOptions {
    pub(crate) dir: PathBuf,
    pub(crate) topic: String,
    pub(crate) partitions: u32,
}
