//! [`BrokerDeadLetters`]: dead letters into a topic of the embedded broker, inside T(n).

use std::sync::Arc;

use async_trait::async_trait;
use shareflow_checkpoint::TransactionId;
use shareflow_runtime::{DeadLetter, DeadLetterWriter, Result};

use super::BrokerTransactions;
use crate::common::dead_letters::DeadLetterSettings;
use crate::common::runtime_error;
use shareflow_broker::EmbeddedBroker;
use shareflow_share::{ProducerRecord, ShareTransactionalProducer};

/// Writes a job's dead letters to a topic of the embedded broker: into T(n) with the
/// job's [`BrokerTransactions`] (exactly once, with the checkpoint's output and
/// acknowledgements), or at once without (at-least-once jobs). The topic must exist.
/// Records the group archives at its delivery limit are the broker's to write: set
/// [`EmbeddedBroker::dead_letter_archived`] to the same topic (decision 0041).
#[derive(Debug)]
pub struct BrokerDeadLetters {
    broker: EmbeddedBroker,
    txns: Option<Arc<BrokerTransactions>>,
    settings: DeadLetterSettings,
}

impl BrokerDeadLetters {
    /// A writer for [`JobBuilder::dead_letters`](shareflow_runtime::JobBuilder::dead_letters).
    pub fn new(
        broker: EmbeddedBroker,
        txns: Option<Arc<BrokerTransactions>>,
        settings: DeadLetterSettings,
    ) -> Arc<Self> {
        Arc::new(Self { broker, txns, settings })
    }
}

#[async_trait]
impl DeadLetterWriter for BrokerDeadLetters {
    async fn write(&self, txn: &TransactionId, letters: Vec<DeadLetter>) -> Result<()> {
        let topic: Arc<str> = self.settings.topic.as_str().into();
        let records: Vec<ProducerRecord> = letters
            .iter()
            .map(|l| {
                let (key, value, headers) = self.settings.record(l, txn.group_id());
                ProducerRecord { topic: topic.clone(), partition: None, key, value, timestamp_ms: 0, headers }
            })
            .collect();
        let task = "dead-letters";
        match &self.txns {
            Some(txns) => {
                let handle = txns.handle(txn.clone())?;
                txns.coordinator()?.send(&handle, records).await.map(|_| ()).map_err(|e| runtime_error(task, e))
            }
            None => self.broker.produce(records).await.map(|_| ()).map_err(|e| runtime_error(task, e)),
        }
    }
}
