//! The settings and the metrics of a share-group source, one struct each for both
//! backends, with the same defaults.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use shareflow_share::Record;

/// Decides whether a record can be processed; `Err` names why not (a poison record).
pub type Decoder = Arc<dyn Fn(&Record) -> std::result::Result<(), String> + Send + Sync>;

/// Records per poll unless set: `max.poll.records`.
pub const DEFAULT_MAX_POLL_RECORDS: usize = 500;

/// How long one poll waits for records unless set (on Kafka, the fetch's
/// `fetch.max.wait.ms`).
pub const DEFAULT_POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// Settings of a share-group source, the same on both backends.
///
/// Make one with [`SourceSettings::new`] and set what differs from the defaults:
///
/// ```
/// # use shareflow_connector::SourceSettings;
/// let mut settings = SourceSettings::new("orders-group", &["orders"]);
/// settings.max_poll_records = 2_000;
/// settings.stop_when_drained = true;
/// assert_eq!(settings.poll_timeout, shareflow_connector::DEFAULT_POLL_TIMEOUT);
/// ```
///
/// A backend refuses, with a typed error at open, a setting it cannot honour (see each
/// field).
#[derive(Clone)]
#[non_exhaustive]
pub struct SourceSettings {
    /// The share group (`group.id`).
    pub group: String,
    /// Topics to consume.
    pub topics: Vec<String>,
    /// Records per poll (`max.poll.records`); at least 1. Default
    /// [`DEFAULT_MAX_POLL_RECORDS`].
    ///
    /// On Kafka, a poll that takes only part of a share fetch costs an acknowledgement
    /// request and a ledger intent more: set it above what a fetch brings, as
    /// `kafka::WHOLE_FETCH_POLL_RECORDS` (10,000, used by `shareflow run` and `demo
    /// --kafka`) does for up to 5 partitions per subtask. The default stays 500, the
    /// Kafka clients' own.
    pub max_poll_records: usize,
    /// How long one poll may wait for records. Default [`DEFAULT_POLL_TIMEOUT`]. An idle
    /// subtask passes a checkpoint barrier only when its poll returns, so keep this well
    /// below the checkpoint timeout.
    pub poll_timeout: Duration,
    /// Finish once every record of the topics is done or bound to a transaction: for
    /// bounded runs and tests. Default `false`.
    pub stop_when_drained: bool,
    /// At most this many records per second per subtask; `None` (the default): as fast
    /// as it goes.
    pub max_records_per_second: Option<u64>,
    /// Deliver records produced before the group's first member joined
    /// (`share.auto.offset.reset=earliest`). Default `true`. The embedded broker always
    /// starts a new group at the log start and refuses `false`.
    pub from_earliest: bool,
    /// Read only committed records (`share.isolation.level=read_committed`): what an
    /// exactly-once job wants when its input is written in transactions, as another
    /// exactly-once job's output or a dead-letter topic is. Default `false`, Kafka's
    /// default. On Kafka the source sets the group's config at start; on the embedded
    /// broker the group's [`ShareConfig`](shareflow_share::ShareConfig) sets it, and the
    /// source refuses `true` when that says otherwise.
    pub read_committed: bool,
    /// Refuses poison records; `None` (the default) accepts all. A refused record goes
    /// to the job's dead letters ([`JobBuilder::dead_letters`]) inside T(n). Without
    /// dead letters, the embedded broker's source REJECTs it (ARCHIVED); the Kafka
    /// source, which cannot reject inside a transaction, refuses a decoder without them.
    ///
    /// [`JobBuilder::dead_letters`]: shareflow_runtime::JobBuilder::dead_letters
    pub decoder: Option<Decoder>,
}

impl std::fmt::Debug for SourceSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceSettings")
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("max_poll_records", &self.max_poll_records)
            .field("poll_timeout", &self.poll_timeout)
            .field("stop_when_drained", &self.stop_when_drained)
            .field("max_records_per_second", &self.max_records_per_second)
            .field("from_earliest", &self.from_earliest)
            .field("read_committed", &self.read_committed)
            .field("decoder", &self.decoder.as_ref().map(|_| "Fn(&Record)"))
            .finish()
    }
}

