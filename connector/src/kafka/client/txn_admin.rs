//! The transaction calls recovery needs on [`KafkaCluster`]: DescribeTransactions,
//! ListTransactions and EndTxn by producer id and epoch, and the transaction states
//! they name.

use std::time::Duration;

use super::kafka_error;
use super::KafkaCluster;
use shareflow_share::{Error, ErrorKind, Result};

/// The state of a Kafka transaction, as DescribeTransactions and ListTransactions name
/// it: Kafka's `TransactionState` (`org.apache.kafka.coordinator.transaction`), parsed
/// once where the broker's answer enters the connector.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum KafkaTxnState {
    /// `Empty`: the transactional id has a producer but no transaction open.
    Empty,
    /// `Ongoing`: a transaction is open and can still commit or abort.
    Ongoing,
    /// `PrepareCommit`: EndTxn(commit) was accepted; the markers are being written.
    PrepareCommit,
    /// `PrepareAbort`: EndTxn(abort), a fence or the transaction timeout is aborting it.
    PrepareAbort,
    /// `CompleteCommit`: the last transaction committed.
    CompleteCommit,
    /// `CompleteAbort`: the last transaction aborted.
    CompleteAbort,
    /// `PrepareEpochFence`: a new producer with the id is fencing the old one; the
    /// open transaction ends aborted.
    PrepareEpochFence,
    /// `Dead`: the id expired (`transactional.id.expiration.ms`) and is being removed.
    Dead,
    /// A state this connector does not know, by the name the broker sent.
    Unknown(String),
}

impl KafkaTxnState {
    /// Parses the broker's state name. Never fails: a name this connector does not
    /// know becomes [`KafkaTxnState::Unknown`].
    pub(crate) fn parse(name: &str) -> Self {
        match name {
            "Empty" => Self::Empty,
            "Ongoing" => Self::Ongoing,
            "PrepareCommit" => Self::PrepareCommit,
            "PrepareAbort" => Self::PrepareAbort,
            "CompleteCommit" => Self::CompleteCommit,
            "CompleteAbort" => Self::CompleteAbort,
            "PrepareEpochFence" => Self::PrepareEpochFence,
            "Dead" => Self::Dead,
            other => Self::Unknown(other.to_string()),
        }
    }

    /// The broker's name of the state, as [`KafkaTxnState::parse`] reads it and
    /// ListTransactions' state filter expects it.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::Empty => "Empty",
            Self::Ongoing => "Ongoing",
            Self::PrepareCommit => "PrepareCommit",
            Self::PrepareAbort => "PrepareAbort",
            Self::CompleteCommit => "CompleteCommit",
            Self::CompleteAbort => "CompleteAbort",
            Self::PrepareEpochFence => "PrepareEpochFence",
            Self::Dead => "Dead",
            Self::Unknown(name) => name,
        }
    }

    /// True once the coordinator has decided to commit: `PrepareCommit` or
    /// `CompleteCommit`. The output becomes (or is) visible; nothing is left to do.
    pub(crate) fn is_committing(&self) -> bool {
        matches!(self, Self::PrepareCommit | Self::CompleteCommit)
    }
}

impl std::fmt::Display for KafkaTxnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One transactional id as its coordinator describes it, for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KafkaTransactionInfo {
    /// The transactional id (`{group}-{prefix}-g{generation}-s{slot}` for shareflow's).
    pub id: String,
    /// Kafka's state name: `Ongoing`, `Empty`, `CompleteCommit`, `PrepareAbort`, ...
    pub state: String,
    /// The producer id the coordinator assigned.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms` of the producer.
    pub timeout: Duration,
    /// When the open transaction began, ms since the Unix epoch; `None` without one.
    pub started_at_ms: Option<u64>,
    /// Partitions the open transaction wrote to.
    pub partitions: usize,
}

/// What DescribeTransactions says about one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KafkaTxnDescription {
    /// The state of its current (or last) transaction.
    pub(crate) state: KafkaTxnState,
    /// The producer id the coordinator assigned to the transactional id.
    pub(crate) producer_id: i64,
    /// The producer epoch of that producer id; EndTxn must name it.
    pub(crate) producer_epoch: i16,
    /// The topics of the partitions the open transaction wrote to, one per partition.
    pub(crate) topics: Vec<String>,
}

