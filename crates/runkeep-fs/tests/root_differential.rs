//! The kit's differential property test against a root of many sessions
//! (`FsRootStore`) and `MemoryStore` side by side. The kit's runs live in
//! one session, so this checks the routing and the single-stream merge;
//! `root_tenancy.rs` checks listings and `claim_next` across sessions.

use std::sync::Arc;

use runkeep_conformance::{differential, Fixture};
use runkeep_fs::{FsRootOptions, FsRootStore};

fn root_fixture(clock: runkeep::ManualClock) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = FsRootStore::open(
        dir.path(),
        FsRootOptions {
            clock: Some(Arc::new(clock.clone())),
            ..Default::default()
        },
    )
    .expect("open the root");
    Fixture::new(Arc::new(store), 3, dir).with_clock(clock)
}

/// A third of the directory store's sequences (the root adds only the
/// routing to the session's store, which that test covers in full), in two
/// halves of 12 that the test harness runs side by side.
fn half() -> differential::Config {
    differential::Config {
        cases: 24,
        ..differential::Config::default()
    }
    .half()
}

fn agrees(config: differential::Config) {
    let report = differential::check(root_fixture, config);
    eprintln!("differential (root vs memory): {report:?}");
    assert_eq!(report.cases, config.cases);
}

#[test]
fn the_root_store_agrees_with_the_reference_model_under_random_operations() {
    agrees(half());
}

#[test]
fn the_root_store_agrees_with_the_reference_model_under_more_random_operations() {
    agrees(half());
}
