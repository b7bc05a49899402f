//! The `shareflow` command line.
//!
//! - `shareflow demo`: runs the main exactly-once job on the embedded broker.
//! - `shareflow txn list`: lists the transactions of an embedded broker directory.
//! - `shareflow checkpoints`: lists the checkpoints of a job.

use std::process::ExitCode;
use std::time::Duration;

use shareflow::demo::{self, DemoOptions};

const USAGE: &str = "usage: shareflow <command> [options]

commands:
  demo         run the exactly-once demo job on the embedded broker
    --records N          records to produce (default 1000000)
    --interval MS        checkpoint interval in ms (default 500)
    --crashes K          crashes to inject at random fault points (default 3, at most 8)
    --seed S             seed of the crash schedule (default 1)
    --dir PATH           broker and checkpoint directory, cleared first (default ./target/shareflow-demo)
    --resume             continue the run a stopped or killed demo left in --dir: produce only
                         what it had not produced, recover, run to the end, check the whole input
    --checkpoints URL    checkpoint storage: file://..., memory://..., s3://... (default file://DIR/checkpoints)
    --partitions P       topic partitions (default 4)
    --parallelism P      job parallelism (default 2)
    --at-least-once      explicit acknowledgement instead of transactions
    --json               print the summary as one JSON object on the last line
  demo --kafka HOST:PORT   run the same job against a real Kafka 4.x broker
    --name NAME          group, topics NAME-input/NAME-output and job id (default: fresh)
    --records N          records to produce first; 0 resumes without producing (default 100000)
    --value-bytes B      bytes per record value (default 100)
    --interval MS        checkpoint interval (default 1000)
    --partitions P, --parallelism P, --checkpoints URL, --at-least-once, --json as above
    --crashes K --seed S crashes at K of the in-process fault points
    --no-verify          skip the read_committed check at the end
    --max-rate R         at most R records per second through the job
  txn list     list the transactions of an embedded broker
    --dir PATH           the broker directory (default ./target/shareflow-demo/broker)
  checkpoints  list a job's checkpoints
    --checkpoints URL    storage (default file://$PWD/target/shareflow-demo/checkpoints)
    --job NAME           job id (default demo)
  help         print this message";

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("shareflow: {message}\n\n{USAGE}");
    ExitCode::from(2)
}

struct Args(Vec<String>);

impl Args {
    fn flag(&mut self, name: &str) -> bool {
        match self.0.iter().position(|a| a == name) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }

    fn value(&mut self, name: &str) -> Result<Option<String>, String> {
        match self.0.iter().position(|a| a == name) {
            Some(i) if i + 1 < self.0.len() => {
                let v = self.0.remove(i + 1);
                self.0.remove(i);
                Ok(Some(v))
            }
            Some(_) => Err(format!("{name} needs a value")),
            None => Ok(None),
        }
    }

    fn number<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.value(name)?.map(|v| v.parse().map_err(|_| format!("{name} {v:?} is not a valid number"))).transpose()
    }

    fn finish(&self) -> Result<(), String> {
        match self.0.first() {
            Some(extra) => Err(format!("unknown argument {extra:?}")),
            None => Ok(()),
        }
    }
}

/// Options both demos take.
struct Common {
    records: Option<u64>,
    interval: Option<Duration>,
    partitions: Option<u32>,
    parallelism: Option<u32>,
    checkpoints: Option<String>,
    crashes: Option<usize>,
    seed: Option<u64>,
    at_least_once: bool,
    json: bool,
}

fn common_options(args: &mut Args) -> Result<Common, String> {
    let interval = match args.number::<u64>("--interval")? {
        Some(0) => return Err("--interval must be > 0 ms".into()),
        ms => ms.map(Duration::from_millis),
    };
    let c = Common {
        records: args.number("--records")?,
        interval,
        partitions: args.number("--partitions")?,
        parallelism: args.number("--parallelism")?,
        checkpoints: args.value("--checkpoints")?,
        crashes: args.number("--crashes")?,
        seed: args.number("--seed")?,
        at_least_once: args.flag("--at-least-once"),
        json: args.flag("--json"),
    };
    if c.partitions == Some(0) || c.parallelism == Some(0) {
        return Err("--partitions and --parallelism must be >= 1".into());
    }
    Ok(c)
}

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
        dir: args.value("--dir")?.map_or(d.dir, Into::into),
        checkpoints: c.checkpoints,
        partitions: c.partitions.unwrap_or(d.partitions),
        parallelism: c.parallelism.unwrap_or(d.parallelism),
        progress: !c.json,
        mode: if c.at_least_once { shareflow::connector::share::AcknowledgementMode::Explicit } else { d.mode },
        resume,
    };
    Ok((o, c.json))
}

