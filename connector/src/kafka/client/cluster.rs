//! [`KafkaCluster`]: one connection handle to a Kafka cluster, with the admin calls the
//! connector needs and bounded reads of topics. The transaction calls recovery needs are
//! in `txn_admin`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use krafka::admin::{
    AdminClient, ConfigOp, ConfigResource, DeleteRecordsOptions, DescribeConfigsOptions,
    DescribeShareGroupOffsetsOptions, IncrementalAlterConfigsOptions, ListOffsetsOptions, NewTopic, OffsetSpec,
    TopicPartition,
};
use krafka::producer::{DeliveryHandle, Producer};
use krafka::Kafka;

use super::kafka_error;
use shareflow_share::{Error, ErrorKind, Result};

/// How long a fetch of a bounded read (up to end offsets known in advance) may wait at
/// the log end. Short: such a fetch shares the job's socket, and the broker serves that
/// socket's produces and commits only after it.
pub(crate) const BOUNDED_READ_WAIT: Duration = Duration::from_millis(10);

/// Output producers' batches: one batch per partition is in flight at a time, so small
/// batches cap throughput at batch / round trip. 1 MiB matches the broker's default
/// fetch size.
pub(crate) const OUTPUT_BATCH_BYTES: usize = 1 << 20;
/// How long an output producer waits to fill a batch.
pub(crate) const OUTPUT_LINGER: Duration = Duration::from_millis(2);

/// A connected Kafka cluster: the client handle every consumer and producer of a job
/// shares, plus an admin client.
#[derive(Clone)]
pub struct KafkaCluster {
    bootstrap: String,
    pub(crate) kafka: Kafka,
    pub(crate) admin: std::sync::Arc<AdminClient>,
}

impl std::fmt::Debug for KafkaCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaCluster").field("bootstrap", &self.bootstrap).finish_non_exhaustive()
    }
}

/// How far a share group is from done on one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShareGroupBacklog {
    /// Records at or after the share-partition start offsets, summed over partitions.
    pub records: u64,
    /// Partitions whose start offset the group has not initialised yet.
    pub uninitialised_partitions: u32,
}

/// One partition of a topic as a share group stands on it, as far as Kafka tells: the
/// share partition's start offset and lag, not the state of each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharePartitionOffsets {
    /// The partition.
    pub partition: i32,
    /// The share-partition start offset; `None` until the group initialised it.
    pub start_offset: Option<i64>,
    /// One past the partition's last offset.
    pub end_offset: i64,
    /// Records at or after the start offset not yet acknowledged or archived (KIP-1226),
    /// if the broker tells.
    pub lag: Option<i64>,
}

impl SharePartitionOffsets {
    /// Records the group has not finished: the lag, or without it every record from the
    /// start offset on (which the coordinator persists lazily, so it lags behind);
    /// `None` while the start offset is not initialised.
    pub fn unfinished(&self) -> Option<u64> {
        match (self.lag, self.start_offset) {
            (Some(lag), _) => Some(lag as u64),
            (None, Some(start)) => Some((self.end_offset - start).max(0) as u64),
            (None, None) => None,
        }
    }
}

impl ShareGroupBacklog {
    /// True when every record of every partition is acknowledged or archived.
    pub fn drained(&self) -> bool {
        self.records == 0 && self.uninitialised_partitions == 0
    }
}

impl KafkaCluster {
    /// Connects to `bootstrap` (`host:port[,host:port...]`). Fails with kind Unavailable,
    /// naming the address, when no broker answers.
    pub async fn connect(bootstrap: &str) -> Result<Self> {
        if bootstrap.trim().is_empty() {
            return Err(Error::InvalidConfig {
                key: "bootstrap.servers".into(),
                value: bootstrap.into(),
                rule: "name at least one broker as host:port".into(),
            });
        }
        let kafka = Self::handle(bootstrap).await?;
        let admin = std::sync::Arc::new(kafka.admin());
        Ok(Self { bootstrap: bootstrap.to_string(), kafka, admin })
    }

    async fn handle(bootstrap: &str) -> Result<Kafka> {
        Kafka::builder(bootstrap)
            .client_id("shareflow")
            .connect_timeout(Duration::from_secs(5))
            .request_timeout(Duration::from_secs(30))
            .allow_auto_create_topics(false)
            .connect()
            .await
            .map_err(|e| kafka_error(format!("connect to {bootstrap}"), e))
    }

