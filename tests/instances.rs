//! Several instances of one share group on the embedded broker (issue 11, decision
//! 0007): each a job with its own prefix, the same group and the same checkpoint root.
//! A silent instance is adopted: fenced, its PREPARE transactions committed from its own
//! manifests, the rest aborted, so its records return to the group. Checked from
//! outside with I1-I5.

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;

use std::sync::Arc;
use std::time::{Duration, Instant};

use eos::{assert_exactly_once, broker_with_input, share_config, GROUP, INPUT, OUTPUT};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::checkpoint::{CheckpointPaths, CheckpointStore};
use shareflow::connector::broker::EmbeddedBroker;
use shareflow::connector::embedded::{BrokerTransactions, ShareGroupSource, TopicSink};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{ErrorKind, InstanceConfig, Job, JobBuilder, JobConfig, RestartStrategy};

const RECORDS: u64 = 3_000;
const INTERVAL: Duration = Duration::from_millis(20);
// Wide enough for a loaded machine (CI runs three test binaries beside a build): an
// instance that never restarts fails its test at its first timed-out checkpoint, and a
// live instance whose beats a starved runtime holds back past the adoption timeout is
// adopted. At 200 ms and 600 ms, two tests of this file failed in a loaded CI run.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_millis(1_000);
const ADOPTION: Duration = Duration::from_millis(3_000);

/// One instance: the share source -> SQL -> topic sink pipeline of the eos tests, as
/// prefix `prefix`, with its checkpoints under `{root}/{prefix}` in `store`.
fn instance(broker: &EmbeddedBroker, store: &Arc<dyn ObjectStore>, prefix: &str, until_drained: bool) -> Job {
    instance_throttled(broker, store, prefix, until_drained, 3, None)
}

/// An instance that dies at its second manifest and never restarts. Its sources are
/// throttled (10,000 records/s each), so it dies with records of the input still LOCKED
/// in its PREPARE transaction.
fn doomed(broker: &EmbeddedBroker, store: &Arc<dyn ObjectStore>, prefix: &str) -> Job {
    let job = instance_throttled(broker, store, prefix, true, 0, Some(10_000));
    job.failpoints().schedule(vec![(points::AFTER_MANIFEST.to_string(), 1)]);
    job
}

fn instance_throttled(
    broker: &EmbeddedBroker,
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    until_drained: bool,
    restarts: u32,
    rate: Option<u64>,
) -> Job {
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(GROUP, &[INPUT]);
    source.stop_when_drained = until_drained;
    // A throttled poll waits until its records are due: polls of 10 ms of input keep
    // that wait, which holds a checkpoint's barrier, far inside the checkpoint timeout.
    source.max_poll_records = rate.map_or(100, |r| (r / 100).max(1) as usize);
    source.poll_timeout = Duration::from_millis(5);
    source.max_records_per_second = rate;
    let job = eos::pipeline(broker, &txns, source, share_config(), 2, Arc::new(SourceMetrics::default()));
    let storage = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", prefix).unwrap());
    let config = JobConfig::new(storage, GROUP, prefix)
        .checkpoint_interval(INTERVAL)
        .checkpoint_timeout(CHECKPOINT_TIMEOUT)
        .restart(RestartStrategy::FixedDelay { attempts: restarts, delay: Duration::from_millis(10) })
        .instance(InstanceConfig::new(ADOPTION));
    job.build(config).unwrap()
}

async fn check(broker: &EmbeddedBroker) -> shareflow::connector::verify::ExactlyOnceReport {
    shareflow::connector::verify::check_exactly_once(broker, GROUP, INPUT, OUTPUT, eos::identity).await.unwrap()
}

