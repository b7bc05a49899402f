//! # shareflow-runtime
//!
//! A small Flink-style dataflow runtime: operators exchange Arrow `RecordBatch`es over
//! bounded channels (so backpressure reaches the sources), and a
//! checkpoint coordinator takes aligned-barrier checkpoints whose
//! commit decision is a manifest in object storage.
//!
//! - Build a graph with [`JobBuilder`]: `source -> .sql(..) / .map(..) / .filter(..) /
//!   .key_by(..) -> sink`, parallelism per operator.
//! - Operators implement [`Operator`] (or [`Source`]): open with restored state,
//!   process batches, snapshot at barriers, hear about completed and aborted
//!   checkpoints.
//! - Transactional resources implement [`TransactionParticipant`]: each checkpoint n
//!   ([`CheckpointId`]) has one transaction T(n) = `{group}-{prefix}-{n}`, begun before
//!   the rows of checkpoint n, prepared once every subtask has acknowledged barrier n,
//!   decided by the manifest, committed on completion; recovery commits what a manifest
//!   decided and aborts the rest.
//! - A failed task cancels the job, which restarts from the newest complete checkpoint
//!   under its [`RestartStrategy`].
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use shareflow_checkpoint::CheckpointStore;
//! use shareflow_runtime::testing::{CollectSink, SequenceSource};
//! use shareflow_runtime::{JobBuilder, JobConfig};
//!
//! let sink = CollectSink::new();
//! let job = JobBuilder::new();
//! job.source("numbers", SequenceSource::schema(), SequenceSource::factory(4, 1_000, 256))
//!     .parallelism(2)
//!     .sql("evens", r#"SELECT split, "offset" FROM input WHERE "offset" % 2 = 0"#)
//!     .sink("collect", sink.factory());
//! job.participant(sink.participant());
//! let storage = CheckpointStore::from_url("memory://runtime-doc/chk", &[], "doc")?;
//! let report = job.build(JobConfig::new(storage, "doc", "run1"))?.run().await?;
//! assert_eq!(sink.committed_rows(), 2_000);
//! assert_eq!(report.attempts, 1);
//! # Ok::<(), shareflow_runtime::RuntimeError>(()) }).unwrap();
//! ```

#![forbid(missing_docs)]

mod channel;
mod config;
mod coordinator;
mod dead_letter;
mod error;
pub mod failpoint;
mod graph;
mod instance;
mod job;
mod keyed;
mod metrics;
mod operator;
mod partition;
mod savepoint;
mod spec;
pub mod sql;
mod task;
#[cfg(feature = "testing")]
pub mod testing;

pub use async_trait::async_trait;
pub use channel::Collector;
pub use config::{InstanceConfig, JobConfig, RestartStrategy};
pub use dead_letter::{
    isolate, DeadLetter, DeadLetterCause, DeadLetterWriter, DeadLetters, Isolated, Isolator, Origin,
};
pub use error::{ErrorKind, Result, RuntimeError};
#[cfg(feature = "testing")]
pub use failpoint::Broken;
pub use failpoint::Failpoints;
pub use graph::{JobBuilder, Stream};
pub use instance::{decide, resolve_pending, Decided, RecoveryMarks, Resolution};
pub use job::{Job, JobReport, StopHandle};
pub use keyed::KeyedItem;
pub use metrics::{
    CheckpointMetrics, CheckpointOutcome, Histogram, JobMetrics, JobMetricsSnapshot, Metric, MetricValue,
    OperatorMetricsSnapshot, HISTORY,
};
pub use operator::{
    JobSettings, Operator, Participant, PendingTransaction, PrepareOutcome, Source, SourceEvent, StateItems,
    SubtaskContext, TransactionParticipant, TransactionTemplate,
};
pub use partition::{key_group_of, key_groups_of_subtask, subtask_of_key_group, Partitioning, KEY_GROUPS};
pub use savepoint::{
    restore_savepoint, Savepoint, SavepointHandle, SAVEPOINT_AFTER_MANIFEST, SAVEPOINT_BEFORE_COPY, SAVEPOINT_MID,
    SAVEPOINT_STEPS,
};
pub use shareflow_checkpoint as checkpoint;
pub use shareflow_checkpoint::CheckpointId;
pub use spec::{GraphEdge, GraphNode, JobGraph, OperatorFactory, SourceFactory};
pub use sql::{SqlOptions, WindowSpec};