    /// A client handle with connections of its own: for a reader that long-polls, or
    /// for small writes whose latency matters.
    ///
    /// The broker reads one request per connection at a time, and a handle keeps one
    /// data connection per broker: a fetch that waits for new records, or the bulk
    /// output's large produce requests, would hold every other request of the job
    /// behind them on that socket.
    pub(crate) async fn dedicated_client(&self) -> Result<Kafka> {
        Self::handle(&self.bootstrap).await
    }

    /// The bootstrap servers.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The client handle.
    pub(crate) fn client(&self) -> &Kafka {
        &self.kafka
    }

    /// Creates `topic` with `partitions` partitions unless it exists. `configs` are topic
    /// configs (`cleanup.policy`, ...).
    pub async fn ensure_topic(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) -> Result<()> {
        let mut new =
            NewTopic::new(topic, partitions, 1).map_err(|e| kafka_error(format!("create topic {topic}"), e))?;
        for (k, v) in configs {
            new.configs.insert((*k).to_string(), (*v).to_string());
        }
        let results = self
            .admin
            .create_topics([new], Default::default())
            .await
            .map_err(|e| kafka_error(format!("create topic {topic}"), e))?;
        match results.into_values().next() {
            Some(Err(krafka::KrafkaError::Broker { code: krafka::error::ErrorCode::TopicAlreadyExists, .. })) => Ok(()),
            Some(Err(e)) => Err(kafka_error(format!("create topic {topic}"), e)),
            _ => {
                self.wait_for_topic(topic).await?;
                Ok(())
            }
        }
    }

