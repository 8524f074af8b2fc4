//! `HttpStore` when the server goes away and comes back: errors within a
//! bound, never hangs; a write whose answer is lost is outcome unknown, one
//! that never connected is a plain (retryable) `Unavailable`; the next call
//! after a restart succeeds.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use runkeep::{CheckpointStore, EvidenceStore, NewEvent, RunStore};
use runkeep_conformance::support;
use runkeep_server::client::{HttpStore, HttpStoreOptions};
use serde_json::json;

use common::{TestServer, TOKEN_A};

fn options() -> HttpStoreOptions {
    HttpStoreOptions {
        request_timeout: Duration::from_millis(700),
        connect_timeout: Duration::from_millis(500),
        ..Default::default()
    }
}

fn ev() -> NewEvent {
    NewEvent::new("step", json!({"n": 1}).as_object().unwrap().clone())
}

/// A "server" that accepts connections and reads requests but never
/// answers: the request was sent, its answer never comes.
async fn black_hole() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_never_comes_is_outcome_unknown_within_the_timeout() {
    let addr = black_hole().await;
    let store = HttpStore::new(format!("http://{addr}"), options())
        .unwrap()
        .with_token(support::tenant(), TOKEN_A);
    let scope = support::run("hole");
    let started = Instant::now();
    let e = store
        .append_events(&scope, &[ev()], None)
        .await
        .expect_err("nothing answers");
    let took = started.elapsed();
    assert!(e.is_outcome_unknown(), "a lost answer to a write: {e}");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}: the reply bound did not hold"
    );
    // A read is retryable, not outcome unknown.
    let e = store
        .list_checkpoints(&scope)
        .await
        .expect_err("nothing answers");
    assert!(e.is_retryable() && !e.is_outcome_unknown(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_went_away_is_an_error_and_its_return_is_used_again() {
    let server = TestServer::start(Arc::new(runkeep::MemoryStore::new()));
    let addr = server.addr;
    let store: Arc<dyn RunStore> = Arc::new(
        HttpStore::new(server.url(), options())
            .unwrap()
            .with_token(support::tenant(), TOKEN_A),
    );
    let scope = support::run("away");
    store.append_events(&scope, &[ev()], None).await.unwrap();
    server.kill();
    let started = Instant::now();
    // The store that talked to the server may still hold its kept-alive
    // connection, and whether the client sees that connection's close
    // before or after writing the next request into it is a race: after
    // the write, a lost answer is honestly outcome unknown. Either way the
    // write is an error within the bound.
    let e = store
        .append_events(&scope, &[ev()], None)
        .await
        .expect_err("the server is gone");
    assert!(e.is_retryable() || e.is_outcome_unknown(), "{e}");
    // A store with no connection to reuse must connect, cannot, and so
    // sent nothing: a plain retryable error, never outcome unknown.
    let fresh = HttpStore::new(format!("http://{addr}"), options())
        .unwrap()
        .with_token(support::tenant(), TOKEN_A);
    let e = fresh
        .append_events(&scope, &[ev()], None)
        .await
        .expect_err("the server is gone");
    assert!(e.is_retryable(), "{e}");
    assert!(
        !e.is_outcome_unknown(),
        "a write that could not connect was not sent: {e}"
    );
    let e = store.list_checkpoints(&scope).await.expect_err("gone");
    assert!(e.is_retryable(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Back on the same port (a fresh store: the old one died with it).
    let server = TestServer::start_on(addr, Arc::new(runkeep::MemoryStore::new()));
    let out = store.append_events(&scope, &[ev()], None).await.unwrap();
    assert_eq!(out[0].seq, 1);
    drop(server);
}

/// The watch is woken by the long-poll, not by its fallback interval (set
/// to a minute here): an append right after `watch()` wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_woken_by_the_server_not_by_its_fallback() {
    let server = TestServer::start(Arc::new(runkeep::MemoryStore::new()));
    let store = HttpStore::new(
        server.url(),
        HttpStoreOptions {
            watch_fallback: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .unwrap()
    .with_token(support::tenant(), TOKEN_A);
    let scope = support::run("watched");
    store.append_events(&scope, &[ev()], None).await.unwrap();
    for _ in 0..3 {
        let mut w = store.watch(&runkeep::WatchTopic::Events(scope.clone()));
        assert!(!w.is_polling());
        // Appended before the background long-poll can have reached the
        // server: still seen.
        store.append_events(&scope, &[ev()], None).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), w.changed())
            .await
            .expect("the events watch woke within 10 s (its fallback is 60 s)");
    }
    // Runnable: a release wakes an idle worker's watch.
    store
        .write_checkpoint(&scope, &support::checkpoint("1", 0), None)
        .await
        .unwrap();
    let lease = store
        .claim(&scope, &support::claim_now("w1", 60_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let mut w = store.watch(&runkeep::WatchTopic::Runnable(support::listing()));
    // Let the long-poll reach the server (the runnable wait has no seq to
    // start from; before it arrives only the fallback covers a change).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.release(&scope, lease.fence).await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), w.changed())
        .await
        .expect("the runnable watch woke within 10 s (its fallback is 60 s)");
}

/// `claim_next` long-polls on the server: an empty queue answers `None`
/// after the wait; a run enqueued during the wait is handed out when the
/// store's watch wakes the poll (long before the wait runs out); a wait
/// above the bound is refused naming `waitMs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_next_long_polls_and_is_woken_by_an_enqueue() {
    let server = TestServer::start(Arc::new(runkeep::MemoryStore::new()));
    let store = server.client(None);
    let filter = runkeep::ClaimNextFilter::default();
    let claim = support::claim_now("w1", 60_000);
    let started = Instant::now();
    let none = store
        .claim_next_waiting(
            &support::listing(),
            &filter,
            &claim,
            Duration::from_millis(400),
        )
        .await
        .unwrap();
    assert!(none.is_none());
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "it did not wait"
    );

    let other = store.clone();
    let enqueue = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        other
            .enqueue(
                &support::run("late"),
                &support::checkpoint("0", 0),
                &runkeep::EnqueueOptions::default(),
            )
            .await
            .unwrap();
    });
    let started = Instant::now();
    let got = store
        .claim_next_waiting(
            &support::listing(),
            &filter,
            &claim,
            Duration::from_secs(25),
        )
        .await
        .unwrap()
        .expect("the enqueued run");
    assert_eq!(got.0, support::run("late"));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "handed out only when the wait ran out ({:?}): the watch did not wake the poll",
        started.elapsed()
    );
    enqueue.await.unwrap();

    let e = store
        .claim_next_waiting(
            &support::listing(),
            &filter,
            &claim,
            Duration::from_secs(31),
        )
        .await
        .expect_err("above the bound");
    assert!(matches!(e, runkeep::Error::InvalidInput { .. }), "{e}");
    assert!(e.to_string().contains("waitMs"), "{e}");
}
