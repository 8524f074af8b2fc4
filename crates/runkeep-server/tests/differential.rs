//! The differential property test through the server: random sequences of
//! claims, releases, snoozes, checkpoint writes (with parks), appends, step
//! commits, finishes, reopens, enqueues, park answers and store-clock moves
//! against an `HttpStore` (→ live API server → `MemoryStore`) and against
//! an in-process `MemoryStore` side by side, every answer and whole
//! read-back compared after each operation.

mod common;

use std::sync::Arc;

use runkeep_conformance::{differential, Fixture};

use common::TestServer;

fn through_http(clock: runkeep::ManualClock) -> Fixture {
    let backing = runkeep::MemoryStore::with_clock(Arc::new(clock.clone()));
    let server = TestServer::start(Arc::new(backing));
    let store = server.client(Some(clock.clone()));
    Fixture::new(Arc::new(store), 3, server).with_clock(clock)
}

/// 24 sequences in two halves of 12, run side by side by the test harness:
/// every operation is followed by a whole read-back of every run over
/// HTTP, and one test of 24 kept one core busy for half a minute.
fn half() -> differential::Config {
    differential::Config {
        cases: 24,
        ..differential::Config::default()
    }
    .half()
}

fn agrees(config: differential::Config) {
    let report = differential::check(through_http, config);
    eprintln!("differential (HttpStore -> server -> memory vs memory): {report:?}");
    assert_eq!(report.cases, config.cases);
    assert!(report.accepted > 0, "no operation was accepted: {report:?}");
}

#[test]
fn the_store_through_the_server_agrees_with_the_reference_model_under_random_operations() {
    agrees(half());
}

#[test]
fn the_store_through_the_server_agrees_with_the_reference_model_under_more_random_operations() {
    agrees(half());
}
