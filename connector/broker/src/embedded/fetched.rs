//! [`FetchedRecord`]: what a plain fetch reads.

use bytes::Bytes;
use shareflow_share::TopicPartition;

use crate::batch::BatchRecord;

/// A record read by a plain (non-share) fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FetchedRecord {
    /// Offset in its partition.
    pub offset: i64,
    /// Key; `None` if produced without one.
    pub key: Option<Bytes>,
    /// Value; `None` for a tombstone.
    pub value: Option<Bytes>,
    /// Create time, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// Record headers, in order (name, value).
    pub headers: Vec<(String, Bytes)>,
}

impl FetchedRecord {
    pub(super) fn new(offset: i64, r: BatchRecord) -> Self {
        Self { offset, key: r.key, value: r.value, timestamp_ms: r.timestamp_ms, headers: r.headers }
    }

    /// The record as a share consumer sees it, read from `tp`: a first delivery.
    pub fn into_record(self, tp: &TopicPartition) -> shareflow_share::Record {
        shareflow_share::Record {
            topic: tp.topic.clone(),
            partition: tp.partition,
            offset: self.offset,
            key: self.key,
            value: self.value,
            timestamp_ms: self.timestamp_ms,
            delivery_count: 1,
            headers: self.headers,
        }
    }
}
