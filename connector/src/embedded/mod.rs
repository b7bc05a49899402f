//! The embedded broker's backend: a source whose subtasks are share-group members
//! ([`ShareGroupSource`]), a sink into its topics ([`TopicSink`]), and the participant
//! that makes the broker's KIP-1289 transaction T(n) part of every checkpoint
//! ([`BrokerTransactions`]).
//!
//! With a transactional share group, the acknowledgements of checkpoint n and the sink's
//! output of checkpoint n join the same T(n) on the same broker, so one commit makes both
//! visible. The broker itself is [`shareflow_broker::EmbeddedBroker`].

mod dead_letters;
mod metrics;
mod participant;
mod sink;
mod source;

pub use dead_letters::BrokerDeadLetters;
pub use metrics::BrokerMetrics;
pub use participant::BrokerTransactions;
pub use sink::TopicSink;
pub use source::ShareGroupSource;
