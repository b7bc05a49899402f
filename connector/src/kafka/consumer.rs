//! [`KafkaShareConsumer`]: the [`ShareConsumer`] contract over the wire to a real Kafka
//! 4.x broker (ShareGroupHeartbeat, ShareFetch with share sessions, ShareAcknowledge).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use krafka::share_consumer::{AcknowledgementMode as KafkaAckMode, ShareConsumer as Inner};
use krafka::ConsumerRecord;

use super::{kafka_error, KafkaCluster};
use crate::error::{Error, ErrorKind, Result};
use crate::share::{AcknowledgeType, MemberId, Record, ShareAcknowledgements, ShareConsumer, TransactionHandle};

/// Settings of a [`KafkaShareConsumer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KafkaShareConsumerConfig {
    /// The share group.
    pub group: String,
    /// Most records one fetch asks for (`max.poll.records`).
    pub max_poll_records: usize,
    /// How long the broker may hold a fetch open waiting for records.
    pub fetch_max_wait: Duration,
}

impl KafkaShareConsumerConfig {
    /// Defaults: 500 records per poll, fetches held up to 100 ms.
    pub fn new(group: &str) -> Self {
        Self { group: group.to_string(), max_poll_records: 500, fetch_max_wait: Duration::from_millis(100) }
    }
}

/// A delivered record's identity. It hashes its offset and partition only, with a
/// multiply-and-rotate hasher: a poll's records differ there, and the topic (one `Arc`
/// shared by every record of a fetch) is compared on a match, by pointer first.
#[derive(Debug, Clone)]
struct Key {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.offset == other.offset
            && self.partition == other.partition
            && (Arc::ptr_eq(&self.topic, &other.topic) || self.topic == other.topic)
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64((self.offset as u64) ^ ((self.partition as u64) << 48));
    }
}

/// The hasher of [`Key`]: one multiplication by an odd constant and a rotation, enough to
/// spread consecutive offsets over a hash table's buckets. Not for untrusted keys: the
/// offsets come from the broker this member polled.
#[derive(Default)]
struct OffsetHasher(u64);

impl std::hash::Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(26);
    }
}

type Delivered = HashMap<Key, ConsumerRecord, std::hash::BuildHasherDefault<OffsetHasher>>;

/// A share-group member on a real Kafka broker, in explicit acknowledgement mode.
///
/// Kafka's rule holds: every record a poll returned must be settled (ACCEPT, RELEASE
/// or REJECT) before the next poll; RENEW keeps the lock and leaves it unsettled.
/// Acknowledgements ride on the next ShareFetch, or go at once with
/// [`commit`](ShareConsumer::commit). KIP-1289 transactional acknowledgement does not
/// exist on stock brokers: [`acknowledge_batches_transactional`](ShareConsumer::acknowledge_batches_transactional)
/// fails with a message saying so.
pub struct KafkaShareConsumer {
    config: KafkaShareConsumerConfig,
    inner: Inner,
    member: MemberId,
    delivered: Delivered,
    /// Records whose partition the group took from this member before they were
    /// settled: in all, and since the last poll.
    revoked: u64,
    revoked_since_poll: u64,
}

impl std::fmt::Debug for KafkaShareConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaShareConsumer")
            .field("group", &self.config.group)
            .field("member", &self.member)
            .field("unsettled", &self.delivered.len())
            .finish_non_exhaustive()
    }
}

impl KafkaShareConsumer {
    /// A member of `config.group` on `cluster`. It joins on [`subscribe`](ShareConsumer::subscribe).
    pub async fn new(cluster: &KafkaCluster, config: KafkaShareConsumerConfig) -> Result<Self> {
        if config.max_poll_records == 0 || config.max_poll_records > i32::MAX as usize {
            return Err(Error::InvalidConfig {
                key: "max.poll.records".into(),
                value: config.max_poll_records.to_string(),
                rule: "must be at least 1".into(),
            });
        }
        // Its own connections, as each Java client has: a share fetch waits up to
        // `fetch_max_wait` for records, and on the job's shared socket the intent
        // writes and the sink's produces would queue behind it.
        let client = cluster.dedicated_client().await?;
        let inner = client
            .share_consumer(config.group.clone())
            .acknowledgement_mode(KafkaAckMode::Explicit)
            .max_poll_records(config.max_poll_records as i32)
            .fetch_max_wait(config.fetch_max_wait)
            .build()
            .await
            .map_err(|e| kafka_error(format!("create share consumer of group {}", config.group), e))?;
        Ok(Self {
            config,
            inner,
            member: MemberId(String::new()),
            delivered: Delivered::default(),
            revoked: 0,
            revoked_since_poll: 0,
        })
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.config.group
    }

    /// Records delivered and not settled yet.
    pub fn unsettled(&self) -> usize {
        self.delivered.len()
    }

