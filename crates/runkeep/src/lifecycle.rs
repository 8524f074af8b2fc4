//! Run lifecycle (contract v2): status, finishing, attempts and
//! dead-lettering, and deferral — the rules that make the store a work queue
//! a fleet can run on. Pure functions, used by every backend.
//!
//! # The model
//!
//! A run is [`RunStatus::Active`] until its holder **finishes** it with an
//! [`Outcome`] (`completed`, `failed` or `cancelled`, an optional JSON result
//! and a reason). Finishing is fenced and ends the lease in the same change:
//! the fence is spent, a write presenting it afterwards is refused, the run
//! keeps all its evidence and stays listed with its status and
//! `finished_at`, and no claim takes it again. An operator can
//! [`reopen`](crate::CheckpointStore::reopen) a finished run: it becomes
//! active and claimable, and its next claim gets a fence above every fence
//! ever issued (fences never rewind). A run without a lifecycle record (one
//! written by the reference implementation, or before contract v2) is active.
//!
//! # Attempts and dead-lettering
//!
//! `attempts` counts the claims that **took the run over from an expired
//! lease of another holder** (or from an unreadable holding): each one is a
//! holder that lost the run without finishing or releasing it — a crash, a
//! kill, a stall past its lease — and the **failed attempts** its holders
//! reported ([`crate::failure`]: a step that raised, panicked or timed
//! out). A renewal does not count, nor does a claim
//! after a clean release (or a [`snooze`](crate::CheckpointStore::snooze)),
//! nor the first claim of a run. When a takeover would bring `attempts` to
//! the run's limit, the claim does not hand the run out: it finishes it as
//! `failed` with the reason [`ATTEMPTS_EXHAUSTED`] (the dead-letter state)
//! and answers [`ClaimOutcome::Finished`].
//! The limit is, in order: the claim's `ClaimOptions::max_attempts`, the
//! run's own limit (set when it was enqueued), else
//! [`DEFAULT_MAX_ATTEMPTS`]. So a limit of `N` dead-letters a run once `N`
//! holders have lost it.
//!
//! # Deferral
//!
//! A holder can give a run back with a not-before time
//! ([`snooze`](crate::CheckpointStore::snooze)): the lease is released and
//! the run's `available_at` is set; claims (direct or `claim_next`) answer
//! [`ClaimOutcome::NotBefore`] until then.
//! Retry with backoff without a sleeping worker. A successful claim clears
//! `available_at`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::failure::{FailedAttempt, RetryPolicy};
use crate::id::{Holder, RunId};
use crate::lease::{
    check_write_fence, decide_claim, decide_release, is_expired, ClaimDecision, ClaimOptions,
    ClaimOutcome, Fence, Lease, LeaseSummary, TopHolding,
};
use crate::scheduling::{concurrency, Concurrency, KeyBusy, Priority};
use crate::time::{Timestamp, Ttl};

/// The attempt limit when neither the claim nor the run sets one.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;
/// The reason recorded on a run dead-lettered by its attempt limit.
pub const ATTEMPTS_EXHAUSTED: &str = "attempts exhausted";
/// Largest serialized finish result accepted, in bytes (1 MiB).
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;
/// Longest finish reason accepted, in characters.
pub const MAX_REASON_CHARS: usize = 4096;

/// Where a run is in its life.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Runnable or running: claims may take it.
    #[default]
    Active,
    /// Finished successfully.
    Completed,
    /// Finished unsuccessfully (by its holder, or dead-lettered).
    Failed,
    /// Finished because it was called off.
    Cancelled,
}

impl RunStatus {
    /// Every status, in declaration order.
    pub const ALL: [RunStatus; 4] = [
        RunStatus::Active,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    /// True for every status but `Active`.
    pub fn is_finished(self) -> bool {
        self != RunStatus::Active
    }

    /// The lowercase name (`active`, `completed`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Active => "active",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RunStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        RunStatus::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{s:?} is not a run status; use active, completed, failed or cancelled"
                ))
            })
    }
}

