//! One test per row of the record state machine (docs/design.md §3, "Record states"), on the
//! embedded broker through its public API.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use shareflow::connector::share::AcknowledgeType::*;
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use support::*;

/// A group in explicit mode: its members choose their own mode (a group configured
/// transactional refuses every plain ACCEPT; see broker_hardening.rs).
async fn fixture() -> Fixture {
    let f = Fixture::new(1, config(Explicit)).await;
    f.produce(0, 10).await;
    f
}

#[tokio::test]
async fn available_poll_acquired_with_delivery_count() {
    let f = fixture().await;
    assert_eq!(f.state(0, 0).await, RecordState::Available);
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 3).await;
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(got.iter().all(|r| r.delivery_count == 1));
    assert_eq!(got[1].value.as_deref(), Some(&b"v1"[..]));
    assert_eq!(f.state(0, 2).await, RecordState::Acquired);
    assert_eq!(f.state(0, 3).await, RecordState::Available);
}

#[tokio::test]
async fn acquired_ack_in_txn_locked_and_lock_no_longer_expires() {
    let f = fixture().await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 2).await;
    c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Locked);
    let status = f.broker.record_status(GROUP, &tp(0), 1).await.unwrap();
    assert_eq!(status.transaction, Some(txn_id(1)));
    // Past the acquisition lock, inside the transaction timeout: still LOCKED.
    f.advance(LOCK + Duration::from_secs(1));
    f.broker.tick().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Locked);
    assert!(poll(&mut c, 10).await.iter().all(|r| r.offset >= 2), "LOCKED records are not redelivered");
}

#[tokio::test]
async fn acquired_lock_timeout_available_then_archived_at_the_limit() {
    let cfg = ShareConfig::builder().delivery_count_limit(2).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    f.produce(0, 1).await;
    let mut c = f.consumer(Explicit).await;
    assert_eq!(poll(&mut c, 1).await[0].delivery_count, 1);
    f.advance(LOCK);
    f.broker.tick().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Available);
    let again = poll(&mut c, 1).await;
    assert_eq!(again[0].delivery_count, 2, "redelivered with delivery count + 1");
    f.advance(LOCK);
    f.broker.tick().await.unwrap();
    let status = f.broker.record_status(GROUP, &tp(0), 0).await.unwrap();
    assert_eq!(status.state, RecordState::Archived);
    assert_eq!(status.archive_reason, Some(ArchiveReason::DeliveryLimit));
    assert!(poll(&mut c, 1).await.is_empty());
    assert_eq!(f.broker.metrics().await.unwrap().records_archived_delivery_limit, 1);
    assert_eq!(f.broker.metrics().await.unwrap().records_redelivered, 1);
}

#[tokio::test]
async fn acquired_outside_a_txn_accept_reject_release_renew() {
    let f = fixture().await;
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 4).await;
    c.acknowledge(&got[0], Accept).await.unwrap();
    c.acknowledge(&got[1], Reject).await.unwrap();
    c.acknowledge(&got[2], Release).await.unwrap();
    c.acknowledge(&got[3], Renew).await.unwrap();
    // Explicit mode: nothing is sent before commit (or the next poll).
    assert_eq!(f.state(0, 0).await, RecordState::Acquired);
    c.commit().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged);
    let rejected = f.broker.record_status(GROUP, &tp(0), 1).await.unwrap();
    assert_eq!((rejected.state, rejected.archive_reason), (RecordState::Archived, Some(ArchiveReason::Rejected)));
    assert_eq!(f.state(0, 2).await, RecordState::Available);
    assert_eq!(f.state(0, 3).await, RecordState::Acquired);
}

#[tokio::test]
async fn renew_restarts_the_lock() {
    let f = fixture().await;
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 2).await;
    f.advance(LOCK - Duration::from_secs(1));
    c.acknowledge(&got[0], Renew).await.unwrap();
    c.commit().await.unwrap();
    f.advance(Duration::from_secs(2));
    f.broker.tick().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Acquired, "renewed");
    assert_eq!(f.state(0, 1).await, RecordState::Available, "not renewed: expired");
}

