//! KIP-1289's transaction metrics on stock Kafka, from the job's own view.

/// KIP-1289's five transaction metrics as a job on stock Kafka sees them. Kafka has no
/// share transactions to count, so the coordinator's view stands in: active is the job's
/// open transactions, prepare and commit time are a checkpoint's phases one and two
/// over every participant, and timeouts are the prepares refused because the
/// transaction had already aborted.
pub fn seed_transaction_metrics(job: &shareflow_runtime::JobMetricsSnapshot) -> Vec<shareflow_runtime::Metric> {
    use shareflow_runtime::{Metric, MetricValue};
    use shareflow_share::metric_names::{
        TRANSACTION_ABORT_TOTAL, TRANSACTION_ACTIVE, TRANSACTION_COMMIT_TIME_MS, TRANSACTION_PREPARE_TIME_MS,
        TRANSACTION_TIMEOUT_TOTAL,
    };
    let c = &job.checkpoints;
    vec![
        Metric::new(
            TRANSACTION_ACTIVE,
            "transactions the job has begun and not decided",
            MetricValue::Gauge(c.transactions_open),
        ),
        Metric::new(
            TRANSACTION_PREPARE_TIME_MS,
            "prepare latency of a checkpoint, every participant, ms",
            MetricValue::Histogram(Box::new(c.prepare.clone())),
        ),
        Metric::new(
            TRANSACTION_COMMIT_TIME_MS,
            "commit latency of a checkpoint, every participant, ms",
            MetricValue::Histogram(Box::new(c.commit.clone())),
        ),
        Metric::new(
            TRANSACTION_ABORT_TOTAL,
            "aborted transactions, timeouts included",
            MetricValue::Counter(c.transactions_aborted),
        ),
        Metric::new(
            TRANSACTION_TIMEOUT_TOTAL,
            "transactions found aborted by their timeout at prepare",
            MetricValue::Counter(c.transactions_timed_out),
        ),
    ]
}
