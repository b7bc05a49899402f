//! `shareflow run`: one instance of a job file's pipeline on an embedded broker
//! ([`crate::embedded_run`]), or one instance of a job file's pipeline or of the main job
//! on Kafka ([`crate::kafka_run`]). The options are read by [`crate::run_options`].

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use super::exit::report;
use crate::run_options::{embedded_job_file, embedded_run_options};

/// `shareflow run ...`: on an embedded broker if the job file says `broker = "DIR"` (or
/// does not load: that path reports its errors), else on Kafka.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    if embedded_job_file(args) {
        return embedded(args, runtime);
    }
    kafka(args, runtime)
}

/// `run JOB.toml` with `broker = "DIR"` in the file: until SIGTERM or Ctrl-C.
fn embedded(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let parsed = embedded_run_options(args).and_then(|o| args.finish().map(|()| o));
    let ((file, dir, checkpoints, instance), json) = match parsed {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    report(
        "run",
        runtime.block_on(crate::embedded_run::run(&file, &dir, &checkpoints, &instance)),
        json,
        |s| s.to_json(),
        |s| s.to_text(),
        |_| true,
    )
}

/// `run` on Kafka: a job file's pipeline, or the main job with `--kafka --group
/// --instance --checkpoints`.
#[cfg(feature = "kafka")]
fn kafka(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let (options, json) = match crate::run_options::run_options(args).and_then(|o| args.finish().map(|()| o)) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    report("run", runtime.block_on(crate::kafka_run::run(&options)), json, |s| s.to_json(), |s| s.to_text(), |_| true)
}

/// `run` on Kafka in a build without the `kafka` feature: refused.
#[cfg(not(feature = "kafka"))]
fn kafka(_args: &mut Args, _runtime: &Runtime) -> ExitCode {
    fail(super::WITHOUT_KAFKA.to_string())
}
