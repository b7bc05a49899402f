//! The rules for keyed state (stateful SQL): which checkpoint it restores from, and
//! beside which instances it may run (decision 0039).

use std::collections::BTreeSet;

use crate::CheckpointId;

/// What a job with keyed state restores, once the participants said whether each
/// transaction of the restored checkpoint's manifest committed (docs/design.md §3 step
/// 7): a checkpoint's state counts every row of its transactions, so it is restored only
/// if all of them committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedRestore {
    /// Every transaction committed, or no participant can tell otherwise: restore it.
    Keep,
    /// Its transactions were all lost (the broker aborted them after the checkpoint
    /// completed, so their records come back): tombstone it and restore an older one.
    FallBack,
    /// Some of its transactions committed and some were lost: no checkpoint holds the
    /// state of exactly what committed. The ids of each.
    Inconsistent {
        /// Checkpoint ids a participant committed.
        committed: Vec<CheckpointId>,
        /// Checkpoint ids a participant lost.
        lost: Vec<CheckpointId>,
    },
}

/// The rule of [`KeyedRestore`]: `answers` holds, for each transaction of the manifest
/// and each participant, whether it committed (`None`: the participant cannot tell, as
/// on a broker where a decided transaction cannot be aborted behind the job's back).
pub fn plan_keyed_restore(answers: &[(CheckpointId, Option<bool>)]) -> KeyedRestore {
    let lost: BTreeSet<CheckpointId> = answers.iter().filter(|(_, c)| *c == Some(false)).map(|(n, _)| *n).collect();
    if lost.is_empty() {
        return KeyedRestore::Keep;
    }
    let committed: BTreeSet<CheckpointId> = answers.iter().filter(|(_, c)| *c == Some(true)).map(|(n, _)| *n).collect();
    if committed.is_empty() {
        KeyedRestore::FallBack
    } else {
        KeyedRestore::Inconsistent { committed: committed.into_iter().collect(), lost: lost.into_iter().collect() }
    }
}

/// Whether an instance may run beside the other instances of its group, as the
/// registry shows them (`others`: prefix and whether its job keeps keyed state, for
/// every other instance registered and neither retired nor adopted). Keyed state needs
/// every record of a key in one place, and a share group gives no such place: a job
/// with keyed state runs alone, and no job runs beside one. `Err` names the instance in
/// the way.
pub fn check_keyed_instances(keyed: bool, others: &[(String, bool)]) -> std::result::Result<(), String> {
    match others.iter().find(|(_, other_keyed)| keyed || *other_keyed) {
        None => Ok(()),
        Some((prefix, true)) => Err(format!(
            "instance {prefix} of this group keeps keyed state (stateful SQL) and is registered, live or not yet \
             adopted: no instance may run beside it, since a share group gives each record to any member. Stop it \
             gracefully (it retires), or run this job in another group or checkpoint root"
        )),
        Some((prefix, false)) => Err(format!(
            "this job keeps keyed state (stateful SQL), which needs every record of a key in one instance, but \
             instance {prefix} of the group is registered, live or not yet adopted. Run the stateful job as the \
             group's only instance: stop the others gracefully, or use another group or checkpoint root"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Answers = Vec<(CheckpointId, Option<bool>)>;
    type Others = Vec<(String, bool)>;

    #[test]
    fn keyed_state_is_restored_only_from_a_checkpoint_whose_transactions_all_committed() {
        use KeyedRestore::*;
        // (answers per (checkpoint id, participant), plan)
        let table: Vec<(Answers, KeyedRestore)> = vec![
            (vec![], Keep),
            (vec![(7, None)], Keep),
            (vec![(7, Some(true)), (7, None)], Keep),
            (vec![(7, Some(false))], FallBack),
            (vec![(6, Some(false)), (7, Some(false)), (7, None)], FallBack),
            (vec![(6, Some(true)), (7, Some(false))], Inconsistent { committed: vec![6], lost: vec![7] }),
        ];
        for (answers, plan) in table {
            assert_eq!(plan_keyed_restore(&answers), plan, "{answers:?}");
        }
    }

    #[test]
    fn keyed_state_runs_alone_in_its_group() {
        let stateless = ("b".to_string(), false);
        let keyed = ("k".to_string(), true);
        // (this job keyed, others, allowed, named in the refusal)
        let table: Vec<(bool, Others, bool, &str)> = vec![
            (true, vec![], true, ""),
            (false, vec![], true, ""),
            (false, vec![stateless.clone()], true, ""),
            (true, vec![stateless.clone()], false, "instance b"),
            (false, vec![stateless.clone(), keyed.clone()], false, "instance k"),
            (true, vec![keyed.clone()], false, "instance k"),
        ];
        for (mine, others, allowed, named) in table {
            let r = check_keyed_instances(mine, &others);
            assert_eq!(r.is_ok(), allowed, "{mine} beside {others:?}");
            if let Err(e) = r {
                assert!(e.contains(named), "{e}");
            }
        }
    }
}
