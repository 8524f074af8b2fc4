//! Failed attempts and cancellation (contract v2): what happens when a step
//! raises, and when an operator calls a run off. Pure functions, used by
//! every backend; [`crate::lifecycle`] holds the rest of the run's life.
//!
//! # Failed attempts
//!
//! A holder whose step returned an error (or panicked, or ran past its
//! attempt timeout) reports it with
//! [`fail_attempt`](crate::CheckpointStore::fail_attempt), fenced like a
//! write. The store, in one change:
//!
//! - counts it in `attempts`, the same counter a takeover of an expired lease
//!   counts in, so a run that kills its worker and a run that raises meet
//!   the same limit;
//! - keeps the error ([`AttemptError`]: a kind and a message, bounded) in the
//!   run's failure history ([`FailedAttempt`], the newest
//!   [`MAX_KEPT_FAILURES`]);
//! - ends the holding (a release tombstone, as for a snooze), and
//! - either defers the run by the backoff of its [`RetryPolicy`]
//!   (`available_at`), or, when the count reaches the limit, dead-letters it:
//!   failed, reason [`ATTEMPTS_EXHAUSTED`], the last error on top of the
//!   history.
//!
//! The backoff is exponential with *equal jitter*: attempt `n` (1-based)
//! waits `d/2 + u × d/2` where `d = min(base × factor^(n-1), cap)` and `u`
//! in `[0, 1)` is derived from the run id and `n` (FNV-1a), not from a
//! random generator. Every backend therefore computes the same instant for
//! the same failure (the differential tests compare them), while runs that
//! failed together still spread out.
//!
//! # Cancel
//!
//! An operator (never a holder: it is unfenced) cancels an active run,
//! claimed or not: it is finished as [`RunStatus::Cancelled`] with the
//! operator's reason, and a release tombstone goes above its top holding,
//! so the holder's next write is refused and no claim takes the run until
//! it is reopened. A holder's refused write on a cancelled run is told so:
//! [`refine_refusal`] turns the fence refusal into [`Error::Cancelled`],
//! and the holder's renewal answers `ClaimOutcome::Finished(Cancelled)`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lease::{check_write_fence, Fence, TopHolding};
use crate::lifecycle::{Lifecycle, RunStatus, ATTEMPTS_EXHAUSTED, MAX_REASON_CHARS};
use crate::time::Timestamp;
use crate::RunId;

/// Longest error kind kept, in characters.
pub const MAX_ERROR_KIND_CHARS: usize = 128;
/// Longest error message kept, in characters.
pub const MAX_ERROR_MESSAGE_CHARS: usize = 4096;
/// How many failed attempts a run's history keeps (the newest; `attempts`
/// still counts every one).
pub const MAX_KEPT_FAILURES: usize = 20;

/// The default first retry delay: 1 s.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(1);
/// The default growth per attempt: ×2.
pub const DEFAULT_RETRY_FACTOR: f64 = 2.0;
/// The default longest retry delay: 10 min.
pub const DEFAULT_RETRY_CAP: Duration = Duration::from_secs(600);
/// The longest retry delay a policy may set: 7 days.
pub const MAX_RETRY_CAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The error of a failed attempt, as the store keeps it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptError {
    /// What failed, in a word: `error`, `panic`, `timeout`, or the host's
    /// own error class name.
    pub kind: String,
    /// The error's text.
    pub message: String,
}

