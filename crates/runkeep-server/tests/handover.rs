//! The hand-over (`POST {run}/steps/hand-over`,
//! `EvidenceStore::commit_step_and_claim_next`) through the server:
//!
//! - through `HttpStore` (one request) over a served memory store and a
//!   served directory store: the step commits and the next run comes back
//!   with its fence; a refused (stale-fence) step claims nothing; an empty
//!   queue answers no next run with the step committed; a claim that failed
//!   after the step committed comes back as `Handover::next`'s error, of the
//!   backing store's kind;
//! - who may: another worker token presenting the fence is 403 (as
//!   `commit_step`), a holder carrying the server's token tag is 400 (as
//!   `claim-next`), the run taken is bound to the caller's token, a reader
//!   token is 403;
//! - strict bodies: a misspelt or unknown field anywhere (`waitMs` included)
//!   is 400 naming it, and nothing changes.

mod common;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions, Error, EvidenceStore, Holder,
    Lease, LeaseSummary, ListingScope, MemoryStore, NextClaim, Outcome, ReadEventsOptions,
    RunScope, RunStatus, RunStore, Step, Ttl,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_conformance::support;
use runkeep_fs::{Attribution, FsOptions, FsStore};
use runkeep_server::client::{HttpStore, HttpStoreOptions};
use runkeep_server::problem::{Problem, ProblemType};
use serde_json::{json, Value};

use common::{TestServer, READER_A, TOKEN_A, WORKER_A, WORKER_A2};

// ------------------------------------------------------------- fixtures

/// A served backing store and an `HttpStore` holding a worker token.
struct Served {
    backing: Arc<dyn RunStore>,
    client: HttpStore,
    server: TestServer,
    /// Every request the server was sent: `METHOD path`.
    requests: Arc<Mutex<Vec<String>>>,
    _dir: Option<tempfile::TempDir>,
}

impl Served {
    /// The requests sent since the last call.
    fn take_requests(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

fn worker_client(server: &TestServer, token: &str) -> HttpStore {
    HttpStore::new(
        server.url(),
        HttpStoreOptions {
            request_timeout: Duration::from_secs(20),
            ..Default::default()
        },
    )
    .unwrap()
    .with_token(support::tenant(), token)
}

fn serve(backing: Arc<dyn RunStore>, dir: Option<tempfile::TempDir>) -> Served {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    let server = TestServer::start_wrapped(
        "127.0.0.1:0".parse().unwrap(),
        backing.clone(),
        move |router| {
            router.layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    seen.lock()
                        .unwrap()
                        .push(format!("{} {}", req.method(), req.uri().path()));
                    next.run(req)
                },
            ))
        },
    );
    Served {
        client: worker_client(&server, WORKER_A),
        backing,
        server,
        requests,
        _dir: dir,
    }
}

fn memory() -> Served {
    serve(Arc::new(MemoryStore::new()), None)
}

fn directory() -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    let backing = FsStore::open(
        dir.path().join("runs"),
        FsOptions {
            attribution: Some(Attribution {
                tenant_id: support::tenant(),
                project_id: support::project(),
                session_id: support::session(),
            }),
            ..Default::default()
        },
    )
    .expect("open the store");
    serve(Arc::new(backing), Some(dir))
}

