//! # shareflow-connector
//!
//! Kafka share groups (KIP-932) with transactional acknowledgements (KIP-1289), for a
//! streaming runtime that wants exactly-once from a queue.
//!
//! The tree shows the architecture:
//! - [`share`]: the contract. [`share::ShareConsumer`] polls and acknowledges,
//!   [`share::ShareTransactionCoordinator`] begins, prepares, commits and aborts
//!   transactions with ids `{groupId}-{prefix}-{checkpointId}`, and
//!   [`share::ShareTransactionalProducer`] binds output to the same transaction.
//! - [`broker`]: [`broker::EmbeddedBroker`], an in-process broker that implements all of
//!   it durably. It is the zero-set-up default.
//! - [`embedded`]: the runtime's source, sink and transactional participant on the
//!   embedded broker. [`embedded::ShareGroupSource`] is transactional (exactly-once) or
//!   explicit (at-least-once); [`embedded::BrokerTransactions`] makes the broker's
//!   transaction T(n) part of every checkpoint, and [`embedded::TopicSink`] writes
//!   output into the same T(n).
//! - [`kafka`] (feature `kafka`; on by default, here and in the `shareflow` crate,
//!   decision 0029): the same on a real Apache Kafka 4.x
//!   cluster, exactly-once through an acknowledgement ledger.
//! - What both backends share is at the top: [`SourceSettings`], [`SourceMetrics`],
//!   [`record_schema`], the fault points in [`points`], and the backend-neutral sinks
//!   [`FileSink`] and [`PrintSink`].
//! - [`stream`]: [`stream::ShareStream`], exactly-once share consumption as a
//!   `futures::Stream` of Arrow batches for a caller's own loop, on either backend.
//! - [`Error`]: one error type; [`Error::kind`] says whether to fix the input, stop
//!   (fenced), retry, or report corrupt data.
//!
//! The commit and recovery rules are decided in one place, outside this crate:
//! `shareflow_checkpoint::protocol` (`plan_recovery`, `plan_completion`); this crate's
//! participants carry them out.
//!
//! A record moves AVAILABLE -> ACQUIRED on poll, ACQUIRED -> LOCKED when acknowledged
//! into a transaction, and LOCKED -> ACKNOWLEDGED in the same atomic step that makes the
//! transaction's output visible. See [`broker::EmbeddedBroker`] for a runnable example.

#![forbid(missing_docs)]

mod common;
pub mod embedded;
#[cfg(feature = "kafka")]
pub mod kafka;
mod sinks;
pub mod stream;
pub mod verify;

/// The KIP-932 + KIP-1289 contract (crate `shareflow-share`): records,
/// acknowledgements, transaction ids, the two state machines, configuration, and the
/// async traits that both backends implement.
pub mod share {
    pub use shareflow_share::{
        dead_letter, keys, validate_group_id, validate_prefix, AckRanges, AcknowledgeType, AcknowledgementBatch,
        AcknowledgementMode, ArchiveReason, IsolationLevel, MemberId, PendingTransaction, ProducerEpoch,
        ProducerRecord, Record, RecordState, ShareAcknowledgements, ShareConfig, ShareConfigBuilder, ShareConsumer,
        ShareTransactionCoordinator, ShareTransactionalProducer, TopicPartition, TransactionHandle, TransactionId,
        TransactionState,
    };
}

/// The embedded broker (crate `shareflow-broker`), with its metrics read as the
/// runtime's ([`BrokerMetrics`](broker::BrokerMetrics)).
pub mod broker {
    pub use crate::embedded::BrokerMetrics;
    pub use shareflow_broker::*;
    pub use shareflow_runtime::{Histogram, Metric, MetricValue};
}

pub use common::dead_letters::{self, DeadLetterSettings};
pub use common::{
    points, record_schema, records_to_batch, Decoder, SourceMetrics, SourceSettings, DEFAULT_MAX_POLL_RECORDS,
    DEFAULT_POLL_TIMEOUT,
};
pub use shareflow_share::{Error, ErrorKind, Result};
#[cfg(feature = "postgres")]
pub use sinks::postgres;
#[cfg(feature = "tables")]
pub use sinks::table;
pub use sinks::{FileCommitter, FileSink, PrintSink};