#[tokio::test]
async fn release_at_the_delivery_limit_archives() {
    let cfg = ShareConfig::builder().delivery_count_limit(2).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    f.produce(0, 1).await;
    let mut c = f.consumer(Explicit).await;
    for expected in [RecordState::Available, RecordState::Archived] {
        let got = poll(&mut c, 1).await;
        c.acknowledge(&got[0], Release).await.unwrap();
        c.commit().await.unwrap();
        assert_eq!(f.state(0, 0).await, expected);
    }
}

async fn locked(f: &Fixture, ack: AcknowledgeType) -> (EmbeddedPair, TransactionHandle) {
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 1).await;
    c.acknowledge_batches_transactional(&acks(&got, ack), &txn).await.unwrap();
    (EmbeddedPair { coord, _consumer: c }, txn)
}

struct EmbeddedPair {
    coord: shareflow::connector::broker::EmbeddedTransactionCoordinator,
    _consumer: shareflow::connector::broker::EmbeddedShareConsumer,
}

#[tokio::test]
async fn locked_commit_accept_acknowledged() {
    let f = fixture().await;
    let (p, txn) = locked(&f, Accept).await;
    p.coord.prepare_transaction(&txn.id).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Locked, "PREPARE keeps the record LOCKED");
    p.coord.commit_transaction(&txn.id).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged);
}

#[tokio::test]
async fn locked_commit_reject_archived() {
    let f = fixture().await;
    let (p, txn) = locked(&f, Reject).await;
    p.coord.prepare_transaction(&txn.id).await.unwrap();
    p.coord.commit_transaction(&txn.id).await.unwrap();
    let s = f.broker.record_status(GROUP, &tp(0), 0).await.unwrap();
    assert_eq!((s.state, s.archive_reason), (RecordState::Archived, Some(ArchiveReason::Rejected)));
}

#[tokio::test]
async fn locked_abort_available_and_redelivered() {
    let f = fixture().await;
    let (p, txn) = locked(&f, Accept).await;
    p.coord.abort_transaction(&txn.id).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Available);
    let mut c = f.consumer(Explicit).await;
    let again = poll(&mut c, 1).await;
    assert_eq!((again[0].offset, again[0].delivery_count), (0, 2));
}

#[tokio::test]
async fn locked_prepared_then_aborted_available() {
    let f = fixture().await;
    let (p, txn) = locked(&f, Accept).await;
    p.coord.prepare_transaction(&txn.id).await.unwrap();
    p.coord.abort_transaction(&txn.id).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Available);
}

#[tokio::test]
async fn locked_txn_timeout_available_and_counted() {
    let f = fixture().await;
    let (_p, txn) = locked(&f, Accept).await;
    f.advance(TXN_TIMEOUT);
    f.broker.tick().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Available);
    assert_eq!(f.broker.transaction_state(&txn.id).await.unwrap(), TransactionState::Aborted);
    let m = f.broker.metrics().await.unwrap();
    assert_eq!((m.transaction_timeout_total, m.transaction_abort_total, m.transaction_active), (1, 1, 0));
}

#[tokio::test]
async fn prepare_never_times_out() {
    let f = fixture().await;
    let (p, txn) = locked(&f, Accept).await;
    p.coord.prepare_transaction(&txn.id).await.unwrap();
    f.advance(TXN_TIMEOUT * 100);
    f.broker.tick().await.unwrap();
    assert_eq!(f.broker.transaction_state(&txn.id).await.unwrap(), TransactionState::Prepare);
    assert_eq!(f.state(0, 0).await, RecordState::Locked);
    let m = f.broker.metrics().await.unwrap();
    assert_eq!((m.transaction_active, m.transaction_prepared, m.transaction_timeout_total), (1, 1, 0));
    p.coord.commit_transaction(&txn.id).await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged);
}

#[tokio::test]
async fn implicit_mode_next_poll_accepts_previous() {
    let f = fixture().await;
    let mut c = f.consumer(Implicit).await;
    let first = poll(&mut c, 2).await;
    assert!(c.acknowledge(&first[0], Accept).await.is_err(), "explicit acks are refused in implicit mode");
    poll(&mut c, 2).await;
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged);
    assert_eq!(f.state(0, 1).await, RecordState::Acknowledged);
    assert_eq!(f.state(0, 2).await, RecordState::Acquired);
}

