//! The embedded broker as a log store (decision 0020): on a local directory, records
//! stay in the journal's segments, snapshots hold only metadata, segment GC keeps every
//! segment a live batch points into, a crash at any step of snapshot or GC leaves a
//! directory that opens with every acknowledged record, and damage to a segment is
//! named with the file and the offsets it held.

#![allow(clippy::unwrap_used)]

#[path = "support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use shareflow::connector::broker::{fault, BrokerOptions, EmbeddedBroker, ManualClock, Retention};
use shareflow::connector::share::*;
use shareflow::connector::Error;

const TOPIC: &str = "in";
const PINNED: &str = "pinned";

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new(TOPIC, p)
}

/// Options on `dir` with snapshots every `every` journal bytes, no retention unless the
/// test sets one (then checked every second of the test's clock), and the test's clock.
fn options(dir: &Path, clock: &ManualClock, every: u64) -> BrokerOptions {
    BrokerOptions::local_dir(dir)
        .unwrap()
        .clock(clock.clone())
        .log_retention(Retention::default())
        .log_retention_check_interval(Duration::from_secs(1))
        .snapshot_every_bytes(every)
}

/// `n` records of `len` bytes; the value names batch `b` and record `i`.
fn batch(b: usize, n: usize, len: usize) -> Vec<ProducerRecord> {
    (0..n)
        .map(|i| {
            let mut v = format!("b{b:05}-r{i:05}-").into_bytes();
            v.resize(len, b'a' + (i % 26) as u8);
            ProducerRecord::new(TOPIC, 0, v)
        })
        .collect()
}

/// A broker on `dir` with the topic, and its options: faults armed through a clone of
/// them fire in this broker.
async fn broker_with_topic(dir: &Path, clock: &ManualClock) -> (BrokerOptions, EmbeddedBroker) {
    let opts = options(dir, clock, 1 << 20);
    let broker = EmbeddedBroker::open(opts.clone()).await.unwrap();
    broker.create_topic(TOPIC, 1).await.unwrap();
    (opts, broker)
}

