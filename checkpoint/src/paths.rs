//! [`CheckpointPaths`]: the one place that builds and parses every object key.
//!
//! ```text
//! {root}/{job}/chk-{n:020}/_shared.state
//! {root}/{job}/chk-{n:020}/{operator}-{subtask}.state   (a state of its own, part 0)
//! {root}/{job}/chk-{n:020}/{operator}-{subtask}.p{k}.state   (part k > 0 of a large state)
//! {root}/{job}/chk-{n:020}/_metadata
//! {root}/{job}/chk-{n:020}/_aborted
//! {root}/{job}/savepoints/{name}/{operator}-{subtask}.state
//! {root}/{job}/savepoints/{name}/_metadata
//! ```
//!
//! Checkpoint ids are zero-padded to 20 digits so LIST order is numeric order.

use object_store::path::Path;

use crate::error::{CheckpointError, Result};
use crate::CheckpointId;

/// File name of a manifest.
pub const MANIFEST_NAME: &str = "_metadata";

/// File name of a checkpoint's shared state object: every operator subtask's state
/// that the manifest does not inline, each in its own envelope, one after another; the
/// manifest (version 2) holds each one's offset, size and CRC. One PUT per checkpoint
/// instead of one per subtask. Never an operator's file name, which always ends in
/// `-{subtask}.state`.
pub const SHARED_STATE_NAME: &str = "_shared.state";

/// File name of the tombstone recovery writes before it aborts a checkpoint's
/// transactions: a manifest that appears later (written by a fenced, paused incarnation)
/// is never restored.
pub const ABORTED_NAME: &str = "_aborted";

/// Builds the keys of one job's checkpoints and savepoints.
///
/// ```
/// use shareflow_checkpoint::CheckpointPaths;
///
/// let paths = CheckpointPaths::new("checkpoints", "orders").unwrap();
/// assert_eq!(paths.manifest(7).as_ref(), "checkpoints/orders/chk-00000000000000000007/_metadata");
/// assert_eq!(
///     paths.state_file(7, "source", 1).unwrap().as_ref(),
///     "checkpoints/orders/chk-00000000000000000007/source-1.state"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPaths {
    root: Path,
    job: Path,
    job_id: String,
}

/// What a key under a job's prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointKey {
    /// A checkpoint's manifest.
    Manifest {
        /// Checkpoint id.
        checkpoint_id: CheckpointId,
    },
    /// A checkpoint's state file.
    State {
        /// Checkpoint id.
        checkpoint_id: CheckpointId,
        /// Operator name.
        operator: String,
        /// Subtask index.
        subtask: u32,
        /// Part index: a state larger than the store's part limit is split into parts.
        part: u32,
    },
    /// A checkpoint's shared state object ([`SHARED_STATE_NAME`]).
    SharedState {
        /// Checkpoint id.
        checkpoint_id: CheckpointId,
    },
    /// A checkpoint's tombstone: recovery aborted its transactions.
    Aborted {
        /// Checkpoint id.
        checkpoint_id: CheckpointId,
    },
    /// Anything under a savepoint.
    Savepoint {
        /// Savepoint name.
        name: String,
    },
    /// Something shareflow did not write.
    Unknown,
}

fn check_name(what: &'static str, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("must not be empty".to_string())
    } else if name.len() > 200 {
        Some("must be at most 200 bytes".to_string())
    } else if name == "." || name == ".." {
        Some("must not be . or ..".to_string())
    } else {
        name.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._-".contains(*c)))
            .map(|c| format!("contains {c:?}; only [A-Za-z0-9._-] is allowed"))
    };
    match reason {
        Some(reason) => Err(CheckpointError::InvalidName { what, name: name.to_string(), reason }),
        None => Ok(()),
    }
}

impl CheckpointPaths {
    /// Paths for `job_id` under `root` (a prefix inside the store; may be empty).
    pub fn new(root: impl Into<Path>, job_id: &str) -> Result<Self> {
        check_name("job id", job_id)?;
        if job_id.starts_with('_') {
            return Err(CheckpointError::InvalidName {
                what: "job id",
                name: job_id.to_string(),
                reason: "must not start with _ (names like _instances are shareflow's own)".into(),
            });
        }
        let root = root.into();
        Ok(Self { job: root.clone().join(job_id), root, job_id: job_id.to_string() })
    }

