//! `--metrics-addr`: a real HTTP client scrapes the Prometheus endpoint of a running
//! `shareflow demo` and sees the values move; bad addresses are refused before the demo
//! does anything.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One scrape: every sample line, `name{labels}` to value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of every series of `name` (any labels).
fn total(s: &BTreeMap<String, f64>, name: &str) -> f64 {
    s.iter().filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{"))).map(|(_, v)| v).sum()
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Scrapes `addr` every 300 ms while `child` runs, until two scrapes after the first
/// completed checkpoint show every name of `moving` grown (or 120 s pass); then reads
/// the dashboard's `/api/partitions` and kills it. Returns those scrapes, the content
/// type and the partitions.
async fn scrape_while(
    mut child: Child,
    addr: &str,
    moving: &[&str],
) -> (Vec<BTreeMap<String, f64>>, String, serde_json::Value, serde_json::Value) {
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/metrics");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut scrapes: Vec<BTreeMap<String, f64>> = Vec::new();
    let mut content_type = String::new();
    while Instant::now() < deadline && child.try_wait().expect("status").is_none() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let Ok(response) = client.get(&url).send().await else { continue };
        assert_eq!(response.status(), 200);
        content_type = response.headers()["content-type"].to_str().expect("ascii").to_string();
        let s = samples(&response.text().await.expect("body"));
        if total(&s, "shareflow_checkpoints_completed_total") >= 1.0 {
            scrapes.push(s);
        }
        if scrapes.len() >= 2 {
            let (a, b) = (&scrapes[0], &scrapes[scrapes.len() - 1]);
            if moving.iter().all(|name| total(b, name) > total(a, name)) {
                break;
            }
        }
    }
    let get = |path: &str| {
        let url = format!("http://{addr}{path}");
        let client = client.clone();
        async move {
            match client.get(url).send().await {
                Ok(r) => r.text().await.expect("body"),
                Err(e) => format!("{e}"),
            }
        }
    };
    let partitions = get("/api/partitions").await;
    let transactions = get("/api/transactions").await;
    let _ = child.kill();
    let _ = child.wait();
    let partitions: serde_json::Value =
        serde_json::from_str(&partitions).unwrap_or_else(|e| panic!("{e}: {partitions}"));
    let transactions: serde_json::Value =
        serde_json::from_str(&transactions).unwrap_or_else(|e| panic!("{e}: {transactions}"));
    assert!(scrapes.len() >= 2, "no two scrapes with a completed checkpoint: {} scrapes", scrapes.len());
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    let (first, last) = (&scrapes[0], &scrapes[scrapes.len() - 1]);
    for name in moving {
        assert!(
            total(last, name) > total(first, name),
            "{name} did not move: {} then {}",
            total(first, name),
            total(last, name)
        );
    }
    (scrapes, content_type, partitions, transactions)
}

/// KIP-1289's five metrics, under their names, and the runtime's checkpoint histogram
/// counting what its counter counts.
fn check_seed_names_and_checkpoints(last: &BTreeMap<String, f64>) {
    for name in [
        "share_transaction_active",
        "share_transaction_prepare_time_ms_count",
        "share_transaction_commit_time_ms_count",
        "share_transaction_abort_total",
        "share_transaction_timeout_total",
    ] {
        assert!(last.contains_key(name), "{name} missing: {:?}", last.keys().collect::<Vec<_>>());
    }
    assert!(total(last, "share_transaction_commit_time_ms_count") >= 1.0);
    assert!(last.keys().any(|k| k.starts_with("shareflow_records_out_total{operator=")), "{last:?}");
    assert_eq!(
        total(last, "shareflow_checkpoint_duration_ms_count"),
        total(last, "shareflow_checkpoints_completed_total")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_demo_serves_metrics_that_move() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["demo", "--records", "400000", "--crashes", "0", "--interval", "200", "--json"])
        .args(["--dir", &dir.path().display().to_string(), "--metrics-addr", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the demo");
    let moving = [
        "shareflow_checkpoints_completed_total",
        "shareflow_records_in_total",
        "shareflow_source_records_emitted_total",
    ];
    let (scrapes, _, partitions, _) = scrape_while(child, &addr, &moving).await;
    let last = &scrapes[scrapes.len() - 1];
    check_seed_names_and_checkpoints(last);
    // The embedded broker's own record counters.
    assert!(total(last, "share_records_acquired_total") >= total(last, "shareflow_source_records_emitted_total"));
    // The dashboard's share partitions: the embedded broker tells each record's state.
    let partitions = partitions.as_array().expect("an array");
    assert!(!partitions.is_empty());
    for p in partitions {
        let n = |state: &str| p[state].as_u64().unwrap_or_else(|| panic!("{state}: {p}"));
        assert_eq!(n("unfinished"), n("available") + n("acquired") + n("locked"), "{p}");
        let all: u64 = ["available", "acquired", "locked", "acknowledged", "archived"].iter().map(|s| n(s)).sum();
        assert_eq!(all, p["end_offset"].as_u64().expect("end_offset"), "{p}");
    }
}

/// `shareflow run` on the real Kafka broker: the seed's five come from the job's
/// coordinator, and the intents counter moves with the checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_instance_serves_metrics_that_move() {
    let Some(c) = support::kafka::cluster().await else { return };
    let bootstrap = support::kafka::bootstrap().expect("set");
    let group = support::kafka::unique("metrics");
    let input = format!("{group}-input");
    c.ensure_topic(&input, 2, &[]).await.expect("input topic");
    c.produce(&input, support::kafka::numbered(60_000)).await.expect("produce");
    let dir = tempfile::tempdir().expect("tempdir");
    let checkpoints = format!("file://{}", dir.path().display());
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["run", "--kafka", &bootstrap, "--group", &group, "--instance", "i1", "--checkpoints", &checkpoints])
        .args(["--interval", "300", "--partitions", "2", "--max-rate", "5000", "--metrics-addr", &addr])
        .env("SHAREFLOW_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start shareflow run");
    let moving = [
        "shareflow_checkpoints_completed_total",
        "shareflow_source_intents_written_total",
        "shareflow_source_poll_wait_ms_total",
        "shareflow_source_intent_wait_ms_total",
        "share_transaction_commit_time_ms_count",
    ];
    let (scrapes, _, partitions, transactions) = scrape_while(child, &addr, &moving).await;
    check_seed_names_and_checkpoints(&scrapes[scrapes.len() - 1]);
    // The instance's open Kafka transactions, by transactional id (Kafka tells no counts).
    for t in transactions.as_array().expect("an array") {
        assert!(t["id"].as_str().expect("an id").starts_with(&format!("{group}-i1-")), "{t}");
        assert!(t["acknowledgements"].is_null() && t["age_ms"].as_u64().is_some(), "{t}");
    }
    // The dashboard's share partitions: what Kafka tells (offsets and lag), no states.
    let partitions = partitions.as_array().expect("an array");
    assert_eq!(partitions.len(), 2, "{partitions:?}");
    let mut ends = 0;
    for p in partitions {
        assert_eq!(p["topic"], input.as_str(), "{p}");
        let (end, start, unfinished) = (p["end_offset"].as_i64(), p["start_offset"].as_i64(), p["unfinished"].as_u64());
        let (end, unfinished) = (end.expect("end_offset"), unfinished.expect("unfinished"));
        assert!(start.is_some_and(|s| (0..=end).contains(&s)), "{p}");
        assert!(unfinished <= end as u64, "{p}");
        assert!(p["acknowledged"].is_null() && p["available"].is_null(), "Kafka tells no states: {p}");
        ends += end;
    }
    assert_eq!(ends, 60_000, "{partitions:?}");
}

#[test]
fn a_bad_or_taken_metrics_address_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = listener.local_addr().expect("addr").to_string();
    for (addr, message) in [("nonsense", "\"nonsense\" is not HOST:PORT"), (taken.as_str(), "cannot serve metrics on")]
    {
        let d = dir.path().join("demo");
        let run = support::demo::shareflow(
            &["demo", "--records", "10", "--dir", &d.display().to_string(), "--metrics-addr", addr],
            Duration::from_secs(60),
        );
        assert_eq!(run.code, 1, "{addr}: {run:?}");
        assert!(run.stderr.contains(message), "{addr}: {}", run.stderr);
        // Refused first: the demo directory was not even made.
        assert!(!d.exists(), "{addr}: the demo started");
    }
    // Several instances in one process are several jobs: one endpoint cannot serve them.
    let run = support::demo::shareflow(
        &["demo", "--instances", "2", "--metrics-addr", "127.0.0.1:0"],
        Duration::from_secs(60),
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("--metrics-addr serves one job"), "{}", run.stderr);
}
