//! Broker acknowledgements and staged files commit together through one checkpoint:
//! after crashes, every record is in exactly one published file row, and readers never
//! see staged files.

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;
#[path = "support/s3.rs"]
mod s3;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, StringViewArray};
use eos::*;
use object_store::memory::InMemory;
use shareflow::checkpoint::{CheckpointPaths, CheckpointStore};
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::embedded::ShareGroupSource;
use shareflow::connector::share::RecordState;
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::connector::{FileCommitter, FileSink};
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy};

const RECORDS: u64 = 3_000;

const CRASHES: [&str; 4] =
    [points::AFTER_STATE_BEFORE_MANIFEST, points::COMMIT_MID, points::AFTER_MANIFEST, "sink.after_write"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_acks_commit_together_across_crashes() {
    for crash in CRASHES {
        let files = FileCommitter::new(Arc::new(InMemory::new()), "out");
        files_and_acks_commit_together(crash, files, memory_storage("files")).await;
    }
}

/// The same with the files and the checkpoints on the S3 server (MinIO): staging,
/// publishing by copy and delete, and reading back under S3's semantics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_acks_commit_together_on_s3_across_crashes() {
    let Some((store, _)) = s3::s3_store() else { return };
    let tag = s3::run_tag();
    for crash in CRASHES {
        let root = format!("eos-file-sink-{tag}/{}", crash.replace('.', "-"));
        let files = FileCommitter::new(store.clone(), &format!("{root}/out"));
        let paths = CheckpointPaths::new(format!("{root}/checkpoints").as_str(), "files").unwrap();
        files_and_acks_commit_together(crash, files, CheckpointStore::new(store.clone(), paths)).await;
    }
}

/// One crash at `crash`, then the output checked: every record in exactly one published
/// row, acknowledged, and no staged file visible.
async fn files_and_acks_commit_together(crash: &str, files: Arc<FileCommitter>, storage: CheckpointStore) {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(GROUP, &[INPUT]);
    source.stop_when_drained = true;
    source.max_poll_records = 200;
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(
            broker.clone(),
            Some(txns.clone()),
            source,
            share_config(),
            Arc::new(SourceMetrics::default()),
        ),
    )
    .parallelism(2)
    .sql("transform", "SELECT upper(CAST(value AS VARCHAR)) AS value FROM input")
    .sink("file-sink", FileSink::factory(files.clone()))
    .parallelism(2)
    .participant(txns)
    .participant(files.clone());
    let config = JobConfig::new(storage, GROUP, "files")
        .checkpoint_interval(Duration::from_millis(5))
        .restart(RestartStrategy::FixedDelay { attempts: 3, delay: Duration::from_millis(5) });
    let job = job.build(config).unwrap();
    job.failpoints().schedule(vec![(crash.to_string(), 0)]);
    job.run().await.unwrap();
    assert_eq!(job.failpoints().fired(), vec![crash.to_string()], "the crash happened");
    // Count every published row by its input identity.
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    for batch in files.read_published().await.unwrap() {
        let values = batch.column(0).as_any().downcast_ref::<StringViewArray>().unwrap();
        for i in 0..values.len() {
            *seen.entry(eos::identity(values.value(i).as_bytes()).unwrap()).or_default() += 1;
        }
    }
    assert_eq!(seen.len() as u64, RECORDS, "{crash}: every record published");
    assert!(seen.values().all(|&n| n == 1), "{crash}: a record was published twice");
    let backlog = broker.backlog(GROUP, INPUT).await.unwrap();
    assert_eq!(backlog.acknowledged, RECORDS, "{crash}: every record acknowledged");
    assert!(files.published().await.unwrap().iter().all(|p| !p.as_ref().contains("_staging")));
    assert_eq!(
        broker
            .record_status(GROUP, &shareflow::connector::share::TopicPartition::new(INPUT, 0), 0)
            .await
            .unwrap()
            .state,
        RecordState::Acknowledged
    );
}
