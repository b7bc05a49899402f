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
//! kind = "kafka"                 # "kafka" or "topic" (a topic), "files" (url), or "print"
//! topic = "orders-upper"
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
use toml::Spanned;

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
    #[serde(default)]
    job: RawJob,
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSink {
    kind: Spanned<String>,
    topic: Option<Spanned<String>>,
    url: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    parallelism: Option<Spanned<i64>>,
    partitions: Option<Spanned<i64>>,
    checkpoint_interval_ms: Option<Spanned<i64>>,
    checkpoint_timeout_ms: Option<Spanned<i64>>,
    adoption_timeout_ms: Option<Spanned<i64>>,
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
    /// (operator name, SQL), in order.
    pub(crate) transforms: Vec<(String, String)>,
    pub(crate) sink: SinkSpec,
    pub(crate) parallelism: u32,
    pub(crate) partitions: u32,
    pub(crate) interval: Duration,
    pub(crate) checkpoint_timeout: Duration,
    pub(crate) adoption_timeout: Duration,
}

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

    /// Checks the job file `text`, named `file` in errors.
    pub(crate) fn parse(file: &str, text: &str) -> Result<Self, JobFileError> {
        let err = |span: Range<usize>, key: &str, message: String| JobFileError {
            file: file.to_string(),
            line: line_of(text, span.start),
            key: key.to_string(),
            message,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of(text, s.start));
            // toml's message carries its own excerpt; its first line says what is wrong.
            let message = e.message().trim().to_string();
            JobFileError { file: file.to_string(), line, key: key_at(text, line), message }
        })?;
        let non_empty = |v: &Spanned<String>, key: &str| -> Result<String, JobFileError> {
            let s = v.get_ref().trim();
            if s.is_empty() {
                return Err(err(v.span(), key, "must not be empty".into()));
            }
            Ok(s.to_string())
        };
        let positive = |v: &Option<Spanned<i64>>, key: &str, default: u64, max: u64| -> Result<u64, JobFileError> {
            match v {
                None => Ok(default),
                Some(n) if *n.get_ref() >= 1 && (*n.get_ref() as u64) <= max => Ok(*n.get_ref() as u64),
                Some(n) => Err(err(n.span(), key, format!("{} is out of range: give 1 to {max}", n.get_ref()))),
            }
        };
        let backend = match (&raw.kafka, &raw.broker) {
            (Some(kafka), None) => {
                let k = non_empty(kafka, "kafka")?;
                if !k.contains(':') {
                    return Err(err(kafka.span(), "kafka", format!("{k:?} is not HOST:PORT")));
                }
                Backend::Kafka(k)
            }
            (None, Some(broker)) => Backend::Embedded(non_empty(broker, "broker")?),
            (Some(_), Some(broker)) => {
                return Err(err(
                    broker.span(),
                    "broker",
                    "give kafka = \"HOST:PORT\" or broker = \"DIR\", not both".into(),
                ))
            }
            (None, None) => {
                return Err(err(
                    0..0,
                    "kafka",
                    "give kafka = \"HOST:PORT\" (a Kafka 4.x broker) or broker = \"DIR\" (an embedded broker \
                     directory, no server needed)"
                        .into(),
                ))
            }
        };
        let checkpoints = non_empty(&raw.checkpoints, "checkpoints")?;
        shareflow::checkpoint::open_url(&checkpoints, &[])
            .map_err(|e| err(raw.checkpoints.span(), "checkpoints", e.to_string()))?;
        let instance = raw.instance.as_ref().map(|i| non_empty(i, "instance")).transpose()?;
        let source = raw.source.get_ref();
        let group = non_empty(&source.group, "source.group")?;
        let topics: Vec<String> = source.topics.get_ref().iter().map(|t| t.trim().to_string()).collect();
        if topics.is_empty() || topics.iter().any(String::is_empty) {
            return Err(err(source.topics.span(), "source.topics", "give one or more topic names".into()));
        }
        let exactly_once = match source.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None | Some(("exactly-once", _)) => true,
            Some(("at-least-once", _)) => false,
            Some((m, span)) => {
                return Err(err(span, "source.mode", format!("{m:?}: give \"exactly-once\" or \"at-least-once\"")))
            }
        };
        let from_earliest = match source.from.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
            None | Some(("earliest", _)) => true,
            Some(("latest", _)) => false,
            Some((m, span)) => return Err(err(span, "source.from", format!("{m:?}: give \"earliest\" or \"latest\""))),
        };
        let max_rate = match &source.max_rate {
            None => None,
            some => Some(positive(some, "source.max_rate", 0, u64::from(u32::MAX))?),
        };
        let job = &raw.job;
        let parallelism = positive(&job.parallelism, "job.parallelism", 2, 64)? as u32;
        let partitions = positive(&job.partitions, "job.partitions", 4, 10_000)? as u32;
        let ms = |v: &Option<Spanned<i64>>, key: &str, default: u64| {
            positive(v, key, default, 86_400_000).map(Duration::from_millis)
        };
        let interval = ms(&job.checkpoint_interval_ms, "job.checkpoint_interval_ms", 1_000)?;
        let checkpoint_timeout = ms(&job.checkpoint_timeout_ms, "job.checkpoint_timeout_ms", 10_000)?;
        let adoption_timeout = ms(&job.adoption_timeout_ms, "job.adoption_timeout_ms", 30_000)?;
        if adoption_timeout <= interval + checkpoint_timeout {
            let span = job.adoption_timeout_ms.as_ref().map_or(0..0, Spanned::span);
            return Err(err(
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
        // Every transform plans against what reaches it: the source's rows, then the
        // previous transform's output.
        let mut schema = shareflow::connector::record_schema();
        let mut transforms = Vec::new();
        for (i, t) in raw.transform.iter().enumerate() {
            let t = t.get_ref();
            let key = format!("transform[{i}].sql");
            let name = match &t.name {
                Some(n) => non_empty(n, &format!("transform[{i}].name"))?,
                None => format!("transform-{i}"),
            };
            let plan = shareflow::runtime::sql::SqlPlan::plan(t.sql.get_ref(), schema.clone())
                .map_err(|e| err(t.sql.span(), &key, format!("{e} (the rows reach it as the table `input`)")))?;
            schema = plan.output_schema();
            transforms.push((name, t.sql.get_ref().clone()));
        }
        let sink = raw.sink.get_ref();
        let sink = match sink.kind.get_ref().as_str() {
            "kafka" | "topic" => {
                let topic = sink
                    .topic
                    .as_ref()
                    .ok_or_else(|| err(raw.sink.span(), "sink.topic", "a topic sink needs topic = \"...\"".into()))?;
                if schema.index_of("value").is_err() {
                    return Err(err(
                        raw.sink.span(),
                        "sink",
                        "a topic sink writes the column `value` (and `key` if there is one); the last transform \
                         has no `value` column"
                            .into(),
                    ));
                }
                SinkSpec::Topic { topic: non_empty(topic, "sink.topic")? }
            }
            "files" => {
                let url = sink.url.as_ref().ok_or_else(|| {
                    err(raw.sink.span(), "sink.url", "a files sink needs url = \"file:///...\"".into())
                })?;
                let u = non_empty(url, "sink.url")?;
                shareflow::checkpoint::open_url(&u, &[]).map_err(|e| err(url.span(), "sink.url", e.to_string()))?;
                SinkSpec::Files { url: u }
            }
            "print" => SinkSpec::Print,
            other => {
                return Err(err(
                    sink.kind.span(),
                    "sink.kind",
                    format!("{other:?}: give \"kafka\" (or \"topic\"), \"files\" or \"print\""),
                ))
            }
        };
        Ok(Self {
            backend,
            checkpoints,
            instance,
            group,
            topics,
            exactly_once,
            from_earliest,
            max_rate,
            transforms,
            sink,
            parallelism,
            partitions,
            interval,
            checkpoint_timeout,
            adoption_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
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
            (replace("kind = \"kafka\"", "kind = \"s3\""), 17, "sink.kind", "\"files\" or \"print\""),
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
    fn a_file_on_an_embedded_broker_directory_parses() {
        let text = GOOD
            .replace("kafka = \"127.0.0.1:19092\"", "broker = \"/var/lib/shareflow/broker\"")
            .replace("kind = \"kafka\"", "kind = \"topic\"");
        let job = JobFile::parse("job.toml", &text).unwrap();
        assert_eq!(job.backend, Backend::Embedded("/var/lib/shareflow/broker".into()));
        assert_eq!(job.sink, SinkSpec::Topic { topic: "orders-upper".into() });
    }
}