impl SourceSettings {
    /// Consumes `topics` as `group`, with the defaults.
    pub fn new(group: &str, topics: &[&str]) -> Self {
        Self {
            group: group.to_string(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            max_poll_records: DEFAULT_MAX_POLL_RECORDS,
            poll_timeout: DEFAULT_POLL_TIMEOUT,
            stop_when_drained: false,
            max_records_per_second: None,
            from_earliest: true,
            read_committed: false,
            decoder: None,
        }
    }

    /// Checks the settings every backend needs; `backend` names the source in the error.
    pub(crate) fn validate(&self, backend: &str) -> crate::Result<()> {
        let invalid = |key: &str, value: String, rule: &str| {
            Err(crate::Error::InvalidConfig { key: key.into(), value, rule: format!("{backend} source: {rule}") })
        };
        if self.topics.is_empty() {
            return invalid("topics", "[]".into(), "name at least one topic to consume");
        }
        if self.max_poll_records == 0 {
            return invalid("max.poll.records", "0".into(), "must be at least 1");
        }
        if self.max_records_per_second == Some(0) {
            return invalid("max_records_per_second", "0".into(), "must be at least 1, or None for no limit");
        }
        Ok(())
    }
}

/// Counters shared by a source's subtasks, the same struct on both backends. A counter
/// a backend has no use for stays 0 (each field says which backend counts it).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct SourceMetrics {
    /// Records emitted downstream (fresh and replayed).
    pub records_emitted: AtomicU64,
    /// Redeliveries seen (delivery count > 1).
    pub records_redelivered: AtomicU64,
    /// Records the decoder refused.
    pub records_poison: AtomicU64,
    /// Records the decoder refused that went to the dead-letter topic.
    pub records_dead_lettered: AtomicU64,
    /// Records replayed from the log because their checkpoint never committed (Kafka).
    pub records_replayed: AtomicU64,
    /// Redelivered records the ledger already covered: accepted, not processed again
    /// (Kafka).
    pub records_skipped: AtomicU64,
    /// Records released because their locks could not be renewed before their intent
    /// (Kafka).
    pub records_released_late: AtomicU64,
    /// Ledger intent entries written (Kafka).
    pub intents_written: AtomicU64,
    /// Nanoseconds the subtasks waited in share consumer polls that returned records
    /// (Kafka; an idle source's empty polls are left out): with `intent_wait_nanos`,
    /// where a busy source's time goes.
    pub poll_wait_nanos: AtomicU64,
    /// Nanoseconds the subtasks waited for ledger intent writes, those that failed or
    /// timed out included (Kafka).
    pub intent_wait_nanos: AtomicU64,
}

impl SourceMetrics {
    /// Counts the redeliveries among a poll's `records` in `records_redelivered`.
    pub(crate) fn count_redelivered(&self, records: &[Record]) {
        let n = records.iter().filter(|r| r.is_redelivery()).count() as u64;
        self.records_redelivered.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every counter, typed, for an exporter (`shareflow-source-*-total`).
    pub fn metrics(&self) -> Vec<shareflow_runtime::Metric> {
        use shareflow_runtime::{Metric, MetricValue::Counter};
        let counters: [(&'static str, &'static str, &AtomicU64); 8] = [
            (
                "shareflow-source-records-emitted-total",
                "records a source emitted downstream, fresh and replayed",
                &self.records_emitted,
            ),
            (
                "shareflow-source-records-redelivered-total",
                "deliveries with a delivery count above 1",
                &self.records_redelivered,
            ),
            (
                "shareflow-source-records-poison-total",
                "records the decoder refused (embedded broker)",
                &self.records_poison,
            ),
            (
                "shareflow-source-records-dead-lettered-total",
                "poison records sent to the dead-letter topic",
                &self.records_dead_lettered,
            ),
            (
                "shareflow-source-records-replayed-total",
                "records replayed from the log because their checkpoint never committed (Kafka)",
                &self.records_replayed,
            ),
            (
                "shareflow-source-records-skipped-total",
                "redeliveries an intent already claimed: accepted and dropped (Kafka)",
                &self.records_skipped,
            ),
            (
                "shareflow-source-records-released-late-total",
                "records released because their locks could not be renewed before their intent (Kafka)",
                &self.records_released_late,
            ),
            (
                "shareflow-source-intents-written-total",
                "intent entries written to the group's intents topic (Kafka)",
                &self.intents_written,
            ),
        ];
        let ms = |c: &AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed) / 1_000_000;
        let waits = [
            (
                "shareflow-source-poll-wait-ms-total",
                "milliseconds the subtasks waited in share consumer polls that returned records (Kafka)",
                ms(&self.poll_wait_nanos),
            ),
            (
                "shareflow-source-intent-wait-ms-total",
                "milliseconds the subtasks waited for ledger intent writes (Kafka)",
                ms(&self.intent_wait_nanos),
            ),
        ];
        counters
            .into_iter()
            .map(|(name, help, c)| (name, help, c.load(std::sync::atomic::Ordering::Relaxed)))
            .chain(waits)
            .map(|(name, help, v)| Metric::new(name, help, Counter(v)))
            .collect()
    }
}

/// How far behind its pace a rate-limited subtask may be and still catch up at full
/// speed.
const RATE_BURST: Duration = Duration::from_secs(1);

/// Paces a subtask to at most `max_records_per_second`.
#[derive(Debug, Default)]
pub(crate) struct RateLimit {
    per_second: Option<u64>,
    /// When emitting started, and how much since.
    start: Option<(tokio::time::Instant, u64)>,
}

impl RateLimit {
    /// No limit for `None`.
    pub(crate) fn new(per_second: Option<u64>) -> Self {
        Self { per_second: per_second.filter(|r| *r > 0), start: None }
    }