async fn enqueue(store: &Arc<dyn RunStore>, name: &str) -> RunScope {
    let scope = support::run(name);
    store
        .enqueue(
            &scope,
            &support::checkpoint(&format!("{name}_0"), 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("enqueue {name}: {e}"));
    scope
}

fn options(holder: &str) -> ClaimOptions {
    ClaimOptions::new(
        Holder::new(holder).unwrap(),
        Ttl::from_millis(60_000).unwrap(),
    )
}

fn next_claim(holder: &str) -> NextClaim {
    NextClaim {
        scope: support::listing(),
        filter: ClaimNextFilter::default(),
        options: options(holder),
    }
}

fn step_finishing(note: &str) -> Step {
    Step {
        events: vec![support::event("note", json!({ "note": note }))],
        finish: Some(Outcome::completed(None)),
        ..Default::default()
    }
}

fn step_noting(note: &str) -> Step {
    Step {
        events: vec![support::event("note", json!({ "note": note }))],
        ..Default::default()
    }
}

/// Takes the next run through `client`; expects `expected`.
async fn take_next(client: &HttpStore, holder: &str, expected: &RunScope) -> Lease {
    let (run, lease) = client
        .claim_next(
            &support::listing(),
            &ClaimNextFilter::default(),
            &options(holder),
        )
        .await
        .expect("claim_next")
        .expect("a run is claimable");
    assert_eq!(&run, expected);
    lease
}

async fn event_count(store: &Arc<dyn RunStore>, scope: &RunScope) -> usize {
    store
        .read_events(scope, &ReadEventsOptions::default())
        .await
        .unwrap()
        .events
        .len()
}

async fn top(store: &Arc<dyn RunStore>, scope: &RunScope) -> Option<LeaseSummary> {
    store.lease(scope, store.now()).await.unwrap()
}

// ------------------------------------------- through HttpStore, per store

async fn hands_over_the_step_and_the_next_run(s: Served) {
    let a = enqueue(&s.backing, "a").await;
    let b = enqueue(&s.backing, "b").await;
    let held = take_next(&s.client, "w1", &a).await;

    s.take_requests();
    let h = s
        .client
        .commit_step_and_claim_next(&a, held.fence, &step_finishing("a done"), &next_claim("w1"))
        .await
        .expect("the hand-over");
    assert_eq!(
        s.take_requests(),
        vec![format!("POST {}", run_path(&a, "/steps/hand-over"))],
        "one request"
    );
    assert_eq!(h.receipt.events.len(), 1);
    assert_eq!(
        h.receipt.lifecycle.as_ref().map(|l| l.status),
        Some(RunStatus::Completed)
    );
    let (run, lease) = h.next.expect("the claim").expect("b was claimable");
    assert_eq!(run, b);
    assert_eq!(
        lease.holder.as_str(),
        "w1",
        "the holder as the worker named it"
    );

    // In the backing store: a finished with its event, b held at that fence
    // through this token.
    assert_eq!(event_count(&s.backing, &a).await, 1);
    assert!(s.backing.lifecycle(&a).await.unwrap().status.is_finished());
    let b_top = top(&s.backing, &b).await.expect("b is held");
    assert_eq!(b_top.fence, lease.fence);
    assert!(!b_top.expired);
    assert!(b_top.holder.starts_with("w1 ~token:"), "{}", b_top.holder);

    // The fence handed back is the one that writes b, through this token.
    s.client
        .commit_step(&b, lease.fence, &step_noting("b, first step"))
        .await
        .expect("a step under the handed-over fence");
    // …and through no other worker's.
    let other = worker_client(&s.server, WORKER_A2);
    let e = other
        .commit_step(&b, lease.fence, &step_noting("hijack"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::NotYourHolding { fence, fenced: true, .. } if fence == lease.fence),
        "403 not-your-holding expected: {e}"
    );
    assert_eq!(event_count(&s.backing, &b).await, 1);
}

async fn a_refused_step_claims_nothing(s: Served) {
    let a = enqueue(&s.backing, "a").await;
    let b = enqueue(&s.backing, "b").await;
    let first = take_next(&s.client, "w1", &a).await;
    // Release and take a again: the first fence is stale.
    assert!(s.client.release(&a, first.fence).await.unwrap());
    let second = take_next(&s.client, "w1", &a).await;
    assert!(second.fence > first.fence);

    let e = s
        .client
        .commit_step_and_claim_next(&a, first.fence, &step_finishing("stale"), &next_claim("w1"))
        .await
        .unwrap_err();
    support::expect_fenced::<()>(Err(e), first.fence, "a hand-over under a stale fence");

    // Nothing of the step, nothing claimed: a is still held at the second
    // fence and unfinished, b is free and the next claim takes it.
    assert_eq!(event_count(&s.backing, &a).await, 0);
    assert!(!s.backing.lifecycle(&a).await.unwrap().status.is_finished());
    assert_eq!(top(&s.backing, &a).await.unwrap().fence, second.fence);
    assert!(top(&s.backing, &b).await.is_none(), "b was claimed");
    take_next(&s.client, "w2", &b).await;
}

async fn an_empty_queue_hands_over_no_run_with_the_step_committed(s: Served) {
    let a = enqueue(&s.backing, "a").await;
    let held = take_next(&s.client, "w1", &a).await;

    // A step that leaves the run held: the run is the caller's already and
    // never its own next one.
    let h = s
        .client
        .commit_step_and_claim_next(&a, held.fence, &step_noting("middle"), &next_claim("w1"))
        .await
        .expect("the hand-over");
    assert_eq!(h.receipt.events.len(), 1);
    assert!(h.receipt.lifecycle.is_none());
    assert!(
        h.next.expect("the claim").is_none(),
        "its own run came back"
    );
    assert_eq!(top(&s.backing, &a).await.unwrap().fence, held.fence);

    // The last step.
    let h = s
        .client
        .commit_step_and_claim_next(&a, held.fence, &step_finishing("end"), &next_claim("w1"))
        .await
        .expect("the hand-over");
    assert!(h.next.expect("the claim").is_none());
    assert_eq!(event_count(&s.backing, &a).await, 2);
    assert_eq!(
        s.backing.lifecycle(&a).await.unwrap().status,
        RunStatus::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hands_over_the_step_and_the_next_run() {
    hands_over_the_step_and_the_next_run(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_hands_over_the_step_and_the_next_run() {
    hands_over_the_step_and_the_next_run(directory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_refused_step_claims_nothing() {
    a_refused_step_claims_nothing(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_a_refused_step_claims_nothing() {
    a_refused_step_claims_nothing(directory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_an_empty_queue_hands_over_no_run_with_the_step_committed() {
    an_empty_queue_hands_over_no_run_with_the_step_committed(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_an_empty_queue_hands_over_no_run_with_the_step_committed() {
    an_empty_queue_hands_over_no_run_with_the_step_committed(directory()).await;
}

// ------------------------------------- a claim that fails after the step

/// A memory store whose `claim_next` fails on demand: 1 = `Contended`,
/// 2 = `Unavailable` with outcome unknown. Its hand-over is `Intercept`'s
/// default, the provided body (commit, then this `claim_next`), so the step
/// commits and the claim fails.
#[derive(Debug, Default)]
struct FailingClaims {
    inner: MemoryStore,
    fail: AtomicU8,
}

#[async_trait]
impl Intercept for FailingClaims {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    async fn claim_next(
        &self,
        s: &ListingScope,
        f: &ClaimNextFilter,
        o: &ClaimOptions,
    ) -> runkeep::Result<Option<(RunScope, Lease)>> {
        match self.fail.load(Ordering::SeqCst) {
            1 => Err(Error::Contended {
                run: "run_conformance_b".into(),
                attempts: 3,
            }),
            2 => Err(Error::outcome_unknown(
                "claim_next",
                std::io::Error::other("injected lost acknowledgement"),
            )),
            _ => self.inner.claim_next(s, f, o).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_failed_after_the_step_comes_back_in_next_with_its_kind() {
    let failing = Arc::new(Intercepted(FailingClaims::default()));
    let s = serve(failing.clone(), None);
    let a = enqueue(&s.backing, "a").await;
    let b = enqueue(&s.backing, "b").await;
    let c = enqueue(&s.backing, "c").await;
    let held = take_next(&s.client, "w1", &a).await;

    // Contended: the step stands, the claim's error keeps its kind.
    failing.fail.store(1, Ordering::SeqCst);
    s.take_requests();
    let h = s
        .client
        .commit_step_and_claim_next(&a, held.fence, &step_finishing("a done"), &next_claim("w1"))
        .await
        .expect("the step committed: the hand-over is Ok");
    assert_eq!(h.receipt.events.len(), 1);
    match h.next {
        Err(Error::Contended { run, attempts }) => {
            assert_eq!(run, "run_conformance_b");
            assert_eq!(attempts, 3);
        }
        other => panic!("expected the claim's Contended, got {other:?}"),
    }
    assert_eq!(s.take_requests().len(), 1, "one request");
    assert!(s.backing.lifecycle(&a).await.unwrap().status.is_finished());
    assert!(top(&s.backing, &b).await.is_none(), "nothing was claimed");

    // Outcome unknown travels as outcome unknown, on the wire as a problem
    // in `nextError` of a 200 answer.
    failing.fail.store(0, Ordering::SeqCst);
    let held = take_next(&s.client, "w1", &b).await;
    failing.fail.store(2, Ordering::SeqCst);
    let answer = post(
        &s.server,
        &run_path(&b, "/steps/hand-over"),
        WORKER_A,
        json!({
            "fence": held.fence.get(),
            "step": {"events": [{"type": "note", "payload": {}}]},
            "next": {"holder": "w1", "ttlMs": 60_000},
        }),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["next"], Value::Null);
    assert_eq!(answer.body["receipt"]["events"][0]["seq"], 1);
    let p: Problem = serde_json::from_value(answer.body["nextError"].clone()).unwrap();
    assert_eq!(p.kind(), Some(ProblemType::Unavailable));
    assert!(p.outcome_unknown);
    let e = p.into_error("claim_next");
    assert!(e.is_outcome_unknown(), "{e}");
    assert!(top(&s.backing, &c).await.is_none());

    // Claims work again: the next hand-over takes c.
    failing.fail.store(0, Ordering::SeqCst);
    let h = s
        .client
        .commit_step_and_claim_next(&b, held.fence, &step_finishing("b done"), &next_claim("w1"))
        .await
        .unwrap();
    assert_eq!(h.next.unwrap().unwrap().0, c);
}

// ------------------------------------------------------------ raw HTTP

struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn problem(&self) -> Problem {
        serde_json::from_value(self.body.clone()).expect("a problem body")
    }
}

fn run_path(scope: &RunScope, tail: &str) -> String {
    format!(
        "/v1/tenants/{}/projects/{}/sessions/{}/runs/{}{tail}",
        scope.tenant_id, scope.project_id, scope.session_id, scope.run_id
    )
}

async fn post(server: &TestServer, path: &str, token: &str, body: Value) -> Answer {
    let res = reqwest::Client::new()
        .post(format!("{}{path}", server.url()))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("the server answers");
    let status = res.status().as_u16();
    Answer {
        status,
        body: res.json().await.unwrap_or(Value::Null),
    }
}

async fn token_id(server: &TestServer, token: &str) -> String {
    let res = reqwest::Client::new()
        .get(format!("{}/v1/whoami", server.url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let who: Value = res.json().await.unwrap();
    who["tokenId"].as_str().expect("tokenId").to_string()
}

/// Memory store with runs a and b, a claimed over HTTP by `WORKER_A` as
/// `worker-1`; answers the fence.
async fn a_claimed() -> (Served, RunScope, RunScope, u64) {
    let s = memory();
    let a = enqueue(&s.backing, "a").await;
    let b = enqueue(&s.backing, "b").await;
    let answer = post(
        &s.server,
        &format!("/v1/tenants/{}/claim-next", support::tenant()),
        WORKER_A,
        json!({"holder": "worker-1", "ttlMs": 60_000}),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["claimed"]["run"]["runId"], a.run_id.as_str());
    let fence = answer.body["claimed"]["lease"]["fence"].as_u64().unwrap();
    (s, a, b, fence)
}

fn hand_over_body(fence: u64, holder: &str) -> Value {
    json!({
        "fence": fence,
        "step": {"events": [{"type": "note", "payload": {"n": 1}}], "finish": {"status": "completed"}},
        "next": {"holder": holder, "ttlMs": 60_000},
    })
}

/// Nothing of a hand-over landed: a has no event and is held at `fence`
/// unfinished, b is held by nobody.
async fn unchanged(s: &Served, a: &RunScope, b: &RunScope, fence: u64) {
    assert_eq!(event_count(&s.backing, a).await, 0, "the step landed");
    assert!(!s.backing.lifecycle(a).await.unwrap().status.is_finished());
    let a_top = top(&s.backing, a).await.expect("a is held");
    assert_eq!(a_top.fence.get(), fence);
    assert!(a_top.holder.starts_with("worker-1 ~token:"));
    assert!(top(&s.backing, b).await.is_none(), "b was claimed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_workers_token_cannot_hand_over_a_holding_it_did_not_claim() {
    let (s, a, b, fence) = a_claimed().await;
    let path = run_path(&a, "/steps/hand-over");

    // commit_step's refusal and the hand-over's are the same: 403, before
    // the store is touched, whatever holder the next claim names (the
    // holder's own name included).
    let step = post(
        &s.server,
        &run_path(&a, "/steps"),
        WORKER_A2,
        json!({"fence": fence, "step": {"events": [{"type": "note", "payload": {}}]}}),
    )
    .await;
    assert_eq!(step.status, 403, "{}", step.body);
    for holder in ["worker-1", "worker-2"] {
        let answer = post(&s.server, &path, WORKER_A2, hand_over_body(fence, holder)).await;
        assert_eq!(answer.status, 403, "{holder}: {}", answer.body);
        assert_eq!(answer.problem().kind(), Some(ProblemType::Forbidden));
    }
    unchanged(&s, &a, &b, fence).await;

    // A next holder carrying the server's tag (to pass as worker-1's token)
    // is refused as claim-next refuses it, naming the field.
    let victim = token_id(&s.server, WORKER_A).await;
    let forged = format!("worker-1 ~token:{victim}");
    let claim_next = post(
        &s.server,
        &format!("/v1/tenants/{}/claim-next", support::tenant()),
        WORKER_A2,
        json!({"holder": forged, "ttlMs": 60_000}),
    )
    .await;
    assert_eq!(claim_next.status, 400, "{}", claim_next.body);
    assert_eq!(claim_next.problem().field.as_deref(), Some("holder"));
    for token in [WORKER_A2, WORKER_A] {
        let answer = post(&s.server, &path, token, hand_over_body(fence, &forged)).await;
        assert_eq!(answer.status, 400, "{}", answer.body);
        let p = answer.problem();
        assert_eq!(p.kind(), Some(ProblemType::InvalidInput));
        assert_eq!(p.field.as_deref(), Some("next.holder"));
        assert_eq!(p.detail, claim_next.problem().detail);
    }
    unchanged(&s, &a, &b, fence).await;

    // A reader token: 403 naming the role.
    let answer = post(&s.server, &path, READER_A, hand_over_body(fence, "r")).await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    assert_eq!(answer.problem().required_role.as_deref(), Some("worker"));
    unchanged(&s, &a, &b, fence).await;

    // The holder's own token hands over, naming the next holder as it
    // likes; the run taken is bound to this token, not to the name.
    let answer = post(
        &s.server,
        &path,
        WORKER_A,
        hand_over_body(fence, "worker-2"),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["next"]["run"]["runId"], b.run_id.as_str());
    assert_eq!(answer.body["next"]["lease"]["holder"], "worker-2");
    assert!(answer.body.get("nextError").is_none(), "{}", answer.body);
    let b_fence = answer.body["next"]["lease"]["fence"].as_u64().unwrap();
    let b_top = top(&s.backing, &b).await.unwrap();
    assert_eq!(b_top.holder, format!("worker-2 ~token:{victim}"));
    let hijack = post(
        &s.server,
        &run_path(&b, "/steps"),
        WORKER_A2,
        json!({"fence": b_fence, "step": {"events": [{"type": "note", "payload": {}}]}}),
    )
    .await;
    assert_eq!(hijack.status, 403, "{}", hijack.body);
    // An operator may act on any holding (as for every fenced write).
    let answer = post(
        &s.server,
        &run_path(&b, "/steps/hand-over"),
        TOKEN_A,
        hand_over_body(b_fence, "ops"),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["next"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_or_unknown_field_is_refused_naming_it_and_changes_nothing() {
    let (s, a, b, fence) = a_claimed().await;
    let path = run_path(&a, "/steps/hand-over");
    let step =
        json!({"events": [{"type": "note", "payload": {}}], "finish": {"status": "completed"}});
    let next = json!({"holder": "worker-1", "ttlMs": 60_000});
    let cases: Vec<(&str, Value)> = vec![
        ("fense", json!({"fense": fence, "step": step, "next": next})),
        ("nxt", json!({"fence": fence, "step": step, "nxt": next})),
        (
            "step.evnts",
            json!({"fence": fence, "step": {"evnts": []}, "next": next}),
        ),
        (
            "next.holdr",
            json!({"fence": fence, "step": step, "next": {"holdr": "w", "ttlMs": 60_000}}),
        ),
        // claim-next's wait is not the hand-over's: unknown here.
        (
            "next.waitMs",
            json!({"fence": fence, "step": step, "next": {"holder": "w", "ttlMs": 60_000, "waitMs": 1000}}),
        ),
        // No client instant either.
        (
            "next.now",
            json!({"fence": fence, "step": step, "next": {"holder": "w", "ttlMs": 60_000, "now": 1}}),
        ),
    ];
    for (field, body) in cases {
        let answer = post(&s.server, &path, WORKER_A, body).await;
        assert_eq!(answer.status, 400, "{field}: {}", answer.body);
        let p = answer.problem();
        assert_eq!(p.kind(), Some(ProblemType::MalformedBody), "{field}");
        assert_eq!(p.field.as_deref(), Some(field));
    }
    // Missing parts are refused too.
    let answer = post(
        &s.server,
        &path,
        WORKER_A,
        json!({"fence": fence, "step": step}),
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    // A next session without its project, an invalid id: invalid input
    // named under `next`.
    let answer = post(
        &s.server,
        &path,
        WORKER_A,
        json!({"fence": fence, "step": step, "next": {"holder": "w", "ttlMs": 60_000, "session": "s"}}),
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.problem().field.as_deref(), Some("next.session"));
    let answer = post(
        &s.server,
        &path,
        WORKER_A,
        json!({"fence": fence, "step": step, "next": {"holder": "w", "ttlMs": 0}}),
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.problem().field.as_deref(), Some("next.ttlMs"));
    unchanged(&s, &a, &b, fence).await;
}

/// `HttpStore` refuses a client instant before sending anything (the step
/// is not committed), and a next claim in another tenant takes the two
/// requests of the provided body (the route names one tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_store_sends_no_instant_and_crosses_tenants_in_two_requests() {
    let s = memory();
    let a = enqueue(&s.backing, "a").await;
    let held = take_next(&s.client, "w1", &a).await;
    let mut next = next_claim("w1");
    next.options.now = Some(s.backing.now());
    let e = s
        .client
        .commit_step_and_claim_next(&a, held.fence, &step_finishing("x"), &next)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot be sent over HTTP"), "{e}");
    assert_eq!(event_count(&s.backing, &a).await, 0);

    // Another tenant: an operator client holding both tenants' tokens.
    let other = RunScope::new(
        support::other_tenant(),
        support::project(),
        support::session(),
        "run_conformance_other".parse().unwrap(),
    );
    s.backing
        .enqueue(
            &other,
            &support::checkpoint("o", 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    let operator = s.server.client(None);
    let next = NextClaim {
        scope: ListingScope::tenant(support::other_tenant()),
        filter: ClaimNextFilter::default(),
        options: options("w1"),
    };
    let h = operator
        .commit_step_and_claim_next(&a, held.fence, &step_finishing("a done"), &next)
        .await
        .unwrap();
    assert_eq!(h.next.unwrap().unwrap().0, other);
    assert!(s.backing.lifecycle(&a).await.unwrap().status.is_finished());
    // With no token for the other tenant the claim is refused after the
    // step, as the provided body reports it.
    let b = enqueue(&s.backing, "b").await;
    let held = take_next(&s.client, "w1", &b).await;
    let h = s
        .client
        .commit_step_and_claim_next(&b, held.fence, &step_finishing("b done"), &next)
        .await
        .unwrap();
    assert!(
        matches!(h.next, Err(Error::InvalidInput { .. })),
        "{:?}",
        h.next
    );
    assert!(s.backing.lifecycle(&b).await.unwrap().status.is_finished());
}
