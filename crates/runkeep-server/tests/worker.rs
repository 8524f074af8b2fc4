//! The worker runtime through the server: workers drain a queue via
//! `HttpStore`, and a step whose commit landed but whose HTTP answer was
//! lost (the server drops the connection after the store committed) is
//! resolved by the worker's read-back — never repeated.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use runkeep::{
    EnqueueOptions, Holder, ListingScope, NewEvent, ReadEventsOptions, RunId, RunScope, RunStatus,
    RunStore, Step, Ttl,
};
use runkeep_conformance::support;
use runkeep_worker::{DrainMode, StepOutcome, Worker, WorkerError, WorkerOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::TestServer;

/// Steps whose answer the server drops after the store committed them.
static DROPPED: AtomicUsize = AtomicUsize::new(0);
/// The status the dropped step's commit got from the store (200: landed).
static DROPPED_STATUS: AtomicUsize = AtomicUsize::new(0);

/// The first step commit is served, then its connection is dropped without
/// an answer (the handler panics after the store committed).
async fn lose_first_step_answer(req: Request, next: Next) -> axum::response::Response {
    let is_step = req.method() == axum::http::Method::POST && req.uri().path().ends_with("/steps");
    let res = next.run(req).await;
    if is_step && DROPPED.fetch_add(1, Ordering::SeqCst) == 0 {
        DROPPED_STATUS.store(res.status().as_u16() as usize, Ordering::SeqCst);
        panic!("test: dropping the answer of a committed step");
    }
    res
}

fn scope(i: usize) -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        support::session(),
        RunId::new(format!("run_w_{i:03}")).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_drain_through_the_server_and_a_lost_step_answer_is_read_back_not_repeated() {
    const RUNS: usize = 24;
    let backing: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let server = TestServer::start_wrapped("127.0.0.1:0".parse().unwrap(), backing.clone(), |r| {
        r.layer(axum::middleware::from_fn(lose_first_step_answer))
    });
    let http: Arc<dyn RunStore> = Arc::new(server.client(None));
    for i in 0..RUNS {
        http.enqueue(
            &scope(i),
            &support::checkpoint("0", 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    }
    let mut drains = Vec::new();
    for w in 0..2 {
        let mut options = WorkerOptions::new(
            Holder::new(format!("http-worker-{w}")).unwrap(),
            Ttl::from_millis(10_000).unwrap(),
        );
        options.mode = DrainMode::UntilIdle;
        let worker = Worker::new(
            http.clone(),
            ListingScope::session(support::tenant(), support::project(), support::session()),
            options,
        )
        .unwrap();
        drains.push(tokio::spawn(async move {
            worker
                .drain(CancellationToken::new(), |h, _resume| async move {
                    let step = Step {
                        events: vec![NewEvent::new(
                            "work",
                            json!({"run": h.scope().run_id.as_str()})
                                .as_object()
                                .unwrap()
                                .clone(),
                        )],
                        checkpoint: Some(support::checkpoint("1", 1)),
                        ..Step::default()
                    };
                    h.commit_step(&step).await?;
                    Ok::<_, WorkerError>(StepOutcome::Finished)
                })
                .await
        }));
    }
    let mut completed = 0;
    let mut failed = 0;
    for d in drains {
        let r = tokio::time::timeout(Duration::from_secs(60), d)
            .await
            .expect("the drains end")
            .unwrap();
        completed += r.completed;
        failed += r.failed;
        assert!(r.failures.is_empty(), "{:?}", r.failures);
    }
    assert!(DROPPED.load(Ordering::SeqCst) >= 1, "the fault never fired");
    assert_eq!(
        DROPPED_STATUS.load(Ordering::SeqCst),
        200,
        "the dropped step had landed in the store"
    );
    assert_eq!((completed, failed), (RUNS as u64, 0));
    for i in 0..RUNS {
        let s = scope(i);
        let events = backing
            .read_events(&s, &ReadEventsOptions::default())
            .await
            .unwrap();
        let work = events
            .events
            .iter()
            .filter(|e| e.event_type == "work")
            .count();
        assert_eq!(
            work, 1,
            "{}: the step's event was written {work} times",
            s.run_id
        );
        assert_eq!(
            backing.lifecycle(&s).await.unwrap().status,
            RunStatus::Completed,
            "{}",
            s.run_id
        );
    }
}

/// Through the server: a failed attempt past its limit dead-letters the run
/// with its error, an operator's cancel makes the holder's next write
/// answer `Cancelled` (problem type `cancelled`, mapped back by
/// `HttpStore`), and `/metrics` counts both per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_and_cancels_travel_and_are_counted_per_tenant() {
    let backing: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let server = TestServer::start(backing.clone());
    let http: Arc<dyn RunStore> = Arc::new(server.client(None));
    let claim = |who: &str| {
        runkeep::ClaimOptions::new(Holder::new(who).unwrap(), Ttl::from_millis(60_000).unwrap())
    };
    let (a, b) = (scope(900), scope(901));
    for s in [&a, &b] {
        http.enqueue(
            s,
            &support::checkpoint(s.run_id.as_str(), 0),
            &EnqueueOptions {
                max_attempts: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    let lease = http.claim(&a, &claim("w")).await.unwrap().lease().unwrap();
    let l = http
        .fail_attempt(
            &a,
            lease.fence,
            &runkeep::AttemptError::new("timeout", "the step ran past 30 s"),
            None,
        )
        .await
        .unwrap();
    assert!(l.is_dead_lettered(), "{l:?}");
    assert_eq!(l.failures[0].error.kind, "timeout");
    assert_eq!(
        backing.lifecycle(&a).await.unwrap(),
        l,
        "what travelled back"
    );
    let lease = http.claim(&b, &claim("w")).await.unwrap().lease().unwrap();
    http.cancel(&b, Some("called off")).await.unwrap();
    match http
        .append_events(
            &b,
            &[NewEvent::new("late", Default::default())],
            Some(lease.fence),
        )
        .await
    {
        Err(runkeep::Error::Cancelled { reason, .. }) => {
            assert_eq!(reason.as_deref(), Some("called off"))
        }
        other => panic!("the holder's write after a cancel answered {other:?}"),
    }
    let text = server.metrics.render();
    let tenant = a.tenant_id.as_str();
    for kind in ["failed_attempt", "dead_lettered", "timed_out", "cancelled"] {
        let series = format!("runkeep_run_failures_total{{kind=\"{kind}\",tenant=\"{tenant}\"}} 1");
        assert!(
            text.contains(&series),
            "{series} missing from /metrics:\n{text}"
        );
    }
}
