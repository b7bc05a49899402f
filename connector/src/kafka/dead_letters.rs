//! [`KafkaDeadLetters`]: dead letters into a Kafka topic, inside T(n).

use std::sync::Arc;

use async_trait::async_trait;
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{DeadLetter, DeadLetterWriter, Result};

use super::KafkaTransactions;
use crate::common::dead_letters::DeadLetterSettings;

/// Writes a job's dead letters to a Kafka topic through the job's
/// [`KafkaTransactions`]: into T(n) in exactly-once mode, with the checkpoint's output
/// and its ledger commit entry; idempotently and flushed before the checkpoint
/// completes in at-least-once mode. A metadata-only dead letter has an empty value.
#[derive(Debug)]
pub struct KafkaDeadLetters {
    txns: Arc<KafkaTransactions>,
    settings: DeadLetterSettings,
}

impl KafkaDeadLetters {
    /// A writer for [`JobBuilder::dead_letters`](shareflow_runtime::JobBuilder::dead_letters);
    /// `txns` must also be a participant of the job.
    pub fn new(txns: Arc<KafkaTransactions>, settings: DeadLetterSettings) -> Arc<Self> {
        Arc::new(Self { txns, settings })
    }
}

#[async_trait]
impl DeadLetterWriter for KafkaDeadLetters {
    async fn write(&self, txn: &TransactionId, letters: Vec<DeadLetter>) -> Result<()> {
        let records = letters
            .iter()
            .map(|l| {
                let (key, value, headers) = self.settings.record(l, txn.group_id());
                // Headers only stays a null value, as on the embedded broker.
                let mut r = krafka::Record::new(self.settings.topic.as_str(), bytes::Bytes::new());
                r.value = value;
                if let Some(k) = key {
                    r = r.key(k);
                }
                for (name, value) in headers {
                    r = r.header(name, value);
                }
                r
            })
            .collect();
        self.txns.send_records(txn.checkpoint_id(), records).await
    }
}