impl KafkaCluster {
    /// DescribeTransactions for one transactional id: `None` when the coordinator does
    /// not know the id (never used, or expired).
    pub(crate) async fn describe_transaction(&self, id: &str) -> Result<Option<KafkaTxnDescription>> {
        let described = self
            .admin
            .describe_transactions([id], Default::default())
            .await
            .map_err(|e| kafka_error(format!("describe {id}"), e))?;
        match described.into_values().next() {
            Some(Ok(d)) => Ok(Some(KafkaTxnDescription {
                state: KafkaTxnState::parse(&d.state),
                producer_id: d.producer_id,
                producer_epoch: d.producer_epoch,
                topics: d.partitions.into_iter().map(|tp| tp.topic).collect(),
            })),
            Some(Err(krafka::KrafkaError::Broker {
                code: krafka::error::ErrorCode::TransactionalIdNotFound, ..
            })) => Ok(None),
            Some(Err(e)) => Err(kafka_error(format!("describe {id}"), e)),
            None => Ok(None),
        }
    }

    /// ListTransactions: every transactional id the brokers know, with its state;
    /// only those in `states` unless it is empty. Lists only: it fences nothing.
    pub(crate) async fn list_transactions(&self, states: &[KafkaTxnState]) -> Result<Vec<(String, KafkaTxnState)>> {
        let states = states.iter().map(|s| s.as_str().to_string()).collect();
        let options = krafka::admin::ListTransactionsOptions::default().states(states);
        let listed = self.admin.list_transactions(options).await.map_err(|e| kafka_error("list transactions", e))?;
        let mut out = Vec::new();
        for (_, r) in listed {
            for t in r.map_err(|e| kafka_error("list transactions", e))? {
                let state = KafkaTxnState::parse(&t.state);
                out.push((t.transactional_id, state));
            }
        }
        Ok(out)
    }

    /// Every transactional id the brokers know that starts with `prefix`, with its state
    /// (`Ongoing`, `Empty`, `CompleteCommit`, ...), sorted: what `shareflow txn list
    /// --kafka` prints, and how a test checks that nothing is left open.
    pub async fn transactional_ids(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = self
            .list_transactions(&[])
            .await?
            .into_iter()
            .filter(|(id, _)| id.starts_with(prefix))
            .map(|(id, state)| (id, state.as_str().to_string()))
            .collect();
        out.sort();
        Ok(out)
    }

