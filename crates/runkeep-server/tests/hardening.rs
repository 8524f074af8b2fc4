//! The server under a worker token that means harm (issue: "the HTTP
//! service under attack"): every attack below succeeded before and is
//! refused now, having changed nothing.
//!
//! - a misspelled `fence` (or any unknown field) in any body;
//! - a client-chosen `now` on a claim, a `claim_next` or a park answer;
//! - a fence read off `GET …/lease` presented through another worker's
//!   token (write, step, release, finish, snooze, prune, park answer), and a
//!   claim under another worker's holder name;
//! - an unfenced write by a worker to a run someone holds;
//! - bodies shaped to cost the server far more than their bytes (many
//!   small numbers, deep nesting), next to the legitimate large body (one
//!   long string) that must still pass.

mod common;

use std::sync::Arc;

use runkeep::{CheckpointId, ClaimOptions, Holder, RunScope, RunStore, Ttl};
use runkeep_conformance::support;
use runkeep_server::problem::{Problem, ProblemType};
use serde_json::{json, Value};

use common::{TestServer, READER_A, TOKEN_A, WORKER_A, WORKER_A2};

const RUN: &str = "run_attacked";

fn scope() -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RUN.parse().unwrap(),
    )
}

fn run_path(tail: &str) -> String {
    format!(
        "/v1/tenants/{}/projects/{}/sessions/{}/runs/{RUN}{tail}",
        support::tenant(),
        support::project(),
        support::session()
    )
}

struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn problem(&self) -> Problem {
        serde_json::from_value(self.body.clone()).expect("a problem body")
    }
}

