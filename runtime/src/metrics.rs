//! Job metrics: checkpoints, and rows and backpressure per operator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counters of one operator, summed over its subtasks.
#[derive(Debug, Default)]
pub(crate) struct OperatorMetrics {
    rows_in: AtomicU64,
    rows_out: AtomicU64,
    backpressure_ns: AtomicU64,
}

impl OperatorMetrics {
    pub(crate) fn add_rows_in(&self, n: u64) {
        self.rows_in.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_rows_out(&self, n: u64) {
        self.rows_out.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_backpressure(&self, d: Duration) {
        self.backpressure_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// A copy of one operator's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OperatorMetricsSnapshot {
    /// Rows received (for a source: produced).
    pub rows_in: u64,
    /// Rows emitted.
    pub rows_out: u64,
    /// Time spent waiting for downstream channel space.
    pub backpressure: Duration,
}

/// Job-wide metrics, shared by the coordinator and every task. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct JobMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    operators: Mutex<BTreeMap<String, Arc<OperatorMetrics>>>,
    checkpoints: Mutex<CheckpointMetrics>,
    restarts: AtomicU64,
}

/// Checkpoint counters and durations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointMetrics {
    /// Checkpoints completed.
    pub completed: u64,
    /// Checkpoints aborted (timeout, failure).
    pub aborted: u64,
    /// Duration of the last completed checkpoint, trigger to commit.
    pub last_duration: Duration,
    /// Longest completed checkpoint.
    pub max_duration: Duration,
    /// Sum of completed durations.
    pub total_duration: Duration,
    /// State bytes of the last completed checkpoint.
    pub last_size_bytes: u64,
    /// Id of the last completed checkpoint.
    pub last_completed_id: Option<u64>,
    /// Transactions committed.
    pub transactions_committed: u64,
    /// Transactions aborted (recovery, refused prepare).
    pub transactions_aborted: u64,
    /// Transactions committed by recovery (found PREPARE with a manifest).
    pub transactions_recovered: u64,
    /// Silent instances of the group this job adopted (decision 0007).
    pub instances_adopted: u64,
}

/// A copy of every job metric.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobMetricsSnapshot {
    /// Per operator.
    pub operators: BTreeMap<String, OperatorMetricsSnapshot>,
    /// Checkpoints.
    pub checkpoints: CheckpointMetrics,
    /// Restarts after failures.
    pub restarts: u64,
}

impl JobMetrics {
    /// The counters of `operator`, created on first use.
    pub(crate) fn operator(&self, operator: &str) -> Arc<OperatorMetrics> {
        let mut ops = self.inner.operators.lock().unwrap_or_else(|p| p.into_inner());
        ops.entry(operator.to_string()).or_default().clone()
    }

    pub(crate) fn checkpoints(&self, f: impl FnOnce(&mut CheckpointMetrics)) {
        f(&mut self.inner.checkpoints.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub(crate) fn restarted(&self) {
        self.inner.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of everything.
    pub fn snapshot(&self) -> JobMetricsSnapshot {
        let ops = self.inner.operators.lock().unwrap_or_else(|p| p.into_inner());
        JobMetricsSnapshot {
            operators: ops
                .iter()
                .map(|(name, m)| {
                    (
                        name.clone(),
                        OperatorMetricsSnapshot {
                            rows_in: m.rows_in.load(Ordering::Relaxed),
                            rows_out: m.rows_out.load(Ordering::Relaxed),
                            backpressure: Duration::from_nanos(m.backpressure_ns.load(Ordering::Relaxed)),
                        },
                    )
                })
                .collect(),
            checkpoints: self.inner.checkpoints.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            restarts: self.inner.restarts.load(Ordering::Relaxed),
        }
    }
}
