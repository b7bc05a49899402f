//! Topic retention on the embedded broker: time and size limits delete whole batches
//! from the start of a log, a share partition's start offset advances past them,
//! records in flight hold retention back, and all of it survives a restart. Retention
//! looks at the logs as often as Kafka's `log.retention.check.interval.ms` says, first
//! one interval after the broker opens.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, ManualClock, Retention};
use shareflow::connector::share::AcknowledgeType::Accept;
use shareflow::connector::share::AcknowledgementMode::Explicit;
use shareflow::connector::share::*;
use support::{config, poll, tp, GROUP, IN};

async fn broker(store: &Arc<dyn ObjectStore>, clock: &ManualClock, retention: Retention) -> EmbeddedBroker {
    let b = EmbeddedBroker::open(
        BrokerOptions::with_store(store.clone(), Path::from("broker"))
            .clock(clock.clone())
            .default_config(config(Explicit))
            .log_retention(retention)
            .log_retention_check_interval(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    b.create_topic(IN, 1).await.unwrap();
    b
}

async fn produce(b: &EmbeddedBroker, n: usize, tag: &str) {
    b.produce((0..n).map(|i| ProducerRecord::new(IN, 0, format!("{tag}-{i:04}"))).collect()).await.unwrap();
}

#[tokio::test]
async fn time_retention_deletes_old_batches_and_delivery_goes_on_past_them() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = ManualClock::new(1_000_000);
    let b = broker(&store, &clock, Retention { ms: Some(60_000), bytes: None }).await;
    produce(&b, 10, "old").await;
    let mut c = b.consumer(GROUP, config(Explicit)).await.unwrap();
    c.subscribe(&[IN]).await.unwrap();
    let got = poll(&mut c, 4).await;
    for r in &got {
        c.acknowledge(r, Accept).await.unwrap();
    }
    c.commit().await.unwrap();
    // A minute and a bit later: the first batch (offsets 0..=9, 6 never delivered) is
    // older than the limit and goes at the next pass.
    clock.advance(Duration::from_secs(61));
    produce(&b, 3, "new").await;
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 10);
    assert_eq!(b.end_offset(&tp(0)).await.unwrap(), 13);
    // What was deleted has no state, and is not counted as waiting for delivery.
    assert!(b.record_status(GROUP, &tp(0), 5).await.is_err(), "a deleted offset has no status");
    let backlog = b.backlog(GROUP, IN).await.unwrap();
    assert_eq!(backlog.available + backlog.acquired + backlog.acknowledged, 3, "{backlog:?}");
    assert!(b.fetch_all(&tp(0), IsolationLevel::ReadUncommitted).await.unwrap().iter().all(|r| r.offset >= 10));
    // The share partition starts at the log start: only the new records are delivered.
    let got = poll(&mut c, 100).await;
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![10, 11, 12]);
    assert_eq!(b.record_status(GROUP, &tp(0), 10).await.unwrap().state, RecordState::Acquired);
    // A group that joins later starts at the log start too.
    let mut late = b.consumer("late-group", config(Explicit)).await.unwrap();
    late.subscribe(&[IN]).await.unwrap();
    assert_eq!(poll(&mut late, 100).await.first().map(|r| r.offset), Some(10));
    // After a restart the log still starts at 10, and offsets go on from 13.
    b.close();
    drop(b);
    let b = broker(&store, &clock, Retention::default()).await;
    assert_eq!((b.start_offset(&tp(0)).await.unwrap(), b.end_offset(&tp(0)).await.unwrap()), (10, 13));
    produce(&b, 1, "after").await;
    assert_eq!(b.end_offset(&tp(0)).await.unwrap(), 14);
}

