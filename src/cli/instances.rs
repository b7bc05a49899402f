//! `shareflow instances`: the instances registered under a checkpoint root (decision
//! 0007), and whether each is live, retired or adopted.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use super::demo_checkpoints;

/// `shareflow instances [--checkpoints URL]`; an unknown option fails after the table.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
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
        let state = match (&r.adopted_by, r.adoption_done, r.retired) {
            (Some(by), true, _) => format!("adopted by {by}"),
            (Some(by), false, _) => format!("being adopted by {by}"),
            (None, _, true) => "retired".to_string(),
            (None, _, false) => "registered".to_string(),
        };
        let (beats, checkpoint) = r.heartbeat.map_or((String::from("-"), String::from("-")), |h| {
            (h.beat.to_string(), h.checkpoint_id.map_or(String::from("-"), |c| c.to_string()))
        });
        println!("{:<24} {:>11} {:>6} {:>10} {state}", r.prefix, r.incarnation, beats, checkpoint);
    }
    Ok(())
}
