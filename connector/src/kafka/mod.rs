//! Real Apache Kafka 4.x: a share consumer over the wire, a transactional sink, and
//! exactly-once on stock brokers through an acknowledgement ledger.
//!
//! Stock Kafka has share groups (KIP-932) but not KIP-1289: share acknowledgements
//! cannot join a Kafka transaction. [`KafkaTransactions`] closes the gap
//! (`docs/decisions/kafka-exactly-once.md`):
//!
//! 1. T(n) is a Kafka transaction with `transactional.id` = `{group}-{prefix}-{n}`. The
//!    sink writes the output of epoch n into it, and each source subtask writes a
//!    **ledger entry** (the offsets it will acknowledge for epoch n) into the ledger
//!    topic inside the same transaction.
//! 2. The checkpoint manifest decides; T(n) commits on `notify_checkpoint_complete`.
//! 3. Only then does the source send the acknowledgements to the share group.
//! 4. A record the broker hands out again (its acknowledgement was lost in a crash, or
//!    its lock expired) is looked up in the committed ledger and acknowledged without
//!    being processed again.
//!
//! A crash between the manifest and the commit leaves T(n) open on the broker; recovery
//! finds it with DescribeTransactions and commits it by producer id and epoch (EndTxn).

mod claims;
mod client;
mod consumer;
mod error;
mod group;
mod ledger;
mod ledger_log;
mod recovery;
mod sink;
mod source;
mod transactions;

pub use claims::Claimant;
pub use client::{KafkaCluster, ShareGroupBacklog};
pub use consumer::{KafkaShareConsumer, KafkaShareConsumerConfig};
pub use ledger::LedgerRange;
pub use sink::KafkaSink;
pub use source::KafkaShareSource;
pub use transactions::{KafkaTransactions, KafkaTransactionsConfig};

pub(crate) use error::kafka_error;