    async fn wait_for_topic(&self, topic: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self.partitions(topic).await {
                Ok(p) if p > 0 => return Ok(()),
                _ if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                Ok(_) => return Err(Error::UnknownTopicPartition { topic: topic.into(), partition: -1 }),
                Err(e) => return Err(e),
            }
        }
    }

    /// The names of every topic of the cluster (internal ones excluded).
    pub async fn topics(&self) -> Result<Vec<String>> {
        self.admin.list_topics(Default::default()).await.map_err(|e| kafka_error("list topics", e))
    }

    /// Deletes topics, ignoring those that do not exist.
    pub async fn delete_topics(&self, topics: &[&str]) -> Result<()> {
        self.admin
            .delete_topics(topics.iter().copied(), Default::default())
            .await
            .map_err(|e| kafka_error(format!("delete topics {topics:?}"), e))?;
        Ok(())
    }

    /// The number of partitions of `topic`.
    pub async fn partitions(&self, topic: &str) -> Result<i32> {
        let described = self
            .admin
            .describe_topics([topic], Default::default())
            .await
            .map_err(|e| kafka_error(format!("describe topic {topic}"), e))?;
        match described.into_values().next() {
            Some(Ok(d)) => Ok(d.partitions.len() as i32),
            Some(Err(krafka::KrafkaError::Broker {
                code: krafka::error::ErrorCode::UnknownTopicOrPartition, ..
            })) => Err(Error::UnknownTopicPartition { topic: topic.into(), partition: -1 }),
            Some(Err(e)) => Err(kafka_error(format!("describe topic {topic}"), e)),
            None => Err(Error::UnknownTopicPartition { topic: topic.into(), partition: -1 }),
        }
    }

    /// Sets share-group configs (`share.auto.offset.reset`, `share.record.lock.duration.ms`,
    /// ...) on `group`.
    pub async fn set_group_configs(&self, group: &str, configs: &[(&str, &str)]) -> Result<()> {
        let ops = configs.iter().map(|(k, v)| ConfigOp::set(*k, *v)).collect();
        let results = self
            .admin
            .incremental_alter_configs([(ConfigResource::group(group), ops)], IncrementalAlterConfigsOptions::default())
            .await
            .map_err(|e| kafka_error(format!("set configs of group {group}"), e))?;
        for (_, r) in results {
            r.map_err(|e| kafka_error(format!("set configs {configs:?} of group {group}"), e))?;
        }
        Ok(())
    }

    /// The delivery limit of share group `group`: its own `share.delivery.count.limit`
    /// if set, else the broker's `group.share.delivery.count.limit`, else Kafka's
    /// default, 5.
    pub async fn share_delivery_limit(&self, group: &str) -> Result<u32> {
        let described = self
            .admin
            .describe_configs([ConfigResource::group(group)], DescribeConfigsOptions::default())
            .await
            .map_err(|e| kafka_error(format!("describe configs of group {group}"), e))?;
        for (_, r) in described {
            let entries = r.map_err(|e| kafka_error(format!("describe configs of group {group}"), e))?;
            let own = entries.iter().find(|c| c.name == "share.delivery.count.limit");
            if let Some(limit) = own.and_then(|c| c.value.as_deref()).and_then(|v| v.parse().ok()) {
                return Ok(limit);
            }
        }
        let broker = self.broker_config("group.share.delivery.count.limit").await?;
        Ok(broker.and_then(|v| v.parse().ok()).unwrap_or(5))
    }

    /// A broker config value, from broker `0`..: the first broker that answers.
    pub async fn broker_config(&self, key: &str) -> Result<Option<String>> {
        let brokers =
            self.admin.describe_cluster(Default::default()).await.map_err(|e| kafka_error("describe cluster", e))?;
        let Some(node) = brokers.brokers.first() else { return Ok(None) };
        let described = self
            .admin
            .describe_configs([ConfigResource::broker(node.id)], DescribeConfigsOptions::default())
            .await
            .map_err(|e| kafka_error(format!("describe config {key} of broker {}", node.id), e))?;
        for (_, r) in described {
            let entries = r.map_err(|e| kafka_error(format!("describe config {key}"), e))?;
            if let Some(entry) = entries.iter().find(|c| c.name == key) {
                return Ok(entry.value.clone());
            }
        }
        Ok(None)
    }

    /// The high watermark (`read_committed`: the last stable offset) of each partition.
    pub async fn end_offsets(&self, topic: &str, read_committed: bool) -> Result<Vec<i64>> {
        self.list_offsets(topic, OffsetSpec::Latest, read_committed).await
    }

    /// The log start offset of every partition of `topic`, in partition order: what
    /// retention or a trim of the ledger left.
    pub async fn start_offsets(&self, topic: &str) -> Result<Vec<i64>> {
        self.list_offsets(topic, OffsetSpec::Earliest, false).await
    }

    async fn list_offsets(&self, topic: &str, spec: OffsetSpec, read_committed: bool) -> Result<Vec<i64>> {
        let n = self.partitions(topic).await?;
        let specs = (0..n).map(|p| (TopicPartition::new(topic, p), spec));
        let options = ListOffsetsOptions::default().read_committed(read_committed);
        let listed = self
            .admin
            .list_offsets(specs, options)
            .await
            .map_err(|e| kafka_error(format!("list offsets of {topic}"), e))?;
        let mut ends = vec![0; n as usize];
        for (tp, r) in listed {
            let o = r.map_err(|e| kafka_error(format!("list offsets of {}-{}", tp.topic, tp.partition), e))?;
            if let Some(slot) = ends.get_mut(tp.partition as usize) {
                *slot = o.offset;
            }
        }
        Ok(ends)
    }

    /// Deletes the records of `topic`-`partition` below offset `before` (Kafka's
    /// DeleteRecords: the log start offset moves up to it) and returns the new log start.
    pub(crate) async fn delete_records(&self, topic: &str, partition: i32, before: i64) -> Result<i64> {
        let op = || format!("delete the records of {topic}-{partition} below offset {before}");
        let deleted = self
            .admin
            .delete_records([(TopicPartition::new(topic, partition), before)], DeleteRecordsOptions::default())
            .await
            .map_err(|e| kafka_error(op(), e))?;
        match deleted.into_iter().next() {
            Some((_, r)) => r.map_err(|e| kafka_error(op(), e)),
            None => Err(Error::kafka(op(), "the broker answered for no partition", ErrorKind::Internal)),
        }
    }

    /// Waits until no transaction holds `topic` open (every partition's last stable
    /// offset equals its end), at most `timeout`. Returns whether it got there. A
    /// commit returns before its markers are written, so a reader that must see it
    /// waits here first.
    pub async fn wait_stable(&self, topic: &str, timeout: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.end_offsets(topic, false).await? == self.end_offsets(topic, true).await? {
                return Ok(true);
            }
            if tokio::time::Instant::now() > deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many records of `topic` the share group `group` has not finished yet.
    pub async fn share_group_backlog(&self, group: &str, topic: &str) -> Result<ShareGroupBacklog> {
        let mut backlog = ShareGroupBacklog::default();
        for p in self.share_group_partitions(group, topic).await? {
            match p.unfinished() {
                Some(n) => backlog.records += n,
                None if p.end_offset == 0 => {}
                None => backlog.uninitialised_partitions += 1,
            }
        }
        Ok(backlog)
    }

    /// Each partition of `topic` as the share group `group` stands on it: what the broker
    /// tells of a share partition (its start offset and lag), beside the log's end.
    pub async fn share_group_partitions(&self, group: &str, topic: &str) -> Result<Vec<SharePartitionOffsets>> {
        let ends = self.end_offsets(topic, false).await?;
        let options = DescribeShareGroupOffsetsOptions::default()
            .partitions((0..ends.len() as i32).map(|p| TopicPartition::new(topic, p)).collect());
        let described = self
            .admin
            .describe_share_group_offsets(group, options)
            .await
            .map_err(|e| kafka_error(format!("describe offsets of share group {group}"), e))?;
        let by_partition: HashMap<i32, (i64, Option<i64>)> = described
            .into_iter()
            .filter_map(|(tp, r)| r.ok().map(|o| (tp.partition, (o.start_offset, o.lag))))
            .collect();
        Ok(ends
            .iter()
            .enumerate()
            .map(|(p, &end_offset)| {
                let (start, lag) = by_partition.get(&(p as i32)).copied().unwrap_or((-1, None));
                SharePartitionOffsets {
                    partition: p as i32,
                    start_offset: (start >= 0).then_some(start),
                    end_offset,
                    lag: lag.filter(|l| *l >= 0),
                }
            })
            .collect())
    }

    /// Produces `(key, value)` records to `topic` with an idempotent producer and waits
    /// until all are acknowledged. For loading input.
    pub async fn produce(&self, topic: &str, records: impl IntoIterator<Item = (Option<Bytes>, Bytes)>) -> Result<u64> {
        let mut writer = self.writer(topic).await?;
        writer.send(records).await?;
        writer.close().await
    }

    /// A [`TopicWriter`] to `topic`: an idempotent producer of its own, outside any
    /// transaction, batching as the Kafka sink does (1 MiB batches, 2 ms linger), on a
    /// connection of its own so that its bulk writes do not hold up the job's other
    /// requests. For loading input and for tools; a job's output goes through
    /// [`KafkaSink`](super::KafkaSink).
    pub async fn writer(&self, topic: &str) -> Result<TopicWriter> {
        let producer = self.idempotent_producer(OUTPUT_LINGER, OUTPUT_BATCH_BYTES, true).await?;
        Ok(TopicWriter { topic: topic.to_string(), producer, pending: Vec::new(), written: 0, failed: None })
    }

    /// Reads every committed record of `topic` (read_committed, from the beginning to the
    /// last stable offset) as `(partition, offset, key, value)`.
    pub async fn read_committed(&self, topic: &str) -> Result<Vec<(i32, i64, Option<Bytes>, Option<Bytes>)>> {
        self.read_topic(topic, true).await
    }

    /// Reads every record of `topic` from the beginning to its end: the last stable
    /// offset with `read_committed`, else the high watermark (open transactions
    /// included). Gives up only when 60 s pass without progress.
    pub async fn read_topic(
        &self,
        topic: &str,
        read_committed: bool,
    ) -> Result<Vec<(i32, i64, Option<Bytes>, Option<Bytes>)>> {
        Ok(self.read_topic_from(topic, read_committed, &[]).await?.0)
    }

    /// Reads the committed records of `topic` from offset `from[p]` of each partition `p`
    /// (0 past the end of `from`) to the last stable offset, as `(partition, offset,
    /// key, value)`, and returns those end offsets: pass them as `from` next time to
    /// read only what was committed since.
    pub async fn read_committed_from(
        &self,
        topic: &str,
        from: &[i64],
    ) -> Result<(Vec<(i32, i64, Option<Bytes>, Option<Bytes>)>, Vec<i64>)> {
        self.read_topic_from(topic, true, from).await
    }

    pub(crate) async fn read_topic_from(
        &self,
        topic: &str,
        read_committed: bool,
        from: &[i64],
    ) -> Result<(Vec<(i32, i64, Option<Bytes>, Option<Bytes>)>, Vec<i64>)> {
        let (records, ends) = self.read_records_from(topic, read_committed, from).await?;
        Ok((records.into_iter().map(|r| (r.partition, r.offset, r.key, r.value)).collect(), ends))
    }

    /// Like [`read_committed_from`](Self::read_committed_from), whole records: headers
    /// and timestamps too (a dead-letter topic's KIP-1191 headers, for `shareflow dlq`).
    pub async fn read_committed_records_from(
        &self,
        topic: &str,
        from: &[i64],
    ) -> Result<(Vec<shareflow_share::Record>, Vec<i64>)> {
        let (records, ends) = self.read_records_from(topic, true, from).await?;
        let records = records.iter().map(super::to_record).collect();
        Ok((records, ends))
    }

    async fn read_records_from(
        &self,
        topic: &str,
        read_committed: bool,
        from: &[i64],
    ) -> Result<(Vec<krafka::consumer::ConsumerRecord>, Vec<i64>)> {
        let ends = self.end_offsets(topic, read_committed).await?;
        let start = |p: i32| from.get(p as usize).copied().unwrap_or(0);
        if (0i32..).zip(&ends).all(|(p, end)| start(p) >= *end) {
            return Ok((Vec::new(), ends));
        }
        let isolation = if read_committed {
            krafka::consumer::IsolationLevel::ReadCommitted
        } else {
            krafka::consumer::IsolationLevel::ReadUncommitted
        };
        let consumer = self
            .kafka
            .consumer_without_group()
            .isolation_level(isolation)
            .fetch_max_wait(BOUNDED_READ_WAIT)
            .build()
            .await
            .map_err(|e| kafka_error(format!("read {topic}"), e))?;
        consumer
            .assign(topic, (0..ends.len() as i32).collect())
            .await
            .map_err(|e| kafka_error(format!("assign {topic}"), e))?;
        for p in 0..ends.len() as i32 {
            match start(p) {
                0 => consumer.seek_to_beginning(topic, p).await,
                offset => consumer.seek(topic, p, offset).await,
            }
            .map_err(|e| kafka_error(format!("seek {topic}-{p}"), e))?;
        }
        let mut out = Vec::new();
        let stall = Duration::from_secs(60);
        let mut last_progress = tokio::time::Instant::now();
        let mut last_total = -1i64;
        loop {
            let (done, total, unresolved) = read_progress(&ends, |p| consumer.position(topic, p)).await;
            if done {
                break;
            }
            if total > last_total {
                last_total = total;
                last_progress = tokio::time::Instant::now();
            } else if last_progress.elapsed() > stall {
                return Err(stalled(topic, &ends, &unresolved, stall));
            }
            for r in
                consumer.poll(Duration::from_millis(200)).await.map_err(|e| kafka_error(format!("read {topic}"), e))?
            {
                let end = ends.get(r.partition as usize).copied().unwrap_or(0);
                if r.offset < end {
                    out.push(r);
                }
            }
        }
        consumer.close().await.map_err(|e| kafka_error("close consumer", e))?;
        Ok((out, ends))
    }
}

