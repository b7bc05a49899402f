//! Job files on an embedded broker directory: `shareflow produce` loads the input,
//! `shareflow run JOB.toml` runs the user's SQL on it with no server, and the output is
//! the input exactly once though the run is killed with SIGKILL again and again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{IsolationLevel, RecordState, TopicPartition};

#[path = "support/rng.rs"]
mod rng;

#[path = "support/processes.rs"]
mod processes;
use processes::{shareflow, wait};

#[cfg(feature = "postgres")]
#[path = "support/postgres.rs"]
mod pg;

#[path = "support/stateful_kinds.rs"]
mod kinds;

const RECORDS: u64 = 20_000;
const PARTITIONS: i32 = 2;

fn job_file(dir: &Path) -> std::path::PathBuf {
    // 20,000 records take 2 s or more, so every kill lands while records move.
    example_job(dir, "uppercase_embedded.toml", "/tmp/shareflow-jobs", 8000)
}

/// `examples/jobs/{example}` moved from `{tmp}` into `dir`, checkpointing every 50 ms, its
/// source at `max_rate` records a second; written to `dir/job.toml`.
fn example_job(dir: &Path, example: &str, tmp: &str, max_rate: u64) -> std::path::PathBuf {
    let text = std::fs::read_to_string(checkout_file(&format!("examples/jobs/{example}")))
        .unwrap()
        .replace(&format!("{tmp}/broker"), &dir.join("broker").display().to_string())
        .replace(&format!("file://{tmp}/checkpoints"), &format!("file://{}", dir.join("checkpoints").display()))
        .replace("checkpoint_interval_ms = 500", "checkpoint_interval_ms = 50")
        .replace("mode = \"exactly-once\"", &format!("mode = \"exactly-once\"\nmax_rate = {max_rate}"));
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn start(job: &Path, log: &Path) -> Child {
    shareflow()
        .arg("run")
        .arg(job)
        .arg("--json")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .expect("start shareflow run")
}

/// Loads `lines` into `topic` of the broker under `dir` with `shareflow produce`.
fn produce_lines(dir: &Path, topic: &str, partitions: i32, lines: impl Iterator<Item = String>) {
    processes::produce_lines(&dir.join("broker"), topic, partitions, lines);
}

/// Output records read_committed, read beside the live job (read-only open).
async fn committed_output(dir: &Path) -> usize {
    let Ok(broker) = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir.join("broker")).unwrap()).await else {
        return 0;
    };
    let mut n = 0;
    for p in 0..broker.partition_count("out").unwrap_or(0) as i32 {
        let tp = TopicPartition::new("out", p);
        n += broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.map_or(0, |r| r.len());
    }
    n
}

