//! The server: the API with its operations routes and manners, on a
//! listener, with a graceful shutdown.
//!
//! - [`ServerConfig`]: listen address, limits, timeouts, the token file.
//! - [`app`]: the whole router — the API ([`crate::api`]), `/healthz`,
//!   `/readyz`, `/metrics` and `/openapi.json` (these four need no token),
//!   under the [`crate::manners`].
//! - [`Server::bind`] then [`Server::run`] (or [`serve`] in one call): the
//!   HTTP/1.1 connection loop with hyper's header-read timeout, a write
//!   timeout per connection (a client that stops reading is dropped) and
//!   graceful shutdown. Pipelined requests are answered in order. Before
//!   any route: a method no route takes (`TRACE`, `CONNECT`, …) is 405, a
//!   request target over [`MAX_URI_BYTES`] 414, a request head over
//!   [`MAX_HEAD_BYTES`] (or 100 header fields) 431, a head that is not
//!   valid HTTP/1.1 (conflicting `Content-Length`s among others) 400, all
//!   as problem details; the last two are refused by hyper itself and
//!   rewritten on the way out (see `server/edges.rs`).
//!
//! # Operations routes
//!
//! - `GET /healthz`: 200 `{"status":"ok"}` while the process serves.
//! - `GET /readyz`: the doctor's quick check through the store: its clock
//!   (`now()`) and a listing of one run of
//!   [`ServerConfig::readiness_scope`], bounded by
//!   [`ServerConfig::readiness_timeout`]. 200 `{"status":"ready",…}` or 503
//!   `{"status":"unavailable",…}` with `Retry-After`; the answer names the
//!   check and the error's kind (`unavailable`, `corrupted`, `timeout`, …),
//!   never a path or a query (those go to the log).
//! - `GET /metrics`: the Prometheus text exposition ([`crate::metrics`]).
//! - `GET /openapi.json`: the API's OpenAPI 3.1 document
//!   ([`crate::openapi::json`], the committed
//!   `crates/runkeep-http/openapi.json`).
//!
//! # Shutdown
//!
//! When the `shutdown` future resolves ([`crate::manners::shutdown_signal`]
//! for SIGTERM / Ctrl-C) the listener is closed at once (new connections
//! are refused), every Server-Sent Events stream is ended (its client
//! resumes elsewhere with `Last-Event-ID`), idle kept-alive connections are
//! closed, and requests in flight run to their end, for at most
//! [`ServerConfig::shutdown_grace`]; then [`Server::run`] returns.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::TokioTimer;
use hyper_util::server::graceful::GracefulShutdown;
use runkeep::{ListOptions, ListingScope, RunStore, TenantId};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::SharedAuthenticator;
use crate::manners::{self, Admission, Limits, Shares};
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::tokens::{TokenFile, TokenStore, DEFAULT_RELOAD_EVERY};

mod edges;
pub use edges::{MAX_HEAD_BYTES, MAX_URI_BYTES};

/// How much longer than the longest long-poll the request timeout must be.
pub const LONG_POLL_MARGIN: Duration = Duration::from_secs(5);

/// Default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";

