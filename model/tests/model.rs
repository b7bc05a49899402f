//! Runs the model checker over the CI configurations (or the deep ones with
//! `SHAREFLOW_MODEL_DEPTH=deep`), and shows that each broken variant is caught.

#[path = "../../tests/support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use shareflow_model::{Bug, Config, ProtocolModel, Trace};
use stateright::{Checker, Expectation, Model};

fn deep() -> bool {
    std::env::var("SHAREFLOW_MODEL_DEPTH").is_ok_and(|d| d == "deep")
}

struct Outcome {
    /// Always-properties that failed, with a readable trace and the trace file's text.
    violated: Vec<(&'static str, String, Trace)>,
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
                violated.push((p.name, trace, Trace::of_path(cfg, p.name, &path)));
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
    if let Some((_, _, trace)) = out.violated.iter().find(|(p, ..)| *p == property) {
        write_trace(name, trace);
    }
    assert!(
        out.violated.iter().any(|(p, ..)| *p == property),
        "{name}: the broken variant {:?} was not caught by {property:?}; violated: {:?}",
        cfg.bug,
        out.violated.iter().map(|v| v.0).collect::<Vec<_>>()
    );
}

/// Writes a counterexample where a runtime test can replay it: `$SHAREFLOW_MODEL_TRACES`,
/// or `model-traces/` in the target dir.
fn write_trace(name: &str, trace: &Trace) {
    let dir = match std::env::var_os("SHAREFLOW_MODEL_TRACES") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| std::path::PathBuf::from("target"), std::path::PathBuf::from)
            .join("model-traces"),
    };
    let file = dir.join(format!("{}.trace", name.replace([':', ' '], "_").replace("__", "_")));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, trace.to_text())) {
        Ok(()) => println!("[{name}] counterexample written to {}", file.display()),
        Err(e) => println!("[{name}] cannot write the counterexample to {}: {e}", file.display()),
    }
}

/// The traces under `tests/traces/` that the root workspace replays against the real
/// runtime (`tests/model_traces.rs`) are counterexamples of the model as it is now:
/// each replays step by step on its own broken variant and violates its property
/// there, and the real protocol either cannot take the same steps or keeps every
/// property along them.
#[test]
fn committed_traces_are_counterexamples_of_this_model() {
    let dir = checkout_file("../tests/traces");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "expected the committed traces in {}, found {files:?}", dir.display());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable trace");
        let trace = Trace::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_ne!(trace.config.bug, Bug::None, "{}: a counterexample of a broken variant", file.display());
        let end = trace.replay(trace.config).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let violated = Trace::violated(trace.config, &end);
        assert!(
            violated.contains(&trace.property.as_str()),
            "{}: replayed, but `{}` holds at the end (violated: {violated:?})",
            file.display(),
            trace.property
        );
        let real = trace.config.with_bug(Bug::None);
        for k in 1..=trace.actions.len() {
            let prefix = Trace { actions: trace.actions[..k].to_vec(), ..trace.clone() };
            match prefix.replay(real) {
                Ok(state) => {
                    let violated = Trace::violated(real, &state);
                    assert!(violated.is_empty(), "{}: the real protocol violates {violated:?}", file.display());
                }
                Err(e) => {
                    println!("{}: the real protocol diverges at step {k}: {e}", file.display());
                    break;
                }
            }
        }
    }
}

#[test]
fn one_instance() {
    holds("one instance", if deep() { Config::deep_one() } else { Config::ci_one() });
}

#[test]
fn one_instance_with_keyed_state() {
    holds("one instance, keyed state", Config::ci_stateful());
}

#[test]
fn broken_emit_twice_is_caught() {
    caught("bug: emit twice", Config::ci_stateful().with_bug(Bug::EmitTwice), "a result is emitted at most once");
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

/// The model's broker refuses what the real broker refuses before it journals a command
/// (`admit`): staging an explicit member's acknowledgements into a transaction.
#[test]
fn the_model_broker_admits_commands_as_the_real_one_does() {
    use shareflow_broker::model::ModelBroker;
    use shareflow_share::{AcknowledgeType, AcknowledgementMode, ShareConfig, TopicPartition, TransactionId};
    let config = |mode| ShareConfig::builder().acknowledgement_mode(mode).build().expect("config");
    let mut broker = ModelBroker::new(config(AcknowledgementMode::Explicit));
    let tp = TopicPartition::new("in", 0);
    broker.create_topic(0, "in", 1).expect("topic");
    broker.produce(0, &tp, &[b"x".to_vec()], None).expect("produce");
    let epoch = broker.init_producer(0, "g", "p").expect("producer");
    let id = TransactionId::new("g", "p", 1).expect("id");
    broker.begin(0, &id, epoch, 60_000).expect("begin");
    for (mode, admitted) in [(AcknowledgementMode::Explicit, false), (AcknowledgementMode::Transactional, true)] {
        let member = broker.join(0, "g", &["in"], &config(mode)).expect("join");
        if admitted {
            assert_eq!(broker.acquire(0, "g", member, 1).expect("acquire").len(), 1);
        }
        let staged = broker.ack_in_txn(0, &id, epoch, member, &tp, 0, AcknowledgeType::Accept);
        match staged {
            Err(e) => assert!(!admitted && e.to_string().contains("opt-in"), "{mode}: {e}"),
            Ok(()) => assert!(admitted, "{mode}: staged"),
        }
    }
}
