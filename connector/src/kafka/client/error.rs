//! [`KafkaError`]: a failed call of the Kafka client, kept whole as the `source` of the
//! connector's public [`Error::Kafka`], and classified by cause: what the caller should
//! do about it ([`ErrorKind`]), not which client variant it was.
//!
//! | cause | kind |
//! |---|---|
//! | another producer owns the transactional id (fenced, producer fenced, invalid producer epoch, fenced instance id) | `Fenced` |
//! | the network, a timeout, a retriable broker code (coordinator or leader not available, not coordinator, ...), a delivery that ran out of time, a closed client, a transaction the broker wants aborted, a transaction coordinator that moved | `Unavailable` |
//! | corrupt bytes: a CRC mismatch, a malformed frame, a record that does not decode, a corrupt message | `Data` |
//! | bad config, an unknown topic, a missing ACL or failed authentication, a request the broker refuses as invalid, a feature the broker lacks | `Invalid` |
//! | the client used out of order | `Internal` |
//!
//! Broker codes not named above are refusals of the request as sent (`Invalid`), unless
//! the client calls them retriable (`Unavailable`); a client variant this connector does
//! not know follows the client's own `is_retriable`.

use std::sync::Arc;

use krafka::error::{ErrorCode, ProtocolErrorKind};
use krafka::KrafkaError;

use shareflow_share::{Error, ErrorKind};

/// A failed Kafka call: what was attempted (`op`, naming the topic, group or
/// transaction) and the client's error, kept as the source.
#[derive(Debug, thiserror::Error)]
#[error("kafka {op} failed: {source}")]
pub(crate) struct KafkaError {
    op: String,
    #[source]
    source: KrafkaError,
}

impl KafkaError {
    /// The failure of `op`.
    pub(crate) fn new(op: impl Into<String>, source: KrafkaError) -> Self {
        Self { op: op.into(), source }
    }

    /// What the caller should do, and a hint that says it in words.
    pub(crate) fn cause(&self) -> (ErrorKind, &'static str) {
        cause(&self.source)
    }
}

impl From<KafkaError> for Error {
    fn from(e: KafkaError) -> Self {
        let (kind, hint) = e.cause();
        Error::Kafka { reason: format!("{}; {hint}", e.source), op: e.op, kind, source: Some(Arc::new(e.source)) }
    }
}

/// Converts a client error into the connector's error, naming the operation.
pub(crate) fn kafka_error(op: impl Into<String>, e: KrafkaError) -> Error {
    KafkaError::new(op, e).into()
}

/// Whether `e` says the group's coordinator is not ready yet: on a new cluster, or for a
/// group whose coordinator moved or is loading. Kafka's own clients wait these out by
/// asking again; so does a share consumer's subscribe.
pub(crate) fn coordinator_not_ready(e: &KrafkaError) -> bool {
    matches!(
        e,
        KrafkaError::Broker {
            code: ErrorCode::CoordinatorNotAvailable | ErrorCode::NotCoordinator | ErrorCode::CoordinatorLoadInProgress,
            ..
        }
    )
}

const FENCED: &str = "another producer took over this transactional id (a newer instance of the job, or \
                      recovery): stop this instance";
const RETRY: &str = "is the broker running and reachable? the call can be retried, and a job restart retries it";
const DATA: &str = "the bytes the broker returned are corrupt or of an unknown format; check the topic and \
                    the broker's log";
const CONFIG: &str = "fix the client setting named above";
const UNKNOWN_TOPIC: &str = "the topic does not exist (auto-creation is off): create it first";
const DENIED: &str = "the client's principal is not allowed to do this: grant it the ACL, or fix its credentials";
const REFUSED: &str = "the broker refused the request as sent: fix its input or the broker's config";
const UNSUPPORTED: &str = "the broker lacks a feature this needs: shareflow needs Apache Kafka 4.2 or later";
const ABORTABLE: &str = "the broker aborts this transaction; the job restarts and replays its checkpoint";
const COORDINATOR: &str = "the transaction coordinator moved or lost track of the transaction; a job restart \
                           re-reads its state";
const BROKER_FAULT: &str = "the broker failed unexpectedly: see its log; a job restart retries";
const CLIENT_BUG: &str = "the client was used out of order: a shareflow bug, please report it";

