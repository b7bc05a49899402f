//! The options of `run` (a job file on an embedded broker or on Kafka, or the main job
//! on Kafka), `produce`, and the Kafka demos, checked before anything runs.

use super::*;

/// Whether `run` is given a job file that runs on an embedded broker directory
/// (`broker = "DIR"`), or one that does not load (whose errors that path reports). A
/// Kafka job file and the main job's options take the Kafka path.
pub(super) fn embedded_job_file(args: &Args) -> bool {
    let Some(path) = args.0.first().filter(|a| !a.starts_with("--")) else { return false };
    job_file::JobFile::load(std::path::Path::new(path))
        .map_or(true, |job| matches!(job.backend, job_file::Backend::Embedded(_)))
}

/// `run JOB.toml [--instance NAME] [--checkpoints URL] [--json]` on an embedded broker:
/// the file, its broker directory, the checkpoint root (default `file://DIR/checkpoints`)
/// and the job id (default the group's name).
#[allow(clippy::type_complexity)]
pub(super) fn embedded_run_options(
    args: &mut Args,
) -> Result<((job_file::JobFile, std::path::PathBuf, String, String), bool), String> {
    let path = args.0.remove(0);
    let job = job_file::JobFile::load(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
    let job_file::Backend::Embedded(dir) = &job.backend else {
        return Err(format!("{path}: not a job file on an embedded broker (no broker = \"DIR\")"));
    };
    let dir = std::path::PathBuf::from(dir);
    let instance = args.value("--instance")?.or_else(|| job.instance.clone()).unwrap_or_else(|| job.group.clone());
    let checkpoints = args.value("--checkpoints")?.unwrap_or_else(|| job.checkpoints.clone());
    if args.value("--kafka")?.is_some() {
        return Err(format!("{path}: --kafka does not apply to a job file with broker = \"DIR\""));
    }
    Ok(((job, dir, checkpoints, instance), args.flag("--json")))
}

/// `produce --dir DIR --topic T [--partitions N]`.
pub(super) fn produce_options(args: &mut Args) -> Result<embedded_run::ProduceOptions, String> {
    let dir = args.value("--dir")?.ok_or("produce needs --dir DIR: the embedded broker's directory")?;
    let topic = args.value("--topic")?.ok_or("produce needs --topic T: the topic to append to")?;
    let partitions = match args.number::<u32>("--partitions")? {
        Some(0) => return Err("--partitions must be >= 1".into()),
        p => p.unwrap_or(4),
    };
    Ok(embedded_run::ProduceOptions { dir: dir.into(), topic, partitions })
}

/// `run job.toml [--instance NAME] [--metrics-addr A] [--json]`: a job file, checked
/// whole before anything runs. `--instance` overrides the file's `instance`.
#[cfg(feature = "kafka")]
pub(super) fn job_file_options(path: &str, args: &mut Args) -> Result<(kafka_run::RunOptions, bool), String> {
    let job = job_file::JobFile::load(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    let instance = match (args.value("--instance")?, &job.instance) {
        (Some(i), _) => i,
        (None, Some(i)) => i.clone(),
        (None, None) => {
            return Err(format!("{path}: give the instance's name: instance = \"...\" in the file, or --instance NAME"))
        }
    };
    let kafka = match (args.value("--kafka")?, &job.backend) {
        (Some(k), _) => k,
        (None, job_file::Backend::Kafka(k)) => k.clone(),
        (None, job_file::Backend::Embedded(dir)) => {
            return Err(format!(
                "{path}: runs on the embedded broker in {dir}, not on Kafka; give --kafka to run it there"
            ))
        }
    };
    let checkpoints = args.value("--checkpoints")?.unwrap_or_else(|| job.checkpoints.clone());
    let mut o = kafka_run::RunOptions::new(&kafka, &job.group, &instance, &checkpoints);
    o.interval = job.interval;
    o.checkpoint_timeout = job.checkpoint_timeout;
    o.adoption_timeout = job.adoption_timeout;
    o.parallelism = job.parallelism;
    o.partitions = job.partitions;
    o.max_rate = job.max_rate;
    o.metrics_addr = args.value("--metrics-addr")?;
    o.delete_ledger_on_retire = args.flag("--delete-ledger-on-retire");
    o.job = Some(job);
    Ok((o, args.flag("--json")))
}

#[cfg(feature = "kafka")]
pub(super) fn run_options(args: &mut Args) -> Result<(kafka_run::RunOptions, bool), String> {
    if let Some(path) = args.0.first().filter(|a| !a.starts_with("--")).cloned() {
        args.0.remove(0);
        return job_file_options(&path, args);
    }
    let mut required = |name: &str, what: &str| -> Result<String, String> {
        args.value(name)?.ok_or_else(|| format!("{name} is required: {what}"))
    };
    let bootstrap = required("--kafka", "the broker, HOST:PORT")?;
    let group = required("--group", "the share group every instance joins")?;
    let instance = required("--instance", "this instance's name, unique in the group")?;
    let checkpoints = required("--checkpoints", "the checkpoint root every instance shares (s3://..., file://...)")?;
    let mut o = kafka_run::RunOptions::new(&bootstrap, &group, &instance, &checkpoints);
    o.input = args.value("--input")?;
    o.output = args.value("--output")?;
    let ms = |v: Option<u64>, name: &str| -> Result<Option<Duration>, String> {
        match v {
            Some(0) => Err(format!("{name} must be > 0 ms")),
            v => Ok(v.map(Duration::from_millis)),
        }
    };
    if let Some(d) = ms(args.number("--interval")?, "--interval")? {
        o.interval = d;
    }
    if let Some(d) = ms(args.number("--checkpoint-timeout")?, "--checkpoint-timeout")? {
        o.checkpoint_timeout = d;
    }
    if let Some(d) = ms(args.number("--adoption-timeout")?, "--adoption-timeout")? {
        o.adoption_timeout = d;
    }
    match args.number::<u32>("--parallelism")? {
        Some(0) => return Err("--parallelism must be >= 1".into()),
        Some(p) => o.parallelism = p,
        None => {}
    }
    match args.number::<u32>("--partitions")? {
        Some(0) => return Err("--partitions must be >= 1".into()),
        Some(p) => o.partitions = p,
        None => {}
    }
    o.max_rate = args.number("--max-rate")?;
    o.metrics_addr = args.value("--metrics-addr")?;
    o.delete_ledger_on_retire = args.flag("--delete-ledger-on-retire");
    Ok((o, args.flag("--json")))
}

/// `--value-bytes B` of the Kafka demos: at least 16, the room a record's identity takes.
#[cfg(feature = "kafka")]
pub(super) fn value_bytes(args: &mut Args) -> Result<Option<usize>, String> {
    match args.number::<usize>("--value-bytes")? {
        Some(b) if b < 16 => Err("--value-bytes must be >= 16".into()),
        b => Ok(b),
    }
}

#[cfg(feature = "kafka")]
pub(super) fn kafka_instances_options(args: &mut Args) -> Result<(kafka_instances::InstancesOptions, bool), String> {
    let bootstrap = args.value("--kafka")?.ok_or("--kafka needs HOST:PORT")?;
    let instances = args.number::<u32>("--instances")?.ok_or("--instances needs a number")?;
    let c = common_options(args)?;
    if c.crashes.is_some() || c.schedule.is_some() || c.at_least_once {
        return Err("--instances runs exactly-once with a schedule of SIGKILLs: use --kills and --seed, \
                    not --crashes, --crash-at or --at-least-once"
            .into());
    }
    let name = match args.value("--name")? {
        Some(n) => n,
        None => kafka_demo::KafkaDemoOptions::new(&bootstrap).name,
    };
    let mut o = kafka_instances::InstancesOptions::new(&bootstrap, &name, instances);
    if let Some(b) = value_bytes(args)? {
        o.value_len = b;
    }
    o.records = c.records.unwrap_or(o.records);
    o.interval = c.interval.unwrap_or(o.interval);
    o.partitions = c.partitions.unwrap_or(o.partitions);
    o.parallelism = c.parallelism.unwrap_or(o.parallelism);
    o.checkpoints = c.checkpoints;
    o.kills = args.number("--kills")?.unwrap_or(0);
    o.seed = c.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    for (flag, field) in
        [("--checkpoint-timeout", &mut o.checkpoint_timeout), ("--adoption-timeout", &mut o.adoption_timeout)]
    {
        match args.number::<u64>(flag)? {
            Some(0) => return Err(format!("{flag} must be > 0 ms")),
            Some(ms) => *field = Duration::from_millis(ms),
            None => {}
        }
    }
    o.max_rate = args.number("--max-rate")?;
    if o.max_rate == Some(0) {
        return Err("--max-rate must be >= 1".into());
    }
    o.progress = !c.json;
    o.validate()?;
    if let Some(dir) = args.value("--logs")? {
        // Made here, so that a directory that cannot be made fails before anything starts.
        std::fs::create_dir_all(&dir).map_err(|e| format!("--logs {dir}: cannot make the directory: {e}"))?;
        o.logs = Some(dir.into());
    }
    Ok((o, c.json))
}

#[cfg(feature = "kafka")]
pub(super) fn kafka_demo_options(args: &mut Args) -> Result<(kafka_demo::KafkaDemoOptions, bool), String> {
    let bootstrap = args.value("--kafka")?.ok_or("--kafka needs HOST:PORT")?;
    let c = common_options(args)?;
    let mut o = kafka_demo::KafkaDemoOptions::new(&bootstrap);
    if let Some(n) = args.value("--name")? {
        o.name = n;
    }
    if let Some(b) = value_bytes(args)? {
        o.value_len = b;
    }
    o.records = c.records.unwrap_or(o.records);
    o.interval = c.interval.unwrap_or(o.interval);
    o.partitions = c.partitions.unwrap_or(o.partitions);
    o.parallelism = c.parallelism.unwrap_or(o.parallelism);
    o.checkpoints = c.checkpoints;
    o.exactly_once = !c.at_least_once;
    o.verify = !args.flag("--no-verify");
    o.metrics_addr = args.value("--metrics-addr")?;
    o.max_rate = args.number("--max-rate")?;
    if o.max_rate == Some(0) {
        return Err("--max-rate must be >= 1".into());
    }
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
