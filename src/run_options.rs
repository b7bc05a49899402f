//! The options of `run` (a job file on an embedded broker or on Kafka, or the main job
//! on Kafka), `produce`, and the Kafka demos, checked before anything runs.

use super::*;

#[cfg(feature = "kafka")]
use cli::line::DemoArgs;
use cli::line::{ProduceArgs, RunArgs};

/// Whether `run` is given a job file that runs on an embedded broker directory
/// (`broker = "DIR"`), or one that does not load (whose errors that path reports). A
/// Kafka job file and the main job's options take the Kafka path.
pub(super) fn embedded_job_file(args: &RunArgs) -> bool {
    let Some(path) = &args.job else { return false };
    job_file::JobFile::load(std::path::Path::new(path))
        .map_or(true, |job| matches!(job.backend, job_file::Backend::Embedded(_)))
}

/// `run JOB.toml` on an embedded broker, its options checked.
pub(super) struct EmbeddedRun {
    /// The job file.
    pub(super) job: job_file::JobFile,
    /// Its broker directory.
    pub(super) dir: std::path::PathBuf,
    /// The checkpoint root (default `file://DIR/checkpoints`).
    pub(super) checkpoints: String,
    /// The job id (default the group's name).
    pub(super) instance: String,
    /// `--metrics-addr`.
    pub(super) metrics_addr: Option<String>,
    /// `--crash-at`.
    pub(super) crashes: Vec<(String, u32)>,
    /// `--from-savepoint`.
    pub(super) savepoint: Option<String>,
    /// `--json`.
    pub(super) json: bool,
}