#[tokio::test]
async fn close_releases_what_the_member_holds() {
    let f = fixture().await;
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 3).await;
    c.acknowledge(&got[0], Accept).await.unwrap();
    c.close().await.unwrap();
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged, "buffered ack sent on close");
    assert_eq!(f.state(0, 1).await, RecordState::Available);
    assert!(c.poll(1, Duration::ZERO).await.is_err(), "closed");
}

#[tokio::test]
async fn in_flight_cap_pauses_fetch() {
    let cfg = ShareConfig::builder().partition_max_record_locks(4).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    f.produce(0, 10).await;
    let mut c = f.consumer(Explicit).await;
    assert_eq!(poll(&mut c, 10).await.len(), 4);
    assert!(poll(&mut c, 10).await.is_empty(), "fetch pauses while the partition is full");
    let info = f.broker.share_partition_info(GROUP, &tp(0)).await.unwrap().unwrap();
    assert_eq!(info.in_flight, 4);
    // Settling one frees one slot.
    let rec = Record {
        topic: IN.into(),
        partition: 0,
        offset: 0,
        key: None,
        value: None,
        timestamp_ms: 0,
        delivery_count: 1,
        headers: Vec::new(),
    };
    c.acknowledge(&rec, Accept).await.unwrap();
    let next = poll(&mut c, 10).await;
    assert_eq!(next.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![4]);
}

#[tokio::test]
async fn members_split_the_records() {
    let f = Fixture::new(2, config(Explicit)).await;
    f.produce(0, 50).await;
    f.produce(1, 50).await;
    let mut a = f.consumer(Explicit).await;
    let mut b = f.consumer(Explicit).await;
    let mut seen = std::collections::BTreeSet::new();
    let (mut from_a, mut from_b) = (0, 0);
    loop {
        let ra = poll(&mut a, 10).await;
        let rb = poll(&mut b, 10).await;
        if ra.is_empty() && rb.is_empty() {
            break;
        }
        from_a += ra.len();
        from_b += rb.len();
        for r in ra.iter().chain(&rb) {
            assert!(seen.insert((r.partition, r.offset)), "{}-{} delivered twice", r.partition, r.offset);
        }
    }
    assert_eq!(seen.len(), 100);
    assert_eq!((from_a, from_b), (50, 50));
}

/// The at-least-once source's batched path: offset ranges outside a transaction settle
/// as single records do, one call for many records, and a refused call buffers nothing.
#[tokio::test]
async fn ranges_outside_a_txn_settle_like_records_all_or_nothing() {
    let f = fixture().await;
    let mut c = f.consumer(Explicit).await;
    assert_eq!(poll(&mut c, 10).await.len(), 10);
    let mut acks = ShareAcknowledgements::new();
    acks.add(tp(0), AcknowledgementBatch::new(0, 5, Accept)).unwrap();
    acks.add(tp(0), AcknowledgementBatch::new(6, 9, Renew)).unwrap();
    c.acknowledge_ranges(&acks).await.unwrap();
    c.commit().await.unwrap();
    for o in 0..=5 {
        assert_eq!(f.state(0, o).await, RecordState::Acknowledged, "offset {o}");
    }
    assert_eq!(f.state(0, 6).await, RecordState::Acquired, "renewed, still held");
    let mut first = ShareAcknowledgements::new();
    first.add(tp(0), AcknowledgementBatch::new(6, 7, Accept)).unwrap();
    c.acknowledge_ranges(&first).await.unwrap();
    // 7 is buffered already: the whole call is refused, 8..=9 included.
    let mut overlapping = ShareAcknowledgements::new();
    overlapping.add(tp(0), AcknowledgementBatch::new(7, 7, Reject)).unwrap();
    overlapping.add(tp(0), AcknowledgementBatch::new(8, 9, Accept)).unwrap();
    let err = c.acknowledge_ranges(&overlapping).await.unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    c.commit().await.unwrap();
    assert_eq!(f.state(0, 7).await, RecordState::Acknowledged);
    assert_eq!(f.state(0, 8).await, RecordState::Acquired, "nothing of the refused call was sent");
}

