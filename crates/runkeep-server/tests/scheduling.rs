//! Issue 30 over HTTP, attacked from outside: the enqueue's priority,
//! concurrency key, retention and idempotency key; an operator's priority
//! change (a worker token, even a second one of the same tenant, is
//! refused); the listing's priority order and filter; a key's holdings;
//! bad input refused with a 400 naming its field and nothing changed.

mod common;

use std::sync::Arc;

use runkeep::{ListOptions, ListingScope, RunStore};
use runkeep_conformance::support;
use runkeep_server::problem::{Problem, ProblemType};
use serde_json::{json, Value};

use common::{TestServer, READER_A, TOKEN_A, WORKER_A, WORKER_A2};

struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn problem(&self) -> Problem {
        serde_json::from_value(self.body.clone()).expect("a problem body")
    }

    /// A 400 `invalid-input` (or `malformed-body`) naming `field`.
    fn refused_naming(&self, field: &str) {
        assert_eq!(self.status, 400, "{}", self.body);
        let p = self.problem();
        assert!(
            matches!(
                p.kind(),
                Some(ProblemType::InvalidInput | ProblemType::MalformedBody)
            ),
            "{}",
            self.body
        );
        assert_eq!(p.field.as_deref(), Some(field), "{}", self.body);
    }
}

async fn call(
    server: &TestServer,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Answer {
    let client = reqwest::Client::new();
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = client
        .request(m, format!("{}{path}", server.url()))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.expect("the server answers");
    let status = res.status().as_u16();
    let bytes = res.bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("a JSON answer")
    };
    Answer { status, body }
}

fn session_path() -> String {
    format!(
        "/v1/tenants/{}/projects/{}/sessions/{}",
        support::tenant(),
        support::project(),
        support::session()
    )
}

fn run_path(run: &str, tail: &str) -> String {
    format!("{}/runs/{run}{tail}", session_path())
}

fn listing_path(query: &str) -> String {
    format!(
        "/v1/tenants/{}/runs?project={}&session={}{query}",
        support::tenant(),
        support::project(),
        support::session()
    )
}

