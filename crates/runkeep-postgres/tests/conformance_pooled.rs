//! The whole conformance kit through pgbouncer in **transaction** pool mode
//! (`common::pgbouncer`: one private pgbouncer for this test binary, fewer
//! server sessions than the stores' pools, so clients share them): each
//! case gets a fresh schema and a login role whose defaults carry the
//! store's settings (`runkeep_postgres::role_settings`), a store on the
//! pooler's URL with `PgOptions::direct_url` straight to the server (for
//! `LISTEN`, the migration and describing statements).

mod common;

use std::sync::{Arc, OnceLock};

use common::pgbouncer::{self, Bouncer, RoleGuard};
use runkeep_conformance::{support, Fixture};
use runkeep_postgres::{role_settings, PgOptions, PgStore};

/// The pgbouncer of this test binary (stopped when the process exits).
fn bouncer() -> &'static Bouncer {
    static B: OnceLock<Bouncer> = OnceLock::new();
    B.get_or_init(|| {
        let url = common::url_required();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(Bouncer::start(&url))
        })
        .join()
        .expect("start pgbouncer")
    })
}

async fn pooled() -> Fixture {
    let url = common::url_required();
    let b = bouncer();
    let schema = common::unique_schema("pool");
    let schema_guard = common::SchemaGuard::new(&url, &schema);
    let clock = support::store_clock();
    let options = common::options(&schema, Some(clock.clone()));
    let (_, _, database) = pgbouncer::target(&url);
    let role = RoleGuard::create(&url, &schema, &role_settings(&options, &schema, &database));
    b.add_role(&schema).await;
    let store = PgStore::connect(
        &pgbouncer::with_user_port(&url, &schema, Some(b.port)),
        PgOptions {
            direct_url: Some(pgbouncer::with_user_port(&url, &schema, None)),
            ..options
        },
    )
    .await
    .unwrap_or_else(|e| panic!("PgStore::connect through pgbouncer failed: {e}"));
    // The schema drops before the role that owns it.
    Fixture::new(Arc::new(store), 3, (schema_guard, role)).with_clock(clock)
}

runkeep_conformance::conformance_tests!(pooled);
