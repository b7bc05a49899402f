//! # shareflow-model
//!
//! A [`stateright`] model of shareflow's commit protocol (docs/design.md §3-4, decisions 0005
//! and 0007) that drives the real pure cores:
//! - the embedded broker's state machine, through `shareflow_broker::model::ModelBroker`,
//!   which runs every step as a journal entry through the real `BrokerState::apply`;
//! - the checkpoint planners `plan_completion`, `plan_recovery`, `resolve`,
//!   `plan_adoption` and `check_instance_start` of `shareflow_checkpoint::protocol`.
//!
//! Only I/O is abstracted: the checkpoint store is a map with conditional create (and
//! two faults: an error, and a write applied whose answer timed out), and time is two
//! nondeterministic events (lock expiry, transaction timeout). See `docs/model.md`.
//!
//! The crate is split by responsibility: the configuration (constants, sizes, bugs),
//! the actions, the state types, the observations and shared operations on a state,
//! the model itself (initial state and enabled actions), the step function, and the
//! properties. Everything public is re-exported here, at the crate root.

mod action;
mod config;
mod properties;
mod protocol_model;
mod state;
mod step;
mod sys;
pub mod trace;

pub use action::{Action, Store, Who, ACTION_KINDS};
pub use config::{Bug, Config, ADOPTION_TIMEOUT, GROUP, INPUT, LOCK_MS, OUTPUT, PREFIXES, TXN_TIMEOUT_MS};
pub use protocol_model::ProtocolModel;
pub use state::{Adopting, Coord, Held, Life, Proc, Registry, Slot, Sys};
pub use trace::{Trace, TraceError};
