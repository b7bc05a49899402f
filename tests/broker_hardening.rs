//! Issue 15: the embedded broker as strict as the seed, and no way to lose a live
//! broker's data. One test (or more) per numbered item; each failed before its fix.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
use shareflow::connector::broker::{BrokerMetrics, BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::AcknowledgeType::*;
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use shareflow::connector::Error;
use support::*;

/// One full checkpoint's transaction: poll `n`, output them, ack them into T(id),
/// prepare, commit.
async fn commit_one(
    f: &Fixture,
    coord: &(impl ShareTransactionalProducer + ShareTransactionCoordinator),
    c: &mut impl ShareConsumer,
    id: u64,
) {
    let txn = coord.begin_transaction(&txn_id(id), TXN_TIMEOUT).await.unwrap();
    let got = poll(c, 1).await;
    let out = got.iter().map(|r| ProducerRecord::new(OUT, 0, r.value.clone().unwrap())).collect();
    coord.send(&txn, out).await.unwrap();
    c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap();
    coord.prepare_transaction(&txn.id).await.unwrap();
    coord.commit_transaction(&txn.id).await.unwrap();
    let _ = f;
}

// ---- 1. The directory lock and the read-only open ----

#[tokio::test]
async fn a_second_read_write_open_is_refused_naming_the_directory_and_holder() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    let err = EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap()).await.unwrap_err();
    match &err {
        Error::DirectoryLocked { dir: d, holder } => {
            assert!(d.contains(&dir.path().display().to_string()), "{err}");
            assert_eq!(holder, &format!("pid {}", std::process::id()), "{err}");
        }
        other => panic!("expected DirectoryLocked, got {other}"),
    }
    // Closing releases it.
    f.broker.close();
    EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap()).await.unwrap();
}

/// A child process being spawned holds a copy of every descriptor until its `exec`,
/// the directory lock's among them. A broker closed in that moment is not held by
/// anyone here any more: reopening it waits for the copy to go instead of failing.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(unsafe_code)]
async fn reopening_waits_for_a_spawning_childs_copy_of_the_lock() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    // The child tells us through a pipe that it has forked (and so holds its copy of
    // the lock) before we close; then it sleeps before its exec.
    let (mut forked_rx, forked_tx) = std::io::pipe().unwrap();
    let child = std::thread::spawn(move || {
        let mut command = std::process::Command::new("true");
        // SAFETY: the hook only writes one byte to a pipe and sleeps (write and
        // nanosleep are async-signal-safe, nothing allocates); it keeps the forked
        // child, with its copy of the lock, from reaching exec for 400 ms.
        unsafe {
            command.pre_exec(move || {
                use std::io::Write;
                (&forked_tx).write_all(b"f")?;
                std::thread::sleep(std::time::Duration::from_millis(400));
                Ok(())
            });
        }
        command.status().unwrap()
    });
    let mut byte = [0u8; 1];
    tokio::task::block_in_place(|| std::io::Read::read_exact(&mut forked_rx, &mut byte)).unwrap();
    f.broker.close();
    let reopened = EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap()).await;
    assert!(reopened.is_ok(), "the child's copy went at its exec: {:?}", reopened.err());
    assert!(child.join().unwrap().success());
    // A live broker of this process is still refused.
    let err = EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap()).await.unwrap_err();
    assert!(matches!(err, Error::DirectoryLocked { .. }), "{err}");
}

#[tokio::test]
async fn a_read_only_open_changes_nothing_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    f.produce(0, 3).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let files_before = tree(dir.path());
    let lsn_before = f.broker.journal_last_lsn();

    // While the live broker holds the directory, and with the clock far past the
    // transaction's timeout (the live broker has not noticed yet).
    f.advance(TXN_TIMEOUT * 2);
    let ro = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir.path()).unwrap().clock(f.clock.clone()))
        .await
        .unwrap();
    let txns = ro.transactions().await.unwrap();
    assert_eq!(txns.len(), 1);
    assert_eq!(txns[0].state, TransactionState::Aborted, "the view applies the timeout in memory");
    assert!(matches!(ro.create_topic("x", 1).await, Err(Error::ReadOnly { .. })));
    assert!(matches!(ro.consumer(GROUP, config(Explicit)).await, Err(Error::ReadOnly { .. })));
    assert_eq!(tree(dir.path()), files_before, "a read-only open writes nothing");
    assert_eq!(f.broker.journal_last_lsn(), lsn_before);
}

