//! `shareflow checkpoints`: the checkpoints of a job, as a table, and with `inspect N`
//! one checkpoint read back and checked ([`crate::admin::inspect_checkpoint`]).

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use super::demo_checkpoints;
use super::exit::admin_exit;

/// `shareflow checkpoints [inspect N] ...`.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    if args.0.first().map(String::as_str) == Some("inspect") {
        args.0.remove(0);
        return inspect(args, runtime);
    }
    admin_exit("checkpoints", runtime.block_on(list(args)))
}

/// `checkpoints inspect N`: one checkpoint, its manifest, transactions and state files.
fn inspect(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let (url, job, id, json) = match inspect_options(args) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    admin_exit("checkpoints inspect", runtime.block_on(crate::admin::inspect_checkpoint(&url, &job, id, json)))
}

/// The options of `checkpoints inspect N`: the checkpoint root, the job, the checkpoint's
/// id and whether `--json` was given.
fn inspect_options(args: &mut Args) -> Result<(String, String, u64, bool), String> {
    let id = match args.0.first() {
        Some(n) if !n.starts_with("--") => {
            let n = args.0.remove(0);
            n.parse().map_err(|_| format!("checkpoints inspect {n:?}: not a checkpoint id"))?
        }
        _ => return Err("checkpoints inspect needs a checkpoint id: checkpoints inspect N".into()),
    };
    let url = args.value("--checkpoints")?.unwrap_or_else(demo_checkpoints);
    let job = args.value("--job")?.unwrap_or_else(|| "demo".into());
    let json = args.flag("--json");
    args.finish()?;
    Ok((url, job, id, json))
}

/// `shareflow checkpoints`: a table of a job's checkpoints, or why there is none.
async fn list(args: &mut Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = args.value("--checkpoints")?.unwrap_or_else(demo_checkpoints);
    let job = args.value("--job")?.unwrap_or_else(|| "demo".into());
    // Every option is checked before anything is read.
    args.finish()?;
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
    Ok(())
}