#[test]
fn a_job_file_on_an_embedded_broker_is_exactly_once_through_kills() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The input, through `produce`.
    let mut produce = shareflow()
        .args(["produce", "--dir"])
        .arg(dir.join("broker"))
        .args(["--topic", "in", "--partitions", &PARTITIONS.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = produce.stdin.take().unwrap();
        for i in 0..RECORDS {
            writeln!(stdin, "record-{i:06}").unwrap();
        }
    }
    let out = produce.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().split(' ').nth(1),
        Some("20000")
    );

    let job = job_file(dir);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Kills at seeded moments while the job runs.
    let mut rng = rng::Rng::new(7);
    let mut kills = 0;
    for run in 0..8 {
        if kills == 3 {
            break;
        }
        let log = dir.join(format!("run-{run}"));
        let mut child = start(&job, &log);
        let delay = Duration::from_millis(300 + rng.below(900));
        match wait(&mut child, delay) {
            Some(status) => panic!(
                "run {run} ended by itself with {status}: {}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            ),
            None => {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
            }
        }
    }
    let after_kills = runtime.block_on(committed_output(dir));
    assert!(after_kills < RECORDS as usize, "the kills landed after the work was done ({after_kills} committed)");
    // The last run goes until the whole output is committed, then stops on SIGTERM.
    let log = dir.join("final");
    let mut child = start(&job, &log);
    let deadline = Instant::now() + Duration::from_secs(120);
    while runtime.block_on(committed_output(dir)) < RECORDS as usize {
        assert!(Instant::now() < deadline, "the output did not reach {RECORDS} records in 120 s");
        assert!(child.try_wait().unwrap().is_none(), "the final run ended early");
        std::thread::sleep(Duration::from_millis(100));
    }
    let term = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(term.success());
    let status = wait(&mut child, Duration::from_secs(30)).expect("the run stops on SIGTERM");
    let stdout = std::fs::read_to_string(log.with_extension("out")).unwrap();
    assert!(status.success(), "{status}: {stdout} {}", std::fs::read_to_string(log.with_extension("err")).unwrap());
    assert!(stdout.contains("\"stopped\":true"), "{stdout}");

    // Checked from the outside: every input record ACKNOWLEDGED, the output each input
    // value upper-cased, once.
    runtime.block_on(async {
        let broker = EmbeddedBroker::open(BrokerOptions::local_dir(dir.join("broker")).unwrap()).await.unwrap();
        let mut seen = BTreeMap::<Vec<u8>, u32>::new();
        // The job made `out` with the file's partitions (4 by default).
        for p in 0..broker.partition_count("out").unwrap() as i32 {
            let tp = TopicPartition::new("out", p);
            for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.unwrap() {
                *seen.entry(r.value.unwrap().to_vec()).or_default() += 1;
            }
        }
        for p in 0..PARTITIONS {
            let input = TopicPartition::new("in", p);
            for r in broker.fetch_all(&input, IsolationLevel::ReadUncommitted).await.unwrap() {
                let status = broker.record_status("uppercase", &input, r.offset).await.unwrap();
                assert_eq!(status.state, RecordState::Acknowledged, "{input}@{}", r.offset);
            }
        }
        let want: BTreeMap<Vec<u8>, u32> = (0..RECORDS).map(|i| (format!("RECORD-{i:06}").into_bytes(), 1)).collect();
        assert_eq!(seen.len(), want.len(), "distinct output values");
        assert_eq!(seen, want);
        broker.close();
    });
    assert_eq!(kills, 3);
}

#[test]
fn produce_and_run_refuse_bad_input_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = shareflow().args(["produce", "--topic", "in"]).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dir <DIR>"), "{}", String::from_utf8_lossy(&out.stderr));
    // A job file with both backends names the line and key.
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        std::fs::read_to_string(job_file(dir.path())).unwrap().replace("broker = ", "kafka = \"h:1\"\nbroker = "),
    )
    .unwrap();
    let out = shareflow().arg("run").arg(&job).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broker: give kafka = \"HOST:PORT\" or broker = \"DIR\", not both"), "{err}");
}