/// Waits (at most `limit`) until `adopted` (if given) is adopted and every input
/// record's output is committed once and the record acknowledged.
async fn wait_done(broker: &EmbeddedBroker, adopted: Option<(&Arc<dyn ObjectStore>, &str)>, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some((store, prefix)) = adopted {
            let registry = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", prefix).unwrap()).registry();
            if !registry.record(prefix).await.unwrap().adoption_done {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        let r = check(broker).await;
        // While an instance runs its next transactions are open (I8 flags them); the
        // callers check every invariant once it stopped.
        if r.exactly_once == RECORDS && r.duplicates == 0 && r.lost == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("not done after {limit:?}: {:?}", check(broker).await);
    false
}

/// Instance `a` crashes right after a manifest: its transaction is PREPARE and pins its
/// records LOCKED. It never comes back. Instance `b` adopts it once `a` is silent past
/// the adoption timeout: the PREPARE transaction commits (its manifest decided it), the
/// ONGOING one aborts, and `b` processes what returns to the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instance_is_adopted_and_its_decided_work_committed() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());

    let a = doomed(&broker, &store, "a");
    let err = a.run().await.unwrap_err();
    assert!(err.to_string().contains(points::AFTER_MANIFEST), "a crashed at the fault point: {err}");
    let pinned = broker.transactions().await.unwrap();
    assert!(
        pinned.iter().any(|t| t.id.prefix() == "a"
            && t.state == shareflow::connector::share::TransactionState::Prepare
            && t.pending_ack_records > 0),
        "a left a PREPARE transaction holding records: {pinned:?}"
    );

    let b = instance(&broker, &store, "b", false);
    let stop = b.stop_handle();
    // Job::run's future is not Send: run it beside the check, in this task.
    let (report, done) = tokio::join!(b.run(), async {
        let done = wait_done(&broker, Some((&store, "a")), Duration::from_secs(30)).await;
        stop.stop();
        done
    });
    assert!(done, "b adopted a and drained the group: {:?}", check(&broker).await);
    let report = report.unwrap();
    assert_eq!(report.metrics.checkpoints.instances_adopted, 1, "{report:?}");
    assert!(report.metrics.checkpoints.transactions_recovered >= 1, "a's PREPARE transaction committed: {report:?}");
    assert_exactly_once(&check(&broker).await, RECORDS, "after adoption");
    let left: Vec<_> = broker.transactions().await.unwrap().into_iter().filter(|t| t.state.is_pending()).collect();
    assert!(left.is_empty(), "no transaction is left open or prepared: {left:?}");

    // The adopted instance can never start again under its prefix.
    let again = instance(&broker, &store, "a", true);
    let err = again.run().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert!(err.to_string().contains("adopted by instance b"), "{err}");
}

/// An adopter that crashes in the middle of an adoption resumes it when it restarts:
/// the plan it recorded first is the one it carries out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopter_that_crashes_mid_adoption_finishes_it_after_its_restart() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = doomed(&broker, &store, "a");
    a.run().await.unwrap_err();

    let b = instance(&broker, &store, "b", false);
    b.failpoints().schedule(vec![(points::ADOPTION_MID.to_string(), 0)]);
    let stop = b.stop_handle();
    let (report, done) = tokio::join!(b.run(), async {
        let done = wait_done(&broker, Some((&store, "a")), Duration::from_secs(30)).await;
        stop.stop();
        done
    });
    assert!(done, "b finished the adoption: {:?}", check(&broker).await);
    let report = report.unwrap();
    assert_eq!(b.failpoints().fired(), vec![points::ADOPTION_MID.to_string()]);
    assert!(report.attempts >= 2, "the crash restarted b: {report:?}");
    assert_eq!(report.metrics.checkpoints.instances_adopted, 1, "{report:?}");
    assert_exactly_once(&check(&broker).await, RECORDS, "after a resumed adoption");
}

/// Two live instances with the same prefix are never both live: the second start
/// fences the first, which stops (no restart) while the second runs to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_of_the_same_prefix_fences_the_first() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let first = instance(&broker, &store, "same", false);
    let second = instance(&broker, &store, "same", true);
    let (first_result, second_result) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(30), first.run()),
        tokio::time::timeout(Duration::from_secs(30), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            second.run().await
        })
    );
    let second_report = second_result.expect("the second ends").unwrap();
    let err = first_result.expect("the first stops").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert_eq!(second_report.metrics.checkpoints.instances_adopted, 0);
    assert_exactly_once(&check(&broker).await, RECORDS, "two starts of one prefix");
}

