//! The listing, a run's summary, `claim_next` (with its long-poll), the
//! runnable wait, a concurrency key's holdings, the store's clock and
//! `whoami`.

use std::time::Duration;

use axum::extract::State;
use axum::Extension;
use axum::Json;
use runkeep::{
    ClaimNextFilter, ListOptions, ListingScope, ParkState, ProjectId, RunStatus, SessionId,
    WatchTopic,
};

use super::events::MAX_WAIT_MS;
use super::extract::{JsonBody, RunAddr, SessionAddr, TenantParam, Q};
use crate::auth::Principal;
use crate::problem::Problem;
use crate::state::AppState;
use runkeep_http::wire::params::{KeyHoldingsQuery, ListQuery, WaitRunnableQuery};
use runkeep_http::wire::{self, ClaimNextAnswer, Claimed, RunPageBody, RunSummary, Waited};

pub(super) type ApiResult<T> = Result<Json<T>, Problem>;

/// The store's clock.
pub(super) async fn clock(State(state): State<AppState>) -> Json<wire::Clock> {
    Json(wire::Clock {
        now: state.store.now().as_millis(),
    })
}

/// Who the token is.
pub(super) async fn whoami(Extension(p): Extension<Principal>) -> Json<wire::WhoAmI> {
    Json(wire::WhoAmI {
        tenant: p.tenant.to_string(),
        role: p.role.as_str().to_string(),
        token_id: p.token_id,
    })
}

pub(super) fn listing_scope(
    tenant: runkeep::TenantId,
    project: Option<&str>,
    session: Option<&str>,
) -> Result<ListingScope, Problem> {
    let project = project
        .map(ProjectId::new)
        .transpose()
        .map_err(|e| Problem::from(e).with_field("project"))?;
    let session = session
        .map(SessionId::new)
        .transpose()
        .map_err(|e| Problem::from(e).with_field("session"))?;
    ListingScope::from_parts(tenant, project, session)
        .map_err(|e| Problem::from(e).with_field("session"))
}

fn csv<T: std::str::FromStr<Err = runkeep::Error>>(
    field: &str,
    v: Option<&str>,
) -> Result<Option<Vec<T>>, Problem> {
    v.map(|s| {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| {
                x.parse::<T>()
                    .map_err(|e| Problem::from(e).with_field(field))
            })
            .collect::<Result<Vec<T>, Problem>>()
    })
    .transpose()
}

pub(super) async fn list_runs(
    State(state): State<AppState>,
    TenantParam(tenant): TenantParam,
    Q(q): Q<ListQuery>,
) -> ApiResult<RunPageBody> {
    let scope = listing_scope(tenant, q.project.as_deref(), q.session.as_deref())?;
    let options = ListOptions {
        order: q
            .order
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e: runkeep::Error| Problem::from(e).with_field("order"))?
            .unwrap_or_default(),
        park: csv::<ParkState>("park", q.park.as_deref())?,
        claimed: q.claimed,
        limit: q.limit,
        cursor: q.cursor,
        now: q.now.map(|n| wire::instant("now", n)).transpose()?,
        status: csv::<RunStatus>("status", q.status.as_deref())?,
        min_priority: q
            .min_priority
            .map(runkeep::Priority::new)
            .transpose()
            .map_err(|e| Problem::from(e).with_field("minPriority"))?,
    };
    let page = state.store.list_runs(&scope, &options).await?;
    Ok(Json((&page).into()))
}

pub(super) async fn claim_next(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    TenantParam(tenant): TenantParam,
    JsonBody(body): JsonBody<wire::ClaimNextBody>,
) -> ApiResult<ClaimNextAnswer> {
    let claimed = claim_waiting(&state, &principal, tenant, &body, None).await?;
    Ok(Json(ClaimNextAnswer {
        claimed: claimed.into_iter().next(),
    }))
}

pub(super) async fn claim_next_batch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    TenantParam(tenant): TenantParam,
    JsonBody(body): JsonBody<wire::ClaimNextBatchBody>,
) -> ApiResult<wire::ClaimNextBatchAnswer> {
    let max = usize::try_from(body.max).unwrap_or(usize::MAX);
    runkeep::batch::check_size("claim-next-batch", max)
        .map_err(|e| Problem::from(e).with_field("max"))?;
    let claimed = claim_waiting(&state, &principal, tenant, &body.claim, Some(max))
        .await
        .map_err(|p| match p.field.clone() {
            Some(f) => p.with_field(format!("claim.{f}")),
            None => p,
        })?;
    Ok(Json(wire::ClaimNextBatchAnswer { claimed }))
}

