//! The embedded demo as a user runs it, through the `shareflow` binary and its `--json`
//! summary: `--resume` on what a stopped run left, the errors a resume can meet, and
//! crash schedules whose every crash fires.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/demo.rs"]
mod demo;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use demo::{fault_points, identity, number, shareflow, value_of, Outcome, INPUT, INPUT_MARKER, OUTPUT, VALUE_LEN};
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{IsolationLevel, ProducerRecord, TopicPartition};

/// The longest one demo run of these sizes may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// `shareflow demo` with the settings of these tests and `extra`.
fn demo_run(dir: &Path, extra: &[&str]) -> Outcome {
    let dir = dir.to_str().expect("a UTF-8 temporary path");
    let mut args = vec!["demo", "--dir", dir, "--interval", "20", "--json"];
    if !extra.contains(&"--crashes") && !extra.contains(&"--crash-at") {
        args.extend(["--crashes", "0"]);
    }
    args.extend(extra);
    shareflow(&args, RUN_TIMEOUT)
}

/// A fresh run of `records` records over 3 partitions.
fn fresh(dir: &Path, records: u64, extra: &[&str]) -> Outcome {
    let records = records.to_string();
    let mut args = vec!["--records", records.as_str(), "--partitions", "3"];
    args.extend(extra);
    demo_run(dir, &args)
}

/// `--resume` of the run in `dir`.
fn resume(dir: &Path, extra: &[&str]) -> Outcome {
    let mut args = vec!["--resume"];
    args.extend(extra);
    demo_run(dir, &args)
}

/// The run succeeded and its own check found the output equal to `records` inputs
/// exactly once; returns its summary.
fn assert_exactly_once(run: &Outcome, records: u64) -> serde_json::Value {
    assert_eq!(run.code, 0, "{run:?}");
    let s = run.json();
    assert_eq!(number(&s, "violations"), 0, "{s}");
    let counts = ["records_produced", "records_committed", "duplicates", "lost"].map(|f| number(&s, f));
    assert_eq!(counts, [records, records, 0, 0], "{s}");
    s
}

/// The run was refused with exit code 1 and a message on stderr; returns the message.
fn refused(run: &Outcome) -> &str {
    assert_eq!(run.code, 1, "the run should have been refused: {run:?}");
    assert!(run.summary().is_none(), "a refused run prints no summary: {run:?}");
    run.stderr.as_str()
}

/// The marker the binary left in `dir`, as JSON.
fn marker(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(INPUT_MARKER)).expect("the run left its input marker");
    serde_json::from_str(&text).expect("the marker is JSON")
}

#[test]
fn resume_without_a_run_names_the_directory_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in [tmp.path().to_path_buf(), tmp.path().join("missing")] {
        let run = resume(&dir, &[]);
        let message = refused(&run);
        assert!(message.contains("nothing to resume in"), "{message}");
        assert!(message.contains(&dir.display().to_string()), "{message}");
        assert!(message.contains("without --resume"), "{message}");
    }
    assert!(!tmp.path().join("broker").exists(), "a refused resume creates no broker");
}

#[test]
fn resume_after_a_finished_run_produces_nothing_and_checks_the_whole_input() {
    let tmp = tempfile::tempdir().unwrap();
    let first = assert_exactly_once(&fresh(tmp.path(), 3_000, &[]), 3_000);
    assert_eq!(first["resumed"], false, "{first}");
    let again = assert_exactly_once(&resume(tmp.path(), &[]), 3_000);
    assert_eq!(again["resumed"], true, "{again}");
}

