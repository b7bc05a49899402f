//! The model checker's counterexamples (docs/model.md), replayed against the real
//! runtime: the embedded broker, the checkpoint store, the share source, the SQL
//! operator, the topic sink and the coordinator, under tokio's paused time.
//!
//! A trace (`tests/traces/*.trace`, written by `model/tests/model.rs`) is a list of the
//! model's actions. The replay turns it into incarnations of the real job: each crash of
//! the trace becomes a failpoint fired at the runtime's point for the action before it
//! (the k-th time the incarnation reaches that point), time events move the paused clock
//! while the instance is down, and the end of the trace stops the job at the point of
//! its last action. At every stop the replay checks the model's safety properties on
//! what the broker and the store hold; at the end it runs the job to quiescence and
//! checks that every record went through exactly once.
//!
//! Each trace was found on a broken variant of the protocol. The real runtime keeps
//! every property along it; the runtime broken the same way (`Failpoints::break_protocol`)
//! breaks the property the model named, so the replay is not vacuous.

#![allow(clippy::unwrap_used)]

#[path = "support/eos.rs"]
mod eos;

#[path = "support/checkout.rs"]
mod checkout;
use checkout::checkout_file;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use eos::*;
use shareflow::connector::share::{IsolationLevel, RecordState, TopicPartition, TransactionState};
use shareflow::runtime::failpoint::points;
use shareflow::runtime::{Broken, RuntimeError};

/// One action of a trace, as far as the replay needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Act {
    /// `Poll`, `Crash`, `LockExpiry`, ...
    name: String,
    /// The arguments as written: `Live(0)`, `0`, `Ok`.
    args: Vec<String>,
}

/// A counterexample read from its file.
#[derive(Debug)]
struct Trace {
    records: u64,
    bug: String,
    property: String,
    actions: Vec<Act>,
}

/// Why a trace cannot be read or replayed.
#[derive(Debug)]
enum ReplayError {
    /// The file is not a trace; the line and what is wrong.
    Malformed { line: usize, reason: String },
    /// A step the replay cannot carry out against the runtime.
    Unsupported { step: usize, action: String, reason: String },
    /// The runtime did not follow the trace: a crash it should have reached did not fire.
    Diverged { step: usize, reason: String },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Malformed { line, reason } => write!(f, "trace line {line}: {reason}"),
            ReplayError::Unsupported { step, action, reason } => {
                write!(f, "step {step} ({action}) cannot be replayed against the runtime: {reason}")
            }
            ReplayError::Diverged { step, reason } => {
                write!(f, "the runtime diverged from the trace at step {step}: {reason}")
            }
        }
    }
}

fn parse(text: &str) -> Result<Trace, ReplayError> {
    let malformed = |line: usize, reason: String| ReplayError::Malformed { line, reason };
    let (mut records, mut bug, mut property) = (None, None, None);
    let mut actions = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let (n, line) = (i + 1, raw.trim());
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix("config:") {
            for pair in rest.split_whitespace() {
                let (key, value) =
                    pair.split_once('=').ok_or_else(|| malformed(n, format!("`{pair}` is not key=value")))?;
                let value: u64 = value.parse().map_err(|_| malformed(n, format!("`{pair}`: not a number")))?;
                match key {
                    "instances" if value != 1 => {
                        return Err(malformed(n, format!("{value} instances: the replay runs one instance")))
                    }
                    "records" => records = Some(value),
                    _ => {}
                }
            }
        } else if let Some(rest) = line.strip_prefix("bug:") {
            bug = Some(rest.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("property:") {
            property = Some(rest.trim().to_string());
        } else {
            if line.matches('(').count() != line.matches(')').count() {
                return Err(malformed(n, format!("`{line}`: unbalanced parentheses")));
            }
            let (name, args) = match line.split_once('(') {
                None => (line, Vec::new()),
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix(')')
                        .ok_or_else(|| malformed(n, format!("`{line}`: unbalanced parentheses")))?;
                    // Arguments never nest deeper than `Live(0)`: split at ", ".
                    (name, inner.split(", ").map(str::to_string).collect())
                }
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphabetic()) {
                return Err(malformed(n, format!("`{line}` is not an action")));
            }
            actions.push(Act { name: name.to_string(), args });
        }
    }
    let missing = |what: &str| malformed(0, format!("no `{what}` line"));
    Ok(Trace {
        records: records.ok_or_else(|| missing("config: ... records="))?,
        bug: bug.ok_or_else(|| missing("bug:"))?,
        property: property.ok_or_else(|| missing("property:"))?,
        actions,
    })
}

