//! An exactly-once pipeline on the embedded broker for failure-recovery tests:
//! share source -> SQL -> transactional topic sink, checked from outside.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use shareflow::checkpoint::{CheckpointPaths, CheckpointStore};
use shareflow::connector::broker::{BrokerOptions, EmbeddedBroker, TokioClock};
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::embedded::ShareGroupSource;
use shareflow::connector::embedded::TopicSink;
use shareflow::connector::share::{AcknowledgementMode, ProducerRecord, ShareConfig};
use shareflow::connector::verify::{check_exactly_once, ExactlyOnceReport};
use shareflow::connector::{record_schema, Decoder, SourceMetrics, SourceSettings};
use shareflow::runtime::{Job, JobBuilder, JobConfig, JobReport, RestartStrategy, RuntimeError, SqlOptions};

#[path = "demo.rs"]
pub mod demo;

pub use demo::identity;

pub const GROUP: &str = "eos";
pub const INPUT: &str = "eos-in";
pub const OUTPUT: &str = "eos-out";

pub fn value_of(id: u64) -> Vec<u8> {
    demo::value_of(id, 40)
}

/// A broker (in-memory journal, tokio clock) with `records` input records.
pub async fn broker_with_input(records: u64, partitions: u32, share: &ShareConfig) -> EmbeddedBroker {
    let broker = EmbeddedBroker::open(
        BrokerOptions::in_memory().clock(TokioClock::new(1_000_000)).default_config(share.clone()),
    )
    .await
    .unwrap();
    broker.create_topic(INPUT, partitions).await.unwrap();
    broker.create_topic(OUTPUT, partitions).await.unwrap();
    broker.create_topic("eos-dlq", 1).await.unwrap();
    broker.configure_group(GROUP, share.clone()).await.unwrap();
    let records: Vec<ProducerRecord> = (0..records)
        .map(|i| ProducerRecord {
            partition: Some((i % partitions as u64) as i32),
            ..ProducerRecord::new(INPUT, 0, value_of(i))
        })
        .collect();
    for chunk in records.chunks(5_000) {
        broker.produce(chunk.to_vec()).await.unwrap();
    }
    broker
}

/// The pipeline of these tests: share source -> upper-casing SQL -> topic sink, with
/// acknowledgements and output in T(n) of `txns`.
pub fn pipeline(
    broker: &EmbeddedBroker,
    txns: &Arc<BrokerTransactions>,
    source: SourceSettings,
    share: ShareConfig,
    parallelism: u32,
    metrics: Arc<SourceMetrics>,
) -> JobBuilder {
    let query = "SELECT key, upper(CAST(value AS VARCHAR)) AS value FROM input";
    query_pipeline(
        broker,
        txns,
        (source, share, metrics),
        ("transform", query, SqlOptions::default()),
        OUTPUT,
        parallelism,
    )
}

/// Share source (settings, group configuration, metrics) -> the query (operator name,
/// SQL, options) -> topic sink into `output`, every operator at `parallelism`, with
/// acknowledgements and output in T(n) of `txns`.
pub fn query_pipeline(
    broker: &EmbeddedBroker,
    txns: &Arc<BrokerTransactions>,
    (source, share, metrics): (SourceSettings, ShareConfig, Arc<SourceMetrics>),
    (name, query, options): (&str, &str, SqlOptions),
    output: &str,
    parallelism: u32,
) -> JobBuilder {
    let job = JobBuilder::new();
    job.source(
        "share-source",
        record_schema(),
        ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, share, metrics),
    )
    .parallelism(parallelism)
    .sql_with(name, query, options)
    .parallelism(parallelism)
    .sink("topic-sink", TopicSink::factory(broker.clone(), Some(txns.clone()), output))
    .parallelism(parallelism)
    .participant(txns.clone());
    job
}

/// An exactly-once job whose share source reads `topic` as `group` until it is drained,
/// 40 records a poll: the builder, the stream after the source (at `parallelism`), and
/// the broker participant it registered.
pub fn drained_source(
    broker: &EmbeddedBroker,
    group: &str,
    topic: &str,
    share: ShareConfig,
    parallelism: u32,
) -> (JobBuilder, shareflow::runtime::Stream, Arc<BrokerTransactions>) {
    drained_source_with(broker, (group, topic, share), parallelism, |_| {})
}

/// [`drained_source`] with the source's settings changed by `change`.
pub fn drained_source_with(
    broker: &EmbeddedBroker,
    (group, topic, share): (&str, &str, ShareConfig),
    parallelism: u32,
    change: impl FnOnce(&mut SourceSettings),
) -> (JobBuilder, shareflow::runtime::Stream, Arc<BrokerTransactions>) {
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(group, &[topic]);
    source.stop_when_drained = true;
    source.max_poll_records = 40;
    source.poll_timeout = Duration::from_millis(5);
    change(&mut source);
    let job = JobBuilder::new();
    let metrics = Arc::new(SourceMetrics::default());
    let stream = job
        .source(
            "share-source",
            record_schema(),
            ShareGroupSource::factory(broker.clone(), Some(txns.clone()), source, share, metrics),
        )
        .parallelism(parallelism);
    job.participant(txns.clone());
    (job, stream, txns)
}

