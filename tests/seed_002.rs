//! KIP-1289's two examples, line by line, on the embedded broker: the consume-transform-
//! produce loop that commits output and share acknowledgements in one transaction
//! (§2.1), and the `TransactionalShareAcknowledger` of a framework without a producer
//! (§2.2). Also both answers to a commit from ONGOING: the coordinator's two-phase
//! `commit_transaction` refuses it, naming the missing prepare; `commit_one_phase` is
//! KIP-1289's `commitTransaction`.

#![allow(clippy::unwrap_used)]

mod support;

use shareflow::connector::broker::TransactionalShareAcknowledger;
use shareflow::connector::share::AcknowledgeType::*;
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use shareflow::connector::{Error, ErrorKind};
use support::*;

fn upper(r: &Record) -> ProducerRecord {
    ProducerRecord::new(OUT, 0, r.value.as_ref().unwrap().to_ascii_uppercase())
}

/// §2.1: begin; poll; send each transformed record; sendShareAcksToTransaction;
/// commitTransaction. Output and acknowledgements become visible together.
#[tokio::test]
async fn consume_transform_produce_commits_output_and_acks_in_one_transaction() {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 5).await;
    let producer = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut share_consumer = f.consumer(Transactional).await;
    let id = txn_id(1);

    // producer.beginTransaction();
    let txn = producer.begin_transaction(&id, TXN_TIMEOUT).await.unwrap();
    // ConsumerRecords<K,V> records = shareConsumer.poll(Duration.ofMillis(100));
    let records = share_consumer.poll(100, std::time::Duration::from_millis(100)).await.unwrap();
    assert_eq!(records.len(), 5);
    // for (record : records) producer.send(transform(record));
    for record in &records {
        producer.send(&txn, vec![upper(record)]).await.unwrap();
    }
    // producer.sendShareAcksToTransaction(ShareAcknowledgements.fromRecords(records, ACCEPT), groupMetadata);
    let acks = ShareAcknowledgements::from_records(&records, Accept).unwrap();
    producer.send_share_acks_to_transaction(&txn, share_consumer.member_id(), &acks).await.unwrap();
    // Nothing is visible before the commit.
    assert!(f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap().is_empty());
    assert_eq!(f.state(0, 0).await, RecordState::Locked);
    // producer.commitTransaction();
    producer.commit_one_phase(&id).await.unwrap();

    let out = f.broker.fetch_all(&out_tp(), IsolationLevel::ReadCommitted).await.unwrap();
    let values: Vec<Vec<u8>> = out.iter().map(|r| r.value.as_ref().unwrap().to_vec()).collect();
    let expected: Vec<Vec<u8>> = records.iter().map(|r| r.value.as_ref().unwrap().to_ascii_uppercase()).collect();
    assert_eq!(values, expected);
    for r in &records {
        assert_eq!(f.state(0, r.offset).await, RecordState::Acknowledged);
    }
    // Idempotent by id, as the seed's table says.
    producer.commit_one_phase(&id).await.unwrap();
    assert_eq!(f.broker.transaction_state(&id).await.unwrap(), TransactionState::Committed);
}

/// The coordinator's own commit stays phase 2 of two (decision 0003): from ONGOING it
/// is refused with an error that names the missing prepare and the one-phase call, and
/// the transaction is left as it was.
#[tokio::test]
async fn a_two_phase_commit_from_ongoing_names_the_missing_prepare() {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 2).await;
    let coord = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
    let mut c = f.consumer(Transactional).await;
    let id = txn_id(1);
    let txn = coord.begin_transaction(&id, TXN_TIMEOUT).await.unwrap();
    let records = poll(&mut c, 2).await;
    coord.send_share_acks_to_transaction(&txn, c.member_id(), &acks(&records, Accept)).await.unwrap();

    let err = coord.commit_transaction(&id).await.unwrap_err();
    assert!(matches!(err, Error::IllegalTransition { op: "commit", state: TransactionState::Ongoing, .. }), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::Invalid);
    let text = err.to_string();
    assert!(text.contains("prepare_transaction first") && text.contains("commit_one_phase"), "{text}");
    assert_eq!(f.broker.transaction_state(&id).await.unwrap(), TransactionState::Ongoing);
    assert_eq!(f.state(0, 0).await, RecordState::Locked);

    // The two-phase path, as the runtime runs it.
    coord.prepare_transaction(&id).await.unwrap();
    coord.commit_transaction(&id).await.unwrap();
    assert_eq!(f.state(0, 1).await, RecordState::Acknowledged);
    // Other illegal transitions keep their plain message.
    let err = coord.prepare_transaction(&id).await.unwrap_err();
    assert!(!err.to_string().contains("commit_one_phase"), "{err}");
}

