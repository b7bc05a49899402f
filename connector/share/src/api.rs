//! The KIP-1289 contract as async traits: consumer, transaction coordinator, and the
//! producer that binds output and acknowledgements to one transaction.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{
    AcknowledgeType, ProducerRecord, Record, ShareAcknowledgements, TopicPartition, TransactionId, TransactionState,
};
use crate::error::Result;

/// A share-group member, unique within its broker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MemberId(pub String);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fencing epoch of a `(group, prefix)` pair. Each new coordinator for the pair
/// bumps it; anything holding an older epoch can commit nothing.
pub type ProducerEpoch = u32;

/// Proof that a transaction was begun under an epoch. Acknowledgements and output join
/// a transaction through a handle, so a fenced instance cannot add to a newer
/// instance's transaction of the same id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransactionHandle {
    /// The transaction.
    pub id: TransactionId,
    /// The epoch that began it.
    pub epoch: ProducerEpoch,
}

/// KIP-1289 `PendingTransaction` (KIP-1289, "State Storage": `ShareTransactionState`):
/// a transaction that is not decided yet, as listed for recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTransaction {
    /// The transaction.
    pub id: TransactionId,
    /// ONGOING or PREPARE.
    pub state: TransactionState,
    /// The epoch that began it.
    pub epoch: ProducerEpoch,
    /// When it began, broker clock, milliseconds.
    pub create_time_ms: u64,
    /// When it was prepared, if it was.
    pub prepare_time_ms: Option<u64>,
    /// Acknowledgements staged in it.
    pub pending_acks: ShareAcknowledgements,
    /// Records produced into it.
    pub produced_records: u64,
}

/// A share-group consumer (KIP-932) with transactional acknowledgement (KIP-1289).
///
/// In `explicit` mode, [`acknowledge`](Self::acknowledge) is buffered and sent with the
/// next poll, [`commit`](Self::commit) or [`close`](Self::close), as Kafka does. In
/// `implicit` mode the next poll accepts the previous batch. In `transactional` mode,
/// records are settled with [`acknowledge_transactional`](Self::acknowledge_transactional);
/// only RELEASE, REJECT and RENEW may go outside a transaction.
#[async_trait]
pub trait ShareConsumer: Send {
    /// This member's id.
    fn member_id(&self) -> &MemberId;

    /// Joins the group for these topics, replacing any earlier subscription.
    async fn subscribe(&mut self, topics: &[&str]) -> Result<()>;

    /// Acquires up to `max_records` records, waiting up to `timeout` for some to arrive.
    async fn poll(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<Record>>;

    /// Settles one record outside any transaction (sent on the next poll or commit).
    async fn acknowledge(&mut self, record: &Record, ack_type: AcknowledgeType) -> Result<()>;

    /// KIP-1289's `acknowledge(record, type, transactionId)` (seed 000, "New Consumer API
    /// Methods"; its request ShareAcknowledgeTransactional) for one record: ACQUIRED ->
    /// LOCKED in `txn`. Returns once the broker holds it durably.
    async fn acknowledge_transactional(
        &mut self,
        record: &Record,
        ack_type: AcknowledgeType,
        txn: &TransactionHandle,
    ) -> Result<()> {
        let acks = ShareAcknowledgements::from_records([record], ack_type)?;
        self.acknowledge_batches_transactional(&acks, txn).await
    }

    /// KIP-1289 ShareAcknowledgeTransactional with its `AcknowledgementBatches`: stages
    /// offset ranges into transaction `txn` at once; all or nothing.
    async fn acknowledge_batches_transactional(
        &mut self,
        acks: &ShareAcknowledgements,
        txn: &TransactionHandle,
    ) -> Result<()>;

    /// Sends buffered acknowledgements now.
    async fn commit(&mut self) -> Result<()>;

    /// Sends buffered acknowledgements, releases what is still acquired, leaves the group.
    async fn close(&mut self) -> Result<()>;
}

/// KIP-1289's `ShareTransactionCoordinator` (KIP-1289, "New Coordinator API"), bound to
/// one `(group, prefix)` and epoch.
///
/// Every call is idempotent by transaction id: `begin` returns the existing
/// transaction, `prepare` of a prepared one, `commit` of a committed one and `abort` of
/// an aborted or committed one are no-ops. Every other transition is
/// [`Error::IllegalTransition`](crate::Error::IllegalTransition).
#[async_trait]
pub trait ShareTransactionCoordinator: Send + Sync {
    /// The epoch this coordinator holds.
    fn epoch(&self) -> ProducerEpoch;

    /// KIP-1289 ShareBeginTransaction: EMPTY -> ONGOING. The transaction aborts by itself
    /// if still ONGOING after `timeout`, which may not exceed the group's
    /// `share.transaction.timeout.ms`; `Duration::ZERO` asks for exactly that.
    async fn begin_transaction(&self, id: &TransactionId, timeout: Duration) -> Result<TransactionHandle>;

    /// KIP-1289 SharePrepareTransaction (phase 1): ONGOING -> PREPARE, durably. After
    /// this only the coordinator decides; the broker never aborts it by timeout.
    async fn prepare_transaction(&self, id: &TransactionId) -> Result<()>;

    /// KIP-1289 ShareCommitTransaction (phase 2): PREPARE -> COMMITTED. Staged
    /// acknowledgements apply (LOCKED -> ACKNOWLEDGED, or ARCHIVED for REJECT) and staged
    /// output becomes visible in one atomic step.
    async fn commit_transaction(&self, id: &TransactionId) -> Result<()>;

    /// KIP-1289 ShareAbortTransaction: ONGOING or PREPARE -> ABORTED. LOCKED records
    /// become AVAILABLE (or ARCHIVED at the delivery limit), output is discarded.
    async fn abort_transaction(&self, id: &TransactionId) -> Result<()>;

    /// KIP-1289 `listPendingTransactions(groupId)`: the ONGOING and PREPARE transactions
    /// of `group` (every prefix), for the recovery protocol.
    async fn list_pending_transactions(&self, group: &str) -> Result<Vec<PendingTransaction>>;
}

/// KIP-1289's `sendShareAcksToTransaction`: produce output and stage share
/// acknowledgements under one transaction, so both commit or abort together.
#[async_trait]
pub trait ShareTransactionalProducer: Send + Sync {
    /// Produces records into `txn`; read_committed readers see them only after commit.
    /// Returns each record's partition and offset.
    async fn send(&self, txn: &TransactionHandle, records: Vec<ProducerRecord>) -> Result<Vec<(TopicPartition, i64)>>;

    /// Stages `acks`, made by `member` of the transaction's group, into `txn`.
    async fn send_share_acks_to_transaction(
        &self,
        txn: &TransactionHandle,
        member: &MemberId,
        acks: &ShareAcknowledgements,
    ) -> Result<()>;
}
