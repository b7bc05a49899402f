//! The transaction side of the broker state: checking a new command against rules
//! added after journals held entries that break them, and each transaction step
//! (begin, stage acknowledgements, prepare, commit, abort), with its epoch checks.

use super::*;

impl BrokerState {
    /// Checks a new command against the rules that came after journals already held
    /// entries breaking them: the broker runs it before applying a command, replay does
    /// not, so that every journal written before still replays as it ran.
    ///
    /// - Staging acknowledgements into a transaction is opt-in: the member must have
    ///   joined with `share.acknowledgement.mode=transactional`. An explicit or
    ///   implicit member whose records were staged would find them gone from its own
    ///   settling (its next poll failed with NotAcquired).
    pub(crate) fn admit(&self, command: &Command) -> Result<()> {
        if let Command::AckInTxn { id, member, .. } = command {
            let group = id.group_id();
            let Some(g) = self.groups.get(group) else { return Ok(()) };
            let mode = g.members.get(member).map(|m| m.mode);
            if let Some(mode) = mode.filter(|m| *m != AcknowledgementMode::Transactional) {
                return Err(Error::InvalidRequest(format!(
                    "staging acknowledgements of member-{member} into transaction {id} is refused: the member uses \
                     share.acknowledgement.mode={mode}, and transactional acknowledgement is opt-in; join with \
                     share.acknowledgement.mode=transactional"
                )));
            }
        }
        Ok(())
    }

    pub(super) fn check_epoch(&self, id: &TransactionId, epoch: ProducerEpoch, what: TxnOp) -> Result<()> {
        let current = self.groups.get(id.group_id()).and_then(|g| g.epochs.get(id.prefix())).copied().unwrap_or(0);
        if epoch != current {
            return Err(Error::Fenced {
                group: id.group_id().to_string(),
                prefix: id.prefix().to_string(),
                epoch,
                current,
                what: format!("{} {id}", what.verb()),
            });
        }
        Ok(())
    }

    /// The transaction to add acknowledgements or output to: ONGOING, begun by `epoch`.
    pub(super) fn txn_for_write(&self, op: TxnOp, id: &TransactionId, epoch: ProducerEpoch) -> Result<TxnKey> {
        self.check_epoch(id, epoch, op)?;
        step(op, id, self.txns.state_of(id))?;
        let key = self.txns.key(id).ok_or_else(|| Error::UnknownTransaction { txn: id.to_string() })?;
        let txn_epoch = self.txns.get(key).map_or(epoch, |t| t.epoch);
        if txn_epoch != epoch {
            return Err(Error::Fenced {
                group: id.group_id().to_string(),
                prefix: id.prefix().to_string(),
                epoch,
                current: txn_epoch,
                what: format!("{} into {id}, begun by another epoch,", op.verb()),
            });
        }
        Ok(key)
    }

    /// Whether acknowledgements could be staged into `id` at `epoch` now: it exists, is
    /// ONGOING, and `epoch` is current. An empty set of acknowledgements changes nothing
    /// and is not journaled, but answers as a non-empty one would.
    pub(crate) fn check_ack_target(&self, id: &TransactionId, epoch: ProducerEpoch) -> Result<()> {
        self.txn_for_write(TxnOp::Acknowledge, id, epoch).map(|_| ())
    }

    pub(super) fn begin(
        &mut self,
        id: &TransactionId,
        epoch: ProducerEpoch,
        timeout_ms: u64,
        now_ms: u64,
    ) -> Result<Outcome> {
        self.check_epoch(id, epoch, TxnOp::Begin)?;
        // Validated on every begin, a repeated one included.
        let config = self.group_config(id.group_id());
        let max_timeout_ms = config.transaction_timeout().as_millis() as u64;
        // 0 asks for the group's own timeout, which is also the maximum.
        let timeout_ms = if timeout_ms == 0 { max_timeout_ms } else { timeout_ms };
        if timeout_ms > max_timeout_ms {
            return Err(Error::InvalidRequest(format!(
                "transaction {id} asks for a timeout of {timeout_ms} ms; share group {} allows 1..={max_timeout_ms} ms \
                 ({} is the maximum duration before auto-abort): ask for less, or raise the group's setting",
                id.group_id(),
                shareflow_share::keys::TXN_TIMEOUT_MS
            )));
        }
        if step(TxnOp::Begin, id, self.txns.state_of(id))? == Step::NoOp {
            // A repeated begin returns the open transaction; one that asks for another
            // timeout would silently get the old one.
            let open = self.txns.key(id).and_then(|k| self.txns.get(k)).map(|t| t.timeout_ms);
            if let Some(open) = open.filter(|&open| open != timeout_ms) {
                return Err(Error::InvalidRequest(format!(
                    "transaction {id} is open already, with a timeout of {open} ms; a repeated begin returns it and \
                     must ask for the same timeout, not {timeout_ms} ms: begin it with {open} ms (or 0 when that is \
                     the group's {}), or begin a new checkpoint id",
                    shareflow_share::keys::TXN_TIMEOUT_MS
                )));
            }
            return Ok(Outcome::Txn { applied: false, epoch });
        }
        let retired = self.groups.get(id.group_id()).and_then(|g| g.retired_checkpoint.get(id.prefix())).copied();
        if let Some(retired) = retired.filter(|&r| id.checkpoint_id() <= r) {
            return Err(Error::InvalidRequest(format!(
                "transaction {id} cannot begin: checkpoint ids of group {} prefix {} are never reused, and ids up \
                 to {retired} were decided and removed after {}; begin a checkpoint id above {retired}",
                id.group_id(),
                id.prefix(),
                shareflow_share::keys::TXN_RETENTION_MS,
            )));
        }
        let max = config.max_pending_transactions();
        let pending: Vec<String> = self
            .txns
            .pending()
            .filter(|(_, t)| t.id.group_id() == id.group_id())
            .map(|(_, t)| t.id.to_string())
            .collect();
        if pending.len() >= max as usize {
            return Err(Error::TooManyPendingTransactions {
                txn: id.to_string(),
                group: id.group_id().to_string(),
                pending: pending.len(),
                max,
                ids: pending.join(", "),
            });
        }
        let highest = self.group_mut(id.group_id()).highest_checkpoint.entry(id.prefix().to_string()).or_default();
        *highest = (*highest).max(id.checkpoint_id());
        self.txns.insert(Txn {
            id: id.clone(),
            state: TransactionState::Ongoing,
            epoch,
            timeout_ms,
            create_time_ms: now_ms,
            prepare_time_ms: None,
            end_time_ms: None,
            acks: ShareAcknowledgements::new(),
            produced: Vec::new(),
            produced_records: 0,
        });
        Ok(Outcome::Txn { applied: true, epoch })
    }

