//! Time for the broker, injected so tests can control it.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of broker time in milliseconds. Lock and transaction timeouts read it.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Milliseconds since some fixed origin; must not go backwards.
    fn now_ms(&self) -> u64;
}

/// Wall-clock time since the Unix epoch.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use shareflow_broker::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now_ms(), 31_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self { now_ms: Arc::new(AtomicU64::new(start_ms)) }
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.now_ms.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the time; ignored if it would go backwards.
    pub fn set(&self, now_ms: u64) {
        self.now_ms.fetch_max(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// Tokio's clock: milliseconds since this clock was made, as `tokio::time` counts them.
/// Under a paused test runtime, broker time then moves with the test's virtual time.
#[derive(Debug, Clone)]
pub struct TokioClock {
    start: tokio::time::Instant,
    offset_ms: u64,
}

impl TokioClock {
    /// A clock reading `start_ms` now.
    pub fn new(start_ms: u64) -> Self {
        Self { start: tokio::time::Instant::now(), offset_ms: start_ms }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.offset_ms + self.start.elapsed().as_millis() as u64
    }
}
