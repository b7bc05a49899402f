//! The `shareflow` command line.
//!
//! - `shareflow demo`: runs the main exactly-once job on the embedded broker
//!   ([`demo`]); `shareflow demo --kafka HOST:PORT` runs it on Kafka ([`kafka_demo`]).
//!   The demos are modules of this binary, not part of the library's API; tests drive
//!   them through this command line and its `--json` summary.
//! - `shareflow txn list`: lists the transactions of an embedded broker directory.
//! - `shareflow checkpoints`: lists the checkpoints of a job.

use std::process::ExitCode;
use std::time::Duration;

mod admin;
mod demo;
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

use run_options::*;

use demo::DemoOptions;

/// What a command that needs Kafka says in a build without the `kafka` feature.
#[cfg(not(feature = "kafka"))]
pub(crate) const WITHOUT_KAFKA: &str = "this shareflow was built without the kafka feature (--no-default-features); \
     build it with `cargo build --release` (the feature is on by default), or `cargo build --release --features kafka`";

const USAGE: &str = "usage: shareflow <command> [options]

options of every command:
  --log-format text|json  how logs (SHAREFLOW_LOG=info, ...) are written to stderr: text
                       (default) or one JSON object per line

progress: on a terminal demo and run show a live bar; elsewhere (and under --json) a plain
line per second (SHAREFLOW_PROGRESS=plain forces lines)