/// How a holder ends a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishStatus {
    /// The work is done.
    Completed,
    /// The work failed and should not be retried.
    Failed,
    /// The work was called off.
    Cancelled,
}

impl From<FinishStatus> for RunStatus {
    fn from(s: FinishStatus) -> Self {
        match s {
            FinishStatus::Completed => RunStatus::Completed,
            FinishStatus::Failed => RunStatus::Failed,
            FinishStatus::Cancelled => RunStatus::Cancelled,
        }
    }
}

/// What a finish records.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The final status.
    pub status: FinishStatus,
    /// The run's result, as the host wants it kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why (free text for operators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Outcome {
    /// Completed, with an optional result.
    pub fn completed(result: Option<Value>) -> Self {
        Self {
            status: FinishStatus::Completed,
            result,
            reason: None,
        }
    }

    /// Failed, with a reason.
    pub fn failed(reason: impl Into<String>) -> Self {
        Self {
            status: FinishStatus::Failed,
            result: None,
            reason: Some(reason.into()),
        }
    }

    /// Cancelled, with a reason.
    pub fn cancelled(reason: impl Into<String>) -> Self {
        Self {
            status: FinishStatus::Cancelled,
            result: None,
            reason: Some(reason.into()),
        }
    }

    /// Refuses a result above [`MAX_RESULT_BYTES`] or a reason above
    /// [`MAX_REASON_CHARS`] (never truncated).
    pub fn validate(&self, run: &RunId) -> Result<()> {
        if let Some(r) = &self.result {
            let size = serde_json::to_vec(r).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > MAX_RESULT_BYTES {
                return Err(Error::invalid(format!(
                    "finish of run {run}: the result is {size} bytes; the limit is {MAX_RESULT_BYTES} (keep large outputs in a checkpoint or the report)"
                )));
            }
        }
        if let Some(r) = &self.reason {
            let n = r.chars().count();
            if n > MAX_REASON_CHARS {
                return Err(Error::invalid(format!(
                    "finish of run {run}: the reason is {n} characters; the limit is {MAX_REASON_CHARS}"
                )));
            }
        }
        Ok(())
    }
}

/// A run's lifecycle as the store keeps it. `Default` is what a run without
/// a record is: active, no attempts, no limit of its own, available now.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Status.
    #[serde(default)]
    pub status: RunStatus,
    /// When it was finished (store clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// The fence the finish presented (spent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_fence: Option<Fence>,
    /// The finish's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The finish's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Takeovers from expired leases so far (module docs).
    #[serde(default)]
    pub attempts: u32,
    /// The run's own attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Not claimable before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<Timestamp>,
    /// The newest failed attempts, oldest first ([`crate::failure`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailedAttempt>,
    /// The run's own retry policy (`None`: the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Each attempt's time limit, ms: a runtime stops a step that runs
    /// longer and reports the attempt failed (`timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
    /// The run must be finished by this instant (store clock): the first
    /// claim at or after it (a claim, `claim_next`, the holder's renewal)
    /// finishes it as failed, reason [`DEADLINE_PASSED`], instead of
    /// handing it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    /// Its priority ([`crate::scheduling::priority`]); serialized when not 0.
    #[serde(default, skip_serializing_if = "Priority::is_default")]
    pub priority: Priority,
    /// Its concurrency key and limit ([`crate::scheduling::concurrency`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// How long it is kept once finished, ms, overriding the store's
    /// retention policy ([`crate::scheduling::retention`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
}

/// The reason recorded on a run finished by its deadline.
pub const DEADLINE_PASSED: &str = "deadline";

/// The enqueue rule: enqueue creates a run, so it refuses one that exists
/// (`Conflict`, changing nothing). Every backend asks this before writing.
pub fn check_enqueue(run_exists: bool, run: &RunId) -> Result<()> {
    if run_exists {
        return Err(Error::Conflict {
            message: format!(
                "enqueue of run {run}: the run already exists; enqueue creates a new run (use another run id, or reopen a finished one)"
            ),
        });
    }
    Ok(())
}

