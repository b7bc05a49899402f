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
    /// Records per second since the last sample.
    pub(crate) rate: f64,
    /// Checkpoints completed.
    pub(crate) checkpoints: u64,
    /// Checkpoints aborted.
    pub(crate) aborted: u64,
    /// Restarts after failures (crashes included).
    pub(crate) restarts: u64,
}

impl Shared {
    /// The shared figures from the job's metrics and the records done since the last
    /// sample, `elapsed` ago.
    pub(crate) fn new(metrics: &JobMetricsSnapshot, done_since: u64, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64();
        Self {
            rate: if secs > 0.0 { done_since as f64 / secs } else { 0.0 },
            checkpoints: metrics.checkpoints.completed,
            aborted: metrics.checkpoints.aborted,
            restarts: metrics.restarts,
        }
    }
}

/// The plain line: the command's own, then the shared figures.
pub(crate) fn plain_line(state: &ProgressState, shared: &Shared) -> String {
    let mut line = format!(
        "{}; {:.0} records/s, {} checkpoints ({} aborted), {} restarts",
        state.line, shared.rate, shared.checkpoints, shared.aborted, shared.restarts
    );
    if let Some(lag) = state.lag {
        line.push_str(&format!(", lag {lag}"));
    }
    line
}

/// The message beside the terminal bar.
pub(crate) fn bar_message(state: &ProgressState, shared: &Shared) -> String {
    let mut msg =
        format!("{:.0} rec/s · {} checkpoints · {} restarts", shared.rate, shared.checkpoints, shared.restarts);
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

/// Samples once a second: what `state` reports, with the shared figures from `metrics`.
pub(crate) struct Sampler {
    last: Option<(Instant, u64)>,
}

impl Sampler {
    /// No sample yet.
    pub(crate) fn new() -> Self {
        Self { last: None }
    }

    /// The shared figures for a sample of `done` records now.
    pub(crate) fn sample(&mut self, metrics: &JobMetricsSnapshot, done: u64) -> Shared {
        let now = Instant::now();
        let (since, elapsed) = match self.last {
            Some((at, before)) => (done.saturating_sub(before), now - at),
            None => (0, Duration::ZERO),
        };
        self.last = Some((now, done));
        Shared::new(metrics, since, elapsed)
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
        let shared = Shared { rate: 1234.4, checkpoints: 7, aborted: 1, restarts: 2 };
        let line = plain_line(&state(None), &shared);
        assert_eq!(line, "progress: 500 records emitted; 1234 records/s, 7 checkpoints (1 aborted), 2 restarts");
        // What scripts read: the number after "progress: ".
        assert_eq!(line.strip_prefix("progress: ").and_then(|l| l.split(' ').next()), Some("500"));
        assert!(plain_line(&state(Some(40)), &shared).ends_with(", lag 40"));
        assert_eq!(bar_message(&state(Some(40)), &shared), "1234 rec/s · 7 checkpoints · 2 restarts · lag 40");
    }

    #[test]
    fn the_rate_is_records_since_the_last_sample_per_second() {
        let m = JobMetricsSnapshot::default();
        let mut s = Sampler::new();
        assert_eq!(s.sample(&m, 100).rate, 0.0, "no rate from a first sample");
        assert_eq!(Shared::new(&m, 3000, Duration::from_secs(2)).rate, 1500.0);
        assert_eq!(Shared::new(&m, 3000, Duration::ZERO).rate, 0.0);
    }
}
