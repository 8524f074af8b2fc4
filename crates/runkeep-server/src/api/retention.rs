//! Retention: the operator's prune of finished runs, one bounded batch per
//! request (`runkeep serve --retain-finished` runs the same batches on a
//! timer, beside the server).

use axum::extract::State;
use axum::Json;
use runkeep_http::wire::{self, PruneReportBody};

use super::extract::{JsonBody, TenantParam};
use super::runs::{listing_scope, ApiResult};
use crate::problem::Problem;
use crate::state::AppState;

pub(super) async fn prune_finished(
    State(state): State<AppState>,
    TenantParam(tenant): TenantParam,
    JsonBody(body): JsonBody<wire::PruneFinishedBody>,
) -> ApiResult<PruneReportBody> {
    let scope = listing_scope(tenant, body.project.as_deref(), body.session.as_deref())?;
    let (policy, now) = body.policy()?;
    let limit =
        usize::try_from(body.limit).map_err(|e| Problem::invalid("limit", e.to_string()))?;
    let report = state
        .store
        .prune_finished(&scope, &policy, now, limit)
        .await?;
    Ok(Json((&report).into()))
}
