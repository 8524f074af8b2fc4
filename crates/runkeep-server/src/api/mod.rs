//! The versioned JSON API (`/v1`): one route per contract operation.
//!
//! Every route is declared once in `table()` with the role it needs; the
//! router and the auth matrix test are both built from it, so a route
//! cannot be added without its role check. A tenant route's guard
//! ([`guard`]) runs before anything is parsed or touched:
//!
//! 1. no token or an unknown one → 401 `unauthorized`;
//! 2. an id in the path (or `?parent=`) that breaks the id rule
//!    (`..`, `%2e%2e`, `/`, NUL, overlong) → 400 `invalid-input` naming it;
//! 3. a tenant other than the token's → 404 `not-found`, the very body a
//!    missing run gets ([`Problem::no_such_run`]);
//! 4. a role below the route's → 403 `forbidden`.
//!
//! Writes carry their fence to the store, which checks it; the server never
//! compares fences itself. Three operations need `operator` when they carry
//! no fence (an operator's override: release of whoever holds a run, a park
//! answer, a prune) and `worker` with one (the holder's own act); the
//! table says so ([`RouteSpec::unfenced_role`]).
//!
//! Every response carries the store's clock in [`NOW_HEADER`] so a client
//! (`HttpStore::now`) judges time as the store does.

// A `Problem` is returned straight into a response, once per refused
// request: its size costs nothing measurable, boxing it would cost clarity.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::Router;

use crate::auth::{Principal, Role};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

pub mod budget;
mod checkpoints;
mod claims;
mod documents;
mod events;
pub mod extract;
pub mod ownership;
mod runs;
mod threads;

pub use events::{MAX_WAIT_MS, SSE_BATCH};

/// The query structs, for the OpenAPI document.
pub(crate) mod docs {
    pub(crate) use super::checkpoints::FenceQuery;
    pub(crate) use super::claims::NowQuery;
    pub(crate) use super::documents::AuditQuery;
    pub(crate) use super::events::{ReadQuery, StreamQuery, WaitEventsQuery};
    pub(crate) use super::runs::{ListQuery, WaitRunnableQuery};
    pub(crate) use super::threads::{
        DeleteThreadQuery, GetThreadQuery, ListThreadQuery, ListThreadsQuery,
    };
}

/// The response header carrying the store's clock (epoch ms).
pub const NOW_HEADER: &str = "runkeep-now";

/// The largest request body [`router`] accepts by default (the contract's
/// 64 MiB checkpoint, its envelope and some slack). The server's own body
/// limit layer may be lower; both answer 413 `payload-too-large`.
pub const DEFAULT_BODY_LIMIT: usize = 65 * 1024 * 1024;

/// The path prefix of every tenant route.
pub const TENANT: &str = "/v1/tenants/{tenant}";
/// The path prefix of every per-run route.
pub const RUN: &str = "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/runs/{run}";

/// One route of the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Method.
    pub method: Method,
    /// Path template (`{name}` parameters).
    pub path: String,
    /// The least role that may call it.
    pub role: Role,
    /// When set: the role needed when the body carries no `fence`.
    pub unfenced_role: Option<Role>,
    /// The OpenAPI operation id and the contract operation it serves.
    pub operation: &'static str,
}

impl RouteSpec {
    fn new(method: Method, path: String, role: Role, operation: &'static str) -> Self {
        Self {
            method,
            path,
            role,
            unfenced_role: None,
            operation,
        }
    }

    /// True when the path names a tenant (so a foreign tenant answers 404).
    pub fn is_tenant_scoped(&self) -> bool {
        self.path.starts_with("/v1/tenants/")
    }
}

type Handler = MethodRouter<AppState>;

