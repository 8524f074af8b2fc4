//! Production manners: what keeps one slow, greedy or broken client from
//! hurting the others, and a shutdown that loses no answer.
//!
//! [`apply`] wraps the router (all of it: API and operations routes) in, from
//! the outside in:
//!
//! 1. **one tracing span per request** (`request`: `method`, `route` — the
//!    matched template, never the raw path —, `status`, `latency_ms`; never
//!    a header, so never `Authorization`), closed by one `answered` event,
//!    and the `runkeep_http_requests_total` / `_seconds` metrics;
//! 2. **the request timeout** ([`crate::server::ServerConfig::request_timeout`]):
//!    the whole exchange up to the response head, body upload included. A
//!    client that has not sent its whole body by then gets **408** and the
//!    connection closed; a handler (the store) that has not answered by
//!    then gets **503** with `Retry-After`, and, for a method that writes,
//!    the detail says *outcome unknown* (the write may have landed: read
//!    back before repeating it, as the worker runtime does);
//! 3. **the body limit** ([`crate::server::ServerConfig::body_limit`]): a
//!    `Content-Length` above it is refused before a byte of the body is
//!    read, a chunked body as soon as it passes the limit; both **413** as
//!    problem details.
//!
//! The API routes and `/readyz` (everything that reaches the store) are
//! also under **admission** ([`admission`]): two budgets of slots, each
//! bounded in all, per tenant and per token, so that no tenant (and, in a
//! tenant, no token) can take what the others need.
//!
//! - **requests**: short requests inside a handler. At most
//!   [`crate::server::ServerConfig::concurrency_limit`] in all (default
//!   256), [`crate::server::ServerConfig::tenant_concurrency_limit`] per
//!   tenant (64) and [`crate::server::ServerConfig::token_concurrency_limit`]
//!   per token (32). A request holds its slot until its response head.
//! - **waits**: long-polls and event tails — `GET …/events/wait`,
//!   `GET …/runnable/wait`, `POST …/claim-next` whose body asks for a
//!   `waitMs` above 0 (`claim.waitMs` for `POST …/claim-next-batch`), and
//!   `GET …/events/stream`. At most
//!   [`crate::server::ServerConfig::wait_limit`] in all (2048),
//!   [`crate::server::ServerConfig::tenant_wait_limit`] per tenant (512)
//!   and [`crate::server::ServerConfig::token_wait_limit`] per token (256).
//!   A long-poll holds its slot until its response head; an event tail
//!   holds it for as long as it streams (until its body is dropped: the
//!   client went away, the write timeout or a shutdown ended it). Waits
//!   never take a request slot, so a tenant's waits cannot starve its own
//!   short requests or anyone else's.
//!
//! The slot is taken before the handler runs, after the bearer token is
//! known: admission authenticates the `Authorization` header itself (the
//! route's guard does it again and answers 401/403/404 as before). A
//! request without a valid token (a 401 to be, `/readyz`, an unknown
//! route) counts against one *anonymous* tenant with one anonymous token,
//! under the same shares, so unauthenticated traffic cannot fill the
//! server either. A `claim-next` is classified by its body: admission
//! reads it (when it announces a `Content-Length` of at most 64 KiB, which
//! every client sends for a JSON body) before taking a slot, and a
//! `waitMs` above 0 makes it a wait; a chunked or larger body is counted
//! as a wait, since it may be one.
//!
//! A caller over a share — its tenant's, then its token's, then the whole
//! budget's — is refused at once with **503** `overloaded` and
//! `Retry-After: 1` rather than queued (a queue in front of a store that
//! is already behind only turns overload into timeouts); the detail says
//! which share is full. 503 rather than 429: it is the status every client
//! of this API (`HttpStore`, the worker runtime, the OpenAPI document)
//! already retries `overloaded` with, and the problem's type says the
//! same in both cases. `runkeep_http_rejected_total{reason}` counts the
//! refusals by share (`overloaded`, `tenant_share`, `token_share`,
//! `waits`, `tenant_waits`, `token_waits`) and
//! `runkeep_http_slots_held{budget}` the slots held. Each share's count is
//! a few hash-map entries under a `std` mutex held only to add or
//! subtract, never across an await. `/healthz` and `/metrics` are outside
//! admission, so an overloaded server can still say so.
//!
//! With the default shares, three tenants at their limit still leave a
//! quarter of each budget to everyone else; more tenants busy at once need
//! a larger budget (or smaller shares).
//!
//! Below the router, the connection loop ([`crate::server`]) adds hyper's
//! **header-read timeout** (a client that does not finish its request
//! head within [`crate::server::ServerConfig::header_read_timeout`] — one
//! that sends a byte a second, or connects and says nothing, or idles on a
//! kept-alive connection — is disconnected) and **graceful shutdown**
//! (stop accepting, end every Server-Sent Events stream with
//! [`end_streams_on`], let in-flight requests finish for up to
//! [`crate::server::ServerConfig::shutdown_grace`]).
//!
//! Every refusal here is an RFC 9457 problem of [`crate::problem`]
//! (`payload-too-large`, `timeout`, `overloaded`, `unavailable` with
//! `outcomeUnknown`), like the API's own errors.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use prometheus::IntGauge;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::{Operation, OperationKind};
use crate::auth::{Principal, SharedAuthenticator};
use crate::metrics::Metrics;
use crate::problem::{Problem, ProblemType, PROBLEM_JSON};

