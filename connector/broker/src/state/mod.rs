//! The whole broker as one pure value: topics, share groups, transactions.
//!
//! [`BrokerState::apply`] takes a journal [`Entry`] (a command plus the time it ran
//! at) and either changes the state and returns an [`Outcome`], or returns an error and
//! changes nothing. Replaying the journal's entries in order rebuilds the state
//! exactly, which is how the broker recovers.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::batch::{self};
use super::log::{PartitionLog, Retention};
use super::share_partition::{Changes, Limits, MemberKey, RangeError, SharePartition, Slot};
use super::txn::{step, Step, Txn, TxnKey, TxnOp, TxnTable};
use shareflow_share::{Error, Result};
mod command;
mod queries;
mod transactions;

pub(crate) use command::{Command, Entry, Events, Outcome};
#[cfg(feature = "model")]
pub(crate) use queries::load_inline;

use shareflow_share::{
    AcknowledgeType, AcknowledgementMode, ArchiveReason, IsolationLevel, ProducerEpoch, RecordState,
    ShareAcknowledgements, ShareConfig, TopicPartition, TransactionId, TransactionState,
};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Member {
    topics: Vec<Arc<str>>,
    mode: AcknowledgementMode,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Group {
    config: ShareConfig,
    members: BTreeMap<MemberKey, Member>,
    partitions: BTreeMap<TopicPartition, SharePartition>,
    epochs: BTreeMap<String, ProducerEpoch>,
    /// The highest checkpoint id ever begun, per prefix.
    highest_checkpoint: BTreeMap<String, u64>,
    /// The highest checkpoint id removed after retention, per prefix: no id at or below
    /// it is begun again (checkpoint ids only grow, so nothing legitimate is refused).
    retired_checkpoint: BTreeMap<String, u64>,
}

impl Group {
    fn new(config: ShareConfig) -> Self {
        Self {
            config,
            members: BTreeMap::new(),
            partitions: BTreeMap::new(),
            epochs: BTreeMap::new(),
            highest_checkpoint: BTreeMap::new(),
            retired_checkpoint: BTreeMap::new(),
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            lock_duration_ms: self.config.record_lock_duration().as_millis() as u64,
            delivery_limit: self.config.delivery_count_limit(),
            max_record_locks: u64::from(self.config.partition_max_record_locks()),
            read_committed: self.config.isolation_level() == IsolationLevel::ReadCommitted,
        }
    }
}

/// The state of a record, as seen by inspection and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordStatus {
    /// The record state.
    pub state: RecordState,
    /// Deliveries so far (0 once ACKNOWLEDGED or ARCHIVED).
    pub delivery_count: u16,
    /// Why it was archived.
    pub archive_reason: Option<ArchiveReason>,
    /// The transaction it is LOCKED in.
    pub transaction: Option<TransactionId>,
}

/// Everything the broker knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BrokerState {
    topics: BTreeMap<Arc<str>, Vec<PartitionLog>>,
    groups: BTreeMap<String, Group>,
    txns: TxnTable,
    default_config: ShareConfig,
    next_member: MemberKey,
    pub(crate) last_now_ms: u64,
    #[serde(skip)]
    pub(crate) events: Events,
}

impl BrokerState {
    pub(crate) fn new(default_config: ShareConfig) -> Self {
        Self {
            topics: BTreeMap::new(),
            groups: BTreeMap::new(),
            txns: TxnTable::default(),
            default_config,
            next_member: 1,
            last_now_ms: 0,
            events: Events::default(),
        }
    }

    /// Runs a journal entry: the passage of time, then the command (for
    /// [`Command::Restarted`], the restart first: see [`restart`](Self::restart)).
    /// The command is all or nothing; the expiry stands even when the command fails.
    /// Returns the outcome and whether the expiry changed anything.
    pub(crate) fn apply(&mut self, entry: &Entry) -> (Result<Outcome>, bool) {
        let archived_before = self.events.records.archived_delivery_limit;
        let result = if matches!(entry.command, Command::Restarted { .. }) {
            let outcome = self.exec(&entry.command, entry.now_ms);
            (outcome, self.expire(entry.now_ms))
        } else {
            let expired = self.expire(entry.now_ms);
            (self.exec(&entry.command, entry.now_ms), expired)
        };
        if self.events.records.archived_delivery_limit != archived_before {
            self.collect_limit_archived();
        }
        result
    }

