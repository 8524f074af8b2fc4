//! Checkpoints, parks, prune, the indexed answers and the atomic step.

use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::answers::{AnswerBudget, ChargedBytes};
use super::claims::{at, checked};
use super::extract::{CheckpointParam, JsonBody, RunAddr, TenantParam, Q};
use super::ownership;
use super::runs::ApiResult;
use crate::auth::Principal;
use crate::problem::Problem;
use crate::state::AppState;
use runkeep_http::wire::params::{FenceQuery, ListCheckpointsQuery, NowQuery};
use runkeep_http::wire::{
    self, CheckpointBody, Claimed, Done, HandOverAnswer, MaybeCheckpoint, Pruned, StepReceiptBody,
};

pub use runkeep_http::wire::{DEFAULT_CHECKPOINTS_PAGE, MAX_CHECKPOINTS_PAGE};

/// A checkpoint without its state (the listing's `summary` form).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary<'a> {
    id: &'a str,
    created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_created_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: Option<&'a wire::PendingBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
}

fn json_answer(bytes: ChargedBytes) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        axum::body::Body::from(bytes.into_bytes()),
    )
        .into_response()
}

fn unwritable() -> Problem {
    Problem::new(
        crate::problem::ProblemType::Backend,
        "the answer could not be written",
    )
}

pub(super) async fn list(
    State(state): State<AppState>,
    Extension(answers): Extension<AnswerBudget>,
    RunAddr(scope): RunAddr,
    Q(q): Q<ListCheckpointsQuery>,
) -> Result<Response, Problem> {
    let full = match q.fields.as_deref() {
        None | Some("summary") => false,
        Some("full") => true,
        Some(other) => {
            return Err(Problem::invalid(
                "fields",
                format!("fields {other:?} is not one of summary, full"),
            ))
        }
    };
    let limit = q.limit.unwrap_or(DEFAULT_CHECKPOINTS_PAGE);
    if limit > MAX_CHECKPOINTS_PAGE {
        return Err(Problem::invalid(
            "limit",
            format!(
                "limit {limit} is above the maximum of {MAX_CHECKPOINTS_PAGE} checkpoints a page; page with after (the last id of the previous page)"
            ),
        ));
    }
    // The store reads every checkpoint with its state, whatever the form:
    // charged by what the run's last listing read.
    let key = format!("list {scope}");
    let estimate = answers.before_read(&key);
    let mut held = answers.charge(scope.tenant_id.as_str(), estimate).await?;
    let turn = answers.heavy(scope.tenant_id.as_str(), estimate).await;
    let cps = state.store.list_checkpoints(&scope).await?;
    let start = match &q.after {
        None => 0,
        Some(after) => {
            cps.iter()
                .position(|c| c.id.as_str() == after)
                .ok_or_else(|| {
                    Problem::invalid(
                        "after",
                        format!("the run has no checkpoint {after:?} (deleted since the previous page?); list again from the start"),
                    )
                })?
                + 1
        }
    };
    let (bytes, read_cost) = tokio::task::spawn_blocking(move || {
        let read_cost: usize = cps
            .iter()
            .flat_map(|c| c.state.iter())
            .map(|(k, v)| k.len() + 4 + runkeep::checkpoint::json_len(v))
            .sum();
        let page = cps.into_iter().skip(start).take(limit);
        let out = if full {
            let bodies: Vec<CheckpointBody> = page.map(Into::into).collect();
            serde_json::to_vec(&bodies)
        } else {
            let bodies: Vec<CheckpointBody> = page
                .map(|mut c| {
                    c.state = Default::default();
                    c.into()
                })
                .collect();
            let summaries: Vec<Summary<'_>> = bodies
                .iter()
                .map(|b| Summary {
                    id: &b.id,
                    created_at: b.created_at,
                    run_created_at: b.run_created_at,
                    pending: b.pending.as_ref(),
                    fence: b.fence,
                })
                .collect();
            serde_json::to_vec(&summaries)
        };
        out.map(|b| (b, read_cost))
    })
    .await
    .map_err(|_| unwritable())?
    .map_err(|_| unwritable())?;
    drop(turn);
    answers.learn(&key, read_cost.max(bytes.len()));
    held.set_bytes(bytes.len()).await?;
    Ok(json_answer(ChargedBytes::new(bytes, Some(held))))
}

