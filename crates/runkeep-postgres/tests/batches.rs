//! `claim_next_batch` on PostgreSQL under contention: the conformance
//! kit's concurrency-key race with every worker claiming four runs a call
//! (one transaction each, module `batch`), sixteen stores (each its own
//! connection pool) in front of one schema. The store's own holdings
//! history must never show a key past its limit, and every run completes.

mod common;

use std::sync::Arc;

use runkeep::RunStore;
use runkeep_conformance::key_limits::{drain_keyed_in_batches, KeyRace};
use runkeep_postgres::PgStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_of_four_never_hold_a_key_past_its_limit() {
    let Some(url) = common::url_or_skip("batches_key_race") else {
        return;
    };
    let schema = common::unique_schema("batch_race");
    let guard = common::SchemaGuard::new(&url, &schema);
    let mut stores: Vec<Arc<dyn RunStore>> = Vec::new();
    for _ in 0..16 {
        stores.push(Arc::new(
            PgStore::connect(
                &url,
                runkeep_postgres::PgOptions {
                    pool_size: 2,
                    ..common::options(&guard.schema, None)
                },
            )
            .await
            .expect("connect"),
        ));
    }
    let spec = KeyRace {
        runs: 600,
        ..KeyRace::full()
    };
    let report = drain_keyed_in_batches(&stores, &spec, 4).await;
    eprintln!("{}", report.line("postgres, 16 stores, batches of 4"));
    report.assert_clean("postgres, batches of 4");
}
