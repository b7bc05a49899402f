//! The `shareflow` command line.
//!
//! - `shareflow demo`: runs the main exactly-once job on the embedded broker
//!   ([`demo`]); `shareflow demo --kafka HOST:PORT` runs it on Kafka ([`kafka_demo`]).
//!   The demos are modules of this binary, not part of the library's API; tests drive
//!   them through this command line and its `--json` summary.
//! - `shareflow txn list`: lists the transactions of an embedded broker directory.
//! - `shareflow checkpoints`: lists the checkpoints of a job.
//!
//! The command line is declared in [`cli::line`]; each command is a module of [`cli`].
//! This file parses it, sets up logging and the async runtime, and dispatches.

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
mod kafka_job;
#[cfg(feature = "kafka")]
mod kafka_run;
mod live;
mod progress;
mod run_options;
mod running;

use clap::Parser;

use cli::args::fail;
use cli::line::{Cli, Command, LogFormat};
// run_options.rs takes these from here (`use super::*`), with the modules.
#[cfg(feature = "kafka")]
use cli::demo::common_options;
#[cfg(feature = "kafka")]
use std::time::Duration;

// admin.rs names it `crate::WITHOUT_KAFKA`.
#[cfg(not(feature = "kafka"))]
pub(crate) use cli::WITHOUT_KAFKA;

/// Parses the command line (clap prints help, or a usage error with exit code 2), sets
/// up logging and the async runtime, and runs the command.
fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let filter = || tracing_subscriber::EnvFilter::try_from_env("SHAREFLOW_LOG").unwrap_or_else(|_| "error".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter()).with_writer(std::io::stderr);
    let _ = if cli.log_format == LogFormat::Json { logs.json().try_init() } else { logs.try_init() };
    match cli.command {
        Command::Demo(args) => cli::demo::command(*args, &runtime),
        Command::Run(args) => cli::run::command(*args, &runtime),
        Command::Savepoint(args) => cli::savepoint::savepoint(args, &runtime),
        Command::Stop(args) => cli::savepoint::stop(args, &runtime),
        Command::Produce(args) => cli::produce::command(args, &runtime),
        Command::Consume(args) => cli::consume::command(args, &runtime),
        Command::Txn(command) => cli::txn::command(command, &runtime),
        Command::Checkpoints(args) => cli::checkpoints::command(args, &runtime),
        Command::Instances(args) => cli::instances::command(args, &runtime),
        Command::Dlq(command) => cli::dlq::command(command, &runtime),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "shareflow",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}
