//! Serving again after a full disk, without a reopen (decision 0020).

use std::time::{Duration, Instant};

use super::EmbeddedBroker;
use crate::state::BrokerState;
use shareflow_share::{Error, Result};

/// How often a broker whose disk filled reads its directory again, at most.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// How long a reload waits for a write or a snapshot that was under way when the disk
/// filled to end.
const BUSY_WAIT: Duration = Duration::from_secs(5);

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
        // A write or a snapshot that was under way when the disk filled ends at once (the
        // journal is failed); the reload waits for it rather than answer this call with
        // the full disk once more.
        let busy_until = Instant::now() + BUSY_WAIT;
        let recovered = loop {
            let fresh = BrokerState::new(self.inner.default_config.clone());
            match self.inner.journal.reload(fresh).await? {
                Some(recovered) => break recovered,
                None if self.inner.journal.check_healthy().is_ok() => return Ok(()),
                None if Instant::now() < busy_until => tokio::time::sleep(Duration::from_millis(2)).await,
                None => return self.inner.journal.check_healthy(),
            }
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use shareflow_share::ProducerRecord;

    use super::*;
    use crate::{fault, BrokerOptions};

    fn record(value: &'static str) -> Vec<ProducerRecord> {
        vec![ProducerRecord::new("t", 0, Bytes::from(value))]
    }

    /// A snapshot that was under way when the disk filled holds the reload back; the
    /// next call waits for it to end and is served, rather than failing with the full
    /// disk once more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_waits_for_a_snapshot_under_way_and_serves_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let options = BrokerOptions::local_dir(dir.path()).unwrap();
        let broker = EmbeddedBroker::open(options.clone()).await.unwrap();
        broker.create_topic("t", 1).await.unwrap();
        broker.produce(record("kept")).await.unwrap();
        // Clones of the options share their fault points.
        let _ = options.fail_at(fault::DISK_FULL);
        let err = broker.produce(record("never durable")).await.unwrap_err();
        assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
        assert!(broker.inner.journal.begin_snapshot(), "no snapshot was under way");
        let journal = broker.inner.journal.clone();
        let snapshot = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            journal.abandon_snapshot();
        });
        let offsets = broker.produce(record("after the reload")).await.unwrap();
        assert_eq!(offsets[0].1, 1, "the write after the reload follows the last durable one");
        snapshot.await.unwrap();
    }
}
