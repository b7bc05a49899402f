//! Several shareflow instances in one share group on a real Kafka 4.x broker (decision
//! 0008): ordered claims, taking over an earlier generation, adopting another prefix,
//! and the bounded pool of transactional ids.

mod support;

use std::time::Duration;

use bytes::Bytes;
use shareflow::connector::kafka::{KafkaCluster, KafkaTransactions, KafkaTransactionsConfig, LedgerRange};
use shareflow::connector::share::ProducerRecord;
use shareflow::runtime::{ErrorKind, PrepareOutcome, TransactionParticipant, TransactionTemplate};
use support::kafka::{cluster, unique};

fn participant(c: &KafkaCluster) -> std::sync::Arc<KafkaTransactions> {
    KafkaTransactions::new(c.clone(), KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(60)))
}

fn range(first: i64, last: i64) -> LedgerRange {
    LedgerRange { topic: "in".into(), partition: 0, first, last }
}

fn records(topic: &str, n: u32) -> Vec<ProducerRecord> {
    (0..n)
        .map(|i| ProducerRecord { partition: None, ..ProducerRecord::new(topic, 0, Bytes::from(format!("rec-{i}"))) })
        .collect()
}

async fn output_topic(c: &KafkaCluster) -> String {
    let out = unique("scale-out");
    c.ensure_topic(&out, 1, &[]).await.expect("topic");
    out
}

