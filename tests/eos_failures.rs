//! Store faults, transaction timeouts, fencing of a second instance, poison records and
//! the at-least-once mode, on the exactly-once pipeline.

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;

use std::sync::Arc;
use std::time::Duration;

use eos::*;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
use shareflow::connector::share::ArchiveReason;
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{Collector, Operator, Result as RtResult, StateItems};

const RECORDS: u64 = 2_000;

fn faulty() -> Arc<FaultyStore> {
    Arc::new(FaultyStore::new(Arc::new(InMemory::new()), 11))
}

/// Store faults during state and manifest writes: the job retries or restarts; nothing
/// is lost or duplicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_errors_and_lost_put_responses_during_state_and_manifest_writes() {
    for (what, rule) in [
        ("state put error", FaultRule::once(StoreOp::Put, ".state", Fault::Error)),
        (
            "state put error x3 (checkpoint fails)",
            FaultRule { remaining: Some(3), ..FaultRule::always(StoreOp::Put, ".state", Fault::Error) },
        ),
        ("state put applied then timed out", FaultRule::once(StoreOp::Put, ".state", Fault::AppliedThenTimeout)),
        (
            "manifest put error x3 (checkpoint fails)",
            FaultRule { remaining: Some(3), ..FaultRule::always(StoreOp::Put, "_metadata", Fault::Error) },
        ),
        ("manifest put applied then timed out", FaultRule::once(StoreOp::Put, "_metadata", Fault::AppliedThenTimeout)),
        ("torn state file", FaultRule::once(StoreOp::Put, ".state", Fault::Torn { keep: 0.5 })),
    ] {
        let store = faulty();
        store.inject(rule);
        let broker = broker_with_input(RECORDS, 2, &share_config()).await;
        let mut run = Run::new(broker, storage_on(store.clone() as Arc<dyn ObjectStore>, "c"));
        run.inline_limit = 0; // every non-empty state goes to the shared object
        let (result, _) = run.run(vec![]).await;
        result.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!store.injected().is_empty(), "{what}: the fault was injected");
        assert_exactly_once(&run.check().await, RECORDS, what);
    }
}

/// A corrupt newest manifest: the restart falls back to the previous checkpoint, the
/// corrupt checkpoint's transaction is aborted, its records are redelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_latest_manifest_falls_back_with_nothing_lost() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let storage = storage_on(store.clone(), "c");
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let mut run = Run::new(broker, storage.clone());
    run.restarts = 0;
    run.interval = Duration::from_millis(2);
    // Throttled (at least 250 ms for the input), so the run takes several checkpoints and
    // never drains within its first.
    run.max_rate = Some(4_000);
    // Stop after the manifest of the second checkpoint is written, before its commit.
    let (result, _) = run.run(vec![(points::COMMIT_BEFORE.to_string(), 1)]).await;
    assert!(result.is_err());
    let newest = storage.list_checkpoints().await.unwrap().last().unwrap().checkpoint_id;
    let path = storage.paths().manifest(newest);
    let mut bytes = store.get(&path).await.unwrap().bytes().await.unwrap().to_vec();
    let n = bytes.len();
    bytes[n / 2] ^= 0x5a;
    store.put(&path, PutPayload::from(bytes)).await.unwrap();
    let mut again = run.clone();
    again.restarts = 3;
    let (job, _, _) = again.job();
    let report = job.run().await.unwrap();
    assert!(report.restored_from < Some(newest), "fell back from {newest} to {:?}", report.restored_from);
    assert_exactly_once(&again.check().await, RECORDS, "corrupt manifest");
}

/// Stalls the snapshot of one checkpoint, once per test.
struct Stall(u64, Duration, Arc<std::sync::atomic::AtomicBool>);

#[shareflow::runtime::async_trait]
impl Operator for Stall {
    async fn process_batch(
        &mut self,
        batch: arrow::record_batch::RecordBatch,
        _input: usize,
        out: &mut Collector,
    ) -> RtResult<()> {
        out.emit(batch).await
    }
    async fn snapshot_state(&mut self, n: u64, _out: &mut Collector) -> RtResult<StateItems> {
        if n == self.0 && !self.2.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(self.1).await;
        }
        Ok(Vec::new())
    }
}