/// The kind and hint of a client error; see the module documentation for the table.
fn cause(e: &KrafkaError) -> (ErrorKind, &'static str) {
    match e {
        KrafkaError::Fenced { .. } => (ErrorKind::Fenced, FENCED),
        KrafkaError::Broker { code, .. } => broker_cause(*code),
        KrafkaError::Network(_) | KrafkaError::Timeout { .. } => (ErrorKind::Unavailable, RETRY),
        // The producer retried for its whole delivery budget; the transaction cannot
        // commit, and a restart replays its checkpoint.
        KrafkaError::DeliveryTimeout { .. } => (ErrorKind::Unavailable, RETRY),
        KrafkaError::Closed { .. } | KrafkaError::Wakeup => (ErrorKind::Unavailable, RETRY),
        KrafkaError::TransactionAbortable { .. } => (ErrorKind::Unavailable, ABORTABLE),
        // An earlier batch of the partition was lost: the producer must be rebuilt,
        // which a restart does.
        KrafkaError::OutOfOrderSequence { .. } => (ErrorKind::Unavailable, RETRY),
        KrafkaError::Protocol { kind, .. } => match kind {
            ProtocolErrorKind::CrcMismatch
            | ProtocolErrorKind::InvalidLength
            | ProtocolErrorKind::InvalidUtf8
            | ProtocolErrorKind::UnsupportedMagic
            | ProtocolErrorKind::InvalidValue => (ErrorKind::Data, DATA),
            ProtocolErrorKind::UnknownApiVersion => (ErrorKind::Invalid, UNSUPPORTED),
            // A request frame larger than the client allows: a record too big.
            ProtocolErrorKind::FrameTooLarge => (ErrorKind::Invalid, REFUSED),
            k if k.is_retriable() => (ErrorKind::Unavailable, RETRY),
            // `Other` and kinds added later: an answer the client could not classify;
            // nothing says a retry changes it.
            _ => (ErrorKind::Invalid, UNSUPPORTED),
        },
        KrafkaError::RecordDeserialization { .. } | KrafkaError::Compression { .. } => (ErrorKind::Data, DATA),
        KrafkaError::Config { .. } | KrafkaError::NoOffset { .. } | KrafkaError::Serialization { .. } => {
            (ErrorKind::Invalid, CONFIG)
        }
        KrafkaError::UnknownTopic { .. } => (ErrorKind::Invalid, UNKNOWN_TOPIC),
        KrafkaError::Auth { .. } => (ErrorKind::Invalid, DENIED),
        KrafkaError::IllegalState { .. } => (ErrorKind::Internal, CLIENT_BUG),
        // A variant added to the client later: trust its own classification.
        other if other.is_retriable() => (ErrorKind::Unavailable, RETRY),
        _ => (ErrorKind::Invalid, REFUSED),
    }
}

