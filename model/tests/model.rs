//! Runs the model checker over the CI configurations (or the deep ones with
//! `SHAREFLOW_MODEL_DEPTH=deep`), and shows that each broken variant is caught.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use shareflow_model::{Bug, Config, ProtocolModel};
use stateright::{Checker, Expectation, Model};

fn deep() -> bool {
    std::env::var("SHAREFLOW_MODEL_DEPTH").is_ok_and(|d| d == "deep")
}

struct Outcome {
    /// Always-properties that failed, with a readable trace.
    violated: Vec<(&'static str, String)>,
    /// Sometimes-properties never reached.
    unreached: Vec<&'static str>,
}

fn run(name: &str, cfg: Config) -> Outcome {
    let model = ProtocolModel::new(cfg);
    let coverage = model.coverage.clone();
    let properties = model.properties();
    let explainer = ProtocolModel::new(cfg);
    let started = Instant::now();
    // Breadth first gives the shortest counterexamples; the deep configurations go depth
    // first, which keeps only the current path in memory besides the visited set.
    if deep() {
        report(name, cfg, model.checker().threads(2).spawn_dfs().join(), started, &coverage, properties, &explainer)
    } else {
        report(name, cfg, model.checker().threads(2).spawn_bfs().join(), started, &coverage, properties, &explainer)
    }
}

fn report(
    name: &str,
    cfg: Config,
    checker: impl Checker<ProtocolModel>,
    started: Instant,
    coverage: &[std::sync::atomic::AtomicU64; 20],
    properties: Vec<stateright::Property<ProtocolModel>>,
    explainer: &ProtocolModel,
) -> Outcome {
    let took = started.elapsed();
    println!(
        "[{name}] {cfg:?}\n[{name}] states: {} visited, {} unique, max depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        took
    );
    let counts: Vec<String> = shareflow_model::ACTION_KINDS
        .iter()
        .zip(coverage.iter())
        .map(|(k, c)| format!("{k}={}", c.load(std::sync::atomic::Ordering::Relaxed)))
        .collect();
    println!("[{name}] coverage: {}", counts.join(" "));
    let mut violated = Vec::new();
    let mut unreached = Vec::new();
    for p in properties {
        let found = checker.discovery(p.name);
        match (p.expectation, found) {
            (Expectation::Always | Expectation::Eventually, Some(path)) => {
                let trace = explainer.explain(&path);
                println!("[{name}] VIOLATED: {}\n{trace}", p.name);
                violated.push((p.name, trace));
            }
            (Expectation::Sometimes, None) => {
                println!("[{name}] never reached: {}", p.name);
                unreached.push(p.name);
            }
            _ => {}
        }
    }
    Outcome { violated, unreached }
}

/// Every property holds, and every coverage property is reached.
fn holds(name: &str, cfg: Config) {
    let out = run(name, cfg);
    let violated: Vec<&str> = out.violated.iter().map(|v| v.0).collect();
    assert!(violated.is_empty(), "{name}: properties violated: {violated:?}");
    assert!(out.unreached.is_empty(), "{name}: coverage properties never reached: {:?}", out.unreached);
}

fn caught(name: &str, cfg: Config, property: &str) {
    let out = run(name, cfg);
    assert!(
        out.violated.iter().any(|(p, _)| *p == property),
        "{name}: the broken variant {:?} was not caught by {property:?}; violated: {:?}",
        cfg.bug,
        out.violated.iter().map(|v| v.0).collect::<Vec<_>>()
    );
}

#[test]
fn one_instance() {
    holds("one instance", if deep() { Config::deep_one() } else { Config::ci_one() });
}

#[test]
fn one_instance_paused_and_back() {
    // Finding 1 (docs/model.md): a paused incarnation that prepared T(n) may still create
    // manifest n after its successor's recovery aborted T(n). The tombstone recovery
    // creates first makes that manifest decide nothing.
    holds("paused instance", Config::ci_pause());
}

#[test]
fn broken_no_tombstone_is_caught() {
    // Without the tombstone, finding 1 comes back: a later recovery restores the late
    // manifest, whose transaction was aborted.
    caught(
        "bug: no tombstone",
        Config::ci_pause().with_bug(Bug::NoTombstone),
        "recovery never restores a checkpoint whose transactions aborted",
    );
}

#[test]
fn two_instances_with_adoption() {
    holds("two instances", if deep() { Config::deep_two() } else { Config::ci_two() });
}

#[test]
fn broken_commit_before_manifest_is_caught() {
    caught(
        "bug: commit before manifest",
        Config::ci_one().with_bug(Bug::CommitBeforeManifest),
        "no commit without a manifest that decided it",
    );
}

#[test]
fn broken_recovery_leaving_prepared_is_caught() {
    // Liveness is not vacuous: a recovery that never decides PREPARE transactions
    // leaves one PREPARE on a path that ends.
    caught(
        "bug: recovery leaves PREPARE",
        Config::ci_one().with_bug(Bug::RecoveryLeavesPrepared),
        "every PREPARE transaction is eventually decided",
    );
}

#[test]
fn broken_skip_fencing_is_caught() {
    caught("bug: skip fencing", Config::ci_pause().with_bug(Bug::SkipFencing), "no two owners commit for one prefix");
}

#[test]
fn broken_recovery_aborting_decided_is_caught() {
    caught(
        "bug: recovery aborts decided",
        Config::ci_one().with_bug(Bug::RecoveryAbortsDecided),
        "a manifest's transactions are never aborted",
    );
}

#[test]
fn broken_ack_before_staging_is_caught() {
    caught(
        "bug: ack before staging",
        Config::ci_one().with_bug(Bug::AckBeforeStaging),
        "acks and output visible together",
    );
}

#[test]
fn broken_adoption_without_fence_is_caught() {
    let cfg = Config { pauses: 1, crashes: 0, ..Config::ci_two() }.with_bug(Bug::AdoptWithoutFence);
    caught("bug: adoption without fence", cfg, "no two owners commit for one prefix");
}

#[test]
fn two_instances_paused_one_adopted() {
    // A paused instance is adopted and its zombie comes back: fenced, it commits
    // nothing. A manifest it creates after the adopter aborted that checkpoint's
    // transaction sits under the adopter's tombstone (finding 1) and decides nothing.
    let cfg = Config { pauses: 1, crashes: 0, ..Config::ci_two() };
    holds("two instances, one paused", cfg);
}

fn fingerprint(s: &shareflow_model::Sys) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// The liveness properties rely on this: with no cycle, every path is finite and ends
/// in a state where nothing can happen, so "every such state is quiescent" means every
/// PREPARE transaction is decided on every path. A depth-first search over the whole
/// graph, with the states on the current path marked, finds any edge back into it.
#[test]
fn the_state_graph_has_no_cycle() {
    let configs = [
        ("one instance", Config::ci_one()),
        ("paused instance", Config::ci_pause()),
        ("two instances", Config::ci_two()),
        ("two instances, one paused", Config { pauses: 1, crashes: 0, ..Config::ci_two() }),
    ];
    for (name, cfg) in configs {
        let model = ProtocolModel::new(cfg);
        let started = Instant::now();
        // fingerprint -> still on the current path
        let mut seen: HashMap<u64, bool> = HashMap::new();
        let init = model.init_states().remove(0);
        seen.insert(fingerprint(&init), true);
        let mut stack = vec![(fingerprint(&init), model.successors(&init))];
        let mut edges = 0u64;
        while let Some((_, next)) = stack.last_mut() {
            let Some(state) = next.pop() else {
                let (done, _) = stack.pop().expect("non-empty");
                seen.insert(done, false);
                continue;
            };
            edges += 1;
            let f = fingerprint(&state);
            match seen.get(&f) {
                Some(true) => panic!(
                    "{name}: a cycle: an event leads back to a state on the current path:\n  {}",
                    state.summary(cfg.records)
                ),
                Some(false) => {}
                None => {
                    seen.insert(f, true);
                    let successors = model.successors(&state);
                    stack.push((f, successors));
                }
            }
        }
        println!("[{name}] acyclic: {} states, {edges} edges, in {:.1?}", seen.len(), started.elapsed());
        assert!(seen.len() > 1_000, "{name}: the search visited only {} states", seen.len());
    }
}
