//! [`LedgerLog`]: the acknowledgement ledger's I/O on Kafka. It writes ledger entries
//! (intents outside any transaction, commit entries as records for T(n)), reads a
//! prefix's commits topic back, and reads the records a replay names from their
//! topics' logs. The ledger model itself is [`super::ledger`]; the intents topic is
//! tailed by [`super::group`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::entries::{LedgerEntry, LedgerRange};
use crate::kafka::client::CachedProducer;
use crate::kafka::client::{kafka_error, KafkaCluster};
use shareflow_checkpoint::CheckpointId;
use shareflow_share::Record;
use shareflow_share::{Error, ErrorKind, Result};

/// Ledger intents are small, latency-bound writes: no linger, small batches.
const INTENT_BATCH_BYTES: usize = 64 << 10;

/// How long the replay of one partition may take to reach its last wanted offset.
const REPLAY_DEADLINE: Duration = Duration::from_secs(60);

/// Reads and writes one job's ledger topic, and the logs its replay plan names.
#[derive(Debug)]
pub(crate) struct LedgerLog {
    cluster: KafkaCluster,
    /// The longest a stable read waits for open transactions to leave the ledger.
    stable_wait: Duration,
    /// Writes intents, commit notes, summaries and at-least-once commit entries, kept
    /// apart from bulk output: its own producer on its own connection.
    intents: CachedProducer,
    /// Commit entries read, and their value bytes.
    read_entries: AtomicU64,
    read_bytes: AtomicU64,
}

impl LedgerLog {
    /// The ledger I/O of a job on `cluster` whose transactions time out after
    /// `transaction_timeout`: a stable read waits that long (at most 60 s) for them.
    pub(crate) fn new(cluster: KafkaCluster, transaction_timeout: Duration) -> Self {
        Self {
            cluster,
            stable_wait: transaction_timeout.min(Duration::from_secs(60)),
            intents: CachedProducer::own_connection(Duration::ZERO, INTENT_BATCH_BYTES),
            read_entries: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
        }
    }

    /// Closes the producer of intents and notes, waiting at most `limit`.
    pub(crate) async fn close(&self, limit: Duration) {
        self.intents.close(limit).await;
    }

    /// Commit entries read so far, and their value bytes.
    pub(crate) fn read_stats(&self) -> (u64, u64) {
        (self.read_entries.load(Ordering::Relaxed), self.read_bytes.load(Ordering::Relaxed))
    }

    /// `entry` as a record of partition 0 of the ledger topic `topic` (it has only
    /// one), for writing here or inside T(n).
    pub(crate) fn record(topic: &str, entry: &LedgerEntry) -> Result<krafka::Record> {
        Ok(krafka::Record::new(topic, Bytes::from(entry.encode()?)).partition(0))
    }

    /// Writes `entry` to `topic` outside any transaction, waits until it is durable, and
    /// returns its offset.
    pub(crate) async fn write(&self, topic: &str, entry: &LedgerEntry) -> Result<i64> {
        let record = Self::record(topic, entry)?;
        let producer = self.intents.get(&self.cluster).await?;
        let meta = producer
            .send(record)
            .await
            .map_err(|e| kafka_error(format!("write {} to the ledger {topic}", entry.describe()), e))?;
        Ok(meta.offset)
    }

    /// The commit entries of the commits topic `topic`, as `(generation, checkpoint_id,
    /// slot)`. `stable`: wait until no transaction holds it open and read only committed
    /// entries (which checkpoints committed); otherwise read everything written, open
    /// transactions included (which checkpoint an open transaction carries). Anything
    /// but a commit entry is corruption.
    pub(crate) async fn commits(&self, topic: &str, stable: bool) -> Result<Vec<(u32, CheckpointId, u16)>> {
        let c = &self.cluster;
        let wait = self.stable_wait;
        if stable && !c.wait_stable(topic, wait).await? {
            return Err(Error::Kafka {
                op: format!("read the commits topic {topic}"),
                reason: format!(
                    "a transaction has kept it open for {wait:?}; another process of this instance may be running: \
                     stop it, or wait for its transaction timeout"
                ),
                kind: ErrorKind::Unavailable,
                source: None,
            });
        }
        Ok(self.read_commits(topic, stable).await?.into_iter().map(|(_, g, e, s)| (g, e, s)).collect())
    }