#[test]
fn resume_finishes_an_input_the_first_run_cut_short() {
    let tmp = tempfile::tempdir().unwrap();
    // What a first run killed while producing leaves: its marker (the one a run of the
    // same input writes), and a prefix of every partition's ids in the input topic.
    let model = tempfile::tempdir().unwrap();
    assert_exactly_once(&fresh(model.path(), 3_000, &[]), 3_000);
    std::fs::copy(model.path().join(INPUT_MARKER), tmp.path().join(INPUT_MARKER)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let broker = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
        broker.create_topic(INPUT, 3).await.unwrap();
        // Ids 0..1001 as the demo produces them: id i to partition i % 3.
        let prefix = (0..1_001u64)
            .map(|id| ProducerRecord {
                partition: Some((id % 3) as i32),
                ..ProducerRecord::new(INPUT, 0, value_of(id, VALUE_LEN))
            })
            .collect();
        broker.produce(prefix).await.unwrap();
        // Ids 0, 3, ..., 999.
        assert_eq!(broker.end_offset(&TopicPartition::new(INPUT, 0)).await.unwrap(), 334);
        broker.close();
    });
    assert_exactly_once(&resume(tmp.path(), &[]), 3_000);
    // The resume produced into the topic the test wrote the prefix to, and only what it
    // lacked; its output topic holds every id once, each the transform of its input.
    runtime.block_on(async {
        let broker = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
        let mut ends = Vec::new();
        for p in 0..3 {
            ends.push(broker.end_offset(&TopicPartition::new(INPUT, p)).await.unwrap());
        }
        assert_eq!(ends, vec![1_000, 1_000, 1_000], "input per partition");
        let mut ids = BTreeSet::new();
        for p in 0..broker.partition_count(OUTPUT).unwrap() as i32 {
            for r in broker.fetch_all(&TopicPartition::new(OUTPUT, p), IsolationLevel::ReadCommitted).await.unwrap() {
                let value = r.value.expect("output values are set");
                let id = identity(&value).expect("output value carries its id");
                assert_eq!(value.as_ref(), value_of(id, VALUE_LEN).to_ascii_uppercase().as_slice());
                assert!(ids.insert(id), "id {id} twice in the output");
            }
        }
        assert_eq!(ids, (0..3_000).collect::<BTreeSet<u64>>());
        broker.close();
    });
}

