//! The transaction state machine, its idempotency list, atomic visibility, fencing and
//! the typed errors of bad requests, on the embedded broker.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use shareflow::connector::broker::{BrokerMetrics, EmbeddedTransactionCoordinator};
use shareflow::connector::share::AcknowledgeType::*;
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use shareflow::connector::{Error, ErrorKind};
use support::*;

async fn setup() -> (Fixture, EmbeddedTransactionCoordinator) {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 10).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    (f, coord)
}

fn assert_illegal(result: Result<(), Error>, op: &str, state: TransactionState) {
    match result {
        Err(Error::IllegalTransition { op: o, state: s, .. }) => assert_eq!((o, s), (op, state)),
        other => panic!("expected illegal {op} in {state}, got {other:?}"),
    }
}

#[tokio::test]
async fn idempotency_list_of_the_seed() {
    let (f, coord) = setup().await;
    let id = txn_id(1);
    let h1 = coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap();
    let h2 = coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap();
    assert_eq!(h1, h2, "begin returns the existing transaction");
    coord.prepare_transaction(&id).await.unwrap();
    coord.prepare_transaction(&id).await.unwrap();
    coord.commit_transaction(&id).await.unwrap();
    coord.commit_transaction(&id).await.unwrap();
    coord.abort_transaction(&id).await.unwrap(); // abort of a committed one is a no-op
    assert_eq!(f.broker.transaction_state(&id).await.unwrap(), TransactionState::Committed);

    let id2 = txn_id(2);
    coord.begin_transaction(&id2, TXN_TIMEOUT).await.unwrap();
    coord.abort_transaction(&id2).await.unwrap();
    coord.abort_transaction(&id2).await.unwrap();
    assert_eq!(f.broker.transaction_state(&id2).await.unwrap(), TransactionState::Aborted);
    assert_eq!(f.broker.metrics().await.unwrap().transaction_abort_total, 1, "a no-op abort is not counted");
}

#[tokio::test]
async fn every_other_transition_is_a_typed_error() {
    let (_f, coord) = setup().await;
    let (committed, aborted, ongoing, prepared) = (txn_id(1), txn_id(2), txn_id(3), txn_id(4));
    coord.begin_transaction(&committed, TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&committed).await.unwrap();
    coord.commit_transaction(&committed).await.unwrap();
    coord.begin_transaction(&aborted, TXN_TIMEOUT).await.unwrap();
    coord.abort_transaction(&aborted).await.unwrap();
    coord.begin_transaction(&ongoing, TXN_TIMEOUT).await.unwrap();
    coord.begin_transaction(&prepared, TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&prepared).await.unwrap();

    assert_illegal(coord.commit_transaction(&aborted).await, "commit", TransactionState::Aborted);
    assert_illegal(coord.commit_transaction(&ongoing).await, "commit", TransactionState::Ongoing);
    assert_illegal(coord.prepare_transaction(&aborted).await, "prepare", TransactionState::Aborted);
    assert_illegal(coord.prepare_transaction(&committed).await, "prepare", TransactionState::Committed);
    assert_illegal(
        coord.begin_transaction(&committed, TXN_TIMEOUT).await.map(|_| ()),
        "begin",
        TransactionState::Committed,
    );
    // KIP-1289: begin "returns existing if already started" (decision 0003).
    assert!(coord.begin_transaction(&prepared, TXN_TIMEOUT).await.is_ok());
    let unknown = txn_id(99);
    for result in [
        coord.prepare_transaction(&unknown).await,
        coord.commit_transaction(&unknown).await,
        coord.abort_transaction(&unknown).await,
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::UnknownTransaction { .. }), "{err}");
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert!(err.to_string().contains("orders-eu-job-99"), "{err}");
    }
}

#[tokio::test]
async fn ack_into_a_prepared_transaction_is_refused_and_changes_nothing() {
    let (f, coord) = setup().await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&txn.id).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 1).await;
    let err = c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap_err();
    assert!(
        matches!(err, Error::IllegalTransition { op: "acknowledge", state: TransactionState::Prepare, .. }),
        "{err}"
    );
    assert_eq!(f.state(0, 0).await, RecordState::Acquired);
}

