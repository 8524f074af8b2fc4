//! The live event tail (Server-Sent Events) across a server restart: a
//! server on a directory store is killed while a client follows a run's
//! events, events are appended while it is down, a new server is started
//! on the same port and directory, and the client resumes with
//! `Last-Event-ID`: every event arrives exactly once, in order.

mod common;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use runkeep::{EvidenceStore, NewEvent, RunScope, RunStore};
use runkeep_conformance::support;
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::json;

use common::{TestServer, TOKEN_A};

fn fs_store(dir: &std::path::Path) -> Arc<dyn RunStore> {
    Arc::new(
        FsStore::open(
            dir.join("runs"),
            FsOptions {
                attribution: Some(Attribution {
                    tenant_id: support::tenant(),
                    project_id: support::project(),
                    session_id: support::session(),
                }),
                ..Default::default()
            },
        )
        .expect("open the store"),
    )
}

fn ev(n: u64) -> NewEvent {
    NewEvent::new("step", json!({ "n": n }).as_object().unwrap().clone())
}

async fn next_event(
    s: &mut (impl futures_util::Stream<Item = runkeep::Result<runkeep::PersistedEvent>> + Unpin),
    errors: &mut usize,
) -> runkeep::PersistedEvent {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), s.next()).await {
            Err(_) => panic!("no event within 30 s"),
            Ok(None) => panic!("the tail ended"),
            Ok(Some(Err(e))) => {
                assert!(
                    e.is_retryable(),
                    "the tail yielded a non-retryable error: {e}"
                );
                *errors += 1;
            }
            Ok(Some(Ok(e))) => return e,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tail_resumes_across_a_server_restart_without_losing_or_repeating_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let scope: RunScope = support::run("tail");
    let server = TestServer::start(fs_store(dir.path()));
    let addr = server.addr;
    let client = server.client(None);
    for n in 1..=3 {
        client.append_events(&scope, &[ev(n)], None).await.unwrap();
    }
    let mut tail = client.follow_events(&scope, 0);
    let mut seen = Vec::new();
    let mut errors = 0;
    for _ in 0..3 {
        seen.push(next_event(&mut tail, &mut errors).await);
    }
    // Live: appended after the tail connected.
    client
        .append_events(&scope, &[ev(4), ev(5)], None)
        .await
        .unwrap();
    for _ in 0..2 {
        seen.push(next_event(&mut tail, &mut errors).await);
    }
    assert_eq!(errors, 0);

    // Kill the server: every connection drops without a goodbye.
    server.kill();
    // While it is down the run gets events another way (the directory).
    let direct = fs_store(dir.path());
    for n in 6..=8 {
        direct.append_events(&scope, &[ev(n)], None).await.unwrap();
    }
    drop(direct);
    // The client really was cut off: its reconnects fail until the restart.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while errors == 0 {
        match tokio::time::timeout_at(deadline, tail.next()).await {
            Err(_) => panic!("the tail never noticed the server was gone"),
            Ok(Some(Err(e))) => {
                assert!(e.is_retryable(), "{e}");
                errors += 1;
            }
            Ok(Some(Ok(e))) => panic!("an event ({}) arrived while the server was down", e.seq),
            Ok(None) => panic!("the tail ended instead of retrying"),
        }
    }

    // Restart on the same port and directory.
    let server = TestServer::start_on(addr, fs_store(dir.path()));
    assert_eq!(server.addr, addr);
    client
        .append_events(&scope, &[ev(9), ev(10)], None)
        .await
        .unwrap();
    while seen.len() < 10 {
        seen.push(next_event(&mut tail, &mut errors).await);
    }
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=10).collect::<Vec<u64>>(),
        "lost or repeated events"
    );
    let ns: Vec<u64> = seen
        .iter()
        .map(|e| e.payload["n"].as_u64().unwrap())
        .collect();
    assert_eq!(ns, (1..=10).collect::<Vec<u64>>());
    // Nothing more is pending: no duplicate arrives late.
    let late = tokio::time::timeout(Duration::from_millis(800), async {
        loop {
            match tail.next().await {
                Some(Ok(e)) => return Some(e.seq),
                Some(Err(_)) => continue,
                None => return None,
            }
        }
    })
    .await;
    assert!(late.is_err() || late == Ok(None), "a late event: {late:?}");
    drop(server);
}

/// The raw protocol: `id:` is the seq, and `Last-Event-ID` wins over
/// `sinceSeq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_numbers_frames_by_seq_and_starts_after_last_event_id() {
    let dir = tempfile::tempdir().unwrap();
    let scope = support::run("raw");
    let server = TestServer::start(fs_store(dir.path()));
    let client = server.client(None);
    for n in 1..=5 {
        client.append_events(&scope, &[ev(n)], None).await.unwrap();
    }
    let url = format!(
        "{}/v1/tenants/{}/projects/{}/sessions/{}/runs/{}/events/stream?sinceSeq=1",
        server.url(),
        scope.tenant_id,
        scope.project_id,
        scope.session_id,
        scope.run_id
    );
    let res = reqwest::Client::new()
        .get(&url)
        .bearer_auth(TOKEN_A)
        .header("last-event-id", "3")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut body = res.bytes_stream();
    let mut text = String::new();
    while !text.contains("id: 5") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("frames within 10 s")
            .expect("the stream is open")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        !text.contains("id: 3\n") && !text.contains("id: 2\n"),
        "{text}"
    );
    assert!(
        text.contains("event: event\nid: 4\n") || text.contains("id: 4"),
        "{text}"
    );
    let first = text.find("id: 4").unwrap();
    assert!(first < text.find("id: 5").unwrap(), "{text}");
}