fn files(dir: &Path, sub: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir.join("broker").join(sub))
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| !p.to_string_lossy().contains('#')).collect())
        .unwrap_or_default();
    out.sort();
    out
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Waits (bounded) until a snapshot newer than `after` exists; returns the newest.
async fn snapshot_after(dir: &Path, after: Option<&PathBuf>) -> PathBuf {
    for _ in 0..1_000 {
        if let Some(s) = files(dir, "snapshot").pop().filter(|s| Some(s) != after) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no snapshot after {after:?} within 10 s");
}

async fn values(broker: &EmbeddedBroker, tp: &TopicPartition) -> Vec<(i64, Bytes)> {
    let records = broker.fetch_all(tp, IsolationLevel::ReadUncommitted).await.unwrap();
    records.into_iter().map(|r| (r.offset, r.value.unwrap())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_live_in_segments_and_snapshots_hold_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 1 << 20)).await.unwrap();
    broker.create_topic(TOPIC, 1).await.unwrap();
    let mut want = Vec::new();
    for b in 0..40 {
        let records = batch(b, 100, 1024);
        want.extend(records.iter().map(|r| r.value.clone().unwrap()));
        broker.produce(records).await.unwrap();
    }
    let snapshot = snapshot_after(dir.path(), None).await;
    let held: u64 = want.iter().map(|v| v.len() as u64).sum();
    assert!(
        size(&snapshot) * 100 <= held,
        "the snapshot is {} bytes for {held} bytes of records: more than 1 %",
        size(&snapshot)
    );
    // Reads come from the segments, before and after a reopen.
    let got: Vec<Bytes> = values(&broker, &tp(0)).await.into_iter().map(|(_, v)| v).collect();
    assert_eq!(got, want);
    let newest = files(dir.path(), "snapshot").pop().unwrap();
    broker.close();
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 1 << 20)).await.unwrap();
    // The reopen read the newest snapshot, and of the journal only what follows it: not
    // the 4 MiB of records.
    let opened = broker.opened();
    assert_eq!(opened.snapshot_bytes, size(&newest), "{opened:?}");
    assert!(opened.journal_bytes < held / 2 && opened.journal_entries < 40, "{opened:?}");
    let got: Vec<Bytes> = values(&broker, &tp(0)).await.into_iter().map(|(_, v)| v).collect();
    assert_eq!(got, want);
    // A read from the middle of a batch starts there.
    let mid = broker.fetch(&tp(0), 1_050, 3, IsolationLevel::ReadUncommitted).await.unwrap();
    assert_eq!(mid.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![1_050, 1_051, 1_052]);
    assert_eq!(mid[0].value.as_ref().unwrap(), &want[1_050]);
    // Share consumers get the stored records too.
    let mut c = broker.consumer("g", ShareConfig::default()).await.unwrap();
    c.subscribe(&[TOPIC]).await.unwrap();
    let polled = c.poll(250, Duration::from_secs(5)).await.unwrap();
    assert_eq!(polled.len(), 250);
    for r in &polled {
        assert_eq!(r.value.as_ref().unwrap(), &want[r.offset as usize]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_a_segment_only_when_no_live_batch_points_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    // `in` keeps about 200 KiB; `pinned` keeps its one early batch for good.
    let open = || {
        EmbeddedBroker::open(
            options(dir.path(), &clock, 256 << 10)
                .topic_retention(TOPIC, Retention { ms: None, bytes: Some(200 << 10) })
                .topic_retention(PINNED, Retention::default()),
        )
    };
    let broker = open().await.unwrap();
    broker.create_topic(TOPIC, 1).await.unwrap();
    broker.create_topic(PINNED, 1).await.unwrap();
    broker.produce(vec![ProducerRecord::new(PINNED, 0, "kept for good")]).await.unwrap();
    let first_segment = files(dir.path(), "wal")[0].clone();
    let mut seen = std::collections::BTreeSet::new();
    for b in 0..200 {
        broker.produce(batch(b, 20, 1024)).await.unwrap();
        clock.advance(Duration::from_millis(1_100)); // retention runs once a second
        seen.extend(files(dir.path(), "wal"));
    }
    // Wait (bounded) for the last snapshot's GC.
    let mut segments = files(dir.path(), "wal");
    for _ in 0..500 {
        if segments.len() <= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        segments = files(dir.path(), "wal");
    }
    assert!(segments.contains(&first_segment), "the pinned batch's segment was deleted: {segments:?}");
    assert!(segments.len() <= 8, "segments only trimmed batches held were kept: {segments:?}");
    let start = broker.start_offset(&tp(0)).await.unwrap();
    assert!(start > 3_000, "retention trimmed the log to {start}");
    let before = values(&broker, &tp(0)).await;
    broker.close();
    let broker = open().await.unwrap();
    assert_eq!(values(&broker, &tp(0)).await, before);
    let pinned = values(&broker, &TopicPartition::new(PINNED, 0)).await;
    assert_eq!(pinned, vec![(0, Bytes::from("kept for good"))]);
    assert!(seen.len() > segments.len() + 4, "segments were not deleted: {} seen, {} left", seen.len(), segments.len());
}

/// For every fault point: run until it fires (the journal stops there as if the process
/// died), reopen, and find every acknowledged record from the log start on; then go on
/// writing, snapshot and reopen again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_each_step_of_roll_snapshot_and_gc_loses_nothing_acknowledged() {
    for &point in fault::ALL {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let opts = || {
            options(dir.path(), &clock, 128 << 10)
                .topic_retention(TOPIC, Retention { ms: None, bytes: Some(100 << 10) })
        };
        // Segments roll at each snapshot: the roll fault fires after the first.
        let armed = opts();
        let broker = EmbeddedBroker::open(armed.clone()).await.unwrap();
        broker.create_topic(TOPIC, 1).await.unwrap();
        let mut acked: Vec<(i64, Bytes)> = Vec::new();
        let mut failed = None;
        for b in 0..2_000 {
            if b == 20 {
                // Armed once records are in: clones of the options share fault points.
                let _ = armed.clone().fail_at(point);
            }
            let records = batch(b, 10, 1024);
            let values: Vec<Bytes> = records.iter().map(|r| r.value.clone().unwrap()).collect();
            match broker.produce(records).await {
                Ok(offsets) => acked.extend(offsets.into_iter().map(|(_, o)| o).zip(values)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            clock.advance(Duration::from_millis(1_100));
        }
        assert!(!armed.fault_armed(point), "{point}: never reached");
        assert!(failed.is_some(), "{point}: the journal went on after the fault");
        if point == fault::DISK_FULL {
            // A typed error that names the directory and says what to do.
            let e = failed.unwrap();
            assert!(matches!(e, Error::DiskFull { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(&*dir.path().to_string_lossy()) && text.contains("Free space"), "{text}");
            // Space is freed (the fault fires once): the same broker reads its directory
            // again on the next call and serves reads and writes, every acknowledged
            // record in place. What was not durable is gone, as after a crash: the
            // failed write was never acknowledged.
            let start = broker.start_offset(&tp(0)).await.unwrap();
            let kept: Vec<&(i64, Bytes)> = acked.iter().filter(|(o, _)| *o >= start).collect();
            let got = values(&broker, &tp(0)).await;
            assert_eq!(got.iter().collect::<Vec<_>>(), kept, "{point}: the log after the reload");
            let last_acked = acked.last().map_or(0, |(o, _)| o + 1);
            assert_eq!(broker.end_offset(&tp(0)).await.unwrap(), last_acked, "{point}");
            let offsets = broker.produce(batch(20_000, 10, 1024)).await.unwrap();
            assert_eq!(offsets[0].1, last_acked, "{point}: the first write after the reload");
        }
        broker.close();

        let broker = EmbeddedBroker::open(opts()).await.unwrap_or_else(|e| panic!("{point}: reopen: {e}"));
        let start = broker.start_offset(&tp(0)).await.unwrap();
        let end = broker.end_offset(&tp(0)).await.unwrap();
        let got = values(&broker, &tp(0)).await;
        let kept: Vec<&(i64, Bytes)> = acked.iter().filter(|(o, _)| *o >= start).collect();
        assert!(!kept.is_empty(), "{point}: nothing acknowledged is left to check (start {start})");
        assert_eq!(got.iter().take(kept.len()).collect::<Vec<_>>(), kept, "{point}");
        let last_acked = acked.last().map_or(0, |(o, _)| o + 1);
        assert!((last_acked..=last_acked + 10).contains(&end), "{point}: end {end}, acknowledged up to {last_acked}");
        // The directory is healthy: it writes, snapshots and reopens again.
        let snapshot = files(dir.path(), "snapshot").pop();
        for b in 0..60 {
            broker.produce(batch(10_000 + b, 10, 1024)).await.unwrap();
            clock.advance(Duration::from_millis(1_100));
        }
        snapshot_after(dir.path(), snapshot.as_ref()).await;
        let end = broker.end_offset(&tp(0)).await.unwrap();
        let tail = values(&broker, &tp(0)).await;
        broker.close();
        let broker = EmbeddedBroker::open(opts()).await.unwrap();
        assert_eq!(broker.end_offset(&tp(0)).await.unwrap(), end, "{point}");
        assert_eq!(values(&broker, &tp(0)).await, tail, "{point}");
        broker.close();
    }
}

/// A full disk under concurrent writers: each write fails or is acknowledged, and each
/// acknowledged one is where it was acknowledged, on the same broker once it has read
/// its directory again, and after a reopen. A writer whose entry the failure lost must
/// not be answered by the later entry that takes its place in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_across_a_full_disk_get_an_error_or_keep_their_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let (opts, broker) = broker_with_topic(dir.path(), &clock).await;
    let mut writers = Vec::new();
    for w in 0..4usize {
        let (broker, opts) = (broker.clone(), opts.clone());
        writers.push(tokio::spawn(async move {
            let (mut acked, mut failed) = (Vec::new(), 0);
            for i in 0..200 {
                if w == 0 && i == 50 {
                    let _ = opts.clone().fail_at(fault::DISK_FULL);
                }
                let records = batch(w * 1_000 + i, 1, 64);
                let value = records[0].value.clone().unwrap();
                match broker.produce(records).await {
                    Ok(offsets) => acked.push((offsets[0].1, value)),
                    Err(_) => failed += 1,
                }
            }
            (acked, failed)
        }));
    }
    let (mut acked, mut failed) = (Vec::new(), 0);
    for w in writers {
        let (a, f) = w.await.unwrap();
        acked.extend(a);
        failed += f;
    }
    assert!(!opts.fault_armed(fault::DISK_FULL), "the full disk never came");
    assert!(failed >= 1, "no write failed on the full disk");
    assert!(acked.len() >= 4 * 200 - failed - 1, "{} acknowledged, {failed} failed", acked.len());
    acked.sort();
    let check = |got: Vec<(i64, Bytes)>, when: &str| {
        let got: std::collections::BTreeMap<i64, Bytes> = got.into_iter().collect();
        for (offset, value) in &acked {
            assert_eq!(got.get(offset), Some(value), "{when}: acknowledged offset {offset}");
        }
        assert_eq!(got.len(), acked.len(), "{when}: records nobody was told about");
    };
    check(values(&broker, &tp(0)).await, "after the reload");
    broker.close();
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 1 << 20)).await.unwrap();
    check(values(&broker, &tp(0)).await, "after a reopen");
    broker.close();
}

/// A write whose entry was still waiting for its group commit when the disk filled is
/// lost with it. Once the broker has read its directory again, newer entries take that
/// entry's place in the journal; the lost write must still answer with an error, not
/// with the offsets that now hold other records.
#[tokio::test] // one thread: the writes below run only when this test lets them
async fn a_write_lost_to_a_full_disk_is_not_answered_by_the_entry_that_took_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let (opts, broker) = broker_with_topic(dir.path(), &clock).await;
    broker.produce(batch(0, 5, 64)).await.unwrap();
    let _ = opts.clone().fail_at(fault::DISK_FULL);
    // `a` starts the group commit that meets the full disk; `b` is taken into the
    // next one and waits.
    let mut a = Box::pin(broker.produce(batch(1, 1, 64)));
    assert!(futures::poll!(&mut a).is_pending());
    let mut b = Box::pin(broker.produce(batch(2, 1, 64)));
    assert!(futures::poll!(&mut b).is_pending());
    assert!(matches!(a.await, Err(Error::DiskFull { .. })));
    // Space is freed: the broker reads its directory again, and new writes take the
    // lost entries' places.
    assert_eq!(broker.end_offset(&tp(0)).await.unwrap(), 5);
    for n in 3..6 {
        broker.produce(batch(n, 1, 64)).await.unwrap();
    }
    match b.await {
        Err(Error::DiskFull { .. }) => {}
        Ok(offsets) => {
            let got = values(&broker, &tp(0)).await;
            let at = got.iter().find(|(o, _)| *o == offsets[0].1).map(|(_, v)| v.clone());
            panic!("the lost write was answered with offset {}, which holds {at:?}", offsets[0].1);
        }
        Err(e) => panic!("the lost write: {e}"),
    }
    let got: Vec<Bytes> = values(&broker, &tp(0)).await.into_iter().map(|(_, v)| v).collect();
    let want: Vec<Bytes> = [0, 0, 0, 0, 0, 3, 4, 5]
        .iter()
        .enumerate()
        .map(|(i, &n)| batch(n, 5, 64)[if i < 5 { i } else { 0 }].value.clone().unwrap())
        .collect();
    assert_eq!(got, want);
    broker.close();
}