/// One incarnation of the job: it runs until `stop` fires (point, hits to let pass).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Incarnation {
    stop: (&'static str, u32),
    /// The trace step of the stop.
    step: usize,
    /// Time that passes while it is down, after it stopped.
    then_advance: Duration,
}

/// The runtime's point right after each of the model's steps.
fn point_after(act: &Act) -> Option<&'static str> {
    Some(match act.name.as_str() {
        "Poll" => shareflow::connector::points::SOURCE_AFTER_POLL,
        "Stage" => shareflow::connector::points::SOURCE_AFTER_LOCK,
        "Sink" => shareflow::connector::points::SINK_AFTER_WRITE,
        "Prepare" => points::AFTER_STATE_BEFORE_MANIFEST,
        "WriteManifest" if act.args.get(1).is_some_and(|a| a == "Ok") => points::AFTER_MANIFEST,
        "Commit" => points::COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
        "Recover" => points::AFTER_RECOVERY,
        _ => return None,
    })
}

/// The lock duration of the replay's group (`eos::share_config`) and the transaction
/// timeout of its runs (`Run::txn_timeout`).
const LOCK: Duration = Duration::from_secs(1);
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// Cuts the trace into incarnations.
fn plan(trace: &Trace) -> Result<Vec<Incarnation>, ReplayError> {
    let mut out = Vec::new();
    let mut hits: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut last: Option<(&'static str, usize)> = None;
    let mut down = false;
    for (i, act) in trace.actions.iter().enumerate() {
        let step = i + 1;
        let unsupported = |reason: &str| ReplayError::Unsupported {
            step,
            action: format!("{}({})", act.name, act.args.join(", ")),
            reason: reason.to_string(),
        };
        if act.args.iter().any(|a| a.starts_with("Zombie")) || ["Pause", "Vanish"].contains(&act.name.as_str()) {
            return Err(unsupported("paused incarnations are replayed by hand (tests/eos_failures.rs)"));
        }
        if act.name.starts_with("Adopt") {
            return Err(unsupported("the replay runs one instance"));
        }
        match act.name.as_str() {
            "Restart" => {
                down = false;
                hits.clear();
                last = None;
            }
            "Crash" => {
                let Some((point, at)) = last else {
                    return Err(unsupported("a crash before the incarnation reached any point the runtime names"));
                };
                if at + 1 != i {
                    return Err(unsupported("a crash right after a step that has no runtime point"));
                }
                out.push(Incarnation { stop: (point, hits[point] - 1), step, then_advance: Duration::ZERO });
                down = true;
            }
            "LockExpiry" | "TxnTimeout" | "Time" => {
                if !down {
                    return Err(unsupported("time passing while the instance runs is left to the runtime's own clock"));
                }
                let by = if act.name == "TxnTimeout" { TXN_TIMEOUT } else { LOCK };
                if let Some(inc) = out.last_mut() {
                    inc.then_advance += by + Duration::from_millis(1);
                }
            }
            "WriteManifest" if point_after(act).is_none() => {
                return Err(unsupported("store faults on the manifest are covered by tests/eos_failures.rs"));
            }
            _ => {
                if let Some(point) = point_after(act) {
                    *hits.entry(point).or_default() += 1;
                    last = Some((point, i));
                }
            }
        }
    }
    // The end of the trace: stop where its last action left the runtime, and look.
    if !down {
        let (Some((point, at)), Some(act)) = (last, trace.actions.last()) else {
            return Err(ReplayError::Diverged { step: trace.actions.len(), reason: "the trace never ran".into() });
        };
        if at + 1 != trace.actions.len() {
            return Err(ReplayError::Unsupported {
                step: trace.actions.len(),
                action: act.name.clone(),
                reason: "the trace ends after a step that has no runtime point".into(),
            });
        }
        out.push(Incarnation {
            stop: (point, hits[point] - 1),
            step: trace.actions.len(),
            then_advance: Duration::ZERO,
        });
    }
    Ok(out)
}

/// A property broken at a stop, by the model's name for it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    property: &'static str,
    step: usize,
    detail: String,
}

