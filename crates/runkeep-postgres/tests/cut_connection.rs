//! Connections cut **inside a transaction** by the TCP proxy
//! (`common::proxy`): the chunk carrying `BEGIN` and the run's row lock
//! reaches the server, its answer is swallowed and both sides are closed,
//! so the server finds its client gone with the transaction open.
//!
//! - One cut, held open until the test saw the backend `idle in
//!   transaction` (the interleaving happened): the write answers a plain
//!   `Unavailable` (nothing committed), nothing landed, the row lock went
//!   with the session, the pool reconnects within the same store, and the
//!   holder's retry lands once; a cut renewal leaves the run claimable by
//!   another holder once the lease plus one renewal interval has passed.
//! - A drain with a cut inside every 7th transaction and every 11th
//!   `COMMIT`'s acknowledgement lost: every write a worker had acknowledged
//!   is in the tables, none twice (a lost acknowledgement is outcome
//!   unknown and read back, not repeated), every run completes, and a run whose claim landed
//!   unheard is claimable again one lease plus one renewal interval later
//!   on the store's clock.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::proxy::Proxy;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, EnqueueOptions, Error,
    EvidenceStore, ListOptions, ManualClock, Outcome, ReadEventsOptions, RunScope, RunStatus, Step,
    Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::PgStore;
use serde_json::json;

const TTL_MS: u64 = 30_000;
/// The worker's lease keeper renews every third of the TTL
/// (`KeeperOptions::renew_fraction`).
const RENEWAL_MS: u64 = TTL_MS / 3;

fn claim(name: &str) -> ClaimOptions {
    ClaimOptions::new(support::holder(name), Ttl::from_millis(TTL_MS).unwrap())
}

