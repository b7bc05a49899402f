//! Savepoints from the command line, on an embedded broker: the windowed example job is
//! stopped with `shareflow stop --savepoint`, the savepoint is copied to another
//! directory, and the job, changed to parallelism 3 and a checkpoint root of its own,
//! starts from the copy with `run --from-savepoint`. Every window comes out once, with
//! the batch answer's count.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

#[path = "support/processes.rs"]
mod processes;
use processes::{shareflow, wait};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const RECORDS: u64 = 20_000;
const USERS: u64 = 50;
const BASE: u64 = 1_700_000_000_000;

/// The windows example on `dir`, checkpoints under `checkpoints`, at `parallelism`.
fn job_file(dir: &Path, name: &str, checkpoints: &str, parallelism: u32) -> std::path::PathBuf {
    let text = std::fs::read_to_string(checkout_file("examples/jobs/windows_embedded.toml"))
        .unwrap()
        .replace("/tmp/shareflow-windows/broker", &dir.join("broker").display().to_string())
        .replace("file:///tmp/shareflow-windows/checkpoints", &format!("file://{}", dir.join(checkpoints).display()))
        .replace("checkpoint_interval_ms = 500", "checkpoint_interval_ms = 50")
        .replace("parallelism = 2", &format!("parallelism = {parallelism}"))
        // 10 s of input: the first run is stopped mid-way, however slowly its first
        // window and the `stop` process come on a loaded machine.
        .replace("mode = \"exactly-once\"", "mode = \"exactly-once\"\nmax_rate = 2000");
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn start(job: &Path, extra: &[&str], err: &Path) -> Child {
    shareflow()
        .arg("run")
        .arg(job)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .unwrap()
}

/// The committed windows of the broker under `dir`.
fn windows(dir: &Path) -> Vec<(String, String, u64)> {
    processes::committed_windows(&dir.join("broker"))
}

/// The clicks of the test into a new embedded broker under `dir`: `RECORDS` of `USERS`
/// users, 10 ms of event time apart, over 2 partitions.
fn produce_clicks(dir: &Path) {
    let clicks = (0..RECORDS).map(|i| format!("user-{},{}", i % USERS, BASE + i * 10));
    processes::produce_lines(&dir.join("broker"), "clicks", 2, clicks);
}

/// Copies the directory `from` to `to`, files and subdirectories.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn stop_with_a_savepoint_then_start_from_a_copy_at_another_parallelism() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    produce_clicks(dir);
    let last = BASE + (RECORDS - 1) * 10;
    let mut want = BTreeMap::<(String, String), u64>::new();
    for i in 0..RECORDS {
        let t = BASE + i * 10;
        let start = t - t % 10_000;
        if start + 10_000 <= last - 2_000 {
            *want.entry((format!("user-{}", i % USERS), start.to_string())).or_default() += 1;
        }
    }

    // The first run, at parallelism 1, until some windows are out.
    let first = job_file(dir, "first.toml", "checkpoints-1", 1);
    let mut child = start(&first, &[], &dir.join("first.err"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while windows(dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no window in 60 s: {}",
            std::fs::read_to_string(dir.join("first.err")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = shareflow().args(["stop"]).arg(&first).args(["--savepoint", "sp", "--json"]).output().unwrap();
    assert!(out.status.success(), "stop: {}", String::from_utf8_lossy(&out.stderr));
    let taken: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((taken["name"].as_str(), taken["stopped"].as_bool()), (Some("sp"), Some(true)), "{taken}");
    let status = wait(&mut child, Duration::from_secs(30)).expect("the job stops");
    assert!(status.success(), "{}", std::fs::read_to_string(dir.join("first.err")).unwrap());
    let partial = windows(dir).len();
    assert!(partial < want.len(), "stopped mid-way: {partial} of {} windows", want.len());

    // The savepoint, copied elsewhere; the job, changed, starts from the copy.
    let url = taken["url"].as_str().unwrap();
    let copy = dir.join("elsewhere").join("sp");
    copy_dir(Path::new(url.strip_prefix("file://").unwrap()), &copy);
    let second = job_file(dir, "second.toml", "checkpoints-2", 3);
    let from = format!("file://{}", copy.display());
    let mut child = start(&second, &["--from-savepoint", &from], &dir.join("second.err"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while windows(dir).len() < want.len() {
        let err = std::fs::read_to_string(dir.join("second.err")).unwrap();
        assert!(Instant::now() < deadline, "the windows did not all close in 120 s: {err}");
        assert!(child.try_wait().unwrap().is_none(), "the second run ended: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = shareflow().args(["stop"]).arg(&second).output().unwrap();
    assert!(out.status.success(), "stop: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait(&mut child, Duration::from_secs(30)).expect("the job stops").success());
    let mut got = BTreeMap::<(String, String), u64>::new();
    for (key, start, count) in windows(dir) {
        assert!(got.insert((key.clone(), start.clone()), count).is_none(), "window {key} {start} emitted twice");
    }
    assert_eq!(got, want);
    // `checkpoints` lists the savepoint beside the retained checkpoints.
    let root = format!("file://{}", dir.join("checkpoints-1").display());
    let out = shareflow().args(["checkpoints", "--checkpoints", &root, "--job", "clicks"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(listing.contains(&format!("savepoint sp: {url}")), "{listing}");
    // Nothing runs now: savepoint and stop say so.
    let out = shareflow().args(["savepoint"]).arg(&second).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no job runs on"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGUSR1 takes a savepoint of a running job, which says where it is and goes on; the
/// savepoint is listed beside the checkpoints.
#[cfg(unix)]
#[test]
fn sigusr1_takes_a_savepoint_and_the_job_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    produce_clicks(dir);
    let job = job_file(dir, "job.toml", "checkpoints", 1);
    let err = dir.join("job.err");
    let mut child = start(&job, &[], &err);
    let stderr = || std::fs::read_to_string(&err).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stderr().contains("progress") {
        assert!(Instant::now() < deadline, "no progress in 60 s: {}", stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let kill = std::process::Command::new("kill").args(["-USR1", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let taken = loop {
        if let Some(line) = stderr().lines().find(|l| l.starts_with("savepoint savepoint-")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no savepoint in 60 s: {}", stderr());
        assert!(child.try_wait().unwrap().is_none(), "the job ended: {}", stderr());
        std::thread::sleep(Duration::from_millis(50));
    };
    let url = taken.rsplit_once(" taken: ").expect("where it is").1;
    let root = format!("file://{}", dir.join("checkpoints").display());
    assert!(url.starts_with(&format!("{root}/clicks/savepoints/savepoint-")), "{taken}");
    let out = shareflow().args(["checkpoints", "--checkpoints", &root, "--job", "clicks"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains(url), "{listing}");
    assert!(child.try_wait().unwrap().is_none(), "the job goes on: {}", stderr());
    let out = shareflow().args(["stop"]).arg(&job).output().unwrap();
    assert!(out.status.success(), "stop: {}", String::from_utf8_lossy(&out.stderr));
    assert!(wait(&mut child, Duration::from_secs(30)).expect("the job stops").success(), "{}", stderr());
}
