//! The progress display of `demo` and `run`: a live bar on a terminal (indicatif), plain
//! lines elsewhere (a pipe, a log file, CI), once a second.
//!
//! The plain line starts with what the command's own line says (`progress: N records
//! emitted ...`: scripts and tests read the number after `progress: `), then the figures
//! every run shares: records per second, checkpoints, restarts.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use shareflow_runtime::JobMetricsSnapshot;

/// What a command reports about its run at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProgressState {
    /// Records done so far (committed, or emitted where commits are not counted).
    pub(crate) done: u64,
    /// Records the run must do, if known: the bar's length.
    pub(crate) total: Option<u64>,
    /// Records waiting to be processed, if known.
    pub(crate) lag: Option<u64>,
    /// The command's own line, `progress: ...`.
    pub(crate) line: String,
}

/// The figures every run shares, from one sample to the next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shared {
    /// Records per second moving through the job, over the last second or more; `None`
    /// until a second sample gives one (the line says "starting").
    pub(crate) rate: Option<f64>,
    /// Checkpoints completed.
    pub(crate) checkpoints: u64,
    /// Checkpoints aborted.
    pub(crate) aborted: u64,
    /// Restarts after failures (crashes included).
    pub(crate) restarts: u64,
}

impl Shared {
    /// The shared figures from the job's metrics and a rate.
    pub(crate) fn new(metrics: &JobMetricsSnapshot, rate: Option<f64>) -> Self {
        Self {
            rate,
            checkpoints: metrics.checkpoints.completed,
            aborted: metrics.checkpoints.aborted,
            restarts: metrics.restarts,
        }
    }
}

/// The records that moved through the job so far: the most rows any operator took in.
/// Every record passes each operator of a pipeline, so this moves with the records, not
/// in steps at each commit as the records done do.
pub(crate) fn moved(metrics: &JobMetricsSnapshot) -> u64 {
    metrics.operators.values().map(|o| o.rows_in).max().unwrap_or(0)
}

/// The plain line: the command's own, then the shared figures.
pub(crate) fn plain_line(state: &ProgressState, shared: &Shared) -> String {
    let mut line = format!(
        "{}; {}, {} checkpoints ({} aborted), {} restarts",
        state.line,
        shared.rate.map_or_else(|| "starting".to_string(), |r| format!("{r:.0} records/s")),
        shared.checkpoints,
        shared.aborted,
        shared.restarts
    );
    if let Some(lag) = state.lag {
        line.push_str(&format!(", lag {lag}"));
    }
    line
}

/// The message beside the terminal bar.
pub(crate) fn bar_message(state: &ProgressState, shared: &Shared) -> String {
    let rate = shared.rate.map_or_else(|| "starting".to_string(), |r| format!("{r:.0} rec/s"));
    let mut msg = format!("{rate} · {} checkpoints · {} restarts", shared.checkpoints, shared.restarts);
    if let Some(lag) = state.lag {
        msg.push_str(&format!(" · lag {lag}"));
    }
    msg
}

/// Where progress goes: a bar on a terminal, lines elsewhere.
pub(crate) enum Display {
    /// A live bar on stderr.
    Bar(indicatif::ProgressBar),
    /// Plain lines on stderr.
    Lines,
}

impl Display {
    /// A bar if stderr is a terminal (and `SHAREFLOW_PROGRESS` is not `plain`), else lines.
    pub(crate) fn for_stderr() -> Self {
        let plain = std::env::var("SHAREFLOW_PROGRESS").is_ok_and(|v| v == "plain");
        if plain || !std::io::stderr().is_terminal() {
            return Display::Lines;
        }
        // A spinner until the first sample says how long the bar is.
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("starting");
        bar.enable_steady_tick(Duration::from_millis(200));
        Display::Bar(bar)
    }

    /// How often to sample: a bar a few times a second, lines once a second.
    pub(crate) fn interval(&self) -> Duration {
        match self {
            Display::Bar(_) => Duration::from_millis(250),
            Display::Lines => Duration::from_secs(1),
        }
    }