/// How far a read of partitions `0..ends.len()` got: whether every partition reached its
/// end offset, the sum of the positions known (progress), and the partitions with
/// something to read whose position the client could not resolve yet. An unresolved
/// position (the seek to the beginning resolves lazily, and its lookup may fail for a
/// while) is neither done nor progress: the next poll retries it, and if it never
/// resolves, the stall error names the partition instead of counting it as offset 0.
async fn read_progress<F, Fut>(ends: &[i64], mut position: F) -> (bool, i64, Vec<i32>)
where
    F: FnMut(i32) -> Fut,
    Fut: std::future::Future<Output = Option<i64>>,
{
    let mut done = true;
    let mut total = 0i64;
    let mut unresolved = Vec::new();
    for (p, end) in (0i32..).zip(ends.iter()) {
        match position(p).await {
            Some(pos) => {
                done &= pos >= *end;
                total += pos;
            }
            // An empty partition has nothing to read, position or not.
            None if *end <= 0 => {}
            None => {
                done = false;
                unresolved.push(p);
            }
        }
    }
    (done, total, unresolved)
}

/// The error of a read of `topic` that made no progress for `stall`, naming the
/// partitions that never got a read position.
fn stalled(topic: &str, ends: &[i64], unresolved: &[i32], stall: Duration) -> Error {
    let positions = if unresolved.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = unresolved.iter().map(|p| format!("{topic}-{p}")).collect();
        format!(
            "; partitions {} never got a read position (not assigned, or their leader is unavailable)",
            names.join(", ")
        )
    };
    Error::kafka(
        format!("read {topic}"),
        format!("no progress towards the end offsets {ends:?} for {stall:?}{positions}; is the broker healthy?"),
        ErrorKind::Unavailable,
    )
}

