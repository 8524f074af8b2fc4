//! runkeep behind pgbouncer in **transaction** pool mode
//! (`common::pgbouncer`): the refusals that say what to configure (no
//! `PgOptions::direct_url`; a role without runkeep's settings), then a drain
//! of several stores sharing fewer server sessions than they have client
//! connections, with watches woken through the direct `LISTEN` connection.
//! The conformance kit through the pooler is `conformance_pooled.rs`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::pgbouncer::{self, Bouncer, RoleGuard};
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions,
    Error, EvidenceStore, Holder, ListingScope, NewEvent, Outcome, ReadEventsOptions, RunScope,
    RunStatus, Step, Timestamp, Ttl, WatchTopic,
};
use runkeep_postgres::{role_settings, PgOptions, PgStore};
use serde_json::{json, Map};

const RUNS: usize = 120;
const STORES: usize = 3;
const WORKERS_PER_STORE: usize = 2;

/// Whether `schema` exists on the server.
async fn schema_exists(url: &str, schema: &str) -> bool {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .query_one("SELECT to_regnamespace($1) IS NOT NULL", &[&schema])
        .await
        .unwrap()
        .get(0)
}

/// A role for `schema` with the settings `options` need (or none), listed
/// in `b`; answers (pooled URL, direct URL, guard).
async fn role_for(
    url: &str,
    b: &Bouncer,
    schema: &str,
    options: Option<&PgOptions>,
) -> (String, String, RoleGuard) {
    let (_, _, database) = pgbouncer::target(url);
    let settings = options.map_or_else(Vec::new, |o| role_settings(o, schema, &database));
    let guard = RoleGuard::create(url, schema, &settings);
    b.add_role(schema).await;
    (
        pgbouncer::with_user_port(url, schema, Some(b.port)),
        pgbouncer::with_user_port(url, schema, None),
        guard,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_reached_without_a_direct_url_is_refused_saying_what_to_set() {
    let Some(url) = common::url_or_skip("pooler_refused") else {
        return;
    };
    let b = Bouncer::start(&url).await;
    let schema = common::unique_schema("poolno");
    let _schema_guard = common::SchemaGuard::new(&url, &schema);
    let options = common::options(&schema, None);
    let (pooled, _direct, _role) = role_for(&url, &b, &schema, Some(&options)).await;
    let Err(e) = PgStore::connect(&pooled, options).await else {
        panic!("a store on a pooler without direct_url must be refused");
    };
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("unsupported startup parameter") && m.contains("PgOptions::direct_url"),
        "{m}"
    );
    assert!(
        !schema_exists(&url, &schema).await,
        "a refused connect changes nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_settings_is_refused_with_the_statements_that_fix_it() {
    let Some(url) = common::url_or_skip("pooler_settings") else {
        return;
    };
    let schema = common::unique_schema("poolset");
    let _schema_guard = common::SchemaGuard::new(&url, &schema);
    let options = PgOptions {
        statement_timeout: Duration::from_secs(20),
        ..common::options(&schema, None)
    };
    let (database, fix) = {
        let b = Bouncer::start(&url).await;
        let (pooled, direct, role) = role_for(&url, &b, &schema, None).await;
        let with_direct = PgOptions {
            direct_url: Some(direct.clone()),
            ..options.clone()
        };
        let Err(e) = PgStore::connect(&pooled, with_direct).await else {
            panic!("a role without runkeep's settings must be refused");
        };
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        let m = e.to_string();
        let (_, _, database) = pgbouncer::target(&url);
        let fix = role_settings(&options, &schema, &database);
        assert!(
            m.contains("statement_timeout is \"0\", not \"20000\""),
            "{m}"
        );
        for statement in &fix {
            assert!(
                m.contains(statement.as_str()),
                "{statement} missing in: {m}"
            );
        }
        (database, (fix, pooled, direct, role))
    };
    let (fix, _, direct, _role) = fix;
    // Do what the message says (on PostgreSQL), then a pooler whose server
    // sessions start after it.
    pgbouncer::run_direct(&url, &fix.join(" ")).unwrap();
    let b = Bouncer::start(&url).await;
    b.add_role(&schema).await;
    let pooled = pgbouncer::with_user_port(&url, &schema, Some(b.port));
    let store = PgStore::connect(
        &pooled,
        PgOptions {
            direct_url: Some(direct),
            ..options
        },
    )
    .await
    .unwrap_or_else(|e| panic!("configured as told ({database}), it connects: {e}"));
    let scope = runkeep_conformance::support::run("run_fixed");
    let lease = store
        .claim(
            &scope,
            &ClaimOptions::new(Holder::new("w").unwrap(), Ttl::from_millis(60_000).unwrap()),
        )
        .await
        .unwrap()
        .lease()
        .unwrap();
    store
        .append_events(&scope, &[event("e", "w", 1)], Some(lease.fence))
        .await
        .unwrap();
}

fn run(i: usize) -> RunScope {
    RunScope::new(
        "tnt_pool".parse().unwrap(),
        "prj_pool".parse().unwrap(),
        "ses_pool".parse().unwrap(),
        format!("run_{i:04}").parse().unwrap(),
    )
}

fn event(kind: &str, holder: &str, step: u32) -> NewEvent {
    let mut p = Map::new();
    p.insert("holder".into(), json!(holder));
    p.insert("step".into(), json!(step));
    NewEvent::new(kind, p)
}

fn checkpoint(id: &str) -> Checkpoint {
    Checkpoint::new(
        CheckpointId::new(id).unwrap(),
        Timestamp::from_millis(1_700_000_000_000).unwrap(),
        Map::new(),
    )
}

/// One worker: claims, writes a step, finishes, until nothing is left.
/// Answers the runs it finished.
async fn worker(store: Arc<PgStore>, name: String) -> Vec<String> {
    let holder = Holder::new(name.clone()).unwrap();
    let tenant = ListingScope::tenant("tnt_pool".parse().unwrap());
    let mut finished = Vec::new();
    loop {
        let claim = ClaimOptions::new(holder.clone(), Ttl::from_millis(60_000).unwrap());
        let taken = match store
            .claim_next(&tenant, &ClaimNextFilter::default(), &claim)
            .await
        {
            Ok(t) => t,
            Err(e) => panic!("{name}: claim_next through the pooler: {e}"),
        };
        let Some((scope, lease)) = taken else {
            return finished;
        };
        let work = Step {
            events: vec![event("work", &name, 1)],
            ..Step::default()
        };
        store
            .commit_step(&scope, lease.fence, &work)
            .await
            .unwrap_or_else(|e| panic!("{name}: step: {e}"));
        let last = Step {
            events: vec![event("finish_step", &name, 2)],
            checkpoint: Some(checkpoint("cp_done")),
            finish: Some(Outcome::completed(Some(json!({ "holder": name })))),
            ..Step::default()
        };
        store
            .commit_step(&scope, lease.fence, &last)
            .await
            .unwrap_or_else(|e| panic!("{name}: finish: {e}"));
        finished.push(scope.run_id.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_through_pgbouncer_in_transaction_mode_finishes_every_run_once() {
    let Some(url) = common::url_or_skip("pooler_drain") else {
        return;
    };
    let b = Bouncer::start(&url).await;
    let schema = common::unique_schema("pooldrain");
    let _schema_guard = common::SchemaGuard::new(&url, &schema);
    let options = PgOptions {
        // A watch wakes only by notification here (no fallback poll).
        watch_fallback: Duration::from_secs(3600),
        ..common::options(&schema, None)
    };
    let (pooled, direct, _role) = role_for(&url, &b, &schema, Some(&options)).await;
    let options = PgOptions {
        direct_url: Some(direct),
        ..options
    };
    let mut stores = Vec::new();
    for _ in 0..STORES {
        stores.push(Arc::new(
            PgStore::connect(&pooled, options.clone())
                .await
                .unwrap_or_else(|e| panic!("connect through pgbouncer: {e}")),
        ));
    }
    for i in 0..RUNS {
        stores[i % STORES]
            .enqueue(
                &run(i),
                &checkpoint("cp_enqueued"),
                &EnqueueOptions::default(),
            )
            .await
            .unwrap();
    }

    // A watch on one store, woken by a write through another: the listener
    // is on the direct connection (through the pooler it would never hear).
    let watched = run(0);
    let mut watch = stores[0].watch(&WatchTopic::Events(watched.clone()));

    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for w in 0..WORKERS_PER_STORE {
            tasks.push(tokio::spawn(worker(store.clone(), format!("w{s}_{w}"))));
        }
    }
    let mut finished = Vec::new();
    for t in tasks {
        finished.extend(t.await.unwrap());
    }
    tokio::time::timeout(Duration::from_secs(120), watch.changed())
        .await
        .expect("the watch was woken by a notification (its fallback poll is an hour)");

    // Every run finished once, by one holder, with its two steps.
    finished.sort();
    let before = finished.len();
    finished.dedup();
    assert_eq!(before, finished.len(), "no run was finished twice");
    assert_eq!(finished.len(), RUNS, "every run was finished");
    let reader = &stores[1];
    for i in 0..RUNS {
        let scope = run(i);
        let life = reader.lifecycle(&scope).await.unwrap();
        assert_eq!(life.status, RunStatus::Completed, "{}", scope.run_id);
        let events = reader
            .read_events(&scope, &ReadEventsOptions::default())
            .await
            .unwrap();
        let kinds: Vec<&str> = events
            .events
            .iter()
            .map(|e| e.event_type.as_str())
            .collect();
        assert_eq!(
            kinds.iter().filter(|k| **k == "work").count(),
            1,
            "{}: {kinds:?}",
            scope.run_id
        );
        assert_eq!(
            kinds.iter().filter(|k| **k == "finish_step").count(),
            1,
            "{}: {kinds:?}",
            scope.run_id
        );
    }

    // The stores' client connections shared fewer server sessions (so a
    // statement or setting left on a session would have met another
    // client): pgbouncer's pool for the role is 3.
    let clients = b.client_connections(&schema).await;
    let servers = b.server_sessions(&schema).await;
    eprintln!("pooled drain: {clients} client connections over {servers} server sessions");
    assert!(
        clients > 3 && servers <= 3,
        "{clients} client connections over {servers} server sessions"
    );
}
