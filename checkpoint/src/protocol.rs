//! Pure recovery decisions. Storage code observes the store, passes the facts in, and
//! carries out the plan that comes back. Nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};

use crate::manifest::Manifest;
use crate::paths::{CheckpointPaths, SHARED_STATE_NAME};
use crate::CheckpointId;

mod keyed;
pub use keyed::{check_keyed_instances, plan_keyed_restore, KeyedRestore};

/// What a checkpoint's manifest looked like when observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestStatus {
    /// No manifest: the checkpoint never completed (or is still being written).
    Missing,
    /// A manifest that fails verification.
    Corrupt {
        /// Why.
        reason: String,
    },
    /// A manifest that decoded and verified.
    Valid(Manifest),
    /// Recovery aborted this checkpoint's transactions and left a tombstone: whatever
    /// manifest appears here (a fenced, paused incarnation may still write one) decides
    /// nothing.
    Aborted,
}

/// One checkpoint directory as observed by LIST (and GET of its manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedCheckpoint {
    /// Checkpoint id.
    pub checkpoint_id: CheckpointId,
    /// The manifest.
    pub manifest: ManifestStatus,
    /// State files present: file name -> size.
    pub files: BTreeMap<String, u64>,
}

/// Everything recovery needs to know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Checkpoints found, in any order.
    pub checkpoints: Vec<ObservedCheckpoint>,
    /// Checkpoints whose state failed checksum verification while restoring, with why.
    pub failed_verification: BTreeMap<CheckpointId, String>,
}

/// How many checkpoints to keep, and which must never be deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Complete checkpoints to keep (at least 1).
    pub retain: usize,
    /// Checkpoints that a PREPARE transaction still needs.
    pub protected: BTreeSet<CheckpointId>,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self { retain: 3, protected: BTreeSet::new() }
    }
}

/// The classification of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointStatus {
    /// Manifest valid and every state file present with its recorded size.
    Complete,
    /// No manifest.
    Incomplete,
    /// Present but unusable; kept for inspection, never deleted automatically.
    Corrupt {
        /// Why.
        reason: String,
    },
    /// Recovery aborted its transactions: never restored, and never deleted (the
    /// tombstone must outlive any late manifest).
    Aborted,
}

/// What to restore from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryDecision {
    /// No complete checkpoint exists: start from the beginning.
    Fresh,
    /// Restore this checkpoint, the newest complete and verifiable one.
    Restore(Manifest),
}

/// Why a checkpoint may be deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectReason {
    /// Complete, but older than the checkpoints retention keeps.
    Superseded,
    /// Never completed, and older than the restore point.
    Incomplete,
}

/// A recovery plan: what to restore, what to delete, and what to warn about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// The restore point.
    pub decision: RecoveryDecision,
    /// Checkpoints to delete, oldest first.
    pub collect: Vec<(CheckpointId, CollectReason)>,
    /// Corrupt checkpoints newer than the restore point, skipped, with the reason; oldest first.
    pub skipped: Vec<(CheckpointId, String)>,
    /// The smallest checkpoint id not seen anywhere: the next one to use.
    pub next_checkpoint_id: CheckpointId,
}

impl RecoveryPlan {
    /// The restored checkpoint id, if any.
    pub fn restored_id(&self) -> Option<CheckpointId> {
        match &self.decision {
            RecoveryDecision::Fresh => None,
            RecoveryDecision::Restore(m) => Some(m.checkpoint_id),
        }
    }
}

