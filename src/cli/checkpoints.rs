//! `shareflow checkpoints`: the checkpoints of a job, as a table, and with `inspect N`
//! one checkpoint read back and checked ([`crate::admin::inspect_checkpoint`]).

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::demo_checkpoints;
use super::exit::admin_exit;
use super::line::{CheckpointsArgs, CheckpointsCommand};

/// `shareflow checkpoints [inspect N] ...`.
pub(crate) fn command(args: CheckpointsArgs, runtime: &Runtime) -> ExitCode {
    let url = args.checkpoints.unwrap_or_else(demo_checkpoints);
    match args.inspect {
        Some(CheckpointsCommand::Inspect { id }) => admin_exit(
            "checkpoints inspect",
            runtime.block_on(crate::admin::inspect_checkpoint(&url, &args.job, id, args.json)),
        ),
        None => admin_exit("checkpoints", runtime.block_on(list(&url, &args.job))),
    }
}

/// `shareflow checkpoints`: a table of a job's checkpoints, or why there is none.
async fn list(url: &str, job: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (url, job) = (url.to_string(), job.to_string());
    let store = shareflow::checkpoint::CheckpointStore::from_url(&url, &[], &job)?;
    let list = store.list_checkpoints().await?;
    if list.is_empty() {
        // Say why there is nothing, rather than print an empty table.
        let jobs = store.list_jobs().await?;
        if jobs.is_empty() {
            return Err(format!("nothing is stored under {url}: check --checkpoints").into());
        }
        if !jobs.contains(&job) {
            return Err(format!(
                "job {job} has nothing under {url}; jobs there: {} (pick one with --job)",
                jobs.join(", ")
            )
            .into());
        }
        println!("job {job} under {url} has no checkpoints yet");
        return Ok(());
    }
    println!(
        "{:>12} {:<40} {:>6} {:>6} {:>6} {:>12} transactions",
        "checkpoint", "status", "states", "inline", "files", "state bytes"
    );
    for c in list {
        // What the manifest records (inline states included); without a valid manifest,
        // only the objects found in storage.
        let (states, inline, bytes, txns) = match &c.manifest {
            Some(m) => (
                m.state_files.len().to_string(),
                m.state_files.iter().filter(|f| f.inline.is_some()).count().to_string(),
                m.state_bytes(),
                m.transactions.iter().map(|t| t.transaction_id.clone()).collect::<Vec<_>>().join(","),
            ),
            None => ("-".into(), "-".into(), c.state_bytes, String::new()),
        };
        println!(
            "{:>12} {:<40} {states:>6} {inline:>6} {:>6} {bytes:>12} {txns}",
            c.checkpoint_id,
            format!("{:?}", c.status),
            c.state_files,
        );
    }
    savepoints(&store, &url).await
}

/// The job's savepoints, after its checkpoints: each with the URL a start takes.
async fn savepoints(
    store: &shareflow::checkpoint::CheckpointStore,
    url: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for name in store.list_savepoints().await? {
        let path = store.savepoint_path(&name)?.to_string();
        println!("{:>12} {name}: {}", "savepoint", shareflow::control::savepoint_url(url, &path));
    }
    Ok(())
}
