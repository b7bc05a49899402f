//! Acknowledgements kept as merged offset ranges, never one entry per record.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{AcknowledgeType, AcknowledgementBatch, TopicPartition};
use crate::error::{Error, Result};
use crate::ranges::{OffsetRanges, Overlap};

/// The acknowledgements of one partition as disjoint, merged offset ranges.
///
/// Adjacent ranges of the same type merge, so a million contiguous ACCEPTs are one
/// entry. Adding an offset twice is an error: a record is settled once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRanges {
    /// first offset -> (last offset, type); serialized as that map.
    ranges: OffsetRanges<AcknowledgeType>,
    records: u64,
}

impl AckRanges {
    /// No acknowledgements.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `first..=last` as `ack_type`. Fails without changing anything when any of
    /// the offsets is already present or the range is empty or negative.
    pub fn add(&mut self, batch: AcknowledgementBatch) -> Result<()> {
        let AcknowledgementBatch { first_offset: first, last_offset: last, ack_type } = batch;
        if first < 0 || last < first {
            return Err(Error::InvalidRequest(format!("acknowledgement range {first}..={last} is empty or negative")));
        }
        self.ranges.insert(first, last, ack_type).map_err(|Overlap { first, last }| {
            Error::InvalidRequest(format!("offsets {first}..={last} are acknowledged twice"))
        })?;
        // 0 <= first <= last, so the count is at most i64::MAX + 1: no overflow.
        self.records = self.records.saturating_add(last.abs_diff(first) + 1);
        Ok(())
    }

    /// Adds one offset.
    pub fn add_offset(&mut self, offset: i64, ack_type: AcknowledgeType) -> Result<()> {
        self.add(AcknowledgementBatch::new(offset, offset, ack_type))
    }

    /// The merged batches, in offset order.
    pub fn batches(&self) -> impl Iterator<Item = AcknowledgementBatch> + '_ {
        self.ranges.iter().map(|(first, last, &ty)| AcknowledgementBatch::new(first, last, ty))
    }

    /// Number of merged ranges.
    pub fn range_count(&self) -> usize {
        self.ranges.range_count()
    }

    /// Number of offsets covered.
    pub fn record_count(&self) -> u64 {
        self.records
    }

    /// True when nothing is acknowledged.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The type `offset` is acknowledged with, if any.
    pub fn get(&self, offset: i64) -> Option<AcknowledgeType> {
        self.ranges.get(offset).map(|(_, _, &ty)| ty)
    }
}

/// Acknowledgements across partitions, as sent with one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareAcknowledgements {
    partitions: BTreeMap<TopicPartition, AckRanges>,
}

impl ShareAcknowledgements {
    /// An empty set: nothing to acknowledge yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a batch for a partition.
    pub fn add(&mut self, tp: TopicPartition, batch: AcknowledgementBatch) -> Result<()> {
        self.partitions.entry(tp).or_default().add(batch)
    }

    /// Settles every record in `records` the same way.
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a super::Record>,
        ack_type: AcknowledgeType,
    ) -> Result<Self> {
        let mut acks = Self::new();
        for r in records {
            acks.partitions.entry(r.topic_partition()).or_default().add_offset(r.offset, ack_type)?;
        }
        Ok(acks)
    }

    /// The partitions and their ranges.
    pub fn partitions(&self) -> impl Iterator<Item = (&TopicPartition, &AckRanges)> {
        self.partitions.iter()
    }

    /// Total offsets covered.
    pub fn record_count(&self) -> u64 {
        self.partitions.values().map(AckRanges::record_count).sum()
    }

    /// True when there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.partitions.values().all(AckRanges::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AcknowledgeType::*;

    #[test]
    fn adjacent_same_type_merges_both_ways() {
        let mut r = AckRanges::new();
        r.add_offset(5, Accept).unwrap();
        r.add_offset(7, Accept).unwrap();
        r.add_offset(6, Accept).unwrap();
        assert_eq!(r.batches().collect::<Vec<_>>(), vec![AcknowledgementBatch::new(5, 7, Accept)]);
        assert_eq!(r.record_count(), 3);
    }

    #[test]
    fn different_types_stay_apart() {
        let mut r = AckRanges::new();
        r.add_offset(1, Accept).unwrap();
        r.add_offset(2, Reject).unwrap();
        r.add_offset(3, Accept).unwrap();
        assert_eq!(r.range_count(), 3);
        assert_eq!(r.get(2), Some(Reject));
        assert_eq!(r.get(4), None);
    }

    #[test]
    fn a_million_contiguous_acks_are_one_range() {
        let mut r = AckRanges::new();
        for o in 0..1_000_000 {
            r.add_offset(o, Accept).unwrap();
        }
        assert_eq!(r.range_count(), 1);
        assert_eq!(r.record_count(), 1_000_000);
    }

    #[test]
    fn overlap_is_rejected_and_changes_nothing() {
        let mut r = AckRanges::new();
        r.add(AcknowledgementBatch::new(10, 20, Accept)).unwrap();
        let before = r.clone();
        let err = r.add(AcknowledgementBatch::new(15, 30, Accept)).unwrap_err();
        assert!(err.to_string().contains("15..=20"), "{err}");
        assert!(r.add(AcknowledgementBatch::new(0, 10, Reject)).is_err());
        assert!(r.add(AcknowledgementBatch::new(3, 2, Reject)).is_err());
        assert_eq!(r, before);
    }

    #[test]
    fn the_whole_non_negative_domain_counts_without_overflow() {
        let mut r = AckRanges::new();
        r.add(AcknowledgementBatch::new(0, i64::MAX, Accept)).unwrap();
        assert_eq!(r.range_count(), 1);
        // i64::MAX + 1 offsets: 0..=i64::MAX.
        assert_eq!(r.record_count(), 1u64 << 63);
        let err = r.add_offset(i64::MAX, Reject).unwrap_err();
        assert!(err.to_string().contains(&format!("offsets {0}..={0} are acknowledged twice", i64::MAX)), "{err}");
    }

    #[test]
    fn the_serialized_form_is_still_the_plain_map() {
        // The format before the shared range type: a map first -> (last, type).
        #[derive(Serialize)]
        struct Old {
            ranges: BTreeMap<i64, (i64, AcknowledgeType)>,
            records: u64,
        }
        let mut r = AckRanges::new();
        r.add(AcknowledgementBatch::new(0, 9, Accept)).unwrap();
        r.add(AcknowledgementBatch::new(10, 12, Reject)).unwrap();
        r.add(AcknowledgementBatch::new(20, 20, Release)).unwrap();
        let old =
            Old { ranges: BTreeMap::from([(0, (9, Accept)), (10, (12, Reject)), (20, (20, Release))]), records: 14 };
        let old_bytes = postcard::to_allocvec(&old).unwrap();
        assert_eq!(postcard::to_allocvec(&r).unwrap(), old_bytes);
        assert_eq!(postcard::from_bytes::<AckRanges>(&old_bytes).unwrap(), r);
    }
}