    /// Shows one sample.
    pub(crate) fn show(&self, state: &ProgressState, shared: &Shared) {
        match self {
            Display::Bar(bar) => {
                if bar.length().is_none() || bar.length() == Some(0) {
                    let template = match state.total {
                        Some(_) => "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} done  {msg}",
                        None => "{spinner} [{elapsed_precise}] {pos} done  {msg}",
                    };
                    bar.set_style(
                        indicatif::ProgressStyle::with_template(template)
                            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                }
                bar.set_length(state.total.unwrap_or(state.done).max(state.done).max(1));
                bar.set_position(state.done);
                bar.set_message(bar_message(state, shared));
            }
            Display::Lines => eprintln!("{}", plain_line(state, shared)),
        }
    }

    /// Ends the display (the bar leaves the screen).
    pub(crate) fn finish(&self) {
        if let Display::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// The shortest span a rate is taken over. Records done move in steps (a checkpoint's
/// commit), and a bar samples four times a second: over a shorter span the rate would
/// read 0 between two steps while records move.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// Samples the shared figures: the rate over the last [`RATE_WINDOW`] or more, of the
/// records moving through the job, or of the records done where the job's operators
/// report none.
pub(crate) struct Sampler {
    /// (when, records moved, records done), oldest first, reaching back past the window.
    history: std::collections::VecDeque<(Instant, u64, u64)>,
}

impl Sampler {
    /// No sample yet.
    pub(crate) fn new() -> Self {
        Self { history: std::collections::VecDeque::new() }
    }

    /// The shared figures for a sample of `done` records now.
    pub(crate) fn sample(&mut self, metrics: &JobMetricsSnapshot, done: u64) -> Shared {
        self.sample_at(Instant::now(), metrics, done)
    }

    /// [`sample`](Self::sample) at `now`.
    pub(crate) fn sample_at(&mut self, now: Instant, metrics: &JobMetricsSnapshot, done: u64) -> Shared {
        let moved = moved(metrics);
        self.history.push_back((now, moved, done));
        // Keep one sample at or before the window's start.
        while self.history.len() > 2 && self.history.get(1).is_some_and(|(at, _, _)| now - *at >= RATE_WINDOW) {
            self.history.pop_front();
        }
        let rate = match self.history.front() {
            Some(&(at, moved_then, done_then)) if now > at => {
                let secs = (now - at).as_secs_f64();
                let records = if moved > 0 { moved.saturating_sub(moved_then) } else { done.saturating_sub(done_then) };
                Some(records as f64 / secs)
            }
            _ => None,
        };
        Shared::new(metrics, rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(lag: Option<u64>) -> ProgressState {
        ProgressState { done: 500, total: Some(1000), lag, line: "progress: 500 records emitted".into() }
    }

    #[test]
    fn the_plain_line_keeps_the_commands_own_words_first() {
        let shared = Shared { rate: Some(1234.4), checkpoints: 7, aborted: 1, restarts: 2 };
        let line = plain_line(&state(None), &shared);
        assert_eq!(line, "progress: 500 records emitted; 1234 records/s, 7 checkpoints (1 aborted), 2 restarts");
        // What scripts read: the number after "progress: ".
        assert_eq!(line.strip_prefix("progress: ").and_then(|l| l.split(' ').next()), Some("500"));
        assert!(plain_line(&state(Some(40)), &shared).ends_with(", lag 40"));
        let first = Shared { rate: None, ..shared };
        assert_eq!(
            plain_line(&state(None), &first),
            "progress: 500 records emitted; starting, 7 checkpoints (1 aborted), 2 restarts"
        );
        assert_eq!(bar_message(&state(Some(40)), &shared), "1234 rec/s · 7 checkpoints · 2 restarts · lag 40");
    }

    /// Job metrics where every operator took in `rows`.
    fn metrics(rows: u64) -> JobMetricsSnapshot {
        let mut m = JobMetricsSnapshot::default();
        for name in ["in", "upper", "out"] {
            m.operators.insert(
                name.into(),
                shareflow_runtime::OperatorMetricsSnapshot { rows_in: rows, ..Default::default() },
            );
        }
        m
    }

    #[test]
    fn the_rate_never_reads_0_while_records_move_between_commits() {
        // Four samples a second (the bar); records move at 100,000/s; the records done
        // move only when a checkpoint commits, here once every 1.5 s.
        let start = Instant::now();
        let mut s = Sampler::new();
        let mut rates = Vec::new();
        for i in 1..=20u64 {
            let now = start + Duration::from_millis(250 * i);
            let done = (i / 6) * 150_000;
            rates.push(s.sample_at(now, &metrics(25_000 * i), done).rate);
        }
        assert_eq!(rates[0], None, "no rate from a first sample");
        for (i, rate) in rates.iter().enumerate().skip(1) {
            let rate = rate.expect("a rate from the second sample on");
            assert!((rate - 100_000.0).abs() < 1.0, "sample {i}: {rate} records/s while 100,000/s move");
        }
    }

    #[test]
    fn the_rate_is_taken_over_a_second_or_more_of_records_done_without_operators() {
        let start = Instant::now();
        let mut s = Sampler::new();
        let m = JobMetricsSnapshot::default();
        s.sample_at(start, &m, 0);
        // A commit of 1,000 records 300 ms in, nothing after: the rate over the last
        // second still counts it, so it does not read 0 at 500 ms.
        assert_eq!(s.sample_at(start + Duration::from_millis(300), &m, 1_000).rate, Some(1_000.0 / 0.3));
        assert_eq!(s.sample_at(start + Duration::from_millis(500), &m, 1_000).rate, Some(2_000.0));
        // Once a second has passed: from the newest sample at least a second old.
        let r = s.sample_at(start + Duration::from_millis(1_500), &m, 4_000).rate.unwrap();
        assert!((r - 3_000.0).abs() < 1e-6, "from the sample at 500 ms: {r}");
        let r = s.sample_at(start + Duration::from_millis(2_600), &m, 5_000).rate.unwrap();
        assert!((r - 1_000.0 / 1.1).abs() < 1e-6, "from the sample at 1,500 ms: {r}");
    }
}
