//! Exactly-once on a real Kafka 4.x broker: Kafka transactions as T(n), recovery of
//! transactions a crash left open, the ledger, and the whole pipeline crashing at every
//! fault point.

mod support;

use std::time::Duration;

use bytes::Bytes;
use shareflow::connector::kafka::{KafkaCluster, KafkaTransactions, KafkaTransactionsConfig};
use shareflow::connector::share::ProducerRecord;
use shareflow::runtime::{ErrorKind, PrepareOutcome, TransactionParticipant, TransactionTemplate};
use support::demo::{kafka_fault_points, number, shareflow, Outcome};
use support::kafka::{cluster, unique};

/// The longest one `demo --kafka` run of these sizes may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

fn participant(c: &KafkaCluster) -> std::sync::Arc<KafkaTransactions> {
    KafkaTransactions::new(c.clone(), KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(60)))
}

async fn setup(c: &KafkaCluster) -> (TransactionTemplate, String) {
    let group = unique("txn-group");
    let template = TransactionTemplate::new(&group, "job").expect("template");
    let out = unique("txn-out");
    c.ensure_topic(&out, 1, &[]).await.expect("topic");
    (template, out)
}

fn records(topic: &str, n: u32) -> Vec<ProducerRecord> {
    (0..n)
        .map(|i| ProducerRecord {
            partition: None,
            ..ProducerRecord::new(topic, 0, Bytes::from(format!("rec-{i:010}-")))
        })
        .collect()
}

/// Begins `txn`, sends `count` records to `out` in it and prepares it.
async fn prepared(p: &KafkaTransactions, txn: &shareflow::checkpoint::TransactionId, out: &str, count: u32) {
    p.begin(txn).await.expect("begin");
    p.send(txn.checkpoint_id(), records(out, count)).await.expect("send");
    assert_eq!(p.prepare(txn).await.expect("prepare"), PrepareOutcome::Prepared);
}

/// What a read_committed reader sees right now.
async fn visible_now(c: &KafkaCluster, topic: &str) -> usize {
    c.read_committed(topic).await.expect("read").len()
}

