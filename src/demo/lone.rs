//! `demo` with one lone job: built with the seeded crash schedule, run to its end (or
//! until a signal stops it), then checked from outside and summed up.

use shareflow_runtime::{Job, JobReport};

use super::*;
use crate::running::{run_job, stop_signal, ProgressLine};

/// The lone job of a demo run on `broker`, whose input topic holds `input`: builds it,
/// serves its metrics at `endpoint` if any, runs it with the crash schedule armed, checks
/// the output and sums the run up.
pub(super) async fn run_lone(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    dir: &Path,
    group_config: ShareConfig,
    input: &DemoInput,
    endpoint: Option<&shareflow::prometheus::MetricsServer>,
) -> Result<DemoSummary, Box<dyn std::error::Error + Send + Sync>> {
    let (job, metrics, schedule) = build_job(options, broker, dir, group_config, input)?;
    if let Some(server) = endpoint {
        serve_metrics(server, &job, &metrics, broker);
    }
    let progress = options.progress.then(|| progress_sampler(broker.clone(), input.records));
    let (report, seconds, processed, stopped) = run_to_end(&job, progress, input.records).await?;
    let (check, left) = check_output(options, broker, input, stopped).await?;
    let broker_metrics = broker.metrics().await?;
    let fired = job.failpoints().fired();
    let crash_cost = CrashCost::of(&job, &metrics);
    // The sink's count is of rows, not records: it stands for the input only when each
    // record went through once (no restart, no redelivery, the whole input in this run).
    let once = report.attempts == 1 && !options.resume && !stopped && crash_cost.records_emitted == input.records;
    Ok(DemoSummary {
        records_produced: check.produced,
        records_committed: check.committed_output,
        duplicates: check.duplicates,
        lost: check.lost,
        archived: check.archived.values().sum(),
        crashes: fired.len(),
        crashes_scheduled: schedule.len(),
        crash_points: fired,
        checkpoints_completed: report.metrics.checkpoints.completed,
        checkpoints_aborted: report.metrics.checkpoints.aborted,
        transactions_committed: broker_metrics.transaction_commit_total,
        transactions_aborted: broker_metrics.transaction_abort_total,
        transactions_recovered: report.metrics.checkpoints.transactions_recovered,
        attempts: report.attempts,
        crash_cost,
        resumed: options.resume,
        records_per_second: input.records as f64 / seconds,
        processed_seconds: processed.filter(|_| once),
        seconds,
        violations: check.violations,
        instances: Vec::new(),
        stopped,
        left_for_resume: left,
    })
}

/// The lone job, its sources' metrics and its crash schedule (fault point, hit).
type BuiltJob = (Job, Arc<SourceMetrics>, Vec<(String, u32)>);

/// Builds the lone job: checkpoints at `--checkpoints` (by default under `dir`), the
/// broker's transactions in exactly-once mode, and the crash schedule (`--crash-at`, or
/// the seed's) armed. Returns the job, its sources' metrics and the schedule.
fn build_job(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    dir: &Path,
    group_config: ShareConfig,
    input: &DemoInput,
) -> Result<BuiltJob, Box<dyn std::error::Error + Send + Sync>> {
    let transactional = input.mode == AcknowledgementMode::Transactional;
    let checkpoints_url =
        options.checkpoints.clone().unwrap_or_else(|| format!("file://{}", dir.join("checkpoints").display()));
    let storage = CheckpointStore::from_url(&checkpoints_url, &[], "demo")?;
    let txns = transactional.then(|| BrokerTransactions::new(broker.clone(), Duration::from_secs(60)));
    let metrics = Arc::new(SourceMetrics::default());
    let mut source_config = SourceSettings::new(GROUP, &[INPUT]);
    source_config.stop_when_drained = true;
    source_config.max_poll_records = 2_000;
    let job = pipeline(broker, txns.clone(), source_config, group_config, options.parallelism, metrics.clone());
    let schedule: Vec<(String, u32)> = match &options.schedule {
        Some(s) => s.clone(),
        None => crash_schedule(options.seed, options.crashes).into_iter().map(|(p, s)| (p.to_string(), s)).collect(),
    };
    let mut config = JobConfig::new(storage, GROUP, "demo")
        .checkpoint_interval(options.interval)
        .restart(restart_strategy(schedule.len() as u32 + 3));
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = TOLERABLE_FAILURES;
    let job = job.build(config)?;
    job.failpoints().schedule(schedule.clone());
    Ok((job, metrics, schedule))
}