/// `claim-next`'s claim (`max` `None`: one run) or a batch of up to `max`,
/// waiting up to the body's `waitMs` until at least one run is taken.
async fn claim_waiting(
    state: &AppState,
    principal: &Principal,
    tenant: runkeep::TenantId,
    body: &wire::ClaimNextBody,
    max: Option<usize>,
) -> Result<Vec<Claimed>, Problem> {
    let scope = listing_scope(tenant, body.project.as_deref(), body.session.as_deref())?;
    let filter = ClaimNextFilter {
        park: body
            .park
            .as_ref()
            .map(|v| v.iter().map(|p| (*p).into()).collect()),
        order: body.order.into(),
    };
    let mut options = body.claim().to_options()?;
    options.holder = super::ownership::tag(&body.holder, &principal.token_id, "holder")?;
    let wait = body.wait_ms.unwrap_or(0);
    if wait > MAX_WAIT_MS {
        return Err(Problem::invalid(
            "waitMs",
            format!("waitMs {wait} is above the limit of {MAX_WAIT_MS} ms; wait again instead"),
        ));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    let revoked = crate::auth::revoked(state.auth.clone(), principal.clone());
    tokio::pin!(revoked);
    loop {
        // Subscribe before looking, so a run made runnable in between wakes us.
        let mut watch = state.store.watch(&WatchTopic::Runnable(scope.clone()));
        let got = match max {
            None => state
                .store
                .claim_next(&scope, &filter, &options)
                .await?
                .into_iter()
                .collect(),
            Some(max) => {
                state
                    .store
                    .claim_next_batch(&scope, &filter, &options, max)
                    .await?
            }
        };
        if !got.is_empty() {
            for _ in &got {
                state.metrics.record_claim("acquired");
            }
            return Ok(got
                .iter()
                .map(|(run, lease)| Claimed {
                    run: run.into(),
                    lease: lease.into(),
                })
                .collect());
        }
        if tokio::time::Instant::now() >= deadline {
            state.metrics.record_claim("empty");
            return Ok(Vec::new());
        }
        // Only the wait is cut short by a revocation, never a claim.
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, watch.changed()) => {}
            () = &mut revoked => return Err(crate::auth::revoked_problem()),
        }
    }
}

pub(super) async fn wait_runnable(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    TenantParam(tenant): TenantParam,
    Q(q): Q<WaitRunnableQuery>,
) -> ApiResult<Waited> {
    let scope = listing_scope(tenant, q.project.as_deref(), q.session.as_deref())?;
    let timeout = super::events::bounded_wait(q.timeout_ms)?;
    let mut watch = state.store.watch(&WatchTopic::Runnable(scope));
    let changed = tokio::select! {
        woke = tokio::time::timeout(timeout, watch.changed()) => woke.is_ok(),
        () = crate::auth::revoked(state.auth.clone(), principal) => {
            return Err(crate::auth::revoked_problem())
        }
    };
    Ok(Json(Waited {
        changed,
        last_seq: None,
    }))
}

pub(super) async fn summary(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<RunSummary> {
    let now = state.store.now();
    let lease = state.store.lease(&scope, now).await?;
    let lifecycle = state.store.lifecycle(&scope).await?;
    let latest = state.store.latest_checkpoint(&scope).await?;
    if lease.is_none() && latest.is_none() && lifecycle == runkeep::Lifecycle::default() {
        return Err(Problem::no_such_run());
    }
    let pending = state.store.find_pending(&scope, now).await?;
    let events = state
        .store
        .read_events(
            &scope,
            &runkeep::ReadEventsOptions {
                since_seq: u64::MAX,
                ..Default::default()
            },
        )
        .await?;
    Ok(Json(RunSummary {
        run: (&scope).into(),
        lease: lease.as_ref().map(Into::into),
        lifecycle: (&lifecycle).into(),
        latest_checkpoint: latest.as_ref().map(Into::into),
        pending: pending.as_ref().map(Into::into),
        last_seq: events.last_seq,
        now: now.as_millis(),
    }))
}

/// A concurrency key's holdings history in the session.
pub(super) async fn key_holdings(
    State(state): State<AppState>,
    SessionAddr(session): SessionAddr,
    Q(q): Q<KeyHoldingsQuery>,
) -> ApiResult<wire::KeyHoldingsBody> {
    wire::concurrency_key("key", &q.key)?;
    let holdings = state.store.key_holdings(&session, &q.key).await?;
    Ok(Json(wire::KeyHoldingsBody {
        key: q.key,
        holdings: holdings.iter().map(Into::into).collect(),
    }))
}
