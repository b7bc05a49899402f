//! `shareflow instances`: the instances registered under a checkpoint root (decision
//! 0007), and whether each is live, retired or adopted.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use shareflow::checkpoint::instances::Standing;

use super::args::{fail, Args};
use super::demo_checkpoints;

/// `shareflow instances [--checkpoints URL]`; an unknown option fails after the table.
/// `shareflow instances gc ...`: see [`gc`].
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    if args.0.first().is_some_and(|a| a == "gc") {
        args.0.remove(0);
        return gc(args, runtime);
    }
    match runtime.block_on(instances(args)).and_then(|()| args.finish().map_err(Into::into)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// `shareflow instances`: every instance registered under a checkpoint root (decision
/// 0007), with its incarnation, last heartbeat and whether it retired or was adopted.
async fn instances(args: &mut Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = args.value("--checkpoints")?.unwrap_or_else(demo_checkpoints);
    // Any job id opens the root; the registry lives beside every job's checkpoints.
    let registry = shareflow::checkpoint::CheckpointStore::from_url(&url, &[], "instances")?.registry();
    println!("{:<24} {:>11} {:>6} {:>10} state", "instance", "incarnation", "beats", "checkpoint");
    for r in registry.observe().await? {
        let state = match r.standing() {
            Standing::Adopted { by } => format!("adopted by {by}"),
            Standing::BeingAdopted { by } => format!("being adopted by {by}"),
            Standing::Retired => "retired".to_string(),
            Standing::Registered => "registered".to_string(),
        };
        let (beats, checkpoint) = r.heartbeat.map_or((String::from("-"), String::from("-")), |h| {
            (h.beat.to_string(), h.checkpoint_id.map_or(String::from("-"), |c| c.to_string()))
        });
        println!("{:<24} {:>11} {:>6} {:>10} {state}", r.prefix, r.incarnation, beats, checkpoint);
    }
    Ok(())
}

/// `shareflow instances gc --checkpoints URL --kafka HOST:PORT --group G [--apply]`: the
/// ledger topics of retired and adopted instances, listed (dry run) or deleted.
#[cfg(feature = "kafka")]
fn gc(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let parsed = (|| -> Result<(String, String, String, bool), String> {
        let url = args.value("--checkpoints")?.ok_or("instances gc: give --checkpoints URL, the instances' root")?;
        let kafka = args.value("--kafka")?.ok_or("instances gc: give --kafka HOST:PORT, the cluster of the ledgers")?;
        let group = args.value("--group")?.ok_or("instances gc: give --group G, the share group of the instances")?;
        let apply = args.flag("--apply");
        args.finish()?;
        Ok((url, kafka, group, apply))
    })();
    let (url, kafka, group, apply) = match parsed {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match runtime.block_on(collect_ledgers(&url, &kafka, &group, apply)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shareflow instances gc failed: {e}");
            ExitCode::from(1)
        }
    }
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
fn gc(_args: &mut Args, _runtime: &Runtime) -> ExitCode {
    fail(super::WITHOUT_KAFKA.to_string())
}
