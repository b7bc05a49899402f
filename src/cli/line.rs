//! The command line, declared once with clap's derive: every command, its options, their
//! help text and their environment defaults. Each command's module turns its arguments
//! into the options of the code it runs, checking what clap cannot (ranges, and options
//! that go together).

use clap::{Args, Parser, Subcommand, ValueEnum};

/// What `--help` says after the commands: the progress output and the exit codes.
const AFTER_HELP: &str = "\
Progress: on a terminal `demo` and `run` show a live bar; elsewhere (and under --json) a
plain line per second (SHAREFLOW_PROGRESS=plain forces lines). Logs go to stderr at the
level SHAREFLOW_LOG gives (error by default; SHAREFLOW_LOG=info for more).

Exit codes: 0 done (a demo: its check passed); 1 failed (the error is on stderr; a demo:
its check found lost or repeated records); 2 the command line does not parse; 3 stopped
because another process fenced this one (docs/operations.md).";

/// Exactly-once stream processing on Kafka share groups (KIP-932 queues): the share
/// acknowledgements and the sink output of each checkpoint commit together.
#[derive(Debug, Parser)]
#[command(name = "shareflow", version, after_help = AFTER_HELP, propagate_version = true)]
pub(crate) struct Cli {
    /// How logs are written to stderr: text, or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SHAREFLOW_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Every command.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the exactly-once demo job: on the embedded broker, or with --kafka on Kafka.
    Demo(Box<DemoArgs>),
    /// Run one instance of a job file's pipeline (or, on Kafka, of the main job).
    Run(Box<RunArgs>),
    /// Take a savepoint of a running job; the job goes on.
    Savepoint(SavepointArgs),
    /// Stop a running job gracefully, with a savepoint of its final checkpoint if asked.
    Stop(StopArgs),
    /// Append each line of standard input as one record to a topic of an embedded broker.
    Produce(ProduceArgs),
    /// Print the records of a topic of an embedded broker.
    Consume(ConsumeArgs),
    /// The transactions a job left on its broker.
    #[command(subcommand)]
    Txn(TxnCommand),
    /// A job's checkpoints.
    Checkpoints(CheckpointsArgs),
    /// The instances registered under a checkpoint root.
    Instances(InstancesArgs),
    /// A job's dead letters.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Print a shell completion script: `shareflow completions bash > /etc/bash_completion.d/shareflow`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Options both demos take.
#[derive(Debug, Clone, Args)]
pub(crate) struct CommonDemoArgs {
    /// Records to produce (default 1000000; on Kafka 100000, and 0 resumes without producing).
    #[arg(long, value_name = "N")]
    pub(crate) records: Option<u64>,
    /// Checkpoint interval in ms (default 100; on Kafka 1000, with --instances 500).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) interval: Option<u64>,
    /// Topic partitions (default 4).
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) partitions: Option<u32>,
    /// Subtasks per operator (default 2).
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) parallelism: Option<u32>,
    /// Checkpoint storage: file://..., memory://..., s3://... (default file://DIR/checkpoints).
    #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS")]
    pub(crate) checkpoints: Option<String>,
    /// Crashes to inject at random fault points (default 3 embedded, 0 on Kafka; at most 8).
    #[arg(long, value_name = "K")]
    pub(crate) crashes: Option<usize>,
    /// Seed of the crash schedule (default 1; with --instances the clock, printed).
    #[arg(long, value_name = "S")]
    pub(crate) seed: Option<u64>,
    /// Crash at the (N+1)-th hit of fault point POINT (N default 0). Repeat it for more
    /// crashes, all armed at once; it replaces --crashes and --seed.
    #[arg(long = "crash-at", value_name = "POINT[:N]")]
    pub(crate) crash_at: Vec<String>,
    /// Acknowledge explicitly instead of in transactions (at least once).
    #[arg(long)]
    pub(crate) at_least_once: bool,
    /// Print the summary as one JSON object on the last line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics while it runs (port 0: any
    /// free one; the address is printed).
    #[arg(long, value_name = "HOST:PORT", env = "SHAREFLOW_METRICS_ADDR")]
    pub(crate) metrics_addr: Option<String>,
}

