//! Retention on the embedded broker: journaled trims, once per check interval.

use std::sync::atomic::Ordering;

use super::EmbeddedBroker;
use crate::journal::Written;
use crate::state::{BrokerState, Command, Entry};
use shareflow_share::Result;

/// Kafka's `LogManager.InitialTaskDelayMs`: its first retention check comes this long
/// after the broker starts.
const FIRST_CHECK_MS: u64 = 30_000;

/// When retention first looks at the logs of a broker opened at `now_ms` whose journal
/// last saw broker time `last_ms` (0 when new), checking every `every_ms`: 30 s after the
/// open (or one interval, if shorter), as on Kafka, so that input produced with old
/// timestamps is not deleted under a job that has just started. A broker reopened more
/// than an interval after its last command looks at once, and one reopened sooner no
/// later than an interval after that command: brokers opened briefly and often (the
/// command line's) still apply retention.
pub(super) fn retention_first_due(now_ms: u64, last_ms: u64, every_ms: u64) -> u64 {
    let after_open = now_ms.saturating_add(FIRST_CHECK_MS.min(every_ms));
    if last_ms == 0 {
        after_open
    } else {
        after_open.min(last_ms.saturating_add(every_ms))
    }
}

impl EmbeddedBroker {
    /// Once per check interval of broker time: deletes what retention allows, one
    /// journaled `Trim` per partition. Returns the last entry written, if any.
    pub(super) fn apply_retention(&self, st: &mut BrokerState, now_ms: u64) -> Result<Option<Written>> {
        let Some((default, per_topic)) = &self.inner.retention else { return Ok(None) };
        if now_ms < self.inner.retention_due_ms.load(Ordering::Relaxed) {
            return Ok(None);
        }
        self.inner.retention_due_ms.store(now_ms.saturating_add(self.inner.retention_every_ms), Ordering::Relaxed);
        let mut written = None;
        for (tp, before) in st.retention_trims(now_ms, default, per_topic) {
            let entry = Entry { now_ms, command: Command::Trim { tp, before } };
            if let (Ok(outcome), _) = st.apply(&entry) {
                if outcome.changed_state() {
                    written = Some(self.inner.journal.append(&entry)?);
                }
            }
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::retention_first_due;

    #[test]
    fn the_first_check_comes_30_s_after_the_open_or_an_interval_after_the_last_command() {
        const MIN: u64 = 60_000;
        // (opened at, journal's last time, interval) -> first check
        let cases = [
            ((1_000 * MIN, 0, 5 * MIN), 1_000 * MIN + 30_000), // new broker: 30 s after the open
            ((1_000 * MIN, 0, 10_000), 1_000 * MIN + 10_000),  // an interval under 30 s
            ((1_000 * MIN, 999 * MIN, 5 * MIN), 1_000 * MIN + 30_000), // reopened a minute later
            ((1_000 * MIN, 990 * MIN, 5 * MIN), 995 * MIN),    // reopened 10 minutes later: at once
            ((1_000 * MIN, 996 * MIN, 5 * MIN), 1_000 * MIN + 30_000), // 4 minutes later
            ((1_000 * MIN, 995 * MIN + 10_000, 5 * MIN), 1_000 * MIN + 10_000), // due before 30 s
        ];
        for ((now, last, every), due) in cases {
            assert_eq!(retention_first_due(now, last, every), due, "opened {now}, last {last}, every {every}");
        }
    }
}
