//! A process-level kill campaign on the embedded broker. For every seed the built
//! `shareflow` binary runs `demo` in a temporary directory and is killed with SIGKILL at
//! seeded random moments, many times: during start-up, while it produces its input,
//! while the broker replays its journal, during recovery after the previous kill, and
//! while the job runs and checkpoints. After each kill it restarts with `--resume`; a
//! last `--resume` runs to the end. Then, with every process dead, the test opens the
//! broker directory itself and checks that the output read_committed is the input
//! exactly once: every id once, each value the transform of its input, every input
//! record ACKNOWLEDGED, no transaction left pending.
//!
//! In-process failpoints fire only where someone put one; a SIGKILL lands anywhere, for
//! example between creating a journal file and writing it.
//!
//! `SHAREFLOW_KILL_SEEDS=k` runs seeds 1..=k (default 30); `SHAREFLOW_KILL_SEED=n` runs
//! seed n only. A seed fixes the run's settings and kill delays; where a delay lands in
//! the child's work still varies from run to run, so a replay can take a few tries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shareflow::connector::broker::fault::GC_AFTER_FIRST_DELETE;
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{IsolationLevel, RecordState, TopicPartition};

/// Seeds per run unless `SHAREFLOW_KILL_SEEDS` says otherwise.
const DEFAULT_SEEDS: u64 = 30;
/// Kills per seed: at least this many...
const MIN_KILLS: u64 = 5;
/// ...and at most this many. Each killed attempt may deliver a record without
/// committing it, and the final run delivers it once more: stay under the limit, or
/// records would be archived at it (docs/design.md §3, "Where exactly-once ends").
const MAX_KILLS: u64 = DELIVERY_LIMIT as u64 - 2;
/// A quarter of the kills land this soon after the start: process start-up, the broker
/// replaying its journal and opening a new segment (100-150 ms into a debug-build run),
/// recovery.
const EARLY: Duration = Duration::from_millis(250);
/// The other kills land up to this long after the start (a debug-build run of these
/// sizes takes 0.3-1 s, so some runs finish before their kill).
const SPAN: Duration = Duration::from_millis(800);
/// Runs per kill at most: runs that finish before their kill do not count as kills.
const RUNS_PER_KILL: u64 = 3;
/// The longest a run may take before the test gives up on it.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[path = "support/rng.rs"]
mod rng;

#[path = "support/demo.rs"]
mod demo;

use demo::{wait_for, DELIVERY_LIMIT, GROUP, INPUT, INPUT_MARKER, OUTPUT, VALUE_LEN};
use rng::Rng;

/// The settings of one seed.
#[derive(Debug)]
struct Settings {
    records: u64,
    partitions: u32,
    parallelism: u32,
    interval_ms: u64,
    kills: u64,
}

/// What one seed did.
#[derive(Debug, Default)]
struct SeedReport {
    /// Runs killed by SIGKILL.
    kills: u64,
    /// Of them, kills within [`EARLY`] of the start.
    early_kills: u64,
    /// Runs that finished before their kill was due.
    finished_early: u64,
    /// Fresh starts (the first run, and any restart before its input marker existed).
    fresh_starts: u64,
    /// Broker opens that cut back a torn or empty journal tail (the children's warnings).
    cut_backs: u64,
    /// Of them, empty last segments.
    empty_segments: u64,
    /// Seconds the final run took.
    final_seconds: f64,
}

fn settings(seed: u64) -> Settings {
    let mut rng = Rng::new(seed);
    Settings {
        records: 10_000 + rng.below(20_001),
        partitions: 1 + rng.below(4) as u32,
        parallelism: 1 + rng.below(2) as u32,
        interval_ms: 5 + rng.below(46),
        kills: MIN_KILLS + rng.below(MAX_KILLS - MIN_KILLS + 1),
    }
}

/// A copy of the `shareflow` binary this test was built with. Every run uses the copy: a
/// build running meanwhile (the target directory may be shared) can replace the original
/// with one whose journal format differs from this test's.
fn binary_copy(dir: &Path) -> PathBuf {
    let copy = dir.join("shareflow");
    std::fs::copy(env!("CARGO_BIN_EXE_shareflow"), &copy).expect("copy the shareflow binary");
    copy
}

/// A `shareflow demo` child: a fresh run when `dir` holds no run yet, else `--resume`.
/// Its output goes to `log` (stdout to `log.out`, stderr to `log.err`).
fn start(bin: &Path, dir: &Path, s: &Settings, log: &Path) -> (Child, bool) {
    start_with(bin, dir, s, log, &[])
}