async fn send_raw(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> Answer {
    let res = reqwest::Client::new()
        .request(method, format!("{}{path}", server.url()))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the server answers");
    let status = res.status().as_u16();
    let bytes = res.bytes().await.unwrap();
    Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

async fn post(server: &TestServer, path: &str, token: &str, body: Value) -> Answer {
    send_raw(
        server,
        reqwest::Method::POST,
        path,
        token,
        serde_json::to_vec(&body).unwrap(),
    )
    .await
}

async fn get(server: &TestServer, path: &str, token: &str) -> Answer {
    let res = reqwest::Client::new()
        .get(format!("{}{path}", server.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    Answer {
        status,
        body: res.json().await.unwrap_or(Value::Null),
    }
}

fn checkpoint(id: &str, state: Value) -> Value {
    json!({"id": id, "createdAt": support::at(1).as_millis(), "state": state})
}

/// A server over a memory store with one run, claimed by `WORKER_A` over
/// HTTP; answers the fence it holds.
async fn claimed() -> (TestServer, Arc<dyn RunStore>, u64) {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    store
        .write_checkpoint(&scope(), &support::checkpoint("seed", 0), None)
        .await
        .unwrap();
    let server = TestServer::start(store.clone());
    let a = post(
        &server,
        &run_path("/claim"),
        WORKER_A,
        json!({"holder": "worker-1", "ttlMs": 60_000}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["outcome"], "acquired");
    // The holder reads back as the worker named it.
    assert_eq!(a.body["lease"]["holder"], "worker-1");
    let fence = a.body["lease"]["fence"].as_u64().unwrap();
    (server, store, fence)
}

async fn checkpoint_ids(store: &Arc<dyn RunStore>) -> Vec<String> {
    store
        .list_checkpoints(&scope())
        .await
        .unwrap()
        .iter()
        .map(|c| c.id.to_string())
        .collect()
}

#[tokio::test]
async fn a_misspelled_fence_is_refused_naming_the_field_and_nothing_is_written() {
    let (server, store, fence) = claimed().await;
    let before = checkpoint_ids(&store).await;
    let a = post(
        &server,
        &run_path("/checkpoints"),
        WORKER_A,
        json!({"checkpoint": checkpoint("stale", json!({})), "fense": fence}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    let p = a.problem();
    assert_eq!(p.kind(), Some(ProblemType::MalformedBody));
    assert_eq!(p.field.as_deref(), Some("fense"));
    assert_eq!(checkpoint_ids(&store).await, before);

    // Nested: the step's checkpoint, the step itself.
    let a = post(
        &server,
        &run_path("/steps"),
        WORKER_A,
        json!({"fence": fence, "step": {"checkpoint": checkpoint("s", json!({})), "evnts": []}}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.problem().field.as_deref(), Some("step.evnts"));
    let a = post(
        &server,
        &run_path("/steps"),
        WORKER_A,
        json!({"fence": fence, "step": {"checkpoint": {"id": "s", "createdAt": 1, "stat": {}}}}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.problem().field.as_deref(), Some("step.checkpoint.stat"));
    assert_eq!(checkpoint_ids(&store).await, before);
}

#[tokio::test]
async fn a_client_cannot_choose_now() {
    let (server, store, _fence) = claimed().await;
    let later = support::at(0).as_millis() + 3_600_000;
    // A second worker fleet tries to take the live lease "an hour later".
    let a = post(
        &server,
        &run_path("/claim"),
        WORKER_A2,
        json!({"holder": "thief", "ttlMs": 60_000, "now": later}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.problem().field.as_deref(), Some("now"));
    let a = post(
        &server,
        &format!("/v1/tenants/{}/claim-next", support::tenant()),
        WORKER_A2,
        json!({"holder": "thief", "ttlMs": 60_000, "now": later}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.problem().field.as_deref(), Some("now"));
    // The lease is still worker-1's.
    let lease = store
        .lease(&scope(), store.now())
        .await
        .unwrap()
        .expect("held");
    assert!(!lease.expired);
    assert!(lease.holder.starts_with("worker-1"), "{}", lease.holder);

    // A park answer cannot be back-dated.
    let parked = support::checkpoint("park", 5).with_pending(runkeep::PendingDecision::new(
        "approval",
        serde_json::Map::new(),
        store.now(),
    ));
    store
        .write_checkpoint(&scope(), &parked, None)
        .await
        .unwrap();
    let a = post(
        &server,
        &run_path("/checkpoints/by-id/cp_conformance_park/answer"),
        TOKEN_A,
        json!({"resolution": {"action": "answer", "decision": 1}, "now": 1}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(a.problem().field.as_deref(), Some("now"));

    // The Rust client refuses to send one.
    let client = server.client(None);
    let mut options = ClaimOptions::new(Holder::new("w").unwrap(), Ttl::from_millis(1000).unwrap());
    options.now = Some(support::at(0));
    let e = runkeep::CheckpointStore::claim(&client, &scope(), &options)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot be sent over HTTP"), "{e}");
}

#[tokio::test]
async fn a_worker_cannot_act_on_a_holding_it_did_not_claim() {
    let (server, store, fence) = claimed().await;
    // Anyone can read the fence…
    let lease = get(&server, &run_path("/lease"), READER_A).await;
    assert_eq!(lease.body["lease"]["fence"].as_u64(), Some(fence));
    let before = checkpoint_ids(&store).await;
    // …but another worker token presenting it is refused on every act.
    let cp = checkpoint("hijack", json!({}));
    let attacks: Vec<(&str, Value)> = vec![
        (
            "/checkpoints",
            json!({"checkpoint": cp.clone(), "fence": fence}),
        ),
        (
            "/steps",
            json!({"fence": fence, "step": {"checkpoint": cp.clone()}}),
        ),
        (
            "/events",
            json!({"events": [{"type": "x", "payload": {}}], "fence": fence}),
        ),
        ("/prune", json!({"keepLast": 0, "fence": fence})),
        (
            "/finish",
            json!({"fence": fence, "outcome": {"status": "failed"}}),
        ),
        ("/snooze", json!({"fence": fence, "until": 1})),
        ("/release", json!({"fence": fence})),
    ];
    for (tail, body) in attacks {
        let a = post(&server, &run_path(tail), WORKER_A2, body).await;
        assert_eq!(a.status, 403, "{tail}: {}", a.body);
        assert_eq!(a.problem().kind(), Some(ProblemType::Forbidden), "{tail}");
    }
    // A claim under worker-1's name through the other token is not a renewal.
    let a = post(
        &server,
        &run_path("/claim"),
        WORKER_A2,
        json!({"holder": "worker-1", "ttlMs": 60_000}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["outcome"], "held", "{}", a.body);
    // Nothing moved: same fence, same checkpoints, still held by worker-1.
    let top = store.lease(&scope(), store.now()).await.unwrap().unwrap();
    assert_eq!(top.fence.get(), fence);
    assert!(!top.expired);
    assert_eq!(checkpoint_ids(&store).await, before);
    assert!(store
        .read_events(&scope(), &Default::default())
        .await
        .unwrap()
        .events
        .is_empty());

    // The holder's own token acts, renews, and releases.
    let a = post(
        &server,
        &run_path("/checkpoints"),
        WORKER_A,
        json!({"checkpoint": cp, "fence": fence}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = post(
        &server,
        &run_path("/claim"),
        WORKER_A,
        json!({"holder": "worker-1", "ttlMs": 60_000}),
    )
    .await;
    assert_eq!(a.body["outcome"], "acquired", "{}", a.body);
    let renewed = a.body["lease"]["fence"].as_u64().unwrap();
    let a = post(
        &server,
        &run_path("/release"),
        WORKER_A,
        json!({"fence": renewed}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["done"], true);
}

#[tokio::test]
async fn the_binding_survives_a_server_restart() {
    // A second server on the same store knows nothing of the first one's
    // claims: the binding is read from the holding itself.
    let (server, store, fence) = claimed().await;
    drop(server);
    let again = TestServer::start(store.clone());
    let a = post(
        &again,
        &run_path("/checkpoints"),
        WORKER_A2,
        json!({"checkpoint": checkpoint("x", json!({})), "fence": fence}),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.body);
    let a = post(
        &again,
        &run_path("/checkpoints"),
        WORKER_A,
        json!({"checkpoint": checkpoint("x", json!({})), "fence": fence}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
}

#[tokio::test]
async fn an_unfenced_worker_write_to_a_held_run_is_refused_an_operators_is_not() {
    let (server, store, _fence) = claimed().await;
    let before = checkpoint_ids(&store).await;
    for (tail, body) in [
        (
            "/checkpoints",
            json!({"checkpoint": checkpoint("nofence", json!({}))}),
        ),
        ("/events", json!({"events": [{"type": "x", "payload": {}}]})),
    ] {
        let a = post(&server, &run_path(tail), WORKER_A, body).await;
        assert_eq!(a.status, 403, "{tail}: {}", a.body);
        let detail = a.problem().detail.clone().unwrap_or_default();
        assert!(detail.contains("without a fence"), "{detail}");
    }
    assert_eq!(checkpoint_ids(&store).await, before);
    // The operator's override.
    let a = post(
        &server,
        &run_path("/checkpoints"),
        TOKEN_A,
        json!({"checkpoint": checkpoint("operator", json!({}))}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // A run nobody holds takes a worker's unfenced write.
    let a = post(&server, &run_path("/release"), TOKEN_A, json!({})).await;
    assert_eq!(a.body["done"], true, "{}", a.body);
    let a = post(
        &server,
        &run_path("/checkpoints"),
        WORKER_A,
        json!({"checkpoint": checkpoint("free", json!({}))}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
}

#[tokio::test]
async fn a_stale_fence_on_release_and_snooze_is_409() {
    let (server, _store, fence) = claimed().await;
    let a = post(
        &server,
        &run_path("/release"),
        WORKER_A,
        json!({"fence": fence}),
    )
    .await;
    assert_eq!(a.body["done"], true, "{}", a.body);
    for (tail, body) in [
        ("/release", json!({"fence": fence})),
        ("/snooze", json!({"fence": fence, "until": 1})),
    ] {
        let a = post(&server, &run_path(tail), WORKER_A, body).await;
        assert_eq!(a.status, 409, "{tail}: {}", a.body);
        let p = a.problem();
        assert_eq!(p.kind(), Some(ProblemType::FencedOut), "{tail}");
        assert_eq!(p.presented, Some(fence), "{tail}");
        let detail = p.detail.clone().unwrap_or_default();
        assert!(detail.contains("holding was released"), "{tail}: {detail}");
    }
    // The Rust client keeps the contract's answer: false.
    let client = server.client(None).with_token(support::tenant(), WORKER_A);
    let done =
        runkeep::CheckpointStore::release(&client, &scope(), runkeep::Fence::new(fence).unwrap())
            .await
            .unwrap();
    assert!(!done);
}

fn zeros(values: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(values * 2 + 64);
    body.extend_from_slice(br#"{"checkpoint":{"id":"big","createdAt":1,"state":{"xs":["#);
    for i in 0..values {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'0');
    }
    body.extend_from_slice(b"]}}}");
    body
}

#[tokio::test]
async fn bodies_shaped_to_cost_more_than_their_bytes_are_refused_before_parsing() {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let server = TestServer::start(store.clone());
    let path = run_path("/checkpoints");
    // Many small numbers: 4 Mi values in 8 MiB.
    let a = send_raw(
        &server,
        reqwest::Method::POST,
        &path,
        TOKEN_A,
        zeros(4 << 20),
    )
    .await;
    assert_eq!(a.status, 413, "{}", a.body);
    let detail = a.problem().detail.clone().unwrap_or_default();
    assert!(detail.contains("JSON values"), "{detail}");
    // Deep nesting.
    let mut deep = br#"{"checkpoint":{"id":"deep","createdAt":1,"state":{"x":"#.to_vec();
    deep.extend(std::iter::repeat_n(b'[', 100_000));
    deep.extend(std::iter::repeat_n(b']', 100_000));
    deep.extend_from_slice(b"}}}");
    let a = send_raw(&server, reqwest::Method::POST, &path, TOKEN_A, deep).await;
    assert_eq!(a.status, 413, "{}", a.body);
    let detail = a.problem().detail.clone().unwrap_or_default();
    assert!(detail.contains("deep"), "{detail}");
    // Escaped quotes and brackets inside strings count for nothing.
    let tricky = json!({"checkpoint": checkpoint("tricky", json!({"s": "[[[[\"{{{,,,,\\"}))});
    let a = post(&server, &path, TOKEN_A, tricky).await;
    assert_eq!(a.status, 200, "{}", a.body);
    // Nothing of the refused bodies was written.
    let ids = checkpoint_ids(&store).await;
    assert_eq!(ids, vec!["tricky".to_string()]);

    // Just under the value limit passes; the core's own limit is the same.
    let a = send_raw(
        &server,
        reqwest::Method::POST,
        &path,
        TOKEN_A,
        zeros(runkeep::checkpoint::MAX_CHECKPOINT_VALUES - 1),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = send_raw(
        &server,
        reqwest::Method::POST,
        &path,
        TOKEN_A,
        zeros(runkeep::checkpoint::MAX_CHECKPOINT_VALUES + 1),
    )
    .await;
    assert!(a.status == 400 || a.status == 413, "{}", a.body);

    // A long string (the shape of a legitimate large checkpoint) passes and
    // reads back whole.
    let long = "x".repeat(16 << 20);
    let a = post(
        &server,
        &path,
        TOKEN_A,
        json!({"checkpoint": checkpoint("long", json!({"blob": long}))}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let back = store
        .read_checkpoint(&scope(), &CheckpointId::new("long").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.state["blob"].as_str().map(str::len), Some(16 << 20));
}

/// Opens an upload of a checkpoint body that sends `sent` bytes of it and
/// never finishes: the server has charged the bytes it received (a body is
/// charged as it arrives, not by what it declares) and holds them.
async fn hung_upload(server: &TestServer, sent: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN_A}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        run_path("/checkpoints"),
        runkeep_server::api::DEFAULT_BODY_LIMIT
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut body = br#"{"checkpoint":{"id":"hung","createdAt":1,"state":{"blob":""#.to_vec();
    body.resize(sent, b'x');
    s.write_all(&body).await.unwrap();
    s.flush().await.unwrap();
    s
}

#[tokio::test]
async fn bodies_in_flight_share_one_memory_budget_charged_by_their_values() {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let server = TestServer::start(store.clone());
    let path = run_path("/checkpoints");
    let budget =
        runkeep_server::api::budget::BodyBudget::new(runkeep_server::api::DEFAULT_BODY_LIMIT);
    // Hold all of this token's share but less than a dense body's cost
    // with uploads that sent their bytes and stopped.
    let dense_values = runkeep::checkpoint::MAX_CHECKPOINT_VALUES - 1;
    let dense_kib = dense_values * runkeep_server::api::budget::BYTES_PER_VALUE / 1024;
    let free_kib = dense_kib - 8192;
    let hold_kib = budget.token_kib() as usize - free_kib;
    assert!(hold_kib / 2 * 1024 < runkeep_server::api::DEFAULT_BODY_LIMIT);
    let mut hung = Vec::new();
    for _ in 0..2 {
        hung.push(hung_upload(&server, hold_kib / 2 * 1024).await);
    }
    // Let the server read and charge them.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // A dense body (2 MiB on the wire, ~1 Mi values) finds no room: its
    // bytes alone would have fit.
    let a = send_raw(
        &server,
        reqwest::Method::POST,
        &path,
        TOKEN_A,
        zeros(dense_values),
    )
    .await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.problem().kind(), Some(ProblemType::Overloaded));
    // A small body still passes.
    let a = post(
        &server,
        &path,
        TOKEN_A,
        json!({"checkpoint": checkpoint("small", json!({"n": 1}))}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // The uploads go away: their charge comes back, the dense body passes.
    drop(hung);
    let mut status = 0;
    for _ in 0..50 {
        let a = send_raw(
            &server,
            reqwest::Method::POST,
            &path,
            TOKEN_A,
            zeros(dense_values),
        )
        .await;
        status = a.status;
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200);
}
