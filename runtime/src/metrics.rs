//! Job metrics: checkpoints, and rows and backpressure per operator; and the typed
//! [`Metric`] list an exporter reads (the broker's metrics use the same types).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use shareflow_checkpoint::CheckpointId;

/// A latency histogram with power-of-two millisecond buckets.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Histogram {
    /// Samples recorded.
    pub count: u64,
    /// Sum of samples, ms.
    pub sum_ms: f64,
    /// Largest sample, ms.
    pub max_ms: f64,
    /// `buckets[i]` counts samples below `2^i` ms (the last bucket takes the rest).
    pub buckets: [u64; 24],
}

impl Histogram {
    /// Adds one sample.
    pub fn record(&mut self, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        self.count += 1;
        self.sum_ms += ms;
        self.max_ms = self.max_ms.max(ms);
        // Bucket i holds what is at most 2^i ms (Prometheus's `le`); the last, the rest.
        let i = (0..self.buckets.len()).find(|&i| ms <= (1u64 << i) as f64).unwrap_or(self.buckets.len() - 1);
        self.buckets[i] += 1;
    }

    /// Upper bound of the bucket holding quantile `q` (0..=1), in ms.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let target = (q.clamp(0.0, 1.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= target {
                return ((1u64 << i) as f64).min(self.max_ms);
            }
        }
        self.max_ms
    }

    /// Mean, ms.
    pub fn mean_ms(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ms / self.count as f64
        }
    }

    /// `(upper bound in ms, samples in this bucket alone)` for every bucket, the last
    /// one's bound `+Inf`. Not cumulative: an exporter that writes Prometheus's
    /// cumulative `le` form sums them (prometheus-client's encoder does).
    pub fn bucket_counts(&self) -> Vec<(f64, u64)> {
        let last = self.buckets.len() - 1;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, &n)| (if i == last { f64::INFINITY } else { (1u64 << i) as f64 }, n))
            .collect()
    }
}

/// The value of one metric. Exhaustive on purpose: an exporter must know every kind.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricValue {
    /// A count that only grows.
    Counter(u64),
    /// A level that goes up and down.
    Gauge(u64),
    /// A latency distribution, ms.
    Histogram(Box<Histogram>),
}

/// One named metric, for an exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// The name, words joined by `-` (KIP-1289's spelling); an exporter whose format
    /// forbids `-` writes `_`.
    pub name: &'static str,
    /// One line saying what it measures.
    pub help: &'static str,
    /// Labels telling apart the series of one name, e.g. `("operator", "sink")`.
    pub labels: Vec<(&'static str, String)>,
    /// Its value: a counter, a gauge or a latency histogram.
    pub value: MetricValue,
}

impl Metric {
    /// A metric without labels.
    pub fn new(name: &'static str, help: &'static str, value: MetricValue) -> Self {
        Self { name, help, labels: Vec::new(), value }
    }

    /// The same metric with one more label.
    pub fn label(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.labels.push((key, value.into()));
        self
    }
}

/// Counters of one operator, summed over its subtasks.
#[derive(Debug, Default)]
pub(crate) struct OperatorMetrics {
    rows_in: AtomicU64,
    rows_out: AtomicU64,
    backpressure_ns: AtomicU64,
    /// When rows last came in, as nanoseconds after [`clock_base`] plus one; 0: never.
    last_input_ns: AtomicU64,
}

/// The instant the metrics' timestamps count from (the first one taken in the process).
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl OperatorMetrics {
    /// `n` rows came in (one batch): counted, and the time noted.
    pub(crate) fn add_rows_in(&self, n: u64) {
        self.rows_in.fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(clock_base().elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        self.last_input_ns.fetch_max(ns, Ordering::Relaxed);
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
    /// When the last rows came in (for a source: were produced); `None` before any.
    pub last_input: Option<Instant>,
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
    restart_delay_ns: AtomicU64,
}

/// Checkpoint counters and durations.
#[derive(Debug, Clone, Default, PartialEq)]
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
    pub last_completed_id: Option<CheckpointId>,
    /// Transactions committed.
    pub transactions_committed: u64,
    /// Transactions aborted (recovery, refused prepare).
    pub transactions_aborted: u64,
    /// Transactions committed by recovery (found PREPARE with a manifest).
    pub transactions_recovered: u64,
    /// Silent instances of the group this job adopted (decision 0007).
    pub instances_adopted: u64,
    /// Transactions begun and not yet committed or aborted, over every participant.
    pub transactions_open: u64,
    /// Prepares refused because the participant had aborted the transaction already
    /// (its timeout passed).
    pub transactions_timed_out: u64,
    /// Trigger to commit, per completed checkpoint.
    pub duration: Histogram,
    /// Trigger to the last subtask's acknowledgement (barrier alignment), per completed
    /// checkpoint.
    pub alignment: Histogram,
    /// Phase one (every participant prepares), per completed checkpoint.
    pub prepare: Histogram,
    /// Phase two (every participant commits), from the manifest's publication, per
    /// completed checkpoint.
    pub commit: Histogram,
    /// Recovery before an attempt: read the latest checkpoint, decide and take over.
    pub recovery: Histogram,
    /// The newest checkpoints' outcomes, oldest first, at most [`HISTORY`] of them.
    pub history: std::collections::VecDeque<CheckpointOutcome>,
}

/// How many checkpoint outcomes [`CheckpointMetrics::history`] keeps.
pub const HISTORY: usize = 64;

/// How one checkpoint ended, for a dashboard's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointOutcome {
    /// Its id, n.
    pub id: CheckpointId,
    /// The transaction it decided: T(n), `{group}-{prefix}-{n}`.
    pub transaction: String,
    /// Trigger to commit (completed) or to the abort.
    pub duration: Duration,
    /// State bytes (0 when aborted).
    pub size_bytes: u64,
    /// `None` if it completed; else why it was aborted.
    pub aborted: Option<String>,
}

