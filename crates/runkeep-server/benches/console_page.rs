//! What one view of the console's runs table costs at 100 000 runs: the one
//! listing request it makes (`GET /v1/tenants/{t}/runs?limit=50…`) through
//! the whole app (`server::app`: routing, auth, manners) over a
//! `MemoryStore` holding the demo runs and 100 000 bulk runs. The console
//! fetches one page per view (and, for the failed rows of that page, their
//! lifecycle), never the whole listing, so its cost is this request's.
//!
//! `cargo bench -p runkeep-server --bench console_page`
//!
//! Measured on the 2-core machine with other builds running (load average
//! 6–11), release build: first page 482 ms, page 1001 (by cursor) 421 ms,
//! first page by creation 585 ms, parked filter 388 ms, claimed filter
//! 414 ms (criterion medians). All of it is `MemoryStore::list_runs`,
//! which builds and sorts a row for every run of the scope on each call;
//! the console's part is one request and 50 rendered rows.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::BodyExt;
use runkeep::{MemoryStore, RunStore, TenantId};
use runkeep_demo as demo;
use runkeep_server::auth::{Role, StaticTokens};
use runkeep_server::metrics::Metrics;
use runkeep_server::server::{app, ServerConfig};
use runkeep_server::state::AppState;
use tower::ServiceExt;

const TOKEN: &str = "bench-reader";
const BULK: usize = 100_000;

async fn page(app: &axum::Router, query: &str) -> serde_json::Value {
    let req = Request::get(format!("/v1/tenants/default/runs?{query}"))
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Percent-encodes what a cursor may hold that a query value cannot.
fn encode(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '-' | '_' | '.' | '~' => c.to_string(),
            other => format!("%{:02X}", other as u32),
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tenant = TenantId::new("default").unwrap();
    let store = Arc::new(MemoryStore::new());
    rt.block_on(async {
        demo::seed(store.as_ref(), &tenant).await.unwrap();
        demo::seed_bulk(store.as_ref(), &tenant, BULK)
            .await
            .unwrap();
    });
    let state = AppState {
        store: store.clone() as Arc<dyn RunStore>,
        auth: Arc::new(StaticTokens::new().with(TOKEN, tenant.clone(), Role::Reader)),
        metrics: Arc::new(Metrics::new()),
    };
    let app = app(state, &ServerConfig::default());
    // A cursor half-way through the listing.
    let deep = rt.block_on(async {
        let mut query = "limit=50".to_string();
        for _ in 0..1000 {
            let p = page(&app, &query).await;
            let cursor = p["cursor"].as_str().unwrap();
            query = format!("limit=50&cursor={}", encode(cursor));
        }
        query
    });
    let mut g = c.benchmark_group("console_page_100k_runs");
    g.sample_size(20);
    for (name, query) in [
        ("first_page", "limit=50".to_string()),
        ("page_1001", deep.clone()),
        (
            "first_page_by_created_at",
            "limit=50&order=createdAt".to_string(),
        ),
        (
            "parked_filter",
            "limit=50&park=outstanding,expired".to_string(),
        ),
        ("claimed_filter", "limit=50&claimed=true".to_string()),
    ] {
        g.bench_function(name, |b| b.iter(|| rt.block_on(page(&app, &query))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
