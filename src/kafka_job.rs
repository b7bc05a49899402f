//! The main job on Kafka, which `demo --kafka` and `run --kafka` (without a job file)
//! both run: its topics, its source settings, its pipeline (share source -> SQL ->
//! transactional Kafka sink), its progress line and its metrics.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use shareflow_connector::kafka::{
    KafkaCluster, KafkaShareSource, KafkaSink, KafkaTransactions, WHOLE_FETCH_POLL_RECORDS,
};
use shareflow_connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow_runtime::JobBuilder;

use crate::demo::TRANSFORM_SQL;
use crate::running::ProgressLine;

/// Serves a Kafka job's metrics, its source's, and KIP-1289's five as the job sees them
/// ([`shareflow_connector::kafka::seed_transaction_metrics`]), and its dashboard, with
/// the share partitions of its input `topics` on `cluster`.
pub(crate) fn serve_job_metrics(
    server: &shareflow::prometheus::MetricsServer,
    job: &shareflow_runtime::Job,
    source: &Arc<SourceMetrics>,
    cluster: &KafkaCluster,
    topics: &[&str],
) {
    server.add(shareflow::prometheus::job_source(job));
    shareflow::dashboard::Dashboard::new(job).with_kafka(cluster, topics).serve(server);
    let handle = job.metrics_handle();
    server.add(shareflow::prometheus::source(move || {
        shareflow_connector::kafka::seed_transaction_metrics(&handle.snapshot())
    }));
    let source = source.clone();
    server.add(shareflow::prometheus::source(move || source.metrics()));
}

/// The input topic of a run.
pub(crate) fn input_topic(name: &str) -> String {
    format!("{name}-input")
}

/// The output topic of a run.
pub(crate) fn output_topic(name: &str) -> String {
    format!("{name}-output")
}

/// The source settings of every job shareflow's binary runs on Kafka (the demo, `run`
/// with or without a job file): group `group`, `topics`, at most `max_rate` records per
/// second over `parallelism` subtasks, and polls that take a whole share fetch
/// (decision 0026): a poll smaller than the fetch makes the client send the rest's
/// acknowledgements in requests of their own, which cost the broker about half again.
pub(crate) fn source_settings(group: &str, topics: &[&str], parallelism: u32, max_rate: Option<u64>) -> SourceSettings {
    let mut source = SourceSettings::new(group, topics);
    source.max_poll_records = WHOLE_FETCH_POLL_RECORDS;
    source.max_records_per_second = max_rate.map(|r| (r / u64::from(parallelism)).max(1));
    if let Some(rate) = source.max_records_per_second {
        source.max_poll_records = source.max_poll_records.min(rate.max(10) as usize / 10);
    }
    source
}

/// The main job on Kafka: share source -> SQL -> transactional Kafka sink into `output`,
/// every operator at `parallelism`, `txns` its participant.
pub(crate) fn pipeline(
    cluster: &KafkaCluster,
    txns: &Arc<KafkaTransactions>,
    source: SourceSettings,
    output: &str,
    parallelism: u32,
    metrics: &Arc<SourceMetrics>,
) -> JobBuilder {
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        KafkaShareSource::factory(cluster.clone(), txns.clone(), source, metrics.clone()),
    )
    .parallelism(parallelism)
    .sql("transform", TRANSFORM_SQL)
    .parallelism(parallelism)
    .sink("kafka-sink", KafkaSink::factory(txns.clone(), output))
    .parallelism(parallelism);
    job.participant(txns.clone());
    job
}

/// The progress line of a Kafka run, from its source metrics.
pub(crate) fn progress_line(metrics: &Arc<SourceMetrics>) -> impl Fn() -> ProgressLine + Send + 'static {
    let metrics = metrics.clone();
    move || -> ProgressLine {
        let done = metrics.records_emitted.load(Ordering::Relaxed);
        let line = format!(
            "progress: {done} records emitted ({} replayed, {} redeliveries skipped)",
            metrics.records_replayed.load(Ordering::Relaxed),
            metrics.records_skipped.load(Ordering::Relaxed)
        );
        Box::pin(async move { Some(crate::progress::ProgressState { done, total: None, lag: None, line }) })
    }
}