/// Classifies one observed checkpoint.
pub fn classify(c: &ObservedCheckpoint, failed_verification: &BTreeMap<CheckpointId, String>) -> CheckpointStatus {
    let manifest = match &c.manifest {
        ManifestStatus::Missing => return CheckpointStatus::Incomplete,
        ManifestStatus::Aborted => return CheckpointStatus::Aborted,
        ManifestStatus::Corrupt { reason } => return CheckpointStatus::Corrupt { reason: reason.clone() },
        ManifestStatus::Valid(m) => m,
    };
    if manifest.checkpoint_id != c.checkpoint_id {
        return CheckpointStatus::Corrupt {
            reason: format!("manifest says checkpoint {}, directory says {}", manifest.checkpoint_id, c.checkpoint_id),
        };
    }
    for f in manifest.state_files.iter().filter(|f| f.inline.is_none()) {
        if let Some(offset) = f.offset {
            if f.size < crate::envelope::HEADER_LEN as u64 {
                return CheckpointStatus::Corrupt {
                    reason: format!(
                        "the state of {} in {SHARED_STATE_NAME} has {} bytes, less than an envelope",
                        f.label(),
                        f.size
                    ),
                };
            }
            let end = offset.saturating_add(f.size);
            match c.files.get(SHARED_STATE_NAME) {
                None => {
                    return CheckpointStatus::Corrupt {
                        reason: format!("the shared state object {SHARED_STATE_NAME} is missing"),
                    }
                }
                Some(&size) if size < end => {
                    return CheckpointStatus::Corrupt {
                        reason: format!(
                            "the shared state object {SHARED_STATE_NAME} has {size} bytes; the state of {} needs bytes {offset}..{end}",
                            f.label()
                        ),
                    }
                }
                Some(_) => continue,
            }
        }
        let name = CheckpointPaths::state_part_name(&f.operator, f.subtask, f.part).unwrap_or_default();
        match c.files.get(&name) {
            None => return CheckpointStatus::Corrupt { reason: format!("state file {name} is missing") },
            Some(&size) if size != f.size => {
                return CheckpointStatus::Corrupt {
                    reason: format!("state file {name} has {size} bytes, the manifest says {}", f.size),
                }
            }
            Some(_) => {}
        }
    }
    match failed_verification.get(&c.checkpoint_id) {
        Some(reason) => CheckpointStatus::Corrupt { reason: reason.clone() },
        None => CheckpointStatus::Complete,
    }
}

/// Picks the newest complete and verifiable checkpoint and what to garbage-collect.
///
/// Never collects: a corrupt checkpoint, the restore point, a protected checkpoint, or
/// an incomplete checkpoint newer than the restore point (it may be in progress).
pub fn resolve(observed: &Observed, policy: &RetentionPolicy) -> RecoveryPlan {
    let mut sorted: Vec<&ObservedCheckpoint> = observed.checkpoints.iter().collect();
    sorted.sort_by_key(|c| std::cmp::Reverse(c.checkpoint_id));
    let statuses: Vec<(CheckpointId, CheckpointStatus)> =
        sorted.iter().map(|c| (c.checkpoint_id, classify(c, &observed.failed_verification))).collect();

    let restore =
        sorted.iter().zip(&statuses).find(|(_, (_, s))| *s == CheckpointStatus::Complete).and_then(|(c, _)| {
            match &c.manifest {
                ManifestStatus::Valid(m) => Some(m.clone()),
                _ => None,
            }
        });
    let restored_id = restore.as_ref().map(|m| m.checkpoint_id);
    let mut skipped: Vec<(CheckpointId, String)> = statuses
        .iter()
        .filter(|(id, _)| restored_id.is_none_or(|r| *id > r))
        .filter_map(|(id, s)| match s {
            CheckpointStatus::Corrupt { reason } => Some((*id, reason.clone())),
            _ => None,
        })
        .collect();
    skipped.reverse();

    let retain = policy.retain.max(1);
    let mut complete_seen = 0;
    let mut collect = Vec::new();
    for (id, status) in &statuses {
        let protected = policy.protected.contains(id) || Some(*id) == restored_id;
        match status {
            CheckpointStatus::Complete => {
                complete_seen += 1;
                if complete_seen > retain && !protected {
                    collect.push((*id, CollectReason::Superseded));
                }
            }
            CheckpointStatus::Incomplete => {
                if restored_id.is_some_and(|r| *id < r) && !protected {
                    collect.push((*id, CollectReason::Incomplete));
                }
            }
            CheckpointStatus::Corrupt { .. } | CheckpointStatus::Aborted => {}
        }
    }
    collect.reverse();
    let next_checkpoint_id = statuses.first().map_or(1, |(id, _)| id + 1);
    RecoveryPlan {
        decision: restore.map_or(RecoveryDecision::Fresh, RecoveryDecision::Restore),
        collect,
        skipped,
        next_checkpoint_id,
    }
}

/// A transaction a participant reports pending (ONGOING or PREPARE) on recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingTxn {
    /// Which participant reports it (an index the caller chooses).
    pub participant: usize,
    /// The checkpoint its id names: T(n) has checkpoint id n.
    pub checkpoint_id: CheckpointId,
    /// Whether the participant reports it PREPARE.
    pub prepared: bool,
}

