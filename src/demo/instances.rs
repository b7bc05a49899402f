//! `demo --instances N`: N instances of the demo's job on one broker, one of them killed
//! and adopted.

use super::*;

/// One instance of `--instances N`: the demo's job as prefix `prefix`, checkpoints under
/// `{checkpoints}/{prefix}`; its sources run until it is stopped.
fn instance_job(
    broker: &EmbeddedBroker,
    checkpoints_url: &str,
    prefix: &str,
    group_config: &ShareConfig,
    options: &DemoOptions,
    restarts: u32,
) -> Result<(shareflow_runtime::Job, Arc<SourceMetrics>), Box<dyn std::error::Error + Send + Sync>> {
    let storage = CheckpointStore::from_url(checkpoints_url, &[], prefix)?;
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let metrics = Arc::new(SourceMetrics::default());
    let mut source_config = SourceSettings::new(GROUP, &[INPUT]);
    source_config.max_poll_records = 2_000;
    let job = pipeline(broker, Some(txns), source_config, group_config.clone(), options.parallelism, metrics.clone());
    let checkpoint_timeout = Duration::from_secs(3);
    let mut config = JobConfig::new(storage, GROUP, prefix)
        .checkpoint_interval(options.interval)
        .checkpoint_timeout(checkpoint_timeout)
        .restart(restart_strategy(restarts))
        .instance(shareflow_runtime::InstanceConfig::new(
            options.interval + checkpoint_timeout + Duration::from_secs(1),
        ));
    config.channel_capacity = 8;
    config.tolerable_checkpoint_failures = TOLERABLE_FAILURES;
    Ok((job.build(config)?, metrics))
}

/// What the schedule of `--instances N` does with one instance.
struct InstancePlan {
    prefix: String,
    role: &'static str,
    /// `(fault point, hits to let pass)`.
    crashes: Vec<(String, u32)>,
    restarts: u32,
}

/// An instance's job and its sources' metrics.
type InstanceJob = (shareflow_runtime::Job, Arc<SourceMetrics>);

/// How an instance's run ended.
type InstanceResult = shareflow_runtime::Result<shareflow_runtime::JobReport>;

/// `--instances N` (decision 0007): N instances of the job in this process, in one share
/// group, with the seeded crashes spread over instances 2..N (which restart); instance 1
/// dies for good at a manifest and must be adopted; one more instance joins late. A
/// watcher stops every live instance once all input is done and no dead instance holds
/// an undecided transaction; a last instance joins to adopt what died too late for the
/// others. Then the output is checked from outside.
pub(super) async fn run_instances(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    dir: &Path,
    group_config: ShareConfig,
    total: u64,
) -> Result<DemoSummary, Box<dyn std::error::Error + Send + Sync>> {
    let checkpoints_url =
        options.checkpoints.clone().unwrap_or_else(|| format!("file://{}", dir.join("checkpoints").display()));
    let plans = plan_instances(options);
    let mut jobs = Vec::new();
    for p in &plans {
        let (job, metrics) = instance_job(broker, &checkpoints_url, &p.prefix, &group_config, options, p.restarts)?;
        job.failpoints().schedule(p.crashes.clone());
        jobs.push((job, metrics));
    }
    let prefixes: Vec<&str> = plans.iter().map(|p| p.prefix.as_str()).collect();
    let started = Instant::now();
    let results = run_together(options, broker, &jobs, &prefixes, total).await;
    let mut seconds = started.elapsed().as_secs_f64();
    let mut summaries = instance_summaries(&plans, &jobs, &results);
    // Whatever died after the others were told to stop is adopted by one more instance.
    let mut late_cost = CrashCost::default();
    let dead = |i: usize| results.get(i).is_none_or(|r| r.is_err());
    if orphaned(&prefixes, &broker.transactions().await?, &dead) {
        let (summary, cost) =
            adopt_the_last(options, broker, &checkpoints_url, &group_config, &prefixes, &dead).await?;
        late_cost = cost;
        summaries.push(summary);
        seconds = started.elapsed().as_secs_f64();
    }
    check_and_summarise(broker, &plans, &jobs, summaries, late_cost, total, seconds).await
}