/// A directory with a snapshot that points into its first segment, which also holds
/// records with `marker` in them.
async fn pinned_directory(dir: &Path, clock: &ManualClock) {
    let broker = EmbeddedBroker::open(options(dir, clock, 256 << 10)).await.unwrap();
    broker.create_topic(TOPIC, 1).await.unwrap();
    for b in 0..40 {
        broker.produce(batch(b, 10, 1024)).await.unwrap();
    }
    // A second snapshot, so that the first segment holds only entries a snapshot covers.
    let first = snapshot_after(dir, None).await;
    for b in 40..80 {
        broker.produce(batch(b, 10, 1024)).await.unwrap();
    }
    snapshot_after(dir, Some(&first)).await;
    broker.close();
}

fn corrupt(e: Error) -> String {
    match e {
        Error::Corrupt { path, reason } => format!("{path}: {reason}"),
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_or_short_segment_is_named_with_the_offsets_it_held() {
    let clock = ManualClock::new(1_000_000);
    for damage in ["missing", "short"] {
        let dir = tempfile::tempdir().unwrap();
        pinned_directory(dir.path(), &clock).await;
        let first = files(dir.path(), "wal")[0].clone();
        match damage {
            "missing" => std::fs::remove_file(&first).unwrap(),
            _ => std::fs::OpenOptions::new().write(true).open(&first).unwrap().set_len(size(&first) / 2).unwrap(),
        }
        let err = corrupt(EmbeddedBroker::open(options(dir.path(), &clock, 256 << 10)).await.err().unwrap());
        let name = first.file_name().unwrap().to_string_lossy().to_string();
        assert!(err.contains(&name), "{damage}: {err}");
        assert!(err.contains("offsets ") && err.contains(" of in-0"), "{damage}: {err}");
        assert!(err.contains("restore the broker directory"), "{damage}: {err}");
        if damage == "short" {
            assert!(err.contains("cut short"), "{err}");
        }
    }
}

#[tokio::test]
async fn a_damaged_batch_is_named_when_read_and_the_rest_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    pinned_directory(dir.path(), &clock).await;
    let first = files(dir.path(), "wal")[0].clone();
    let mut bytes = std::fs::read(&first).unwrap();
    let at = bytes.windows(13).position(|w| w == b"b00003-r00004").unwrap();
    bytes[at + 2] ^= 1;
    std::fs::write(&first, bytes).unwrap();
    // The snapshot covers the segment, so the open does not read it.
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 256 << 10)).await.unwrap();
    let err = corrupt(broker.fetch_all(&tp(0), IsolationLevel::ReadUncommitted).await.err().unwrap());
    assert!(err.contains(&*first.file_name().unwrap().to_string_lossy()), "{err}");
    assert!(err.contains("offsets 30..=39 of in-0"), "{err}");
    assert!(err.contains("checksum"), "{err}");
    // Batches around it read.
    assert_eq!(broker.fetch(&tp(0), 0, 30, IsolationLevel::ReadUncommitted).await.unwrap().len(), 30);
    assert_eq!(broker.fetch(&tp(0), 40, 10, IsolationLevel::ReadUncommitted).await.unwrap().len(), 10);
}

