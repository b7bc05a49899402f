//! Serving again after a full disk, without a reopen (decision 0020).

use std::time::{Duration, Instant};

use super::EmbeddedBroker;
use crate::state::BrokerState;
use shareflow_share::{Error, Result};

/// How often a broker whose disk filled reads its directory again, at most.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

impl EmbeddedBroker {
    /// After a journal write failed on a full disk: reads the directory again, at most
    /// once a second, so that memory matches what is on disk and the broker serves
    /// again without a reopen once space is freed. Until then every call fails with
    /// [`Error::DiskFull`]. Other failures need a reopen, and are returned as they are.
    pub(super) async fn reload_after_disk_full(&self) -> Result<()> {
        if self.inner.journal.check_healthy().is_ok() || self.inner.read_only {
            return Ok(());
        }
        let mut reloaded_at = self.inner.reloaded_at.lock().await;
        if reloaded_at.is_some_and(|at| at.elapsed() < RELOAD_EVERY) {
            return self.inner.journal.check_healthy();
        }
        let fresh = BrokerState::new(self.inner.default_config.clone());
        let Some(recovered) = self.inner.journal.reload(fresh).await? else {
            return self.inner.journal.check_healthy();
        };
        *reloaded_at = Some(Instant::now());
        {
            let mut st = self.inner.state.lock().map_err(|_| Error::Internal("broker state lock poisoned".into()))?;
            *st = recovered.state;
            self.inner.journal.finish_reload(recovered.next_lsn, recovered.segments)?;
        }
        tracing::warn!(
            next_lsn = self.inner.journal.next_lsn(),
            "embedded broker read its directory again after a full disk; it serves again"
        );
        self.inner.wake.notify_waiters();
        Ok(())
    }
}
