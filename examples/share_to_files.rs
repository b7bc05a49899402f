//! Exactly-once from a share group to Arrow IPC files on object storage: files are
//! staged under the checkpoint's transaction and published by its commit, together with
//! the share acknowledgements.
//!
//! `cargo run --example share_to_files`

use std::sync::Arc;
use std::time::Duration;

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::embedded::ShareGroupSource;
use shareflow::connector::share::*;
use shareflow::connector::{record_schema, SourceSettings};
use shareflow::connector::{FileCommitter, FileSink};
use shareflow::runtime::{JobBuilder, JobConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let config = ShareConfig::builder().acknowledgement_mode(AcknowledgementMode::Transactional).build()?;
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory().default_config(config.clone())).await?;
    broker.create_topic("events", 1).await?;
    broker.produce((0..5_000).map(|i| ProducerRecord::new("events", 0, format!("event {i}"))).collect()).await?;

    // Two participants, one decision: the broker transaction and the staged files.
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let files = FileCommitter::new(Arc::new(object_store::memory::InMemory::new()), "lake/events");
    let mut source = SourceSettings::new("archiver", &["events"]);
    source.stop_when_drained = true;
    let job = JobBuilder::new();
    job.source(
        "events",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, config, Default::default()),
    )
    .sql("project", r#"SELECT partition, "offset", CAST(value AS VARCHAR) AS value FROM input"#)
    .sink("files", FileSink::factory(files.clone()))
    .participant(txns)
    .participant(files.clone());
    let storage = CheckpointStore::from_url("memory://example-files/checkpoints", &[], "share-to-files")?;
    job.build(JobConfig::new(storage, "archiver", "example").checkpoint_interval(Duration::from_millis(50)))?
        .run()
        .await?;

    let rows: usize = files.read_published().await?.iter().map(|b| b.num_rows()).sum();
    println!("{} published files hold {rows} rows", files.published().await?.len());
    Ok(())
}
