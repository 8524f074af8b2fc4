//! The wall clock a worker judges leases by, injectable for tests.
//!
//! [`Clock`] and [`SystemClock`] are the core's ([`runkeep::time`]): one
//! trait for the store's clock and the worker's, so a test can hand the same
//! clock to both.

use runkeep::time::Timestamp;
pub use runkeep::time::{Clock, SystemClock};

/// A clock that follows tokio's clock from a fixed origin: `origin` plus the
/// time tokio says has passed since it was built.
///
/// Under a paused tokio runtime (`#[tokio::test(start_paused = true)]`) it
/// moves only when tokio time moves, so a test can let several lease TTLs
/// pass in an instant and the store judges expiry on the same time line as
/// the worker.
#[derive(Clone, Debug)]
pub struct TokioClock {
    origin: Timestamp,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin` now.
    pub fn new(origin: Timestamp) -> Self {
        Self {
            origin,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.started);
        let ms = i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX);
        self.origin.offset(ms)
    }
}