/// [`start`] with environment variables of the test's own.
fn start_with(bin: &Path, dir: &Path, s: &Settings, log: &Path, env: &[(&str, &str)]) -> (Child, bool) {
    let fresh = !dir.join(INPUT_MARKER).exists();
    let mut cmd = Command::new(bin);
    cmd.arg("demo").arg("--dir").arg(dir);
    cmd.args(["--interval", &s.interval_ms.to_string(), "--parallelism", &s.parallelism.to_string()]);
    cmd.args(["--crashes", "0", "--json"]);
    if fresh {
        cmd.args(["--records", &s.records.to_string(), "--partitions", &s.partitions.to_string()]);
    } else {
        cmd.arg("--resume");
    }
    cmd.envs(env.iter().copied());
    cmd.env("SHAREFLOW_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(File::create(log.with_extension("out")).expect("stdout file"))
        .stderr(File::create(log.with_extension("err")).expect("stderr file"));
    // The other test of this binary may fork while the copy of the binary is still open
    // for writing in the child it starts (Linux then refuses to run the copy until that
    // child execs): try again, a bounded number of times.
    for _ in 0..100 {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(20))
            }
            spawned => return (spawned.expect("start shareflow demo"), fresh),
        }
    }
    panic!("start shareflow demo: {} stayed busy for 2 s", bin.display())
}