/// Windowed counts from `examples/jobs/windows_embedded.toml` through SIGKILLs, one of
/// them at a broker journal point: every window the watermark passed is in the output
/// once, with the batch answer's count, and no window appears twice.
#[test]
fn the_windowed_job_file_is_exactly_once_through_kills() {
    const USERS: u64 = 50;
    const BASE: u64 = 1_700_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // Event times 10 ms apart: 200 s, 20 windows of 10 s, 20 records per user each.
    produce_lines(dir, "clicks", PARTITIONS, (0..RECORDS).map(|i| format!("user-{},{}", i % USERS, BASE + i * 10)));
    let job = example_job(dir, "windows_embedded.toml", "/tmp/shareflow-windows", 8000);
    // Complete windows: the watermark ends at the last event time less 2 s of lateness,
    // so every window but the last closes.
    let last = BASE + (RECORDS - 1) * 10;
    let mut want = BTreeMap::<(String, String), u64>::new();
    for i in 0..RECORDS {
        let t = BASE + i * 10;
        let start = t - t % 10_000;
        if start + 10_000 <= last - 2_000 {
            *want.entry((format!("user-{}", i % USERS), start.to_string())).or_default() += 1;
        }
    }
    let read = |dir: &Path| processes::committed_windows(&dir.join("broker"));
    let mut rng = rng::Rng::new(11);
    let mut kills = 0;
    for run in 0..8 {
        if kills == 3 {
            break;
        }
        let log = dir.join(format!("win-{run}"));
        // The second run dies inside the broker's journal, at a segment roll.
        let mut child = if run == 1 {
            let mut cmd = shareflow();
            cmd.env("SHAREFLOW_CRASH_AT", "segment.roll")
                .arg("run")
                .arg(&job)
                .arg("--json")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
                .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
            cmd.spawn().unwrap()
        } else {
            start(&job, &log)
        };
        match wait(&mut child, Duration::from_millis(300 + rng.below(900))) {
            Some(_) if run == 1 => kills += 1,
            Some(status) => panic!(
                "run {run} ended with {status}: {}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            ),
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
            }
        }
    }
    let after_kills = read(dir).len();
    assert!(after_kills < want.len(), "the kills landed after the work was done ({after_kills} windows)");
    let log = dir.join("win-final");
    let mut child = start(&job, &log);
    let deadline = Instant::now() + Duration::from_secs(120);
    while read(dir).len() < want.len() {
        assert!(Instant::now() < deadline, "the windows did not all close in 120 s");
        assert!(child.try_wait().unwrap().is_none(), "the final run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = wait(&mut child, Duration::from_secs(30)).expect("the run stops on SIGTERM");
    assert!(status.success(), "{status}");
    let mut got = BTreeMap::<(String, String), u64>::new();
    for (key, start, count) in read(dir) {
        assert!(got.insert((key.clone(), start.clone()), count).is_none(), "window {key} {start} emitted twice");
    }
    assert_eq!(got, want);
}

/// The job file of one stateful kind on the broker under `dir`, its checkpoints in
/// `chk-{name}`, with `source` and `transform` lines of the test's own.
fn stateful_job(dir: &Path, kind: &kinds::Kind, source: &str, transform: &str) -> std::path::PathBuf {
    let name = kind.name;
    let job = format!(
        "broker = \"{broker}\"\ncheckpoints = \"file://{chk}\"\n\n[source]\ngroup = \"{name}\"\ntopics = [\"events\"]\n{source}\n\
         [[transform]]\nname = \"{name}\"\n{lateness}{transform}sql = \"{sql}\"\n\n\
         [sink]\nkind = \"topic\"\ntopic = \"{name}-out\"\n\n[job]\nparallelism = 2\ncheckpoint_interval_ms = 50\n",
        broker = dir.join("broker").display(),
        chk = dir.join(format!("chk-{name}")).display(),
        lateness = kind.lateness,
        sql = kind.sql,
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, job).unwrap();
    path
}

/// The (key, value) rows of `{name}-out` read_committed, in offset order per partition.
fn stateful_output(dir: &Path, name: &str) -> Vec<(String, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut rows = Vec::new();
        let Ok(broker) = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir.join("broker")).unwrap()).await
        else {
            return rows;
        };
        for p in 0..broker.partition_count(&format!("{name}-out")).unwrap_or(0) as i32 {
            let tp = TopicPartition::new(format!("{name}-out"), p);
            for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.unwrap_or_default() {
                let text = |b: Option<bytes::Bytes>| String::from_utf8(b.unwrap().to_vec()).unwrap();
                rows.push((text(r.key), text(r.value)));
            }
        }
        rows
    })
}

