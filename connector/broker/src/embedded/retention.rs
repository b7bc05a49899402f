//! Retention on the embedded broker: journaled trims, at most once a second.

use std::sync::atomic::Ordering;

use super::EmbeddedBroker;
use crate::journal::Written;
use crate::state::{BrokerState, Command, Entry};
use shareflow_share::Result;

/// How often retention looks at the logs, in broker time.
const RETENTION_EVERY_MS: u64 = 1_000;

impl EmbeddedBroker {
    /// At most once a second of broker time: deletes what retention allows, one
    /// journaled `Trim` per partition. Returns the last entry written, if any.
    pub(super) fn apply_retention(&self, st: &mut BrokerState, now_ms: u64) -> Result<Option<Written>> {
        let Some((default, per_topic)) = &self.inner.retention else { return Ok(None) };
        let last = self.inner.retention_at_ms.load(Ordering::Relaxed);
        if now_ms < last.saturating_add(RETENTION_EVERY_MS) {
            return Ok(None);
        }
        self.inner.retention_at_ms.store(now_ms, Ordering::Relaxed);
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