impl Lifecycle {
    /// Dead-lettered: finished as failed by a claim because its holders
    /// kept losing it (reason [`ATTEMPTS_EXHAUSTED`]). The one place the
    /// reason is compared; listings carry the answer
    /// ([`crate::RunRow::dead_lettered`]).
    pub fn is_dead_lettered(&self) -> bool {
        self.status == RunStatus::Failed && self.reason.as_deref() == Some(ATTEMPTS_EXHAUSTED)
    }

    /// True when a claim at `now` may take the run (active and available).
    pub fn is_runnable(&self, now: Timestamp) -> bool {
        !self.status.is_finished() && self.available_at.is_none_or(|at| now >= at)
    }

    /// The attempt limit in force for a claim that passes `claim_limit`.
    pub fn limit(&self, claim_limit: Option<u32>) -> u32 {
        claim_limit
            .or(self.max_attempts)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS)
    }
}

/// Options of [`CheckpointStore::enqueue`](crate::CheckpointStore::enqueue).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnqueueOptions {
    /// Not claimable before this instant.
    pub available_at: Option<Timestamp>,
    /// The run's own attempt limit.
    pub max_attempts: Option<u32>,
    /// The run's own retry policy after a failed attempt (`None`: the
    /// defaults of [`crate::failure`]).
    pub retry: Option<RetryPolicy>,
    /// Each attempt's time limit (`None`: none).
    pub attempt_timeout: Option<Ttl>,
    /// The run must be finished by this instant (`None`: no deadline).
    pub deadline: Option<Timestamp>,
    /// Its priority (default 0; higher runs are claimed first).
    pub priority: Priority,
    /// Its concurrency key and limit (`None`: none).
    pub concurrency: Option<Concurrency>,
    /// How long it is kept once finished (`None`: the store's policy).
    pub retention: Option<Ttl>,
}

impl EnqueueOptions {
    /// Refuses a zero attempt limit (the run could never be handed out) and
    /// a bad retry policy. (A deadline already past is allowed: the run's
    /// first claim finishes it.)
    pub fn validate(&self, run: &RunId) -> Result<()> {
        if self.max_attempts == Some(0) {
            return Err(Error::invalid(format!(
                "enqueue of run {run}: max_attempts must be at least 1"
            )));
        }
        if let Some(p) = &self.retry {
            p.validate(run)?;
        }
        self.priority.validate()?;
        if let Some(c) = &self.concurrency {
            c.validate()?;
        }
        Ok(())
    }

    /// The lifecycle a run enqueued with these options starts with.
    pub fn lifecycle(&self) -> Lifecycle {
        Lifecycle {
            max_attempts: self.max_attempts,
            available_at: self.available_at,
            retry: self.retry,
            attempt_timeout_ms: self.attempt_timeout.map(Ttl::as_millis),
            deadline: self.deadline,
            priority: self.priority,
            concurrency: self.concurrency.clone(),
            retention_ms: self.retention.map(Ttl::as_millis),
            ..Lifecycle::default()
        }
    }
}

/// What a claim must do, given the run's top holding and lifecycle.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ClaimPlan {
    /// Publish `fence`; `takeover` when it takes the run from an expired
    /// lease of another holder (an attempt).
    Take {
        /// The fence to publish.
        fence: Fence,
        /// Counts an attempt.
        takeover: bool,
    },
    /// Someone else holds it live.
    Held(LeaseSummary),
    /// The run is finished; nothing to take.
    Finished(RunStatus),
    /// Deferred until this instant.
    NotBefore(Timestamp),
    /// The run's concurrency key is at its limit
    /// ([`crate::scheduling::concurrency`]).
    AtLimit(KeyBusy),
    /// The run's deadline has passed: finish it as failed
    /// ([`DEADLINE_PASSED`]) at `fence` instead of handing it out.
    PastDeadline {
        /// The fence the finish spends.
        fence: Fence,
    },
    /// This takeover would reach the attempt limit: finish the run as
    /// failed ([`ATTEMPTS_EXHAUSTED`]) at `fence` instead of handing it out.
    Exhausted {
        /// The fence the dead-lettering spends.
        fence: Fence,
        /// The attempt count it records.
        attempts: u32,
    },
}

