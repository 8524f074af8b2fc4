//! A live `runkeep` API server on 127.0.0.1 for the tests: the API router
//! over a given store, on its own thread and runtime, so dropping (or
//! [`TestServer::kill`]ing) it drops every connection and stream at once,
//! like a killed process.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of these shared helpers"
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runkeep::{ManualClock, RunStore, TenantId};
use runkeep_conformance::support;
use runkeep_server::auth::{Role, StaticTokens};
use runkeep_server::client::{HttpStore, HttpStoreOptions};
use runkeep_server::metrics::Metrics;
use runkeep_server::state::AppState;

/// The operator token of the conformance tenant.
pub const TOKEN_A: &str = "test-operator-a";
/// The operator token of the conformance kit's other tenant.
pub const TOKEN_B: &str = "test-operator-b";
/// Tokens of the conformance tenant by role.
pub const READER_A: &str = "test-reader-a";
/// A worker token of the conformance tenant.
pub const WORKER_A: &str = "test-worker-a";
/// A second worker token of the conformance tenant (another worker fleet).
pub const WORKER_A2: &str = "test-worker-a2";

/// The test tokens: operator, worker and reader of the conformance tenant,
/// operator of the other tenant.
pub fn tokens() -> StaticTokens {
    StaticTokens::new()
        .with(TOKEN_A, support::tenant(), Role::Operator)
        .with(WORKER_A, support::tenant(), Role::Worker)
        .with(WORKER_A2, support::tenant(), Role::Worker)
        .with(READER_A, support::tenant(), Role::Reader)
        .with(TOKEN_B, support::other_tenant(), Role::Operator)
}

/// A server running on its own thread.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The server's metrics (what `/metrics` renders).
    #[allow(
        dead_code,
        reason = "read by the tests that check a counter, not by every test binary"
    )]
    pub metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Serves `store` on a free port.
    pub fn start(store: Arc<dyn RunStore>) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), store)
    }

    /// Serves `store` on `addr` (retrying the bind for a few seconds, for a
    /// restart on the port just freed).
    pub fn start_on(addr: SocketAddr, store: Arc<dyn RunStore>) -> Self {
        Self::start_wrapped(addr, store, |r| r)
    }

    /// Serves `store` on `addr` with `wrap` applied to the API router (a
    /// test layer: fault injection).
    pub fn start_wrapped(
        addr: SocketAddr,
        store: Arc<dyn RunStore>,
        wrap: impl FnOnce(axum::Router) -> axum::Router + Send + 'static,
    ) -> Self {
        let listener = {
            let mut tries = 0;
            loop {
                match std::net::TcpListener::bind(addr) {
                    Ok(l) => break l,
                    Err(e) if tries < 100 => {
                        tries += 1;
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => panic!("bind {addr}: {e}"),
                }
            }
        };
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let metrics = Arc::new(Metrics::default());
        let served = metrics.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let state = AppState {
                    store,
                    auth: Arc::new(tokens()),
                    metrics: served,
                };
                let app = wrap(runkeep_server::api::router(state));
                tokio::select! {
                    r = axum::serve(listener, app) => { r.unwrap(); }
                    _ = stopped => {}
                }
            });
            // Shutting the runtime down here drops every connection task,
            // and so closes its socket, before `kill` returns: a kill.
            rt.shutdown_timeout(Duration::from_secs(5));
        });
        Self {
            addr,
            metrics,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An `HttpStore` holding both tenants' operator tokens; `clock` is the
    /// backing store's clock (the conformance kit moves it).
    pub fn client(&self, clock: Option<ManualClock>) -> HttpStore {
        let options = HttpStoreOptions {
            steer_clock: clock.clone(),
            clock: clock.map(|c| Arc::new(c) as Arc<dyn runkeep::Clock>),
            request_timeout: Duration::from_secs(20),
            watch_fallback: Duration::from_millis(500),
            ..Default::default()
        };
        HttpStore::new(self.url(), options)
            .unwrap()
            .with_token(support::tenant(), TOKEN_A)
            .with_token(support::other_tenant(), TOKEN_B)
    }

    /// Stops the server at once: the listener, every connection and every
    /// stream are dropped without a goodbye.
    pub fn kill(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The conformance tenant.
pub fn tenant() -> TenantId {
    support::tenant()
}
