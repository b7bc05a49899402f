//! [`BrokerTransactions`]: the embedded broker as a transactional participant of a job.
//!
//! One instance per job serves the share source (acknowledgements) and the topic sink
//! (output): both join T(n) on the same broker, so one commit makes both visible.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{
    CheckpointId, JobSettings, PendingTransaction, PrepareOutcome, Result, RuntimeError, TransactionParticipant,
    TransactionTemplate,
};

use crate::common::runtime_error;
use shareflow_broker::{EmbeddedBroker, EmbeddedTransactionCoordinator};
use shareflow_share::sync::lock;
use shareflow_share::Error;
use shareflow_share::{ShareTransactionCoordinator, TransactionHandle, TransactionState};

/// The embedded broker's KIP-1289 coordinator, bound to the job's group and prefix.
#[derive(Debug)]
pub struct BrokerTransactions {
    broker: EmbeddedBroker,
    timeout: Duration,
    coordinator: Mutex<Option<EmbeddedTransactionCoordinator>>,
}

impl BrokerTransactions {
    /// A participant on `broker`; transactions abort by themselves after `timeout` if
    /// still ONGOING.
    pub fn new(broker: EmbeddedBroker, timeout: Duration) -> Arc<Self> {
        Arc::new(Self { broker, timeout, coordinator: Mutex::new(None) })
    }

    /// The coordinator of the current attempt.
    pub fn coordinator(&self) -> Result<EmbeddedTransactionCoordinator> {
        lock(&self.coordinator)
            .clone()
            .ok_or_else(|| RuntimeError::Internal("broker transactions used before open".into()))
    }

    /// The handle through which acknowledgements and output join T(n).
    pub fn handle(&self, txn: TransactionId) -> Result<TransactionHandle> {
        Ok(TransactionHandle { id: txn, epoch: self.coordinator()?.epoch() })
    }

    /// The broker whose KIP-1289 coordinator this participant drives; sources and sinks
    /// of the same job must use this one, or their work is not in T(n).
    pub fn broker(&self) -> &EmbeddedBroker {
        &self.broker
    }

    fn err(&self, op: &'static str, txn: &TransactionId, e: Error) -> RuntimeError {
        RuntimeError::participant("embedded-broker", op, txn, e.kind(), e)
    }
}

#[async_trait]
impl TransactionParticipant for BrokerTransactions {
    fn name(&self) -> &str {
        "embedded-broker"
    }

    /// A participant on the same broker with the same timeout. Opening it with another
    /// instance's template bumps that prefix's producer epoch: the other instance is
    /// fenced and can decide nothing more.
    fn adopter(&self) -> Option<shareflow_runtime::Participant> {
        Some(BrokerTransactions::new(self.broker.clone(), self.timeout))
    }

    /// Takes the prefix: a new producer epoch fences any older instance and aborts its
    /// ONGOING transactions.
    /// The transaction timeout must exceed checkpoint interval + checkpoint timeout, or
    /// the broker aborts T(n) before its checkpoint can commit it. (The broker also
    /// refuses a timeout above the group's `share.transaction.timeout.ms` at begin.)
    async fn validate(&self, checkpoint_interval: Option<Duration>, checkpoint_timeout: Duration) -> Result<()> {
        let needed = checkpoint_interval.unwrap_or_default().saturating_add(checkpoint_timeout);
        if self.timeout <= needed {
            return Err(RuntimeError::InvalidConfig {
                key: shareflow_share::keys::TXN_TIMEOUT_MS.into(),
                value: self.timeout.as_millis().to_string(),
                rule: format!(
                    "the embedded broker's transaction timeout must exceed checkpoint interval + checkpoint timeout \
                     ({} ms), or the broker aborts T(n) before its checkpoint can commit it",
                    needed.as_millis()
                ),
            });
        }
        Ok(())
    }

    /// The checks of `validate`, then the group's settings against the job: the group's
    /// `share.transaction.timeout.ms` must allow this participant's timeout (the broker
    /// refuses a longer one at begin), and `share.transaction.max.pending` must leave
    /// room for every instance's pending transactions (or a begin fails under load with
    /// `TooManyPendingTransactions`).
    async fn validate_job(&self, job: &JobSettings) -> Result<()> {
        self.validate(job.checkpoint_interval, job.checkpoint_timeout).await?;
        let group = self.broker.group_config(&job.group).await.map_err(|e| runtime_error("embedded-broker", e))?;
        check_group(&group, self.timeout, job)
    }

    async fn open(&self, template: &TransactionTemplate) -> Result<()> {
        let c = self
            .broker
            .transaction_coordinator(template.group_id(), template.prefix())
            .await
            .map_err(|e| runtime_error("embedded-broker", e))?;
        tracing::info!(
            group = template.group_id(),
            prefix = template.prefix(),
            epoch = c.epoch(),
            "took the transactional prefix"
        );
        *lock(&self.coordinator) = Some(c);
        Ok(())
    }

    async fn begin(&self, txn: &TransactionId) -> Result<()> {
        self.coordinator()?
            .begin_transaction(txn, self.timeout)
            .await
            .map(|_| ())
            .map_err(|e| self.err("begin", txn, e))
    }