/// A poll that meets a damaged batch fails, naming it, and charges no other record a
/// delivery: not the readable records of its partition, and not those of the other
/// partition that the same poll acquired. The unreadable records keep theirs, so that
/// the delivery limit archives them in the end and the group moves on.
#[tokio::test]
async fn a_poll_that_meets_a_damaged_batch_fails_and_charges_no_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    {
        let broker = EmbeddedBroker::open(options(dir.path(), &clock, 256 << 10)).await.unwrap();
        broker.create_topic(TOPIC, 2).await.unwrap();
        broker.create_topic("filler", 1).await.unwrap();
        for b in 0..3 {
            for p in 0..2 {
                let records = batch(b * 2 + p, 10, 256)
                    .into_iter()
                    .map(|r| ProducerRecord::new(TOPIC, p as i32, r.value.unwrap()))
                    .collect();
                broker.produce(records).await.unwrap();
            }
        }
        // Two snapshots, so that the first segment holds only entries a snapshot covers:
        // the open does not read it, and the damage shows only when a poll does.
        let filler = |b| batch(b, 10, 1024).into_iter().map(|r| ProducerRecord::new("filler", 0, r.value.unwrap()));
        for b in 100..140 {
            broker.produce(filler(b).collect()).await.unwrap();
        }
        let first = snapshot_after(dir.path(), None).await;
        for b in 140..180 {
            broker.produce(filler(b).collect()).await.unwrap();
        }
        snapshot_after(dir.path(), Some(&first)).await;
        broker.close();
    }
    // Batch 2 is partition 0's offsets 10..=19.
    let wal = files(dir.path(), "wal")[0].clone();
    let mut bytes = std::fs::read(&wal).unwrap();
    let at = bytes.windows(13).position(|w| w == b"b00002-r00004").unwrap();
    bytes[at + 2] ^= 1;
    std::fs::write(&wal, bytes).unwrap();

    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 256 << 10)).await.unwrap();
    let mut consumer = broker.consumer("g", ShareConfig::default()).await.unwrap();
    consumer.subscribe(&[TOPIC]).await.unwrap();
    for attempt in 1..=5u16 {
        let err = corrupt(consumer.poll(100, Duration::from_millis(100)).await.expect_err("the poll fails"));
        assert!(err.contains("offsets 10..=19 of in-0"), "attempt {attempt}: {err}");
        for (p, offset) in [(0, 0), (0, 9), (0, 20), (0, 29), (1, 0), (1, 29)] {
            let status = broker.record_status("g", &tp(p), offset).await.unwrap();
            assert_eq!(status.state, RecordState::Available, "attempt {attempt}: in-{p} offset {offset}");
            assert_eq!(status.delivery_count, 0, "attempt {attempt}: in-{p} offset {offset} was charged a delivery");
        }
        // The unreadable records keep their delivery, so that the limit ends it.
        let status = broker.record_status("g", &tp(0), 15).await.unwrap();
        assert_eq!((status.state, status.delivery_count), (RecordState::Acquired, attempt));
        clock.advance(Duration::from_secs(60));
    }
    // The delivery limit (5) archived the unreadable batch; every other record comes,
    // as a first delivery, and the group moves on.
    let got = consumer.poll(100, Duration::from_millis(100)).await.unwrap();
    assert_eq!(got.len(), 50);
    assert!(
        got.iter().all(|r| r.delivery_count == 1),
        "{:?}",
        got.iter().map(|r| r.delivery_count).collect::<Vec<_>>()
    );
    assert!(!got.iter().any(|r| r.partition == 0 && (10..=19).contains(&r.offset)));
    let status = broker.record_status("g", &tp(0), 15).await.unwrap();
    assert_eq!((status.state, status.archive_reason), (RecordState::Archived, Some(ArchiveReason::DeliveryLimit)));
    broker.close();
}