/// `shareflow demo`.
#[derive(Debug, Args)]
#[command(after_help = "Fault points of --crash-at: source.after_poll, source.after_lock, sink.after_write, \
    checkpoint.after_state_before_manifest, checkpoint.after_manifest, commit.before, commit.mid, \
    commit.after_broker_before_notify, recovery.mid, recovery.after.\n\n\
    SIGTERM or Ctrl-C stops a run gracefully: a final checkpoint, then the summary says stopped; \
    --resume finishes it.")]
pub(crate) struct DemoArgs {
    /// Options of every demo.
    #[command(flatten)]
    pub(crate) common: CommonDemoArgs,
    /// Run against a real Kafka 4.x broker at HOST:PORT instead of the embedded one.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) kafka: Option<String>,
    /// Broker and checkpoint directory, cleared first (default ./target/shareflow-demo).
    #[arg(long, value_name = "PATH", conflicts_with = "kafka")]
    pub(crate) dir: Option<String>,
    /// Continue the run a stopped or killed demo left in --dir.
    #[arg(long, conflicts_with_all = ["kafka", "records", "partitions"])]
    pub(crate) resume: bool,
    /// Run N instances of the job in one share group: in this process on the embedded
    /// broker; as N `shareflow run` processes with --kafka.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) instances: Option<u32>,
    /// Kafka: group, topics NAME-input/NAME-output and job id (default: fresh).
    #[arg(long, value_name = "NAME", requires = "kafka")]
    pub(crate) name: Option<String>,
    /// Kafka: bytes per record value, at least 16 (default 100).
    #[arg(long, value_name = "B", requires = "kafka", value_parser = clap::value_parser!(u64).range(16..))]
    pub(crate) value_bytes: Option<u64>,
    /// Kafka: skip the read_committed check at the end.
    #[arg(long, requires = "kafka")]
    pub(crate) no_verify: bool,
    /// Kafka: at most R records per second through the job (each instance).
    #[arg(long, value_name = "R", requires = "kafka", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_rate: Option<u64>,
    /// Kafka with --instances: K SIGKILLs of random instances, each restarted (default 0).
    #[arg(long, value_name = "K", requires = "instances")]
    pub(crate) kills: Option<usize>,
    /// Kafka with --instances: how long a checkpoint may take, in ms (default 3000).
    #[arg(long, value_name = "MS", requires = "instances", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) checkpoint_timeout: Option<u64>,
    /// Kafka with --instances: silence before adoption, in ms (default 5000).
    #[arg(long, value_name = "MS", requires = "instances", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) adoption_timeout: Option<u64>,
    /// Kafka with --instances: append each instance's stderr to DIR/ID.log.
    #[arg(long, value_name = "DIR", requires = "instances")]
    pub(crate) logs: Option<String>,
}

/// `shareflow run`.
#[derive(Debug, Args)]
#[command(after_help = "With a job file (examples/jobs/*.toml) the whole file is checked first, and each \
    error names its line and key. With broker = \"DIR\" in the file it runs on an embedded broker in DIR, \
    no server needed. Without a job file it runs the main job on Kafka (--kafka, --group, --instance and \
    --checkpoints). It runs until SIGTERM or Ctrl-C: a final checkpoint, then it retires.")]
