//! The web dashboard of a running demo, opened in a real browser (headless Chromium from
//! `scripts/chromium`): the job graph, a completed checkpoint and the share-partition
//! states appear, and a screenshot is saved. The JSON endpoints under `/api/` are
//! checked as a script reads them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/browser.rs"]
mod browser;
#[path = "support/processes.rs"]
mod processes;
use browser::progress;

/// The demo's input: enough that the checks run while it does (a debug build takes
/// seconds for it).
const RECORDS: u64 = 3_000_000;

/// The browser, or `None` with the reason printed. Under `./scripts/test` (which sets
/// `SHAREFLOW_REQUIRE_SERVERS`) or CI a missing browser fails the test.
fn chromium() -> Option<String> {
    match std::env::var("SHAREFLOW_CHROMIUM") {
        Ok(c) => Some(c),
        Err(_) => {
            let why = "SHAREFLOW_CHROMIUM is not set: install it with ./scripts/chromium install and \
                       eval \"$(./scripts/chromium env)\" (./scripts/test does both)";
            assert!(
                std::env::var("CI").is_err() && std::env::var("SHAREFLOW_REQUIRE_SERVERS").is_err(),
                "this run must test the dashboard in a real browser: {why}"
            );
            eprintln!("skipping the browser test: {why}");
            None
        }
    }
}

/// `GET path` from `addr`: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn api(addr: &str, path: &str) -> serde_json::Value {
    let (status, body) = get(addr, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Starts a demo long enough to look at, serving its dashboard; returns it and its
/// address (from the line it prints).
fn start_demo(dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["demo", "--records", &RECORDS.to_string(), "--crashes", "0", "--interval", "200", "--json"])
        .args(["--metrics-addr", "127.0.0.1:0", "--dir"])
        .arg(dir)
        .env("SHAREFLOW_PROGRESS", "plain")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("metrics on http://") {
                let _ = tx.send(rest.trim_end_matches("/metrics").to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(120)).expect("the demo prints its address");
    (child, addr)
}

/// Chromium's DOM of `url` after the page ran for a few (virtual) seconds.
fn dump_dom(browser: &str, scratch: &std::path::Path, url: &str) -> String {
    browser::run_retrying(browser, scratch, &["--dump-dom".to_string()], url, 2)
        .unwrap_or_else(|e| panic!("the page's DOM: {e}"))
}

#[test]
fn the_dashboard_of_a_running_demo_shows_its_graph_checkpoints_and_partitions_in_a_browser() {
    let Some(browser) = chromium() else { return };
    let tmp = tempfile::tempdir().unwrap();
    progress("starting the demo");
    let (mut demo, addr) = start_demo(tmp.path());
    progress(&format!("the demo serves its dashboard on {addr}"));
    let outcome = std::panic::catch_unwind(|| {
        // The endpoints, as a script reads them: wait for a completed checkpoint.
        let deadline = Instant::now() + Duration::from_secs(120);
        // The endpoints come when the job is built, after the input is produced.
        while get(&addr, "/api/checkpoints").0 != 200 || api(&addr, "/api/checkpoints")["completed"] == 0 {
            assert!(Instant::now() < deadline, "no checkpoint completed in 120 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        progress("a checkpoint completed; reading /api/");
        let job = api(&addr, "/api/job");
        let names: Vec<&str> = job["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["share-source", "transform", "topic-sink"], "{job}");
        assert_eq!(job["edges"].as_array().unwrap().len(), 2, "{job}");
        let checkpoints = api(&addr, "/api/checkpoints");
        let first = &checkpoints["history"][0];
        assert_eq!(first["outcome"], "completed", "{checkpoints}");
        assert!(first["transaction"].as_str().unwrap().starts_with("demo-demo-"), "{checkpoints}");
        let partitions = api(&addr, "/api/partitions");
        assert_eq!(partitions.as_array().unwrap().len(), 4, "{partitions}");
        let (acked, all): (u64, u64) = partitions.as_array().unwrap().iter().fold((0, 0), |(a, t), p| {
            let states = ["available", "acquired", "locked", "acknowledged", "archived"];
            (a + p["acknowledged"].as_u64().unwrap(), t + states.iter().map(|s| p[s].as_u64().unwrap()).sum::<u64>())
        });
        assert!(acked > 0, "{partitions}");
        assert_eq!(all, RECORDS, "every record is in one state: {partitions}");
        assert!(api(&addr, "/api/instances").is_array());
        assert_eq!(api(&addr, "/api/dead-letters")["enabled"], false);
        let (status, body) = get(&addr, "/api/nothing");
        assert_eq!(status, 404);
        assert!(body.contains("/api/job"), "{body}");

        // The page, in the browser.
        let dom = dump_dom(&browser, tmp.path(), &format!("http://{addr}/"));
        for node in names {
            assert!(dom.contains(&format!("data-name=\"{node}\"")), "node {node} is not drawn: {dom}");
        }
        assert!(dom.contains("rows/s"), "no rates: {dom}");
        assert!(dom.contains("data-outcome=\"completed\""), "no completed checkpoint: {dom}");
        assert!(dom.contains("class=\"partition\"") && dom.contains("ACKNOWLEDGED"), "no partitions: {dom}");
        assert!(dom.contains("<p id=\"error\"></p>"), "the page saw an error: {dom}");

        let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
        let _ = std::fs::remove_file(&shot);
        let shot_flags = [
            "--hide-scrollbars".to_string(),
            "--window-size=1280,900".to_string(),
            format!("--screenshot={}", shot.display()),
        ];
        browser::run_retrying(&browser, tmp.path(), &shot_flags, &format!("http://{addr}/"), 2)
            .unwrap_or_else(|e| panic!("the screenshot: {e}"));
        let png = std::fs::read(&shot).expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "{} bytes", png.len());
        eprintln!("screenshot: {}", shot.display());
    });
    let _ = demo.kill();
    let _ = demo.wait();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