/// The limits [`apply`] enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
    /// Longest a request may take up to its response head.
    pub request_timeout: Duration,
}

/// Wraps every route of `router` in the tracing span, the request timeout
/// and the body limit (see the module doc). Apply it last, when every route
/// is in place: axum applies layers to the routes that exist.
pub fn apply(router: Router, limits: Limits, metrics: Arc<Metrics>) -> Router {
    router
        .layer(DefaultBodyLimit::max(limits.body_limit))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            limits.body_limit,
        ))
        .layer(middleware::from_fn_with_state(
            (limits, metrics.clone()),
            body_limit_as_problem,
        ))
        .layer(middleware::from_fn_with_state(
            (limits, metrics.clone()),
            request_timeout,
        ))
        .layer(middleware::from_fn_with_state(metrics, track))
}

/// One admission budget's bounds: slots in all, per tenant, per token.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Shares {
    /// Slots in all.
    pub total: usize,
    /// Most slots one tenant may hold.
    pub per_tenant: usize,
    /// Most slots one token may hold.
    pub per_token: usize,
}

/// What [`admission`] enforces (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Admission {
    /// Short requests inside a handler.
    pub requests: Shares,
    /// Long-polls waiting and event tails streaming.
    pub waits: Shares,
}

/// The largest `claim-next` body admission reads to find its `waitMs`.
pub const CLAIM_NEXT_PEEK_LIMIT: usize = 64 * 1024;

/// Puts every route of `router` under [`Admission`]: each request takes a
/// slot of its budget for its tenant and token (resolved with `auth`), or
/// is refused at once with 503 `overloaded` and `Retry-After: 1` (see the
/// module doc).
pub fn admission(
    router: Router,
    admission: Admission,
    auth: SharedAuthenticator,
    metrics: Arc<Metrics>,
) -> Router {
    let gate = Arc::new(Gate {
        requests: Pool::new(Budget::Requests, admission.requests, &metrics),
        waits: Pool::new(Budget::Waits, admission.waits, &metrics),
        routes: long_routes(),
        auth,
        metrics,
    });
    router.layer(middleware::from_fn_with_state(gate, admit))
}

/// How a route uses its slot.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A short request: a request slot until the response head.
    Short,
    /// A long-poll: a wait slot until the response head.
    Wait,
    /// An event tail: a wait slot until its body ends.
    Tail,
    /// `claim-next` and `claim-next-batch`: a wait when the body's
    /// `waitMs` (`claim.waitMs`) is above 0.
    ClaimNext,
}