    /// The partitions the group's coordinator assigned this member, by topic: empty
    /// until a heartbeat brought an assignment. A new share group assigns a partition
    /// only once its state is initialised, so a member's first assignment can take one
    /// heartbeat interval.
    pub fn assignment(&self) -> std::collections::BTreeMap<String, Vec<i32>> {
        self.inner
            .assignment()
            .into_iter()
            .map(|(topic, mut partitions)| {
                partitions.sort_unstable();
                (topic, partitions)
            })
            .collect()
    }

    /// Records delivered to this member whose partition the group then assigned
    /// elsewhere before they were settled (another member joined, say). Their
    /// acknowledgements cannot be sent any more: each one settled them locally, and the
    /// broker gives them back to the group, delivery count raised, when their locks
    /// expire. The exactly-once source covers them through its ledger.
    pub fn revoked_unsettled(&self) -> u64 {
        self.revoked
    }

    /// The member epoch the coordinator last gave this member: 0 before it joined (and
    /// while it rejoins after a fence). A member's epoch is the group epoch of the
    /// assignment it holds, so a member whose epoch is below another's holds an
    /// assignment that does not count the members that joined since.
    pub fn member_epoch(&self) -> i32 {
        self.inner.member_epoch()
    }

    /// Sends a heartbeat at once rather than at the next interval, and installs the
    /// assignment it brings: a member learns of a newer assignment without waiting up to
    /// a heartbeat interval (5 s by default). For use before the first poll, as
    /// [`JoinGate`](super::JoinGate) does: partitions taken away by it lose no records
    /// then.
    pub async fn heartbeat_now(&mut self) -> Result<()> {
        let topics = self.inner.subscription();
        if topics.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "group {}: heartbeat before subscribe; subscribe to the topics first",
                self.config.group
            )));
        }
        // Subscribing again to the same topics sends the joining heartbeat with the
        // current member id and epoch: the coordinator answers with the member's
        // current assignment, and the group epoch does not change.
        self.inner
            .subscribe(topics.iter())
            .await
            .map_err(|e| kafka_error(format!("heartbeat in group {}", self.config.group), e))
    }

    /// The acquisition lock duration the broker reported, once known.
    pub fn lock_duration(&self) -> Option<Duration> {
        self.inner.acquisition_lock_timeout()
    }

    /// Sends buffered acknowledgements and returns the partitions whose
    /// acknowledgements the broker refused, with the reason (a lock that expired:
    /// INVALID_RECORD_STATE). Transport failures are errors.
    pub async fn commit_outcome(&mut self) -> Result<Vec<(String, i32, String)>> {
        let results = self
            .inner
            .commit()
            .await
            .map_err(|e| kafka_error(format!("acknowledge in group {}", self.config.group), e))?;
        let mut refused = Vec::new();
        for (tp, r) in results {
            if let Err(e) = r {
                refused.push((tp.topic.to_string(), tp.partition, e.to_string()));
            }
        }
        Ok(refused)
    }

    /// True while `record`, delivered by the last poll, is not settled: not accepted,
    /// released or rejected, and its partition not taken away.
    pub fn is_unsettled(&self, record: &Record) -> bool {
        self.delivered.contains_key(&Self::key(record))
    }

    /// True when `record`'s partition was taken from this member while it stayed a
    /// member: its locks then stay held until they expire. A fenced member's locks are
    /// released at once, so a fence must not pass for this: the member epoch is 0 until
    /// it rejoins, and a rejoined member that holds the partition again is no match
    /// either (both fail as before). A fence and a rejoin to an assignment without the
    /// partition, all between this poll and this acknowledgement, cannot be told apart
    /// from a move.
    fn revoked_partition(&self, record: &Record) -> bool {
        self.inner.member_epoch() > 0
            && !self
                .inner
                .assignment()
                .get(record.topic.as_ref())
                .is_some_and(|partitions| partitions.contains(&record.partition))
    }

    fn key(record: &Record) -> Key {
        Key { topic: record.topic.clone(), partition: record.partition, offset: record.offset }
    }
}

fn to_record(r: &ConsumerRecord) -> Record {
    Record {
        // The fetch's own topic name: every record of it shares the one allocation.
        topic: r.topic.clone(),
        partition: r.partition,
        offset: r.offset,
        key: r.key.clone(),
        value: r.value.clone(),
        timestamp_ms: r.timestamp,
        delivery_count: r.delivery_count.unwrap_or(1),
    }
}

#[async_trait]
impl ShareConsumer for KafkaShareConsumer {
    fn member_id(&self) -> &MemberId {
        &self.member
    }

    async fn subscribe(&mut self, topics: &[&str]) -> Result<()> {
        self.inner
            .subscribe(topics.iter().copied())
            .await
            .map_err(|e| kafka_error(format!("subscribe group {} to {topics:?}", self.config.group), e))?;
        self.member = MemberId(self.inner.member_id());
        Ok(())
    }

