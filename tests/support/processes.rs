//! The `shareflow` binary driven as a user drives it, for the tests of job files on an
//! embedded broker: the command, waiting for a process (bounded), loading input with
//! `produce`, and the windowed example's committed output.
#![allow(dead_code, unreachable_pub)]

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{IsolationLevel, TopicPartition};

/// `shareflow`, logging warnings, progress as plain lines.
pub fn shareflow() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shareflow"));
    cmd.env("SHAREFLOW_LOG", "warn").env("SHAREFLOW_PROGRESS", "plain");
    cmd
}

/// Waits up to `limit` for `child` to exit.
pub fn wait(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `shareflow produce` of `lines` into `topic` (made with `partitions`) of the broker
/// in `broker`: its stdout, or a panic with its stderr.
pub fn produce_lines(broker: &Path, topic: &str, partitions: i32, lines: impl Iterator<Item = String>) -> String {
    let mut produce = shareflow()
        .args(["produce", "--dir"])
        .arg(broker)
        .args(["--topic", topic, "--partitions", &partitions.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = produce.stdin.take().unwrap();
        for line in lines {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let out = produce.wait_with_output().unwrap();
    assert!(out.status.success(), "produce: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The windowed example's committed output in the broker under `broker`, read beside a
/// live job: (user, window start, count).
pub fn committed_windows(broker: &Path) -> Vec<(String, String, u64)> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let Ok(broker) = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(broker).unwrap()).await else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for p in 0..broker.partition_count("clicks-per-window").unwrap_or(0) as i32 {
            let tp = TopicPartition::new("clicks-per-window", p);
            for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await.unwrap_or_default() {
                let key = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
                let value = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                let (start, count) = value.split_once(',').unwrap();
                rows.push((key, start.to_string(), count.parse().unwrap()));
            }
        }
        rows
    })
}
