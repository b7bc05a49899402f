//! What a demo run reports: records, crashes and their cost, instances, as text and JSON.

use super::*;

/// The summary of a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DemoSummary {
    /// Records produced to the input topic.
    pub(crate) records_produced: u64,
    /// Output records visible to read_committed readers.
    pub(crate) records_committed: u64,
    /// Extra copies of output.
    pub(crate) duplicates: u64,
    /// Records neither done nor output.
    pub(crate) lost: u64,
    /// Records archived (all reasons).
    pub(crate) archived: u64,
    /// Crashes injected (failpoints that fired).
    pub(crate) crashes: usize,
    /// Crashes scheduled; those of them at points the run did not reach did not fire.
    pub(crate) crashes_scheduled: usize,
    /// The failpoints that fired, in order.
    pub(crate) crash_points: Vec<String>,
    /// Checkpoints completed.
    pub(crate) checkpoints_completed: u64,
    /// Checkpoints aborted.
    pub(crate) checkpoints_aborted: u64,
    /// Broker transactions committed.
    pub(crate) transactions_committed: u64,
    /// Broker transactions aborted.
    pub(crate) transactions_aborted: u64,
    /// Transactions committed by recovery.
    pub(crate) transactions_recovered: u64,
    /// Job attempts.
    pub(crate) attempts: u32,
    /// Where a crash's time goes: what the sources emitted, what the restart strategy
    /// waited and what recovery took.
    pub(crate) crash_cost: CrashCost,
    /// The run resumed one a stopped process left.
    pub(crate) resumed: bool,
    /// Records per second through the job (produce excluded); for a resumed run, the
    /// whole input over this run's time.
    pub(crate) records_per_second: f64,
    /// Seconds the job ran.
    pub(crate) seconds: f64,
    /// Seconds until the sink had received every input record: the job at full speed,
    /// without the tail a run spends on its last checkpoint. At-least-once sources
    /// finish only once a periodic checkpoint accepted their last records (up to one
    /// interval later), exactly-once ones as soon as everything is staged, so this is
    /// the figure that compares the two modes. `None` unless one attempt ran the whole
    /// input and the sources emitted each record once (a crash, a redelivery, a resume
    /// or a stop makes the sink's row count mean something else).
    pub(crate) processed_seconds: Option<f64>,
    /// Invariant violations found by the checker.
    pub(crate) violations: Vec<String>,
    /// Per instance, with `--instances N`; empty for one lone job.
    pub(crate) instances: Vec<InstanceSummary>,
    /// A signal (SIGTERM, Ctrl-C) stopped the run before its input was done; what is
    /// left is AVAILABLE, and `--resume` finishes it.
    pub(crate) stopped: bool,
    /// Records a stopped run left AVAILABLE, untouched, for `--resume` (not lost).
    pub(crate) left_for_resume: u64,
}

/// Where the time of a run's crashes goes, summed over every job and attempt.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct CrashCost {
    /// Records the sources emitted, fresh and again after a restart.
    pub(crate) records_emitted: u64,
    /// Seconds the restart strategy waited before restarts.
    pub(crate) restart_delay_seconds: f64,
    /// Seconds recovery took (restore the newest complete checkpoint, decide its
    /// transactions), the first attempt's included.
    pub(crate) recovery_seconds: f64,
}

impl CrashCost {
    /// What `job` spent, its sources having emitted what `sources` counted.
    pub(super) fn of(job: &shareflow_runtime::Job, sources: &SourceMetrics) -> Self {
        let m = job.metrics();
        Self {
            records_emitted: sources.records_emitted.load(std::sync::atomic::Ordering::Relaxed),
            restart_delay_seconds: m.restart_delay.as_secs_f64(),
            recovery_seconds: m.checkpoints.recovery.sum_ms / 1e3,
        }
    }

    pub(super) fn add(self, other: Self) -> Self {
        Self {
            records_emitted: self.records_emitted + other.records_emitted,
            restart_delay_seconds: self.restart_delay_seconds + other.restart_delay_seconds,
            recovery_seconds: self.recovery_seconds + other.recovery_seconds,
        }
    }
}

/// What one instance of `--instances N` did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct InstanceSummary {
    /// Its prefix (and job id).
    pub(crate) prefix: String,
    /// What the schedule made of it: `steady`, `crashes and restarts`, `dies for good`,
    /// or `joins late`.
    pub(crate) role: &'static str,
    /// Records its sources emitted (replays after restarts included).
    pub(crate) records_emitted: u64,
    /// Crashes that fired in it.
    pub(crate) crashes: usize,
    /// Job attempts.
    pub(crate) attempts: u32,
    /// Silent instances it adopted.
    pub(crate) adoptions: u64,
    /// How its run ended: `stopped`, or the error that ended it.
    pub(crate) outcome: String,
}