/// The API's routes that are not short, from their [`OperationKind`]
/// (an exhaustive match: a new kind must be placed here).
fn long_routes() -> Vec<(Method, String, Kind)> {
    Operation::ALL
        .iter()
        .filter_map(|op| {
            let kind = match op.kind() {
                OperationKind::Short => return None,
                OperationKind::LongPoll => Kind::Wait,
                OperationKind::Stream => Kind::Tail,
                OperationKind::LongPollIfWaiting => Kind::ClaimNext,
            };
            Some((op.method(), op.path().to_string(), kind))
        })
        .collect()
}

/// The two budgets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Budget {
    Requests,
    Waits,
}

impl Budget {
    fn label(self) -> &'static str {
        match self {
            Budget::Requests => "requests",
            Budget::Waits => "waits",
        }
    }

    /// What a holder of this budget is called in a refusal.
    fn noun(self) -> &'static str {
        match self {
            Budget::Requests => "requests",
            Budget::Waits => "long-polls and event tails",
        }
    }
}

/// Which share a refused request found full.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Full {
    Token,
    Tenant,
    Total,
}

/// The slots held now, in all and by tenant and token key. Only keys
/// holding a slot are present.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    tenants: HashMap<String, usize>,
    tokens: HashMap<String, usize>,
}

/// One budget.
#[derive(Debug)]
struct Pool {
    budget: Budget,
    shares: Shares,
    counts: Mutex<Counts>,
    held: IntGauge,
}

/// Who a request counts against.
#[derive(Debug)]
struct Who {
    /// The tenant's key (`""`: anonymous).
    tenant: String,
    /// The token's key (`tenant/token-id`; `""`: anonymous).
    token: String,
    principal: Option<Principal>,
}

impl Who {
    fn of(principal: Option<Principal>) -> Self {
        match principal {
            Some(p) => Who {
                tenant: p.tenant.as_str().to_string(),
                token: format!("{}/{}", p.tenant.as_str(), p.token_id),
                principal: Some(p),
            },
            None => Who {
                tenant: String::new(),
                token: String::new(),
                principal: None,
            },
        }
    }
}

fn bump(map: &mut HashMap<String, usize>, key: &str) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_string(), 1);
        }
    }
}

