//! Job configuration, validated at build time.

use std::time::Duration;

use shareflow_checkpoint::{CheckpointStore, DEFAULT_INLINE_LIMIT, MAX_INLINE_LIMIT};

use crate::error::{Result, RuntimeError};

/// How to restart a failed job. More strategies may come, so a `match` outside this
/// crate needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestartStrategy {
    /// Fail on the first error.
    None,
    /// Restart up to `attempts` times, waiting `delay` before each.
    FixedDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before each restart.
        delay: Duration,
    },
    /// Restart up to `attempts` times; the first restart waits `initial`, each next one
    /// twice as long as the one before, never more than `max`. A one-off crash costs
    /// little; a failure that repeats (a store or broker down) is retried ever more
    /// slowly instead of in a tight loop.
    ExponentialDelay {
        /// Restarts allowed.
        attempts: u32,
        /// Wait before the first restart.
        initial: Duration,
        /// The longest wait.
        max: Duration,
    },
}

impl RestartStrategy {
    /// Whether restart number `restart` (1 for the first) is allowed, and how long to
    /// wait before it.
    pub(crate) fn delay_before(&self, restart: u32) -> Option<Duration> {
        match *self {
            RestartStrategy::None => None,
            RestartStrategy::FixedDelay { attempts, delay } => (restart <= attempts).then_some(delay),
            RestartStrategy::ExponentialDelay { attempts, initial, max } => (restart <= attempts).then(|| {
                let doublings = restart.saturating_sub(1).min(31);
                initial.saturating_mul(1u32 << doublings).min(max)
            }),
        }
    }

    /// Whether this strategy can burn the delivery attempts of the records a job holds
    /// in a share group whose delivery limit is `delivery_limit`. Each failed attempt can
    /// cost every record the job holds one delivery (its locks are released, or its
    /// transaction aborted), so a failure of the job itself that repeats (a sink that is
    /// down, a checkpoint timeout too short) archives them after `delivery_limit` - 1
    /// failed attempts, counted but never processed. `None` when the restarts stop first;
    /// otherwise what to change, naming both numbers.
    pub fn burns_deliveries(&self, delivery_limit: u32) -> Option<String> {
        let restarts = self.attempts();
        if restarts < delivery_limit.saturating_sub(1) {
            return None;
        }
        Some(format!(
            "the restart strategy allows {restarts} restarts and the share group's delivery limit is {delivery_limit}: \
             a failure of the job itself that repeats (a sink that is down, a checkpoint timeout too short) costs \
             each record the job holds one delivery per failed attempt, so after {} such attempts those records are \
             ARCHIVED without being processed. Allow at most {} restarts, or raise the group's delivery limit \
             (group.share.delivery.count.limit) to {} or more",
            delivery_limit.saturating_sub(1),
            delivery_limit.saturating_sub(2),
            restarts.saturating_add(2)
        ))
    }

    /// Restarts allowed in all.
    pub fn attempts(&self) -> u32 {
        match *self {
            RestartStrategy::None => 0,
            RestartStrategy::FixedDelay { attempts, .. } | RestartStrategy::ExponentialDelay { attempts, .. } => {
                attempts
            }
        }
    }
}

/// Checkpointing and execution settings of a job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Time between checkpoints; `None`: only the final checkpoint when the input ends.
    pub checkpoint_interval: Option<Duration>,
    /// A checkpoint not complete after this is aborted. Default 30 s: with a
    /// checkpoint interval below 30 s, the seed's default transaction timeout (60 s)
    /// outlasts interval + checkpoint timeout, as a transactional participant requires.
    pub checkpoint_timeout: Duration,
    /// Least time from the end of one checkpoint to the start of the next.
    pub min_pause_between_checkpoints: Duration,
    /// Consecutive aborted checkpoints tolerated before the job fails.
    pub tolerable_checkpoint_failures: u32,
    /// Where checkpoints go.
    pub storage: CheckpointStore,
    /// Complete checkpoints kept.
    pub retained_checkpoints: usize,
    /// Bytes of state a checkpoint inlines into its manifest, smallest states first
    /// (default [`DEFAULT_INLINE_LIMIT`], 1 MiB; at most [`MAX_INLINE_LIMIT`], 16 MiB). A
    /// checkpoint whose state fits is one object; 0 inlines only empty states and puts
    /// the rest in the shared state object (a state past its 256 MiB limit gets a file of
    /// its own).
    pub inline_state_limit: usize,
    /// Restart strategy.
    pub restart: RestartStrategy,
    /// Transaction ids are `{group}-{prefix}-{checkpointId}`.
    pub transaction_group: String,
    /// The prefix of this job instance; two live instances must not share one.
    pub transaction_prefix: String,
    /// Batches a channel holds before the sender waits.
    pub channel_capacity: usize,
    /// Parallelism of operators that do not set one.
    pub default_parallelism: u32,
    /// Run as one instance of several in the share group (decision 0007); `None`: a
    /// lone job that nobody adopts.
    pub instance: Option<InstanceConfig>,
    /// Start from the savepoint at this URL ([`crate::savepoint`]): its state, unless the
    /// job has a checkpoint of its own taken after it.
    pub savepoint: Option<String>,
}

