//! The API's refusals, route by route: the auth matrix generated from the
//! route table (no token, a bad token, another tenant's token, the wrong
//! role), traversal ids, malformed and oversized bodies, unknown routes and
//! methods; every refusal a problem detail that changes nothing.

mod common;

use std::sync::Arc;

use axum::http::Method;
use runkeep::{ListOptions, ListingScope, RunStore};
use runkeep_conformance::support;
use runkeep_server::api::{self, RouteSpec};
use runkeep_server::auth::Role;
use runkeep_server::problem::{Problem, ProblemType, PROBLEM_JSON};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{TestServer, READER_A, TOKEN_A, TOKEN_B, WORKER_A};

const RUN: &str = "run_conformance_seeded";

fn concrete(path: &str) -> String {
    path.replace("{tenant}", support::tenant().as_str())
        .replace("{project}", support::project().as_str())
        .replace("{session}", support::session().as_str())
        .replace("{run}", RUN)
        .replace("{checkpoint}", "cp_1")
}

async fn seeded() -> (TestServer, Arc<dyn RunStore>) {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let scope = runkeep::RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RUN.parse().unwrap(),
    );
    store
        .write_checkpoint(&scope, &support::checkpoint("1", 0), None)
        .await
        .unwrap();
    (TestServer::start(store.clone()), store)
}

struct Answer {
    status: u16,
    content_type: String,
    www_authenticate: bool,
    body: Vec<u8>,
}

impl Answer {
    fn problem(&self) -> Problem {
        assert!(
            self.content_type.starts_with(PROBLEM_JSON),
            "status {} is not a problem detail (content-type {:?}): {}",
            self.status,
            self.content_type,
            String::from_utf8_lossy(&self.body)
        );
        serde_json::from_slice(&self.body).expect("a problem body")
    }
}

async fn send(
    server: &TestServer,
    method: &Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let client = reqwest::Client::new();
    let m = reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap();
    let mut req = client.request(m, format!("{}{path}", server.url()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    } else if method == Method::POST || method == Method::PUT {
        req = req.json(&json!({}));
    }
    if path.ends_with("/events/stream") {
        // The tail never ends on its own; answers here are refusals.
        req = req.timeout(std::time::Duration::from_secs(2));
    }
    let res = req.send().await.expect("the server answers");
    let status = res.status().as_u16();
    let content_type = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let www_authenticate = res.headers().contains_key("www-authenticate");
    let body = if content_type.starts_with("text/event-stream") {
        Vec::new()
    } else {
        res.bytes().await.unwrap().to_vec()
    };
    Answer {
        status,
        content_type,
        www_authenticate,
        body,
    }
}

fn token_for(role: Role) -> &'static str {
    match role {
        Role::Reader => READER_A,
        Role::Worker => WORKER_A,
        Role::Operator => TOKEN_A,
    }
}

/// The role one below `role`, if any.
fn below(role: Role) -> Option<Role> {
    match role {
        Role::Reader => None,
        Role::Worker => Some(Role::Reader),
        Role::Operator => Some(Role::Worker),
    }
}

/// A body that parses for the routes whose role depends on the body (no
/// fence: the operator's form).
fn unfenced_body(spec: &RouteSpec) -> Value {
    match spec.operation {
        "release" => json!({}),
        "prune_checkpoints" => json!({ "keepLast": 1 }),
        "resolve_park" => json!({ "resolution": { "action": "expire" } }),
        other => panic!("{other} has an unfenced role but no body in this test: add one"),
    }
}

/// The roles the issue specifies, stated apart from the table: reads are
/// `reader`; reopen, cancel, set-priority, the retention prune and
/// creating or deleting a schedule are `operator` (a scheduler advancing a
/// schedule's cursor is a `worker`); release, prune and park answers are the
/// holder's (`worker`) with a fence and an operator's without; every other
/// write is `worker`.
#[test]
fn the_route_table_gives_each_operation_the_role_the_issue_specifies() {
    for spec in api::route_table() {
        let (role, unfenced) = match spec.operation {
            "reopen" | "cancel" | "set_priority" | "prune_finished" | "put_schedule"
            | "delete_schedule" => (Role::Operator, None),
            "release" | "prune_checkpoints" | "resolve_park" => {
                (Role::Worker, Some(Role::Operator))
            }
            _ if spec.method == Method::GET => (Role::Reader, None),
            _ => (Role::Worker, None),
        };
        assert_eq!(
            (spec.role, spec.unfenced_role),
            (role, unfenced),
            "{} {} ({})",
            spec.method,
            spec.path,
            spec.operation
        );
    }
}

