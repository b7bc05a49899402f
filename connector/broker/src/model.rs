//! Feature `model`: a thin handle on the embedded broker's pure state machine
//! ([`BrokerState::apply`]), for the model checker in `model/` (issue 13). Not for jobs.
//!
//! Every call builds the same journal [`Entry`] the broker shell builds and runs it
//! through the real `apply`; nothing here decides anything. The handle is
//! `Clone + Hash + Eq` by the state's canonical postcard encoding (the journal
//! snapshot format), so the `events` metric counters, which the shell drains after
//! every call, take no part in a state's identity.

use std::hash::{Hash, Hasher};

use bytes::Bytes;

use crate::log::LogRecord;
use crate::state::{BrokerState, Command, Entry, Events, Outcome};
use crate::RecordStatus;
use shareflow_share::{
    AcknowledgeType, AcknowledgementBatch, IsolationLevel, ProducerEpoch, ShareAcknowledgements, ShareConfig,
    TopicPartition, TransactionId, TransactionState,
};
use shareflow_share::{Error, Result};

/// The broker's whole state, driven only through [`BrokerState::apply`].
#[derive(Clone)]
pub struct ModelBroker {
    state: BrokerState,
}

/// A pending (ONGOING or PREPARE) transaction as the broker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingView {
    /// Its id.
    pub id: TransactionId,
    /// ONGOING or PREPARE.
    pub state: TransactionState,
    /// The producer epoch that began it.
    pub epoch: ProducerEpoch,
}

impl ModelBroker {
    /// An empty broker whose groups default to `config`.
    pub fn new(config: ShareConfig) -> Self {
        Self { state: BrokerState::new(config) }
    }

    fn run(&mut self, now_ms: u64, command: Command) -> Result<Outcome> {
        // What the real broker refuses before it journals a command, the model refuses too.
        self.state.admit(&command)?;
        let (outcome, _expired) = self.state.apply(&Entry { now_ms, command });
        self.state.events = Events::default();
        outcome
    }