fn drop_one(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl Pool {
    fn new(budget: Budget, shares: Shares, metrics: &Metrics) -> Arc<Self> {
        let shares = Shares {
            total: shares.total.max(1),
            per_tenant: shares.per_tenant.max(1),
            per_token: shares.per_token.max(1),
        };
        let held = metrics.slots_held(budget.label());
        held.set(0);
        Arc::new(Pool {
            budget,
            shares,
            counts: Mutex::new(Counts::default()),
            held,
        })
    }

    /// A slot for `who`, or the share that is full (the tenant's, then the
    /// token's, then the budget's: a tenant at its share is told so even
    /// when the token asking is at its own too).
    fn take(self: &Arc<Self>, who: Who) -> Result<Slot, (Full, Who)> {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let full = if c.tenants.get(&who.tenant).copied().unwrap_or(0) >= self.shares.per_tenant {
            Some(Full::Tenant)
        } else if c.tokens.get(&who.token).copied().unwrap_or(0) >= self.shares.per_token {
            Some(Full::Token)
        } else if c.total >= self.shares.total {
            Some(Full::Total)
        } else {
            None
        };
        if let Some(full) = full {
            return Err((full, who));
        }
        c.total += 1;
        bump(&mut c.tenants, &who.tenant);
        bump(&mut c.tokens, &who.token);
        self.held.set(c.total as i64);
        Ok(Slot {
            pool: self.clone(),
            who,
        })
    }

    /// The refusal of `who` for the `full` share.
    fn refuse(&self, full: Full, who: &Who, metrics: &Metrics) -> Response {
        let waits = self.budget == Budget::Waits;
        let reason = match (full, waits) {
            (Full::Total, false) => "overloaded",
            (Full::Tenant, false) => "tenant_share",
            (Full::Token, false) => "token_share",
            (Full::Total, true) => "waits",
            (Full::Tenant, true) => "tenant_waits",
            (Full::Token, true) => "token_waits",
        };
        metrics.record_rejected(reason);
        let noun = self.budget.noun();
        let holder = match (full, &who.principal) {
            (Full::Total, _) => None,
            (Full::Tenant, Some(p)) => {
                Some((format!("tenant {}", p.tenant), self.shares.per_tenant))
            }
            (Full::Token, Some(p)) => Some((
                format!("this token ({})", p.token_id),
                self.shares.per_token,
            )),
            (Full::Tenant, None) => Some((
                "requests without a valid token".to_string(),
                self.shares.per_tenant,
            )),
            (Full::Token, None) => Some((
                "requests without a valid token".to_string(),
                self.shares.per_token,
            )),
        };
        let detail = match holder {
            None => format!(
                "{} {noun} are being served already, all this server takes; retry after the delay in Retry-After",
                self.shares.total
            ),
            Some((holder, n)) => format!(
                "{holder} has {n} {noun} being served already, its share of this server; retry after the delay in Retry-After (other tenants are not held back)"
            ),
        };
        Problem::new(ProblemType::Overloaded, detail).into_response()
    }
}

/// A slot held; given back when dropped.
#[derive(Debug)]
struct Slot {
    pool: Arc<Pool>,
    who: Who,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self
            .pool
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        drop_one(&mut c.tenants, &self.who.tenant);
        drop_one(&mut c.tokens, &self.who.token);
        self.pool.held.set(c.total as i64);
    }
}

/// Admission's state.
#[derive(Debug)]
struct Gate {
    requests: Arc<Pool>,
    waits: Arc<Pool>,
    routes: Vec<(Method, String, Kind)>,
    auth: SharedAuthenticator,
    metrics: Arc<Metrics>,
}

impl Gate {
    fn kind(&self, req: &Request) -> Kind {
        let Some(path) = req.extensions().get::<MatchedPath>() else {
            return Kind::Short;
        };
        self.routes
            .iter()
            .find(|(m, p, _)| m == req.method() && p == path.as_str())
            .map_or(Kind::Short, |(_, _, k)| *k)
    }
}

/// The fields of a `claim-next` body admission looks at: its `waitMs`, or
/// a `claim-next-batch` body's `claim.waitMs`.
#[derive(serde::Deserialize)]
struct ClaimNextPeek {
    #[serde(rename = "waitMs")]
    wait_ms: Option<u64>,
    claim: Option<Box<ClaimNextPeek>>,
}

impl ClaimNextPeek {
    fn waits(&self) -> bool {
        self.wait_ms.is_some_and(|ms| ms > 0) || self.claim.as_ref().is_some_and(|c| c.waits())
    }
}

/// Whether a `claim-next` asks to wait, and the request to pass on (its
/// body read, when it was, put back).
async fn claim_next_waits(req: Request) -> (bool, Request) {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let Some(length) = announced.filter(|n| *n <= CLAIM_NEXT_PEEK_LIMIT) else {
        // Chunked or large: it may wait.
        return (true, req);
    };
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, length.max(1)).await {
        Ok(bytes) => {
            // A body that does not parse is the handler's to refuse, at
            // once: a short request.
            let waits = serde_json::from_slice::<ClaimNextPeek>(&bytes)
                .ok()
                .is_some_and(|p| p.waits());
            (waits, Request::from_parts(parts, Body::from(bytes)))
        }
        Err(e) => {
            // Let the handler's extractor meet the error and answer it.
            let body = Body::from_stream(futures_util::stream::once(async move {
                Err::<axum::body::Bytes, _>(e)
            }));
            (false, Request::from_parts(parts, body))
        }
    }
}