#[tokio::test]
async fn commit_makes_output_and_acks_visible_together() {
    let (f, coord) = setup().await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 5).await;
    let out = got.iter().map(|r| ProducerRecord::new(OUT, 0, r.value.clone().unwrap())).collect();
    coord.send(&txn, out).await.unwrap();
    c.acknowledge_batches_transactional(&acks(&got, Accept), &txn).await.unwrap();

    async fn committed(f: &Fixture) -> usize {
        f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap().len()
    }
    assert_eq!(committed(&f).await, 0, "read_committed sees nothing before commit");
    assert_eq!(f.broker.fetch_all(&out_tp(), IsolationLevel::ReadUncommitted).await.unwrap().len(), 5);
    assert_eq!(f.broker.last_stable_offset(&out_tp()).await.unwrap(), 0);
    coord.prepare_transaction(&txn.id).await.unwrap();
    assert_eq!(committed(&f).await, 0, "nor after prepare");
    coord.commit_transaction(&txn.id).await.unwrap();
    assert_eq!(committed(&f).await, 5);
    for o in 0..5 {
        assert_eq!(f.state(0, o).await, RecordState::Acknowledged);
    }
    let m = f.broker.metrics().await.unwrap();
    assert_eq!((m.transaction_commit_time.count, m.transaction_prepare_time.count), (1, 1));
}

#[tokio::test]
async fn aborted_output_is_never_visible_to_read_committed() {
    let (f, coord) = setup().await;
    let t1 = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.send(&t1, vec![ProducerRecord::new(OUT, 0, "aborted")]).await.unwrap();
    let t2 = coord.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    coord.send(&t2, vec![ProducerRecord::new(OUT, 0, "committed")]).await.unwrap();
    coord.abort_transaction(&t1.id).await.unwrap();
    coord.prepare_transaction(&t2.id).await.unwrap();
    coord.commit_transaction(&t2.id).await.unwrap();
    let seen = f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].offset, seen[0].value.as_deref()), (1, Some(&b"committed"[..])));
}

#[tokio::test]
async fn send_share_acks_to_transaction_binds_acks_of_a_member() {
    let (f, coord) = setup().await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 3).await;
    coord.send_share_acks_to_transaction(&txn, c.member_id(), &acks(&got, Accept)).await.unwrap();
    assert_eq!(f.state(0, 2).await, RecordState::Locked);
    let pending = coord.list_pending_transactions(GROUP).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].pending_acks.record_count(), 3);
    let stranger = MemberId("member-999".into());
    let err = coord.send_share_acks_to_transaction(&txn, &stranger, &acks(&got, Accept)).await.unwrap_err();
    assert!(err.to_string().contains("member-999"), "{err}");
}

#[tokio::test]
async fn max_pending_transactions_is_enforced() {
    let cfg = ShareConfig::builder().acknowledgement_mode(Transactional).max_pending_transactions(2).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    coord.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    coord.prepare_transaction(&txn_id(2)).await.unwrap();
    let err = coord.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let msg = err.to_string();
    assert!(msg.contains("share.transaction.max.pending=2") && msg.contains("orders-eu-job-1"), "{msg}");
    coord.abort_transaction(&txn_id(1)).await.unwrap();
    coord.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.unwrap();
}

#[tokio::test]
async fn a_second_instance_fences_the_first() {
    let (f, old) = setup().await;
    let ongoing = old.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let prepared = old.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let got = poll(&mut c, 2).await;
    c.acknowledge_batches_transactional(&acks(&got[1..], Accept), &prepared).await.unwrap();
    old.prepare_transaction(&prepared.id).await.unwrap();

    let new = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    assert_eq!(new.epoch(), old.epoch() + 1);
    assert_eq!(
        f.broker.transaction_state(&ongoing.id).await.unwrap(),
        TransactionState::Aborted,
        "ONGOING of the old epoch aborted"
    );
    assert_eq!(
        f.broker.transaction_state(&prepared.id).await.unwrap(),
        TransactionState::Prepare,
        "PREPARE left to the new owner"
    );

    for result in [
        old.commit_transaction(&prepared.id).await,
        old.abort_transaction(&prepared.id).await,
        old.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.map(|_| ()),
        c.acknowledge_batches_transactional(&acks(&got[..1], Accept), &ongoing).await,
        old.send(&ongoing, vec![ProducerRecord::new(OUT, 0, "x")]).await.map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    }
    // A new transaction with the same id as a stale handle's cannot take the stale writes.
    let fresh = new.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.unwrap();
    let stale = TransactionHandle { id: fresh.id.clone(), epoch: old.epoch() };
    let err = c.acknowledge_batches_transactional(&acks(&got[..1], Accept), &stale).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced);
    assert!(err.to_string().contains("another instance with the same prefix"), "{err}");
    new.commit_transaction(&prepared.id).await.unwrap();
    assert_eq!(f.state(0, 1).await, RecordState::Acknowledged);
}

