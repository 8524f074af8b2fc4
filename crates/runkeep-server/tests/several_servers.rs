//! `HttpStore::with_servers`: one client in front of several servers over
//! one store fails over. A request that could not connect goes to the next
//! server at once; a read whose answer was lost too; a write whose answer
//! was lost is outcome unknown and the calls after it go to the next
//! server; a lease is renewed through another server when its own was
//! killed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use runkeep::{
    CheckpointStore, ClaimOptions, ClaimOutcome, EvidenceStore, Holder, NewEvent, RunStore, Ttl,
};
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

fn client(urls: &[String]) -> HttpStore {
    HttpStore::with_servers(urls.to_vec(), options())
        .unwrap()
        .with_token(support::tenant(), TOKEN_A)
}

fn ev() -> NewEvent {
    NewEvent::new("step", json!({"n": 1}).as_object().unwrap().clone())
}

/// A port nothing listens on (bound, then closed).
fn closed_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

/// Accepts connections and reads requests but never answers.
async fn black_hole() -> String {
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
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_connect_goes_to_the_next_server() {
    let live = TestServer::start(Arc::new(runkeep::MemoryStore::new()));
    let dead = closed_port();
    let scope = support::run("next");
    // One server, down: refused, nothing sent.
    let alone = client(std::slice::from_ref(&dead));
    let e = alone
        .append_events(&scope, &[ev()], None)
        .await
        .expect_err("nothing listens");
    assert!(e.is_retryable() && !e.is_outcome_unknown(), "{e}");
    // The same first server with a live one after it: the write lands,
    // once, and the store stays on the server that answered.
    let store = client(&[dead.clone(), live.url()]);
    let out = store.append_events(&scope, &[ev()], None).await.unwrap();
    assert_eq!(out[0].seq, 1);
    assert_eq!(store.base_url(), live.url());
    assert_eq!(store.base_urls(), [dead, live.url()]);
    let batch = store
        .read_events(&scope, &runkeep::ReadEventsOptions::default())
        .await
        .unwrap();
    assert_eq!(batch.events.len(), 1, "sent once: {batch:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_moves_the_store_to_the_next_server() {
    let live = TestServer::start(Arc::new(runkeep::MemoryStore::new()));
    let hole = black_hole().await;
    let scope = support::run("hole");
    // A read is repeatable: after the hole's timeout, the next server.
    let store = client(&[hole.clone(), live.url()]);
    let cps = store.list_checkpoints(&scope).await.unwrap();
    assert!(cps.is_empty());
    assert_eq!(store.base_url(), live.url());
    // A write whose answer was lost may have landed: outcome unknown, not
    // repeated elsewhere; the call after it goes to the next server.
    let store = client(&[hole, live.url()]);
    let e = store
        .append_events(&scope, &[ev()], None)
        .await
        .expect_err("the hole never answers");
    assert!(e.is_outcome_unknown(), "{e}");
    assert_eq!(store.base_url(), live.url());
    let out = store.append_events(&scope, &[ev()], None).await.unwrap();
    assert_eq!(out[0].seq, 1, "the lost write was not repeated: {out:?}");
}

/// The case of a worker whose server was killed: its lease is renewed
/// through the other server. The same renewal through the killed server
/// alone fails (the kill took effect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_renewed_through_another_server_when_its_own_was_killed() {
    let backing: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let a = TestServer::start(backing.clone());
    let b = TestServer::start(backing.clone());
    let (a_url, b_url) = (a.url(), b.url());
    let scope = support::run("renewed");
    backing
        .write_checkpoint(
            &scope,
            &runkeep::Checkpoint::new(
                runkeep::CheckpointId::new("cp_1").unwrap(),
                runkeep::Timestamp::now(),
                serde_json::Map::new(),
            ),
            None,
        )
        .await
        .unwrap();
    let store = client(&[a_url.clone(), b_url.clone()]);
    let alone = client(std::slice::from_ref(&a_url));
    let claim = ClaimOptions::new(
        Holder::new("h1").unwrap(),
        Ttl::from_millis(60_000).unwrap(),
    );
    let ClaimOutcome::Acquired(first) = store.claim(&scope, &claim).await.unwrap() else {
        panic!("not acquired")
    };
    assert_eq!(store.base_url(), a_url);
    a.kill();
    let e = alone
        .claim(&scope, &claim)
        .await
        .expect_err("the server was killed");
    assert!(e.is_retryable(), "{e}");
    // The renewal: at most one lost answer (a kept-alive connection to the
    // killed server written before its close was seen), then through b.
    let mut lost = 0;
    let renewed = loop {
        match store.claim(&scope, &claim).await {
            Ok(ClaimOutcome::Acquired(l)) => break l,
            Ok(other) => panic!("not renewed: {other:?}"),
            Err(e) if e.is_outcome_unknown() && lost == 0 => lost += 1,
            Err(e) => panic!("the renewal failed over to nothing: {e}"),
        }
    };
    assert!(renewed.fence > first.fence, "{renewed:?} after {first:?}");
    assert_eq!(store.base_url(), b_url);
    drop(b);
}
