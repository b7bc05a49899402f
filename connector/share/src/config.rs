//! Share-group configuration with the keys and rules of docs/design.md §5.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How a consumer settles what it polled (`share.acknowledgement.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum AcknowledgementMode {
    /// The next poll (or commit) accepts everything the previous poll returned.
    Implicit,
    /// Each record is acknowledged by the application (KIP-932's default).
    #[default]
    Explicit,
    /// Acknowledgements are staged into a transaction and applied on its commit
    /// (KIP-1289). ACCEPT outside a transaction is refused in this mode.
    Transactional,
}

impl fmt::Display for AcknowledgementMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AcknowledgementMode::Implicit => "implicit",
            AcknowledgementMode::Explicit => "explicit",
            AcknowledgementMode::Transactional => "transactional",
        })
    }
}

impl FromStr for AcknowledgementMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "implicit" => Ok(Self::Implicit),
            "explicit" => Ok(Self::Explicit),
            "transactional" => Ok(Self::Transactional),
            _ => Err(invalid(keys::ACK_MODE, s, "must be one of implicit, explicit, transactional")),
        }
    }
}

/// Which records a share group may deliver (`share.isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum IsolationLevel {
    /// Everything written, including open and aborted transactions (Kafka's default).
    #[default]
    ReadUncommitted,
    /// Only committed records, up to the last stable offset; aborted ones are archived.
    ReadCommitted,
}

/// Configuration keys, spelled as in Kafka and the seed.
pub mod keys {
    /// `share.acknowledgement.mode`
    pub const ACK_MODE: &str = "share.acknowledgement.mode";
    /// `share.transaction.timeout.ms`
    pub const TXN_TIMEOUT_MS: &str = "share.transaction.timeout.ms";
    /// `share.transaction.max.pending`
    pub const TXN_MAX_PENDING: &str = "share.transaction.max.pending";
    /// `group.share.record.lock.duration.ms`
    pub const LOCK_DURATION_MS: &str = "group.share.record.lock.duration.ms";
    /// `group.share.delivery.count.limit`
    pub const DELIVERY_COUNT_LIMIT: &str = "group.share.delivery.count.limit";
    /// `group.share.partition.max.record.locks`
    pub const MAX_RECORD_LOCKS: &str = "group.share.partition.max.record.locks";
    /// `share.isolation.level`
    pub const ISOLATION_LEVEL: &str = "share.isolation.level";
    /// `share.transaction.retention.ms`: how long a COMMITTED or ABORTED transaction
    /// stays listed before the broker removes it (KIP-1289: "Cleanup after retention").
    pub const TXN_RETENTION_MS: &str = "share.transaction.retention.ms";
}

fn invalid(key: &str, value: impl ToString, rule: impl ToString) -> Error {
    Error::InvalidConfig { key: key.to_string(), value: value.to_string(), rule: rule.to_string() }
}

/// Validated share-group configuration. Build it with [`ShareConfig::builder`].
///
/// ```
/// use std::time::Duration;
/// use shareflow_share::{AcknowledgementMode, ShareConfig};
///
/// let config = ShareConfig::builder()
///     .acknowledgement_mode(AcknowledgementMode::Transactional)
///     .checkpointing(Duration::from_secs(1), Duration::from_secs(10))
///     .build()
///     .unwrap();
/// assert_eq!(config.transaction_timeout(), Duration::from_secs(60));
///
/// let err = ShareConfig::builder()
///     .checkpointing(Duration::from_secs(50), Duration::from_secs(20))
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("share.transaction.timeout.ms"));
/// ```
///
/// A config that arrives through serde is checked by the same rules: decoding an
/// invalid one fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedShareConfig")]
pub struct ShareConfig {
    acknowledgement_mode: AcknowledgementMode,
    transaction_timeout_ms: u64,
    max_pending_transactions: u32,
    record_lock_duration_ms: u64,
    delivery_count_limit: u16,
    partition_max_record_locks: u32,
    isolation_level: IsolationLevel,
    transaction_retention_ms: u64,
}

/// The serde form of [`ShareConfig`] before its rules are checked.
#[derive(Deserialize)]
struct UncheckedShareConfig {
    acknowledgement_mode: AcknowledgementMode,
    transaction_timeout_ms: u64,
    max_pending_transactions: u32,
    record_lock_duration_ms: u64,
    delivery_count_limit: u16,
    partition_max_record_locks: u32,
    isolation_level: IsolationLevel,
    transaction_retention_ms: u64,
}

