//! Embedded-broker throughput of the exactly-once consume cycle: poll 500 records, stage
//! them into the checkpoint's transaction, and prepare + commit every 10,000 records.
//! One tokio current-thread runtime, so one core. Journals: in-memory, and a local
//! directory with and without `fdatasync` per group commit.
//!
//! `cargo bench --bench broker_txn`

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use shareflow::connector::broker::{BrokerOptions, Durability, EmbeddedBroker};
use shareflow::connector::share::*;

const PER_COMMIT: usize = 10_000;
const POLL: usize = 500;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn group_config() -> ShareConfig {
    ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .partition_max_record_locks(PER_COMMIT as u32)
        .transaction_timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

async fn setup(options: BrokerOptions, records: usize) -> EmbeddedBroker {
    let broker = EmbeddedBroker::open(options.default_config(group_config())).await.unwrap();
    broker.create_topic("in", 1).await.unwrap();
    let value = vec![7u8; 100];
    for chunk in 0..records.div_ceil(PER_COMMIT) {
        let n = PER_COMMIT.min(records - chunk * PER_COMMIT);
        broker.produce((0..n).map(|_| ProducerRecord::new("in", 0, value.clone())).collect()).await.unwrap();
    }
    broker
}

/// Consumes `commits` x 10,000 records exactly once and returns the time it took.
async fn consume(broker: &EmbeddedBroker, commits: u64) -> Duration {
    let mut consumer = broker.consumer("g", group_config()).await.unwrap();
    consumer.subscribe(&["in"]).await.unwrap();
    let coordinator = broker.transaction_coordinator("g", "bench").await.unwrap();
    let start = Instant::now();
    for n in 1..=commits {
        let id = TransactionId::new("g", "bench", n).unwrap();
        let txn = coordinator.begin_transaction(&id, Duration::from_secs(600)).await.unwrap();
        let mut done = 0;
        while done < PER_COMMIT {
            let records = consumer.poll(POLL, Duration::ZERO).await.unwrap();
            assert!(!records.is_empty(), "ran out of records");
            done += records.len();
            let acks = ShareAcknowledgements::from_records(&records, AcknowledgeType::Accept).unwrap();
            consumer.acknowledge_batches_transactional(&acks, &txn).await.unwrap();
        }
        coordinator.prepare_transaction(&id).await.unwrap();
        coordinator.commit_transaction(&id).await.unwrap();
    }
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("eos_consume_cycle");
    group.throughput(Throughput::Elements(PER_COMMIT as u64));
    group.sample_size(20).measurement_time(Duration::from_secs(8));
    for journal in ["memory", "file-fsync", "file-no-fsync"] {
        group.bench_function(BenchmarkId::new("journal", journal), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let dir = tempfile::tempdir().unwrap();
                    let options = match journal {
                        "memory" => {
                            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
                            BrokerOptions::with_store(store, Path::from("broker"))
                        }
                        "file-fsync" => BrokerOptions::local_dir(dir.path()).unwrap(),
                        _ => BrokerOptions::local_dir(dir.path()).unwrap().durability(Durability::ProcessCrash),
                    };
                    let broker = setup(options, iters as usize * PER_COMMIT).await;
                    consume(&broker, iters).await
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