#[test]
fn resume_refuses_another_mode_a_damaged_marker_and_a_foreign_input() {
    let tmp = tempfile::tempdir().unwrap();
    assert_exactly_once(&fresh(tmp.path(), 500, &[]), 500);

    let run = resume(tmp.path(), &["--at-least-once"]);
    let message = refused(&run);
    assert!(message.contains("uses transactional acknowledgement, not explicit"), "{message}");

    // The marker names fewer records than the topic holds: another run's input. Of 100
    // records, partition 0 gets ids 0, 3, ..., 99: 34; of the 500 there, 167.
    std::fs::write(tmp.path().join(INPUT_MARKER), r#"{"records":100,"partitions":3,"mode":"transactional"}"#).unwrap();
    let run = resume(tmp.path(), &[]);
    let message = refused(&run);
    assert!(
        message.contains(&format!("partition 0 of {INPUT} holds 167 records, more than the 34 this run")),
        "{message}"
    );

    std::fs::write(tmp.path().join(INPUT_MARKER), "{\"records\": 5}").unwrap();
    let run = resume(tmp.path(), &[]);
    let message = refused(&run);
    assert!(message.contains("is damaged") && message.contains("partitions"), "{message}");
    assert!(message.contains("without --resume"), "{message}");
}

#[test]
fn a_fresh_run_clears_the_previous_run() {
    let tmp = tempfile::tempdir().unwrap();
    assert_exactly_once(&fresh(tmp.path(), 800, &[]), 800);
    assert_exactly_once(&fresh(tmp.path(), 300, &[]), 300);
    let m = marker(tmp.path());
    assert_eq!((number(&m, "records"), number(&m, "partitions")), (300, 3), "{m}");
    assert_eq!(m["mode"], "transactional", "{m}");
}

/// Every crash of a schedule over all fault points fires: one the run does not reach
/// (yet) does not hold back the others.
#[test]
fn every_scheduled_crash_of_the_demo_fires() {
    let tmp = tempfile::tempdir().unwrap();
    let points = fault_points();
    let all = points.len().to_string();
    for seed in ["1", "2"] {
        let s = assert_exactly_once(&fresh(tmp.path(), 20_000, &["--crashes", &all, "--seed", seed]), 20_000);
        assert_eq!(number(&s, "crashes_scheduled"), points.len() as u64, "{s}");
        assert_eq!(number(&s, "crashes"), number(&s, "crashes_scheduled"), "seed {seed}: fired {}", s["crash_points"]);
        let fired: BTreeSet<&str> = s["crash_points"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        assert_eq!(fired, points.iter().copied().collect(), "seed {seed}: the demo's fault points");
    }
}

/// `--crash-at` schedules exactly the crashes it names, each after the hits it names.
#[test]
fn crash_at_fires_the_named_crashes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fresh(
        tmp.path(),
        5_000,
        &["--crash-at", "sink.after_write:2", "--crash-at", "checkpoint.after_manifest", "--crash-at", "no.such.point"],
    );
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("\"no.such.point\" is not a fault point"), "{}", run.stderr);

    let run =
        fresh(tmp.path(), 5_000, &["--crash-at", "sink.after_write:2", "--crash-at", "checkpoint.after_manifest"]);
    let s = assert_exactly_once(&run, 5_000);
    assert_eq!(number(&s, "crashes_scheduled"), 2, "{s}");
    let fired: BTreeSet<&str> = s["crash_points"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(fired, BTreeSet::from(["sink.after_write", "checkpoint.after_manifest"]), "{s}");
    // Each crash ends an attempt; two may land in the same attempt.
    assert!((2..=3).contains(&number(&s, "attempts")), "two crashes, one or two restarts: {s}");
}

/// The summary says where crashes' time goes: a crash-free run emits each record once and
/// waits for no restart; a crash after a sink write makes the sources emit what that
/// epoch held again, and its one restart waits the demo's first restart delay (10 ms).
#[test]
fn the_summary_says_what_crashes_cost() {
    let tmp = tempfile::tempdir().unwrap();
    let s = assert_exactly_once(&fresh(tmp.path(), 5_000, &[]), 5_000);
    assert_eq!(number(&s, "attempts"), 1, "{s}");
    assert_eq!(number(&s, "records_emitted"), 5_000, "{s}");
    assert_eq!(number(&s, "records_emitted_again"), 0, "{s}");
    assert_eq!(s["restart_delay_seconds"].as_f64(), Some(0.0), "{s}");
    assert!(s["recovery_seconds"].as_f64().is_some_and(|r| r >= 0.0), "{s}");
    // The sink took in the whole input before the job's last checkpoint ended it.
    let (processed, seconds) = (s["processed_seconds"].as_f64(), s["seconds"].as_f64().unwrap());
    assert!(processed.is_some_and(|p| p > 0.0 && p <= seconds), "{s}");
    assert!(s["processed_per_second"].as_f64().is_some_and(|r| r >= s["records_per_second"].as_f64().unwrap()), "{s}");

    let s = assert_exactly_once(&fresh(tmp.path(), 5_000, &["--crash-at", "sink.after_write:0"]), 5_000);
    assert_eq!(number(&s, "attempts"), 2, "{s}");
    let again = number(&s, "records_emitted_again");
    assert!(again > 0, "the crashed epoch's records are emitted again: {s}");
    assert!(again <= 5_000, "one crash redoes one epoch at most, not more than the input: {s}");
    assert_eq!(number(&s, "records_emitted"), 5_000 + again, "every record emitted at least once: {s}");
    assert_eq!(s["restart_delay_seconds"].as_f64(), Some(0.01), "{s}");
    assert!(s["recovery_seconds"].as_f64().is_some_and(|r| r > 0.0), "the restart recovered: {s}");
    // The sink's count includes what the crash made it take in twice: no full-speed figure.
    assert!(s["processed_seconds"].is_null() && s["processed_per_second"].is_null(), "{s}");
}

/// The full-speed time ends when the sink has every record, not when the run does. An
/// at-least-once run ends only after a periodic checkpoint has accepted its last
/// records, so with a 1.5 s interval it lasts at least 1.5 s; its sink had everything
/// before that.
#[test]
fn the_full_speed_time_leaves_out_the_wait_for_a_periodic_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let args = ["demo", "--dir", dir, "--records", "2000", "--partitions", "3", "--interval", "1500"];
    let run = shareflow(&[&args[..], &["--crashes", "0", "--at-least-once", "--json"]].concat(), RUN_TIMEOUT);
    let s = assert_exactly_once(&run, 2_000);
    let seconds = s["seconds"].as_f64().unwrap();
    assert!(seconds >= 1.5, "the run waited for its first periodic checkpoint: {s}");
    let processed = s["processed_seconds"].as_f64();
    assert!(processed.is_some_and(|p| p > 0.0 && p < seconds), "the sink had every record first: {s}");
    let (rate, to_end) = (s["processed_per_second"].as_f64().unwrap(), s["records_per_second"].as_f64().unwrap());
    assert!(rate > to_end, "the input over the shorter time: {s}");
}

