//! Counterexamples written out as text, read back, and replayed on the model.
//!
//! A trace file is what a runtime test replays (`tests/model_traces.rs` of the root
//! workspace): the configuration it was found in, the property it violates, then one
//! action per line in the form the checker prints them (`Poll(Live(0))`,
//! `WriteManifest(Live(0), Ok)`, `LockExpiry`). Lines starting with `#` are comments.
//!
//! ```text
//! # shareflow model counterexample
//! config: instances=1 records=2 checkpoints=3 crashes=1 pauses=0 lock_expiries=1 txn_timeouts=1 store_faults=1 delivery_limit=2
//! bug: CommitBeforeManifest
//! property: no commit without a manifest that decided it
//! Restart(0)
//! Recover(0)
//! ```

use std::fmt::{self, Write as _};

use stateright::{Expectation, Model};

use crate::{Action, Bug, Config, ProtocolModel, Store, Sys, Who};

/// A counterexample: the configuration it was found in, the property it violates, and
/// the actions from the initial state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The configuration, bug included.
    pub config: Config,
    /// The violated property's name, as `ProtocolModel::properties` names it.
    pub property: String,
    /// The actions, in order.
    pub actions: Vec<Action>,
}

/// Why a trace file could not be read, or did not replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// 1-based line of the file (0: the file as a whole), or step of the replay.
    pub line: usize,
    /// `true`: `line` is a step of a replay, not a line of the file.
    pub in_replay: bool,
    /// What is wrong, and what to do.
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.in_replay { "replay step" } else { "trace line" };
        write!(f, "{what} {}: {}", self.line, self.message)
    }
}

impl std::error::Error for TraceError {}

fn err(line: usize, message: impl Into<String>) -> TraceError {
    TraceError { line, in_replay: false, message: message.into() }
}

fn step_err(step: usize, message: impl Into<String>) -> TraceError {
    TraceError { line: step, in_replay: true, message: message.into() }
}

const CONFIG_KEYS: [&str; 9] = [
    "instances",
    "records",
    "checkpoints",
    "crashes",
    "pauses",
    "lock_expiries",
    "txn_timeouts",
    "store_faults",
    "delivery_limit",
];

impl Trace {
    /// The trace of a path the checker found.
    pub fn of_path(config: Config, property: &str, path: &stateright::Path<Sys, Action>) -> Self {
        let actions = path.clone().into_actions();
        Trace { config, property: property.to_string(), actions }
    }

    /// The text form (see the module docs).
    pub fn to_text(&self) -> String {
        let c = &self.config;
        let mut out = String::from("# shareflow model counterexample (model/src/trace.rs)\n");
        let values = [
            u64::from(c.instances),
            u64::from(c.records),
            c.checkpoints,
            u64::from(c.crashes),
            u64::from(c.pauses),
            u64::from(c.lock_expiries),
            u64::from(c.txn_timeouts),
            u64::from(c.store_faults),
            u64::from(c.delivery_limit),
        ];
        let mut pairs: Vec<String> = CONFIG_KEYS.iter().zip(values).map(|(k, v)| format!("{k}={v}")).collect();
        if c.stateful {
            pairs.push("stateful=1".into());
        }
        let _ = writeln!(out, "config: {}", pairs.join(" "));
        let _ = writeln!(out, "bug: {:?}", c.bug);
        let _ = writeln!(out, "property: {}", self.property);
        for a in &self.actions {
            let _ = writeln!(out, "{a:?}");
        }
        out
    }

    /// Reads the text form back. Every header line is required, once.
    pub fn parse(text: &str) -> Result<Self, TraceError> {
        let mut config = None;
        let mut bug = None;
        let mut property = None;
        let mut actions = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("config:") {
                if config.is_some() {
                    return Err(err(n, "a second `config:` line"));
                }
                config = Some(parse_config(n, rest)?);
            } else if let Some(rest) = line.strip_prefix("bug:") {
                if bug.is_some() {
                    return Err(err(n, "a second `bug:` line"));
                }
                bug = Some(parse_bug(n, rest.trim())?);
            } else if let Some(rest) = line.strip_prefix("property:") {
                if property.is_some() {
                    return Err(err(n, "a second `property:` line"));
                }
                property = Some(rest.trim().to_string());
            } else {
                if config.is_none() || bug.is_none() || property.is_none() {
                    return Err(err(n, "an action before the `config:`, `bug:` and `property:` lines"));
                }
                actions.push(parse_action(n, line)?);
            }
        }
        let Some(mut config) = config else { return Err(err(0, "no `config:` line")) };
        let Some(bug) = bug else { return Err(err(0, "no `bug:` line")) };
        let Some(property) = property else { return Err(err(0, "no `property:` line")) };
        if actions.is_empty() {
            return Err(err(0, "no actions"));
        }
        config.bug = bug;
        Ok(Trace { config, property, actions })
    }

    /// Replays the actions on the model of `config` (the trace's own, or another bug's):
    /// each must be enabled where it is taken. Returns the state reached.
    pub fn replay(&self, config: Config) -> Result<Sys, TraceError> {
        let model = ProtocolModel::new(config);
        let mut state = model.init_states().remove(0);
        for (i, &action) in self.actions.iter().enumerate() {
            let mut enabled = Vec::new();
            model.actions(&state, &mut enabled);
            if !enabled.contains(&action) {
                return Err(step_err(i + 1, format!("{action:?} is not enabled here (enabled: {enabled:?})")));
            }
            state = model
                .next_state(&state, action)
                .ok_or_else(|| step_err(i + 1, format!("{action:?} is enabled but cannot happen here")))?;
        }
        Ok(state)
    }

    /// The always-properties of `config` that `state` violates, by name.
    pub fn violated(config: Config, state: &Sys) -> Vec<&'static str> {
        let model = ProtocolModel::new(config);
        model
            .properties()
            .into_iter()
            .filter(|p| p.expectation == Expectation::Always && !(p.condition)(&model, state))
            .map(|p| p.name)
            .collect()
    }
}