impl KafkaCluster {
    /// An idempotent, non-transactional producer with these batching settings, on the
    /// job's shared connection or, with `own_connection`, on a connection of its own.
    pub(crate) async fn idempotent_producer(
        &self,
        linger: Duration,
        batch_bytes: usize,
        own_connection: bool,
    ) -> Result<Producer> {
        let client = if own_connection { self.dedicated_client().await? } else { self.kafka.clone() };
        client
            .producer()
            .idempotent(true)
            .linger(linger)
            .batch_size(batch_bytes)
            .build()
            .await
            .map_err(|e| kafka_error("build the idempotent producer", e))
    }
}

/// Writes records to one topic at the pace of its producer: [`send`](Self::send) queues
/// them and returns, [`flush`](Self::flush) and [`close`](Self::close) wait until the
/// broker acknowledged every one.
///
/// It keeps one delivery handle per record until the next `flush`, so flush now and
/// then when writing millions. Delivery gets the producer's own retries and no more.
/// After an error the writer refuses further calls: which of the records since the last
/// successful `flush` reached the topic is unknown, and writing them again may write
/// some twice. Drop it, read the topic if it matters, and start a new one.
pub struct TopicWriter {
    topic: String,
    producer: Producer,
    pending: Vec<DeliveryHandle>,
    written: u64,
    failed: Option<String>,
}