#[tokio::test]
async fn acks_of_records_not_held_are_refused_with_offsets_and_member() {
    let (f, coord) = setup().await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut a = f.consumer(Transactional).await;
    let mut b = f.consumer(Transactional).await;
    let held_by_a = poll(&mut a, 2).await;
    // b acknowledges a's records.
    let err = b.acknowledge_batches_transactional(&acks(&held_by_a, Accept), &txn).await.unwrap_err();
    match &err {
        Error::NotAcquired { member, offset, state, detail, .. } => {
            assert_eq!(member, &b.member_id().0);
            assert_eq!((*offset, *state), (0, RecordState::Acquired));
            assert!(detail.contains(&a.member_id().0), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.kind(), ErrorKind::Invalid);
    // Offsets never delivered.
    let mut never = ShareAcknowledgements::new();
    never.add(tp(0), AcknowledgementBatch::new(5, 7, Accept)).unwrap();
    let err = a.acknowledge_batches_transactional(&never, &txn).await.unwrap_err();
    assert!(matches!(err, Error::NeverDelivered { from: 5, .. }), "{err}");
    assert!(err.to_string().contains("offsets 5..=7"), "{err}");
    // Partly valid: all or nothing.
    let mut mixed = ShareAcknowledgements::new();
    mixed.add(tp(0), AcknowledgementBatch::new(0, 1, Accept)).unwrap();
    mixed.add(tp(0), AcknowledgementBatch::new(3, 3, Accept)).unwrap();
    assert!(a.acknowledge_batches_transactional(&mixed, &txn).await.is_err());
    assert_eq!(f.state(0, 0).await, RecordState::Acquired, "nothing applied");
    // RELEASE cannot be staged in a transaction.
    let err = a.acknowledge_batches_transactional(&acks(&held_by_a, Release), &txn).await.unwrap_err();
    assert!(err.to_string().contains("only ACCEPT and REJECT"), "{err}");
    // ACCEPT outside a transaction is refused in transactional mode.
    assert!(a.acknowledge(&held_by_a[0], Accept).await.is_err());
    // A transaction of another group or prefix.
    let foreign = TransactionHandle { id: TransactionId::new("other", PREFIX, 1).unwrap(), epoch: 1 };
    assert!(a.acknowledge_batches_transactional(&acks(&held_by_a, Accept), &foreign).await.is_err());
    assert!(coord.begin_transaction(&TransactionId::new(GROUP, "other", 1).unwrap(), TXN_TIMEOUT).await.is_err());
}

#[tokio::test]
async fn explicit_mode_consumers_cannot_ack_transactionally() {
    let (f, coord) = setup().await;
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 1).await;
    let err = c.acknowledge_transactional(&got[0], Accept, &txn).await.unwrap_err();
    assert!(err.to_string().contains("share.acknowledgement.mode=transactional"), "{err}");
}

/// Transactional acknowledgement is opt-in, at the broker too: staging an explicit or
/// implicit member's records through the coordinator is refused, and the member still
/// settles them itself.
#[tokio::test]
async fn staging_acks_of_a_member_not_in_transactional_mode_is_refused() {
    let f = Fixture::new(1, config(Explicit)).await;
    f.produce(0, 10).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    for mode in [Explicit, Implicit] {
        let mut c = f.consumer(mode).await;
        let got = poll(&mut c, 2).await;
        let err = coord.send_share_acks_to_transaction(&txn, c.member_id(), &acks(&got, Accept)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{mode}: {err}");
        let text = err.to_string();
        assert!(text.contains(&format!("share.acknowledgement.mode={mode}")) && text.contains("opt-in"), "{text}");
        for r in &got {
            assert_eq!(f.state(0, r.offset).await, RecordState::Acquired, "{mode}: offset {} was staged", r.offset);
        }
        if mode == Explicit {
            for r in &got {
                c.acknowledge(r, Accept).await.unwrap();
            }
            c.commit().await.unwrap();
        } else {
            poll(&mut c, 1).await; // the next poll accepts the previous one's records
        }
        for r in &got {
            assert_eq!(f.state(0, r.offset).await, RecordState::Acknowledged, "{mode}: offset {}", r.offset);
        }
        c.close().await.unwrap();
    }
    let pending = coord.list_pending_transactions(GROUP).await.unwrap();
    assert_eq!(pending[0].pending_acks.record_count(), 0, "nothing was staged");
}

/// A repeated begin returns the open transaction, but only for the same timeout, and
/// a timeout above the group's is refused on a repeat as on a first begin.
#[tokio::test]
async fn a_repeated_begin_validates_its_timeout_and_must_match_the_open_one() {
    let (_f, coord) = setup().await;
    let id = txn_id(1);
    let first = coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap();
    assert_eq!(coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap(), first);
    let err = coord.begin_transaction(&id, Duration::from_secs(24 * 3600)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("allows 1..="), "{err}");
    let other = TXN_TIMEOUT / 2;
    let err = coord.begin_transaction(&id, other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let text = err.to_string();
    let (open, asked) = (TXN_TIMEOUT.as_millis().to_string(), other.as_millis().to_string());
    assert!(text.contains(&format!("timeout of {open} ms")) && text.contains(&format!("not {asked} ms")), "{text}");
    // The open transaction is unchanged, and still takes the same timeout.
    assert_eq!(coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap(), first);
}

/// An empty set of acknowledgements answers as a non-empty one would: an unknown
/// transaction, a fenced epoch or a decided transaction are errors, not Ok.
#[tokio::test]
async fn empty_acknowledgements_still_check_the_transaction_and_its_epoch() {
    let (f, old) = setup().await;
    let mut c = f.consumer(Transactional).await;
    let empty = ShareAcknowledgements::new();
    let ongoing = old.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    c.acknowledge_batches_transactional(&empty, &ongoing).await.unwrap();
    old.send_share_acks_to_transaction(&ongoing, c.member_id(), &empty).await.unwrap();

    let unknown = TransactionHandle { id: txn_id(7), epoch: old.epoch() };
    for result in [
        c.acknowledge_batches_transactional(&empty, &unknown).await,
        old.send_share_acks_to_transaction(&unknown, c.member_id(), &empty).await,
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::UnknownTransaction { .. }), "{err:?}");
    }
    let decided = old.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
    old.prepare_transaction(&decided.id).await.unwrap();
    assert!(c.acknowledge_batches_transactional(&empty, &decided).await.is_err(), "a prepared transaction");
    let short = old.begin_transaction(&txn_id(3), Duration::from_secs(1)).await.unwrap();
    f.advance(Duration::from_secs(2));
    for result in [
        c.acknowledge_batches_transactional(&empty, &short).await,
        old.send_share_acks_to_transaction(&short, c.member_id(), &empty).await,
    ] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::IllegalTransition { state: TransactionState::Aborted, .. }), "{err:?}");
    }

    let _new = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    for result in [
        c.acknowledge_batches_transactional(&empty, &ongoing).await,
        old.send_share_acks_to_transaction(&ongoing, c.member_id(), &empty).await,
    ] {
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Fenced);
    }
}