fn parse_config(line: usize, text: &str) -> Result<Config, TraceError> {
    let mut values = [None::<u64>; 9];
    let mut stateful = false;
    for pair in text.split_whitespace() {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(err(line, format!("`{pair}` is not key=value")));
        };
        // Optional, and only written when set: older traces have no such key.
        if key == "stateful" {
            stateful = value == "1";
            continue;
        }
        let Some(at) = CONFIG_KEYS.iter().position(|k| *k == key) else {
            return Err(err(line, format!("unknown config key `{key}`; known: {}", CONFIG_KEYS.join(", "))));
        };
        let v = value.parse::<u64>().map_err(|_| err(line, format!("`{key}={value}` is not a number")))?;
        values[at] = Some(v);
    }
    let mut got = [0u64; 9];
    for (i, v) in values.iter().enumerate() {
        got[i] = v.ok_or_else(|| err(line, format!("config key `{}` is missing", CONFIG_KEYS[i])))?;
    }
    let small = |i: usize| -> Result<u8, TraceError> {
        u8::try_from(got[i]).map_err(|_| err(line, format!("`{}` = {} is too large", CONFIG_KEYS[i], got[i])))
    };
    Ok(Config {
        instances: small(0)?,
        records: small(1)?,
        checkpoints: got[2],
        crashes: small(3)?,
        pauses: small(4)?,
        lock_expiries: small(5)?,
        txn_timeouts: small(6)?,
        store_faults: small(7)?,
        delivery_limit: u16::try_from(got[8]).map_err(|_| err(line, "`delivery_limit` is too large"))?,
        stateful,
        bug: Bug::None,
    })
}

fn parse_bug(line: usize, name: &str) -> Result<Bug, TraceError> {
    Ok(match name {
        "None" => Bug::None,
        "CommitBeforeManifest" => Bug::CommitBeforeManifest,
        "SkipFencing" => Bug::SkipFencing,
        "RecoveryAbortsDecided" => Bug::RecoveryAbortsDecided,
        "AckBeforeStaging" => Bug::AckBeforeStaging,
        "AdoptWithoutFence" => Bug::AdoptWithoutFence,
        "NoTombstone" => Bug::NoTombstone,
        "RecoveryLeavesPrepared" => Bug::RecoveryLeavesPrepared,
        other => return Err(err(line, format!("unknown bug `{other}`"))),
    })
}

