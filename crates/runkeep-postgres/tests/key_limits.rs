//! The conformance kit's concurrency-key race and fairness figure on
//! PostgreSQL (`runkeep_conformance::key_limits`), each worker on its own
//! store (its own connection pool) in front of one schema.

mod common;

use std::sync::Arc;
use std::time::Duration;

use runkeep::RunStore;
use runkeep_conformance::key_limits::{drain_keyed, fairness, Fairness, KeyRace};
use runkeep_postgres::PgStore;

async fn stores(url: &str, schema: &str, n: usize) -> Vec<Arc<dyn RunStore>> {
    let mut out: Vec<Arc<dyn RunStore>> = Vec::new();
    for _ in 0..n {
        out.push(Arc::new(
            PgStore::connect(
                url,
                runkeep_postgres::PgOptions {
                    // One worker's calls are sequential: two connections
                    // each keep 16 stores far below the server's limit.
                    pool_size: 2,
                    ..common::options(schema, None)
                },
            )
            .await
            .expect("connect"),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_stores_never_hold_a_key_past_its_limit() {
    let Some(url) = common::url_or_skip("key_limits_race") else {
        return;
    };
    let schema = common::unique_schema("key_race");
    let guard = common::SchemaGuard::new(&url, &schema);
    let stores = stores(&url, &guard.schema, 16).await;
    let report = drain_keyed(&stores, &KeyRace::full()).await;
    eprintln!("{}", report.line("postgres, 16 stores"));
    report.assert_clean("postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_ninety_percent_of_the_queue_does_not_starve_the_others() {
    let Some(url) = common::url_or_skip("key_limits_fairness") else {
        return;
    };
    let schema = common::unique_schema("key_fair");
    let guard = common::SchemaGuard::new(&url, &schema);
    let stores = stores(&url, &guard.schema, 8).await;
    let report = fairness(
        &stores,
        &Fairness {
            workers: 8,
            big_runs: 900,
            big_limit: 2,
            other_runs: 100,
            hold: Duration::from_millis(2),
        },
    )
    .await;
    eprintln!("{}", report.line("postgres, 8 workers, 900 + 100 runs"));
    assert_eq!(report.big_most, 2, "the big key must be held at its limit");
    assert_eq!(
        report.claimed_while_big_waited,
        100,
        "{}",
        report.line("postgres")
    );
}
