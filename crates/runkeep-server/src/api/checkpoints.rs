//! Checkpoints, parks, prune, the indexed answers and the atomic step.

use std::time::Instant;

use axum::extract::State;
use axum::{Extension, Json};

use super::claims::{checked, NowQuery};
use super::extract::{CheckpointParam, JsonBody, RunAddr, Q};
use super::ownership;
use super::runs::ApiResult;
use crate::auth::Principal;
use crate::problem::Problem;
use crate::state::AppState;
use crate::wire::{
    self, CheckpointBody, Claimed, Done, HandOverAnswer, MaybeCheckpoint, Pruned, StepReceiptBody,
};

pub(super) async fn list(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<Vec<CheckpointBody>> {
    let cps = state.store.list_checkpoints(&scope).await?;
    Ok(Json(cps.iter().map(Into::into).collect()))
}

pub(super) async fn write(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::WriteCheckpointBody>,
) -> ApiResult<CheckpointBody> {
    let fence = wire::opt_fence("fence", body.fence)?;
    let cp = body.checkpoint.into_checkpoint("checkpoint")?;
    let stored = checked(
        &state,
        state.store.write_checkpoint(&scope, &cp, fence).await,
    )?;
    Ok(Json(stored.into()))
}

pub(super) async fn read(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    CheckpointParam(id): CheckpointParam,
) -> ApiResult<MaybeCheckpoint> {
    let cp = state.store.read_checkpoint(&scope, &id).await?;
    Ok(Json(MaybeCheckpoint {
        checkpoint: cp.map(Into::into),
    }))
}

/// A fence in the query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FenceQuery {
    /// The holding the delete is made under (absent: unfenced).
    fence: Option<u64>,
    /// The parent run, for a sub-run.
    #[expect(
        dead_code,
        reason = "read only by serde: the parent is part of the run address, parsed so that deny_unknown_fields accepts it"
    )]
    parent: Option<String>,
}

pub(super) async fn delete(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    CheckpointParam(id): CheckpointParam,
    Q(q): Q<FenceQuery>,
) -> ApiResult<Done> {
    let fence = wire::opt_fence("fence", q.fence)?;
    let done = checked(
        &state,
        state.store.delete_checkpoint(&scope, &id, fence).await,
    )?;
    Ok(Json(Done { done }))
}

pub(super) async fn resolve(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    CheckpointParam(id): CheckpointParam,
    JsonBody(body): JsonBody<wire::ResolveBody>,
) -> ApiResult<CheckpointBody> {
    let fence = wire::opt_fence("fence", body.fence)?;
    if fence.is_none() {
        principal.require(super::unfenced_role("resolve_park"))?;
    }
    // The store's clock, always: a client cannot back-date an answer.
    let now = state.store.now();
    let answer = state
        .store
        .resolve_park(&scope, &id, body.resolution.to_resolution(), now, fence)
        .await;
    match answer {
        Ok(cp) => Ok(Json((&cp).into())),
        Err(e @ runkeep::Error::Conflict { .. }) => {
            // Exactly once: the refusal carries the answer that won.
            let mut p = Problem::from(e);
            if let Ok(Some(cp)) = state.store.read_checkpoint(&scope, &id).await {
                if let Some(pending) = &cp.pending {
                    p.first_answer = pending.decision.clone();
                    p.resolved_at = pending.resolved_at.map(|t| t.as_millis());
                }
            }
            Err(p)
        }
        Err(e) => Err(checked::<()>(&state, Err(e)).unwrap_err()),
    }
}

pub(super) async fn prune(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::PruneBody>,
) -> ApiResult<Pruned> {
    let fence = wire::opt_fence("fence", body.fence)?;
    if fence.is_none() {
        principal.require(super::unfenced_role("prune_checkpoints"))?;
    }
    let ids = checked(
        &state,
        state
            .store
            .prune_checkpoints(&scope, body.keep_last, fence)
            .await,
    )?;
    Ok(Json(Pruned {
        deleted: ids.iter().map(ToString::to_string).collect(),
    }))
}