    async fn prepare(&self, txn: &TransactionId) -> Result<PrepareOutcome> {
        match self.coordinator()?.prepare_transaction(txn).await {
            Ok(()) => Ok(PrepareOutcome::Prepared),
            Err(Error::IllegalTransition { state: TransactionState::Aborted, .. }) => {
                Ok(PrepareOutcome::AlreadyAborted)
            }
            Err(e) => Err(self.err("prepare", txn, e)),
        }
    }

    async fn commit(&self, txn: &TransactionId) -> Result<()> {
        self.coordinator()?.commit_transaction(txn).await.map_err(|e| self.err("commit", txn, e))
    }

    async fn abort(&self, txn: &TransactionId) -> Result<()> {
        self.coordinator()?.abort_transaction(txn).await.map_err(|e| self.err("abort", txn, e))
    }

    async fn highest_checkpoint_id(&self, template: &TransactionTemplate) -> Result<Option<CheckpointId>> {
        self.broker
            .highest_checkpoint_id(template.group_id(), template.prefix())
            .await
            .map_err(|e| runtime_error("embedded-broker", e))
    }

    async fn pending(&self, template: &TransactionTemplate) -> Result<Vec<PendingTransaction>> {
        let opened = lock(&self.coordinator).clone();
        let all = match opened {
            Some(c) => c.list_pending_transactions(template.group_id()).await,
            // Not opened (a dry run of `txn resolve`, on a read-only broker): the same
            // answer from the broker's listing, without taking the prefix.
            None => self.broker.pending(template.group_id()).await,
        }
        .map_err(|e| runtime_error("embedded-broker", e))?;
        Ok(all
            .into_iter()
            .filter(|t| t.id.prefix() == template.prefix())
            .map(|t| PendingTransaction { prepared: t.state == TransactionState::Prepare, id: t.id })
            .collect())
    }
}

/// The group's transaction settings against a job whose participant uses `timeout`: an
/// error names the group's key, its value, and the value that would work.
fn check_group(group: &shareflow_share::ShareConfig, timeout: Duration, job: &JobSettings) -> Result<()> {
    use shareflow_share::keys;
    if group.transaction_timeout() < timeout {
        return Err(RuntimeError::InvalidConfig {
            key: keys::TXN_TIMEOUT_MS.into(),
            value: group.transaction_timeout().as_millis().to_string(),
            rule: format!(
                "group {}'s {} must be at least the job's transaction timeout ({} ms, BrokerTransactions::new), \
                 or the broker refuses every begin: set it to {} or more, or give BrokerTransactions a shorter \
                 timeout above checkpoint interval + checkpoint timeout",
                job.group,
                keys::TXN_TIMEOUT_MS,
                timeout.as_millis(),
                timeout.as_millis()
            ),
        });
    }
    if let Some(why) = job.restart.burns_deliveries(u32::from(group.delivery_count_limit())) {
        tracing::warn!(group = %job.group, "{why}");
    }
    let needed = job.instances.saturating_mul(job.pending_per_instance());
    if group.max_pending_transactions() < needed {
        return Err(RuntimeError::InvalidConfig {
            key: keys::TXN_MAX_PENDING.into(),
            value: group.max_pending_transactions().to_string(),
            rule: format!(
                "group {}'s {} must be at least {needed}: {} instance(s) of the job (this one and those the \
                 registry shows live), each with up to {} pending transactions (tolerable_checkpoint_failures {} \
                 + 2); set it to {needed}, or lower tolerable_checkpoint_failures",
                job.group,
                keys::TXN_MAX_PENDING,
                job.instances,
                job.pending_per_instance(),
                job.tolerable_checkpoint_failures
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shareflow_share::{keys, ShareConfig};

    fn job(tolerable: u32, instances: u32) -> JobSettings {
        JobSettings::new("g", Some(Duration::from_millis(500)), Duration::from_secs(10), tolerable, instances)
    }

    fn group(timeout: Duration, max_pending: u32) -> ShareConfig {
        ShareConfig::builder().transaction_timeout(timeout).max_pending_transactions(max_pending).build().unwrap()
    }

    /// The group's timeout must allow the participant's; max.pending must hold every
    /// instance's pending transactions. Each refusal names the key, its value and the
    /// value that works.
    #[test]
    fn the_group_settings_are_checked_against_the_job() {
        let minute = Duration::from_secs(60);
        check_group(&group(minute, 5), minute, &job(3, 1)).unwrap();
        check_group(&group(minute, 15), minute, &job(3, 3)).unwrap();

        let err = check_group(&group(Duration::from_secs(30), 5), minute, &job(3, 1)).unwrap_err().to_string();
        assert!(err.contains(keys::TXN_TIMEOUT_MS) && err.contains("30000"), "{err}");
        assert!(err.contains("set it to 60000 or more"), "{err}");

        let err = check_group(&group(minute, 14), minute, &job(3, 3)).unwrap_err().to_string();
        assert!(err.contains(keys::TXN_MAX_PENDING) && err.contains("14"), "{err}");
        assert!(err.contains("must be at least 15") && err.contains("3 instance(s)"), "{err}");
        assert!(err.contains("tolerable_checkpoint_failures 3"), "{err}");
    }
}