pub(crate) struct RunArgs {
    /// The job file.
    #[arg(value_name = "JOB.toml")]
    pub(crate) job: Option<String>,
    /// This instance's name, unique in the group (default: the file's `instance`, or on
    /// an embedded broker the group's name).
    #[arg(long, value_name = "ID")]
    pub(crate) instance: Option<String>,
    /// The Kafka broker (default: the job file's `kafka`).
    #[arg(long, value_name = "HOST:PORT", env = "SHAREFLOW_KAFKA")]
    pub(crate) kafka: Option<String>,
    /// The checkpoint root every instance shares (default: the job file's).
    #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS")]
    pub(crate) checkpoints: Option<String>,
    /// Serve this instance's metrics at http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT", env = "SHAREFLOW_METRICS_ADDR")]
    pub(crate) metrics_addr: Option<String>,
    /// Print the summary as one JSON object on the last line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Start from this savepoint (the URL `shareflow savepoint` or `stop --savepoint`
    /// printed, or a copy of it): its state, over this run's parallelism.
    #[arg(long, value_name = "URL")]
    pub(crate) from_savepoint: Option<String>,
    /// A job file on an embedded broker: crash at the (N+1)-th hit of fault point POINT
    /// and restart, as the job file's restarts allow (for tests; repeatable).
    #[arg(long = "crash-at", value_name = "POINT[:N]")]
    pub(crate) crash_at: Vec<String>,
    /// Kafka: after SIGTERM or Ctrl-C retired it, delete its ledger topic.
    #[arg(long)]
    pub(crate) delete_ledger_on_retire: bool,
    /// The main job: the share group every instance joins.
    #[arg(long, value_name = "G", conflicts_with = "job")]
    pub(crate) group: Option<String>,
    /// The main job: the input topic (default G-input).
    #[arg(long, value_name = "T", conflicts_with = "job")]
    pub(crate) input: Option<String>,
    /// The main job: the output topic (default G-output).
    #[arg(long, value_name = "T", conflicts_with = "job")]
    pub(crate) output: Option<String>,
    /// The main job: checkpoint interval in ms (default 1000).
    #[arg(long, value_name = "MS", conflicts_with = "job", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) interval: Option<u64>,
    /// The main job: how long a checkpoint may take, in ms (default 10000).
    #[arg(long, value_name = "MS", conflicts_with = "job", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) checkpoint_timeout: Option<u64>,
    /// The main job: silence before adoption, in ms (default 30000).
    #[arg(long, value_name = "MS", conflicts_with = "job", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) adoption_timeout: Option<u64>,
    /// The main job: subtasks per operator (default 2).
    #[arg(long, value_name = "P", conflicts_with = "job", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) parallelism: Option<u32>,
    /// The main job: partitions of the topics it creates (default 4).
    #[arg(long, value_name = "P", conflicts_with = "job", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) partitions: Option<u32>,
    /// The main job: at most R records per second through this instance.
    #[arg(long, value_name = "R", conflicts_with = "job", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_rate: Option<u64>,
}

/// Where a running job listens, for `savepoint` and `stop`.
#[derive(Debug, Args)]
pub(crate) struct JobAddress {
    /// The running job's file.
    #[arg(value_name = "JOB.toml")]
    pub(crate) job: String,
    /// The job's endpoint (its --metrics-addr). Default, on an embedded broker: the
    /// address the job wrote to DIR/endpoint.
    #[arg(long, value_name = "HOST:PORT", env = "SHAREFLOW_METRICS_ADDR")]
    pub(crate) addr: Option<String>,
    /// Print the answer as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `shareflow savepoint`.
#[derive(Debug, Args)]
#[command(
    after_help = "The savepoint copies the first checkpoint that completes after the request.     The job goes on and acknowledges more input; a start from this savepoint does not read that input     again. For a restart from a savepoint (another parallelism, changed SQL), use `shareflow stop --savepoint`."
)]
pub(crate) struct SavepointArgs {
    /// The job.
    #[command(flatten)]
    pub(crate) at: JobAddress,
    /// The savepoint's name (default savepoint-{unix ms}).
    #[arg(long, value_name = "NAME")]
    pub(crate) name: Option<String>,
}

/// `shareflow stop`.
#[derive(Debug, Args)]
pub(crate) struct StopArgs {
    /// The job.
    #[command(flatten)]
    pub(crate) at: JobAddress,
    /// Take a savepoint of the final checkpoint, named NAME (default savepoint-{unix ms}).
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "")]
    pub(crate) savepoint: Option<String>,
}