#[test]
fn the_cli_resumes_and_refuses_what_a_resume_cannot_take() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let run = shareflow(&["demo", "--resume", "--dir", dir], RUN_TIMEOUT);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains(dir) && run.stderr.contains("without --resume"), "{}", run.stderr);

    let run = shareflow(&["demo", "--resume", "--dir", dir, "--records", "5"], RUN_TIMEOUT);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("'--resume' cannot be used with '--records <N>'"), "{}", run.stderr);

    let run = shareflow(&["demo", "--dir", dir, "--records", "200", "--crashes", "0", "--json"], RUN_TIMEOUT);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = shareflow(&["demo", "--resume", "--dir", dir, "--crashes", "0", "--json"], RUN_TIMEOUT);
    assert_eq!(run.code, 0, "{run:?}");
    let stdout = &run.stdout;
    assert!(stdout.contains("\"resumed\":true") && stdout.contains("\"records_produced\":200"), "{stdout}");
    assert!(stdout.contains("\"violations\":0"), "{stdout}");
    // The resumed run saw only what the first left, so what it re-emitted is not told.
    assert!(stdout.contains("\"records_emitted_again\":null"), "{stdout}");
    assert!(stdout.contains("\"processed_seconds\":null"), "{stdout}");
}

/// A fresh demo never clears a broker directory that a live broker holds: it would
/// delete the files the live broker goes on writing to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_demo_refuses_a_directory_a_live_broker_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let live = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
    live.create_topic("kept", 1).await.unwrap();
    let path = tmp.path().to_path_buf();
    let run = tokio::task::spawn_blocking(move || fresh(&path, 10, &[])).await.unwrap();
    let message = refused(&run);
    assert!(message.contains("in use by pid"), "{message}");
    assert_eq!(live.partition_count("kept").unwrap(), 1);
    live.close();
    let reopened = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
    assert_eq!(reopened.partition_count("kept").unwrap(), 1, "the live broker's files were left alone");
}