/// A checkpoint answer: charged before the store is read (by the run's last
/// checkpoint answer), serialized once on the blocking pool, the parsed
/// state dropped, and the charge set to the bytes until they are sent.
async fn checkpoint_answer(
    answers: &AnswerBudget,
    scope: &runkeep::RunScope,
    read: impl std::future::Future<Output = runkeep::Result<Option<runkeep::Checkpoint>>>,
) -> Result<Response, Problem> {
    let key = format!("checkpoint {scope}");
    let estimate = answers.before_read(&key);
    let mut held = answers.charge(scope.tenant_id.as_str(), estimate).await?;
    let turn = answers.heavy(scope.tenant_id.as_str(), estimate).await;
    let cp = read.await?;
    let bytes = tokio::task::spawn_blocking(move || {
        serde_json::to_vec(&MaybeCheckpoint {
            checkpoint: cp.map(Into::into),
        })
    })
    .await
    .map_err(|_| unwritable())?
    .map_err(|_| unwritable())?;
    drop(turn);
    answers.learn(&key, bytes.len());
    held.set_bytes(bytes.len()).await?;
    Ok(json_answer(ChargedBytes::new(bytes, Some(held))))
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
    Extension(answers): Extension<AnswerBudget>,
    RunAddr(scope): RunAddr,
    CheckpointParam(id): CheckpointParam,
) -> Result<Response, Problem> {
    checkpoint_answer(&answers, &scope, state.store.read_checkpoint(&scope, &id)).await
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
        principal.require(super::unfenced_role(super::Operation::ResolvePark))?;
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
        principal.require(super::unfenced_role(super::Operation::PruneCheckpoints))?;
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
    Extension(answers): Extension<AnswerBudget>,
    RunAddr(scope): RunAddr,
) -> Result<Response, Problem> {
    checkpoint_answer(&answers, &scope, state.store.latest_checkpoint(&scope)).await
}

pub(super) async fn pending(
    State(state): State<AppState>,
    Extension(answers): Extension<AnswerBudget>,
    RunAddr(scope): RunAddr,
    Q(q): Q<NowQuery>,
) -> Result<Response, Problem> {
    let now = at(&state, &q)?;
    checkpoint_answer(&answers, &scope, state.store.find_pending(&scope, now)).await
}

pub(super) async fn resume_point(
    State(state): State<AppState>,
    Extension(answers): Extension<AnswerBudget>,
    RunAddr(scope): RunAddr,
    Q(q): Q<NowQuery>,
) -> Result<Response, Problem> {
    let now = at(&state, &q)?;
    checkpoint_answer(&answers, &scope, state.store.resume_point(&scope, now)).await
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

/// The group commit: each step judged by the store under its own fence
/// (and for this token, as every worker write), one outcome per step.
pub(super) async fn commit_steps(
    State(state): State<AppState>,
    TenantParam(tenant): TenantParam,
    JsonBody(body): JsonBody<wire::CommitStepsBody>,
) -> ApiResult<wire::CommitStepsAnswer> {
    let commits = body.into_commits(&tenant)?;
    let started = Instant::now();
    let outcomes = state.store.commit_steps(&commits).await?;
    state.metrics.observe_step(started.elapsed());
    let outcomes = outcomes
        .into_iter()
        .map(|r| match checked(&state, r) {
            Ok(receipt) => wire::StepOutcomeBody {
                receipt: Some((&receipt).into()),
                problem: None,
            },
            Err(problem) => wire::StepOutcomeBody {
                receipt: None,
                problem: Some(problem),
            },
        })
        .collect();
    Ok(Json(wire::CommitStepsAnswer { outcomes }))
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
