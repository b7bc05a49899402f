//! Named failpoints: a test arms one, and the job "crashes" the moment it is reached.
//!
//! The runtime's points (DESIGN.md §4) are listed in [`points`]. Connectors add their
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
    /// Every runtime failpoint.
    pub const ALL: &[&str] = &[
        AFTER_STATE_BEFORE_MANIFEST,
        AFTER_MANIFEST,
        COMMIT_BEFORE,
        COMMIT_MID,
        COMMIT_AFTER_BROKER_BEFORE_NOTIFY,
        RECOVERY_MID,
    ];
}

#[derive(Debug, Clone, Copy)]
struct Armed {
    /// Hits to let pass before firing.
    skip: u32,
    /// Remaining firings.
    fire: u32,
}

/// A registry of armed failpoints, shared by everything in a job. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    armed: Arc<Mutex<HashMap<String, Armed>>>,
    /// Crashes to happen one after the other: only the head is armed.
    schedule: Arc<Mutex<std::collections::VecDeque<(String, u32)>>>,
    fired: Arc<Mutex<Vec<String>>>,
}

impl Failpoints {
    /// No failpoint armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires `name` once, on its `(skip + 1)`-th hit.
    pub fn arm(&self, name: &str, skip: u32) {
        self.armed.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), Armed { skip, fire: 1 });
    }

    /// Arms a sequence of crashes: `(name, skip)` pairs fired one after the other, each
    /// armed only once the previous one fired. Replaces any earlier schedule.
    pub fn schedule(&self, crashes: Vec<(String, u32)>) {
        *self.schedule.lock().unwrap_or_else(|p| p.into_inner()) = crashes.into();
    }

    /// Disarms everything.
    pub fn clear(&self) {
        self.armed.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.schedule.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The failpoints that fired, in order.
    pub fn fired(&self) -> Vec<String> {
        self.fired.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Passes, or returns [`RuntimeError::InjectedCrash`] if `name` is armed and due.
    pub fn hit(&self, name: &str) -> Result<()> {
        {
            let mut schedule = self.schedule.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((head, skip)) = schedule.front_mut() {
                if head == name {
                    if *skip > 0 {
                        *skip -= 1;
                    } else {
                        schedule.pop_front();
                        drop(schedule);
                        return self.fire(name);
                    }
                }
            }
        }
        let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
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
        self.fired.lock().unwrap_or_else(|p| p.into_inner()).push(name.to_string());
        Err(RuntimeError::InjectedCrash(name.to_string()))
    }

    /// Crashes of the schedule that have not fired yet.
    pub fn scheduled(&self) -> usize {
        self.schedule.lock().unwrap_or_else(|p| p.into_inner()).len()
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
    fn a_schedule_fires_in_order() {
        let f = Failpoints::new();
        f.schedule(vec![("a".into(), 1), ("b".into(), 0)]);
        assert!(f.hit("b").is_ok(), "b waits for a");
        assert!(f.hit("a").is_ok(), "a skips once");
        assert!(f.hit("a").is_err());
        assert!(f.hit("a").is_ok(), "a fired already");
        assert!(f.hit("b").is_err());
        assert_eq!(f.fired(), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(f.scheduled(), 0);
    }
}
