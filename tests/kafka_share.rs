//! The share consumer against a real Kafka 4.x broker: membership, splitting work,
//! lock expiry, RELEASE, REJECT and RENEW; and the topic writer that loads their input.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use shareflow::connector::kafka::{JoinGate, KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig};
use shareflow::connector::share::{
    AcknowledgeType, Record, ShareAcknowledgements, ShareConsumer, TransactionHandle, TransactionId,
};
use shareflow::connector::ErrorKind;
use support::kafka::{cluster, numbered, unique};

async fn topic_with(c: &KafkaCluster, partitions: i32, records: u64) -> String {
    let topic = unique("share-in");
    c.ensure_topic(&topic, partitions, &[]).await.expect("create topic");
    c.produce(&topic, numbered(records)).await.expect("produce");
    topic
}

/// A member of `group` reading `topic` in share fetches of up to `fetch` records.
async fn member(c: &KafkaCluster, group: &str, topic: &str, fetch: usize) -> KafkaShareConsumer {
    let mut config = KafkaShareConsumerConfig::new(group);
    config.fetch_max_records = fetch;
    let mut m = KafkaShareConsumer::new(c, config).await.expect("consumer");
    m.subscribe(&[topic]).await.expect("subscribe");
    m
}

async fn group_with(c: &KafkaCluster, lock_ms: u32) -> String {
    let group = unique("share-group");
    c.set_group_configs(
        &group,
        &[("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", &lock_ms.to_string())],
    )
    .await
    .expect("group configs");
    group
}

