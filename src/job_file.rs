//! Job files: `shareflow run job.toml` runs a user's own pipeline without Rust, as one
//! instance of its share group (start it N times with different `--instance` names),
//! on a Kafka 4.x broker (`kafka = "HOST:PORT"`) or on an embedded broker directory
//! (`broker = "DIR"`, no server needed).
//!
//! ```toml
//! kafka = "127.0.0.1:19092"      # or: broker = "/var/lib/shareflow/broker"
//! checkpoints = "file:///var/lib/shareflow/orders"
//!
//! [source]
//! group = "orders"
//! topics = ["orders"]
//! mode = "exactly-once"          # or "at-least-once"
//!
//! [[transform]]
//! sql = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input"
//!
//! [sink]
//! kind = "kafka"                 # "kafka" or "topic" (a topic), "files" (url), "postgres"
//! topic = "orders-upper"         #   (url, table, mode = "insert" or "upsert", key), or "print"
//!
//! [dead_letters]                 # optional: rows the SQL fails on go here, not stop the job
//! topic = "orders-dlq"
//! copy_record = true             # false: only the KIP-1191 headers, not key and value
//!
//! [job]
//! parallelism = 2
//! checkpoint_interval_ms = 1000
//! ```
//!
//! The whole file is checked before anything runs: unknown keys, wrong types, values out
//! of range and SQL that does not plan are errors naming the file, the line and the key.

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use shareflow::runtime::sql::{plan_query, QueryPlan};
use shareflow::runtime::SqlOptions;
use toml::Spanned;

mod sinks;

/// One `[[transform]]`: (operator name, SQL, options).
pub(crate) type Transform = (String, String, SqlOptions);

/// A job file error: where (file, line, key) and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {key}: {message}")]
pub(crate) struct JobFileError {
    /// The file.
    pub(crate) file: String,
    /// The 1-based line.
    pub(crate) line: usize,
    /// The key, dotted (`sink.topic`), or `-` for the file as a whole.
    pub(crate) key: String,
    /// What is wrong, and what to give instead.
    pub(crate) message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    kafka: Option<Spanned<String>>,
    broker: Option<Spanned<String>>,
    checkpoints: Spanned<String>,
    instance: Option<Spanned<String>>,
    source: Spanned<RawSource>,
    #[serde(default)]
    transform: Vec<Spanned<RawTransform>>,
    sink: Spanned<RawSink>,
    dead_letters: Option<Spanned<RawDeadLetters>>,
    #[serde(default)]
    job: RawJob,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadLetters {
    topic: Spanned<String>,
    copy_record: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    group: Spanned<String>,
    topics: Spanned<Vec<String>>,
    mode: Option<Spanned<String>>,
    from: Option<Spanned<String>>,
    max_rate: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransform {
    name: Option<Spanned<String>>,
    sql: Spanned<String>,
    allowed_lateness_ms: Option<Spanned<i64>>,
    idle_timeout_ms: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
// The settings of the sinks a build leaves out are still read (and refused by kind).
#[cfg_attr(not(all(feature = "tables", feature = "postgres")), allow(dead_code))]
struct RawSink {
    kind: Spanned<String>,
    topic: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
    table: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    key: Option<Spanned<Vec<String>>>,
    partition_by: Option<Spanned<String>>,
    target_file_mb: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    parallelism: Option<Spanned<i64>>,
    partitions: Option<Spanned<i64>>,
    checkpoint_interval_ms: Option<Spanned<i64>>,
    checkpoint_timeout_ms: Option<Spanned<i64>>,
    adoption_timeout_ms: Option<Spanned<i64>>,
    restarts: Option<Spanned<i64>>,
}

/// Where a job reads and writes its topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Backend {
    /// A Kafka 4.x broker, `HOST:PORT`.
    Kafka(String),
    /// An embedded broker in this directory (created if missing).
    Embedded(String),
}

/// Where a job writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SinkSpec {
    /// A topic of the job's broker, in the checkpoint's transaction.
    Topic { topic: String },
    /// Files under an object-store URL, published when the checkpoint commits.
    Files { url: String },
    /// A PostgreSQL table, by two-phase commit (decision 0042).
    #[cfg(feature = "postgres")]
    Postgres(shareflow::connector::postgres::PostgresSettings),
    /// Parquet files, or a Delta table, on object storage (decision 0043).
    #[cfg(feature = "tables")]
    Table(shareflow::connector::table::TableSettings),
    /// Standard output (at least once: a line printed before a crash is printed again).
    Print,
}

/// A checked job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobFile {
    pub(crate) backend: Backend,
    pub(crate) checkpoints: String,
    pub(crate) instance: Option<String>,
    pub(crate) group: String,
    pub(crate) topics: Vec<String>,
    pub(crate) exactly_once: bool,
    pub(crate) from_earliest: bool,
    pub(crate) max_rate: Option<u64>,
    /// The transforms, in order.
    pub(crate) transforms: Vec<Transform>,
    pub(crate) sink: SinkSpec,
    /// `[dead_letters]`: where records the job cannot process go, if anywhere.
    pub(crate) dead_letters: Option<shareflow::connector::DeadLetterSettings>,
    pub(crate) parallelism: u32,
    pub(crate) partitions: u32,
    pub(crate) interval: Duration,
    pub(crate) checkpoint_timeout: Duration,
    pub(crate) adoption_timeout: Duration,
    /// Finish once the input is drained (not a job file key: `shareflow dlq redrive`
    /// sets it).
    pub(crate) stop_when_drained: bool,
    /// `[job] restarts`: failed attempts the run restarts after, 500 ms apart
    /// (default [`DEFAULT_RESTARTS`]). Each can cost the records the job holds one
    /// delivery: the run warns when they outlast the group's delivery limit.
    pub(crate) restarts: u32,
}

