//! Savepoints of a running job, and a start from one.
//!
//! A savepoint is a copy of a complete checkpoint, under its own name, that retention
//! never deletes: its manifest and state files in one directory, named relative to it,
//! so that a copy elsewhere restores too. A [`SavepointHandle`] asks the running job
//! for one. The coordinator takes it from the first checkpoint that completes after the
//! request (with `at_stop`, from the final checkpoint of a graceful stop), before that
//! checkpoint can be collected.
//!
//! A job configured with [`JobConfig::from_savepoint`](crate::JobConfig::from_savepoint)
//! restores its operator and keyed state from the savepoint, redistributed over its
//! own parallelism, unless it has a complete checkpoint of its own taken after the
//! savepoint (a restart after it began). Its transactions are decided as always, from
//! its own checkpoints. A share group has no offsets to rewind: the input a savepoint
//! restores against is what the group has not acknowledged at the restart, which is
//! exactly the input after the savepoint only when it was taken with a stop.

use std::sync::{Arc, Mutex};

use shareflow_checkpoint::{CheckpointId, CheckpointStore};
use tokio::sync::oneshot;

use crate::error::{Result, RuntimeError};
use crate::failpoint::Failpoints;

/// The failpoint where the checkpoint a savepoint copies is complete and committed, and
/// nothing is copied yet.
pub const SAVEPOINT_BEFORE_COPY: &str = "savepoint.before_copy";
/// The failpoint between copying a savepoint's state files and writing its manifest.
pub const SAVEPOINT_MID: &str = "savepoint.mid";
/// The failpoint where the savepoint's manifest is written (it is complete) and the
/// request is not answered yet.
pub const SAVEPOINT_AFTER_MANIFEST: &str = "savepoint.after_manifest";
/// The failpoints of taking a savepoint, in the order it reaches them.
pub const SAVEPOINT_STEPS: &[&str] = &[SAVEPOINT_BEFORE_COPY, SAVEPOINT_MID, SAVEPOINT_AFTER_MANIFEST];

/// A savepoint the job took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Savepoint {
    /// Its name.
    pub name: String,
    /// The checkpoint it copies.
    pub checkpoint_id: CheckpointId,
    /// Its directory, under the checkpoint store's root.
    pub path: String,
}

/// One request waiting for a checkpoint.
struct Request {
    name: String,
    at_stop: bool,
    reply: oneshot::Sender<Result<Savepoint>>,
}

/// The requests of a job, shared by its handles and its coordinator; `ended` once the
/// job's run is over, when a request fails at once.
#[derive(Clone, Default)]
pub(crate) struct Requests(Arc<Mutex<(Vec<Request>, bool)>>);

impl Requests {
    /// Takes the requests checkpoint `n` serves (every one if it is the final
    /// checkpoint, else those not waiting for the stop) and copies it for each.
    /// An injected crash fails the attempt too, after the request is answered.
    pub(crate) async fn serve(
        &self,
        storage: &CheckpointStore,
        n: CheckpointId,
        is_final: bool,
        f: &Failpoints,
    ) -> Result<()> {
        let served: Vec<Request> = {
            let mut all = shareflow_checkpoint::sync::lock(&self.0);
            let (now, later): (Vec<Request>, Vec<Request>) = all.0.drain(..).partition(|r| is_final || !r.at_stop);
            all.0 = later;
            now
        };
        let mut crash = None;
        for r in served {
            let taken = take(storage, &r.name, n, f).await;
            if let Err(e) = &taken {
                tracing::warn!(savepoint = %r.name, checkpoint = n, error = %e, "a savepoint failed");
                if matches!(e, RuntimeError::InjectedCrash(_)) {
                    crash = Some(e.clone());
                }
            }
            let _ = r.reply.send(taken);
        }
        crash.map_or(Ok(()), Err)
    }

    /// The job runs: requests wait for its checkpoints.
    pub(crate) fn open(&self) {
        shareflow_checkpoint::sync::lock(&self.0).1 = false;
    }

