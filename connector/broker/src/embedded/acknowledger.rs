//! [`TransactionalShareAcknowledger`]: KIP-1289's acknowledger for a framework that
//! reads a share group without a Kafka producer (its §2.2): each checkpoint's share
//! acknowledgements commit in a transaction of their own.

use super::*;

/// Commits share acknowledgements in transactions of their own, one per checkpoint id:
/// KIP-1289's `TransactionalShareAcknowledger`, on the embedded broker.
///
/// `init_transactions` takes the next producer epoch of the group and prefix, which
/// fences an older acknowledger of the same pair (its ONGOING transactions abort; a
/// PREPARE one is left to this one). Then each `commit_acknowledgements` runs begin,
/// stage, prepare and commit of transaction `{group}-{prefix}-{checkpoint_id}`.
///
/// How it differs from KIP-1289's `new TransactionalShareAcknowledger(props)` and
/// `commitAcknowledgements(bufferedAcks, shareGroupId)` (seed 002, §2.2):
/// - the group is fixed at [`new`](Self::new), with the prefix, not passed to each
///   commit: the producer epoch that fences belongs to the pair;
/// - [`commit_acknowledgements`](Self::commit_acknowledgements) takes a checkpoint id,
///   which names the transaction, so a retry after a crash finds the same transaction
///   and finishes it (idempotent by id); the seed's call has no id;
/// - it takes the `MemberId` of the consumer that holds the records: the broker stages
///   only records that member holds ACQUIRED, and only if it joined in transactional
///   mode. The seed's acknowledgements name no member;
/// - the acknowledgements are `ShareAcknowledgements` (offset ranges per partition,
///   each with its type);
/// - it is async and returns the committed `TransactionId` (the seed's example uses no
///   result), or an `Error` whose kind says what to do;
/// - it prepares between staging and commit, journaled, so a crash between them leaves
///   a PREPARE transaction that a retry with the same acknowledgements commits; the
///   seed's call runs begin, send and commit only;
/// - the timeout is the group's `share.transaction.timeout.ms` unless
///   [`timeout`](Self::timeout) sets another; there are no `props`.
///
/// This acknowledger exists on the embedded broker only: stock Kafka cannot put share
/// acknowledgements into a transaction (docs/design.md §2).
///
/// ```
/// # use std::time::Duration;
/// # use shareflow_broker::{BrokerOptions, EmbeddedBroker, TransactionalShareAcknowledger};
/// # use shareflow_share::*;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let broker = EmbeddedBroker::open(BrokerOptions::in_memory()).await?;
/// broker.create_topic("orders", 1).await?;
/// broker.produce(vec![ProducerRecord::new("orders", 0, "o-1")]).await?;
/// let config = ShareConfig::builder().acknowledgement_mode(AcknowledgementMode::Transactional).build()?;
/// let mut consumer = broker.consumer("flink-source", config).await?;
/// consumer.subscribe(&["orders"]).await?;
/// let records = consumer.poll(100, Duration::from_millis(100)).await?;
///
/// let mut acknowledger = TransactionalShareAcknowledger::new(&broker, "flink-source", "job-1");
/// acknowledger.init_transactions().await?;
/// // On checkpoint 1 complete:
/// let acks = ShareAcknowledgements::from_records(&records, AcknowledgeType::Accept)?;
/// let id = acknowledger.commit_acknowledgements(1, consumer.member_id(), &acks).await?;
/// assert_eq!(id.to_string(), "flink-source-job-1-1");
/// assert_eq!(broker.transaction_state(&id).await?, TransactionState::Committed);
/// # Ok::<(), shareflow_share::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct TransactionalShareAcknowledger {
    broker: EmbeddedBroker,
    group: String,
    prefix: String,
    timeout: Duration,
    coordinator: Option<EmbeddedTransactionCoordinator>,
}