    /// Moves what the partitions archived at the delivery limit into the events.
    fn collect_limit_archived(&mut self) {
        for (name, g) in &mut self.groups {
            for (tp, sp) in &mut g.partitions {
                for (first, last) in sp.take_limit_archived() {
                    self.events.limit_archived.push((name.clone(), tp.clone(), first, last));
                }
            }
        }
    }

    /// `group`'s runs archived at the delivery limit and not dead-lettered yet.
    pub(crate) fn archived_at_limit(&self, group: &str) -> Vec<(TopicPartition, i64, i64)> {
        let Some(g) = self.groups.get(group) else { return Vec::new() };
        g.partitions.iter().flat_map(|(tp, sp)| sp.archived_at_limit().map(move |(f, l)| (tp.clone(), f, l))).collect()
    }

    /// KIP-1191's ARCHIVING -> ARCHIVED with its dead letters, all or nothing.
    fn dead_letter(
        &mut self,
        group: &str,
        source: &TopicPartition,
        range: (i64, i64),
        tp: &TopicPartition,
        batch: &Bytes,
    ) -> Result<Outcome> {
        let (first, last) = range;
        self.log(tp)?;
        let meta = batch::meta(batch).map_err(|e| Error::InvalidRequest(format!("dead letters to {tp}: {e}")))?;
        if i64::from(meta.count) != last - first + 1 {
            return Err(Error::InvalidRequest(format!(
                "dead letters of {source} offsets {first}..={last} to {tp}: the batch holds {} records, not {}",
                meta.count,
                last - first + 1
            )));
        }
        let sp = self.groups.get_mut(group).and_then(|g| g.partitions.get_mut(source)).ok_or_else(|| {
            Error::InvalidRequest(format!("dead letters of {source} in group {group}: the group never read it"))
        })?;
        let changes = sp.dead_letter(first, last).map_err(|e| {
            Error::InvalidRequest(format!("dead letters of {source} offsets {first}..={last} in group {group}: {e:?}"))
        })?;
        self.note(changes);
        self.produce(tp, batch.clone(), None)
    }

    /// The broker restarted (decision 0003, "Restart"): members are gone, and every
    /// ACQUIRED record becomes AVAILABLE. The delivery a restart cuts short counts, as a
    /// failed one does: a record that crashes the process that holds the broker must not
    /// be redelivered forever, so at the delivery limit it is ARCHIVED. Runs before the
    /// downtime's expiry, so how long the broker was down does not change the result.
    fn restart(&mut self) {
        let mut changes = Changes::default();
        for g in self.groups.values_mut() {
            g.members.clear();
            let limits = g.limits();
            for sp in g.partitions.values_mut() {
                changes.add(sp.release_all_after_restart(&limits));
            }
        }
        self.note(changes);
    }

    /// Processes the passage of time: lock expiry, transaction timeout, and removal of
    /// decided transactions past retention. Returns whether anything changed.
    pub(crate) fn expire(&mut self, now_ms: u64) -> bool {
        self.last_now_ms = self.last_now_ms.max(now_ms);
        let now_ms = self.last_now_ms;
        let mut changes = Changes::default();
        for group in self.groups.values_mut() {
            let limits = group.limits();
            for sp in group.partitions.values_mut() {
                changes.add(sp.expire_locks(now_ms, &limits));
            }
        }
        let timed_out = self.txns.timed_out(now_ms);
        for &key in &timed_out {
            self.finish(key, false, now_ms);
            self.events.txn_timed_out += 1;
        }
        let purged = self.txns.purge(now_ms);
        for id in &purged {
            let retired = self.group_mut(id.group_id()).retired_checkpoint.entry(id.prefix().to_string()).or_default();
            *retired = (*retired).max(id.checkpoint_id());
        }
        self.note(changes);
        changes.any() || !timed_out.is_empty() || !purged.is_empty()
    }

    fn note(&mut self, changes: Changes) {
        if changes.released > 0 || changes.archived_aborted_txn > 0 {
            self.events.wake = true;
        }
        self.events.records.add(changes);
    }

