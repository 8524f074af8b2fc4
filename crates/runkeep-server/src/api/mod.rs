//! The versioned JSON API (`/v1`): one route per contract operation.
//!
//! Every operation is declared once, with its method, path, role and kind,
//! in [`Operation`] (`runkeep-http`); the router, admission, the auth
//! matrix test and the OpenAPI document are all built from it, so a route
//! cannot be added without its role check. This module maps each
//! operation to its handler with an exhaustive `match` (`handler`): a new
//! operation without a handler does not compile. A tenant route's guard
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
//! compares fences itself. A worker's request acts for its token
//! (`runkeep::acting`): the store also refuses, under the same lock as the
//! fence, its act on a holding another token claimed ([`ownership`]). Three operations need `operator` when they carry
//! no fence (an operator's override: release of whoever holds a run, a park
//! answer, a prune) and `worker` with one (the holder's own act); the
//! table says so ([`Operation::unfenced_role`]).
//!
//! Every response carries the store's clock in [`NOW_HEADER`] so a client
//! (`HttpStore::now`) judges time as the store does.

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::Router;

use crate::auth::{Principal, Role};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

pub mod answers;
pub mod budget;
mod checkpoints;
mod claims;
mod documents;
mod events;
pub mod extract;
pub mod ownership;
mod retention;
mod runs;
mod schedules;
mod threads;

pub use events::{MAX_WAIT_MS, SSE_BATCH};

pub use runkeep_http::routes::{Operation, OperationKind, RouteSpec, NOW_HEADER, RUN, TENANT};

/// The largest request body [`router`] accepts by default (the contract's
/// 64 MiB checkpoint, its envelope and some slack). The server's own body
/// limit layer may be lower; both answer 413 `payload-too-large`.
pub const DEFAULT_BODY_LIMIT: usize = 65 * 1024 * 1024;

type Handler = MethodRouter<AppState>;

/// The handler of each operation ([`Operation`]), on the table's method.
/// Exhaustive, with no catch-all: an operation added to the table without
/// a handler here does not compile (error E0004, "non-exhaustive patterns:
/// `Operation::…` not covered").
fn handler(op: Operation) -> Handler {
    use Operation::*;
    match op {
        Clock => on(op, runs::clock),
        Whoami => on(op, runs::whoami),
        ListRuns => on(op, runs::list_runs),
        ClaimNext => on(op, runs::claim_next),
        ClaimNextBatch => on(op, runs::claim_next_batch),
        WaitRunnable => on(op, runs::wait_runnable),
        RunSummary => on(op, runs::summary),
        Claim => on(op, claims::claim),
        Release => on(op, claims::release),
        Finish => on(op, claims::finish),
        Snooze => on(op, claims::snooze),
        Enqueue => on(op, claims::enqueue),
        FailAttempt => on(op, claims::fail_attempt),
        Cancel => on(op, claims::cancel),
        Reopen => on(op, claims::reopen),
        SetPriority => on(op, claims::set_priority),
        KeyHoldings => on(op, runs::key_holdings),
        PruneFinished => on(op, retention::prune_finished),
        Lease => on(op, claims::lease),
        Lifecycle => on(op, claims::lifecycle),
        CommitStep => on(op, checkpoints::commit_step),
        CommitStepAndClaimNext => on(op, checkpoints::commit_step_and_claim_next),
        CommitSteps => on(op, checkpoints::commit_steps),
        ListCheckpoints => on(op, checkpoints::list),
        WriteCheckpoint => on(op, checkpoints::write),
        LatestCheckpoint => on(op, checkpoints::latest),
        FindPending => on(op, checkpoints::pending),
        ResumePoint => on(op, checkpoints::resume_point),
        ReadCheckpoint => on(op, checkpoints::read),
        DeleteCheckpoint => on(op, checkpoints::delete),
        PruneCheckpoints => on(op, checkpoints::prune),
        ReadEvents => on(op, events::read),
        AppendEvents => on(op, events::append),
        TailEvents => on(op, events::stream),
        WaitEvents => on(op, events::wait),
        ReadRunRecord => on(op, documents::read_record),
        WriteRunRecord => on(op, documents::write_record),
        ReadMessages => on(op, documents::read_messages),
        WriteMessages => on(op, documents::write_messages),
        ReadReport => on(op, documents::read_report),
        WriteReport => on(op, documents::write_report),
        ReadAudit => on(op, documents::read_audit),
        AppendAudit => on(op, documents::append_audit),
        PutThreadCheckpoint => on(op, threads::put_checkpoint),
        ListThreadCheckpoints => on(op, threads::list_checkpoints),
        GetThreadCheckpoint => on(op, threads::get_checkpoint),
        PutThreadWrites => on(op, threads::put_writes),
        DeleteThread => on(op, threads::delete_thread),
        DeleteThreadCheckpoints => on(op, threads::delete_checkpoints),
        ListThreadsCheckpoints => on(op, threads::list_threads),
        ResolvePark => on(op, checkpoints::resolve),
        ListSchedules => on(op, schedules::list),
        PutSchedule => on(op, schedules::put),
        GetSchedule => on(op, schedules::get),
        DeleteSchedule => on(op, schedules::delete),
        AdvanceSchedule => on(op, schedules::advance),
    }
}