    /// When the next record may go, given what was emitted so far; `None`: now. A
    /// subtask that fell behind (idle, no records) may catch up by at most
    /// [`RATE_BURST`] worth of records, not by everything it did not emit while idle.
    pub(crate) fn due(&mut self) -> Option<tokio::time::Instant> {
        let rate = self.per_second?;
        let now = tokio::time::Instant::now();
        let (start, emitted) = self.start.get_or_insert((now, 0));
        let due = *start + Duration::from_secs_f64(*emitted as f64 / rate as f64);
        if let Some(behind) = now.checked_duration_since(due).and_then(|b| b.checked_sub(RATE_BURST)) {
            *start += behind;
            return Some(due + behind);
        }
        Some(due)
    }

    /// Sleeps while the subtask is ahead of its limit.
    pub(crate) async fn throttle(&mut self) {
        if let Some(due) = self.due() {
            tokio::time::sleep_until(due).await;
        }
    }

    /// Counts `n` records emitted.
    pub(crate) fn emitted(&mut self, n: u64) {
        if let Some((_, emitted)) = self.start.as_mut() {
            *emitted += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_records_delivered_more_than_once_count_as_redelivered() {
        let record = |delivery_count| Record {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            value: None,
            timestamp_ms: 0,
            delivery_count,
            headers: Vec::new(),
        };
        let m = SourceMetrics::default();
        m.count_redelivered(&[record(1), record(2), record(1), record(5)]);
        m.count_redelivered(&[]);
        m.count_redelivered(&[record(1)]);
        assert_eq!(m.records_redelivered.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn the_source_waits_are_exported_in_whole_milliseconds() {
        let m = SourceMetrics::default();
        m.poll_wait_nanos.store(2_999_999, std::sync::atomic::Ordering::Relaxed);
        m.intent_wait_nanos.store(7_000_000, std::sync::atomic::Ordering::Relaxed);
        m.intents_written.store(3, std::sync::atomic::Ordering::Relaxed);
        let value = |name: &str| {
            let found: Vec<_> = m.metrics().into_iter().filter(|x| x.name == name).collect();
            assert_eq!(found.len(), 1, "{name} exported once");
            found[0].value.clone()
        };
        use shareflow_runtime::MetricValue::Counter;
        assert_eq!(value("shareflow-source-poll-wait-ms-total"), Counter(2));
        assert_eq!(value("shareflow-source-intent-wait-ms-total"), Counter(7));
        assert_eq!(value("shareflow-source-intents-written-total"), Counter(3));
    }

    #[test]
    fn both_backends_get_the_same_defaults() {
        let s = SourceSettings::new("g", &["a", "b"]);
        assert_eq!((s.group.as_str(), s.topics.len()), ("g", 2));
        assert_eq!(s.max_poll_records, 500);
        assert_eq!(s.poll_timeout, Duration::from_millis(100));
        assert!(!s.stop_when_drained && s.from_earliest);
        assert!(s.max_records_per_second.is_none() && s.decoder.is_none());
        assert!(s.validate("test").is_ok());
    }

    #[test]
    fn bad_settings_are_named() {
        let mut s = SourceSettings::new("g", &[]);
        let err = s.validate("kafka").unwrap_err().to_string();
        assert!(err.contains("topics") && err.contains("kafka source"), "{err}");
        s.topics = vec!["t".into()];
        s.max_poll_records = 0;
        assert!(s.validate("embedded").unwrap_err().to_string().contains("max.poll.records=0"));
        s.max_poll_records = 1;
        s.max_records_per_second = Some(0);
        assert!(s.validate("embedded").unwrap_err().to_string().contains("max_records_per_second=0"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_spaces_records_by_their_count() {
        let mut r = RateLimit::new(Some(100));
        let t0 = tokio::time::Instant::now();
        r.throttle().await; // nothing emitted yet: no wait
        assert_eq!(tokio::time::Instant::now(), t0);
        r.emitted(50);
        r.throttle().await; // 50 records at 100/s: due half a second after the start
        assert_eq!(tokio::time::Instant::now() - t0, Duration::from_millis(500));
        assert!(RateLimit::new(None).due().is_none());
        assert!(RateLimit::new(Some(0)).due().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_subtask_catches_up_by_at_most_one_second_of_records() {
        let mut r = RateLimit::new(Some(100));
        r.throttle().await; // the pace starts now
        let t0 = tokio::time::Instant::now();
        // 10 s without records: the limiter owes 1 s of them, not 10 s.
        tokio::time::sleep(Duration::from_secs(10)).await;
        r.throttle().await;
        assert_eq!(tokio::time::Instant::now() - t0, Duration::from_secs(10), "behind: no wait");
        r.emitted(100); // one second's worth, at once
        r.throttle().await;
        assert_eq!(tokio::time::Instant::now() - t0, Duration::from_secs(10), "the burst is allowed");
        r.emitted(100); // one more second's worth: paced again
        r.throttle().await;
        assert_eq!(tokio::time::Instant::now() - t0, Duration::from_secs(11));
    }
}
