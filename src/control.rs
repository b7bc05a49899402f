//! Control of a running job over its HTTP endpoint (beside `/metrics` and the
//! dashboard): `POST /api/savepoint?name=N` takes a savepoint and lets the job go on;
//! with `&stop=true` it stops the job gracefully with a savepoint of its final
//! checkpoint. `POST /api/stop` stops it without one. `shareflow savepoint` and
//! `shareflow stop` call them. SIGUSR1 takes a savepoint too ([`savepoint_on_signal`]).

use std::sync::Arc;

use hyper::{Method, StatusCode};
use shareflow_runtime::{Job, SavepointHandle, StopHandle};

use crate::prometheus::{MetricsServer, Route, WebRequest, WebResponse};

/// The answer to `POST /api/savepoint`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SavepointTaken {
    /// Its name.
    pub name: String,
    /// The checkpoint it copies.
    pub checkpoint_id: u64,
    /// Where it is: give it to `shareflow run --from-savepoint`.
    pub url: String,
    /// Whether the job stopped with it.
    pub stopped: bool,
}

/// Serves `/api/savepoint` and `/api/stop` for `job`, whose checkpoints are under
/// `checkpoints` (a URL).
pub fn serve(server: &MetricsServer, job: &Job, checkpoints: &str) {
    let (savepoints, stop, checkpoints) = (job.savepoint_handle(), job.stop_handle(), checkpoints.to_string());
    let route: Route = Arc::new(move |req: WebRequest| {
        let (savepoints, stop, checkpoints) = (savepoints.clone(), stop.clone(), checkpoints.clone());
        Box::pin(async move { control(req, &savepoints, &stop, &checkpoints).await })
    });
    server.route("/api/savepoint", route.clone());
    server.route("/api/stop", route);
}

/// Takes a savepoint of `job` (checkpoints under the URL `checkpoints`) on each
/// SIGUSR1, named `savepoint-{unix ms}`, and says on stderr where it is or why it
/// failed; the job goes on. Stops listening when the returned task is aborted. Must be
/// called inside the runtime; does nothing where there are no such signals.
pub fn savepoint_on_signal(job: &Job, checkpoints: &str) -> tokio::task::JoinHandle<()> {
    let (savepoints, root) = (job.savepoint_handle(), checkpoints.to_string());
    #[cfg(unix)]
    let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1());
    tokio::spawn(async move {
        #[cfg(unix)]
        match signal {
            Ok(mut signal) => {
                while signal.recv().await.is_some() {
                    let name = format!("savepoint-{}", shareflow_checkpoint::now_ms());
                    match savepoints.take(&name).await {
                        Ok(s) => eprintln!(
                            "savepoint {name} of checkpoint {} taken: {}",
                            s.checkpoint_id,
                            savepoint_url(&root, &s.path)
                        ),
                        Err(e) => eprintln!("savepoint {name} (asked for by SIGUSR1) failed: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGUSR1: no savepoints by signal"),
        }
        #[cfg(not(unix))]
        let _ = (savepoints, root);
    })
}

async fn control(req: WebRequest, savepoints: &SavepointHandle, stop: &StopHandle, root: &str) -> WebResponse {
    if req.method != Method::POST {
        return WebResponse::text(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST /api/savepoint?name=N[&stop=true], POST /api/stop\n",
        );
    }
    if req.path == "/api/stop" {
        stop.stop();
        #[derive(serde::Serialize)]
        struct Stopping {
            stopping: bool,
        }
        return WebResponse::json(&Stopping { stopping: true });
    }
    let name = match req.param("name") {
        Some(n) => n.to_string(),
        None => format!("savepoint-{}", shareflow_checkpoint::now_ms()),
    };
    let stopping = req.param("stop").is_some_and(|s| s == "true" || s == "1");
    let taken = if stopping { savepoints.stop_with(&name).await } else { savepoints.take(&name).await };
    match taken {
        Ok(s) => WebResponse::json(&SavepointTaken {
            url: savepoint_url(root, &s.path),
            name: s.name,
            checkpoint_id: s.checkpoint_id,
            stopped: stopping,
        }),
        Err(e) => WebResponse::text(StatusCode::SERVICE_UNAVAILABLE, format!("savepoint {name} failed: {e}\n")),
    }
}

/// The URL of `path` (as the checkpoint store of the root `root` names it) in that
/// store. A `file://` store is rooted at the root's directory, so its paths are
/// relative to it; the others are rooted at the bucket, so their paths hold the root's.
pub fn savepoint_url(root: &str, path: &str) -> String {
    match root.split_once("://") {
        Some(("file", _)) => format!("{}/{path}", root.trim_end_matches('/')),
        Some((scheme, rest)) => {
            let authority = rest.split('/').next().unwrap_or_default();
            format!("{scheme}://{authority}/{path}")
        }
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_savepoint_url_keeps_the_roots_scheme_and_bucket() {
        let rows = [
            ("file:///tmp/c", "job/savepoints/s", "file:///tmp/c/job/savepoints/s"),
            ("file:///tmp/c/", "job/savepoints/s", "file:///tmp/c/job/savepoints/s"),
            ("memory://m/c", "c/job/savepoints/s", "memory://m/c/job/savepoints/s"),
            ("s3://bucket/base", "base/job/savepoints/s", "s3://bucket/base/job/savepoints/s"),
            ("s3://bucket", "job/savepoints/s", "s3://bucket/job/savepoints/s"),
        ];
        for (root, path, want) in rows {
            assert_eq!(savepoint_url(root, path), want, "{root} {path}");
        }
    }
}
