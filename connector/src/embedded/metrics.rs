//! The embedded broker's metrics as the runtime's typed [`Metric`] list, which the
//! Prometheus endpoint and the job's own metrics use.

use shareflow_broker::{
    Latency, MetricsSnapshot, TRANSACTION_ABORT_TOTAL, TRANSACTION_ACTIVE, TRANSACTION_COMMIT_TIME_MS,
    TRANSACTION_PREPARE_TIME_MS, TRANSACTION_TIMEOUT_TOTAL,
};
use shareflow_runtime::{Histogram, Metric, MetricValue};

/// A broker [`MetricsSnapshot`] read as the runtime's metrics.
pub trait BrokerMetrics {
    /// Every metric as `(name, value)`, from [`metrics`](Self::metrics); histograms as
    /// `{name}-count`, `-avg`, `-p99` and `-max`.
    fn iter(&self) -> Vec<(String, f64)>;

    /// Every metric by name, typed: KIP-1289's five first (`share-transaction-active`,
    /// `share-transaction-prepare-time-ms`, `share-transaction-commit-time-ms`,
    /// `share-transaction-abort-total`, `share-transaction-timeout-total`), then ours.
    /// This is the interface an exporter reads.
    fn metrics(&self) -> Vec<Metric>;
}

/// The runtime's histogram with the broker's latency buckets (the same layout).
fn histogram(latency: &Latency) -> Histogram {
    let mut h = Histogram::default();
    h.count = latency.count;
    h.sum_ms = latency.sum_ms;
    h.max_ms = latency.max_ms;
    h.buckets = latency.buckets;
    h
}

impl BrokerMetrics for MetricsSnapshot {
    fn iter(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for metric in self.metrics() {
            match metric.value {
                MetricValue::Counter(v) | MetricValue::Gauge(v) => out.push((metric.name.to_string(), v as f64)),
                MetricValue::Histogram(h) => {
                    out.push((format!("{}-count", metric.name), h.count as f64));
                    out.push((format!("{}-avg", metric.name), h.mean_ms()));
                    out.push((format!("{}-p99", metric.name), h.quantile_ms(0.99)));
                    out.push((format!("{}-max", metric.name), h.max_ms));
                }
            }
        }
        out
    }

    fn metrics(&self) -> Vec<Metric> {
        use MetricValue::*;
        let m = Metric::new;
        vec![
            m(TRANSACTION_ACTIVE, "ONGOING plus PREPARE transactions", Gauge(self.transaction_active)),
            m(
                TRANSACTION_PREPARE_TIME_MS,
                "prepare latency, ms",
                Histogram(Box::new(histogram(&self.transaction_prepare_time))),
            ),
            m(
                TRANSACTION_COMMIT_TIME_MS,
                "commit latency, ms",
                Histogram(Box::new(histogram(&self.transaction_commit_time))),
            ),
            m(
                TRANSACTION_ABORT_TOTAL,
                "aborted transactions, timeouts included",
                Counter(self.transaction_abort_total),
            ),
            m(
                TRANSACTION_TIMEOUT_TOTAL,
                "transactions aborted by their timeout",
                Counter(self.transaction_timeout_total),
            ),
            m(
                "share-transaction-prepared",
                "PREPARE transactions waiting for their coordinator",
                Gauge(self.transaction_prepared),
            ),
            m("share-transaction-commit-total", "committed transactions", Counter(self.transaction_commit_total)),
            m("share-records-acquired-total", "deliveries", Counter(self.records_acquired)),
            m(
                "share-records-redelivered-total",
                "deliveries that were redeliveries",
                Counter(self.records_redelivered),
            ),
            m("share-records-acknowledged-total", "records ACKNOWLEDGED", Counter(self.records_acknowledged)),
            m(
                "share-records-archived-rejected-total",
                "records archived as rejected",
                Counter(self.records_archived_rejected),
            ),
            m(
                "share-records-archived-delivery-limit-total",
                "records archived at the delivery limit",
                Counter(self.records_archived_delivery_limit),
            ),
            m(
                "share-records-archived-aborted-transaction-total",
                "records archived because their producer transaction aborted",
                Counter(self.records_archived_aborted_transaction),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_latency_buckets_are_the_runtime_histogram_buckets() {
        let (mut runtime, mut latency) = (Histogram::default(), Latency::default());
        for ms in [0.0, 0.5, 1.0, 1.5, 3.0, 700.0, 4_194_304.0, 1e12] {
            let d = std::time::Duration::from_secs_f64(ms / 1e3);
            runtime.record(d);
            latency.record(d);
        }
        assert_eq!(histogram(&latency), runtime);
        assert_eq!(histogram(&latency).quantile_ms(0.5), runtime.quantile_ms(0.5));
    }
}