/// `shareflow produce`.
#[derive(Debug, Args)]
#[command(after_help = "While a job runs on DIR, the records go through that job's process (its \
    --metrics-addr, or the address it wrote to DIR/endpoint); otherwise into DIR directly.")]
pub(crate) struct ProduceArgs {
    /// The embedded broker's directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: String,
    /// The topic to append to.
    #[arg(long, value_name = "T")]
    pub(crate) topic: String,
    /// Partitions of the topic if it is made here.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) partitions: u32,
}

/// `shareflow consume`.
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// The embedded broker's directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: String,
    /// The topic to read.
    #[arg(long, value_name = "T")]
    pub(crate) topic: String,
    /// Where to begin: the start of each partition, or its end (only what comes next).
    #[arg(long, value_enum, default_value_t = Position::Start)]
    pub(crate) from: Position,
    /// Stop after N records.
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Keep waiting for new records (until Ctrl-C, or --count).
    #[arg(long)]
    pub(crate) follow: bool,
    /// Read aborted and open transactions' records too.
    #[arg(long)]
    pub(crate) read_uncommitted: bool,
    /// How each record is printed.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub(crate) format: Format,
}

/// Where `consume` begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Position {
    /// The start of each partition.
    Start,
    /// The end of each partition: only records written from now on.
    End,
}

/// How `consume` prints a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// One JSON object per line: partition, offset, timestamp, key, value, headers.
    Json,
    /// The value alone, one per line.
    Raw,
}

/// Where the transactions are: an embedded broker's directory, or a Kafka broker.
#[derive(Debug, Clone, Args)]
pub(crate) struct BrokerArgs {
    /// An embedded broker's directory (default ./target/shareflow-demo/broker).
    #[arg(long, value_name = "PATH", conflicts_with = "kafka")]
    pub(crate) dir: Option<String>,
    /// A Kafka broker instead.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) kafka: Option<String>,
}

