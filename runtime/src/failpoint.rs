//! Named failpoints: a test arms one, and the job "crashes" the moment it is reached.
//!
//! The runtime's points (docs/design.md §4) are listed in [`points`]. Connectors add their
//! own (`source.after_poll`, `sink.after_write`, ...) through the same registry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{Result, RuntimeError};

/// The runtime's failpoint names.
pub mod points {
    /// State of checkpoint n is written and every participant prepared; no manifest yet.
    pub const AFTER_STATE_BEFORE_MANIFEST: &str = "checkpoint.after_state_before_manifest";
    /// The manifest of n is written; nothing committed yet. Recovery must commit.
    pub const AFTER_MANIFEST: &str = "checkpoint.after_manifest";
    /// About to commit the participants' transactions.
    pub const COMMIT_BEFORE: &str = "commit.before";
    /// Some participants committed, others not (a lost response, then a crash).
    pub const COMMIT_MID: &str = "commit.mid";
    /// Every participant committed; operators not yet notified.
    pub const COMMIT_AFTER_BROKER_BEFORE_NOTIFY: &str = "commit.after_broker_before_notify";
    /// Recovery resolved some pending transactions, not all.
    pub const RECOVERY_MID: &str = "recovery.mid";
    /// Recovery decided every pending transaction and restored the state; no task runs
    /// yet.
    pub const AFTER_RECOVERY: &str = "recovery.after";
    /// An adopter claimed a silent instance, fenced it and recorded its plan; none of
    /// its transactions is decided yet (decision 0007). Only instances reach it.
    pub const ADOPTION_MID: &str = "adoption.mid";
    /// Every failpoint a lone job (not an instance of a group) reaches.
    pub const ALL: &[&str] = &[
        AFTER_STATE_BEFORE_MANIFEST,
        AFTER_MANIFEST,
        COMMIT_BEFORE,
        COMMIT_MID,
        COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
        RECOVERY_MID,
        AFTER_RECOVERY,
    ];
}

/// A deliberately broken variant of the commit protocol, the runtime's counterpart of
/// the model's broken variants (docs/model.md). The tests that replay the model's
/// counterexamples against the runtime select one to show that the replay catches what
/// the model caught. Only the `testing` feature can select one
/// ([`Failpoints::break_protocol`]); without it neither this type nor any branch that
/// consults it is compiled.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Broken {
    /// The coordinator commits T(n) after prepare, before it writes the manifest.
    CommitBeforeManifest,
    /// Recovery aborts every pending transaction, including those a manifest decided.
    RecoveryAbortsDecided,
}

#[derive(Debug, Clone, Copy)]
struct Armed {
    /// Hits to let pass before firing.
    skip: u32,
    /// Remaining firings.
    fire: u32,
}

/// One crash of a schedule that has not fired yet.
#[derive(Debug, Clone)]
struct Pending {
    name: String,
    /// Hits of `name` still to let pass; 0: fires on the next hit.
    skip: u32,
}

#[derive(Debug, Default)]
struct Schedule {
    /// Crashes not fired yet, in the order they were scheduled.
    pending: Vec<Pending>,
    /// Crashes scheduled by the last [`Failpoints::schedule`] call.
    total: usize,
}

/// A registry of armed failpoints, shared by everything in a job. Cheap to clone.
///
/// Two ways to arm a crash:
/// - [`arm`](Self::arm): one named point, fired on its `(skip + 1)`-th hit;
/// - [`schedule`](Self::schedule): several crashes for a run with restarts. Every crash
///   of a schedule is armed at once and counts the hits of its own point, so a crash at
///   a point the run no longer reaches (a source point once the input is drained,
///   `recovery.mid` when no crash left decided work) never holds back the others. The
///   crashes that never fire are reported by [`unfired`](Self::unfired).
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    armed: Arc<Mutex<HashMap<String, Armed>>>,
    schedule: Arc<Mutex<Schedule>>,
    fired: Arc<Mutex<Vec<String>>>,
    #[cfg(feature = "testing")]
    broken: Arc<Mutex<Option<Broken>>>,
}

impl Failpoints {
    /// No failpoint armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires `name` once, on its `(skip + 1)`-th hit.
    pub fn arm(&self, name: &str, skip: u32) {
        shareflow_checkpoint::sync::lock(&self.armed).insert(name.to_string(), Armed { skip, fire: 1 });
    }

    /// Schedules crashes for a run with restarts: each `(name, skip)` fires once, on the
    /// `(skip + 1)`-th hit of `name` counted from this call, across restarts. All are armed
    /// at once, so they fire in the order the run reaches them, not in list order, and
    /// one the run never reaches again does not stall the rest. A hit fires at most one
    /// crash: when two crashes of the same point are due together, the earlier in the list
    /// fires and the other fires on the next hit. Replaces any earlier schedule.
    pub fn schedule(&self, crashes: Vec<(String, u32)>) {
        let mut schedule = shareflow_checkpoint::sync::lock(&self.schedule);
        schedule.total = crashes.len();
        schedule.pending = crashes.into_iter().map(|(name, skip)| Pending { name, skip }).collect();
    }

    /// Disarms everything.
    pub fn clear(&self) {
        shareflow_checkpoint::sync::lock(&self.armed).clear();
        let mut schedule = shareflow_checkpoint::sync::lock(&self.schedule);
        schedule.pending.clear();
        schedule.total = 0;
    }