/// The model's safety properties, read from the real broker and store.
async fn check(run: &Run, records: u64, step: usize) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut v = |property: &'static str, detail: String| found.push(Violation { property, step, detail });
    let broker = &run.broker;
    let input = TopicPartition::new(INPUT, 0);
    let output = TopicPartition::new(OUTPUT, 0);
    let mut out_count: BTreeMap<u64, usize> = BTreeMap::new();
    for r in broker.fetch_all(&output, IsolationLevel::ReadCommitted).await.unwrap() {
        if let Some(id) = r.value.as_deref().and_then(identity) {
            *out_count.entry(id).or_default() += 1;
        }
    }
    for id in 0..records {
        let out = out_count.get(&id).copied().unwrap_or(0);
        if out > 1 {
            v("every record in committed output at most once", format!("record {id} output {out} times"));
        }
        let state = broker.record_status(GROUP, &input, id as i64).await.map_or(RecordState::Available, |s| s.state);
        if (state == RecordState::Acknowledged) != (out >= 1) {
            v("acks and output visible together", format!("record {id} is {state:?} with its output {out} times"));
        }
    }
    let txns = broker.transactions().await.unwrap();
    let mut manifests = BTreeMap::new();
    for c in run.storage.list_checkpoints().await.unwrap() {
        if let Ok(m) = run.storage.read_manifest(c.checkpoint_id).await {
            manifests.insert(c.checkpoint_id, m);
        }
    }
    let newest = manifests.keys().next_back().copied();
    for t in txns.iter().filter(|t| t.id.prefix() == run.prefix) {
        let k = t.id.checkpoint_id();
        if t.state == TransactionState::Committed && newest.is_none_or(|m| m < k) {
            v(
                "no commit without a manifest that decided it",
                format!("{} committed, newest manifest {newest:?}", t.id),
            );
        }
    }
    for (n, m) in &manifests {
        for r in &m.transactions {
            if let Some(t) = txns.iter().find(|t| t.id.to_string() == r.transaction_id) {
                if t.state == TransactionState::Aborted {
                    v(
                        "a manifest's transactions are never aborted",
                        format!("{} aborted, manifest {n} decided it", t.id),
                    );
                }
            }
        }
    }
    found
}

/// What a replay saw.
#[derive(Debug)]
struct Replayed {
    /// Safety violations at the stops, in order.
    violations: Vec<Violation>,
    /// Points the incarnations stopped at.
    stops: Vec<String>,
}

/// Replays `trace` against the runtime, broken as `broken` says (`None`: the real one).
async fn replay(trace: &Trace, broken: Option<Broken>) -> Result<Replayed, ReplayError> {
    let incarnations = plan(trace)?;
    let broker = broker_with_input(trace.records, 1, &share_config()).await;
    let mut run = Run::new(broker, memory_storage("trace"));
    run.parallelism = 1;
    run.restarts = 0;
    run.max_poll_records = 1;
    run.txn_timeout = TXN_TIMEOUT;
    let mut violations = Vec::new();
    let mut stops = Vec::new();
    for inc in incarnations {
        let (job, _, _) = run.job();
        job.failpoints().break_protocol(broken);
        job.failpoints().arm(inc.stop.0, inc.stop.1);
        match job.run().await {
            Err(RuntimeError::InjectedCrash(point)) if point == inc.stop.0 => stops.push(point),
            other => {
                return Err(ReplayError::Diverged {
                    step: inc.step,
                    reason: format!("expected a stop at {} (hit {}), got {other:?}", inc.stop.0, inc.stop.1 + 1),
                })
            }
        }
        violations.extend(check(&run, trace.records, inc.step).await);
        tokio::time::advance(inc.then_advance).await;
    }
    // To quiescence, with the protocol as it is.
    run.restarts = 3;
    let (job, _, _) = run.job();
    job.run().await.map_err(|e| ReplayError::Diverged {
        step: trace.actions.len(),
        reason: format!("the final run did not finish: {e}"),
    })?;
    assert_exactly_once(&run.check().await, trace.records, "the final run");
    assert!(
        run.broker.pending_transactions().await.unwrap().is_empty(),
        "a transaction was left undecided at quiescence"
    );
    Ok(Replayed { violations, stops })
}