    /// DescribeTransactions for every transactional id starting with `prefix`, sorted
    /// by id: what `shareflow txn list --kafka` prints. Lists and describes only: it
    /// fences nothing. An id that expired between the listing and the description is
    /// left out.
    pub async fn describe_transactions(&self, prefix: &str) -> Result<Vec<KafkaTransactionInfo>> {
        let ids: Vec<String> = self.transactional_ids(prefix).await?.into_iter().map(|(id, _)| id).collect();
        let mut out = Vec::new();
        for chunk in ids.chunks(100) {
            let described = self
                .admin
                .describe_transactions(chunk.iter().map(String::as_str), Default::default())
                .await
                .map_err(|e| kafka_error(format!("describe the transactions of {prefix}*"), e))?;
            for (id, d) in described {
                match d {
                    Ok(d) => out.push(KafkaTransactionInfo {
                        id,
                        state: d.state,
                        producer_id: d.producer_id,
                        producer_epoch: d.producer_epoch,
                        timeout: d.timeout,
                        started_at_ms: u64::try_from(d.start_time_ms).ok(),
                        partitions: d.partitions.len(),
                    }),
                    Err(krafka::KrafkaError::Broker {
                        code: krafka::error::ErrorCode::TransactionalIdNotFound,
                        ..
                    }) => {}
                    Err(e) => return Err(kafka_error(format!("describe {id}"), e)),
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// EndTxn: ends the transaction of transactional id `id` by producer id and epoch,
    /// as the producer that began it would have (`commit`: commit, else abort). The only
    /// way to finish a transaction whose producer died, on brokers without KIP-939.
    /// Built on krafka internals: FindCoordinator, then EndTxn to the coordinator.
    pub(crate) async fn end_txn(&self, id: &str, producer_id: i64, epoch: i16, commit: bool) -> Result<()> {
        use krafka::__private::protocol::{
            versions, ApiKey, EndTxnRequest, EndTxnResponse, FindCoordinatorRequest, FindCoordinatorResponse,
            VersionedDecode, VersionedEncode,
        };
        use krafka::__private::{kafka_metadata, kafka_pool};
        let op = format!("{} {id} by producer id {producer_id} epoch {epoch}", if commit { "commit" } else { "abort" });
        let kafka = &self.kafka;
        let metadata = kafka_metadata(kafka);
        let mut brokers = metadata.brokers();
        if brokers.is_empty() {
            metadata.refresh().await.map_err(|e| kafka_error(op.clone(), e))?;
            brokers = metadata.brokers();
        }
        let Some(broker) = brokers.first() else {
            return Err(Error::Kafka {
                op,
                reason: "no broker is known".into(),
                kind: ErrorKind::Unavailable,
                source: None,
            });
        };
        let pool = kafka_pool(kafka);
        let conn =
            pool.get_connection_by_id(broker.id(), broker.address()).await.map_err(|e| kafka_error(op.clone(), e))?;
        let unsupported = |api: &str| Error::Kafka {
            op: op.clone(),
            reason: format!("the broker speaks no {api} version this client knows"),
            kind: ErrorKind::Invalid,
            source: None,
        };
        let v = conn
            .negotiate_api_version(
                ApiKey::FindCoordinator,
                versions::FIND_COORDINATOR_MAX,
                versions::FIND_COORDINATOR_MIN,
            )
            .ok_or_else(|| unsupported("FindCoordinator"))?;
        let request = FindCoordinatorRequest::for_transaction(id);
        let mut bytes = conn
            .send_request(ApiKey::FindCoordinator, v, |buf| request.encode_versioned(v, buf))
            .await
            .map_err(|e| kafka_error(op.clone(), e))?;
        let found = FindCoordinatorResponse::decode_versioned(v, &mut bytes).map_err(|e| kafka_error(op.clone(), e))?;
        if !found.error_code.is_ok() {
            // The broker's code decides the kind: not available or loading is
            // transient, an authorization failure is not.
            let e = krafka::KrafkaError::broker(found.error_code, "FindCoordinator found no transaction coordinator");
            return Err(kafka_error(op, e));
        }
        let coordinator = pool
            .get_connection(&format!("{}:{}", found.host, found.port))
            .await
            .map_err(|e| kafka_error(op.clone(), e))?;
        let v = coordinator
            .negotiate_api_version(ApiKey::EndTxn, versions::END_TXN_MAX, versions::END_TXN_MIN)
            .ok_or_else(|| unsupported("EndTxn"))?;
        let request = if commit {
            EndTxnRequest::commit(id.to_string(), producer_id, epoch)
        } else {
            EndTxnRequest::abort(id.to_string(), producer_id, epoch)
        };
        let mut bytes = coordinator
            .send_request(ApiKey::EndTxn, v, |buf| request.encode_versioned(v, buf))
            .await
            .map_err(|e| kafka_error(op.clone(), e))?;
        let response = EndTxnResponse::decode_versioned(v, &mut bytes).map_err(|e| kafka_error(op.clone(), e))?;
        if !response.is_ok() {
            // By cause: a newer producer epoch (fenced), a concurrent transaction
            // (transient), a transaction the coordinator already ended (re-read it).
            let e = krafka::KrafkaError::broker(response.error_code, "the transaction coordinator refused EndTxn");
            return Err(kafka_error(op, e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_states_parse_once_and_keep_unknown_names() {
        let known = [
            ("Empty", KafkaTxnState::Empty),
            ("Ongoing", KafkaTxnState::Ongoing),
            ("PrepareCommit", KafkaTxnState::PrepareCommit),
            ("PrepareAbort", KafkaTxnState::PrepareAbort),
            ("CompleteCommit", KafkaTxnState::CompleteCommit),
            ("CompleteAbort", KafkaTxnState::CompleteAbort),
            ("PrepareEpochFence", KafkaTxnState::PrepareEpochFence),
            ("Dead", KafkaTxnState::Dead),
        ];
        for (name, state) in known {
            assert_eq!(KafkaTxnState::parse(name), state);
            assert_eq!(state.as_str(), name);
            assert_eq!(state.to_string(), name);
            assert_eq!(state.is_committing(), matches!(name, "PrepareCommit" | "CompleteCommit"), "{name}");
        }
        // Case matters, as on the broker; nothing is guessed.
        for name in ["ongoing", "", "Preparing"] {
            let state = KafkaTxnState::parse(name);
            assert_eq!(state, KafkaTxnState::Unknown(name.to_string()));
            assert_eq!(state.as_str(), name);
            assert!(!state.is_committing());
        }
    }
}
