//! `shareflow produce`: each line of standard input as one record of a topic of an
//! embedded broker, the input of a job file with `broker = "DIR"`: through the job
//! that runs on the directory, if one does ([`crate::live`]), else into it directly.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::line::ProduceArgs;
use crate::run_options::produce_options;

/// `shareflow produce --dir DIR --topic T [--partitions N]`.
pub(crate) fn command(args: ProduceArgs, runtime: &Runtime) -> ExitCode {
    let options = produce_options(args);
    let stdin = std::io::stdin().lock();
    match runtime.block_on(crate::embedded_run::produce(&options.dir, &options.topic, options.partitions, stdin)) {
        Ok(n) => {
            println!("produced {n} records to {} in {}", options.topic, options.dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("shareflow produce failed: {e}");
            ExitCode::from(1)
        }
    }
}
