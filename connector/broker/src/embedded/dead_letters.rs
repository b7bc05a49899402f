//! Records archived at the delivery limit, on the embedded broker: each archived batch is
//! logged at warn with its partition and offsets, and, for a group with a dead-letter
//! topic, written there in the same journaled step that marks it dead-lettered
//! (KIP-1191's ARCHIVING -> ARCHIVED, exactly once; decision 0041).

use bytes::Bytes;

use super::EmbeddedBroker;
use crate::batch;
use crate::journal::Written;
use crate::log::LogRecord;
use crate::share_partition::AcquiredRange;
use crate::state::{BrokerState, Command, Entry, Outcome};
use shareflow_share::dead_letter::{
    CAUSE_DELIVERY_LIMIT, HEADER_CAUSE, HEADER_DELIVERY_COUNT, HEADER_GROUP, HEADER_MESSAGE, HEADER_OFFSET,
    HEADER_PARTITION, HEADER_TASK, HEADER_TOPIC,
};
use shareflow_share::{Error, Record, Result, TopicPartition};

/// Where a group's records archived at the delivery limit go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterTarget {
    /// The dead-letter topic; it must exist.
    pub topic: String,
    /// Copy each record's key and value, or only the headers.
    pub copy_record: bool,
}

/// Dead letters per journal entry at most: an entry of a long archived run stays small.
const LETTERS_PER_ENTRY: usize = 1_000;
/// Bytes of dead letters per journal entry at most (past one record).
const BYTES_PER_ENTRY: usize = 8 << 20;
/// Rounds of dead-lettering in one call: a dead-lettering step's own expiry may archive
/// more, which the next round takes.
const ROUNDS: usize = 16;

impl EmbeddedBroker {
    /// From now on, records `group` archives at its delivery limit go to `target`'s
    /// topic, each once, in the journal entry that marks it dead-lettered; records the
    /// group archived at the limit before, still in the log, go there now. The setting
    /// lives as long as this broker handle's process: a job that wants it sets it at
    /// each start (`shareflow run` does, from `[dead_letters]`). Records archived while
    /// it is unset stay ARCHIVED (reason `delivery_limit`) until it is set again, unless
    /// retention deletes them first. Returns how many records it dead-lettered now.
    pub async fn dead_letter_archived(&self, group: &str, target: DeadLetterTarget) -> Result<u64> {
        let (written, letters) = {
            let mut st = self.state()?;
            st.log(&TopicPartition::new(target.topic.as_str(), 0)).map_err(|_| {
                Error::InvalidRequest(format!(
                    "dead-letter topic {} of group {group} does not exist; create it first",
                    target.topic
                ))
            })?;
            shareflow_share::sync::lock(&self.inner.dead_letter_targets).insert(group.to_string(), target);
            let now_ms = self.inner.clock.now_ms().max(st.last_now_ms);
            let ranges = st.archived_at_limit(group).into_iter().map(|(tp, f, l)| (group.to_string(), tp, f, l));
            let (written, letters) = self.dead_letter_ranges(&mut st, now_ms, ranges.collect())?;
            let events = std::mem::take(&mut st.events);
            drop(st);
            self.publish(&events);
            (written, letters)
        };
        if let Some(w) = written {
            self.inner.journal.sync(w).await?;
        }
        Ok(letters)
    }

    /// After a command, under the state lock: logs what it archived at the delivery
    /// limit, and dead-letters what belongs to a group with a target. Returns the last
    /// entry written, if any.
    pub(super) fn after_limit_archived(&self, st: &mut BrokerState, now_ms: u64) -> Result<Option<Written>> {
        if st.events.limit_archived.is_empty() {
            return Ok(None);
        }
        let archived = std::mem::take(&mut st.events.limit_archived);
        for (group, tp, first, last) in &archived {
            tracing::warn!(
                group = %group, partition = %tp, first, last, records = last - first + 1,
                "records archived at the group's delivery limit"
            );
        }
        Ok(self.dead_letter_ranges(st, now_ms, archived)?.0)
    }