/// One step of a commit plan, on one participant's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnAction {
    /// A checkpoint at or before the restored one decided it, and it is PREPARE: commit.
    Commit {
        /// The participant.
        participant: usize,
        /// T(checkpoint_id).
        checkpoint_id: CheckpointId,
    },
    /// A checkpoint decided it, but the participant reports it ONGOING. The manifest is
    /// written only after every participant's prepare returned, so this participant's
    /// prepare left no state it can report (Kafka without KIP-939: a prepare is a flush
    /// and the broker still says Ongoing). Prepare again (idempotent), then commit; a
    /// participant that answers "already aborted" here has lost decided work.
    PrepareAndCommit {
        /// The participant.
        participant: usize,
        /// T(checkpoint_id).
        checkpoint_id: CheckpointId,
    },
    /// No complete checkpoint decided it: abort (records are redelivered, staged
    /// output discarded).
    Abort {
        /// The participant.
        participant: usize,
        /// T(checkpoint_id).
        checkpoint_id: CheckpointId,
    },
}

impl TxnAction {
    /// The checkpoint whose transaction the action is on.
    pub fn checkpoint_id(&self) -> CheckpointId {
        match *self {
            TxnAction::Commit { checkpoint_id, .. }
            | TxnAction::PrepareAndCommit { checkpoint_id, .. }
            | TxnAction::Abort { checkpoint_id, .. } => checkpoint_id,
        }
    }
}

/// docs/design.md §3 step 7, the recovery half of the commit rules (decision 0005): with
/// checkpoint `restored` restored, every pending transaction with checkpoint id <=
/// `restored` commits (prepared first if a participant reports it ONGOING), and every
/// other one aborts. The plan runs in checkpoint-id order; carrying it out is idempotent,
/// so a recovery that crashes half-way plans and runs again.
pub fn plan_recovery(restored: Option<CheckpointId>, pending: &[PendingTxn]) -> Vec<TxnAction> {
    let mut ordered = pending.to_vec();
    ordered.sort_by_key(|t| (t.checkpoint_id, t.participant));
    ordered
        .into_iter()
        .map(|PendingTxn { participant, checkpoint_id, prepared }| {
            match (decides_commit(restored, checkpoint_id), prepared) {
                (true, true) => TxnAction::Commit { participant, checkpoint_id },
                (true, false) => TxnAction::PrepareAndCommit { participant, checkpoint_id },
                (false, _) => TxnAction::Abort { participant, checkpoint_id },
            }
        })
        .collect()
}

/// The rule under [`plan_recovery`]: with checkpoint `restored` the newest complete one,
/// transaction T(`checkpoint_id`) is decided to commit iff `checkpoint_id <= restored`;
/// every other pending transaction is decided to abort. `shareflow txn` checks a decision
/// by hand against the same rule.
pub fn decides_commit(restored: Option<CheckpointId>, checkpoint_id: CheckpointId) -> bool {
    restored.is_some_and(|r| checkpoint_id <= r)
}

/// The completion half of the commit rules: once checkpoint `completed`'s manifest is
/// written, every uncommitted transaction up to it commits, earlier ones included (a
/// checkpoint that failed left its transaction open, and a later one decides it), in
/// checkpoint-id order. Later ones stay open.
pub fn plan_completion(completed: CheckpointId, uncommitted: &BTreeSet<CheckpointId>) -> Vec<CheckpointId> {
    uncommitted.range(..=completed).copied().collect()
}

/// One instance of a share group as the instance registry shows it to an observer
/// (decision 0007). Instances are jobs with their own prefix, sharing the group and the
/// checkpoint root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    /// The instance's transaction prefix (also its job id under the checkpoint root).
    pub prefix: String,
    /// How long its heartbeat has not changed, measured on the observer's own clock
    /// (no clocks are compared across machines).
    pub silent_for: std::time::Duration,
    /// It stopped gracefully after a final committed checkpoint: nobody adopts it.
    pub retired: bool,
    /// The instance that claimed its adoption, if one did. A claim is exclusive and
    /// permanent: the adopted instance never starts again under this prefix.
    pub adopted_by: Option<String>,
    /// The claimed adoption finished: every transaction of the instance is decided.
    pub adoption_done: bool,
}

/// One step an instance takes for another (decision 0007).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdoptionStep {
    /// Finish an adoption this instance owns: one it claimed earlier (and crashed or
    /// was stopped in the middle of), or one claimed by an instance it adopted.
    Resume {
        /// The adopted instance.
        prefix: String,
    },
    /// Claim the adoption of a silent instance, then carry it out.
    Claim {
        /// The silent instance.
        prefix: String,
    },
}

