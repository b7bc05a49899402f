//! The connector conformance suite: behaviours every [`ShareConsumer`] must have, run
//! unchanged against the embedded broker and against real Kafka. Differences between
//! the two are listed in `docs/decisions/kafka-client.md`.
#![allow(unreachable_pub, dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use shareflow::connector::share::{AcknowledgeType, Record, ShareConsumer};
use shareflow::runtime::async_trait;

/// What the suite needs from a broker.
#[async_trait]
pub trait Backend: Send + Sync {
    /// For messages.
    fn name(&self) -> &str;
    /// A new topic with `partitions` partitions holding `records` records.
    async fn topic(&self, partitions: u32, records: u64) -> String;
    /// A new share group whose acquisition locks last `lock`, reading from the earliest offset.
    async fn group(&self, lock: Duration) -> String;
    /// A member of `group` subscribed to `topic`, in explicit acknowledgement mode.
    async fn member(&self, group: &str, topic: &str) -> Box<dyn ShareConsumer>;
    /// Lets `by` pass on the broker's clock.
    async fn pass(&self, by: Duration);
}

/// Long enough that a renewal every quarter of it has a wide margin on a loaded machine
/// (a Kafka round trip there can take a second).
const LOCK: Duration = Duration::from_millis(5_000);

/// Polls until `want` records arrived; callers ask for at most one poll's worth.
async fn poll_until(m: &mut dyn ShareConsumer, want: usize, backend: &dyn Backend) -> Vec<Record> {
    let mut got = Vec::new();
    for _ in 0..300 {
        got.extend(m.poll(500, Duration::from_millis(100)).await.expect("poll"));
        if got.len() >= want {
            return got;
        }
    }
    panic!("{}: only {} of {want} records arrived", backend.name(), got.len());
}

async fn poll_nothing(m: &mut dyn ShareConsumer, backend: &dyn Backend, why: &str) {
    for _ in 0..5 {
        let got = m.poll(500, Duration::from_millis(100)).await.expect("poll");
        assert!(got.is_empty(), "{}: {why}, but got {got:?}", backend.name());
    }
}

/// Every record is delivered once, with delivery count 1; accepted records never return.
pub async fn delivers_each_record_once(b: &dyn Backend) {
    let topic = b.topic(2, 20).await;
    let group = b.group(Duration::from_secs(30)).await;
    let mut m = b.member(&group, &topic).await;
    // Kafka's rule, which both must accept: settle a poll's records before the next.
    let mut got = Vec::new();
    for _ in 0..300 {
        let batch = m.poll(500, Duration::from_millis(100)).await.expect("poll");
        for r in &batch {
            m.acknowledge(r, AcknowledgeType::Accept).await.expect("accept");
        }
        got.extend(batch);
        if got.len() >= 20 {
            break;
        }
    }
    let distinct: BTreeSet<(i32, i64)> = got.iter().map(|r| (r.partition, r.offset)).collect();
    assert_eq!((got.len(), distinct.len()), (20, 20), "{}: each record once", b.name());
    assert!(got.iter().all(|r| r.delivery_count == 1), "{}: first deliveries count 1", b.name());
    m.commit().await.expect("commit");
    poll_nothing(m.as_mut(), b, "accepted records are done").await;
    m.close().await.expect("close");
}

/// RELEASE hands a record out again at once, delivery count + 1; REJECT never again.
pub async fn release_redelivers_and_reject_archives(b: &dyn Backend) {
    let topic = b.topic(1, 2).await;
    let group = b.group(Duration::from_secs(30)).await;
    let mut m = b.member(&group, &topic).await;
    let mut got = poll_until(m.as_mut(), 2, b).await;
    got.sort_by_key(|r| r.offset);
    m.acknowledge(&got[0], AcknowledgeType::Release).await.expect("release");
    m.acknowledge(&got[1], AcknowledgeType::Reject).await.expect("reject");
    m.commit().await.expect("commit");
    let again = poll_until(m.as_mut(), 1, b).await;
    assert_eq!(again.len(), 1, "{}: only the released record returns", b.name());
    assert_eq!((again[0].offset, again[0].delivery_count), (got[0].offset, 2), "{}", b.name());
    m.acknowledge(&again[0], AcknowledgeType::Accept).await.expect("accept");
    m.commit().await.expect("commit");
    poll_nothing(m.as_mut(), b, "a rejected record is archived").await;
    m.close().await.expect("close");
}

/// A lock that expires hands the record to another member, delivery count + 1.
pub async fn expired_locks_redeliver(b: &dyn Backend) {
    let topic = b.topic(1, 1).await;
    let group = b.group(LOCK).await;
    let mut first = b.member(&group, &topic).await;
    let got = poll_until(first.as_mut(), 1, b).await;
    b.pass(LOCK + Duration::from_millis(500)).await;
    let mut second = b.member(&group, &topic).await;
    let again = poll_until(second.as_mut(), 1, b).await;
    assert_eq!((again[0].offset, again[0].delivery_count), (got[0].offset, 2), "{}", b.name());
    second.acknowledge(&again[0], AcknowledgeType::Accept).await.expect("accept");
    second.commit().await.expect("commit");
    second.close().await.expect("close");
    let _ = first.close().await;
}

/// RENEW restarts the lock: the record is not redelivered while it is renewed.
pub async fn renew_keeps_the_lock(b: &dyn Backend) {
    let topic = b.topic(1, 1).await;
    let group = b.group(LOCK).await;
    let mut holder = b.member(&group, &topic).await;
    // Joined first: its join must not eat into the lock before the first renewal.
    let mut other = b.member(&group, &topic).await;
    let got = poll_until(holder.as_mut(), 1, b).await;
    // Held for 1.5 lock durations, renewed every quarter.
    for _ in 0..6 {
        b.pass(LOCK / 4).await;
        holder.acknowledge(&got[0], AcknowledgeType::Renew).await.expect("renew");
        holder.commit().await.expect("renew reaches the broker");
        let stolen = other.poll(10, Duration::from_millis(50)).await.expect("poll");
        assert!(stolen.is_empty(), "{}: a renewed record stays with its holder: {stolen:?}", b.name());
    }
    holder.acknowledge(&got[0], AcknowledgeType::Accept).await.expect("accept");
    holder.commit().await.expect("commit");
    poll_nothing(other.as_mut(), b, "the accepted record is done").await;
    holder.close().await.expect("close");
    other.close().await.expect("close");
}

/// Transactional acknowledgement of offsets the member never received is refused.
pub async fn acknowledging_foreign_records_is_refused(b: &dyn Backend) {
    let topic = b.topic(1, 1).await;
    let group = b.group(Duration::from_secs(30)).await;
    let mut m = b.member(&group, &topic).await;
    let got = poll_until(m.as_mut(), 1, b).await;
    let mut foreign = got[0].clone();
    foreign.offset += 100;
    let refused = m.acknowledge(&foreign, AcknowledgeType::Accept).await;
    let committed = if refused.is_ok() { m.commit().await } else { Ok(()) };
    assert!(refused.is_err() || committed.is_err(), "{}: acknowledging an unknown offset must fail", b.name());
    let _ = m.close().await;
}
