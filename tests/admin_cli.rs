//! `shareflow txn list` on an embedded broker, run as a real process beside the live
//! broker: each transaction's state, age, timeout and staged work, and with
//! `--checkpoints` the checkpoint whose manifest decides it.

#![allow(clippy::unwrap_used)]

mod support;

use shareflow::checkpoint::{CheckpointStore, Manifest, ParticipantState, TransactionRecord};
use shareflow::connector::broker::{
    BrokerOptions, EmbeddedBroker, EmbeddedShareConsumer, EmbeddedTransactionCoordinator,
};
use shareflow::connector::share::AcknowledgeType::Accept;
use shareflow::connector::share::AcknowledgementMode::Transactional;
use shareflow::connector::share::*;
use support::{acks, config, poll, txn_id, GROUP, IN, OUT, PREFIX, TXN_TIMEOUT};

/// `shareflow txn ARGS`: exit code, stdout, stderr.
fn txn(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow")).arg("txn").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn txn_list(args: &[&str]) -> (i32, String, String) {
    txn(&[&["list"], args].concat())
}

/// A live broker in `dir` (system clock, as the commands' own opens use) with topics
/// `IN` holding `records` records and `OUT`, its coordinator, and a subscribed
/// transactional consumer.
async fn live_broker(
    dir: &std::path::Path,
    records: usize,
) -> (EmbeddedBroker, EmbeddedTransactionCoordinator, EmbeddedShareConsumer) {
    let broker = EmbeddedBroker::open(BrokerOptions::local_dir(dir).unwrap().default_config(config(Transactional)))
        .await
        .unwrap();
    broker.create_topic(IN, 1).await.unwrap();
    broker.create_topic(OUT, 1).await.unwrap();
    broker.configure_group(GROUP, config(Transactional)).await.unwrap();
    broker.produce((0..records).map(|i| ProducerRecord::new(IN, 0, format!("v{i}"))).collect()).await.unwrap();
    let coord = broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = broker.consumer(GROUP, config(Transactional)).await.unwrap();
    c.subscribe(&[IN]).await.unwrap();
    (broker, coord, c)
}

/// Publishes checkpoint `n`'s manifest, naming T(n), under `root`.
async fn publish_checkpoint(root: &str, n: u64) {
    let store = CheckpointStore::from_url(root, &[], PREFIX).unwrap();
    let manifest = Manifest {
        job_id: PREFIX.into(),
        checkpoint_id: n,
        created_at_ms: shareflow::checkpoint::now_ms(),
        state_files: Vec::new(),
        transactions: vec![TransactionRecord {
            participant: "share-source".into(),
            transaction_id: txn_id(n).to_string(),
            state: ParticipantState::Prepared,
        }],
    };
    store.publish_manifest(&manifest).await.unwrap();
}