    /// The failpoints that fired, in order.
    pub fn fired(&self) -> Vec<String> {
        shareflow_checkpoint::sync::lock(&self.fired).clone()
    }

    /// Passes, or returns [`RuntimeError::InjectedCrash`] if `name` is armed and due.
    pub fn hit(&self, name: &str) -> Result<()> {
        {
            let mut schedule = shareflow_checkpoint::sync::lock(&self.schedule);
            let mut due = None;
            for (i, crash) in schedule.pending.iter_mut().enumerate().filter(|(_, c)| c.name == name) {
                if crash.skip > 0 {
                    crash.skip -= 1;
                } else if due.is_none() {
                    due = Some(i);
                }
            }
            if let Some(i) = due {
                schedule.pending.remove(i);
                drop(schedule);
                return self.fire(name);
            }
        }
        let mut armed = shareflow_checkpoint::sync::lock(&self.armed);
        let Some(a) = armed.get_mut(name) else { return Ok(()) };
        if a.skip > 0 {
            a.skip -= 1;
            return Ok(());
        }
        if a.fire == 0 {
            return Ok(());
        }
        a.fire -= 1;
        drop(armed);
        self.fire(name)
    }

    fn fire(&self, name: &str) -> Result<()> {
        tracing::warn!(failpoint = name, "injected crash");
        shareflow_checkpoint::sync::lock(&self.fired).push(name.to_string());
        Err(RuntimeError::InjectedCrash(name.to_string()))
    }

    /// Runs the job with a broken variant of the protocol (tests only).
    #[cfg(feature = "testing")]
    pub fn break_protocol(&self, broken: Option<Broken>) {
        *shareflow_checkpoint::sync::lock(&self.broken) = broken;
    }

    /// Whether the protocol is broken as `broken` says.
    #[cfg(feature = "testing")]
    pub(crate) fn is_broken(&self, broken: Broken) -> bool {
        *shareflow_checkpoint::sync::lock(&self.broken) == Some(broken)
    }

    /// Crashes of the schedule that have not fired yet.
    pub fn scheduled(&self) -> usize {
        shareflow_checkpoint::sync::lock(&self.schedule).pending.len()
    }

    /// How many crashes the last [`schedule`](Self::schedule) call asked for.
    #[cfg(test)]
    pub(crate) fn scheduled_total(&self) -> usize {
        shareflow_checkpoint::sync::lock(&self.schedule).total
    }

    /// The points of the scheduled crashes that have not fired (yet), in schedule order.
    pub fn unfired(&self) -> Vec<String> {
        shareflow_checkpoint::sync::lock(&self.schedule).pending.iter().map(|c| c.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_after_skips() {
        let f = Failpoints::new();
        f.arm("x", 2);
        assert!(f.hit("x").is_ok());
        assert!(f.hit("x").is_ok());
        assert!(matches!(f.hit("x"), Err(RuntimeError::InjectedCrash(n)) if n == "x"));
        assert!(f.hit("x").is_ok());
        assert!(f.hit("y").is_ok());
        assert_eq!(f.fired(), vec!["x".to_string()]);
    }

    #[test]
    fn every_crash_of_a_schedule_is_armed_at_once() {
        let f = Failpoints::new();
        f.schedule(vec![("a".into(), 1), ("b".into(), 0), ("never".into(), 0)]);
        assert_eq!(f.scheduled_total(), 3);
        // b does not wait for a: a point the run no longer reaches cannot stall the rest.
        assert!(f.hit("b").is_err(), "b fires on its first hit");
        assert!(f.hit("b").is_ok(), "b fired already");
        assert!(f.hit("a").is_ok(), "a skips once");
        assert!(f.hit("a").is_err());
        assert!(f.hit("a").is_ok(), "a fired already");
        assert_eq!(f.fired(), vec!["b".to_string(), "a".to_string()]);
        assert_eq!(f.scheduled(), 1);
        assert_eq!(f.unfired(), vec!["never".to_string()]);
    }

    #[test]
    fn skips_count_from_the_schedule_not_from_the_previous_crash() {
        let f = Failpoints::new();
        f.schedule(vec![("a".into(), 0), ("b".into(), 2)]);
        assert!(f.hit("b").is_ok());
        assert!(f.hit("b").is_ok());
        assert!(f.hit("a").is_err());
        assert!(f.hit("b").is_err(), "b's two skips passed before a fired");
        assert_eq!(f.scheduled(), 0);
    }

    #[test]
    fn one_hit_fires_at_most_one_crash() {
        let f = Failpoints::new();
        f.schedule(vec![("a".into(), 1), ("a".into(), 0), ("a".into(), 0)]);
        assert!(f.hit("a").is_err(), "the second entry is due first");
        assert!(f.hit("a").is_err(), "the first entry's skip passed on the first hit; it is due with the third");
        assert!(f.hit("a").is_err());
        assert!(f.hit("a").is_ok());
        assert_eq!(f.fired().len(), 3);
        assert!(f.unfired().is_empty());
    }

    #[test]
    fn clear_disarms_the_schedule() {
        let f = Failpoints::new();
        f.schedule(vec![("a".into(), 0)]);
        f.clear();
        assert!(f.hit("a").is_ok());
        assert_eq!((f.scheduled(), f.scheduled_total()), (0, 0));
    }
}
