//! Retention on the embedded broker: journaled trims, once per check interval.

use std::sync::atomic::Ordering;

use super::EmbeddedBroker;
use crate::journal::Written;
use crate::state::{BrokerState, Command, Entry};
use shareflow_share::Result;

impl EmbeddedBroker {
    /// Once per check interval of broker time: deletes what retention allows, one
    /// journaled `Trim` per partition. Returns the last entry written, if any.
    pub(super) fn apply_retention(&self, st: &mut BrokerState, now_ms: u64) -> Result<Option<Written>> {
        let Some((default, per_topic)) = &self.inner.retention else { return Ok(None) };
        let last = self.inner.retention_at_ms.load(Ordering::Relaxed);
        if now_ms < last.saturating_add(self.inner.retention_every_ms) {
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
