//! Broker metrics with the names of seed 000, readable as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub use shareflow_runtime::{Histogram, Metric, MetricValue};

use super::state::Events;

/// `share-transaction-active`: ONGOING plus PREPARE transactions (gauge).
pub const TRANSACTION_ACTIVE: &str = "share-transaction-active";
/// `share-transaction-prepare-time-ms`: prepare latency (histogram).
pub const TRANSACTION_PREPARE_TIME_MS: &str = "share-transaction-prepare-time-ms";
/// `share-transaction-commit-time-ms`: commit latency (histogram).
pub const TRANSACTION_COMMIT_TIME_MS: &str = "share-transaction-commit-time-ms";
/// `share-transaction-abort-total`: aborted transactions, timeouts included (counter).
pub const TRANSACTION_ABORT_TOTAL: &str = "share-transaction-abort-total";
/// `share-transaction-timeout-total`: transactions aborted by their timeout (counter).
pub const TRANSACTION_TIMEOUT_TOTAL: &str = "share-transaction-timeout-total";

/// A point-in-time copy of every broker metric.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// `share-transaction-active`
    pub transaction_active: u64,
    /// Of the active ones, those in PREPARE: they wait for the coordinator, forever if need be.
    pub transaction_prepared: u64,
    /// `share-transaction-prepare-time-ms`
    pub transaction_prepare_time: Histogram,
    /// `share-transaction-commit-time-ms`
    pub transaction_commit_time: Histogram,
    /// `share-transaction-abort-total`
    pub transaction_abort_total: u64,
    /// `share-transaction-timeout-total`
    pub transaction_timeout_total: u64,
    /// Transactions committed.
    pub transaction_commit_total: u64,
    /// Records acquired (deliveries).
    pub records_acquired: u64,
    /// Acquisitions that were redeliveries.
    pub records_redelivered: u64,
    /// Records ACKNOWLEDGED.
    pub records_acknowledged: u64,
    /// Records archived because they were rejected.
    pub records_archived_rejected: u64,
    /// Records archived at the delivery limit.
    pub records_archived_delivery_limit: u64,
    /// Records archived because their producer transaction aborted.
    pub records_archived_aborted_transaction: u64,
}

impl MetricsSnapshot {
    /// Every metric as `(name, value)`, from [`metrics`](Self::metrics); histograms as
    /// `{name}-count`, `-avg`, `-p99` and `-max`.
    pub fn iter(&self) -> Vec<(String, f64)> {
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
}

impl MetricsSnapshot {
    /// Every metric by name, typed: seed 000's five first (`share-transaction-active`,
    /// `share-transaction-prepare-time-ms`, `share-transaction-commit-time-ms`,
    /// `share-transaction-abort-total`, `share-transaction-timeout-total`), then ours.
    /// This is the interface an exporter reads.
    pub fn metrics(&self) -> Vec<Metric> {
        use MetricValue::*;
        let m = Metric::new;
        vec![
            m(TRANSACTION_ACTIVE, "ONGOING plus PREPARE transactions", Gauge(self.transaction_active)),
            m(
                TRANSACTION_PREPARE_TIME_MS,
                "prepare latency, ms",
                Histogram(Box::new(self.transaction_prepare_time.clone())),
            ),
            m(
                TRANSACTION_COMMIT_TIME_MS,
                "commit latency, ms",
                Histogram(Box::new(self.transaction_commit_time.clone())),
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

/// Live counters; the gauges are read from the state when a snapshot is taken.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    abort_total: AtomicU64,
    timeout_total: AtomicU64,
    commit_total: AtomicU64,
    acquired: AtomicU64,
    redelivered: AtomicU64,
    acknowledged: AtomicU64,
    archived_rejected: AtomicU64,
    archived_delivery_limit: AtomicU64,
    archived_aborted_txn: AtomicU64,
    prepare_time: Mutex<Histogram>,
    commit_time: Mutex<Histogram>,
}

impl Metrics {
    pub(crate) fn record(&self, e: &Events) {
        let add = |c: &AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.abort_total, e.txn_aborted);
        add(&self.timeout_total, e.txn_timed_out);
        add(&self.commit_total, e.txn_committed);
        add(&self.acquired, e.records.acquired);
        add(&self.redelivered, e.records.redelivered);
        add(&self.acknowledged, e.records.acknowledged);
        add(&self.archived_rejected, e.records.archived_rejected);
        add(&self.archived_delivery_limit, e.records.archived_delivery_limit);
        add(&self.archived_aborted_txn, e.records.archived_aborted_txn);
    }

    pub(crate) fn prepare_time(&self, d: Duration) {
        if let Ok(mut h) = self.prepare_time.lock() {
            h.record(d);
        }
    }

    pub(crate) fn commit_time(&self, d: Duration) {
        if let Ok(mut h) = self.commit_time.lock() {
            h.record(d);
        }
    }

    pub(crate) fn snapshot(&self, active: u64, prepared: u64) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            transaction_active: active,
            transaction_prepared: prepared,
            transaction_prepare_time: self.prepare_time.lock().map(|h| h.clone()).unwrap_or_default(),
            transaction_commit_time: self.commit_time.lock().map(|h| h.clone()).unwrap_or_default(),
            transaction_abort_total: get(&self.abort_total),
            transaction_timeout_total: get(&self.timeout_total),
            transaction_commit_total: get(&self.commit_total),
            records_acquired: get(&self.acquired),
            records_redelivered: get(&self.redelivered),
            records_acknowledged: get(&self.acknowledged),
            records_archived_rejected: get(&self.archived_rejected),
            records_archived_delivery_limit: get(&self.archived_delivery_limit),
            records_archived_aborted_transaction: get(&self.archived_aborted_txn),
        }
    }
}