    async fn poll(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<Record>> {
        if self.revoked_since_poll > 0 {
            tracing::info!(
                group = %self.config.group,
                records = self.revoked_since_poll,
                "records of partitions assigned to another member before they were settled; the broker gives them \
                 back when their locks expire"
            );
            self.revoked_since_poll = 0;
        }
        if !self.delivered.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "group {}: {} records of the previous poll are not settled; ACCEPT, RELEASE or REJECT each before polling again",
                self.config.group,
                self.delivered.len()
            )));
        }
        let got = self
            .inner
            .poll(timeout)
            .await
            .map_err(|e| kafka_error(format!("poll share group {}", self.config.group), e))?;
        if max_records < got.len() {
            tracing::debug!(max_records, got = got.len(), "poll returned more than asked; max.poll.records rules");
        }
        let member = self.inner.member_id();
        if member != self.member.0 {
            self.member = MemberId(member);
        }
        let mut out = Vec::with_capacity(got.len());
        self.delivered.reserve(got.len());
        for r in got {
            let rec = to_record(&r);
            self.delivered.insert(Self::key(&rec), r);
            out.push(rec);
        }
        Ok(out)
    }

    async fn acknowledge(&mut self, record: &Record, ack_type: AcknowledgeType) -> Result<()> {
        let key = Self::key(record);
        let Some(delivered) = self.delivered.get(&key) else {
            return Err(Error::InvalidRequest(format!(
                "group {}: {}-{}@{} was not delivered to this member by its last poll, or is settled already",
                self.config.group, record.topic, record.partition, record.offset
            )));
        };
        let sent = match ack_type {
            AcknowledgeType::Accept => self.inner.ack(delivered),
            AcknowledgeType::Release => self.inner.release(delivered),
            AcknowledgeType::Reject => self.inner.reject(delivered),
            AcknowledgeType::Renew => self.inner.renew(delivered),
        };
        match sent {
            Ok(()) => {}
            // The client forgets the unsettled records of a partition the group took
            // away; nothing can settle them but their locks' expiry.
            Err(krafka::KrafkaError::IllegalState { .. }) if self.revoked_partition(record) => {
                self.delivered.remove(&key);
                self.revoked += 1;
                self.revoked_since_poll += 1;
                return Ok(());
            }
            Err(e) => {
                let op = format!(
                    "{ack_type} {}-{}@{} in group {}",
                    record.topic, record.partition, record.offset, self.config.group
                );
                return Err(kafka_error(op, e));
            }
        }
        if ack_type != AcknowledgeType::Renew {
            self.delivered.remove(&key);
        }
        Ok(())
    }

    async fn acknowledge_batches_transactional(
        &mut self,
        acks: &ShareAcknowledgements,
        txn: &TransactionHandle,
    ) -> Result<()> {
        Err(Error::Kafka {
            op: format!("acknowledge {} records into {}", acks.record_count(), txn.id),
            reason: "stock Kafka brokers do not implement KIP-1289 transactional acknowledgements; \
                     use KafkaShareSource with KafkaTransactions, which reaches exactly-once through the ledger"
                .into(),
            kind: ErrorKind::Invalid,
            source: None,
        })
    }

    async fn commit(&mut self) -> Result<()> {
        let refused = self.commit_outcome().await?;
        if let Some((topic, partition, reason)) = refused.first() {
            return Err(Error::Kafka {
                op: format!("acknowledge {topic}-{partition} in group {}", self.config.group),
                reason: format!("the broker refused it: {reason} (did the acquisition lock expire?)"),
                kind: ErrorKind::Invalid,
                source: None,
            });
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        // Unsettled records go back at once rather than waiting for their locks.
        let unsettled: Vec<ConsumerRecord> = self.delivered.drain().map(|(_, r)| r).collect();
        for r in &unsettled {
            let _ = self.inner.release(r);
        }
        self.inner.close().await.map_err(|e| kafka_error(format!("close member of group {}", self.config.group), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(topic: &str, partition: i32, offset: i64) -> Key {
        Key { topic: Arc::from(topic), partition, offset }
    }

    #[test]
    fn a_delivered_record_is_found_by_topic_partition_and_offset() {
        let mut delivered: HashMap<Key, u32, std::hash::BuildHasherDefault<OffsetHasher>> = HashMap::default();
        let shared: Arc<str> = Arc::from("orders");
        for partition in 0..4 {
            for offset in 0..2_000 {
                delivered.insert(Key { topic: shared.clone(), partition, offset }, 1);
                delivered.insert(key("payments", partition, offset), 2);
            }
        }
        assert_eq!(delivered.len(), 16_000, "two topics with the same partitions and offsets are distinct");
        #[rustfmt::skip]
        let cases: &[(&str, Key, Option<u32>)] = &[
            ("the fetch's own topic",                      Key { topic: shared.clone(), partition: 3, offset: 1_999 }, Some(1)),
            ("an equal topic name in another allocation",  key("orders", 3, 1_999),   Some(1)),
            ("the other topic",                            key("payments", 0, 0),     Some(2)),
            ("an offset never delivered",                  key("orders", 0, 2_000),   None),
            ("a partition never delivered",                key("orders", 4, 0),       None),
            ("a topic never delivered",                    key("refunds", 0, 0),      None),
        ];
        for (case, k, want) in cases {
            assert_eq!(delivered.get(k).copied(), *want, "{case}: {k:?}");
        }
    }
}
