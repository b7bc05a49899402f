//! The embedded demo as a user runs it: `--resume` on what a stopped run left, the errors
//! a resume can meet, and crash schedules whose every crash fires.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::{AcknowledgementMode, TopicPartition};
use shareflow::demo::{self, DemoError, DemoInput, DemoOptions, DemoSummary, FAULT_POINTS, INPUT, INPUT_MARKER};

fn options(dir: &Path, records: u64) -> DemoOptions {
    DemoOptions {
        dir: dir.to_path_buf(),
        records,
        interval: Duration::from_millis(20),
        crashes: 0,
        partitions: 3,
        progress: false,
        ..DemoOptions::default()
    }
}

fn resume(dir: &Path) -> DemoOptions {
    DemoOptions { resume: true, ..options(dir, 0) }
}

fn assert_exactly_once(s: &DemoSummary, records: u64) {
    assert!(s.violations.is_empty(), "{:?}", s.violations.first());
    assert_eq!((s.records_produced, s.records_committed, s.duplicates, s.lost), (records, records, 0, 0));
}

async fn demo_error(options: &DemoOptions) -> DemoError {
    match demo::run(options).await {
        Ok(s) => panic!("the run should have been refused, but ran: {s:?}"),
        Err(e) => match e.downcast::<DemoError>() {
            Ok(e) => *e,
            Err(e) => panic!("not a DemoError: {e}"),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_without_a_run_names_the_directory_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in [tmp.path().to_path_buf(), tmp.path().join("missing")] {
        let e = demo_error(&resume(&dir)).await;
        assert!(matches!(&e, DemoError::NothingToResume { dir: d } if *d == dir), "{e:?}");
        let message = e.to_string();
        assert!(message.contains(&dir.display().to_string()), "{message}");
        assert!(message.contains("without --resume"), "{message}");
    }
    assert!(!tmp.path().join("broker").exists(), "a refused resume creates no broker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_a_finished_run_produces_nothing_and_checks_the_whole_input() {
    let tmp = tempfile::tempdir().unwrap();
    let first = demo::run(&options(tmp.path(), 3_000)).await.unwrap();
    assert_exactly_once(&first, 3_000);
    assert!(!first.resumed);
    let again = demo::run(&resume(tmp.path())).await.unwrap();
    assert!(again.resumed);
    assert_exactly_once(&again, 3_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_finishes_an_input_the_first_run_cut_short() {
    let tmp = tempfile::tempdir().unwrap();
    // What a first run killed while producing leaves: its marker, and a prefix of every
    // partition's ids in the input topic.
    let whole = DemoInput { records: 3_000, partitions: 3, mode: AcknowledgementMode::Transactional };
    whole.save(tmp.path()).unwrap();
    {
        let broker = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
        broker.create_topic(INPUT, 3).await.unwrap();
        let part = DemoInput { records: 1_001, ..whole };
        assert_eq!(demo::produce_input(&broker, &part).await.unwrap(), 1_001);
        assert_eq!(broker.end_offset(&TopicPartition::new(INPUT, 0)).await.unwrap(), 334);
        broker.close();
    }
    let s = demo::run(&resume(tmp.path())).await.unwrap();
    assert_exactly_once(&s, 3_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_refuses_another_mode_a_damaged_marker_and_a_foreign_input() {
    let tmp = tempfile::tempdir().unwrap();
    assert_exactly_once(&demo::run(&options(tmp.path(), 500)).await.unwrap(), 500);

    let e = demo_error(&DemoOptions { mode: AcknowledgementMode::Explicit, ..resume(tmp.path()) }).await;
    assert!(
        matches!(
            e,
            DemoError::ModeMismatch {
                started: AcknowledgementMode::Transactional,
                asked: AcknowledgementMode::Explicit,
                ..
            }
        ),
        "{e:?}"
    );

    // The marker names fewer records than the topic holds: another run's input.
    DemoInput { records: 100, partitions: 3, mode: AcknowledgementMode::Transactional }.save(tmp.path()).unwrap();
    let e = demo_error(&resume(tmp.path())).await;
    assert!(matches!(e, DemoError::UnexpectedInput { expected: 34, found: 167, .. }), "{e:?}");

    std::fs::write(tmp.path().join(INPUT_MARKER), "{\"records\": 5}").unwrap();
    let e = demo_error(&resume(tmp.path())).await;
    assert!(matches!(&e, DemoError::BadMarker { reason, .. } if reason.contains("partitions")), "{e:?}");
    assert!(e.to_string().contains("without --resume"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_run_clears_the_previous_run() {
    let tmp = tempfile::tempdir().unwrap();
    assert_exactly_once(&demo::run(&options(tmp.path(), 800)).await.unwrap(), 800);
    let s = demo::run(&options(tmp.path(), 300)).await.unwrap();
    assert_exactly_once(&s, 300);
    assert_eq!(DemoInput::load(tmp.path()).unwrap().records, 300);
}

#[test]
fn marker_round_trips_and_counts_records_per_partition() {
    let tmp = tempfile::tempdir().unwrap();
    let input = DemoInput { records: 10, partitions: 4, mode: AcknowledgementMode::Explicit };
    input.save(tmp.path()).unwrap();
    assert_eq!(DemoInput::load(tmp.path()).unwrap(), input);
    assert!(!tmp.path().join(format!("{INPUT_MARKER}.tmp")).exists());
    assert_eq!((0..4).map(|p| input.records_in(p)).collect::<Vec<_>>(), vec![3, 3, 2, 2]);
}

/// Every crash of a schedule over all fault points fires: one the run does not reach
/// (yet) does not hold back the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheduled_crash_of_the_demo_fires() {
    let tmp = tempfile::tempdir().unwrap();
    for seed in [1, 2] {
        let s =
            demo::run(&DemoOptions { crashes: FAULT_POINTS.len(), seed, ..options(tmp.path(), 20_000) }).await.unwrap();
        assert_exactly_once(&s, 20_000);
        assert_eq!(s.crashes_scheduled, FAULT_POINTS.len());
        assert_eq!(s.crashes, s.crashes_scheduled, "seed {seed}: fired {:?}", s.crash_points);
    }
}

fn shareflow(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shareflow")).args(args).output().expect("run shareflow");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn the_cli_resumes_and_refuses_what_a_resume_cannot_take() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let (code, stderr) = shareflow(&["demo", "--resume", "--dir", dir]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(dir) && stderr.contains("without --resume"), "{stderr}");

    let (code, stderr) = shareflow(&["demo", "--resume", "--dir", dir, "--records", "5"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("drop --records"), "{stderr}");

    let (code, stderr) = shareflow(&["demo", "--dir", dir, "--records", "200", "--crashes", "0", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["demo", "--resume", "--dir", dir, "--crashes", "0", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("\"resumed\":true") && stdout.contains("\"records_produced\":200"), "{stdout}");
    assert!(stdout.contains("\"violations\":0"), "{stdout}");
}

/// A fresh demo never clears a broker directory that a live broker holds: it would
/// delete the files the live broker goes on writing to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_demo_refuses_a_directory_a_live_broker_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let live = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
    live.create_topic("kept", 1).await.unwrap();
    let err = demo::run(&options(tmp.path(), 10)).await.unwrap_err();
    assert!(err.to_string().contains("in use by pid"), "{err}");
    assert_eq!(live.partition_count("kept").unwrap(), 1);
    live.close();
    let reopened = EmbeddedBroker::open(BrokerOptions::local_dir(tmp.path().join("broker")).unwrap()).await.unwrap();
    assert_eq!(reopened.partition_count("kept").unwrap(), 1, "the live broker's files were left alone");
}
