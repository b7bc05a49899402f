//! Real Apache Kafka 4.x: a share consumer over the wire, a transactional sink, and
//! exactly-once on stock brokers through an acknowledgement ledger.
//!
//! Stock Kafka has share groups (KIP-932) but not KIP-1289: share acknowledgements
//! cannot join a Kafka transaction. [`KafkaTransactions`] closes the gap (decisions
//! `kafka-exactly-once.md` and 0008):
//!
//! 1. Before a source subtask's records of epoch n go anywhere, it writes an **intent**
//!    naming their offsets to the group's intents topic `{group}-intents`, which every
//!    instance of the group tails. The first intent naming an offset owns it
//!    ([`Claimant`], `claims.rs`); an epoch that lost a claim aborts at prepare.
//! 2. T(n) is a Kafka transaction on `{group}-{prefix}-g{generation}-s{n mod K}`: a
//!    bounded pool of K transactional ids per job attempt, so a new attempt or an
//!    adopter can fence every id the prefix ever used. The sink writes the output of
//!    epoch n into it, with a **commit entry** for epoch n in `{group}-{prefix}-ledger`.
//! 3. The checkpoint manifest decides; T(n) commits on `notify_checkpoint_complete`.
//!    Only then does the source send the acknowledgements to the share group.
//! 4. A delivery that any intent names is acknowledged and dropped: its owner commits
//!    or replays it. An offset owned by a claimant the attempt holds (its own earlier
//!    generations, or an adopted instance) and not in a committed epoch is replayed from
//!    the topic's log.
//!
//! A crash between the manifest and the commit leaves T(n) open on the broker; recovery
//! finds it with DescribeTransactions and commits it by producer id and epoch (EndTxn).

mod claims;
mod client;
mod client_thread;
mod consumer;
mod error;
mod group;
mod join_gate;
mod ledger;
mod ledger_log;
mod recovery;
mod sink;
mod source;
mod transactions;
mod txn_admin;

pub use claims::Claimant;
pub use client::{KafkaCluster, ShareGroupBacklog, TopicWriter};
pub use consumer::{KafkaShareConsumer, KafkaShareConsumerConfig, WHOLE_FETCH_POLL_RECORDS};
pub use group::GroupIntent;
pub use join_gate::{GatePassed, JoinGate};
pub use ledger::LedgerRange;
pub use sink::KafkaSink;
pub use source::KafkaShareSource;
pub use transactions::{KafkaTransactions, KafkaTransactionsConfig, LedgerReads};
pub use txn_admin::KafkaTransactionInfo;

pub(crate) use error::kafka_error;

/// KIP-1289's five transaction metrics as a job on stock Kafka sees them. Kafka has no
/// share transactions to count, so the coordinator's view stands in: active is the job's
/// open transactions, prepare and commit time are a checkpoint's phases one and two
/// over every participant, and timeouts are the prepares refused because the
/// transaction had already aborted.
pub fn seed_transaction_metrics(job: &shareflow_runtime::JobMetricsSnapshot) -> Vec<shareflow_runtime::Metric> {
    use shareflow_runtime::{Metric, MetricValue};
    use shareflow_share::metric_names::{
        TRANSACTION_ABORT_TOTAL, TRANSACTION_ACTIVE, TRANSACTION_COMMIT_TIME_MS, TRANSACTION_PREPARE_TIME_MS,
        TRANSACTION_TIMEOUT_TOTAL,
    };
    let c = &job.checkpoints;
    vec![
        Metric::new(
            TRANSACTION_ACTIVE,
            "transactions the job has begun and not decided",
            MetricValue::Gauge(c.transactions_open),
        ),
        Metric::new(
            TRANSACTION_PREPARE_TIME_MS,
            "prepare latency of a checkpoint, every participant, ms",
            MetricValue::Histogram(Box::new(c.prepare.clone())),
        ),
        Metric::new(
            TRANSACTION_COMMIT_TIME_MS,
            "commit latency of a checkpoint, every participant, ms",
            MetricValue::Histogram(Box::new(c.commit.clone())),
        ),
        Metric::new(
            TRANSACTION_ABORT_TOTAL,
            "aborted transactions, timeouts included",
            MetricValue::Counter(c.transactions_aborted),
        ),
        Metric::new(
            TRANSACTION_TIMEOUT_TOTAL,
            "transactions found aborted by their timeout at prepare",
            MetricValue::Counter(c.transactions_timed_out),
        ),
    ]
}
