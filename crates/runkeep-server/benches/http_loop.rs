//! Requests per second of a worker's loop — claim → commit a step (one
//! event and a checkpoint) → finish — through the server (`HttpStore` →
//! live API server on 127.0.0.1 → `MemoryStore`) next to the same loop in
//! process on a `MemoryStore`, side by side in one run. One element is one
//! loop (three store calls, so three HTTP requests through the server).
//!
//! `cargo bench -p runkeep-server --bench http_loop`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, Holder, MemoryStore, NewEvent, Outcome, ProjectId,
    RunId, RunScope, RunStore, SessionId, Step, TenantId, Timestamp, Ttl,
};
use runkeep_server::auth::{Role, StaticTokens};
use runkeep_server::client::{HttpStore, HttpStoreOptions};
use runkeep_server::metrics::Metrics;
use runkeep_server::state::AppState;
use serde_json::json;

const TOKEN: &str = "bench-worker";

fn tenant() -> TenantId {
    TenantId::new("tnt_bench").unwrap()
}

/// Serves the API over `store` on its own thread and runtime; answers the
/// base URL.
fn serve(store: Arc<dyn RunStore>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let state = AppState {
                store,
                auth: Arc::new(StaticTokens::new().with(TOKEN, tenant(), Role::Worker)),
                metrics: Arc::new(Metrics::default()),
            };
            axum::serve(listener, runkeep_server::api::router(state))
                .await
                .unwrap();
        });
    });
    format!("http://{addr}")
}

static RUN: AtomicU64 = AtomicU64::new(0);

async fn one_loop(store: &dyn RunStore, holder: &Holder) {
    let n = RUN.fetch_add(1, Ordering::Relaxed);
    let scope = RunScope::new(
        tenant(),
        ProjectId::new("prj_bench").unwrap(),
        SessionId::new("ses_bench").unwrap(),
        RunId::new(format!("run_{n}")).unwrap(),
    );
    let lease = store
        .claim(
            &scope,
            &ClaimOptions::new(holder.clone(), Ttl::from_millis(60_000).unwrap()),
        )
        .await
        .unwrap()
        .lease()
        .expect("a fresh run is free");
    let step = Step {
        events: vec![NewEvent::new(
            "tool_completed",
            json!({"toolUseId": "t1", "toolName": "search", "result": "ok"})
                .as_object()
                .unwrap()
                .clone(),
        )],
        checkpoint: Some(Checkpoint::new(
            CheckpointId::new("cp_1").unwrap(),
            Timestamp::now(),
            json!({"cursor": n}).as_object().unwrap().clone(),
        )),
        ..Step::default()
    };
    store.commit_step(&scope, lease.fence, &step).await.unwrap();
    store
        .finish(&scope, lease.fence, &Outcome::completed(None))
        .await
        .unwrap();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let holder = Holder::new("bench-worker").unwrap();
    let in_process: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let base = serve(Arc::new(MemoryStore::new()));
    let http: Arc<dyn RunStore> = Arc::new(
        HttpStore::new(base, HttpStoreOptions::default())
            .unwrap()
            .with_token(tenant(), TOKEN),
    );
    // Warm the connection.
    rt.block_on(one_loop(http.as_ref(), &holder));

    let mut g = c.benchmark_group("claim_step_finish");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("in_process_memory", |b| {
        b.iter(|| rt.block_on(one_loop(in_process.as_ref(), &holder)))
    });
    g.bench_function("http_memory", |b| {
        b.iter(|| rt.block_on(one_loop(http.as_ref(), &holder)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