/// Settings of a job that runs as one of several instances of a share group, each with
/// its own prefix, the same group and the same checkpoint root (decision 0007).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceConfig {
    /// An instance whose heartbeat has not changed for this long is adopted by a live
    /// one: fenced, and its transactions decided from its own manifests. Must exceed
    /// checkpoint interval + checkpoint timeout.
    pub adoption_timeout: Duration,
    /// How often the instance beats and looks for silent instances. Default: a quarter
    /// of the adoption timeout. A job beats at least once per checkpoint interval
    /// whatever this says ([`Self::beat_every`]).
    pub heartbeat_interval: Duration,
}

impl InstanceConfig {
    /// Adoption after `adoption_timeout` of silence, beats every quarter of it.
    pub fn new(adoption_timeout: Duration) -> Self {
        Self { adoption_timeout, heartbeat_interval: adoption_timeout / 4 }
    }

    /// How often a job that checkpoints every `checkpoint_interval` beats: the
    /// heartbeat interval, and at most one checkpoint interval. A silent instance is
    /// noticed within two beats past the adoption timeout, so beating once per
    /// checkpoint keeps adoption within the timeout plus two checkpoint intervals, for
    /// one registry write and read per interval, fewer than the checkpoint's own.
    pub(crate) fn beat_every(&self, checkpoint_interval: Option<Duration>) -> Duration {
        match checkpoint_interval.filter(|i| !i.is_zero()) {
            Some(i) => self.heartbeat_interval.min(i),
            None => self.heartbeat_interval,
        }
    }
}

impl JobConfig {
    /// Defaults: no periodic checkpoints, 30 s timeout, no restarts, 3 retained,
    /// channel capacity 4, parallelism 1.
    pub fn new(storage: CheckpointStore, group: &str, prefix: &str) -> Self {
        Self {
            checkpoint_interval: None,
            checkpoint_timeout: Duration::from_secs(30),
            min_pause_between_checkpoints: Duration::ZERO,
            tolerable_checkpoint_failures: 0,
            storage,
            retained_checkpoints: 3,
            inline_state_limit: DEFAULT_INLINE_LIMIT,
            restart: RestartStrategy::None,
            transaction_group: group.to_string(),
            transaction_prefix: prefix.to_string(),
            channel_capacity: 4,
            default_parallelism: 1,
            instance: None,
            savepoint: None,
        }
    }

    /// Starts from the savepoint at `url` (a directory with its manifest and state
    /// files): its operator and keyed state, redistributed over this job's parallelism.
    pub fn from_savepoint(mut self, url: impl Into<String>) -> Self {
        self.savepoint = Some(url.into());
        self
    }

    /// Runs the job as one instance of several in its share group: its job id (the
    /// storage's) must equal its prefix, and silent instances are adopted after
    /// `instance.adoption_timeout`.
    pub fn instance(mut self, instance: InstanceConfig) -> Self {
        self.instance = Some(instance);
        self
    }

    /// Sets the checkpoint interval.
    pub fn checkpoint_interval(mut self, interval: Duration) -> Self {
        self.checkpoint_interval = Some(interval);
        self
    }

    /// Sets the checkpoint timeout.
    pub fn checkpoint_timeout(mut self, timeout: Duration) -> Self {
        self.checkpoint_timeout = timeout;
        self
    }

