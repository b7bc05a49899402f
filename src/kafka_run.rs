//! `shareflow run --kafka`: one instance of the main job in a share group on a real
//! Kafka 4.x broker (decision 0008). Start as many as you like with the same group and
//! checkpoint root and different `--instance` names: Kafka spreads the records, the
//! instances keep the output exactly-once between them, and a live one adopts a dead
//! one. SIGTERM or Ctrl-C stops an instance gracefully: a final checkpoint, commit,
//! and a retirement record, so nobody adopts it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shareflow_checkpoint::CheckpointStore;
use shareflow_connector::kafka::{KafkaCluster, KafkaTransactions, KafkaTransactionsConfig};
use shareflow_connector::SourceMetrics;
use shareflow_runtime::{InstanceConfig, JobConfig, RestartStrategy};

use crate::kafka_job::{input_topic, output_topic, pipeline, progress_line, serve_job_metrics, source_settings};
use crate::running::{run_job, stop_signal};

/// Settings of one instance.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    /// `host:port` of the broker.
    pub(crate) bootstrap: String,
    /// The share group; the topics are `{group}-input` and `{group}-output` unless set.
    pub(crate) group: String,
    /// This instance's name: its transaction prefix and job id.
    pub(crate) instance: String,
    /// The checkpoint root every instance of the group shares.
    pub(crate) checkpoints: String,
    /// The input topic.
    pub(crate) input: Option<String>,
    /// The output topic.
    pub(crate) output: Option<String>,
    /// Checkpoint interval.
    pub(crate) interval: Duration,
    /// Checkpoint timeout.
    pub(crate) checkpoint_timeout: Duration,
    /// How long an instance may stay silent before a live one adopts it.
    pub(crate) adoption_timeout: Duration,
    /// Subtasks per operator.
    pub(crate) parallelism: u32,
    /// At most this many records per second through this instance.
    pub(crate) max_rate: Option<u64>,
    /// Partitions of the topics, if this instance creates them.
    pub(crate) partitions: u32,
    /// Serve Prometheus metrics on this `HOST:PORT`.
    pub(crate) metrics_addr: Option<String>,
    /// `--from-savepoint`: the savepoint to start from.
    pub(crate) savepoint: Option<String>,
    /// The user's pipeline from a job file, instead of the main job.
    pub(crate) job: Option<crate::job_file::JobFile>,
    /// `--delete-ledger-on-retire`: after a graceful stop retired the instance, delete
    /// its ledger topic (what `shareflow instances gc` would delete later).
    pub(crate) delete_ledger_on_retire: bool,
}

impl RunOptions {
    /// Defaults for everything but the required four.
    pub(crate) fn new(bootstrap: &str, group: &str, instance: &str, checkpoints: &str) -> Self {
        Self {
            bootstrap: bootstrap.into(),
            group: group.into(),
            instance: instance.into(),
            checkpoints: checkpoints.into(),
            input: None,
            output: None,
            interval: Duration::from_secs(1),
            checkpoint_timeout: Duration::from_secs(10),
            adoption_timeout: Duration::from_secs(30),
            parallelism: 2,
            max_rate: None,
            partitions: 4,
            metrics_addr: None,
            savepoint: None,
            job: None,
            delete_ledger_on_retire: false,
        }
    }
}

/// What an instance did before it stopped.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct RunSummary {
    pub(crate) instance: String,
    pub(crate) emitted: u64,
    pub(crate) replayed: u64,
    pub(crate) skipped: u64,
    pub(crate) attempts: u32,
    pub(crate) checkpoints_completed: u64,
    pub(crate) adoptions: u64,
    pub(crate) transactions_recovered: u64,
    #[serde(rename = "stopped")]
    pub(crate) stopped_by_signal: bool,
    pub(crate) seconds: f64,
}

impl RunSummary {
    /// One JSON object: the summary, serialized.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(crate) fn to_text(&self) -> String {
        format!(
            "instance {}: {} records emitted ({} replayed, {} redeliveries skipped), {} checkpoints, {} adoptions, \
             {} attempts, {:.1} s{}",
            self.instance,
            self.emitted,
            self.replayed,
            self.skipped,
            self.checkpoints_completed,
            self.adoptions,
            self.attempts,
            self.seconds,
            if self.stopped_by_signal { "; stopped by a signal and retired" } else { "" }
        )
    }
}