    fn applied(outcome: Outcome) -> Result<bool> {
        match outcome {
            Outcome::Txn { applied, .. } => Ok(applied),
            other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// `CreateTopic`.
    pub fn create_topic(&mut self, now_ms: u64, name: &str, partitions: u32) -> Result<()> {
        self.run(now_ms, Command::CreateTopic { name: name.into(), partitions }).map(|_| ())
    }

    /// `Produce` of one record per value, inside `txn` if given; returns the base offset.
    pub fn produce(
        &mut self,
        now_ms: u64,
        tp: &TopicPartition,
        values: &[Vec<u8>],
        txn: Option<(&TransactionId, ProducerEpoch)>,
    ) -> Result<i64> {
        let records = values
            .iter()
            .map(|v| LogRecord {
                key: None,
                value: Some(Bytes::copy_from_slice(v)),
                timestamp_ms: 0,
                headers: Vec::new(),
            })
            .collect();
        let txn = txn.map(|(id, e)| (id.clone(), e));
        match self.run(now_ms, Command::Produce { tp: tp.clone(), records, txn })? {
            Outcome::Produced { base_offset } => Ok(base_offset),
            other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// `Join`: a new member with its own configuration; returns its key.
    pub fn join(&mut self, now_ms: u64, group: &str, topics: &[&str], config: &ShareConfig) -> Result<u64> {
        let topics = topics.iter().map(|t| t.to_string()).collect();
        match self.run(now_ms, Command::Join { group: group.into(), topics, config: config.clone() })? {
            Outcome::Joined { member } => Ok(member),
            other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// `Acquire`: the offsets handed out, with their delivery counts.
    pub fn acquire(
        &mut self,
        now_ms: u64,
        group: &str,
        member: u64,
        max_records: u64,
    ) -> Result<Vec<(TopicPartition, i64, u16)>> {
        let command = Command::Acquire { group: group.into(), member, max_records, start_partition: 0 };
        match self.run(now_ms, command)? {
            Outcome::Acquired { ranges, .. } => Ok(ranges
                .into_iter()
                .flat_map(|(tp, r)| (r.first..=r.last).map(move |o| (tp.clone(), o, r.deliveries)))
                .collect()),
            Outcome::Unchanged => Ok(Vec::new()),
            other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    fn acks(tp: &TopicPartition, offset: i64, ack: AcknowledgeType) -> Result<ShareAcknowledgements> {
        let mut acks = ShareAcknowledgements::new();
        acks.add(tp.clone(), AcknowledgementBatch::new(offset, offset, ack))?;
        Ok(acks)
    }

    /// `Acknowledge` of one offset outside any transaction.
    pub fn acknowledge(
        &mut self,
        now_ms: u64,
        group: &str,
        member: u64,
        tp: &TopicPartition,
        offset: i64,
        ack: AcknowledgeType,
    ) -> Result<()> {
        let acks = Self::acks(tp, offset, ack)?;
        self.run(now_ms, Command::Acknowledge { group: group.into(), member, acks }).map(|_| ())
    }

    /// `AckInTxn` of one offset: stages it into `id`.
    #[allow(clippy::too_many_arguments)]
    pub fn ack_in_txn(
        &mut self,
        now_ms: u64,
        id: &TransactionId,
        epoch: ProducerEpoch,
        member: u64,
        tp: &TopicPartition,
        offset: i64,
        ack: AcknowledgeType,
    ) -> Result<()> {
        let acks = Self::acks(tp, offset, ack)?;
        self.run(now_ms, Command::AckInTxn { id: id.clone(), epoch, member, acks }).map(|_| ())
    }

    /// `InitProducer`: bumps the prefix's epoch (fencing older ones) and aborts its
    /// ONGOING transactions; returns the new epoch.
    pub fn init_producer(&mut self, now_ms: u64, group: &str, prefix: &str) -> Result<ProducerEpoch> {
        match self.run(now_ms, Command::InitProducer { group: group.into(), prefix: prefix.into() })? {
            Outcome::Epoch(e) => Ok(e),
            other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// `Begin`; returns whether it changed anything.
    pub fn begin(&mut self, now_ms: u64, id: &TransactionId, epoch: ProducerEpoch, timeout_ms: u64) -> Result<bool> {
        self.run(now_ms, Command::Begin { id: id.clone(), epoch, timeout_ms }).and_then(Self::applied)
    }

    /// `Prepare`; returns whether it changed anything.
    pub fn prepare(&mut self, now_ms: u64, id: &TransactionId, epoch: ProducerEpoch) -> Result<bool> {
        self.run(now_ms, Command::Prepare { id: id.clone(), epoch }).and_then(Self::applied)
    }

    /// `Commit`; returns whether it changed anything.
    pub fn commit(&mut self, now_ms: u64, id: &TransactionId, epoch: ProducerEpoch) -> Result<bool> {
        self.run(now_ms, Command::Commit { id: id.clone(), epoch }).and_then(Self::applied)
    }

    /// `Abort`; returns whether it changed anything.
    pub fn abort(&mut self, now_ms: u64, id: &TransactionId, epoch: ProducerEpoch) -> Result<bool> {
        self.run(now_ms, Command::Abort { id: id.clone(), epoch }).and_then(Self::applied)
    }

    /// `Tick`: only time passes (lock expiry, transaction timeout, retention). Returns
    /// whether a lock or a transaction expired.
    pub fn tick(&mut self, now_ms: u64) -> bool {
        let (_, expired) = self.state.apply(&Entry { now_ms, command: Command::Tick });
        self.state.events = Events::default();
        expired
    }

    // ---- reads ----

    /// The broker's time: the latest it has seen.
    pub fn now_ms(&self) -> u64 {
        self.state.last_now_ms
    }

    /// ONGOING and PREPARE transactions of `group` and `prefix`, by checkpoint id.
    pub fn pending(&self, group: &str, prefix: &str) -> Vec<PendingView> {
        let mut out: Vec<PendingView> = self
            .state
            .pending_txns()
            .filter(|t| t.id.group_id() == group && t.id.prefix() == prefix)
            .map(|t| PendingView { id: t.id.clone(), state: t.state, epoch: t.epoch })
            .collect();
        out.sort_by_key(|p| p.id.checkpoint_id());
        out
    }

    /// Every pending transaction of every group.
    pub fn all_pending(&self) -> Vec<PendingView> {
        self.state.pending_txns().map(|t| PendingView { id: t.id.clone(), state: t.state, epoch: t.epoch }).collect()
    }

    /// The state of a transaction (EMPTY if unknown).
    pub fn txn_state(&self, id: &TransactionId) -> TransactionState {
        self.state.txn(id).map_or(TransactionState::Empty, |t| t.state)
    }

    /// The highest checkpoint id ever begun by `(group, prefix)`.
    pub fn highest_checkpoint(&self, group: &str, prefix: &str) -> Option<u64> {
        self.state.highest_checkpoint(group, prefix)
    }

    /// One record's state for `group`.
    pub fn record_status(&self, group: &str, tp: &TopicPartition, offset: i64) -> Option<RecordStatus> {
        self.state.record_status(group, tp, offset)
    }

    /// Values visible to a `read_committed` reader, from offset 0.
    pub fn read_committed(&self, tp: &TopicPartition) -> Vec<Vec<u8>> {
        self.state
            .read(tp, 0, usize::MAX, IsolationLevel::ReadCommitted, &crate::state::load_inline)
            .map(|(records, _)| {
                records.into_iter().map(|(_, r)| r.value.as_ref().map(|v| v.to_vec()).unwrap_or_default()).collect()
            })
            .unwrap_or_default()
    }

    /// Values of every batch whose transaction committed (or that was produced outside
    /// a transaction), whatever the last stable offset: committed output that a
    /// read_committed reader may not see yet behind another open transaction.
    pub fn committed_values(&self, tp: &TopicPartition) -> Vec<Vec<u8>> {
        let Ok(log) = self.state.log(tp) else { return Vec::new() };
        log.batches_from(0)
            .filter(|b| b.txn.is_none() && !b.aborted)
            .filter_map(|b| crate::state::load_inline(tp, b).ok())
            .flat_map(|data| {
                crate::batch::records(&data)
                    .map(|r| r.ok().and_then(|r| r.value).map(|v| v.to_vec()).unwrap_or_default())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The canonical encoding the handle is hashed and compared by.
    pub fn encoding(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.state).unwrap_or_default()
    }
}

impl std::fmt::Debug for ModelBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The full state is long; a trace shows the model's own summary instead.
        write!(f, "ModelBroker(now={}ms, pending={:?})", self.state.last_now_ms, self.all_pending())
    }
}

impl PartialEq for ModelBroker {
    fn eq(&self, other: &Self) -> bool {
        self.encoding() == other.encoding()
    }
}

impl Eq for ModelBroker {}

impl Hash for ModelBroker {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.encoding().hash(h);
    }
}
