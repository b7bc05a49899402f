//! A crash at every fault point, a restart, and the exactly-once check.
//!
//! For each fault point: a share group -> SQL -> topic job on an embedded broker whose
//! journal is on disk crashes there (a scheduled failpoint, no restarts), the broker is
//! closed as a dying process leaves it, then broker and job start again on the same
//! directory and checkpoints. Recovery decides what the crash left open, the job runs to
//! the end, and an independent check reads the output read_committed and every input
//! record's state.
//!
//! `cargo run --example crash_recovery`

use std::path::Path;
use std::time::Duration;

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::embedded::{BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow::connector::share::*;
use shareflow::connector::verify::check_exactly_once;
use shareflow::connector::{record_schema, SourceSettings};
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{Job, JobBuilder, JobConfig, RestartStrategy};

type Error = Box<dyn std::error::Error + Send + Sync>;

const GROUP: &str = "orders";
const INPUT: &str = "orders-in";
const OUTPUT: &str = "orders-out";
const RECORDS: u64 = 20_000;

/// The order id an input value (`order-0000000042`) and its output carry.
fn identity(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?.strip_prefix("order-")?;
    text.get(..10)?.parse().ok()
}

fn share_config() -> Result<ShareConfig, Error> {
    Ok(ShareConfig::builder().acknowledgement_mode(AcknowledgementMode::Transactional).build()?)
}

/// Opens the broker in `dir`: what a process does when it starts.
async fn open_broker(dir: &Path) -> Result<EmbeddedBroker, Error> {
    let options = BrokerOptions::local_dir(dir.join("broker"))?.default_config(share_config()?);
    Ok(EmbeddedBroker::open(options).await?)
}

/// The job: share group -> SQL -> topic, exactly once through the broker's transactions,
/// checkpoints in `dir`.
fn job(broker: &EmbeddedBroker, dir: &Path, restart: RestartStrategy) -> Result<Job, Error> {
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(GROUP, &[INPUT]);
    source.stop_when_drained = true; // a bounded run for the example
    let job = JobBuilder::new();
    job.source(
        "orders",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, share_config()?, Default::default()),
    )
    .parallelism(2)
    .sql("confirm", "SELECT key, concat(CAST(value AS VARCHAR), ' confirmed') AS value FROM input")
    .parallelism(2)
    .sink("confirmed", TopicSink::factory(broker.clone(), Some(txns.clone()), OUTPUT))
    .parallelism(2)
    .participant(txns);
    let storage = CheckpointStore::from_url(&format!("file://{}", dir.join("checkpoints").display()), &[], "orders")?;
    let config = JobConfig::new(storage, GROUP, "crash-recovery")
        .checkpoint_interval(Duration::from_millis(20))
        .restart(restart);
    Ok(job.build(config)?)
}

/// One fault point: crash there, restart, check.
async fn crash_and_recover(point: &str) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let broker = open_broker(dir.path()).await?;
    broker.create_topic(INPUT, 2).await?;
    broker.create_topic(OUTPUT, 2).await?;
    broker.configure_group(GROUP, share_config()?).await?;
    let orders = (0..RECORDS).map(|i| ProducerRecord::new(INPUT, (i % 2) as i32, format!("order-{i:010}"))).collect();
    broker.produce(orders).await?;

    // The first run crashes at `point`: on its third hit for the per-batch points of the
    // source and the sink (so some work is done first), on its first for the checkpoint
    // and commit points. Without restarts the crash ends the run, as a crash ends a process.
    let skip = if point.starts_with("source.") || point.starts_with("sink.") { 2 } else { 0 };
    let first = job(&broker, dir.path(), RestartStrategy::None)?;
    first.failpoints().schedule(vec![(point.to_string(), skip)]);
    let crashed = match first.run().await {
        Ok(_) => "not reached: the first run finished".to_string(),
        Err(e) => format!("crashed ({e})"),
    };
    drop(first);
    broker.close();

    // The restart: a new broker on the same journal, a new job on the same checkpoints.
    let broker = open_broker(dir.path()).await?;
    let report = job(&broker, dir.path(), RestartStrategy::None)?.run().await?;
    let check = check_exactly_once(&broker, GROUP, INPUT, OUTPUT, identity).await?;
    println!("{point}: {crashed}");
    println!(
        "    restart: recovery committed {} transaction(s); output {} of {RECORDS} records, {} duplicates, {} lost; \
         exactly-once check {}",
        report.metrics.checkpoints.transactions_recovered,
        check.committed_output,
        check.duplicates,
        check.lost,
        if check.ok() { "passed".to_string() } else { format!("FAILED: {:?}", check.violations.first()) }
    );
    broker.close();
    if check.ok() {
        Ok(())
    } else {
        Err(format!("{point}: the output is not the input exactly once").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // The recovery points are reached in a recovery that has decided work to redo only
    // after an earlier crash; the failure tests cover them.
    let all = shareflow::connector::points::ALL
        .iter()
        .chain(points::ALL)
        .filter(|p| **p != points::RECOVERY_MID && **p != points::AFTER_RECOVERY);
    for point in all {
        crash_and_recover(point).await?;
    }
    Ok(())
}
