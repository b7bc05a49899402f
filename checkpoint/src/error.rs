//! The one public error type of the checkpoint crate, and the project-wide [`ErrorKind`].

use std::sync::Arc;

/// What the caller should do about an error. Shared by every shareflow crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input or configuration: the caller must change what it sends.
    Invalid,
    /// Another writer owns this: a newer instance, or a manifest with different bytes.
    Fenced,
    /// Transient: the store is down or slow. Retry later.
    Unavailable,
    /// Stored bytes are corrupt or of an unknown format.
    Data,
    /// A bug in shareflow. Please report it.
    Internal,
}

/// Result alias for the checkpoint crate.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// Failures of checkpoint storage. Every message names the path or option at fault.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A storage URL or one of its options is wrong.
    #[error("invalid storage URL {url:?}: {option}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// The option (or URL part) at fault.
        option: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A job, operator or savepoint name that cannot be part of a path.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// `job id`, `operator`, `savepoint name`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The rule.
        reason: String,
    },
    /// A transaction id, group id or prefix is malformed.
    #[error("invalid {part} in transaction id {input:?}: {reason}")]
    InvalidTransactionId {
        /// Which part is wrong: `group id`, `prefix`, `checkpoint id`.
        part: &'static str,
        /// The text that was given.
        input: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// Something that must exist does not.
    #[error("{what} not found at {path}")]
    NotFound {
        /// What was looked for.
        what: &'static str,
        /// Where.
        path: String,
    },
    /// Stored bytes fail verification.
    #[error("corrupt checkpoint data in {path}: {reason}")]
    Corrupt {
        /// The object path.
        path: String,
        /// Which check failed.
        reason: String,
    },
    /// A manifest with different bytes already exists: another writer published this
    /// checkpoint id. Manifests are never overwritten.
    #[error(
        "manifest {path} already exists with different content: another job instance wrote checkpoint \
         {checkpoint_id}; this instance is fenced"
    )]
    ManifestConflict {
        /// The manifest path.
        path: String,
        /// The checkpoint id.
        checkpoint_id: crate::CheckpointId,
    },
    /// A savepoint of that name exists: savepoints are never overwritten.
    #[error("savepoint {name:?} already exists at {path}: take it under another name, or delete that directory first")]
    SavepointExists {
        /// The savepoint's name.
        name: String,
        /// Its manifest.
        path: String,
    },
    /// The instance was adopted by another one after it fell silent; its transactions
    /// are decided by the adopter, so it may never start again under this prefix.
    #[error(
        "instance {prefix} was adopted by instance {by} after it fell silent; its transactions are decided \
         there. Start this instance with a new prefix"
    )]
    InstanceAdopted {
        /// The adopted instance's prefix.
        prefix: String,
        /// The adopter's prefix.
        by: String,
    },
    /// Another incarnation of the instance, or its adopter, took over: this one must
    /// stop.
    #[error("instance {prefix} is fenced: {reason}")]
    InstanceFenced {
        /// The instance's prefix.
        prefix: String,
        /// Who took over, and what to do.
        reason: String,
    },
    /// The store failed.
    #[error("object store {op} of {path} failed: {source}")]
    Store {
        /// The operation: put, get, list, delete, copy.
        op: &'static str,
        /// The object path.
        path: String,
        /// The store's error.
        #[source]
        source: Arc<object_store::Error>,
    },
    /// A shareflow bug.
    #[error("internal error (a shareflow bug, please report it): {0}")]
    Internal(String),
}

impl CheckpointError {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CheckpointError::InvalidUrl { .. }
            | CheckpointError::InvalidName { .. }
            | CheckpointError::InvalidTransactionId { .. }
            | CheckpointError::SavepointExists { .. }
            | CheckpointError::NotFound { .. } => ErrorKind::Invalid,
            CheckpointError::Corrupt { .. } => ErrorKind::Data,
            CheckpointError::ManifestConflict { .. }
            | CheckpointError::InstanceAdopted { .. }
            | CheckpointError::InstanceFenced { .. } => ErrorKind::Fenced,
            CheckpointError::Store { source, .. } => match source.as_ref() {
                object_store::Error::NotFound { .. } => ErrorKind::Invalid,
                _ => ErrorKind::Unavailable,
            },
            CheckpointError::Internal(_) => ErrorKind::Internal,
        }
    }

    pub(crate) fn store(op: &'static str, path: impl ToString, source: object_store::Error) -> Self {
        CheckpointError::Store { op, path: path.to_string(), source: Arc::new(source) }
    }

    pub(crate) fn corrupt(path: impl ToString, reason: impl ToString) -> Self {
        CheckpointError::Corrupt { path: path.to_string(), reason: reason.to_string() }
    }
}