    /// The commit entries of the commits topic `topic` as `(offset, generation,
    /// checkpoint_id, slot)`, read up to its end now: committed entries only if
    /// `read_committed`, without waiting for open transactions. Anything but a commit
    /// entry is corruption.
    pub(crate) async fn read_commits(
        &self,
        topic: &str,
        read_committed: bool,
    ) -> Result<Vec<(i64, u32, CheckpointId, u16)>> {
        let mut out = Vec::new();
        for (partition, offset, _key, value) in self.cluster.read_topic(topic, read_committed).await? {
            let value = value.unwrap_or_default();
            self.read_entries.fetch_add(1, Ordering::Relaxed);
            self.read_bytes.fetch_add(value.len() as u64, Ordering::Relaxed);
            let corrupt = |reason: String| Error::Corrupt {
                path: format!("kafka topic {topic} partition {partition} offset {offset}"),
                reason: format!(
                    "{reason}. The commits topic must be written by this instance only; recreating it empty gives \
                     up exactly-once for checkpoints that were in flight"
                ),
            };
            match LedgerEntry::decode(&value) {
                Ok(LedgerEntry::Commit { generation, checkpoint_id, slot }) => {
                    out.push((offset, generation, checkpoint_id, slot))
                }
                Ok(other) => return Err(corrupt(format!("{} in a commits topic", other.describe()))),
                Err(reason) => return Err(corrupt(format!("not a ledger entry: {reason}"))),
            }
        }
        tracing::debug!(topic = %topic, commits = out.len(), read_committed, "read a commits topic");
        Ok(out)
    }

    /// Reads the records of `ranges` from their topics' logs, for replay. Offsets the log
    /// no longer holds (retention deleted them) are reported and skipped: their output
    /// is lost, the one case the ledger cannot repair.
    pub(crate) async fn read_ranges(&self, ranges: &[LedgerRange]) -> Result<Vec<Record>> {
        let mut by_tp: BTreeMap<(String, i32), Vec<(i64, i64)>> = BTreeMap::new();
        for r in ranges {
            by_tp.entry((r.topic.clone(), r.partition)).or_default().push((r.first, r.last));
        }
        let mut out = Vec::new();
        for ((topic, partition), wanted) in by_tp {
            let op = |what: &str| format!("{what} {topic}-{partition} for replay");
            let consumer = self
                .cluster
                .client()
                .consumer_without_group()
                .fetch_max_wait(crate::kafka::client::BOUNDED_READ_WAIT)
                .build()
                .await
                .map_err(|e| kafka_error(op("read"), e))?;
            consumer.assign(&topic, vec![partition]).await.map_err(|e| kafka_error(op("assign"), e))?;
            let first = wanted.iter().map(|w| w.0).min().unwrap_or(0);
            let last = wanted.iter().map(|w| w.1).max().unwrap_or(-1);
            consumer.seek(&topic, partition, first).await.map_err(|e| kafka_error(op("seek"), e))?;
            let mut found = 0u64;
            let deadline = tokio::time::Instant::now() + REPLAY_DEADLINE;
            loop {
                let position = consumer.position(&topic, partition).await;
                // Only asked when the position is unknown: is the partition still ours?
                let assigned = position.is_some()
                    || consumer.assignment().await.get(&topic).is_some_and(|ps| ps.contains(&partition));
                let position = match replay_progress(position, assigned, last, &topic, partition)? {
                    ReplayProgress::Done => break,
                    ReplayProgress::Reading { position } => position,
                };
                if tokio::time::Instant::now() > deadline {
                    let at = position.map_or_else(|| "unknown".to_string(), |p| p.to_string());
                    return Err(Error::Kafka {
                        op: op("read"),
                        reason: format!("offsets up to {last} did not arrive within 60 s (position {at})"),
                        kind: ErrorKind::Unavailable,
                        source: None,
                    });
                }
                let records =
                    consumer.poll(Duration::from_millis(200)).await.map_err(|e| kafka_error(op("read"), e))?;
                for r in records {
                    if wanted.iter().any(|&(f, l)| r.offset >= f && r.offset <= l) {
                        found += 1;
                        out.push(crate::kafka::client::to_record(&r));
                    }
                }
            }
            let expected: u64 = wanted.iter().map(|(f, l)| (l - f + 1) as u64).sum();
            if found < expected {
                tracing::error!(
                    topic = %topic,
                    partition,
                    expected,
                    found,
                    "replay: the log no longer holds some acknowledged records (retention?); their output is lost"
                );
            }
            let _ = consumer.close().await;
        }
        Ok(out)
    }
}