/// `Name` or `Name(arg, arg)`, where an argument may itself be `Name(arg)`.
fn parse_action(line: usize, text: &str) -> Result<Action, TraceError> {
    if text.matches('(').count() != text.matches(')').count() {
        return Err(err(line, format!("`{text}`: unbalanced parentheses")));
    }
    let (name, args) = match text.split_once('(') {
        None => (text, Vec::new()),
        Some((name, rest)) => {
            let inner = rest.strip_suffix(')').ok_or_else(|| err(line, format!("`{text}`: unbalanced parentheses")))?;
            (name, split_args(inner))
        }
    };
    let want = |n: usize| -> Result<(), TraceError> {
        if args.len() == n {
            Ok(())
        } else {
            Err(err(line, format!("`{text}`: {name} takes {n} argument(s), found {}", args.len())))
        }
    };
    let inst = |s: &str| -> Result<u8, TraceError> {
        s.parse::<u8>().map_err(|_| err(line, format!("`{text}`: `{s}` is not an instance number")))
    };
    let who = |s: &str| -> Result<Who, TraceError> {
        if let Some(i) = s.strip_prefix("Live(").and_then(|r| r.strip_suffix(')')) {
            Ok(Who::Live(inst(i)?))
        } else if let Some(i) = s.strip_prefix("Zombie(").and_then(|r| r.strip_suffix(')')) {
            Ok(Who::Zombie(inst(i)?))
        } else {
            Err(err(line, format!("`{text}`: `{s}` is neither Live(i) nor Zombie(i)")))
        }
    };
    let action = match name {
        "Restart" | "Recover" | "Start" | "Crash" | "Pause" | "AdoptClaim" | "AdoptFence" | "AdoptDecide"
        | "AdoptDone" | "Vanish" => {
            want(1)?;
            let i = inst(&args[0])?;
            match name {
                "Restart" => Action::Restart(i),
                "Recover" => Action::Recover(i),
                "Start" => Action::Start(i),
                "Crash" => Action::Crash(i),
                "Pause" => Action::Pause(i),
                "AdoptClaim" => Action::AdoptClaim(i),
                "AdoptFence" => Action::AdoptFence(i),
                "AdoptDecide" => Action::AdoptDecide(i),
                "AdoptDone" => Action::AdoptDone(i),
                _ => Action::Vanish(i),
            }
        }
        "Poll" | "Stage" | "Sink" | "Barrier" | "Prepare" | "Commit" => {
            want(1)?;
            let w = who(&args[0])?;
            match name {
                "Poll" => Action::Poll(w),
                "Stage" => Action::Stage(w),
                "Sink" => Action::Sink(w),
                "Barrier" => Action::Barrier(w),
                "Prepare" => Action::Prepare(w),
                _ => Action::Commit(w),
            }
        }
        "WriteManifest" => {
            want(2)?;
            let store = match args[1].as_str() {
                "Ok" => Store::Ok,
                "Error" => Store::Error,
                "AppliedThenTimeout" => Store::AppliedThenTimeout,
                other => return Err(err(line, format!("`{text}`: unknown store outcome `{other}`"))),
            };
            Action::WriteManifest(who(&args[0])?, store)
        }
        "LockExpiry" | "TxnTimeout" | "Time" => {
            want(0)?;
            match name {
                "LockExpiry" => Action::LockExpiry,
                "TxnTimeout" => Action::TxnTimeout,
                _ => Action::Time,
            }
        }
        other => return Err(err(line, format!("unknown action `{other}`"))),
    };
    Ok(action)
}

/// Splits `a, B(c), d` at the commas outside parentheses.
fn split_args(inner: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for ch in inner.chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                args.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.trim().is_empty() {
        args.push(cur.trim().to_string());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        Trace {
            config: Config::ci_one().with_bug(Bug::CommitBeforeManifest),
            property: "no commit without a manifest that decided it".into(),
            actions: vec![
                Action::Restart(0),
                Action::Poll(Who::Live(0)),
                Action::WriteManifest(Who::Zombie(1), Store::AppliedThenTimeout),
                Action::LockExpiry,
                Action::Vanish(1),
            ],
        }
    }

    #[test]
    fn text_round_trips() {
        let t = sample();
        assert_eq!(Trace::parse(&t.to_text()), Ok(t));
    }

    #[test]
    fn bad_files_name_the_line_and_the_fault() {
        let text = sample().to_text();
        let cases: Vec<(String, usize, &str)> = vec![
            (text.replace("Poll(Live(0))", "Poll(Live(0)"), 6, "unbalanced"),
            (text.replace("Poll(Live(0))", "Poll(Dead(0))"), 6, "neither Live"),
            (text.replace("Poll(Live(0))", "Jump(0)"), 6, "unknown action"),
            (text.replace("Restart(0)", "Restart(0, 1)"), 5, "takes 1 argument"),
            (text.replace("AppliedThenTimeout", "Maybe"), 7, "unknown store outcome"),
            (text.replace("bug: CommitBeforeManifest", "bug: Gremlins"), 3, "unknown bug"),
            (text.replace("records=2", "records=x"), 2, "not a number"),
            (text.replace("records=2 ", ""), 2, "`records` is missing"),
            (text.replace("records=2", "records=2 colour=3"), 2, "unknown config key"),
            (text.replace("property: ", "# property: "), 5, "an action before the `config:`"),
            (text.lines().take(4).collect::<Vec<_>>().join("\n"), 0, "no actions"),
        ];
        for (bad, line, needle) in cases {
            let e = Trace::parse(&bad).expect_err(needle);
            assert_eq!(e.line, line, "{needle}: {e}");
            assert!(e.message.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn an_action_the_model_does_not_enable_is_refused_by_step() {
        // The first action of any run is a start: a poll before it cannot happen.
        let t = Trace { actions: vec![Action::Poll(Who::Live(0))], ..sample() };
        let e = t.replay(Config::ci_one()).expect_err("poll before start");
        assert_eq!((e.line, e.in_replay), (1, true));
        assert!(e.to_string().starts_with("replay step 1: Poll(Live(0)) is not enabled"), "{e}");
    }
}