impl TryFrom<UncheckedShareConfig> for ShareConfig {
    type Error = Error;
    fn try_from(u: UncheckedShareConfig) -> Result<Self> {
        let c = ShareConfig {
            acknowledgement_mode: u.acknowledgement_mode,
            transaction_timeout_ms: u.transaction_timeout_ms,
            max_pending_transactions: u.max_pending_transactions,
            record_lock_duration_ms: u.record_lock_duration_ms,
            delivery_count_limit: u.delivery_count_limit,
            partition_max_record_locks: u.partition_max_record_locks,
            isolation_level: u.isolation_level,
            transaction_retention_ms: u.transaction_retention_ms,
        };
        c.validate()?;
        Ok(c)
    }
}

impl Default for ShareConfig {
    fn default() -> Self {
        Self {
            acknowledgement_mode: AcknowledgementMode::Explicit,
            transaction_timeout_ms: 60_000,
            max_pending_transactions: 5,
            record_lock_duration_ms: 30_000,
            delivery_count_limit: 5,
            partition_max_record_locks: 2_000,
            isolation_level: IsolationLevel::ReadUncommitted,
            transaction_retention_ms: 86_400_000,
        }
    }
}

impl ShareConfig {
    /// Allowed range of `group.share.record.lock.duration.ms`.
    pub const LOCK_DURATION_RANGE_MS: std::ops::RangeInclusive<u64> = 1_000..=3_600_000;
    /// Allowed range of `group.share.delivery.count.limit`.
    pub const DELIVERY_COUNT_LIMIT_RANGE: std::ops::RangeInclusive<u16> = 2..=10;
    /// Allowed range of `group.share.partition.max.record.locks`. Wider than Kafka's
    /// because LOCKED records count too, and a checkpoint may hold many.
    pub const MAX_RECORD_LOCKS_RANGE: std::ops::RangeInclusive<u32> = 1..=100_000_000;
    /// Allowed range of `share.transaction.retention.ms`: one minute to 30 days.
    pub const TXN_RETENTION_RANGE_MS: std::ops::RangeInclusive<u64> = 60_000..=2_592_000_000;

    /// A builder starting from the defaults.
    pub fn builder() -> ShareConfigBuilder {
        ShareConfigBuilder::default()
    }

    /// `share.acknowledgement.mode`
    pub fn acknowledgement_mode(&self) -> AcknowledgementMode {
        self.acknowledgement_mode
    }
    /// `share.transaction.timeout.ms`
    pub fn transaction_timeout(&self) -> Duration {
        Duration::from_millis(self.transaction_timeout_ms)
    }
    /// `share.transaction.max.pending`
    pub fn max_pending_transactions(&self) -> u32 {
        self.max_pending_transactions
    }
    /// `group.share.record.lock.duration.ms`
    pub fn record_lock_duration(&self) -> Duration {
        Duration::from_millis(self.record_lock_duration_ms)
    }
    /// `group.share.delivery.count.limit`
    pub fn delivery_count_limit(&self) -> u16 {
        self.delivery_count_limit
    }
    /// `group.share.partition.max.record.locks`: ACQUIRED plus LOCKED records a share
    /// partition may hold before fetch pauses.
    pub fn partition_max_record_locks(&self) -> u32 {
        self.partition_max_record_locks
    }
    /// `share.isolation.level`
    pub fn isolation_level(&self) -> IsolationLevel {
        self.isolation_level
    }
    /// `share.transaction.retention.ms`: COMMITTED and ABORTED transactions are removed
    /// this long after their decision (default one day).
    pub fn transaction_retention(&self) -> Duration {
        Duration::from_millis(self.transaction_retention_ms)
    }

    /// The same configuration with another acknowledgement mode. The mode is a member's
    /// setting; every other key belongs to the group.
    pub fn with_acknowledgement_mode(mut self, mode: AcknowledgementMode) -> Self {
        self.acknowledgement_mode = mode;
        self
    }