/// The bug: `txn list` opened the directory read-write, journaled `Restarted` and
/// repaired the tail under a live broker, which then appended to an unlinked file.
/// Now a live broker and `shareflow txn list` in a loop (a real process) coexist, and
/// every acknowledged commit survives a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_list_in_a_loop_beside_a_live_broker_loses_no_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::on_local_dir(dir.path(), 1, config(Transactional)).await;
    // At least 40 commits, and more until `txn list` ran twice beside them: one run of
    // the binary can outlast 40 commits on a loaded machine.
    const COMMITS: u64 = 40;
    const INPUT: u64 = 2_000;
    f.produce(0, INPUT as usize).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let lister = {
        let (stop, runs) = (stop.clone(), runs.clone());
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && runs.load(std::sync::atomic::Ordering::Relaxed) < 200
                && started.elapsed() < Duration::from_secs(60)
            {
                let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
                    .args(["txn", "list", "--dir"])
                    .arg(&dir)
                    .output()
                    .unwrap();
                assert!(out.status.success(), "txn list failed: {}", String::from_utf8_lossy(&out.stderr));
                runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let started = std::time::Instant::now();
    let mut commits = 0;
    while commits < INPUT
        && (commits < COMMITS || runs.load(std::sync::atomic::Ordering::Relaxed) < 2)
        && started.elapsed() < Duration::from_secs(60)
    {
        commits += 1;
        commit_one(&f, &coord, &mut c, commits).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    lister.join().unwrap();
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    assert!(runs >= 2, "txn list ran only {runs} times beside the live broker ({commits} commits)");

    f.restart().await;
    let out = f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap();
    assert_eq!(out.len() as u64, commits, "every acknowledged commit survives ({runs} concurrent txn list runs)");
    let committed = f.broker.transactions().await.unwrap();
    assert_eq!(committed.iter().filter(|t| t.state == TransactionState::Committed).count() as u64, commits);
}

fn tree(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path().display().to_string(), meta.len()));
            }
        }
    }
    out.sort();
    out
}

// ---- 1b. Every state a kill can leave opens ----

/// A kill between creating the next segment (`create_new`) and writing its first frame
/// left an empty file named after the next lsn; the broker could then never append.
#[tokio::test]
async fn an_empty_segment_left_by_a_kill_opens_and_the_broker_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    f.produce(0, 2).await;
    let next = f.broker.journal_last_lsn() + 1;
    f.broker.close();
    let empty = dir.path().join("broker/wal").join(format!("{next:020}.seg"));
    std::fs::File::create(&empty).unwrap();
    f.restart().await;
    f.produce(0, 3).await;
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 5);
    f.restart().await;
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 5, "writes after the empty segment survive");
}

#[tokio::test]
async fn an_unfinished_snapshot_upload_is_ignored_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    f.produce(0, 2).await;
    f.broker.close();
    let snapshots = dir.path().join("broker/snapshot");
    std::fs::create_dir_all(&snapshots).unwrap();
    let temp = snapshots.join("00000000000000000099.snap#3");
    std::fs::write(&temp, b"half a snapshot").unwrap();
    f.restart().await;
    assert!(!temp.exists(), "the temporary upload is removed");
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 2);
}