/// What a read_committed reader sees once every decided transaction's markers are in.
async fn committed(c: &KafkaCluster, topic: &str) -> usize {
    assert!(c.wait_stable(topic, Duration::from_secs(30)).await.expect("ends"), "{topic} stays open");
    visible_now(c, topic).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_of_t_n_is_visible_only_once_it_commits() {
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    let p = participant(&c);
    p.open(&template).await.expect("open");
    let t1 = template.transaction(1);
    prepared(&p, &t1, &out, 10).await;
    assert_eq!(visible_now(&c, &out).await, 0, "nothing visible before the commit");
    p.commit(&t1).await.expect("commit");
    assert_eq!(committed(&c, &out).await, 10);
    let t2 = template.transaction(2);
    p.begin(&t2).await.expect("begin");
    p.send(2, records(&out, 5)).await.expect("send");
    p.abort(&t2).await.expect("abort");
    assert_eq!(committed(&c, &out).await, 10, "aborted output never shows");
    // The ledger holds the commit of epoch 1 only.
    let committed = p.committed_checkpoints().await.expect("ledger");
    assert_eq!(committed.into_iter().collect::<Vec<_>>(), vec![1]);
    let err = p.send(9, records(&out, 1)).await.expect_err("T(9) was never begun");
    assert!(err.to_string().contains("T(9) is not open"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_committed_read_returns_each_committed_record_once_and_no_open_one() {
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    let p = participant(&c);
    p.open(&template).await.expect("open");
    let t = |n| template.transaction(n);
    prepared(&p, &t(1), &out, 4).await;
    p.commit(&t(1)).await.expect("commit");
    assert!(c.wait_stable(&out, Duration::from_secs(30)).await.expect("ends"));
    let (first, ends) = c.read_committed_from(&out, &[]).await.expect("read");
    assert_eq!(first.len(), 4);
    // An open transaction's records are not read, and the end stops before them.
    prepared(&p, &t(2), &out, 3).await;
    let (open, same) = c.read_committed_from(&out, &ends).await.expect("read");
    assert_eq!((open.len(), &same), (0, &ends), "nothing committed since");
    p.commit(&t(2)).await.expect("commit");
    prepared(&p, &t(3), &out, 2).await;
    p.commit(&t(3)).await.expect("commit");
    assert!(c.wait_stable(&out, Duration::from_secs(30)).await.expect("ends"));
    let (next, _) = c.read_committed_from(&out, &ends).await.expect("read");
    let offsets: Vec<i64> = next.iter().map(|r| r.1).collect();
    assert_eq!(next.len(), 5, "T(2) and T(3), and nothing read before: {offsets:?}");
    assert!(offsets.iter().all(|o| *o >= ends[0]), "{offsets:?} from {ends:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_commits_a_decided_transaction_by_producer_id_and_aborts_the_rest() {
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    // The crashed instance: T(4) prepared (its checkpoint completed), T(5) still open.
    let crashed = participant(&c);
    crashed.open(&template).await.expect("open");
    for (n, count) in [(4u64, 7u32), (5, 3)] {
        let t = template.transaction(n);
        crashed.begin(&t).await.expect("begin");
        crashed.send(n, records(&out, count)).await.expect("send");
    }
    assert_eq!(crashed.prepare(&template.transaction(4)).await.expect("prepare"), PrepareOutcome::Prepared);
    drop(crashed);
    // The new instance: T(4) prepared (the ledger is among its partitions) and waits for
    // the runtime's decision; T(5) never prepared, so no checkpoint can cover it and it
    // is aborted on the spot.
    let p = participant(&c);
    p.open(&template).await.expect("open");
    let pending: Vec<(u64, bool)> =
        p.pending(&template).await.expect("pending").iter().map(|t| (t.id.checkpoint_id(), t.prepared)).collect();
    assert_eq!(pending, vec![(4, true)]);
    // Epoch 4's commit entry is written (inside T(4)); epoch 5 left no trace, and a
    // new generation's transactional ids are fresh, so using 5 again is harmless.
    assert!(p.highest_checkpoint_id(&template).await.expect("highest") >= Some(4));
    p.commit(&template.transaction(4)).await.expect("recovery commit");
    p.abort(&template.transaction(5)).await.expect("recovery abort");
    assert!(p.pending(&template).await.expect("pending").is_empty(), "nothing lingers");
    assert_eq!(committed(&c, &out).await, 7, "T(4) committed by producer id and epoch; T(5) aborted");
    // Deciding again is harmless.
    p.commit(&template.transaction(4)).await.expect("idempotent commit");
    p.abort(&template.transaction(5)).await.expect("idempotent abort");
    assert_eq!(committed(&c, &out).await, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_attempt_aborts_the_live_transactions_of_the_last_one() {
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    let p = participant(&c);
    p.open(&template).await.expect("open");
    let t3 = template.transaction(3);
    p.begin(&t3).await.expect("begin");
    p.send(3, records(&out, 5)).await.expect("send");
    // The attempt fails in process; the next one opens the participant again.
    p.open(&template).await.expect("reopen");
    assert!(p.pending(&template).await.expect("pending").is_empty(), "T(3) is not left for recovery to decide");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(committed(&c, &out).await, 0, "buffered writes of T(3) never become visible");
    let end = c.end_offsets(&out, false).await.expect("ends");
    let stable = c.end_offsets(&out, true).await.expect("stable");
    assert_eq!(end, stable, "no transaction holds the output topic open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_fences_what_a_stale_one_wrote_and_never_prepared() {
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    let stale = participant(&c);
    stale.open(&template).await.expect("open");
    let t4 = template.transaction(4);
    stale.begin(&t4).await.expect("begin");
    stale.send(4, records(&out, 3)).await.expect("send");
    // Until a batch reaches the broker, T(4) is the stale producer's secret.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c.end_offsets(&out, false).await.expect("ends") == vec![0] {
        assert!(tokio::time::Instant::now() < deadline, "T(4)'s records never reached the broker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Opening takes over the prefix: T(4) never prepared, so no checkpoint can cover it,
    // and the new instance aborts it by fencing its id. Listing it afterwards fences
    // nothing and finds nothing.
    let fresh = participant(&c);
    fresh.open(&template).await.expect("open");
    assert!(fresh.pending(&template).await.expect("pending").is_empty());
    // Its writes now carry a stale producer epoch. Kafka answers InvalidProducerEpoch,
    // which the client reports as "abort the transaction" (a bumped epoch may also be
    // a transaction timeout's abort; it cannot tell), so the refusal is Unavailable or
    // Fenced, never a success.
    for (op, result) in [("prepare", stale.prepare(&t4).await.map(|_| ())), ("commit", stale.commit(&t4).await)] {
        let err = result.expect_err("the stale producer is fenced");
        assert!(matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Fenced), "{op}: {err}");
        assert!(err.to_string().contains(&format!("failed to {op} {t4}")), "{err}");
    }
    assert_eq!(committed(&c, &out).await, 0, "nothing of the fenced T(4) shows");
    // A prepare asked of the new instance asks the broker: T(4) is aborted.
    assert_eq!(fresh.prepare(&t4).await.expect("prepare"), PrepareOutcome::AlreadyAborted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_aborts_an_unprepared_transaction_another_process_began_after_open() {
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    let fresh = participant(&c);
    fresh.open(&template).await.expect("open");
    // Another process of the prefix writes into T(7) after the fresh one opened: open
    // could not fence it. It never prepared, so nothing can ever decide it: listing the
    // pending transactions aborts it.
    let other = participant(&c);
    other.open(&template).await.expect("open");
    assert!(other.generation() > fresh.generation(), "each attempt has a generation of its own");
    let t7 = template.transaction(7);
    other.begin(&t7).await.expect("begin");
    other.send(7, records(&out, 2)).await.expect("send");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c.end_offsets(&out, false).await.expect("ends") == vec![0] {
        assert!(tokio::time::Instant::now() < deadline, "T(7)'s records never reached the broker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fresh.pending(&template).await.expect("pending").is_empty(), "unprepared: nothing to decide");
    let err = other.prepare(&t7).await.expect_err("its transactional id was fenced");
    assert!(matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Fenced), "{err}");
    assert_eq!(committed(&c, &out).await, 0, "nothing of T(7) shows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_named_by_the_ledger_are_never_reused() {
    let Some(c) = cluster().await else { return };
    let (template, _) = setup(&c).await;
    // At-least-once has no transactions to list: only the ledger knows epoch 9 was used.
    let p = KafkaTransactions::new(
        c.clone(),
        KafkaTransactionsConfig::default().exactly_once(false).transaction_timeout(Duration::from_secs(60)),
    );
    p.open(&template).await.expect("open");
    assert_eq!(p.highest_checkpoint_id(&template).await.expect("highest"), None);
    let range = shareflow::connector::kafka::LedgerRange { topic: "in".into(), partition: 0, first: 0, last: 9 };
    p.write_intent(9, 0, vec![range]).await.expect("intent");
    assert_eq!(p.highest_checkpoint_id(&template).await.expect("highest"), Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_timeouts_are_checked_against_checkpointing_and_the_broker() {
    let Some(c) = cluster().await else { return };
    let short = KafkaTransactions::new(
        c.clone(),
        KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(5)),
    );
    let err = short.validate(Duration::from_secs(4), Duration::from_secs(2)).await.expect_err("too short");
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("checkpoint interval plus checkpoint timeout"), "{err}");
    let long = KafkaTransactions::new(
        c.clone(),
        KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(3_600)),
    );
    let err = long.validate(Duration::from_secs(1), Duration::from_secs(60)).await.expect_err("over the broker max");
    assert!(err.to_string().contains("transaction.max.timeout.ms"), "{err}");
    participant(&c).validate(Duration::from_secs(1), Duration::from_secs(30)).await.expect("60 s fits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_checkpoints_outlast_the_transaction_timeout_does_not_start() {
    if support::kafka::bootstrap().is_none() {
        return;
    }
    // The default transaction timeout is 600 s.
    let run = kafka_demo(10, &["--interval", "700000"]).await;
    assert_eq!(run.code, 1, "refused before running: {run:?}");
    assert!(run.summary().is_none(), "{run:?}");
    assert!(run.stderr.contains("transaction.timeout.ms"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_record_in_the_ledger_is_a_data_error_naming_its_offset() {
    let Some(c) = cluster().await else { return };
    let (template, _) = setup(&c).await;
    let p = participant(&c);
    p.open(&template).await.expect("open");
    let ledger = p.ledger_topic().expect("ledger topic");
    c.produce(&ledger, [(None, Bytes::from_static(b"not a ledger entry"))]).await.expect("produce");
    let err = p.committed_checkpoints().await.expect_err("corrupt ledger");
    assert_eq!(err.kind(), ErrorKind::Data, "{err}");
    assert!(err.to_string().contains(&format!("{ledger} partition 0 offset 0")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_record_in_the_intents_topic_stops_the_attempt_naming_its_offset() {
    let Some(c) = cluster().await else { return };
    let (template, _) = setup(&c).await;
    let intents = format!("{}-intents", template.group_id());
    c.ensure_topic(&intents, 1, &[]).await.expect("topic");
    c.produce(&intents, [(None, Bytes::from_static(b"not an intent"))]).await.expect("produce");
    let err = participant(&c).open(&template).await.expect_err("corrupt intents topic");
    assert_eq!(err.kind(), ErrorKind::Data, "{err}");
    assert!(err.to_string().contains(&format!("{intents} partition 0 offset 0")), "{err}");
}

/// Runs `shareflow demo --kafka` on a fresh name with `records` records, 300 ms
/// checkpoints in memory (unless `extra` sets `--interval`), 2 partitions, parallelism 2,
/// and `extra`.
async fn kafka_demo(records: u64, extra: &[&str]) -> Outcome {
    let bootstrap = support::kafka::bootstrap().expect("checked by the caller");
    let name = unique("eos");
    let checkpoints = format!("memory://{name}");
    let records = records.to_string();
    let mut args = vec!["demo", "--kafka", &bootstrap, "--name", &name, "--records", &records, "--json"];
    args.extend(["--partitions", "2", "--parallelism", "2", "--checkpoints", &checkpoints]);
    if !extra.contains(&"--interval") {
        args.extend(["--interval", "300"]);
    }
    args.extend(extra);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        shareflow(&args, RUN_TIMEOUT)
    })
    .await
    .expect("the run's thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_stays_exactly_once_through_a_crash_at_every_fault_point() {
    if support::kafka::bootstrap().is_none() {
        return;
    }
    // Every crash is armed at once and counts hits of its own point; the source points
    // skip one hit so that the first attempt emits before it crashes.
    let points = kafka_fault_points();
    let crashes: Vec<String> = points.iter().map(|p| format!("{p}:{}", u32::from(p.contains("source.")))).collect();
    let mut extra = Vec::new();
    for c in &crashes {
        extra.extend(["--crash-at", c.as_str()]);
    }
    let run = kafka_demo(20_000, &extra).await;
    assert_eq!(run.code, 0, "{run:?}");
    let s = run.json();
    assert_eq!(number(&s, "crashes"), points.len() as u64, "every fault point fired: {s}");
    assert_eq!((number(&s, "duplicates"), number(&s, "lost")), (0, 0), "{s}");
    assert_eq!(number(&s, "output_records"), 20_000, "{s}");
    assert!(
        number(&s, "transactions_recovered") >= 1,
        "a crash after the manifest leaves T(n) for recovery to commit: {s}"
    );
    assert!(number(&s, "replayed") > 0, "crashes before the commit replay from the log: {s}");
    // The crash right after a poll leaves its records locked to a dead attempt: they come
    // back with a delivery count above 1, and the source counts them.
    assert!(number(&s, "redelivered") > 0, "records polled before a crash come back redelivered: {s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_mode_loses_nothing_through_crashes() {
    if support::kafka::bootstrap().is_none() {
        return;
    }
    let after_manifest = shareflow::runtime::failpoint::points::AFTER_MANIFEST;
    // The sink's first write crashes: a poll takes a whole share fetch, so each sink
    // subtask may write the 3,000 records in one batch, and a second write may not come.
    let run =
        kafka_demo(3_000, &["--at-least-once", "--crash-at", "sink.after_write:0", "--crash-at", after_manifest]).await;
    // The check of an at-least-once run passes when nothing is lost.
    assert_eq!(run.code, 0, "{run:?}");
    let s = run.json();
    assert_eq!(number(&s, "crashes"), 2, "{s}");
    assert_eq!(number(&s, "lost"), 0, "at-least-once never loses: {s}");
    assert!(number(&s, "output_records") >= 3_000, "{s}");
}

/// `shareflow txn list --kafka`: a prepared T(1) shows on its slot id as Ongoing, with an
/// age, the producer's timeout and the partitions it wrote; `--prefix` of another
/// instance lists nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_list_on_kafka_shows_an_open_transaction_with_age_and_timeout() {
    let Some(c) = cluster().await else { return };
    let bootstrap = support::kafka::bootstrap().expect("set");
    let (template, out) = setup(&c).await;
    let p = participant(&c);
    p.open(&template).await.expect("open");
    let t1 = template.transaction(1);
    prepared(&p, &t1, &out, 10).await;
    let group = template.group_id().to_string();
    let run = tokio::task::spawn_blocking(move || {
        let listed = shareflow(&["txn", "list", "--kafka", &bootstrap, "--group", &group, "--json"], RUN_TIMEOUT);
        let other = shareflow(
            &["txn", "list", "--kafka", &bootstrap, "--group", &group, "--prefix", "nobody", "--json"],
            RUN_TIMEOUT,
        );
        (listed, other)
    });
    let (listed, other) = run.await.expect("thread");
    assert_eq!(listed.code, 0, "{listed:?}");
    let rows: serde_json::Value = serde_json::from_str(listed.stdout.trim()).expect("a JSON array");
    let rows = rows.as_array().expect("array");
    // Every id of the pool is there (open initialises all K), all under the group.
    assert!(
        rows.iter().all(|r| r["id"].as_str().expect("id").starts_with(&format!("{}-job-g", template.group_id()))),
        "{rows:?}"
    );
    let open: Vec<_> = rows.iter().filter(|r| r["state"] == "Ongoing").collect();
    assert_eq!(open.len(), 1, "exactly T(1)'s slot is open: {rows:?}");
    let t = open[0];
    assert!(t["age_seconds"].as_f64().is_some_and(|a| (0.0..60.0).contains(&a)), "{t}");
    assert_eq!(t["timeout_seconds"], 60.0, "{t}");
    // The output topic and the prefix's commits topic.
    assert!(t["partitions"].as_u64().is_some_and(|n| n >= 2), "{t}");
    assert_eq!(other.code, 0, "{other:?}");
    assert_eq!(other.stdout.trim(), "[]");
    p.commit(&t1).await.expect("commit");
}

/// The ledger is summarised and trimmed as a job runs, so a recovery after many
/// checkpoints reads only what is live, and still replays exactly what never committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_is_trimmed_and_a_recovery_reads_only_what_is_live() {
    use shareflow::connector::kafka::LedgerRange;
    let Some(c) = cluster().await else { return };
    let (template, out) = setup(&c).await;
    let config =
        KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(60)).ledger_summary_every(20);
    let range =
        |n: u64| LedgerRange { topic: "in".into(), partition: 0, first: (n as i64 - 1) * 10, last: n as i64 * 10 - 1 };
    let p = KafkaTransactions::new(c.clone(), config.clone());
    p.open(&template).await.expect("open");
    p.take_over(&template).await.expect("take over");
    // 60 checkpoints: an intent, an output record and a commit each.
    const EPOCHS: u64 = 60;
    for n in 1..=EPOCHS {
        let t = template.transaction(n);
        p.begin(&t).await.expect("begin");
        p.write_intent(n, 0, vec![range(n)]).await.expect("intent");
        p.send(n, records(&out, 1)).await.expect("send");
        assert_eq!(p.prepare(&t).await.expect("prepare"), PrepareOutcome::Prepared);
        p.commit(&t).await.expect("commit");
    }
    let intents = format!("{}-intents", template.group_id());
    let commits = p.ledger_topic().expect("ledger topic");
    // Compactions run in the background after commits; the last one is waited for.
    let mut start = 0;
    for _ in 0..100 {
        start = c.start_offsets(&intents).await.expect("start")[0];
        if start >= 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(start >= 100, "60 intents and 60 notes written, summarised every 20: the topic starts at {start}");
    assert!(c.start_offsets(&commits).await.expect("start")[0] > 0, "the commits topic is trimmed too");
    // A crash in epoch 61: its intent is written, its transaction prepared, and its
    // checkpoint never completes.
    let t = template.transaction(EPOCHS + 1);
    p.begin(&t).await.expect("begin");
    p.write_intent(EPOCHS + 1, 0, vec![range(EPOCHS + 1)]).await.expect("intent");
    p.send(EPOCHS + 1, records(&out, 1)).await.expect("send");
    assert_eq!(p.prepare(&t).await.expect("prepare"), PrepareOutcome::Prepared);
    drop(p);
    let q = KafkaTransactions::new(c.clone(), config);
    q.open(&template).await.expect("open");
    let pending: Vec<u64> = q.pending(&template).await.expect("pending").iter().map(|t| t.id.checkpoint_id()).collect();
    assert_eq!(pending, vec![EPOCHS + 1]);
    q.abort(&t).await.expect("abort");
    q.take_over(&template).await.expect("take over");
    // Only epoch 61 is replayed: everything the trimmed part named is done.
    assert_eq!(q.queued_replay(), vec![range(EPOCHS + 1)]);
    assert!(q.highest_checkpoint_id(&template).await.expect("highest") >= Some(EPOCHS + 1));
    // Untrimmed, a recovery reads every record the two topics ever held (the commits
    // topic more than once). Trimmed, it reads what came after the last summary: less
    // than half of what was written, however the background compactions fell.
    let written =
        c.end_offsets(&intents, false).await.expect("end")[0] + c.end_offsets(&commits, false).await.expect("end")[0];
    let reads = q.ledger_reads();
    eprintln!("the recovery read {} ledger records ({} bytes) of {written} written", reads.entries, reads.bytes);
    assert!(
        (reads.entries as i64) < written / 2,
        "a recovery read {} ledger records of {written} written",
        reads.entries
    );
    assert_eq!(reads.open_intents, 1, "only epoch 61's intent is open");
    assert_eq!(committed(&c, &out).await, EPOCHS as usize);
    // Tools read what is left: the open intent, from the summary or the log.
    let named: Vec<LedgerRange> =
        c.group_intents(template.group_id()).await.expect("intents").into_iter().flat_map(|i| i.ranges).collect();
    assert!(named.contains(&range(EPOCHS + 1)), "{named:?}");
    assert!(!named.contains(&range(1)), "{named:?}");
}

/// `txn resolve --kafka` and `txn commit|abort --kafka` decide what a crashed instance
/// left prepared, by its checkpoints: a dry run changes nothing, an abort of an undecided
/// one and a commit of a decided one are carried out, and nothing is left after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_resolve_commit_and_abort_on_kafka_follow_the_manifests() {
    use shareflow::checkpoint::{CheckpointStore, Manifest, ParticipantState, TransactionRecord};
    let Some(c) = cluster().await else { return };
    let bootstrap = support::kafka::bootstrap().expect("checked by cluster()");
    let (template, out) = setup(&c).await;
    let crashed = participant(&c);
    crashed.open(&template).await.expect("open");
    prepared(&crashed, &template.transaction(4), &out, 7).await;
    prepared(&crashed, &template.transaction(5), &out, 3).await;
    drop(crashed);
    // Checkpoint 4 completed (its manifest names T(4)); 5 never did.
    let dir = tempfile::tempdir().expect("dir");
    let root = format!("file://{}", dir.path().display());
    let store = CheckpointStore::from_url(&root, &[], template.prefix()).expect("store");
    store
        .publish_manifest(&Manifest {
            job_id: template.prefix().into(),
            checkpoint_id: 4,
            created_at_ms: shareflow::checkpoint::now_ms(),
            state_files: Vec::new(),
            transactions: vec![TransactionRecord {
                participant: "kafka".into(),
                transaction_id: template.transaction(4).to_string(),
                state: ParticipantState::Prepared,
            }],
        })
        .await
        .expect("manifest");
    let group = template.group_id().to_string();
    let txn = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shareflow"))
            .arg("txn")
            .args(args)
            .args(["--kafka", &bootstrap, "--checkpoints", &root, "--group", &group])
            .output()
            .expect("run shareflow");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, plan, stderr) = txn(&["resolve", "--prefix", template.prefix(), "--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        plan.lines().collect::<Vec<_>>(),
        vec![
            format!("would commit: {} (kafka)", template.transaction(4)),
            format!("would abort: {} (kafka)", template.transaction(5))
        ],
        "{plan}"
    );
    assert_eq!(visible_now(&c, &out).await, 0, "a dry run changes nothing");
    // Against the manifests: refused.
    let (code, _, stderr) = txn(&["commit", &template.transaction(5).to_string()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no complete checkpoint decides"), "{stderr}");
    let (code, done, stderr) = txn(&["abort", &template.transaction(5).to_string()]);
    assert_eq!((code, done.trim()), (0, format!("aborted {} (kafka)", template.transaction(5)).as_str()), "{stderr}");
    let (code, done, stderr) = txn(&["commit", &template.transaction(4).to_string()]);
    assert_eq!((code, done.trim()), (0, format!("committed {} (kafka)", template.transaction(4)).as_str()), "{stderr}");
    assert_eq!(committed(&c, &out).await, 7, "T(4) committed, T(5) aborted");
    let (code, left, stderr) = txn(&["resolve", "--prefix", template.prefix()]);
    assert_eq!(
        (code, left.trim()),
        (0, format!("nothing pending under {group}-{}", template.prefix()).as_str()),
        "{stderr}"
    );
    // A live instance of the prefix (its heartbeat moves) is refused, named.
    let registry = store.registry();
    let incarnation = registry.register(template.prefix()).await.expect("register");
    let beating = tokio::spawn({
        let (registry, prefix) = (registry.clone(), template.prefix().to_string());
        async move {
            for beat in 1..=100u64 {
                registry.heartbeat(&prefix, incarnation, beat, Some(4)).await.expect("beat");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    let (code, _, stderr) = txn(&["resolve", "--prefix", template.prefix()]);
    beating.abort();
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(&format!("instance {} is live", template.prefix())), "{stderr}");
}