    pub(crate) fn exec(&mut self, command: &Command, now_ms: u64) -> Result<Outcome> {
        match command {
            Command::CreateTopic { name, partitions } => self.create_topic(name, *partitions),
            Command::Trim { tp, before } => self.trim(tp, *before),
            Command::Produce { tp, records, txn } => self.produce(tp, batch::encode(records), txn.as_ref()),
            Command::Append { tp, txn, batch } => self.produce(tp, batch.clone(), txn.as_ref()),
            Command::DeadLetter { group, source, first, last, tp, batch } => {
                self.dead_letter(group, source, (*first, *last), tp, batch)
            }
            Command::Rewrite { tp, base_offset, batch } => self.rewrite(tp, *base_offset, batch),
            Command::ConfigureGroup { group, config } => {
                config.validate()?;
                self.group_mut(group).config = config.clone();
                Ok(Outcome::Done)
            }
            Command::Join { group, topics, config } => self.join(group, topics, config),
            Command::Subscribe { group, member, topics } => {
                self.check_topics(topics)?;
                let g = Self::member(&mut self.groups, group, *member)?;
                if let Some(m) = g.members.get_mut(member) {
                    m.topics = topics.iter().map(|t| Arc::from(t.as_str())).collect();
                }
                Ok(Outcome::Done)
            }
            Command::Leave { group, member } => {
                let g = self.group_mut(group);
                g.members.remove(member);
                let limits = g.limits();
                let mut changes = Changes::default();
                for sp in g.partitions.values_mut() {
                    changes.add(sp.release_member(*member, &limits));
                }
                self.note(changes);
                Ok(Outcome::Done)
            }
            Command::Acquire { group, member, max_records, start_partition } => {
                self.acquire(group, *member, *max_records, *start_partition as usize, now_ms)
            }
            Command::Acknowledge { group, member, acks } => self.acknowledge(group, *member, acks, now_ms),
            Command::Unacquire { group, member, ranges } => {
                let g = Self::member(&mut self.groups, group, *member)?;
                let mut changes = Changes::default();
                for (tp, first, last) in ranges {
                    if let Some(sp) = g.partitions.get_mut(tp) {
                        changes.add(sp.unacquire(*member, *first, *last));
                    }
                }
                self.note(changes);
                Ok(Outcome::Done)
            }
            Command::InitProducer { group, prefix } => {
                let g = self.group_mut(group);
                let epoch = g.epochs.get(prefix).copied().unwrap_or(0) + 1;
                g.epochs.insert(prefix.clone(), epoch);
                let stale: Vec<TxnKey> = self
                    .txns
                    .pending()
                    .filter(|(_, t)| {
                        t.state == TransactionState::Ongoing && t.id.group_id() == group && t.id.prefix() == prefix
                    })
                    .map(|(k, _)| k)
                    .collect();
                for key in stale {
                    self.finish(key, false, now_ms);
                }
                Ok(Outcome::Epoch(epoch))
            }
            Command::Begin { id, epoch, timeout_ms } => self.begin(id, *epoch, *timeout_ms, now_ms),
            Command::AckInTxn { id, epoch, member, acks } => self.ack_in_txn(id, *epoch, *member, acks),
            Command::Prepare { id, epoch } => self.decide_txn(TxnOp::Prepare, id, *epoch, now_ms),
            Command::Commit { id, epoch } => self.decide_txn(TxnOp::Commit, id, *epoch, now_ms),
            Command::Abort { id, epoch } => self.decide_txn(TxnOp::Abort, id, *epoch, now_ms),
            // Time alone changes nothing beyond what `expire` already did.
            Command::Tick => Ok(Outcome::Unchanged),
            Command::Restarted { default_config } => {
                self.default_config = default_config.clone();
                self.restart();
                Ok(Outcome::Done)
            }
        }
    }

    fn group_mut(&mut self, group: &str) -> &mut Group {
        let config = &self.default_config;
        self.groups.entry(group.to_string()).or_insert_with(|| Group::new(config.clone()))
    }

