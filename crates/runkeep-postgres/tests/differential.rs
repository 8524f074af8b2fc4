//! The differential property test for the PostgreSQL backend: random
//! sequences of claims, releases, snoozes, checkpoint writes (with parks),
//! appends, step commits, finishes, reopens, enqueues, park answers and
//! store-clock moves against a `PgStore` (one fresh schema per sequence)
//! and against `MemoryStore` side by side, every answer and whole
//! read-back compared after each operation
//! (`runkeep_conformance::differential`).

mod common;

use std::sync::Arc;

use runkeep_conformance::{differential, Fixture};
use runkeep_postgres::PgStore;

fn pg_fixture(clock: runkeep::ManualClock) -> Fixture {
    let url = common::url_required();
    let schema = common::unique_schema("diff");
    let guard = common::SchemaGuard::new(&url, &schema);
    let options = common::options(&schema, Some(clock.clone()));
    // The kit builds fixtures inside its own runtime without awaiting:
    // migrate on a thread of our own, then build the pool (it connects on
    // first use, on the kit's runtime).
    let (u, o) = (url.clone(), options.clone());
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime to migrate")
            .block_on(PgStore::migrate(&u, &o))
    })
    .join()
    .expect("the migration thread")
    .unwrap_or_else(|e| panic!("{} is set but migrating failed: {e}", common::URL_VAR));
    let store = PgStore::open_migrated(&url, options).expect("build the store");
    Fixture::new(Arc::new(store), 3, guard).with_clock(clock)
}

fn agrees(config: differential::Config) {
    let report = differential::check(pg_fixture, config);
    eprintln!("differential (postgres vs memory): {report:?}");
    assert_eq!(report.cases, config.cases);
}

/// The default 64 sequences in two halves of 32 that the test harness
/// runs side by side.
#[test]
fn the_postgres_store_agrees_with_the_reference_model_under_random_operations() {
    agrees(differential::Config::default().half());
}

#[test]
fn the_postgres_store_agrees_with_the_reference_model_under_more_random_operations() {
    agrees(differential::Config::default().half());
}
