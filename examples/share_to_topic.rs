//! Exactly-once from a share group to a topic on the embedded broker.
//!
//! `cargo run --example share_to_topic`

use std::time::Duration;

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::embedded::ShareGroupSource;
use shareflow::connector::embedded::TopicSink;
use shareflow::connector::share::*;
use shareflow::connector::{record_schema, SourceSettings};
use shareflow::runtime::{JobBuilder, JobConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // A broker in memory, with 10,000 orders to process.
    let config = ShareConfig::builder().acknowledgement_mode(AcknowledgementMode::Transactional).build()?;
    let broker = EmbeddedBroker::open(BrokerOptions::in_memory().default_config(config.clone())).await?;
    broker.create_topic("orders", 2).await?;
    broker.create_topic("shipped", 2).await?;
    let orders = (0..10_000).map(|i| ProducerRecord::new("orders", i % 2, format!("order-{i}"))).collect();
    broker.produce(orders).await?;

    // The broker's transaction T(n) is part of every checkpoint: the source's
    // acknowledgements and the sink's output commit together.
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new("shipping", &["orders"]);
    source.stop_when_drained = true; // a bounded run for the example
    let job = JobBuilder::new();
    job.source(
        "orders",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, config, Default::default()),
    )
    .parallelism(2)
    .sql("ship", "SELECT key, concat('shipped ', CAST(value AS VARCHAR)) AS value FROM input")
    .sink("shipped", TopicSink::factory(broker.clone(), Some(txns.clone()), "shipped"))
    .parallelism(2)
    .participant(txns);

    let storage = CheckpointStore::from_url("memory://example/checkpoints", &[], "share-to-topic")?;
    let report = job
        .build(JobConfig::new(storage, "shipping", "example").checkpoint_interval(Duration::from_millis(50)))?
        .run()
        .await?;

    // read_committed readers see each order exactly once.
    let mut shipped = 0;
    for p in 0..2 {
        shipped += broker.fetch_all(&TopicPartition::new("shipped", p), IsolationLevel::ReadCommitted).await?.len();
    }
    println!("shipped {shipped} orders in {} checkpoints", report.metrics.checkpoints.completed);
    Ok(())
}
