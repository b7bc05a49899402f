//! A running embedded job fed from other processes: `shareflow produce --dir` appends
//! through the job's process while crashes are injected into the job, and `shareflow
//! consume --dir` reads the output beside it. Every record produced comes out once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

#[path = "support/processes.rs"]
mod processes;
use processes::{shareflow, wait};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BATCHES: u64 = 4;
const PER_BATCH: u64 = 5_000;

/// The uppercase example on `dir`, checkpointing every 50 ms, restarting up to 5 times,
/// at most 5,000 records a second.
fn job_file(dir: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(checkout_file("examples/jobs/uppercase_embedded.toml"))
        .unwrap()
        .replace("/tmp/shareflow-jobs/broker", &dir.join("broker").display().to_string())
        .replace("file:///tmp/shareflow-jobs/checkpoints", &format!("file://{}", dir.join("checkpoints").display()))
        .replace("checkpoint_interval_ms = 500", "checkpoint_interval_ms = 50\nrestarts = 5")
        // Slow enough that the crashes land while records move.
        .replace("mode = \"exactly-once\"", "mode = \"exactly-once\"\nmax_rate = 5000");
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `shareflow produce` of `lines` into `topic`: its stdout.
fn produce(dir: &Path, topic: &str, lines: impl Iterator<Item = String>) -> String {
    processes::produce_lines(&dir.join("broker"), topic, 2, lines)
}

/// `shareflow consume` with `args`: (exit code, stdout, stderr).
fn consume(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = shareflow().args(["consume", "--dir"]).arg(dir.join("broker")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn a_running_job_takes_input_from_other_processes_exactly_once_through_crashes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let job = job_file(dir);
    let err = dir.join("run.err");
    let mut child = shareflow()
        .arg("run")
        .arg(&job)
        .args(["--json", "--crash-at", "sink.after_write:30", "--crash-at", "commit.mid:6"])
        .args(["--crash-at", "checkpoint.after_manifest:10"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let endpoint = dir.join("broker").join("endpoint");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !endpoint.exists() {
        assert!(child.try_wait().unwrap().is_none(), "the job ended: {}", std::fs::read_to_string(&err).unwrap());
        assert!(Instant::now() < deadline, "no endpoint file after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Batches from separate processes while the job runs (and crashes, and restarts).
    for b in 0..BATCHES {
        let out = produce(dir, "in", (b * PER_BATCH..(b + 1) * PER_BATCH).map(|i| format!("record-{i:06}")));
        assert!(out.starts_with(&format!("produced {PER_BATCH} records to in")), "{out}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The output, read beside the running job.
    let total = (BATCHES * PER_BATCH) as usize;
    let deadline = Instant::now() + Duration::from_secs(120);
    let output = loop {
        let (code, out, stderr) = consume(dir, &["--topic", "out", "--format", "raw"]);
        assert_eq!(code, 0, "{stderr}");
        if out.lines().count() >= total {
            break out;
        }
        assert!(child.try_wait().unwrap().is_none(), "the job ended: {}", std::fs::read_to_string(&err).unwrap());
        assert!(Instant::now() < deadline, "{} of {total} records out after 120 s", out.lines().count());
        std::thread::sleep(Duration::from_millis(200));
    };
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = wait(&mut child, Duration::from_secs(60)).expect("the job stops on SIGTERM");
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(status.success(), "{stderr}");
    let mut summary = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut summary).unwrap();
    let summary: serde_json::Value = serde_json::from_str(summary.lines().last().unwrap()).unwrap();
    assert_eq!(summary["attempts"].as_u64().unwrap(), 4, "the crashes fired: {summary} {stderr}");
    assert!(!endpoint.exists(), "the endpoint file goes with the job");

    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for line in output.lines() {
        *seen.entry(line).or_default() += 1;
    }
    let repeated: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).take(5).collect();
    assert!(repeated.is_empty(), "repeated: {repeated:?}");
    assert_eq!(seen.len(), total);
    for i in 0..BATCHES * PER_BATCH {
        assert!(seen.contains_key(format!("RECORD-{i:06}").as_str()), "RECORD-{i:06} is missing");
    }

    // Without a job, produce opens the directory itself; consume reads JSON lines, a
    // count, from the end.
    let out = produce(dir, "extra", ["a", "b", "c"].into_iter().map(String::from));
    assert!(out.starts_with("produced 3 records to extra"), "{out}");
    let (code, out, stderr) = consume(dir, &["--topic", "extra", "--count", "2"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l["partition"].is_i64() && l["offset"].is_i64() && l["value"].is_string()), "{out}");
    let (code, out, _) = consume(dir, &["--topic", "extra", "--from", "end"]);
    assert_eq!((code, out.as_str()), (0, ""));
}

#[test]
fn consume_names_what_it_cannot_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (code, _, stderr) = consume(dir, &["--topic", "in"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("is not a directory") && stderr.contains("--dir"), "{stderr}");
    produce(dir, "in", ["x"].into_iter().map(String::from));
    let (code, _, stderr) = consume(dir, &["--topic", "nope"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("topic \"nope\" is not in"), "{stderr}");
    let (code, _, stderr) = consume(dir, &["--topic", "in", "--format", "xml"]);
    assert_eq!(code, 2, "{stderr}");
}