commands:
  demo         run the exactly-once demo job on the embedded broker
    --records N          records to produce (default 1000000)
    --interval MS        checkpoint interval in ms (default 100)
    --crashes K          crashes to inject at random fault points (default 3, at most 8)
    --seed S             seed of the crash schedule (default 1)
    --crash-at POINT[:N] crash at the (N+1)-th hit of fault point POINT (N default 0); repeat
                         it for more crashes, all armed at once; replaces --crashes and --seed.
                         POINT: source.after_poll, source.after_lock, sink.after_write,
                         checkpoint.after_state_before_manifest, checkpoint.after_manifest,
                         commit.before, commit.mid, commit.after_broker_before_notify,
                         recovery.mid, recovery.after (a point the run does not reach does not fire)
    --dir PATH           broker and checkpoint directory, cleared first (default ./target/shareflow-demo)
    --resume             continue the run a stopped or killed demo left in --dir: produce only
                         what it had not produced, recover, run to the end, check the whole input
                         (SIGTERM or Ctrl-C stops a run gracefully: a final checkpoint, then the
                         summary says stopped; --resume finishes it)
    --checkpoints URL    checkpoint storage: file://..., memory://..., s3://... (default file://DIR/checkpoints)
    --partitions P       topic partitions (default 4)
    --parallelism P      job parallelism (default 2)
    --at-least-once      explicit acknowledgement instead of transactions
    --instances N        run N instances of the job in one share group, in this process: the
                         seeded crashes hit instances 2..N (which restart), instance 1 dies for
                         good and is adopted, one more instance joins late (default 1)
    --json               print the summary as one JSON object on the last line
    --metrics-addr HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics while it
                         runs (port 0: any free one; the address is printed); one job only
  demo --kafka HOST:PORT   run the same job against a real Kafka 4.x broker (this and `run`
                         on Kafka need the kafka feature, on by default)
    --name NAME          group, topics NAME-input/NAME-output and job id (default: fresh)
    --records N          records to produce first; 0 resumes without producing (default 100000)
    --value-bytes B      bytes per record value (default 100)
    --interval MS        checkpoint interval (default 1000)
    --partitions P, --parallelism P, --checkpoints URL, --at-least-once, --json as above
    --crashes K --seed S crashes at K of the in-process fault points
    --crash-at POINT[:N] as above
    --no-verify          skip the read_committed check at the end (with --at-least-once the
                         check passes when nothing is lost: duplicates are allowed)
    --max-rate R         at most R records per second through the job
    --metrics-addr HOST:PORT  as above
  demo --kafka HOST:PORT --instances N
               run N `shareflow run` processes of the job in one share group, then check the
               output read_committed; --json adds per-instance counts and the adoptions
    --kills K            K SIGKILLs of random instances at seeded moments, each restarted; with
                         K >= 1 also: i1 is killed for good first (and adopted), a new instance
                         joins halfway, and one is paused with SIGSTOP past the adoption
                         timeout, then resumed (it must stop fenced) (default 0)
    --seed S             seed of the schedule (default: the clock; printed)
    --name, --records, --value-bytes, --partitions, --parallelism, --checkpoints as above
    --interval MS        checkpoint interval (default 500)
    --checkpoint-timeout MS, --adoption-timeout MS  as for run (defaults 3000, 5000)
    --max-rate R         at most R records per second through each instance
    --logs DIR           append each instance process's whole stderr to DIR/ID.log (set
                         SHAREFLOW_LOG for more than warnings)
  run JOB.toml [--instance ID] [--kafka HOST:PORT] [--checkpoints URL] [--metrics-addr A] [--json]
               run one instance of your own pipeline from a job file (source, SQL
               transforms, sink, checkpoints; examples/jobs/*.toml); the whole file is
               checked first, and each error names its line and key. With broker = \"DIR\"
               in the file (instead of kafka = ...) it runs on an embedded broker in DIR,
               no server needed, until SIGTERM or Ctrl-C
  produce --dir DIR --topic T [--partitions N]
               append each line of standard input as one record (its value) to topic T of
               the embedded broker in DIR (created with N partitions, default 4, if
               missing); the input of a job file with broker = \"DIR\"
  run --kafka HOST:PORT --group G --instance ID --checkpoints URL
               run one instance of the main job in share group G on a real Kafka 4.x broker,
               until SIGTERM or Ctrl-C (a final checkpoint, then it retires). Start more with
               other IDs and the same G and URL: exactly-once holds across them, and a live
               instance adopts one silent for longer than the adoption timeout
    --input T, --output T  topics (default G-input, G-output)
    --interval MS        checkpoint interval (default 1000)
    --checkpoint-timeout MS  how long a checkpoint may take (default 10000)
    --adoption-timeout MS  silence before adoption (default 30000; more than interval plus
                         checkpoint timeout); the instance beats every quarter of it, at
                         most every interval
    --parallelism P      subtasks per operator (default 2)
    --partitions P       partitions of topics this instance creates (default 4)
    --max-rate R         at most R records per second through this instance
    --metrics-addr HOST:PORT  serve this instance's Prometheus metrics (as for demo)
    --json               print the summary as one JSON object on the last line
  txn list     list transactions: id, state, age, timeout; on the embedded broker also the
               acknowledgements staged and records produced, and with --checkpoints the
               checkpoint whose manifest decides each (read-only, safe next to a live job)
    --dir PATH           an embedded broker's directory (default ./target/shareflow-demo/broker)
    --kafka HOST:PORT    a Kafka broker instead (ids G-P-gN-sK: the slot pool, decision 0008;
                         every --kafka needs the kafka feature, on by default)
    --group G, --prefix P  only the transactions of share group G (and its instance P)
    --checkpoints URL    the checkpoint root of the group's instances (embedded broker)
    --json               one JSON array
  txn resolve --checkpoints URL --group G --prefix P
               decide what a stopped job left pending, as its restart would: commit what a
               complete checkpoint covers, abort the rest; refused while the job runs
    --dir PATH           the broker directory (default ./target/shareflow-demo/broker)
    --kafka HOST:PORT    a Kafka broker instead (the prefix's prepared transactions)
    --dry-run            print what it would do, change nothing (safe next to a live job)
    --json               one JSON array
  txn commit|abort ID --group G --checkpoints URL
               decide one transaction of a stopped job by hand (ID: G-P-N); refused when
               the job's checkpoints decided otherwise (a commit no complete checkpoint
               covers, an abort of one that one covers) unless --force, and while the job
               runs (embedded: its broker holds the directory; Kafka: its heartbeat moves)
    --dir PATH | --kafka HOST:PORT  the broker (default the demo's embedded directory)
    --force              act against the checkpoints (exactly-once does not hold then)
    --json               one JSON object
  checkpoints  list a job's checkpoints
    --checkpoints URL    storage (default file://$PWD/target/shareflow-demo/checkpoints)
    --job NAME           job id (default demo)
  checkpoints inspect N  one checkpoint: its manifest, the transactions it decides, its
               state files, each read back and checked (size, CRC-32C); --checkpoints,
               --job as above, --json
  instances    list the instances registered under a checkpoint root: incarnation, last
               heartbeat, and whether each is live, retired or adopted (and by whom)
    --checkpoints URL    the shared checkpoint root (default file://$PWD/target/shareflow-demo/checkpoints)
  help         print this message";

/// The exit of an admin command that ran: 0, or 1 with `shareflow {what} failed: ...`
/// (no usage text: the options were fine).
fn admin_exit(what: &str, outcome: Result<(), Box<dyn std::error::Error + Send + Sync>>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shareflow {what} failed: {e}");
            ExitCode::from(1)
        }
    }
}

/// The demo's checkpoint root, the default of the admin commands' `--checkpoints`.
fn demo_checkpoints() -> String {
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
    format!("file://{cwd}/target/shareflow-demo/checkpoints")
}

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

/// A bad `--crash-at` value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CrashAtError {
    /// The point is not one of the fault points.
    UnknownPoint {
        /// The name given.
        point: String,
    },
    /// The hit count after `:` is not a number.
    BadSkip {
        /// The whole value given.
        value: String,
    },
    /// The same point named twice.
    Repeated {
        /// The point.
        point: String,
    },
    /// `--crash-at` given with `--crashes` or `--seed`.
    WithSeededCrashes,
}

impl std::fmt::Display for CrashAtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CrashAtError::UnknownPoint { point } => {
                write!(f, "--crash-at {point:?} is not a fault point; use one of: {}", fault_point_names().join(", "))
            }
            CrashAtError::BadSkip { value } => {
                write!(f, "--crash-at {value:?}: the part after ':' must be a number of hits to let pass (POINT[:N])")
            }
            CrashAtError::Repeated { point } => {
                write!(f, "--crash-at names {point:?} twice: give each fault point at most once")
            }
            CrashAtError::WithSeededCrashes => {
                write!(f, "--crash-at gives the crash schedule itself: drop --crashes and --seed")
            }
        }
    }
}

impl std::error::Error for CrashAtError {}

/// Every fault point a `--crash-at` may name: the connector's and the runtime's.
fn fault_point_names() -> Vec<&'static str> {
    shareflow::connector::points::ALL.iter().chain(shareflow::runtime::failpoint::points::ALL).copied().collect()
}

/// Parses one `--crash-at POINT[:N]` value into `(point, skip)`.
fn parse_crash_at(value: &str) -> Result<(String, u32), CrashAtError> {
    let (point, skip) = match value.split_once(':') {
        Some((p, n)) => (p, n.parse().map_err(|_| CrashAtError::BadSkip { value: value.to_string() })?),
        None => (value, 0),
    };
    if !fault_point_names().contains(&point) {
        return Err(CrashAtError::UnknownPoint { point: point.to_string() });
    }
    Ok((point.to_string(), skip))
}

/// Every `--crash-at` of the command line, in order; `None` if there is none.
fn crash_at(args: &mut Args, seeded: bool) -> Result<Option<Vec<(String, u32)>>, String> {
    let mut schedule: Vec<(String, u32)> = Vec::new();
    while let Some(v) = args.value("--crash-at")? {
        let (point, skip) = parse_crash_at(&v).map_err(|e| e.to_string())?;
        if schedule.iter().any(|(p, _)| *p == point) {
            return Err(CrashAtError::Repeated { point }.to_string());
        }
        schedule.push((point, skip));
    }
    if schedule.is_empty() {
        return Ok(None);
    }
    if seeded {
        return Err(CrashAtError::WithSeededCrashes.to_string());
    }
    Ok(Some(schedule))
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
    schedule: Option<Vec<(String, u32)>>,
    at_least_once: bool,
    json: bool,
}

fn common_options(args: &mut Args) -> Result<Common, String> {
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

fn txn_resolve_options(args: &mut Args) -> Result<admin::TxnResolve, String> {
    admin::TxnResolve::new(
        admin::TxnSource::from_options(args.value("--dir")?, args.value("--kafka")?)?,
        args.value("--checkpoints")?,
        args.value("--group")?,
        args.value("--prefix")?,
        args.flag("--dry-run"),
        args.flag("--json"),
    )
}

fn txn_decide_options(op: admin::TxnOp, args: &mut Args) -> Result<admin::TxnDecide, String> {
    let id = match args.0.first() {
        Some(a) if !a.starts_with("--") => Some(args.0.remove(0)),
        _ => None,
    };
    admin::TxnDecide::new(
        op,
        id,
        admin::TxnSource::from_options(args.value("--dir")?, args.value("--kafka")?)?,
        args.value("--group")?,
        args.value("--checkpoints")?,
        args.flag("--force"),
        args.flag("--json"),
    )
}

fn txn_list_options(args: &mut Args) -> Result<admin::TxnList, String> {
    admin::TxnList::new(
        args.value("--dir")?,
        args.value("--kafka")?,
        args.value("--group")?,
        args.value("--prefix")?,
        args.value("--checkpoints")?,
        args.flag("--json"),
    )
}

async fn checkpoints(args: &mut Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = args.value("--checkpoints")?.unwrap_or_else(demo_checkpoints);
    let job = args.value("--job")?.unwrap_or_else(|| "demo".into());
    // Every option is checked before anything is read.
    args.finish()?;
    let store = shareflow::checkpoint::CheckpointStore::from_url(&url, &[], &job)?;
    let list = store.list_checkpoints().await?;
    if list.is_empty() {
        // Say why there is nothing, rather than print an empty table.
        let jobs = store.list_jobs().await?;
        if jobs.is_empty() {
            return Err(format!("nothing is stored under {url}: check --checkpoints").into());
        }
        if !jobs.contains(&job) {
            return Err(format!(
                "job {job} has nothing under {url}; jobs there: {} (pick one with --job)",
                jobs.join(", ")
            )
            .into());
        }
        println!("job {job} under {url} has no checkpoints yet");
        return Ok(());
    }
    println!(
        "{:>12} {:<40} {:>6} {:>6} {:>6} {:>12} transactions",
        "checkpoint", "status", "states", "inline", "files", "state bytes"
    );
    for c in list {
        // What the manifest records (inline states included); without a valid manifest,
        // only the objects found in storage.
        let (states, inline, bytes, txns) = match &c.manifest {
            Some(m) => (
                m.state_files.len().to_string(),
                m.state_files.iter().filter(|f| f.inline.is_some()).count().to_string(),
                m.state_bytes(),
                m.transactions.iter().map(|t| t.transaction_id.clone()).collect::<Vec<_>>().join(","),
            ),
            None => ("-".into(), "-".into(), c.state_bytes, String::new()),
        };
        println!(
            "{:>12} {:<40} {states:>6} {inline:>6} {:>6} {bytes:>12} {txns}",
            c.checkpoint_id,
            format!("{:?}", c.status),
            c.state_files,
        );
    }
    Ok(())
}

/// `shareflow instances`: every instance registered under a checkpoint root (decision
/// 0007), with its incarnation, last heartbeat and whether it retired or was adopted.
async fn instances(args: &mut Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = args.value("--checkpoints")?.unwrap_or_else(demo_checkpoints);
    // Any job id opens the root; the registry lives beside every job's checkpoints.
    let registry = shareflow::checkpoint::CheckpointStore::from_url(&url, &[], "instances")?.registry();
    println!("{:<24} {:>11} {:>6} {:>10} state", "instance", "incarnation", "beats", "checkpoint");
    for r in registry.observe().await? {
        let state = match (&r.adopted_by, r.adoption_done, r.retired) {
            (Some(by), true, _) => format!("adopted by {by}"),
            (Some(by), false, _) => format!("being adopted by {by}"),
            (None, _, true) => "retired".to_string(),
            (None, _, false) => "registered".to_string(),
        };
        let (beats, checkpoint) = r.heartbeat.map_or((String::from("-"), String::from("-")), |h| {
            (h.beat.to_string(), h.checkpoint_id.map_or(String::from("-"), |c| c.to_string()))
        });
        println!("{:<24} {:>11} {:>6} {:>10} {state}", r.prefix, r.incarnation, beats, checkpoint);
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
        #[cfg(not(feature = "kafka"))]
        "demo" if args.0.iter().any(|a| a == "--kafka") => fail(WITHOUT_KAFKA.to_string()),
        #[cfg(feature = "kafka")]
        "demo" if args.0.iter().any(|a| a == "--kafka") && args.0.iter().any(|a| a == "--instances") => {
            let (options, json) = match kafka_instances_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
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
                    .block_on(kafka_instances::run(&options))
                    .map_err(|e| format!("{e} (seed {})", options.seed).into()),
                json,
                |s| s.to_json(),
                |s| s.to_text(),
                |s| s.clean(),
            )
        }
        #[cfg(feature = "kafka")]
        "demo" if args.0.iter().any(|a| a == "--kafka") => {
            let (options, json) = match kafka_demo_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            report(
                "demo --kafka",
                runtime.block_on(kafka_demo::run(&options)),
                json,
                |s| s.to_json(),
                |s| s.to_text(),
                // At-least-once may repeat records; it must never lose one.
                |s| !options.verify || (s.lost == 0 && (s.duplicates == 0 || !options.exactly_once)),
            )
        }
        "run" if embedded_job_file(&args) => {
            let parsed = embedded_run_options(&mut args).and_then(|o| args.finish().map(|()| o));
            let ((file, dir, checkpoints, instance), json) = match parsed {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            report(
                "run",
                runtime.block_on(embedded_run::run(&file, &dir, &checkpoints, &instance)),
                json,
                |s| s.to_json(),
                |s| s.to_text(),
                |_| true,
            )
        }
        "produce" => {
            let options = match produce_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            let stdin = std::io::stdin().lock();
            match runtime.block_on(embedded_run::produce(&options.dir, &options.topic, options.partitions, stdin)) {
                Ok(n) => {
                    println!("produced {n} records to {} in {}", options.topic, options.dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("produce: {e}")),
            }
        }
        #[cfg(feature = "kafka")]
        "run" => {
            let (options, json) = match run_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            report("run", runtime.block_on(kafka_run::run(&options)), json, |s| s.to_json(), |s| s.to_text(), |_| true)
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
        "txn" if args.0.first().map(String::as_str) == Some("resolve") => {
            args.0.remove(0);
            let resolve = match txn_resolve_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            admin_exit("txn resolve", runtime.block_on(resolve.run()))
        }
        "txn" if matches!(args.0.first().map(String::as_str), Some("commit" | "abort")) => {
            let op = if args.0.remove(0) == "commit" { admin::TxnOp::Commit } else { admin::TxnOp::Abort };
            let what = if op == admin::TxnOp::Commit { "txn commit" } else { "txn abort" };
            let decide = match txn_decide_options(op, &mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            admin_exit(what, runtime.block_on(decide.run()))
        }
        "txn" if args.0.first().map(String::as_str) == Some("list") => {
            args.0.remove(0);
            // Every option is checked before anything is read.
            let list = match txn_list_options(&mut args).and_then(|o| args.finish().map(|()| o)) {
                Ok(o) => o,
                Err(e) => return fail(e),
            };
            admin_exit("txn list", runtime.block_on(list.run()))
        }
        "checkpoints" if args.0.first().map(String::as_str) == Some("inspect") => {
            args.0.remove(0);
            let parsed = (|| -> Result<(String, String, u64, bool), String> {
                let id = match args.0.first() {
                    Some(n) if !n.starts_with("--") => {
                        let n = args.0.remove(0);
                        n.parse().map_err(|_| format!("checkpoints inspect {n:?}: not a checkpoint id"))?
                    }
                    _ => return Err("checkpoints inspect needs a checkpoint id: checkpoints inspect N".into()),
                };
                let url = args.value("--checkpoints")?.unwrap_or_else(demo_checkpoints);
                let job = args.value("--job")?.unwrap_or_else(|| "demo".into());
                let json = args.flag("--json");
                args.finish()?;
                Ok((url, job, id, json))
            })();
            let (url, job, id, json) = match parsed {
                Ok(p) => p,
                Err(e) => return fail(e),
            };
            admin_exit("checkpoints inspect", runtime.block_on(admin::inspect_checkpoint(&url, &job, id, json)))
        }
        "checkpoints" => admin_exit("checkpoints", runtime.block_on(checkpoints(&mut args))),
        "instances" => match runtime.block_on(instances(&mut args)).and_then(|()| args.finish().map_err(Into::into)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        #[cfg(not(feature = "kafka"))]
        "run" => fail(WITHOUT_KAFKA.to_string()),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => fail(format!("unknown command {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Args {
        Args(a.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn crash_at_reads_points_and_hits_in_order() {
        let mut a = args(&["--crash-at", "sink.after_write:1", "--json", "--crash-at", "checkpoint.after_manifest"]);
        let schedule = crash_at(&mut a, false);
        assert_eq!(
            schedule,
            Ok(Some(vec![("sink.after_write".to_string(), 1), ("checkpoint.after_manifest".to_string(), 0)]))
        );
        assert_eq!(a.0, vec!["--json".to_string()], "the other arguments are left");
        assert_eq!(crash_at(&mut args(&[]), true), Ok(None));
    }

    #[test]
    fn crash_at_refuses_bad_values_by_name() {
        assert_eq!(
            parse_crash_at("sink.after_nothing"),
            Err(CrashAtError::UnknownPoint { point: "sink.after_nothing".into() })
        );
        assert!(CrashAtError::UnknownPoint { point: "x".into() }.to_string().contains("recovery.mid"));
        assert_eq!(parse_crash_at("commit.before:x"), Err(CrashAtError::BadSkip { value: "commit.before:x".into() }));
        assert_eq!(parse_crash_at("commit.before:-1"), Err(CrashAtError::BadSkip { value: "commit.before:-1".into() }));
        let e = crash_at(&mut args(&["--crash-at", "commit.before", "--crash-at", "commit.before:2"]), false);
        assert_eq!(e, Err(CrashAtError::Repeated { point: "commit.before".into() }.to_string()));
        let e = crash_at(&mut args(&["--crash-at", "commit.before"]), true);
        assert_eq!(e, Err(CrashAtError::WithSeededCrashes.to_string()));
        assert_eq!(crash_at(&mut args(&["--crash-at"]), false), Err("--crash-at needs a value".to_string()));
    }
}
