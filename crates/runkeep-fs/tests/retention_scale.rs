//! Retention at scale on the directory store
//! (`runkeep_conformance::scale`): `RUNKEEP_RETENTION_SCALE_RUNS` finished
//! runs (default 2 000), pruned through the session index.

use std::sync::Arc;

use runkeep_conformance::{scale, support};
use runkeep_fs::{Attribution, FsOptions, FsStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_finished_runs_at_scale_while_the_queue_drains() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = support::store_clock();
    let store = FsStore::open(
        dir.path().join("runs"),
        FsOptions {
            attribution: Some(Attribution {
                tenant_id: support::tenant(),
                project_id: support::project(),
                session_id: support::session(),
            }),
            clock: Some(Arc::new(clock.clone())),
            ..Default::default()
        },
    )
    .expect("open the store");
    let figures = scale::retention_at_scale(Arc::new(store), clock, scale::size(), 1000).await;
    eprintln!("directory: {figures}");
}
