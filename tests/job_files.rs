//! `shareflow run JOB.toml`: the two example job files under `examples/jobs/`, run as
//! real processes on a real Kafka broker, each checked from the outside; and a bad job
//! file refused before anything runs, naming its line and key.

#![allow(clippy::unwrap_used)]

mod support;

#[path = "support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::ObjectStoreExt as _;
use shareflow::connector::kafka::{KafkaShareConsumer, KafkaShareConsumerConfig};
use shareflow::connector::share::{AcknowledgeType, ShareConsumer};
use support::demo::{wait_for, Outcome};
use support::kafka::{cluster, unique};

#[path = "support/stateful_kinds.rs"]
mod kinds;
#[path = "support/rng.rs"]
mod rng;

/// The longest a job file's run may take to process its input.
const WITHIN: Duration = Duration::from_secs(120);

/// Starts `shareflow run FILE --instance NAME --checkpoints URL --json`.
fn start(file: &Path, instance: &str, checkpoints: &str, stdout: &Path) -> Child {
    let bootstrap = support::kafka::bootstrap().unwrap();
    Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .arg("run")
        .arg(file)
        .args(["--instance", instance, "--kafka", &bootstrap, "--checkpoints", checkpoints, "--json"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(stdout).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// SIGTERM by pid, then the run's summary: it stops gracefully (a final checkpoint).
fn stop(mut child: Child, stdout: &Path) -> Outcome {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success(), "kill -TERM by pid");
    let status = wait_for(&mut child, WITHIN).unwrap_or_else(|| {
        child.kill().unwrap();
        panic!("the job did not stop after SIGTERM")
    });
    Outcome {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(stdout).unwrap(),
        stderr: String::new(),
    }
}

/// The example file's value of `key` (a quoted string on its own line).
fn file_value(file: &std::path::Path, key: &str) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("{key} in {}", file.display()));
    line.split('"').nth(1).unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uppercase_job_file_writes_each_record_once_upper_cased() {
    let Some(c) = cluster().await else { return };
    let file = &checkout_file("examples/jobs/uppercase.toml");
    let (input, output) = ("jobs-uppercase-in", file_value(file, "topic"));
    assert!(std::fs::read_to_string(file).unwrap().contains(&format!("topics = [\"{input}\"]")));
    c.ensure_topic(input, 4, &[]).await.unwrap();
    c.ensure_topic(&output, 4, &[]).await.unwrap();
    // Values unique to this run: earlier runs of the example left their own.
    let tag = unique("run");
    let values: Vec<String> = (0..500).map(|i| format!("{tag}-rec-{i}")).collect();
    let before = c.end_offsets(&output, true).await.unwrap();
    c.produce(input, values.iter().map(|v| (None, Bytes::from(v.clone())))).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = format!("file://{}", dir.path().display());
    let out = dir.path().join("stdout");
    let child = start(file, "a", &checkpoints, &out);
    // Until every value is in the output, upper-cased.
    let wanted: Vec<String> = values.iter().map(|v| v.to_uppercase()).collect();
    let started = Instant::now();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut from = before.clone();
    while !wanted.iter().all(|w| seen.contains_key(w)) {
        assert!(started.elapsed() < WITHIN, "only {} of 500 records reached {output}", seen.len());
        let (records, ends) = c.read_committed_from(&output, &from).await.unwrap();
        from = ends;
        for (_, _, _, v) in records {
            let v = String::from_utf8_lossy(v.as_deref().unwrap_or_default()).to_string();
            if v.starts_with(&tag.to_uppercase()) {
                *seen.entry(v).or_default() += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stopped = stop(child, &out);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    let summary = stopped.json();
    assert_eq!(summary["instance"], "a", "{summary}");
    assert_eq!(summary["stopped"], true, "{summary}");
    // Nothing more arrived after the stop, and nothing twice.
    let (records, _) = c.read_committed_from(&output, &from).await.unwrap();
    for (_, _, _, v) in records {
        let v = String::from_utf8_lossy(v.as_deref().unwrap_or_default()).to_string();
        if v.starts_with(&tag.to_uppercase()) {
            *seen.entry(v).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 500);
    assert!(
        seen.values().all(|&n| n == 1),
        "duplicates: {:?}",
        seen.iter().filter(|(_, &n)| n > 1).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_errors_job_file_publishes_only_the_error_lines_as_files() {
    use arrow::array::{Array, StringArray};
    let Some(c) = cluster().await else { return };
    let file = &checkout_file("examples/jobs/errors_to_files.toml");
    let input = "jobs-logs-in";
    c.ensure_topic(input, 4, &[]).await.unwrap();
    let tag = unique("run");
    // Every third line is an error.
    let lines: Vec<String> =
        (0..300).map(|i| format!("{} {tag} line {i}", if i % 3 == 0 { "ERROR" } else { "INFO" })).collect();
    c.produce(input, lines.iter().map(|l| (None, Bytes::from(l.clone())))).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = format!("file://{}", dir.path().join("checkpoints").display());
    let out = dir.path().join("stdout");
    let child = start(file, "a", &checkpoints, &out);
    // The lake is the example's; only this run's lines are counted.
    let lake = file_value(file, "url");
    let (store, root) = shareflow::checkpoint::open_url(&lake, &[]).unwrap();
    let committer = shareflow::connector::FileCommitter::new(store.clone(), root.as_ref());
    let count = || async {
        let mut found: HashMap<String, usize> = HashMap::new();
        for path in committer.published().await.unwrap() {
            let bytes = store.get(&path).await.unwrap().bytes().await.unwrap();
            let reader = arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes.to_vec()), None).unwrap();
            for batch in reader {
                let batch = batch.unwrap();
                // Whatever string type the SQL produced (Utf8, Utf8View), read as Utf8.
                let column = batch.column_by_name("value").unwrap();
                let column = arrow::compute::cast(column, &arrow::datatypes::DataType::Utf8).unwrap();
                let values = column.as_any().downcast_ref::<StringArray>().unwrap();
                for i in 0..values.len() {
                    let v = values.value(i);
                    if v.contains(&tag) {
                        *found.entry(v.split_once(' ').unwrap().1.to_string()).or_default() += 1;
                    }
                }
            }
        }
        found
    };
    let started = Instant::now();
    let mut found = count().await;
    while found.len() < 100 {
        assert!(started.elapsed() < WITHIN, "only {} of 100 error lines were published", found.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
        found = count().await;
    }
    let stopped = stop(child, &out);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    let found = count().await;
    let errors: Vec<&String> = lines.iter().filter(|l| l.starts_with("ERROR")).collect();
    assert_eq!(found.len(), errors.len(), "{found:?}");
    for e in errors {
        assert_eq!(found.get(e.as_str()), Some(&1), "{e}: published once");
    }
}

#[test]
fn a_bad_job_file_is_refused_naming_its_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(checkout_file("examples/jobs/uppercase.toml")).unwrap();
    let bad = good.replace("parallelism = 2", "parallelism = 0");
    let line = bad.lines().position(|l| l == "parallelism = 0").unwrap() + 1;
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["run", path.to_str().unwrap(), "--instance", "a"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("bad.toml:{line}: job.parallelism: 0 is out of range")), "{stderr}");
    // A missing file is named too.
    let out = Command::new(env!("CARGO_BIN_EXE_shareflow")).args(["run", "/nonexistent/job.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/job.toml"), "{out:?}");
}

/// Tumbling, hopping, session and upsert queries, each run from a job file by
/// `shareflow run` on Kafka (event time read from the value `USER,MS`): the closed
/// windows (and each user's last count) equal the batch answer, read_committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stateful_query_kind_runs_from_a_job_file_on_kafka() {
    let Some(c) = cluster().await else { return };
    let bootstrap = support::kafka::bootstrap().unwrap();
    let input = unique("kinds-in");
    c.ensure_topic(&input, 2, &[]).await.unwrap();
    c.produce(&input, (0..kinds::N).map(|i| (None, Bytes::from(kinds::value(i))))).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for kind in kinds::kinds() {
        let name = kind.name;
        let (group, output) = (unique(&format!("kinds-{name}")), unique(&format!("kinds-{name}-out")));
        let job = format!(
            "kafka = \"{bootstrap}\"\ncheckpoints = \"file://{chk}\"\n\n[source]\ngroup = \"{group}\"\n\
             topics = [\"{input}\"]\n\n[[transform]]\nname = \"{name}\"\n{lateness}sql = \"{sql}\"\n\n\
             [sink]\nkind = \"kafka\"\ntopic = \"{output}\"\n\n[job]\nparallelism = 2\ncheckpoint_interval_ms = 200\n",
            chk = dir.path().join(name).display(),
            lateness = kind.lateness,
            sql = kind.sql,
        );
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, job).unwrap();
        let stdout = dir.path().join(format!("{name}.out"));
        let child = start(&path, name, &format!("file://{}", dir.path().join(name).display()), &stdout);
        let read = || async {
            let rows = c.read_committed(&output).await.unwrap_or_default().into_iter().map(|(_, _, k, v)| {
                let text = |b: Option<Bytes>| String::from_utf8(b.unwrap_or_default().to_vec()).unwrap();
                (text(k), text(v))
            });
            kinds::fold(name, rows).unwrap()
        };
        // The last windows close once the drained source was idle for 10 s.
        let deadline = Instant::now() + WITHIN;
        while read().await != kind.want {
            assert!(
                Instant::now() < deadline,
                "{name}: not the batch answer within {WITHIN:?}: {} rows of {}",
                read().await.len(),
                kind.want.len()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let outcome = stop(child, &stdout);
        assert_eq!(outcome.code, 0, "{name}: {}", outcome.stdout);
        assert_eq!(read().await, kind.want, "{name}: after the stop");
    }
}

/// A job file with `[dead_letters]` on Kafka: the values the SQL cannot cast go to the
/// dead-letter topic in the checkpoint's transaction, with the KIP-1191 headers, and so
/// does a row too large for a Kafka record; every input value comes out once, in the
/// output or in the dead letters, read_committed, though two runs are SIGKILLed.
///
/// The group also has Kafka 4.4's own dead-letter queue (KIP-1191, `share.version=2`):
/// it receives none of the job's records (the job ACCEPTs what it dead-letters), while a
/// plain share consumer's REJECT in another group lands there, so it was live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_file_with_dead_letters_on_kafka_sends_each_bad_row_there_once() {
    use shareflow::connector::dead_letters::{header, HEADER_CAUSE, HEADER_GROUP, HEADER_OFFSET, HEADER_TOPIC};
    let Some(c) = cluster().await else { return };
    let bootstrap = support::kafka::bootstrap().unwrap();
    let (input, output, dlq, group) = (unique("dlq-in"), unique("dlq-out"), unique("dlq-dead"), unique("dlq"));
    c.ensure_topic(&input, 2, &[]).await.unwrap();
    // The broker's queue: its name must start with `dlq.`, and the topic must allow it.
    let broker_dlq = format!("dlq.{}", unique("broker"));
    c.ensure_topic(&broker_dlq, 1, &[("errors.deadletterqueue.group.enable", "true")]).await.unwrap();
    let broker_queue = [
        ("share.auto.offset.reset", "earliest"),
        ("errors.deadletterqueue.topic.name", broker_dlq.as_str()),
        ("errors.deadletterqueue.copy.record.enable", "true"),
    ];
    c.set_group_configs(&group, &broker_queue).await.unwrap();
    const N: u64 = 1_000;
    // 1 % poison: values the cast fails on, and values the query makes too large for a
    // Kafka record (their dead letter copies the key, which names them).
    let line = |i: u64| match i % 200 {
        42 => format!("oops-{i}"),
        142 => format!("huge-{i}"),
        _ => i.to_string(),
    };
    let key = |i: u64| line(i).starts_with("huge").then(|| Bytes::from(format!("huge-{i}")));
    c.produce(&input, (0..N).map(|i| (key(i), Bytes::from(line(i))))).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let chk = format!("file://{}", dir.path().join("chk").display());
    let job = format!(
        "kafka = \"{bootstrap}\"\ncheckpoints = \"{chk}\"\n\n[source]\ngroup = \"{group}\"\ntopics = [\"{input}\"]\n\
         max_rate = 300\n\n[[transform]]\nsql = \"SELECT key, CASE WHEN starts_with(CAST(value AS VARCHAR), 'huge-') THEN \
         repeat(CAST(value AS VARCHAR), 150000) ELSE concat('doubled-', CAST(CAST(CAST(value AS VARCHAR) AS BIGINT) * 2 \
         AS VARCHAR)) END AS value FROM input\"\n\n[sink]\nkind = \"kafka\"\ntopic = \"{output}\"\n\n\
         [dead_letters]\ntopic = \"{dlq}\"\n\n[job]\nparallelism = 2\ncheckpoint_interval_ms = 200\n"
    );
    let path = dir.path().join("dlq.toml");
    std::fs::write(&path, job).unwrap();
    let stdout = dir.path().join("dlq.out");
    let read = || async {
        let mut got: Vec<(u64, bool)> = Vec::new();
        let (out, _) = c.read_committed_records_from(&output, &[]).await.unwrap_or_default();
        for r in out {
            let v = String::from_utf8(r.value.unwrap_or_default().to_vec()).unwrap();
            got.push((v.trim_start_matches("doubled-").parse::<u64>().unwrap() / 2, false));
        }
        let (dead, _) = c.read_committed_records_from(&dlq, &[]).await.unwrap_or_default();
        for r in dead {
            let v = String::from_utf8(r.value.clone().unwrap_or_default().to_vec()).unwrap();
            let k = String::from_utf8(r.key.clone().unwrap_or_default().to_vec()).unwrap();
            if header(&r.headers, HEADER_CAUSE) == Some("sink") {
                // A sink sees rows, not records: no origin, and the key, not the value.
                assert!(r.value.is_none() && k.starts_with("huge-"), "{k}: {v}");
                got.push((k.trim_start_matches("huge-").parse().unwrap(), true));
                continue;
            }
            assert_eq!(header(&r.headers, HEADER_CAUSE), Some("sql"), "{v}");
            assert_eq!(header(&r.headers, HEADER_TOPIC), Some(input.as_str()), "{v}");
            assert_eq!(header(&r.headers, HEADER_GROUP), Some(group.as_str()), "{v}");
            assert!(header(&r.headers, HEADER_OFFSET).is_some(), "{v}");
            got.push((v.trim_start_matches("oops-").parse().unwrap(), true));
        }
        got.sort();
        got
    };
    // Two runs SIGKILLed part way (seeded), then one to the end.
    let mut rng = rng::Rng::new(52);
    for run in 0..2 {
        let mut child = start(&path, "dlq", &chk, &stdout);
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(1_500))).await;
        assert!(child.try_wait().unwrap().is_none(), "run {run} ended early");
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!((read().await.len() as u64) < N, "the kills landed after the work was done");
    let child = start(&path, "dlq", &chk, &stdout);
    let deadline = Instant::now() + WITHIN;
    while (read().await.len() as u64) < N {
        assert!(Instant::now() < deadline, "only {} of {N} records came out", read().await.len());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let outcome = stop(child, &stdout);
    assert_eq!(outcome.code, 0, "{}", outcome.stdout);
    let want: Vec<(u64, bool)> = (0..N).map(|i| (i, line(i).parse::<u64>().is_err())).collect();
    assert_eq!(read().await, want, "every value once, the bad ones as dead letters");
    // Another group with the same broker queue: a plain consumer REJECTs three records.
    let other = unique("dlq-plain");
    c.set_group_configs(&other, &broker_queue).await.unwrap();
    let mut consumer = KafkaShareConsumer::new(&c, KafkaShareConsumerConfig::new(&other)).await.unwrap();
    consumer.subscribe(&[input.as_str()]).await.unwrap();
    let mut rejected = 0;
    let deadline = Instant::now() + WITHIN;
    while rejected < 3 {
        assert!(Instant::now() < deadline, "the plain consumer got no records");
        for r in consumer.poll(3 - rejected, Duration::from_millis(500)).await.unwrap() {
            consumer.acknowledge(&r, AcknowledgeType::Reject).await.unwrap();
            rejected += 1;
        }
    }
    consumer.commit().await.unwrap();
    // The broker writes asynchronously: wait for the three, then look at all it wrote.
    let deadline = Instant::now() + WITHIN;
    let written = loop {
        let (records, _) = c.read_committed_records_from(&broker_dlq, &[]).await.unwrap();
        if records.len() >= 3 || Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let groups: Vec<&str> = written.iter().filter_map(|r| header(&r.headers, HEADER_GROUP)).collect();
    assert_eq!(groups, vec![other.as_str(); 3], "the broker's queue holds the plain consumer's rejects only");
    consumer.close().await.unwrap();
    // `dlq list` and `dlq redrive` on Kafka: into a topic of its own, twice, each dead
    // letter once.
    let dlq_cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .arg("dlq")
            .args(args)
            .args(["--topic", dlq.as_str(), "--kafka", bootstrap.as_str()])
            .output()
            .unwrap()
    };
    let listed = dlq_cli(&["list", "--json"]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let poison = want.iter().filter(|(_, dead)| *dead).count();
    assert_eq!(poison, 10, "5 values the cast fails on, 5 rows too large");
    assert_eq!(String::from_utf8_lossy(&listed.stdout).lines().count(), poison);
    let redriven = unique("dlq-redriven");
    let redrive_chk = format!("file://{}", dir.path().join("redrive").display());
    for round in 0..2 {
        let out = dlq_cli(&["redrive", "--to", redriven.as_str(), "--checkpoints", redrive_chk.as_str()]);
        assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        let (b, _) = c.read_committed_records_from(&redriven, &[]).await.unwrap();
        eprintln!(
            "DEBUG round {round}: {:?} {}",
            b.iter().map(|r| (r.key.clone(), r.value.clone())).collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let (back, _) = c.read_committed_records_from(&redriven, &[]).await.unwrap();
    let mut back: Vec<String> =
        back.iter().map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()).collect();
    back.sort();
    // A huge row's dead letter holds no value: nothing to redrive.
    let mut expected: Vec<String> = (0..N).map(line).filter(|l| l.starts_with("oops")).collect();
    expected.sort();
    assert_eq!(back, expected, "each dead letter redriven once, over two redrives");
}
