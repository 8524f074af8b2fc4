//! The PostgreSQL backend passes the whole conformance kit against the real
//! server, one fresh schema per case (dropped after it), on a store clock
//! the kit moves (`PgOptions::clock`, the test-only override of the
//! server's clock).

mod common;

use std::sync::Arc;

use runkeep_conformance::{support, Fixture};
use runkeep_postgres::PgStore;

async fn postgres() -> Fixture {
    let url = common::url_required();
    let schema = common::unique_schema("conf");
    let guard = common::SchemaGuard::new(&url, &schema);
    let clock = support::store_clock();
    let store = PgStore::connect(&url, common::options(&schema, Some(clock.clone())))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{} is set but PgStore::connect failed: {e}",
                common::URL_VAR
            )
        });
    Fixture::new(Arc::new(store), 3, guard).with_clock(clock)
}

runkeep_conformance::conformance_tests!(postgres);
