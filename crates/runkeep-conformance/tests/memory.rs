//! The reference model passes the whole kit, on a store clock the cases move.

use std::sync::Arc;

use runkeep_conformance::{conformance_tests, support, Fixture};

async fn memory() -> Fixture {
    let clock = support::store_clock();
    let store = runkeep::MemoryStore::with_clock(Arc::new(clock.clone()));
    Fixture::new(Arc::new(store), 3, ()).with_clock(clock)
}

conformance_tests!(memory);
