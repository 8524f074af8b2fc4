//! Fenced writes, on checkpoints and on every piece of run evidence.

use std::sync::Arc;

use runkeep::{Fence, NewAuditEvent, NewEvent, ParkResolution, RunStore};
use serde_json::{json, Map};

use crate::support::*;

/// The holder writes with its fence.
pub async fn lets_the_current_holder_keep_writing(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let l = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    write(&store, &a, &checkpoint("1", 1), Some(l.fence)).await;
    assert_eq!(store.list_checkpoints(&a).await.expect("list").len(), 1);
}

/// Unfenced writes are accepted on a claimed run (incremental adoption).
pub async fn still_accepts_an_unfenced_write_on_a_claimed_run(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    write(&store, &a, &checkpoint("1", 1), None).await;
    assert_eq!(store.list_checkpoints(&a).await.expect("list").len(), 1);
}

/// A superseded holder is refused at its write, with both fences.
pub async fn fences_the_stalled_holder_out_at_the_moment_it_writes(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    let err = store
        .write_checkpoint(&a, &checkpoint("1", 1), Some(w1.fence))
        .await;
    assert!(
        err.as_ref().is_err_and(|e| !e.is_retryable()),
        "fenced out must not be retryable"
    );
    expect_fenced_out(err, w1.fence, w2.fence);
}

/// The refusal survives the new holder's release.
pub async fn still_refuses_a_superseded_fence_after_the_new_holder_releases(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    store.release(&a, w2.fence).await.expect("release");
    let result = store
        .write_checkpoint(&a, &checkpoint("1", 1), Some(w1.fence))
        .await;
    assert!(
        result.as_ref().is_err_and(runkeep::Error::is_fenced_out),
        "superseded write accepted after release: {result:?}"
    );
}

/// A released fence is refused like a superseded one.
pub async fn refuses_the_fence_its_own_holder_just_released(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    store.release(&a, w1.fence).await.expect("release");
    let result = store
        .write_checkpoint(&a, &checkpoint("1", 1), Some(w1.fence))
        .await;
    assert!(
        result.as_ref().is_err_and(runkeep::Error::is_fenced_out),
        "released fence accepted: {result:?}"
    );
}

/// A fence above every issued one is refused as invalid input.
pub async fn refuses_a_fence_that_was_never_issued(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let never = Fence::new(7).expect("fence");
    let r = store
        .write_checkpoint(&a, &checkpoint("1", 1), Some(never))
        .await;
    assert!(
        matches!(r, Err(runkeep::Error::InvalidInput { .. })),
        "fence on a never-claimed run: {r:?}"
    );
    let l = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    let above = Fence::new(l.fence.get() + 5).expect("fence");
    let r = store
        .write_checkpoint(&a, &checkpoint("1", 1), Some(above))
        .await;
    assert!(
        matches!(r, Err(runkeep::Error::InvalidInput { .. })),
        "fence above the top: {r:?}"
    );
    assert!(store.list_checkpoints(&a).await.expect("list").is_empty());
}

/// A refused write changes nothing: a full read-back is identical.
pub async fn a_refused_write_leaves_nothing_behind(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    write(&store, &a, &checkpoint("keep", 1), Some(w1.fence)).await;
    store
        .append_events(&a, &[NewEvent::new("step", Map::new())], Some(w1.fence))
        .await
        .expect("append");
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    let before_cps = store.list_checkpoints(&a).await.expect("list");
    let before_ev = store
        .read_events(&a, &Default::default())
        .await
        .expect("events");
    let mut zombie = checkpoint("keep", 9_999);
    zombie.state.insert("iteration".into(), json!(99));
    assert!(store
        .write_checkpoint(&a, &zombie, Some(w1.fence))
        .await
        .is_err());
    assert!(store
        .write_checkpoint(&a, &checkpoint("zombie", 9_999), Some(w1.fence))
        .await
        .is_err());
    assert!(store
        .append_events(&a, &[NewEvent::new("zombie", Map::new())], Some(w1.fence))
        .await
        .is_err());
    assert!(store
        .delete_checkpoint(&a, &checkpoint("keep", 0).id, Some(w1.fence))
        .await
        .is_err());
    assert_eq!(store.list_checkpoints(&a).await.expect("list"), before_cps);
    assert_eq!(
        store
            .read_events(&a, &Default::default())
            .await
            .expect("events"),
        before_ev
    );
    let latest = store
        .latest_checkpoint(&a)
        .await
        .expect("latest")
        .expect("one");
    assert_eq!(latest.id, checkpoint("keep", 0).id);
    let _ = w2;
}

/// Events, run record, messages, report, audit, delete, prune and park
/// resolution all refuse a superseded fence.
pub async fn fences_every_kind_of_run_evidence(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    write(&store, &a, &parked("p", 1, 1, None), Some(w1.fence)).await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    let (old, cur) = (w1.fence, w2.fence);
    expect_fenced_out(
        store
            .append_events(&a, &[NewEvent::new("x", Map::new())], Some(old))
            .await,
        old,
        cur,
    );
    expect_fenced_out(
        store.write_run_record(&a, &Map::new(), Some(old)).await,
        old,
        cur,
    );
    expect_fenced_out(store.write_messages(&a, &[], 0, Some(old)).await, old, cur);
    expect_fenced_out(store.write_report(&a, "r", Some(old)).await, old, cur);
    expect_fenced_out(
        store
            .append_audit(&a, &[NewAuditEvent::new("w1", "x", "ok")], Some(old))
            .await,
        old,
        cur,
    );
    expect_fenced_out(
        store
            .delete_checkpoint(&a, &parked("p", 0, 0, None).id, Some(old))
            .await,
        old,
        cur,
    );
    expect_fenced_out(store.prune_checkpoints(&a, 0, Some(old)).await, old, cur);
    expect_fenced_out(
        store
            .resolve_park(
                &a,
                &parked("p", 0, 0, None).id,
                ParkResolution::Answer(json!("yes")),
                at(3_000),
                Some(old),
            )
            .await,
        old,
        cur,
    );
    assert!(store.read_run_record(&a).await.expect("record").is_none());
    assert_eq!(store.read_report(&a).await.expect("report"), None);
    assert!(store.read_audit(&a, 0).await.expect("audit").is_empty());
    assert!(store
        .read_events(&a, &Default::default())
        .await
        .expect("events")
        .events
        .is_empty());
    assert_eq!(
        store.read_messages(&a).await.expect("messages").kind(),
        "unavailable"
    );
    let still = store
        .read_checkpoint(&a, &parked("p", 0, 0, None).id)
        .await
        .expect("read")
        .expect("kept");
    assert!(
        still
            .pending
            .as_ref()
            .is_some_and(|p| p.resolved_at.is_none()),
        "zombie answered the park"
    );
}