/// Every route of the table with no token, a bad token, another tenant's
/// token and each role below the one it needs. Generated from the table,
/// so a new route is covered as soon as it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_no_token_a_bad_token_another_tenant_and_the_wrong_role() {
    let (server, store) = seeded().await;
    let table = api::route_table();
    assert!(table.len() >= 36, "the route table shrank: {}", table.len());
    // The body another tenant gets, to compare with: a run that does not exist.
    let missing = send(
        &server,
        &Method::GET,
        &concrete(api::RUN).replace(RUN, "run_conformance_missing"),
        Some(TOKEN_A),
        None,
    )
    .await;
    assert_eq!(missing.status, 404);
    let missing_body = missing.body.clone();
    assert_eq!(missing.problem().kind(), Some(ProblemType::NotFound));
    let mut checks = 0;
    for spec in &table {
        let mut path = concrete(&spec.path);
        if spec.path.ends_with("/wait") {
            // A long-poll: answer at once when allowed.
            path.push_str("?timeoutMs=1");
        }
        let what = format!("{} {}", spec.method, spec.path);

        let a = send(&server, &spec.method, &path, None, None).await;
        assert_eq!(
            a.status,
            401,
            "{what} without a token: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(
            a.problem().kind(),
            Some(ProblemType::Unauthorized),
            "{what}"
        );
        assert!(a.www_authenticate, "{what}: 401 without WWW-Authenticate");

        let a = send(&server, &spec.method, &path, Some("not-a-token"), None).await;
        assert_eq!(a.status, 401, "{what} with a bad token");
        assert_eq!(
            a.problem().kind(),
            Some(ProblemType::Unauthorized),
            "{what}"
        );
        checks += 2;

        if spec.is_tenant_scoped() {
            let a = send(&server, &spec.method, &path, Some(TOKEN_B), None).await;
            assert_eq!(a.status, 404, "{what} with another tenant's token");
            assert_eq!(
                a.body, missing_body,
                "{what}: another tenant's answer differs from a missing run's"
            );
            checks += 1;
        }

        let mut role = spec.role;
        while let Some(lower) = below(role) {
            let a = send(&server, &spec.method, &path, Some(token_for(lower)), None).await;
            assert_eq!(
                a.status,
                403,
                "{what} needs {:?} but a {lower:?} token got {} {}",
                spec.role,
                a.status,
                String::from_utf8_lossy(&a.body)
            );
            let p = a.problem();
            assert_eq!(p.kind(), Some(ProblemType::Forbidden), "{what}");
            assert_eq!(
                p.required_role.as_deref(),
                Some(spec.role.as_str()),
                "{what}"
            );
            checks += 1;
            role = lower;
        }
        if let Some(unfenced) = spec.unfenced_role {
            let mut role = unfenced;
            while let Some(lower) = below(role) {
                let a = send(
                    &server,
                    &spec.method,
                    &path,
                    Some(token_for(lower)),
                    Some(unfenced_body(spec)),
                )
                .await;
                assert_eq!(
                    a.status,
                    403,
                    "{what} without a fence needs {unfenced:?} but a {lower:?} token got {} {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                );
                checks += 1;
                role = lower;
            }
        }

        // The role it needs is let through (whatever the store answers);
        // the body here carries no fence, so the unfenced role.
        let allowed = spec.unfenced_role.unwrap_or(spec.role);
        let a = send(&server, &spec.method, &path, Some(token_for(allowed)), None).await;
        assert!(
            a.status != 401
                && a.status != 403
                && !(a.status == 404 && a.body == missing_body && spec.operation != "run_summary"),
            "{what} refused its own role: {} {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        );
        checks += 1;
    }
    eprintln!("auth matrix: {} routes, {checks} checks", table.len());
    // The refusals changed nothing: the seeded run is the only one and has
    // its one checkpoint... (the allowed calls above may have written to it).
    let page = store
        .list_runs(
            &ListingScope::tenant(support::other_tenant()),
            &ListOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        page.entries.is_empty(),
        "another tenant got state: {page:?}"
    );
}

/// A raw request (the ids must reach the server as typed: an HTTP client
/// would resolve `..` before sending).
async fn raw(server: &TestServer, method: &str, target: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let req = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN_A}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_ids_are_refused_naming_the_field_and_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn RunStore> = Arc::new(
        runkeep_fs::FsStore::open(
            dir.path().join("runs"),
            runkeep_fs::FsOptions {
                attribution: Some(runkeep_fs::Attribution {
                    tenant_id: support::tenant(),
                    project_id: support::project(),
                    session_id: support::session(),
                }),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let server = TestServer::start(store.clone());
    let base = concrete(api::RUN).replace(&format!("/runs/{RUN}"), "");
    let cp = r#"{"checkpoint":{"id":"cp_1","createdAt":1,"state":{}}}"#;
    let long = "x".repeat(129);
    let cases: Vec<(String, &str)> = vec![
        (format!("{base}/runs/../checkpoints"), "run"),
        (format!("{base}/runs/%2e%2e/checkpoints"), "run"),
        (format!("{base}/runs/%2E%2E/checkpoints"), "run"),
        (format!("{base}/runs/a%2Fb/checkpoints"), "run"),
        (format!("{base}/runs/a%00b/checkpoints"), "run"),
        (format!("{base}/runs/a%5Cb/checkpoints"), "run"),
        (format!("{base}/runs/{long}/checkpoints"), "run"),
        (
            format!("{base}/runs/run_ok/checkpoints?parent=.."),
            "parent",
        ),
        (
            format!("{base}/runs/run_ok/checkpoints?parent=%2e%2e%2fx"),
            "parent",
        ),
        (
            concrete(api::RUN).replace(support::session().as_str(), "..") + "/checkpoints",
            "session",
        ),
        (
            concrete(api::RUN).replace(support::project().as_str(), "%2e%2e") + "/checkpoints",
            "project",
        ),
        (
            concrete(api::RUN).replace(support::tenant().as_str(), "..") + "/checkpoints",
            "tenant",
        ),
    ];
    for (target, field) in &cases {
        for (method, body) in [("POST", cp), ("GET", "")] {
            let (status, body) = raw(&server, method, target, body).await;
            assert_eq!(status, 400, "{method} {target}: {body}");
            let p: Problem = serde_json::from_str(&body).unwrap();
            assert_eq!(
                p.kind(),
                Some(ProblemType::InvalidInput),
                "{target}: {body}"
            );
            assert_eq!(p.field.as_deref(), Some(*field), "{target}: {body}");
        }
    }
    // A traversal checkpoint id on a real run.
    let (status, body) = raw(
        &server,
        "GET",
        &(concrete(api::RUN) + "/checkpoints/by-id/..%2F..%2Fx"),
        "",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let p: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(p.field.as_deref(), Some("checkpoint"), "{body}");
    // Nothing was created anywhere: the store directory holds no run.
    let page = store
        .list_runs(
            &ListingScope::tenant(support::tenant()),
            &ListOptions::default(),
        )
        .await
        .unwrap();
    assert!(page.entries.is_empty(), "{page:?}");
    let mut names: Vec<String> = walk(dir.path());
    names.retain(|n| !n.ends_with("runs"));
    assert!(
        names
            .iter()
            .all(|n| n.contains("/runs/") && !n.contains("run_ok")),
        "files appeared: {names:?}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if p.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_unknown_routes_and_methods_are_problem_details() {
    let (server, store) = seeded().await;
    let claim = concrete(api::RUN) + "/claim";
    let (status, body) = raw(&server, "POST", &claim, "{\"holder\": \"w\", ").await;
    assert_eq!(status, 400, "{body}");
    let p: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(p.kind(), Some(ProblemType::MalformedBody), "{body}");

    let (status, body) = raw(&server, "POST", &claim, r#"{"holder": 5, "ttlMs": 1000}"#).await;
    assert_eq!(status, 400, "{body}");
    let p: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(p.kind(), Some(ProblemType::MalformedBody), "{body}");
    assert_eq!(p.field.as_deref(), Some("holder"), "{body}");

    let (status, body) = raw(&server, "POST", &claim, r#"{"holder": "w", "ttlMs": 0}"#).await;
    assert_eq!(status, 400, "{body}");
    let p: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(p.kind(), Some(ProblemType::InvalidInput), "{body}");
    assert_eq!(p.field.as_deref(), Some("ttlMs"), "{body}");

    let step = concrete(api::RUN) + "/steps";
    let (status, body) = raw(
        &server,
        "POST",
        &step,
        r#"{"fence": 1, "step": {"events": [{"type": 7}]}}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let p: Problem = serde_json::from_str(&body).unwrap();
    assert_eq!(p.field.as_deref(), Some("step.events[0].type"), "{body}");

    // No JSON content type.
    let a = reqwest::Client::new()
        .post(format!("{}{claim}", server.url()))
        .bearer_auth(TOKEN_A)
        .body(r#"{"holder":"w","ttlMs":1000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(a.status(), 415);
    assert!(a.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with(PROBLEM_JSON));

    let a = send(&server, &Method::GET, "/v1/nowhere", Some(TOKEN_A), None).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.problem().kind(), Some(ProblemType::NotFound));
    let a = send(&server, &Method::DELETE, &claim, Some(TOKEN_A), None).await;
    assert_eq!(a.status, 405);
    assert_eq!(a.problem().kind(), Some(ProblemType::MethodNotAllowed));

    // None of it claimed the run.
    let scope = runkeep::RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RUN.parse().unwrap(),
    );
    assert_eq!(
        store
            .lease(&scope, runkeep::Timestamp::now())
            .await
            .unwrap(),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_with_413_and_changes_nothing() {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let state = runkeep_server::state::AppState {
        store: store.clone(),
        auth: Arc::new(common::tokens()),
        metrics: Arc::new(runkeep_server::metrics::Metrics::default()),
    };
    let app = api::router_with_limit(state, 4096);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let big = "x".repeat(8192);
    let body = json!({"checkpoint": {"id": "cp_1", "createdAt": 1, "state": {"big": big}}});
    let path = concrete(api::RUN) + "/checkpoints";
    let res = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .bearer_auth(TOKEN_A)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
    let p: Problem = res.json().await.unwrap();
    assert_eq!(p.kind(), Some(ProblemType::PayloadTooLarge));
    let page = store
        .list_runs(
            &ListingScope::tenant(support::tenant()),
            &ListOptions::default(),
        )
        .await
        .unwrap();
    assert!(page.entries.is_empty());
}

/// Fenced out over HTTP: 409 with both fences, and 503 answers carry
/// Retry-After (contended, unavailable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_out_is_409_with_both_fences() {
    let (server, _store) = seeded().await;
    let claim = concrete(api::RUN) + "/claim";
    let body = json!({"holder": "w1", "ttlMs": 60000});
    let a = send(&server, &Method::POST, &claim, Some(WORKER_A), Some(body)).await;
    assert_eq!(a.status, 200);
    let body = json!({"holder": "w1", "ttlMs": 60000});
    let a = send(&server, &Method::POST, &claim, Some(WORKER_A), Some(body)).await;
    assert_eq!(a.status, 200, "renewal");
    let cp = json!({"checkpoint": {"id": "cp_2", "createdAt": 2, "state": {}}, "fence": 1});
    let a = send(
        &server,
        &Method::POST,
        &(concrete(api::RUN) + "/checkpoints"),
        Some(WORKER_A),
        Some(cp),
    )
    .await;
    assert_eq!(a.status, 409);
    let p = a.problem();
    assert_eq!(p.kind(), Some(ProblemType::FencedOut));
    assert_eq!((p.presented, p.current), (Some(1), Some(2)));
    assert_eq!(p.run.as_deref(), Some(RUN));
}

/// A park is answered exactly once: the second answer is 409 `conflict`
/// carrying the first answer and when it was recorded, and the stored
/// answer is still the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_park_answer_is_a_conflict_carrying_the_first() {
    let (server, store) = seeded().await;
    let scope = runkeep::RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RUN.parse().unwrap(),
    );
    let parked = support::checkpoint("park", 5).with_pending(runkeep::PendingDecision::new(
        "approval",
        serde_json::Map::new(),
        support::at(5),
    ));
    store.write_checkpoint(&scope, &parked, None).await.unwrap();
    let path = format!(
        "{}/checkpoints/by-id/{}/answer",
        concrete(api::RUN),
        parked.id
    );
    let first = json!({"resolution": {"action": "answer", "decision": {"approve": true}}});
    let a = send(&server, &Method::POST, &path, Some(TOKEN_A), Some(first)).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let second = json!({"resolution": {"action": "answer", "decision": {"approve": false}}});
    let a = send(&server, &Method::POST, &path, Some(TOKEN_A), Some(second)).await;
    assert_eq!(a.status, 409, "{}", String::from_utf8_lossy(&a.body));
    let p = a.problem();
    assert_eq!(p.kind(), Some(ProblemType::Conflict));
    assert_eq!(p.first_answer, Some(json!({"approve": true})));
    let stored = store
        .read_checkpoint(&scope, &parked.id)
        .await
        .unwrap()
        .unwrap();
    let pending = stored.pending.unwrap();
    assert_eq!(pending.decision, Some(json!({"approve": true})));
    // Recorded at the store's clock (a client cannot choose the instant).
    assert_eq!(p.resolved_at, pending.resolved_at.map(|t| t.as_millis()));
    assert!(p.resolved_at.is_some());
}

/// Nothing leaks: a directory store's refusals and failures name files in
/// their messages; over HTTP the body never holds the directory's path
/// (an invalid-input detail has it replaced, a corrupted one is generic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_leaks_a_filesystem_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display().to_string();
    let fs = runkeep_fs::FsStore::open(
        dir.path().join("runs"),
        runkeep_fs::FsOptions {
            attribution: Some(runkeep_fs::Attribution {
                tenant_id: support::tenant(),
                project_id: support::project(),
                session_id: support::session(),
            }),
            ..Default::default()
        },
    )
    .unwrap();
    let store: Arc<dyn RunStore> = Arc::new(fs);
    let scope = runkeep::RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RUN.parse().unwrap(),
    );
    store
        .write_checkpoint(&scope, &support::checkpoint("1", 0), None)
        .await
        .unwrap();
    // The store's own refusal names its directory.
    let foreign = runkeep::RunScope::new(
        support::tenant(),
        support::other_project(),
        support::session(),
        RUN.parse().unwrap(),
    );
    let direct = store
        .write_checkpoint(&foreign, &support::checkpoint("1", 0), None)
        .await
        .unwrap_err();
    assert!(direct.to_string().contains(&root), "the premise: {direct}");
    // Damage the checkpoint file: the store's Corrupted names the file.
    let mut damaged = 0;
    for path in walk(dir.path()) {
        if path.ends_with(".json") && path.contains("checkpoints") {
            std::fs::write(&path, b"{ not json").unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 0, "no checkpoint file found to damage");
    let direct = store.list_checkpoints(&scope).await.unwrap_err();
    assert!(
        matches!(direct, runkeep::Error::Corrupted { .. }),
        "the premise: {direct}"
    );

    let server = TestServer::start(store);
    let cp = json!({"checkpoint": {"id": "cp_1", "createdAt": 1, "state": {}}});
    let foreign_path = concrete(api::RUN).replace(
        support::project().as_str(),
        support::other_project().as_str(),
    ) + "/checkpoints";
    let a = send(
        &server,
        &Method::POST,
        &foreign_path,
        Some(TOKEN_A),
        Some(cp),
    )
    .await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.body));
    let text = String::from_utf8_lossy(&a.body).to_string();
    assert!(!text.contains(&root), "a path leaked: {text}");
    assert!(text.contains("<path>"), "{text}");

    let a = send(
        &server,
        &Method::GET,
        &(concrete(api::RUN) + "/checkpoints"),
        Some(TOKEN_A),
        None,
    )
    .await;
    assert_eq!(a.status, 500, "{}", String::from_utf8_lossy(&a.body));
    let text = String::from_utf8_lossy(&a.body).to_string();
    assert_eq!(a.problem().kind(), Some(ProblemType::Corrupted));
    assert!(
        !text.contains(&root) && !text.contains(".json"),
        "a path leaked: {text}"
    );
}
