//! The acknowledgement ledger on Kafka: its entries, the group-wide claim index, the
//! intents tailer with its summaries and trims, the commits log, and the pure recovery
//! plan. It uses the client side (`super::client`), never the runtime adapters.

mod claims;
mod entries;
mod gc;
mod group;
mod log;
pub(crate) mod recovery;

pub(crate) use entries::to_ranges;
pub(crate) use entries::LedgerEntry;
pub use entries::{Claimant, LedgerRange};
pub use gc::{ledger_topic, plan_ledger_gc, LedgerTopicFate};
pub use group::GroupIntent;
pub(crate) use group::GroupLedger;
pub(crate) use log::LedgerLog;
