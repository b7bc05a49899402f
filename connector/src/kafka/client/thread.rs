//! [`ClientThread`]: a share consumer's Kafka client on a single-threaded runtime of its
//! own, so that what the consumer hands the client just before a fetch goes with that
//! fetch (decision 0026).
//!
//! The client's request manager is a task of the runtime the client lives on. On the
//! job's multi-threaded runtime it wakes on another thread at the first acknowledgement
//! passed to it, and sends what it has on its own before the poll says a fetch is
//! wanted: one ShareAcknowledge, and one share-state write on the broker, for each
//! fetch. Here the acknowledgements and the poll are one task of the client's thread,
//! which runs nothing else until the poll waits, and by then the fetch is wanted.

use std::future::Future;

use shareflow_share::{Error, ErrorKind, Result};

/// A thread running a current-thread Tokio runtime until the `ClientThread` is
/// dropped; the client's tasks (request managers, heartbeats, connections) die with it.
pub(crate) struct ClientThread {
    handle: tokio::runtime::Handle,
    /// Dropping it ends the thread's runtime.
    _stop: tokio::sync::oneshot::Sender<()>,
    group: String,
}

impl ClientThread {
    /// Starts the thread of a member of `group`.
    pub(crate) fn start(group: &str) -> Result<Self> {
        let failed = |e: std::io::Error| {
            Error::kafka(
                format!("start the client thread of a member of group {group}"),
                format!("{e}; the process is out of threads or memory"),
                ErrorKind::Unavailable,
            )
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // The runtime is built on its thread and never leaves it: dropped on the
        // caller's, inside the job's runtime, it would panic.
        let (started, start) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("shareflow-share-client".into())
            .spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => {
                    let _ = started.send(Ok(runtime.handle().clone()));
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                }
                Err(e) => {
                    let _ = started.send(Err(e));
                }
            })
            .map_err(failed)?;
        let handle = start
            .recv()
            .map_err(|_| failed(std::io::Error::other("the thread ended before its runtime started")))?
            .map_err(failed)?;
        Ok(Self { handle, _stop: stop, group: group.to_string() })
    }

    /// Starts `work` as a task of the client's thread.
    pub(crate) fn spawn<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.handle.spawn(work)
    }

    /// Runs `work` on the client's thread and waits for it. Cancel safe as far as
    /// `work` is: dropped, the call leaves `work` running to its end there.
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl Future<Output = T> + Send + 'static) -> Result<T> {
        let task = self.spawn(work);
        self.joined(task).await
    }

    /// Waits for `task`, a task of this thread.
    pub(crate) async fn joined<T>(
        &self,
        task: impl Future<Output = std::result::Result<T, tokio::task::JoinError>>,
    ) -> Result<T> {
        task.await.map_err(|e| {
            Error::kafka(
                format!("run the client of a member of group {}", self.group),
                format!("its task on the client thread ended without a result ({e}); restart the source"),
                ErrorKind::Internal,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_client_thread_and_a_panic_is_an_error() {
        let thread = ClientThread::start("g").unwrap();
        let here = std::thread::current().id();
        let there = thread.run(async { std::thread::current().id() }).await.unwrap();
        assert_ne!(here, there, "the work ran on the client's thread");
        let again = thread.run(async { std::thread::current().id() }).await.unwrap();
        assert_eq!(there, again, "always the same thread");
        let err = thread.run::<()>(async { panic!("boom") }).await.unwrap_err();
        assert!(err.to_string().contains("member of group g"), "{err}");
        assert!(thread.run(async { 7 }).await.unwrap() == 7, "the thread outlives a panicking task");
    }

    /// What the fetch relies on: a task the work wakes (the client's request manager)
    /// runs only once the work waits, and then sees everything the work did before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_woken_by_the_work_runs_only_once_the_work_waits() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let thread = ClientThread::start("g").unwrap();
        for round in 0..200 {
            let (wake, wanted) = (Arc::new(tokio::sync::Notify::new()), Arc::new(AtomicBool::new(false)));
            // The "manager": at its wake, is the fetch wanted yet?
            let manager = thread.spawn({
                let (wake, wanted) = (wake.clone(), wanted.clone());
                async move {
                    wake.notified().await;
                    wanted.load(Ordering::SeqCst)
                }
            });
            thread
                .run(async move {
                    // Acknowledgements wake the manager, one by one ...
                    for _ in 0..100 {
                        wake.notify_one();
                        std::hint::spin_loop();
                    }
                    // ... and only then does the poll say a fetch is wanted, and wait.
                    wanted.store(true, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                })
                .await
                .unwrap();
            let saw = thread.joined(manager).await.unwrap();
            assert!(saw, "round {round}: the manager planned before the fetch was wanted");
        }
    }
}