/// How the server listens, what it accepts and how long it waits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on (port 0: any free port; see
    /// [`Server::local_addr`]).
    pub listen: SocketAddr,
    /// Largest request body, in bytes (413 above it). Default
    /// [`crate::api::DEFAULT_BODY_LIMIT`] (65 MiB: the contract's largest
    /// checkpoint and its envelope); lower it when no run writes large
    /// checkpoints.
    pub body_limit: usize,
    /// The slowest average rate a request body may arrive at once
    /// [`ServerConfig::body_rate_grace`] has passed, bytes a second (408
    /// below it; 0: no minimum). Default
    /// [`crate::api::budget::DEFAULT_MIN_RATE`] (64 KiB/s).
    pub body_min_rate: u64,
    /// How long a body may take before its rate is judged, and the longest
    /// pause between two of its chunks. Default 10 s.
    pub body_rate_grace: Duration,
    /// The memory large answers in flight may take together, bytes (a
    /// checkpoint, a checkpoint listing, a page of events; see
    /// [`crate::api::answers`]). Each tenant's share is half; an answer that
    /// finds no room within 5 s is 503 `overloaded`. Default
    /// [`crate::api::answers::DEFAULT_ANSWER_BUDGET`] (512 MiB).
    pub answer_budget: usize,
    /// Longest a request may take up to its response head, body upload
    /// included (408 for a body not received, 503 for a store that did not
    /// answer). Default 60 s. [`Server::bind`] refuses one that does not
    /// exceed the API's longest long-poll ([`crate::api::MAX_WAIT_MS`]) by
    /// [`LONG_POLL_MARGIN`], so a waiting `claim_next` is never cut off.
    pub request_timeout: Duration,
    /// Longest a client may take to send a request head, and to stay idle
    /// on a kept-alive connection; then it is disconnected. Default 10 s.
    pub header_read_timeout: Duration,
    /// Longest a write to a client may wait for the client to read (its
    /// receive window full); then the connection is dropped, so a client
    /// that stops reading its answer (or its event stream) cannot hold it
    /// forever. Default 30 s.
    pub write_timeout: Duration,
    /// Most short requests inside a handler at once, all tenants together
    /// (503 `overloaded` + `Retry-After` above it; see
    /// [`crate::manners`]). Default 256.
    pub concurrency_limit: usize,
    /// Most short requests of one tenant inside a handler at once. Default
    /// 64 (a quarter of the default [`ServerConfig::concurrency_limit`]).
    pub tenant_concurrency_limit: usize,
    /// Most short requests of one token inside a handler at once. Default
    /// 32.
    pub token_concurrency_limit: usize,
    /// Most long-polls waiting (`events/wait`, `runnable/wait`, a
    /// `claim-next` with `waitMs`) and event tails streaming at once, all
    /// tenants together; they never take one of the
    /// [`ServerConfig::concurrency_limit`] slots. Default 2048.
    pub wait_limit: usize,
    /// Most long-polls and event tails of one tenant at once. Default 512.
    pub tenant_wait_limit: usize,
    /// Most long-polls and event tails of one token at once. Default 256.
    pub token_wait_limit: usize,
    /// Longest a shutdown waits for requests in flight. Default 30 s.
    pub shutdown_grace: Duration,
    /// The token file (`runkeep token …` manages it).
    pub tokens: PathBuf,
    /// Longest a `runkeep token revoke` takes to reach a running server
    /// (how often it stats the token file). Default 1 s; zero: every
    /// request.
    pub token_reload_every: Duration,
    /// What `/readyz` lists (one run of it).
    pub readiness_scope: ListingScope,
    /// Longest `/readyz` waits for the store. Default 2 s.
    pub readiness_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            body_limit: crate::api::DEFAULT_BODY_LIMIT,
            body_min_rate: crate::api::budget::DEFAULT_MIN_RATE,
            body_rate_grace: crate::api::budget::DEFAULT_RATE_GRACE,
            answer_budget: crate::api::answers::DEFAULT_ANSWER_BUDGET,
            request_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
            concurrency_limit: 256,
            tenant_concurrency_limit: 64,
            token_concurrency_limit: 32,
            wait_limit: 2048,
            tenant_wait_limit: 512,
            token_wait_limit: 256,
            shutdown_grace: Duration::from_secs(30),
            tokens: PathBuf::from("runkeep-tokens.json"),
            token_reload_every: DEFAULT_RELOAD_EVERY,
            readiness_scope: ListingScope::tenant(default_tenant()),
            readiness_timeout: Duration::from_secs(2),
        }
    }
}

fn default_tenant() -> TenantId {
    match TenantId::new("default") {
        Ok(t) => t,
        Err(e) => unreachable!("\"default\" is a valid tenant id: {e}"),
    }
}

