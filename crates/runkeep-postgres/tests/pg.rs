//! PostgreSQL-specific guarantees: migrations (refusal of a newer schema,
//! two migrators at once), the payload limit, tenant isolation across every
//! operation, skewed client clocks, index use at 100 000 runs, LISTEN/NOTIFY
//! wake-ups and a backend terminated mid-operation.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Error, EvidenceStore,
    ListOptions, ListOrder, ListingScope, ManualClock, NewAuditEvent, ParkResolution,
    ReadEventsOptions, RunScope, Step, Timestamp, Ttl, WatchTopic,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore, SCHEMA_VERSION};
use serde_json::json;

fn claim(name: &str, ttl_ms: u64) -> ClaimOptions {
    ClaimOptions::new(support::holder(name), Ttl::from_millis(ttl_ms).unwrap())
}

/// The storage options of `schema`'s `runs` table.
async fn runs_options(raw: &tokio_postgres::Client, schema: &str) -> Vec<String> {
    let r: Option<Vec<String>> = raw
        .query_one(
            "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'runs'",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    r.unwrap_or_default()
}

/// A schema a version-1 binary created is brought to the current version
/// on connect, keeping its runs; version 2 leaves `runs` pages 30 % free
/// (heap-only updates for claims), which a fresh schema has too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_a_version_1_schema_and_keeps_its_runs() {
    let Some(url) = common::url_or_skip("migrates_a_version_1_schema") else {
        return;
    };
    let schema = common::unique_schema("v1");
    let guard = common::SchemaGuard::new(&url, &schema);
    let raw = common::raw_client(&url, "public").await;
    let (version, v1) = runkeep_postgres::schema::MIGRATIONS[0];
    assert_eq!(version, 1);
    raw.batch_execute(&format!(
        "CREATE SCHEMA \"{schema}\"; SET search_path TO \"{schema}\"; {v1}
         CREATE TABLE runkeep_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
         INSERT INTO runkeep_schema (version) VALUES (1);
         INSERT INTO runs (tenant_id, project_id, session_id, run_id) VALUES ('{}', '{}', '{}', 'run_old');",
        support::tenant(),
        support::project(),
        support::session(),
    ))
    .await
    .unwrap();
    assert!(runs_options(&raw, &schema).await.is_empty());
    let store = PgStore::connect(&url, common::options(&schema, None))
        .await
        .expect("connect migrates the version-1 schema");
    assert_eq!(
        runs_options(&raw, &schema).await,
        vec!["fillfactor=70".to_string()]
    );
    let versions: Vec<i32> = raw
        .query(
            &format!("SELECT version FROM \"{schema}\".runkeep_schema ORDER BY version"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, applied_versions());
    // The old run is still there and still claimable.
    let old = RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        "run_old".parse().unwrap(),
    );
    let got = store.claim(&old, &claim("w", 60_000)).await.unwrap();
    assert!(matches!(got, ClaimOutcome::Acquired(_)), "{got:?}");
    // A fresh schema is created at the same settings.
    let (_fresh, fresh_guard) = common::store(&url, "v2", None).await;
    assert_eq!(
        runs_options(&raw, &fresh_guard.schema).await,
        vec!["fillfactor=70".to_string()]
    );
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_schema_at_a_newer_version_than_the_binary() {
    let Some(url) = common::url_or_skip("refuses_a_schema_at_a_newer_version") else {
        return;
    };
    let (store, guard) = common::store(&url, "newer", None).await;
    drop(store);
    let raw = common::raw_client(&url, &guard.schema).await;
    raw.execute(
        "INSERT INTO runkeep_schema (version) VALUES ($1)",
        &[&(SCHEMA_VERSION + 1)],
    )
    .await
    .unwrap();
    let err = PgStore::connect(&url, common::options(&guard.schema, None))
        .await
        .expect_err("a newer schema must be refused");
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(
        msg.contains(&format!("version {}", SCHEMA_VERSION + 1)) && msg.contains("upgrade runkeep"),
        "{msg}"
    );
    // A store built without migrating refuses on its first connection too.
    let lazy = PgStore::open_migrated(&url, common::options(&guard.schema, None)).unwrap();
    let err = lazy
        .lifecycle(&support::run("run_any"))
        .await
        .expect_err("every pooled connection checks the version");
    assert!(err.to_string().contains("newer than version"), "{err}");
    // Nothing was migrated over it: the newer row is still the newest.
    let n: i64 = raw
        .query_one("SELECT count(*) FROM runkeep_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, i64::try_from(applied_versions().len()).unwrap() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_migrators_at_once_serialize_on_the_advisory_lock() {
    let Some(url) = common::url_or_skip("two_migrators_at_once") else {
        return;
    };
    let schema = common::unique_schema("mig");
    let guard = common::SchemaGuard::new(&url, &schema);
    // Hold the migration lock ourselves, so both migrators must queue on it.
    let (mut holder, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("the server is reachable");
    tokio::spawn(conn);
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('runkeep-migrate:' || $1::text, 0))",
        &[&schema],
    )
    .await
    .unwrap();
    let opts = common::options(&schema, None);
    let a = tokio::spawn({
        let (u, o) = (url.clone(), opts.clone());
        async move { PgStore::migrate(&u, &o).await }
    });
    let b = tokio::spawn({
        let (u, o) = (url.clone(), opts.clone());
        async move { PgStore::migrate(&u, &o).await }
    });
    // Both are now waiting on the advisory lock (proved, not hoped).
    let (watcher, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the two migrators never both waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.unwrap();
    let (ra, rb) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(ra.expect("first migrator"), SCHEMA_VERSION);
    assert_eq!(rb.expect("second migrator"), SCHEMA_VERSION);
    let raw = common::raw_client(&url, &guard.schema).await;
    let versions: Vec<i32> = raw
        .query("SELECT version FROM runkeep_schema ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        applied_versions(),
        "each migration is applied exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_a_payload_over_the_limit_and_stores_nothing() {
    let Some(url) = common::url_or_skip("refuses_a_payload_over_the_limit") else {
        return;
    };
    let schema = common::unique_schema("limit");
    let _guard = common::SchemaGuard::new(&url, &schema);
    let store = PgStore::connect(
        &url,
        PgOptions {
            max_payload_bytes: 4096,
            ..common::options(&schema, None)
        },
    )
    .await
    .unwrap();
    let scope = support::run("run_big");
    let mut cp = support::checkpoint("cp_big", 0);
    cp.state.insert("blob".into(), json!("x".repeat(5000)));
    let err = store.write_checkpoint(&scope, &cp, None).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(err.to_string().contains("max_payload_bytes"), "{err}");
    assert!(store.list_checkpoints(&scope).await.unwrap().is_empty());
    let mut payload = serde_json::Map::new();
    payload.insert("blob".into(), json!("y".repeat(5000)));
    let err = store
        .append_events(&scope, &[runkeep::NewEvent::new("big", payload)], None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_payload_bytes"), "{err}");
    let mut read = None;
    for _ in 0..6 {
        match store
            .read_events(&scope, &ReadEventsOptions::default())
            .await
        {
            Ok(b) => {
                read = Some(b);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
    }
    assert_eq!(read.expect("the pool never recovered").last_seq, 0);
    // Just under the limit is stored whole (never truncated).
    let mut ok = support::checkpoint("cp_ok", 0);
    ok.state.insert("blob".into(), json!("z".repeat(3000)));
    store.write_checkpoint(&scope, &ok, None).await.unwrap();
    let back = store
        .read_checkpoint(&scope, &ok.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.state["blob"].as_str().unwrap().len(), 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measures_large_payloads() {
    let Some(url) = common::url_or_skip("measures_large_payloads") else {
        return;
    };
    let (store, _guard) = common::store(&url, "large", None).await;
    let scope = support::run("run_large");
    for mib in [1usize, 8] {
        let mut cp = support::checkpoint(&format!("cp_{mib}"), 0);
        cp.state
            .insert("blob".into(), json!("x".repeat(mib * 1024 * 1024)));
        let t = Instant::now();
        store.write_checkpoint(&scope, &cp, None).await.unwrap();
        let w = t.elapsed();
        let t = Instant::now();
        let back = store
            .read_checkpoint(&scope, &cp.id)
            .await
            .unwrap()
            .unwrap();
        let r = t.elapsed();
        assert_eq!(
            back.state["blob"].as_str().unwrap().len(),
            mib * 1024 * 1024
        );
        eprintln!("payload {mib} MiB: write {w:?}, read {r:?}");
    }
}

/// Every operation tenant B can address with tenant A's run id (and A's
/// fence) answers as for a run that does not exist, and changes nothing of
/// A's run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_can_never_reach_another_tenants_run_by_a_guessed_id() {
    let Some(url) = common::url_or_skip("tenant_isolation") else {
        return;
    };
    let (store, guard) = common::store(&url, "tenant", None).await;
    let a = support::run("run_shared_name");
    let mut b = a.clone();
    b.tenant_id = support::other_tenant();
    // Tenant A: a run with a lease, checkpoints (one parked), events,
    // documents and audit.
    let lease = store
        .claim(&a, &claim("alice", 600_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let f = lease.fence;
    let cp1 = support::checkpoint("cp_1", 0);
    let id1 = cp1.id.clone();
    store.write_checkpoint(&a, &cp1, Some(f)).await.unwrap();
    let parked = support::parked("cp_2", 1, 1, None);
    let id2 = parked.id.clone();
    store.write_checkpoint(&a, &parked, Some(f)).await.unwrap();
    store
        .append_events(&a, &[support::event("e", json!({"n": 1}))], Some(f))
        .await
        .unwrap();
    store
        .write_report(&a, "report of a", Some(f))
        .await
        .unwrap();
    store
        .write_messages(&a, &[json!({"m": 1})], 1, Some(f))
        .await
        .unwrap();
    store
        .append_audit(&a, &[NewAuditEvent::new("operator", "act", "ok")], Some(f))
        .await
        .unwrap();
    let before = support::read_back(
        &(Arc::new(store) as Arc<dyn runkeep::RunStore>),
        &a,
        support::at(0),
    )
    .await;
    let store = PgStore::connect(&url, common::options(&guard.schema, None))
        .await
        .unwrap();
    let s: Arc<dyn runkeep::RunStore> = Arc::new(store);
    let now = s.now();

    // Reads under B see nothing.
    assert!(s.read_checkpoint(&b, &id1).await.unwrap().is_none());
    assert!(s.list_checkpoints(&b).await.unwrap().is_empty());
    assert!(s.latest_checkpoint(&b).await.unwrap().is_none());
    assert!(s.find_pending(&b, now).await.unwrap().is_none());
    assert!(s.resume_point(&b, now).await.unwrap().is_none());
    assert!(s.lease(&b, now).await.unwrap().is_none());
    assert_eq!(
        s.lifecycle(&b).await.unwrap(),
        runkeep::Lifecycle::default()
    );
    let ev = s
        .read_events(&b, &ReadEventsOptions::default())
        .await
        .unwrap();
    assert!(ev.events.is_empty() && ev.last_seq == 0);
    assert!(s.read_run_record(&b).await.unwrap().is_none());
    assert_eq!(
        s.read_messages(&b).await.unwrap(),
        runkeep::MessageSnapshot::Unavailable
    );
    assert!(s.read_report(&b).await.unwrap().is_none());
    assert!(s.read_audit(&b, 0).await.unwrap().is_empty());
    let b_listing = ListingScope::tenant(b.tenant_id.clone());
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        let page = s
            .list_runs(
                &b_listing,
                &ListOptions {
                    order,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(page.entries.is_empty(), "{page:?}");
    }
    assert!(s
        .claim_next(
            &b_listing,
            &ClaimNextFilter::default(),
            &claim("mallory", 60_000)
        )
        .await
        .unwrap()
        .is_none());

    // Writes under B with A's fence: never issued for B's run.
    let invalid = |r: runkeep::Result<()>, what: &str| match r {
        Err(Error::InvalidInput { .. }) => {}
        other => panic!("{what} across tenants answered {other:?}"),
    };
    invalid(
        s.write_checkpoint(&b, &support::checkpoint("cp_x", 2), Some(f))
            .await
            .map(drop),
        "write_checkpoint",
    );
    invalid(
        s.append_events(&b, &[support::event("e", json!({}))], Some(f))
            .await
            .map(drop),
        "append_events",
    );
    invalid(s.write_report(&b, "x", Some(f)).await, "write_report");
    invalid(
        s.write_messages(&b, &[], 0, Some(f)).await,
        "write_messages",
    );
    invalid(
        s.write_run_record(&b, &serde_json::Map::new(), Some(f))
            .await,
        "write_run_record",
    );
    invalid(
        s.append_audit(&b, &[NewAuditEvent::new("operator", "act", "ok")], Some(f))
            .await
            .map(drop),
        "append_audit",
    );
    invalid(
        s.delete_checkpoint(&b, &id1, Some(f)).await.map(drop),
        "delete_checkpoint",
    );
    invalid(
        s.finish(&b, f, &runkeep::Outcome::completed(None))
            .await
            .map(drop),
        "finish",
    );
    let step = Step {
        events: vec![support::event("e", json!({}))],
        ..Step::default()
    };
    invalid(s.commit_step(&b, f, &step).await.map(drop), "commit_step");
    assert!(matches!(
        s.resolve_park(&b, &id2, ParkResolution::Answer(json!("ok")), now, None)
            .await,
        Err(Error::NotFound { .. })
    ));
    assert!(!s.release(&b, f).await.unwrap());
    assert!(!s.snooze(&b, f, support::at(1)).await.unwrap());
    assert!(matches!(s.reopen(&b).await, Err(Error::NotFound { .. })));
    assert!(!s.delete_checkpoint(&b, &id1, None).await.unwrap());
    assert!(s.prune_checkpoints(&b, 0, None).await.unwrap().is_empty());
    // B's own claim of "its" run starts at fence 1: A's fences are not B's.
    let lb = s
        .claim(&b, &claim("mallory", 60_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(lb.fence.get(), 1);

    // A's run is exactly as it was, and the tables hold nothing else of B.
    let after = support::read_back(&s, &a, support::at(0)).await;
    assert_eq!(before, after);
    let raw = common::raw_client(&url, &guard.schema).await;
    for table in ["checkpoints", "events", "audit"] {
        let n: i64 = raw
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE tenant_id = $1"),
                &[&b.tenant_id.to_string()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "{table} holds rows of tenant B");
    }
}

/// Two clients whose machine clocks are 20 minutes apart never both hold a
/// live lease: the server's clock judges, not theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_skewed_clocks_never_both_hold_a_live_lease() {
    let Some(url) = common::url_or_skip("skewed_clocks") else {
        return;
    };
    let (first, guard) = common::store(&url, "skew", None).await;
    drop(first);
    let real = Timestamp::now();
    let behind = ManualClock::new(real.offset(-10 * 60_000));
    let ahead = ManualClock::new(real.offset(10 * 60_000));
    let open = |clock: ManualClock| {
        let url = url.clone();
        let schema = guard.schema.clone();
        async move {
            PgStore::connect(
                &url,
                PgOptions {
                    local_clock: Arc::new(clock),
                    ..common::options(&schema, None)
                },
            )
            .await
            .unwrap()
        }
    };
    let slow = open(behind.clone()).await;
    let fast = open(ahead.clone()).await;
    // Their `now()` agree (both corrected to the server) within a second's
    // worth of round trips, though their machines are 20 minutes apart.
    let gap = (slow.now().as_millis() - fast.now().as_millis()).abs();
    assert!(gap < 30_000, "store clocks differ by {gap} ms");
    let scope = support::run("run_skew");
    store_checkpoint(&slow, &scope).await;
    // The slow client takes a 2-minute lease; to the fast client's machine
    // it expired 8 minutes ago.
    let lease = slow
        .claim(&scope, &claim("slow", 120_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    match fast.claim(&scope, &claim("fast", 120_000)).await.unwrap() {
        ClaimOutcome::Held(s) => assert_eq!(s.fence, lease.fence),
        other => panic!("the fast client took a live lease: {other:?}"),
    }
    assert!(fast
        .claim_next(
            &scope.session_scope(),
            &ClaimNextFilter::default(),
            &claim("fast", 120_000)
        )
        .await
        .unwrap()
        .is_none());
    // And the other way round: the fast client's lease is not cut short
    // for the slow one.
    assert!(slow.release(&scope, lease.fence).await.unwrap());
    let lease = fast
        .claim(&scope, &claim("fast", 120_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    assert!(matches!(
        slow.claim(&scope, &claim("slow", 120_000)).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    // The slow client's writes under its superseded fence stay refused.
    support::expect_fenced_out(
        slow.write_checkpoint(
            &scope,
            &support::checkpoint("cp_late", 5),
            Some(runkeep::Fence::FIRST),
        )
        .await,
        runkeep::Fence::FIRST,
        lease.fence,
    );
    assert!(lease.expires_at > slow.now());
}

async fn store_checkpoint(store: &PgStore, scope: &RunScope) {
    store
        .write_checkpoint(scope, &support::checkpoint("cp_0", 0), None)
        .await
        .unwrap();
}

/// At 100 000 runs, the listing (both orders, with filters, after a cursor)
/// and claim_next's candidate search read an index, never scan the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_and_claims_from_indexes_at_100_000_runs() {
    let Some(url) = common::url_or_skip("explain_at_100k") else {
        return;
    };
    let (store, guard) = common::store(&url, "explain", None).await;
    // One real run gives a real digest to copy.
    let seed = support::run("run_seed");
    store_checkpoint(&store, &seed).await;
    let raw = common::raw_client(&url, &guard.schema).await;
    let t = Instant::now();
    raw.execute(
        "INSERT INTO runs (tenant_id, project_id, session_id, run_id, parent_id, digest, checkpoint_count, created_rank, created_stamp, status, top_kind, top_fence, holder, expires_at)
         SELECT r.tenant_id, r.project_id, r.session_id, 'run_' || lpad(g::text, 6, '0'), '', r.digest, 1,
                (g % 2)::smallint, g, CASE WHEN g % 10 = 0 THEN 'completed' ELSE 'active' END,
                CASE WHEN g % 3 = 0 THEN 1 END, CASE WHEN g % 3 = 0 THEN 1 END,
                CASE WHEN g % 3 = 0 THEN 'w' END, CASE WHEN g % 3 = 0 THEN 9000000000000 END
         FROM runs r, generate_series(1, 100000) g WHERE r.run_id = $1",
        &[&seed.run_id.to_string()],
    )
    .await
    .unwrap();
    raw.batch_execute("ANALYZE runs").await.unwrap();
    eprintln!("seeded 100 000 runs in {:?}", t.elapsed());
    let tenant = ListingScope::tenant(support::tenant());
    let session = support::listing();
    let first = store
        .list_runs(
            &tenant,
            &ListOptions {
                limit: Some(50),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(first.entries.len(), 50);
    let cases: Vec<(&str, ListingScope, ListOptions)> = vec![
        (
            "run-id order",
            tenant.clone(),
            ListOptions {
                limit: Some(50),
                ..Default::default()
            },
        ),
        (
            "run-id order after a cursor",
            tenant.clone(),
            ListOptions {
                limit: Some(50),
                cursor: first.cursor.clone(),
                ..Default::default()
            },
        ),
        (
            "created-at order",
            tenant.clone(),
            ListOptions {
                order: ListOrder::CreatedAt,
                limit: Some(50),
                ..Default::default()
            },
        ),
        (
            "session scope, unclaimed, active",
            session.clone(),
            ListOptions {
                claimed: Some(false),
                status: Some(vec![runkeep::RunStatus::Active]),
                limit: Some(50),
                ..Default::default()
            },
        ),
        (
            "park filter",
            tenant.clone(),
            ListOptions {
                park: Some(vec![runkeep::ParkState::Outstanding]),
                limit: Some(50),
                ..Default::default()
            },
        ),
    ];
    for (what, scope, options) in cases {
        let plan = store.explain_list_runs(&scope, &options).await.unwrap();
        eprintln!("EXPLAIN list_runs ({what}):\n{plan}");
        assert!(
            plan.contains("Index Scan using runs_") || plan.contains("Index Only Scan using runs_"),
            "{what}: no index scan:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan"),
            "{what}: sequential scan:\n{plan}"
        );
        assert!(
            !plan.contains("checkpoints"),
            "{what}: reads checkpoints:\n{plan}"
        );
        let t = Instant::now();
        store.list_runs(&scope, &options).await.unwrap();
        eprintln!("list_runs ({what}) page of 50: {:?}", t.elapsed());
    }
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        let filter = ClaimNextFilter { order, park: None };
        let plan = store.explain_claim_next(&tenant, &filter).await.unwrap();
        eprintln!("EXPLAIN claim_next ({order:?}):\n{plan}");
        // The heads statement (version 6): the first unkeyed run and the
        // keyed groups' first runs, from their indexes.
        assert!(
            plan.contains("Index Scan using runs_unkeyed_by_")
                && plan.contains("runs_keyed_by_")
                && !plan.contains("runs_runnable_by_"),
            "claim_next: not the heads' indexes:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan"),
            "claim_next: sequential scan:\n{plan}"
        );
        let t = Instant::now();
        let got = store
            .claim_next(&tenant, &filter, &claim("w2", 60_000))
            .await
            .unwrap();
        assert!(got.is_some());
        eprintln!("claim_next ({order:?}) at 100 000 runs: {:?}", t.elapsed());
    }
}

/// A change committed on another connection (another store, as another
/// process would be) wakes a watcher through LISTEN/NOTIFY, long before its
/// fallback poll could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_connections_change_wakes_a_watcher() {
    let Some(url) = common::url_or_skip("listen_notify") else {
        return;
    };
    let (watcher_store, guard) = common::store(&url, "watch", None).await;
    let fallback = Duration::from_secs(120);
    let watcher_store = PgStore::connect(
        &url,
        PgOptions {
            watch_fallback: fallback,
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .unwrap_or(watcher_store);
    let writer = PgStore::connect(&url, common::options(&guard.schema, None))
        .await
        .unwrap();
    let scope = support::run("run_watch");
    let mut events = watcher_store.watch(&WatchTopic::Events(scope.clone()));
    let mut runnable = watcher_store.watch(&WatchTopic::Runnable(support::listing()));
    assert!(!events.is_polling() && events.interval() == fallback);
    // Give the listener its LISTEN (it starts with the store), proved by
    // the server: a backend of ours is listening.
    let raw = common::raw_client(&url, &guard.schema).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = raw
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN runkeep_%' AND query LIKE '%' || $1 || '%' AND state = 'idle'", &[&guard.schema])
            .await
            .unwrap()
            .get(0);
        if n >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the listener never ran LISTEN");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut latencies = Vec::new();
    let mut appends = Vec::new();
    for i in 0..5 {
        let t = Instant::now();
        writer
            .append_events(&scope, &[support::event("tick", json!({"i": i}))], None)
            .await
            .unwrap();
        let committed = t.elapsed();
        appends.push(committed);
        tokio::time::timeout(Duration::from_secs(30), events.changed())
            .await
            .expect("the watcher was not woken by the other connection's append");
        latencies.push(t.elapsed());
    }
    tokio::time::timeout(Duration::from_secs(30), runnable.changed())
        .await
        .expect("the runnable watcher was not woken");
    eprintln!(
        "LISTEN/NOTIFY: from the start of another connection's append to the watcher's wake-up: {latencies:?} (the appends' own round trips: {appends:?})"
    );
}

/// A backend terminated while the operation waits inside its transaction
/// answers a retryable error, stores nothing, and the pool recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_terminated_mid_operation_is_retryable_and_the_pool_recovers() {
    let Some(url) = common::url_or_skip("terminated_backend") else {
        return;
    };
    let app = common::unique_schema("app");
    let sep = if url.contains('?') { '&' } else { '?' };
    let app_url = format!("{url}{sep}application_name={app}");
    let (store, guard) = common::store(&app_url, "term", None).await;
    let store = Arc::new(store);
    let scope = support::run("run_term");
    let lease = store
        .claim(&scope, &claim("w", 600_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    // Hold the run's row lock from outside, so the store's write waits in
    // its transaction.
    let (mut locker, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    locker
        .batch_execute(&format!("SET search_path TO \"{}\"", guard.schema))
        .await
        .unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE",
        &[&scope.run_id.to_string()],
    )
    .await
    .unwrap();
    let write = tokio::spawn({
        let store = store.clone();
        let scope = scope.clone();
        async move {
            store
                .append_events(&scope, &[support::event("e", json!({}))], Some(lease.fence))
                .await
        }
    });
    // Wait until the write is blocked on the lock, then terminate it.
    let raw = common::raw_client(&url, &guard.schema).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let killed: i64 = raw
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[&app],
            )
            .await
            .unwrap()
            .get(0);
        if killed > 0 {
            break;
        }
        if Instant::now() >= deadline {
            let act: Vec<String> = raw
                .query("SELECT coalesce(application_name, '') || ' ' || coalesce(wait_event_type, '-') || ' ' || coalesce(query, '') FROM pg_stat_activity", &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            panic!("the write never waited on the row lock: {act:#?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let err = tokio::time::timeout(Duration::from_secs(30), write)
        .await
        .expect("the cut operation hangs")
        .unwrap()
        .expect_err("the terminated operation cannot succeed");
    assert!(err.is_retryable(), "{err:?}");
    tx.rollback().await.unwrap();
    // Nothing of it landed; every pooled connection is then killed too, and
    // the pool still serves (after at most one retryable failure per dead
    // connection it hands out).
    let mut read = None;
    for _ in 0..6 {
        match store
            .read_events(&scope, &ReadEventsOptions::default())
            .await
        {
            Ok(b) => {
                read = Some(b);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
    }
    assert_eq!(read.expect("the pool never recovered").last_seq, 0);
    raw.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .await
    .unwrap();
    let mut last = None;
    for _ in 0..6 {
        match store
            .append_events(&scope, &[support::event("e", json!({}))], Some(lease.fence))
            .await
        {
            Ok(e) => {
                last = Some(e);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
    }
    let e = last.expect("the pool never recovered");
    assert_eq!(e[0].seq, 1, "the cut append left no sequence number behind");
}

/// The versions a fresh schema records: every migration's, in order
/// (versions are not contiguous while parallel branches take theirs).
fn applied_versions() -> Vec<i32> {
    runkeep_postgres::schema::MIGRATIONS
        .iter()
        .map(|(v, _)| *v)
        .collect()
}