/// The admission middleware.
async fn admit(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let principal = Principal::from_headers(req.headers(), gate.auth.as_ref()).ok();
    let kind = gate.kind(&req);
    let (waits, req) = match kind {
        Kind::Short => (false, req),
        Kind::Wait | Kind::Tail => (true, req),
        // Without a valid token the guard answers 401 at once.
        Kind::ClaimNext if principal.is_none() => (false, req),
        Kind::ClaimNext => claim_next_waits(req).await,
    };
    let pool = if waits { &gate.waits } else { &gate.requests };
    let slot = match pool.take(Who::of(principal)) {
        Ok(slot) => slot,
        Err((full, who)) => return pool.refuse(full, &who, &gate.metrics),
    };
    let response = next.run(req).await;
    if kind != Kind::Tail {
        drop(slot);
        return response;
    }
    // The tail holds its slot for as long as its body streams.
    response.map(|inner| Body::new(Holding { inner, _slot: slot }))
}

/// A response body that holds a slot until it is dropped.
#[derive(Debug)]
struct Holding {
    inner: Body,
    _slot: Slot,
}

impl http_body::Body for Holding {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Ends the body of every `text/event-stream` response of `router` when
/// `shutdown` is cancelled, so a graceful shutdown does not wait on a tail
/// that never ends (its client reconnects with `Last-Event-ID`).
pub fn end_streams_on(router: Router, shutdown: CancellationToken) -> Router {
    router.layer(middleware::map_response(move |response: Response| {
        let shutdown = shutdown.clone();
        async move {
            let is_stream = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if !is_stream {
                return response;
            }
            let (parts, body) = response.into_parts();
            let body = body
                .into_data_stream()
                .take_until(shutdown.cancelled_owned());
            Response::from_parts(parts, Body::from_stream(body))
        }
    }))
}

/// A method label with a bounded set of values.
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// One span per request, the closing event and the request metrics.
async fn track(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let span = tracing::info_span!(
        "request",
        method,
        route = route.as_str(),
        status = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    );
    let started = Instant::now();
    let in_flight = metrics.request_started();
    let response = next.run(req).instrument(span.clone()).await;
    drop(in_flight);
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    span.record("status", status);
    span.record("latency_ms", elapsed.as_secs_f64() * 1000.0);
    span.in_scope(|| tracing::info!("answered"));
    metrics.record_request(method, &route, status, elapsed);
    response
}

/// A 413 from the body limit (tower-http's, or an extractor's) as problem
/// details.
async fn body_limit_as_problem(
    State((limits, metrics)): State<(Limits, Arc<Metrics>)>,
    req: Request,
    next: Next,
) -> Response {
    let response = next.run(req).await;
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE {
        return response;
    }
    metrics.record_rejected("body_too_large");
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if is_problem {
        return response;
    }
    let mut r = Problem::new(
        ProblemType::PayloadTooLarge,
        format!(
            "the request body is larger than the server accepts ({} bytes)",
            limits.body_limit
        ),
    )
    .into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Whether a request has a body still to come.
fn expects_body(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    done: Arc<AtomicBool>,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.done.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The request timeout: 408 when the client has not sent its body, 503
/// (outcome unknown for a write) when the handler has not answered.
async fn request_timeout(
    State((limits, metrics)): State<(Limits, Arc<Metrics>)>,
    req: Request,
    next: Next,
) -> Response {
    let received = Arc::new(AtomicBool::new(!expects_body(&req)));
    let writes = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let req = req.map(|inner| {
        Body::new(Tracked {
            inner,
            done: received.clone(),
        })
    });
    match tokio::time::timeout(limits.request_timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            metrics.record_rejected("timeout");
            let secs = limits.request_timeout.as_secs_f64();
            if !received.load(Ordering::Acquire) {
                let mut r = Problem::new(
                    ProblemType::Timeout,
                    format!("the request body did not arrive within {secs} s"),
                )
                .into_response();
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
            let mut p = if writes {
                Problem::new(ProblemType::Unavailable, format!("outcome unknown: the store did not answer within {secs} s; the write may have been stored, so read it back before repeating it"))
            } else {
                Problem::new(
                    ProblemType::Unavailable,
                    format!("the store did not answer within {secs} s; retry"),
                )
            };
            p.outcome_unknown = writes;
            p.into_response()
        }
    }
}

/// Listens for Ctrl-C (SIGINT) and SIGTERM from the moment it is called,
/// and returns a future that resolves on the first of them.
///
/// Call it before telling anyone the server is up: until the handlers are
/// registered a SIGTERM keeps its default action and kills the process
/// with requests in flight (a lazily registered handler left that window
/// open between the "listening" line and the first poll of the serve loop).
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static>
{
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_long_route_of_the_api_is_classified() {
        let mut kinds: Vec<(String, Kind)> = long_routes()
            .into_iter()
            .map(|(m, p, k)| (format!("{m} {p}"), k))
            .collect();
        kinds.sort_by(|a, b| a.0.cmp(&b.0));
        let run = crate::api::RUN;
        let tenant = crate::api::TENANT;
        let mut expected = vec![
            (format!("GET {run}/events/wait"), Kind::Wait),
            (format!("GET {tenant}/runnable/wait"), Kind::Wait),
            (format!("GET {run}/events/stream"), Kind::Tail),
            (format!("POST {tenant}/claim-next"), Kind::ClaimNext),
            (format!("POST {tenant}/claim-next-batch"), Kind::ClaimNext),
        ];
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(kinds, expected);
    }

    #[test]
    fn a_claim_waits_by_its_wait_ms_or_a_batchs_claim_wait_ms() {
        let waits = |body: &str| serde_json::from_str::<ClaimNextPeek>(body).unwrap().waits();
        assert!(waits(r#"{"holder":"w","ttlMs":1000,"waitMs":5}"#));
        assert!(!waits(r#"{"holder":"w","ttlMs":1000,"waitMs":0}"#));
        assert!(!waits(r#"{"holder":"w","ttlMs":1000}"#));
        assert!(waits(
            r#"{"max":8,"claim":{"holder":"w","ttlMs":1000,"waitMs":5}}"#
        ));
        assert!(!waits(r#"{"max":8,"claim":{"holder":"w","ttlMs":1000}}"#));
    }

    fn who(tenant: &str, token: &str) -> Who {
        Who {
            tenant: tenant.into(),
            token: token.into(),
            principal: None,
        }
    }

    #[test]
    fn a_pool_counts_each_share_and_forgets_a_key_when_its_last_slot_goes() {
        let metrics = Metrics::new();
        let pool = Pool::new(
            Budget::Requests,
            Shares {
                total: 4,
                per_tenant: 3,
                per_token: 2,
            },
            &metrics,
        );
        let a1 = pool.take(who("a", "a/1")).unwrap();
        let a2 = pool.take(who("a", "a/1")).unwrap();
        assert_eq!(pool.take(who("a", "a/1")).unwrap_err().0, Full::Token);
        let a3 = pool.take(who("a", "a/2")).unwrap();
        assert_eq!(pool.take(who("a", "a/3")).unwrap_err().0, Full::Tenant);
        let b1 = pool.take(who("b", "b/1")).unwrap();
        assert_eq!(pool.take(who("c", "c/1")).unwrap_err().0, Full::Total);
        assert_eq!(metrics.slots_held("requests").get(), 4);
        drop((a1, a2, a3, b1));
        let c = pool.counts.lock().unwrap();
        assert_eq!(c.total, 0);
        assert!(c.tenants.is_empty() && c.tokens.is_empty(), "{c:?}");
        assert_eq!(metrics.slots_held("requests").get(), 0);
    }
}