/// Copies a directory tree.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// `tests/fixtures/broker-v4` was written by the format before the log store: records
/// inline in a version-4 snapshot and in `Produce` entries. It opens with every record
/// and state, and its first new snapshot holds no record bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_the_previous_format_opens_and_moves_its_records_into_segments() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&checkout_file("tests/fixtures/broker-v4"), dir.path());
    let clock = ManualClock::new(1_700_000_000_000);
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 64 << 10)).await.unwrap();
    let check = |broker: EmbeddedBroker| async move {
        for p in 0..2 {
            let got = broker.fetch(&tp(p), 0, 15, IsolationLevel::ReadUncommitted).await.unwrap();
            let want: Vec<usize> = (0..30).filter(|i| i % 2 == p as usize).collect();
            assert_eq!(got.len(), want.len(), "in-{p}");
            for (r, i) in got.iter().zip(want) {
                assert_eq!(r.offset, (i / 2) as i64);
                assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
                assert_eq!(r.value.as_deref(), Some(format!("legacy-{i:03}").as_bytes()));
            }
        }
        for o in 0..10 {
            let want = if o <= 5 { RecordState::Acknowledged } else { RecordState::Available };
            assert_eq!(broker.record_status("g", &tp(1), o).await.unwrap().state, want, "in-1 offset {o}");
        }
        broker
    };
    let broker = check(broker).await;
    // New records go on; the next snapshot is of the new format and holds no records.
    let old = files(dir.path(), "snapshot").pop();
    for b in 0..20 {
        broker.produce(batch(b, 10, 1024)).await.unwrap();
    }
    let snapshot = snapshot_after(dir.path(), old.as_ref()).await;
    let bytes = std::fs::read(&snapshot).unwrap();
    assert!(!bytes.windows(7).any(|w| w == b"legacy-"), "the new snapshot holds records of the old format");
    assert!(!bytes.windows(6).any(|w| w == b"b00000"), "the new snapshot holds new records");
    assert_eq!(u16::from_le_bytes([bytes[4], bytes[5]]), 5, "snapshot format version");
    broker.close();
    // Once the old snapshot and the segments it covered are gone, it all still reads.
    let broker = check(EmbeddedBroker::open(options(dir.path(), &clock, 64 << 10)).await.unwrap()).await;
    assert_eq!(broker.end_offset(&tp(0)).await.unwrap(), 15 + 200);
}

