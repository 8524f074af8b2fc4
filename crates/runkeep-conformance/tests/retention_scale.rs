//! Retention at scale on the memory store (`runkeep_conformance::scale`):
//! `RUNKEEP_RETENTION_SCALE_RUNS` finished runs (default 2 000).

use std::sync::Arc;

use runkeep::MemoryStore;
use runkeep_conformance::{scale, support};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_finished_runs_at_scale_while_the_queue_drains() {
    let clock = support::store_clock();
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let figures = scale::retention_at_scale(store, clock, scale::size(), 1000).await;
    eprintln!("memory: {figures}");
}