/// Runs one instance until SIGTERM or Ctrl-C, or until another process takes its
/// prefix over (an error of kind Fenced).
pub(crate) async fn run(options: &RunOptions) -> Result<RunSummary, Box<dyn std::error::Error + Send + Sync>> {
    // From here on a SIGTERM stops the run gracefully, also while it starts.
    let signal = stop_signal();
    // The checkpoint root opens, and the endpoint binds, before the broker is touched.
    let storage = CheckpointStore::from_url(&options.checkpoints, &[], &options.instance)?;
    let endpoint = crate::running::metrics_endpoint(options.metrics_addr.as_deref()).await?;
    let cluster = KafkaCluster::connect(&options.bootstrap).await?;
    let exactly_once = options.job.as_ref().is_none_or(|j| j.exactly_once);
    let restarts = options.job.as_ref().map_or(crate::job_file::DEFAULT_RESTARTS.into(), |j| j.restarts);
    let txns = KafkaTransactions::new(cluster.clone(), KafkaTransactionsConfig::default().exactly_once(exactly_once));
    let mut config = JobConfig::new(storage, &options.group, &options.instance)
        .checkpoint_interval(options.interval)
        .checkpoint_timeout(options.checkpoint_timeout)
        .restart(RestartStrategy::FixedDelay { attempts: restarts, delay: Duration::from_millis(500) })
        .instance(InstanceConfig::new(options.adoption_timeout));
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = 2;
    if let Some(url) = &options.savepoint {
        config = config.from_savepoint(url.clone());
    }

    let metrics = Arc::new(SourceMetrics::default());
    let topics: Vec<String> = match &options.job {
        Some(file) => file.topics.clone(),
        None => vec![options.input.clone().unwrap_or_else(|| input_topic(&options.group))],
    };
    let job = match &options.job {
        Some(file) => file_pipeline(file, &cluster, &txns, &metrics, options.parallelism).await?,
        None => {
            let input = topics[0].clone();
            let output = options.output.clone().unwrap_or_else(|| output_topic(&options.group));
            cluster.ensure_topic(&input, options.partitions as i32, &[]).await?;
            cluster.ensure_topic(&output, options.partitions as i32, &[]).await?;
            let mut source = source_settings(&options.group, &[&input], options.parallelism, options.max_rate);
            source.from_earliest = true;
            pipeline(&cluster, &txns, source, &output, options.parallelism, &metrics)
        }
    };
    let job = job.build(config)?;
    if let Some(server) = &endpoint {
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        serve_job_metrics(server, &job, &metrics, &cluster, &topics);
        shareflow::control::serve(server, &job, &options.checkpoints);
    }
    let on_usr1 = shareflow::control::savepoint_on_signal(&job, &options.checkpoints);

    let stopped = Arc::new(AtomicBool::new(false));
    let on_signal = tokio::spawn({
        let (stop, stopped) = (job.stop_handle(), stopped.clone());
        async move {
            signal.await;
            stopped.store(true, Ordering::SeqCst);
            stop.stop();
        }
    });
    let result = run_job(&job, Some(progress_line(&metrics))).await;
    on_signal.abort();
    on_usr1.abort();
    let (report, seconds) = result?;
    if options.delete_ledger_on_retire && stopped.load(Ordering::SeqCst) {
        // Retired: it committed everything and keeps nothing pending; nobody reads its
        // ledger again (see plan_ledger_gc).
        let topic = shareflow_connector::kafka::ledger_topic(&options.group, &options.instance);
        cluster.delete_topics(&[&topic]).await?;
        eprintln!("retired; deleted the ledger topic {topic}");
    }
    Ok(RunSummary {
        instance: options.instance.clone(),
        emitted: metrics.records_emitted.load(Ordering::Relaxed),
        replayed: metrics.records_replayed.load(Ordering::Relaxed),
        skipped: metrics.records_skipped.load(Ordering::Relaxed),
        attempts: report.attempts,
        checkpoints_completed: report.metrics.checkpoints.completed,
        adoptions: report.metrics.checkpoints.instances_adopted,
        transactions_recovered: report.metrics.checkpoints.transactions_recovered,
        stopped_by_signal: stopped.load(Ordering::SeqCst),
        seconds,
    })
}

/// The source settings of a job file: the same as every job of the binary on Kafka
/// (whole-fetch polls), with the file's group, topics, start and rate.
fn file_source_settings(file: &crate::job_file::JobFile, parallelism: u32) -> shareflow_connector::SourceSettings {
    let topics: Vec<&str> = file.topics.iter().map(String::as_str).collect();
    let mut source = source_settings(&file.group, &topics, parallelism, file.max_rate);
    source.from_earliest = file.from_earliest;
    // An exactly-once job never reads what a transaction may still take back.
    source.read_committed = file.exactly_once;
    source.stop_when_drained = file.stop_when_drained;
    source
}

