//! The exactly-once checker: invariants I1-I4 and I8 of docs/design.md §4, checked from outside the
//! pipeline (the demo and the failure-recovery tests use it).

use std::collections::BTreeMap;

use crate::broker::EmbeddedBroker;
use crate::share::{IsolationLevel, RecordState, TopicPartition};
use shareflow_share::Result;

/// What the checker found, from outside the pipeline: the input topic's records and
/// their share-partition states, and the output topic read with read_committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExactlyOnceReport {
    /// Records in the input topic, over all partitions.
    pub produced: u64,
    /// Output records visible to read_committed readers.
    pub committed_output: u64,
    /// Input records whose output is committed exactly once and that are ACKNOWLEDGED.
    pub exactly_once: u64,
    /// Extra copies of committed output.
    pub duplicates: u64,
    /// Input records neither done (ACKNOWLEDGED or ARCHIVED) nor output.
    pub lost: u64,
    /// Input records ARCHIVED, by reason.
    pub archived: BTreeMap<String, u64>,
    /// Every broken invariant, one line each (I1-I4 and I8 of docs/design.md §4).
    pub violations: Vec<String>,
}

impl ExactlyOnceReport {
    /// No invariant is broken.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks invariants I1-I4 and I8 at quiescence. `identity` extracts the input record's id
/// from an input value and from an output value (the pipeline must carry it through).
pub async fn check_exactly_once(
    broker: &EmbeddedBroker,
    group: &str,
    input_topic: &str,
    output_topic: &str,
    identity: impl Fn(&[u8]) -> Option<u64>,
) -> Result<ExactlyOnceReport> {
    let mut report = ExactlyOnceReport::default();
    let mut outputs: BTreeMap<u64, u64> = BTreeMap::new();
    for p in 0..broker.partition_count(output_topic)? as i32 {
        let tp = TopicPartition::new(output_topic, p);
        for r in broker.fetch_all(&tp, IsolationLevel::ReadCommitted).await? {
            report.committed_output += 1;
            match r.value.as_deref().and_then(&identity) {
                Some(id) => *outputs.entry(id).or_default() += 1,
                None => report.violations.push(format!("output {tp} offset {} has no input identity", r.offset)),
            }
        }
    }
    let mut seen = BTreeMap::new();
    for p in 0..broker.partition_count(input_topic)? as i32 {
        let tp = TopicPartition::new(input_topic, p);
        for r in broker.fetch_all(&tp, IsolationLevel::ReadUncommitted).await? {
            report.produced += 1;
            let Some(id) = r.value.as_deref().and_then(&identity) else {
                report.violations.push(format!("input {tp} offset {} has no identity", r.offset));
                continue;
            };
            seen.insert(id, ());
            let copies = outputs.get(&id).copied().unwrap_or(0);
            let status = broker.record_status(group, &tp, r.offset).await?;
            if copies > 1 {
                report.duplicates += copies - 1;
                report.violations.push(format!("I2: input {tp}@{} (id {id}) has {copies} committed outputs", r.offset));
            }
            match (status.state, copies) {
                (RecordState::Acknowledged, 1) => report.exactly_once += 1,
                (RecordState::Acknowledged, 0) => {
                    report.lost += 1;
                    report.violations.push(format!("I3: {tp}@{} is ACKNOWLEDGED without committed output", r.offset));
                }
                (RecordState::Archived, n) => {
                    let reason = status.archive_reason.map_or("unknown".to_string(), |r| r.to_string());
                    *report.archived.entry(reason.clone()).or_default() += 1;
                    if n > 0 {
                        report
                            .violations
                            .push(format!("I4: {tp}@{} is ARCHIVED ({reason}) yet has committed output", r.offset));
                    }
                }
                (state, 0) => {
                    report.lost += 1;
                    report.violations.push(format!("I1: {tp}@{} is {state} at quiescence, with no output", r.offset));
                }
                (state, _) => {
                    report.violations.push(format!(
                        "I4: {tp}@{} has committed output but is {state}: it would be redelivered",
                        r.offset
                    ));
                }
            }
        }
    }
    for id in outputs.keys() {
        if !seen.contains_key(id) {
            report.violations.push(format!("output id {id} matches no input record"));
        }
    }
    for t in broker.transactions().await? {
        if t.state.is_pending() && t.id.group_id() == group {
            report.violations.push(format!("I8: transaction {} is still {} at quiescence", t.id, t.state));
        }
    }
    debug_assert!(
        report.violations.iter().any(|v| v.starts_with("I2") || v.starts_with("I4") || v.starts_with("output"))
            || report.exactly_once + report.duplicates == report.committed_output,
        "acknowledged records and committed outputs must pair up"
    );
    Ok(report)
}
