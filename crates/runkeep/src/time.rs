//! Instants and durations as the store understands them.
//!
//! Instants are absolute epoch milliseconds ([`Timestamp`]): a lease expiry must
//! survive the process that set it, so a monotonic clock cannot be used (it is
//! not comparable across processes or hosts). Callers may inject the clock
//! (`now`) so one operation judges every expiry against one instant; an
//! injected clock is validated like any other input.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The latest instant accepted: 9999-12-31T23:59:59.999Z.
pub const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// An absolute instant in epoch milliseconds, `0..=MAX_TIMESTAMP_MS`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The epoch (0 ms). Used on disk as "no deadline could be established".
    pub const EPOCH: Timestamp = Timestamp(0);

    /// Validates an instant.
    pub fn from_millis(ms: i64) -> Result<Self> {
        if !(0..=MAX_TIMESTAMP_MS).contains(&ms) {
            return Err(Error::invalid(format!(
                "instant {ms} ms is outside 0..={MAX_TIMESTAMP_MS} (epoch milliseconds)"
            )));
        }
        Ok(Self(ms))
    }

    /// Validates an instant given as a float (as JSON numbers may be):
    /// finite, integral and in range.
    pub fn from_f64(ms: f64) -> Result<Self> {
        if !ms.is_finite() || ms.fract() != 0.0 {
            return Err(Error::invalid(format!(
                "instant {ms} is not a whole, finite number of epoch milliseconds"
            )));
        }
        Self::from_millis(ms as i64)
    }

    /// The wall clock now.
    pub fn now() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Self(ms.clamp(0, MAX_TIMESTAMP_MS))
    }

    /// Epoch milliseconds.
    pub fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + ttl`, saturating at the maximum instant.
    pub fn plus(self, ttl: Ttl) -> Self {
        Self(
            self.0
                .saturating_add(ttl.as_millis() as i64)
                .min(MAX_TIMESTAMP_MS),
        )
    }

    /// `self + ms` (ms may be negative), clamped to the valid range.
    pub fn offset(self, ms: i64) -> Self {
        Self(self.0.saturating_add(ms).clamp(0, MAX_TIMESTAMP_MS))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Self::from_f64(v).map_err(serde::de::Error::custom)
    }
}

/// Longest lease accepted: 366 days.
pub const MAX_TTL_MS: u64 = 366 * 24 * 60 * 60 * 1000;

/// A lease duration: a positive whole number of milliseconds up to [`MAX_TTL_MS`].
///
/// A zero lease is one every worker can take at once, so it is refused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Ttl(u64);

impl Ttl {
    /// Validates a lease duration in milliseconds.
    pub fn from_millis(ms: u64) -> Result<Self> {
        if ms == 0 {
            return Err(Error::invalid(
                "lease TTL must be a positive number of milliseconds (a zero lease is one every worker can take at once)",
            ));
        }
        if ms > MAX_TTL_MS {
            return Err(Error::invalid(format!(
                "lease TTL {ms} ms is longer than the limit of {MAX_TTL_MS} ms (366 days)"
            )));
        }
        Ok(Self(ms))
    }

    /// Validates a lease duration given as a float (NaN, infinities, negatives
    /// and fractions are refused).
    pub fn from_f64_millis(ms: f64) -> Result<Self> {
        if !ms.is_finite() || ms <= 0.0 {
            return Err(Error::invalid(format!(
                "lease TTL {ms} must be a positive number of milliseconds"
            )));
        }
        if ms.fract() != 0.0 {
            return Err(Error::invalid(format!(
                "lease TTL {ms} must be a whole number of milliseconds"
            )));
        }
        if ms > MAX_TTL_MS as f64 {
            return Err(Error::invalid(format!(
                "lease TTL {ms} ms is longer than the limit of {MAX_TTL_MS} ms (366 days)"
            )));
        }
        Self::from_millis(ms as u64)
    }

    /// Validates a lease duration.
    pub fn from_duration(d: Duration) -> Result<Self> {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 && !d.is_zero() {
            return Err(Error::invalid(
                "lease TTL must be at least one millisecond (a zero lease is one every worker can take at once)",
            ));
        }
        Self::from_millis(ms)
    }

    /// Milliseconds.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// As a [`Duration`].
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl TryFrom<u64> for Ttl {
    type Error = Error;
    fn try_from(v: u64) -> Result<Self> {
        Self::from_millis(v)
    }
}

impl From<Ttl> for u64 {
    fn from(t: Ttl) -> u64 {
        t.0
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ttl({}ms)", self.0)
    }
}

/// The clock a store judges time by (contract v2: lease expiry, parks'
/// deadlines, `available_at` and `finished_at` are judged on the store's
/// clock when a call does not pass an instant). The memory and directory
/// stores use [`SystemClock`] unless given another; a database store uses
/// the database's clock. Tests inject a [`ManualClock`] into the store, not
/// into each call.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The instant now.
    fn now(&self) -> Timestamp;
}

/// The machine's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told (tests, simulations). Cheap to clone;
/// clones share the instant.
#[derive(Clone, Debug)]
pub struct ManualClock(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicI64::new(
            start.as_millis(),
        )))
    }

    /// Sets the instant.
    pub fn set(&self, to: Timestamp) {
        self.0
            .store(to.as_millis(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Moves the instant by `ms` (either way).
    pub fn advance(&self, ms: i64) {
        self.set(self.now().offset(ms));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(std::sync::atomic::Ordering::SeqCst))
            .unwrap_or(Timestamp::EPOCH)
    }
}

/// Another machine's clock (a database's, a server's) read through this
/// machine's: the local clock plus the offset last observed. A store whose
/// authority is remote judges by the remote clock inside its statements or
/// requests; this is its answer to [`Clock::now`] between them, corrected
/// every time an answer carries the remote instant ([`RemoteClock::observe`]).
/// Until the first observation the offset is 0. Clones share the offset.
#[derive(Clone, Debug)]
pub struct RemoteClock {
    local: std::sync::Arc<dyn Clock>,
    offset_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl RemoteClock {
    /// The remote clock seen through `local`, offset 0 until observed.
    pub fn new(local: std::sync::Arc<dyn Clock>) -> Self {
        Self {
            local,
            offset_ms: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0)),
        }
    }

    /// A clock over the same local clock that starts from this one's
    /// current offset and then keeps its own.
    pub fn detached(&self) -> Self {
        let c = Self::new(self.local.clone());
        c.offset_ms
            .store(self.offset_ms(), std::sync::atomic::Ordering::Relaxed);
        c
    }

    /// The remote clock read `remote` just now: keep the offset to it.
    pub fn observe(&self, remote: Timestamp) {
        let local = self.local.now();
        self.offset_ms.store(
            remote.as_millis().saturating_sub(local.as_millis()),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Remote minus local, in milliseconds, as last observed.
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Clock for RemoteClock {
    fn now(&self) -> Timestamp {
        self.local.now().offset(self.offset_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_clock_is_the_local_one_plus_the_offset_last_observed() {
        let local = ManualClock::new(Timestamp::from_millis(1_000).unwrap());
        let remote = RemoteClock::new(std::sync::Arc::new(local.clone()));
        assert_eq!(
            remote.now().as_millis(),
            1_000,
            "offset 0 before any observation"
        );
        remote.observe(Timestamp::from_millis(61_000).unwrap());
        assert_eq!(remote.offset_ms(), 60_000);
        local.advance(5);
        assert_eq!(remote.now().as_millis(), 61_005);
        let shared = remote.clone();
        let detached = remote.detached();
        remote.observe(Timestamp::from_millis(1_005).unwrap());
        assert_eq!(shared.offset_ms(), 0, "clones share the offset");
        assert_eq!(
            detached.offset_ms(),
            60_000,
            "a detached clock keeps its own"
        );
    }

    #[test]
    fn ttl_refuses_zero_nan_negative_fraction_and_huge() {
        assert!(Ttl::from_millis(0).is_err());
        assert!(Ttl::from_f64_millis(f64::NAN).is_err());
        assert!(Ttl::from_f64_millis(f64::INFINITY).is_err());
        assert!(Ttl::from_f64_millis(-5.0).is_err());
        assert!(Ttl::from_f64_millis(1.5).is_err());
        assert!(Ttl::from_millis(MAX_TTL_MS + 1).is_err());
        assert!(Ttl::from_duration(Duration::from_micros(10)).is_err());
        let msg = Ttl::from_millis(0).unwrap_err().to_string();
        assert!(msg.contains("positive number of milliseconds"), "{msg}");
        assert_eq!(Ttl::from_f64_millis(1000.0).unwrap().as_millis(), 1000);
    }

    #[test]
    fn timestamps_refuse_negative_nan_and_far_future() {
        assert!(Timestamp::from_millis(-1).is_err());
        assert!(Timestamp::from_f64(f64::NAN).is_err());
        assert!(Timestamp::from_f64(1.5).is_err());
        assert!(Timestamp::from_millis(MAX_TIMESTAMP_MS + 1).is_err());
        assert!(serde_json::from_str::<Timestamp>("-3").is_err());
        assert_eq!(
            serde_json::from_str::<Timestamp>("5000000")
                .unwrap()
                .as_millis(),
            5_000_000
        );
        assert!(Timestamp::now().as_millis() > 1_700_000_000_000);
    }
}
