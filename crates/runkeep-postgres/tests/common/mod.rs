//! Shared by the PostgreSQL tests: the server URL, a unique schema per
//! test (dropped when its guard drops), and store builders.
//!
//! `RUNKEEP_TEST_POSTGRES_URL` names the server (`scripts/test.sh` sets it).
//! When it is set, an unreachable server fails the test; when it is unset,
//! [`url_or_skip`] prints why and the test returns early. The conformance
//! and differential fixtures cannot skip per case, so they fail with what
//! to set.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of these shared helpers"
)]

pub mod counting;
pub mod pgbouncer;
pub mod proxy;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use runkeep::ManualClock;
use runkeep_postgres::{PgOptions, PgStore};

/// The variable the tests read.
pub const URL_VAR: &str = "RUNKEEP_TEST_POSTGRES_URL";

/// The server URL, or `None` after printing why the test skips.
pub fn url_or_skip(test: &str) -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            eprintln!(
                "SKIPPED {test}: {URL_VAR} is not set (scripts/test.sh sets it to postgres://postgres@127.0.0.1:5432/test)"
            );
            None
        }
    }
}

/// The server URL; panics with what to set when absent.
pub fn url_required() -> String {
    std::env::var(URL_VAR).ok().filter(|u| !u.is_empty()).unwrap_or_else(|| {
        panic!(
            "{URL_VAR} is not set: the PostgreSQL conformance and differential tests need a server; run scripts/test.sh or set {URL_VAR}=postgres://postgres@127.0.0.1:5432/test"
        )
    })
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// `host:port` of the server in `url` (what a proxy in front of it dials).
pub fn server_addr(url: &str) -> String {
    let (host, port, _) = pgbouncer::target(url);
    format!("{host}:{port}")
}

/// A schema name no other test (of this or another process) uses.
pub fn unique_schema(label: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("rkt_{label}_{}_{n}_{nanos:x}", std::process::id())
}

/// Drops its schema when dropped (pass or fail), on a thread of its own so
/// it works inside and outside a runtime.
#[derive(Debug)]
pub struct SchemaGuard {
    pub url: String,
    pub schema: String,
}

impl SchemaGuard {
    pub fn new(url: &str, schema: &str) -> Self {
        Self {
            url: url.to_string(),
            schema: schema.to_string(),
        }
    }
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        let t = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the schema");
            rt.block_on(async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect to drop the test schema");
                let driver = tokio::spawn(conn);
                let r = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await;
                drop(client);
                let _ = driver.await;
                if let Err(e) = r {
                    eprintln!("could not drop test schema {schema}: {e}");
                }
            });
        });
        let _ = t.join();
    }
}

/// Options for a test store in `schema` on `clock` (the test clock).
pub fn options(schema: &str, clock: Option<ManualClock>) -> PgOptions {
    PgOptions {
        schema: schema.to_string(),
        pool_size: 4,
        clock: clock.map(|c| Arc::new(c) as Arc<dyn runkeep::Clock>),
        watch_fallback: std::time::Duration::from_secs(30),
        ..PgOptions::default()
    }
}

/// A connected store in a fresh schema, with its guard.
pub async fn store(url: &str, label: &str, clock: Option<ManualClock>) -> (PgStore, SchemaGuard) {
    let schema = unique_schema(label);
    let guard = SchemaGuard::new(url, &schema);
    let store = PgStore::connect(url, options(&schema, clock))
        .await
        .unwrap_or_else(|e| panic!("{URL_VAR} is set but PgStore::connect failed: {e}"));
    (store, guard)
}

/// A raw client for reading the tables back (search_path on the schema).
pub async fn raw_client(url: &str, schema: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("{URL_VAR} is set but the server is unreachable: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute(&format!("SET search_path TO \"{schema}\""))
        .await
        .expect("set search_path");
    client
}
