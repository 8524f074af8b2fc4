//! `runkeep serve` in process: the same server (`runkeep_server::server`,
//! its admission, limits and manners) on 127.0.0.1 on a thread and runtime
//! of its own, as a separate process would have, with an [`HttpStore`]
//! client on the bench's runtime.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use runkeep::{RunStore, TenantId};
use runkeep_http::client::{HttpStore, HttpStoreOptions};
use runkeep_server::auth::{Role, StaticTokens};
use runkeep_server::metrics::Metrics;
use runkeep_server::server::{Server, ServerConfig};
use runkeep_server::state::AppState;

/// Builds the server's backing store on the server's own runtime (a pooled
/// PostgreSQL store must live on the runtime that drives its connections).
pub type MakeStore = Box<
    dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<Arc<dyn RunStore>, String>> + Send>> + Send,
>;

/// A server running on its own thread; stopped when dropped.
#[derive(Debug)]
pub struct InProcessServer {
    addr: SocketAddr,
    token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessServer {
    /// Starts a server over the store `make` builds, with one operator
    /// token for `tenant`.
    pub fn start(label: &str, tenant: TenantId, make: MakeStore) -> Result<Self, String> {
        let token = format!("bench-{}", runkeep::id::random_suffix(24));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let secret = token.clone();
        let thread = std::thread::Builder::new()
            .name(format!("bench-serve-{label}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("server runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let store = match make().await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let state = AppState {
                        store,
                        auth: Arc::new(StaticTokens::new().with(secret, tenant, Role::Operator)),
                        metrics: Arc::new(Metrics::new()),
                    };
                    let config = ServerConfig {
                        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                        shutdown_grace: Duration::from_secs(2),
                        ..ServerConfig::default()
                    };
                    let server = match Server::bind(config, state).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("bind the server: {e}")));
                            return;
                        }
                    };
                    match server.local_addr() {
                        Ok(a) => {
                            let _ = ready_tx.send(Ok(a));
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("server address: {e}")));
                            return;
                        }
                    }
                    let _ = server
                        .run(async {
                            let _ = stopped.await;
                        })
                        .await;
                });
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .map_err(|e| format!("start the server thread: {e}"))?;
        let addr = ready_rx
            .recv()
            .map_err(|_| "the server thread ended before it listened".to_string())??;
        Ok(Self {
            addr,
            token,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its operator token's secret.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// An [`HttpStore`] on this server for `tenant`.
    pub fn client(&self, tenant: TenantId) -> Result<HttpStore, String> {
        Ok(
            HttpStore::new(format!("http://{}", self.addr), HttpStoreOptions::default())
                .map_err(|e| format!("HttpStore: {e}"))?
                .with_token(tenant, self.token.clone()),
        )
    }
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