/// The kind and hint of a broker error code.
fn broker_cause(code: ErrorCode) -> (ErrorKind, &'static str) {
    use ErrorCode as C;
    match code {
        C::ProducerFenced | C::InvalidProducerEpoch | C::FencedInstanceId => (ErrorKind::Fenced, FENCED),
        C::CorruptMessage | C::InvalidRecord => (ErrorKind::Data, DATA),
        C::UnknownTopicOrPartition | C::UnknownTopicId | C::InvalidTopic => (ErrorKind::Invalid, UNKNOWN_TOPIC),
        C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::DelegationTokenAuthorizationFailed
        | C::SaslAuthenticationFailed
        | C::UnsupportedSaslMechanism
        | C::IllegalSaslState
        | C::SecurityDisabled => (ErrorKind::Invalid, DENIED),
        C::UnsupportedVersion | C::UnsupportedForMessageFormat => (ErrorKind::Invalid, UNSUPPORTED),
        C::InvalidRequest
        | C::InvalidConfig
        | C::InvalidPartitions
        | C::InvalidReplicationFactor
        | C::InvalidReplicaAssignment
        | C::PolicyViolation
        | C::InvalidTransactionTimeout
        | C::MessageTooLarge
        | C::RecordListTooLarge
        | C::InvalidRequiredAcks
        | C::UnsupportedCompressionType
        | C::InvalidGroupId
        | C::GroupIdNotFound
        | C::TopicAlreadyExists => (ErrorKind::Invalid, REFUSED),
        C::TransactionAbortable => (ErrorKind::Unavailable, ABORTABLE),
        // The coordinator of the transactional id changed, or the transaction moved to
        // a state the call did not expect (the broker aborted it on a timeout): a
        // restart describes it again and decides from what it finds.
        C::TransactionCoordinatorFenced | C::InvalidTxnState | C::InvalidProducerIdMapping => {
            (ErrorKind::Unavailable, COORDINATOR)
        }
        C::UnknownServerError => (ErrorKind::Unavailable, BROKER_FAULT),
        c if c.is_retriable() => (ErrorKind::Unavailable, RETRY),
        // Every other non-retriable code is the broker refusing the request as sent.
        _ => (ErrorKind::Invalid, REFUSED),
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn kind(e: KrafkaError) -> ErrorKind {
        Error::from(KafkaError::new("op", e)).kind()
    }

    #[test]
    fn fencing_means_stop_this_instance() {
        assert_eq!(kind(KrafkaError::fenced("epoch bumped")), ErrorKind::Fenced);
        for code in [ErrorCode::ProducerFenced, ErrorCode::InvalidProducerEpoch, ErrorCode::FencedInstanceId] {
            assert_eq!(kind(KrafkaError::broker(code, "x")), ErrorKind::Fenced, "{code:?}");
        }
    }

    #[test]
    fn only_a_coordinator_not_ready_yet_is_waited_out() {
        for (code, wait) in [
            (ErrorCode::CoordinatorNotAvailable, true),
            (ErrorCode::NotCoordinator, true),
            (ErrorCode::CoordinatorLoadInProgress, true),
            (ErrorCode::GroupAuthorizationFailed, false),
            (ErrorCode::UnknownTopicOrPartition, false),
            (ErrorCode::InvalidRequest, false),
        ] {
            assert_eq!(coordinator_not_ready(&KrafkaError::broker(code, "x")), wait, "{code:?}");
        }
        assert!(!coordinator_not_ready(&KrafkaError::timeout("heartbeat")));
    }

    #[test]
    fn transient_failures_are_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(kind(KrafkaError::network(io)), ErrorKind::Unavailable);
        assert_eq!(kind(KrafkaError::timeout("fetch")), ErrorKind::Unavailable);
        assert_eq!(kind(KrafkaError::delivery_timeout(true, "x")), ErrorKind::Unavailable);
        assert_eq!(kind(KrafkaError::closed("producer")), ErrorKind::Unavailable);
        assert_eq!(kind(KrafkaError::transaction_abortable("x")), ErrorKind::Unavailable);
        assert_eq!(kind(KrafkaError::protocol_kind(ProtocolErrorKind::TruncatedFrame, "x")), ErrorKind::Unavailable);
        for code in [
            ErrorCode::CoordinatorNotAvailable,
            ErrorCode::NotCoordinator,
            ErrorCode::CoordinatorLoadInProgress,
            ErrorCode::LeaderNotAvailable,
            ErrorCode::NotLeaderForPartition,
            ErrorCode::RequestTimedOut,
            ErrorCode::ConcurrentTransactions,
            ErrorCode::TransactionCoordinatorFenced,
            ErrorCode::InvalidTxnState,
            ErrorCode::UnknownServerError,
        ] {
            assert_eq!(kind(KrafkaError::broker(code, "x")), ErrorKind::Unavailable, "{code:?}");
        }
    }

    #[test]
    fn corrupt_bytes_are_data_errors() {
        assert_eq!(kind(KrafkaError::protocol_kind(ProtocolErrorKind::CrcMismatch, "crc")), ErrorKind::Data);
        assert_eq!(kind(KrafkaError::broker(ErrorCode::CorruptMessage, "x")), ErrorKind::Data);
        assert_eq!(kind(KrafkaError::record_deserialization("t", 0, 7, "value", "bad")), ErrorKind::Data);
    }

    #[test]
    fn bad_input_is_invalid_with_a_hint_naming_what_to_fix() {
        let cases = [
            (KrafkaError::config("linger.ms"), CONFIG),
            (KrafkaError::unknown_topic("orders"), UNKNOWN_TOPIC),
            (KrafkaError::broker(ErrorCode::UnknownTopicOrPartition, "orders-3"), UNKNOWN_TOPIC),
            (KrafkaError::auth("bad password"), DENIED),
            (KrafkaError::broker(ErrorCode::TopicAuthorizationFailed, "x"), DENIED),
            (KrafkaError::broker(ErrorCode::TransactionalIdAuthorizationFailed, "x"), DENIED),
            (KrafkaError::broker(ErrorCode::InvalidRequest, "x"), REFUSED),
            (KrafkaError::broker(ErrorCode::InvalidTransactionTimeout, "x"), REFUSED),
            (KrafkaError::protocol_kind(ProtocolErrorKind::UnknownApiVersion, "no EndTxn"), UNSUPPORTED),
        ];
        for (e, hint) in cases {
            let shown = e.to_string();
            let err = Error::from(KafkaError::new("create topic orders", e));
            assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
            let text = err.to_string();
            assert!(text.starts_with("kafka create topic orders failed: "), "{text}");
            assert!(text.contains(&shown) && text.ends_with(hint), "{text}");
        }
    }

    #[test]
    fn a_client_misuse_is_internal() {
        assert_eq!(kind(KrafkaError::illegal_state("send before begin")), ErrorKind::Internal);
    }

    #[test]
    fn the_client_error_stays_reachable_as_the_source() {
        let err = kafka_error("commit T(3)", KrafkaError::broker(ErrorCode::ProducerFenced, "epoch 4 < 5"));
        let source = err.source().expect("the client error is the source");
        // Shared, so that the error stays `Clone`: the pointer's Display and source are
        // the client error's.
        assert_eq!(source.to_string(), KrafkaError::broker(ErrorCode::ProducerFenced, "epoch 4 < 5").to_string());
        let shared = source.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>().expect("a shared error");
        let client = shared.downcast_ref::<KrafkaError>().expect("a krafka error");
        assert!(matches!(client, KrafkaError::Broker { code: ErrorCode::ProducerFenced, .. }), "{client:?}");
        // A clone shares the source.
        assert!(err.clone().source().is_some());
    }
}