    /// The root every job's prefix is under (shared by the instances of a group).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The paths of another job under the same root: another instance of the group.
    pub fn sibling(&self, job_id: &str) -> Result<Self> {
        Self::new(self.root.clone(), job_id)
    }

    /// The job id.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The prefix that holds everything of the job.
    pub(crate) fn job_prefix(&self) -> &Path {
        &self.job
    }

    /// The directory of checkpoint `n`.
    pub fn checkpoint_dir(&self, checkpoint_id: CheckpointId) -> Path {
        self.job.clone().join(format!("chk-{checkpoint_id:020}"))
    }

    /// The manifest of checkpoint `n`: its commit decision.
    pub fn manifest(&self, checkpoint_id: CheckpointId) -> Path {
        self.checkpoint_dir(checkpoint_id).join(MANIFEST_NAME)
    }

    /// The tombstone of checkpoint `n` ([`ABORTED_NAME`]).
    pub(crate) fn aborted_marker(&self, checkpoint_id: CheckpointId) -> Path {
        self.checkpoint_dir(checkpoint_id).join(ABORTED_NAME)
    }

    /// File name of an operator subtask's state, without its directory.
    pub fn state_file_name(operator: &str, subtask: u32) -> Result<String> {
        check_name("operator", operator)?;
        Ok(format!("{operator}-{subtask}.state"))
    }

    /// File name of part `part` of an operator subtask's state: part 0 is
    /// [`state_file_name`](Self::state_file_name), part k > 0 is
    /// `{operator}-{subtask}.p{k}.state`.
    pub fn state_part_name(operator: &str, subtask: u32, part: u32) -> Result<String> {
        check_name("operator", operator)?;
        Ok(match part {
            0 => format!("{operator}-{subtask}.state"),
            k => format!("{operator}-{subtask}.p{k}.state"),
        })
    }

    /// The state of one operator subtask in checkpoint `n`.
    pub fn state_file(&self, checkpoint_id: CheckpointId, operator: &str, subtask: u32) -> Result<Path> {
        self.state_part(checkpoint_id, operator, subtask, 0)
    }

    /// Part `part` of the state of one operator subtask in checkpoint `n`.
    pub fn state_part(&self, checkpoint_id: CheckpointId, operator: &str, subtask: u32, part: u32) -> Result<Path> {
        Ok(self.checkpoint_dir(checkpoint_id).join(Self::state_part_name(operator, subtask, part)?))
    }

    /// The shared state object of checkpoint `n` ([`SHARED_STATE_NAME`]).
    pub fn shared_state(&self, checkpoint_id: CheckpointId) -> Path {
        self.checkpoint_dir(checkpoint_id).join(SHARED_STATE_NAME)
    }

    /// The prefix of all savepoints.
    pub(crate) fn savepoints(&self) -> Path {
        self.job.clone().join("savepoints")
    }

    /// The directory of savepoint `name`.
    pub(crate) fn savepoint_dir(&self, name: &str) -> Result<Path> {
        check_name("savepoint name", name)?;
        Ok(self.savepoints().join(name))
    }