impl ServerConfig {
    /// Refuses a configuration the API cannot be served with: a request
    /// timeout that would cut off a long-poll, a zero admission limit
    /// (concurrency or wait, in all, per tenant or per token) or body
    /// limit. A share above its total is allowed: the total bounds it.
    pub fn check(&self) -> Result<(), ServeError> {
        let longest = Duration::from_millis(crate::api::MAX_WAIT_MS) + LONG_POLL_MARGIN;
        if self.request_timeout < longest {
            return Err(ServeError::Config(format!(
                "the request timeout ({} ms) must be at least {} ms: the API's long-polls (claim_next and runnable/wait) wait up to {} ms and would be cut off",
                self.request_timeout.as_millis(),
                longest.as_millis(),
                crate::api::MAX_WAIT_MS
            )));
        }
        for (value, what, refused) in [
            (self.concurrency_limit, "concurrency limit", "every request"),
            (
                self.tenant_concurrency_limit,
                "per-tenant concurrency limit",
                "every request",
            ),
            (
                self.token_concurrency_limit,
                "per-token concurrency limit",
                "every request",
            ),
            (
                self.wait_limit,
                "wait limit",
                "every long-poll and event tail",
            ),
            (
                self.tenant_wait_limit,
                "per-tenant wait limit",
                "every long-poll and event tail",
            ),
            (
                self.token_wait_limit,
                "per-token wait limit",
                "every long-poll and event tail",
            ),
        ] {
            if value == 0 {
                return Err(ServeError::Config(format!(
                    "a {what} of 0 would refuse {refused}; give at least 1"
                )));
            }
        }
        if self.body_limit == 0 {
            return Err(ServeError::Config(
                "a body limit of 0 bytes would refuse every write; give at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The shares [`manners::admission`] enforces.
    pub fn admission(&self) -> Admission {
        Admission {
            requests: Shares {
                total: self.concurrency_limit,
                per_tenant: self.tenant_concurrency_limit,
                per_token: self.token_concurrency_limit,
            },
            waits: Shares {
                total: self.wait_limit,
                per_tenant: self.tenant_wait_limit,
                per_token: self.token_wait_limit,
            },
        }
    }

    /// The limits [`manners::apply`] enforces.
    pub fn limits(&self) -> Limits {
        Limits {
            body_limit: self.body_limit,
            request_timeout: self.request_timeout,
        }
    }
}

/// The whole router: the API, the operations routes, the manners. Server-
/// Sent Events streams are not ended by a shutdown (see
/// [`app_with_shutdown`]).
pub fn app(state: AppState, config: &ServerConfig) -> Router {
    app_with_shutdown(state, config, CancellationToken::new())
}

/// [`app`], with every Server-Sent Events stream ended when `shutdown` is
/// cancelled.
pub fn app_with_shutdown(
    state: AppState,
    config: &ServerConfig,
    shutdown: CancellationToken,
) -> Router {
    let metrics = state.metrics.clone();
    let auth = state.auth.clone();
    let readiness = Readiness {
        store: state.store.clone(),
        scope: config.readiness_scope.clone(),
        timeout: config.readiness_timeout,
    };
    let budget = crate::api::budget::BodyBudget::new(config.body_limit)
        .with_min_rate(config.body_min_rate, config.body_rate_grace);
    let answers = crate::api::answers::AnswerBudget::new(config.answer_budget);
    let store_bound = crate::api::router_with_budgets(state, budget, answers).merge(
        Router::new()
            .route("/readyz", get(readyz))
            .with_state(readiness),
    );
    let store_bound = manners::admission(store_bound, config.admission(), auth, metrics.clone());
    let open = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi_json))
        .with_state(metrics.clone())
        .merge(crate::console::router());
    let router = manners::end_streams_on(store_bound.merge(open), shutdown);
    manners::apply(router, config.limits(), metrics)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// The OpenAPI document, built once.
async fn openapi_json() -> Response {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = DOCUMENT.get_or_init(crate::openapi::json).clone();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        text,
    )
        .into_response()
}

async fn metrics_text(State(metrics): State<Arc<Metrics>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        metrics.render(),
    )
        .into_response()
}

#[derive(Clone, Debug)]
struct Readiness {
    store: Arc<dyn RunStore>,
    scope: ListingScope,
    timeout: Duration,
}

/// The kind of a store error, for answers that must not leak its text.
fn error_kind(e: &runkeep::Error) -> &'static str {
    use runkeep::Error as E;
    match e {
        E::InvalidInput { .. } => "invalid-input",
        E::NotFound { .. } => "not-found",
        E::FencedOut { .. } => "fenced-out",
        E::Contended { .. } => "contended",
        E::Conflict { .. } => "conflict",
        E::Unsupported { .. } => "unsupported",
        E::Corrupted { .. } => "corrupted",
        E::Unavailable { .. } => "unavailable",
        _ => "error",
    }
}

async fn readyz(State(r): State<Readiness>) -> Response {
    let started = Instant::now();
    let store = r.store.clone();
    let probe = async move {
        let options = ListOptions {
            limit: Some(1),
            now: Some(store.now()),
            ..ListOptions::default()
        };
        store.list_runs(&r.scope, &options).await
    };
    let outcome = match tokio::time::timeout(r.timeout, probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the store's listing failed");
            Err(error_kind(&e))
        }
        Err(_) => {
            tracing::warn!(
                timeout_ms = r.timeout.as_millis() as u64,
                "readiness: the store did not answer in time"
            );
            Err("timeout")
        }
    };
    let ms = started.elapsed().as_millis() as u64;
    match outcome {
        Ok(()) => Json(json!({
            "status": "ready",
            "checks": [{ "id": "store.reachable", "status": "pass", "ms": ms }],
        }))
        .into_response(),
        Err(kind) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
            Json(json!({
                "status": "unavailable",
                "checks": [{ "id": "store.reachable", "status": "fail", "error": kind, "ms": ms }],
            })),
        )
            .into_response(),
    }
}