/// `--instances 3`: three instances and a late joiner in one share group; the seeded
/// crashes hit instances 2 and 3, instance 1 dies for good and is adopted. The output is
/// exactly once, and the summary says who did what.
#[test]
fn several_instances_adopt_the_one_that_died() {
    let tmp = tempfile::tempdir().unwrap();
    let s =
        assert_exactly_once(&fresh(tmp.path(), 20_000, &["--instances", "3", "--crashes", "3", "--seed", "5"]), 20_000);
    assert!(number(&s, "adoptions") >= 1, "the dead instance was adopted: {s}");
    let instances = s["instances"].as_array().expect("per-instance summaries");
    assert!(instances.len() >= 4, "three instances and a late joiner: {s}");
    let role = |prefix: &str| instances.iter().find(|i| i["prefix"] == prefix).map(|i| i["role"].clone());
    assert_eq!(role("demo-1"), Some("dies for good".into()), "{s}");
    assert_eq!(role("demo-4"), Some("joins late".into()), "{s}");
    let dead = instances.iter().find(|i| i["prefix"] == "demo-1").unwrap();
    assert_eq!(dead["crashes"], 1, "{s}");
    assert!(dead["outcome"].as_str().unwrap().contains("injected crash"), "{s}");
    let emitted: u64 = instances.iter().map(|i| i["records_emitted"].as_u64().unwrap()).sum();
    assert!(emitted >= 20_000, "every record went through some instance (replays count twice): {s}");

    // The admin view of the same run: instance 1 adopted, the others retired.
    let root = format!("file://{}", tmp.path().join("checkpoints").display());
    let listed = shareflow(&["instances", "--checkpoints", &root], RUN_TIMEOUT);
    assert_eq!(listed.code, 0, "{listed:?}");
    let adopter = instances.iter().find(|i| i["adoptions"].as_u64() > Some(0)).unwrap()["prefix"].as_str().unwrap();
    let line = |prefix: &str| listed.stdout.lines().find(|l| l.starts_with(&format!("{prefix} "))).map(str::to_string);
    assert!(line("demo-1").is_some_and(|l| l.ends_with(&format!("adopted by {adopter}"))), "{}", listed.stdout);
    assert!(line("demo-4").is_some_and(|l| l.ends_with("retired")), "{}", listed.stdout);

    let refused_run = fresh(tmp.path(), 1_000, &["--instances", "2", "--at-least-once"]);
    assert!(refused(&refused_run).contains("--instances: instances need exactly-once mode"), "{refused_run:?}");
}