/// The seeds of a campaign: `SHAREFLOW_SEED` alone if set, else 1..=`$count_var`
/// (default `default`).
pub fn campaign_seeds(count_var: &str, default: u64) -> Vec<u64> {
    match std::env::var("SHAREFLOW_SEED") {
        Ok(s) => vec![s.parse().expect("SHAREFLOW_SEED is a number")],
        Err(_) => (1..=std::env::var(count_var).ok().and_then(|s| s.parse().ok()).unwrap_or(default)).collect(),
    }
}

/// Ends a campaign: each failure's reason was printed with its replay command by the
/// caller; fails unless none failed and crashes fired in at least half the seeds.
pub fn campaign_verdict(name: &str, seeds: usize, failures: &[u64], fired: usize) {
    eprintln!("{name}: {seeds} seeds, {} failed, {fired} crashes fired", failures.len());
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    assert!(fired >= seeds / 2, "only {fired} crashes fired");
}

pub fn share_config() -> ShareConfig {
    ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .record_lock_duration(Duration::from_secs(1))
        .partition_max_record_locks(1_000_000)
        .build()
        .unwrap()
}

/// Settings of one pipeline run.
#[derive(Clone)]
pub struct Run {
    pub broker: EmbeddedBroker,
    pub storage: CheckpointStore,
    pub interval: Duration,
    pub restarts: u32,
    pub txn_timeout: Duration,
    pub decoder: Option<Decoder>,
    pub dead_letter: bool,
    pub inline_limit: usize,
    pub parallelism: u32,
    pub prefix: String,
    /// Records per second per source subtask; `None`: as fast as it goes.
    pub max_rate: Option<u64>,
    /// Records one poll returns at most.
    pub max_poll_records: usize,
}

impl Run {
    pub fn new(broker: EmbeddedBroker, storage: CheckpointStore) -> Self {
        Self {
            broker,
            storage,
            interval: Duration::from_millis(20),
            restarts: 5,
            txn_timeout: Duration::from_secs(60),
            decoder: None,
            dead_letter: false,
            inline_limit: shareflow::checkpoint::DEFAULT_INLINE_LIMIT,
            parallelism: 2,
            prefix: "job".into(),
            max_rate: None,
            max_poll_records: 200,
        }
    }

    pub fn job(&self) -> (Job, Arc<BrokerTransactions>, Arc<SourceMetrics>) {
        let txns = BrokerTransactions::new(self.broker.clone(), self.txn_timeout);
        let metrics = Arc::new(SourceMetrics::default());
        let mut source = SourceSettings::new(GROUP, &[INPUT]);
        source.stop_when_drained = true;
        source.max_poll_records = self.max_poll_records;
        // Idle polls hold barriers back; these runs use checkpoint timeouts of 50 ms.
        source.poll_timeout = Duration::from_millis(5);
        source.decoder = self.decoder.clone();
        source.max_records_per_second = self.max_rate;
        let job = pipeline(&self.broker, &txns, source, share_config(), self.parallelism, metrics.clone());
        if self.dead_letter {
            let settings = shareflow::connector::DeadLetterSettings::new("eos-dlq");
            job.dead_letters(shareflow::connector::embedded::BrokerDeadLetters::new(
                self.broker.clone(),
                Some(txns.clone()),
                settings,
            ));
        }
        let mut config = JobConfig::new(self.storage.clone(), GROUP, &self.prefix)
            .checkpoint_interval(self.interval)
            // The broker's transaction timeout must outlast interval + checkpoint timeout.
            .checkpoint_timeout(self.txn_timeout / 4)
            .restart(RestartStrategy::FixedDelay { attempts: self.restarts, delay: Duration::from_millis(10) });
        config.tolerable_checkpoint_failures = 3;
        config.inline_state_limit = self.inline_limit;
        (job.build(config).unwrap(), txns, metrics)
    }

    /// Runs with `crashes` scheduled, to the end of the input.
    pub async fn run(&self, crashes: Vec<(String, u32)>) -> (Result<JobReport, RuntimeError>, Vec<String>) {
        let (job, _, _) = self.job();
        job.failpoints().schedule(crashes);
        let result = job.run().await;
        (result, job.failpoints().fired())
    }

    pub async fn check(&self) -> ExactlyOnceReport {
        check_exactly_once(&self.broker, GROUP, INPUT, OUTPUT, identity).await.unwrap()
    }
}

pub fn memory_storage(name: &str) -> CheckpointStore {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CheckpointStore::from_url(&format!("memory://eos-{name}-{n}/c"), &[], "eos").unwrap()
}

pub fn storage_on(store: Arc<dyn ObjectStore>, root: &str) -> CheckpointStore {
    CheckpointStore::new(store, CheckpointPaths::new(root, "eos").unwrap())
}

/// Asserts I1-I5 and that every record went through exactly once.
pub fn assert_exactly_once(report: &ExactlyOnceReport, records: u64, context: &str) {
    assert!(report.ok(), "{context}: violations: {:?}", report.violations.iter().take(10).collect::<Vec<_>>());
    assert_eq!(report.produced, records, "{context}");
    assert_eq!((report.duplicates, report.lost), (0, 0), "{context}");
    let archived: u64 = report.archived.values().sum();
    assert_eq!(report.exactly_once + archived, records, "{context}");
}
