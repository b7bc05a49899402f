//! The connector's named fault points (docs/design.md §4). One point has one name on both
//! backends, so a crash schedule written for one runs unchanged on the other.
//!
//! The runtime's points (`checkpoint.*`, `commit.*`, `recovery.mid`) are in
//! `shareflow_runtime::failpoint::points`.

/// `source.after_poll`: records were polled (ACQUIRED), nothing binds them to T(n) yet.
pub const SOURCE_AFTER_POLL: &str = "source.after_poll";

/// `source.after_lock`: the polled records are bound to T(n) and not emitted yet.
///
/// On the embedded broker they are LOCKED in T(n) (KIP-1289: acknowledged with the
/// transaction's handle). On Kafka the ledger's intent entry naming them is durable in
/// the group's intents topic (written outside any transaction), and they are not yet
/// accepted at the share group.
pub const SOURCE_AFTER_LOCK: &str = "source.after_lock";

/// `sink.after_write`: the output of checkpoint n is written into T(n), the barrier is
/// not yet reached.
pub const SINK_AFTER_WRITE: &str = "sink.after_write";

/// Every fault point of the connector.
pub const ALL: &[&str] = &[SOURCE_AFTER_POLL, SOURCE_AFTER_LOCK, SINK_AFTER_WRITE];