/// The newest snapshot's lsn, from its file name.
fn snapshot_lsn(dir: &Path) -> Option<u64> {
    files(dir, "snapshot").pop()?.file_stem()?.to_str()?.parse().ok()
}

/// Damage in the last frame of the last segment is a torn tail only if the frame is
/// newer than the snapshot: a frame the snapshot covers was durable, and a batch of it
/// may be pointed at, so cutting it would lose records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_a_last_frame_the_snapshot_covers_is_corruption_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    // A snapshot after every write, so one soon covers the last entry.
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 1)).await.unwrap();
    broker.create_topic(TOPIC, 1).await.unwrap();
    let mut covered = false;
    for b in 0..50 {
        broker.produce(batch(b, 10, 1024)).await.unwrap();
        for _ in 0..200 {
            if snapshot_lsn(dir.path()) == Some(broker.journal_last_lsn()) {
                covered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if covered {
            break;
        }
    }
    assert!(covered, "no snapshot covered the last entry");
    broker.close();
    let last = files(dir.path(), "wal").pop().unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 1; // a record byte of the last batch: its frame's checksum fails
    std::fs::write(&last, bytes).unwrap();
    let err = corrupt(EmbeddedBroker::open(options(dir.path(), &clock, 1)).await.err().unwrap());
    assert!(err.contains(&*last.file_name().unwrap().to_string_lossy()), "{err}");
    assert_eq!(size(&last), n as u64, "the segment was cut");
}

/// `open_read_only` beside the live broker (as `shareflow txn list` does) reads the
/// records from the segments the live broker writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_view_beside_the_live_broker_reads_the_stored_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let broker = EmbeddedBroker::open(options(dir.path(), &clock, 64 << 10)).await.unwrap();
    broker.create_topic(TOPIC, 1).await.unwrap();
    for b in 0..30 {
        broker.produce(batch(b, 10, 1024)).await.unwrap();
    }
    let view = EmbeddedBroker::open_read_only(options(dir.path(), &clock, 64 << 10)).await.unwrap();
    let got = view.fetch_all(&tp(0), IsolationLevel::ReadCommitted).await.unwrap();
    assert_eq!(got.len(), 300);
    assert_eq!(got[123].value, broker.fetch(&tp(0), 123, 1, IsolationLevel::ReadCommitted).await.unwrap()[0].value);
}
