//! Three `runkeep serve` processes over one PostgreSQL store (issue 31,
//! item 3), through the real binary:
//!
//! - a long-poll on one server is woken by a write through another: the
//!   servers re-read on their own only every `--watch-fallback` (set far
//!   above the long-poll's own timeout), so an answer `changed: true` can
//!   only come from the store's `NOTIFY`;
//! - a token revoked with `runkeep token revoke` is refused by every
//!   server reading the token file within the reload interval (polled
//!   until refused, under a generous bound; a token not revoked is still
//!   served by all);
//! - one LangGraph thread's write batches sent at once through two servers
//!   are all kept: the test holds the run's row lock from its own
//!   connection until batches from both servers wait on it (asserted from
//!   `pg_blocking_pids`), then lets them go together.
//!
//! No assertion is on a duration (the machines are noisy); the wake-up
//! figures are measured by `runkeep-bench --wake` (BENCHMARKS.md).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::servers::{client, drop_schema, pg_store, runkeep, serve_with, token, Serve};
use runkeep::RunScope;
use runkeep_conformance::support;
use serde_json::{json, Value};

/// How often a server re-reads when no notification came: far above the
/// long-poll's timeout, so no answer before that timeout is a re-read.
const FALLBACK: &str = "600s";
/// The long-poll's own timeout.
const WAIT_MS: u64 = 30_000;
/// Long-polls woken, rotating the writing and the waiting server.
const ROUNDS: usize = 9;
/// Thread write batches sent at once (half through each of two servers).
const BATCHES: usize = 16;
/// The longest a step that should happen at once may take.
const BOUND: Duration = Duration::from_secs(20);

fn run_path(scope: &RunScope, tail: &str) -> String {
    format!(
        "/v1/tenants/{}/projects/{}/sessions/{}/runs/{}{tail}",
        scope.tenant_id, scope.project_id, scope.session_id, scope.run_id
    )
}

/// Three servers over one fresh schema, with an operator token.
struct Fleet {
    url: String,
    schema: String,
    /// The prefix of the servers' `application_name`s.
    app: String,
    /// The `--store` address and the token file every server reads.
    store: String,
    tokens: PathBuf,
    servers: Vec<Serve>,
    token: String,
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn start(label: &str, n: usize) -> Self {
        Self::start_with(label, n, &[])
    }

    fn start_with(label: &str, n: usize, extra: &[&str]) -> Self {
        let (url, schema, store) = pg_store(label);
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.json");
        let token = token(&store, &tokens, "operator");
        // Each server's connections carry its own application name.
        let app = format!("rkt_serve_{label}_{}_", std::process::id());
        let servers = (0..n)
            .map(|i| {
                let named = format!("{store}&application_name={app}{i}");
                let mut args = vec!["--watch-fallback", FALLBACK];
                args.extend_from_slice(extra);
                serve_with(&named, &tokens, &args)
            })
            .collect();
        Fleet {
            url,
            schema,
            app,
            store,
            tokens,
            servers,
            token,
            _dir: dir,
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.servers.clear();
        // Off the test's runtime: dropping the schema runs one of its own.
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || drop_schema(&url, &schema)).join();
    }
}