/// §2.2: `new TransactionalShareAcknowledger(props)`; `initTransactions()`; on each
/// checkpoint complete `commitAcknowledgements(bufferedAcks, shareGroupId)`.
#[tokio::test]
async fn the_transactional_share_acknowledger_of_a_framework_without_a_producer() {
    let f = Fixture::new(1, config(Transactional)).await;
    f.produce(0, 6).await;
    let mut source = f.consumer(Transactional).await;

    // TransactionalShareAcknowledger acknowledger = new TransactionalShareAcknowledger(props);
    let mut acknowledger = TransactionalShareAcknowledger::new(&f.broker, GROUP, PREFIX);
    let buffered = acks(&poll(&mut source, 3).await, Accept);
    let err = acknowledger.commit_acknowledgements(1, source.member_id(), &buffered).await.unwrap_err();
    assert!(err.to_string().contains("init_transactions"), "{err}");
    // acknowledger.initTransactions();
    let epoch = acknowledger.init_transactions().await.unwrap();
    assert_eq!(acknowledger.epoch(), Some(epoch));

    // On checkpoint complete: acknowledger.commitAcknowledgements(bufferedAcks, shareGroupId);
    let id = acknowledger.commit_acknowledgements(1, source.member_id(), &buffered).await.unwrap();
    assert_eq!(id, txn_id(1));
    assert_eq!(f.broker.transaction_state(&id).await.unwrap(), TransactionState::Committed);
    for offset in 0..3 {
        assert_eq!(f.state(0, offset).await, RecordState::Acknowledged);
    }
    // Again with the same id: Ok, and nothing changes.
    acknowledger.commit_acknowledgements(1, source.member_id(), &buffered).await.unwrap();
    assert_eq!(f.state(0, 3).await, RecordState::Available);

    // A crash between prepare and commit leaves the next checkpoint's transaction
    // PREPARE; the acknowledger of the next incarnation commits it.
    let next = acks(&poll(&mut source, 3).await, Accept);
    {
        let crashed = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
        let txn = crashed.begin_transaction(&txn_id(2), TXN_TIMEOUT).await.unwrap();
        crashed.send_share_acks_to_transaction(&txn, source.member_id(), &next).await.unwrap();
        crashed.prepare_transaction(&txn.id).await.unwrap();
    }
    let mut restarted = TransactionalShareAcknowledger::new(&f.broker, GROUP, PREFIX);
    assert!(restarted.init_transactions().await.unwrap() > epoch);
    restarted.commit_acknowledgements(2, source.member_id(), &next).await.unwrap();
    for offset in 3..6 {
        assert_eq!(f.state(0, offset).await, RecordState::Acknowledged);
    }
    // A retry may finish only what it started: an open id holding other
    // acknowledgements is refused, naming both counts.
    f.produce(0, 2).await;
    let two = poll(&mut source, 2).await;
    {
        let crashed = f.broker.transaction_coordinator(GROUP, PREFIX).await.unwrap();
        let txn = crashed.begin_transaction(&txn_id(3), TXN_TIMEOUT).await.unwrap();
        crashed.send_share_acks_to_transaction(&txn, source.member_id(), &acks(&two[..1], Accept)).await.unwrap();
        crashed.prepare_transaction(&txn.id).await.unwrap();
    }
    let mut third = TransactionalShareAcknowledger::new(&f.broker, GROUP, PREFIX);
    third.init_transactions().await.unwrap();
    let err = third.commit_acknowledgements(3, source.member_id(), &acks(&two, Accept)).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("holding 1 acknowledged records, not the 2"), "{text}");
    assert_eq!(f.broker.transaction_state(&txn_id(3)).await.unwrap(), TransactionState::Prepare);
    third.commit_acknowledgements(3, source.member_id(), &acks(&two[..1], Accept)).await.unwrap();
    assert_eq!(f.state(0, two[0].offset).await, RecordState::Acknowledged);

    // The first acknowledger is fenced by the newer incarnation.
    let err = acknowledger.commit_acknowledgements(4, source.member_id(), &ShareAcknowledgements::new()).await;
    assert_eq!(err.unwrap_err().kind(), ErrorKind::Fenced);
}
