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
/// machine's: the local clock plus an estimate of the offset between them.
/// A store whose authority is remote judges by the remote clock inside its
/// statements or requests; this is its answer to [`Clock::now`] between
/// them, corrected every time an answer carries the remote instant
/// ([`RemoteClock::observe`]).
///
/// Two rules keep it usable as the stamp of successive writes (checkpoints
/// of one fence are ordered by it):
/// - **An observation is a lower bound.** The remote instant was read
///   before the answer reached this machine, so `remote - local` falls short
///   of the true offset by the answer's latency. The estimate is the largest
///   observation of the last [`OFFSET_WINDOW_MS`] to twice that: a slow
///   answer (a commit that waited for a synchronous standby, a loaded
///   server) does not pull the clock back, and a remote clock that was
///   really stepped back (or a failover to a server whose clock is behind)
///   is followed within two windows.
/// - **It never runs backwards.** When the estimate drops, `now` holds at
///   the latest instant it returned until the local clock catches up.
///
/// Until the first observation the offset is 0. Clones share the estimate.
#[derive(Clone, Debug)]
pub struct RemoteClock {
    local: std::sync::Arc<dyn Clock>,
    estimate: std::sync::Arc<std::sync::Mutex<OffsetEstimate>>,
}

/// How long one bucket of [`RemoteClock`]'s windowed maximum lasts.
pub const OFFSET_WINDOW_MS: i64 = 30_000;

/// The windowed maximum of the observed offsets (two buckets: the current
/// one and the one before) and the latest instant handed out.
#[derive(Clone, Debug, Default)]
struct OffsetEstimate {
    /// The current bucket: its largest observation and the local instant it began.
    current: Option<(i64, i64)>,
    /// The previous bucket's largest observation.
    previous: Option<i64>,
    /// The latest instant `now` returned (ms).
    latest: i64,
}

impl OffsetEstimate {
    fn offset(&self) -> i64 {
        match (self.current, self.previous) {
            (Some((c, _)), Some(p)) => c.max(p),
            (Some((c, _)), None) => c,
            (None, Some(p)) => p,
            (None, None) => 0,
        }
    }

    fn observe(&mut self, offset: i64, local: i64) {
        match self.current {
            Some((best, began)) if local.saturating_sub(began) < OFFSET_WINDOW_MS => {
                self.current = Some((best.max(offset), began));
            }
            Some((best, _)) => {
                self.previous = Some(best);
                self.current = Some((offset, local));
            }
            None => self.current = Some((offset, local)),
        }
    }
}

impl RemoteClock {
    /// The remote clock seen through `local`, offset 0 until observed.
    pub fn new(local: std::sync::Arc<dyn Clock>) -> Self {
        Self {
            local,
            estimate: std::sync::Arc::default(),
        }
    }

    fn estimate(&self) -> std::sync::MutexGuard<'_, OffsetEstimate> {
        self.estimate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A clock over the same local clock that starts from this one's
    /// current estimate and then keeps its own.
    pub fn detached(&self) -> Self {
        Self {
            local: self.local.clone(),
            estimate: std::sync::Arc::new(std::sync::Mutex::new(self.estimate().clone())),
        }
    }

    /// The remote clock read `remote` (an answer that just arrived carried it).
    pub fn observe(&self, remote: Timestamp) {
        let local = self.local.now().as_millis();
        self.estimate()
            .observe(remote.as_millis().saturating_sub(local), local);
    }

    /// The estimated offset, remote minus local, in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        self.estimate().offset()
    }
}

impl Clock for RemoteClock {
    fn now(&self) -> Timestamp {
        let local = self.local.now();
        let mut e = self.estimate();
        let now = local.offset(e.offset());
        if now.as_millis() < e.latest {
            return Timestamp::from_millis(e.latest).unwrap_or(now);
        }
        e.latest = now.as_millis();
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_clock_is_the_local_one_plus_the_offset_observed() {
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
        // A faster answer shows the offset was larger.
        remote.observe(Timestamp::from_millis(61_007).unwrap());
        assert_eq!(shared.offset_ms(), 60_002, "clones share the estimate");
        assert_eq!(
            detached.offset_ms(),
            60_000,
            "a detached clock keeps its own"
        );
    }

    /// The soak's failover trial saw two checkpoints of one fence come back
    /// in the wrong order: an answer delayed by the failover set the offset
    /// back, and the next step's stamp fell before the previous one's.
    #[test]
    fn a_late_answer_never_sets_the_remote_clock_back() {
        let local = ManualClock::new(Timestamp::from_millis(100_000).unwrap());
        let remote = RemoteClock::new(std::sync::Arc::new(local.clone()));
        remote.observe(Timestamp::from_millis(100_000).unwrap());
        local.advance(20);
        let first = remote.now();
        // An answer read remotely 20 ms ago arrives 800 ms late.
        local.advance(800);
        remote.observe(first);
        let second = remote.now();
        assert!(second > first, "{second:?} after {first:?}");
        assert_eq!(remote.offset_ms(), 0, "the slow answer is not the estimate");
        // Every answer slow for two windows: the estimate follows them
        // (a server clock stepped back), and the clock holds instead of
        // running backwards while it does.
        let mut last = remote.now();
        for _ in 0..(2 * OFFSET_WINDOW_MS / 1_000 + 2) {
            local.advance(1_000);
            remote.observe(local.now().offset(-5_000));
            let now = remote.now();
            assert!(now >= last, "{now:?} before {last:?}");
            last = now;
        }
        assert_eq!(remote.offset_ms(), -5_000);
        local.advance(5_000);
        assert_eq!(remote.now(), local.now().offset(-5_000));
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
