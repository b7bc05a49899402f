//! What the tests of the `shareflow demo` binary need: the record format and names the
//! demo uses, its fault points, and a way to run the binary and read its `--json`
//! summary.
//!
//! The demos are part of the binary, not of the library, so these are test copies. Each
//! is checked against what the binary does where a test uses it: the tests read the
//! topics the binary wrote, check its output values record by record, read the input
//! marker it left, and compare the fault points that fired with these lists.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use shareflow::runtime::failpoint::points as runtime_points;

/// The demo's share group (and job id).
pub const GROUP: &str = "demo";
/// The demo's input topic.
pub const INPUT: &str = "demo-input";
/// The demo's output topic.
pub const OUTPUT: &str = "demo-output";
/// Bytes of every input value the demo produces.
pub const VALUE_LEN: usize = 100;
/// `group.share.delivery.count.limit` of the demo's group.
pub const DELIVERY_LIMIT: u16 = 10;
/// The file in the demo directory that names the input of the run started there.
pub const INPUT_MARKER: &str = "demo-input.json";

/// The fault points `shareflow demo --crashes K` draws from: every point but the
/// recovery points (`recovery.mid` is reached only after an earlier crash left decided
/// work; `recovery.after` is covered by the failure-recovery tests).
pub fn fault_points() -> Vec<&'static str> {
    shareflow::connector::points::ALL
        .iter()
        .chain(runtime_points::ALL)
        .copied()
        .filter(|p| *p != runtime_points::RECOVERY_MID && *p != runtime_points::AFTER_RECOVERY)
        .collect()
}

/// The fault points `shareflow demo --kafka --crashes K` draws from: those of
/// [`fault_points`] but `commit.mid`, which the Kafka demo's list leaves out.
pub fn kafka_fault_points() -> Vec<&'static str> {
    fault_points().into_iter().filter(|p| *p != runtime_points::COMMIT_MID).collect()
}

/// The identity of a record, carried from the input value to the output value.
pub fn identity(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value.get(4..14)?).ok()?;
    if !value[..4].eq_ignore_ascii_case(b"rec-") {
        return None;
    }
    text.parse().ok()
}

/// The value of input record `id`: `rec-{id:010}-` padded with `x` to `len` bytes (at
/// least 16), which [`identity`] reads back.
pub fn value_of(id: u64, len: usize) -> Vec<u8> {
    let mut v = format!("rec-{id:010}-").into_bytes();
    v.resize(len.max(16), b'x');
    v
}

/// The input topic of a `demo --kafka --name NAME` run.
pub fn input_topic(name: &str) -> String {
    format!("{name}-input")
}

/// The output topic of a `demo --kafka --name NAME` run.
pub fn output_topic(name: &str) -> String {
    format!("{name}-output")
}

/// Waits until `child` exits or `within` passes; `None` if it still runs.
pub fn wait_for(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return Some(status);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(2)));
    }
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Outcome {
    /// Its exit code (-1: killed by a signal).
    pub code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Outcome {
    /// The `--json` summary: the last line of stdout as JSON, or `None`.
    pub fn summary(&self) -> Option<serde_json::Value> {
        serde_json::from_str(self.stdout.lines().last()?).ok()
    }

    /// The summary, or a panic showing what the run printed.
    pub fn json(&self) -> serde_json::Value {
        self.summary().unwrap_or_else(|| panic!("no JSON summary: {self:?}"))
    }
}

/// A number of a summary, or a panic naming the field.
pub fn number(summary: &serde_json::Value, field: &str) -> u64 {
    summary[field].as_u64().unwrap_or_else(|| panic!("no number {field:?} in {summary}"))
}

/// Runs `shareflow ARGS` to its end, at most `timeout` (then it is killed by pid and the
/// test fails).
pub fn shareflow(args: &[&str], timeout: Duration) -> Outcome {
    shareflow_with_env(args, &[], timeout)
}

/// [`shareflow`] with these environment variables set for the process.
pub fn shareflow_with_env(args: &[&str], env: &[(&str, String)], timeout: Duration) -> Outcome {
    let logs = tempfile::tempdir().expect("temporary directory");
    let (out, err) = (logs.path().join("out"), logs.path().join("err"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("start shareflow");
    let status = wait_for(&mut child, timeout);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let Some(status) = status else {
        child.kill().expect("kill shareflow"); // SIGKILL to this child's pid
        let _ = child.wait();
        panic!("shareflow {args:?} did not finish in {timeout:?}; stderr:\n{}", read(&err));
    };
    Outcome { code: status.code().unwrap_or(-1), stdout: read(&out), stderr: read(&err) }
}
