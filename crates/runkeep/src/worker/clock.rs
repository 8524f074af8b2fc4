//! The wall clock a worker judges leases by, injectable for tests.

use std::fmt;

use crate::time::Timestamp;

/// Where a worker reads "now" when it asks the store to judge a lease.
///
/// Lease expiry is absolute epoch milliseconds (it must survive the process),
/// so claims and renewals pass the clock's instant to the store. The local
/// deadline a worker enforces on itself is measured on the monotonic clock
/// (`tokio::time::Instant`) instead, so a wall-clock jump cannot extend it.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The instant now.
    fn now(&self) -> Timestamp;
}

/// The system wall clock (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

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