/// Restarts of a job file's run unless `[job] restarts` says otherwise: through a broker
/// or store outage of minutes.
pub(crate) const DEFAULT_RESTARTS: u16 = 1_000;

/// The 1-based line of byte `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The dotted key written on 1-based `line` of `text` (`sink.topic`), from the table
/// header above it; `-` if the line holds no `key = value`.
fn key_at(text: &str, line: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(here) = line.checked_sub(1).and_then(|i| lines.get(i)) else { return "-".into() };
    let Some((key, _)) = here.split_once('=') else { return "-".into() };
    let key = key.trim();
    let table = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    }
}

impl JobFile {
    /// Reads and checks the job file at `path`.
    pub(crate) fn load(path: &Path) -> Result<Self, JobFileError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| JobFileError {
            file: file.clone(),
            line: 0,
            key: "-".into(),
            message: format!("cannot read the job file: {e}"),
        })?;
        Self::parse(&file, &text)
    }

    /// Checks the job file `text`, named `file` in errors: the broker, the checkpoint
    /// root and the instance, then each table in the order the file gives them.
    pub(crate) fn parse(file: &str, text: &str) -> Result<Self, JobFileError> {
        let check = Checker { file, text };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of(text, s.start));
            // toml's message carries its own excerpt; its first line says what is wrong.
            let message = e.message().trim().to_string();
            JobFileError { file: file.to_string(), line, key: key_at(text, line), message }
        })?;
        let backend = check.backend(&raw)?;
        let checkpoints = check.non_empty(&raw.checkpoints, "checkpoints")?;
        shareflow::checkpoint::open_url(&checkpoints, &[])
            .map_err(|e| check.err(raw.checkpoints.span(), "checkpoints", e.to_string()))?;
        let instance = raw.instance.as_ref().map(|i| check.non_empty(i, "instance")).transpose()?;
        let source = check.source(raw.source.get_ref())?;
        let job = check.job(&raw.job)?;
        let (transforms, writes_value) = check.transforms(&raw.transform)?;
        let sink = check.sink(&raw.sink, writes_value)?;
        let dead_letters =
            raw.dead_letters.as_ref().map(|d| check.dead_letters(d, &source.topics, &sink)).transpose()?;
        Ok(Self {
            backend,
            checkpoints,
            instance,
            group: source.group,
            topics: source.topics,
            exactly_once: source.exactly_once,
            from_earliest: source.from_earliest,
            max_rate: source.max_rate,
            transforms,
            sink,
            dead_letters,
            parallelism: job.parallelism,
            partitions: job.partitions,
            interval: job.interval,
            checkpoint_timeout: job.checkpoint_timeout,
            adoption_timeout: job.adoption_timeout,
            restarts: job.restarts,
            stop_when_drained: false,
        })
    }
}