/// The JSON form of [`DemoSummary`]: one object, its figures rounded for reading.
#[derive(serde::Serialize)]
struct SummaryJson<'a> {
    records_produced: u64,
    records_committed: u64,
    duplicates: u64,
    lost: u64,
    archived: u64,
    crashes: usize,
    crashes_scheduled: usize,
    crash_points: &'a [String],
    checkpoints_completed: u64,
    checkpoints_aborted: u64,
    transactions_committed: u64,
    transactions_aborted: u64,
    transactions_recovered: u64,
    attempts: u32,
    records_emitted: u64,
    /// What the sources emitted beyond the input: the work crashes made them redo;
    /// null where this run did not see the whole input (resumed, or stopped).
    records_emitted_again: Option<u64>,
    restart_delay_seconds: f64,
    recovery_seconds: f64,
    resumed: bool,
    stopped: bool,
    left_for_resume: u64,
    records_per_second: f64,
    seconds: f64,
    processed_seconds: Option<f64>,
    /// The input over that time (records_per_second * seconds is the input).
    processed_per_second: Option<f64>,
    violations: usize,
    adoptions: u64,
    instances: &'a [InstanceSummary],
}

impl DemoSummary {
    /// Records the sources emitted beyond the input, the work crashes made them redo;
    /// `None` for a run that did not see the whole input from its start (a resumed or a
    /// stopped one), where the difference would mean nothing.
    pub(crate) fn records_emitted_again(&self) -> Option<u64> {
        (!self.resumed && !self.stopped).then(|| self.crash_cost.records_emitted.saturating_sub(self.records_produced))
    }

    /// One JSON object.
    pub(crate) fn to_json(&self) -> String {
        let round = |x: f64, scale: f64| (x * scale).round() / scale;
        let json = SummaryJson {
            records_produced: self.records_produced,
            records_committed: self.records_committed,
            duplicates: self.duplicates,
            lost: self.lost,
            archived: self.archived,
            crashes: self.crashes,
            crashes_scheduled: self.crashes_scheduled,
            crash_points: &self.crash_points,
            checkpoints_completed: self.checkpoints_completed,
            checkpoints_aborted: self.checkpoints_aborted,
            transactions_committed: self.transactions_committed,
            transactions_aborted: self.transactions_aborted,
            transactions_recovered: self.transactions_recovered,
            attempts: self.attempts,
            records_emitted: self.crash_cost.records_emitted,
            records_emitted_again: self.records_emitted_again(),
            restart_delay_seconds: round(self.crash_cost.restart_delay_seconds, 1e6),
            recovery_seconds: round(self.crash_cost.recovery_seconds, 1e6),
            resumed: self.resumed,
            stopped: self.stopped,
            left_for_resume: self.left_for_resume,
            records_per_second: self.records_per_second.round(),
            seconds: round(self.seconds, 1e3),
            processed_seconds: self.processed_seconds.map(|s| round(s, 1e3)),
            processed_per_second: self
                .processed_seconds
                .filter(|s| *s > 0.0)
                .map(|s| (self.records_per_second * self.seconds / s).round()),
            violations: self.violations.len(),
            adoptions: self.instances.iter().map(|i| i.adoptions).sum(),
            instances: &self.instances,
        };
        serde_json::to_string(&json).unwrap_or_default()
    }

    /// A human summary.
    pub(crate) fn to_text(&self) -> String {
        format!(
            "records: produced {}, committed output {}, duplicated {}, lost {}, archived {}\n\
             crashes: {} of {} scheduled, at {:?}; job attempts {}{}\n\
             cost of crashes: restart delays {:.3} s, recovery {:.3} s, records emitted again {}\n\
             checkpoints: completed {}, aborted {}\n\
             transactions: committed {}, aborted {}, recovered {}\n\
             throughput: {:.0} records/s over {:.2} s\n\
             exactly-once check: {}",
            self.records_produced,
            self.records_committed,
            self.duplicates,
            self.lost,
            self.archived,
            self.crashes,
            self.crashes_scheduled,
            self.crash_points,
            self.attempts,
            match (self.resumed, self.stopped) {
                (_, true) => " (stopped by a signal: `--resume` finishes it)",
                (true, false) => " (resumed)",
                (false, false) => "",
            },
            self.crash_cost.restart_delay_seconds,
            self.crash_cost.recovery_seconds,
            self.records_emitted_again().map_or_else(|| "n/a (not a whole run)".to_string(), |n| n.to_string()),
            self.checkpoints_completed,
            self.checkpoints_aborted,
            self.transactions_committed,
            self.transactions_aborted,
            self.transactions_recovered,
            self.records_per_second,
            self.seconds,
            if self.violations.is_empty() {
                "passed".to_string()
            } else {
                format!(
                    "{} violations: {:?}",
                    self.violations.len(),
                    self.violations.iter().take(5).collect::<Vec<_>>()
                )
            },
        )
    }
}