/// `handler` served for `op`'s method (the table's).
fn on<H, T>(op: Operation, handler: H) -> Handler
where
    H: axum::handler::Handler<T, AppState>,
    T: 'static,
{
    let method = op.method();
    let filter = routing::MethodFilter::try_from(method.clone()).unwrap_or_else(|_| {
        unreachable!("the table's methods are GET, POST, PUT and DELETE, not {method}")
    });
    routing::on(filter, handler)
}

/// Every route with its handler, in the route table's order.
fn table() -> Vec<(RouteSpec, Handler)> {
    Operation::ALL
        .iter()
        .map(|op| (op.spec(), handler(*op)))
        .collect()
}

/// Every route of the API with the role it needs (what the auth matrix
/// test and the OpenAPI test walk).
pub fn route_table() -> Vec<RouteSpec> {
    runkeep_http::routes::routes()
}

/// The unfenced role of `op` (what its handler enforces when the body
/// carries no fence): the table's, or `operator`.
pub(crate) fn unfenced_role(op: Operation) -> Role {
    op.unfenced_role().unwrap_or(Role::Operator)
}

/// The API router with the default body limit ([`DEFAULT_BODY_LIMIT`]).
pub fn router(state: AppState) -> Router {
    router_with_limit(state, DEFAULT_BODY_LIMIT)
}

/// The API router accepting bodies up to `body_limit` bytes, with the
/// default answer budget ([`answers::DEFAULT_ANSWER_BUDGET`]).
pub fn router_with_limit(state: AppState, body_limit: usize) -> Router {
    router_with_budgets(
        state,
        budget::BodyBudget::new(body_limit),
        answers::AnswerBudget::new(answers::DEFAULT_ANSWER_BUDGET),
    )
}

/// The API router charging request bodies to `budget` (its limit is the
/// largest body accepted, [`budget`]) and large answers to `answers`
/// ([`answers`]).
pub fn router_with_budgets(
    state: AppState,
    budget: budget::BodyBudget,
    answers: answers::AnswerBudget,
) -> Router {
    let body_limit = budget.limit_bytes();
    let mut by_path: BTreeMap<String, Handler> = BTreeMap::new();
    for (spec, handler) in table() {
        let role = spec.role;
        // The charge sits inside the guard: it counts against the
        // principal the guard found.
        let layered = handler
            .route_layer(middleware::from_fn_with_state(
                budget.clone(),
                budget::charge_bodies,
            ))
            .route_layer(middleware::from_fn_with_state((state.clone(), role), guard));
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
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(budget::refuse_bodies))
        .layer(axum::Extension(answers))
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
    // A worker's (or reader's) writes are made for its token: the store
    // refuses its act on a holding another token claimed, judged with the
    // fence under the store's lock (`runkeep::acting`, `ownership`).
    // An operator acts for no one: it may override.
    let actor = if principal.role < Role::Operator {
        match runkeep::acting::Actor::new(&principal.token_id) {
            Ok(a) => Some(a),
            Err(e) => return Problem::from(e).with_instance(path).into_response(),
        }
    } else {
        None
    };
    parts.extensions.insert(principal);
    req = Request::from_parts(parts, body);
    match actor {
        Some(a) => runkeep::acting::scope(a, next.run(req)).await,
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_table_has_a_handler() {
        // `handler` is an exhaustive match: this only checks the table and
        // `Operation::ALL` agree.
        assert_eq!(table().len(), route_table().len());
        assert_eq!(Operation::ALL.len(), route_table().len());
    }
}
