//! Shared helpers for the integration tests: a broker on a shared in-memory store with
//! a manual clock, that can be "crashed" and reopened.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, ManualClock};
use shareflow::connector::share::*;

pub mod conformance;
pub mod demo;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod s3;

pub const GROUP: &str = "orders-eu";
pub const PREFIX: &str = "job";
pub const IN: &str = "in";
pub const OUT: &str = "out";
pub const LOCK: Duration = Duration::from_secs(30);
pub const TXN_TIMEOUT: Duration = Duration::from_secs(60);

pub fn tp(partition: i32) -> TopicPartition {
    TopicPartition::new(IN, partition)
}

pub fn out_tp() -> TopicPartition {
    TopicPartition::new(OUT, 0)
}

pub fn config(mode: AcknowledgementMode) -> ShareConfig {
    ShareConfig::builder().acknowledgement_mode(mode).build().expect("valid config")
}

pub fn txn_id(n: u64) -> TransactionId {
    TransactionId::new(GROUP, PREFIX, n).expect("valid id")
}

pub struct Fixture {
    pub store: Arc<dyn ObjectStore>,
    pub clock: ManualClock,
    pub broker: EmbeddedBroker,
    pub group_config: ShareConfig,
    pub options: BrokerOptions,
}

impl Fixture {
    /// A broker with topic `in` (`partitions` partitions) and `out` (1 partition).
    pub async fn new(partitions: u32, group_config: ShareConfig) -> Self {
        Self::on_store(Arc::new(InMemory::new()), partitions, group_config).await
    }

    pub async fn on_store(store: Arc<dyn ObjectStore>, partitions: u32, group_config: ShareConfig) -> Self {
        let options = BrokerOptions::with_store(store.clone(), Path::from("broker"));
        Self::with_options(options, store, partitions, group_config).await
    }

    /// A broker whose journal appends to files in `dir`.
    pub async fn on_local_dir(dir: &std::path::Path, partitions: u32, group_config: ShareConfig) -> Self {
        Self::on_local_dir_with(dir, BrokerOptions::local_dir(dir).expect("local dir"), partitions, group_config).await
    }

    /// [`on_local_dir`](Self::on_local_dir) with options of the test's own on `dir`.
    pub async fn on_local_dir_with(
        dir: &std::path::Path,
        options: BrokerOptions,
        partitions: u32,
        group_config: ShareConfig,
    ) -> Self {
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir).expect("local store"));
        Self::with_options(options, store, partitions, group_config).await
    }

    async fn with_options(
        options: BrokerOptions,
        store: Arc<dyn ObjectStore>,
        partitions: u32,
        group_config: ShareConfig,
    ) -> Self {
        let clock = ManualClock::new(1_000_000);
        let options = options.clock(clock.clone()).default_config(group_config.clone());
        let broker = EmbeddedBroker::open(options.clone()).await.expect("open broker");
        broker.create_topic(IN, partitions).await.expect("create in");
        broker.create_topic(OUT, 1).await.expect("create out");
        broker.configure_group(GROUP, group_config.clone()).await.expect("configure");
        Self { store, clock, broker, group_config, options }
    }

    /// Drops the broker without any shutdown and opens it again on the same journal.
    pub async fn restart(&mut self) {
        self.broker.close();
        self.broker = EmbeddedBroker::open(self.options.clone()).await.expect("reopen broker");
    }

    /// Closes the broker and opens it again, returning the result.
    pub async fn reopen(&self) -> Result<EmbeddedBroker, shareflow::connector::Error> {
        self.broker.close();
        EmbeddedBroker::open(self.options.clone()).await
    }

    pub async fn produce(&self, partition: i32, n: usize) -> Vec<i64> {
        let records = (0..n).map(|i| ProducerRecord::new(IN, partition, format!("v{i}"))).collect();
        self.broker.produce(records).await.expect("produce").into_iter().map(|(_, o)| o).collect()
    }

    pub async fn consumer(&self, mode: AcknowledgementMode) -> shareflow::connector::broker::EmbeddedShareConsumer {
        let config = self.group_config.clone().with_acknowledgement_mode(mode);
        let mut c = self.broker.consumer(GROUP, config).await.expect("consumer");
        c.subscribe(&[IN]).await.expect("subscribe");
        c
    }

    pub async fn state(&self, partition: i32, offset: i64) -> RecordState {
        self.broker.record_status(GROUP, &tp(partition), offset).await.expect("status").state
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

pub async fn open(store: &Arc<dyn ObjectStore>, clock: &ManualClock, config: &ShareConfig) -> EmbeddedBroker {
    EmbeddedBroker::open(
        BrokerOptions::with_store(store.clone(), Path::from("broker"))
            .clock(clock.clone())
            .default_config(config.clone()),
    )
    .await
    .expect("open broker")
}

pub async fn poll(c: &mut impl ShareConsumer, max: usize) -> Vec<Record> {
    c.poll(max, Duration::ZERO).await.expect("poll")
}

pub fn acks(records: &[Record], ty: AcknowledgeType) -> ShareAcknowledgements {
    ShareAcknowledgements::from_records(records, ty).expect("acks")
}

/// Everything a client can observe of the broker, for before/after comparisons.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub records: Vec<(i32, i64, shareflow::connector::broker::RecordStatus)>,
    pub transactions: Vec<shareflow::connector::broker::TransactionInfo>,
    pub out_committed: Vec<shareflow::connector::broker::FetchedRecord>,
    pub out_uncommitted: Vec<shareflow::connector::broker::FetchedRecord>,
    pub out_last_stable: i64,
    pub in_ends: Vec<i64>,
}

pub async fn observe(f: &Fixture) -> Observed {
    let partitions = f.broker.partition_count(IN).expect("in");
    let mut records = Vec::new();
    let mut in_ends = Vec::new();
    for p in 0..partitions as i32 {
        let end = f.broker.end_offset(&tp(p)).await.expect("end");
        in_ends.push(end);
        for o in 0..end {
            records.push((p, o, f.broker.record_status(GROUP, &tp(p), o).await.expect("status")));
        }
    }
    Observed {
        records,
        transactions: f.broker.transactions().await.expect("txns"),
        out_committed: f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.expect("fetch"),
        out_uncommitted: f.broker.fetch_all(&out_tp(), IsolationLevel::ReadUncommitted).await.expect("fetch"),
        out_last_stable: f.broker.last_stable_offset(&out_tp()).await.expect("lso"),
        in_ends,
    }
}

/// What a restart must turn `before` into: ACQUIRED records come back AVAILABLE with
/// their delivery count; nothing else changes.
/// What a restart does to `before` (decision 0003, "Restart"): ACQUIRED records come back
/// AVAILABLE with their delivery count, or ARCHIVED once that count is `delivery_limit`.
pub fn after_restart(before: &Observed, delivery_limit: u16) -> Observed {
    let mut expected = before.clone();
    for (_, _, s) in &mut expected.records {
        if s.state == RecordState::Acquired {
            if s.delivery_count >= delivery_limit {
                s.state = RecordState::Archived;
                s.delivery_count = 0;
                s.archive_reason = Some(ArchiveReason::DeliveryLimit);
                s.transaction = None;
            } else {
                s.state = RecordState::Available;
            }
        }
    }
    expected
}

pub trait ClockExt {
    fn now_ms_for_tests(&self) -> u64;
}

impl ClockExt for ManualClock {
    fn now_ms_for_tests(&self) -> u64 {
        use shareflow::connector::broker::Clock;
        self.now_ms()
    }
}
