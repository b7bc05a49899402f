//! The one public error type of the runtime crate.

use std::sync::Arc;

use shareflow_checkpoint::CheckpointError;
pub use shareflow_checkpoint::ErrorKind;

/// Result alias for the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Failures of building or running a job. Messages name the operator, subtask, config key
/// or failpoint at fault.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The job graph is malformed.
    #[error("invalid job graph: {0}")]
    InvalidGraph(String),
    /// A configuration value breaks its rule.
    #[error("invalid config {key}={value}: {rule}")]
    InvalidConfig {
        /// Key.
        key: String,
        /// Value given.
        value: String,
        /// The rule.
        rule: String,
    },
    /// A SQL query that does not plan, or plans to something the SQL operator cannot run
    /// per batch.
    #[error("SQL query does not plan: {message}\n  query: {query}")]
    Sql {
        /// The query text.
        query: String,
        /// DataFusion's message, or what is unsupported.
        message: String,
    },
    /// An operator failed.
    #[error("{task} failed: {source}")]
    Task {
        /// `operator[subtask]`.
        task: String,
        /// What to do about it.
        kind: ErrorKind,
        /// The cause.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A failpoint armed by a test fired: the job crashes here.
    #[error("injected crash at failpoint {0}")]
    InjectedCrash(String),
    /// Checkpoint storage failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A transactional participant failed.
    #[error("transaction participant {participant} failed to {op} {txn}: {source}")]
    Participant {
        /// Participant name.
        participant: String,
        /// begin, prepare, commit, abort, recover.
        op: &'static str,
        /// Transaction id.
        txn: String,
        /// What to do about it.
        kind: ErrorKind,
        /// The cause.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The job was cancelled, or a task stopped because another failed.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// The job failed more often than its restart strategy allows.
    #[error("job failed {attempts} times, more than the restart strategy allows; last error: {last}")]
    RestartsExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: Box<RuntimeError>,
    },
    /// A shareflow bug.
    #[error("internal error (a shareflow bug, please report it): {0}")]
    Internal(String),
}

impl RuntimeError {
    /// What the caller should do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::InvalidGraph(_) | RuntimeError::InvalidConfig { .. } | RuntimeError::Sql { .. } => {
                ErrorKind::Invalid
            }
            RuntimeError::Task { kind, .. } | RuntimeError::Participant { kind, .. } => *kind,
            RuntimeError::InjectedCrash(_) | RuntimeError::Cancelled(_) => ErrorKind::Unavailable,
            RuntimeError::Checkpoint(e) => e.kind(),
            RuntimeError::RestartsExhausted { last, .. } => last.kind(),
            RuntimeError::Internal(_) => ErrorKind::Internal,
        }
    }

    /// Wraps an operator's own error.
    pub fn task(
        task: impl Into<String>,
        kind: ErrorKind,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        RuntimeError::Task { task: task.into(), kind, source: Arc::new(source) }
    }

    /// An operator failure described by a message.
    pub fn task_message(task: impl Into<String>, kind: ErrorKind, message: impl Into<String>) -> Self {
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        struct Message(String);
        Self::task(task, kind, Message(message.into()))
    }

    /// Wraps a participant's error.
    pub fn participant(
        participant: impl Into<String>,
        op: &'static str,
        txn: impl ToString,
        kind: ErrorKind,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        RuntimeError::Participant {
            participant: participant.into(),
            op,
            txn: txn.to_string(),
            kind,
            source: Arc::new(source),
        }
    }

    pub(crate) fn arrow(task: &str, e: arrow::error::ArrowError) -> Self {
        Self::task(task, ErrorKind::Invalid, e)
    }
}
