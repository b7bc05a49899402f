//! `shareflow demo`: the exactly-once demo job on the embedded broker ([`crate::demo`]),
//! with `--kafka HOST:PORT` on a Kafka broker ([`crate::kafka_demo`]), and with
//! `--kafka` and `--instances N` as N `shareflow run` processes ([`crate::kafka_instances`]);
//! and the options the demos share.

use std::process::ExitCode;
use std::time::Duration;

use tokio::runtime::Runtime;

use super::args::{fail, Args};
use super::crash_at::crash_at;
use super::exit::report;
use crate::demo::DemoOptions;
#[cfg(feature = "kafka")]
use crate::run_options::{kafka_demo_options, kafka_instances_options};

/// `shareflow demo ...`: on Kafka if `--kafka` is given, else on the embedded broker.
pub(crate) fn command(args: &mut Args, runtime: &Runtime) -> ExitCode {
    if args.0.iter().any(|a| a == "--kafka") {
        return kafka(args, runtime);
    }
    let (options, json) = match demo_options(args).and_then(|o| args.finish().map(|()| o)) {
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
fn kafka(_args: &mut Args, _runtime: &Runtime) -> ExitCode {
    fail(super::WITHOUT_KAFKA.to_string())
}

/// `demo --kafka HOST:PORT ...`: the job in this process, or with `--instances N` as N
/// `shareflow run` processes.
#[cfg(feature = "kafka")]
fn kafka(args: &mut Args, runtime: &Runtime) -> ExitCode {
    if args.0.iter().any(|a| a == "--instances") {
        return kafka_instances(args, runtime);
    }
    let (options, json) = match kafka_demo_options(args).and_then(|o| args.finish().map(|()| o)) {
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
fn kafka_instances(args: &mut Args, runtime: &Runtime) -> ExitCode {
    let (options, json) = match kafka_instances_options(args).and_then(|o| args.finish().map(|()| o)) {
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

/// The options both demos take, checked; the rest are left in `args`.
pub(crate) fn common_options(args: &mut Args) -> Result<Common, String> {
    let interval = match args.number::<u64>("--interval")? {
        Some(0) => return Err("--interval must be > 0 ms".into()),
        ms => ms.map(Duration::from_millis),
    };
    let crashes = args.number("--crashes")?;
    let seed = args.number("--seed")?;
    let c = Common {
        records: args.number("--records")?,
        interval,
        partitions: args.number("--partitions")?,
        parallelism: args.number("--parallelism")?,
        checkpoints: args.value("--checkpoints")?,
        schedule: crash_at(args, crashes.is_some() || seed.is_some())?,
        crashes,
        seed,
        at_least_once: args.flag("--at-least-once"),
        json: args.flag("--json"),
    };
    if c.partitions == Some(0) || c.parallelism == Some(0) {
        return Err("--partitions and --parallelism must be >= 1".into());
    }
    Ok(c)
}

/// The options of `demo` on the embedded broker, and whether `--json` was given.
fn demo_options(args: &mut Args) -> Result<(DemoOptions, bool), String> {
    let c = common_options(args)?;
    let resume = args.flag("--resume");
    if resume && (c.records.is_some() || c.partitions.is_some()) {
        return Err("--resume continues the input of the run in --dir: drop --records and --partitions".into());
    }
    let d = DemoOptions::default();
    let o = DemoOptions {
        records: c.records.unwrap_or(d.records),
        interval: c.interval.unwrap_or(d.interval),
        crashes: c.crashes.unwrap_or(d.crashes),
        seed: c.seed.unwrap_or(d.seed),
        schedule: c.schedule,
        dir: args.value("--dir")?.map_or(d.dir, Into::into),
        checkpoints: c.checkpoints,
        partitions: c.partitions.unwrap_or(d.partitions),
        parallelism: c.parallelism.unwrap_or(d.parallelism),
        progress: !c.json,
        mode: if c.at_least_once { shareflow::connector::share::AcknowledgementMode::Explicit } else { d.mode },
        resume,
        instances: match args.number::<u32>("--instances")? {
            Some(0) => return Err("--instances must be >= 1".into()),
            n => n.unwrap_or(d.instances),
        },
        metrics_addr: args.value("--metrics-addr")?,
    };
    Ok((o, c.json))
}