/// A checkpoint slower than the transaction timeout: a job whose transaction timeout
/// does not exceed checkpoint interval + checkpoint timeout is refused before it starts
/// (the broker would abort T(n) under a checkpoint that could still complete). With a
/// valid configuration, a stalled checkpoint aborts cleanly: the job restarts, the
/// records are redelivered, no duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ongoing_transaction_times_out_while_its_checkpoint_is_slow() {
    use shareflow::connector::embedded::BrokerTransactions;
    use shareflow::connector::embedded::ShareGroupSource;
    use shareflow::connector::embedded::TopicSink;
    use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
    use shareflow::runtime::{JobBuilder, JobConfig, RestartStrategy};
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let build = |checkpoint_timeout: Duration| {
        // Five times the first values of this test (300 ms, 250 ms, 600 ms), so that on a
        // loaded machine no checkpoint but the stalled one outlasts the timeouts.
        let txns = BrokerTransactions::new(broker.clone(), Duration::from_millis(1_500));
        let mut source = SourceSettings::new(GROUP, &[INPUT]);
        source.stop_when_drained = true;
        source.max_poll_records = 100;
        // An idle poll holds a barrier back: short ones keep every checkpoint but the
        // stalled one well inside its timeout.
        source.poll_timeout = Duration::from_millis(5);
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let job = JobBuilder::new();
        job.source(
            "share-source",
            record_schema(),
            ShareGroupSource::factory(
                broker.clone(),
                Some(txns.clone()),
                source,
                share_config(),
                Arc::new(SourceMetrics::default()),
            ),
        )
        .operator("stall", Some(record_schema()), move |ctx: &shareflow::runtime::SubtaskContext| {
            Stall(ctx.first_checkpoint_id, Duration::from_millis(3_000), stalled.clone())
        })
        .sink("topic-sink", TopicSink::factory(broker.clone(), Some(txns.clone()), OUTPUT))
        .participant(txns.clone());
        let config = JobConfig::new(memory_storage("timeout"), GROUP, "slow")
            .checkpoint_interval(Duration::from_millis(20))
            .checkpoint_timeout(checkpoint_timeout)
            // The stall takes one restart; a slow machine may take a few more.
            .restart(RestartStrategy::FixedDelay { attempts: 10, delay: Duration::from_millis(10) });
        job.build(config)
    };
    let refused = match build(Duration::from_secs(5)) {
        Ok(job) => job.run().await.unwrap_err(),
        Err(e) => e,
    };
    assert!(refused.to_string().contains("share.transaction.timeout.ms"), "{refused}");
    assert!(broker.transactions().await.unwrap().is_empty(), "refused before any transaction began");

    let report = build(Duration::from_millis(1_250)).unwrap().run().await.unwrap();
    let m = broker.metrics().await.unwrap();
    assert!(report.attempts >= 2, "the stalled checkpoint restarted the job: {report:?}");
    assert!(m.transaction_abort_total >= 1, "its transaction aborted (by timeout or by the coordinator): {m:?}");
    let check = check(&broker).await;
    assert_exactly_once(&check, RECORDS, "transaction timeout");
}

async fn check(
    broker: &shareflow::connector::broker::EmbeddedBroker,
) -> shareflow::connector::verify::ExactlyOnceReport {
    shareflow::connector::verify::check_exactly_once(broker, GROUP, INPUT, OUTPUT, identity).await.unwrap()
}

/// A second live instance with the same group and prefix fences the first: the first
/// can commit nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_with_the_same_prefix_fences_the_first() {
    use shareflow::runtime::{TransactionParticipant, TransactionTemplate};
    let broker = broker_with_input(10, 1, &share_config()).await;
    let template = TransactionTemplate::new(GROUP, "job").unwrap();
    let first = shareflow::connector::embedded::BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    first.open(&template).await.unwrap();
    first.begin(&template.transaction(1)).await.unwrap();
    let second = shareflow::connector::embedded::BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    second.open(&template).await.unwrap();
    let err = first.prepare(&template.transaction(1)).await.unwrap_err();
    assert_eq!(err.kind(), shareflow::runtime::ErrorKind::Fenced, "{err}");
    assert!(err.to_string().contains("another instance with the same prefix"), "{err}");
    assert!(first.begin(&template.transaction(2)).await.is_err());
    // The second owns the prefix and works.
    second.begin(&template.transaction(2)).await.unwrap();
    assert_eq!(second.prepare(&template.transaction(2)).await.unwrap(), shareflow::runtime::PrepareOutcome::Prepared);
    second.commit(&template.transaction(2)).await.unwrap();
}