/// A torn tail is cut back in place (the same file, truncated and fsynced), not by
/// writing a new file over it.
#[tokio::test]
async fn a_torn_tail_is_cut_back_in_place() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    f.produce(0, 2).await;
    f.broker.close();
    let wal = dir.path().join("broker/wal");
    let segment = std::fs::read_dir(&wal).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let good_len = std::fs::metadata(&segment).unwrap().len();
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
        file.write_all(b"SFJE\x02\x00").unwrap(); // a frame header cut short
    }
    let inode = std::fs::metadata(&segment).unwrap().ino();
    f.restart().await;
    let meta = std::fs::metadata(&segment).unwrap();
    assert_eq!((meta.len(), meta.ino()), (good_len, inode));
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 2);
}

// ---- 2. Nothing changes before it is durable; a poisoned journal refuses everything ----

#[tokio::test]
async fn a_failed_commit_write_is_never_visible_and_poisons_the_broker() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 7));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let f = Fixture::on_store(store.clone(), 1, config(Transactional)).await;
    f.produce(0, 1).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let got = poll(&mut c, 1).await;
    coord.send(&txn, vec![ProducerRecord::new(OUT, 0, "x")]).await.unwrap();
    c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap();
    coord.prepare_transaction(&txn.id).await.unwrap();

    faulty.inject(FaultRule::always(StoreOp::Put, "wal", Fault::Error));
    assert!(coord.commit_transaction(&txn.id).await.is_err(), "the commit cannot be journaled");
    // Memory may hold COMMITTED, but nobody may see it: every call fails now.
    assert!(f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.is_err());
    assert!(f.broker.record_status(GROUP, &tp(0), 0).await.is_err());
    assert!(f.broker.metrics().await.is_err());
    assert!(coord.list_pending_transactions(GROUP).await.is_err());
    assert!(f.broker.produce(vec![ProducerRecord::new(IN, 0, "y")]).await.is_err(), "writes refuse too");

    faulty.clear();
    let reopened = f.reopen().await.unwrap();
    assert_eq!(reopened.transaction_state(&txn_id(1)).await.unwrap(), TransactionState::Prepare);
    assert!(reopened.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap().is_empty());
    assert_eq!(reopened.record_status(GROUP, &tp(0), 0).await.unwrap().state, RecordState::Locked);
}

// ---- 4 and 5. What is journaled ----

#[tokio::test]
async fn an_acquire_that_only_archives_aborted_records_is_journaled() {
    let cfg = ShareConfig::builder().isolation_level(IsolationLevel::ReadCommitted).build().unwrap();
    let mut f = Fixture::new(1, cfg).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    // Records written to the input inside a transaction that aborts.
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.send(&txn, vec![ProducerRecord::new(IN, 0, "a"), ProducerRecord::new(IN, 0, "b")]).await.unwrap();
    coord.abort_transaction(&txn.id).await.unwrap();
    let mut c = f.consumer(Explicit).await;
    assert!(poll(&mut c, 10).await.is_empty());
    assert_eq!(f.broker.metrics().await.unwrap().records_archived_aborted_transaction, 2);

    f.restart().await;
    let status = f.broker.record_status(GROUP, &tp(0), 0).await.unwrap();
    assert_eq!((status.state, status.archive_reason), (RecordState::Archived, Some(ArchiveReason::AbortedTransaction)));
    let mut c = f.consumer(Explicit).await;
    assert!(poll(&mut c, 10).await.is_empty());
    assert_eq!(
        f.broker.metrics().await.unwrap().records_archived_aborted_transaction,
        0,
        "replay does not archive (or count) them a second time"
    );
}

#[tokio::test]
async fn a_tick_journals_only_when_something_expired() {
    let f = Fixture::new(1, config(Explicit)).await;
    f.produce(0, 1).await;
    let before = f.broker.journal_last_lsn();
    f.broker.tick().await.unwrap();
    f.broker.tick().await.unwrap();
    assert_eq!(f.broker.journal_last_lsn(), before, "nothing expired: nothing journaled");
    let mut c = f.consumer(Explicit).await;
    poll(&mut c, 1).await;
    let before = f.broker.journal_last_lsn();
    f.advance(LOCK + Duration::from_secs(1));
    f.broker.tick().await.unwrap();
    assert_eq!(f.broker.journal_last_lsn(), before + 1, "the lock expiry is journaled once");
    assert_eq!(f.state(0, 0).await, RecordState::Available);
}