/// Every route with its handler. The single source of the router and of
/// [`route_table`].
fn table() -> Vec<(RouteSpec, Handler)> {
    use Role::*;
    let t = |p: &str| format!("{TENANT}{p}");
    let r = |p: &str| format!("{RUN}{p}");
    let g = Method::GET;
    let p = Method::POST;
    let put = Method::PUT;
    let d = Method::DELETE;
    let mut v: Vec<(RouteSpec, Handler)> = vec![
        (
            RouteSpec::new(g.clone(), "/v1/clock".into(), Reader, "clock"),
            routing::get(runs::clock),
        ),
        (
            RouteSpec::new(g.clone(), "/v1/whoami".into(), Reader, "whoami"),
            routing::get(runs::whoami),
        ),
        (
            RouteSpec::new(g.clone(), t("/runs"), Reader, "list_runs"),
            routing::get(runs::list_runs),
        ),
        (
            RouteSpec::new(p.clone(), t("/claim-next"), Worker, "claim_next"),
            routing::post(runs::claim_next),
        ),
        (
            RouteSpec::new(g.clone(), t("/runnable/wait"), Reader, "wait_runnable"),
            routing::get(runs::wait_runnable),
        ),
        (
            RouteSpec::new(g.clone(), r(""), Reader, "run_summary"),
            routing::get(runs::summary),
        ),
        (
            RouteSpec::new(p.clone(), r("/claim"), Worker, "claim"),
            routing::post(claims::claim),
        ),
        (
            RouteSpec::new(p.clone(), r("/release"), Worker, "release"),
            routing::post(claims::release),
        ),
        (
            RouteSpec::new(p.clone(), r("/finish"), Worker, "finish"),
            routing::post(claims::finish),
        ),
        (
            RouteSpec::new(p.clone(), r("/snooze"), Worker, "snooze"),
            routing::post(claims::snooze),
        ),
        (
            RouteSpec::new(p.clone(), r("/enqueue"), Worker, "enqueue"),
            routing::post(claims::enqueue),
        ),
        (
            RouteSpec::new(p.clone(), r("/reopen"), Operator, "reopen"),
            routing::post(claims::reopen),
        ),
        (
            RouteSpec::new(g.clone(), r("/lease"), Reader, "lease"),
            routing::get(claims::lease),
        ),
        (
            RouteSpec::new(g.clone(), r("/lifecycle"), Reader, "lifecycle"),
            routing::get(claims::lifecycle),
        ),
        (
            RouteSpec::new(p.clone(), r("/steps"), Worker, "commit_step"),
            routing::post(checkpoints::commit_step),
        ),
        (
            RouteSpec::new(g.clone(), r("/checkpoints"), Reader, "list_checkpoints"),
            routing::get(checkpoints::list),
        ),
        (
            RouteSpec::new(p.clone(), r("/checkpoints"), Worker, "write_checkpoint"),
            routing::post(checkpoints::write),
        ),
        (
            RouteSpec::new(
                g.clone(),
                r("/checkpoints/latest"),
                Reader,
                "latest_checkpoint",
            ),
            routing::get(checkpoints::latest),
        ),
        (
            RouteSpec::new(g.clone(), r("/checkpoints/pending"), Reader, "find_pending"),
            routing::get(checkpoints::pending),
        ),
        (
            RouteSpec::new(
                g.clone(),
                r("/checkpoints/resume-point"),
                Reader,
                "resume_point",
            ),
            routing::get(checkpoints::resume_point),
        ),
        (
            RouteSpec::new(
                g.clone(),
                r("/checkpoints/by-id/{checkpoint}"),
                Reader,
                "read_checkpoint",
            ),
            routing::get(checkpoints::read),
        ),
        (
            RouteSpec::new(
                d.clone(),
                r("/checkpoints/by-id/{checkpoint}"),
                Worker,
                "delete_checkpoint",
            ),
            routing::delete(checkpoints::delete),
        ),
        (
            RouteSpec::new(p.clone(), r("/prune"), Worker, "prune_checkpoints"),
            routing::post(checkpoints::prune),
        ),
        (
            RouteSpec::new(g.clone(), r("/events"), Reader, "read_events"),
            routing::get(events::read),
        ),
        (
            RouteSpec::new(p.clone(), r("/events"), Worker, "append_events"),
            routing::post(events::append),
        ),
        (
            RouteSpec::new(g.clone(), r("/events/stream"), Reader, "tail_events"),
            routing::get(events::stream),
        ),
        (
            RouteSpec::new(g.clone(), r("/events/wait"), Reader, "wait_events"),
            routing::get(events::wait),
        ),
        (
            RouteSpec::new(g.clone(), r("/record"), Reader, "read_run_record"),
            routing::get(documents::read_record),
        ),
        (
            RouteSpec::new(put.clone(), r("/record"), Worker, "write_run_record"),
            routing::put(documents::write_record),
        ),
        (
            RouteSpec::new(g.clone(), r("/messages"), Reader, "read_messages"),
            routing::get(documents::read_messages),
        ),
        (
            RouteSpec::new(put.clone(), r("/messages"), Worker, "write_messages"),
            routing::put(documents::write_messages),
        ),
        (
            RouteSpec::new(g.clone(), r("/report"), Reader, "read_report"),
            routing::get(documents::read_report),
        ),
        (
            RouteSpec::new(put.clone(), r("/report"), Worker, "write_report"),
            routing::put(documents::write_report),
        ),
        (
            RouteSpec::new(g.clone(), r("/audit"), Reader, "read_audit"),
            routing::get(documents::read_audit),
        ),
        (
            RouteSpec::new(p.clone(), r("/audit"), Worker, "append_audit"),
            routing::post(documents::append_audit),
        ),
    ];
    v.extend(thread_routes());
    // The park answer: worker with its fence, operator without.
    let mut answer = RouteSpec::new(
        p.clone(),
        r("/checkpoints/by-id/{checkpoint}/answer"),
        Worker,
        "resolve_park",
    );
    answer.unfenced_role = Some(Operator);
    v.push((answer, routing::post(checkpoints::resolve)));
    for (spec, _) in v.iter_mut() {
        if matches!(spec.operation, "release" | "prune_checkpoints") {
            spec.unfenced_role = Some(Operator);
        }
    }
    v
}