/// The pipeline of a job file: share source, its transforms in order, its sink. The
/// topics it names are created if missing, with the file's partitions.
async fn file_pipeline(
    file: &crate::job_file::JobFile,
    cluster: &KafkaCluster,
    txns: &Arc<KafkaTransactions>,
    metrics: &Arc<SourceMetrics>,
    parallelism: u32,
) -> Result<shareflow_runtime::JobBuilder, Box<dyn std::error::Error + Send + Sync>> {
    use crate::job_file::SinkSpec;
    use shareflow_connector::kafka::{KafkaShareSource, KafkaSink};
    use shareflow_connector::{record_schema, FileCommitter, FileSink, PrintSink};
    for topic in &file.topics {
        cluster.ensure_topic(topic, file.partitions as i32, &[]).await?;
    }
    let source = file_source_settings(file, parallelism);
    let job = shareflow_runtime::JobBuilder::new();
    let mut stream = job
        .source(
            "share-source",
            record_schema(),
            KafkaShareSource::factory(cluster.clone(), txns.clone(), source, metrics.clone()),
        )
        .parallelism(parallelism);
    for (name, sql, options) in &file.transforms {
        stream = stream.sql_with(name, sql, *options).parallelism(parallelism);
    }
    match &file.sink {
        SinkSpec::Topic { topic } => {
            cluster.ensure_topic(topic, file.partitions as i32, &[]).await?;
            stream.sink("kafka-sink", KafkaSink::factory(txns.clone(), topic)).parallelism(parallelism);
        }
        SinkSpec::Files { url } => {
            let (store, root) = shareflow_checkpoint::open_url(url, &[])?;
            let files = FileCommitter::new(store, root.as_ref());
            stream.sink("file-sink", FileSink::factory(files.clone())).parallelism(parallelism);
            job.participant(files);
        }
        #[cfg(feature = "tables")]
        SinkSpec::Table(settings) => {
            use shareflow_connector::table::{TableCommitter, TableSink};
            let committer = TableCommitter::new(settings.clone())?;
            stream.sink("table-sink", TableSink::factory(committer.clone())).parallelism(parallelism);
            job.participant(committer);
        }
        #[cfg(feature = "postgres")]
        SinkSpec::Postgres(settings) => {
            use shareflow_connector::postgres::{PostgresCommitter, PostgresSink};
            stream.sink("postgres-sink", PostgresSink::factory(settings.clone())).parallelism(parallelism);
            job.participant(PostgresCommitter::new(settings.clone()));
        }
        SinkSpec::Print => {
            stream.sink("print", PrintSink::factory(&format!("{}:", file.group))).parallelism(parallelism);
        }
    }
    if let Some(d) = &file.dead_letters {
        cluster.ensure_topic(&d.topic, 1, &[]).await?;
        job.dead_letters(shareflow_connector::kafka::KafkaDeadLetters::new(txns.clone(), d.clone()));
    }
    job.participant(txns.clone());
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shareflow_connector::kafka::WHOLE_FETCH_POLL_RECORDS;

    fn file(extra_source: &str) -> crate::job_file::JobFile {
        let text = format!(
            "kafka = \"127.0.0.1:1\"\ncheckpoints = \"file:///tmp/x\"\n[source]\ngroup = \"g\"\ntopics = [\"a\", \"b\"]\n\
             {extra_source}\n[sink]\nkind = \"print\"\n"
        );
        crate::job_file::JobFile::parse("job.toml", &text).expect("a valid job file")
    }

    /// A job file's polls take a whole share fetch, as the demo's and `run`'s do: with
    /// the library's default of 500 the client acknowledges the polls it serves from its
    /// buffer in requests of their own, and the job ran at half the rate.
    #[test]
    fn a_job_files_source_polls_whole_fetches() {
        let s = file_source_settings(&file(""), 2);
        assert_eq!(s.max_poll_records, WHOLE_FETCH_POLL_RECORDS);
        assert_eq!(s.group, "g");
        assert_eq!(s.topics, vec!["a".to_string(), "b".to_string()]);
        assert!(s.from_earliest, "a job file reads from the earliest record unless it says otherwise");
        assert_eq!(s.max_records_per_second, None);
    }

    #[test]
    fn a_job_files_rate_is_split_over_its_subtasks_and_caps_the_poll() {
        let s = file_source_settings(&file("max_rate = 1000\nfrom = \"latest\""), 2);
        assert_eq!(s.max_records_per_second, Some(500));
        assert_eq!(s.max_poll_records, 50, "a poll is at most a tenth of a second of the subtask's rate");
        assert!(!s.from_earliest);
    }
}