/// The claim rule of contract v2: [`decide_claim`] plus status, deferral and
/// the attempt limit (module docs).
pub fn plan_claim(
    run: &RunId,
    top: Option<&TopHolding>,
    lifecycle: &Lifecycle,
    holder: &Holder,
    now: Timestamp,
    claim_limit: Option<u32>,
    key_held_by_others: u32,
) -> Result<ClaimPlan> {
    if lifecycle.status.is_finished() {
        return Ok(ClaimPlan::Finished(lifecycle.status));
    }
    let fence = match decide_claim(run, top, holder, now)? {
        ClaimDecision::Held(s) => return Ok(ClaimPlan::Held(s)),
        ClaimDecision::Take(f) => f,
    };
    if lifecycle.deadline.is_some_and(|d| now >= d) {
        return Ok(ClaimPlan::PastDeadline { fence });
    }
    let renewal = matches!(top, Some(TopHolding::Lease { holder: h, expires_at, .. })
        if h == holder && !is_expired(*expires_at, now));
    if !renewal {
        if let Some(at) = lifecycle.available_at {
            if now < at {
                return Ok(ClaimPlan::NotBefore(at));
            }
        }
        if let Some(busy) = lifecycle
            .concurrency
            .as_ref()
            .and_then(|c| concurrency::admit(c, key_held_by_others))
        {
            return Ok(ClaimPlan::AtLimit(busy));
        }
    }
    let takeover = match top {
        Some(TopHolding::Lease {
            holder: h,
            expires_at,
            ..
        }) => h != holder && is_expired(*expires_at, now),
        Some(TopHolding::Unreadable { .. }) => true,
        Some(TopHolding::Released { .. }) | None => false,
    };
    if takeover {
        let attempts = lifecycle.attempts.saturating_add(1);
        if attempts >= lifecycle.limit(claim_limit) {
            return Ok(ClaimPlan::Exhausted { fence, attempts });
        }
    }
    Ok(ClaimPlan::Take { fence, takeover })
}

/// The lifecycle after a successful take.
pub fn after_take(l: &Lifecycle, takeover: bool) -> Lifecycle {
    Lifecycle {
        attempts: l.attempts.saturating_add(u32::from(takeover)),
        available_at: None,
        ..l.clone()
    }
}

/// The lifecycle after a finish at `fence`, judged at `now`. Refuses a run
/// that is already finished (`Conflict`: a finish is recorded once; a
/// cancelled run answers `Cancelled`, so its holder learns why).
pub fn after_finish(
    run: &RunId,
    l: &Lifecycle,
    outcome: &Outcome,
    fence: Fence,
    now: Timestamp,
) -> Result<Lifecycle> {
    if l.status == RunStatus::Cancelled {
        return Err(crate::failure::cancelled(run, "finish", l));
    }
    if l.status.is_finished() {
        return Err(Error::Conflict {
            message: format!(
                "run {run} was already finished ({}) at {}; a run is finished once (reopen it first)",
                l.status,
                l.finished_at.map(|t| t.as_millis()).unwrap_or(0)
            ),
        });
    }
    Ok(Lifecycle {
        status: outcome.status.into(),
        finished_at: Some(now),
        finished_fence: Some(fence),
        result: outcome.result.clone(),
        reason: outcome.reason.clone(),
        available_at: None,
        ..l.clone()
    })
}

/// The lifecycle after an operator sets the run's priority: refused
/// (`Conflict`) on a finished run.
pub fn after_set_priority(run: &RunId, l: &Lifecycle, priority: Priority) -> Result<Lifecycle> {
    if l.status.is_finished() {
        return Err(Error::Conflict {
            message: format!(
                "set priority of run {run}: the run is finished ({}); reopen it first",
                l.status
            ),
        });
    }
    Ok(Lifecycle {
        priority,
        ..l.clone()
    })
}

