//! The Kafka participant's settings and the rules they follow: the slot pool of
//! transactional ids and the transaction timeout against a checkpoint and the broker.

use std::time::Duration;

use shareflow_runtime::{CheckpointId, TransactionTemplate};
use shareflow_share::Error;

/// The broker config that caps `transaction.timeout.ms`.
pub(crate) const BROKER_MAX_TIMEOUT: &str = "transaction.max.timeout.ms";

/// Settings of [`KafkaTransactions`]: start from `KafkaTransactionsConfig::default()`
/// and change what differs.
///
/// ```
/// # use std::time::Duration;
/// # use shareflow_connector::kafka::KafkaTransactionsConfig;
/// let config = KafkaTransactionsConfig::default().transaction_timeout(Duration::from_secs(120)).slots(6);
/// assert!(config.exactly_once);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KafkaTransactionsConfig {
    /// Exactly-once (a Kafka transaction per checkpoint) or at-least-once (idempotent
    /// writes flushed at each checkpoint; a crash may repeat output since the last one).
    pub exactly_once: bool,
    /// `transaction.timeout.ms` of each T(n). The broker aborts a transaction open this
    /// long, so it must exceed checkpoint interval plus checkpoint timeout, and fit the
    /// broker's `transaction.max.timeout.ms`. A job down longer than this between a
    /// checkpoint and its commit loses that checkpoint's output, which the ledger then
    /// replays.
    pub transaction_timeout: Duration,
    /// K, the transactional ids per attempt: T(n) runs on `{group}-{prefix}-g{generation}-s{n mod K}`.
    /// At most K transactions of one attempt are open at once, so K must exceed the
    /// job's tolerable checkpoint failures plus one (default 4).
    pub slots: u16,
    /// The intents topic is summarised and trimmed once this many entries were written
    /// since its last summary (default 64): a recovery then reads about this many
    /// intents, notes and commit entries, whatever the job's age. A compaction costs a
    /// summary record, a read of the commits topic and two DeleteRecords calls, in the
    /// background after a commit.
    pub ledger_summary_every: u64,
}

impl Default for KafkaTransactionsConfig {
    fn default() -> Self {
        Self { exactly_once: true, transaction_timeout: Duration::from_secs(600), slots: 4, ledger_summary_every: 64 }
    }
}

impl KafkaTransactionsConfig {
    /// Exactly-once (`true`, the default) or at-least-once.
    pub fn exactly_once(mut self, exactly_once: bool) -> Self {
        self.exactly_once = exactly_once;
        self
    }

    /// `transaction.timeout.ms` of each T(n) (default 600 s).
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// K, the transactional ids per attempt (default 4, at least 2).
    pub fn slots(mut self, slots: u16) -> Self {
        self.slots = slots;
        self
    }

    /// Summarise and trim the intents topic every `entries` entries (default 64, at
    /// least 1).
    pub fn ledger_summary_every(mut self, entries: u64) -> Self {
        self.ledger_summary_every = entries.max(1);
        self
    }
}

/// The Kafka transactional id of slot `slot` of generation `generation` of `template`.
pub(crate) fn slot_id(template: &TransactionTemplate, generation: u32, slot: u16) -> String {
    format!("{}-{}-g{generation}-s{slot}", template.group_id(), template.prefix())
}

/// Whether the Kafka transactional id `id` is one of `template`'s slots (an id of that
/// group and prefix exactly, not of a longer prefix that starts the same).
pub fn is_slot_id(id: &str, template: &TransactionTemplate) -> bool {
    parse_slot_id(id, template).is_some()
}

/// `(generation, slot)` if `id` is a slot id of `template`'s prefix.
pub(crate) fn parse_slot_id(id: &str, template: &TransactionTemplate) -> Option<(u32, u16)> {
    let rest = id.strip_prefix(template.group_id())?.strip_prefix('-')?.strip_prefix(template.prefix())?;
    let (generation, slot) = rest.strip_prefix("-g")?.split_once("-s")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(generation) || !digits(slot) {
        return None;
    }
    Some((generation.parse().ok()?, slot.parse().ok()?))
}

/// The slot T(n) runs on (n is `checkpoint_id`), unless a transaction of the attempt
/// still holds it: at most K consecutive transactions are open at once, so `n mod K` is
/// unique among them. `Err` names the checkpoint whose transaction holds the slot.
pub(crate) fn slot_for(
    checkpoint_id: CheckpointId,
    slots: u16,
    open: impl IntoIterator<Item = CheckpointId>,
) -> std::result::Result<u16, CheckpointId> {
    let k = u64::from(slots.max(1));
    let slot = checkpoint_id % k;
    match open.into_iter().find(|&m| m != checkpoint_id && m % k == slot) {
        Some(m) => Err(m),
        None => Ok(slot as u16),
    }
}