#[tokio::test]
async fn records_in_flight_hold_retention_back() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = ManualClock::new(1_000_000);
    let b = broker(&store, &clock, Retention { ms: Some(1_000), bytes: None }).await;
    produce(&b, 5, "a").await; // batch 0..=4
    produce(&b, 5, "b").await; // batch 5..=9
    let mut c = b.consumer(GROUP, config(Explicit)).await.unwrap();
    c.subscribe(&[IN]).await.unwrap();
    let got = poll(&mut c, 7).await; // 0..=6 ACQUIRED
    for r in &got[..5] {
        c.acknowledge(r, Accept).await.unwrap();
    }
    c.commit().await.unwrap(); // 0..=4 done, 5 and 6 still ACQUIRED
    clock.advance(Duration::from_secs(5));
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 5, "the batch holding 5 and 6 stays while they are in flight");
    for r in &got[5..] {
        c.acknowledge(r, Accept).await.unwrap();
    }
    c.commit().await.unwrap();
    clock.advance(Duration::from_secs(2));
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 10, "then it goes, undelivered 7..=9 with it");
    assert!(poll(&mut c, 10).await.is_empty());
}

#[tokio::test]
async fn size_retention_keeps_the_log_under_its_limit() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = ManualClock::new(1_000_000);
    // Each record is "x-0000" (6 bytes); batches of 100 are 600 bytes.
    let b = broker(&store, &clock, Retention { ms: None, bytes: Some(2_000) }).await;
    for round in 0..20 {
        produce(&b, 100, "x").await;
        clock.advance(Duration::from_millis(1_100));
        b.tick().await.unwrap();
        let bytes = b.log_bytes(&tp(0)).await.unwrap();
        assert!(bytes <= 2_000, "round {round}: {bytes} bytes after a pass");
    }
    let start = b.start_offset(&tp(0)).await.unwrap();
    assert_eq!(b.end_offset(&tp(0)).await.unwrap() - start, 300, "3 batches of 600 bytes fit in 2,000");
    assert_eq!(b.log_bytes(&tp(0)).await.unwrap(), 1_800);
}

#[tokio::test]
async fn retention_looks_30_s_after_the_open_then_once_per_check_interval_as_kafka_does() {
    // Input produced with timestamps a year old, as a replay of history is: past the
    // default 7 days of retention from the start. It stays until the first check, 30 s
    // after the open (Kafka's initial delay), and a job that starts at once reads it.
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let clock = ManualClock::new(1_800_000_000_000);
    let open = || async {
        let options = BrokerOptions::with_store(store.clone(), Path::from("broker"));
        EmbeddedBroker::open(options.clock(clock.clone()).default_config(config(Explicit))).await.unwrap()
    };
    let b = open().await;
    b.create_topic(IN, 1).await.unwrap();
    let old = 1_800_000_000_000 - 365 * 24 * 3_600_000;
    let produce_old = |n: i64| {
        (0..n)
            .map(|i| ProducerRecord { timestamp_ms: old + i, ..ProducerRecord::new(IN, 0, format!("r{i}")) })
            .collect()
    };
    b.produce(produce_old(10)).await.unwrap();
    clock.advance(Duration::from_secs(29));
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 0, "deleted before the first check");
    let mut c = b.consumer(GROUP, config(Explicit)).await.unwrap();
    c.subscribe(&[IN]).await.unwrap();
    let got = poll(&mut c, 100).await;
    assert_eq!(got.len(), 10);
    for r in &got {
        c.acknowledge(r, Accept).await.unwrap();
    }
    c.commit().await.unwrap();
    clock.advance(Duration::from_secs(2));
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 10, "the first check, 30 s after the open");
    // Then once per interval: 5 minutes by default.
    b.produce(produce_old(5)).await.unwrap();
    clock.advance(Duration::from_secs(290));
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 10, "checked again before the interval");
    clock.advance(Duration::from_secs(11));
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 15, "the second check, 5 minutes after the first");
    assert_eq!(shareflow::connector::broker::DEFAULT_RETENTION_CHECK, Duration::from_secs(300));
    // Reopened more than an interval after its last command, it looks at once.
    b.produce(produce_old(5)).await.unwrap();
    b.close();
    drop(b);
    clock.advance(Duration::from_secs(600));
    let b = open().await;
    b.tick().await.unwrap();
    assert_eq!(b.start_offset(&tp(0)).await.unwrap(), 20, "a reopen after 10 minutes checks at once");
}