/// How many long-polls and tails `server` holds open now (its
/// `runkeep_http_slots_held{budget="waits"}` gauge).
async fn waits_held(http: &reqwest::Client, server: &Serve) -> u64 {
    let text = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("runkeep_http_slots_held{budget=\"waits\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_one_server_is_woken_by_a_write_through_another() {
    let fleet = Fleet::start("wake", 3);
    let http = reqwest::Client::new();
    let scope = support::run("wake");
    let writers: Vec<_> = fleet
        .servers
        .iter()
        .map(|s| client(s, &fleet.token))
        .collect();
    let first = writers[0]
        .append_events(&scope, &[support::event("start", json!({}))], None)
        .await
        .expect("first event");
    let mut last = first.last().expect("an event").seq;
    for round in 0..ROUNDS {
        let (writer, waiter) = (round % 3, (round + 1) % 3);
        let server = &fleet.servers[waiter];
        let url = format!(
            "{}{}?sinceSeq={last}&timeoutMs={WAIT_MS}",
            server.url,
            run_path(&scope, "/events/wait")
        );
        let poll = tokio::spawn(http.get(url).bearer_auth(&fleet.token).send());
        // The interleaving under test: the long-poll is waiting on its
        // server before the write is made through another.
        let deadline = Instant::now() + BOUND;
        while waits_held(&http, server).await == 0 {
            assert!(
                Instant::now() < deadline,
                "round {round}: the long-poll never started waiting"
            );
            tokio::task::yield_now().await;
        }
        let written = Instant::now();
        writers[writer]
            .append_events(
                &scope,
                &[support::event("step", json!({ "round": round }))],
                None,
            )
            .await
            .expect("the write");
        let answer = poll.await.expect("task").expect("the long-poll");
        let woke = written.elapsed();
        assert_eq!(answer.status(), 200, "round {round}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(
            body["changed"],
            json!(true),
            "round {round}: the long-poll on server {waiter} was not woken by the write \
             through server {writer} before its own timeout ({WAIT_MS} ms, below the \
             re-read interval {FALLBACK}): {body}"
        );
        last = body["lastSeq"].as_u64().expect("lastSeq");
        eprintln!("round {round}: server {waiter} woke {woke:?} after the write through {writer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_threads_batches_sent_through_two_servers_at_once_are_all_kept() {
    let fleet = Fleet::start("threads", 2);
    let http = reqwest::Client::new();
    let scope = support::run("thread");
    let send = |server: usize, method: reqwest::Method, tail: &str, body: Value| {
        http.request(
            method,
            format!("{}{}", fleet.servers[server].url, run_path(&scope, tail)),
        )
        .bearer_auth(&fleet.token)
        .json(&body)
        .send()
    };
    let put = send(
        0,
        reqwest::Method::PUT,
        "/thread/checkpoints",
        json!({
            "thread": "t", "ns": "", "checkpointId": "c1",
            "checkpoint": { "v": 4, "id": "c1", "channel_versions": {} },
            "metadata": {}, "blobs": [],
        }),
    )
    .await
    .expect("put the checkpoint");
    assert_eq!(
        put.status(),
        200,
        "{}",
        put.text().await.unwrap_or_default()
    );

    // Hold the run's row (what every write of the run locks) from a
    // connection of our own, so the batches pile up behind it.
    let (mut pg, conn) = tokio_postgres::connect(&fleet.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let holder = pg.transaction().await.expect("begin");
    let locked = holder
        .query(
            &format!(
                "SELECT pg_backend_pid() FROM \"{}\".runs WHERE tenant_id = $1 AND project_id = $2 \
                 AND session_id = $3 AND run_id = $4 FOR UPDATE",
                fleet.schema
            ),
            &[
                &scope.tenant_id.as_str(),
                &scope.project_id.as_str(),
                &scope.session_id.as_str(),
                &scope.run_id.as_str(),
            ],
        )
        .await
        .expect("lock the run's row");
    assert_eq!(locked.len(), 1, "the run's row exists");
    let pid: i32 = locked[0].get(0);

    let mut batches = Vec::new();
    for i in 0..BATCHES {
        let body = json!({
            "thread": "t", "ns": "", "checkpointId": "c1",
            "taskId": format!("task-{i:02}"), "taskPath": "",
            "writes": [{ "idx": 0, "channel": format!("ch-{i}"), "type": "json", "data": "eA==" }],
        });
        batches.push(tokio::spawn(send(
            i % 2,
            reqwest::Method::POST,
            "/thread/writes",
            body,
        )));
    }
    // Both servers have batches waiting on the row at once: the overlap.
    let (probe, conn) = tokio_postgres::connect(&fleet.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let deadline = Instant::now() + BOUND;
    let waiting = loop {
        // Waiting on the row directly or queued behind another waiter; the
        // application name says which server the connection is.
        let n: i64 = probe
            .query_one(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND application_name LIKE $1",
                &[&format!("{}%", fleet.app)],
            )
            .await
            .expect("blocked backends")
            .get(0);
        if n >= 2 {
            break n;
        }
        if Instant::now() >= deadline {
            let seen: Vec<String> = probe
                .query(
                    "SELECT format('%s %s %s %s', pid, wait_event_type, state, left(query, 80)) \
                     FROM pg_stat_activity WHERE datname = current_database()",
                    &[],
                )
                .await
                .expect("activity")
                .iter()
                .map(|r| r.get(0))
                .collect();
            let mut done = Vec::new();
            for b in batches {
                let a = b.await.expect("task").expect("a batch");
                done.push(format!(
                    "{} {}",
                    a.status(),
                    a.text().await.unwrap_or_default()
                ));
            }
            panic!(
                "batches from both servers never waited on the run at once ({n} servers \
                 waiting; holder {pid}; answers {done:?}): {seen:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    holder.rollback().await.expect("release the row");
    for b in batches {
        let answer = b.await.expect("task").expect("a batch");
        assert_eq!(
            answer.status(),
            200,
            "{}",
            answer.text().await.unwrap_or_default()
        );
    }
    let got: Value = http
        .get(format!(
            "{}{}?checkpointId=c1",
            fleet.servers[1].url,
            run_path(&scope, "/thread/checkpoint")
        ))
        .bearer_auth(&fleet.token)
        .send()
        .await
        .expect("read back")
        .json()
        .await
        .expect("json");
    let mut tasks: Vec<String> = got["checkpoint"]["writes"]
        .as_array()
        .unwrap_or_else(|| panic!("no writes: {got}"))
        .iter()
        .map(|w| w["taskId"].as_str().expect("taskId").to_string())
        .collect();
    tasks.sort();
    let want: Vec<String> = (0..BATCHES).map(|i| format!("task-{i:02}")).collect();
    assert_eq!(
        tasks, want,
        "batches were lost (batches of {waiting} servers waited on the run at once)"
    );
    drop(probe);
    drop(pg);
}

/// The reload interval of the revocation test, and the bound it polls
/// under (the documented delay is one interval; the bound is generous).
const RELOAD: &str = "500ms";
const REVOKE_BOUND: Duration = Duration::from_secs(20);

async fn whoami(http: &reqwest::Client, server: &Serve, token: &str) -> u16 {
    http.get(format!("{}/v1/whoami", server.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("whoami")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_is_refused_by_every_server_within_the_reload_interval() {
    let fleet = Fleet::start_with("revoke", 3, &["--token-reload", RELOAD]);
    let http = reqwest::Client::new();
    let out = runkeep(&fleet.store)
        .args(["--json", "--tenant", support::tenant().as_str()])
        .args(["token", "create", "--role", "worker", "--tokens"])
        .arg(&fleet.tokens)
        .output()
        .expect("runkeep token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).expect("json");
    let (id, secret) = (
        created["id"].as_str().expect("id").to_string(),
        created["token"].as_str().expect("token").to_string(),
    );
    // Every server serves the new token first (each reloads on its own).
    for (i, server) in fleet.servers.iter().enumerate() {
        let deadline = Instant::now() + REVOKE_BOUND;
        while whoami(&http, server, &secret).await != 200 {
            assert!(
                Instant::now() < deadline,
                "server {i} never took the new token"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let out = runkeep(&fleet.store)
        .args(["token", "revoke", &id, "--tokens"])
        .arg(&fleet.tokens)
        .output()
        .expect("runkeep token revoke");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revoked = Instant::now();
    for (i, server) in fleet.servers.iter().enumerate() {
        loop {
            let status = whoami(&http, server, &secret).await;
            if status == 401 {
                break;
            }
            assert_eq!(status, 200, "server {i}: the token answered {status}");
            assert!(
                revoked.elapsed() < REVOKE_BOUND,
                "server {i} still serves the revoked token {REVOKE_BOUND:?} after the revoke"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "server {i} refuses the revoked token {:?} after the revoke",
            revoked.elapsed()
        );
    }
    for (i, server) in fleet.servers.iter().enumerate() {
        assert_eq!(
            whoami(&http, server, &fleet.token).await,
            200,
            "server {i} refuses the token that was not revoked"
        );
    }
}

#[test]
fn watch_fallback_is_refused_for_a_store_that_is_not_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("fs:{}", dir.path().join("runs").display());
    let out = runkeep(&store)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--watch-fallback",
            "1s",
            "--tokens",
        ])
        .arg(dir.path().join("tokens.json"))
        .output()
        .expect("runkeep serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("--watch-fallback applies to a PostgreSQL store only"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("tokens.json").exists(),
        "a refused start made a token file"
    );
}
