//! Real Apache Kafka 4.x: a share consumer over the wire, a transactional sink, and
//! exactly-once on stock brokers through an acknowledgement ledger.
//!
//! Stock Kafka has share groups (KIP-932) but not KIP-1289: share acknowledgements
//! cannot join a Kafka transaction. [`KafkaTransactions`] closes the gap (decisions
//! `kafka-exactly-once.md` and 0008):
//!
//! 1. Before a source subtask's records of checkpoint n go anywhere, it writes an **intent**
//!    naming their offsets to the group's intents topic `{group}-intents`, which every
//!    instance of the group tails. The first intent naming an offset owns it
//!    ([`Claimant`], `claims.rs`); a checkpoint that lost a claim aborts at prepare.
//! 2. T(n) is a Kafka transaction on `{group}-{prefix}-g{generation}-s{n mod K}`: a
//!    bounded pool of K transactional ids per job attempt, so a new attempt or an
//!    adopter can fence every id the prefix ever used. The sink writes the output of
//!    checkpoint n into it, with a **commit entry** for checkpoint n in
//!    `{group}-{prefix}-ledger`.
//! 3. The checkpoint manifest decides; T(n) commits on `notify_checkpoint_complete`.
//!    The source ACCEPTed its records as soon as their intent was durable, before it
//!    emitted them: from then on the ledger, not the share group, says what is done.
//! 4. A delivery that any intent names is acknowledged and dropped: its owner commits
//!    or replays it. An offset owned by a claimant the attempt holds (its own earlier
//!    generations, or an adopted instance) and not in a committed checkpoint is replayed
//!    from the topic's log.
//!
//! A crash between the manifest and the commit leaves T(n) open on the broker; recovery
//! finds it with DescribeTransactions and commits it by producer id and epoch (EndTxn).

mod client;
mod dead_letters;
mod ledger;
mod metrics;
mod sink;
mod source;
mod transactions;
mod txn_config;

pub use client::{
    GatePassed, JoinGate, KafkaCluster, KafkaShareConsumer, KafkaShareConsumerConfig, KafkaTransactionInfo,
    ShareGroupBacklog, SharePartitionOffsets, TopicWriter, WHOLE_FETCH_POLL_RECORDS,
};
pub use dead_letters::KafkaDeadLetters;
pub use ledger::{ledger_topic, plan_ledger_gc, Claimant, GroupIntent, LedgerRange, LedgerTopicFate};
pub use metrics::seed_transaction_metrics;
pub use sink::KafkaSink;
pub use source::KafkaShareSource;
pub use transactions::{KafkaTransactions, LedgerReads};
pub use txn_config::{is_slot_id, KafkaTransactionsConfig};
