//! The transaction metrics' names that both backends report, as KIP-1289 names them.

/// `share-transaction-active`: ONGOING plus PREPARE transactions (gauge).
pub const TRANSACTION_ACTIVE: &str = "share-transaction-active";
/// `share-transaction-prepare-time-ms`: prepare latency (histogram).
pub const TRANSACTION_PREPARE_TIME_MS: &str = "share-transaction-prepare-time-ms";
/// `share-transaction-commit-time-ms`: commit latency (histogram).
pub const TRANSACTION_COMMIT_TIME_MS: &str = "share-transaction-commit-time-ms";
/// `share-transaction-abort-total`: aborted transactions, timeouts included (counter).
pub const TRANSACTION_ABORT_TOTAL: &str = "share-transaction-abort-total";
/// `share-transaction-timeout-total`: transactions aborted by their timeout (counter).
pub const TRANSACTION_TIMEOUT_TOTAL: &str = "share-transaction-timeout-total";