/// Where the replay of one partition stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplayProgress {
    /// The consumer is past the last wanted offset.
    Done,
    /// Keep polling. `position` is `None` while the consumer resolves a reset: a fetch
    /// was answered out of range (retention deleted the offsets) and looking up the
    /// new position failed for now; the next poll tries again.
    Reading {
        /// The consumer's position, when known.
        position: Option<i64>,
    },
}

/// The replay loop's step from the consumer's `position` of `topic`-`partition` and
/// whether the partition is still `assigned`: done once past `last`. A partition that
/// is no longer assigned has no position ever again; the loop assigned it itself, so
/// that is a shareflow bug (kind Internal), not a reason to read forever.
fn replay_progress(
    position: Option<i64>,
    assigned: bool,
    last: i64,
    topic: &str,
    partition: i32,
) -> Result<ReplayProgress> {
    match position {
        Some(p) if p > last => Ok(ReplayProgress::Done),
        Some(p) => Ok(ReplayProgress::Reading { position: Some(p) }),
        None if assigned => Ok(ReplayProgress::Reading { position: None }),
        None => Err(Error::Internal(format!(
            "the replay of {topic}-{partition} lost its partition: the consumer that assigned it reports no \
             position and no assignment"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_reads_until_past_the_last_wanted_offset() {
        assert_eq!(replay_progress(Some(10), true, 9, "in", 0).unwrap(), ReplayProgress::Done);
        assert_eq!(replay_progress(Some(9), true, 9, "in", 0).unwrap(), ReplayProgress::Reading { position: Some(9) });
        assert_eq!(replay_progress(Some(0), true, -1, "in", 0).unwrap(), ReplayProgress::Done);
    }

    #[test]
    fn an_unknown_position_is_waited_for_not_taken_for_the_first_offset() {
        assert_eq!(replay_progress(None, true, 9, "in", 0).unwrap(), ReplayProgress::Reading { position: None });
    }

    #[test]
    fn a_partition_the_replay_no_longer_holds_is_an_internal_error() {
        let err = replay_progress(None, false, 9, "in", 3).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal);
        assert!(err.to_string().contains("the replay of in-3 lost its partition"), "{err}");
    }

    #[test]
    fn ledger_records_go_to_partition_zero_of_the_ledger_topic() {
        let entry = LedgerEntry::Commit { generation: 1, checkpoint_id: 4, slot: 0 };
        let record = LedgerLog::record("g-job-ledger", &entry).unwrap();
        assert_eq!(record.topic, "g-job-ledger");
        assert_eq!(record.partition, Some(0));
        assert_eq!(LedgerEntry::decode(record.value.as_deref().unwrap_or_default()), Ok(entry));
    }
}
