//! The whole conformance kit through the server: every case runs against
//! an `HttpStore` talking to a live API server on 127.0.0.1, backed by a
//! `MemoryStore`, by a directory store (`FsStore` on a temp directory), by
//! the root of many tenants (`FsRootStore`); `conformance_postgres.rs` does
//! the same on PostgreSQL. The variants,
//! fences and answers the kit checks are the backing store's, carried over
//! HTTP and mapped back by `HttpStore`.

mod common;

use std::sync::Arc;

use runkeep_conformance::{support, Fixture};
use runkeep_fs::{Attribution, FsOptions, FsStore};

use common::TestServer;

async fn memory() -> Fixture {
    let clock = support::store_clock();
    let backing = runkeep::MemoryStore::with_clock(Arc::new(clock.clone()));
    let server = TestServer::start(Arc::new(backing));
    let store = server.client(Some(clock.clone()));
    Fixture::new(Arc::new(store), 3, server).with_clock(clock)
}

runkeep_conformance::conformance_tests!(memory, over_http);

mod directory {
    use super::*;

    async fn directory() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = support::store_clock();
        let backing = FsStore::open(
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
        let server = TestServer::start(Arc::new(backing));
        let store = server.client(Some(clock.clone()));
        // The server goes before the directory.
        Fixture::new(Arc::new(store), 3, (server, dir)).with_clock(clock)
    }

    runkeep_conformance::conformance_tests!(directory, over_http);
}

/// Through the server on the root of many tenants (`FsRootStore`, what
/// `runkeep serve` opens by default): both tenants are held and kept apart.
mod directory_root {
    use super::*;
    use runkeep_fs::{FsRootOptions, FsRootStore};

    async fn root() -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = support::store_clock();
        let backing = FsRootStore::open(
            dir.path().join("root"),
            FsRootOptions {
                clock: Some(Arc::new(clock.clone())),
                ..Default::default()
            },
        )
        .expect("open the root");
        let server = TestServer::start(Arc::new(backing));
        let store = server.client(Some(clock.clone()));
        Fixture::new(Arc::new(store), 3, (server, dir)).with_clock(clock)
    }

    runkeep_conformance::conformance_tests!(root, over_http);
}
