//! The conformance kit through the server backed by PostgreSQL: an
//! `HttpStore` → a live API server on 127.0.0.1 → `PgStore` in a fresh
//! schema per case (dropped afterwards), on the store clock the kit moves.
//! Needs `RUNKEEP_TEST_POSTGRES_URL` (`scripts/test.sh` sets it); without
//! it every case fails saying so, like the PostgreSQL crate's own kit.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use runkeep_conformance::{support, Fixture};
use runkeep_postgres::{PgOptions, PgStore};

use common::TestServer;

const URL_VAR: &str = "RUNKEEP_TEST_POSTGRES_URL";
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Drops the case's schema when dropped.
struct SchemaGuard {
    url: String,
    schema: String,
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    let driver = tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                        .await;
                    drop(client);
                    let _ = driver.await;
                }
            });
        })
        .join();
    }
}

/// The runtime the store's pool and listener were made on, shut down
/// without blocking (it is dropped inside the case's runtime).
struct RtGuard(Option<tokio::runtime::Runtime>);

impl Drop for RtGuard {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

async fn postgres() -> Fixture {
    let url = std::env::var(URL_VAR).ok().filter(|u| !u.is_empty()).unwrap_or_else(|| {
        panic!("{URL_VAR} is not set: the conformance kit through the server on PostgreSQL needs a server; run scripts/test.sh or set {URL_VAR}=postgres://postgres@127.0.0.1:5432/test")
    });
    let schema = format!(
        "rkt_http_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let guard = SchemaGuard {
        url: url.clone(),
        schema: schema.clone(),
    };
    let clock = support::store_clock();
    // The store is connected on the server's own runtime (its pool and
    // listener live there), so connect it on a thread of that shape.
    let (url2, schema2, clock2) = (url.clone(), schema.clone(), clock.clone());
    let backing = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let store = rt.block_on(PgStore::connect(
            &url2,
            PgOptions {
                schema: schema2,
                pool_size: 4,
                clock: Some(Arc::new(clock2) as Arc<dyn runkeep::Clock>),
                watch_fallback: std::time::Duration::from_secs(30),
                ..PgOptions::default()
            },
        ));
        (store, rt)
    })
    .join()
    .expect("connect thread");
    let (store, rt) = backing;
    let store =
        store.unwrap_or_else(|e| panic!("{URL_VAR} is set but PgStore::connect failed: {e}"));
    let server = TestServer::start(Arc::new(store));
    let client = server.client(Some(clock.clone()));
    Fixture::new(Arc::new(client), 3, (server, RtGuard(Some(rt)), guard)).with_clock(clock)
}

runkeep_conformance::conformance_tests!(postgres, over_http);
