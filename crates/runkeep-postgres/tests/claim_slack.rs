//! `claim_next`'s candidate statement under contention
//! (`PgOptions::claim_slack`, `claims::HeadSlack`): when other claimers
//! hold the first runs locked, the statement's `SKIP LOCKED` must pass
//! them in the same statement once the store has seen contention, instead
//! of answering "all locked" and sending the scan after it.
//!
//! The contention is made, not hoped for: a second session holds the first
//! runs of the queue locked (`SELECT … FOR UPDATE` in an open transaction,
//! what a claimer between its candidate statement and its commit holds).
//! Round trips are counted by the proxy of `round_trips.rs`
//! (`common::counting`) on a current-thread runtime, where the count is
//! exact. Each test runs with the slack on and off: the difference in waits
//! is the change, and the off run shows the test fails without it.

mod common;

use common::counting::Counter;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions, ListingScope, RunId, RunScope,
    SessionId, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore};

fn session(name: &str) -> SessionId {
    SessionId::new(format!("ses_slack_{name}")).unwrap()
}

fn run(session_name: &str, i: usize) -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        session(session_name),
        RunId::new(format!("run_{i:03}")).unwrap(),
    )
}

fn listing(session_name: &str) -> ListingScope {
    ListingScope::session(support::tenant(), support::project(), session(session_name))
}

fn opts() -> ClaimOptions {
    ClaimOptions::new(support::holder("w"), Ttl::from_millis(600_000).unwrap())
}

async fn queue(store: &PgStore, session_name: &str, n: usize) {
    for i in 0..n {
        store
            .enqueue(
                &run(session_name, i),
                &support::checkpoint("start", 0),
                &EnqueueOptions::default(),
            )
            .await
            .expect("enqueue");
    }
}

