//! The randomized campaign: seeded schedules of 1-3 crashes at random fault points plus
//! random store faults, each run to quiescence and checked for I1-I5. A failing seed
//! prints the command that replays it.
//!
//! `SHAREFLOW_SEED=n` runs one seed; `SHAREFLOW_CAMPAIGN_SEEDS=k` runs k (default 1000).

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;

use std::sync::Arc;
use std::time::Duration;

use eos::*;
use object_store::memory::InMemory;
use object_store::ObjectStore;
use shareflow::checkpoint::testing::{Fault, FaultRule, FaultyStore, StoreOp};
use shareflow::demo::FAULT_POINTS;
use shareflow::runtime::failpoint::points;

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs one seeded schedule; returns a description of the failure, if any.
async fn run_seed(seed: u64) -> Result<String, String> {
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
    run.inline_threshold = if rng.below(2) == 0 { 0 } else { 16 * 1024 };
    run.restarts = 12;
    let mut crashes = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let point = FAULT_POINTS[rng.below(FAULT_POINTS.len() as u64) as usize].to_string();
        crashes.push((point, rng.below(3) as u32));
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
    let (result, fired) = run.run(crashes).await;
    if let Err(e) = result {
        return Err(format!(
            "{schedule}: the job did not finish: {e} (fired {fired:?}, store faults {:?})",
            store.injected().len()
        ));
    }
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
    Ok(format!("{} crashes, {} store faults", fired.len(), store.injected().len()))
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
    let mut crashes = 0;
    let mut failures = Vec::new();
    for &seed in &seeds {
        match run_seed(seed).await {
            Ok(summary) => {
                crashes += summary.split(' ').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
            }
            Err(why) => {
                eprintln!("seed {seed} failed: {why}\n  replay: SHAREFLOW_SEED={seed} cargo test --test eos_campaign -- --nocapture");
                failures.push(seed);
            }
        }
    }
    eprintln!("campaign: {} schedules, {crashes} crashes injected, {} failed", seeds.len(), failures.len());
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    assert!(seeds.len() < 50 || crashes > seeds.len() as u64 / 2, "the campaign injected too few crashes: {crashes}");
}
