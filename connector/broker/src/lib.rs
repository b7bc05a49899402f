//! # shareflow-broker
//!
//! The embedded broker: KIP-932 share groups with KIP-1289 transactional
//! acknowledgements, in process, durable through a journal on `object_store`. It
//! implements the contract of `shareflow-share` and depends on nothing of the runtime;
//! users reach it as `shareflow::connector::broker`.
//!
//! - [`EmbeddedBroker`]: topics, produce and fetch, share consumers, coordinators.
//! - Pure state machines inside: the record states of each share partition and the
//!   transaction table take a command and a time and return the new state. The broker
//!   shell only locks, journals and waits.
//! - Durability: every call returns after its effect is in the journal. Reopening the
//!   same store restores topics, ACKNOWLEDGED, ARCHIVED and LOCKED records and every
//!   transaction; ACQUIRED records come back AVAILABLE, as in Kafka.

#![forbid(missing_docs)]

pub(crate) mod batch;
mod clock;
mod embedded;
pub mod fault;
mod journal;
pub(crate) mod log;
mod metrics;
#[cfg(feature = "model")]
#[doc(hidden)]
pub mod model;
mod run_map;
mod share_partition;
pub(crate) mod state;
mod txn;

pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use embedded::{
    Backlog, BrokerOptions, DeadLetterTarget, EmbeddedBroker, EmbeddedShareConsumer, EmbeddedTransactionCoordinator,
    FetchedRecord, SharePartitionInfo, TransactionInfo, TransactionalShareAcknowledger, DEFAULT_RETENTION_CHECK,
    DEFAULT_RETENTION_MS,
};
pub use journal::{Durability, Opened};
pub use log::Retention;
pub use metrics::{
    Latency, MetricsSnapshot, TRANSACTION_ABORT_TOTAL, TRANSACTION_ACTIVE, TRANSACTION_COMMIT_TIME_MS,
    TRANSACTION_PREPARE_TIME_MS, TRANSACTION_TIMEOUT_TOTAL,
};
pub use state::RecordStatus;
