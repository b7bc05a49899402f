//! `shareflow produce`: each line of standard input as one record of a topic of an
//! embedded broker, the input of a job file with `broker = "DIR"`.

use std::process::ExitCode;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use crate::run_options::produce_options;

/// `shareflow produce --dir DIR --topic T [--partitions N]`.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let options = match produce_options(args).and_then(|o| args.finish().map(|()| o)) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let stdin = std::io::stdin().lock();
    match runtime.block_on(crate::embedded_run::produce(&options.dir, &options.topic, options.partitions, stdin)) {
        Ok(n) => {
            println!("produced {n} records to {} in {}", options.topic, options.dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("produce: {e}")),
    }
}