/// SIGTERM stops a running demo gracefully: a final checkpoint commits what was done,
/// the rest is left AVAILABLE (nothing lost, nothing duplicated, nothing LOCKED), the
/// process exits 0, and `--resume` finishes the input exactly once.
#[test]
fn sigterm_stops_the_demo_gracefully_and_resume_finishes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap().to_string();
    let records = 600_000u64;
    let logs = tempfile::tempdir().unwrap();
    let out = logs.path().join("out");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["demo", "--dir", &dir, "--interval", "50", "--crashes", "0", "--json", "--partitions", "3"])
        .args(["--records", &records.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The signal handler is in place once the job runs: wait for its first checkpoint.
    let checkpoints = tmp.path().join("checkpoints").join("demo");
    let started = std::time::Instant::now();
    while !std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_some()) {
        assert!(started.elapsed() < RUN_TIMEOUT, "the demo never checkpointed");
        assert!(child.try_wait().unwrap().is_none(), "the demo ended before its first checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success(), "kill -TERM by pid");
    let status = demo::wait_for(&mut child, RUN_TIMEOUT).unwrap_or_else(|| {
        child.kill().unwrap();
        panic!("the demo did not stop after SIGTERM")
    });
    let stopped = Outcome {
        code: status.code().unwrap_or(-1),
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr: String::new(),
    };
    assert_eq!(stopped.code, 0, "{stopped:?}");
    let s = stopped.json();
    assert_eq!(s["stopped"], true, "the signal arrived before the input was done: {s}");
    assert!(s["records_emitted_again"].is_null(), "a run cut short does not say what it redid: {s}");
    assert!(s["processed_seconds"].is_null(), "a run cut short never had the whole input: {s}");
    assert_eq!((number(&s, "duplicates"), number(&s, "lost"), number(&s, "violations")), (0, 0, 0), "{s}");
    let (committed, left) = (number(&s, "records_committed"), number(&s, "left_for_resume"));
    assert!(left > 0, "the run was cut short: {s}");
    assert_eq!(committed + left + number(&s, "archived"), records, "every record is done or left AVAILABLE: {s}");

    let resumed = assert_exactly_once(&resume(tmp.path(), &[]), records);
    assert_eq!(resumed["resumed"], true, "{resumed}");
}

/// Options are checked before anything runs: a checkpoint URL that cannot open (S3
/// without credentials) fails before the demo makes its directory or produces input.
#[test]
fn a_checkpoint_url_that_cannot_open_fails_before_anything_is_produced() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["demo", "--records", "100", "--dir", dir.to_str().unwrap(), "--checkpoints", "s3://bucket/x"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .expect("run shareflow");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("invalid storage URL \"s3://bucket/x\""), "{stderr}");
    assert!(stderr.contains("needs credentials"), "{stderr}");
    assert!(!stderr.contains("produced"), "{stderr}");
    assert!(!dir.exists(), "the demo made its directory before it checked the URL");
}

/// `shareflow checkpoints` lists a run's checkpoints, and says why when there are none:
/// nothing stored at the location, or another job's name.
#[test]
fn checkpoints_lists_a_run_and_names_a_location_or_job_with_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    assert_exactly_once(&fresh(tmp.path(), 5_000, &[]), 5_000);
    let root = format!("file://{}", tmp.path().join("checkpoints").display());
    let listed = shareflow(&["checkpoints", "--checkpoints", &root], RUN_TIMEOUT);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.starts_with("  checkpoint status"), "{}", listed.stdout);
    let rows: Vec<&str> = listed.stdout.lines().skip(1).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l.contains("Complete")), "{}", listed.stdout);
    // Each complete checkpoint names the transaction that decided it.
    assert!(rows.iter().all(|l| l.contains("demo-demo-")), "{}", listed.stdout);

    let other = shareflow(&["checkpoints", "--checkpoints", &root, "--job", "nope"], RUN_TIMEOUT);
    assert_eq!(other.code, 1, "{other:?}");
    assert!(other.stderr.contains("job nope has nothing under"), "{}", other.stderr);
    assert!(other.stderr.contains("jobs there: demo (pick one with --job)"), "{}", other.stderr);

    let missing = format!("file://{}", tmp.path().join("no-such-place").display());
    let nothing = shareflow(&["checkpoints", "--checkpoints", &missing], RUN_TIMEOUT);
    assert_eq!(nothing.code, 1, "{nothing:?}");
    assert!(nothing.stderr.contains(&format!("nothing is stored under {missing}")), "{}", nothing.stderr);
}

/// `shareflow checkpoints inspect N` shows a complete checkpoint's manifest and checks
/// its state; a damaged manifest and an id with none are named.
#[test]
fn checkpoints_inspect_shows_a_checkpoint_and_names_a_damaged_one() {
    let tmp = tempfile::tempdir().unwrap();
    assert_exactly_once(&fresh(tmp.path(), 5_000, &[]), 5_000);
    let root = format!("file://{}", tmp.path().join("checkpoints").display());
    let listed = shareflow(&["checkpoints", "--checkpoints", &root], RUN_TIMEOUT);
    let first: u64 = listed.stdout.lines().nth(1).and_then(|l| l.split_whitespace().next()).unwrap().parse().unwrap();
    let id = first.to_string();
    let shown = shareflow(&["checkpoints", "inspect", &id, "--checkpoints", &root, "--json"], RUN_TIMEOUT);
    assert_eq!(shown.code, 0, "{shown:?}");
    let v: serde_json::Value = serde_json::from_str(shown.stdout.trim()).unwrap();
    assert_eq!(v["checkpoint"], first, "{v}");
    assert_eq!(v["job"], "demo", "{v}");
    let txns = v["transactions"].as_array().unwrap();
    assert!(
        !txns.is_empty() && txns.iter().all(|t| t["transaction"].as_str().unwrap().starts_with("demo-demo-")),
        "{v}"
    );
    assert!(v["state_files"].as_array().unwrap().iter().all(|f| f["check"] == "verified"), "{v}");

    // A damaged manifest is named, with the checkpoint and what to do.
    let manifest = tmp.path().join("checkpoints").join("demo").join(format!("chk-{first:020}")).join("_metadata");
    std::fs::write(&manifest, b"not a manifest").unwrap();
    let damaged = shareflow(&["checkpoints", "inspect", &id, "--checkpoints", &root], RUN_TIMEOUT);
    assert_eq!(damaged.code, 1, "{damaged:?}");
    assert!(damaged.stderr.contains(&format!("checkpoint {first} of job demo under {root}")), "{}", damaged.stderr);
    // An id with no checkpoint, and a missing id.
    let none = shareflow(&["checkpoints", "inspect", "999999", "--checkpoints", &root], RUN_TIMEOUT);
    assert_eq!(none.code, 1, "{none:?}");
    assert!(none.stderr.contains("list them with `shareflow checkpoints`"), "{}", none.stderr);
    let bad = shareflow(&["checkpoints", "inspect", "--checkpoints", &root], RUN_TIMEOUT);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(
        bad.stderr.contains("required arguments were not provided") && bad.stderr.contains("<ID>"),
        "{}",
        bad.stderr
    );
}

