//! The headers of a dead letter. A dead letter written by a job (any backend) and one
//! written by a broker (Kafka 4.4's share-group DLQ, or the embedded broker at the
//! delivery limit) carry the same names, KIP-1191's, so that Kafka's tools and
//! `shareflow dlq` read them the same way.

/// The input record's topic (KIP-1191).
pub const HEADER_TOPIC: &str = "__dlq.errors.topic";
/// Its partition (KIP-1191).
pub const HEADER_PARTITION: &str = "__dlq.errors.partition";
/// Its offset (KIP-1191).
pub const HEADER_OFFSET: &str = "__dlq.errors.offset";
/// The share group (KIP-1191).
pub const HEADER_GROUP: &str = "__dlq.errors.group";
/// Its delivery count when it failed (KIP-1191).
pub const HEADER_DELIVERY_COUNT: &str = "__dlq.errors.delivery.count";
/// What failed, in words (KIP-1191).
pub const HEADER_MESSAGE: &str = "__dlq.errors.message";
/// Why: `decode`, `sql`, `sink` or `delivery-limit` (shareflow's own header).
pub const HEADER_CAUSE: &str = "shareflow.dlq.cause";
/// The task that gave up on it, `operator[subtask]`, or `broker` (shareflow's own
/// header).
pub const HEADER_TASK: &str = "shareflow.dlq.task";
/// The cause of a record archived at the delivery limit.
pub const CAUSE_DELIVERY_LIMIT: &str = "delivery-limit";
