//! `shareflow demo`: the exactly-once demo job on the embedded broker ([`crate::demo`]),
//! with `--kafka HOST:PORT` on a Kafka broker ([`crate::kafka_demo`]), and with
//! `--kafka` and `--instances N` as N `shareflow run` processes ([`crate::kafka_instances`]);
//! and the options the demos share.

use std::process::ExitCode;
use std::time::Duration;

use tokio::runtime::Runtime;

use super::args::fail;
use super::crash_at::crash_at;
use super::exit::report;
use super::line::{CommonDemoArgs, DemoArgs};
use crate::demo::DemoOptions;
#[cfg(feature = "kafka")]
use crate::run_options::{kafka_demo_options, kafka_instances_options};

/// `shareflow demo ...`: on Kafka if `--kafka` is given, else on the embedded broker.
pub(crate) fn command(args: DemoArgs, runtime: &Runtime) -> ExitCode {
    if args.kafka.is_some() {
        return kafka(args, runtime);
    }
    let (options, json) = match demo_options(args) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    report(
        "demo",
        runtime.block_on(crate::demo::run(&options)),
        json,
        |s| s.to_json(),
        |s| s.to_text(),
        |s| s.violations.is_empty(),
    )
}

/// `demo --kafka ...` in a build without the `kafka` feature: refused.
#[cfg(not(feature = "kafka"))]
fn kafka(_args: DemoArgs, _runtime: &Runtime) -> ExitCode {
    fail(super::WITHOUT_KAFKA.to_string())
}

/// `demo --kafka HOST:PORT ...`: the job in this process, or with `--instances N` as N
/// `shareflow run` processes.
#[cfg(feature = "kafka")]
fn kafka(args: DemoArgs, runtime: &Runtime) -> ExitCode {
    if args.instances.is_some() {
        return kafka_instances(args, runtime);
    }
    let (options, json) = match kafka_demo_options(args) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    report(
        "demo --kafka",
        runtime.block_on(crate::kafka_demo::run(&options)),
        json,
        |s| s.to_json(),
        |s| s.to_text(),
        // At-least-once may repeat records; it must never lose one.
        |s| !options.verify || (s.lost == 0 && (s.duplicates == 0 || !options.exactly_once)),
    )
}

/// `demo --kafka HOST:PORT --instances N ...`: N `shareflow run` processes in one share
/// group, killed and restarted on a seeded schedule.
#[cfg(feature = "kafka")]
fn kafka_instances(args: DemoArgs, runtime: &Runtime) -> ExitCode {
    let (options, json) = match kafka_instances_options(args) {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    if options.progress {
        eprintln!("schedule seed {} (replay it with --seed {})", options.seed, options.seed);
    }
    report(
        "demo --kafka --instances",
        // A failure names the seed, so that the schedule can be replayed.
        runtime
            .block_on(crate::kafka_instances::run(&options))
            .map_err(|e| format!("{e} (seed {})", options.seed).into()),
        json,
        |s| s.to_json(),
        |s| s.to_text(),
        |s| s.clean(),
    )
}

/// Options both demos take.
pub(crate) struct Common {
    pub(crate) records: Option<u64>,
    pub(crate) interval: Option<Duration>,
    pub(crate) partitions: Option<u32>,
    pub(crate) parallelism: Option<u32>,
    pub(crate) checkpoints: Option<String>,
    pub(crate) crashes: Option<usize>,
    pub(crate) seed: Option<u64>,
    pub(crate) schedule: Option<Vec<(String, u32)>>,
    pub(crate) at_least_once: bool,
    pub(crate) json: bool,
}

/// The options both demos take, checked.
pub(crate) fn common_options(args: &CommonDemoArgs) -> Result<Common, String> {
    Ok(Common {
        records: args.records,
        interval: args.interval.map(Duration::from_millis),
        partitions: args.partitions,
        parallelism: args.parallelism,
        checkpoints: args.checkpoints.clone(),
        schedule: crash_at(&args.crash_at, args.crashes.is_some() || args.seed.is_some())?,
        crashes: args.crashes,
        seed: args.seed,
        at_least_once: args.at_least_once,
        json: args.json,
    })
}

/// The options of `demo` on the embedded broker, and whether `--json` was given.
fn demo_options(args: DemoArgs) -> Result<(DemoOptions, bool), String> {
    instances_only(&args, "--kafka --instances")?;
    let c = common_options(&args.common)?;
    let d = DemoOptions::default();
    let o = DemoOptions {
        records: c.records.unwrap_or(d.records),
        interval: c.interval.unwrap_or(d.interval),
        crashes: c.crashes.unwrap_or(d.crashes),
        seed: c.seed.unwrap_or(d.seed),
        schedule: c.schedule,
        dir: args.dir.map_or(d.dir, Into::into),
        checkpoints: c.checkpoints,
        partitions: c.partitions.unwrap_or(d.partitions),
        parallelism: c.parallelism.unwrap_or(d.parallelism),
        progress: !c.json,
        mode: if c.at_least_once { shareflow::connector::share::AcknowledgementMode::Explicit } else { d.mode },
        resume: args.resume,
        instances: args.instances.unwrap_or(d.instances),
        metrics_addr: args.common.metrics_addr,
    };
    Ok((o, c.json))
}

/// Refuses the options of `demo --kafka --instances` (the processes' schedule) elsewhere.
pub(crate) fn instances_only(args: &DemoArgs, needs: &str) -> Result<(), String> {
    let given = [
        ("--kills", args.kills.is_some()),
        ("--checkpoint-timeout", args.checkpoint_timeout.is_some()),
        ("--adoption-timeout", args.adoption_timeout.is_some()),
        ("--logs", args.logs.is_some()),
    ];
    match given.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(format!("{flag} is an option of the processes of demo {needs}")),
        None => Ok(()),
    }
}
