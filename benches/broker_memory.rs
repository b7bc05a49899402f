//! Heap cost of LOCKED state: 1,000,000 records with contiguous offsets, acquired by
//! polls of 500 and staged into one transaction. Prints the broker heap growth caused
//! by the records' state (target <= 16 MiB), next to the heap the topic log itself takes.
//!
//! `cargo bench --bench broker_memory`

#![allow(clippy::unwrap_used, missing_docs, unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use shareflow::connector::broker::{BrokerOptions, Durability, EmbeddedBroker};
use shareflow::connector::share::*;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::LIVE;

const RECORDS: usize = 1_000_000;

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for a list; this bench has no criterion tests.
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        // A local journal, so the journal's bytes are on disk and not counted as heap.
        let config = ShareConfig::builder()
            .acknowledgement_mode(AcknowledgementMode::Transactional)
            .partition_max_record_locks(RECORDS as u32)
            .transaction_timeout(Duration::from_secs(3600))
            .build()
            .unwrap();
        let options = BrokerOptions::local_dir(dir.path()).unwrap().durability(Durability::ProcessCrash);
        let before_broker = LIVE.load(Ordering::Relaxed);
        let broker = EmbeddedBroker::open(options.default_config(config.clone())).await.unwrap();
        broker.create_topic("in", 1).await.unwrap();
        for _ in 0..RECORDS / 10_000 {
            broker
                .produce((0..10_000).map(|i| ProducerRecord::new("in", 0, vec![i as u8; 16])).collect())
                .await
                .unwrap();
        }
        let mut consumer = broker.consumer("g", config).await.unwrap();
        consumer.subscribe(&["in"]).await.unwrap();
        let coordinator = broker.transaction_coordinator("g", "mem").await.unwrap();
        let id = TransactionId::new("g", "mem", 1).unwrap();
        let txn = coordinator.begin_transaction(&id, Duration::from_secs(3600)).await.unwrap();
        let with_log = LIVE.load(Ordering::Relaxed);

        let mut locked = 0;
        while locked < RECORDS {
            let records = consumer.poll(500, Duration::ZERO).await.unwrap();
            locked += records.len();
            let acks = ShareAcknowledgements::from_records(&records, AcknowledgeType::Accept).unwrap();
            consumer.acknowledge_batches_transactional(&acks, &txn).await.unwrap();
        }
        let with_locked = LIVE.load(Ordering::Relaxed);
        let tp = TopicPartition::new("in", 0);
        let info = broker.share_partition_info("g", &tp).await.unwrap().unwrap();
        assert_eq!(info.in_flight, RECORDS as u64);
        assert_eq!(broker.record_status("g", &tp, RECORDS as i64 - 1).await.unwrap().state, RecordState::Locked);

        println!("records LOCKED in one transaction: {locked}");
        println!("share-partition runs stored:      {}", info.run_count);
        println!(
            "heap for their LOCKED state:       {:.3} MiB ({} bytes, target <= 16 MiB)",
            mib(with_locked - with_log),
            with_locked - with_log
        );
        println!("heap for the topic log (16 B values, for comparison): {:.1} MiB", mib(with_log - before_broker));
        coordinator.prepare_transaction(&id).await.unwrap();
        coordinator.commit_transaction(&id).await.unwrap();
        let after_commit = LIVE.load(Ordering::Relaxed);
        println!("heap change after the commit:      {:.3} MiB", mib(after_commit - with_locked));
    });
}