/// The lifecycle a claim past the run's deadline records (finished at
/// `now`, the instant it was judged).
pub fn past_deadline(l: &Lifecycle, fence: Fence, now: Timestamp) -> Lifecycle {
    Lifecycle {
        status: RunStatus::Failed,
        finished_at: Some(now),
        finished_fence: Some(fence),
        result: None,
        reason: Some(DEADLINE_PASSED.to_string()),
        available_at: None,
        ..l.clone()
    }
}

/// The lifecycle a dead-lettering claim records.
pub fn exhausted(l: &Lifecycle, fence: Fence, attempts: u32, now: Timestamp) -> Lifecycle {
    Lifecycle {
        status: RunStatus::Failed,
        finished_at: Some(now),
        finished_fence: Some(fence),
        result: None,
        reason: Some(ATTEMPTS_EXHAUSTED.to_string()),
        attempts,
        available_at: None,
        ..l.clone()
    }
}

/// The lifecycle after an operator reopens a run: active, available now,
/// attempts back to 0 (so it is not dead-lettered again at once), the
/// finish and the failure history cleared, its own limit and retry policy
/// kept. Refuses an active run (`Conflict`).
pub fn after_reopen(run: &RunId, l: &Lifecycle) -> Result<Lifecycle> {
    if !l.status.is_finished() {
        return Err(Error::Conflict {
            message: format!("run {run} is active; only a finished run can be reopened"),
        });
    }
    // What the run is (its limits, its place in the queue, its key, how
    // long it is kept) stays; what its last life recorded (status, result,
    // attempts, failures, deferral, the deadline it missed) does not.
    Ok(Lifecycle {
        max_attempts: l.max_attempts,
        retry: l.retry,
        attempt_timeout_ms: l.attempt_timeout_ms,
        priority: l.priority,
        concurrency: l.concurrency.clone(),
        retention_ms: l.retention_ms,
        ..Lifecycle::default()
    })
}

/// The claim transition on a run whose top holding and lifecycle are kept
/// together (the memory store, a database row): [`plan_claim`] applied.
/// `Exhausted` spends the fence on a tombstone (never a lease) and records
/// the dead-lettering. The directory backend, whose state lives in separate
/// files, applies the same plan its own way.
pub fn apply_claim(
    run: &RunId,
    top: &mut Option<TopHolding>,
    lifecycle: &mut Lifecycle,
    options: &ClaimOptions,
    now: Timestamp,
    key_held_by_others: u32,
) -> Result<ClaimOutcome> {
    match plan_claim(
        run,
        top.as_ref(),
        lifecycle,
        &options.holder,
        now,
        options.max_attempts,
        key_held_by_others,
    )? {
        ClaimPlan::Held(s) => Ok(ClaimOutcome::Held(s)),
        ClaimPlan::AtLimit(b) => Ok(ClaimOutcome::AtLimit(b)),
        ClaimPlan::Finished(status) => Ok(ClaimOutcome::Finished(status)),
        ClaimPlan::NotBefore(at) => Ok(ClaimOutcome::NotBefore(at)),
        ClaimPlan::Exhausted { fence, attempts } => {
            *lifecycle = exhausted(lifecycle, fence, attempts, now);
            *top = Some(TopHolding::Released { fence });
            Ok(ClaimOutcome::Finished(lifecycle.status))
        }
        ClaimPlan::PastDeadline { fence } => {
            *lifecycle = past_deadline(lifecycle, fence, now);
            *top = Some(TopHolding::Released { fence });
            Ok(ClaimOutcome::Finished(lifecycle.status))
        }
        ClaimPlan::Take { fence, takeover } => {
            let lease = Lease {
                holder: options.holder.clone(),
                fence,
                expires_at: now.plus(options.ttl),
                attempt_timeout_ms: lifecycle.attempt_timeout_ms,
            };
            *top = Some(TopHolding::Lease {
                fence,
                holder: lease.holder.clone(),
                expires_at: lease.expires_at,
            });
            *lifecycle = after_take(lifecycle, takeover);
            Ok(ClaimOutcome::Acquired(lease))
        }
    }
}

