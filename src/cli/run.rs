//! `shareflow run`: one instance of a job file's pipeline on an embedded broker
//! ([`crate::embedded_run`]), or one instance of a job file's pipeline or of the main job
//! on Kafka ([`crate::kafka_run`]). The options are read by [`crate::run_options`].

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::fail;
use super::exit::report;
use super::line::RunArgs;
use crate::run_options::{embedded_job_file, embedded_run_options};

/// `shareflow run ...`: on an embedded broker if the job file says `broker = "DIR"` (or
/// does not load: that path reports its errors), else on Kafka.
pub(crate) fn command(args: RunArgs, runtime: &Runtime) -> ExitCode {
    if embedded_job_file(&args) {
        return embedded(args, runtime);
    }
    kafka(args, runtime)
}

/// `run JOB.toml` with `broker = "DIR"` in the file: until SIGTERM or Ctrl-C.
fn embedded(args: RunArgs, runtime: &Runtime) -> ExitCode {
    let o = match embedded_run_options(args) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let on = crate::embedded_run::RunOn {
        checkpoints: &o.checkpoints,
        instance: &o.instance,
        metrics_addr: o.metrics_addr.as_deref(),
        crashes: &o.crashes,
        savepoint: o.savepoint.as_deref(),
    };
    report(
        "run",
        runtime.block_on(crate::embedded_run::run(&o.job, &o.dir, &on)),
        o.json,
        |s| s.to_json(),
        |s| s.to_text(),
        |_| true,
    )
}

/// `run` on Kafka: a job file's pipeline, or the main job with `--kafka --group
/// --instance --checkpoints`.
#[cfg(feature = "kafka")]
fn kafka(args: RunArgs, runtime: &Runtime) -> ExitCode {
    let (options, json) = match crate::run_options::run_options(args) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    report("run", runtime.block_on(crate::kafka_run::run(&options)), json, |s| s.to_json(), |s| s.to_text(), |_| true)
}

/// `run` on Kafka in a build without the `kafka` feature: refused.
#[cfg(not(feature = "kafka"))]
fn kafka(_args: RunArgs, _runtime: &Runtime) -> ExitCode {
    fail(super::WITHOUT_KAFKA.to_string())
}