fn load(name: &str) -> Trace {
    let path = checkout_file(&format!("tests/traces/{name}")).display().to_string();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The trace replays on the real runtime with every property kept, and on the runtime
/// broken as the model was, the property the model named breaks.
async fn real_keeps_and_broken_breaks(name: &str, broken: Broken) {
    let trace = load(name);
    let real = replay(&trace, None).await.unwrap_or_else(|e| panic!("{name}, real runtime: {e}"));
    println!("{name}: real runtime stopped at {:?}", real.stops);
    assert!(real.violations.is_empty(), "{name}: the real runtime broke {:?}", real.violations);
    let bad = replay(&trace, Some(broken)).await.unwrap_or_else(|e| panic!("{name}, {broken:?}: {e}"));
    println!("{name}: broken runtime stopped at {:?}, violations {:?}", bad.stops, bad.violations);
    assert!(
        bad.violations.iter().any(|v| v.property == trace.property),
        "{name}: the runtime broken as {broken:?} ({}) kept `{}`: {:?}",
        trace.bug,
        trace.property,
        bad.violations
    );
}

#[tokio::test(start_paused = true)]
async fn commit_before_manifest_trace_replays_against_the_runtime() {
    real_keeps_and_broken_breaks("commit_before_manifest.trace", Broken::CommitBeforeManifest).await;
}

#[tokio::test(start_paused = true)]
async fn recovery_aborts_decided_trace_replays_against_the_runtime() {
    real_keeps_and_broken_breaks("recovery_aborts_decided.trace", Broken::RecoveryAbortsDecided).await;
}

#[test]
fn a_trace_maps_to_stops_and_time() {
    let trace = parse(
        "config: instances=1 records=2\nbug: X\nproperty: p\n\
         Restart(0)\nRecover(0)\nStart(0)\nPoll(Live(0))\nStage(Live(0))\nPoll(Live(0))\nCrash(0)\nLockExpiry\n\
         Restart(0)\nRecover(0)\nStart(0)\nPoll(Live(0))\nStage(Live(0))\nSink(Live(0))\n",
    )
    .unwrap();
    assert_eq!(
        plan(&trace).unwrap(),
        vec![
            // The second poll of the first incarnation, then a lock's worth of time.
            Incarnation {
                stop: (shareflow::connector::points::SOURCE_AFTER_POLL, 1),
                step: 7,
                then_advance: LOCK + Duration::from_millis(1)
            },
            // Hits count per incarnation: the end of the trace, its first sink.
            Incarnation {
                stop: (shareflow::connector::points::SINK_AFTER_WRITE, 0),
                step: 14,
                then_advance: Duration::ZERO
            },
        ]
    );
}

#[test]
fn traces_the_replay_cannot_carry_out_are_refused_by_name() {
    let head = "config: instances=1 records=1\nbug: X\nproperty: p\n";
    let started = "Restart(0)\nRecover(0)\nStart(0)\n";
    let cases = [
        (format!("{started}Pause(0)\n"), "paused incarnations"),
        (format!("{started}Poll(Live(0))\nLockExpiry\n"), "time passing while the instance runs"),
        ("Restart(0)\nCrash(0)\n".to_string(), "a crash before the incarnation reached"),
        (
            format!("{started}Poll(Live(0))\nBarrier(Live(0))\nCrash(0)\n"),
            "right after a step that has no runtime point",
        ),
        (format!("{started}Poll(Live(0))\nBarrier(Live(0))\n"), "ends after a step that has no runtime point"),
        (format!("{started}Poll(Live(0))\nPrepare(Live(0))\nWriteManifest(Live(0), Error)\n"), "store faults"),
        (format!("{started}AdoptClaim(0)\n"), "one instance"),
    ];
    for (tail, needle) in cases {
        let trace = parse(&format!("{head}{tail}")).unwrap();
        let e = plan(&trace).expect_err(needle);
        assert!(matches!(e, ReplayError::Unsupported { .. }) && e.to_string().contains(needle), "{needle}: {e}");
    }
    let bad = [
        ("config: instances=2 records=1\nbug: X\nproperty: p\nRestart(0)\n", "the replay runs one instance"),
        ("config: instances=1\nbug: X\nproperty: p\nRestart(0)\n", "records="),
        ("config: instances=1 records=1\nproperty: p\nRestart(0)\n", "no `bug:`"),
        ("config: instances=1 records=1\nbug: X\nproperty: p\nPoll(Live(0)\n", "unbalanced"),
        ("config: instances=1 records=one\nbug: X\nproperty: p\n", "not a number"),
        ("config: instances=1 records=1\nbug: X\nproperty: p\n42\n", "not an action"),
    ];
    for (text, needle) in bad {
        let e = parse(text).expect_err(needle);
        assert!(matches!(e, ReplayError::Malformed { .. }) && e.to_string().contains(needle), "{needle}: {e}");
    }
}
