//! Recurring schedules: list, put, get, delete, and the cursor's
//! compare-and-set (`runkeep::scheduling::schedule`).

use axum::extract::FromRequestParts;
use axum::extract::State;
use axum::http::request::Parts;
use axum::Json;
use runkeep::scheduling::schedule;
use runkeep::{ListingScope, ProjectId, SessionId};
use runkeep_http::wire::{
    self, AdvanceScheduleBody, Done, ListSchedulesQuery, MaybeSchedule, ScheduleBody,
    ScheduleEntryBody, ScheduleList,
};

use super::extract::{path_id, JsonBody, SessionAddr, TenantParam, Q};
use super::runs::ApiResult;
use crate::problem::Problem;
use crate::state::AppState;

/// The schedule a schedule route addresses: its session and name,
/// validated.
#[derive(Debug, Clone)]
pub(super) struct ScheduleAddr {
    session: ListingScope,
    name: String,
}

impl FromRequestParts<AppState> for ScheduleAddr {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let SessionAddr(session) = SessionAddr::from_request_parts(parts, state).await?;
        let name = path_id(parts, state, "schedule", |n| {
            schedule::check_name(&n).map(|()| n)
        })
        .await?;
        Ok(ScheduleAddr { session, name })
    }
}

pub(super) async fn list(
    State(state): State<AppState>,
    TenantParam(tenant): TenantParam,
    Q(q): Q<ListSchedulesQuery>,
) -> ApiResult<ScheduleList> {
    let f = |n: &'static str| move |e| Problem::from(e).with_field(n);
    let project = q
        .project
        .map(ProjectId::new)
        .transpose()
        .map_err(f("project"))?;
    let session = q
        .session
        .map(SessionId::new)
        .transpose()
        .map_err(f("session"))?;
    let scope = ListingScope::from_parts(tenant, project, session).map_err(Problem::from)?;
    let now = state.store.now();
    let entries = state.store.list_schedules(&scope).await?;
    Ok(Json(ScheduleList {
        schedules: entries
            .iter()
            .map(|e| ScheduleEntryBody::of(e, now))
            .collect(),
    }))
}

pub(super) async fn put(
    State(state): State<AppState>,
    addr: ScheduleAddr,
    JsonBody(mut body): JsonBody<ScheduleBody>,
) -> ApiResult<ScheduleBody> {
    if body.name.is_empty() {
        body.name = addr.name.clone();
    }
    if body.name != addr.name {
        return Err(Problem::invalid(
            "name",
            format!(
                "the body names schedule {:?}, the path {:?}",
                body.name, addr.name
            ),
        ));
    }
    let now = state.store.now();
    let s = body.to_schedule(now)?;
    let stored = state.store.put_schedule(&addr.session, &s).await?;
    Ok(Json(ScheduleBody::of(&stored, now)))
}

pub(super) async fn get(
    State(state): State<AppState>,
    addr: ScheduleAddr,
) -> ApiResult<MaybeSchedule> {
    let now = state.store.now();
    let s = state.store.get_schedule(&addr.session, &addr.name).await?;
    Ok(Json(MaybeSchedule {
        schedule: s.map(|s| ScheduleBody::of(&s, now)),
    }))
}

pub(super) async fn delete(State(state): State<AppState>, addr: ScheduleAddr) -> ApiResult<Done> {
    let done = state
        .store
        .delete_schedule(&addr.session, &addr.name)
        .await?;
    Ok(Json(Done { done }))
}

pub(super) async fn advance(
    State(state): State<AppState>,
    addr: ScheduleAddr,
    JsonBody(body): JsonBody<AdvanceScheduleBody>,
) -> ApiResult<Done> {
    let from = body.from.map(|ms| wire::instant("from", ms)).transpose()?;
    let to = wire::instant("to", body.to)?;
    let done = state
        .store
        .advance_schedule(&addr.session, &addr.name, from, to)
        .await?;
    Ok(Json(Done { done }))
}