    /// Sets the restart strategy.
    pub fn restart(mut self, restart: RestartStrategy) -> Self {
        self.restart = restart;
        self
    }

    /// Sets the default parallelism.
    pub fn parallelism(mut self, parallelism: u32) -> Self {
        self.default_parallelism = parallelism;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |key: &str, value: String, rule: &str| {
            Err(RuntimeError::InvalidConfig { key: key.into(), value, rule: rule.into() })
        };
        if self.checkpoint_interval.is_some_and(|i| i.is_zero()) {
            return bad("checkpoint.interval", "0".into(), "must be > 0, or unset for no periodic checkpoints");
        }
        if self.checkpoint_timeout.is_zero() {
            return bad("checkpoint.timeout", "0".into(), "must be > 0");
        }
        if self.retained_checkpoints == 0 {
            return bad("checkpoint.retained", "0".into(), "must be >= 1: the restore point is always kept");
        }
        if self.channel_capacity == 0 {
            return bad("channel.capacity", "0".into(), "must be >= 1");
        }
        if self.default_parallelism == 0 {
            return bad("parallelism.default", "0".into(), "must be >= 1");
        }
        if self.inline_state_limit > MAX_INLINE_LIMIT {
            return bad(
                "checkpoint.inline.limit",
                format!("{} bytes", self.inline_state_limit),
                &format!(
                    "must be at most {MAX_INLINE_LIMIT} bytes ({} MiB): recovery, adoption and the admin CLI \
                     hold every stored manifest in memory together; larger state belongs in the shared state \
                     object",
                    MAX_INLINE_LIMIT >> 20
                ),
            );
        }
        if let RestartStrategy::ExponentialDelay { initial, max, .. } = self.restart {
            if initial.is_zero() {
                // Zero doubled is zero: every restart would follow at once, the tight
                // loop this strategy is there to prevent.
                return bad(
                    "restart.initial",
                    "0 ms".into(),
                    "must be above zero; for restarts without a wait use a fixed delay of 0",
                );
            }
            if initial > max {
                return bad(
                    "restart.max",
                    format!("{} ms", max.as_millis()),
                    &format!("must be at least the initial delay ({} ms)", initial.as_millis()),
                );
            }
        }
        shareflow_checkpoint::validate_group_id(&self.transaction_group)?;
        shareflow_checkpoint::validate_prefix(&self.transaction_prefix)?;
        if let Some(i) = &self.instance {
            let Some(interval) = self.checkpoint_interval else {
                return bad(
                    "checkpoint.interval",
                    "unset".into(),
                    "an instance of a share group needs periodic checkpoints: set checkpoint_interval",
                );
            };
            let needed = interval.saturating_add(self.checkpoint_timeout);
            if i.adoption_timeout <= needed {
                return bad(
                    "adoption.timeout.ms",
                    i.adoption_timeout.as_millis().to_string(),
                    &format!(
                        "must exceed checkpoint interval + checkpoint timeout ({} ms), or live instances would be \
                         adopted while they checkpoint",
                        needed.as_millis()
                    ),
                );
            }
            if i.heartbeat_interval.is_zero() || i.heartbeat_interval >= i.adoption_timeout {
                return bad(
                    "heartbeat.interval.ms",
                    i.heartbeat_interval.as_millis().to_string(),
                    "must be > 0 and below the adoption timeout (default: a quarter of it)",
                );
            }
            let job_id = self.storage.paths().job_id();
            if job_id != self.transaction_prefix {
                return bad(
                    "job.id",
                    job_id.to_string(),
                    &format!(
                        "an instance keeps its checkpoints under its prefix ({}), so adopters find them: open the \
                         checkpoint store with job id {}",
                        self.transaction_prefix, self.transaction_prefix
                    ),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Each row: restarts allowed, delivery limit, whether the restarts can archive
    /// records the job holds.
    #[test]
    fn restarts_that_outlast_the_delivery_limit_are_named() {
        let fixed = |attempts| RestartStrategy::FixedDelay { attempts, delay: Duration::ZERO };
        let rows = [
            (RestartStrategy::None, 5, false),
            (fixed(3), 5, false),
            (fixed(4), 5, true),
            (fixed(10), 5, true),
            (fixed(10), 12, false),
            (fixed(0), 1, true),
            (
                RestartStrategy::ExponentialDelay {
                    attempts: 1000,
                    initial: Duration::from_millis(1),
                    max: Duration::from_secs(1),
                },
                5,
                true,
            ),
        ];
        for (strategy, limit, burns) in rows {
            let verdict = strategy.burns_deliveries(limit);
            assert_eq!(verdict.is_some(), burns, "{strategy:?} against {limit}: {verdict:?}");
            if let Some(why) = verdict {
                assert!(why.contains(&format!("{} restarts", strategy.attempts())), "{why}");
                assert!(why.contains(&format!("delivery limit is {limit}")), "{why}");
            }
        }
    }

    #[test]
    fn restart_delays_per_strategy() {
        let ms = Duration::from_millis;
        let fixed = RestartStrategy::FixedDelay { attempts: 2, delay: ms(50) };
        let exp = RestartStrategy::ExponentialDelay { attempts: 5, initial: ms(10), max: ms(60) };
        let huge = RestartStrategy::ExponentialDelay { attempts: u32::MAX, initial: ms(1), max: ms(1_000) };
        for (strategy, restart, delay) in [
            (RestartStrategy::None, 1, None),
            (fixed, 1, Some(ms(50))),
            (fixed, 2, Some(ms(50))),
            (fixed, 3, None),
            (exp, 1, Some(ms(10))),
            (exp, 2, Some(ms(20))),
            (exp, 3, Some(ms(40))),
            // Capped at max.
            (exp, 4, Some(ms(60))),
            (exp, 5, Some(ms(60))),
            (exp, 6, None),
            // No overflow however many restarts.
            (huge, 40, Some(ms(1_000))),
            (huge, u32::MAX, Some(ms(1_000))),
        ] {
            assert_eq!(strategy.delay_before(restart), delay, "{strategy:?}, restart {restart}");
        }
        assert_eq!((RestartStrategy::None.attempts(), fixed.attempts(), exp.attempts()), (0, 2, 5));
    }

    #[test]
    fn an_exponential_delay_whose_initial_exceeds_its_max_is_refused() {
        let store = shareflow_checkpoint::CheckpointStore::from_url("memory://", &[], "job").unwrap();
        let config = JobConfig::new(store, "g", "p").restart(RestartStrategy::ExponentialDelay {
            attempts: 3,
            initial: Duration::from_secs(2),
            max: Duration::from_secs(1),
        });
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("restart.max") && err.contains("1000 ms") && err.contains("2000 ms"), "{err}");
    }

    #[test]
    fn an_exponential_delay_starting_at_zero_is_refused() {
        let store = shareflow_checkpoint::CheckpointStore::from_url("memory://", &[], "job").unwrap();
        let config = JobConfig::new(store, "g", "p").restart(RestartStrategy::ExponentialDelay {
            attempts: 3,
            initial: Duration::ZERO,
            max: Duration::from_secs(1),
        });
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("restart.initial") && err.contains("fixed delay"), "{err}");
    }

    #[test]
    fn an_inline_limit_past_the_largest_manifest_is_refused() {
        let store = shareflow_checkpoint::CheckpointStore::from_url("memory://", &[], "job").unwrap();
        let mut config = JobConfig::new(store, "g", "p");
        config.inline_state_limit = MAX_INLINE_LIMIT;
        config.validate().unwrap();
        config.inline_state_limit = MAX_INLINE_LIMIT + 1;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("checkpoint.inline.limit") && err.contains("16 MiB"), "{err}");
    }

    #[test]
    fn an_instance_beats_once_per_checkpoint_or_four_times_per_adoption_timeout_whichever_is_more_often() {
        let ms = Duration::from_millis;
        for (timeout, interval, beat) in [
            (ms(5_000), Some(ms(500)), ms(500)),
            (ms(30_000), Some(ms(1_000)), ms(1_000)),
            (ms(2_000), Some(ms(1_000)), ms(500)),
            (ms(30_000), Some(ms(60_000)), ms(7_500)),
            (ms(30_000), None, ms(7_500)),
            (ms(30_000), Some(ms(0)), ms(7_500)),
        ] {
            let beat_every = InstanceConfig::new(timeout).beat_every(interval);
            assert_eq!(beat_every, beat, "timeout {timeout:?}, interval {interval:?}");
        }
    }
}