/// The share coordinator persists start offsets asynchronously: wait for them.
async fn wait_drained(c: &KafkaCluster, group: &str, topic: &str) {
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let backlog = c.share_group_backlog(group, topic).await.expect("backlog");
        if backlog.drained() {
            return;
        }
        assert!(tokio::time::Instant::now() < end, "group {group} never drained {topic}: {backlog:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits up to 30 s until `m` holds `partitions` partitions of `topic`.
async fn until_holding(m: &KafkaShareConsumer, topic: &str, partitions: usize) {
    support::kafka::until(Duration::from_secs(30), || m.assignment().get(topic).is_some_and(|p| p.len() == partitions))
        .await;
}

/// Polls until some records arrive or `wait` passes.
async fn poll_some(m: &mut KafkaShareConsumer, wait: Duration) -> Vec<Record> {
    let end = tokio::time::Instant::now() + wait;
    loop {
        let got = m.poll(500, Duration::from_millis(200)).await.expect("poll");
        if !got.is_empty() || tokio::time::Instant::now() > end {
            return got;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_one_group_split_the_work_and_every_record_arrives_once() {
    let Some(c) = cluster().await else { return };
    let total = 3_000u64;
    let topic = topic_with(&c, 2, total).await;
    let group = group_with(&c, 15_000).await;
    let mut a = member(&c, &group, &topic, 100).await;
    let mut b = member(&c, &group, &topic, 100).await;
    // Both pass the join gate first, as the source's subtasks do: a member that got both
    // partitions before the other joined would lose one at its next heartbeat, and the
    // acknowledgements it kept for that partition with it.
    let gate = JoinGate::new(2, Duration::from_secs(20));
    let (pa, pb) = tokio::join!(gate.settle(0, &mut a), gate.settle(1, &mut b));
    assert!(pa.expect("gate a").settled && pb.expect("gate b").settled, "both members hold a partition");
    let mut seen = BTreeSet::new();
    let (mut by_a, mut by_b, mut dup) = (0u64, 0u64, 0u64);
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < total && tokio::time::Instant::now() < end {
        for (m, count) in [(&mut a, &mut by_a), (&mut b, &mut by_b)] {
            for r in m.poll(100, Duration::from_millis(50)).await.expect("poll") {
                assert_eq!(r.delivery_count, 1, "nothing expired, nothing is redelivered");
                if !seen.insert((r.partition, r.offset)) {
                    dup += 1;
                }
                *count += 1;
                m.acknowledge(&r, AcknowledgeType::Accept).await.expect("accept");
            }
        }
    }
    a.commit().await.expect("commit a");
    b.commit().await.expect("commit b");
    assert_eq!(seen.len() as u64, total, "every record arrives");
    assert_eq!(dup, 0, "no record goes to two members");
    assert!(by_a > 0 && by_b > 0, "both members got work: a={by_a} b={by_b}");
    wait_drained(&c, &group, &topic).await;
    a.close().await.expect("close");
    b.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lock_redelivers_with_the_delivery_count_raised() {
    let Some(c) = cluster().await else { return };
    let topic = topic_with(&c, 1, 1).await;
    let group = group_with(&c, 3_000).await;
    let mut a = member(&c, &group, &topic, 10).await;
    let first = poll_some(&mut a, Duration::from_secs(30)).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].delivery_count, 1);
    // a never settles it; after the lock another member gets it again. (3 s: b's accept
    // must reach the broker within b's own lock, on a loaded machine too.)
    let mut b = member(&c, &group, &topic, 10).await;
    let again = poll_some(&mut b, Duration::from_secs(30)).await;
    assert_eq!(again.len(), 1, "redelivered after the lock expired");
    assert_eq!((again[0].partition, again[0].offset), (first[0].partition, first[0].offset));
    assert_eq!(again[0].delivery_count, 2);
    b.acknowledge(&again[0], AcknowledgeType::Accept).await.expect("accept");
    b.commit().await.expect("commit");
    let _ = a.close().await;
    wait_drained(&c, &group, &topic).await;
    b.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_redelivers_at_once_and_reject_archives() {
    let Some(c) = cluster().await else { return };
    let topic = topic_with(&c, 1, 2).await;
    let group = group_with(&c, 15_000).await;
    let mut a = member(&c, &group, &topic, 10).await;
    let mut got = poll_some(&mut a, Duration::from_secs(30)).await;
    while got.len() < 2 {
        let more = poll_some(&mut a, Duration::from_secs(10)).await;
        assert!(!more.is_empty(), "both records arrive");
        got.extend(more);
    }
    got.sort_by_key(|r| r.offset);
    a.acknowledge(&got[0], AcknowledgeType::Release).await.expect("release");
    a.acknowledge(&got[1], AcknowledgeType::Reject).await.expect("reject");
    a.commit().await.expect("commit");
    let again = poll_some(&mut a, Duration::from_secs(10)).await;
    assert_eq!(again.len(), 1, "only the released record comes back, well before its 15 s lock would expire");
    assert_eq!(again[0].offset, got[0].offset);
    assert_eq!(again[0].delivery_count, 2);
    a.acknowledge(&again[0], AcknowledgeType::Accept).await.expect("accept");
    a.commit().await.expect("commit");
    let none = poll_some(&mut a, Duration::from_secs(2)).await;
    assert!(none.is_empty(), "the rejected record is archived, never delivered again: {none:?}");
    wait_drained(&c, &group, &topic).await;
    a.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_keeps_the_lock_past_its_duration() {
    let Some(c) = cluster().await else { return };
    let topic = topic_with(&c, 1, 1).await;
    // A renewal's round trip, and b's poll, take a second on a loaded machine: the lock
    // is 6 s so that every renewal lands well inside it.
    let group = group_with(&c, 6_000).await;
    let mut a = member(&c, &group, &topic, 10).await;
    // b joins before a takes the record (it fetches only when it polls), so that its
    // join does not eat into the lock before the first renewal.
    let mut b = member(&c, &group, &topic, 10).await;
    let got = poll_some(&mut a, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1);
    // Hold it for 2.5 lock durations, renewing every ~600 ms; b must never see it.
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::time::Instant::now() < end {
        a.acknowledge(&got[0], AcknowledgeType::Renew).await.expect("renew");
        a.commit().await.expect("renew accepted by the broker");
        let stolen = b.poll(10, Duration::from_millis(300)).await.expect("poll b");
        assert!(stolen.is_empty(), "a renewed lock is not redelivered: {stolen:?}");
    }
    a.acknowledge(&got[0], AcknowledgeType::Accept).await.expect("accept");
    a.commit().await.expect("commit");
    wait_drained(&c, &group, &topic).await;
    a.close().await.expect("close");
    b.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_past_the_join_gate_hold_disjoint_shares_of_one_epoch() {
    let Some(c) = cluster().await else { return };
    let topic = topic_with(&c, 4, 400).await;
    let group = group_with(&c, 15_000).await;
    // A group whose partitions are initialised assigns at once: the first member to
    // join gets all four, and learns that it lost two only at its next heartbeat.
    let mut first = member(&c, &group, &topic, 100).await;
    until_holding(&first, &topic, 4).await;
    first.close().await.expect("close");
    let mut a = member(&c, &group, &topic, 100).await;
    until_holding(&a, &topic, 4).await;
    assert_eq!(a.assignment().get(&topic).map(Vec::len), Some(4), "the only member gets every partition");
    let mut b = member(&c, &group, &topic, 100).await;
    // The coordinator assigns the newcomer a share a while after its join: until then
    // it holds nothing and the first member holds every partition.
    assert!(b.assignment().is_empty() || a.member_epoch() < b.member_epoch(), "b holds nothing yet, or a newer epoch");

    let gate = JoinGate::new(2, Duration::from_secs(20));
    let (pa, pb) = tokio::join!(gate.settle(0, &mut a), gate.settle(1, &mut b));
    let (pa, pb) = (pa.expect("gate a"), pb.expect("gate b"));
    assert!(pa.settled && pb.settled, "both settled: {pa:?} {pb:?}");
    assert!(pa.heartbeats + pb.heartbeats > 0, "a member heartbeat ahead of its interval: {pa:?} {pb:?}");
    assert_eq!(a.member_epoch(), b.member_epoch(), "both hold the assignment of one epoch");
    let of = |m: &KafkaShareConsumer| -> BTreeSet<i32> {
        m.assignment().get(&topic).into_iter().flatten().copied().collect()
    };
    let (sa, sb) = (of(&a), of(&b));
    assert!(!sa.is_empty() && !sb.is_empty(), "both hold partitions: {sa:?} {sb:?}");
    assert!(sa.is_disjoint(&sb), "no partition is assigned to both: {sa:?} {sb:?}");
    assert_eq!(sa.union(&sb).copied().collect::<Vec<_>>(), vec![0, 1, 2, 3], "every partition is assigned");

    // A gate of one member passes at once; an index outside the gate passes unsettled.
    let alone = JoinGate::new(1, Duration::from_secs(20));
    assert!(alone.settle(0, &mut a).await.expect("gate").settled);
    assert!(!alone.settle(1, &mut b).await.expect("gate").settled);
    a.close().await.expect("close");
    b.close().await.expect("close");
}

/// A member of a new group holding the records of its first poll of a new topic of 3.
async fn member_holding_records(c: &KafkaCluster) -> (String, String, KafkaShareConsumer, Vec<Record>) {
    let topic = topic_with(c, 1, 3).await;
    let group = group_with(c, 15_000).await;
    let mut a = member(c, &group, &topic, 10).await;
    let got = poll_some(&mut a, Duration::from_secs(30)).await;
    assert!(!got.is_empty());
    (topic, group, a, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_use_gets_typed_errors() {
    let Some(c) = cluster().await else { return };
    let (_topic, group, mut a, got) = member_holding_records(&c).await;
    let err = a.poll(10, Duration::from_millis(10)).await.expect_err("unsettled records");
    assert!(err.to_string().contains("not settled"), "{err}");
    let err = a.poll(0, Duration::from_millis(10)).await.expect_err("a poll of nothing");
    assert!(err.to_string().contains("at least 1"), "{err}");
    let mut foreign = got[0].clone();
    foreign.offset += 1_000;
    let err = a.acknowledge(&foreign, AcknowledgeType::Accept).await.expect_err("never delivered");
    assert!(err.to_string().contains("was not delivered"), "{err}");
    for r in &got {
        a.acknowledge(r, AcknowledgeType::Accept).await.expect("accept");
    }
    a.close().await.expect("close");
    let mut idle = KafkaShareConsumer::new(&c, KafkaShareConsumerConfig::new(&group)).await.expect("consumer");
    let err = idle.heartbeat_now().await.expect_err("heartbeat before subscribe");
    assert!(err.to_string().contains("subscribe to the topics first"), "{err}");
    let mut zero = KafkaShareConsumerConfig::new(&group);
    zero.fetch_max_records = 0;
    let err = KafkaShareConsumer::new(&c, zero).await.expect_err("a fetch of no records");
    assert!(err.to_string().contains("fetch_max_records"), "the error names the setting: {err}");
    let err = KafkaCluster::connect("").await.expect_err("empty bootstrap");
    assert!(err.to_string().contains("bootstrap.servers"), "{err}");
}

/// Stock Kafka has no KIP-1289: the Kafka consumer refuses transactional
/// acknowledgements with an error that says so and names the way that works, and the
/// records stay held, to be settled as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_acknowledgements_are_refused_on_stock_kafka() {
    let Some(c) = cluster().await else { return };
    let (topic, group, mut a, got) = member_holding_records(&c).await;
    let txn = TransactionHandle { id: TransactionId::new(group.as_str(), "job", 1).expect("id"), epoch: 0 };
    let acks = ShareAcknowledgements::from_records(&got, AcknowledgeType::Accept).expect("acks");
    let err = a.acknowledge_batches_transactional(&acks, &txn).await.expect_err("no KIP-1289 on stock Kafka");
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let text = err.to_string();
    assert!(text.contains("KIP-1289") && text.contains("KafkaTransactions"), "{text}");
    let err = a.acknowledge_transactional(&got[0], AcknowledgeType::Accept, &txn).await.expect_err("one record");
    assert!(err.to_string().contains("KIP-1289"), "{err}");
    for r in &got {
        assert!(a.is_unsettled(r), "offset {} was settled by a refused call", r.offset);
        a.acknowledge(r, AcknowledgeType::Accept).await.expect("accept");
    }
    a.commit().await.expect("commit");
    a.close().await.expect("close");
    wait_drained(&c, &group, &topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_an_expired_lock_is_refused() {
    // The Kafka source relies on this: a lock it cannot renew is reported, so it
    // releases the record instead of naming it in an intent.
    let Some(c) = cluster().await else { return };
    let topic = topic_with(&c, 1, 1).await;
    let group = group_with(&c, 3_000).await;
    let mut a = member(&c, &group, &topic, 10).await;
    let got = poll_some(&mut a, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1);
    let mut b = member(&c, &group, &topic, 10).await;
    let again = poll_some(&mut b, Duration::from_secs(30)).await;
    assert_eq!(again.len(), 1, "the lock expired and b holds the record now");
    a.acknowledge(&got[0], AcknowledgeType::Renew).await.expect("queued");
    // However long after the renewal the commit comes: the renewal goes with it, so the
    // commit waits for its answer (sent at once, it could be answered before the
    // commit began to wait, and its refusal would go unseen).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = a.commit_outcome().await.expect("outcome");
    assert_eq!(refused.len(), 1, "renewing a lock a owns no more must be refused: {refused:?}");
    b.acknowledge(&again[0], AcknowledgeType::Accept).await.expect("accept");
    b.close().await.expect("close");
    let _ = a.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_writer_delivers_every_record_in_order_and_counts_them() {
    let Some(c) = cluster().await else { return };
    let topic = unique("writer-out");
    c.ensure_topic(&topic, 1, &[]).await.expect("create topic");
    let mut w = c.writer(&topic).await.expect("writer");
    let value = |i: u32| bytes::Bytes::from(format!("v{i}"));
    w.send((0..3).map(|i| (Some(bytes::Bytes::from(format!("k{i}"))), value(i)))).await.expect("send");
    assert_eq!(w.flush().await.expect("flush"), 3, "flush counts what was acknowledged");
    w.send((3..5).map(|i| (None, value(i)))).await.expect("send");
    assert_eq!(w.close().await.expect("close"), 5, "close counts every record written");
    let got = c.read_topic(&topic, false).await.expect("read");
    let values: Vec<_> = got.iter().map(|(_, _, _, v)| v.clone().expect("a value")).collect();
    assert_eq!(values, (0..5).map(value).collect::<Vec<_>>(), "one partition keeps send order");
    let keys: Vec<_> = got.iter().map(|(_, _, k, _)| k.clone()).collect();
    assert_eq!(keys[0].as_deref(), Some(&b"k0"[..]));
    assert_eq!(keys[4], None, "a record sent without a key has none");
    c.delete_topics(&[topic.as_str()]).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_writer_that_failed_refuses_further_writes() {
    let Some(c) = cluster().await else { return };
    let topic = unique("writer-small");
    c.ensure_topic(&topic, 1, &[("max.message.bytes", "1024")]).await.expect("create topic");
    let mut w = c.writer(&topic).await.expect("writer");
    w.send([(None, bytes::Bytes::from(vec![b'x'; 10_000]))]).await.expect("queued");
    let err = w.flush().await.expect_err("a record too large for the topic");
    assert!(err.to_string().contains(&topic), "the error names the topic: {err}");
    let again = w.send([(None, bytes::Bytes::from_static(b"small"))]).await.expect_err("refused");
    assert!(again.to_string().contains("failed earlier"), "{again}");
    assert!(w.close().await.is_err(), "a failed writer does not claim a count");
    c.delete_topics(&[topic.as_str()]).await.expect("delete");
}

/// A member that joins takes partitions from one that holds unsettled records. The
/// first member's acknowledgements of those records cannot be sent any more: they settle
/// locally without an error (they used to fail the job as a client bug), are counted, and
/// the broker gives the records back when their locks expire, so nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_partition_taken_away_settle_without_an_error_and_come_back() {
    let Some(c) = cluster().await else { return };
    let total = 400u64;
    let topic = topic_with(&c, 4, total).await;
    // Up to 3 groups: the move must take a partition the first member holds records of.
    for attempt in 0..4 {
        // Locks outlast the wait for the new assignment (a heartbeat interval, 2 s on
        // the test broker), and expire soon enough for the taken records to come back.
        let group = group_with(&c, 15_000).await;
        c.set_group_configs(&group, &[("share.delivery.count.limit", "10")]).await.expect("delivery limit");
        let mut a = member(&c, &group, &topic, 500).await;
        until_holding(&a, &topic, 4).await;
        assert_eq!(a.assignment().get(&topic).map(Vec::len), Some(4), "the only member gets every partition");
        // A poll with records of every partition, so that whichever partitions the group
        // moves, some of them are unsettled. A poll of fewer (the first fetches often
        // bring one partition) is given back and tried again; the group's delivery limit
        // is raised so that these retries archive nothing.
        let mut got = Vec::new();
        for _ in 0..8 {
            // Time for the client's background fetches to bring the other partitions.
            tokio::time::sleep(Duration::from_millis(300)).await;
            got = poll_some(&mut a, Duration::from_secs(30)).await;
            if got.iter().map(|r| r.partition).collect::<BTreeSet<_>>().len() == 4 {
                break;
            }
            for r in &got {
                a.acknowledge(r, AcknowledgeType::Release).await.expect("release");
            }
            // At once: released with the next fetch, the broker would leave them out of
            // that fetch, and the polls would alternate between the same partitions.
            a.commit().await.expect("release");
            got.clear();
        }
        assert!(!got.is_empty(), "no poll brought records of every partition in 8 tries");
        assert!(got.iter().all(|r| a.is_unsettled(r)), "a poll's records are unsettled");
        let polled_at = tokio::time::Instant::now();
        let mut b = member(&c, &group, &topic, 500).await;
        support::kafka::until(Duration::from_secs(12), || a.assignment().get(&topic).is_some_and(|p| p.len() < 4))
            .await;
        assert!(polled_at.elapsed() < Duration::from_secs(13), "the move came before the locks could expire");
        let kept = a.assignment().get(&topic).cloned().unwrap_or_default();
        assert!(kept.len() < 4, "the group moved partitions to the new member: {:?}", a.assignment());
        for r in &got {
            a.acknowledge(r, AcknowledgeType::Accept).await.expect("no error for a partition taken away");
        }
        let taken: BTreeSet<(i32, i64)> =
            got.iter().filter(|r| !kept.contains(&r.partition)).map(|r| (r.partition, r.offset)).collect();
        // The acknowledgements go to the client at the commit, and are counted there.
        a.commit().await.expect("commit");
        assert_eq!(a.revoked_unsettled(), taken.len() as u64, "each record of a partition taken away is counted");
        if taken.is_empty() {
            assert!(attempt < 3, "four moves in a row took only partitions without unsettled records");
            a.close().await.expect("close");
            b.close().await.expect("close");
            continue;
        }
        // The taken records come back, delivery count raised, once their locks expire;
        // the others are accepted once.
        let mut seen: BTreeSet<(i32, i64)> =
            got.iter().filter(|r| kept.contains(&r.partition)).map(|r| (r.partition, r.offset)).collect();
        let mut back = BTreeSet::new();
        let end = tokio::time::Instant::now() + Duration::from_secs(60);
        while (seen.len() as u64) < total && tokio::time::Instant::now() < end {
            for m in [&mut a, &mut b] {
                for r in m.poll(500, Duration::from_millis(100)).await.expect("poll") {
                    if taken.contains(&(r.partition, r.offset)) {
                        assert!(r.delivery_count > 1, "a taken record comes back as a redelivery: {r:?}");
                        back.insert((r.partition, r.offset));
                    }
                    seen.insert((r.partition, r.offset));
                    m.acknowledge(&r, AcknowledgeType::Accept).await.expect("accept");
                }
                m.commit().await.expect("commit");
            }
        }
        assert_eq!(seen.len() as u64, total, "every record arrives");
        assert_eq!(back, taken, "every taken record came back");
        wait_drained(&c, &group, &topic).await;
        a.close().await.expect("close");
        b.close().await.expect("close");
        return;
    }
}

/// Polls `m` for up to 30 s until it hands out records and holds more of the same fetch,
/// accepting and giving back polls that bring everything they fetched (the first fetch
/// of a new group can bring only part of a partition).
async fn poll_holding(m: &mut KafkaShareConsumer, max: usize) -> Vec<Record> {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = m.poll(max, Duration::from_millis(200)).await.expect("poll");
        assert!(got.len() <= max, "a poll hands out at most its max_records: {} > {max}", got.len());
        if !got.is_empty() && m.held() > 0 {
            return got;
        }
        for r in &got {
            m.acknowledge(r, AcknowledgeType::Release).await.expect("release");
        }
        assert!(tokio::time::Instant::now() < end, "no fetch brought more than {max} records in 30 s");
    }
}

/// A fetch larger than a poll: the polls hand it out in order, at most their
/// `max_records` each, the member fetches again only once it was all handed out and
/// settled, and the acknowledgements kept meanwhile reach the broker with that fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_larger_than_a_poll_is_handed_out_over_several_polls_once_each() {
    let Some(c) = cluster().await else { return };
    let total = 600u64;
    let topic = topic_with(&c, 1, total).await;
    let group = group_with(&c, 15_000).await;
    let mut a = member(&c, &group, &topic, 1_000).await;
    let mut seen = BTreeSet::new();
    let (mut polls, mut from_held) = (0u32, 0u32);
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < total && tokio::time::Instant::now() < end {
        let held_before = a.held();
        let got = a.poll(50, Duration::from_millis(200)).await.expect("poll");
        assert!(got.len() <= 50, "a poll hands out at most 50: {}", got.len());
        if got.is_empty() {
            continue;
        }
        polls += 1;
        if held_before > 0 {
            from_held += 1;
            assert_eq!(a.held(), held_before - got.len(), "a poll of a held fetch hands out what it held, in order");
        }
        let offsets: Vec<i64> = got.iter().map(|r| r.offset).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "in fetch order: {offsets:?}");
        for r in &got {
            assert_eq!(r.delivery_count, 1, "nothing is redelivered: {r:?}");
            assert!(seen.insert(r.offset), "{r:?} handed out twice");
            a.acknowledge(r, AcknowledgeType::Accept).await.expect("accept");
        }
    }
    assert_eq!(seen.len() as u64, total, "every record arrives");
    assert!(from_held > 0, "some polls were served from a held fetch ({polls} polls)");
    // The last polls' acknowledgements are still kept: the next poll, which fetches,
    // passes them on, without a commit.
    let none = a.poll(50, Duration::from_millis(200)).await.expect("poll");
    assert!(none.is_empty(), "nothing is left: {none:?}");
    wait_drained(&c, &group, &topic).await;
    a.close().await.expect("close");
}

/// A member of a new group on a topic of [`HELD_TOTAL`] records, holding part of a
/// fetch: it accepted the poll it was handed, and holds `held` more.
struct Holding {
    topic: String,
    group: String,
    a: KafkaShareConsumer,
    accepted: BTreeSet<i64>,
    held: usize,
}

const HELD_TOTAL: u64 = 200;

async fn holding(c: &KafkaCluster, lock_ms: u32) -> Holding {
    let topic = topic_with(c, 1, HELD_TOTAL).await;
    let group = group_with(c, lock_ms).await;
    let mut a = member(c, &group, &topic, 1_000).await;
    let got = poll_holding(&mut a, 10).await;
    for r in &got {
        a.acknowledge(r, AcknowledgeType::Accept).await.expect("accept");
    }
    let held = a.held();
    assert!(held > 0);
    Holding { topic, group, a, accepted: got.iter().map(|r| r.offset).collect(), held }
}

/// Polls `members` in turn, accepting every record, until they got every record of
/// `topic` but `accepted`, or 30 s passed; then commits each, waits until `group`
/// drained the topic, and closes each. No record `accepted` comes, and none twice.
/// Returns how many came redelivered.
async fn the_rest(
    c: &KafkaCluster,
    group: &str,
    topic: &str,
    members: &mut [&mut KafkaShareConsumer],
    accepted: &BTreeSet<i64>,
) -> usize {
    let rest = HELD_TOTAL - accepted.len() as u64;
    let (mut seen, mut redelivered) = (BTreeSet::new(), 0usize);
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while (seen.len() as u64) < rest && tokio::time::Instant::now() < end {
        for m in members.iter_mut() {
            for r in m.poll(500, Duration::from_millis(100)).await.expect("poll") {
                assert!(!accepted.contains(&r.offset), "{r:?} was accepted before");
                assert!(seen.insert(r.offset), "{r:?} handed out twice");
                redelivered += usize::from(r.delivery_count >= 2);
                m.acknowledge(&r, AcknowledgeType::Accept).await.expect("accept");
            }
        }
    }
    assert_eq!(seen.len() as u64, rest, "every record not accepted arrives within 30 s");
    for m in members.iter_mut() {
        m.commit().await.expect("commit");
    }
    wait_drained(c, group, topic).await;
    for m in members.iter_mut() {
        m.close().await.expect("close");
    }
    redelivered
}

/// A commit passes the acknowledgements a member kept to the broker at once: the
/// records it accepted never come back, while the locks of those it held and never
/// handed out expire and another member gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_sends_the_acknowledgements_kept_while_a_fetch_is_held() {
    let Some(c) = cluster().await else { return };
    let Holding { topic, group, mut a, accepted, .. } = holding(&c, 4_000).await;
    a.commit().await.expect("commit");
    // a holds the rest past its 4 s locks; b gets every other record, and none a accepted.
    let mut b = member(&c, &group, &topic, 1_000).await;
    the_rest(&c, &group, &topic, &mut [&mut b], &accepted).await;
    let _ = a.close().await;
}

/// A member that closes holding part of a fetch sends the acknowledgements it kept, and
/// the records it never handed out go back (it releases them, and its share session's
/// close releases what it still holds): another member gets them at once, well before
/// their 60 s locks would expire, and never the records the first one accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_while_holding_a_fetch_accepts_what_was_settled_and_releases_the_rest() {
    let Some(c) = cluster().await else { return };
    let Holding { topic, group, mut a, accepted, held } = holding(&c, 60_000).await;
    a.close().await.expect("close");
    let mut b = member(&c, &group, &topic, 1_000).await;
    let redelivered = the_rest(&c, &group, &topic, &mut [&mut b], &accepted).await;
    assert!(redelivered >= held, "the {held} records a held came back released ({redelivered} redelivered)");
}

/// A member whose assignment changed since a fetch (another member joined) gives back
/// what it held of that fetch rather than handing it out: the partition may be the other
/// member's now, or, after a fence, the locks gone. The records come back at once,
/// delivery count raised, well before their 60 s locks would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_fetch_goes_back_when_the_assignment_changes() {
    let Some(c) = cluster().await else { return };
    let Holding { topic, group, mut a, accepted, held } = holding(&c, 60_000).await;
    let epoch = a.member_epoch();
    let mut b = member(&c, &group, &topic, 1_000).await;
    support::kafka::until(Duration::from_secs(15), || a.member_epoch() != epoch).await;
    assert_ne!(a.member_epoch(), epoch, "b's join moved a to a new epoch");
    let redelivered = the_rest(&c, &group, &topic, &mut [&mut a, &mut b], &accepted).await;
    assert!(redelivered >= held, "the {held} records a held went back and came again ({redelivered} redelivered)");
}

/// What a member still holds half a lock duration after the fetch goes back instead of
/// out: a record handed out has at least half its lock left, as the exactly-once
/// source's intents need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_fetch_older_than_half_the_lock_goes_back() {
    let Some(c) = cluster().await else { return };
    let Holding { topic, group, mut a, accepted, held } = holding(&c, 4_000).await;
    // Past half of the 4 s lock, before it expires.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let redelivered = the_rest(&c, &group, &topic, &mut [&mut a], &accepted).await;
    assert!(redelivered >= held, "the {held} records held went back and came again ({redelivered} redelivered)");
}

/// A poll dropped while its fetch waits on the broker loses nothing: the fetch goes on
/// on the member's client thread, and the next poll hands out what it brought, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_dropped_while_its_fetch_waits_loses_no_record() {
    let Some(c) = cluster().await else { return };
    let total = 300u64;
    let topic = topic_with(&c, 1, 0).await;
    let group = group_with(&c, 15_000).await;
    let mut a = member(&c, &group, &topic, 500).await;
    // The topic is empty: the poll waits on its fetch until it is dropped.
    let dropped = tokio::time::timeout(Duration::from_millis(300), a.poll(500, Duration::from_secs(20))).await;
    assert!(dropped.is_err(), "an empty topic's poll is still waiting: {dropped:?}");
    c.produce(&topic, numbered(total)).await.expect("produce");
    let mut seen = BTreeSet::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < total && tokio::time::Instant::now() < end {
        for r in a.poll(500, Duration::from_millis(500)).await.expect("a poll after a dropped one") {
            assert_eq!(r.delivery_count, 1, "nothing is redelivered: {r:?}");
            assert!(seen.insert(r.offset), "{} came twice", r.offset);
            a.acknowledge(&r, AcknowledgeType::Accept).await.expect("accept");
        }
    }
    assert_eq!(seen.len() as u64, total, "every record arrives");
    a.commit().await.expect("commit");
    wait_drained(&c, &group, &topic).await;
    a.close().await.expect("close");
}
