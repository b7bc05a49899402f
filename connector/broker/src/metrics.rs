//! Broker metrics, readable as a snapshot. The connector maps a snapshot to the
//! runtime's metric types (`shareflow_connector::broker::BrokerMetrics`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub use shareflow_share::metric_names::{
    TRANSACTION_ABORT_TOTAL, TRANSACTION_ACTIVE, TRANSACTION_COMMIT_TIME_MS, TRANSACTION_PREPARE_TIME_MS,
    TRANSACTION_TIMEOUT_TOTAL,
};

use super::state::Events;

/// Latencies in milliseconds, in power-of-two buckets: `buckets[i]` counts samples of at
/// most `2^i` ms (the last bucket takes the rest), the layout of the runtime's histogram.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Latency {
    /// Samples recorded.
    pub count: u64,
    /// Sum of samples, ms.
    pub sum_ms: f64,
    /// Largest sample, ms.
    pub max_ms: f64,
    /// Samples per bucket.
    pub buckets: [u64; 24],
}

impl Latency {
    /// Adds one sample.
    pub fn record(&mut self, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        self.count += 1;
        self.sum_ms += ms;
        self.max_ms = self.max_ms.max(ms);
        let last = self.buckets.len() - 1;
        let i = (0..last).find(|&i| ms <= (1u64 << i) as f64).unwrap_or(last);
        self.buckets[i] += 1;
    }
}

/// A point-in-time copy of every broker metric.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// `share-transaction-active`
    pub transaction_active: u64,
    /// Of the active ones, those in PREPARE: they wait for the coordinator, forever if need be.
    pub transaction_prepared: u64,
    /// `share-transaction-prepare-time-ms`
    pub transaction_prepare_time: Latency,
    /// `share-transaction-commit-time-ms`
    pub transaction_commit_time: Latency,
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
    prepare_time: Mutex<Latency>,
    commit_time: Mutex<Latency>,
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
