//! A keyed count on Kafka, as the stateful Kafka tests run it: a share source (spread
//! over a few seconds), `SELECT key, count(*) ... GROUP BY key`, a transactional sink.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use shareflow::checkpoint::CheckpointStore;
use shareflow::connector::kafka::{
    KafkaCluster, KafkaShareSource, KafkaSink, KafkaTransactions, KafkaTransactionsConfig,
};
use shareflow::connector::{record_schema, SourceMetrics, SourceSettings};
use shareflow::runtime::{Job, JobBuilder, JobConfig, RestartStrategy};

/// How a count job runs.
#[derive(Debug, Clone)]
pub struct Counts {
    /// Subtasks per operator.
    pub parallelism: u32,
    /// Stop once the input is drained.
    pub drain: bool,
    /// Restarts after a failure.
    pub restarts: u32,
    /// The transactions' timeout, if not the default.
    pub transaction_timeout: Option<Duration>,
    /// The savepoint to start from.
    pub savepoint: Option<String>,
    /// Records per second per source subtask.
    pub rate: u64,
}

/// The count of `group` from `input` into `output`, checkpoints under `root`.
pub fn counting_job(cluster: &KafkaCluster, (group, input, output): (&str, &str, &str), root: &str, c: &Counts) -> Job {
    let mut txn_config = KafkaTransactionsConfig::default();
    if let Some(t) = c.transaction_timeout {
        txn_config = txn_config.transaction_timeout(t);
    }
    let txns = KafkaTransactions::new(cluster.clone(), txn_config);
    let mut source = SourceSettings::new(group, &[input]);
    source.from_earliest = true;
    source.stop_when_drained = c.drain;
    source.max_poll_records = 50;
    source.max_records_per_second = Some(c.rate);
    let builder = JobBuilder::new();
    builder
        .source(
            "share-source",
            record_schema(),
            KafkaShareSource::factory(cluster.clone(), txns.clone(), source, Arc::new(SourceMetrics::default())),
        )
        .sql("count", "SELECT CAST(key AS VARCHAR) AS key, CAST(count(*) AS VARCHAR) AS value FROM input GROUP BY key")
        .sink("kafka-sink", KafkaSink::factory(txns.clone(), output))
        .participant(txns);
    let storage = CheckpointStore::from_url(root, &[], "counts").unwrap();
    let mut config = JobConfig::new(storage, group, "counts")
        .parallelism(c.parallelism)
        .checkpoint_interval(Duration::from_millis(300))
        .checkpoint_timeout(Duration::from_secs(5))
        .restart(RestartStrategy::FixedDelay { attempts: c.restarts, delay: Duration::from_millis(10) });
    // A cold broker may time the first checkpoints out while the group forms.
    config.tolerable_checkpoint_failures = 2;
    if let Some(url) = &c.savepoint {
        config = config.from_savepoint(url.clone());
    }
    builder.build(config).unwrap()
}
