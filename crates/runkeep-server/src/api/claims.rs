//! Claims and the run lifecycle: claim (and renew), release, finish,
//! snooze, failed attempts, cancel, enqueue, reopen, set priority, lease,
//! lifecycle.

use axum::extract::State;
use axum::{Extension, Json};

use super::extract::{JsonBody, RunAddr, Q};
use super::runs::ApiResult;
use crate::auth::Principal;
use crate::problem::Problem;
use crate::state::AppState;
use runkeep_http::wire::{self, ClaimAnswer, Done, LifecycleBody, MaybeLease, NowQuery};

use super::ownership;

pub(super) fn checked<T>(state: &AppState, r: runkeep::Result<T>) -> Result<T, Problem> {
    if let Err(e) = &r {
        if e.is_fenced_out() {
            state.metrics.record_fenced_out();
        }
    }
    r.map_err(Problem::from)
}

pub(super) async fn claim(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::ClaimBody>,
) -> ApiResult<ClaimAnswer> {
    let mut options = body.to_options()?;
    options.holder = ownership::tag(&body.holder, &principal.token_id, "holder")?;
    let outcome = state.store.claim(&scope, &options).await?;
    let answer = ClaimAnswer::from(&outcome);
    state.metrics.record_claim(answer.label());
    Ok(Json(answer))
}

pub(super) async fn release(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::ReleaseBody>,
) -> ApiResult<Done> {
    let fence = match wire::opt_fence("fence", body.fence)? {
        Some(f) => {
            let done = state.store.release(&scope, f).await?;
            if !done {
                return Err(stale(&state, &scope, "release", f).await);
            }
            return Ok(Json(Done { done }));
        }
        None => {
            // An operator's release of whoever holds the run: the store
            // still releases only the top holding's own fence.
            principal.require(super::unfenced_role(super::Operation::Release))?;
            match state.store.lease(&scope, state.store.now()).await? {
                Some(l) if !l.holder.is_empty() => l.fence,
                _ => return Ok(Json(Done { done: false })),
            }
        }
    };
    let done = state.store.release(&scope, fence).await?;
    Ok(Json(Done { done }))
}

pub(super) async fn finish(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::FinishBody>,
) -> ApiResult<LifecycleBody> {
    let fence = wire::fence("fence", body.fence)?;
    let outcome = (&body.outcome).into();
    let l = checked(&state, state.store.finish(&scope, fence, &outcome).await)?;
    Ok(Json((&l).into()))
}

pub(super) async fn fail_attempt(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::FailAttemptBody>,
) -> ApiResult<LifecycleBody> {
    let fence = wire::fence("fence", body.fence)?;
    let error = (&body.error).into();
    let l = checked(
        &state,
        state
            .store
            .fail_attempt(&scope, fence, &error, body.max_attempts)
            .await,
    )?;
    let tenant = scope.tenant_id.as_str();
    state.metrics.record_run_failure("failed_attempt", tenant);
    if body.error.kind == "timeout" {
        state.metrics.record_run_failure("timed_out", tenant);
    }
    if l.is_dead_lettered() {
        state.metrics.record_run_failure("dead_lettered", tenant);
    }
    Ok(Json((&l).into()))
}

pub(super) async fn cancel(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::CancelBody>,
) -> ApiResult<LifecycleBody> {
    let l = state.store.cancel(&scope, body.reason.as_deref()).await?;
    state
        .metrics
        .record_run_failure("cancelled", scope.tenant_id.as_str());
    Ok(Json((&l).into()))
}

pub(super) async fn snooze(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::SnoozeBody>,
) -> ApiResult<Done> {
    let fence = wire::fence("fence", body.fence)?;
    let until = wire::instant("until", body.until)?;
    let done = state.store.snooze(&scope, fence, until).await?;
    if !done {
        return Err(stale(&state, &scope, "snooze", fence).await);
    }
    Ok(Json(Done { done }))
}

/// A release or snooze whose fence was not the current holding: 409
/// `fenced-out` with both fences, like every other write under a stale
/// fence (the store's contract answers `false`; `HttpStore` maps it back).
async fn stale(
    state: &AppState,
    scope: &runkeep::RunScope,
    operation: &'static str,
    presented: runkeep::Fence,
) -> Problem {
    let (current, released) = match state.store.lease(scope, state.store.now()).await {
        Ok(Some(l)) => (l.fence, l.holder.is_empty()),
        Ok(None) => (presented, false),
        Err(e) => return Problem::from(e),
    };
    state.metrics.record_fenced_out();
    let mut p = Problem::from(runkeep::Error::FencedOut {
        run: scope.run_id.to_string(),
        operation,
        presented,
        current,
    });
    if released {
        p.detail = Some(format!(
            "fenced out: {operation} on run {} presented fence {presented}, but the run's holding was released (it is at fence {current}); this worker no longer holds it",
            scope.run_id
        ));
    }
    p
}

pub(super) async fn enqueue(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::EnqueueBody>,
) -> ApiResult<wire::EnqueueAnswer> {
    let cp = body.checkpoint.to_checkpoint("checkpoint")?;
    let (options, dedupe) = body.to_options()?;
    match dedupe {
        // Without a key: the answer enqueue always gave (the checkpoint).
        None => {
            let stored = state.store.enqueue(&scope, &cp, &options).await?;
            Ok(Json(wire::EnqueueAnswer::Written((&stored).into())))
        }
        Some(d) => {
            let e = state
                .store
                .enqueue_once(&scope, &cp, &options, Some(&d))
                .await?;
            Ok(Json(wire::EnqueueAnswer::Once((&e).into())))
        }
    }
}

/// An operator's priority change (unfenced, like cancel and reopen).
pub(super) async fn set_priority(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::SetPriorityBody>,
) -> ApiResult<LifecycleBody> {
    let priority = body.to_priority()?;
    let l = state.store.set_priority(&scope, priority).await?;
    Ok(Json((&l).into()))
}

pub(super) async fn reopen(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<LifecycleBody> {
    let l = state.store.reopen(&scope).await?;
    Ok(Json((&l).into()))
}

/// The instant a read is judged at: the query's `now`, else the store's
/// clock.
pub(super) fn at(state: &AppState, q: &NowQuery) -> Result<runkeep::Timestamp, Problem> {
    match q.now {
        Some(n) => wire::instant("now", n),
        None => Ok(state.store.now()),
    }
}

pub(super) async fn lease(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<NowQuery>,
) -> ApiResult<MaybeLease> {
    let now = at(&state, &q)?;
    let l = state.store.lease(&scope, now).await?;
    Ok(Json(MaybeLease {
        lease: l.as_ref().map(Into::into),
    }))
}

pub(super) async fn lifecycle(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<LifecycleBody> {
    let l = state.store.lifecycle(&scope).await?;
    Ok(Json((&l).into()))
}
