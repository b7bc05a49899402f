//! The `shareflow` command line.
//!
//! - `shareflow demo`: runs the main exactly-once job on the embedded broker
//!   ([`demo`]); `shareflow demo --kafka HOST:PORT` runs it on Kafka ([`kafka_demo`]).
//!   The demos are modules of this binary, not part of the library's API; tests drive
//!   them through this command line and its `--json` summary.
//! - `shareflow txn list`: lists the transactions of an embedded broker directory.
//! - `shareflow checkpoints`: lists the checkpoints of a job.
//!
//! Each command is a module of [`cli`]; this file reads the options of every command,
//! sets up logging and the async runtime, and dispatches on the command's name.

use std::process::ExitCode;

mod admin;
mod cli;
mod demo;
mod dlq;
mod embedded_run;
mod job_file;
#[cfg(feature = "kafka")]
mod kafka_demo;
#[cfg(feature = "kafka")]
mod kafka_instances;
#[cfg(feature = "kafka")]
mod kafka_run;
mod progress;
mod run_options;

use cli::args::{fail, Args};
// run_options.rs takes these from here (`use super::*`), with `Args` and the modules.
#[cfg(feature = "kafka")]
use cli::demo::common_options;
#[cfg(feature = "kafka")]
use std::time::Duration;

// admin.rs names it `crate::WITHOUT_KAFKA`.
#[cfg(not(feature = "kafka"))]
pub(crate) use cli::WITHOUT_KAFKA;

/// Reads the options of every command (`--log-format`), sets up logging and the async
/// runtime, and runs the command.
fn main() -> ExitCode {
    let mut args = Args(std::env::args().skip(1).collect());
    if args.0.is_empty() {
        return fail("no command given");
    }
    let command = args.0.remove(0);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let json_logs = match args.value("--log-format") {
        Ok(None) => false,
        Ok(Some(f)) if f == "text" => false,
        Ok(Some(f)) if f == "json" => true,
        Ok(Some(f)) => return fail(format!("--log-format {f:?}: give text (the default) or json")),
        Err(e) => return fail(e),
    };
    let filter = || tracing_subscriber::EnvFilter::try_from_env("SHAREFLOW_LOG").unwrap_or_else(|_| "error".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter()).with_writer(std::io::stderr);
    let _ = if json_logs { logs.json().try_init() } else { logs.try_init() };
    match command.as_str() {
        "demo" => cli::demo::command(&mut args, &runtime),
        "run" => cli::run::command(&mut args, &runtime),
        "produce" => cli::produce::command(&mut args, &runtime),
        "txn" => cli::txn::command(&mut args, &runtime),
        "checkpoints" => cli::checkpoints::command(&mut args, &runtime),
        "instances" => cli::instances::command(&mut args, &runtime),
        "dlq" => cli::dlq::command(&mut args, &runtime),
        "help" | "--help" | "-h" => {
            println!("{}", cli::usage::USAGE);
            ExitCode::SUCCESS
        }
        other => fail(format!("unknown command {other:?}")),
    }
}