impl AdoptionStep {
    /// The instance the step is about.
    pub fn prefix(&self) -> &str {
        match self {
            AdoptionStep::Resume { prefix } | AdoptionStep::Claim { prefix } => prefix,
        }
    }
}

/// Which instances `me` must adopt, given what the registry shows and the adoption
/// timeout:
/// - never itself, a retired instance, or a finished adoption;
/// - an adoption claimed by `me`, or by an instance `me` adopted, is resumed (the
///   claimant cannot finish it; carrying an adoption out is idempotent);
/// - an adoption claimed by anyone else is theirs (if they die, whoever adopts them
///   inherits it);
/// - an unclaimed instance silent for longer than `timeout` is claimed.
///
/// Resumes come first, then claims, each in prefix order.
pub fn plan_adoption(me: &str, instances: &[InstanceView], timeout: std::time::Duration) -> Vec<AdoptionStep> {
    let adopted_by_me: BTreeSet<&str> =
        instances.iter().filter(|v| v.adopted_by.as_deref() == Some(me)).map(|v| v.prefix.as_str()).collect();
    let mut resume = BTreeSet::new();
    let mut claim = BTreeSet::new();
    for v in instances.iter().filter(|v| v.prefix != me && !v.retired) {
        match v.adopted_by.as_deref() {
            Some(_) if v.adoption_done => {}
            Some(by) if by == me || adopted_by_me.contains(by) => {
                resume.insert(v.prefix.clone());
            }
            Some(_) => {}
            None if v.silent_for > timeout => {
                claim.insert(v.prefix.clone());
            }
            None => {}
        }
    }
    resume
        .into_iter()
        .map(|prefix| AdoptionStep::Resume { prefix })
        .chain(claim.into_iter().map(|prefix| AdoptionStep::Claim { prefix }))
        .collect()
}

/// Whether an instance may start under `prefix`, given what the registry shows of it:
/// `Err(by)` if `by` claimed its adoption (its transactions were or are being decided by
/// another instance, so starting again would decide them twice). A retired or live
/// record does not stop a start: the new incarnation fences the old one.
pub fn check_instance_start(own: Option<&InstanceView>) -> Result<(), String> {
    match own.and_then(|v| v.adopted_by.clone()) {
        Some(by) => Err(by),
        None => Ok(()),
    }
}