/// Off a terminal the demo prints a plain progress line a second, with the shared
/// figures; `--log-format json` writes its logs as one JSON object per line; a format
/// it does not know is refused before anything runs.
#[test]
fn plain_progress_lines_and_json_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let run = demo::shareflow_with_env(
        // Long enough for a progress line (one a second) on a fast machine too: 300,000
        // records once finished in 0.9 s.
        &["demo", "--dir", dir, "--records", "2000000", "--crashes", "0", "--interval", "100", "--log-format", "json"],
        &[("SHAREFLOW_LOG", "info".to_string())],
        RUN_TIMEOUT,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let progress: Vec<&str> = run.stderr.lines().filter(|l| l.starts_with("progress: ")).collect();
    assert!(!progress.is_empty(), "no progress line: {}", run.stderr);
    // The first line has no rate yet: it says so.
    assert!(progress[0].contains("starting"), "{}", progress[0]);
    for (i, line) in progress.iter().enumerate() {
        let rate = if i == 0 { "starting" } else { "records/s" };
        assert!(line.contains("% done") && line.contains(rate) && line.contains("checkpoints"), "{line}");
    }
    let logs: Vec<serde_json::Value> =
        run.stderr.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!logs.is_empty(), "no JSON log line: {}", run.stderr);
    for log in &logs {
        assert!(log["level"].is_string() && log["fields"].is_object() && log["timestamp"].is_string(), "{log}");
    }
    let bad = shareflow(&["demo", "--dir", dir, "--log-format", "yaml"], RUN_TIMEOUT);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("invalid value 'yaml' for '--log-format <LOG_FORMAT>'"), "{}", bad.stderr);
}

/// The at-least-once mode: the source keeps each epoch's records as offset ranges,
/// renews them as ranges and ACCEPTs them when the checkpoint completes. Through crashes
/// at random fault points every record reaches the output; only duplicates may appear.
#[test]
fn at_least_once_loses_nothing_through_crashes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fresh(tmp.path(), 3_000, &["--at-least-once", "--crashes", "2", "--seed", "3"]);
    let s = run.json();
    assert_eq!(number(&s, "records_produced"), 3_000, "{s}");
    assert_eq!(number(&s, "lost"), 0, "{s}");
    assert!(number(&s, "records_committed") >= 3_000, "{s}");
    assert!(number(&s, "crashes") >= 1, "a crash fired: {s}");
    // Each record was ACCEPTed once its checkpoint completed: none went round until the
    // delivery limit archived it, and the duplicates are only what the crashes replayed
    // (a crash before the notification replays its checkpoint's records, at most all).
    assert_eq!(number(&s, "archived"), 0, "{s}");
    assert!(number(&s, "duplicates") <= 3_000 * number(&s, "crashes"), "{s}");
}
