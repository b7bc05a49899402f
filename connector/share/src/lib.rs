//! # shareflow-share
//!
//! The KIP-932 + KIP-1289 contract in Rust: records, acknowledgements, transaction ids,
//! the two state machines, configuration, and the async traits that the embedded
//! broker (`shareflow-broker`) and the Kafka client (`shareflow-connector`) both
//! implement. Beside it, what both backends share below the contract: the one
//! [`Error`] type with its [`ErrorKind`], the offset-range set of [`ranges`], and the
//! transaction metrics' names in [`metric_names`].
//!
//! Users reach all of it as `shareflow::connector::share` (and the error as
//! `shareflow::connector::Error`).

#![forbid(missing_docs)]

mod ack_ranges;
mod api;
mod config;
pub mod dead_letter;
mod error;
pub mod metric_names;
pub mod ranges;
mod record;
mod state;
pub mod sync;

pub use ack_ranges::{AckRanges, ShareAcknowledgements};
pub use api::{
    MemberId, PendingTransaction, ProducerEpoch, ShareConsumer, ShareTransactionCoordinator,
    ShareTransactionalProducer, TransactionHandle,
};
pub use config::{keys, AcknowledgementMode, IsolationLevel, ShareConfig, ShareConfigBuilder};
pub use error::{Error, ErrorKind, Result};
pub use record::{AcknowledgeType, AcknowledgementBatch, ProducerRecord, Record, TopicPartition};
pub use shareflow_checkpoint::{validate_group_id, validate_prefix, TransactionId};
pub use state::{ArchiveReason, RecordState, TransactionState};
