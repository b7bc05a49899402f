//! `shareflow savepoint JOB.toml` and `shareflow stop JOB.toml [--savepoint [NAME]]`:
//! asks the running job over its endpoint ([`shareflow::control`]).

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::exit::admin_exit;
use super::line::{JobAddress, SavepointArgs, StopArgs};
use crate::embedded_run::BoxError;
use crate::job_file::{Backend, JobFile};

/// `shareflow savepoint JOB.toml [--name N]`.
pub(crate) fn savepoint(args: SavepointArgs, runtime: &Runtime) -> ExitCode {
    let query = match &args.name {
        Some(n) => format!("/api/savepoint?name={n}"),
        None => "/api/savepoint".to_string(),
    };
    admin_exit("savepoint", runtime.block_on(ask(&args.at, &query)))
}

/// `shareflow stop JOB.toml [--savepoint [NAME]]`.
pub(crate) fn stop(args: StopArgs, runtime: &Runtime) -> ExitCode {
    let query = match args.savepoint.as_deref() {
        None => "/api/stop".to_string(),
        Some("") => "/api/savepoint?stop=true".to_string(),
        Some(n) => format!("/api/savepoint?stop=true&name={n}"),
    };
    admin_exit("stop", runtime.block_on(ask(&args.at, &query)))
}

/// POSTs `query` to the job of `at` and prints its answer.
async fn ask(at: &JobAddress, query: &str) -> Result<(), BoxError> {
    let addr = address(at).await?;
    let (status, body) = crate::live::http_post(&addr, query, Vec::new())
        .await
        .map_err(|e| format!("no answer from the job at {addr}: {e}; is it running?"))?;
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(format!("the job at {addr} answered {status}: {}", text.trim()).into());
    }
    if at.json || !query.starts_with("/api/savepoint") {
        println!("{}", text.trim());
    } else {
        let taken: shareflow::control::SavepointTaken = serde_json::from_slice(&body)?;
        println!(
            "savepoint {} of checkpoint {}{}: {}",
            taken.name,
            taken.checkpoint_id,
            if taken.stopped { "; the job stops" } else { "" },
            taken.url
        );
    }
    Ok(())
}

/// The job's endpoint: `--addr`, else on an embedded broker the one in DIR/endpoint.
async fn address(at: &JobAddress) -> Result<String, BoxError> {
    if let Some(a) = &at.addr {
        return Ok(a.clone());
    }
    let job = JobFile::load(std::path::Path::new(&at.job)).map_err(|e| e.to_string())?;
    match &job.backend {
        Backend::Embedded(dir) => crate::live::live_endpoint(std::path::Path::new(dir)).await.ok_or_else(|| {
            format!("no job runs on {dir} (no live address in {dir}/{})", crate::live::ENDPOINT_FILE).into()
        }),
        Backend::Kafka(_) => Err(format!(
            "{}: a job on Kafka: give --addr HOST:PORT, the --metrics-addr of the running instance",
            at.job
        )
        .into()),
    }
}