    /// Fails every waiting request, and every later one: the job ended without a
    /// checkpoint for them.
    pub(crate) fn fail_all(&self) {
        let mut all = shareflow_checkpoint::sync::lock(&self.0);
        all.1 = true;
        for r in all.0.drain(..) {
            let _ = r.reply.send(Err(ended(&r.name)));
        }
    }
}

/// Copies checkpoint `n` to savepoint `name`.
async fn take(storage: &CheckpointStore, name: &str, n: CheckpointId, f: &Failpoints) -> Result<Savepoint> {
    let path = storage.savepoint_path(name)?.to_string();
    f.hit(SAVEPOINT_BEFORE_COPY)?;
    let manifest = storage.copy_savepoint_state(name, n).await?;
    f.hit(SAVEPOINT_MID)?;
    storage.publish_savepoint(name, &manifest).await?;
    f.hit(SAVEPOINT_AFTER_MANIFEST)?;
    Ok(Savepoint { name: name.to_string(), checkpoint_id: n, path })
}

/// Asks a running job for savepoints. Cheap to clone.
#[derive(Clone)]
pub struct SavepointHandle {
    pub(crate) requests: Requests,
    pub(crate) stop: crate::job::StopHandle,
}

impl std::fmt::Debug for SavepointHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavepointHandle").finish_non_exhaustive()
    }
}

impl SavepointHandle {
    /// A savepoint `name` of the first checkpoint that completes from now on; the job
    /// goes on. Fails if the job ends (or the copy fails) first.
    pub async fn take(&self, name: &str) -> Result<Savepoint> {
        self.request(name, false).await
    }

    /// Stops the job gracefully, with savepoint `name` of its final checkpoint: what a
    /// start from it needs, since nothing is acknowledged after it.
    pub async fn stop_with(&self, name: &str) -> Result<Savepoint> {
        let reply = self.enqueue(name, true);
        self.stop.stop();
        Self::wait(name, reply).await
    }

    async fn request(&self, name: &str, at_stop: bool) -> Result<Savepoint> {
        let reply = self.enqueue(name, at_stop);
        Self::wait(name, reply).await
    }

    fn enqueue(&self, name: &str, at_stop: bool) -> oneshot::Receiver<Result<Savepoint>> {
        let (tx, rx) = oneshot::channel();
        let mut all = shareflow_checkpoint::sync::lock(&self.requests.0);
        if all.1 {
            let _ = tx.send(Err(ended(name)));
        } else {
            all.0.push(Request { name: name.to_string(), at_stop, reply: tx });
        }
        rx
    }

    async fn wait(name: &str, reply: oneshot::Receiver<Result<Savepoint>>) -> Result<Savepoint> {
        reply.await.map_err(|_| ended(name))?
    }
}

/// The error of a savepoint asked of a job that has ended.
fn ended(name: &str) -> RuntimeError {
    RuntimeError::Cancelled(format!("savepoint {name}: the job ended before a checkpoint could serve it"))
}

/// Whether a start restores the savepoint taken at `savepoint_ms` rather than its own
/// newest complete checkpoint, taken at `own_ms` if there is one: the savepoint, unless
/// the job checkpointed after it (it started from the savepoint, then restarted).
pub fn restore_savepoint(savepoint_ms: u64, own_ms: Option<u64>) -> bool {
    own_ms.is_none_or(|own| own < savepoint_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_restores_the_savepoint_until_it_checkpointed_after_it() {
        // (savepoint taken at, own newest checkpoint taken at, restore the savepoint)
        let rows: &[(u64, Option<u64>, bool)] = &[
            (100, None, true),       // a fresh job
            (100, Some(50), true),   // the job's older checkpoints: the savepoint is newer
            (100, Some(100), false), // the checkpoint the savepoint copies, in its own job
            (100, Some(150), false), // checkpointed after the start from it: a restart
        ];
        for &(savepoint, own, want) in rows {
            assert_eq!(restore_savepoint(savepoint, own), want, "savepoint {savepoint}, own {own:?}");
        }
    }
}