impl AttemptError {
    /// An error, cut to the limits ([`MAX_ERROR_KIND_CHARS`],
    /// [`MAX_ERROR_MESSAGE_CHARS`]) with a marker saying how much was cut,
    /// so a runtime can always record what its step raised. An empty kind
    /// becomes `error`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        let kind = kind.into();
        let kind = if kind.trim().is_empty() {
            "error".to_string()
        } else {
            cut(kind, MAX_ERROR_KIND_CHARS)
        };
        Self {
            kind,
            message: cut(message.into(), MAX_ERROR_MESSAGE_CHARS),
        }
    }

    /// Refuses an empty kind, or a kind or message above the limits (what
    /// arrives over the wire is checked, never cut silently).
    pub fn validate(&self, run: &RunId) -> Result<()> {
        if self.kind.trim().is_empty() {
            return Err(Error::invalid(format!(
                "failed attempt of run {run}: the error kind is empty; name it (`error`, `panic`, `timeout`, or the error's class)"
            )));
        }
        let k = self.kind.chars().count();
        if k > MAX_ERROR_KIND_CHARS {
            return Err(Error::invalid(format!(
                "failed attempt of run {run}: the error kind is {k} characters; the limit is {MAX_ERROR_KIND_CHARS}"
            )));
        }
        let m = self.message.chars().count();
        if m > MAX_ERROR_MESSAGE_CHARS {
            return Err(Error::invalid(format!(
                "failed attempt of run {run}: the error message is {m} characters; the limit is {MAX_ERROR_MESSAGE_CHARS} (AttemptError::new cuts it with a marker)"
            )));
        }
        Ok(())
    }
}

fn cut(s: String, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s;
    }
    let marker = format!(" … [{} more characters cut]", n - max);
    let keep = max.saturating_sub(marker.chars().count());
    let mut out: String = s.chars().take(keep).collect();
    out.push_str(&marker);
    out
}

/// One failed attempt in a run's history.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedAttempt {
    /// The attempt count this failure brought the run to.
    pub attempt: u32,
    /// The fence of the holding that failed.
    pub fence: Fence,
    /// When it was recorded (store clock).
    pub at: Timestamp,
    /// The error.
    #[serde(flatten)]
    pub error: AttemptError,
    /// When the run became claimable again; `None` when this failure
    /// dead-lettered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
}

/// How a run is retried after a failed attempt (set on enqueue; the
/// defaults are [`DEFAULT_RETRY_BASE`], [`DEFAULT_RETRY_FACTOR`],
/// [`DEFAULT_RETRY_CAP`]).
#[derive(Clone, Copy, PartialEq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// The first delay, in milliseconds.
    pub base_ms: u64,
    /// The growth per attempt (`1.0`: a constant delay).
    pub factor: f64,
    /// The longest delay, in milliseconds.
    pub cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base_ms: DEFAULT_RETRY_BASE.as_millis() as u64,
            factor: DEFAULT_RETRY_FACTOR,
            cap_ms: DEFAULT_RETRY_CAP.as_millis() as u64,
        }
    }
}

impl RetryPolicy {
    /// Refuses a factor below 1 or above 100 (or not finite), or a base or
    /// cap above [`MAX_RETRY_CAP`]. A cap below the base is allowed: every
    /// delay is then the cap.
    pub fn validate(&self, run: &RunId) -> Result<()> {
        if !self.factor.is_finite() || !(1.0..=100.0).contains(&self.factor) {
            return Err(Error::invalid(format!(
                "retry policy of run {run}: factor {} is outside 1..=100 (1: the same delay every time)",
                self.factor
            )));
        }
        let max = MAX_RETRY_CAP.as_millis() as u64;
        if self.base_ms > max {
            return Err(Error::invalid(format!(
                "retry policy of run {run}: base {} ms is above the longest delay allowed, {max} ms (7 days)",
                self.base_ms
            )));
        }
        if self.cap_ms > max {
            return Err(Error::invalid(format!(
                "retry policy of run {run}: cap {} ms is above the longest delay allowed, {max} ms (7 days); set a deadline or reopen the run by hand instead",
                self.cap_ms
            )));
        }
        Ok(())
    }

    /// The delay after failed attempt `attempt` (1-based) of `run`
    /// (module docs: exponential, equal jitter, derived from the run id).
    pub fn delay(&self, run: &RunId, attempt: u32) -> Duration {
        let exp = self
            .factor
            .powi(attempt.saturating_sub(1).min(1_000) as i32);
        let full = (self.base_ms as f64 * exp).min(self.cap_ms as f64);
        let half = full / 2.0;
        Duration::from_millis((half + unit(run, attempt) * half) as u64)
    }
}

/// A number in `[0, 1)` from the run id and the attempt (FNV-1a 64).
fn unit(run: &RunId, attempt: u32) -> f64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(run.as_str().as_bytes());
    h.write(&attempt.to_le_bytes());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The lifecycle after the holder at `fence` reports a failed attempt at
