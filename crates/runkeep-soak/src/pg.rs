//! The soak on PostgreSQL: a fresh schema per soak, and the backend's own
//! chaos besides kill -9 and SIGSTOP of the workers:
//!
//! - **Terminated backends**: `pg_terminate_backend` of a random server
//!   connection of the workers (found in `pg_stat_activity` by the
//!   `application_name` every worker connects with), at random moments:
//!   mid-statement, mid-transaction or idle in the pool.
//! - **Partitions**: every worker process reaches the server through a
//!   TCP proxy of its own that the soak runs; a partition makes one
//!   worker's proxy stop forwarding (bytes are neither passed on nor
//!   refused, and connections stay open, as when a network drops packets)
//!   for longer than the lease TTL, then resume. The partitioned worker's
//!   leases lapse and are taken over; what it sends after the heal is
//!   judged by the fence like any zombie's.
//! - **Cut connections**: one worker's proxy closes every connection it
//!   holds, both sides at once, as a network that resets: a transaction in
//!   flight is cut in the middle (the server rolls it back when it reads
//!   the client's end; a `COMMIT` in flight leaves the outcome unknown,
//!   which the worker resolves by fencing off and reading back), and the
//!   worker's pool opens new connections.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use runkeep_postgres::PgStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::BackendChaos;

/// A fresh schema name for one soak: `runkeep_soak_<10 random [a-z0-9]>`.
pub fn fresh_schema() -> String {
    format!("runkeep_soak_{}", runkeep::id::random_suffix(10))
}

/// The `application_name` the soak's workers connect with.
pub fn worker_application_name(schema: &str) -> String {
    format!("{schema}_worker")
}

/// Drops the soak's schema (and everything in it).
pub async fn drop_schema(store: &PgStore, schema: &str) -> Result<(), String> {
    let c = store
        .pool()
        .get()
        .await
        .map_err(|e| format!("drop schema {schema}: no connection: {e}"))?;
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .map_err(|e| format!("drop schema {schema}: {e}"))?;
    Ok(())
}

/// Splits a URL around its one TCP `host:port` (port optional): (before,
/// `host:port`, after). `None` for what the proxy cannot stand in for (no host, several
/// hosts, an IPv6 literal).
fn split_host(url: &str) -> Option<(&str, &str, &str)> {
    let scheme_end = url.find("://")? + 3;
    let rest = &url[scheme_end..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let auth = &rest[..end];
    let host_start = auth.rfind('@').map_or(0, |i| i + 1);
    let host = &auth[host_start..];
    if host.is_empty() || host.contains(',') || host.starts_with('[') {
        return None;
    }
    Some((
        &url[..scheme_end + host_start],
        host,
        &url[scheme_end + end..],
    ))
}

/// The server a URL names, as `host:port` (port 5432 when not given).
pub fn upstream(url: &str) -> Option<String> {
    let (_, host, _) = split_host(url)?;
    Some(if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5432")
    })
}

/// `url` with its host and port replaced by `to`.
pub fn through(url: &str, to: &str) -> Option<String> {
    let (before, _, after) = split_host(url)?;
    Some(format!("{before}{to}{after}"))
}

/// One worker's proxy: forwards every connection to the server, except
/// while partitioned.
#[derive(Debug)]
pub struct Proxy {
    /// `127.0.0.1:PORT`.
    pub listen: String,
    partitioned: watch::Sender<bool>,
    /// Bumped to close every connection open through it.
    cut: watch::Sender<u64>,
    open: Arc<AtomicU64>,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free local port.
    pub fn start(upstream: String) -> std::io::Result<Arc<Self>> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let listen = listener.local_addr()?.to_string();
        let listener = TcpListener::from_std(listener)?;
        let (tx, rx) = watch::channel(false);
        let (cut, cut_rx) = watch::channel(0u64);
        let proxy = Arc::new(Self {
            listen,
            partitioned: tx,
            cut,
            open: Arc::new(AtomicU64::new(0)),
        });
        let open = proxy.open.clone();
        let weak = Arc::downgrade(&proxy);
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if weak.upgrade().is_none() {
                    return;
                }
                let (upstream, rx, open) = (upstream.clone(), rx.clone(), open.clone());
                let mut cut_rx = cut_rx.clone();
                cut_rx.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    open.fetch_add(1, Ordering::SeqCst);
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Either pump ending, or a cut, drops both sockets.
                    tokio::select! {
                        _ = pump(cr, sw, rx.clone()) => {}
                        _ = pump(sr, cw, rx) => {}
                        _ = cut_rx.changed() => {}
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(proxy)
    }

    /// Connections open through it.
    pub fn connections(&self) -> u64 {
        self.open.load(Ordering::SeqCst)
    }

    fn set_partitioned(&self, on: bool) {
        let _ = self.partitioned.send(on);
    }

    /// Closes every connection open through it.
    fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

/// Copies `from` to `to`, holding every byte read while partitioned until
/// the partition heals (so a partition neither delivers nor refuses).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut partitioned: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // While partitioned, do not even read: the sender's kernel buffers
        // fill and its writes block, as over a dead link.
        if partitioned.wait_for(|p| !*p).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if partitioned.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// PostgreSQL chaos for the soak engine.
#[derive(Debug)]
pub struct PgChaos {
    /// The soak's own store (its connections are never struck).
    store: Arc<PgStore>,
    /// The workers' `application_name`.
    app: String,
    /// The workers' proxies (one per worker process started).
    proxies: Arc<Mutex<Vec<Arc<Proxy>>>>,
    /// How long a partition lasts: the lease TTL times 1.3 to 2.
    ttl: Duration,
}

impl PgChaos {
    /// Chaos over the workers connecting as `app`, partitioning through
    /// `proxies`.
    pub fn new(
        store: Arc<PgStore>,
        app: String,
        proxies: Arc<Mutex<Vec<Arc<Proxy>>>>,
        ttl: Duration,
    ) -> Self {
        Self {
            store,
            app,
            proxies,
            ttl,
        }
    }

