//! Which instances' ledger topics (`{group}-{prefix}-ledger`) may go: the pure plan of
//! `shareflow instances gc`. An instance that retired committed everything and keeps
//! nothing pending; one whose adoption finished had every transaction decided by its
//! adopter. Nobody reads their ledgers again: a later start under the same name takes a
//! generation above every transactional id Kafka still lists for the prefix, and
//! continues from its checkpoints. Every other instance may still be recovered or
//! adopted from its ledger, so its topic stays.

use std::collections::BTreeSet;

use shareflow_checkpoint::instances::{InstanceRecord, Standing};

/// The ledger (commits) topic of `prefix` in share group `group`.
pub fn ledger_topic(group: &str, prefix: &str) -> String {
    format!("{group}-{prefix}-ledger")
}

/// What to do with one instance's ledger topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerTopicFate {
    /// Nobody reads it again: delete it.
    Delete {
        /// The topic.
        topic: String,
        /// Why it may go, for the operator.
        why: String,
    },
    /// It may still be read: keep it.
    Keep {
        /// The topic.
        topic: String,
        /// Why it stays, for the operator.
        why: String,
    },
}

/// The fate of the ledger topic of every registered instance whose topic exists
/// (`existing`), in the registry's order.
pub fn plan_ledger_gc(group: &str, records: &[InstanceRecord], existing: &BTreeSet<String>) -> Vec<LedgerTopicFate> {
    records
        .iter()
        .filter_map(|r| {
            let topic = ledger_topic(group, &r.prefix);
            if !existing.contains(&topic) {
                return None;
            }
            let prefix = &r.prefix;
            Some(match r.standing() {
                Standing::Adopted { by } => LedgerTopicFate::Delete {
                    topic,
                    why: format!("instance {prefix} was adopted by {by}, and that ended"),
                },
                Standing::BeingAdopted { by } => LedgerTopicFate::Keep {
                    topic,
                    why: format!("instance {prefix} is being adopted by {by}, which reads this ledger"),
                },
                Standing::Retired => LedgerTopicFate::Delete { topic, why: format!("instance {prefix} retired") },
                Standing::Registered => LedgerTopicFate::Keep {
                    topic,
                    why: format!(
                        "instance {prefix} is live or may be restarted or adopted (neither retired nor adopted): its \
                         recovery reads this ledger"
                    ),
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(prefix: &str, retired: bool, adopted_by: Option<&str>, adoption_done: bool) -> InstanceRecord {
        let mut r = InstanceRecord::default();
        r.prefix = prefix.into();
        r.incarnation = 1;
        r.retired = retired;
        r.adopted_by = adopted_by.map(Into::into);
        r.adoption_done = adoption_done;
        r
    }

    /// Retired and adopted-and-done go; live, being adopted, and missing topics do not.
    #[test]
    fn only_retired_and_finished_adoptions_lose_their_ledger() {
        let records = [
            record("retired", true, None, false),
            record("adopted", false, Some("b"), true),
            record("adopting", false, Some("b"), false),
            record("live", false, None, false),
            record("gone", true, None, false),
        ];
        let existing: BTreeSet<String> =
            ["retired", "adopted", "adopting", "live"].iter().map(|p| ledger_topic("g", p)).collect();
        let fates: Vec<(bool, String)> = plan_ledger_gc("g", &records, &existing)
            .into_iter()
            .map(|f| match f {
                LedgerTopicFate::Delete { topic, .. } => (true, topic),
                LedgerTopicFate::Keep { topic, .. } => (false, topic),
            })
            .collect();
        assert_eq!(
            fates,
            vec![
                (true, "g-retired-ledger".to_string()),
                (true, "g-adopted-ledger".to_string()),
                (false, "g-adopting-ledger".to_string()),
                (false, "g-live-ledger".to_string()),
            ]
        );
    }
}