/// A stopped instance takes a final checkpoint, commits it, leaves, and records that it
/// retired: nobody adopts it, however long it stays away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_retires_and_is_never_adopted() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = instance(&broker, &store, "a", false);
    let stop = a.stop_handle();
    let (result, ()) = tokio::join!(tokio::time::timeout(Duration::from_secs(10), a.run()), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.stop();
    });
    result.expect("a stops").unwrap();
    let pending: Vec<_> = broker.transactions().await.unwrap().into_iter().filter(|t| t.state.is_pending()).collect();
    assert!(pending.is_empty(), "the final checkpoint committed everything: {pending:?}");
    let registry = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", "a").unwrap()).registry();
    assert!(registry.record("a").await.unwrap().retired);

    // b runs past the adoption timeout and finishes the input; a is never adopted.
    let b = instance(&broker, &store, "b", true);
    tokio::time::sleep(ADOPTION * 2).await;
    let report = b.run().await.unwrap();
    assert_eq!(report.metrics.checkpoints.instances_adopted, 0, "{report:?}");
    assert!(registry.record("a").await.unwrap().adopted_by.is_none());
    assert_exactly_once(&check(&broker).await, RECORDS, "after a graceful stop");
}

/// Bad configuration of an instance is refused before it starts, naming the setting.
#[tokio::test]
async fn bad_instance_settings_are_named() {
    let broker = broker_with_input(10, 1, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let build = |prefix: &str, job_id: &str, adoption: Duration| {
        let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
        let job = JobBuilder::new();
        job.source(
            "s",
            record_schema(),
            ShareGroupSource::factory(
                broker.clone(),
                Some(txns.clone()),
                SourceSettings::new(GROUP, &[INPUT]),
                share_config(),
                Arc::new(SourceMetrics::default()),
            ),
        )
        .sink("k", TopicSink::factory(broker.clone(), Some(txns.clone()), OUTPUT))
        .participant(txns);
        let storage = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", job_id).unwrap());
        let config = JobConfig::new(storage, GROUP, prefix)
            .checkpoint_interval(INTERVAL)
            .checkpoint_timeout(CHECKPOINT_TIMEOUT)
            .instance(InstanceConfig::new(adoption));
        job.build(config)
    };
    let short = INTERVAL + CHECKPOINT_TIMEOUT;
    let err = build("a", "a", short).err().expect("too short");
    assert!(err.to_string().contains(&format!("adoption.timeout.ms={}", short.as_millis())), "{err}");
    let needed = format!("checkpoint interval + checkpoint timeout ({} ms)", short.as_millis());
    assert!(err.to_string().contains(&needed), "{err}");
    let err = build("a", "other", ADOPTION).err().expect("job id differs from the prefix");
    assert!(err.to_string().contains("job.id=other"), "{err}");
    assert!(build("a", "a", ADOPTION).is_ok());
}

/// A group whose `share.transaction.max.pending` cannot hold the pending transactions of
/// every instance the registry shows is refused before the first attempt, naming the key
/// and the value that works; nothing is begun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_too_small_for_its_instances_is_refused_before_the_first_attempt() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // Two other live instances of the group: with this one, 3 x 2 pending transactions
    // (no tolerable failures) against the default max.pending of 5.
    let registry = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", "a").unwrap()).registry();
    registry.register("b").await.unwrap();
    registry.register("c").await.unwrap();
    let job = instance(&broker, &store, "a", true);
    let err = tokio::time::timeout(Duration::from_secs(30), job.run()).await.expect("ends").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let text = err.to_string();
    assert!(text.contains("share.transaction.max.pending=5"), "{text}");
    assert!(text.contains("must be at least 6: 3 instance(s)"), "{text}");
    assert!(broker.pending_transactions().await.unwrap().is_empty(), "nothing begun");
    // Once one of them retires, the group has room.
    registry.retire("c", 1).await.unwrap();
    let job = instance(&broker, &store, "a", true);
    tokio::time::timeout(Duration::from_secs(60), job.run()).await.expect("ends").unwrap();
}

/// An adopter that cannot read the dead instance's checkpoints fails with an error naming
/// that instance and what to do; it never decides the instance's transactions blindly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_checkpoint_root_stops_the_adoption_with_a_named_error() {
    use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 7));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    doomed(&broker, &store, "a").run().await.unwrap_err();
    // a's own checkpoints (not the registry) cannot be listed any more.
    faulty.inject(FaultRule::always(StoreOp::List, "chk/a", Fault::Error));
    let b = instance(&broker, &store, "b", false);
    let err = tokio::time::timeout(Duration::from_secs(30), b.run()).await.expect("b gives up").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("cannot read the checkpoints of instance a to adopt it"), "{text}");
    assert!(text.contains("same checkpoint root"), "{text}");
    let prepared = broker.transactions().await.unwrap();
    assert!(
        prepared
            .iter()
            .any(|t| t.id.prefix() == "a" && t.state == shareflow::connector::share::TransactionState::Prepare),
        "a's PREPARE transaction is left for an adopter that can read its checkpoints: {prepared:?}"
    );
}