/// Waits until the backend whose client port is `port` is `idle in
/// transaction` (it ran the `BEGIN` pipeline and waits for its client);
/// answers whether it held a lock on a table of `schema` then.
async fn idle_in_transaction(url: &str, port: u16, schema: &str) -> bool {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..400 {
        let row = client
            .query_opt(
                "SELECT a.state, EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE l.pid = a.pid AND n.nspname = $2) \
                 FROM pg_stat_activity a WHERE a.client_port = $1",
                &[&i32::from(port), &schema],
            )
            .await
            .unwrap();
        if let Some(r) = row {
            if r.get::<_, Option<String>>(0).as_deref() == Some("idle in transaction") {
                return r.get(1);
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no backend on client port {port} went idle in transaction");
}

async fn events(store: &PgStore, scope: &RunScope) -> Vec<String> {
    store
        .read_events(scope, &ReadEventsOptions::default())
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.payload["step"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_inside_a_transaction_leaves_no_lock_and_the_pool_reconnects() {
    let Some(url) = common::url_or_skip("cut_in_tx") else {
        return;
    };
    let clock = support::store_clock();
    let (direct, guard) = common::store(&url, "cut", Some(clock.clone())).await;
    let proxy = Proxy::start(&common::server_addr(&url)).await;
    let store = Arc::new(
        PgStore::connect(
            &proxy.url(&url),
            common::options(&guard.schema, Some(clock.clone())),
        )
        .await
        .unwrap(),
    );
    let scope = support::run("run_cut");
    let lease = store
        .claim(&scope, &claim("a"))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let step = |id: &str| Step {
        events: vec![support::event("work", json!({ "step": id }))],
        ..Step::default()
    };

    // 1. A step cut while its transaction holds the row lock.
    proxy.pause_next_begin();
    let writer = {
        let (store, scope, s) = (store.clone(), scope.clone(), step("s1"));
        tokio::spawn(async move { store.commit_step(&scope, lease.fence, &s).await })
    };
    let port = proxy.holding().await;
    assert!(
        idle_in_transaction(&url, port, &guard.schema).await,
        "the cut transaction held a lock on the store's tables"
    );
    let accepted = proxy.accepted();
    proxy.release_cut();
    let err = writer.await.unwrap().expect_err("its connection was cut");
    assert_eq!(proxy.cuts_in_tx(), 1);
    assert!(err.is_retryable() && !err.is_outcome_unknown(), "{err:?}");
    assert!(events(&direct, &scope).await.is_empty(), "nothing landed");
    // The holder repeats it on the same store: a new connection, and it
    // lands once (the lock left with the cut session: no wait for
    // idle_in_transaction_session_timeout).
    let mut retried = store.commit_step(&scope, lease.fence, &step("s1")).await;
    if matches!(&retried, Err(e) if e.is_retryable()) {
        // The pool may hand out the cut connection once before it learns.
        retried = store.commit_step(&scope, lease.fence, &step("s1")).await;
    }
    retried.unwrap();
    assert!(
        proxy.accepted() > accepted,
        "the pool opened a new connection"
    );
    assert_eq!(events(&direct, &scope).await, ["s1"]);

    // 2. The holder's renewal cut mid transaction: nothing changed, and
    // once the lease plus one renewal interval has passed another holder
    // takes the run (no lock, no lease left behind).
    proxy.pause_next_begin();
    let renewal = {
        let (store, scope) = (store.clone(), scope.clone());
        tokio::spawn(async move { store.claim(&scope, &claim("a")).await })
    };
    let port = proxy.holding().await;
    assert!(idle_in_transaction(&url, port, &guard.schema).await);
    proxy.release_cut();
    let err = renewal.await.unwrap().expect_err("the renewal was cut");
    assert!(!err.is_outcome_unknown(), "{err:?}");
    assert_eq!(proxy.cuts_in_tx(), 2);
    clock.advance((TTL_MS + RENEWAL_MS) as i64);
    let taken = direct.claim(&scope, &claim("b")).await.unwrap();
    let ClaimOutcome::Acquired(b) = taken else {
        panic!("the run is claimable after the lease and one renewal: {taken:?}");
    };
    assert!(b.fence > lease.fence);
    // The cut holder, reconnected, is refused under its old fence.
    let mut late = store.commit_step(&scope, lease.fence, &step("late")).await;
    if matches!(&late, Err(e) if e.is_retryable()) {
        late = store.commit_step(&scope, lease.fence, &step("late")).await;
    }
    assert!(matches!(late, Err(Error::FencedOut { .. })), "{late:?}");
    assert_eq!(events(&direct, &scope).await, ["s1"]);
}

const RUNS: usize = 60;
const WORKERS: usize = 3;

/// What the workers had acknowledged: (run, step id).
type Acked = Arc<Mutex<BTreeSet<(String, String)>>>;

/// Writes `step` under `fence` until it is acknowledged or refused; an
/// outcome-unknown answer is resolved by reading the step back by its id.
/// Answers whether it is stored.
async fn write_step(
    store: &PgStore,
    scope: &RunScope,
    fence: runkeep::Fence,
    id: &str,
    finish: bool,
) -> bool {
    let step = Step {
        events: vec![support::event("work", json!({ "step": id }))],
        finish: finish.then(|| Outcome::completed(None)),
        ..Step::default()
    };
    loop {
        match store.commit_step(scope, fence, &step).await {
            Ok(_) => return true,
            Err(e) if e.is_outcome_unknown() => {
                // Read back (retrying the read through the cuts). Final
                // without fencing off first (the worker's documented path
                // renews before it reads): the proxy loses an
                // acknowledgement only after the COMMIT was answered.
                loop {
                    match store
                        .read_events(scope, &ReadEventsOptions::default())
                        .await
                    {
                        Ok(page) => {
                            if page.events.iter().any(|e| e.payload["step"] == json!(id)) {
                                return true;
                            }
                            break;
                        }
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("read back: {e}"),
                    }
                }
            }
            Err(e) if e.is_retryable() => {}
            Err(Error::FencedOut { .. }) => return false,
            Err(e) => panic!("{}: {e}", scope.run_id),
        }
    }
}

async fn worker(store: Arc<PgStore>, name: String, acked: Acked) {
    let opts = claim(&name);
    loop {
        let taken = match store
            .claim_next(&support::listing(), &ClaimNextFilter::default(), &opts)
            .await
        {
            Ok(t) => t,
            Err(e) if e.is_retryable() => continue,
            Err(e) => panic!("{name}: claim_next: {e}"),
        };
        let Some((scope, lease)) = taken else { return };
        let run = scope.run_id.to_string();
        for (n, finish) in [(1, false), (2, true)] {
            let id = format!("{run}#{}#{n}", lease.fence);
            if !write_step(&store, &scope, lease.fence, &id, finish).await {
                break;
            }
            acked.lock().unwrap().insert((run.clone(), id));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_through_cut_connections_loses_no_acknowledged_write() {
    let Some(url) = common::url_or_skip("cut_drain") else {
        return;
    };
    let clock: ManualClock = support::store_clock();
    let (direct, guard) = common::store(&url, "cutdrain", Some(clock.clone())).await;
    for i in 0..RUNS {
        direct
            .enqueue(
                &support::run(&format!("run_{i:03}")),
                &support::checkpoint("start", 0),
                &EnqueueOptions::default(),
            )
            .await
            .unwrap();
    }
    let proxy = Proxy::start(&common::server_addr(&url)).await;
    let store = Arc::new(
        PgStore::connect(
            &proxy.url(&url),
            common::options(&guard.schema, Some(clock.clone())),
        )
        .await
        .unwrap(),
    );
    let accepted = proxy.accepted();
    proxy.cut_every(7, 11);
    let acked: Acked = Arc::default();
    let mut rounds = 0;
    loop {
        let tasks: Vec<_> = (0..WORKERS)
            .map(|w| tokio::spawn(worker(store.clone(), format!("w{w}"), acked.clone())))
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let active = direct
            .list_runs(
                &support::listing(),
                &ListOptions {
                    status: Some(vec![RunStatus::Active]),
                    ..ListOptions::default()
                },
            )
            .await
            .unwrap();
        if active.entries.is_empty() {
            break;
        }
        // Left active: runs whose claim landed but whose answer was lost
        // (nobody knows it holds them) or whose holder was fenced out.
        // One lease plus one renewal interval later they are claimable.
        rounds += 1;
        assert!(
            rounds <= 3,
            "runs stuck past a lease and a renewal: {active:?}"
        );
        clock.advance((TTL_MS + RENEWAL_MS) as i64);
    }
    proxy.cut_every(0, 0);

    assert!(proxy.cuts_in_tx() > 0 && proxy.acks_lost() > 0);
    assert!(proxy.accepted() > accepted, "the pool reconnected");
    let acked = acked.lock().unwrap().clone();
    let mut completed = 0;
    for i in 0..RUNS {
        let scope = support::run(&format!("run_{i:03}"));
        let all = events(&direct, &scope).await;
        let stored: BTreeSet<String> = all.iter().cloned().collect();
        assert_eq!(stored.len(), all.len(), "a step stored twice: {all:?}");
        for (run, id) in acked.iter().filter(|(r, _)| *r == scope.run_id.to_string()) {
            assert!(stored.contains(id), "{run}: acknowledged {id} is lost");
        }
        if direct.lifecycle(&scope).await.unwrap().status == RunStatus::Completed {
            completed += 1;
        }
    }
    assert_eq!(completed, RUNS);
    eprintln!(
        "cut drain: {RUNS} runs, {} transactions cut, {} acknowledgements lost, {} connections opened, {} acknowledged writes all stored, {rounds} clock advance(s)",
        proxy.cuts_in_tx(),
        proxy.acks_lost(),
        proxy.accepted() - accepted,
        acked.len()
    );
}