/// The prefixes `me` holds: those whose adoption finished under `me`, or under a prefix
/// `me` holds (holding is transitive). Their remaining work is `me`'s: a backend that
/// cannot make a decided transaction give its records back (stock Kafka) replays them.
/// An unfinished adoption is not held yet; [`plan_adoption`] resumes it first.
pub fn held_prefixes(me: &str, instances: &[InstanceView]) -> BTreeSet<String> {
    let mut held: BTreeSet<String> = BTreeSet::new();
    loop {
        let before = held.len();
        for v in instances.iter().filter(|v| v.adoption_done && v.prefix != me) {
            if let Some(by) = v.adopted_by.as_deref() {
                if by == me || held.contains(by) {
                    held.insert(v.prefix.clone());
                }
            }
        }
        if held.len() == before {
            return held;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::StateFileRef;

    fn manifest(id: u64) -> Manifest {
        Manifest {
            job_id: "j".into(),
            checkpoint_id: id,
            created_at_ms: 0,
            state_files: vec![
                StateFileRef {
                    operator: "op".into(),
                    subtask: 0,
                    size: 10,
                    crc32c: 0,
                    inline: None,
                    offset: None,
                    part: 0,
                },
                StateFileRef::inline("small", 0, b"inline state needs no file"),
            ],
            transactions: vec![],
        }
    }

    /// `C` complete, `I` incomplete, `X` corrupt manifest, `M` missing state file, `A`
    /// tombstoned by recovery (a late manifest may or may not be there).
    fn observed(spec: &str) -> Observed {
        let checkpoints = spec
            .chars()
            .enumerate()
            .filter(|(_, c)| *c != '.')
            .map(|(i, c)| {
                let id = i as u64 + 1;
                let mut files = BTreeMap::from([("op-0.state".to_string(), 10)]);
                let manifest = match c {
                    'C' => ManifestStatus::Valid(manifest(id)),
                    'I' => ManifestStatus::Missing,
                    'X' => ManifestStatus::Corrupt { reason: "checksum mismatch".into() },
                    'A' => ManifestStatus::Aborted,
                    'M' => {
                        files.clear();
                        ManifestStatus::Valid(manifest(id))
                    }
                    other => panic!("bad spec {other}"),
                };
                ObservedCheckpoint { checkpoint_id: id, manifest, files }
            })
            .collect();
        Observed { checkpoints, failed_verification: BTreeMap::new() }
    }

    /// (restored, collected, skipped, next checkpoint id)
    type Outcome = (Option<u64>, Vec<(u64, CollectReason)>, Vec<u64>, u64);

    fn plan(spec: &str, retain: usize, protected: &[u64]) -> Outcome {
        let policy = RetentionPolicy { retain, protected: protected.iter().copied().collect() };
        let p = resolve(&observed(spec), &policy);
        (p.restored_id(), p.collect.clone(), p.skipped.iter().map(|s| s.0).collect(), p.next_checkpoint_id)
    }

    use CollectReason::*;

    #[test]
    fn resolution_table() {
        // (checkpoints 1.. as a string, retain, protected) -> (restore, collect, skipped, next id)
        let rows: Vec<(&str, usize, &[u64], Outcome)> = vec![
            ("", 3, &[], (None, vec![], vec![], 1)),
            ("I", 3, &[], (None, vec![], vec![], 2)),
            ("C", 3, &[], (Some(1), vec![], vec![], 2)),
            ("CC", 1, &[], (Some(2), vec![(1, Superseded)], vec![], 3)),
            ("CCCC", 2, &[], (Some(4), vec![(1, Superseded), (2, Superseded)], vec![], 5)),
            ("CCCC", 2, &[1], (Some(4), vec![(2, Superseded)], vec![], 5)),
            // Incomplete older than the restore point goes; newer stays (in progress).
            ("CICI", 3, &[], (Some(3), vec![(2, Incomplete)], vec![], 5)),
            ("CICI", 3, &[2], (Some(3), vec![], vec![], 5)),
            // A corrupt newest manifest falls back and is never collected.
            ("CCX", 1, &[], (Some(2), vec![(1, Superseded)], vec![3], 4)),
            ("CXX", 1, &[], (Some(1), vec![], vec![2, 3], 4)),
            ("XC", 1, &[], (Some(2), vec![], vec![], 3)),
            // A manifest whose state file is missing is corrupt.
            ("CM", 1, &[], (Some(1), vec![], vec![2], 3)),
            ("X", 1, &[], (None, vec![], vec![1], 2)),
            ("IX", 1, &[], (None, vec![], vec![2], 3)),
            // Gaps are fine; retention counts complete ones only.
            ("C.C.I", 1, &[], (Some(3), vec![(1, Superseded)], vec![], 6)),
            // A tombstoned checkpoint is never restored (even the newest) and never
            // collected, even when it is older than the restore point.
            ("CA", 1, &[], (Some(1), vec![], vec![], 3)),
            ("A", 1, &[], (None, vec![], vec![], 2)),
            ("CAC", 1, &[], (Some(3), vec![(1, Superseded)], vec![], 4)),
        ];
        for (spec, retain, protected, expected) in rows {
            assert_eq!(plan(spec, retain, protected), expected, "{spec} retain {retain} protected {protected:?}");
        }
    }

    #[test]
    fn a_shared_state_object_must_hold_every_section_the_manifest_names() {
        let mut m = manifest(1);
        m.state_files[0].offset = Some(100);
        m.state_files[0].size = 20; // bytes 100..120 of the shared object
        let at = |files: &[(&str, u64)]| ObservedCheckpoint {
            checkpoint_id: 1,
            manifest: ManifestStatus::Valid(m.clone()),
            files: files.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        };
        let none = BTreeMap::new();
        assert_eq!(classify(&at(&[(SHARED_STATE_NAME, 120)]), &none), CheckpointStatus::Complete);
        assert_eq!(classify(&at(&[(SHARED_STATE_NAME, 500)]), &none), CheckpointStatus::Complete);
        let mut empty = m.clone();
        empty.state_files[0].size = 0;
        let at_empty = ObservedCheckpoint { manifest: ManifestStatus::Valid(empty), ..at(&[(SHARED_STATE_NAME, 500)]) };
        match classify(&at_empty, &none) {
            CheckpointStatus::Corrupt { reason } => assert!(reason.contains("less than an envelope"), "{reason}"),
            other => panic!("an empty section: {other:?}"),
        }
        let rows: [(&[(&str, u64)], &str); 3] = [
            (&[(SHARED_STATE_NAME, 119)], "has 119 bytes; the state of op-0 needs bytes 100..120"),
            (&[], "_shared.state is missing"),
            // A file of its own does not stand in for the shared object's section.
            (&[("op-0.state", 10)], "_shared.state is missing"),
        ];
        for (files, needle) in rows {
            match classify(&at(files), &none) {
                CheckpointStatus::Corrupt { reason } => assert!(reason.contains(needle), "{files:?}: {reason}"),
                other => panic!("{files:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn failed_verification_falls_back() {
        let mut o = observed("CC");
        o.failed_verification.insert(2, "op-0.state: checksum mismatch".into());
        let p = resolve(&o, &RetentionPolicy { retain: 1, protected: BTreeSet::new() });
        assert_eq!(p.restored_id(), Some(1));
        assert_eq!(p.skipped, vec![(2, "op-0.state: checksum mismatch".to_string())]);
        assert!(p.collect.is_empty(), "neither the restore point nor the corrupt one is collected");
    }

    #[test]
    fn state_file_size_mismatch_is_corrupt() {
        let mut o = observed("C");
        o.checkpoints[0].files.insert("op-0.state".into(), 9);
        let status = classify(&o.checkpoints[0], &BTreeMap::new());
        assert!(matches!(status, CheckpointStatus::Corrupt { reason } if reason.contains("9 bytes")));
    }

    #[test]
    fn recovery_plans() {
        let t = |participant, checkpoint_id, prepared| PendingTxn { participant, checkpoint_id, prepared };
        let commit = |participant, checkpoint_id| TxnAction::Commit { participant, checkpoint_id };
        let prepare_commit = |participant, checkpoint_id| TxnAction::PrepareAndCommit { participant, checkpoint_id };
        let abort = |participant, checkpoint_id| TxnAction::Abort { participant, checkpoint_id };
        let rows: Vec<(Option<u64>, Vec<PendingTxn>, Vec<TxnAction>)> = vec![
            // Nothing restored: everything aborts, PREPARE included.
            (None, vec![t(0, 1, true), t(0, 2, false)], vec![abort(0, 1), abort(0, 2)]),
            // The restored checkpoint and earlier ones commit; later ones abort.
            (Some(5), vec![t(0, 5, true), t(0, 4, true), t(0, 6, true)], vec![commit(0, 4), commit(0, 5), abort(0, 6)]),
            // Decided but reported ONGOING: prepare, then commit.
            (Some(5), vec![t(1, 5, false)], vec![prepare_commit(1, 5)]),
            // ONGOING and not decided: abort.
            (Some(5), vec![t(1, 6, false)], vec![abort(1, 6)]),
            // Two participants: ordered by checkpoint, then participant.
            (
                Some(3),
                vec![t(1, 3, true), t(0, 4, false), t(0, 3, true), t(1, 2, false)],
                vec![prepare_commit(1, 2), commit(0, 3), commit(1, 3), abort(0, 4)],
            ),
            (Some(3), vec![], vec![]),
        ];
        for (restored, pending, expected) in rows {
            assert_eq!(plan_recovery(restored, &pending), expected, "{restored:?} {pending:?}");
        }
    }

    #[test]
    fn a_transaction_commits_iff_a_complete_checkpoint_at_or_above_it_is_restored() {
        // (restored, checkpoint id, commits)
        let rows = [(None, 0, false), (None, 7, false), (Some(0), 0, true), (Some(5), 4, true), (Some(5), 5, true)];
        let rows = rows.into_iter().chain([(Some(5), 6, false), (Some(u64::MAX), u64::MAX, true)]);
        for (restored, n, commits) in rows {
            assert_eq!(decides_commit(restored, n), commits, "{restored:?} {n}");
        }
    }

    #[test]
    fn completion_plans() {
        let open: BTreeSet<u64> = [3, 4, 6, 7].into();
        let rows = [(2, vec![]), (3, vec![3]), (5, vec![3, 4]), (6, vec![3, 4, 6]), (9, vec![3, 4, 6, 7])];
        for (completed, expected) in rows {
            assert_eq!(plan_completion(completed, &open), expected, "completing {completed}");
        }
    }

    fn view(prefix: &str, silent_s: u64, retired: bool, adopted_by: Option<&str>, done: bool) -> InstanceView {
        InstanceView {
            prefix: prefix.into(),
            silent_for: std::time::Duration::from_secs(silent_s),
            retired,
            adopted_by: adopted_by.map(Into::into),
            adoption_done: done,
        }
    }

    #[test]
    fn held_prefixes_follow_finished_adoptions_transitively() {
        let views = [
            view("a", 0, false, None, false),
            view("b", 99, false, Some("a"), true),  // a adopted b
            view("c", 99, false, Some("b"), true),  // b had adopted c: a holds c
            view("d", 99, false, Some("a"), false), // unfinished: resumed, not held yet
            view("e", 99, false, Some("d"), true),  // held by d, which a does not hold yet
            view("f", 99, false, Some("z"), true),  // someone else's
            view("a2", 99, false, Some("a"), true),
        ];
        let held = held_prefixes("a", &views);
        assert_eq!(held, BTreeSet::from(["b".to_string(), "c".to_string(), "a2".to_string()]));
        assert_eq!(held_prefixes("z", &views), BTreeSet::from(["f".to_string()]));
        assert!(held_prefixes("q", &views).is_empty());
        // A cycle (impossible in a registry, where an adopted prefix never runs again)
        // still terminates.
        let cycle = [view("x", 0, false, Some("y"), true), view("y", 0, false, Some("x"), true)];
        assert_eq!(held_prefixes("x", &cycle), BTreeSet::from(["y".to_string()]));
    }

    fn steps(me: &str, instances: &[InstanceView]) -> Vec<String> {
        plan_adoption(me, instances, std::time::Duration::from_secs(10))
            .into_iter()
            .map(|s| match s {
                AdoptionStep::Resume { prefix } => format!("resume {prefix}"),
                AdoptionStep::Claim { prefix } => format!("claim {prefix}"),
            })
            .collect()
    }

    #[test]
    fn adoption_table() {
        // (case, me, instances, expected steps); the timeout is 10 s.
        let cases: Vec<(&str, &str, Vec<InstanceView>, Vec<&str>)> = vec![
            ("a live instance is left alone", "a", vec![view("b", 3, false, None, false)], vec![]),
            ("silent exactly the timeout is not yet dead", "a", vec![view("b", 10, false, None, false)], vec![]),
            ("silent past the timeout is claimed", "a", vec![view("b", 11, false, None, false)], vec!["claim b"]),
            ("never itself, however silent", "a", vec![view("a", 99, false, None, false)], vec![]),
            ("a retired instance is never adopted", "a", vec![view("b", 99, true, None, false)], vec![]),
            ("another's claim is theirs", "a", vec![view("b", 99, false, Some("c"), false)], vec![]),
            ("my unfinished claim is resumed", "a", vec![view("b", 99, false, Some("a"), false)], vec!["resume b"]),
            ("my finished claim is done", "a", vec![view("b", 99, false, Some("a"), true)], vec![]),
            (
                "a claim of an instance I adopted is inherited",
                "a",
                vec![view("c", 99, false, Some("a"), true), view("b", 99, false, Some("c"), false)],
                vec!["resume b"],
            ),
            (
                "a finished claim of an instance I adopted needs nothing",
                "a",
                vec![view("c", 99, false, Some("a"), true), view("b", 99, false, Some("c"), true)],
                vec![],
            ),
            (
                "resumes first, then claims, each in prefix order",
                "a",
                vec![
                    view("z", 50, false, None, false),
                    view("d", 50, false, Some("a"), false),
                    view("m", 50, false, None, false),
                    view("b", 50, false, Some("a"), false),
                ],
                vec!["resume b", "resume d", "claim m", "claim z"],
            ),
        ];
        for (case, me, instances, expected) in cases {
            assert_eq!(steps(me, &instances), expected, "{case}");
        }
    }

    #[test]
    fn an_adopted_instance_may_not_start_again() {
        assert_eq!(check_instance_start(None), Ok(()));
        assert_eq!(check_instance_start(Some(&view("a", 0, false, None, false))), Ok(()));
        assert_eq!(check_instance_start(Some(&view("a", 0, true, None, false))), Ok(()), "retired restarts");
        assert_eq!(check_instance_start(Some(&view("a", 0, false, Some("b"), false))), Err("b".to_string()));
        assert_eq!(check_instance_start(Some(&view("a", 0, false, Some("b"), true))), Err("b".to_string()));
    }
}