/// `now`, with the attempt limit of the report (`limit`) over the run's
/// own. Refuses a finished run (`Conflict`, as a finish does); the fence
/// rule is the caller's, atomically with the write.
pub fn after_failure(
    run: &RunId,
    l: &Lifecycle,
    fence: Fence,
    error: &AttemptError,
    limit: Option<u32>,
    now: Timestamp,
) -> Result<Lifecycle> {
    if l.status == RunStatus::Cancelled {
        return Err(cancelled(run, "fail_attempt", l));
    }
    if l.status.is_finished() {
        return Err(Error::Conflict {
            message: format!(
                "failed attempt of run {run}: the run was already finished ({}); nothing to retry",
                l.status
            ),
        });
    }
    let attempt = l.attempts.saturating_add(1);
    let dead = attempt >= l.limit(limit);
    let retry_at = (!dead).then(|| {
        let delay = l.retry.unwrap_or_default().delay(run, attempt);
        now.offset(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
    });
    let mut failures = l.failures.clone();
    failures.push(FailedAttempt {
        attempt,
        fence,
        at: now,
        error: error.clone(),
        retry_at,
    });
    if failures.len() > MAX_KEPT_FAILURES {
        failures.drain(..failures.len() - MAX_KEPT_FAILURES);
    }
    let mut next = Lifecycle {
        attempts: attempt,
        failures,
        available_at: retry_at,
        ..l.clone()
    };
    if dead {
        next.status = RunStatus::Failed;
        next.finished_at = Some(now);
        next.finished_fence = Some(fence);
        next.result = None;
        next.reason = Some(ATTEMPTS_EXHAUSTED.to_string());
    }
    Ok(next)
}

/// Refuses a cancel reason above [`MAX_REASON_CHARS`].
pub fn check_cancel_reason(run: &RunId, reason: Option<&str>) -> Result<()> {
    if let Some(r) = reason {
        let n = r.chars().count();
        if n > MAX_REASON_CHARS {
            return Err(Error::invalid(format!(
                "cancel of run {run}: the reason is {n} characters; the limit is {MAX_REASON_CHARS}"
            )));
        }
    }
    Ok(())
}

/// The lifecycle after an operator cancels the run at `now`, and the
/// tombstone fence to publish above `top` (`None` for a run never
/// claimed: no holding exists to end). Refuses a finished run
/// (`Conflict`) and a run that does not exist (`NotFound`, `exists`).
pub fn after_cancel(
    run: &RunId,
    exists: bool,
    l: &Lifecycle,
    top: Option<&TopHolding>,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<(Lifecycle, Option<Fence>)> {
    check_cancel_reason(run, reason)?;
    if !exists {
        return Err(Error::NotFound {
            what: format!("run {run}"),
        });
    }
    if l.status.is_finished() {
        return Err(Error::Conflict {
            message: format!(
                "cancel of run {run}: the run was already finished ({}); reopen it first to run it again",
                l.status
            ),
        });
    }
    // A lease (live or lapsed) or an unreadable holding is ended as a
    // finish ends it: its fence is spent, a tombstone goes above it.
    let (tomb, spent) = match top {
        Some(t @ (TopHolding::Lease { .. } | TopHolding::Unreadable { .. })) => {
            (Some(t.fence().next(run)?), Some(t.fence()))
        }
        Some(TopHolding::Released { .. }) | None => (None, None),
    };
    Ok((
        Lifecycle {
            status: RunStatus::Cancelled,
            finished_at: Some(now),
            finished_fence: spent,
            result: None,
            reason: Some(reason.unwrap_or(CANCELLED_BY_OPERATOR).to_string()),
            available_at: None,
            ..l.clone()
        },
        tomb,
    ))
}

/// The reason recorded on a cancel that gave none.
pub const CANCELLED_BY_OPERATOR: &str = "cancelled by an operator";

/// The refusal of a holder's act on a cancelled run.
pub fn cancelled(run: &RunId, operation: &'static str, l: &Lifecycle) -> Error {
    Error::Cancelled {
        run: run.to_string(),
        operation,
        reason: l.reason.clone(),
    }
}

/// A holder's write refused for its fence on a run that was cancelled is
/// answered [`Error::Cancelled`] instead, so the holder learns why it lost
/// the run (and stops instead of treating it as a takeover). Any other
/// error is returned unchanged.
pub fn refine_refusal(error: Error, l: &Lifecycle) -> Error {
    match error {
        Error::FencedOut { run, operation, .. } if l.status == RunStatus::Cancelled => {
            Error::Cancelled {
                run,
                operation,
                reason: l.reason.clone(),
            }
        }
        other => other,
    }
}

/// The failed-attempt transition on a run whose top holding and lifecycle
/// are kept together (the memory store, a database row): the finished-run
/// check, the fence rule, then the holding ends with a tombstone at
/// `fence + 1` and the lifecycle records the failure. Nothing changes on a
/// refusal.
pub fn apply_failure(
    run: &RunId,
    top: &mut Option<TopHolding>,
    lifecycle: &mut Lifecycle,
    fence: Fence,
    error: &AttemptError,
    limit: Option<u32>,
    now: Timestamp,
) -> Result<Lifecycle> {
    error.validate(run)?;
    let next = after_failure(run, lifecycle, fence, error, limit, now)?;
    check_write_fence(run, "fail_attempt", fence, top.as_ref())
        .map_err(|e| refine_refusal(e, lifecycle))?;
    *top = Some(TopHolding::Released {
        fence: fence.next(run)?,
    });
    *lifecycle = next.clone();
    Ok(next)
}

/// The cancel transition (kept-together state, as [`apply_failure`]).
pub fn apply_cancel(
    run: &RunId,
    exists: bool,
    top: &mut Option<TopHolding>,
    lifecycle: &mut Lifecycle,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<Lifecycle> {
    let (next, tomb) = after_cancel(run, exists, lifecycle, top.as_ref(), reason, now)?;
    if let Some(fence) = tomb {
        *top = Some(TopHolding::Released { fence });
    }
    *lifecycle = next.clone();
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Holder;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }
    fn f(n: u64) -> Fence {
        Fence::new(n).unwrap()
    }
    fn run() -> RunId {
        RunId::new("run_a").unwrap()
    }
    fn lease(fence: u64) -> TopHolding {
        TopHolding::Lease {
            fence: f(fence),
            holder: Holder::new("w").unwrap(),
            expires_at: at(10_000),
        }
    }

    #[test]
    fn backoff_grows_with_equal_jitter_and_stops_at_the_cap() {
        let p = RetryPolicy::default();
        for attempt in 1..=20u32 {
            let full = (1000.0 * 2f64.powi(attempt as i32 - 1)).min(600_000.0);
            let d = p.delay(&run(), attempt).as_millis() as f64;
            assert!(
                d >= full / 2.0 && d < full,
                "attempt {attempt}: {d} vs {full}"
            );
        }
        // The same run and attempt: the same delay, on every backend.
        assert_eq!(p.delay(&run(), 3), p.delay(&run(), 3));
        // Different runs spread out.
        let other = RunId::new("run_b").unwrap();
        assert_ne!(p.delay(&run(), 5), p.delay(&other, 5));
        let flat = RetryPolicy {
            base_ms: 100,
            factor: 1.0,
            cap_ms: 100,
        };
        assert!(flat.delay(&run(), 30) <= Duration::from_millis(100));
    }

    #[test]
    fn bad_policies_and_errors_are_refused() {
        let bad = |p: RetryPolicy| p.validate(&run()).is_err();
        assert!(bad(RetryPolicy {
            factor: 0.5,
            ..RetryPolicy::default()
        }));
        assert!(bad(RetryPolicy {
            factor: f64::NAN,
            ..RetryPolicy::default()
        }));
        assert!(!bad(RetryPolicy {
            base_ms: 10,
            cap_ms: 5,
            factor: 2.0
        }));
        assert!(bad(RetryPolicy {
            base_ms: u64::MAX,
            cap_ms: 5,
            factor: 2.0
        }));
        assert!(bad(RetryPolicy {
            cap_ms: u64::MAX,
            ..RetryPolicy::default()
        }));
        assert!(!bad(RetryPolicy::default()));
        let long = AttemptError {
            kind: "error".into(),
            message: "x".repeat(MAX_ERROR_MESSAGE_CHARS + 1),
        };
        assert!(long.validate(&run()).is_err());
        let cut = AttemptError::new("error", "x".repeat(MAX_ERROR_MESSAGE_CHARS * 3));
        assert!(cut.validate(&run()).is_ok());
        assert!(cut.message.ends_with("characters cut]"));
        assert_eq!(AttemptError::new("  ", "m").kind, "error");
    }

    #[test]
    fn failures_count_defer_and_dead_letter_at_the_limit() {
        let mut l = Lifecycle {
            max_attempts: Some(3),
            ..Lifecycle::default()
        };
        let mut top = Some(lease(1));
        let e = AttemptError::new("error", "boom");
        let done = apply_failure(&run(), &mut top, &mut l, f(1), &e, None, at(0)).unwrap();
        assert_eq!(done.attempts, 1);
        assert_eq!(done.status, RunStatus::Active);
        let until = done.available_at.unwrap();
        assert!(until >= at(500) && until < at(1000));
        assert_eq!(top, Some(TopHolding::Released { fence: f(2) }));
        // The same fence again: refused, nothing changes.
        assert!(apply_failure(&run(), &mut top, &mut l, f(1), &e, None, at(0)).is_err());
        assert_eq!(l.attempts, 1);
        top = Some(lease(3));
        apply_failure(&run(), &mut top, &mut l, f(3), &e, None, at(5000)).unwrap();
        top = Some(lease(5));
        let dead = apply_failure(&run(), &mut top, &mut l, f(5), &e, None, at(9000)).unwrap();
        assert!(dead.is_dead_lettered());
        assert_eq!(dead.attempts, 3);
        assert_eq!(dead.failures.len(), 3);
        assert_eq!(dead.failures[2].retry_at, None);
        assert_eq!(dead.available_at, None);
    }

    #[test]
    fn the_history_keeps_the_newest() {
        let mut l = Lifecycle {
            max_attempts: Some(1000),
            ..Lifecycle::default()
        };
        for n in 1..=(MAX_KEPT_FAILURES as u64 + 5) {
            let mut top = Some(lease(n));
            let e = AttemptError::new("error", format!("#{n}"));
            apply_failure(&run(), &mut top, &mut l, f(n), &e, None, at(0)).unwrap();
        }
        assert_eq!(l.failures.len(), MAX_KEPT_FAILURES);
        assert_eq!(
            l.failures.last().unwrap().error.message,
            format!("#{}", MAX_KEPT_FAILURES + 5)
        );
        assert_eq!(l.attempts as usize, MAX_KEPT_FAILURES + 5);
    }

    #[test]
    fn cancel_ends_the_holding_and_refusals_say_cancelled() {
        let mut l = Lifecycle::default();
        let mut top = Some(lease(4));
        let c = apply_cancel(&run(), true, &mut top, &mut l, Some("customer left"), at(7)).unwrap();
        assert_eq!(c.status, RunStatus::Cancelled);
        assert_eq!(top, Some(TopHolding::Released { fence: f(5) }));
        let refused = check_write_fence(&run(), "append", f(4), top.as_ref()).unwrap_err();
        assert!(matches!(
            refine_refusal(refused, &l),
            Error::Cancelled { reason: Some(ref r), .. } if r == "customer left"
        ));
        // Once.
        assert!(matches!(
            apply_cancel(&run(), true, &mut top, &mut l, None, at(8)),
            Err(Error::Conflict { .. })
        ));
        // A run never claimed: no tombstone; one that does not exist: NotFound.
        let mut fresh = Lifecycle::default();
        let mut none = None;
        apply_cancel(&run(), true, &mut none, &mut fresh, None, at(1)).unwrap();
        assert_eq!(none, None);
        assert!(matches!(
            apply_cancel(
                &run(),
                false,
                &mut None,
                &mut Lifecycle::default(),
                None,
                at(1)
            ),
            Err(Error::NotFound { .. })
        ));
    }
}
