//! # shareflow-connector
//!
//! Kafka share groups (KIP-932) with transactional acknowledgements (KIP-1289), for a
//! streaming runtime that wants exactly-once from a queue.
//!
//! - [`share`]: the contract. [`share::ShareConsumer`] polls and acknowledges,
//!   [`share::ShareTransactionCoordinator`] begins, prepares, commits and aborts
//!   transactions with ids `{groupId}-{prefix}-{checkpointId}`, and
//!   [`share::ShareTransactionalProducer`] binds output to the same transaction.
//! - [`broker`]: [`broker::EmbeddedBroker`], an in-process broker that implements all of
//!   it durably. It is the zero-set-up default.
//! - [`source::ShareGroupSource`]: the runtime source; transactional (exactly-once) or
//!   explicit (at-least-once). [`participant::BrokerTransactions`] makes the broker's
//!   transaction T(n) part of every checkpoint, and [`sink::TopicSink`] writes output
//!   into the same T(n).
//! - [`Error`]: one error type; [`Error::kind`] says whether to fix the input, stop
//!   (fenced), retry, or report corrupt data.
//!
//! A record moves AVAILABLE -> ACQUIRED on poll, ACQUIRED -> LOCKED when acknowledged
//! into a transaction, and LOCKED -> ACKNOWLEDGED in the same atomic step that makes the
//! transaction's output visible. See [`broker::EmbeddedBroker`] for a runnable example.

pub mod broker;
mod common;
mod error;
pub mod file_sink;
pub mod kafka;
pub mod participant;
pub mod share;
pub mod sink;
pub mod source;
pub mod verify;

pub use error::{Error, ErrorKind, Result};