    /// Classifies a key found under [`job_prefix`](Self::job_prefix).
    pub fn parse(&self, path: &Path) -> CheckpointKey {
        let Some(mut parts) = path.prefix_match(&self.job) else { return CheckpointKey::Unknown };
        let (Some(dir), Some(file), None) = (parts.next(), parts.next(), parts.next()) else {
            return match (path.prefix_match(&self.savepoints()).and_then(|mut p| p.next()), ()) {
                (Some(name), ()) => CheckpointKey::Savepoint { name: name.as_ref().to_string() },
                _ => CheckpointKey::Unknown,
            };
        };
        let Some(checkpoint_id) =
            dir.as_ref().strip_prefix("chk-").filter(|d| d.len() == 20).and_then(|d| d.parse().ok())
        else {
            return CheckpointKey::Unknown;
        };
        let file = file.as_ref();
        if file == MANIFEST_NAME {
            return CheckpointKey::Manifest { checkpoint_id };
        }
        if file == ABORTED_NAME {
            return CheckpointKey::Aborted { checkpoint_id };
        }
        if file == SHARED_STATE_NAME {
            return CheckpointKey::SharedState { checkpoint_id };
        }
        let Some((operator, tail)) = file.strip_suffix(".state").and_then(|f| f.rsplit_once('-')) else {
            return CheckpointKey::Unknown;
        };
        let (subtask, part) = match tail.split_once(".p") {
            Some((subtask, part)) => (subtask.parse().ok(), part.parse().ok().filter(|k| *k > 0)),
            None => (tail.parse().ok(), Some(0)),
        };
        match (subtask, part) {
            (Some(subtask), Some(part)) if !operator.is_empty() => {
                CheckpointKey::State { checkpoint_id, operator: operator.to_string(), subtask, part }
            }
            _ => CheckpointKey::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_share_the_root_and_underscore_names_are_reserved() {
        let p = CheckpointPaths::new("root/x", "a").unwrap();
        let b = p.sibling("b").unwrap();
        assert_eq!((b.root().as_ref(), b.job_prefix().as_ref()), ("root/x", "root/x/b"));
        let err = CheckpointPaths::new("root", "_instances").unwrap_err();
        assert!(err.to_string().contains("must not start with _"), "{err}");
        assert!(p.sibling("_x").is_err());
    }

    #[test]
    fn keys_round_trip_through_parse() {
        let p = CheckpointPaths::new("root/x", "job-1").unwrap();
        assert_eq!(p.parse(&p.manifest(42)), CheckpointKey::Manifest { checkpoint_id: 42 });
        assert_eq!(
            p.parse(&p.state_file(42, "share-source", 3).unwrap()),
            CheckpointKey::State { checkpoint_id: 42, operator: "share-source".into(), subtask: 3, part: 0 }
        );
        assert_eq!(
            p.parse(&p.state_part(42, "agg.v2", 3, 17).unwrap()),
            CheckpointKey::State { checkpoint_id: 42, operator: "agg.v2".into(), subtask: 3, part: 17 }
        );
        for odd in ["agg-3.p0.state", "agg-3.p.state", "agg-3.px.state", "agg-x.p1.state", "-3.state"] {
            let key = p.checkpoint_dir(42).join(odd);
            assert_eq!(p.parse(&key), CheckpointKey::Unknown, "{odd}");
        }
        let sp = p.savepoint_dir("before-upgrade").unwrap().join(MANIFEST_NAME);
        assert_eq!(p.parse(&sp), CheckpointKey::Savepoint { name: "before-upgrade".into() });
        assert_eq!(p.parse(&Path::from("root/x/job-1/chk-12/_metadata")), CheckpointKey::Unknown);
        assert_eq!(p.parse(&p.aborted_marker(12)), CheckpointKey::Aborted { checkpoint_id: 12 });
        assert_eq!(p.parse(&p.shared_state(12)), CheckpointKey::SharedState { checkpoint_id: 12 });
        // An operator may be called `_shared`: its files never take the shared object's name.
        assert_eq!(
            p.parse(&p.state_file(12, "_shared", 0).unwrap()),
            CheckpointKey::State { checkpoint_id: 12, operator: "_shared".into(), subtask: 0, part: 0 }
        );
        assert_eq!(p.parse(&Path::from("root/x/other/chk-00000000000000000001/_metadata")), CheckpointKey::Unknown);
    }

    #[test]
    fn zero_padding_keeps_list_order_numeric() {
        let p = CheckpointPaths::new("", "j").unwrap();
        let mut keys: Vec<String> = [10u64, 9, 100, 1].iter().map(|n| p.manifest(*n).to_string()).collect();
        keys.sort();
        let ids: Vec<u64> = keys
            .iter()
            .map(|k| match p.parse(&Path::from(k.as_str())) {
                CheckpointKey::Manifest { checkpoint_id } => checkpoint_id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec![1, 9, 10, 100]);
    }

    #[test]
    fn bad_names_are_refused_with_the_rule() {
        for (job, ok) in [("a/b", false), ("", false), ("..", false), ("job_1.x-y", true)] {
            assert_eq!(CheckpointPaths::new("r", job).is_ok(), ok, "{job}");
        }
        let p = CheckpointPaths::new("r", "j").unwrap();
        let err = p.state_file(1, "op/x", 0).unwrap_err();
        assert!(err.to_string().contains("operator") && err.to_string().contains("'/'"), "{err}");
        assert!(p.savepoint_dir("a b").is_err());
    }
}
