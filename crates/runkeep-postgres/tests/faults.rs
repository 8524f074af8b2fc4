//! Connection faults made real by a TCP proxy between the store and the
//! server (`common::proxy`): a commit whose acknowledgement is lost, a
//! commit lost before the server, and a partition that stops forwarding
//! without a reset.

mod common;

use std::time::{Duration, Instant};

use common::proxy::{CommitFault, Proxy};
use runkeep::{
    CheckpointStore, ClaimOptions, ClaimOutcome, EvidenceStore, ReadEventsOptions, RunScope, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore};
use serde_json::json;

fn claim(name: &str, ttl_ms: u64) -> ClaimOptions {
    ClaimOptions::new(support::holder(name), Ttl::from_millis(ttl_ms).unwrap())
}

async fn last_seq(store: &PgStore, scope: &RunScope) -> u64 {
    store
        .read_events(scope, &ReadEventsOptions::default())
        .await
        .unwrap()
        .last_seq
}

/// Retries a retryable failure a few times (a pooled connection the fault
/// killed answers once with one).
async fn eventually<T, F, Fut>(mut op: F) -> runkeep::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = runkeep::Result<T>>,
{
    let mut last = None;
    for _ in 0..8 {
        match op().await {
            Err(e) if e.is_retryable() => last = Some(e),
            other => return other,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_acknowledgement_is_lost_is_outcome_unknown_not_a_refusal() {
    let Some(url) = common::url_or_skip("lost_ack") else {
        return;
    };
    let (direct, guard) = common::store(&url, "ack", None).await;
    let proxy = Proxy::start(&common::server_addr(&url)).await;
    let store = PgStore::connect(&proxy.url(&url), common::options(&guard.schema, None))
        .await
        .expect("connect through the proxy");
    let scope = support::run("run_ack");
    let first = store
        .claim(&scope, &claim("w", 600_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    // A renewal supersedes the first fence.
    let lease = store
        .claim(&scope, &claim("w", 600_000))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let e = || support::event("e", json!({}));

    // A refusal is a refusal: nothing stored, and not "outcome unknown".
    assert!(lease.fence > first.fence);
    let stale = first.fence;
    let refused = store
        .append_events(&scope, &[e()], Some(stale))
        .await
        .expect_err("a fence never issued is refused");
    assert!(
        refused.is_fenced_out() && !refused.is_outcome_unknown(),
        "{refused:?}"
    );

    // The server commits, the proxy swallows its reply and cuts the client.
    proxy.arm(CommitFault::LoseAck);
    let err = store
        .append_events(&scope, &[e()], Some(lease.fence))
        .await
        .expect_err("the acknowledgement never arrives");
    assert_eq!(proxy.acks_lost(), 1, "the server acknowledged the commit");
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert!(err.is_retryable() && !err.is_fenced_out(), "{err:?}");
    assert!(
        err.to_string().contains("read it back before repeating it"),
        "{err}"
    );
    assert_eq!(last_seq(&direct, &scope).await, 1, "the commit did land");

    // The COMMIT itself is lost: the client cannot tell, so it is outcome
    // unknown too, and indeed nothing landed.
    // (First let the pool drop the connection the cut killed.)
    eventually(|| store.lifecycle(&scope)).await.unwrap();
    proxy.arm(CommitFault::LoseCommit);
    let one = [e()];
    let err = store
        .append_events(&scope, &one, Some(lease.fence))
        .await
        .expect_err("the commit never reaches the server");
    assert_eq!(proxy.commits_lost(), 1);
    assert!(err.is_outcome_unknown(), "{err:?}");
    assert_eq!(
        last_seq(&direct, &scope).await,
        1,
        "the lost commit did not land"
    );

    // The pool recovers: the next append lands once, at seq 2.
    let appended = eventually(|| store.append_events(&scope, &one, Some(lease.fence)))
        .await
        .unwrap();
    assert_eq!(appended[0].seq, 2);
    assert_eq!(last_seq(&direct, &scope).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_loses_its_lease_by_expiry_and_is_refused_after_the_heal() {
    let Some(url) = common::url_or_skip("partition") else {
        return;
    };
    let (direct, guard) = common::store(&url, "part", None).await;
    let proxy = Proxy::start(&common::server_addr(&url)).await;
    let short = PgOptions {
        statement_timeout: Duration::from_millis(1_000),
        lock_timeout: Duration::from_millis(1_000),
        idle_in_transaction_timeout: Duration::from_millis(2_000),
        connect_timeout: Duration::from_millis(2_000),
        reply_timeout: Duration::from_millis(1_500),
        ..common::options(&guard.schema, None)
    };
    let a = PgStore::connect(&proxy.url(&url), short)
        .await
        .expect("connect through the proxy");
    let scope = support::run("run_partition");
    const TTL: u64 = 2_000;
    let fence_a = a
        .claim(&scope, &claim("a", TTL))
        .await
        .unwrap()
        .lease()
        .unwrap()
        .fence;
    a.append_events(
        &scope,
        &[support::event("before", json!({}))],
        Some(fence_a),
    )
    .await
    .unwrap();

    proxy.partition(true);
    // The holder's renewal and its write get no answer, and say so within
    // the reply timeout instead of hanging (the test's own bound is 15 s).
    let renewal = tokio::time::timeout(Duration::from_secs(15), a.claim(&scope, &claim("a", TTL)))
        .await
        .expect("a renewal through the partition must not hang")
        .expect_err("a renewal cannot pass the partition");
    assert!(renewal.is_retryable(), "{renewal:?}");
    assert!(renewal.to_string().contains("reply_timeout"), "{renewal}");
    let write = tokio::time::timeout(
        Duration::from_secs(15),
        a.append_events(
            &scope,
            &[support::event("during", json!({}))],
            Some(fence_a),
        ),
    )
    .await
    .expect("a write through the partition must not hang")
    .expect_err("a write cannot pass the partition");
    assert!(write.is_retryable(), "{write:?}");

    // Another worker takes the run once the lease expired on the
    // database's clock (it is refused while the lease is live).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut refused_while_live = 0;
    let fence_b = loop {
        match direct.claim(&scope, &claim("b", 60_000)).await.unwrap() {
            ClaimOutcome::Acquired(l) => break l.fence,
            ClaimOutcome::Held(s) => {
                assert_eq!(s.fence, fence_a);
                refused_while_live += 1;
            }
            other => panic!("{other:?}"),
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(fence_b > fence_a);
    assert!(
        refused_while_live > 0 || direct.lifecycle(&scope).await.unwrap().attempts == 1,
        "the takeover followed an expiry"
    );
    assert_eq!(direct.lifecycle(&scope).await.unwrap().attempts, 1);

    // The partition heals: the old holder's writes are refused.
    proxy.partition(false);
    let after = [support::event("after", json!({}))];
    let late = eventually(|| a.append_events(&scope, &after, Some(fence_a)))
        .await
        .expect_err("a superseded holder's write is refused");
    assert!(late.is_fenced_out(), "{late:?}");
    let again = claim("a", TTL);
    let renewal = eventually(|| a.claim(&scope, &again)).await.unwrap();
    assert!(
        matches!(renewal, ClaimOutcome::Held(ref s) if s.fence == fence_b),
        "{renewal:?}"
    );
    // Nothing of the partitioned holder's landed after its "before".
    let events = direct
        .read_events(&scope, &ReadEventsOptions::default())
        .await
        .unwrap()
        .events;
    let kinds: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(kinds, ["before"], "{events:?}");
}