// ---- 6. share.transaction.timeout.ms is the maximum ----

#[tokio::test]
async fn begin_refuses_a_timeout_above_the_groups_maximum() {
    let f = Fixture::new(1, config(Transactional)).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let err = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT + Duration::from_millis(1)).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("60001 ms") && text.contains("1..=60000 ms"), "{text}");
    assert!(text.contains("share.transaction.timeout.ms"), "{text}");
    assert!(coord.begin_transaction(&txn_id(1), Duration::from_secs(u64::MAX)).await.is_err());
    coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    // No timeout asked: the group's (60 s).
    coord.begin_transaction(&txn_id(2), Duration::ZERO).await.unwrap();
    f.advance(TXN_TIMEOUT - Duration::from_millis(1));
    assert_eq!(f.broker.transaction_state(&txn_id(2)).await.unwrap(), TransactionState::Ongoing);
    f.advance(Duration::from_millis(1));
    assert_eq!(f.broker.transaction_state(&txn_id(2)).await.unwrap(), TransactionState::Aborted);
}

// ---- 7. The delivery limit across a restart ----

/// Decision 0003, "Restart": the delivery a restart cuts short counts. A record held at
/// the limit is ARCHIVED; one below it comes back AVAILABLE with its count, and is next
/// delivered with count + 1. Downtime shorter or longer than the lock changes nothing.
#[tokio::test]
async fn a_restart_counts_the_cut_delivery_whatever_the_downtime() {
    for downtime in [Duration::from_secs(1), LOCK * 3] {
        let cfg = ShareConfig::builder().delivery_count_limit(2).build().unwrap();
        let mut f = Fixture::new(1, cfg).await;
        f.produce(0, 2).await;
        let mut c = f.consumer(Explicit).await;
        // Offset 0 reaches delivery 2 (the limit), offset 1 stays at delivery 1.
        let got = poll(&mut c, 2).await;
        c.acknowledge(&got[0], Release).await.unwrap();
        c.commit().await.unwrap();
        let again = poll(&mut c, 1).await;
        assert_eq!((again[0].offset, again[0].delivery_count), (0, 2));

        f.advance(downtime);
        f.restart().await;
        let at_limit = f.broker.record_status(GROUP, &tp(0), 0).await.unwrap();
        assert_eq!(
            (at_limit.state, at_limit.archive_reason),
            (RecordState::Archived, Some(ArchiveReason::DeliveryLimit)),
            "downtime {downtime:?}"
        );
        let below = f.broker.record_status(GROUP, &tp(0), 1).await.unwrap();
        assert_eq!((below.state, below.delivery_count), (RecordState::Available, 1), "downtime {downtime:?}");
        let mut c = f.consumer(Explicit).await;
        let got = poll(&mut c, 10).await;
        assert_eq!(got.iter().map(|r| (r.offset, r.delivery_count)).collect::<Vec<_>>(), vec![(1, 2)]);
    }
}

// ---- 8. Transactional mode at the broker ----

#[tokio::test]
async fn a_transactional_group_refuses_plain_accept_at_the_broker() {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 2).await;
    // An explicit-mode client does not check: the broker must.
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 2).await;
    c.acknowledge(&got[0], Accept).await.unwrap();
    let err = c.commit().await.unwrap_err();
    assert!(err.to_string().contains("share.acknowledgement.mode=transactional"), "{err}");
    assert_eq!(f.state(0, 0).await, RecordState::Acquired, "nothing was acknowledged");
    // RELEASE outside a transaction stays allowed.
    c.acknowledge(&got[1], Release).await.unwrap();
    c.commit().await.unwrap();
    assert_eq!(f.state(0, 1).await, RecordState::Available);
}

