//! Retention at scale on PostgreSQL (`runkeep_conformance::scale`):
//! `RUNKEEP_RETENTION_SCALE_RUNS` finished runs (default 2 000) in a fresh
//! schema.

mod common;

use std::sync::Arc;

use runkeep_conformance::{scale, support};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_finished_runs_at_scale_while_the_queue_drains() {
    let Some(url) = common::url_or_skip("prunes_finished_runs_at_scale_while_the_queue_drains")
    else {
        return;
    };
    let clock = support::store_clock();
    let (store, _guard) = common::store(&url, "retscale", Some(clock.clone())).await;
    let figures = scale::retention_at_scale(Arc::new(store), clock, scale::size(), 1000).await;
    eprintln!("postgres: {figures}");
}