/// The finish transition (kept-together state, as [`apply_claim`]): a
/// finished run is `Conflict` whatever the fence (the caller learns the run
/// is finished, not only that it lost it), then the fence rule, then the
/// lease ends with a tombstone at `fence + 1`. Nothing changes on a refusal.
pub fn apply_finish(
    run: &RunId,
    top: &mut Option<TopHolding>,
    lifecycle: &mut Lifecycle,
    outcome: &Outcome,
    fence: Fence,
    now: Timestamp,
) -> Result<Lifecycle> {
    let l = after_finish(run, lifecycle, outcome, fence, now)?;
    check_write_fence(run, "finish", fence, top.as_ref())?;
    let tomb = fence.next(run)?;
    *top = Some(TopHolding::Released { fence: tomb });
    *lifecycle = l.clone();
    Ok(l)
}

/// The snooze transition (kept-together state, as [`apply_claim`]): a
/// release of `fence` that also defers the run until `until`; `false` and no
/// change when `fence` is not the run's current holding.
pub fn apply_snooze(
    run: &RunId,
    top: &mut Option<TopHolding>,
    lifecycle: &mut Lifecycle,
    fence: Fence,
    until: Timestamp,
) -> Result<bool> {
    match decide_release(run, top.as_ref(), fence)? {
        Some(tomb) => {
            *top = Some(TopHolding::Released { fence: tomb });
            lifecycle.available_at = Some(until);
            Ok(true)
        }
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }
    fn f(n: u64) -> Fence {
        Fence::new(n).unwrap()
    }
    fn run() -> RunId {
        RunId::new("run_a").unwrap()
    }
    fn h(s: &str) -> Holder {
        Holder::new(s).unwrap()
    }
    fn lease(fence: u64, holder: &str, exp: i64) -> TopHolding {
        TopHolding::Lease {
            fence: f(fence),
            holder: h(holder),
            expires_at: at(exp),
        }
    }

    #[test]
    fn only_takeovers_from_expired_leases_count_attempts() {
        let l = Lifecycle::default();
        let plan = |top: Option<TopHolding>, who: &str| {
            plan_claim(&run(), top.as_ref(), &l, &h(who), at(100), None, 0).unwrap()
        };
        // First claim, after a release, renewal: no attempt.
        assert_eq!(
            plan(None, "a"),
            ClaimPlan::Take {
                fence: f(1),
                takeover: false
            }
        );
        assert_eq!(
            plan(Some(TopHolding::Released { fence: f(2) }), "a"),
            ClaimPlan::Take {
                fence: f(3),
                takeover: false
            }
        );
        assert_eq!(
            plan(Some(lease(3, "a", 200)), "a"),
            ClaimPlan::Take {
                fence: f(4),
                takeover: false
            }
        );
        // Another holder's expired lease, or an unreadable one: an attempt.
        assert_eq!(
            plan(Some(lease(3, "a", 50)), "b"),
            ClaimPlan::Take {
                fence: f(4),
                takeover: true
            }
        );
        assert_eq!(
            plan(Some(TopHolding::Unreadable { fence: f(3) }), "b"),
            ClaimPlan::Take {
                fence: f(4),
                takeover: true
            }
        );
        assert!(matches!(
            plan(Some(lease(3, "a", 200)), "b"),
            ClaimPlan::Held(_)
        ));
    }

    #[test]
    fn the_takeover_that_reaches_the_limit_dead_letters() {
        let mut l = Lifecycle {
            max_attempts: Some(3),
            ..Lifecycle::default()
        };
        let top = lease(5, "a", 50);
        for expected in [1, 2] {
            let p = plan_claim(&run(), Some(&top), &l, &h("b"), at(100), None, 0).unwrap();
            assert_eq!(
                p,
                ClaimPlan::Take {
                    fence: f(6),
                    takeover: true
                }
            );
            l = after_take(&l, true);
            assert_eq!(l.attempts, expected);
        }
        let p = plan_claim(&run(), Some(&top), &l, &h("b"), at(100), None, 0).unwrap();
        assert_eq!(
            p,
            ClaimPlan::Exhausted {
                fence: f(6),
                attempts: 3
            }
        );
        // The claim's own limit wins over the run's.
        let p = plan_claim(&run(), Some(&top), &l, &h("b"), at(100), Some(10), 0).unwrap();
        assert!(matches!(p, ClaimPlan::Take { .. }));
        let dead = exhausted(&l, f(6), 3, at(100));
        assert_eq!(dead.status, RunStatus::Failed);
        assert_eq!(dead.reason.as_deref(), Some(ATTEMPTS_EXHAUSTED));
        let p = plan_claim(&run(), None, &dead, &h("b"), at(100), None, 0).unwrap();
        assert_eq!(p, ClaimPlan::Finished(RunStatus::Failed));
    }

    #[test]
    fn deferral_holds_until_its_instant_and_a_take_clears_it() {
        let l = Lifecycle {
            available_at: Some(at(500)),
            ..Lifecycle::default()
        };
        let top = TopHolding::Released { fence: f(2) };
        assert_eq!(
            plan_claim(&run(), Some(&top), &l, &h("a"), at(499), None, 0).unwrap(),
            ClaimPlan::NotBefore(at(500))
        );
        assert!(matches!(
            plan_claim(&run(), Some(&top), &l, &h("a"), at(500), None, 0).unwrap(),
            ClaimPlan::Take { .. }
        ));
        assert_eq!(after_take(&l, false).available_at, None);
        assert!(!l.is_runnable(at(499)) && l.is_runnable(at(500)));
    }

    #[test]
    fn finish_once_reopen_only_finished() {
        let l = Lifecycle::default();
        let done = after_finish(&run(), &l, &Outcome::completed(None), f(4), at(9)).unwrap();
        assert_eq!(done.status, RunStatus::Completed);
        assert_eq!(done.finished_fence, Some(f(4)));
        assert!(matches!(
            after_finish(&run(), &done, &Outcome::failed("x"), f(4), at(9)),
            Err(Error::Conflict { .. })
        ));
        assert!(matches!(
            after_reopen(&run(), &l),
            Err(Error::Conflict { .. })
        ));
        let again = after_reopen(&run(), &done).unwrap();
        assert_eq!(again, Lifecycle::default());
        // What the run is stays across a reopen: priority, key, retention.
        let keyed = Lifecycle {
            priority: Priority::new(7).unwrap(),
            concurrency: Some(Concurrency::new("k", 2).unwrap()),
            retention_ms: Some(1_000),
            attempts: 3,
            ..Lifecycle::default()
        };
        let done = after_finish(&run(), &keyed, &Outcome::completed(None), f(4), at(9)).unwrap();
        let again = after_reopen(&run(), &done).unwrap();
        assert_eq!(again.priority, keyed.priority);
        assert_eq!(again.concurrency, keyed.concurrency);
        assert_eq!(again.retention_ms, Some(1_000));
        assert_eq!((again.attempts, again.status), (0, RunStatus::Active));
    }

    #[test]
    fn outcome_limits_are_refused_not_truncated() {
        let big = Outcome::completed(Some(Value::String("x".repeat(MAX_RESULT_BYTES))));
        assert!(big.validate(&run()).is_err());
        let long = Outcome::failed("y".repeat(MAX_REASON_CHARS + 1));
        assert!(long.validate(&run()).is_err());
        assert!(Outcome::failed("fine").validate(&run()).is_ok());
        assert_eq!("failed".parse::<RunStatus>().unwrap(), RunStatus::Failed);
        assert!("done".parse::<RunStatus>().is_err());
    }
}
