//! The Kafka client side: the cluster handle with its admin calls and writers, the share
//! consumer on a thread of its own, the join gate, and the errors. Nothing here knows
//! the ledger or the runtime.

mod cluster;
mod consumer;
mod error;
mod join_gate;
mod thread;
mod txn_admin;

pub(crate) use cluster::{
    await_all, enqueue_all, CachedProducer, BOUNDED_READ_WAIT, OUTPUT_BATCH_BYTES, OUTPUT_LINGER,
};
pub use cluster::{KafkaCluster, ShareGroupBacklog, SharePartitionOffsets, TopicWriter};
pub(crate) use consumer::to_record;
pub use consumer::{KafkaShareConsumer, KafkaShareConsumerConfig, WHOLE_FETCH_POLL_RECORDS};
pub(crate) use error::kafka_error;
pub use join_gate::{GatePassed, JoinGate};
pub use txn_admin::KafkaTransactionInfo;
pub(crate) use txn_admin::{KafkaTxnDescription, KafkaTxnState};
