//! Restarts: the state before equals the state after, for every record and transaction
//! state, on the in-memory store and on the local file system.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use shareflow::connector::broker::BrokerOptions;
use shareflow::connector::share::AcknowledgeType::*;
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use support::*;

/// Leaves records in every state and transactions in every state:
/// offsets 0 ACKNOWLEDGED, 1 ARCHIVED (rejected), 2 ARCHIVED (delivery limit),
/// 3-4 LOCKED in ONGOING txn 3 (with output), 5 LOCKED in PREPARE txn 4 (with output),
/// 6 ACQUIRED (delivery 2), 7 AVAILABLE after a release (delivery 1), 8-9 never delivered.
/// Txn 1 COMMITTED with output, txn 2 ABORTED with output.
async fn every_state(f: &Fixture) {
    f.produce(0, 10).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut x = f.consumer(Explicit).await;
    let mut t = f.consumer(Transactional).await;

    // 0 accepted, 1 rejected by a committed transaction.
    let t1 = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let r = poll(&mut t, 2).await;
    coord.send(&t1, vec![ProducerRecord::new(OUT, 0, "committed")]).await.unwrap();
    let mut a = ShareAcknowledgements::new();
    a.add(tp(0), AcknowledgementBatch::new(r[0].offset, r[0].offset, Accept)).unwrap();
    a.add(tp(0), AcknowledgementBatch::new(r[1].offset, r[1].offset, Reject)).unwrap();
    t.acknowledge_batches_transactional(&a, &t1).await.unwrap();
    coord.prepare_transaction(&t1.id).await.unwrap();
    coord.commit_transaction(&t1.id).await.unwrap();

    // 2 archived at the delivery limit (limit 3 in this fixture).
    for _ in 0..LIMIT {
        let r = poll(&mut x, 1).await;
        assert_eq!(r[0].offset, 2);
        x.acknowledge(&r[0], Release).await.unwrap();
        x.commit().await.unwrap();
    }

    // Txn 2 aborted with output.
    let t2 = coord.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    coord.send(&t2, vec![ProducerRecord::new(OUT, 0, "aborted")]).await.unwrap();
    coord.abort_transaction(&t2.id).await.unwrap();

    // 3-4 LOCKED in ONGOING txn 3, 5 LOCKED in PREPARE txn 4.
    let t3 = coord.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.unwrap();
    let t4 = coord.begin_transaction(&txn_id(4), TXN_TIMEOUT).await.unwrap();
    let r = poll(&mut t, 3).await;
    assert_eq!(r.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![3, 4, 5]);
    t.acknowledge_batches_transactional(&acks(&r[..2], Accept), &t3).await.unwrap();
    t.acknowledge_batches_transactional(&acks(&r[2..], Accept), &t4).await.unwrap();
    coord.send(&t3, vec![ProducerRecord::new(OUT, 0, "ongoing")]).await.unwrap();
    coord.send(&t4, vec![ProducerRecord::new(OUT, 0, "prepared")]).await.unwrap();
    coord.prepare_transaction(&t4.id).await.unwrap();

    // 6 ACQUIRED on its second delivery, 7 released once.
    let r = poll(&mut x, 2).await;
    assert_eq!(r.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![6, 7]);
    x.acknowledge(&r[0], Release).await.unwrap();
    x.acknowledge(&r[1], Release).await.unwrap();
    x.commit().await.unwrap();
    let r = poll(&mut x, 1).await;
    assert_eq!((r[0].offset, r[0].delivery_count), (6, 2));
}

const LIMIT: u16 = 3;

fn fixture_config() -> ShareConfig {
    ShareConfig::builder().acknowledgement_mode(Transactional).delivery_count_limit(LIMIT).build().unwrap()
}

async fn restart_preserves_every_state(mut f: Fixture) {
    every_state(&f).await;
    let before = observe(&f).await;
    let states: Vec<RecordState> = before.records.iter().map(|(_, _, s)| s.state).collect();
    use RecordState::*;
    assert_eq!(
        states,
        vec![Acknowledged, Archived, Archived, Locked, Locked, Locked, Acquired, Available, Available, Available]
    );
    f.restart().await;
    let after = observe(&f).await;
    assert_eq!(after, after_restart(&before, LIMIT));
    assert_eq!(after.records[6].2.delivery_count, 2, "delivery count survives");
    // A second restart changes nothing more.
    f.restart().await;
    assert_eq!(observe(&f).await, after);

    // The recovered transactions still work: the PREPARE one commits, atomically.
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let pending = coord.list_pending_transactions(GROUP).await.unwrap();
    assert_eq!(
        pending.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        vec![txn_id(4)],
        "the new epoch aborted the ONGOING one"
    );
    coord.commit_transaction(&txn_id(4)).await.unwrap();
    let out: Vec<_> = f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap();
    let values: Vec<&[u8]> = out.iter().filter_map(|r| r.value.as_deref()).collect();
    assert_eq!(values, vec![&b"committed"[..], &b"prepared"[..]]);
    assert_eq!(f.state(0, 5).await, Acknowledged);
    assert_eq!(f.state(0, 3).await, Available, "txn 3 aborted by the new epoch");
}