/// `run JOB.toml [--instance NAME] [--checkpoints URL] [--json] ...` on an embedded
/// broker.
pub(super) fn embedded_run_options(args: RunArgs) -> Result<EmbeddedRun, String> {
    let path = args.job.unwrap_or_default();
    let job = job_file::JobFile::load(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
    let job_file::Backend::Embedded(dir) = &job.backend else {
        return Err(format!("{path}: not a job file on an embedded broker (no broker = \"DIR\")"));
    };
    let dir = std::path::PathBuf::from(dir);
    let instance = args.instance.or_else(|| job.instance.clone()).unwrap_or_else(|| job.group.clone());
    let checkpoints = args.checkpoints.unwrap_or_else(|| job.checkpoints.clone());
    if args.kafka.is_some() {
        return Err(format!("{path}: --kafka does not apply to a job file with broker = \"DIR\""));
    }
    let crashes = cli::crash_at::crash_at(&args.crash_at, false)?.unwrap_or_default();
    Ok(EmbeddedRun {
        job,
        dir,
        checkpoints,
        instance,
        metrics_addr: args.metrics_addr,
        crashes,
        savepoint: args.from_savepoint,
        json: args.json,
    })
}

/// `produce --dir DIR --topic T [--partitions N]`.
pub(super) fn produce_options(args: ProduceArgs) -> embedded_run::ProduceOptions {
    embedded_run::ProduceOptions { dir: args.dir.into(), topic: args.topic, partitions: args.partitions }
}

/// `run job.toml [--instance NAME] [--metrics-addr A] [--json]`: a job file, checked
/// whole before anything runs. `--instance` overrides the file's `instance`.
#[cfg(feature = "kafka")]
pub(super) fn job_file_options(path: &str, args: RunArgs) -> Result<(kafka_run::RunOptions, bool), String> {
    let job = job_file::JobFile::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let instance = match (args.instance, &job.instance) {
        (Some(i), _) => i,
        (None, Some(i)) => i.clone(),
        (None, None) => {
            return Err(format!("{path}: give the instance's name: instance = \"...\" in the file, or --instance NAME"))
        }
    };
    let kafka = match (args.kafka, &job.backend) {
        (Some(k), _) => k,
        (None, job_file::Backend::Kafka(k)) => k.clone(),
        (None, job_file::Backend::Embedded(dir)) => {
            return Err(format!(
                "{path}: runs on the embedded broker in {dir}, not on Kafka; give --kafka to run it there"
            ))
        }
    };
    let checkpoints = args.checkpoints.unwrap_or_else(|| job.checkpoints.clone());
    let mut o = kafka_run::RunOptions::new(&kafka, &job.group, &instance, &checkpoints);
    o.interval = job.interval;
    o.checkpoint_timeout = job.checkpoint_timeout;
    o.adoption_timeout = job.adoption_timeout;
    o.parallelism = job.parallelism;
    o.partitions = job.partitions;
    o.max_rate = job.max_rate;
    o.metrics_addr = args.metrics_addr;
    o.delete_ledger_on_retire = args.delete_ledger_on_retire;
    o.savepoint = args.from_savepoint;
    o.job = Some(job);
    Ok((o, args.json))
}

#[cfg(feature = "kafka")]
pub(super) fn run_options(args: RunArgs) -> Result<(kafka_run::RunOptions, bool), String> {
    if let Some(path) = args.job.clone() {
        return job_file_options(&path, args);
    }
    let required = |v: Option<String>, name: &str, what: &str| -> Result<String, String> {
        v.ok_or_else(|| format!("{name} is required: {what}"))
    };
    let bootstrap = required(args.kafka, "--kafka", "the broker, HOST:PORT")?;
    let group = required(args.group, "--group", "the share group every instance joins")?;
    let instance = required(args.instance, "--instance", "this instance's name, unique in the group")?;
    let checkpoints = required(
        args.checkpoints,
        "--checkpoints",
        "the checkpoint root every instance shares (s3://..., file://...)",
    )?;
    if !args.crash_at.is_empty() {
        return Err("--crash-at applies to a job file on an embedded broker".into());
    }
    let mut o = kafka_run::RunOptions::new(&bootstrap, &group, &instance, &checkpoints);
    o.input = args.input;
    o.output = args.output;
    let ms = |v: Option<u64>, d: &mut Duration| {
        if let Some(ms) = v {
            *d = Duration::from_millis(ms);
        }
    };
    ms(args.interval, &mut o.interval);
    ms(args.checkpoint_timeout, &mut o.checkpoint_timeout);
    ms(args.adoption_timeout, &mut o.adoption_timeout);
    o.parallelism = args.parallelism.unwrap_or(o.parallelism);
    o.partitions = args.partitions.unwrap_or(o.partitions);
    o.max_rate = args.max_rate;
    o.metrics_addr = args.metrics_addr;
    o.delete_ledger_on_retire = args.delete_ledger_on_retire;
    o.savepoint = args.from_savepoint;
    Ok((o, args.json))
}

#[cfg(feature = "kafka")]
pub(super) fn kafka_instances_options(args: DemoArgs) -> Result<(kafka_instances::InstancesOptions, bool), String> {
    let bootstrap = args.kafka.clone().unwrap_or_default();
    let instances = args.instances.unwrap_or(1);
    let c = common_options(&args.common)?;
    if c.crashes.is_some() || c.schedule.is_some() || c.at_least_once {
        return Err("--instances runs exactly-once with a schedule of SIGKILLs: use --kills and --seed, \
                    not --crashes, --crash-at or --at-least-once"
            .into());
    }
    let name = match args.name {
        Some(n) => n,
        None => kafka_demo::KafkaDemoOptions::new(&bootstrap).name,
    };
    let mut o = kafka_instances::InstancesOptions::new(&bootstrap, &name, instances);
    if let Some(b) = args.value_bytes {
        o.value_len = b as usize;
    }
    o.records = c.records.unwrap_or(o.records);
    o.interval = c.interval.unwrap_or(o.interval);
    o.partitions = c.partitions.unwrap_or(o.partitions);
    o.parallelism = c.parallelism.unwrap_or(o.parallelism);
    o.checkpoints = c.checkpoints;
    o.kills = args.kills.unwrap_or(0);
    o.seed = c.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    for (ms, field) in
        [(args.checkpoint_timeout, &mut o.checkpoint_timeout), (args.adoption_timeout, &mut o.adoption_timeout)]
    {
        if let Some(ms) = ms {
            *field = Duration::from_millis(ms);
        }
    }
    o.max_rate = args.max_rate;
    o.progress = !c.json;
    o.validate()?;
    if let Some(dir) = args.logs {
        // Made here, so that a directory that cannot be made fails before anything starts.
        std::fs::create_dir_all(&dir).map_err(|e| format!("--logs {dir}: cannot make the directory: {e}"))?;
        o.logs = Some(dir.into());
    }
    Ok((o, c.json))
}

#[cfg(feature = "kafka")]
pub(super) fn kafka_demo_options(args: DemoArgs) -> Result<(kafka_demo::KafkaDemoOptions, bool), String> {
    cli::demo::instances_only(&args, "--kafka --instances")?;
    let bootstrap = args.kafka.clone().unwrap_or_default();
    let c = common_options(&args.common)?;
    let mut o = kafka_demo::KafkaDemoOptions::new(&bootstrap);
    if let Some(n) = args.name {
        o.name = n;
    }
    if let Some(b) = args.value_bytes {
        o.value_len = b as usize;
    }
    o.records = c.records.unwrap_or(o.records);
    o.interval = c.interval.unwrap_or(o.interval);
    o.partitions = c.partitions.unwrap_or(o.partitions);
    o.parallelism = c.parallelism.unwrap_or(o.parallelism);
    o.checkpoints = c.checkpoints;
    o.exactly_once = !c.at_least_once;
    o.verify = !args.no_verify;
    o.metrics_addr = args.common.metrics_addr.clone();
    o.max_rate = args.max_rate;
    let points = kafka_demo::FAULT_POINTS;
    let crashes = c.crashes.unwrap_or(0);
    if crashes > points.len() {
        return Err(format!("--crashes {crashes} is more than the {} fault points", points.len()));
    }
    o.crashes = match c.schedule {
        Some(schedule) => schedule,
        None => demo::schedule_from(points, c.seed.unwrap_or(1), crashes)
            .into_iter()
            .map(|(p, s)| (p.to_string(), s))
            .collect(),
    };
    o.progress = !c.json;
    Ok((o, c.json))
}