/// The plan of `--instances N`: instance 1 dies for good at a manifest after a seeded
/// number of them, the crash schedule (`--crash-at`, or the seed's) is spread over
/// instances 2..N, and instance N + 1 joins late.
fn plan_instances(options: &DemoOptions) -> Vec<InstancePlan> {
    let n = options.instances as usize;
    let schedule: Vec<(String, u32)> = match &options.schedule {
        Some(s) => s.clone(),
        None => crash_schedule(options.seed, options.crashes).into_iter().map(|(p, s)| (p.to_string(), s)).collect(),
    };
    let mut seed = options.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut plans: Vec<InstancePlan> = Vec::new();
    let doomed_skip = (next(&mut seed) % 3) as u32 + 1;
    plans.push(InstancePlan {
        prefix: "demo-1".into(),
        role: "dies for good",
        crashes: vec![(runtime_points::AFTER_MANIFEST.to_string(), doomed_skip)],
        restarts: 0,
    });
    for i in 2..=n {
        let mine: Vec<(String, u32)> =
            schedule.iter().enumerate().filter(|(k, _)| k % (n - 1) == i - 2).map(|(_, c)| c.clone()).collect();
        let role = if mine.is_empty() { "steady" } else { "crashes and restarts" };
        let restarts = mine.len() as u32 + 3;
        plans.push(InstancePlan { prefix: format!("demo-{i}"), role, crashes: mine, restarts });
    }
    plans.push(InstancePlan {
        prefix: format!("demo-{}", n + 1),
        role: "joins late",
        crashes: Vec::new(),
        restarts: 3,
    });
    plans
}

/// Whether `open` holds an undecided transaction of an instance that is `dead`, or of
/// none of the instances (`prefixes`, in the order of their jobs).
fn orphaned(
    prefixes: &[&str],
    open: &[shareflow_connector::broker::TransactionInfo],
    dead: &dyn Fn(usize) -> bool,
) -> bool {
    open.iter()
        .filter(|t| t.state.is_pending())
        .any(|t| prefixes.iter().position(|p| *p == t.id.prefix()).is_none_or(&dead))
}

/// Runs the instances' `jobs` at once, the last of them joining late. A watcher prints
/// progress and stops every live instance once all `total` input records are done and
/// no dead instance holds an undecided transaction, or as soon as every instance ended.
/// Returns how each run ended, in the order of `jobs`.
async fn run_together(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    jobs: &[InstanceJob],
    prefixes: &[&str],
    total: u64,
) -> Vec<InstanceResult> {
    let n = options.instances as usize;
    let stops: Vec<_> = jobs.iter().map(|(j, _)| j.stop_handle()).collect();
    let ended: Vec<std::sync::atomic::AtomicBool> = jobs.iter().map(|_| Default::default()).collect();
    let join_after = options.interval * 4;
    let runs = futures::future::join_all(jobs.iter().zip(&ended).enumerate().map(|(i, ((job, _), ended))| {
        let late = i == n;
        async move {
            if late {
                tokio::time::sleep(join_after).await;
            }
            let r = job.run().await;
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        }
    }));
    let watcher = async {
        let mut printed = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Every instance ended (all of them failed): nothing will make progress.
            if ended.iter().all(|e| e.load(std::sync::atomic::Ordering::SeqCst)) {
                break;
            }
            let Ok(b) = broker.backlog(GROUP, INPUT).await else { continue };
            if b.acknowledged + b.archived < total {
                if options.progress && printed.elapsed() >= Duration::from_secs(1) {
                    printed = Instant::now();
                    eprintln!(
                        "progress: {:>6.1}% done",
                        100.0 * (b.acknowledged + b.archived) as f64 / total.max(1) as f64
                    );
                }
                continue;
            }
            let Ok(open) = broker.transactions().await else { continue };
            if !orphaned(prefixes, &open, &|i| ended[i].load(std::sync::atomic::Ordering::SeqCst)) {
                break;
            }
        }
        for s in &stops {
            s.stop();
        }
    };
    let (results, ()) = tokio::join!(runs, watcher);
    results
}