/// A server bound to its address, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    router: Router,
    config: ServerConfig,
    streams: CancellationToken,
}

impl Server {
    /// Checks `config` ([`ServerConfig::check`]), binds `config.listen`
    /// and builds [`app_with_shutdown`] around `state`.
    pub async fn bind(config: ServerConfig, state: AppState) -> Result<Self, ServeError> {
        config.check()?;
        let streams = CancellationToken::new();
        let router = app_with_shutdown(state, &config, streams.clone());
        let address = config.listen;
        Self::bind_router(config, router, streams)
            .await
            .map_err(|source| ServeError::Io { address, source })
    }

    /// Binds `config.listen` to serve `router` as it is (tests serve routes
    /// of their own under [`manners::apply`]); `streams` is cancelled when
    /// the shutdown starts (pass the token given to
    /// [`manners::end_streams_on`]).
    pub async fn bind_router(
        config: ServerConfig,
        router: Router,
        streams: CancellationToken,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(config.listen).await?;
        Ok(Self {
            listener,
            router,
            config,
            streams,
        })
    }

    /// The address it listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then shuts down gracefully (see
    /// the module doc) and says whether every connection finished in the
    /// grace. Errors accepting a connection (a full file table) are logged
    /// and retried, never fatal.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<Stopped> {
        let Self {
            listener,
            router,
            config,
            streams,
        } = self;
        let graceful = GracefulShutdown::new();
        let router = edges::guard(router);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(config.header_read_timeout);
        edges::configure(&mut http);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
                    io.set_write_timeout(Some(config.write_timeout));
                    let (io, service) = edges::connection(&router, Box::pin(io));
                    let connection = http.serve_connection(io, service);
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                    });
                }
            }
        }
        drop(listener);
        streams.cancel();
        let open = graceful.count();
        tracing::info!(
            connections = open,
            "shutting down: waiting for requests in flight"
        );
        tokio::select! {
            () = graceful.shutdown() => {
                tracing::info!("every connection closed");
                Ok(Stopped::Drained)
            }
            () = tokio::time::sleep(config.shutdown_grace) => {
                tracing::warn!(grace_ms = config.shutdown_grace.as_millis() as u64, "shutdown grace elapsed; closing the connections left");
                Ok(Stopped::GraceElapsed { connections: open })
            }
        }
    }
}

/// How [`Server::run`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stopped {
    /// Every connection finished its requests and closed.
    Drained,
    /// The grace elapsed first; the connections left were dropped
    /// (`connections` were open when the shutdown started).
    GraceElapsed {
        /// Connections open when the shutdown started.
        connections: usize,
    },
}

/// The state of a server over `store` with the tokens of
/// `config.tokens`.
pub fn state(config: &ServerConfig, store: Arc<dyn RunStore>) -> Result<AppState, ServeError> {
    let tokens = TokenStore::open(
        TokenFile::new(config.tokens.clone()),
        config.token_reload_every,
    )?;
    let auth: SharedAuthenticator = Arc::new(tokens);
    Ok(AppState {
        store,
        auth,
        metrics: Arc::new(Metrics::new()),
    })
}

/// Why [`serve`] could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The token file cannot be read.
    #[error(transparent)]
    Tokens(#[from] crate::tokens::TokenError),
    /// The configuration cannot be served ([`ServerConfig::check`]).
    #[error("{0}")]
    Config(String),
    /// Binding or serving failed.
    #[error("listen on {address}: {source}")]
    Io {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Binds `config.listen`, serves `store` with the tokens of
/// `config.tokens` until `shutdown` resolves, then shuts down gracefully.
pub async fn serve(
    config: ServerConfig,
    store: Arc<dyn RunStore>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let address = config.listen;
    let state = state(&config, store)?;
    let server = Server::bind(config, state).await?;
    server
        .run(shutdown)
        .await
        .map_err(|source| ServeError::Io { address, source })
        .map(|_| ())
}