/// The thread routes (`threads`): a LangGraph-style checkpoint chain in
/// one run, for checkpoint savers.
fn thread_routes() -> Vec<(RouteSpec, Handler)> {
    use Role::*;
    let t = |p: &str| format!("{TENANT}{p}");
    let r = |p: &str| format!("{RUN}{p}");
    vec![
        (
            RouteSpec::new(
                Method::PUT,
                r("/thread/checkpoints"),
                Worker,
                "put_thread_checkpoint",
            ),
            routing::put(threads::put_checkpoint),
        ),
        (
            RouteSpec::new(
                Method::GET,
                r("/thread/checkpoints"),
                Reader,
                "list_thread_checkpoints",
            ),
            routing::get(threads::list_checkpoints),
        ),
        (
            RouteSpec::new(
                Method::GET,
                r("/thread/checkpoint"),
                Reader,
                "get_thread_checkpoint",
            ),
            routing::get(threads::get_checkpoint),
        ),
        (
            RouteSpec::new(
                Method::POST,
                r("/thread/writes"),
                Worker,
                "put_thread_writes",
            ),
            routing::post(threads::put_writes),
        ),
        (
            RouteSpec::new(Method::DELETE, r("/thread"), Worker, "delete_thread"),
            routing::delete(threads::delete_thread),
        ),
        (
            RouteSpec::new(
                Method::GET,
                t("/thread-checkpoints"),
                Reader,
                "list_threads_checkpoints",
            ),
            routing::get(threads::list_threads),
        ),
    ]
}

/// Every route of the API with the role it needs (what the auth matrix
/// test and the OpenAPI test walk).
pub fn route_table() -> Vec<RouteSpec> {
    table().into_iter().map(|(s, _)| s).collect()
}

/// The unfenced role of `operation` (what its handler enforces when the
/// body carries no fence).
pub(crate) fn unfenced_role(operation: &str) -> Role {
    table()
        .into_iter()
        .find(|(s, _)| s.operation == operation)
        .and_then(|(s, _)| s.unfenced_role)
        .unwrap_or(Role::Operator)
}

/// The API router with the default body limit ([`DEFAULT_BODY_LIMIT`]).
pub fn router(state: AppState) -> Router {
    router_with_limit(state, DEFAULT_BODY_LIMIT)
}

/// The API router accepting bodies up to `body_limit` bytes.
pub fn router_with_limit(state: AppState, body_limit: usize) -> Router {
    let mut by_path: BTreeMap<String, Handler> = BTreeMap::new();
    for (spec, handler) in table() {
        let role = spec.role;
        let layered =
            handler.route_layer(middleware::from_fn_with_state((state.clone(), role), guard));
        let entry = by_path.remove(&spec.path);
        by_path.insert(
            spec.path.clone(),
            match entry {
                Some(existing) => existing.merge(layered),
                None => layered,
            },
        );
    }
    let mut router = Router::new();
    for (path, handler) in by_path {
        router = router.route(&path, handler);
    }
    let budget = budget::BodyBudget::new(body_limit);
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            budget,
            budget::charge_bodies,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), stamp_now))
        .with_state(state)
}

async fn not_found(req: Request) -> Problem {
    Problem::new(ProblemType::NotFound, "no such route").with_instance(req.uri().path())
}

async fn method_not_allowed(req: Request) -> Problem {
    Problem::new(
        ProblemType::MethodNotAllowed,
        format!("{} is not allowed on this route", req.method()),
    )
    .with_instance(req.uri().path())
}

/// Adds [`NOW_HEADER`] (the store's clock) to every response.
async fn stamp_now(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let now = state.store.now().as_millis();
    res.headers_mut().insert(NOW_HEADER, HeaderValue::from(now));
    res
}

/// The per-route guard: 401, then 400 for bad ids, then 404 for another
/// tenant, then 403 (module docs). Puts the [`Principal`] on the request.
pub async fn guard(
    State((state, role)): State<(AppState, Role)>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_string();
    let principal = match Principal::from_headers(req.headers(), state.auth.as_ref()) {
        Ok(p) => p,
        Err(p) => return p.with_instance(path).into_response(),
    };
    let (mut parts, body) = req.into_parts();
    let params: Vec<(String, String)> = {
        use axum::extract::FromRequestParts;
        match axum::extract::RawPathParams::from_request_parts(&mut parts, &()).await {
            Ok(raw) => raw
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Err(_) => {
                return Problem::invalid(
                    "path",
                    "a path parameter is not valid percent-encoded UTF-8",
                )
                .with_instance(path)
                .into_response()
            }
        }
    };
    let mut tenant = None;
    for (name, value) in params {
        if let Err(p) = extract::check_param(&name, &value) {
            return p.with_instance(path).into_response();
        }
        if name == "tenant" {
            tenant = Some(value);
        }
    }
    if let Err(p) = extract::parent_of(parts.uri.query()) {
        return p.with_instance(path).into_response();
    }
    if let Some(t) = tenant {
        if principal.tenant.as_str() != t {
            // Exactly the body a missing run gets (no instance: it would
            // tell the two apart).
            return Problem::no_such_run().into_response();
        }
    }
    if let Err(p) = principal.require(role) {
        return p.with_instance(path).into_response();
    }
    parts.extensions.insert(principal);
    req = Request::from_parts(parts, body);
    next.run(req).await
}