#[tokio::test]
async fn read_committed_share_group_skips_aborted_and_waits_for_open_transactions() {
    let cfg = ShareConfig::builder().isolation_level(IsolationLevel::ReadCommitted).build().unwrap();
    let f = Fixture::new(1, cfg).await;
    let producer = f.broker.transaction_coordinator("producer", "p").await.unwrap();
    let t1 = producer.begin_transaction(&TransactionId::new("producer", "p", 1).unwrap(), TXN_TIMEOUT).await.unwrap();
    producer.send(&t1, vec![ProducerRecord::new(IN, 0, "a"), ProducerRecord::new(IN, 0, "b")]).await.unwrap();
    f.produce(0, 1).await; // offset 2, after the open transaction
    let mut c = f.consumer(Explicit).await;
    assert!(poll(&mut c, 10).await.is_empty(), "blocked at the last stable offset");
    producer.abort_transaction(&t1.id).await.unwrap();
    let got = poll(&mut c, 10).await;
    assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![2]);
    let s = f.broker.record_status(GROUP, &tp(0), 0).await.unwrap();
    assert_eq!((s.state, s.archive_reason), (RecordState::Archived, Some(ArchiveReason::AbortedTransaction)));
}

#[tokio::test]
async fn bad_topics_and_requests_are_invalid_not_panics() {
    let (f, _coord) = setup().await;
    for (name, parts) in [("", 1), ("bad name", 1), ("ok", 0)] {
        assert_eq!(f.broker.create_topic(name, parts).await.unwrap_err().kind(), ErrorKind::Invalid);
    }
    assert!(f.broker.create_topic(IN, 3).await.is_err(), "a topic cannot change its partition count");
    assert!(f.broker.produce(vec![ProducerRecord::new("missing", 0, "x")]).await.is_err());
    assert!(f.broker.produce(vec![ProducerRecord::new(IN, 7, "x")]).await.is_err());
    let mut c = f.broker.consumer(GROUP, config(Explicit)).await.unwrap();
    assert!(c.subscribe(&["missing"]).await.is_err());
    assert!(f.broker.consumer("bad group", config(Explicit)).await.is_err());
    assert!(f.broker.transaction_coordinator(GROUP, "-leading-dash").await.is_err());
    assert!(f.broker.transaction_coordinator(GROUP, "white space").await.is_err());
    assert!(f.broker.fetch(&TopicPartition::new("missing", 0), 0, 1, IsolationLevel::ReadCommitted).await.is_err());
    assert!(f.broker.record_status(GROUP, &tp(0), 1_000).await.is_err());
    assert_eq!(c.poll(0, Duration::ZERO).await.unwrap_err().kind(), ErrorKind::Invalid);
}

