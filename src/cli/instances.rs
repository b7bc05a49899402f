//! `shareflow instances`: the instances registered under a checkpoint root (decision
//! 0007), and whether each is live, retired or adopted.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::demo_checkpoints;
use super::line::{InstancesArgs, InstancesCommand};

/// `shareflow instances [--checkpoints URL] [--json]`, or `shareflow instances gc ...`
/// (see [`gc`]).
pub(crate) fn command(args: InstancesArgs, runtime: &Runtime) -> ExitCode {
    let url = args.checkpoints.unwrap_or_else(demo_checkpoints);
    if let Some(InstancesCommand::Gc { kafka, group, apply }) = args.gc {
        return gc(&url, &kafka, &group, apply, runtime);
    }
    super::exit::admin_exit("instances", runtime.block_on(instances(&url, args.json)))
}

/// `shareflow instances`: every instance registered under a checkpoint root (decision
/// 0007), with its incarnation, last heartbeat and whether it retired or was adopted.
async fn instances(url: &str, json: bool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Any job id opens the root; the registry lives beside every job's checkpoints.
    let registry = shareflow::checkpoint::CheckpointStore::from_url(url, &[], "instances")?.registry();
    let rows = shareflow::dashboard::instance_views(registry.observe().await?);
    if json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    let dash = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    println!("{:<24} {:>11} {:>6} {:>10} state", "instance", "incarnation", "beats", "checkpoint");
    for r in rows {
        println!(
            "{:<24} {:>11} {:>6} {:>10} {}",
            r.instance,
            r.incarnation,
            dash(r.beats),
            dash(r.checkpoint),
            r.standing
        );
    }
    Ok(())
}

/// `shareflow instances gc --checkpoints URL --kafka HOST:PORT --group G [--apply]`: the
/// ledger topics of retired and adopted instances, listed (dry run) or deleted.
#[cfg(feature = "kafka")]
fn gc(url: &str, kafka: &str, group: &str, apply: bool, runtime: &Runtime) -> ExitCode {
    super::exit::admin_exit("instances gc", runtime.block_on(collect_ledgers(url, kafka, group, apply)))
}

/// Lists, and with `apply` deletes, the ledger topics that `plan_ledger_gc` lets go.
#[cfg(feature = "kafka")]
async fn collect_ledgers(
    url: &str,
    kafka: &str,
    group: &str,
    apply: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use shareflow_connector::kafka::{plan_ledger_gc, KafkaCluster, LedgerTopicFate};
    let registry = shareflow::checkpoint::CheckpointStore::from_url(url, &[], "instances")?.registry();
    let records = registry.observe().await?;
    let cluster = KafkaCluster::connect(kafka).await?;
    let existing = cluster.topics().await?.into_iter().collect();
    for fate in plan_ledger_gc(group, &records, &existing) {
        match fate {
            LedgerTopicFate::Delete { topic, why } if apply => {
                cluster.delete_topics(&[&topic]).await?;
                println!("deleted {topic}: {why}");
            }
            LedgerTopicFate::Delete { topic, why } => println!("would delete {topic}: {why} (--apply deletes it)"),
            LedgerTopicFate::Keep { topic, why } => println!("kept {topic}: {why}"),
        }
    }
    Ok(())
}

/// `instances gc` in a build without the `kafka` feature: refused.
#[cfg(not(feature = "kafka"))]
fn gc(_url: &str, _kafka: &str, _group: &str, _apply: bool, _runtime: &Runtime) -> ExitCode {
    super::args::fail(super::WITHOUT_KAFKA.to_string())
}
