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
//! also under **the concurrency limit** ([`concurrency_limit`]): at most
//! [`crate::server::ServerConfig::concurrency_limit`] requests are inside a
//! handler at once; one more is refused at once with **503** and
//! `Retry-After: 1` rather than queued (a queue in front of a store that
//! is already behind only turns overload into timeouts). A request holds
//! its slot until its response head is sent: a Server-Sent Events tail
//! does not hold one while it streams, a long-polling `claim_next` does
//! while it waits. `/healthz` and `/metrics` are outside the limit, so an
//! overloaded server can still say so.
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{BoxError, Router};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::ServiceBuilder;
use tracing::Instrument;

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

/// Puts every route of `router` under one shared limit of `max` requests in
/// a handler at once; one more answers 503 with `Retry-After: 1`.
pub fn concurrency_limit(router: Router, max: usize, metrics: Arc<Metrics>) -> Router {
    let max = max.max(1);
    router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(move |err: BoxError| {
                let metrics = metrics.clone();
                async move {
                    if err.is::<tower::load_shed::error::Overloaded>() {
                        metrics.record_rejected("overloaded");
                        Problem::new(
                            ProblemType::Overloaded,
                            format!(
                                "{max} requests are being served already; retry after the delay in Retry-After"
                            ),
                        )
                        .into_response()
                    } else {
                        tracing::error!(error = %err, "a middleware failed");
                        Problem::new(
                            ProblemType::Backend,
                            "the server failed to handle the request; its log has the details",
                        )
                        .into_response()
                    }
                }
            }))
            .layer(LoadShedLayer::new())
            .layer(GlobalConcurrencyLimitLayer::new(max)),
    )
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

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