// ---- 9. Config validated wherever it enters ----

#[tokio::test]
async fn a_member_config_that_conflicts_with_the_group_is_refused_naming_the_key() {
    let f = Fixture::new(1, ShareConfig::builder().delivery_count_limit(3).build().unwrap()).await;
    let err = f.broker.consumer(GROUP, config(Explicit)).await.unwrap_err();
    match &err {
        Error::InvalidConfig { key, value, rule } => {
            assert_eq!((key.as_str(), value.as_str()), ("group.share.delivery.count.limit", "5"));
            assert!(rule.contains("=3"), "{rule}");
        }
        other => panic!("expected InvalidConfig, got {other}"),
    }
    // The group's own config with another mode joins.
    f.broker.consumer(GROUP, f.group_config.clone().with_acknowledgement_mode(Transactional)).await.unwrap();
}

#[test]
fn a_config_decoded_with_serde_is_validated() {
    let good = ShareConfig::default();
    let mut json = serde_json::to_value(&good).unwrap();
    json["record_lock_duration_ms"] = serde_json::json!(5);
    let err = serde_json::from_value::<ShareConfig>(json).unwrap_err();
    assert!(err.to_string().contains("group.share.record.lock.duration.ms"), "{err}");
}

// ---- 10. Reads see the passage of time, and only their group ----

#[tokio::test]
async fn reads_apply_timeouts_before_answering() {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 1).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let got = poll(&mut c, 1).await;
    c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap();
    f.advance(TXN_TIMEOUT + Duration::from_secs(1));
    // No write, no tick: the reads themselves must see the timeout.
    assert!(coord.list_pending_transactions(GROUP).await.unwrap().is_empty());
    assert_eq!(f.broker.metrics().await.unwrap().transaction_active, 0);
    assert_eq!(f.state(0, 0).await, RecordState::Available);
    assert_eq!(f.broker.metrics().await.unwrap().transaction_timeout_total, 1);
}

#[tokio::test]
async fn list_pending_refuses_another_group() {
    let f = Fixture::new(1, config(Transactional)).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let err = coord.list_pending_transactions("someone-else").await.unwrap_err();
    assert!(err.to_string().contains("someone-else"), "{err}");
}

// ---- 11. Retention of decided transactions ----

#[tokio::test]
async fn decided_transactions_are_removed_after_retention_and_aborted_output_stays_hidden() {
    let retention = Duration::from_secs(120);
    let cfg = ShareConfig::builder().transaction_retention(retention).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let t1 = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.send(&t1, vec![ProducerRecord::new(OUT, 0, "committed")]).await.unwrap();
    coord.prepare_transaction(&t1.id).await.unwrap();
    coord.commit_transaction(&t1.id).await.unwrap();
    let t2 = coord.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    coord.send(&t2, vec![ProducerRecord::new(OUT, 0, "aborted")]).await.unwrap();
    coord.abort_transaction(&t2.id).await.unwrap();
    coord.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&txn_id(3)).await.unwrap();
    assert_eq!(f.broker.transaction_count().await.unwrap(), 3);

    f.advance(retention - Duration::from_secs(1));
    assert_eq!(f.broker.transaction_count().await.unwrap(), 3, "kept until retention passes");
    assert!(coord.commit_transaction(&t1.id).await.is_ok(), "a repeated commit is still a no-op");
    f.advance(Duration::from_secs(2));
    let left: Vec<_> = f.broker.transactions().await.unwrap().into_iter().map(|t| (t.id, t.state)).collect();
    assert_eq!(left, vec![(txn_id(3), TransactionState::Prepare)], "PREPARE is never removed");
    assert!(matches!(coord.commit_transaction(&t1.id).await, Err(Error::UnknownTransaction { .. })));
    let reused = coord.begin_transaction(&t1.id, TXN_TIMEOUT).await.unwrap_err();
    assert!(reused.to_string().contains("never reused"), "a removed id is still never begun again: {reused}");
    assert_eq!(f.broker.highest_checkpoint_id(GROUP, PREFIX).await.unwrap(), Some(3));
    let out = f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap();
    let values: Vec<&[u8]> = out.iter().filter_map(|r| r.value.as_deref()).collect();
    assert_eq!(values, vec![&b"committed"[..]], "the aborted output stays hidden once its transaction is gone");
}