fn kafka_demo_options(args: &mut Args) -> Result<(shareflow::kafka_demo::KafkaDemoOptions, bool), String> {
    let bootstrap = args.value("--kafka")?.ok_or("--kafka needs HOST:PORT")?;
    let c = common_options(args)?;
    let mut o = shareflow::kafka_demo::KafkaDemoOptions::new(&bootstrap);
    if let Some(n) = args.value("--name")? {
        o.name = n;
    }
    if let Some(b) = args.number::<usize>("--value-bytes")? {
        if b < 16 {
            return Err("--value-bytes must be >= 16".into());
        }
        o.value_len = b;
    }
    o.records = c.records.unwrap_or(o.records);
    o.interval = c.interval.unwrap_or(o.interval);
    o.partitions = c.partitions.unwrap_or(o.partitions);
    o.parallelism = c.parallelism.unwrap_or(o.parallelism);
    o.checkpoints = c.checkpoints;
    o.exactly_once = !c.at_least_once;
    o.verify = !args.flag("--no-verify");
    o.max_rate = args.number("--max-rate")?;
    if o.max_rate == Some(0) {
        return Err("--max-rate must be >= 1".into());
    }
    let points = shareflow::kafka_demo::FAULT_POINTS;
    let crashes = c.crashes.unwrap_or(0);
    if crashes > points.len() {
        return Err(format!("--crashes {crashes} is more than the {} fault points", points.len()));
    }
    o.crashes = demo::schedule_from(points, c.seed.unwrap_or(1), crashes)
        .into_iter()
        .map(|(p, s)| (p.to_string(), s))
        .collect();
    o.progress = !c.json;
    Ok((o, c.json))
}

/// Prints a demo's summary and turns its outcome into the exit code.
fn report<S>(
    what: &str,
    outcome: Result<S, Box<dyn std::error::Error + Send + Sync>>,
    json: bool,
    to_json: impl Fn(&S) -> String,
    to_text: impl Fn(&S) -> String,
    clean: impl Fn(&S) -> bool,
) -> ExitCode {
    match outcome {
        Ok(summary) => {
            println!("{}", if json { to_json(&summary) } else { to_text(&summary) });
            if clean(&summary) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("shareflow {what} failed: {e}");
            ExitCode::from(1)
        }
    }
}

async fn txn_list(args: &mut Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = args.value("--dir")?.unwrap_or_else(|| "target/shareflow-demo/broker".into());
    if !std::path::Path::new(&dir).join("broker").exists() {
        return Err(format!("no embedded broker in {dir}").into());
    }
    // Read-only: changes nothing on disk and works while a job's broker holds the
    // directory.
    let broker = shareflow::connector::broker::EmbeddedBroker::open_read_only(
        shareflow::connector::broker::BrokerOptions::local_dir(&dir)?,
    )
    .await?;
    println!("{:<40} {:<10} {:>6} {:>14} {:>10}", "transaction", "state", "epoch", "pending acks", "produced");
    for t in broker.transactions().await? {
        println!(
            "{:<40} {:<10} {:>6} {:>14} {:>10}",
            t.id.to_string(),
            t.state.to_string(),
            t.epoch,
            t.pending_ack_records,
            t.produced_records
        );
    }
    Ok(())
}

async fn checkpoints(args: &mut Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let default = format!("file://{}/target/shareflow-demo/checkpoints", std::env::current_dir()?.display());
    let url = args.value("--checkpoints")?.unwrap_or(default);
    let job = args.value("--job")?.unwrap_or_else(|| "demo".into());
    let store = shareflow::checkpoint::CheckpointStore::from_url(&url, &[], &job)?;
    println!("{:>12} {:<40} {:>6} {:>12} transactions", "checkpoint", "status", "files", "state bytes");
    for c in store.list_checkpoints().await? {
        let txns = c
            .manifest
            .map(|m| m.transactions.iter().map(|t| t.transaction_id.clone()).collect::<Vec<_>>().join(","))
            .unwrap_or_default();
        println!(
            "{:>12} {:<40} {:>6} {:>12} {txns}",
            c.checkpoint_id,
            format!("{:?}", c.status),
            c.state_files,
            c.state_bytes
        );
    }
    Ok(())
}

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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHAREFLOW_LOG").unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    match command.as_str() {
        "demo" if args.0.iter().any(|a| a == "--kafka") => {
            let (options, json) = match kafka_demo_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            report(
                "demo --kafka",
                runtime.block_on(shareflow::kafka_demo::run(&options)),
                json,
                |s| s.to_json(),
                |s| s.to_text(),
                |s| !options.verify || (s.duplicates == 0 && s.lost == 0),
            )
        }
        "demo" => {
            let (options, json) = match demo_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            report(
                "demo",
                runtime.block_on(demo::run(&options)),
                json,
                |s| s.to_json(),
                |s| s.to_text(),
                |s| s.violations.is_empty(),
            )
        }
        "txn" if args.0.first().map(String::as_str) == Some("list") => {
            args.0.remove(0);
            match runtime.block_on(txn_list(&mut args)).and_then(|()| args.finish().map_err(Into::into)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        "checkpoints" => {
            match runtime.block_on(checkpoints(&mut args)).and_then(|()| args.finish().map_err(Into::into)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => fail(format!("unknown command {other:?}")),
    }
}
