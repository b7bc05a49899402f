//! The KIP-932 + KIP-1289 contract in Rust: records, acknowledgements, transaction ids,
//! the two state machines, configuration, and the async traits that the embedded
//! broker and the Kafka client both implement.

mod ack_ranges;
mod api;
mod config;
mod record;
mod state;

pub use ack_ranges::{AckRanges, ShareAcknowledgements};
pub use api::{
    MemberId, PendingTransaction, ProducerEpoch, ShareConsumer, ShareTransactionCoordinator,
    ShareTransactionalProducer, TransactionHandle,
};
pub use config::{keys, AcknowledgementMode, IsolationLevel, ShareConfig, ShareConfigBuilder};
pub use record::{AcknowledgeType, AcknowledgementBatch, ProducerRecord, Record, TopicPartition};
pub use shareflow_checkpoint::{validate_group_id, validate_prefix, TransactionId};
pub use state::{ArchiveReason, RecordState, TransactionState};