// ---- Seed elements without a test until now ----

#[tokio::test]
async fn single_record_acknowledge_transactional_commits() {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 2).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let got = poll(&mut c, 2).await;
    c.acknowledge_transactional(&got[0], Accept, &txn).await.unwrap();
    c.acknowledge_transactional(&got[1], Reject, &txn).await.unwrap();
    assert_eq!(f.broker.record_status(GROUP, &tp(0), 0).await.unwrap().transaction, Some(txn_id(1)));
    coord.prepare_transaction(&txn.id).await.unwrap();
    coord.commit_transaction(&txn.id).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged);
    let rejected = f.broker.record_status(GROUP, &tp(0), 1).await.unwrap();
    assert_eq!((rejected.state, rejected.archive_reason), (RecordState::Archived, Some(ArchiveReason::Rejected)));
}

/// Decision 0003, "RENEW and transactions": a LOCKED record is governed by the
/// transaction timeout, so there is nothing to renew. RENEW cannot be staged into a
/// transaction, and RENEW of a LOCKED record outside one is refused.
#[tokio::test]
async fn renew_is_refused_into_a_transaction_and_on_a_locked_record() {
    let f = Fixture::new(1, config(Explicit)).await;
    f.produce(0, 2).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let got = poll(&mut c, 2).await;
    let err = c.acknowledge_transactional(&got[0], Renew, &txn).await.unwrap_err();
    assert!(err.to_string().contains("only ACCEPT and REJECT can be staged"), "{err}");
    assert_eq!(f.state(0, 0).await, RecordState::Acquired);

    c.acknowledge_transactional(&got[1], Accept, &txn).await.unwrap();
    c.acknowledge(&got[1], Renew).await.unwrap();
    let err = c.commit().await.unwrap_err();
    assert!(matches!(err, Error::NotAcquired { state: RecordState::Locked, .. }), "{err}");
    assert_eq!(f.state(0, 1).await, RecordState::Locked);
}

#[tokio::test]
async fn locked_to_archived_at_the_delivery_limit() {
    let f = Fixture::new(1, ShareConfig::builder().delivery_count_limit(2).build().unwrap()).await;
    f.produce(0, 1).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 1).await;
    c.acknowledge(&got[0], Release).await.unwrap();
    c.commit().await.unwrap();
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let got = poll(&mut c, 1).await;
    assert_eq!(got[0].delivery_count, 2);
    c.acknowledge_transactional(&got[0], Accept, &txn).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Locked);
    coord.abort_transaction(&txn.id).await.unwrap();
    let status = f.broker.record_status(GROUP, &tp(0), 0).await.unwrap();
    assert_eq!((status.state, status.archive_reason), (RecordState::Archived, Some(ArchiveReason::DeliveryLimit)));
}

#[tokio::test]
async fn begin_of_a_prepared_transaction_returns_the_existing_one() {
    let f = Fixture::new(1, config(Transactional)).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let first = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&txn_id(1)).await.unwrap();
    let again = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(f.broker.transaction_state(&txn_id(1)).await.unwrap(), TransactionState::Prepare);
    // It stays closed to writes.
    assert!(coord.send(&again, vec![ProducerRecord::new(OUT, 0, "late")]).await.is_err());
    // A decided id is never begun again.
    coord.commit_transaction(&txn_id(1)).await.unwrap();
    assert!(matches!(
        coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await,
        Err(Error::IllegalTransition { state: TransactionState::Committed, .. })
    ));
}