impl CheckpointMetrics {
    /// Records how checkpoint `outcome.id` ended, forgetting the oldest past [`HISTORY`].
    pub(crate) fn remember(&mut self, outcome: CheckpointOutcome) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(outcome);
    }
}

/// A copy of every job metric.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobMetricsSnapshot {
    /// Per operator.
    pub operators: BTreeMap<String, OperatorMetricsSnapshot>,
    /// Checkpoints.
    pub checkpoints: CheckpointMetrics,
    /// Restarts after failures.
    pub restarts: u64,
    /// What the restart strategy waited before those restarts, in all.
    pub restart_delay: Duration,
}

impl JobMetrics {
    /// The counters of `operator`, created on first use.
    pub(crate) fn operator(&self, operator: &str) -> Arc<OperatorMetrics> {
        let mut ops = shareflow_checkpoint::sync::lock(&self.inner.operators);
        ops.entry(operator.to_string()).or_default().clone()
    }

    pub(crate) fn checkpoints(&self, f: impl FnOnce(&mut CheckpointMetrics)) {
        f(&mut shareflow_checkpoint::sync::lock(&self.inner.checkpoints));
    }

    /// A restart, after waiting `delay`.
    pub(crate) fn restarted(&self, delay: Duration) {
        self.inner.restarts.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.inner.restart_delay_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A copy of everything.
    pub fn snapshot(&self) -> JobMetricsSnapshot {
        let ops = shareflow_checkpoint::sync::lock(&self.inner.operators);
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
                            last_input: match m.last_input_ns.load(Ordering::Relaxed) {
                                0 => None,
                                ns => Some(clock_base() + Duration::from_nanos(ns - 1)),
                            },
                        },
                    )
                })
                .collect(),
            checkpoints: shareflow_checkpoint::sync::lock(&self.inner.checkpoints).clone(),
            restarts: self.inner.restarts.load(Ordering::Relaxed),
            restart_delay: Duration::from_nanos(self.inner.restart_delay_ns.load(Ordering::Relaxed)),
        }
    }
}

