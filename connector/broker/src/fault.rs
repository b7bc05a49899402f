//! Named fault points in the journal's multi-step operations (decision 0020): segment
//! roll, snapshot and segment GC. A test arms a point on one broker
//! ([`BrokerOptions::fail_at`](super::BrokerOptions::fail_at)) and the step fails there
//! as if the process had died, leaving the directory as a crash would; or it sets
//! `SHAREFLOW_CRASH_AT=<point>` and the process aborts there, for kill campaigns.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use shareflow_share::{Error, Result};

/// After the journal rolls to a new segment file (not the first of a process), before
/// its first entry is written.
pub const SEGMENT_ROLL: &str = "segment.roll";
/// A journal write meets a full disk: half of it reaches the segment, then ENOSPC.
pub const DISK_FULL: &str = "segment.disk_full";
/// After a snapshot is encoded, before its file is written.
pub const SNAPSHOT_BEFORE_WRITE: &str = "snapshot.before_write";
/// After a snapshot file is written and synced, before any segment is deleted.
pub const SNAPSHOT_BEFORE_GC: &str = "snapshot.before_gc";
/// After the first segment a snapshot freed is deleted, before the rest.
pub const GC_AFTER_FIRST_DELETE: &str = "gc.after_first_delete";
/// After the freed segments are deleted, before the older snapshots are.
pub const GC_BEFORE_OLD_SNAPSHOTS: &str = "gc.before_old_snapshots";

/// Every fault point, in the order a snapshot meets them.
pub const ALL: &[&str] = &[
    SEGMENT_ROLL,
    DISK_FULL,
    SNAPSHOT_BEFORE_WRITE,
    SNAPSHOT_BEFORE_GC,
    GC_AFTER_FIRST_DELETE,
    GC_BEFORE_OLD_SNAPSHOTS,
];

/// The points armed on one broker, and the one the process aborts at, if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    armed: Arc<Mutex<BTreeSet<&'static str>>>,
    crash_at: Option<Arc<str>>,
}

impl Faults {
    /// Faults from the environment: `SHAREFLOW_CRASH_AT`.
    pub(crate) fn from_env() -> Self {
        Self { armed: Arc::default(), crash_at: std::env::var("SHAREFLOW_CRASH_AT").ok().map(Into::into) }
    }

    /// Arms `point`: its next hit fails.
    pub(crate) fn arm(&self, point: &'static str) {
        shareflow_share::sync::lock(&self.armed).insert(point);
    }

    /// Whether `point` is armed and has not fired yet.
    pub(crate) fn armed(&self, point: &str) -> bool {
        shareflow_share::sync::lock(&self.armed).contains(point)
    }

    /// Fails if `point` is armed (once), aborts the process if it is the crash point.
    pub(crate) fn hit(&self, point: &'static str) -> Result<()> {
        if self.crash_at.as_deref() == Some(point) {
            eprintln!("shareflow: crashing at fault point {point} (SHAREFLOW_CRASH_AT)");
            std::process::abort();
        }
        if shareflow_share::sync::lock(&self.armed).remove(point) {
            return Err(Error::Internal(format!("fault point {point} fired")));
        }
        Ok(())
    }
}