/// A PREPARE transaction survives any timeout: crash after the manifest, let far more
/// than the transaction timeout pass, restart: recovery commits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_survives_its_timeout_and_is_committed_by_recovery() {
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let mut run = Run::new(broker.clone(), memory_storage("prepared"));
    run.restarts = 0;
    run.interval = Duration::from_millis(2);
    // Long enough for a loaded machine to prepare a transaction in time, short enough
    // to wait out.
    run.txn_timeout = Duration::from_secs(4);
    let (result, _) = run.run(vec![(points::AFTER_MANIFEST.to_string(), 0)]).await;
    assert!(result.is_err());
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    broker.tick().await.unwrap();
    let prepared: Vec<_> = broker
        .transactions()
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.state == shareflow::connector::share::TransactionState::Prepare)
        .collect();
    assert_eq!(prepared.len(), 1, "the PREPARE transaction outlived its timeout");
    let mut again = run.clone();
    again.restarts = 2;
    again.txn_timeout = Duration::from_secs(60);
    let (job, _, _) = again.job();
    let report = job.run().await.unwrap();
    assert!(report.metrics.checkpoints.transactions_recovered >= 1);
    assert_exactly_once(&again.check().await, RECORDS, "prepared survives");
}

/// Poison records are rejected (archived with a reason and counted), or dead-lettered
/// inside the transaction when a dead-letter topic is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_are_rejected_or_dead_lettered() {
    for dead_letter in [false, true] {
        let broker = broker_with_input(500, 1, &share_config()).await;
        let mut run = Run::new(broker.clone(), memory_storage("poison"));
        run.dead_letter = dead_letter;
        run.decoder = Some(Arc::new(|r: &shareflow::connector::share::Record| {
            let id = r.value.as_deref().and_then(identity).unwrap_or(0);
            if id % 50 == 7 {
                Err(format!("record {id} does not decode"))
            } else {
                Ok(())
            }
        }));
        let (job, _, metrics) = run.job();
        job.run().await.unwrap();
        let report = run.check().await;
        let poison = metrics.records_poison.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(poison, 10);
        if dead_letter {
            let dlq = broker
                .fetch_all(
                    &shareflow::connector::share::TopicPartition::new("eos-dlq", 0),
                    shareflow::connector::share::IsolationLevel::ReadCommitted,
                )
                .await
                .unwrap();
            assert_eq!(dlq.len(), 10);
            // Dead-lettered records are ACKNOWLEDGED with their output in the DLQ, not the output topic.
            assert_eq!(report.committed_output, 490);
        } else {
            assert_eq!(report.archived.get(&ArchiveReason::Rejected.to_string()), Some(&10));
            assert!(report.ok(), "{:?}", report.violations);
            assert_eq!(report.exactly_once, 490);
        }
    }
}

/// The model's finding 1 (docs/model.md): a fenced, paused incarnation can publish its
/// manifest n after a successor's recovery aborted T(n). Recovery tombstones n before it
/// aborts, so that late manifest is never restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_written_after_recovery_aborted_its_checkpoint_is_never_restored() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let storage = storage_on(store.clone(), "c");
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let mut run = Run::new(broker.clone(), storage.clone());
    run.restarts = 0;
    run.interval = Duration::from_millis(2);
    run.max_rate = Some(4_000);
    // The incarnation that will "pause": T(n) prepared and its state written, no manifest.
    let (result, _) = run.run(vec![(points::AFTER_STATE_BEFORE_MANIFEST.to_string(), 1)]).await;
    assert!(result.is_err());
    let n = broker
        .transactions()
        .await
        .unwrap()
        .iter()
        .filter(|t| t.state == shareflow::connector::share::TransactionState::Prepare)
        .map(|t| t.id.checkpoint_id())
        .max()
        .expect("a PREPARE transaction without a manifest");
    // Its successor recovers: T(n) has no manifest, so it is aborted; then a crash, before
    // any new checkpoint.
    let (result, fired) = run.run(vec![(points::RECOVERY_MID.to_string(), 0)]).await;
    assert!(result.is_err());
    assert_eq!(fired, vec![points::RECOVERY_MID.to_string()]);
    // The paused incarnation wakes up and publishes manifest n.
    let late = shareflow::checkpoint::Manifest {
        job_id: "eos".into(),
        checkpoint_id: n,
        created_at_ms: 0,
        state_files: vec![],
        transactions: vec![],
    };
    storage.publish_manifest(&late).await.unwrap();
    // The next recovery never restores checkpoint n.
    let mut again = run.clone();
    again.restarts = 3;
    let (job, _, _) = again.job();
    let report = job.run().await.unwrap();
    assert!(report.restored_from.is_none_or(|r| r < n), "restored {:?}, not the aborted {n}", report.restored_from);
    assert_exactly_once(&again.check().await, RECORDS, "late manifest");
}