pub(super) async fn latest(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<MaybeCheckpoint> {
    let cp = state.store.latest_checkpoint(&scope).await?;
    Ok(Json(MaybeCheckpoint {
        checkpoint: cp.map(Into::into),
    }))
}

pub(super) async fn pending(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<NowQuery>,
) -> ApiResult<MaybeCheckpoint> {
    let now = q.at(&state)?;
    let cp = state.store.find_pending(&scope, now).await?;
    Ok(Json(MaybeCheckpoint {
        checkpoint: cp.map(Into::into),
    }))
}

pub(super) async fn resume_point(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<NowQuery>,
) -> ApiResult<MaybeCheckpoint> {
    let now = q.at(&state)?;
    let cp = state.store.resume_point(&scope, now).await?;
    Ok(Json(MaybeCheckpoint {
        checkpoint: cp.map(Into::into),
    }))
}

pub(super) async fn commit_step(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::CommitStepBody>,
) -> ApiResult<StepReceiptBody> {
    let fence = wire::fence("fence", body.fence)?;
    let step = body.step.into_step()?;
    let started = Instant::now();
    let r = state.store.commit_step(&scope, fence, &step).await;
    state.metrics.observe_step(started.elapsed());
    let receipt = checked(&state, r)?;
    Ok(Json((&receipt).into()))
}

/// The hand-over: the step on this run, then the next run, through the
/// store's `commit_step_and_claim_next` (one transaction on PostgreSQL).
/// The step is refused exactly as `commit_step` refuses it (the fence's
/// holding must be this token's); the claim is `claim-next`'s, in the
/// path's tenant, its holder bound to this token, without a wait. A claim
/// that failed after the step committed is answered 200 with the step's
/// receipt and the claim's problem as `nextError`.
pub(super) async fn commit_step_and_claim_next(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::HandOverBody>,
) -> ApiResult<HandOverAnswer> {
    let fence = wire::fence("fence", body.fence)?;
    let step = body.step.into_step()?;
    let next = body.next;
    let listing = super::runs::listing_scope(
        scope.tenant_id.clone(),
        next.project.as_deref(),
        next.session.as_deref(),
    )
    .map_err(in_next)?;
    let filter = runkeep::ClaimNextFilter {
        park: next
            .park
            .as_ref()
            .map(|v| v.iter().map(|p| (*p).into()).collect()),
        order: next.order.into(),
    };
    let mut options = next.claim().to_options().map_err(in_next)?;
    options.holder = ownership::tag(&next.holder, &principal.token_id, "next.holder")?;
    let next = runkeep::NextClaim {
        scope: listing,
        filter,
        options,
    };
    let started = Instant::now();
    let r = state
        .store
        .commit_step_and_claim_next(&scope, fence, &step, &next)
        .await;
    state.metrics.observe_step(started.elapsed());
    let handover = checked(&state, r)?;
    let (claimed, next_error) = match handover.next {
        Ok(Some((run, lease))) => {
            state.metrics.record_claim("acquired");
            (
                Some(Claimed {
                    run: (&run).into(),
                    lease: (&lease).into(),
                }),
                None,
            )
        }
        Ok(None) => {
            state.metrics.record_claim("empty");
            (None, None)
        }
        Err(e) => {
            state.metrics.record_claim("error");
            (None, Some(Problem::from(e)))
        }
    };
    Ok(Json(HandOverAnswer {
        receipt: (&handover.receipt).into(),
        next: claimed,
        next_error,
    }))
}

/// A problem about a field of the hand-over's `next`, named by its body path.
fn in_next(p: Problem) -> Problem {
    match p.field.clone() {
        Some(f) => p.with_field(format!("next.{f}")),
        None => p,
    }
}