/// Begins T(n), polls one record, sends one output record and acknowledges the record
/// into it.
async fn begin_ack_send(
    coord: &(impl ShareTransactionalProducer + ShareTransactionCoordinator),
    c: &mut impl ShareConsumer,
    n: u64,
) -> TransactionHandle {
    let txn = coord.begin_transaction(&txn_id(n), TXN_TIMEOUT).await.unwrap();
    let got = poll(c, 1).await;
    coord.send(&txn, vec![ProducerRecord::new(OUT, 0, "out")]).await.unwrap();
    c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap();
    txn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_list_shows_each_transaction_and_the_checkpoint_that_decides_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker_dir = dir.path().join("broker-dir");
    let (broker, coord, mut c) = live_broker(&broker_dir, 3).await;
    // T(1) committed; T(2) PREPARE with one ack and one output record, named by
    // checkpoint 2's manifest; T(3) ONGOING, named by none.
    let t1 = begin_ack_send(&coord, &mut c, 1).await;
    coord.prepare_transaction(&t1.id).await.unwrap();
    coord.commit_transaction(&t1.id).await.unwrap();
    let t2 = begin_ack_send(&coord, &mut c, 2).await;
    coord.prepare_transaction(&t2.id).await.unwrap();
    let _t3 = begin_ack_send(&coord, &mut c, 3).await;

    let root = format!("file://{}", dir.path().join("checkpoints").display());
    for n in [1, 2] {
        publish_checkpoint(&root, n).await;
    }

    let d = broker_dir.display().to_string();
    let (code, stdout, stderr) = txn_list(&["--dir", &d, "--group", GROUP, "--checkpoints", &root, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let row = |n: u64| rows.as_array().unwrap().iter().find(|r| r["id"] == txn_id(n).to_string()).cloned().unwrap();
    let (r1, r2, r3) = (row(1), row(2), row(3));
    assert_eq!(
        (r1["state"].as_str(), r2["state"].as_str(), r3["state"].as_str()),
        (Some("COMMITTED"), Some("PREPARE"), Some("ONGOING"))
    );
    assert_eq!(r2["decided_by"], "checkpoint 2", "{r2}");
    assert_eq!(r3["decided_by"], "no manifest: recovery aborts it", "{r3}");
    assert_eq!((r2["pending_acks"].as_u64(), r2["produced"].as_u64()), (Some(1), Some(1)), "{r2}");
    assert_eq!(r1["pending_acks"], 0, "a decided transaction stages nothing: {r1}");
    assert_eq!(r3["timeout_seconds"], TXN_TIMEOUT.as_secs_f64(), "{r3}");
    assert!(r3["age_seconds"].as_f64().is_some_and(|a| (0.0..60.0).contains(&a)), "{r3}");

    // The table, and the filters.
    let (code, table, _) = txn_list(&["--dir", &d]);
    assert_eq!(code, 0);
    assert!(table.starts_with("transaction "), "{table}");
    assert_eq!(table.lines().count(), 4, "a header and three transactions: {table}");
    let (code, none, _) = txn_list(&["--dir", &d, "--group", GROUP, "--prefix", "other", "--json"]);
    assert_eq!((code, none.trim()), (0, "[]"));
    // Bad input is named before anything is read.
    let (code, _, stderr) = txn_list(&["--dir", &d, "--prefix", PREFIX]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--prefix needs --group"), "{stderr}");
    let (code, _, stderr) = txn_list(&["--dir", &dir.path().join("nothing").display().to_string()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no embedded broker in"), "{stderr}");
    let (code, _, stderr) = txn_list(&["--dir", &d, "--bogus"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unexpected argument '--bogus'"), "{stderr}");

    // Resolve: refused while the broker is live, planned by a dry run, then carried out.
    let resolve = |extra: &[&str]| {
        let mut args =
            vec!["resolve", "--dir", d.as_str(), "--checkpoints", root.as_str(), "--group", GROUP, "--prefix", PREFIX];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow")).arg("txn").args(&args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, _, stderr) = resolve(&[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(&format!("pid {}", std::process::id())), "names the live broker's holder: {stderr}");
    let (code, planned, stderr) = resolve(&["--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        planned.lines().collect::<Vec<_>>(),
        vec![
            format!("would commit: {} (embedded-broker)", txn_id(2)),
            format!("would abort: {} (embedded-broker)", txn_id(3)),
        ],
        "{planned}"
    );
    broker.close();
    drop(broker);
    let (code, done, stderr) = resolve(&["--json"]);
    assert_eq!(code, 0, "{stderr}");
    let done: serde_json::Value = serde_json::from_str(done.trim()).unwrap();
    assert_eq!(done.as_array().unwrap().len(), 2, "{done}");
    let (_, after, _) = txn_list(&["--dir", &d, "--group", GROUP, "--json"]);
    let after: serde_json::Value = serde_json::from_str(after.trim()).unwrap();
    let state =
        |n: u64| after.as_array().unwrap().iter().find(|r| r["id"] == txn_id(n).to_string()).unwrap()["state"].clone();
    assert_eq!((state(2), state(3)), ("COMMITTED".into(), "ABORTED".into()), "{after}");
    // Nothing is left to do.
    let (code, again, _) = resolve(&[]);
    assert_eq!((code, again.trim()), (0, format!("nothing pending under {GROUP}-{PREFIX}").as_str()));
}

/// A job `job` checkpointing to `file://` under `dir`, and two subtasks' states of the
/// given sizes.
fn store_and_states(
    dir: &std::path::Path,
    sizes: [usize; 2],
) -> (String, CheckpointStore, Vec<(String, u32, bytes::Bytes)>) {
    let root = format!("file://{}", dir.display());
    let store = CheckpointStore::from_url(&root, &[], "job").unwrap();
    let states = vec![
        ("counter".to_string(), 0, bytes::Bytes::from(vec![7u8; sizes[0]])),
        ("counter".to_string(), 1, bytes::Bytes::from(vec![9u8; sizes[1]])),
    ];
    (root, store, states)
}

/// `shareflow checkpoints` counts a checkpoint's states and bytes from its manifest,
/// inline ones included, beside the files it found in storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_lists_inline_states_and_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store, states) = store_and_states(dir.path(), [1_000, 3_000]);
    // Checkpoint 1 inlines both; checkpoint 2 puts both in its shared object.
    let one = store.commit_checkpoint(1, &states, Vec::new(), 1 << 20).await.unwrap();
    let two = store.commit_checkpoint(2, &states, Vec::new(), 0).await.unwrap();
    assert_eq!(one.state_bytes(), 4_000);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
        .args(["checkpoints", "--checkpoints", &root, "--job", "job"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let row = |id: &str| -> Vec<String> {
        let line =
            stdout.lines().find(|l| l.split_whitespace().next() == Some(id)).unwrap_or_else(|| panic!("{stdout}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    // checkpoint, status, states, inline, files, state bytes
    assert_eq!(row("1")[1..6], ["Complete", "2", "2", "0", "4000"], "{stdout}");
    assert_eq!(row("2")[1..6], ["Complete", "2", "0", "1", &two.state_bytes().to_string()], "{stdout}");
    assert!(two.state_bytes() > 4_000, "shared sections carry their envelopes");
}

/// `checkpoints inspect` reads every state file back: a flipped byte fails its CRC and
/// the command, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_inspect_finds_a_damaged_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store, states) = store_and_states(dir.path(), [1_000, 1_000]);
    store.commit_checkpoint(1, &states, Vec::new(), 0).await.unwrap();
    let inspect = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .args(["checkpoints", "inspect", "1", "--checkpoints", &root, "--job", "job"])
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = inspect();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().filter(|l| l.contains("counter") && l.ends_with("verified")).count(), 2, "{out}");
    // Both states went into the checkpoint's one shared object: flip the last byte of
    // subtask 1's section.
    let chk = dir.path().join("job").join(format!("chk-{:020}", 1));
    let names: Vec<String> =
        std::fs::read_dir(&chk).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    assert!(names.contains(&shareflow::checkpoint::SHARED_STATE_NAME.to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("counter")), "no file per subtask: {names:?}");
    let manifest = store.read_manifest(1).await.unwrap();
    let one = manifest.state_files.iter().find(|f| f.subtask == 1).unwrap();
    let file = chk.join(shareflow::checkpoint::SHARED_STATE_NAME);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = (one.offset.unwrap() + one.size - 1) as usize;
    bytes[last] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let (code, out, err) = inspect();
    assert_eq!(code, 1, "{out}");
    // Only subtask 1's section fails; subtask 0's, in the same object, still verifies.
    assert_eq!(out.lines().filter(|l| l.contains("counter") && l.contains("FAILS")).count(), 1, "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("counter") && l.ends_with("verified")).count(), 1, "{out}");
    assert!(err.contains("1 state file(s) of checkpoint 1 fail verification"), "{err}");
}

/// `txn commit|abort ID` decides one transaction by hand, and refuses what the job's
/// checkpoints decided otherwise unless `--force`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_commit_and_abort_follow_the_manifests_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let broker_dir = dir.path().join("broker-dir");
    let (broker, coord, mut c) = live_broker(&broker_dir, 4).await;
    // T(2) PREPARE, decided by checkpoint 2; T(3) ONGOING and T(4) PREPARE, both above
    // the newest complete checkpoint.
    let t2 = begin_ack_send(&coord, &mut c, 2).await;
    coord.prepare_transaction(&t2.id).await.unwrap();
    let _t3 = begin_ack_send(&coord, &mut c, 3).await;
    let t4 = begin_ack_send(&coord, &mut c, 4).await;
    coord.prepare_transaction(&t4.id).await.unwrap();
    let root = format!("file://{}", dir.path().join("checkpoints").display());
    publish_checkpoint(&root, 2).await;
    let d = broker_dir.display().to_string();
    let id = |n: u64| txn_id(n).to_string();
    let run = |op: &str, id: &str, extra: &[&str]| {
        let mut args = vec![op, id, "--dir", d.as_str(), "--group", GROUP, "--checkpoints", root.as_str()];
        args.extend_from_slice(extra);
        txn(&args)
    };
    // The manifests allow it, but the job's broker still holds the directory.
    let (code, _, stderr) = run("commit", &id(2), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(&format!("pid {}", std::process::id())), "names the live broker's holder: {stderr}");
    broker.close();
    drop(broker);

    // An ONGOING transaction cannot commit, whatever the manifests say.
    let (code, _, stderr) = run("commit", &id(3), &["--force"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("never prepared"), "{stderr}");
    // Against the manifests: refused, saying why, and nothing changes.
    let (code, _, stderr) = run("commit", &id(3), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("no complete checkpoint decides") && stderr.contains("newest complete checkpoint is 2"),
        "{stderr}"
    );
    let (code, _, stderr) = run("abort", &id(2), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("complete checkpoint 2 covers"), "{stderr}");
    // With the manifests: carried out. (Taking the prefix aborts what never prepared,
    // as a restart would, so T(3) goes first.)
    let (code, out, stderr) = run("abort", &id(3), &["--json"]);
    assert_eq!(code, 0, "{stderr}");
    let out: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((out["action"].as_str(), out["forced"].as_bool()), (Some("aborted"), Some(false)), "{out}");
    let (code, out, stderr) = run("commit", &id(2), &[]);
    assert_eq!((code, out.trim()), (0, format!("committed {} (embedded-broker)", id(2)).as_str()), "{stderr}");
    // Forced: committed against the manifests, with a warning.
    let (code, out, stderr) = run("commit", &id(4), &["--force"]);
    assert_eq!((code, out.trim()), (0, format!("committed {} (embedded-broker)", id(4)).as_str()), "{stderr}");
    assert!(stderr.contains("exactly-once does not hold"), "{stderr}");
    let (_, after, _) = txn_list(&["--dir", &d, "--group", GROUP, "--json"]);
    let after: serde_json::Value = serde_json::from_str(after.trim()).unwrap();
    let state = |n: u64| after.as_array().unwrap().iter().find(|r| r["id"] == id(n)).unwrap()["state"].clone();
    assert_eq!((state(2), state(3), state(4)), ("COMMITTED".into(), "ABORTED".into(), "COMMITTED".into()), "{after}");

    // Bad input, each named: a decided id, an unknown one, a malformed one, a missing option.
    let (code, _, stderr) = run("abort", &id(3), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(&format!("no open transaction {}", id(3))), "{stderr}");
    let (code, _, stderr) = run("abort", &id(99), &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(&format!("no open transaction {}", id(99))), "{stderr}");
    let (code, _, stderr) = run("commit", "not-a-transaction", &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("txn commit not-a-transaction"), "{stderr}");
    let (code, _, stderr) = txn(&["abort", &id(3), "--dir", &d, "--checkpoints", &root]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("needs --group G"), "{stderr}");
    let (code, _, stderr) = txn(&["abort", &id(3), "--dir", &d, "--group", GROUP]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("needs --checkpoints URL"), "{stderr}");
}