/// Checks `transaction.timeout.ms` (`timeout`): it must exceed checkpoint interval plus
/// checkpoint timeout (`needed`), and not exceed the broker's
/// `transaction.max.timeout.ms` (`broker_max`, as the broker reports it; `None` when
/// unknown). A broker value that is not a whole number of milliseconds is an invalid
/// config naming the broker's key and value, never a limit that lets anything pass.
pub(crate) fn check_transaction_timeout(
    timeout: Duration,
    needed: Duration,
    broker_max: Option<&str>,
) -> crate::Result<()> {
    if timeout <= needed {
        return Err(Error::InvalidConfig {
            key: "transaction.timeout.ms".into(),
            value: timeout.as_millis().to_string(),
            rule: format!(
                "must exceed checkpoint interval plus checkpoint timeout ({} ms), or the broker aborts T(n) \
                 before its checkpoint can commit it",
                needed.as_millis()
            ),
        });
    }
    let Some(max) = broker_max else { return Ok(()) };
    let max: u128 = max.trim().parse().map_err(|e| Error::InvalidConfig {
        key: BROKER_MAX_TIMEOUT.into(),
        value: max.to_string(),
        rule: format!(
            "the broker reports it, but it is not a whole number of milliseconds ({e}); fix the broker's config"
        ),
    })?;
    if timeout.as_millis() > max {
        return Err(Error::InvalidConfig {
            key: "transaction.timeout.ms".into(),
            value: timeout.as_millis().to_string(),
            rule: format!(
                "must not exceed the broker's transaction.max.timeout.ms ({max} ms); lower it or raise the broker's"
            ),
        });
    }
    Ok(())
}

/// K against the job: one attempt keeps up to `tolerable_checkpoint_failures + 2`
/// transactions open, each on a slot of its own, so K must be at least that.
pub(crate) fn check_slots(slots: u16, job: &shareflow_runtime::JobSettings) -> Result<(), Error> {
    let needed = job.pending_per_instance();
    if u32::from(slots) < needed {
        return Err(Error::InvalidConfig {
            key: "slots".into(),
            value: slots.to_string(),
            rule: format!(
                "must be at least {needed}: one attempt keeps up to tolerable_checkpoint_failures ({}) + 2 \
                 transactions open, each on a slot of its own; set KafkaTransactionsConfig::slots({needed}), or \
                 lower tolerable_checkpoint_failures to {}",
                job.tolerable_checkpoint_failures,
                u32::from(slots).saturating_sub(2)
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shareflow_share::ErrorKind;

    #[test]
    fn a_slot_id_is_of_its_template_exactly() {
        let template = TransactionTemplate::new("g", "i1").expect("template");
        let rows = [
            ("g-i1-g0-s0", true),
            ("g-i1-g12-s3", true),
            ("g-i1-b-g0-s0", false), // instance "i1-b", whose prefix starts the same
            ("g-i10-g0-s0", false),
            ("g-i1-g0-s", false),
            ("g-i1-gx-s0", false),
            ("h-i1-g0-s0", false),
        ];
        for (id, want) in rows {
            assert_eq!(is_slot_id(id, &template), want, "{id}");
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_timeout_must_outlast_a_checkpoint() {
        let err = check_transaction_timeout(S(5), S(6), Some("900000")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert!(err.to_string().contains("checkpoint interval plus checkpoint timeout (6000 ms)"), "{err}");
        check_transaction_timeout(S(7), S(6), None).expect("no broker maximum known");
    }

    #[test]
    fn the_timeout_must_fit_the_broker_maximum() {
        check_transaction_timeout(S(60), S(31), Some("60000")).expect("equal fits");
        let err = check_transaction_timeout(S(3_600), S(61), Some("900000")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert!(err.to_string().contains("transaction.max.timeout.ms (900000 ms)"), "{err}");
    }

    #[test]
    fn an_unparsable_broker_maximum_is_an_error_naming_its_key_and_value() {
        for bad in ["", "15m", "-1", "9e5"] {
            let err = check_transaction_timeout(S(60), S(31), Some(bad)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Invalid, "{bad:?}");
            match &err {
                Error::InvalidConfig { key, value, .. } => {
                    assert_eq!((key.as_str(), value.as_str()), (BROKER_MAX_TIMEOUT, bad));
                }
                other => panic!("{bad:?}: {other:?}"),
            }
            assert!(err.to_string().contains(&format!("invalid config transaction.max.timeout.ms={bad}:")), "{err}");
        }
    }

    /// One attempt keeps up to tolerable failures + 2 transactions open: K below that is
    /// refused, naming K, the value that works and the other setting.
    #[test]
    fn slots_must_cover_the_transactions_one_attempt_keeps_open() {
        let job = |tolerable| {
            shareflow_runtime::JobSettings::new(
                "g",
                Some(Duration::from_millis(500)),
                Duration::from_secs(10),
                tolerable,
                1,
            )
        };
        check_slots(4, &job(2)).unwrap();
        check_slots(5, &job(3)).unwrap();
        let err = check_slots(4, &job(3)).unwrap_err().to_string();
        assert!(err.contains("slots"), "{err}");
        assert!(err.contains("must be at least 5"), "{err}");
        assert!(err.contains("tolerable_checkpoint_failures (3)"), "{err}");
        assert!(err.contains("lower tolerable_checkpoint_failures to 2"), "{err}");
    }
}