/// `shareflow txn ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum TxnCommand {
    /// List transactions: id, state, age, timeout (read-only, safe next to a live job).
    List {
        /// The broker.
        #[command(flatten)]
        broker: BrokerArgs,
        /// Only the transactions of share group G.
        #[arg(long, value_name = "G")]
        group: Option<String>,
        /// Only those of instance P (with --group).
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// The checkpoint root: show the checkpoint whose manifest decides each.
        #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS")]
        checkpoints: Option<String>,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Decide what a stopped job left pending, as its restart would.
    Resolve {
        /// The broker.
        #[command(flatten)]
        broker: BrokerArgs,
        /// The job's checkpoint root.
        #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS")]
        checkpoints: Option<String>,
        /// The share group.
        #[arg(long, value_name = "G")]
        group: Option<String>,
        /// The instance.
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// Print what it would do, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Commit one transaction of a stopped job by hand.
    Commit(DecideArgs),
    /// Abort one transaction of a stopped job by hand.
    Abort(DecideArgs),
}

/// `txn commit|abort ID`.
#[derive(Debug, Args)]
pub(crate) struct DecideArgs {
    /// The transaction: G-P-N.
    pub(crate) id: Option<String>,
    /// The broker.
    #[command(flatten)]
    pub(crate) broker: BrokerArgs,
    /// The share group.
    #[arg(long, value_name = "G")]
    pub(crate) group: Option<String>,
    /// The job's checkpoint root.
    #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS")]
    pub(crate) checkpoints: Option<String>,
    /// Act against the checkpoints (exactly-once does not hold then).
    #[arg(long)]
    pub(crate) force: bool,
    /// One JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `shareflow checkpoints [inspect N]`.
#[derive(Debug, Args)]
pub(crate) struct CheckpointsArgs {
    /// `inspect N`: one checkpoint, read back and checked.
    #[command(subcommand)]
    pub(crate) inspect: Option<CheckpointsCommand>,
    /// Checkpoint storage (default file://$PWD/target/shareflow-demo/checkpoints).
    #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS", global = true)]
    pub(crate) checkpoints: Option<String>,
    /// The job's id.
    #[arg(long, value_name = "NAME", default_value = "demo", global = true)]
    pub(crate) job: String,
    /// One JSON object.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// `checkpoints inspect`.
#[derive(Debug, Subcommand)]
pub(crate) enum CheckpointsCommand {
    /// One checkpoint: its manifest, the transactions it decides, its state files.
    Inspect {
        /// The checkpoint's id.
        id: u64,
    },
}

/// `shareflow instances [gc]`.
#[derive(Debug, Args)]
pub(crate) struct InstancesArgs {
    /// `gc`: the ledger topics of instances that retired or were adopted.
    #[command(subcommand)]
    pub(crate) gc: Option<InstancesCommand>,
    /// The shared checkpoint root (default file://$PWD/target/shareflow-demo/checkpoints).
    #[arg(long, value_name = "URL", env = "SHAREFLOW_CHECKPOINTS", global = true)]
    pub(crate) checkpoints: Option<String>,
    /// One JSON array.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// `instances gc`.
#[derive(Debug, Subcommand)]
pub(crate) enum InstancesCommand {
    /// List (or with --apply delete) ledger topics no live instance needs.
    Gc {
        /// The cluster of the ledgers.
        #[arg(long, value_name = "HOST:PORT", env = "SHAREFLOW_KAFKA")]
        kafka: String,
        /// The share group of the instances.
        #[arg(long, value_name = "G")]
        group: String,
        /// Delete them (the default only lists).
        #[arg(long)]
        apply: bool,
    },
}

/// Where dead letters are.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct DlqBroker {
    /// An embedded broker's directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<String>,
    /// A Kafka broker.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) kafka: Option<String>,
}

/// `shareflow dlq ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// A job's dead letters: where each sits, its cause, its record and its error.
    List {
        /// The dead-letter topic.
        #[arg(long, value_name = "DLQ")]
        topic: String,
        /// The broker.
        #[command(flatten)]
        broker: DlqBroker,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back into INPUT after a fix, exactly once.
    Redrive {
        /// The dead-letter topic.
        #[arg(long, value_name = "DLQ")]
        topic: String,
        /// The input topic to put the records back into.
        #[arg(long, value_name = "INPUT")]
        to: String,
        /// The broker.
        #[command(flatten)]
        broker: DlqBroker,
        /// Only rows where this holds (a WHERE over topic, partition, offset, key, value,
        /// timestamp).
        #[arg(long, value_name = "SQL")]
        filter: Option<String>,
        /// At most N records per second.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        max_rate: Option<u64>,
        /// The redrive's checkpoints (default DIR/redrive-checkpoints, or
        /// file://$PWD/target/shareflow-redrive/checkpoints on Kafka).
        #[arg(long, value_name = "URL")]
        checkpoints: Option<String>,
        /// The summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn kafka_only_options_are_refused_without_kafka() {
        for args in [
            &["shareflow", "demo", "--kills", "2"][..],
            &["shareflow", "demo", "--value-bytes", "100"],
            &["shareflow", "demo", "--kafka", "h:1", "--resume"],
            &["shareflow", "demo", "--resume", "--records", "5"],
            &["shareflow", "demo", "--interval", "0"],
            &["shareflow", "run", "job.toml", "--group", "g"],
            &["shareflow", "dlq", "list", "--topic", "d"],
            &["shareflow", "dlq", "list", "--topic", "d", "--dir", "x", "--kafka", "h:1"],
        ] {
            let e = Cli::try_parse_from(args).expect_err(&format!("{args:?} parses"));
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }

    #[test]
    fn every_command_has_help() {
        let mut cli = Cli::command();
        for sub in cli.get_subcommands_mut() {
            assert!(sub.get_about().is_some(), "{} has no help", sub.get_name());
        }
        let help = Cli::try_parse_from(["shareflow", "demo", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(help.to_string().contains("--crash-at"), "{help}");
    }
}
