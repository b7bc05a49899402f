//! The clients of an embedded broker: its share consumer and its transaction
//! coordinator (which is also its transactional producer).

use super::*;

/// A member of a share group on the embedded broker.
#[derive(Debug)]
pub struct EmbeddedShareConsumer {
    pub(super) broker: EmbeddedBroker,
    pub(super) group: String,
    pub(super) mode: AcknowledgementMode,
    pub(super) member: MemberKey,
    pub(super) member_id: MemberId,
    /// Explicit acknowledgements waiting for the next poll or commit.
    pub(super) pending: ShareAcknowledgements,
    /// Implicit mode: what the last poll returned, accepted by the next one.
    pub(super) implicit: Vec<Record>,
    pub(super) cursor: u32,
    pub(super) closed: bool,
}

impl EmbeddedShareConsumer {
    fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::Closed { what: format!("share consumer {} of group {}", self.member_id, self.group) });
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if self.mode == AcknowledgementMode::Implicit && !self.implicit.is_empty() {
            let acks = ShareAcknowledgements::from_records(&self.implicit, AcknowledgeType::Accept)?;
            self.implicit.clear();
            self.send(acks).await?;
        }
        if !self.pending.is_empty() {
            let acks = std::mem::take(&mut self.pending);
            self.send(acks).await?;
        }
        Ok(())
    }

    /// Settles offset ranges outside any transaction, as
    /// [`acknowledge`](ShareConsumer::acknowledge) settles one record: buffered, and sent
    /// with the next poll, commit or close. One call covers a whole checkpoint's records
    /// (the at-least-once source's path), instead of one call per record. All or
    /// nothing: a refused range leaves nothing buffered.
    pub async fn acknowledge_ranges(&mut self, acks: &ShareAcknowledgements) -> Result<()> {
        self.check_open()?;
        let mut pending = self.pending.clone();
        for (tp, ranges) in acks.partitions() {
            for b in ranges.batches() {
                match (self.mode, b.ack_type) {
                    (AcknowledgementMode::Implicit, _) => {
                        return Err(Error::InvalidRequest(format!(
                            "acknowledging {tp} offsets {}..={} is not allowed in implicit mode: the next poll accepts every record",
                            b.first_offset, b.last_offset
                        )))
                    }
                    (AcknowledgementMode::Transactional, AcknowledgeType::Accept) => {
                        return Err(Error::InvalidRequest(format!(
                            "ACCEPT of {tp} offsets {}..={} outside a transaction is refused in transactional mode; use acknowledge_transactional or acknowledge_batches_transactional",
                            b.first_offset, b.last_offset
                        )))
                    }
                    _ => pending.add(tp.clone(), b)?,
                }
            }
        }
        self.pending = pending;
        Ok(())
    }

    async fn send(&self, acks: ShareAcknowledgements) -> Result<()> {
        self.broker
            .execute(Command::Acknowledge { group: self.group.clone(), member: self.member, acks })
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl ShareConsumer for EmbeddedShareConsumer {
    fn member_id(&self) -> &MemberId {
        &self.member_id
    }

    async fn subscribe(&mut self, topics: &[&str]) -> Result<()> {
        self.check_open()?;
        let topics = topics.iter().map(|t| t.to_string()).collect();
        self.broker
            .execute(Command::Subscribe { group: self.group.clone(), member: self.member, topics })
            .await
            .map(|_| ())
    }

    async fn poll(&mut self, max_records: usize, timeout: Duration) -> Result<Vec<Record>> {
        self.check_open()?;
        self.flush().await?;
        if max_records == 0 {
            return Err(Error::InvalidRequest("poll needs max_records >= 1".into()));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.broker.inner.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let command = Command::Acquire {
                group: self.group.clone(),
                member: self.member,
                max_records: max_records as u64,
                start_partition: self.cursor,
            };
            self.cursor = self.cursor.wrapping_add(1);
            let ranges = match self.broker.execute(command).await? {
                Outcome::Acquired { ranges, .. } => ranges,
                other => return Err(Error::Internal(format!("acquire returned {other:?}"))),
            };
            if !ranges.is_empty() {
                let mut records = Vec::with_capacity(max_records.min(4096));
                let loaded = {
                    let st = self.broker.state()?;
                    let journal = &self.broker.inner.journal;
                    ranges.iter().try_for_each(|(tp, range)| {
                        st.delivered_records(tp, range, &|tp, b| journal.load_batch(tp, b), &mut records)
                            .map_err(|u| (tp.clone(), u))
                    })
                };
                if let Err((bad_tp, bad)) = loaded {
                    // A batch that cannot be read (damaged, or its segment gone): the
                    // poll fails, naming it. Every other record of the poll is taken
                    // back uncharged, so that readable records do not creep towards the
                    // delivery limit; the unreadable ones keep their delivery, so that
                    // the limit archives them in the end and the group moves on.
                    let mut back = Vec::with_capacity(ranges.len() + 1);
                    for (tp, r) in &ranges {
                        if *tp == bad_tp && r.first <= bad.last && bad.first <= r.last {
                            back.push((tp.clone(), r.first, bad.first - 1));
                            back.push((tp.clone(), bad.last + 1, r.last));
                        } else {
                            back.push((tp.clone(), r.first, r.last));
                        }
                    }
                    back.retain(|(_, first, last)| first <= last);
                    let undo = Command::Unacquire { group: self.group.clone(), member: self.member, ranges: back };
                    if let Err(undo) = self.broker.execute(undo).await {
                        tracing::warn!(group = %self.group, error = %undo, "could not take back a poll that failed to read");
                    }
                    return Err(bad.error);
                }
                if self.mode == AcknowledgementMode::Implicit {
                    self.implicit = records.clone();
                }
                return Ok(records);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Lock expiry makes records available without a wake-up, so look again
            // at least every 50 ms.
            let wait = (deadline - now).min(Duration::from_millis(50));
            let _ = tokio::time::timeout(wait, notified).await;
            self.check_open()?;
        }
    }

    async fn acknowledge(&mut self, record: &Record, ack_type: AcknowledgeType) -> Result<()> {
        self.acknowledge_ranges(&ShareAcknowledgements::from_records([record], ack_type)?).await
    }

    async fn acknowledge_batches_transactional(
        &mut self,
        acks: &ShareAcknowledgements,
        txn: &TransactionHandle,
    ) -> Result<()> {
        self.check_open()?;
        if self.mode != AcknowledgementMode::Transactional {
            return Err(Error::InvalidRequest(format!(
                "transactional acknowledgement into {} needs share.acknowledgement.mode=transactional, this consumer is {}",
                txn.id, self.mode
            )));
        }
        if txn.id.group_id() != self.group {
            return Err(Error::InvalidRequest(format!(
                "transaction {} belongs to another group than {}",
                txn.id, self.group
            )));
        }
        if acks.is_empty() {
            // Nothing to stage, but the same answer a non-empty set would get.
            return self.broker.read(|st| st.check_ack_target(&txn.id, txn.epoch)).await?;
        }
        self.broker
            .execute(Command::AckInTxn {
                id: txn.id.clone(),
                epoch: txn.epoch,
                member: self.member,
                acks: acks.clone(),
            })
            .await
            .map(|_| ())
    }

    async fn commit(&mut self) -> Result<()> {
        self.check_open()?;
        self.flush().await
    }

    async fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let flushed = self.flush().await;
        self.closed = true;
        let left = self.broker.execute(Command::Leave { group: self.group.clone(), member: self.member }).await;
        flushed.and(left.map(|_| ()))
    }
}

impl EmbeddedShareConsumer {
    /// Leaves the group in the background without flushing anything: what a consumer
    /// whose owner died does. Every record it holds ACQUIRED is released at once (a
    /// failed delivery, as when its lock expires) instead of after the lock duration.
    /// LOCKED records stay with their transaction. Needs a tokio runtime; without one
    /// (or once the broker is closed) the locks expire as they would anyway.
    pub fn abandon(mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let (broker, group, member) = (self.broker.clone(), self.group.clone(), self.member);
        handle.spawn(async move {
            if let Err(e) = broker.execute(Command::Leave { group, member }).await {
                tracing::debug!(error = %e, "an abandoned consumer could not leave; its locks expire instead");
            }
        });
    }
}

/// The KIP-1289 coordinator for one `(group, prefix)` at one epoch, also the producer
/// that binds output to its transactions.
#[derive(Debug, Clone)]
pub struct EmbeddedTransactionCoordinator {
    pub(super) broker: EmbeddedBroker,
    pub(super) group: String,
    pub(super) prefix: String,
    pub(super) epoch: ProducerEpoch,
}

impl EmbeddedTransactionCoordinator {
    fn check_id(&self, id: &TransactionId) -> Result<()> {
        if id.group_id() != self.group || id.prefix() != self.prefix {
            return Err(Error::InvalidRequest(format!(
                "transaction {id} does not belong to this coordinator (group {}, prefix {})",
                self.group, self.prefix
            )));
        }
        Ok(())
    }

    /// KIP-1289's one-phase `commitTransaction`: prepares `id`, then commits it.
    ///
    /// [`commit_transaction`](ShareTransactionCoordinator::commit_transaction) commits
    /// only from PREPARE (decision 0003): a caller that records its decision between the
    /// two phases (the runtime writes its checkpoint manifest there) keeps that order. A
    /// caller with nothing to record, such as KIP-1289's consume-transform-produce loop,
    /// commits in one call with this. Idempotent like both steps: a committed `id`
    /// returns Ok. A crash between the steps leaves `id` PREPARE; a restarted caller
    /// finds it with `list_pending_transactions` and commits it, as it had asked.
    pub async fn commit_one_phase(&self, id: &TransactionId) -> Result<()> {
        if self.broker.transaction_state(id).await? != TransactionState::Committed {
            self.prepare_transaction(id).await?;
        }
        self.commit_transaction(id).await
    }

    async fn step(&self, id: &TransactionId, command: Command) -> Result<bool> {
        self.check_id(id)?;
        match self.broker.execute(command).await? {
            Outcome::Txn { applied, .. } => Ok(applied),
            other => Err(Error::Internal(format!("transaction step returned {other:?}"))),
        }
    }
}

#[async_trait]
impl ShareTransactionCoordinator for EmbeddedTransactionCoordinator {
    fn epoch(&self) -> ProducerEpoch {
        self.epoch
    }

    async fn begin_transaction(&self, id: &TransactionId, timeout: Duration) -> Result<TransactionHandle> {
        let timeout_ms = timeout.as_millis().min(u128::from(u64::MAX)) as u64;
        self.step(id, Command::Begin { id: id.clone(), epoch: self.epoch, timeout_ms }).await?;
        Ok(TransactionHandle { id: id.clone(), epoch: self.epoch })
    }

    async fn prepare_transaction(&self, id: &TransactionId) -> Result<()> {
        let started = Instant::now();
        if self.step(id, Command::Prepare { id: id.clone(), epoch: self.epoch }).await? {
            self.broker.inner.metrics.prepare_time(started.elapsed());
        }
        Ok(())
    }

    async fn commit_transaction(&self, id: &TransactionId) -> Result<()> {
        let started = Instant::now();
        if self.step(id, Command::Commit { id: id.clone(), epoch: self.epoch }).await? {
            self.broker.inner.metrics.commit_time(started.elapsed());
        }
        Ok(())
    }

    async fn abort_transaction(&self, id: &TransactionId) -> Result<()> {
        self.step(id, Command::Abort { id: id.clone(), epoch: self.epoch }).await.map(|_| ())
    }

    /// KIP-1289 `listPendingTransactions`: the ONGOING and PREPARE transactions of this
    /// coordinator's group, every prefix. Another group is refused.
    async fn list_pending_transactions(&self, group: &str) -> Result<Vec<PendingTransaction>> {
        if group != self.group {
            return Err(Error::InvalidRequest(format!(
                "list of pending transactions of group {group} asked of the coordinator of group {}: \
                 use a coordinator of that group",
                self.group
            )));
        }
        self.broker.pending(group).await
    }
}

#[async_trait]
impl ShareTransactionalProducer for EmbeddedTransactionCoordinator {
    async fn send(&self, txn: &TransactionHandle, records: Vec<ProducerRecord>) -> Result<Vec<(TopicPartition, i64)>> {
        self.check_id(&txn.id)?;
        self.broker.produce_inner(records, Some(txn)).await
    }

    async fn send_share_acks_to_transaction(
        &self,
        txn: &TransactionHandle,
        member: &MemberId,
        acks: &ShareAcknowledgements,
    ) -> Result<()> {
        self.check_id(&txn.id)?;
        let member = self.broker.member_key(&self.group, member)?;
        if acks.is_empty() {
            // Nothing to stage, but the same answer a non-empty set would get.
            let staged = Command::AckInTxn { id: txn.id.clone(), epoch: txn.epoch, member, acks: acks.clone() };
            return self
                .broker
                .read(|st| st.admit(&staged).and_then(|()| st.check_ack_target(&txn.id, txn.epoch)))
                .await?;
        }
        self.broker
            .execute(Command::AckInTxn { id: txn.id.clone(), epoch: txn.epoch, member, acks: acks.clone() })
            .await
            .map(|_| ())
    }
}