/// A store with one pooled connection through a counting proxy, and the
/// guard of its schema.
async fn counted_store(url: &str, slack: bool) -> (PgStore, Counter, common::SchemaGuard) {
    let (_direct, guard) = common::store(url, "slack", None).await;
    let counter = Counter::start(&common::server_addr(url)).await;
    let store = PgStore::connect(
        &counter.url(url),
        PgOptions {
            pool_size: 1,
            claim_slack: slack,
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .expect("connect through the counting proxy");
    (store, counter, guard)
}

/// Another session holding `runs` locked in an open transaction (what a
/// claimer holds between its candidate statement and its commit).
async fn lock_runs(
    url: &str,
    schema: &str,
    session_name: &str,
    runs: &[usize],
) -> tokio_postgres::Client {
    let locker = common::raw_client(url, schema).await;
    locker.batch_execute("BEGIN").await.unwrap();
    let ids: Vec<String> = runs.iter().map(|i| format!("run_{i:03}")).collect();
    let locked = locker
        .query(
            "SELECT run_id FROM runs WHERE session_id = $1 AND run_id = ANY($2) FOR UPDATE",
            &[&session(session_name).as_str(), &ids],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), runs.len(), "the other session locks them all");
    locker
}

/// What the waits of one `claim_next` were, and which run it took.
async fn counted_claim(store: &PgStore, counter: &Counter, session_name: &str) -> (usize, String) {
    let before = counter.snapshot();
    let next = store
        .claim_next(&listing(session_name), &ClaimNextFilter::default(), &opts())
        .await
        .expect("claim_next");
    let used = counter.snapshot() - before;
    let (scope, _) = next.expect("a run is claimable");
    (used.waits, scope.run_id.to_string())
}

async fn single(url: &str, slack: bool) -> (usize, usize, usize) {
    let (store, counter, guard) = counted_store(url, slack).await;
    queue(&store, "warm", 2).await;
    queue(&store, "busy", 8).await;
    // Uncontended, once to prepare the statements, once counted.
    counted_claim(&store, &counter, "warm").await;
    let (plain, taken) = counted_claim(&store, &counter, "warm").await;
    assert_eq!(taken, "run_001");

    let locker = lock_runs(url, &guard.schema, "busy", &[0, 1, 2, 3]).await;
    let (first, taken) = counted_claim(&store, &counter, "busy").await;
    assert_eq!(
        taken, "run_004",
        "the first run no other claimer holds locked"
    );
    let (second, taken) = counted_claim(&store, &counter, "busy").await;
    assert_eq!(taken, "run_005");
    locker.batch_execute("ROLLBACK").await.unwrap();
    let (_, taken) = counted_claim(&store, &counter, "busy").await;
    assert_eq!(
        taken, "run_000",
        "the runs are claimable again once unlocked"
    );
    (plain, first, second)
}

#[tokio::test]
async fn claim_next_passes_runs_locked_by_other_claimers_in_one_statement_once_it_saw_them() {
    let Some(url) = common::url_or_skip("claim_slack") else {
        return;
    };
    let (plain, first, second) = single(&url, true).await;
    eprintln!("slack on: uncontended {plain}, first contended {first}, second {second}");
    assert!(
        first > plain,
        "the first contended claim goes on with the scan: {first} waits vs {plain}"
    );
    assert_eq!(
        second, plain,
        "once contention was seen, the candidate statement passes the locked runs itself"
    );

    // The earlier path (the option off) pays the scan every time: what the
    // assertion above would see without the slack.
    let (plain, first, second) = single(&url, false).await;
    eprintln!("slack off: uncontended {plain}, first contended {first}, second {second}");
    assert!(
        second > plain,
        "without the slack every contended claim scans: {second} waits vs {plain}"
    );
}

async fn batch(url: &str, slack: bool) -> (usize, usize, Vec<String>) {
    let (store, counter, guard) = counted_store(url, slack).await;
    queue(&store, "warm", 16).await;
    queue(&store, "busy", 40).await;
    let claim = |name: &'static str| {
        let store = &store;
        let counter = &counter;
        async move {
            let before = counter.snapshot();
            let taken = store
                .claim_next_batch(&listing(name), &ClaimNextFilter::default(), &opts(), 8)
                .await
                .expect("claim_next_batch");
            let used = counter.snapshot() - before;
            let ids: Vec<String> = taken.iter().map(|(s, _)| s.run_id.to_string()).collect();
            (used.waits, ids)
        }
    };
    claim("warm").await;
    let (plain, ids) = claim("warm").await;
    assert_eq!(ids.len(), 8);

    // Another claimer's batch of 16 holds the first runs locked.
    let locked: Vec<usize> = (0..16).collect();
    let locker = lock_runs(url, &guard.schema, "busy", &locked).await;
    let (_, first) = claim("busy").await;
    let (second_waits, second) = claim("busy").await;
    locker.batch_execute("ROLLBACK").await.unwrap();
    let expected: Vec<String> = (16..32).map(|i| format!("run_{i:03}")).collect();
    let mut all = first.clone();
    all.extend(second);
    assert_eq!(
        all, expected,
        "each batch takes the first runs no other claimer holds locked, in claim order"
    );
    (plain, second_waits, all)
}

#[tokio::test]
async fn claim_next_batch_passes_a_locked_batch_in_one_statement_once_it_saw_it() {
    let Some(url) = common::url_or_skip("claim_slack") else {
        return;
    };
    let (plain, second, _) = batch(&url, true).await;
    eprintln!("slack on: uncontended batch {plain} waits, second contended batch {second}");
    assert_eq!(
        second, plain,
        "once contention was seen, a batch behind another's locked batch costs what an uncontended one does"
    );
    let (plain, second, _) = batch(&url, false).await;
    eprintln!("slack off: uncontended batch {plain} waits, second contended batch {second}");
    assert!(
        second > plain + 4,
        "without the slack each run of the batch is a statement of its own: {second} vs {plain}"
    );
}
