//! The instance campaign (issue 11): seeded schedules of three instances of one share
//! group on one embedded broker. Each schedule crashes instances at random fault points
//! (the runtime's, the connector's and `adoption.mid`); some restart, some die for good
//! and must be adopted. A survivor runs until every record is done; an instance that
//! joins late adopts what died too late for the others to see. Then I1-I5 and I8
//! are checked from outside: output = input, no duplicates, nothing left open.
//!
//! `SHAREFLOW_INSTANCE_SEED=n` runs one seed; `SHAREFLOW_INSTANCE_SEEDS=k` runs k
//! (default 300). A failing seed prints the command that replays it.

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;
#[path = "support/rng.rs"]
mod rng;
#[path = "support/s3.rs"]
mod s3;

use std::sync::Arc;
use std::time::{Duration, Instant};

use eos::{broker_with_input, GROUP, INPUT, OUTPUT};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use rng::Rng;
use shareflow::checkpoint::{CheckpointPaths, CheckpointStore};
use shareflow::connector::broker::EmbeddedBroker;
use shareflow::connector::embedded::BrokerTransactions;
use shareflow::connector::share::{AcknowledgementMode, ShareConfig};
use shareflow::connector::{points as connector_points, SourceMetrics, SourceSettings};
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{ErrorKind, InstanceConfig, Job, JobConfig, RestartStrategy};

const RECORDS: u64 = 400;
const ADOPTION: Duration = Duration::from_millis(250);
/// A schedule that has not drained by then failed liveness (I8).
const LIMIT: Duration = Duration::from_secs(20);

/// The group's config. `share.transaction.max.pending` is per group: every live instance
/// keeps up to two transactions open (T(n) and T(n+1)), more while checkpoints fail, and
/// a dead instance's stay until it is adopted. Three instances need well over the
/// default 5 (decision 0007).
fn share_config() -> ShareConfig {
    ShareConfig::builder()
        .acknowledgement_mode(AcknowledgementMode::Transactional)
        .record_lock_duration(Duration::from_secs(1))
        .partition_max_record_locks(1_000_000)
        .max_pending_transactions(32)
        .build()
        .unwrap()
}

/// Where a schedule keeps its checkpoints and registry: a store and a root in it.
#[derive(Clone)]
struct Root {
    store: Arc<dyn ObjectStore>,
    path: String,
    /// Each checkpoint's timeout, and the adoption timeout (which must exceed the
    /// checkpoint interval plus the checkpoint timeout).
    timeouts: (Duration, Duration),
}

/// The timeouts of the in-memory campaign: tight, so that a schedule adopts quickly.
const MEMORY_TIMEOUTS: (Duration, Duration) = (Duration::from_millis(150), ADOPTION);

/// On the S3 server every checkpoint and heartbeat is a round trip. Under the parallel
/// test run the in-memory timeouts failed 2 of 60 seeds on 2026-12-06: in seed 38 a
/// survivor's final checkpoint timed out 4 times; in seed 39 a PREPARE of a dead
/// instance was left at quiescence (I8), not reproduced alone or under load since. A
/// checkpoint may take 1 s here, and silence means death after 2 s.
const S3_TIMEOUTS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(2));

fn job(broker: &EmbeddedBroker, root: &Root, prefix: &str, restarts: u32) -> Job {
    let txns = BrokerTransactions::new(broker.clone(), Duration::from_secs(60));
    let mut source = SourceSettings::new(GROUP, &[INPUT]);
    source.max_poll_records = 25;
    source.poll_timeout = Duration::from_millis(2);
    let job = eos::pipeline(broker, &txns, source, share_config(), 1, Arc::new(SourceMetrics::default()));
    let storage = CheckpointStore::new(root.store.clone(), CheckpointPaths::new(root.path.as_str(), prefix).unwrap());
    let mut config = JobConfig::new(storage, GROUP, prefix)
        .checkpoint_interval(Duration::from_millis(10))
        .checkpoint_timeout(root.timeouts.0)
        .restart(RestartStrategy::FixedDelay { attempts: restarts, delay: Duration::from_millis(5) })
        .instance(InstanceConfig::new(root.timeouts.1));
    // A checkpoint late on a loaded machine is not one of the schedule's crashes: it must
    // not use up the survivor's restarts.
    config.tolerable_checkpoint_failures = 3;
    job.build(config).unwrap()
}

/// What one schedule did.
struct Outcome {
    fired: usize,
    adopted: u64,
    /// The survivor was fenced: presumed dead (its heartbeats late on a loaded machine)
    /// and adopted while it ran.
    survivor_fenced: bool,
}