/// Serves the metrics of `job`, of its sources and of `broker` at `server`, and the
/// job's dashboard.
fn serve_metrics(
    server: &shareflow::prometheus::MetricsServer,
    job: &Job,
    metrics: &Arc<SourceMetrics>,
    broker: &EmbeddedBroker,
) {
    server.add(shareflow::prometheus::job_source(job));
    shareflow::dashboard::Dashboard::new(job).with_embedded_broker(broker, &[INPUT]).serve(server);
    let source = metrics.clone();
    server.add(shareflow::prometheus::source(move || source.metrics()));
    let b = broker.clone();
    server.add(Arc::new(move || {
        let b = b.clone();
        Box::pin(async move { b.metrics().await.map(|m| m.metrics()).unwrap_or_default() })
    }));
}

/// The lone job's progress sample: how much of the `total` input records the group has
/// acknowledged or archived, and how many are locked in open checkpoints.
fn progress_sampler(broker: EmbeddedBroker, total: u64) -> impl Fn() -> ProgressLine + Send + 'static {
    move || -> ProgressLine {
        let broker = broker.clone();
        Box::pin(async move {
            let b = broker.backlog(GROUP, INPUT).await.ok()?;
            let done = b.acknowledged + b.archived;
            Some(crate::progress::ProgressState {
                done,
                total: Some(total),
                lag: Some(total.saturating_sub(done + b.locked)),
                line: format!(
                    "progress: {:>6.1}% done ({} acknowledged, {} locked in open checkpoints)",
                    100.0 * done as f64 / total.max(1) as f64,
                    b.acknowledged,
                    b.locked
                ),
            })
        })
    }
}

/// Runs `job` to its end, showing `progress` if given, or until SIGTERM or Ctrl-C stops
/// it. Returns the report, the seconds the job ran, the seconds until the sink had
/// received all `total` input records (if it did), and whether a signal stopped it.
async fn run_to_end(
    job: &Job,
    progress: Option<impl Fn() -> ProgressLine + Send + 'static>,
    total: u64,
) -> Result<(JobReport, f64, Option<f64>, bool), Box<dyn std::error::Error + Send + Sync>> {
    // SIGTERM or Ctrl-C stops the job gracefully: a final checkpoint, commit, close.
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on_signal = tokio::spawn({
        let (stop, stopped) = (job.stop_handle(), stopped.clone());
        async move {
            stop_signal().await;
            stopped.store(true, std::sync::atomic::Ordering::SeqCst);
            stop.stop();
        }
    });
    // run_job starts its own clock just after this one, so the time to the sink's last
    // batch is capped at the run's below.
    let started = Instant::now();
    let outcome = run_job(job, progress).await;
    on_signal.abort();
    let (report, seconds) = outcome?;
    // When the sink's last batch came in, if it took in the whole input.
    let sink = job.metrics().operators.get(SINK).copied().unwrap_or_default();
    let processed = (sink.rows_in >= total)
        .then_some(sink.last_input)
        .flatten()
        .map(|last| last.saturating_duration_since(started).as_secs_f64().min(seconds));
    let stopped = stopped.load(std::sync::atomic::Ordering::SeqCst);
    Ok((report, seconds, processed, stopped))
}

/// The independent check of the run: the output topic read_committed, and every
/// share-partition state, against the whole `input`. What a run a signal `stopped` had
/// not reached is left for `--resume`, not lost; returns the report and how many records
/// that was.
async fn check_output(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    input: &DemoInput,
    stopped: bool,
) -> Result<(ExactlyOnceReport, u64), Box<dyn std::error::Error + Send + Sync>> {
    let mut left = 0;
    // Independent check: the output topic read_committed, and every share-partition state.
    // The peak starts again from here (`5` to clear_refs resets VmHWM on Linux), so that
    // the job's own peak does not count as the check's.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (before, started) = (memory_kib("VmRSS"), std::time::Instant::now());
    let mut check: ExactlyOnceReport = check_exactly_once(broker, GROUP, INPUT, OUTPUT, identity).await?;
    if options.progress {
        // The peak during the check, less the resident memory before it: what the check
        // took, and on a kernel without clear_refs an upper bound (the job's own peak
        // may be the higher one).
        let grew = memory_kib("VmHWM").zip(before).map(|(peak, before)| peak.saturating_sub(before) / 1024);
        eprintln!(
            "checked {} input records in {:.1} s; at most {} MiB of memory for the check (the peak, less what \
             the process held before it)",
            check.produced,
            started.elapsed().as_secs_f64(),
            grew.map_or("unknown".to_string(), |m| m.to_string())
        );
    }
    if stopped {
        // What a stopped run had not reached is AVAILABLE for `--resume`; anything else
        // (a duplicate, a record left LOCKED, an undecided transaction) still counts.
        left = check.leave_available();
        if options.progress {
            eprintln!("stopped by a signal after a final checkpoint; `shareflow demo --resume` finishes the run");
        }
    }
    if check.produced != input.records {
        check.violations.push(format!(
            "the input topic holds {} records, not the {} the run started with",
            check.produced, input.records
        ));
    }
    Ok((check, left))
}

/// A `kB` line of /proc/self/status (`VmRSS`, `VmHWM`), if the system has one.
fn memory_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()
}