#[tokio::test]
async fn max_pending_counts_every_prefix_of_the_group() {
    let cfg = ShareConfig::builder().max_pending_transactions(2).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    let a = f.broker.transaction_coordinator(GROUP, "a").await.unwrap();
    let b = f.broker.transaction_coordinator(GROUP, "b").await.unwrap();
    let id = |p: &str, n| TransactionId::new(GROUP, p, n).unwrap();
    a.begin_transaction(&id("a", 1), TXN_TIMEOUT).await.unwrap();
    b.begin_transaction(&id("b", 1), TXN_TIMEOUT).await.unwrap();
    let err = a.begin_transaction(&id("a", 2), TXN_TIMEOUT).await.unwrap_err();
    match &err {
        Error::TooManyPendingTransactions { pending, max, ids, .. } => {
            assert_eq!((*pending, *max), (2, 2));
            assert!(ids.contains(&id("b", 1).to_string()), "{err}");
        }
        other => panic!("expected TooManyPendingTransactions, got {other}"),
    }
    // Another group has its own budget.
    let other = f.broker.transaction_coordinator("other", "a").await.unwrap();
    other.begin_transaction(&TransactionId::new("other", "a", 1).unwrap(), TXN_TIMEOUT).await.unwrap();
}

#[tokio::test]
async fn the_seeds_example_id_works_end_to_end() {
    let f = Fixture::new(1, config(Transactional)).await;
    let group = "my-share-group";
    let coord = f.broker.transaction_coordinator(group, "flink-job").await.unwrap();
    let id = TransactionId::parse("my-share-group-flink-job-42", group).unwrap();
    assert_eq!((id.prefix(), id.checkpoint_id()), ("flink-job", 42));
    coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&id).await.unwrap();
    let pending = coord.list_pending_transactions(group).await.unwrap();
    assert_eq!(pending[0].id.to_string(), "my-share-group-flink-job-42");
    coord.commit_transaction(&id).await.unwrap();
}

#[tokio::test]
async fn the_five_seed_metrics_have_their_exact_names_and_types() {
    use shareflow::connector::broker::MetricValue;
    let f = Fixture::new(1, config(Transactional)).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&txn_id(1)).await.unwrap();
    coord.commit_transaction(&txn_id(1)).await.unwrap();
    coord.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    let metrics = f.broker.metrics().await.unwrap().metrics();
    let find = |name: &str| metrics.iter().find(|m| m.name == name).map(|m| m.value.clone());
    assert_eq!(find("share-transaction-active"), Some(MetricValue::Gauge(1)));
    assert!(matches!(find("share-transaction-prepare-time-ms"), Some(MetricValue::Histogram(h)) if h.count == 1));
    assert!(matches!(find("share-transaction-commit-time-ms"), Some(MetricValue::Histogram(h)) if h.count == 1));
    assert_eq!(find("share-transaction-abort-total"), Some(MetricValue::Counter(0)));
    assert_eq!(find("share-transaction-timeout-total"), Some(MetricValue::Counter(0)));
    let names: Vec<&str> = metrics.iter().take(5).map(|m| m.name).collect();
    assert_eq!(
        names,
        [
            "share-transaction-active",
            "share-transaction-prepare-time-ms",
            "share-transaction-commit-time-ms",
            "share-transaction-abort-total",
            "share-transaction-timeout-total"
        ]
    );
}

// ---- Review findings ----