async fn run_seed(seed: u64, root: &Root) -> Result<Outcome, String> {
    let mut rng = Rng::new(seed);
    let broker = broker_with_input(RECORDS, 2, &share_config()).await;
    let crash_points: Vec<&str> =
        points::ALL.iter().chain(connector_points::ALL).copied().chain([points::ADOPTION_MID]).collect();
    // Instances a and b crash once each at a random point and either restart or die for
    // good; c is the survivor, which may crash mid-adoption and restart.
    let mut jobs = Vec::new();
    let mut plan = Vec::new();
    for prefix in ["a", "b"] {
        let point = crash_points[rng.below(crash_points.len() as u64) as usize];
        let skip = rng.below(4) as u32;
        let restarts = if rng.below(2) == 0 { 0 } else { 2 };
        let j = job(&broker, root, prefix, restarts);
        j.failpoints().schedule(vec![(point.to_string(), skip)]);
        plan.push(format!("{prefix}: {point}+{skip} restarts={restarts}"));
        jobs.push(j);
    }
    // The survivor and the janitor have restarts to spare: one may go to the scheduled
    // crash mid-adoption, the rest to runs of late checkpoints on a loaded machine.
    let survivor = job(&broker, root, "c", 8);
    if rng.below(2) == 0 {
        survivor.failpoints().schedule(vec![(points::ADOPTION_MID.to_string(), 0)]);
        plan.push("c: adoption.mid+0".into());
    }
    let all: Vec<&Job> = jobs.iter().chain([&survivor]).collect();
    let prefixes = ["a", "b", "c"];
    let stops: Vec<_> = all.iter().map(|j| j.stop_handle()).collect();
    let ended: Vec<std::sync::atomic::AtomicBool> = all.iter().map(|_| Default::default()).collect();
    // Done when every record is done and no instance that ended (a dead one) still has
    // an undecided transaction: an adopter must have decided them.
    let watcher = async {
        let start = Instant::now();
        let mut done = false;
        while start.elapsed() < LIMIT {
            let r = shareflow::connector::verify::check_exactly_once(&broker, GROUP, INPUT, OUTPUT, eos::identity)
                .await
                .unwrap();
            let archived: u64 = r.archived.values().sum();
            if r.duplicates > 0 {
                break;
            }
            if r.exactly_once + archived == RECORDS && r.lost == 0 {
                let open = broker.transactions().await.unwrap();
                let orphaned = open.iter().filter(|t| t.state.is_pending()).any(|t| {
                    let i = prefixes.iter().position(|p| *p == t.id.prefix());
                    i.is_none_or(|i| ended[i].load(std::sync::atomic::Ordering::SeqCst))
                });
                if !orphaned {
                    done = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for s in &stops {
            s.stop();
        }
        done
    };
    let runs = futures::future::join_all(all.iter().zip(&ended).map(|(j, ended)| async move {
        let r = j.run().await;
        ended.store(true, std::sync::atomic::Ordering::SeqCst);
        r
    }));
    let (results, done) = tokio::join!(runs, watcher);
    let fired: usize = all.iter().map(|j| j.failpoints().fired().len()).sum();
    let plan = plan.join(", ");
    // A survivor whose heartbeats came late (a loaded machine) is presumed dead, adopted
    // and fenced, and stops: the protocol's answer, not a failure. A joining instance
    // then finishes the work, and the output is checked the same way.
    let (survivor_adopted, survivor_fenced) = match results.last() {
        Some(Ok(r)) => (r.metrics.checkpoints.instances_adopted, false),
        Some(Err(e)) if e.kind() == ErrorKind::Fenced => (0, true),
        other => return Err(format!("[{plan}] the survivor failed: {other:?}")),
    };
    // An instance that died just as the others were told to stop leaves undecided
    // transactions nobody was left to adopt: a new instance joins and adopts them.
    let orphans = |open: &[shareflow::connector::broker::TransactionInfo]| {
        open.iter()
            .filter(|t| t.state.is_pending())
            .filter(|t| prefixes.iter().position(|p| *p == t.id.prefix()).is_some_and(|i| results[i].is_err()))
            .count()
    };
    let drained = || async {
        let r = shareflow::connector::verify::check_exactly_once(&broker, GROUP, INPUT, OUTPUT, eos::identity)
            .await
            .unwrap();
        r.exactly_once + r.archived.values().sum::<u64>() == RECORDS && r.lost == 0
    };
    let mut janitor_adopted = 0;
    let mut drained_by_janitor = false;
    if orphans(&broker.transactions().await.unwrap()) > 0 || survivor_fenced {
        let janitor = job(&broker, root, "z", 8);
        let stop = janitor.stop_handle();
        let (report, ()) = tokio::join!(janitor.run(), async {
            let start = Instant::now();
            while start.elapsed() < LIMIT
                && (orphans(&broker.transactions().await.unwrap()) > 0 || (survivor_fenced && !drained().await))
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            drained_by_janitor = survivor_fenced && drained().await;
            stop.stop();
        });
        match report {
            Ok(r) => janitor_adopted = r.metrics.checkpoints.instances_adopted,
            Err(e) => return Err(format!("[{plan}] the joining instance failed: {e}")),
        }
    }
    let r =
        shareflow::connector::verify::check_exactly_once(&broker, GROUP, INPUT, OUTPUT, eos::identity).await.unwrap();
    let archived: u64 = r.archived.values().sum();
    let done = done || drained_by_janitor;
    if !done || !r.ok() || r.duplicates > 0 || r.lost > 0 || r.exactly_once + archived != RECORDS {
        return Err(format!("[{plan}] not exactly once (drained: {done}): {r:?}"));
    }
    let open: Vec<_> = broker.transactions().await.unwrap().into_iter().filter(|t| t.state.is_pending()).collect();
    if !open.is_empty() {
        return Err(format!("[{plan}] transactions left open or prepared: {open:?}"));
    }
    Ok(Outcome { fired, adopted: survivor_adopted + janitor_adopted, survivor_fenced })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_under_seeded_crashes_stay_exactly_once() {
    let seeds = seeds("SHAREFLOW_INSTANCE_SEEDS", 300);
    campaign(&seeds, 1.0, |_| Root { store: Arc::new(InMemory::new()), path: "chk".into(), timeouts: MEMORY_TIMEOUTS })
        .await;
}

/// The same campaign with the checkpoints and the registry on the S3 server (MinIO):
/// the registry's create-only claims, heartbeats and adoption under S3's semantics.
/// `SHAREFLOW_INSTANCE_S3_SEEDS=k` runs k (default 60).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_s3_under_seeded_crashes_stay_exactly_once() {
    let Some((store, _)) = s3::s3_store() else { return };
    let tag = s3::run_tag();
    let seeds = seeds("SHAREFLOW_INSTANCE_S3_SEEDS", 60);
    // A checkpoint costs S3 round trips, so a schedule drains after fewer of them and
    // fewer crash points armed at a later hit fire. Measured per schedule: 0.9 alone,
    // 0.92 and 0.58 in two parallel test runs, against 1.2 in memory. The floor checks
    // that the campaign crashes at all, not how often a loaded machine lets it.
    let root =
        |seed| Root { store: store.clone(), path: format!("instances-campaign-{tag}/{seed}"), timeouts: S3_TIMEOUTS };
    campaign(&seeds, 0.4, root).await;
}

/// The seeds to run: `SHAREFLOW_INSTANCE_SEED=n` alone, else 1..=k with k from `var`.
fn seeds(var: &str, default: u64) -> Vec<u64> {
    match std::env::var("SHAREFLOW_INSTANCE_SEED") {
        Ok(s) => vec![s.parse().expect("SHAREFLOW_INSTANCE_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or(default);
            (1..=n).collect()
        }
    }
}

/// Runs every seed with its own root, and checks that the campaign crashed (at least
/// `crashes` per schedule) and adopted.
async fn campaign(seeds: &[u64], crashes: f64, root: impl Fn(u64) -> Root) {
    let (mut fired, mut adopted, mut fenced, mut failures) = (0, 0, 0, Vec::new());
    for &seed in seeds {
        match run_seed(seed, &root(seed)).await {
            Ok(o) => {
                fired += o.fired;
                adopted += o.adopted;
                fenced += usize::from(o.survivor_fenced);
            }
            Err(why) => {
                eprintln!(
                    "seed {seed} failed: {why}\n  replay: SHAREFLOW_INSTANCE_SEED={seed} cargo test --test \
                     instances_campaign -- --nocapture"
                );
                failures.push(seed);
            }
        }
    }
    eprintln!(
        "{} schedules, {fired} crashes fired, {adopted} adoptions, {fenced} survivors fenced while alive",
        seeds.len()
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    // The campaign must exercise what it is for: crashes and adoptions.
    if seeds.len() >= 50 {
        let (n, wanted) = (seeds.len(), crashes * seeds.len() as f64);
        assert!(fired as f64 >= wanted, "too few crashes fired: {fired} in {n} schedules, at least {wanted} wanted");
        assert!(
            adopted as f64 >= seeds.len() as f64 / 10.0,
            "too few adoptions: {adopted} in {} schedules",
            seeds.len()
        );
    }
}