/// Runs `job` until its output folds to the kind's batch answer (60 s at most) and the
/// job runs (its first progress line: a SIGTERM now stops it gracefully), stops it with
/// SIGTERM, and checks the answer again after the stop.
fn run_to_the_answer(dir: &Path, kind: &kinds::Kind, job: &Path, log: &Path) {
    let name = kind.name;
    let read = || kinds::fold(name, stateful_output(dir, name)).unwrap();
    let running = || std::fs::read_to_string(log.with_extension("err")).is_ok_and(|e| e.contains("progress:"));
    let mut child = start(job, log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while read() != kind.want || !running() {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "{name}: the output is not the batch answer: {} rows against {} ({})",
                read().len(),
                kind.want.len(),
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = wait(&mut child, Duration::from_secs(30)).expect("the run stops on SIGTERM");
    assert!(status.success(), "{name}: {status}");
    assert_eq!(read(), kind.want, "{name}: after the stop");
}

/// Tumbling, hopping, session and upsert queries, each run from a job file by
/// `shareflow run` on one embedded broker directory, event time read from the value
/// (`USER,MS`): the closed windows (and each user's last count) equal the batch answer.
#[test]
fn every_stateful_query_kind_runs_from_a_job_file() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    produce_lines(dir, "events", 2, (0..kinds::N).map(kinds::value));
    for kind in kinds::kinds() {
        // The last windows close once the drained source was idle for 10 s.
        let job = stateful_job(dir, &kind, "", "");
        run_to_the_answer(dir, &kind, &job, &dir.join(format!("{}-run", kind.name)));
    }
}

/// The stateful kill campaign: for each seed, one query kind (tumbling, hopping,
/// session, upsert by seed) runs from a job file and is killed 2-4 times at seeded
/// moments, by SIGKILL or, in one run, by an abort at a seeded broker journal point
/// (`SHAREFLOW_CRASH_AT`; snapshots every 16 KiB so the snapshot and GC points are
/// reached). A last run goes on to the batch answer: every closed window once with its
/// count, and (upsert) every user's counts strictly rising, each value committed once.
///
/// `SHAREFLOW_STATEFUL_KILL_SEEDS=k` runs seeds 1..=k (default 4, one per kind).
#[test]
fn every_stateful_query_kind_is_exact_through_seeded_kills() {
    use shareflow::connector::broker::fault;
    let seeds: u64 = std::env::var("SHAREFLOW_STATEFUL_KILL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let (mut kills, mut broker_aborts, mut cut_short) = (0, Vec::new(), 0);
    for seed in 1..=seeds {
        let mut rng = rng::Rng::new(seed);
        let kind = kinds::kinds().swap_remove((seed % 4) as usize);
        let name = kind.name;
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        produce_lines(dir, "events", 2, (0..kinds::N).map(kinds::value));
        // 4,000 records at 500 a second, 8 s of input: every kill lands while records move.
        // An input that sends nothing for this long stops holding the watermark back: a
        // short one makes a loaded machine's stall look like an idle input, whose rows
        // then arrive late (1 s did, twice, in full runs; 3 s once, in a full run with a
        // browser beside it).
        let idle = if kind.lateness.is_empty() { "" } else { "idle_timeout_ms = 6000\n" };
        let job = stateful_job(dir, &kind, "max_rate = 500\n", idle);
        let runs = 2 + rng.below(3);
        let abort_run = rng.below(runs);
        let point = fault::ALL[rng.below(fault::ALL.len() as u64) as usize];
        for run in 0..runs {
            let log = dir.join(format!("{name}-{run}"));
            let mut cmd = shareflow();
            cmd.env("SHAREFLOW_BROKER_SNAPSHOT_BYTES", "16384");
            if run == abort_run {
                cmd.env("SHAREFLOW_CRASH_AT", point);
            }
            let mut child = cmd
                .arg("run")
                .arg(&job)
                .arg("--json")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
                .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
                .spawn()
                .unwrap();
            let err = || std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
            // The run that aborts in the broker gets time to reach its point.
            let delay = if run == abort_run { 4_000 } else { 150 + rng.below(1_350) };
            match wait(&mut child, Duration::from_millis(delay)) {
                Some(_) if err().contains(&format!("crashing at fault point {point}")) => broker_aborts.push(point),
                Some(status) => panic!("seed {seed} ({name}) run {run} ended with {status}: {}", err()),
                None => {
                    child.kill().unwrap(); // SIGKILL
                    child.wait().unwrap();
                }
            }
            kills += 1;
        }
        let before = kinds::fold(name, stateful_output(dir, name))
            .unwrap_or_else(|e| panic!("seed {seed}: after the kills: {e}"));
        if before != kind.want {
            cut_short += 1;
        }
        run_to_the_answer(dir, &kind, &job, &dir.join(format!("{name}-final")));
        if name == "upsert" {
            let mut counts = BTreeMap::<String, Vec<u64>>::new();
            for (user, value) in stateful_output(dir, name) {
                counts.entry(user).or_default().push(value.parse().unwrap());
            }
            for (user, c) in counts {
                assert!(c.windows(2).all(|w| w[0] < w[1]), "seed {seed}: {user} committed counts {c:?}: a value twice");
            }
        }
    }
    eprintln!(
        "stateful kill campaign: {seeds} seeds, {kills} kills ({} at broker journal points: {broker_aborts:?}), \
         {cut_short} seeds stopped short of the answer",
        broker_aborts.len()
    );
    assert!(cut_short * 2 >= seeds, "only {cut_short} of {seeds} seeds were killed before the answer was complete");
}

/// `examples/jobs/dead_letters_embedded.toml` through SIGKILLs: values that are not
/// numbers go to the dead-letter topic with their KIP-1191 headers, the rest are
/// doubled; every input line comes out exactly once, in one topic or the other.
#[test]
fn the_dead_letters_job_file_is_exactly_once_through_kills() {
    use shareflow::connector::dead_letters::{header, HEADER_CAUSE, HEADER_MESSAGE, HEADER_OFFSET, HEADER_TOPIC};
    const N: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let line = |i: u64| if i % 100 == 42 { format!("oops-{i}") } else { i.to_string() };
    produce_lines(dir, "numbers", PARTITIONS, (0..N).map(line));
    let job = example_job(dir, "dead_letters_embedded.toml", "/tmp/shareflow-dlq", 1000);
    // (id, from the dead letters?) of every record read_committed in both topics.
    let read = || -> Vec<(u64, bool)> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let Ok(broker) =
                EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir.join("broker")).unwrap()).await
            else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for (topic, dead) in [("numbers-doubled", false), ("numbers-dlq", true)] {
                for p in 0..broker.partition_count(topic).unwrap_or(0) as i32 {
                    let tp = TopicPartition::new(topic, p);
                    for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.unwrap_or_default() {
                        let value = String::from_utf8(r.value.clone().unwrap_or_default().to_vec()).unwrap();
                        let id: u64 = if dead {
                            assert_eq!(header(&r.headers, HEADER_CAUSE), Some("sql"), "{value}");
                            assert_eq!(header(&r.headers, HEADER_TOPIC), Some("numbers"), "{value}");
                            assert!(header(&r.headers, HEADER_OFFSET).is_some(), "{value}");
                            assert!(header(&r.headers, HEADER_MESSAGE).is_some_and(|m| m.contains("oops")), "{value}");
                            value.trim_start_matches("oops-").parse().unwrap()
                        } else {
                            value.trim_start_matches("doubled-").parse::<u64>().unwrap() / 2
                        };
                        out.push((id, dead));
                    }
                }
            }
            out
        })
    };
    let mut rng = rng::Rng::new(52);
    for run in 0..2 {
        let log = dir.join(format!("dlq-{run}"));
        let mut child = start(&job, &log);
        if let Some(status) = wait(&mut child, Duration::from_millis(300 + rng.below(900))) {
            panic!("run {run} ended with {status}: {}", std::fs::read_to_string(log.with_extension("err")).unwrap());
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!((read().len() as u64) < N, "the kills landed after the work was done");
    let log = dir.join("dlq-final");
    let mut child = start(&job, &log);
    let running = || std::fs::read_to_string(log.with_extension("err")).is_ok_and(|e| e.contains("progress:"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while (read().len() as u64) < N || !running() {
        assert!(Instant::now() < deadline, "not every record came out in 60 s: {}", read().len());
        assert!(child.try_wait().unwrap().is_none(), "the final run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = wait(&mut child, Duration::from_secs(30)).expect("the run stops on SIGTERM");
    assert!(status.success(), "{status}");
    // The default 1,000 restarts outlast the group's delivery limit of 5: the run says so
    // (a killed run may not have got that far).
    let last = std::fs::read_to_string(log.with_extension("err")).unwrap();
    assert!(last.contains("allows 1000 restarts and the share group's delivery limit is 5"), "{last}");
    let mut got = read();
    got.sort();
    let want: Vec<(u64, bool)> = (0..N).map(|i| (i, line(i).starts_with("oops"))).collect();
    assert_eq!(got, want, "every line once, the bad ones as dead letters");
}

/// A run whose checkpoints all time out (1 ms) fails attempt after attempt, and each
/// failed attempt is a delivery of every record it held. At the group's delivery limit
/// the broker archives them; with `[dead_letters]` it dead-letters them too (cause
/// `delivery-limit`), each once, instead of letting them vanish, and says so at warn.
#[test]
fn records_a_failing_run_burns_to_the_delivery_limit_are_dead_lettered_once() {
    // A checkpoint timeout of 1 ms fails nearly every checkpoint; one that meets it while
    // the job is idle commits what it holds. A run where such a checkpoint committed
    // every record before any reached the limit shows nothing: it is run again, at most
    // 3 times in all.
    for round in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        if burn_to_the_delivery_limit(dir.path(), round == 3) {
            return;
        }
        eprintln!("round {round}: a checkpoint committed every record before the limit; again");
    }
}

/// One run of [`records_a_failing_run_burns_to_the_delivery_limit_are_dead_lettered_once`]
/// in `dir`: `false` if a checkpoint committed every record (unless `last`, when that
/// fails the test), else `true` once every check passed.
fn burn_to_the_delivery_limit(dir: &Path, last: bool) -> bool {
    use shareflow::connector::dead_letters::{header, HEADER_CAUSE, HEADER_DELIVERY_COUNT};
    const N: u64 = 400;
    produce_lines(dir, "numbers", PARTITIONS, (0..N).map(|i| i.to_string()));
    let job = example_job(dir, "dead_letters_embedded.toml", "/tmp/shareflow-dlq", 100_000);
    let text =
        std::fs::read_to_string(&job).unwrap().replace("[job]\n", "[job]\ncheckpoint_timeout_ms = 1\nrestarts = 7\n");
    std::fs::write(&job, text).unwrap();
    let log = dir.join("burn");
    let mut child = start(&job, &log);
    let status = wait(&mut child, Duration::from_secs(120)).expect("the run gives up within 120 s");
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (out, dead) = runtime.block_on(async {
        let broker =
            EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir.join("broker")).unwrap()).await.unwrap();
        let (mut out, mut dead) = (Vec::new(), Vec::new());
        for (topic, dlq) in [("numbers-doubled", false), ("numbers-dlq", true)] {
            for p in 0..broker.partition_count(topic).unwrap_or(0) as i32 {
                let tp = TopicPartition::new(topic, p);
                for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.unwrap() {
                    let value = String::from_utf8(r.value.clone().unwrap_or_default().to_vec()).unwrap();
                    if dlq {
                        assert_eq!(header(&r.headers, HEADER_CAUSE), Some("delivery-limit"), "{value}");
                        assert_eq!(header(&r.headers, HEADER_DELIVERY_COUNT), Some("5"), "{value}");
                        dead.push(value.parse::<u64>().unwrap());
                    } else {
                        out.push(value.trim_start_matches("doubled-").parse::<u64>().unwrap() / 2);
                    }
                }
            }
        }
        (out, dead)
    });
    if !last && dead.is_empty() && out.len() as u64 == N {
        return false;
    }
    assert!(!status.success(), "{err}");
    assert!(err.contains("records archived at the group's delivery limit"), "{err}");
    assert!(!dead.is_empty(), "nothing reached the delivery limit: {err}");
    let mut all: Vec<u64> = out.iter().chain(&dead).copied().collect();
    all.sort();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "every record once: {} out, {} dead", out.len(), dead.len());
    true
}

/// `examples/jobs/postgres_embedded.toml` into a real PostgreSQL table through SIGKILLs.
/// The table has no key and the sink inserts (the example upserts), so that a row
/// written twice would show: every number lands once, and after SIGTERM no transaction
/// of the job is left prepared.
#[cfg(feature = "postgres")]
#[test]
fn the_postgres_job_file_is_exactly_once_through_kills() {
    const N: u64 = 3_000;
    let Some(url) = pg::url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (table, group) = (pg::unique("numbers"), pg::unique("numbers_to_pg"));
    let client = runtime.block_on(pg::client(&url));
    runtime
        .block_on(client.batch_execute(&format!(
            "CREATE TABLE {table} (id bigint, doubled bigint, seen_at timestamp DEFAULT now())"
        )))
        .unwrap();
    produce_lines(dir, "numbers", PARTITIONS, (1..=N).map(|i| i.to_string()));
    let job = example_job(dir, "postgres_embedded.toml", "/tmp/shareflow-pg", 800);
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("postgres://shareflow@127.0.0.1:15432/shareflow", &url)
        .replace("table = \"numbers\"", &format!("table = \"{table}\""))
        .replace("group = \"numbers-to-pg\"", &format!("group = \"{group}\""))
        .replace("mode = \"upsert\"\nkey = [\"id\"]\n", "");
    std::fs::write(&job, text).unwrap();
    let count = |what: &str| -> i64 {
        runtime
            .block_on(client.query_one(&format!("SELECT ({what})::bigint FROM {table}"), &[]))
            .unwrap()
            .get::<_, Option<i64>>(0)
            .unwrap_or(0)
    };
    let mut rng = rng::Rng::new(53);
    for run in 0..2 {
        let log = dir.join(format!("pg-{run}"));
        let mut child = start(&job, &log);
        if let Some(status) = wait(&mut child, Duration::from_millis(400 + rng.below(800))) {
            panic!("run {run} ended with {status}: {}", std::fs::read_to_string(log.with_extension("err")).unwrap());
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!((count("count(*)") as u64) < N, "the kills landed after the work was done");
    let log = dir.join("pg-final");
    let mut child = start(&job, &log);
    let deadline = Instant::now() + Duration::from_secs(60);
    while (count("count(*)") as u64) < N {
        assert!(Instant::now() < deadline, "{} of {N} rows in 60 s", count("count(*)"));
        assert!(child.try_wait().unwrap().is_none(), "the final run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = wait(&mut child, Duration::from_secs(30)).expect("the run stops on SIGTERM");
    assert!(status.success(), "{status}");
    let n = N as i64;
    assert_eq!((count("count(*)"), count("count(DISTINCT id)")), (n, n), "every number once");
    assert_eq!(count("sum(doubled - 2 * id)"), 0, "each doubled");
    assert_eq!(count("min(id)"), 1);
    assert_eq!(count("max(id)"), n);
    let left = runtime.block_on(pg::prepared(&client, &format!("{group}-")));
    assert!(left.is_empty(), "prepared transactions left after a clean stop: {left:?}");
    runtime.block_on(client.batch_execute(&format!("DROP TABLE {table}"))).unwrap();
}

/// `examples/jobs/delta_embedded.toml` into a Delta table through SIGKILLs, read back by
/// delta-rs (`scripts/delta-check`, the format's own reader): every number once, in the
/// partition of its last digit, and nothing left staged after SIGTERM.
#[cfg(feature = "tables")]
#[test]
fn the_delta_job_file_is_exactly_once_through_kills() {
    const N: u64 = 3_000;
    let check_script = checkout_file("scripts/delta-check");
    let install = Command::new(&check_script).arg("install").output().unwrap();
    if !install.status.success() {
        let why = format!("scripts/delta-check install failed: {}", String::from_utf8_lossy(&install.stderr));
        assert!(
            std::env::var("CI").is_err() && std::env::var("SHAREFLOW_REQUIRE_SERVERS").is_err(),
            "this run must read the Delta table with delta-rs: {why}"
        );
        eprintln!("skipping the Delta reader test: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    produce_lines(dir, "numbers", PARTITIONS, (1..=N).map(|i| i.to_string()));
    let job = example_job(dir, "delta_embedded.toml", "/tmp/shareflow-delta", 800);
    let table = dir.join("table");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("file:///tmp/shareflow-delta/table", &format!("file://{}", table.display()));
    std::fs::write(&job, text).unwrap();
    let query = |sql: &str| -> serde_json::Value {
        let out = Command::new(&check_script).arg(&table).arg(sql).output().unwrap();
        assert!(out.status.success(), "delta-check: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let rows = || {
        if table.join("_delta_log").exists() {
            query("SELECT count(*) AS n FROM t")["n"].as_u64().unwrap()
        } else {
            0
        }
    };
    let mut rng = rng::Rng::new(54);
    for run in 0..2 {
        let log = dir.join(format!("delta-{run}"));
        let mut child = start(&job, &log);
        if let Some(status) = wait(&mut child, Duration::from_millis(600 + rng.below(900))) {
            panic!("run {run} ended with {status}: {}", std::fs::read_to_string(log.with_extension("err")).unwrap());
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!(rows() < N, "the kills landed after the work was done");
    let log = dir.join("delta-final");
    let mut child = start(&job, &log);
    let deadline = Instant::now() + Duration::from_secs(90);
    while rows() < N {
        assert!(Instant::now() < deadline, "{} of {N} rows in 90 s", rows());
        assert!(child.try_wait().unwrap().is_none(), "the final run ended early");
        std::thread::sleep(Duration::from_millis(500));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = wait(&mut child, Duration::from_secs(30)).expect("the run stops on SIGTERM");
    assert!(status.success(), "{status}");
    let got = query(
        "SELECT count(*) AS n, count(DISTINCT id) AS d, min(id) AS lo, max(id) AS hi, \
         sum(CASE WHEN id % 10 <> digit THEN 1 ELSE 0 END) AS wrong FROM t",
    );
    assert_eq!((got["n"].as_u64(), got["d"].as_u64()), (Some(N), Some(N)), "every number once: {got}");
    assert_eq!((got["lo"].as_u64(), got["hi"].as_u64(), got["wrong"].as_u64()), (Some(1), Some(N), Some(0)), "{got}");
    let staged: Vec<_> = walk(&table.join("_staging")).into_iter().filter(|p| !p.ends_with("_aborted")).collect();
    assert!(staged.is_empty(), "staged files left after a clean stop: {staged:?}");
}

/// Every file under `dir`, if it exists.
#[cfg(feature = "tables")]
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}

/// `shareflow dlq list` shows every dead letter with its headers, and `shareflow dlq
/// redrive` puts them back into the input topic exactly once, though the first redrive
/// is killed part way: the second goes on in the same share group.
#[test]
fn dlq_redrive_is_exactly_once_after_a_kill_mid_redrive() {
    use shareflow::connector::dead_letters::{HEADER_CAUSE, HEADER_OFFSET};
    const N: u64 = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let broker_dir = dir.join("broker");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let broker = EmbeddedBroker::open(BrokerOptions::local_dir(&broker_dir).unwrap()).await.unwrap();
        broker.create_topic("numbers", 2).await.unwrap();
        broker.create_topic("numbers-dlq", 2).await.unwrap();
        let letters = (0..N).map(|i| shareflow::connector::share::ProducerRecord {
            partition: Some((i % 2) as i32),
            headers: vec![
                (HEADER_CAUSE.to_string(), bytes::Bytes::from_static(b"sql")),
                (HEADER_OFFSET.to_string(), bytes::Bytes::from(i.to_string())),
            ],
            ..shareflow::connector::share::ProducerRecord::new("numbers-dlq", 0, format!("fixed-{i}").into_bytes())
        });
        broker.produce(letters.collect()).await.unwrap();
        broker.close();
    });
    let dlq = |extra: &[&str]| {
        let mut cmd = shareflow();
        cmd.arg("dlq").args(extra).args(["--topic", "numbers-dlq", "--dir"]).arg(&broker_dir);
        cmd
    };
    let listed = dlq(&["list", "--json"]).output().unwrap();
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(listed.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len() as u64, N);
    assert!(lines.iter().all(|l| l["headers"][HEADER_CAUSE] == "sql"), "{:?}", lines[0]);
    let redrive = || {
        dlq(&["redrive", "--to", "numbers", "--max-rate", "2000", "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let read = || -> Vec<String> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let broker = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(&broker_dir).unwrap()).await.unwrap();
            let mut values = Vec::new();
            for p in 0..2 {
                let tp = TopicPartition::new("numbers", p);
                for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.unwrap() {
                    values.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
                }
            }
            values.sort();
            values
        })
    };
    let mut first = redrive();
    assert!(wait(&mut first, Duration::from_millis(700)).is_none(), "the first redrive ended before its kill");
    first.kill().unwrap();
    first.wait().unwrap();
    let partial = read().len() as u64;
    assert!(partial < N, "the kill landed after the redrive was done");
    let second = redrive().wait_with_output().unwrap();
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    let mut want: Vec<String> = (0..N).map(|i| format!("fixed-{i}")).collect();
    want.sort();
    assert_eq!(read(), want, "every dead letter back once ({partial} before the kill)");
    // Nothing left: a third redrive puts nothing back.
    let third = redrive().wait_with_output().unwrap();
    assert!(third.status.success(), "{}", String::from_utf8_lossy(&third.stderr));
    assert_eq!(read().len() as u64, N);
}