fn enqueue_body(extra: Value) -> Value {
    let mut body = json!({
        "checkpoint": {"id": "cp_1", "createdAt": 1_000, "state": {"input": 1}},
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn scope(run: &str) -> runkeep::RunScope {
    runkeep::RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        runkeep::RunId::new(run).unwrap(),
    )
}

async fn start() -> (TestServer, Arc<dyn RunStore>) {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    (TestServer::start(store.clone()), store)
}

async fn run_count(store: &Arc<dyn RunStore>) -> usize {
    let scope = ListingScope::session(support::tenant(), support::project(), support::session());
    store
        .list_runs(&scope, &ListOptions::default())
        .await
        .unwrap()
        .entries
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_operator_sets_a_priority_and_a_second_worker_token_is_refused() {
    let (server, store) = start().await;
    let a = call(
        &server,
        "POST",
        &run_path("run_a", "/enqueue"),
        WORKER_A,
        Some(enqueue_body(json!({"priority": 3}))),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // The answer without `dedupe` is the checkpoint, as before.
    assert_eq!(a.body["id"], "cp_1", "{}", a.body);
    assert!(a.body.get("created").is_none(), "{}", a.body);
    for token in [WORKER_A, WORKER_A2, READER_A] {
        let a = call(
            &server,
            "POST",
            &run_path("run_a", "/priority"),
            token,
            Some(json!({"priority": 100})),
        )
        .await;
        assert_eq!(a.status, 403, "{token}: {}", a.body);
        assert_eq!(a.problem().kind(), Some(ProblemType::Forbidden));
        assert_eq!(a.problem().required_role.as_deref(), Some("operator"));
    }
    let scope = scope("run_a");
    assert_eq!(store.lifecycle(&scope).await.unwrap().priority.get(), 3);
    let a = call(
        &server,
        "POST",
        &run_path("run_a", "/priority"),
        TOKEN_A,
        Some(json!({"priority": -7})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["priority"], -7);
    assert_eq!(store.lifecycle(&scope).await.unwrap().priority.get(), -7);
    // A run that does not exist: 404; a finished one: 409, unchanged.
    let a = call(
        &server,
        "POST",
        &run_path("run_missing", "/priority"),
        TOKEN_A,
        Some(json!({"priority": 1})),
    )
    .await;
    assert_eq!(a.status, 404, "{}", a.body);
    let a = call(
        &server,
        "POST",
        &run_path("run_a", "/cancel"),
        TOKEN_A,
        Some(json!({})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = call(
        &server,
        "POST",
        &run_path("run_a", "/priority"),
        TOKEN_A,
        Some(json!({"priority": 9})),
    )
    .await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert_eq!(store.lifecycle(&scope).await.unwrap().priority.get(), -7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_naming_the_field_and_changes_nothing() {
    let (server, store) = start().await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"priority": 2_000_000}), "priority"),
        (json!({"priority": -2_000_000}), "priority"),
        (json!({"priority": 2e6}), "priority"),
        (
            json!({"concurrency": {"key": "a key", "limit": 1}}),
            "concurrency.key",
        ),
        (
            json!({"concurrency": {"key": "", "limit": 1}}),
            "concurrency.key",
        ),
        (
            json!({"concurrency": {"key": "k", "limit": 0}}),
            "concurrency.limit",
        ),
        (
            json!({"concurrency": {"key": "k", "limit": 10_001}}),
            "concurrency.limit",
        ),
        (
            json!({"dedupe": {"key": "d", "windowMs": 30u64 * 24 * 3600 * 1000 + 1}}),
            "dedupe.windowMs",
        ),
        (
            json!({"dedupe": {"key": "d", "windowMs": 0}}),
            "dedupe.windowMs",
        ),
        (
            json!({"dedupe": {"key": "", "windowMs": 1000}}),
            "dedupe.key",
        ),
        (
            json!({"dedupe": {"key": "a\u{7}b", "windowMs": 1000}}),
            "dedupe.key",
        ),
        (json!({"retentionMs": 0}), "retentionMs"),
    ];
    for (extra, field) in cases {
        let a = call(
            &server,
            "POST",
            &run_path("run_bad", "/enqueue"),
            WORKER_A,
            Some(enqueue_body(extra.clone())),
        )
        .await;
        a.refused_naming(field);
        assert_eq!(run_count(&store).await, 0, "{extra} created a run");
    }
    // The priority change, on a run that exists: refused, unchanged.
    let a = call(
        &server,
        "POST",
        &run_path("run_ok", "/enqueue"),
        WORKER_A,
        Some(enqueue_body(json!({"priority": 5}))),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    for bad in [
        json!({"priority": 2_000_000}),
        json!({"priority": 2e6}),
        json!({"priority": "high"}),
    ] {
        let a = call(
            &server,
            "POST",
            &run_path("run_ok", "/priority"),
            TOKEN_A,
            Some(bad.clone()),
        )
        .await;
        a.refused_naming("priority");
    }
    let scope = scope("run_ok");
    assert_eq!(store.lifecycle(&scope).await.unwrap().priority.get(), 5);
    // The listing's filter and the holdings' key.
    call(
        &server,
        "GET",
        &listing_path("&minPriority=2000000"),
        READER_A,
        None,
    )
    .await
    .refused_naming("minPriority");
    call(
        &server,
        "GET",
        &listing_path("&minPriority=x"),
        READER_A,
        None,
    )
    .await
    .refused_naming("minPriority");
    call(
        &server,
        "GET",
        &listing_path("&order=urgency"),
        READER_A,
        None,
    )
    .await
    .refused_naming("order");
    call(
        &server,
        "GET",
        &format!("{}/key-holdings?key=a%20b", session_path()),
        READER_A,
        None,
    )
    .await
    .refused_naming("key");
    call(
        &server,
        "GET",
        &format!("{}/key-holdings", session_path()),
        READER_A,
        None,
    )
    .await
    .refused_naming("key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_answers_the_first_run_inside_its_window() {
    let (server, store) = start().await;
    let dedupe = json!({"dedupe": {"key": "order-42", "windowMs": 600_000}});
    let a = call(
        &server,
        "POST",
        &run_path("run_first", "/enqueue"),
        WORKER_A,
        Some(enqueue_body(dedupe.clone())),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["created"], true, "{}", a.body);
    assert_eq!(a.body["run"]["runId"], "run_first");
    assert_eq!(a.body["checkpoint"]["id"], "cp_1");
    // Another token of the tenant, another run id, the same key.
    let a = call(
        &server,
        "POST",
        &run_path("run_second", "/enqueue"),
        WORKER_A2,
        Some(enqueue_body(dedupe.clone())),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["created"], false, "{}", a.body);
    assert_eq!(a.body["run"]["runId"], "run_first", "{}", a.body);
    assert_eq!(run_count(&store).await, 1);
    // The same run id again is a conflict, key or not.
    let a = call(
        &server,
        "POST",
        &run_path("run_first", "/enqueue"),
        WORKER_A,
        Some(enqueue_body(json!({}))),
    )
    .await;
    assert_eq!(a.status, 409, "{}", a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_orders_by_priority_and_filters_and_the_key_history_is_read() {
    let (server, store) = start().await;
    for (run, extra) in [
        ("run_low", json!({"priority": -1})),
        ("run_mid", json!({})),
        (
            "run_high",
            json!({"priority": 9, "concurrency": {"key": "customer:42/eu", "limit": 1}, "retentionMs": 86_400_000}),
        ),
        (
            "run_high2",
            json!({"priority": 9, "concurrency": {"key": "customer:42/eu", "limit": 1}}),
        ),
    ] {
        let a = call(
            &server,
            "POST",
            &run_path(run, "/enqueue"),
            WORKER_A,
            Some(enqueue_body(extra)),
        )
        .await;
        assert_eq!(a.status, 200, "{run}: {}", a.body);
    }
    let lc = store.lifecycle(&scope("run_high")).await.unwrap();
    assert_eq!(lc.retention_ms, Some(86_400_000));
    assert_eq!(lc.concurrency.as_ref().map(|c| c.limit), Some(1));
    let a = call(
        &server,
        "GET",
        &listing_path("&order=priority"),
        READER_A,
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let ids: Vec<&str> = a.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"]["runId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["run_high", "run_high2", "run_mid", "run_low"]);
    assert_eq!(a.body["entries"][0]["priority"], 9);
    assert_eq!(a.body["entries"][0]["concurrencyKey"], "customer:42/eu");
    assert!(
        a.body["entries"][2].get("priority").is_none(),
        "0 is left out"
    );
    let a = call(
        &server,
        "GET",
        &listing_path("&minPriority=0"),
        READER_A,
        None,
    )
    .await;
    let ids: Vec<&str> = a.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"]["runId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["run_high", "run_high2", "run_mid"]);

    // One run of the key held: the other answers atLimit, nothing changed.
    let claim = json!({"holder": "w1", "ttlMs": 60_000});
    let a = call(
        &server,
        "POST",
        &run_path("run_high", "/claim"),
        WORKER_A,
        Some(claim.clone()),
    )
    .await;
    assert_eq!(a.body["outcome"], "acquired", "{}", a.body);
    let a = call(
        &server,
        "POST",
        &run_path("run_high2", "/claim"),
        WORKER_A2,
        Some(claim),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["outcome"], "atLimit", "{}", a.body);
    assert_eq!(a.body["key"], "customer:42/eu");
    assert_eq!(
        (a.body["limit"].as_u64(), a.body["held"].as_u64()),
        (Some(1), Some(1))
    );
    // The history, read by a reader, the key percent-encoded in the query.
    let a = call(
        &server,
        "GET",
        &format!("{}/key-holdings?key=customer%3A42%2Feu", session_path()),
        READER_A,
        None,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["key"], "customer:42/eu");
    let holdings = a.body["holdings"].as_array().unwrap();
    assert_eq!(holdings.len(), 1, "{}", a.body);
    assert_eq!(holdings[0]["runId"], "run_high");
    assert_eq!(holdings[0]["fence"], 1);
    // The HttpStore reads the same history.
    let client = server.client(None);
    let session = ListingScope::session(support::tenant(), support::project(), support::session());
    let via_client = runkeep::CheckpointStore::key_holdings(&client, &session, "customer:42/eu")
        .await
        .unwrap();
    let direct = store
        .key_holdings(&session, "customer:42/eu")
        .await
        .unwrap();
    assert_eq!(via_client, direct);
}
