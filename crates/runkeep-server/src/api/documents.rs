//! Run documents (record, messages, report) and the audit trail.

use axum::extract::State;
use axum::Json;

use super::claims::checked;
use super::extract::{JsonBody, RunAddr, Q};
use super::runs::ApiResult;
use crate::state::AppState;
use runkeep_http::wire::params::AuditQuery;
use runkeep_http::wire::{self, AuditList, Done, MaybeRecord, MaybeReport, MessagesBody};

pub(super) async fn read_record(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<MaybeRecord> {
    let record = state.store.read_run_record(&scope).await?;
    Ok(Json(MaybeRecord { record }))
}

pub(super) async fn write_record(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::RecordBody>,
) -> ApiResult<Done> {
    let fence = wire::opt_fence("fence", body.fence)?;
    checked(
        &state,
        state
            .store
            .write_run_record(&scope, &body.record, fence)
            .await,
    )?;
    Ok(Json(Done { done: true }))
}

pub(super) async fn read_messages(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<MessagesBody> {
    let m = state.store.read_messages(&scope).await?;
    Ok(Json((&m).into()))
}

pub(super) async fn write_messages(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::WriteMessagesBody>,
) -> ApiResult<Done> {
    let fence = wire::opt_fence("fence", body.fence)?;
    checked(
        &state,
        state
            .store
            .write_messages(&scope, &body.messages, body.through_event_seq, fence)
            .await,
    )?;
    Ok(Json(Done { done: true }))
}

pub(super) async fn read_report(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
) -> ApiResult<MaybeReport> {
    let report = state.store.read_report(&scope).await?;
    Ok(Json(MaybeReport { report }))
}

pub(super) async fn write_report(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::ReportBody>,
) -> ApiResult<Done> {
    let fence = wire::opt_fence("fence", body.fence)?;
    checked(
        &state,
        state.store.write_report(&scope, &body.report, fence).await,
    )?;
    Ok(Json(Done { done: true }))
}

pub(super) async fn append_audit(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::AppendAuditBody>,
) -> ApiResult<AuditList> {
    let fence = wire::opt_fence("fence", body.fence)?;
    let events: Vec<runkeep::NewAuditEvent> = body.events.iter().map(Into::into).collect();
    let out = checked(
        &state,
        state.store.append_audit(&scope, &events, fence).await,
    )?;
    Ok(Json(AuditList {
        records: out.iter().map(Into::into).collect(),
    }))
}

pub(super) async fn read_audit(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<AuditQuery>,
) -> ApiResult<AuditList> {
    let out = state
        .store
        .read_audit(&scope, super::extract::seq_param("sinceSeq", q.since_seq)?)
        .await?;
    Ok(Json(AuditList {
        records: out.iter().map(Into::into).collect(),
    }))
}
