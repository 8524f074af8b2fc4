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

/// A batch passes a keyed run whose key's lock another claimer holds, and
/// answers the runs it took without waiting for that lock: a raw
/// transaction holds the key lock of `a1` (as a claimer judging a run of
/// that key does) until the batch has answered. A batch that waited for
/// it would meet `lock_timeout` and fail.
#[tokio::test]
async fn a_batch_passes_a_key_another_claimer_holds_and_answers_what_it_took() {
    use runkeep::CheckpointStore as _;
    use runkeep::{ClaimNextFilter, Concurrency, EnqueueOptions};
    use runkeep_conformance::support::{
        checkpoint, claim_now, listing, project, run, session, tenant,
    };
    let Some(url) = common::url_or_skip("batches_pass_a_held_key") else {
        return;
    };
    let schema = common::unique_schema("batch_pass");
    let guard = common::SchemaGuard::new(&url, &schema);
    let store = PgStore::connect(
        &url,
        runkeep_postgres::PgOptions {
            lock_timeout: std::time::Duration::from_secs(2),
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .expect("connect");
    let keyed = EnqueueOptions {
        concurrency: Some(Concurrency::new("customer-a", 2).expect("key")),
        ..EnqueueOptions::default()
    };
    store
        .enqueue(&run("a1"), &checkpoint("a1", 0), &keyed)
        .await
        .expect("enqueue a1");
    store
        .enqueue(&run("b1"), &checkpoint("b1", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue b1");
    let raw = common::raw_client(&url, &guard.schema).await;
    raw.batch_execute("BEGIN").await.expect("BEGIN");
    let held: bool = raw
        .query_one(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(concat_ws(chr(1), 'runkeep-key', \
             $1::text, $2::text, $3::text, $4::text, $5::text), 0))",
            &[
                &guard.schema,
                &tenant().to_string(),
                &project().to_string(),
                &session().to_string(),
                &"customer-a",
            ],
        )
        .await
        .expect("take the key's lock")
        .get(0);
    assert!(held, "the raw transaction holds customer-a's lock");
    let taken = store
        .claim_next_batch(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now("w1", 60_000),
            2,
        )
        .await
        .expect("a batch beside a held key answers without waiting for it");
    assert_eq!(
        taken.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>(),
        [run("b1")],
        "a1 passed (its key's lock is held), b1 taken"
    );
    raw.batch_execute("COMMIT").await.expect("COMMIT");
    let next = store
        .claim_next_batch(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now("w2", 60_000),
            2,
        )
        .await
        .expect("the batch after the lock is released");
    assert_eq!(
        next.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>(),
        [run("a1")],
        "once the key's lock is free, a1 is taken"
    );
}