impl std::fmt::Debug for TopicWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicWriter")
            .field("topic", &self.topic)
            .field("pending", &self.pending.len())
            .field("written", &self.written)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl TopicWriter {
    /// Queues `(key, value)` records. It waits for the topic's metadata the first time
    /// and for the producer's buffer memory when that is full, nothing else.
    pub async fn send(&mut self, records: impl IntoIterator<Item = (Option<Bytes>, Bytes)>) -> Result<()> {
        self.usable()?;
        let topic = self.topic.as_str();
        let records = records.into_iter().map(|(key, value)| {
            let r = krafka::Record::new(topic, value);
            match key {
                Some(k) => r.key(k),
                None => r,
            }
        });
        let producer = &self.producer;
        let outcome = enqueue_into(records, "", |r| producer.enqueue(r), &mut self.pending).await;
        outcome.map_err(|e| self.fail(e))
    }

    /// Waits until every record queued so far is acknowledged, and returns how many
    /// this writer wrote in all.
    pub async fn flush(&mut self) -> Result<u64> {
        self.usable()?;
        let pending = std::mem::take(&mut self.pending);
        let n = pending.len() as u64;
        await_all(pending, &format!("records to {}", self.topic)).await.map_err(|e| self.fail(e))?;
        self.written += n;
        Ok(self.written)
    }

    /// [`flush`](Self::flush)es, closes the producer, and returns how many records
    /// this writer wrote.
    pub async fn close(mut self) -> Result<u64> {
        let written = self.flush().await?;
        self.producer.close().await.map_err(|e| kafka_error("close producer", e))?;
        Ok(written)
    }

    fn usable(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(first) => Err(Error::InvalidRequest(format!(
                "the writer to {} failed earlier ({first}); which records since its last flush reached the topic \
                 is unknown: drop it and start a new writer",
                self.topic
            ))),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        self.failed.get_or_insert_with(|| e.to_string());
        e
    }
}

/// Queues `records` with `enqueue`, one producer's `enqueue`; `context` ends the error
/// message (" in T(n)").
pub(crate) async fn enqueue_all<F, Fut>(
    records: impl IntoIterator<Item = krafka::Record>,
    context: &str,
    enqueue: F,
) -> Result<Vec<DeliveryHandle>>
where
    F: Fn(krafka::Record) -> Fut,
    Fut: std::future::Future<Output = krafka::Result<DeliveryHandle>>,
{
    let mut handles = Vec::new();
    enqueue_into(records, context, enqueue, &mut handles).await?;
    Ok(handles)
}