/// The last lines of a child's stderr and stdout, for a failure message.
fn output_of(log: &Path) -> String {
    let tail = |ext: &str| {
        let text = std::fs::read_to_string(log.with_extension(ext)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    format!("stderr:\n{}\nstdout:\n{}", tail("err"), tail("out"))
}

/// Every file under the broker directory with its size: what a kill left on disk.
fn broker_files(dir: &Path) -> String {
    fn walk(path: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(path) else { return };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                let size = e.metadata().map_or(0, |m| m.len());
                out.push(format!("{} ({size} B)", p.strip_prefix(root).unwrap_or(&p).display()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir.join("broker"), dir, &mut out);
    out.join(", ")
}

/// Counts the broker's warnings in a child's stderr: (cut-backs, empty segments).
fn count_cut_backs(log: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    let count = |what: &str| text.lines().filter(|l| l.contains(what)).count() as u64;
    (count("recovered after cutting back"), count("empty last journal segment"))
}

impl SeedReport {
    fn add_warnings(&mut self, log: &Path) {
        let (cut_backs, empty) = count_cut_backs(log);
        self.cut_backs += cut_backs;
        self.empty_segments += empty;
    }
}

/// Runs one seed with the binary `bin`: the kills, the final run, and the independent check.
fn run_seed(bin: &Path, seed: u64, root: &Path) -> Result<SeedReport, String> {
    let s = settings(seed);
    let dir = root.join("demo");
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut report = SeedReport::default();
    // Kill delays are drawn up to `span`; once a run finishes before its kill, up to that
    // run's lifetime, so that the later kills land while a run is still alive.
    let mut span = SPAN;
    // What each run did, for a failure message.
    let mut history = Vec::new();
    let failed = |what: String, history: &[String], log: &Path| {
        format!(
            "{s:?}: {what}\n{}\nruns before: {}\nbroker files: {}",
            output_of(log),
            history.join("; "),
            broker_files(&dir)
        )
    };
    for run in 0..s.kills * RUNS_PER_KILL {
        if report.kills == s.kills {
            break;
        }
        let log = root.join(format!("run-{run}"));
        let early = rng.below(4) == 0;
        let delay = if early { EARLY } else { span }.mul_f64(rng.below(1_001) as f64 / 1_000.0);
        let started = Instant::now();
        let (mut child, fresh) = start(bin, &dir, &s, &log);
        report.fresh_starts += u64::from(fresh);
        let status = match wait_for(&mut child, delay) {
            Some(status) => status,
            None => {
                child.kill().expect("SIGKILL the demo"); // Child::kill is SIGKILL on Unix.
                child.wait().expect("reap the demo")
            }
        };
        report.add_warnings(&log);
        let how = if fresh { "fresh" } else { "--resume" };
        if status.signal() == Some(9) {
            report.kills += 1;
            report.early_kills += u64::from(early);
            history.push(format!("{run} {how}: SIGKILL after {delay:.0?}"));
        } else if status.success() {
            report.finished_early += 1;
            span = started.elapsed().min(SPAN);
            history.push(format!("{run} {how}: finished after {:.0?}", started.elapsed()));
        } else {
            let what = format!("run {run} ({how}) exited with {status} before its kill {delay:.0?} after the start");
            return Err(failed(what, &history, &log));
        }
    }
    let log = root.join("final");
    let started = Instant::now();
    let (mut child, fresh) = start(bin, &dir, &s, &log);
    report.fresh_starts += u64::from(fresh);
    let Some(status) = wait_for(&mut child, RUN_TIMEOUT) else {
        child.kill().expect("SIGKILL the demo");
        let _ = child.wait();
        return Err(failed(format!("the final run did not finish in {RUN_TIMEOUT:?}"), &history, &log));
    };
    report.final_seconds = started.elapsed().as_secs_f64();
    report.add_warnings(&log);
    if !status.success() {
        return Err(failed(format!("the final run failed with {status}"), &history, &log));
    }
    let stdout = std::fs::read_to_string(log.with_extension("out")).unwrap_or_default();
    if !stdout.trim_end().ends_with('}') || !stdout.contains("\"violations\":0") {
        return Err(failed("the final run's own check failed".into(), &history, &log));
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(check_output(&dir, &s)).map_err(|e| format!("{s:?}: {e}"))?;
    Ok(report)
}

/// Opens the broker directory the (dead) runs left and checks, without the job's own
/// checker, that the output read_committed is the input exactly once.
async fn check_output(dir: &Path, s: &Settings) -> Result<(), String> {
    let options = BrokerOptions::local_dir(dir.join("broker")).map_err(|e| format!("broker directory: {e}"))?;
    let broker =
        EmbeddedBroker::open(options).await.map_err(|e| format!("cannot open the broker the runs left: {e}"))?;
    let mut problems = Vec::new();
    // The input: ids 0..records, each once, id i in partition i % partitions.
    let mut input = BTreeMap::<u64, u32>::new();
    for p in 0..s.partitions as i32 {
        let tp = TopicPartition::new(INPUT, p);
        for r in broker.fetch_all(&tp, IsolationLevel::ReadUncommitted).await.map_err(|e| format!("read {tp}: {e}"))? {
            let Some(id) = r.value.as_deref().and_then(demo::identity) else {
                problems.push(format!("input {tp}@{} has no id", r.offset));
                continue;
            };
            *input.entry(id).or_default() += 1;
            if id % u64::from(s.partitions) != p as u64 {
                problems.push(format!("input id {id} is in partition {p}"));
            }
            let status =
                broker.record_status(GROUP, &tp, r.offset).await.map_err(|e| format!("status of {tp}: {e}"))?;
            if status.state != RecordState::Acknowledged {
                problems.push(format!("input {tp}@{} (id {id}) is {}, not ACKNOWLEDGED", r.offset, status.state));
            }
        }
    }
    // The output, read_committed: each id once, its value the transform of the input's.
    let mut output = BTreeMap::<u64, u32>::new();
    for p in 0..broker.partition_count(OUTPUT).map_err(|e| format!("{OUTPUT}: {e}"))? as i32 {
        let tp = TopicPartition::new(OUTPUT, p);
        for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.map_err(|e| format!("read {tp}: {e}"))? {
            let Some(id) = r.value.as_deref().and_then(demo::identity) else {
                problems.push(format!("output {tp}@{} has no id", r.offset));
                continue;
            };
            *output.entry(id).or_default() += 1;
            let expected = demo::value_of(id, VALUE_LEN).to_ascii_uppercase();
            if r.value.as_deref() != Some(expected.as_slice()) || r.key.is_some() {
                problems.push(format!("output {tp}@{} (id {id}) is not the transform of input {id}", r.offset));
            }
        }
    }
    for (what, seen) in [("input", &input), ("output", &output)] {
        let missing = (0..s.records).filter(|id| !seen.contains_key(id)).count();
        let duplicates: u32 = seen.values().map(|n| n - 1).sum();
        let foreign = seen.keys().filter(|id| **id >= s.records).count();
        if (missing, duplicates, foreign) != (0, 0, 0) {
            problems.push(format!(
                "{what}: {missing} of {} ids missing, {duplicates} duplicates, {foreign} unknown ids",
                s.records
            ));
        }
    }
    for t in broker.transactions().await.map_err(|e| format!("transactions: {e}"))? {
        if t.state.is_pending() {
            problems.push(format!("transaction {} is still {}", t.id, t.state));
        }
    }
    broker.close();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{} problems, first: {:?}", problems.len(), &problems[..problems.len().min(8)]))
    }
}

#[test]
fn sigkill_campaign_output_equals_input_exactly_once() {
    let seeds: Vec<u64> = match std::env::var("SHAREFLOW_KILL_SEED") {
        Ok(s) => vec![s.parse().expect("SHAREFLOW_KILL_SEED is a number")],
        Err(_) => {
            let n = std::env::var("SHAREFLOW_KILL_SEEDS")
                .map_or(DEFAULT_SEEDS, |s| s.parse().expect("SHAREFLOW_KILL_SEEDS is a number"));
            (1..=n).collect()
        }
    };
    let started = Instant::now();
    let bin_dir = tempfile::tempdir().expect("temporary directory");
    let bin = binary_copy(bin_dir.path());
    let mut failures = Vec::new();
    let (mut total_kills, mut cut_backs, mut empty_segments) = (0, 0, 0);
    for &seed in &seeds {
        let root = tempfile::tempdir().expect("temporary directory");
        let seed_started = Instant::now();
        match run_seed(&bin, seed, root.path()) {
            Ok(r) => {
                total_kills += r.kills;
                cut_backs += r.cut_backs;
                empty_segments += r.empty_segments;
                eprintln!(
                    "seed {seed}: {:?}: {} kills ({} early), {} runs finished before their kill, {} fresh starts, \
                     {} journal tails cut back ({} empty segments); final run {:.2} s; seed {:.1} s",
                    settings(seed),
                    r.kills,
                    r.early_kills,
                    r.finished_early,
                    r.fresh_starts,
                    r.cut_backs,
                    r.empty_segments,
                    r.final_seconds,
                    seed_started.elapsed().as_secs_f64()
                );
            }
            Err(why) => {
                let kept: PathBuf = root.keep();
                eprintln!(
                    "seed {seed} FAILED: {why}\n  the runs' directory is kept in {}\n  replay: \
                     SHAREFLOW_KILL_SEED={seed} cargo test --test demo_sigkill_campaign -- --nocapture",
                    kept.display()
                );
                failures.push(seed);
            }
        }
    }
    eprintln!(
        "sigkill campaign: {} seeds, {total_kills} kills, {cut_backs} journal tails cut back ({empty_segments} empty \
         segments), {} failed, {:.1} s",
        seeds.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?} (replay commands above)");
    assert!(
        total_kills >= seeds.len() as u64 * MIN_KILLS,
        "only {total_kills} kills landed in {} seeds: too many runs finished before their kill",
        seeds.len()
    );
}

/// The log store's multi-step operations, crashed at each of their fault points inside
/// a real `demo` process (`SHAREFLOW_CRASH_AT` aborts it there; snapshots every 64 KiB
/// of journal make the run reach them): the next run resumes, and the output is the
/// input exactly once.
#[test]
fn a_crash_in_segment_roll_snapshot_or_gc_keeps_the_output_exactly_once() {
    let bin_dir = tempfile::tempdir().expect("temporary directory");
    let bin = binary_copy(bin_dir.path());
    let mut failures = Vec::new();
    for &point in shareflow::connector::broker::fault::ALL {
        // Whether a run reaches a point depends on its timing (GC deletes a segment only
        // once no batch points into it): a run that ends without reaching it is tried
        // again, longer, up to 3 times.
        let mut outcome = Err(format!("{point}: no run reached it"));
        for attempt in 0..3u32 {
            let records = 20_000 * 3u64.pow(attempt);
            let s = Settings { records, partitions: 2, parallelism: 2, interval_ms: 10, kills: 1 };
            let root = tempfile::tempdir().expect("temporary directory");
            let dir = root.path().join("demo");
            let env = [("SHAREFLOW_CRASH_AT", point), ("SHAREFLOW_BROKER_SNAPSHOT_BYTES", "65536")];
            let log = root.path().join("crash");
            let (mut child, _) = start_with(&bin, &dir, &s, &log, &env);
            let Some(status) = wait_for(&mut child, RUN_TIMEOUT) else {
                child.kill().expect("SIGKILL the demo");
                let _ = child.wait();
                outcome = Err(format!("{point}: the run did not end in {RUN_TIMEOUT:?}"));
                break;
            };
            if status.success() {
                continue; // it never reached the point
            }
            // SIGABRT: the process died at the point.
            if status.signal() != Some(6) {
                outcome = Err(format!("{point}: the run ended with {status}, not at the point\n{}", output_of(&log)));
                break;
            }
            let log = root.path().join("final");
            let (mut child, _) = start(&bin, &dir, &s, &log);
            let status = wait_for(&mut child, RUN_TIMEOUT).unwrap_or_else(|| {
                child.kill().expect("SIGKILL the demo");
                child.wait().expect("reap the demo")
            });
            if !status.success() {
                outcome = Err(format!("{point}: the run after the crash failed with {status}\n{}", output_of(&log)));
                break;
            }
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            outcome = runtime.block_on(check_output(&dir, &s)).map_err(|e| format!("{point}: {e}"));
            break;
        }
        match outcome {
            // The demo keeps every record, so a segment goes only when no output batch
            // landed in it, which few runs see; `tests/broker_log_store.rs` crashes at
            // this point in process, where retention frees segments for sure.
            Err(e) if point == GC_AFTER_FIRST_DELETE && e.ends_with("no run reached it") => {
                eprintln!("{point}: not reached in 3 demo runs (covered in process by broker_log_store)");
            }
            Err(e) => failures.push(e),
            Ok(()) => eprintln!("{point}: crashed there, resumed, output exactly once"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fault points failed:\n{}",
        failures.len(),
        shareflow::connector::broker::fault::ALL.len(),
        failures.join("\n")
    );
}