#[tokio::test]
async fn restart_preserves_every_state_in_memory() {
    restart_preserves_every_state(Fixture::on_store(Arc::new(InMemory::new()), 1, fixture_config()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_preserves_every_state_on_local_disk_as_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    restart_preserves_every_state(Fixture::on_store(store, 1, fixture_config()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_preserves_every_state_with_the_appending_local_journal() {
    let dir = tempfile::tempdir().unwrap();
    restart_preserves_every_state(Fixture::on_local_dir(dir.path(), 1, fixture_config()).await).await;
}

#[tokio::test]
async fn ongoing_transaction_keeps_its_timeout_across_a_restart() {
    let mut f = Fixture::new(1, fixture_config()).await;
    f.produce(0, 1).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let r = poll(&mut c, 1).await;
    c.acknowledge_batches_transactional(&acks(&r, Accept), &txn).await.unwrap();
    f.restart().await;
    assert_eq!(f.state(0, 0).await, RecordState::Locked);
    f.advance(TXN_TIMEOUT);
    f.broker.tick().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Available);
    assert_eq!(f.broker.metrics().await.unwrap().transaction_timeout_total, 1);
}

#[tokio::test]
async fn consumers_of_a_restarted_broker_must_subscribe_again() {
    let mut f = Fixture::new(1, fixture_config()).await;
    f.produce(0, 1).await;
    let store = f.store.clone();
    let clock = f.clock.clone();
    let old = f.broker.clone();
    let mut c = f.consumer(Explicit).await;
    poll(&mut c, 1).await;
    f.restart().await;
    assert!(old.tick().await.is_err(), "the old handle is closed");
    let _ = (store, clock);
    let mut fresh = f.consumer(Explicit).await;
    assert_eq!(poll(&mut fresh, 1).await[0].delivery_count, 2);
}

async fn list(store: &Arc<dyn ObjectStore>, dir: &str) -> Vec<Path> {
    store.list(Some(&Path::from(format!("broker/{dir}")))).map_ok(|m| m.location).try_collect().await.unwrap()
}

#[tokio::test]
async fn snapshots_bound_the_journal_and_restore_the_same_state() {
    snapshots_restore_the_same_state(Fixture::new(1, fixture_config()).await, 150).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_work_with_the_appending_local_journal() {
    let dir = tempfile::tempdir().unwrap();
    // Records stay in the segments and out of snapshots, so the snapshot comes from the
    // bound on the journal since the last one, set low here (default 256 MiB).
    let options = BrokerOptions::local_dir(dir.path()).unwrap().snapshot_every_bytes(4 << 20);
    snapshots_restore_the_same_state(Fixture::on_local_dir_with(dir.path(), options, 1, fixture_config()).await, 2)
        .await;
}

async fn snapshots_restore_the_same_state(mut f: Fixture, max_segments: usize) {
    every_state(&f).await;
    // 200 produce calls of 32 KiB: enough segments and bytes to trigger a snapshot.
    for i in 0..200 {
        let value = vec![i as u8; 32 * 1024];
        f.broker.produce(vec![ProducerRecord::new(IN, 0, value)]).await.unwrap();
    }
    // The snapshot is encoded and written in the background, then the segments it covers
    // are deleted: wait (bounded) for both, rather than racing them under load.
    for _ in 0..500 {
        if list(&f.store, "snapshot").await.len() == 1 && list(&f.store, "wal").await.len() <= max_segments {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let snapshots = list(&f.store, "snapshot").await;
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    let segments = list(&f.store, "wal").await;
    assert!(segments.len() <= max_segments, "obsolete segments are deleted, {} remain", segments.len());
    let before = observe(&f).await;
    f.restart().await;
    assert_eq!(observe(&f).await, after_restart(&before, LIMIT));
    let last = f.broker.fetch(&tp(0), 209, 1, IsolationLevel::ReadUncommitted).await.unwrap();
    assert_eq!(last[0].value.as_deref(), Some(&vec![199u8; 32 * 1024][..]));
    // Later writes go on after the snapshot and survive too.
    f.broker.produce(vec![ProducerRecord::new(IN, 0, "after")]).await.unwrap();
    f.restart().await;
    assert_eq!(f.broker.end_offset(&tp(0)).await.unwrap(), 211);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_group_commits_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::on_local_dir(dir.path(), 2, fixture_config()).await;
    let mut tasks = Vec::new();
    for t in 0..16 {
        let broker = f.broker.clone();
        tasks.push(tokio::spawn(async move {
            let mut offsets = Vec::new();
            for i in 0..25 {
                let r = ProducerRecord::new(IN, t % 2, format!("{t}-{i}"));
                offsets.extend(broker.produce(vec![r]).await.unwrap());
            }
            offsets
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 400, "every produce got its own offset");
    f.restart().await;
    let mut ends: Vec<i64> = Vec::new();
    for p in 0..2 {
        ends.push(f.broker.end_offset(&tp(p)).await.unwrap());
    }
    assert_eq!(ends, vec![200, 200]);
}
