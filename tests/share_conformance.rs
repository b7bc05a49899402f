//! The connector conformance suite on the embedded broker and on real Kafka 4.x.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, ManualClock};
use shareflow::connector::kafka::{KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig};
use shareflow::connector::share::{AcknowledgementMode, ProducerRecord, ShareConfig, ShareConsumer};
use shareflow::runtime::async_trait;
use support::conformance::{self, Backend};

struct Embedded {
    broker: EmbeddedBroker,
    clock: ManualClock,
    next: AtomicU64,
}

impl Embedded {
    async fn new() -> Self {
        let clock = ManualClock::new(1_000_000);
        let broker = EmbeddedBroker::open(BrokerOptions::in_memory().clock(clock.clone())).await.expect("broker");
        Self { broker, clock, next: AtomicU64::new(0) }
    }
}

#[async_trait]
impl Backend for Embedded {
    fn name(&self) -> &str {
        "embedded"
    }
    async fn topic(&self, partitions: u32, records: u64) -> String {
        let topic = format!("t{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.broker.create_topic(&topic, partitions).await.expect("topic");
        let recs = (0..records)
            .map(|i| ProducerRecord::new(topic.as_str(), (i % u64::from(partitions)) as i32, format!("v{i}")))
            .collect();
        self.broker.produce(recs).await.expect("produce");
        topic
    }
    async fn group(&self, lock: Duration) -> String {
        let group = format!("g{}", self.next.fetch_add(1, Ordering::Relaxed));
        let config = ShareConfig::builder()
            .acknowledgement_mode(AcknowledgementMode::Explicit)
            .record_lock_duration(lock)
            .build()
            .expect("config");
        self.broker.configure_group(&group, config).await.expect("group");
        group
    }
    async fn member(&self, group: &str, topic: &str) -> Box<dyn ShareConsumer> {
        let config = self.broker.group_config(group).await.expect("group config");
        let mut c = self
            .broker
            .consumer(group, config.with_acknowledgement_mode(AcknowledgementMode::Explicit))
            .await
            .expect("consumer");
        c.subscribe(&[topic]).await.expect("subscribe");
        Box::new(c)
    }
    async fn pass(&self, by: Duration) {
        self.clock.advance(by);
    }
}

struct Kafka(KafkaCluster);

#[async_trait]
impl Backend for Kafka {
    fn name(&self) -> &str {
        "kafka"
    }
    async fn topic(&self, partitions: u32, records: u64) -> String {
        let topic = support::kafka::unique("conf");
        self.0.ensure_topic(&topic, partitions as i32, &[]).await.expect("topic");
        self.0.produce(&topic, support::kafka::numbered(records)).await.expect("produce");
        topic
    }
    async fn group(&self, lock: Duration) -> String {
        let group = support::kafka::unique("conf-group");
        let lock = lock.as_millis().to_string();
        self.0
            .set_group_configs(
                &group,
                &[("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", &lock)],
            )
            .await
            .expect("group");
        group
    }
    async fn member(&self, group: &str, topic: &str) -> Box<dyn ShareConsumer> {
        let mut c = KafkaShareConsumer::new(&self.0, KafkaShareConsumerConfig::new(group)).await.expect("consumer");
        c.subscribe(&[topic]).await.expect("subscribe");
        Box::new(c)
    }
    async fn pass(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    conformance::$name(&Embedded::new().await).await;
                }
            )*
        }
        mod kafka {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(c) = support::kafka::cluster().await else { return };
                    conformance::$name(&Kafka(c)).await;
                }
            )*
        }
    };
}

conformance!(
    delivers_each_record_once,
    release_redelivers_and_reject_archives,
    expired_locks_redeliver,
    renew_keeps_the_lock,
    acknowledging_foreign_records_is_refused,
);