    /// Checks every rule that needs no job settings; the first violation is
    /// [`Error::InvalidConfig`] naming the key and its allowed range.
    pub fn validate(&self) -> Result<()> {
        let c = self;
        if c.transaction_timeout_ms == 0 {
            return Err(invalid(keys::TXN_TIMEOUT_MS, c.transaction_timeout_ms, "must be > 0"));
        }
        if c.max_pending_transactions < 1 {
            return Err(invalid(keys::TXN_MAX_PENDING, c.max_pending_transactions, "must be >= 1"));
        }
        if !ShareConfig::LOCK_DURATION_RANGE_MS.contains(&c.record_lock_duration_ms) {
            return Err(invalid(keys::LOCK_DURATION_MS, c.record_lock_duration_ms, "must be in 1000..=3600000"));
        }
        if !ShareConfig::DELIVERY_COUNT_LIMIT_RANGE.contains(&c.delivery_count_limit) {
            return Err(invalid(keys::DELIVERY_COUNT_LIMIT, c.delivery_count_limit, "must be in 2..=10"));
        }
        if !ShareConfig::MAX_RECORD_LOCKS_RANGE.contains(&c.partition_max_record_locks) {
            return Err(invalid(keys::MAX_RECORD_LOCKS, c.partition_max_record_locks, "must be in 1..=100000000"));
        }
        if !ShareConfig::TXN_RETENTION_RANGE_MS.contains(&c.transaction_retention_ms) {
            return Err(invalid(
                keys::TXN_RETENTION_MS,
                c.transaction_retention_ms,
                "must be in 60000..=2592000000 (one minute to 30 days)",
            ));
        }
        if c.transaction_retention_ms < c.transaction_timeout_ms {
            return Err(invalid(
                keys::TXN_RETENTION_MS,
                c.transaction_retention_ms,
                format!(
                    "must be >= {} ({} ms): a decided transaction must stay known at least as long as one can run",
                    keys::TXN_TIMEOUT_MS,
                    c.transaction_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// The first group-level key on which `self` and `group` differ, with both values.
    /// The acknowledgement mode is a member's setting and is not compared.
    pub fn conflict_with(&self, group: &ShareConfig) -> Option<(&'static str, String, String)> {
        let pairs: [(&'static str, String, String); 7] = [
            (keys::TXN_TIMEOUT_MS, self.transaction_timeout_ms.to_string(), group.transaction_timeout_ms.to_string()),
            (
                keys::TXN_MAX_PENDING,
                self.max_pending_transactions.to_string(),
                group.max_pending_transactions.to_string(),
            ),
            (
                keys::LOCK_DURATION_MS,
                self.record_lock_duration_ms.to_string(),
                group.record_lock_duration_ms.to_string(),
            ),
            (keys::DELIVERY_COUNT_LIMIT, self.delivery_count_limit.to_string(), group.delivery_count_limit.to_string()),
            (
                keys::MAX_RECORD_LOCKS,
                self.partition_max_record_locks.to_string(),
                group.partition_max_record_locks.to_string(),
            ),
            (keys::ISOLATION_LEVEL, format!("{:?}", self.isolation_level), format!("{:?}", group.isolation_level)),
            (
                keys::TXN_RETENTION_MS,
                self.transaction_retention_ms.to_string(),
                group.transaction_retention_ms.to_string(),
            ),
        ];
        pairs.into_iter().find(|(_, mine, theirs)| mine != theirs)
    }
}

/// Builder for [`ShareConfig`]; [`build`](Self::build) checks every rule.
#[derive(Debug, Clone, Default)]
pub struct ShareConfigBuilder {
    config: ShareConfig,
    checkpointing: Option<(Duration, Duration)>,
    errors: Vec<Error>,
}

impl ShareConfigBuilder {
    /// `share.acknowledgement.mode`
    pub fn acknowledgement_mode(mut self, mode: AcknowledgementMode) -> Self {
        self.config.acknowledgement_mode = mode;
        self
    }
    /// `share.transaction.timeout.ms`
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.config.transaction_timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        self
    }
    /// `share.transaction.max.pending`
    pub fn max_pending_transactions(mut self, max: u32) -> Self {
        self.config.max_pending_transactions = max;
        self
    }
    /// `group.share.record.lock.duration.ms`
    pub fn record_lock_duration(mut self, duration: Duration) -> Self {
        self.config.record_lock_duration_ms = duration.as_millis().min(u64::MAX as u128) as u64;
        self
    }
    /// `group.share.delivery.count.limit`
    pub fn delivery_count_limit(mut self, limit: u16) -> Self {
        self.config.delivery_count_limit = limit;
        self
    }
    /// `group.share.partition.max.record.locks`
    pub fn partition_max_record_locks(mut self, max: u32) -> Self {
        self.config.partition_max_record_locks = max;
        self
    }
    /// `share.isolation.level`
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.config.isolation_level = level;
        self
    }
    /// `share.transaction.retention.ms`
    pub fn transaction_retention(mut self, retention: Duration) -> Self {
        self.config.transaction_retention_ms = retention.as_millis().min(u64::MAX as u128) as u64;
        self
    }
    /// The job's checkpoint interval and timeout, so that `build()` can check that the
    /// transaction timeout outlasts a checkpoint.
    pub fn checkpointing(mut self, interval: Duration, timeout: Duration) -> Self {
        self.checkpointing = Some((interval, timeout));
        self
    }

    /// Sets a key from its Kafka-style name and string value. Unknown keys and
    /// unparsable values are reported by [`build`](Self::build).
    pub fn set(mut self, key: &str, value: &str) -> Self {
        fn num<T: FromStr>(key: &str, value: &str) -> Result<T> {
            value.trim().parse().map_err(|_| invalid(key, value, "must be a non-negative integer"))
        }
        let result = match key {
            keys::ACK_MODE => value.parse().map(|m| self.config.acknowledgement_mode = m),
            keys::TXN_TIMEOUT_MS => num(key, value).map(|v| self.config.transaction_timeout_ms = v),
            keys::TXN_MAX_PENDING => num(key, value).map(|v| self.config.max_pending_transactions = v),
            keys::LOCK_DURATION_MS => num(key, value).map(|v| self.config.record_lock_duration_ms = v),
            keys::DELIVERY_COUNT_LIMIT => num(key, value).map(|v| self.config.delivery_count_limit = v),
            keys::MAX_RECORD_LOCKS => num(key, value).map(|v| self.config.partition_max_record_locks = v),
            keys::TXN_RETENTION_MS => num(key, value).map(|v| self.config.transaction_retention_ms = v),
            keys::ISOLATION_LEVEL => match value {
                "read_uncommitted" => Ok(IsolationLevel::ReadUncommitted),
                "read_committed" => Ok(IsolationLevel::ReadCommitted),
                _ => Err(invalid(key, value, "must be read_uncommitted or read_committed")),
            }
            .map(|level| self.config.isolation_level = level),
            _ => Err(invalid(key, value, "unknown key; see shareflow_share::keys for the known ones")),
        };
        if let Err(e) = result {
            self.errors.push(e);
        }
        self
    }

    /// Checks every rule and returns the first violation as [`Error::InvalidConfig`].
    pub fn build(self) -> Result<ShareConfig> {
        if let Some(e) = self.errors.into_iter().next() {
            return Err(e);
        }
        let c = self.config;
        c.validate()?;
        if let Some((interval, timeout)) = self.checkpointing {
            let needed = interval.saturating_add(timeout).as_millis();
            if u128::from(c.transaction_timeout_ms) <= needed {
                return Err(invalid(
                    keys::TXN_TIMEOUT_MS,
                    c.transaction_timeout_ms,
                    format!(
                        "must exceed checkpoint interval + checkpoint timeout = {} ms + {} ms = {needed} ms, \
                         or an ONGOING transaction can time out before its checkpoint completes",
                        interval.as_millis(),
                        timeout.as_millis()
                    ),
                ));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(err: Error) -> String {
        match err {
            Error::InvalidConfig { key, .. } => key,
            other => panic!("not a config error: {other}"),
        }
    }

    #[test]
    fn defaults_match_the_design() {
        let c = ShareConfig::builder().build().unwrap();
        assert_eq!(c.acknowledgement_mode(), AcknowledgementMode::Explicit);
        assert_eq!(c.transaction_timeout(), Duration::from_millis(60_000));
        assert_eq!(c.max_pending_transactions(), 5);
        assert_eq!(c.record_lock_duration(), Duration::from_millis(30_000));
        assert_eq!(c.delivery_count_limit(), 5);
        assert_eq!(c.partition_max_record_locks(), 2_000);
    }

    #[test]
    fn each_rule_names_its_key() {
        let b = ShareConfig::builder;
        let cases: Vec<(ShareConfigBuilder, &str)> = vec![
            (b().max_pending_transactions(0), keys::TXN_MAX_PENDING),
            (b().record_lock_duration(Duration::from_millis(999)), keys::LOCK_DURATION_MS),
            (b().record_lock_duration(Duration::from_millis(3_600_001)), keys::LOCK_DURATION_MS),
            (b().delivery_count_limit(1), keys::DELIVERY_COUNT_LIMIT),
            (b().delivery_count_limit(11), keys::DELIVERY_COUNT_LIMIT),
            (b().partition_max_record_locks(0), keys::MAX_RECORD_LOCKS),
            (b().transaction_timeout(Duration::ZERO), keys::TXN_TIMEOUT_MS),
            (
                b().transaction_timeout(Duration::from_secs(30))
                    .checkpointing(Duration::from_secs(10), Duration::from_secs(20)),
                keys::TXN_TIMEOUT_MS,
            ),
            (b().set(keys::ACK_MODE, "sometimes"), keys::ACK_MODE),
            (b().set(keys::TXN_TIMEOUT_MS, "-5"), keys::TXN_TIMEOUT_MS),
            (b().set("share.unknown", "1"), "share.unknown"),
            (b().transaction_retention(Duration::from_millis(59_999)), keys::TXN_RETENTION_MS),
            (
                b().transaction_timeout(Duration::from_secs(120)).transaction_retention(Duration::from_secs(60)),
                keys::TXN_RETENTION_MS,
            ),
        ];
        for (builder, key) in cases {
            assert_eq!(key_of(builder.build().unwrap_err()), key);
        }
    }

    #[test]
    fn bounds_are_inclusive() {
        for (lock, limit) in [(1_000, 2), (3_600_000, 10)] {
            ShareConfig::builder()
                .record_lock_duration(Duration::from_millis(lock))
                .delivery_count_limit(limit)
                .build()
                .unwrap();
        }
    }

    #[test]
    fn string_keys_set_values() {
        let c = ShareConfig::builder()
            .set(keys::ACK_MODE, "transactional")
            .set(keys::TXN_TIMEOUT_MS, "120000")
            .set(keys::ISOLATION_LEVEL, "read_committed")
            .build()
            .unwrap();
        assert_eq!(c.acknowledgement_mode(), AcknowledgementMode::Transactional);
        assert_eq!(c.transaction_timeout(), Duration::from_secs(120));
        assert_eq!(c.isolation_level(), IsolationLevel::ReadCommitted);
    }

    #[test]
    fn serde_applies_the_rules() {
        let good = ShareConfig::builder().delivery_count_limit(3).build().unwrap();
        let bytes = postcard::to_allocvec(&good).unwrap();
        assert_eq!(postcard::from_bytes::<ShareConfig>(&bytes).unwrap(), good);
        // A delivery limit of 1 cannot be built, so forge its bytes.
        let mut unchecked = good.clone();
        unchecked.delivery_count_limit = 1;
        let bytes = postcard::to_allocvec(&unchecked).unwrap();
        let err = postcard::from_bytes::<ShareConfig>(&bytes).unwrap_err();
        assert!(matches!(err, postcard::Error::SerdeDeCustom), "{err:?}");
    }

    #[test]
    fn conflicts_name_the_first_differing_group_key() {
        let group = ShareConfig::default();
        let member = ShareConfig::builder()
            .acknowledgement_mode(AcknowledgementMode::Transactional)
            .delivery_count_limit(3)
            .build()
            .unwrap();
        let (key, mine, theirs) = member.conflict_with(&group).unwrap();
        assert_eq!((key, mine.as_str(), theirs.as_str()), (keys::DELIVERY_COUNT_LIMIT, "3", "5"));
        let same = group.clone().with_acknowledgement_mode(AcknowledgementMode::Implicit);
        assert_eq!(same.conflict_with(&group), None, "the mode is the member's own");
    }

    #[test]
    fn timeout_equal_to_interval_plus_timeout_is_refused() {
        let err = ShareConfig::builder()
            .transaction_timeout(Duration::from_millis(1500))
            .checkpointing(Duration::from_millis(500), Duration::from_millis(1000))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("1500 ms"), "{err}");
    }
}
