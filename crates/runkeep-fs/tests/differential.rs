//! The differential property test for the directory backend: random
//! sequences of claims, releases, snoozes, checkpoint writes (with parks),
//! appends, step commits, finishes, reopens, enqueues, park answers and
//! store-clock moves against an `FsStore` and against `MemoryStore` side by
//! side, every answer and whole read-back compared after each operation
//! (`runkeep_conformance::differential`).

use std::sync::Arc;

use runkeep_conformance::{differential, support, Fixture};
use runkeep_fs::{Attribution, FsOptions, FsStore};

fn fs_fixture(clock: runkeep::ManualClock) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
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
    Fixture::new(Arc::new(store), 3, dir).with_clock(clock)
}

fn agrees(config: differential::Config) {
    let report = differential::check(fs_fixture, config);
    eprintln!("differential (fs vs memory): {report:?}");
    assert_eq!(report.cases, config.cases);
}

/// The default 64 sequences in two halves of 32 that the test harness
/// runs side by side.
#[test]
fn the_directory_store_agrees_with_the_reference_model_under_random_operations() {
    agrees(differential::Config::default().half());
}

#[test]
fn the_directory_store_agrees_with_the_reference_model_under_more_random_operations() {
    agrees(differential::Config::default().half());
}
