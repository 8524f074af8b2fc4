//! Retention on PostgreSQL beyond the conformance cases: the `finished_at`
//! column of schema version 7 (migrated from version 6 with data in it),
//! the batch's statements read indexes, and a reopen forced between the
//! prune's scan and its delete.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::proxy::{CommitFault, Proxy};
use runkeep::scheduling::RetentionPolicy;
use runkeep::{
    CheckpointStore, EnqueueOptions, Lifecycle, ListingScope, ManualClock, Outcome, RunScope,
    RunStatus, RunStore, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgStore, SCHEMA_VERSION};

const KEEP_MS: u64 = 60_000;

fn policy() -> RetentionPolicy {
    RetentionPolicy::keep_for(Ttl::from_millis(KEEP_MS).unwrap())
}

/// Enqueues `scope`, claims it and finishes it (completed) at the store's
/// clock.
async fn finished(store: &Arc<dyn RunStore>, scope: &RunScope) {
    store
        .enqueue(
            scope,
            &support::checkpoint("first", 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    let lease = support::take(store, scope, support::claim_now("w", 60_000)).await;
    store
        .finish(scope, lease.fence, &Outcome::completed(None))
        .await
        .unwrap();
}

/// `SELECT … ORDER BY 1` of `sql` as text rows.
async fn strings(raw: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    raw.query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A schema version 6 wrote (finished runs found by an index on the
/// lifecycle's `finishedAt`) is migrated to the current version: the
/// `finished_at` column is backfilled from the lifecycle of the finished
/// runs only, the expression index is gone, and a prune on the migrated
/// schema deletes exactly the due run and its sub-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_a_version_6_schema_with_finished_runs() {
    let Some(url) = common::url_or_skip("migrates_a_version_6_schema") else {
        return;
    };
    assert_eq!(
        SCHEMA_VERSION, 7,
        "this test starts from the version before"
    );
    let schema = common::unique_schema("v6");
    let guard = common::SchemaGuard::new(&url, &schema);
    let raw = common::raw_client(&url, "public").await;
    let mut sql = format!("CREATE SCHEMA \"{schema}\"; SET search_path TO \"{schema}\";");
    for (version, body) in &runkeep_postgres::schema::MIGRATIONS[..6] {
        assert!(*version <= 6);
        sql.push_str(body);
    }
    sql.push_str(
        "CREATE TABLE runkeep_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
         INSERT INTO runkeep_schema (version) SELECT generate_series(1, 6);",
    );
    raw.batch_execute(&sql).await.unwrap();
    // Rows as version 6 wrote them: the lifecycle JSON and its status.
    let done = Lifecycle {
        status: RunStatus::Completed,
        finished_at: Some(support::at(0)),
        ..Lifecycle::default()
    };
    let failed_late = Lifecycle {
        status: RunStatus::Failed,
        finished_at: Some(support::at(KEEP_MS as i64)),
        ..Lifecycle::default()
    };
    let done_json = serde_json::to_value(&done).unwrap();
    let late_json = serde_json::to_value(&failed_late).unwrap();
    let (t, p, s) = (
        support::tenant().to_string(),
        support::project().to_string(),
        support::session().to_string(),
    );
    let insert = format!(
        "INSERT INTO \"{schema}\".runs (tenant_id, project_id, session_id, run_id, parent_id, lifecycle, status)
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    );
    for (run, parent, lifecycle, status) in [
        ("run_done", "", Some(&done_json), "completed"),
        ("run_done_sub", "run_done", Some(&done_json), "completed"),
        ("run_late", "", Some(&late_json), "failed"),
        ("run_active", "", None, "active"),
    ] {
        raw.execute(
            &insert,
            &[&t, &p, &s, &run, &parent, &lifecycle.cloned(), &status],
        )
        .await
        .unwrap();
    }
    let old_index = strings(
        &raw,
        &format!("SELECT indexdef FROM pg_indexes WHERE schemaname = '{schema}' AND indexname = 'runs_finished_by_finished_at'"),
    )
    .await;
    assert!(old_index[0].contains("lifecycle"), "{old_index:?}");

    let clock = support::store_clock();
    let store = PgStore::connect(&url, common::options(&schema, Some(clock.clone())))
        .await
        .expect("connect migrates the version-6 schema");
    let versions = strings(
        &raw,
        &format!("SELECT version::text FROM \"{schema}\".runkeep_schema ORDER BY version"),
    )
    .await;
    assert_eq!(
        versions.last().map(String::as_str),
        Some("7"),
        "{versions:?}"
    );
    assert_eq!(versions.len(), 7);
    // Backfilled from the lifecycle of each finished row; NULL when active.
    let columns = strings(
        &raw,
        &format!("SELECT run_id || '=' || coalesce(finished_at::text, 'null') FROM \"{schema}\".runs ORDER BY run_id"),
    )
    .await;
    let at = |ms: i64| support::at(ms).as_millis().to_string();
    assert_eq!(
        columns,
        vec![
            "run_active=null".to_string(),
            format!("run_done={}", at(0)),
            format!("run_done_sub={}", at(0)),
            format!("run_late={}", at(KEEP_MS as i64)),
        ]
    );
    let new_index = strings(
        &raw,
        &format!("SELECT indexdef FROM pg_indexes WHERE schemaname = '{schema}' AND indexname = 'runs_finished_by_finished_at'"),
    )
    .await;
    assert_eq!(new_index.len(), 1);
    assert!(
        new_index[0].contains("(tenant_id, finished_at)") && !new_index[0].contains("lifecycle"),
        "{new_index:?}"
    );
    // The prune on the migrated rows: run_done (and its sub-run) is due,
    // run_late is not yet, run_active never.
    clock.set(support::at(KEEP_MS as i64));
    let report = store
        .prune_finished(&support::listing(), &policy(), None, 10)
        .await
        .unwrap();
    let deleted: Vec<&str> = report.deleted.iter().map(|s| s.run_id.as_str()).collect();
    assert_eq!(deleted, vec!["run_done"], "{report:?}");
    assert_eq!(report.sub_runs_deleted, 1);
    let left = strings(
        &raw,
        &format!("SELECT run_id FROM \"{schema}\".runs ORDER BY run_id"),
    )
    .await;
    assert_eq!(left, vec!["run_active", "run_late"]);
    drop(guard);
}

/// The `finished_at` column of the run `col`.
async fn finished_at_of(raw: &tokio_postgres::Client) -> Option<i64> {
    raw.query_one(
        "SELECT finished_at FROM runs WHERE run_id = 'run_conformance_col'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Every save keeps `finished_at`: set by a finish, cleared by a reopen,
/// set again by the next finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_save_keeps_the_finished_at_column() {
    let Some(url) = common::url_or_skip("every_save_keeps_the_finished_at_column") else {
        return;
    };
    let clock = support::store_clock();
    let (store, guard) = common::store(&url, "finat", Some(clock.clone())).await;
    let raw = common::raw_client(&url, &guard.schema).await;
    let store: Arc<dyn RunStore> = Arc::new(store);
    let r = support::run("col");
    store
        .enqueue(
            &r,
            &support::checkpoint("first", 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        finished_at_of(&raw).await,
        None,
        "an enqueued run is not finished"
    );
    let lease = support::take(&store, &r, support::claim_now("w", 60_000)).await;
    assert_eq!(
        finished_at_of(&raw).await,
        None,
        "a claimed run is not finished"
    );
    store
        .finish(&r, lease.fence, &Outcome::completed(None))
        .await
        .unwrap();
    assert_eq!(finished_at_of(&raw).await, Some(support::at(0).as_millis()));
    clock.advance(1_000);
    store.reopen(&r).await.unwrap();
    assert_eq!(
        finished_at_of(&raw).await,
        None,
        "a reopened run is not finished"
    );
    let lease = support::take(&store, &r, support::claim_now("w", 60_000)).await;
    store
        .cancel(&r, Some("operator"))
        .await
        .expect("cancel the claimed run");
    let _ = lease;
    assert_eq!(
        finished_at_of(&raw).await,
        Some(support::at(1_000).as_millis())
    );
}

/// At 20 000 runs (a tenth finished, with sub-runs) every statement of a
/// batch reads an index: the scan walks `runs_finished_by_finished_at` in
/// order (no sort, no expression on the lifecycle), and the lock, sub-run
/// and delete statements go by key; nothing scans `runs` sequentially.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_batch_reads_indexes() {
    let Some(url) = common::url_or_skip("a_prune_batch_reads_indexes") else {
        return;
    };
    let clock = support::store_clock();
    let (store, guard) = common::store(&url, "ret_explain", Some(clock.clone())).await;
    let seeded: Arc<dyn RunStore> = Arc::new(store);
    finished(&seeded, &support::run("seed")).await;
    let raw = common::raw_client(&url, &guard.schema).await;
    raw.execute(
        "INSERT INTO runs (tenant_id, project_id, session_id, run_id, parent_id, lifecycle, status, finished_at)
         SELECT r.tenant_id, r.project_id, r.session_id,
                CASE WHEN g % 20 = 1 THEN 'sub_' ELSE 'run_' END || lpad(g::text, 6, '0'),
                CASE WHEN g % 20 = 1 THEN 'run_' || lpad((g - 1)::text, 6, '0') ELSE '' END,
                CASE WHEN g % 10 < 2 THEN r.lifecycle END,
                CASE WHEN g % 10 < 2 THEN 'completed' ELSE 'active' END,
                CASE WHEN g % 10 < 2 THEN r.finished_at - g END
         FROM runs r, generate_series(1, 20000) g WHERE r.run_id = $1",
        &[&support::run("seed").run_id.to_string()],
    )
    .await
    .unwrap();
    raw.batch_execute("ANALYZE runs").await.unwrap();
    // Reconnect so no cached plan predates the statistics.
    let store = PgStore::connect(&url, common::options(&guard.schema, Some(clock.clone())))
        .await
        .unwrap();
    clock.advance(KEEP_MS as i64);
    for scope in [ListingScope::tenant(support::tenant()), support::listing()] {
        let plan = store
            .explain_prune_finished(&scope, &policy(), None, 100)
            .await
            .unwrap();
        eprintln!("EXPLAIN prune_finished ({scope}):\n{plan}");
        let section = |name: &str| {
            let start = plan.find(&format!("-- {name}\n")).unwrap();
            let rest = &plan[start + 4 + name.len()..];
            rest[..rest.find("\n-- ").unwrap_or(rest.len())].to_string()
        };
        let scan = section("scan");
        assert!(
            scan.contains("Index Scan using runs_finished_by_finished_at"),
            "{scan}"
        );
        assert!(!scan.contains("Sort"), "the scan sorts:\n{scan}");
        assert!(!scan.contains("finishedAt"), "{scan}");
        let lock = section("lock");
        assert!(lock.contains("runs_pkey"), "{lock}");
        let subs = section("sub-runs");
        assert!(subs.contains("runs_sub_runs_by_parent"), "{subs}");
        let delete = section("delete");
        assert!(delete.contains("runs_pkey"), "{delete}");
        assert!(!plan.contains("Seq Scan on runs"), "{plan}");
    }
}

/// Backends of this schema waiting for a row lock in the prune's lock
/// statement, blocked by a transaction that holds a lock on `runs`.
async fn prune_lock_waiters(raw: &tokio_postgres::Client) -> i64 {
    raw.query_one(
        "SELECT count(*) FROM pg_stat_activity a
         WHERE a.wait_event_type = 'Lock'
           AND a.query LIKE '%FOR UPDATE OF r%' AND a.query LIKE '%r.parent_id = ''''%'
           AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'runs'::regclass)
           AND EXISTS (SELECT 1 FROM pg_locks l
                       WHERE l.pid = ANY (pg_blocking_pids(a.pid))
                         AND l.relation = 'runs'::regclass AND l.granted)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// The prune's scan has chosen a finished run as due; another store (its
/// own connection) reopens it and has its row locked, its `COMMIT` held
/// by a proxy. The prune waits for that lock (seen in `pg_locks`); the
/// reopen commits; the prune reads the reopened run and keeps it, while
/// the other due run of the same batch is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reopened_between_the_scan_and_the_delete_is_kept() {
    let Some(url) = common::url_or_skip("a_run_reopened_between_the_scan_and_the_delete") else {
        return;
    };
    let clock: ManualClock = support::store_clock();
    let (store, guard) = common::store(&url, "ret_reopen", Some(clock.clone())).await;
    let store: Arc<dyn RunStore> = Arc::new(store);
    let reopened = support::run("reopened");
    let other = support::run("other");
    finished(&store, &reopened).await;
    finished(&store, &other).await;
    clock.advance(KEEP_MS as i64);

    let target = url
        .split_once('@')
        .map(|(_, r)| r)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    let proxy = Proxy::start(&target).await;
    let via_proxy = PgStore::connect(
        &proxy.url(&url),
        common::options(&guard.schema, Some(clock.clone())),
    )
    .await
    .unwrap();
    let raw = common::raw_client(&url, &guard.schema).await;

    // The reopen: its row lock taken, its COMMIT held.
    proxy.arm(CommitFault::Hold);
    let reopen = {
        let r = reopened.clone();
        tokio::spawn(async move { via_proxy.reopen(&r).await })
    };
    wait_until("the reopen's COMMIT is held", || async {
        proxy.held() == 1
    })
    .await;

    // The prune: its scan still sees the run finished (the reopen has not
    // committed), so it is a candidate; its lock waits for the reopen.
    let prune = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .prune_finished(&support::listing(), &policy(), None, 10)
                .await
        })
    };
    wait_until("the prune waits for the reopen's row lock", || async {
        prune_lock_waiters(&raw).await == 1
    })
    .await;
    assert!(!prune.is_finished());
    proxy.release();
    let l = reopen.await.unwrap().expect("the reopen commits");
    assert_eq!(l.status, RunStatus::Active);
    let report = prune.await.unwrap().expect("the prune batch");
    assert_eq!(report.scanned, 2, "the scan chose both runs: {report:?}");
    let deleted: Vec<&RunScope> = report.deleted.iter().collect();
    assert_eq!(deleted, vec![&other], "{report:?}");
    assert_eq!(
        store.lifecycle(&reopened).await.unwrap().status,
        RunStatus::Active,
        "the reopened run is kept"
    );
    assert!(
        store.list_checkpoints(&reopened).await.unwrap().len() == 1,
        "with its evidence"
    );
    assert!(store.list_checkpoints(&other).await.unwrap().is_empty());
}

/// Polls `cond` until it holds (a bounded wait for another task or
/// backend to reach a state; no timing is asserted).
async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..3_000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// `(n_tup_upd, n_tup_hot_upd)` of this schema's `runs`, once the
/// statistics count at least `updates` updates (each backend reports its
/// counts when idle, within about 10 s: this waits for them, it does not
/// time anything).
async fn runs_updates(raw: &tokio_postgres::Client, schema: &str, updates: i64) -> (i64, i64) {
    for _ in 0..600 {
        let row = raw
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'runs'",
                &[&schema],
            )
            .await
            .unwrap();
        let (upd, hot): (i64, i64) = (row.get(0), row.get(1));
        if upd >= updates {
            return (upd, hot);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the statistics never counted {updates} updates of {schema}.runs");
}

/// A claim that takes over a lapsed lease rewrites the lifecycle (it
/// counts the attempt), and since version 7 no index of `runs` reads the
/// lifecycle: every such claim is a heap-only update. (Version 5's index on
/// the lifecycle's `finishedAt` made each one add an entry to every index
/// of the table.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_claims_are_heap_only_updates() {
    let Some(url) = common::url_or_skip("takeover_claims_are_heap_only_updates") else {
        return;
    };
    let clock = support::store_clock();
    let (store, guard) = common::store(&url, "ret_hot", Some(clock.clone())).await;
    let store: Arc<dyn RunStore> = Arc::new(store);
    let raw = common::raw_client(&url, &guard.schema).await;
    let r = support::run("hot");
    store
        .enqueue(
            &r,
            &support::checkpoint("first", 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    support::take(&store, &r, support::claim_now("w0", 1_000)).await;
    let (upd0, hot0) = runs_updates(&raw, &guard.schema, 2).await;
    const CLAIMS: i64 = 10;
    for i in 1..=CLAIMS {
        clock.advance(2_000);
        support::take(&store, &r, support::claim_now(&format!("w{i}"), 1_000)).await;
    }
    assert_eq!(
        store.lifecycle(&r).await.unwrap().attempts,
        CLAIMS as u32,
        "each takeover rewrote the lifecycle"
    );
    let (upd, hot) = runs_updates(&raw, &guard.schema, upd0 + CLAIMS).await;
    assert_eq!(upd - upd0, CLAIMS, "one update per claim");
    assert_eq!(
        hot - hot0,
        CLAIMS,
        "every takeover claim is heap-only ({upd0}/{hot0} before, {upd}/{hot} after)"
    );
}