/// What each planned instance did, from its job and how its run ended.
fn instance_summaries(
    plans: &[InstancePlan],
    jobs: &[InstanceJob],
    results: &[InstanceResult],
) -> Vec<InstanceSummary> {
    let mut summaries = Vec::new();
    for ((plan, (job, metrics)), result) in plans.iter().zip(jobs).zip(results) {
        let (attempts, adoptions, outcome) = match result {
            Ok(r) => (r.attempts, r.metrics.checkpoints.instances_adopted, "stopped".to_string()),
            // A run that failed used every attempt its restart strategy allowed.
            Err(e) => (plan.restarts + 1, job.metrics().checkpoints.instances_adopted, e.to_string()),
        };
        summaries.push(InstanceSummary {
            prefix: plan.prefix.clone(),
            role: plan.role,
            records_emitted: metrics.records_emitted.load(std::sync::atomic::Ordering::Relaxed),
            crashes: job.failpoints().fired().len(),
            attempts,
            adoptions,
            outcome,
        });
    }
    summaries
}

/// Runs one more instance, `demo-{N + 2}`, until no instance that is `dead` holds an
/// undecided transaction any more (60 s at most), so that it adopts what died after the
/// others were told to stop. Returns what it did and its crash cost.
async fn adopt_the_last(
    options: &DemoOptions,
    broker: &EmbeddedBroker,
    checkpoints_url: &str,
    group_config: &ShareConfig,
    prefixes: &[&str],
    dead: &impl Fn(usize) -> bool,
) -> Result<(InstanceSummary, CrashCost), Box<dyn std::error::Error + Send + Sync>> {
    let n = options.instances as usize;
    let prefix = format!("demo-{}", n + 2);
    let (job, metrics) = instance_job(broker, checkpoints_url, &prefix, group_config, options, 3)?;
    let stop = job.stop_handle();
    let (report, ()) = tokio::join!(job.run(), async {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if broker.transactions().await.is_ok_and(|open| !orphaned(prefixes, &open, dead)) {
                break;
            }
        }
        stop.stop();
    });
    let report = report?;
    let late_cost = CrashCost::of(&job, &metrics);
    let summary = InstanceSummary {
        prefix,
        role: "joins to adopt the last",
        records_emitted: metrics.records_emitted.load(std::sync::atomic::Ordering::Relaxed),
        crashes: 0,
        attempts: report.attempts,
        adoptions: report.metrics.checkpoints.instances_adopted,
        outcome: "stopped".into(),
    };
    Ok((summary, late_cost))
}

/// Checks the output from outside against the `total` input records and sums the run
/// up: the instances' `summaries`, their crashes and checkpoints, the crash cost of
/// `jobs` on top of `late_cost`, and the `seconds` it took.
async fn check_and_summarise(
    broker: &EmbeddedBroker,
    plans: &[InstancePlan],
    jobs: &[InstanceJob],
    summaries: Vec<InstanceSummary>,
    late_cost: CrashCost,
    total: u64,
    seconds: f64,
) -> Result<DemoSummary, Box<dyn std::error::Error + Send + Sync>> {
    let mut check: ExactlyOnceReport = check_exactly_once(broker, GROUP, INPUT, OUTPUT, identity).await?;
    if check.produced != total {
        check.violations.push(format!("the input topic holds {} records, not {total}", check.produced));
    }
    let broker_metrics = broker.metrics().await?;
    let fired: Vec<String> = jobs.iter().flat_map(|(j, _)| j.failpoints().fired()).collect();
    let crash_cost = jobs.iter().fold(late_cost, |sum, (j, m)| sum.add(CrashCost::of(j, m)));
    let all = jobs.iter().map(|(j, _)| j.metrics().checkpoints);
    let (completed, aborted, recovered) =
        all.fold((0, 0, 0), |(c, a, r), m| (c + m.completed, a + m.aborted, r + m.transactions_recovered));
    Ok(DemoSummary {
        records_produced: check.produced,
        records_committed: check.committed_output,
        duplicates: check.duplicates,
        lost: check.lost,
        archived: check.archived.values().sum(),
        crashes: fired.len(),
        crashes_scheduled: plans.iter().map(|p| p.crashes.len()).sum(),
        crash_points: fired,
        checkpoints_completed: completed,
        checkpoints_aborted: aborted,
        transactions_committed: broker_metrics.transaction_commit_total,
        transactions_aborted: broker_metrics.transaction_abort_total,
        transactions_recovered: recovered,
        attempts: summaries.iter().map(|s| s.attempts).sum(),
        crash_cost,
        resumed: false,
        records_per_second: total as f64 / seconds,
        processed_seconds: None,
        seconds,
        violations: check.violations,
        instances: summaries,
        stopped: false,
        left_for_resume: 0,
    })
}
