//! Records, topic partitions and acknowledgement types.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A topic and partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TopicPartition {
    /// Topic name, as created on the broker.
    pub topic: Arc<str>,
    /// Partition index, from 0.
    pub partition: i32,
}

impl TopicPartition {
    /// A topic partition.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        Self { topic: topic.into(), partition }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// One record delivered to a share consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Topic the record came from.
    pub topic: Arc<str>,
    /// Partition the record came from.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Record key; `None` for a record produced without one.
    pub key: Option<Bytes>,
    /// Record value; `None` for a tombstone.
    pub value: Option<Bytes>,
    /// Create time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// How many times the record has been delivered, this delivery included (>= 1).
    pub delivery_count: i16,
    /// Record headers, in order (name, value); empty for most records.
    pub headers: Vec<(String, Bytes)>,
}

impl Record {
    /// True for a redelivery: the record was delivered before (to this member or
    /// another) and not settled.
    pub fn is_redelivery(&self) -> bool {
        self.delivery_count > 1
    }

    /// The record's topic partition.
    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition { topic: self.topic.clone(), partition: self.partition }
    }
}

/// A record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Destination topic.
    pub topic: Arc<str>,
    /// Destination partition; `None` picks one by key hash (or round robin without a key).
    pub partition: Option<i32>,
    /// Key; with `partition: None` it picks the partition by hash.
    pub key: Option<Bytes>,
    /// Value; `None` produces a tombstone.
    pub value: Option<Bytes>,
    /// Create time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Record headers, in order (name, value).
    pub headers: Vec<(String, Bytes)>,
}

impl ProducerRecord {
    /// A record with a value, to a chosen partition.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32, value: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            partition: Some(partition),
            key: None,
            value: Some(value.into()),
            timestamp_ms: 0,
            headers: Vec::new(),
        }
    }

    /// Sets the key (it does not change an explicitly chosen partition).
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// How a share consumer settles a delivered record (KIP-932, RENEW from KIP-1222).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AcknowledgeType {
    /// Processed: the record is done (ACKNOWLEDGED).
    Accept,
    /// Give it back for another delivery (AVAILABLE, or ARCHIVED at the delivery limit).
    Release,
    /// Unprocessable: never deliver it again (ARCHIVED).
    Reject,
    /// Keep holding it: restart the acquisition lock.
    Renew,
}

impl fmt::Display for AcknowledgeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AcknowledgeType::Accept => "ACCEPT",
            AcknowledgeType::Release => "RELEASE",
            AcknowledgeType::Reject => "REJECT",
            AcknowledgeType::Renew => "RENEW",
        })
    }
}

/// A contiguous range of offsets settled the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AcknowledgementBatch {
    /// First offset, inclusive.
    pub first_offset: i64,
    /// Last offset, inclusive.
    pub last_offset: i64,
    /// How the offsets are settled.
    pub ack_type: AcknowledgeType,
}

impl AcknowledgementBatch {
    /// A batch covering `first..=last`.
    pub fn new(first_offset: i64, last_offset: i64, ack_type: AcknowledgeType) -> Self {
        Self { first_offset, last_offset, ack_type }
    }

    /// Number of offsets in the batch.
    pub fn len(&self) -> u64 {
        (self.last_offset - self.first_offset + 1).max(0) as u64
    }

    /// True when `last_offset < first_offset`.
    pub fn is_empty(&self) -> bool {
        self.last_offset < self.first_offset
    }
}