    async fn terminate(&self) -> Result<Option<String>, String> {
        let c = self
            .store
            .pool()
            .get()
            .await
            .map_err(|e| format!("pg_terminate_backend: no connection: {e}"))?;
        let rows = c
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1",
                &[&self.app],
            )
            .await
            .map_err(|e| format!("pg_terminate_backend: {e}"))?;
        Ok(rows
            .first()
            .filter(|r| r.get::<_, bool>(0))
            .map(|_| "backends terminated (pg_terminate_backend)".to_string()))
    }

    /// Cuts every connection of a random worker that has some open.
    fn cut(&self) -> Option<String> {
        let proxy = {
            let all = self.proxies.lock().unwrap_or_else(|p| p.into_inner());
            let live: Vec<&Arc<Proxy>> = all
                .iter()
                .filter(|p| p.connections() > 0)
                .filter(|p| !*p.partitioned.borrow())
                .collect();
            if live.is_empty() {
                return None;
            }
            live[rand::thread_rng().gen_range(0..live.len())].clone()
        };
        proxy.cut_all();
        Some("connections cut (a worker's proxy closed them, both sides)".to_string())
    }

    fn partition(&self) -> Option<String> {
        let proxy = {
            let all = self.proxies.lock().unwrap_or_else(|p| p.into_inner());
            let live: Vec<&Arc<Proxy>> = all
                .iter()
                .filter(|p| p.connections() > 0)
                .filter(|p| !*p.partitioned.borrow())
                .collect();
            if live.is_empty() {
                return None;
            }
            live[rand::thread_rng().gen_range(0..live.len())].clone()
        };
        let d = crate::stall_past_ttl(self.ttl);
        proxy.set_partitioned(true);
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            proxy.set_partitioned(false);
        });
        Some("partitions (a worker's proxy stopped forwarding past the lease TTL)".to_string())
    }
}

impl BackendChaos for PgChaos {
    fn strike(&self) -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + '_>> {
        Box::pin(async move {
            let roll: f64 = rand::thread_rng().gen();
            let label = if roll < 0.3 {
                self.partition()
            } else if roll < 0.6 {
                self.cut()
            } else {
                None
            };
            match label {
                Some(label) => Ok(Some(label)),
                None => self.terminate().await,
            }
        })
    }

    fn heal(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            for p in self
                .proxies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                p.set_partitioned(false);
            }
        })
    }
}

/// How the soak's worker processes reach a PostgreSQL store: under the
/// soak's application name, each through a proxy of its own (for
/// partitions) when one can be started.
#[derive(Debug)]
pub struct PgWorkers {
    /// The URL every worker connects with (secret: it may carry a
    /// password), its `application_name` set.
    url: String,
    /// The workers' `application_name`.
    app: String,
    /// The server the proxies forward to (`None`: the URL names none the
    /// proxy can stand in for; workers connect directly).
    upstream: Option<String>,
    /// The workers' proxies (one per worker process started).
    proxies: Arc<Mutex<Vec<Arc<Proxy>>>>,
}

impl PgWorkers {
    /// Workers connecting with `url`, whose `application_name` is `app`.
    pub fn new(url: String, app: String) -> Self {
        let upstream = upstream(&url);
        Self {
            url,
            app,
            upstream,
            proxies: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The workers' `application_name`.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The URL one more worker process connects with: through a new proxy
    /// of its own. When no proxy can be started the URL connects directly
    /// and the error says why (that worker cannot be partitioned).
    pub fn worker_url(&self) -> (String, Option<std::io::Error>) {
        let Some(up) = &self.upstream else {
            return (self.url.clone(), None);
        };
        match Proxy::start(up.clone()) {
            Ok(p) => {
                self.proxies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(p.clone());
                match through(&self.url, &p.listen) {
                    Some(url) => (url, None),
                    None => (self.url.clone(), None),
                }
            }
            Err(e) => (self.url.clone(), Some(e)),
        }
    }

    /// The chaos over these workers: `store` is the soak's own (its
    /// connections are never struck), `ttl` the workers' lease TTL.
    pub fn chaos(&self, store: Arc<PgStore>, ttl: Duration) -> PgChaos {
        PgChaos::new(store, self.app.clone(), self.proxies.clone(), ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_stands_in_for_the_one_host_of_a_url() {
        assert_eq!(
            upstream("postgres://u:p@db:5433/test?x=1").as_deref(),
            Some("db:5433")
        );
        assert_eq!(upstream("postgres://db/test").as_deref(), Some("db:5432"));
        assert_eq!(upstream("postgres://a,b/test"), None);
        assert_eq!(upstream("postgres://[::1]:5432/test"), None);
        assert_eq!(
            through("postgres://u:p@db:5433/test?x=1", "127.0.0.1:9").as_deref(),
            Some("postgres://u:p@127.0.0.1:9/test?x=1")
        );
    }
}
