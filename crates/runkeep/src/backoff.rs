//! Backoff and jitter, written once for the workspace: the directory
//! store's lock and claim races (`runkeep-fs`), the PostgreSQL LISTEN
//! reconnect (`runkeep-postgres`), `HttpStore`'s event tail
//! (`runkeep-http`), the worker's idle polling (`runkeep-worker`) and the
//! soak's chaos schedule (`runkeep-soak`).
//!
//! Why not a crate: `backoff` is unmaintained, and `backon` (the usual
//! choice) wraps a fallible call in a retry loop with its own jitter
//! distribution (it adds up to one more delay). Every loop here is a
//! long-lived one that resets its delay on success (a reconnect, a tail, a
//! poll) or a synchronous race on a thread, and each keeps the bounds it
//! documents; what they share is two lines of arithmetic, which live here.

use std::time::Duration;

use rand::Rng;

/// `first × 2^streak`, capped at `max` (saturating: any `streak` is safe).
pub fn doubling(first: Duration, max: Duration, streak: u32) -> Duration {
    first
        .saturating_mul(2u32.saturating_pow(streak.min(31)))
        .min(max)
}

/// A delay that doubles after each use up to a cap, and starts again from
/// the first after a success.
#[derive(Clone, Debug)]
pub struct Doubling {
    first: Duration,
    max: Duration,
    current: Duration,
}

impl Doubling {
    /// Starts at `first`; never above `max` (unless `first` is).
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            current: first,
        }
    }

    /// Doubles without a cap (a loop bounded by a deadline instead).
    pub const fn uncapped(first: Duration) -> Self {
        Self::new(first, Duration::MAX)
    }

    /// The delay [`Doubling::next_delay`] will answer, without using it.
    pub fn current(&self) -> Duration {
        self.current
    }

    /// The delay to wait now; the next one is twice it, capped.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = d.saturating_mul(2).min(self.max);
        d
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.first;
    }
}

/// `d` shortened by a random part of up to `fraction` of itself, given a
/// uniform draw `unit` in `[0, 1)`: `d × (1 − fraction × unit)`. The pure
/// rule behind [`jitter`].
pub fn shorten(d: Duration, fraction: f64, unit: f64) -> Duration {
    d.mul_f64(1.0 - fraction * unit.clamp(0.0, 1.0))
}

/// `d` shortened by a random part of up to `fraction` (in `[0, 1]`) of
/// itself: within `(d × (1 − fraction), d]`. Jitter only shortens, so a
/// documented bound stays a bound, and a pool of waiters does not wake in
/// step.
pub fn jitter(d: Duration, fraction: f64) -> Duration {
    shorten(d, fraction, rand::thread_rng().gen::<f64>())
}

/// `d × U(lo, hi)`: a random stretch of `d` (the soak's chaos schedule and
/// its stalls past a lease TTL).
pub fn scaled(d: Duration, lo: f64, hi: f64) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(lo..hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubling_caps_and_saturates() {
        assert_eq!(doubling(100 * MS, 1000 * MS, 0), 100 * MS);
        assert_eq!(doubling(100 * MS, 1000 * MS, 3), 800 * MS);
        assert_eq!(doubling(100 * MS, 1000 * MS, 4), 1000 * MS);
        assert_eq!(doubling(100 * MS, 1000 * MS, u32::MAX), 1000 * MS);
        let us = Duration::from_micros(1);
        for lost in 1..20u32 {
            assert_eq!(
                doubling(50 * us, (50 << 7) * us, lost),
                Duration::from_micros(50u64 << lost.min(7))
            );
        }
    }

    #[test]
    fn a_doubling_delay_doubles_to_its_cap_and_resets() {
        let mut b = Doubling::new(100 * MS, 500 * MS);
        let seen: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(seen, [100 * MS, 200 * MS, 400 * MS, 500 * MS, 500 * MS]);
        b.reset();
        assert_eq!(b.current(), 100 * MS);
        assert_eq!(b.next_delay(), 100 * MS);
        let mut u = Doubling::uncapped(50 * MS);
        let seen: Vec<_> = (0..4).map(|_| u.next_delay()).collect();
        assert_eq!(seen, [50 * MS, 100 * MS, 200 * MS, 400 * MS]);
        for _ in 0..100 {
            u.next_delay();
        }
        assert_eq!(u.current(), Duration::MAX);
    }

    #[test]
    fn jitter_only_shortens_within_its_fraction() {
        assert_eq!(shorten(1000 * MS, 0.5, 0.0), 1000 * MS);
        assert_eq!(shorten(1000 * MS, 0.5, 1.0), 500 * MS);
        for _ in 0..100 {
            let d = jitter(1000 * MS, 0.5);
            assert!(d > 500 * MS && d <= 1000 * MS, "{d:?}");
            let s = scaled(1000 * MS, 0.5, 1.5);
            assert!(s >= 500 * MS && s < 1500 * MS, "{s:?}");
        }
    }
}