    /// Dead-letters `ranges` of groups with a target, in rounds until none is left.
    fn dead_letter_ranges(
        &self,
        st: &mut BrokerState,
        now_ms: u64,
        mut ranges: Vec<(String, TopicPartition, i64, i64)>,
    ) -> Result<(Option<Written>, u64)> {
        let (mut written, mut letters) = (None, 0);
        for _ in 0..ROUNDS {
            let targets = shareflow_share::sync::lock(&self.inner.dead_letter_targets).clone();
            ranges.retain(|(group, ..)| targets.contains_key(group));
            if ranges.is_empty() {
                break;
            }
            // A window of at most one entry's letters at a time: an archived run of
            // millions of records is never read into memory whole.
            let windows = std::mem::take(&mut ranges).into_iter().flat_map(|(group, source, first, last)| {
                (first..=last).step_by(LETTERS_PER_ENTRY).map(move |from| {
                    (group.clone(), source.clone(), from, last.min(from + LETTERS_PER_ENTRY as i64 - 1))
                })
            });
            for (group, source, first, last) in windows {
                let target = &targets[&group];
                for command in dead_letter_commands(st, &self.inner.journal, &group, &source, (first, last), target) {
                    let entry = Entry { now_ms, command };
                    let (result, _) = st.apply(&entry);
                    match result {
                        Ok(Outcome::Produced { base_offset }) => {
                            let w = self.inner.journal.append(&entry)?;
                            if let Command::DeadLetter { tp, first, last, .. } = &entry.command {
                                if self.inner.journal.stores_records() {
                                    st.store_batch(tp, base_offset, w.lsn);
                                }
                                letters += (last - first + 1) as u64;
                            }
                            written = Some(w);
                        }
                        Ok(_) => {}
                        // Retention took the range meanwhile, or it changed: nothing to do.
                        Err(e) => {
                            tracing::warn!(group = %group, partition = %source, error = %e, "dead letters skipped")
                        }
                    }
                }
            }
            // A step's expiry may have archived more.
            ranges = std::mem::take(&mut st.events.limit_archived);
        }
        if !ranges.is_empty() {
            // Left for the next command's round, or the next `dead_letter_archived`.
            st.events.limit_archived = ranges;
        }
        Ok((written, letters))
    }
}

/// The `DeadLetter` commands for `[first, last]` of `source` (at most
/// [`LETTERS_PER_ENTRY`] records): its records as dead letters, cut into entries of about
/// [`BYTES_PER_ENTRY`] bytes. A batch that cannot be read is logged and left archived.
fn dead_letter_commands(
    st: &BrokerState,
    journal: &crate::journal::Journal,
    group: &str,
    source: &TopicPartition,
    (first, last): (i64, i64),
    target: &DeadLetterTarget,
) -> Vec<Command> {
    let mut records = Vec::new();
    let range = AcquiredRange { first, last, deliveries: st.delivery_limit(group) };
    if let Err(u) = st.delivered_records(source, &range, &|tp, b| journal.load_batch(tp, b), &mut records) {
        tracing::warn!(group, partition = %source, first = u.first, last = u.last, error = %u.error,
            "records archived at the delivery limit cannot be read, so they are not dead-lettered");
        return Vec::new();
    }
    let partitions = st.partition_count(&target.topic).unwrap_or(1).max(1);
    let tp = TopicPartition::new(target.topic.as_str(), source.partition.rem_euclid(partitions as i32));
    let mut commands = Vec::new();
    let mut chunk: Vec<LogRecord> = Vec::new();
    let (mut chunk_first, mut bytes) = (first, 0usize);
    for (i, r) in records.iter().enumerate() {
        let letter = letter(r, group, target.copy_record);
        bytes += letter.value.as_ref().map_or(0, Bytes::len) + letter.key.as_ref().map_or(0, Bytes::len);
        chunk.push(letter);
        if bytes >= BYTES_PER_ENTRY || i + 1 == records.len() {
            let batch = batch::encode(&chunk);
            commands.push(Command::DeadLetter {
                group: group.to_string(),
                source: source.clone(),
                first: chunk_first,
                last: r.offset,
                tp: tp.clone(),
                batch,
            });
            (chunk, chunk_first, bytes) = (Vec::new(), r.offset + 1, 0);
        }
    }
    commands
}

/// The dead letter of `r`, archived at `group`'s delivery limit.
fn letter(r: &Record, group: &str, copy_record: bool) -> LogRecord {
    let text = |s: String| Bytes::from(s);
    let headers = vec![
        (HEADER_TOPIC.to_string(), text(r.topic.to_string())),
        (HEADER_PARTITION.to_string(), text(r.partition.to_string())),
        (HEADER_OFFSET.to_string(), text(r.offset.to_string())),
        (HEADER_GROUP.to_string(), text(group.to_string())),
        (HEADER_DELIVERY_COUNT.to_string(), text(r.delivery_count.to_string())),
        (
            HEADER_MESSAGE.to_string(),
            text(format!("archived at the group's delivery limit of {} deliveries", r.delivery_count)),
        ),
        (HEADER_CAUSE.to_string(), Bytes::from_static(CAUSE_DELIVERY_LIMIT.as_bytes())),
        (HEADER_TASK.to_string(), Bytes::from_static(b"broker")),
    ];
    let (key, value) = if copy_record { (r.key.clone(), r.value.clone()) } else { (None, None) };
    LogRecord { key, value, timestamp_ms: r.timestamp_ms, headers }
}
