//! Damaged journals: a torn tail is cut back to the last good entry with a warning;
//! damage anywhere else, garbage files and corrupt snapshots are `Data` errors.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker};
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use shareflow::connector::{Error, ErrorKind};
use support::*;

async fn segments(store: &Arc<dyn ObjectStore>) -> Vec<Path> {
    let mut paths: Vec<Path> =
        store.list(Some(&Path::from("broker/wal"))).map_ok(|m| m.location).try_collect().await.unwrap();
    paths.sort();
    paths
}

async fn read(store: &Arc<dyn ObjectStore>, path: &Path) -> Vec<u8> {
    store.get(path).await.unwrap().bytes().await.unwrap().to_vec()
}

async fn write(store: &Arc<dyn ObjectStore>, path: &Path, bytes: Vec<u8>) {
    store.put(path, PutPayload::from(bytes)).await.unwrap();
}

async fn reopen(f: &Fixture) -> Result<EmbeddedBroker, Error> {
    f.reopen().await
}

/// Ten records produced one call at a time: one journal segment per record.
async fn ten_records() -> Fixture {
    let f = Fixture::new(1, config(Explicit)).await;
    for i in 0..10 {
        f.broker.produce(vec![ProducerRecord::new(IN, 0, format!("r{i}"))]).await.unwrap();
    }
    f
}

#[tokio::test]
async fn torn_last_write_is_truncated_and_earlier_entries_survive() {
    let f = ten_records().await;
    let last = segments(&f.store).await.pop().unwrap();
    let bytes = read(&f.store, &last).await;
    write(&f.store, &last, bytes[..bytes.len() - 3].to_vec()).await;
    let broker = reopen(&f).await.unwrap();
    assert_eq!(broker.end_offset(&tp(0)).await.unwrap(), 9, "the torn produce is gone, the nine before it remain");
    // The damaged segment was cut back, so the next restart is clean and appends work.
    broker.produce(vec![ProducerRecord::new(IN, 0, "after")]).await.unwrap();
    broker.close();
    // On the fixture's clock: a system clock is decades past the records' timestamps,
    // and the default retention (7 days) would delete them all.
    let again =
        EmbeddedBroker::open(BrokerOptions::with_store(f.store.clone(), Path::from("broker")).clock(f.clock.clone()))
            .await
            .unwrap();
    let values = values(&again).await;
    assert_eq!(values.len(), 10);
    assert_eq!(values[8], Bytes::from("r8"));
    assert_eq!(values[9], Bytes::from("after"));
}

#[tokio::test]
async fn corrupt_last_entry_and_zero_filled_tail_are_truncated() {
    let f = ten_records().await;
    let last = segments(&f.store).await.pop().unwrap();
    let mut bytes = read(&f.store, &last).await;
    let n = bytes.len();
    bytes[n - 1] ^= 0xff; // checksum mismatch in the last entry
    write(&f.store, &last, bytes).await;
    assert_eq!(reopen(&f).await.unwrap().end_offset(&tp(0)).await.unwrap(), 9);

    let f = ten_records().await;
    let last = segments(&f.store).await.pop().unwrap();
    let mut bytes = read(&f.store, &last).await;
    bytes.extend_from_slice(&[0; 64]); // a pre-allocated, never written tail
    write(&f.store, &last, bytes).await;
    assert_eq!(reopen(&f).await.unwrap().end_offset(&tp(0)).await.unwrap(), 10, "nothing lost");
}

/// The values of partition 0 of `in`, read_uncommitted.
async fn values(broker: &EmbeddedBroker) -> Vec<Bytes> {
    let records = broker.fetch_all(&tp(0), IsolationLevel::ReadUncommitted).await.unwrap();
    records.into_iter().filter_map(|r| r.value).collect()
}

fn assert_corrupt(result: Result<EmbeddedBroker, Error>, path_part: &str) {
    match result {
        Err(e @ Error::Corrupt { .. }) => {
            assert_eq!(e.kind(), ErrorKind::Data);
            assert!(e.to_string().contains(path_part), "{e}");
        }
        Err(other) => panic!("expected Corrupt naming {path_part}, got {other}"),
        Ok(_) => panic!("expected Corrupt naming {path_part}, the broker opened"),
    }
}

#[tokio::test]
async fn damage_in_the_middle_is_a_data_error_never_a_reset() {
    let f = ten_records().await;
    let all = segments(&f.store).await;
    let middle = &all[all.len() / 2];
    let mut bytes = read(&f.store, middle).await;
    bytes[20] ^= 0x01;
    write(&f.store, middle, bytes).await;
    assert_corrupt(reopen(&f).await, middle.filename().unwrap());
}

#[tokio::test]
async fn a_missing_segment_is_a_data_error() {
    let f = ten_records().await;
    let all = segments(&f.store).await;
    f.store.delete(&all[3]).await.unwrap();
    assert_corrupt(reopen(&f).await, "missing");
}

#[tokio::test]
async fn garbage_files_are_data_errors() {
    // Non-zero garbage at the end of the journal is not a torn write.
    let f = ten_records().await;
    write(&f.store, &Path::from("broker/wal/99999999999999999999.seg"), b"definitely not a journal".to_vec()).await;
    assert_corrupt(reopen(&f).await, "99999999999999999999.seg");

    let f = ten_records().await;
    write(&f.store, &Path::from("broker/wal/notes.txt"), b"hello".to_vec()).await;
    assert_corrupt(reopen(&f).await, "notes.txt");

    let f = ten_records().await;
    write(&f.store, &Path::from("broker/snapshot/00000000000000000005.snap"), vec![0xAB; 100]).await;
    assert_corrupt(reopen(&f).await, "00000000000000000005.snap");
}

#[tokio::test]
async fn arbitrary_bytes_as_a_journal_never_panic() {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::default();
    let strategy = proptest::collection::vec(any::<u8>(), 0..200);
    for _ in 0..64 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        write(&store, &Path::from("broker/wal/00000000000000000001.seg"), bytes).await;
        // Either a (possibly empty) broker or a typed error; never a panic.
        if let Err(e) = EmbeddedBroker::open(BrokerOptions::with_store(store, Path::from("broker"))).await {
            assert_eq!(e.kind(), ErrorKind::Data, "{e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appending_local_journal_truncates_a_torn_append_and_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fixture::on_local_dir(dir.path(), 1, config(Explicit)).await;
    for i in 0..10 {
        f.broker.produce(vec![ProducerRecord::new(IN, 0, format!("r{i}"))]).await.unwrap();
    }
    let all = segments(&f.store).await;
    assert_eq!(all.len(), 1, "one appended segment, not one file per write: {all:?}");
    let file = dir.path().join(all[0].as_ref());
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - 5).unwrap();
    let broker = f.reopen().await.unwrap();
    assert_eq!(broker.end_offset(&tp(0)).await.unwrap(), 9);
    broker.produce(vec![ProducerRecord::new(IN, 0, "after")]).await.unwrap();
    broker.close();
    let again = f.reopen().await.unwrap();
    let values = values(&again).await;
    assert_eq!(values.len(), 10);
    assert_eq!(values[9], Bytes::from("after"));
}