/// The checked `[source]` table.
struct SourceTable {
    group: String,
    topics: Vec<String>,
    exactly_once: bool,
    from_earliest: bool,
    max_rate: Option<u64>,
}

/// The checked `[job]` table.
struct JobTable {
    parallelism: u32,
    partitions: u32,
    interval: Duration,
    checkpoint_timeout: Duration,
    adoption_timeout: Duration,
    restarts: u32,
}

/// Checks the values of one job file; each error names the file, the line and the key.
struct Checker<'a> {
    /// The file, as errors name it.
    file: &'a str,
    /// Its text, where the lines are counted.
    text: &'a str,
}

impl Checker<'_> {
    /// The error `message` about `key`, at the line where byte range `span` starts.
    fn err(&self, span: Range<usize>, key: &str, message: String) -> JobFileError {
        JobFileError {
            file: self.file.to_string(),
            line: line_of(self.text, span.start),
            key: key.to_string(),
            message,
        }
    }

    /// The string `v`, trimmed; an error if nothing is left.
    fn non_empty(&self, v: &Spanned<String>, key: &str) -> Result<String, JobFileError> {
        let s = v.get_ref().trim();
        if s.is_empty() {
            return Err(self.err(v.span(), key, "must not be empty".into()));
        }
        Ok(s.to_string())
    }

    /// The number `v`, 1 to `max`, or `default` if it is not given.
    fn positive(&self, v: &Option<Spanned<i64>>, key: &str, default: u64, max: u64) -> Result<u64, JobFileError> {
        match v {
            None => Ok(default),
            Some(n) if *n.get_ref() >= 1 && (*n.get_ref() as u64) <= max => Ok(*n.get_ref() as u64),
            Some(n) => Err(self.err(n.span(), key, format!("{} is out of range: give 1 to {max}", n.get_ref()))),
        }
    }

    /// The milliseconds `v` (at most a day), or `default` ms if it is not given.
    fn ms(&self, v: &Option<Spanned<i64>>, key: &str, default: u64) -> Result<Duration, JobFileError> {
        self.positive(v, key, default, 86_400_000).map(Duration::from_millis)
    }

    /// The `[dead_letters]` table: a topic that is neither an input nor the output.
    fn dead_letters(
        &self,
        raw: &Spanned<RawDeadLetters>,
        inputs: &[String],
        sink: &SinkSpec,
    ) -> Result<shareflow::connector::DeadLetterSettings, JobFileError> {
        let d = raw.get_ref();
        let topic = self.non_empty(&d.topic, "dead_letters.topic")?;
        let output = matches!(sink, SinkSpec::Topic { topic: t } if *t == topic);
        if inputs.contains(&topic) || output {
            let what = if output { "the sink's topic" } else { "an input topic" };
            return Err(self.err(
                d.topic.span(),
                "dead_letters.topic",
                format!("{topic:?} is {what}: dead letters need a topic of their own"),
            ));
        }
        Ok(shareflow::connector::DeadLetterSettings { topic, copy_record: d.copy_record.unwrap_or(true) })
    }

    /// `kafka = "HOST:PORT"` or `broker = "DIR"`: exactly one of them.
    fn backend(&self, raw: &RawFile) -> Result<Backend, JobFileError> {
        match (&raw.kafka, &raw.broker) {
            (Some(kafka), None) => {
                let k = self.non_empty(kafka, "kafka")?;
                if !k.contains(':') {
                    return Err(self.err(kafka.span(), "kafka", format!("{k:?} is not HOST:PORT")));
                }
                Ok(Backend::Kafka(k))
            }
            (None, Some(broker)) => Ok(Backend::Embedded(self.non_empty(broker, "broker")?)),
            (Some(_), Some(broker)) => Err(self.err(
                broker.span(),
                "broker",
                "give kafka = \"HOST:PORT\" or broker = \"DIR\", not both".into(),
            )),
            (None, None) => Err(self.err(
                0..0,
                "kafka",
                "give kafka = \"HOST:PORT\" (a Kafka 4.x broker) or broker = \"DIR\" (an embedded broker \
                 directory, no server needed)"
                    .into(),
            )),
        }
    }

    /// The `[source]` table: group, topics, mode, where to start, and the rate limit.
    fn source(&self, source: &RawSource) -> Result<SourceTable, JobFileError> {
        let group = self.non_empty(&source.group, "source.group")?;
        let topics: Vec<String> = source.topics.get_ref().iter().map(|t| t.trim().to_string()).collect();
        if topics.is_empty() || topics.iter().any(String::is_empty) {
            return Err(self.err(source.topics.span(), "source.topics", "give one or more topic names".into()));
        }
        let exactly_once = match source.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None | Some(("exactly-once", _)) => true,
            Some(("at-least-once", _)) => false,
            Some((m, span)) => {
                return Err(self.err(span, "source.mode", format!("{m:?}: give \"exactly-once\" or \"at-least-once\"")))
            }
        };
        let from_earliest = match source.from.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None | Some(("earliest", _)) => true,
            Some(("latest", _)) => false,
            Some((m, span)) => {
                return Err(self.err(span, "source.from", format!("{m:?}: give \"earliest\" or \"latest\"")))
            }
        };
        let max_rate = match &source.max_rate {
            None => None,
            some => Some(self.positive(some, "source.max_rate", 0, u64::from(u32::MAX))?),
        };
        Ok(SourceTable { group, topics, exactly_once, from_earliest, max_rate })
    }

    /// The `[job]` table: parallelism, partitions and the checkpoint and adoption timing.
    fn job(&self, job: &RawJob) -> Result<JobTable, JobFileError> {
        let parallelism = self.positive(&job.parallelism, "job.parallelism", 2, 64)? as u32;
        let partitions = self.positive(&job.partitions, "job.partitions", 4, 10_000)? as u32;
        let interval = self.ms(&job.checkpoint_interval_ms, "job.checkpoint_interval_ms", 1_000)?;
        let checkpoint_timeout = self.ms(&job.checkpoint_timeout_ms, "job.checkpoint_timeout_ms", 10_000)?;
        let adoption_timeout = self.ms(&job.adoption_timeout_ms, "job.adoption_timeout_ms", 30_000)?;
        let restarts = match &job.restarts {
            Some(n) if *n.get_ref() == 0 => 0,
            other => self.positive(other, "job.restarts", DEFAULT_RESTARTS.into(), 1_000_000)? as u32,
        };
        if adoption_timeout <= interval + checkpoint_timeout {
            let span = job.adoption_timeout_ms.as_ref().map_or(0..0, Spanned::span);
            return Err(self.err(
                span,
                "job.adoption_timeout_ms",
                format!(
                    "{} ms must exceed checkpoint_interval_ms plus checkpoint_timeout_ms ({} ms): a live instance \
                     must never look silent",
                    adoption_timeout.as_millis(),
                    (interval + checkpoint_timeout).as_millis()
                ),
            ));
        }
        Ok(JobTable { parallelism, partitions, interval, checkpoint_timeout, adoption_timeout, restarts })
    }

    /// The `[[transform]]` tables: (operator name, SQL) in order, and whether the rows
    /// that leave the last one have a `value` column.
    fn transforms(&self, raw: &[Spanned<RawTransform>]) -> Result<(Vec<Transform>, bool), JobFileError> {
        // Every transform plans against what reaches it: the source's rows, then the
        // previous transform's output.
        let mut schema = shareflow::connector::record_schema();
        let mut transforms = Vec::new();
        for (i, t) in raw.iter().enumerate() {
            let t = t.get_ref();
            let key = format!("transform[{i}].sql");
            let name = match &t.name {
                Some(n) => self.non_empty(n, &format!("transform[{i}].name"))?,
                None => format!("transform-{i}"),
            };
            let mut options = SqlOptions::default();
            if let Some(ms) = &t.allowed_lateness_ms {
                let lateness_key = format!("transform[{i}].allowed_lateness_ms");
                let ms = u64::try_from(*ms.get_ref())
                    .map_err(|_| self.err(ms.span(), &lateness_key, "give 0 or more milliseconds".to_string()))?;
                options.allowed_lateness = Duration::from_millis(ms);
            }
            if let Some(ms) = &t.idle_timeout_ms {
                let idle_key = format!("transform[{i}].idle_timeout_ms");
                let ms = u64::try_from(*ms.get_ref())
                    .ok()
                    .filter(|ms| *ms > 0)
                    .ok_or_else(|| self.err(ms.span(), &idle_key, "give 1 or more milliseconds".to_string()))?;
                options.idle_timeout = Duration::from_millis(ms);
            }
            let plan = plan_query(t.sql.get_ref(), schema.clone(), options)
                .map_err(|e| self.err(t.sql.span(), &key, format!("{e} (the rows reach it as the table `input`)")))?;
            schema = match &plan {
                QueryPlan::Stateless(p) => p.output_schema(),
                QueryPlan::Stateful(p) => p.output_schema(),
            };
            let windowed = matches!(&plan, QueryPlan::Stateful(p) if p.window().is_some());
            for (name, given) in
                [("allowed_lateness_ms", &t.allowed_lateness_ms), ("idle_timeout_ms", &t.idle_timeout_ms)]
            {
                if let (Some(v), false) = (given, windowed) {
                    return Err(self.err(
                        v.span(),
                        &format!("transform[{i}].{name}"),
                        "only a windowed query (GROUP BY tumble, hop or session) has a watermark; remove the key"
                            .into(),
                    ));
                }
            }
            transforms.push((name, t.sql.get_ref().clone(), options));
        }
        Ok((transforms, schema.index_of("value").is_ok()))
    }

    /// The `[sink]` table; a topic sink needs the `value` column (`writes_value`).
    fn sink(&self, raw: &Spanned<RawSink>, writes_value: bool) -> Result<SinkSpec, JobFileError> {
        let sink = raw.get_ref();
        match sink.kind.get_ref().as_str() {
            "kafka" | "topic" => {
                let topic = sink
                    .topic
                    .as_ref()
                    .ok_or_else(|| self.err(raw.span(), "sink.topic", "a topic sink needs topic = \"...\"".into()))?;
                if !writes_value {
                    return Err(self.err(
                        raw.span(),
                        "sink",
                        "a topic sink writes the column `value` (and `key` if there is one); the last transform \
                         has no `value` column"
                            .into(),
                    ));
                }
                Ok(SinkSpec::Topic { topic: self.non_empty(topic, "sink.topic")? })
            }
            "files" => {
                let url = sink.url.as_ref().ok_or_else(|| {
                    self.err(raw.span(), "sink.url", "a files sink needs url = \"file:///...\"".into())
                })?;
                let u = self.non_empty(url, "sink.url")?;
                shareflow::checkpoint::open_url(&u, &[])
                    .map_err(|e| self.err(url.span(), "sink.url", e.to_string()))?;
                Ok(SinkSpec::Files { url: u })
            }
            #[cfg(feature = "postgres")]
            "postgres" => self.postgres_sink(raw),
            #[cfg(not(feature = "postgres"))]
            "postgres" => Err(self.sink_not_built(raw, "postgres")),
            #[cfg(feature = "tables")]
            "parquet" | "delta" => self.table_sink(raw),
            #[cfg(not(feature = "tables"))]
            "parquet" | "delta" => Err(self.sink_not_built(raw, "tables")),
            "print" => Ok(SinkSpec::Print),
            other => Err(self.err(
                sink.kind.span(),
                "sink.kind",
                format!("{other:?}: give \"kafka\" (or \"topic\"), \"files\", \"parquet\", \"delta\", \"postgres\" or \"print\""),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const GOOD: &str = r#"
kafka = "127.0.0.1:19092"
checkpoints = "memory://jobs/orders"

[source]
group = "orders"
topics = ["orders"]

[[transform]]
name = "upper"
sql = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input"

[[transform]]
sql = "SELECT key, value FROM input WHERE value <> 'SKIP'"

[sink]
kind = "kafka"
topic = "orders-upper"

[job]
parallelism = 3
checkpoint_interval_ms = 500
"#;

    #[test]
    fn a_good_file_gives_every_setting_with_defaults_for_the_rest() {
        let job = JobFile::parse("job.toml", GOOD).unwrap();
        assert_eq!(job.backend, Backend::Kafka("127.0.0.1:19092".into()));
        assert_eq!((job.group.as_str(), job.topics.clone()), ("orders", vec!["orders".to_string()]));
        assert!(job.exactly_once && job.from_earliest);
        assert_eq!(job.transforms.len(), 2);
        assert_eq!((job.transforms[0].0.as_str(), job.transforms[1].0.as_str()), ("upper", "transform-1"));
        assert_eq!(job.sink, SinkSpec::Topic { topic: "orders-upper".into() });
        assert_eq!((job.parallelism, job.partitions), (3, 4));
        assert_eq!((job.interval, job.checkpoint_timeout), (Duration::from_millis(500), Duration::from_secs(10)));
        assert_eq!(job.instance, None);
    }

    /// Each bad file, the line and key its error names, and a word of the message.
    #[test]
    fn every_error_names_the_line_and_the_key() {
        let replace = |from: &str, to: &str| GOOD.replacen(from, to, 1);
        let table: Vec<(String, usize, &str, &str)> = vec![
            (replace("topic = \"orders-upper\"", "topik = \"x\""), 18, "sink.topik", "unknown field `topik`"),
            (replace("parallelism = 3", "parallelism = 0"), 21, "job.parallelism", "out of range"),
            (replace("parallelism = 3", "parallelism = \"three\""), 21, "job.parallelism", "invalid type"),
            (replace("kind = \"kafka\"", "kind = \"s3\""), 17, "sink.kind", "\"postgres\" or \"print\""),
            (replace("FROM input\"", "FROM nowhere\""), 11, "transform[0].sql", "table `input`"),
            (replace("topics = [\"orders\"]", "topics = []"), 7, "source.topics", "one or more"),
            (replace("group = \"orders\"", "group = \" \""), 6, "source.group", "must not be empty"),
            (replace("[source]", "[source]\nmode = \"twice\""), 6, "source.mode", "at-least-once"),
            (replace("127.0.0.1:19092", "localhost"), 2, "kafka", "HOST:PORT"),
            (replace("memory://jobs/orders", "ftp://x/y"), 3, "checkpoints", "ftp"),
            (
                replace("checkpoint_interval_ms = 500", "checkpoint_interval_ms = 500\nadoption_timeout_ms = 600"),
                23,
                "job.adoption_timeout_ms",
                "must exceed",
            ),
            (
                replace("SELECT key, value FROM input WHERE value <> 'SKIP'", "SELECT key FROM input"),
                0,
                "sink",
                "`value`",
            ),
            (replace("topic = \"orders-upper\"", ""), 0, "sink.topic", "needs topic"),
            ("kafka = ".into(), 1, "kafka", "string"),
            (replace("kafka = \"127.0.0.1:19092\"", ""), 0, "kafka", "broker = \"DIR\""),
            (replace("kafka = \"127.0.0.1:19092\"", "kafka = \"h:1\"\nbroker = \"/tmp/b\""), 3, "broker", "not both"),
            (replace("kafka = \"127.0.0.1:19092\"", "broker = \"\""), 2, "broker", "must not be empty"),
        ];
        for (text, line, key, word) in table {
            let e = JobFile::parse("job.toml", &text).expect_err(&text);
            assert_eq!(e.file, "job.toml");
            assert_eq!(e.key, key, "{e}");
            if line > 0 {
                assert_eq!(e.line, line, "{e}");
            } else {
                assert!(e.line > 0, "{e}");
            }
            assert!(e.to_string().contains(word), "{e}");
            assert!(e.to_string().starts_with(&format!("job.toml:{}: {key}: ", e.line)), "{e}");
        }
    }

    #[test]
    fn files_and_print_sinks_and_at_least_once_parse() {
        let text = GOOD
            .replace("kind = \"kafka\"\ntopic = \"orders-upper\"", "kind = \"files\"\nurl = \"memory://lake/orders\"")
            .replace("[source]", "[source]\nmode = \"at-least-once\"\nfrom = \"latest\"\nmax_rate = 500");
        let job = JobFile::parse("job.toml", &text).unwrap();
        assert_eq!(job.sink, SinkSpec::Files { url: "memory://lake/orders".into() });
        assert!(!job.exactly_once && !job.from_earliest);
        assert_eq!(job.max_rate, Some(500));
        let print = GOOD.replace("kind = \"kafka\"\ntopic = \"orders-upper\"", "kind = \"print\"");
        assert_eq!(JobFile::parse("job.toml", &print).unwrap().sink, SinkSpec::Print);
    }

    #[test]
    fn restarts_default_to_a_thousand_and_take_zero() {
        assert_eq!(JobFile::parse("job.toml", GOOD).unwrap().restarts, 1_000);
        let with = |n: &str| GOOD.replace("[job]", &format!("[job]\nrestarts = {n}"));
        assert_eq!(JobFile::parse("job.toml", &with("0")).unwrap().restarts, 0);
        assert_eq!(JobFile::parse("job.toml", &with("3")).unwrap().restarts, 3);
        let e = JobFile::parse("job.toml", &with("-1")).unwrap_err();
        assert_eq!(e.key, "job.restarts", "{e}");
    }

    #[test]
    fn dead_letters_parse_and_need_a_topic_of_their_own() {
        let with = |table: &str| format!("{GOOD}\n[dead_letters]\n{table}\n");
        let job = JobFile::parse("job.toml", &with("topic = \"orders-dlq\"")).unwrap();
        assert_eq!(job.dead_letters, Some(shareflow::connector::DeadLetterSettings::new("orders-dlq")));
        let job = JobFile::parse("job.toml", &with("topic = \"dlq\"\ncopy_record = false")).unwrap();
        assert_eq!(job.dead_letters.map(|d| d.copy_record), Some(false));
        assert_eq!(JobFile::parse("job.toml", GOOD).unwrap().dead_letters, None);
        for (table, key, word) in [
            ("topic = \"orders\"", "dead_letters.topic", "an input topic"),
            ("topic = \"orders-upper\"", "dead_letters.topic", "the sink's topic"),
            ("topic = \" \"", "dead_letters.topic", "must not be empty"),
            ("topic = \"dlq\"\ncopy = true", "dead_letters.copy", "unknown field"),
        ] {
            let e = JobFile::parse("job.toml", &with(table)).expect_err(table);
            assert_eq!(e.key, key, "{e}");
            assert!(e.to_string().contains(word), "{e}");
        }
    }

    #[test]
    fn a_file_on_an_embedded_broker_directory_parses() {
        let text = GOOD
            .replace("kafka = \"127.0.0.1:19092\"", "broker = \"/var/lib/shareflow/broker\"")
            .replace("kind = \"kafka\"", "kind = \"topic\"");
        let job = JobFile::parse("job.toml", &text).unwrap();
        assert_eq!(job.backend, Backend::Embedded("/var/lib/shareflow/broker".into()));
        assert_eq!(job.sink, SinkSpec::Topic { topic: "orders-upper".into() });
    }

    #[test]
    fn every_example_job_file_parses_and_the_stateful_ones_are_stateful() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs");
        let mut stateful = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let job = match JobFile::load(&path) {
                Ok(job) => job,
                // A sink this build leaves out (decision 0046): refused by its kind.
                Err(e) if e.to_string().contains("this shareflow was built without the") => continue,
                Err(e) => panic!("{}: {e}", path.display()),
            };
            for (name, sql, options) in &job.transforms {
                if let Ok(QueryPlan::Stateful(p)) = plan_query(sql, shareflow::connector::record_schema(), *options) {
                    stateful.push((name.clone(), p.window().map(|w| w.describe())));
                }
            }
        }
        stateful.sort();
        assert_eq!(
            stateful,
            vec![
                ("count".to_string(), None),
                ("per-minute".to_string(), Some("hop(10000 ms, 60000 ms)".to_string())),
                ("per-window".to_string(), Some("tumble(10000 ms)".to_string())),
                ("sessions".to_string(), Some("session(30000 ms)".to_string())),
            ]
        );
    }

    #[test]
    fn allowed_lateness_is_only_for_windowed_queries_and_not_negative() {
        let windowed = GOOD.replace(
            "sql = \"SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input\"",
            "allowed_lateness_ms = 1500\nsql = \"SELECT key, CAST(count(*) AS VARCHAR) AS value FROM input GROUP BY key, \
             tumble(timestamp, INTERVAL '1 second')\"",
        );
        let job = JobFile::parse("job.toml", &windowed).unwrap();
        assert_eq!(job.transforms[0].2.allowed_lateness, Duration::from_millis(1500));
        let stateless = GOOD.replace("[[transform]]\n", "[[transform]]\nallowed_lateness_ms = 10\n");
        let e = JobFile::parse("job.toml", &stateless).unwrap_err();
        assert!(e.key.ends_with("allowed_lateness_ms") && e.message.contains("windowed"), "{e}");
        let negative = windowed.replace("1500", "-1");
        let e = JobFile::parse("job.toml", &negative).unwrap_err();
        assert!(e.message.contains("0 or more"), "{e}");
    }
}