#[tokio::test]
async fn ranges_are_refused_in_implicit_mode_and_as_plain_accept_in_transactional_mode() {
    let f = fixture().await;
    let mut acks = ShareAcknowledgements::new();
    acks.add(tp(0), AcknowledgementBatch::new(0, 1, Accept)).unwrap();
    let mut implicit = f.consumer(Implicit).await;
    let err = implicit.acknowledge_ranges(&acks).await.unwrap_err();
    assert!(err.to_string().contains("implicit mode"), "{err}");
    let mut transactional = f.consumer(Transactional).await;
    let err = transactional.acknowledge_ranges(&acks).await.unwrap_err();
    assert!(err.to_string().contains("acknowledge_batches_transactional"), "{err}");
}

/// The exactly-once checker (`connector/src/verify.rs`) names every broken invariant: a
/// record ACKNOWLEDGED without output (I3), one with two outputs (I2), one ARCHIVED yet
/// with output or AVAILABLE with output (I4), one AVAILABLE without output (I1), and an
/// output that matches no input; the rest count as exactly once.
#[tokio::test]
async fn the_checker_names_each_broken_invariant() {
    use shareflow::connector::verify::check_exactly_once;
    let f = fixture().await;
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 7).await;
    assert_eq!(got.len(), 7);
    let mut settle = acks(&got[..6], Accept);
    for (tp, ranges) in acks(&got[6..], Reject).partitions() {
        for b in ranges.batches() {
            settle.add(tp.clone(), b).unwrap();
        }
    }
    c.acknowledge_ranges(&settle).await.unwrap();
    c.commit().await.unwrap();
    // v0..v5 ACKNOWLEDGED, v6 ARCHIVED (rejected), v7..v9 AVAILABLE.
    let outputs = ["v0", "v1", "v2", "v3", "v3", "v6", "v8", "v99"];
    let records = outputs.iter().map(|v| ProducerRecord::new(OUT, 0, v.as_bytes().to_vec())).collect();
    f.broker.produce(records).await.unwrap();
    let id = |v: &[u8]| std::str::from_utf8(v).ok()?.strip_prefix('v')?.parse().ok();
    let report = check_exactly_once(&f.broker, GROUP, IN, OUT, id).await.unwrap();
    assert_eq!((report.produced, report.committed_output), (10, 8));
    // v0, v1, v2 once; v3 twice; v4, v5 acknowledged without output; v7, v9 never delivered.
    assert_eq!((report.exactly_once, report.duplicates, report.lost), (3, 1, 4));
    assert_eq!(report.archived.values().sum::<u64>(), 1);
    let mut found: Vec<String> =
        report.violations.iter().map(|v| v.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    found.sort();
    // The AVAILABLE records (v7, v9) are summed up in one line, naming the first.
    let want = ["I1: 2", "I2: input", "I3: in-0@4", "I3: in-0@5", "I4: in-0@6", "I4: in-0@8", "output id"];
    assert_eq!(found, want, "{:#?}", report.violations);
    assert!(report.available_line().is_some_and(|l| l.contains("in-0@7")), "{:?}", report.violations);
    assert_eq!((report.available, report.violation_count), (2, 7));
    // A stopped run forgives them: they are what a resumed run does next.
    let mut stopped = report.clone();
    assert_eq!(stopped.leave_available(), 2);
    assert_eq!((stopped.lost, stopped.violations.len(), stopped.available_line()), (2, 6, None));
}

/// A run broken a million ways does not take the checker's memory: it keeps the first
/// `MAX_VIOLATION_LINES` lines and counts the rest.
#[tokio::test]
async fn the_checker_keeps_a_bounded_number_of_violation_lines() {
    use shareflow::connector::verify::{check_exactly_once, MAX_VIOLATION_LINES};
    let f = Fixture::new(1, config(Explicit)).await;
    let extra = MAX_VIOLATION_LINES as u64 + 200;
    let records = (0..extra).map(|i| ProducerRecord::new(OUT, 0, format!("v{}", 1_000_000 + i).into_bytes())).collect();
    f.broker.produce(records).await.unwrap();
    let id = |v: &[u8]| std::str::from_utf8(v).ok()?.strip_prefix('v')?.parse().ok();
    let report = check_exactly_once(&f.broker, GROUP, IN, OUT, id).await.unwrap();
    assert_eq!(report.violation_count, extra);
    assert_eq!(report.violations.len(), MAX_VIOLATION_LINES + 1);
    assert_eq!(report.violations.last().unwrap(), "... and 200 more");
    assert!(!report.ok());
}