    pub(super) fn ack_in_txn(
        &mut self,
        id: &TransactionId,
        epoch: ProducerEpoch,
        member: MemberKey,
        acks: &ShareAcknowledgements,
    ) -> Result<Outcome> {
        let key = self.txn_for_write(TxnOp::Acknowledge, id, epoch)?;
        let group = id.group_id();
        for (tp, ranges) in acks.partitions() {
            for b in ranges.batches() {
                if !matches!(b.ack_type, AcknowledgeType::Accept | AcknowledgeType::Reject) {
                    return Err(Error::InvalidRequest(format!(
                        "{} of {tp} offsets {}..={} cannot join transaction {id}: only ACCEPT and REJECT can be staged",
                        b.ack_type, b.first_offset, b.last_offset
                    )));
                }
            }
        }
        Self::member(&mut self.groups, group, member)?;
        self.check_acks(group, member, acks)?;
        let g = Self::member(&mut self.groups, group, member)?;
        let txn = self.txns.get_mut(key).ok_or_else(|| Error::UnknownTransaction { txn: id.to_string() })?;
        for (tp, ranges) in acks.partitions() {
            if let Some(sp) = g.partitions.get_mut(tp) {
                for b in ranges.batches() {
                    sp.lock(b.first_offset, b.last_offset, key, b.ack_type == AcknowledgeType::Accept);
                    let added = txn.acks.add(tp.clone(), b);
                    debug_assert!(added.is_ok(), "records held by a member cannot already be in {id}");
                }
            }
        }
        Ok(Outcome::Txn { applied: true, epoch })
    }

    pub(super) fn decide_txn(
        &mut self,
        op: TxnOp,
        id: &TransactionId,
        epoch: ProducerEpoch,
        now_ms: u64,
    ) -> Result<Outcome> {
        self.check_epoch(id, epoch, op)?;
        if step(op, id, self.txns.state_of(id))? == Step::NoOp {
            return Ok(Outcome::Txn { applied: false, epoch });
        }
        let key = self.txns.key(id).ok_or_else(|| Error::UnknownTransaction { txn: id.to_string() })?;
        match op {
            TxnOp::Prepare => {
                if let Some(t) = self.txns.get_mut(key) {
                    t.state = TransactionState::Prepare;
                    t.prepare_time_ms = Some(now_ms);
                }
            }
            TxnOp::Commit => self.finish(key, true, now_ms),
            TxnOp::Abort => self.finish(key, false, now_ms),
            TxnOp::Begin | TxnOp::Acknowledge | TxnOp::Produce => {
                return Err(Error::Internal(format!("{} is not a decision", op.verb())))
            }
        }
        Ok(Outcome::Txn { applied: true, epoch })
    }

    /// Commits or aborts: acknowledgements apply and output turns visible (or both are
    /// undone) in this one step.
    pub(super) fn finish(&mut self, key: TxnKey, commit: bool, now_ms: u64) {
        let Some(txn) = self.txns.get_mut(key) else { return };
        txn.state = if commit { TransactionState::Committed } else { TransactionState::Aborted };
        let acks = std::mem::take(&mut txn.acks);
        let produced = std::mem::take(&mut txn.produced);
        let group = txn.id.group_id().to_string();
        let retention = self.group_config(&group).transaction_retention();
        self.txns.decided(key, now_ms, now_ms.saturating_add(retention.as_millis() as u64));
        let mut changes = Changes::default();
        if let Some(g) = self.groups.get_mut(&group) {
            let limits = g.limits();
            for (tp, ranges) in acks.partitions() {
                let Some(sp) = g.partitions.get_mut(tp) else { continue };
                for b in ranges.batches() {
                    changes.add(if commit {
                        sp.commit_locked(b.first_offset, b.last_offset, key)
                    } else {
                        sp.abort_locked(b.first_offset, b.last_offset, key, &limits)
                    });
                }
            }
        }
        for (tp, base) in produced {
            if let Ok(log) = self.log_mut(&tp) {
                log.close_txn_batch(base, !commit);
            }
        }
        if commit {
            self.events.txn_committed += 1;
        } else {
            self.events.txn_aborted += 1;
        }
        self.events.wake = true;
        self.note(changes);
    }
}
