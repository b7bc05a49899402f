//! Records archived at the delivery limit on the embedded broker: dead-lettered once, in
//! the journal entry that marks them so, with KIP-1191's headers (decision 0041).

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;

use shareflow::connector::broker::DeadLetterTarget;
use shareflow::connector::share::AcknowledgementMode::*;
use shareflow::connector::share::*;
use support::*;

const DLQ: &str = "dlq";

fn target(copy_record: bool) -> DeadLetterTarget {
    DeadLetterTarget { topic: DLQ.into(), copy_record }
}

/// A broker on `dir` whose group archives a record at its second failed delivery, with
/// 6 records in `in` and the topic `dlq`.
async fn fixture(dir: &std::path::Path) -> Fixture {
    let cfg = ShareConfig::builder().delivery_count_limit(2).build().unwrap();
    let f = Fixture::on_local_dir(dir, 1, cfg).await;
    f.broker.create_topic(DLQ, 1).await.unwrap();
    f.produce(0, 6).await;
    f
}

/// Delivers every record twice, never acknowledging, except record 0 (accepted at its
/// first delivery): records 1..=5 end archived at the limit.
async fn fail_twice(f: &Fixture) {
    let mut c = f.consumer(Explicit).await;
    let got = poll(&mut c, 10).await;
    assert_eq!(got.len(), 6);
    c.acknowledge(&got[0], AcknowledgeType::Accept).await.unwrap();
    c.commit().await.unwrap();
    f.advance(LOCK);
    f.broker.tick().await.unwrap();
    assert_eq!(poll(&mut c, 10).await.len(), 5);
    f.advance(LOCK);
    f.broker.tick().await.unwrap();
}

/// The dead-letter topic's records, by the offset they came from.
async fn letters(broker: &shareflow::connector::broker::EmbeddedBroker) -> BTreeMap<i64, Vec<FetchedRecordView>> {
    let mut by_offset: BTreeMap<i64, Vec<FetchedRecordView>> = BTreeMap::new();
    for r in broker.fetch_all(&TopicPartition::new(DLQ, 0), IsolationLevel::ReadCommitted).await.unwrap() {
        let h =
            |name: &str| r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| String::from_utf8(v.to_vec()).unwrap());
        let offset: i64 = h(dead_letter::HEADER_OFFSET).unwrap().parse().unwrap();
        by_offset.entry(offset).or_default().push(FetchedRecordView {
            value: r.value.map(|v| v.to_vec()),
            topic: h(dead_letter::HEADER_TOPIC),
            partition: h(dead_letter::HEADER_PARTITION),
            group: h(dead_letter::HEADER_GROUP),
            delivery_count: h(dead_letter::HEADER_DELIVERY_COUNT),
            cause: h(dead_letter::HEADER_CAUSE),
            message: h(dead_letter::HEADER_MESSAGE),
        });
    }
    by_offset
}

#[derive(Debug)]
struct FetchedRecordView {
    value: Option<Vec<u8>>,
    topic: Option<String>,
    partition: Option<String>,
    group: Option<String>,
    delivery_count: Option<String>,
    cause: Option<String>,
    message: Option<String>,
}

async fn reason(broker: &shareflow::connector::broker::EmbeddedBroker, offset: i64) -> Option<ArchiveReason> {
    broker.record_status(GROUP, &tp(0), offset).await.unwrap().archive_reason
}

#[tokio::test]
async fn records_archived_at_the_limit_are_dead_lettered_once_with_kip_1191_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture(dir.path()).await;
    assert_eq!(f.broker.dead_letter_archived(GROUP, target(true)).await.unwrap(), 0, "nothing archived yet");
    fail_twice(&f).await;
    let got = letters(&f.broker).await;
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5], "{got:?}");
    for (offset, copies) in &got {
        assert_eq!(copies.len(), 1, "offset {offset}: {copies:?}");
        let l = &copies[0];
        assert_eq!(l.value.as_deref(), Some(format!("v{offset}").as_bytes()));
        assert_eq!(
            (l.topic.as_deref(), l.partition.as_deref(), l.group.as_deref()),
            (Some(IN), Some("0"), Some(GROUP))
        );
        assert_eq!((l.delivery_count.as_deref(), l.cause.as_deref()), (Some("2"), Some("delivery-limit")));
        assert!(l.message.as_deref().unwrap().contains("delivery limit"), "{l:?}");
        assert_eq!(reason(&f.broker, *offset).await, Some(ArchiveReason::DeadLettered));
    }
    assert_eq!(f.state(0, 0).await, RecordState::Acknowledged);
    assert_eq!(reason(&f.broker, 0).await, None);

    // A reopen replays the journal: the same dead letters, none twice, none again.
    f.restart().await;
    assert_eq!(f.broker.dead_letter_archived(GROUP, target(true)).await.unwrap(), 0);
    let again = letters(&f.broker).await;
    assert_eq!(again.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert!(again.values().all(|c| c.len() == 1), "{again:?}");
    assert_eq!(reason(&f.broker, 3).await, Some(ArchiveReason::DeadLettered));
}

/// What a crash between archiving and dead-lettering leaves (archived, no target yet in
/// the new process) is dead-lettered once the target is set.
#[tokio::test]
async fn records_archived_without_a_target_are_dead_lettered_once_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture(dir.path()).await;
    fail_twice(&f).await;
    assert!(letters(&f.broker).await.is_empty());
    assert_eq!(reason(&f.broker, 2).await, Some(ArchiveReason::DeliveryLimit));
    f.restart().await;
    assert_eq!(f.broker.dead_letter_archived(GROUP, target(false)).await.unwrap(), 5);
    let got = letters(&f.broker).await;
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert!(got.values().all(|c| c.len() == 1 && c[0].value.is_none()), "headers only: {got:?}");
    assert_eq!(reason(&f.broker, 2).await, Some(ArchiveReason::DeadLettered));
    assert_eq!(f.broker.dead_letter_archived(GROUP, target(false)).await.unwrap(), 0, "each once");
}

#[tokio::test]
async fn a_missing_dead_letter_topic_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture(dir.path()).await;
    let t = DeadLetterTarget { topic: "nowhere".into(), copy_record: true };
    let err = f.broker.dead_letter_archived(GROUP, t).await.unwrap_err().to_string();
    assert!(err.contains("nowhere") && err.contains("create it"), "{err}");
    // Nothing was set: archiving later dead-letters nothing and fails nothing.
    fail_twice(&f).await;
    assert_eq!(reason(&f.broker, 1).await, Some(ArchiveReason::DeliveryLimit));
}

/// A run archived at once that is longer than one journal entry's letters (1,000) goes
/// out in several entries, each record once.
#[tokio::test]
async fn a_long_archived_run_is_dead_lettered_in_entries_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ShareConfig::builder().delivery_count_limit(2).partition_max_record_locks(10_000).build().unwrap();
    let f = Fixture::on_local_dir(dir.path(), 1, cfg).await;
    f.broker.create_topic(DLQ, 1).await.unwrap();
    f.produce(0, 2_500).await;
    f.broker.dead_letter_archived(GROUP, target(true)).await.unwrap();
    let mut c = f.consumer(Explicit).await;
    for _ in 0..2 {
        assert_eq!(poll(&mut c, 10_000).await.len(), 2_500);
        f.advance(LOCK);
        f.broker.tick().await.unwrap();
    }
    let got = letters(&f.broker).await;
    assert_eq!(got.len(), 2_500);
    assert!(got.values().all(|c| c.len() == 1), "each once");
    assert_eq!(reason(&f.broker, 2_499).await, Some(ArchiveReason::DeadLettered));
}