/// An instance beats while its checkpoint commits: a manifest write that stalls for four
/// adoption timeouts does not get the live instance adopted, and both finish the input
/// exactly once. (Beats came only between checkpoints, and a broker stall of 8 s got a
/// live instance adopted and fenced.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_commit_does_not_get_a_live_instance_adopted() {
    use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 7));
    // a's second manifest takes four adoption timeouts to land.
    faulty.inject(FaultRule::once(
        StoreOp::Put,
        "chk/a/chk-00000000000000000002/_metadata",
        Fault::Latency(ADOPTION * 4),
    ));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let a = instance_throttled(&broker, &store, "a", true, 0, Some(2_000));
    // b runs until a has finished, so it watches a through the whole stall. It is
    // throttled too: at full speed it could drain the input before a's second checkpoint,
    // and a would stop without ever writing the manifest that stalls.
    let b = instance_throttled(&broker, &store, "b", false, 3, Some(1_000));
    let stop_b = b.stop_handle();
    let (ra, rb) = tokio::join!(
        async {
            let r = tokio::time::timeout(Duration::from_secs(60), a.run()).await;
            stop_b.stop();
            r
        },
        tokio::time::timeout(Duration::from_secs(60), b.run())
    );
    assert_eq!(faulty.injected().len(), 1, "the stall happened: {:?}", faulty.injected());
    let ra = ra.expect("a ends").expect("a is not fenced");
    let rb = rb.expect("b ends").expect("b ends well");
    assert_eq!((ra.metrics.checkpoints.instances_adopted, rb.metrics.checkpoints.instances_adopted), (0, 0));
    assert_exactly_once(&check(&broker).await, RECORDS, "a slow commit");
}

/// A job with keyed state (stateful SQL) as an instance of its group.
fn keyed_instance(broker: &EmbeddedBroker, store: &Arc<dyn ObjectStore>, prefix: &str) -> Job {
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(GROUP, &[INPUT]);
    // Runs until stopped, so that it is live while others try to start.
    source.stop_when_drained = false;
    source.poll_timeout = Duration::from_millis(5);
    let query = "SELECT key, CAST(count(*) AS VARCHAR) AS value FROM input GROUP BY key";
    let job = eos::query_pipeline(
        broker,
        &txns,
        (source, share_config(), Arc::new(SourceMetrics::default())),
        ("count", query, shareflow::runtime::SqlOptions::default()),
        OUTPUT,
        1,
    );
    let storage = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", prefix).unwrap());
    let config = JobConfig::new(storage, GROUP, prefix)
        .checkpoint_interval(INTERVAL)
        .checkpoint_timeout(CHECKPOINT_TIMEOUT)
        .instance(InstanceConfig::new(ADOPTION));
    job.build(config).unwrap()
}

/// Keyed state needs every record of a key in one instance: a stateful job refuses to
/// start beside another registered instance, and any job refuses to start beside a
/// registered stateful one (live, or dead and not adopted), before anything is begun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_keyed_state_runs_alone_in_its_group() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let registry = CheckpointStore::new(store.clone(), CheckpointPaths::new("chk", "a").unwrap()).registry();
    registry.register("b").await.unwrap();
    let err = keyed_instance(&broker, &store, "keyed").run().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let text = err.to_string();
    assert!(text.contains("keeps keyed state") && text.contains("instance b"), "{text}");
    assert!(broker.pending_transactions().await.unwrap().is_empty(), "nothing begun");

    // Alone, it runs (and marks itself keyed in the registry) until stopped.
    registry.retire("b", 1).await.unwrap();
    let keyed = keyed_instance(&broker, &store, "keyed");
    let stop = keyed.stop_handle();
    let beside = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = registry.record("keyed").await.unwrap();
            if r.keyed_state && r.incarnation > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the keyed instance registered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A stateless instance started beside it is refused, naming it.
        let err = instance(&broker, &store, "late", true).run().await.unwrap_err();
        stop.stop();
        err.to_string()
    };
    let (ran, text) = tokio::join!(keyed.run(), beside);
    assert!(text.contains("instance keyed") && text.contains("keeps keyed state"), "{text}");
    ran.unwrap();
    // Stopped gracefully, it retired: the group is free again.
    instance(&broker, &store, "late", true).run().await.unwrap();
}
