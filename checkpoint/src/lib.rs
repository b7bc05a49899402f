//! # shareflow-checkpoint
//!
//! Checkpoint storage for shareflow, on any `object_store` (memory, local disk with
//! fsync, S3).
//!
//! - [`envelope`]: the versioned, checksummed wrapper of every durable file.
//! - [`CheckpointPaths`]: the one place that builds object keys:
//!   `{root}/{job}/chk-{n:020}/_shared.state` (every state the manifest does not
//!   inline, one object per checkpoint) and `.../_metadata`.
//! - [`Manifest`]: a checkpoint's `_metadata`, written last with `PutMode::Create`. Its
//!   existence is the commit decision for the transactions it lists.
//! - [`protocol`]: pure recovery decisions. [`protocol::resolve`] picks the newest
//!   complete, verifiable checkpoint and what to garbage-collect;
//!   [`protocol::plan_recovery`] and [`protocol::plan_completion`] say which pending
//!   transactions commit and which abort: the commit rules, in one place.
//! - [`CheckpointStore`]: the I/O edge: write state, publish manifests, recover, collect
//!   garbage, savepoints, and inspection.
//! - [`open_url`]: `memory://`, `file://`, `s3://` (and `gs://`, `az://` by feature).
//! - [`CheckpointId`]: the id of a checkpoint, one name and one type from the
//!   coordinator to the sinks.
//! - [`TransactionId`]: `{groupId}-{prefix}-{checkpointId}`, the one transaction that
//!   commits a checkpoint of a job instance.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use shareflow_checkpoint::{CheckpointStore, Manifest, RetentionPolicy};
//!
//! let store = CheckpointStore::from_url("memory://lib-doc/checkpoints", &[], "orders")?;
//! let state = store.write_state(1, "share-source", 0, b"ack ranges").await?;
//! store
//!     .publish_manifest(&Manifest {
//!         job_id: "orders".into(),
//!         checkpoint_id: 1,
//!         created_at_ms: 0,
//!         state_files: vec![state],
//!         transactions: vec![],
//!     })
//!     .await?;
//! let recovery = store.recover(&RetentionPolicy::default()).await?;
//! assert_eq!(recovery.plan.restored_id(), Some(1));
//! # Ok::<(), shareflow_checkpoint::CheckpointError>(()) }).unwrap();
//! ```

#![forbid(missing_docs)]

pub mod envelope;
mod error;
pub mod instances;
mod local;
pub mod manifest;
mod paths;
pub mod protocol;
mod store;
pub mod sync;
#[cfg(feature = "testing")]
pub mod testing;
mod txn_id;
mod url;

pub use envelope::EnvelopeError;
pub use error::{CheckpointError, ErrorKind, Result};
pub use local::DurableLocalStore;
pub use manifest::{Manifest, ParticipantState, StateFileRef, TransactionRecord};
pub use paths::{CheckpointKey, CheckpointPaths, ABORTED_NAME, MANIFEST_NAME, SHARED_STATE_NAME};
pub use protocol::{RecoveryDecision, RecoveryPlan, RetentionPolicy};
pub use store::{
    inline_choice, now_ms, CheckpointInfo, CheckpointStore, Published, Recovery, RestoredCheckpoint,
    DEFAULT_INLINE_LIMIT, MAX_INLINE_LIMIT, SHARED_STATE_LIMIT, STATE_PART_LIMIT,
};
pub use txn_id::{validate_group_id, validate_prefix, CheckpointId, TransactionId};
pub use url::{open_url, S3_OPTIONS};
