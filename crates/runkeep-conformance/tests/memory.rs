//! The reference model passes the whole kit.

use std::sync::Arc;

use runkeep_conformance::{conformance_tests, Fixture};

async fn memory() -> Fixture {
    Fixture::new(Arc::new(runkeep::MemoryStore::new()), 1, ())
}

conformance_tests!(memory);