impl TransactionalShareAcknowledger {
    /// An acknowledger of share group `group` whose transactions take ids
    /// `{group}-{prefix}-{checkpoint_id}`; call [`init_transactions`](Self::init_transactions)
    /// before the first commit. Transactions ask for the group's own timeout
    /// (`share.transaction.timeout.ms`) unless [`timeout`](Self::timeout) says otherwise.
    pub fn new(broker: &EmbeddedBroker, group: &str, prefix: &str) -> Self {
        Self {
            broker: broker.clone(),
            group: group.to_string(),
            prefix: prefix.to_string(),
            timeout: Duration::ZERO,
            coordinator: None,
        }
    }

    /// The timeout each transaction asks for; at most the group's
    /// `share.transaction.timeout.ms`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// KIP-1289's `initTransactions`: takes the next producer epoch of the group and
    /// prefix. An older acknowledger (or coordinator) of the same pair is fenced from
    /// then on. Calling it again takes another epoch.
    pub async fn init_transactions(&mut self) -> Result<ProducerEpoch> {
        let coordinator = self.broker.transaction_coordinator(&self.group, &self.prefix).await?;
        let epoch = coordinator.epoch();
        self.coordinator = Some(coordinator);
        Ok(epoch)
    }

    /// The producer epoch `init_transactions` took, if it ran.
    pub fn epoch(&self) -> Option<ProducerEpoch> {
        self.coordinator.as_ref().map(ShareTransactionCoordinator::epoch)
    }

    /// KIP-1289's `commitAcknowledgements`: begin, stage `acks` (held by `member`, a
    /// member in transactional mode), prepare and commit transaction
    /// `{group}-{prefix}-{checkpoint_id}`, and return its id.
    ///
    /// Idempotent by transaction id, as KIP-1289's table says: an id committed already
    /// returns at once; a PREPARE one that holds exactly `acks` is committed; an ONGOING
    /// one that holds exactly `acks` is prepared and committed without staging them
    /// again, and one that holds nothing gets them. An open id that holds other
    /// acknowledgements is an error, as is an aborted id: its acknowledgements did not
    /// commit, and ids are never reused.
    pub async fn commit_acknowledgements(
        &self,
        checkpoint_id: u64,
        member: &MemberId,
        acks: &ShareAcknowledgements,
    ) -> Result<TransactionId> {
        let Some(coordinator) = &self.coordinator else {
            return Err(Error::InvalidRequest(format!(
                "the transactional acknowledger of group {} prefix {} commits only after init_transactions",
                self.group, self.prefix
            )));
        };
        let id = TransactionId::new(&self.group, &self.prefix, checkpoint_id)?;
        let state = self.broker.transaction_state(&id).await?;
        let staged = match state {
            TransactionState::Committed => return Ok(id),
            TransactionState::Ongoing | TransactionState::Prepare => {
                // A retry of this call may finish what it started, never commit another
                // set of acknowledgements under the same id.
                let pending = coordinator.list_pending_transactions(&self.group).await?;
                let held = pending.into_iter().find(|p| p.id == id).map(|p| p.pending_acks).unwrap_or_default();
                let same = &held == acks;
                if !same && (state == TransactionState::Prepare || !held.is_empty()) {
                    return Err(Error::InvalidRequest(format!(
                        "transaction {id} is {state} already, holding {} acknowledged records, not the {} of this \
                         commit: checkpoint ids are never reused; commit these under a new checkpoint id",
                        held.record_count(),
                        acks.record_count()
                    )));
                }
                if state == TransactionState::Prepare {
                    coordinator.commit_transaction(&id).await?;
                    return Ok(id);
                }
                same && !held.is_empty()
            }
            _ => false,
        };
        let txn = coordinator.begin_transaction(&id, self.timeout).await?;
        if !staged {
            coordinator.send_share_acks_to_transaction(&txn, member, acks).await?;
        }
        coordinator.prepare_transaction(&id).await?;
        coordinator.commit_transaction(&id).await?;
        Ok(id)
    }
}