    fn create_topic(&mut self, name: &str, partitions: u32) -> Result<Outcome> {
        if name.is_empty() || name.len() > 249 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(Error::InvalidRequest(format!(
                "topic name {name:?} must be 1..=249 characters of [A-Za-z0-9._-]"
            )));
        }
        if partitions == 0 || partitions > 10_000 {
            return Err(Error::InvalidRequest(format!("topic {name} needs 1..=10000 partitions, got {partitions}")));
        }
        match self.topics.get(name) {
            Some(existing) if existing.len() == partitions as usize => Ok(Outcome::Done),
            Some(existing) => Err(Error::InvalidRequest(format!(
                "topic {name} already exists with {} partitions, not {partitions}",
                existing.len()
            ))),
            None => {
                self.topics.insert(name.into(), vec![PartitionLog::default(); partitions as usize]);
                Ok(Outcome::Done)
            }
        }
    }

    pub(crate) fn partition_count(&self, topic: &str) -> Option<usize> {
        self.topics.get(topic).map(Vec::len)
    }

    pub(crate) fn log(&self, tp: &TopicPartition) -> Result<&PartitionLog> {
        self.topics
            .get(&tp.topic)
            .and_then(|p| p.get(usize::try_from(tp.partition).ok()?))
            .ok_or_else(|| Error::UnknownTopicPartition { topic: tp.topic.to_string(), partition: tp.partition })
    }

    fn log_mut(&mut self, tp: &TopicPartition) -> Result<&mut PartitionLog> {
        self.topics
            .get_mut(&tp.topic)
            .and_then(|p| p.get_mut(usize::try_from(tp.partition).ok()?))
            .ok_or_else(|| Error::UnknownTopicPartition { topic: tp.topic.to_string(), partition: tp.partition })
    }

    fn produce(
        &mut self,
        tp: &TopicPartition,
        data: Bytes,
        txn: Option<&(TransactionId, ProducerEpoch)>,
    ) -> Result<Outcome> {
        let meta = batch::meta(&data).map_err(|e| Error::InvalidRequest(format!("produce to {tp}: {e}")))?;
        if meta.count == 0 {
            return Err(Error::InvalidRequest(format!("produce to {tp} with no records")));
        }
        self.log(tp)?;
        let key = match txn {
            Some((id, epoch)) => Some(self.txn_for_write(TxnOp::Produce, id, *epoch)?),
            None => None,
        };
        let log = self.log_mut(tp)?;
        let base_offset = log.append(data, meta, key);
        if let Some(t) = key.and_then(|key| self.txns.get_mut(key)) {
            t.produced.push((tp.clone(), base_offset));
            t.produced_records += u64::from(meta.count);
        }
        self.events.wake = true;
        Ok(Outcome::Produced { base_offset })
    }

    /// Checks that `batch` is the one at `base_offset` (by its count): a rewrite moves
    /// where it lives, nothing else.
    fn rewrite(&mut self, tp: &TopicPartition, base_offset: i64, data: &Bytes) -> Result<Outcome> {
        let meta = batch::meta(data).map_err(|e| Error::InvalidRequest(format!("rewrite of {tp}: {e}")))?;
        match self.log(tp)?.batch_at(base_offset) {
            Some(b) if b.base_offset == base_offset && b.count == meta.count => Ok(Outcome::Produced { base_offset }),
            Some(b) if b.base_offset == base_offset => Err(Error::InvalidRequest(format!(
                "rewrite of {tp}: the batch at offset {base_offset} holds {} records, not {}",
                b.count, meta.count
            ))),
            // Retention deleted it meanwhile: nothing to move.
            _ => Ok(Outcome::Unchanged),
        }
    }

    /// The batches of every log whose buffer is in memory: (partition, base offset,
    /// buffer).
    pub(crate) fn inline_batches(&self) -> Vec<(TopicPartition, i64, Bytes)> {
        let mut out = Vec::new();
        for (tp, log) in self.logs() {
            for b in log.batches() {
                if let super::log::BatchData::Inline(data) = &b.data {
                    out.push((tp.clone(), b.base_offset, data.clone()));
                }
            }
        }
        out
    }

    /// Deletes the log of `tp` below `before` and moves its share partitions' start up.
    fn trim(&mut self, tp: &TopicPartition, before: i64) -> Result<Outcome> {
        let log = self.log_mut(tp)?;
        let gone = log.trim(before);
        let start = log.start();
        if gone == 0 {
            return Ok(Outcome::Unchanged);
        }
        for g in self.groups.values_mut() {
            if let Some(sp) = g.partitions.get_mut(tp) {
                sp.advance_start(start);
            }
        }
        self.events.retention_deleted += gone;
        Ok(Outcome::Done)
    }

    /// What retention deletes at `now_ms`: per partition, the offset below which its
    /// topic's retention (`per_topic`, else `default`) deletes. Never a batch of an
    /// open producer transaction, and never a record some share group has ACQUIRED or
    /// LOCKED: retention waits for those.
    pub(crate) fn retention_trims(
        &self,
        now_ms: u64,
        default: &Retention,
        per_topic: &BTreeMap<String, Retention>,
    ) -> Vec<(TopicPartition, i64)> {
        let mut out = Vec::new();
        for (topic, logs) in &self.topics {
            let retention = per_topic.get(&**topic).unwrap_or(default);
            if !retention.limits() {
                continue;
            }
            for (p, log) in logs.iter().enumerate() {
                let tp = TopicPartition { topic: topic.clone(), partition: p as i32 };
                let in_flight = self.groups.values().filter_map(|g| g.partitions.get(&tp)?.first_in_flight()).min();
                let keep_from = in_flight.unwrap_or(i64::MAX).min(log.last_stable_offset());
                if let Some(before) = log.retention_point(now_ms, retention, keep_from) {
                    out.push((tp, before));
                }
            }
        }
        out
    }

    fn check_topics(&self, topics: &[String]) -> Result<()> {
        for t in topics {
            if !self.topics.contains_key(t.as_str()) {
                return Err(Error::UnknownTopicPartition { topic: t.clone(), partition: -1 });
            }
        }
        Ok(())
    }

    fn join(&mut self, group: &str, topics: &[String], config: &ShareConfig) -> Result<Outcome> {
        self.check_topics(topics)?;
        config.validate()?;
        if let Some((key, mine, theirs)) = config.conflict_with(self.group_config(group)) {
            return Err(Error::InvalidConfig {
                key: key.to_string(),
                value: mine,
                rule: format!(
                    "share group {group} is configured with {key}={theirs}; a member must use the group's value \
                     (only share.acknowledgement.mode is a member's own)"
                ),
            });
        }
        let member = self.next_member;
        self.next_member += 1;
        let topics = topics.iter().map(|t| Arc::from(t.as_str())).collect();
        let mode = config.acknowledgement_mode();
        self.group_mut(group).members.insert(member, Member { topics, mode });
        Ok(Outcome::Joined { member })
    }

    fn member<'a>(groups: &'a mut BTreeMap<String, Group>, group: &str, member: MemberKey) -> Result<&'a mut Group> {
        match groups.get_mut(group) {
            Some(g) if g.members.contains_key(&member) => Ok(g),
            _ => Err(Error::InvalidRequest(format!(
                "member-{member} is not a member of group {group}; it left, was never joined, or the broker restarted: subscribe again"
            ))),
        }
    }

    fn acquire(
        &mut self,
        group: &str,
        member: MemberKey,
        max_records: u64,
        start: usize,
        now_ms: u64,
    ) -> Result<Outcome> {
        let g = Self::member(&mut self.groups, group, member)?;
        let limits = g.limits();
        let mut tps = Vec::new();
        let m = g.members.get(&member).ok_or_else(|| Error::Internal("member vanished".into()))?;
        for topic in &m.topics {
            let n = self.topics.get(topic).map_or(0, Vec::len);
            tps.extend((0..n as i32).map(|p| TopicPartition::new(topic.clone(), p)));
        }
        let mut out = Vec::new();
        let mut changes = Changes::default();
        let mut budget = max_records;
        for i in 0..tps.len() {
            if budget == 0 {
                break;
            }
            let tp = &tps[(start + i) % tps.len()];
            let Some(log) = self.topics.get(&tp.topic).and_then(|p| p.get(tp.partition as usize)) else { continue };
            // A new share partition starts at the log start: retention may have
            // deleted what came before.
            let sp = g.partitions.entry(tp.clone()).or_insert_with(|| SharePartition::new(log.start()));
            let (ranges, acquired) = sp.acquire(member, budget, now_ms, &limits, log);
            // A share partition exists once something was delivered from it: an empty
            // acquire must leave no trace, since it is not journaled.
            if ranges.is_empty() && !acquired.any() && sp.fetched_end() == log.start() && sp.run_count() == 0 {
                g.partitions.remove(tp);
            }
            changes.add(acquired);
            for r in ranges {
                budget -= (r.last - r.first + 1) as u64;
                out.push((tp.clone(), r));
            }
        }
        let archived = changes.archived_aborted_txn > 0 || changes.archived_delivery_limit > 0;
        self.note(changes);
        Ok(Outcome::Acquired { ranges: out, archived })
    }

    fn range_error(
        group: &str,
        member: MemberKey,
        tp: &TopicPartition,
        first: i64,
        last: i64,
        e: RangeError,
        txns: &TxnTable,
    ) -> Error {
        match e {
            RangeError::NeverDelivered { from } => Error::NeverDelivered {
                group: group.to_string(),
                topic: tp.topic.to_string(),
                partition: tp.partition,
                first,
                last,
                from,
            },
            RangeError::WrongState { offset, slot } => {
                let detail = match slot {
                    Slot::Acquired { member: owner, .. } => format!(" (held by member-{owner})"),
                    Slot::Locked { txn, .. } => match txns.get(txn) {
                        Some(t) => format!(" (in transaction {})", t.id),
                        None => " (in a transaction)".to_string(),
                    },
                    Slot::Available { deliveries: 0 } => " (never delivered)".to_string(),
                    Slot::Available { .. } => " (its acquisition lock expired or it was released)".to_string(),
                    Slot::Archived(reason) => format!(" ({reason})"),
                    Slot::Acknowledged => String::new(),
                };
                Error::NotAcquired {
                    group: group.to_string(),
                    member: format!("member-{member}"),
                    topic: tp.topic.to_string(),
                    partition: tp.partition,
                    first,
                    last,
                    offset,
                    state: slot.record_state(),
                    detail,
                }
            }
        }
    }

    /// Checks that `member` holds every offset in `acks`.
    fn check_acks(&self, group: &str, member: MemberKey, acks: &ShareAcknowledgements) -> Result<()> {
        let g = self.groups.get(group).ok_or_else(|| Error::InvalidRequest(format!("unknown share group {group}")))?;
        for (tp, ranges) in acks.partitions() {
            let sp = g.partitions.get(tp);
            for b in ranges.batches() {
                let result = match sp {
                    Some(sp) => sp.check_held(member, b.first_offset, b.last_offset),
                    None => Err(RangeError::NeverDelivered { from: b.first_offset }),
                };
                result
                    .map_err(|e| Self::range_error(group, member, tp, b.first_offset, b.last_offset, e, &self.txns))?;
            }
        }
        Ok(())
    }

    fn acknowledge(
        &mut self,
        group: &str,
        member: MemberKey,
        acks: &ShareAcknowledgements,
        now_ms: u64,
    ) -> Result<Outcome> {
        let g = Self::member(&mut self.groups, group, member)?;
        let member_mode = g.members.get(&member).map(|m| m.mode);
        let group_mode = g.config.acknowledgement_mode();
        let transactional = AcknowledgementMode::Transactional;
        if member_mode == Some(transactional) || group_mode == transactional {
            for (tp, ranges) in acks.partitions() {
                if let Some(b) = ranges.batches().find(|b| b.ack_type == AcknowledgeType::Accept) {
                    let whose = if member_mode == Some(transactional) { "member" } else { "group" };
                    return Err(Error::InvalidRequest(format!(
                        "ACCEPT of {tp} offsets {}..={} by member-{member} outside a transaction is refused: \
                         the {whose} uses share.acknowledgement.mode=transactional, so ACCEPT must join a \
                         transaction (ShareAcknowledgeTransactional)",
                        b.first_offset, b.last_offset
                    )));
                }
            }
        }
        self.check_acks(group, member, acks)?;
        let g = Self::member(&mut self.groups, group, member)?;
        let limits = g.limits();
        let mut changes = Changes::default();
        for (tp, ranges) in acks.partitions() {
            if let Some(sp) = g.partitions.get_mut(tp) {
                for b in ranges.batches() {
                    changes.add(sp.acknowledge(b.first_offset, b.last_offset, b.ack_type, now_ms, &limits));
                }
            }
        }
        self.note(changes);
        Ok(Outcome::Done)
    }
}
