//! Growth over many checkpoints: 100,000 checkpoints (begin, one record acknowledged
//! into T(n), prepare, commit, 500 ms of clock between them) on one broker whose input
//! is written up front. Prints, per
//! block of 10,000 checkpoints, the mean time of one checkpoint's four calls, the time
//! of `list_pending_transactions` and of `metrics`, the transactions the broker keeps,
//! and the live heap. With `share.transaction.retention.ms` = 60 s the figures stay flat;
//! with 30 days (nothing expires within the run) they show what retention saves.
//!
//! `cargo bench --bench broker_retention` (add `-- 20000` for a shorter run)

#![allow(clippy::unwrap_used, missing_docs, unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, ManualClock};
use shareflow::connector::share::*;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::LIVE;

const BLOCK: u64 = 10_000;

async fn run(checkpoints: u64, retention: Duration) {
    let clock = ManualClock::new(1_000_000);
    let config = ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .transaction_retention(retention)
        .build()
        .unwrap();
    // An in-memory journal: what the broker keeps is on the heap, journal included
    // (snapshots replace the segments they cover).
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory().clock(clock.clone()).default_config(config.clone()))
        .await
        .unwrap();
    broker.create_topic("in", 1).await.unwrap();
    // The input is written first, so that its heap is the same at every row.
    for first in (0..checkpoints).step_by(BLOCK as usize) {
        let n = BLOCK.min(checkpoints - first);
        broker.produce((0..n).map(|_| ProducerRecord::new("in", 0, "r")).collect()).await.unwrap();
    }
    let mut consumer = broker.consumer("g", config).await.unwrap();
    consumer.subscribe(&["in"]).await.unwrap();
    let coordinator = broker.transaction_coordinator("g", "job").await.unwrap();
    println!(
        "retention {:>9} s | {:>9} | {:>13} | {:>10} | {:>10} | {:>11} | {:>8}",
        retention.as_secs(),
        "after",
        "checkpoint us",
        "pending us",
        "metrics us",
        "txns kept",
        "heap MiB"
    );
    let mut spent = Duration::ZERO;
    for n in 1..=checkpoints {
        let id = TransactionId::new("g", "job", n).unwrap();
        let started = Instant::now();
        let txn = coordinator.begin_transaction(&id, Duration::from_secs(60)).await.unwrap();
        let records = consumer.poll(1, Duration::ZERO).await.unwrap();
        let acks = ShareAcknowledgements::from_records(&records, AcknowledgeType::Accept).unwrap();
        consumer.acknowledge_batches_transactional(&acks, &txn).await.unwrap();
        coordinator.prepare_transaction(&id).await.unwrap();
        coordinator.commit_transaction(&id).await.unwrap();
        spent += started.elapsed();
        clock.advance(Duration::from_millis(500));
        if n % BLOCK == 0 {
            let started = Instant::now();
            for _ in 0..100 {
                coordinator.list_pending_transactions("g").await.unwrap();
            }
            let pending_us = started.elapsed().as_secs_f64() * 1e6 / 100.0;
            let started = Instant::now();
            for _ in 0..100 {
                broker.metrics().await.unwrap();
            }
            let metrics_us = started.elapsed().as_secs_f64() * 1e6 / 100.0;
            println!(
                "{:>19} | {:>9} | {:>13.1} | {:>10.1} | {:>10.1} | {:>11} | {:>8.1}",
                "",
                n,
                spent.as_secs_f64() * 1e6 / BLOCK as f64,
                pending_us,
                metrics_us,
                broker.transaction_count().await.unwrap(),
                LIVE.load(Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
            );
            spent = Duration::ZERO;
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; this bench has no criterion tests.
    }
    let checkpoints = std::env::args().skip(1).find_map(|a| a.parse::<u64>().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        run(checkpoints, Duration::from_secs(60)).await;
        run(checkpoints, Duration::from_secs(30 * 24 * 3600)).await;
    });
}