/// A failed attempt's source leaves the group as it is dropped: the records it held
/// ACQUIRED (polled, not yet bound to T(n)) go to the next attempt at once. The broker's
/// clock never moves here, so no lock ever expires: without the release the restarted
/// job would wait for those records forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_releases_what_its_source_held_without_waiting_for_locks() {
    use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, ManualClock};
    use shareflow::connector::share::ProducerRecord;
    let share = share_config();
    let broker = EmbeddedBroker::open(
        BrokerOptions::in_memory().clock(ManualClock::new(1_000_000)).default_config(share.clone()),
    )
    .await
    .unwrap();
    broker.create_topic(INPUT, 1).await.unwrap();
    broker.create_topic(OUTPUT, 1).await.unwrap();
    broker.configure_group(GROUP, share).await.unwrap();
    let records: Vec<ProducerRecord> = (0..500).map(|i| ProducerRecord::new(INPUT, 0, value_of(i))).collect();
    broker.produce(records).await.unwrap();
    let mut run = Run::new(broker.clone(), memory_storage("abandon"));
    run.parallelism = 1;
    run.restarts = 2;
    run.max_poll_records = 100;
    let crash = vec![(shareflow::connector::points::SOURCE_AFTER_POLL.to_string(), 1)];
    let (result, fired) = tokio::time::timeout(Duration::from_secs(60), run.run(crash))
        .await
        .expect("the restarted job waited for records the failed attempt held");
    result.unwrap();
    assert_eq!(fired, vec![shareflow::connector::points::SOURCE_AFTER_POLL.to_string()]);
    let report = run.check().await;
    assert_exactly_once(&report, 500, "after a crash with records ACQUIRED");
}

/// `read_committed` on the embedded broker is the group's to say: a source asking for it
/// in a group that reads uncommitted is refused, naming the setting and the fix, before
/// it reads anything; a group that reads committed takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_source_refuses_read_committed_in_a_group_that_reads_uncommitted() {
    use shareflow::connector::embedded::TopicSink;
    use shareflow::connector::share::IsolationLevel;
    use shareflow::runtime::{JobConfig, RestartStrategy};
    for isolation in [IsolationLevel::ReadUncommitted, IsolationLevel::ReadCommitted] {
        let group = shareflow::connector::share::ShareConfig::builder()
            .acknowledgement_mode(shareflow::connector::share::AcknowledgementMode::Transactional)
            .record_lock_duration(Duration::from_secs(1))
            .isolation_level(isolation)
            .build()
            .unwrap();
        let broker = broker_with_input(50, 1, &group).await;
        let (job, stream, txns) = drained_source_with(&broker, (GROUP, INPUT, group), 1, |s| s.read_committed = true);
        stream.sink("topic-sink", TopicSink::factory(broker.clone(), Some(txns), OUTPUT));
        let config = JobConfig::new(memory_storage("rc"), GROUP, "rc").restart(RestartStrategy::None);
        let result = job.build(config).unwrap().run().await;
        match isolation {
            IsolationLevel::ReadUncommitted => {
                let e = result.unwrap_err().to_string();
                assert!(
                    e.contains("read_committed") && e.contains("isolation_level(IsolationLevel::ReadCommitted)"),
                    "{e}"
                );
            }
            IsolationLevel::ReadCommitted => {
                result.unwrap();
                let out = shareflow::connector::share::TopicPartition::new(OUTPUT, 0);
                assert_eq!(broker.fetch_all(&out, isolation).await.unwrap().len(), 50);
            }
        }
    }
}