#[tokio::test]
async fn poll_waits_for_records_to_arrive() {
    let f = Fixture::new(1, config(Explicit)).await;
    let mut c = f.consumer(Explicit).await;
    let broker = f.broker.clone();
    let producer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        broker.produce(vec![ProducerRecord::new(IN, 0, "late")]).await.unwrap();
    });
    let got = c.poll(10, Duration::from_secs(10)).await.unwrap();
    assert_eq!(got.len(), 1);
    producer.await.unwrap();
}

#[tokio::test]
async fn metric_names_are_the_seeds() {
    let (f, _coord) = setup().await;
    let names: Vec<String> = f.broker.metrics().await.unwrap().iter().into_iter().map(|(n, _)| n).collect();
    for name in [
        "share-transaction-active",
        "share-transaction-prepare-time-ms-p99",
        "share-transaction-commit-time-ms-p99",
        "share-transaction-abort-total",
        "share-transaction-timeout-total",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
    }
}

/// The mode check holds for an empty acknowledgement set too, through the coordinator:
/// nothing to stage, but an explicit or implicit member is refused as a non-empty set
/// would be, and a transactional member is admitted; the model broker answers the same.
#[tokio::test]
async fn an_empty_acknowledgement_set_meets_the_same_mode_check() {
    let f = Fixture::new(1, config(Explicit)).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let txn = coord.begin_transaction(&txn_id(1), TXN_TIMEOUT).await.unwrap();
    let empty = ShareAcknowledgements::new();
    for mode in [Explicit, Implicit, Transactional] {
        let c = f.consumer(mode).await;
        let result = coord.send_share_acks_to_transaction(&txn, c.member_id(), &empty).await;
        match mode {
            Transactional => result.unwrap(),
            _ => {
                let err = result.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Invalid, "{mode}: {err}");
                assert!(err.to_string().contains("opt-in"), "{mode}: {err}");
            }
        }
    }
}