impl JobMetricsSnapshot {
    /// Every job metric, typed, for an exporter: per operator (label `operator`) records
    /// in and out and backpressure time; checkpoints completed and aborted, their
    /// duration, alignment, prepare and commit latency and size; transactions; restarts,
    /// recovery time and adoptions.
    pub fn metrics(&self) -> Vec<Metric> {
        use MetricValue::{Counter, Gauge};
        let hist = |h: &Histogram| MetricValue::Histogram(Box::new(h.clone()));
        let mut out = Vec::new();
        for (name, op) in &self.operators {
            out.push(
                Metric::new(
                    "shareflow-records-in-total",
                    "rows an operator received (a source: read)",
                    Counter(op.rows_in),
                )
                .label("operator", name),
            );
            out.push(
                Metric::new("shareflow-records-out-total", "rows an operator emitted", Counter(op.rows_out))
                    .label("operator", name),
            );
            out.push(
                Metric::new(
                    "shareflow-backpressure-ms-total",
                    "time an operator waited for downstream channel space, ms",
                    Counter(op.backpressure.as_millis() as u64),
                )
                .label("operator", name),
            );
        }
        let c = &self.checkpoints;
        out.extend([
            Metric::new("shareflow-checkpoints-completed-total", "checkpoints completed", Counter(c.completed)),
            Metric::new(
                "shareflow-checkpoints-aborted-total",
                "checkpoints aborted (timeout, failure)",
                Counter(c.aborted),
            ),
            Metric::new("shareflow-checkpoint-duration-ms", "checkpoint trigger to commit, ms", hist(&c.duration)),
            Metric::new(
                "shareflow-checkpoint-alignment-ms",
                "checkpoint trigger to the last barrier acknowledgement, ms",
                hist(&c.alignment),
            ),
            Metric::new(
                "shareflow-checkpoint-size-bytes",
                "state bytes of the last completed checkpoint",
                Gauge(c.last_size_bytes),
            ),
            Metric::new(
                "shareflow-checkpoint-last-id",
                "id of the last completed checkpoint (0: none yet)",
                Gauge(c.last_completed_id.unwrap_or(0)),
            ),
            Metric::new(
                "shareflow-prepare-time-ms",
                "phase one of a checkpoint's commit, every participant, ms",
                hist(&c.prepare),
            ),
            Metric::new(
                "shareflow-commit-time-ms",
                "phase two of a checkpoint's commit, every participant, ms",
                hist(&c.commit),
            ),
            Metric::new(
                "shareflow-transactions-open",
                "transactions begun and not yet decided",
                Gauge(c.transactions_open),
            ),
            Metric::new(
                "shareflow-transactions-committed-total",
                "transactions committed",
                Counter(c.transactions_committed),
            ),
            Metric::new(
                "shareflow-transactions-aborted-total",
                "transactions aborted (recovery, refused prepare)",
                Counter(c.transactions_aborted),
            ),
            Metric::new(
                "shareflow-transactions-timed-out-total",
                "prepares refused because the transaction's timeout had passed",
                Counter(c.transactions_timed_out),
            ),
            Metric::new(
                "shareflow-transactions-recovered-total",
                "PREPARE transactions a recovery committed from their manifest",
                Counter(c.transactions_recovered),
            ),
            Metric::new("shareflow-restarts-total", "restarts after failures", Counter(self.restarts)),
            Metric::new(
                "shareflow-restart-delay-ms-total",
                "ms the restart strategy waited before restarts",
                Counter(u64::try_from(self.restart_delay.as_millis()).unwrap_or(u64::MAX)),
            ),
            Metric::new("shareflow-recovery-time-ms", "recovery before an attempt, ms", hist(&c.recovery)),
            Metric::new(
                "shareflow-instances-adopted-total",
                "silent instances this job adopted",
                Counter(c.instances_adopted),
            ),
        ]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_bound_the_samples() {
        let mut h = Histogram::default();
        for ms in [1, 2, 3, 100] {
            h.record(Duration::from_millis(ms));
        }
        assert_eq!(h.count, 4);
        // The second of four samples is 2 ms, in the bucket `le 2`.
        assert_eq!(h.quantile_ms(0.5), 2.0);
        assert_eq!(h.quantile_ms(1.0), 100.0);
        assert_eq!(h.mean_ms(), 26.5);
        // Each bucket alone, `le` inclusive: 1 ms in `le 1`, 2 in `le 2`, 3 in `le 4`.
        let b = h.bucket_counts();
        assert_eq!(b.len(), 24);
        assert_eq!((b[0], b[1], b[2], b[3], b[7]), ((1.0, 1), (2.0, 1), (4.0, 1), (8.0, 0), (128.0, 1)));
        assert_eq!(b[23], (f64::INFINITY, 0));
        let mut huge = Histogram::default();
        huge.record(Duration::from_secs(1 << 24));
        assert_eq!(huge.bucket_counts()[23], (f64::INFINITY, 1), "past the last bound: +Inf");
    }

    /// An operator's snapshot says when its last rows came in: not before they did, and
    /// none for an operator that has had none.
    #[test]
    fn the_last_input_is_timed_when_rows_come_in() {
        let m = JobMetrics::default();
        m.operator("source").add_rows_out(7);
        let before = Instant::now();
        m.operator("sink").add_rows_in(5);
        let first = m.snapshot().operators["sink"].last_input.expect("rows came in");
        assert!(first >= before && first <= Instant::now(), "{first:?} after {before:?}");
        std::thread::sleep(Duration::from_millis(2));
        m.operator("sink").add_rows_in(1);
        let sink = m.snapshot().operators["sink"];
        assert!(sink.last_input.expect("rows came in") > first, "a later batch moves it on");
        assert_eq!(sink.rows_in, 6);
        assert_eq!(m.snapshot().operators["source"].last_input, None, "nothing came into the source");
    }

    #[test]
    fn every_operator_gets_its_labelled_series() {
        let m = JobMetrics::default();
        m.operator("source").add_rows_out(7);
        m.operator("sink").add_rows_in(5);
        m.checkpoints(|c| c.duration.record(Duration::from_millis(30)));
        let list = m.snapshot().metrics();
        let find = |name: &str, op: &str| {
            list.iter()
                .find(|x| x.name == name && x.labels == vec![("operator", op.to_string())])
                .map(|x| x.value.clone())
        };
        assert_eq!(find("shareflow-records-out-total", "source"), Some(MetricValue::Counter(7)));
        assert_eq!(find("shareflow-records-in-total", "sink"), Some(MetricValue::Counter(5)));
        let duration = list.iter().find(|x| x.name == "shareflow-checkpoint-duration-ms").expect("duration");
        assert!(matches!(&duration.value, MetricValue::Histogram(h) if h.count == 1 && h.sum_ms == 30.0));
        // Names are unique per label set: an exporter may register each once.
        let mut keys: Vec<_> = list.iter().map(|x| (x.name, x.labels.clone())).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), list.len());
    }
}
