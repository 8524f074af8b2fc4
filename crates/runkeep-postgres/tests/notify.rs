//! `NotifyMode::Coalesced`: watchers still wake, and quick commits share
//! `NOTIFY` statements.

mod common;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use runkeep::{CheckpointStore, EvidenceStore, RunId, RunScope, WatchTopic};
use runkeep_conformance::support;
use runkeep_postgres::{NotifyMode, PgOptions, PgStore};
use serde_json::json;

fn run(name: &str) -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RunId::new(format!("run_{name}")).unwrap(),
    )
}

async fn coalesced(url: &str, schema: &str, pool_size: usize) -> PgStore {
    PgStore::connect(
        url,
        PgOptions {
            notify: NotifyMode::Coalesced,
            pool_size,
            ..common::options(schema, None)
        },
    )
    .await
    .unwrap()
}

/// Waits until the server shows a backend listening on `schema`'s channel,
/// its `LISTEN` done: the session idle again. (`pg_stat_activity` shows the
/// statement from its start, and a `NOTIFY` committed before the `LISTEN`
/// is not delivered: a CI run lost its first wake-up that way.)
async fn wait_for_listen(url: &str, schema: &str) {
    let raw = common::raw_client(url, schema).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = raw
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN runkeep_%' AND query LIKE '%' || $1 || '%' AND state = 'idle'",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        if n >= 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the listener never ran LISTEN");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn append(store: &PgStore, i: u64) {
    let scope = run(&format!("count_{i}"));
    store
        .append_events(&scope, &[support::event("tick", json!({}))], None)
        .await
        .unwrap();
}

/// Waits until the store's count of NOTIFY statements stops moving.
async fn settled_count(store: &PgStore) -> u64 {
    let mut last = store.notify_statements();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = store.notify_statements();
        if now == last {
            return now;
        }
        last = now;
    }
}

/// A change committed by a store in coalesced mode wakes another store's
/// watcher long before its fallback poll could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_change_still_wakes_a_watcher() {
    let Some(url) = common::url_or_skip("coalesced_wakes") else {
        return;
    };
    let (_first, guard) = common::store(&url, "coalesce_watch", None).await;
    let fallback = Duration::from_secs(120);
    let watcher = PgStore::connect(
        &url,
        PgOptions {
            watch_fallback: fallback,
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .unwrap();
    let writer = coalesced(&url, &guard.schema, 4).await;
    let scope = run("coalesced_watch");
    let mut events = watcher.watch(&WatchTopic::Events(scope.clone()));
    assert!(!events.is_polling() && events.interval() == fallback);
    wait_for_listen(&url, &guard.schema).await;
    for i in 0..3 {
        writer
            .append_events(&scope, &[support::event("tick", json!({"i": i}))], None)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), events.changed())
            .await
            .expect("the watcher was not woken by the coalesced notification");
    }
    assert!(writer.notify_statements() >= 1);
}

/// Many commits at once share NOTIFY statements in coalesced mode, where
/// immediate mode sends one per commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_commits_send_fewer_notify_statements_than_commits_when_coalesced() {
    let Some(url) = common::url_or_skip("coalesced_count") else {
        return;
    };
    const N: u64 = 24;
    let (immediate, guard) = common::store(&url, "coalesce_count", None).await;
    // A connection per commit: all of them in flight at once.
    let store = coalesced(&url, &guard.schema, N as usize).await;
    // Warm the pool (and the notify connection) first.
    join_all((0..N).map(|i| append(&store, 1000 + i))).await;
    let before = settled_count(&store).await;
    join_all((0..N).map(|i| append(&store, i))).await;
    let coalesced = settled_count(&store).await - before;
    assert!(
        (1..N).contains(&coalesced),
        "{N} commits sent {coalesced} NOTIFY statements in coalesced mode; expected fewer than {N}"
    );

    let before = immediate.notify_statements();
    join_all((0..N).map(|i| append(&immediate, 100 + i))).await;
    assert_eq!(
        immediate.notify_statements() - before,
        N,
        "immediate mode sends one NOTIFY per commit"
    );
    eprintln!("{N} commits: {coalesced} coalesced NOTIFY statements, {N} immediate");
}

/// The pid of the backend `role` listens on, once its `LISTEN` is done.
async fn listener_of(raw: &tokio_postgres::Client, role: &str) -> Option<i32> {
    raw.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND query LIKE 'LISTEN runkeep_%' AND state = 'idle'",
        &[&role],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// A change committed while a store's listener is down (not connected yet,
/// or reconnecting after a fault) still wakes a watch made meanwhile: once
/// its `LISTEN` is up again the listener wakes every watch, so each one
/// re-reads. Forced: the watching store's role loses `LOGIN` and its
/// listening backend is ended; the watch is made and the write committed
/// while the listener cannot reconnect (asserted: no backend of the role
/// listens after the write); then `LOGIN` comes back. The watch's fallback
/// re-read is far above the bound, so only the listener can wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_committed_while_the_listener_is_down_still_wakes_a_watch() {
    let Some(url) = common::url_or_skip("listener_down") else {
        return;
    };
    let (writer, guard) = common::store(&url, "listener_down", None).await;
    let role = common::pgbouncer::RoleGuard::create(&url, &format!("{}_w", guard.schema), &[]);
    let watcher = PgStore::connect(
        &common::pgbouncer::with_user_port(&url, &role.role, None),
        PgOptions {
            watch_fallback: Duration::from_secs(600),
            pool_size: 1,
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .unwrap();
    let raw = common::raw_client(&url, &guard.schema).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(pid) = listener_of(&raw, &role.role).await {
            break pid;
        }
        assert!(Instant::now() < deadline, "the listener never ran LISTEN");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    raw.batch_execute(&format!(
        "ALTER ROLE \"{}\" NOLOGIN; SELECT pg_terminate_backend({pid})",
        role.role
    ))
    .await
    .unwrap();
    while raw
        .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .is_some()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let scope = run("listener_down");
    let mut events = watcher.watch(&WatchTopic::Events(scope.clone()));
    assert!(!events.is_polling());
    writer
        .append_events(&scope, &[support::event("tick", json!({}))], None)
        .await
        .unwrap();
    assert_eq!(
        listener_of(&raw, &role.role).await,
        None,
        "the interleaving under test: the write committed while the watcher's listener was down"
    );
    raw.batch_execute(&format!("ALTER ROLE \"{}\" LOGIN", role.role))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), events.changed())
        .await
        .expect("a change committed while the listener was down never woke the watch");
    let seen = watcher
        .read_events(&scope, &runkeep::ReadEventsOptions::default())
        .await
        .unwrap();
    assert_eq!(seen.events.len(), 1, "the woken watch re-reads the change");
}