/// [`enqueue_all`] into `handles`, which keeps the handles of the records queued before
/// a failure.
async fn enqueue_into<F, Fut>(
    records: impl IntoIterator<Item = krafka::Record>,
    context: &str,
    enqueue: F,
    handles: &mut Vec<DeliveryHandle>,
) -> Result<()>
where
    F: Fn(krafka::Record) -> Fut,
    Fut: std::future::Future<Output = krafka::Result<DeliveryHandle>>,
{
    let records = records.into_iter();
    handles.reserve(records.size_hint().0);
    // The topic for the error, copied only when it changes (most calls write one topic).
    let mut topic = String::new();
    for r in records {
        if r.topic != topic {
            topic.clone_from(&r.topic);
        }
        handles.push(enqueue(r).await.map_err(|e| kafka_error(format!("write to {topic}{context}"), e))?);
    }
    Ok(())
}

/// Waits until the broker acknowledged every record of `handles`; `what` names them in
/// the error.
pub(crate) async fn await_all(handles: Vec<DeliveryHandle>, what: &str) -> Result<()> {
    for h in handles {
        let _ = h.await.map_err(|e| kafka_error(format!("deliver {what}"), e))?;
    }
    Ok(())
}

/// One idempotent producer, built on first use and shared after that.
pub(crate) struct CachedProducer {
    slot: tokio::sync::Mutex<Option<Arc<Producer>>>,
    linger: Duration,
    batch_bytes: usize,
    own_connection: bool,
}

impl std::fmt::Debug for CachedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedProducer")
            .field("linger", &self.linger)
            .field("batch_bytes", &self.batch_bytes)
            .field("own_connection", &self.own_connection)
            .finish_non_exhaustive()
    }
}

impl CachedProducer {
    /// A slot whose producer waits `linger` to fill batches of `batch_bytes`.
    pub(crate) fn new(linger: Duration, batch_bytes: usize) -> Self {
        Self { slot: tokio::sync::Mutex::new(None), linger, batch_bytes, own_connection: false }
    }

    /// The same, on a connection of its own: for small writes whose latency matters,
    /// which on the shared connection would wait behind the bulk output's requests
    /// (the broker answers one connection's requests in order).
    pub(crate) fn own_connection(linger: Duration, batch_bytes: usize) -> Self {
        Self { own_connection: true, ..Self::new(linger, batch_bytes) }
    }

    /// The producer, built on `cluster` by the first call.
    pub(crate) async fn get(&self, cluster: &KafkaCluster) -> Result<Arc<Producer>> {
        let mut g = self.slot.lock().await;
        if let Some(p) = g.as_ref() {
            return Ok(p.clone());
        }
        let p = Arc::new(cluster.idempotent_producer(self.linger, self.batch_bytes, self.own_connection).await?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// Closes the producer, if one was built, waiting at most `limit` for what it still
    /// sends; the next [`get`](Self::get) builds a new one.
    pub(crate) async fn close(&self, limit: Duration) {
        let taken = self.slot.lock().await.take();
        if let Some(p) = taken {
            let _ = p.close_with(krafka::CloseOptions::new().timeout(limit)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(ends: &[i64], positions: &[Option<i64>]) -> (bool, i64, Vec<i32>) {
        let positions = positions.to_vec();
        futures::executor::block_on(read_progress(ends, |p| {
            let pos = positions[p as usize];
            async move { pos }
        }))
    }

    #[test]
    fn an_unresolved_position_is_neither_done_nor_progress() {
        // Both partitions at their ends: done.
        assert_eq!(progress(&[3, 5], &[Some(3), Some(5)]), (true, 8, vec![]));
        // Partition 1 has records but no position yet: not done, no progress counted,
        // and named (it used to count as offset 0).
        assert_eq!(progress(&[3, 5], &[Some(3), None]), (false, 3, vec![1]));
        // An empty partition needs no position.
        assert_eq!(progress(&[3, 0], &[Some(3), None]), (true, 3, vec![]));
        assert_eq!(progress(&[3, 5], &[Some(1), Some(5)]), (false, 6, vec![]));
    }

    #[test]
    fn a_stalled_read_names_the_partitions_without_a_position() {
        let err = stalled("orders", &[3, 5], &[1], Duration::from_secs(60));
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        let text = err.to_string();
        assert!(
            text.starts_with("kafka read orders failed: no progress towards the end offsets [3, 5] for 60s"),
            "{text}"
        );
        assert!(text.contains("partitions orders-1 never got a read position"), "{text}");
        assert!(!stalled("orders", &[3], &[], Duration::from_secs(60)).to_string().contains("never got"));
    }
}
