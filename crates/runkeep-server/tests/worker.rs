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
