//! The randomized campaign: seeded schedules of 1-3 crashes at random fault points (a
//! quarter of them with two more: `commit.before`, then `recovery.mid` in the recovery
//! that follows) plus random store faults, each run to quiescence and checked for I1-I5.
//! A failing seed prints the command that replays it.
//!
//! Every crash of a schedule is armed at once ([`Failpoints::schedule`]), so a crash at a
//! point the run no longer reaches does not hold back the others. The campaign prints how
//! many of the scheduled crashes fired, per fault point, and fails if fewer than
//! [`MIN_FIRED_PER_SCHEDULE`] fire per schedule on average (checked from 50 schedules on).
//!
//! `SHAREFLOW_SEED=n` runs one seed; `SHAREFLOW_CAMPAIGN_SEEDS=k` runs k (default 1000).
//!
//! [`Failpoints::schedule`]: shareflow::runtime::Failpoints::schedule

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use eos::*;
use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
use shareflow::runtime::failpoint::points;

/// The campaign fails if fewer crashes than this fire per schedule on average.
const MIN_FIRED_PER_SCHEDULE: f64 = 1.5;

#[path = "support/rng.rs"]
mod rng;

use rng::Rng;

/// What one schedule did.
struct Outcome {
    /// The points of the scheduled crashes.
    scheduled: Vec<String>,
    /// The points that fired, in order.
    fired: Vec<String>,
    /// Job attempts (restarts + 1).
    attempts: u32,
}

/// Runs one seeded schedule; returns a description of the failure, if any.
async fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut rng = Rng::new(seed);
    let records = 200 + rng.below(400);
    let partitions = 1 + rng.below(3) as u32;
    let broker = broker_with_input(records, partitions, &share_config()).await;
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new()), seed));
    let p = |rng: &mut Rng| (rng.below(4) as f64) / 100.0;
    store.inject(FaultRule { probability: p(&mut rng), ..FaultRule::always(StoreOp::Put, "", Fault::Error) });
    store.inject(FaultRule {
        probability: p(&mut rng),
        ..FaultRule::always(StoreOp::Put, "", Fault::AppliedThenTimeout)
    });
    store.inject(FaultRule { probability: p(&mut rng), ..FaultRule::always(StoreOp::Get, "", Fault::Error) });
    store.inject(FaultRule {
        probability: 0.1,
        ..FaultRule::always(StoreOp::Any, "", Fault::Latency(Duration::from_millis(1)))
    });
    let mut run = Run::new(broker, storage_on(store.clone() as Arc<dyn ObjectStore>, "c"));
    run.parallelism = 1 + rng.below(2) as u32;
    run.interval = Duration::from_millis(2 + rng.below(20));
    run.inline_limit = match rng.below(3) {
        0 => 0,
        1 => 16 * 1024,
        _ => shareflow::checkpoint::DEFAULT_INLINE_LIMIT,
    };
    run.restarts = 12;
    let mut crashes = Vec::new();
    let fault_points = demo::fault_points();
    for _ in 0..1 + rng.below(3) {
        let point = fault_points[rng.below(fault_points.len() as u64) as usize];
        // Checkpoint points come round once per checkpoint, and an attempt of these short
        // runs takes few: a higher skip would leave them unfired.
        let skip = if point.starts_with("source.") || point.starts_with("sink.") { rng.below(3) } else { rng.below(2) };
        crashes.push((point.to_string(), skip as u32));
    }
    if rng.below(4) == 0 {
        // recovery.mid after a crash that leaves decided work.
        crashes.push((points::COMMIT_BEFORE.to_string(), 0));
        crashes.push((points::RECOVERY_MID.to_string(), 0));
    }
    let schedule = format!(
        "records {records}, partitions {partitions}, parallelism {}, interval {:?}, crashes {crashes:?}",
        run.parallelism, run.interval
    );
    let scheduled = crashes.iter().map(|c| c.0.clone()).collect();
    let (job, _, _) = run.job();
    job.failpoints().schedule(crashes);
    let result = job.run().await;
    let fired = job.failpoints().fired();
    let attempts = match result {
        Ok(r) => r.attempts,
        Err(e) => {
            return Err(format!(
                "{schedule}: the job did not finish: {e} (fired {fired:?}, store faults {:?})",
                store.injected().len()
            ))
        }
    };
    let report = run.check().await;
    let archived: u64 = report.archived.values().sum();
    if !report.ok() || report.duplicates > 0 || report.lost > 0 || report.exactly_once + archived != records {
        return Err(format!(
            "{schedule}: fired {fired:?}: {} violations, first {:?}; duplicates {}, lost {}",
            report.violations.len(),
            report.violations.first(),
            report.duplicates,
            report.lost
        ));
    }
    Ok(Outcome { scheduled, fired, attempts })
}

#[tokio::test(start_paused = true)]
async fn campaign() {
    let seeds: Vec<u64> = match std::env::var("SHAREFLOW_SEED") {
        Ok(s) => vec![s.parse().expect("SHAREFLOW_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("SHAREFLOW_CAMPAIGN_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
            (1..=n).collect()
        }
    };
    // Per fault point: (scheduled, fired).
    let mut by_point = BTreeMap::<String, (usize, usize)>::new();
    let (mut scheduled, mut fired, mut restarts) = (0, 0, 0);
    let mut failures = Vec::new();
    for &seed in &seeds {
        match run_seed(seed).await {
            Ok(o) => {
                scheduled += o.scheduled.len();
                fired += o.fired.len();
                restarts += o.attempts as usize - 1;
                for p in o.scheduled {
                    by_point.entry(p).or_default().0 += 1;
                }
                for p in o.fired {
                    by_point.entry(p).or_default().1 += 1;
                }
            }
            Err(why) => {
                eprintln!("seed {seed} failed: {why}\n  replay: SHAREFLOW_SEED={seed} cargo test --test eos_campaign -- --nocapture");
                failures.push(seed);
            }
        }
    }
    let per_schedule = fired as f64 / seeds.len() as f64;
    eprintln!(
        "campaign: {} schedules, {} failed; crashes fired {fired} of {scheduled} scheduled ({per_schedule:.2} per schedule), {restarts} restarts",
        seeds.len(),
        failures.len()
    );
    for (point, (s, f)) in &by_point {
        eprintln!("  {point:<40} fired {f:>5} of {s:>5} scheduled");
    }
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    assert!(
        seeds.len() < 50 || per_schedule >= MIN_FIRED_PER_SCHEDULE,
        "only {per_schedule:.2} crashes fired per schedule ({fired} of {scheduled}); the campaign needs {MIN_FIRED_PER_SCHEDULE}"
    );
}
