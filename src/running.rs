//! Running a job from the command line, as `demo`, `run` and `dlq redrive` all do: to
//! its end with a progress display ([`run_job`]), stopped by SIGTERM or Ctrl-C
//! ([`stop_signal`]), with its metrics served when asked ([`metrics_endpoint`]).

use std::sync::Arc;
use std::time::Instant;

use shareflow_runtime::RuntimeError;

/// A progress sample, made when asked.
pub(crate) type ProgressLine =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<crate::progress::ProgressState>> + Send + 'static>>;

/// Runs `job` to its end, showing the sample `progress` makes every second if given (a
/// live bar on a terminal, plain lines elsewhere: [`crate::progress`]). Returns the
/// report and how many seconds the job ran.
pub(crate) async fn run_job(
    job: &shareflow_runtime::Job,
    progress: Option<impl Fn() -> ProgressLine + Send + 'static>,
) -> Result<(shareflow_runtime::JobReport, f64), Box<dyn std::error::Error + Send + Sync>> {
    let started = Instant::now();
    let display = progress.is_some().then(|| Arc::new(crate::progress::Display::for_stderr()));
    let printer = progress.zip(display.clone()).map(|(sample, display)| {
        let metrics = job.metrics_handle();
        tokio::spawn(async move {
            let mut sampler = crate::progress::Sampler::new();
            loop {
                tokio::time::sleep(display.interval()).await;
                if let Some(state) = sample().await {
                    let shared = sampler.sample(&metrics.snapshot(), state.done);
                    display.show(&state, &shared);
                }
            }
        })
    });
    let outcome = job.run().await;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(p) = printer {
        p.abort();
    }
    if let Some(d) = display {
        d.finish();
    }
    match outcome {
        Ok(r) => Ok((r, seconds)),
        Err(RuntimeError::RestartsExhausted { attempts, last }) => {
            Err(format!("the job failed {attempts} times; last error: {last}").into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Binds the metrics endpoint of `--metrics-addr`, if any, and says where it is.
pub(crate) async fn metrics_endpoint(
    addr: Option<&str>,
) -> Result<Option<shareflow::prometheus::MetricsServer>, shareflow::prometheus::MetricsError> {
    let Some(addr) = addr else { return Ok(None) };
    let server = shareflow::prometheus::MetricsServer::bind(addr).await?;
    eprintln!("metrics on http://{}/metrics", server.local_addr());
    Ok(Some(server))
}

/// Listens for SIGTERM from this call on (a SIGTERM before the returned future is first
/// polled, while a run still starts, is kept for it, not the default death); the future
/// returns on SIGTERM or Ctrl-C, never if neither can be listened for. Must be called
/// inside the runtime.
pub(crate) fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = term.recv() => return,
                r = tokio::signal::ctrl_c() => if r.is_ok() { return },
            }
        }
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