/// The default config of unconfigured groups is journaled: a read-only open with other
/// options (as `shareflow txn list` makes) replays the same state.
#[tokio::test]
async fn replay_does_not_depend_on_the_options_of_a_later_open() {
    let dir = tempfile::tempdir().unwrap();
    let custom =
        ShareConfig::builder().delivery_count_limit(3).transaction_timeout(Duration::from_secs(120)).build().unwrap();
    let broker = EmbeddedBroker::open(BrokerOptions::local_dir(dir.path()).unwrap().default_config(custom.clone()))
        .await
        .unwrap();
    broker.create_topic(IN, 1).await.unwrap();
    broker.consumer("unconfigured", custom.clone()).await.unwrap();
    let coord = broker.transaction_coordinator("unconfigured", PREFIX).await.unwrap();
    let id = TransactionId::new("unconfigured", PREFIX, 1).unwrap();
    coord.begin_transaction(&id, Duration::from_secs(100)).await.unwrap();
    let ro = EmbeddedBroker::open_read_only(BrokerOptions::local_dir(dir.path()).unwrap()).await.unwrap();
    assert_eq!(ro.transaction_state(&id).await.unwrap(), TransactionState::Ongoing);
    assert_eq!(ro.group_config("unconfigured").await.unwrap(), custom);
}

/// A snapshot that cannot be written does not turn a durable command into an error.
#[tokio::test]
async fn a_failed_snapshot_does_not_fail_the_command() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 3));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let mut f = Fixture::on_store(store, 1, config(Explicit)).await;
    faulty.inject(FaultRule::always(StoreOp::Put, "snapshot", Fault::Error));
    // 200 produce calls of 32 KiB: past the snapshot threshold.
    for i in 0..200u8 {
        f.broker.produce(vec![ProducerRecord::new(IN, 0, vec![i; 32 * 1024])]).await.unwrap();
    }
    // Snapshots run in the background: wait (bounded) for the failed attempt.
    for _ in 0..3_000 {
        if !faulty.injected().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!faulty.injected().is_empty(), "a snapshot was tried and failed");
    faulty.clear();
    f.restart().await;
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 200);
}

/// A snapshot being written holds up neither the broker nor the caller whose command
/// started it: here its write never finishes, and 200 more commands still complete.
#[tokio::test]
async fn a_snapshot_being_written_blocks_no_command() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 3));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let f = Fixture::on_store(store, 1, config(Explicit)).await;
    faulty.inject(FaultRule::always(StoreOp::Put, "snapshot", Fault::Latency(Duration::from_secs(3600))));
    let commands = async {
        for i in 0..200u8 {
            f.broker.produce(vec![ProducerRecord::new(IN, 0, vec![i; 32 * 1024])]).await.unwrap();
        }
    };
    // A guard against a hang, not a measurement: the commands take well under a second.
    tokio::time::timeout(Duration::from_secs(60), commands)
        .await
        .expect("the commands waited for a snapshot write that never ends");
    // The snapshot is encoded on a blocking thread before its write starts: wait
    // (bounded) for the write to be under way.
    for _ in 0..3_000 {
        if !faulty.injected().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!faulty.injected().is_empty(), "a snapshot write was started");
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 200);
}

/// A poll that finds nothing leaves no share partition behind (it is not journaled, so
/// a replay would not have it either).
#[tokio::test]
async fn an_empty_poll_leaves_no_trace() {
    let mut f = Fixture::new(1, config(Explicit)).await;
    let mut c = f.consumer(Explicit).await;
    assert!(poll(&mut c, 5).await.is_empty());
    assert_eq!(f.broker.share_partition_info(GROUP, &tp(0)).await.unwrap(), None);
    f.restart().await;
    assert_eq!(f.broker.share_partition_info(GROUP, &tp(0)).await.unwrap(), None);
}

/// Damage in the last segment followed by a valid entry is corruption, not a torn tail:
/// cutting there would drop acknowledged entries.
#[tokio::test]
async fn damage_followed_by_a_valid_entry_is_corruption_not_a_tear() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    for _ in 0..3 {
        f.produce(0, 1).await;
    }
    f.broker.close();
    let wal = dir.path().join("broker/wal");
    let segment = std::fs::read_dir(&wal).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    // The length field (bytes 8..12 of a frame) of the segment's first frame, made huge.
    bytes[11] = 0x7f;
    std::fs::write(&segment, &bytes).unwrap();
    let err = f.reopen().await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "nothing was cut");
}