/// Offsets of the queued replay, merged, in order.
fn queued(p: &KafkaTransactions) -> Vec<(i64, i64)> {
    let mut v: Vec<(i64, i64)> = p.queued_replay().iter().map(|r| (r.first, r.last)).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_two_instances_claim_one_offset_the_first_intent_wins_and_the_other_epoch_aborts() {
    let Some(c) = cluster().await else { return };
    let group = unique("claims");
    let out = output_topic(&c).await;
    let (ta, tb) = (TransactionTemplate::new(&group, "a").unwrap(), TransactionTemplate::new(&group, "b").unwrap());
    let (a, b) = (participant(&c), participant(&c));
    a.open(&ta).await.expect("open a");
    b.open(&tb).await.expect("open b");
    for (p, t) in [(&a, &ta), (&b, &tb)] {
        p.take_over(t).await.expect("take over");
        p.begin(&t.transaction(1)).await.expect("begin");
        p.send(1, records(&out, 3)).await.expect("send");
    }
    // a names 0..=9 first; b's intent overlaps it (a redelivery b's index had not seen).
    a.write_intent(1, 0, vec![range(0, 9)]).await.expect("intent a");
    b.write_intent(1, 0, vec![range(10, 19), range(5, 5)]).await.expect("intent b");
    assert_eq!(b.prepare(&tb.transaction(1)).await.expect("prepare b"), PrepareOutcome::AlreadyAborted);
    assert_eq!(a.prepare(&ta.transaction(1)).await.expect("prepare a"), PrepareOutcome::Prepared);
    a.commit(&ta.transaction(1)).await.expect("commit a");
    assert!(c.wait_stable(&out, Duration::from_secs(30)).await.expect("stable"));
    assert_eq!(c.read_committed(&out).await.expect("read").len(), 3, "only a's epoch shows");
    // Intents that overlap nobody's prepare fine.
    b.begin(&tb.transaction(2)).await.expect("begin");
    b.write_intent(2, 0, vec![range(20, 29)]).await.expect("intent");
    assert_eq!(b.prepare(&tb.transaction(2)).await.expect("prepare"), PrepareOutcome::Prepared);
    b.commit(&tb.transaction(2)).await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_generation_replays_what_the_last_one_named_and_never_committed() {
    let Some(c) = cluster().await else { return };
    let template = TransactionTemplate::new(&unique("generations"), "a").unwrap();
    let out = output_topic(&c).await;
    let old = participant(&c);
    old.open(&template).await.expect("open");
    old.take_over(&template).await.expect("take over");
    assert!(queued(&old).is_empty(), "a new prefix has nothing to replay");
    for n in [1, 2] {
        old.begin(&template.transaction(n)).await.expect("begin");
    }
    old.write_intent(1, 0, vec![range(0, 9)]).await.expect("intent");
    old.write_intent(2, 0, vec![range(10, 19)]).await.expect("intent");
    old.send(1, records(&out, 1)).await.expect("send");
    assert_eq!(old.prepare(&template.transaction(1)).await.expect("prepare"), PrepareOutcome::Prepared);
    old.commit(&template.transaction(1)).await.expect("commit");
    // The process dies with epoch 2 open. The next one takes its prefix over.
    let new = participant(&c);
    new.open(&template).await.expect("open");
    assert!(new.generation() > old.generation());
    assert!(new.pending(&template).await.expect("pending").is_empty(), "epoch 2 never prepared");
    new.take_over(&template).await.expect("take over");
    assert_eq!(queued(&new), vec![(10, 19)], "epoch 1 committed; epoch 2 is replayed");
    // The old generation's ids are fenced: it can begin nothing that commits.
    let t3 = template.transaction(3);
    let stale = old.begin(&t3).await.and(old.prepare(&t3).await.map(drop));
    assert!(stale.is_err(), "a fenced generation prepared a transaction");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopter_fences_the_adopted_instance_commits_what_its_checkpoint_decided_and_replays_the_rest() {
    let Some(c) = cluster().await else { return };
    let group = unique("adoption");
    let out = output_topic(&c).await;
    let (ta, tb) = (TransactionTemplate::new(&group, "a").unwrap(), TransactionTemplate::new(&group, "b").unwrap());
    let a = participant(&c);
    a.open(&ta).await.expect("open a");
    a.take_over(&ta).await.expect("take over");
    // Epoch 1 committed, epoch 2 prepared (its checkpoint completed), epoch 3 open.
    for (n, first) in [(1u64, 0i64), (2, 10), (3, 20)] {
        a.begin(&ta.transaction(n)).await.expect("begin");
        a.write_intent(n, 0, vec![range(first, first + 9)]).await.expect("intent");
        a.send(n, records(&out, 1)).await.expect("send");
    }
    for n in [1, 2] {
        assert_eq!(a.prepare(&ta.transaction(n)).await.expect("prepare"), PrepareOutcome::Prepared);
    }
    a.commit(&ta.transaction(1)).await.expect("commit");
    // a goes silent; b adopts it as the runtime does: an adopter opens a's prefix,
    // decides a's transactions, then b takes a's work over.
    let b = participant(&c);
    b.open(&tb).await.expect("open b");
    b.take_over(&tb).await.expect("take over own");
    let adopter = b.adopter().expect("kafka can adopt");
    adopter.open(&ta).await.expect("adopter open");
    let pending: Vec<(u64, bool)> =
        adopter.pending(&ta).await.expect("pending").iter().map(|t| (t.id.checkpoint_id(), t.prepared)).collect();
    assert_eq!(pending, vec![(2, true)], "epoch 3 never prepared and was aborted on open");
    adopter.commit(&ta.transaction(2)).await.expect("commit a's decided epoch by producer id");
    b.take_over(&ta).await.expect("take over a");
    assert_eq!(queued(&b), vec![(20, 29)], "only a's uncommitted epoch is replayed");
    // a comes back from its pause: everything it tries fails.
    let t4 = ta.transaction(4);
    let resumed = a.begin(&t4).await.and(a.prepare(&t4).await.map(drop));
    let err = resumed.expect_err("an adopted instance prepared a transaction");
    assert!(matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Fenced | ErrorKind::Internal), "{err}");
    assert!(c.wait_stable(&out, Duration::from_secs(30)).await.expect("stable"));
    assert_eq!(c.read_committed(&out).await.expect("read").len(), 2, "epochs 1 and 2 of a");
    // A late intent of a (written after the adoption) is b's to replay.
    a.write_intent(4, 0, vec![range(30, 34)]).await.expect("a zombie's intent still lands");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !queued(&b).contains(&(30, 34)) {
        assert!(tokio::time::Instant::now() < deadline, "b never queued a's late intent: {:?}", queued(&b));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A chain: a dies with epoch 1 uncommitted; b adopts a and commits a's work in an epoch
/// of its own; b dies; c adopts b, so it holds a too. Whatever order c takes the two
/// prefixes over in (a restart takes them in name order, a before b), nothing is
/// replayed: b committed it. Found by `kafka_instances` as 151 duplicated records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_an_adopter_already_committed_is_not_replayed_by_the_adopter_of_the_adopter() {
    let Some(c) = cluster().await else { return };
    let group = unique("chain");
    let out = output_topic(&c).await;
    let t = |prefix: &str| TransactionTemplate::new(&group, prefix).unwrap();
    let (ta, tb, tc) = (t("a"), t("b"), t("c"));
    let a = participant(&c);
    a.open(&ta).await.expect("open a");
    a.take_over(&ta).await.expect("take over");
    a.begin(&ta.transaction(1)).await.expect("begin");
    a.write_intent(1, 0, vec![range(0, 9)]).await.expect("intent a");
    // a goes silent with epoch 1 open; b adopts it and replays 0..=9 in its epoch 1.
    let b = participant(&c);
    b.open(&tb).await.expect("open b");
    b.take_over(&tb).await.expect("take over own");
    b.adopter().expect("kafka can adopt").open(&ta).await.expect("adopter open");
    b.take_over(&ta).await.expect("take over a");
    assert_eq!(queued(&b), vec![(0, 9)], "a's uncommitted epoch is b's to replay");
    b.begin(&tb.transaction(1)).await.expect("begin");
    b.write_intent(1, 0, vec![range(0, 9)]).await.expect("b re-claims what it holds");
    b.send(1, records(&out, 10)).await.expect("send");
    assert_eq!(b.prepare(&tb.transaction(1)).await.expect("prepare"), PrepareOutcome::Prepared);
    b.commit(&tb.transaction(1)).await.expect("commit");
    // b dies; c adopts b and holds a through it. Taken over a first, then b.
    let cc = participant(&c);
    cc.open(&tc).await.expect("open c");
    cc.take_over(&tc).await.expect("take over own");
    cc.adopter().expect("kafka can adopt").open(&tb).await.expect("adopter open");
    cc.take_over(&ta).await.expect("take over a");
    cc.take_over(&tb).await.expect("take over b");
    assert_eq!(queued(&cc), vec![], "b committed a's work; replaying it would duplicate it");
    assert!(c.wait_stable(&out, Duration::from_secs(30)).await.expect("stable"));
    assert_eq!(c.read_committed(&out).await.expect("read").len(), 10, "b's epoch, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_ids_stay_at_k_per_generation_however_many_checkpoints_run() {
    let Some(c) = cluster().await else { return };
    let template = TransactionTemplate::new(&unique("slots"), "a").unwrap();
    let out = output_topic(&c).await;
    let p = KafkaTransactions::new(
        c.clone(),
        KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(60)).slots(3),
    );
    p.open(&template).await.expect("open");
    p.take_over(&template).await.expect("take over");
    for n in 1..=30u64 {
        let t = template.transaction(n);
        p.begin(&t).await.expect("begin");
        p.send(n, records(&out, 1)).await.expect("send");
        assert_eq!(p.prepare(&t).await.expect("prepare"), PrepareOutcome::Prepared);
        p.commit(&t).await.expect("commit");
    }
    let ids = support::kafka::transactional_ids(&c, &format!("{}-a-", template.group_id())).await;
    assert_eq!(ids.len(), 3, "{ids:?}");
    // Four open at once do not fit three slots: the fourth is refused, never queued.
    for n in 31..=33u64 {
        p.begin(&template.transaction(n)).await.expect("begin");
    }
    let err = p.begin(&template.transaction(34)).await.expect_err("slot busy");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("still carries T(31)"), "{err}");
}
