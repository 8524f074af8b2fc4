//! Checkpoint read-back, the total order, replacement, absence, validation
//! and value isolation.

use std::sync::Arc;

use runkeep::RunStore;
use serde_json::json;

use crate::support::*;

/// Everything written reads back (whole-value comparison, not a few fields).
pub async fn reads_back_a_checkpoint_whole(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let mut cp = parked("1", 10, 11, Some(500)).with_run_created_at(at(-100));
    cp.state.insert(
        "nested".into(),
        json!({"deep": [1, 2, {"x": null}], "unicode": "é漢"}),
    );
    let stored = write(&store, &a, &cp, None).await;
    let back = store
        .read_checkpoint(&a, &cp.id)
        .await
        .expect("read")
        .expect("present");
    assert_eq!(back, stored);
    assert_eq!(back.state, cp.state);
    assert_eq!(back.pending, cp.pending);
    assert_eq!(back.run_created_at, cp.run_created_at);
    assert_eq!(
        store.list_checkpoints(&a).await.expect("list"),
        vec![stored]
    );
}

/// Fenced writes carry their fence; unfenced writes the fence in force;
/// writes to a never-claimed run none.
pub async fn stamps_each_checkpoint_with_the_fence_it_was_written_under(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let s0 = write(&store, &a, &checkpoint("0", 0), None).await;
    assert_eq!(s0.fence, None);
    let l = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    let s1 = write(&store, &a, &checkpoint("1", 1), Some(l.fence)).await;
    assert_eq!(s1.fence, Some(l.fence));
    let s2 = write(&store, &a, &checkpoint("2", 2), None).await;
    assert_eq!(s2.fence, Some(l.fence));
    let back = store
        .read_checkpoint(&a, &s1.id)
        .await
        .expect("read")
        .expect("present");
    assert_eq!(back.fence, Some(l.fence));
}

/// A write accepted under an older fence never outranks one
/// written under a newer fence, whatever the clocks say.
pub async fn orders_latest_by_fence_before_clock(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    write(
        &store,
        &a,
        &checkpoint("old_holder_fast_clock", 900_000),
        Some(w1.fence),
    )
    .await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    write(
        &store,
        &a,
        &checkpoint("new_holder_slow_clock", 10),
        Some(w2.fence),
    )
    .await;
    let latest = store
        .latest_checkpoint(&a)
        .await
        .expect("latest")
        .expect("one");
    assert_eq!(latest.id, checkpoint("new_holder_slow_clock", 0).id);
    let resume = store
        .resume_point(&a, at(3_000))
        .await
        .expect("resume")
        .expect("one");
    assert_eq!(resume.id, latest.id);
}

/// `list_checkpoints` is ascending by `(fence, created_at, id)`, ties on the
/// clock broken by id.
pub async fn lists_checkpoints_in_the_total_order(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    for (id, t) in [("c", 5), ("a", 5), ("b", 1), ("d", 9)] {
        write(&store, &a, &checkpoint(id, t), None).await;
    }
    let got: Vec<String> = store
        .list_checkpoints(&a)
        .await
        .expect("list")
        .iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(
        got,
        [
            "cp_conformance_b",
            "cp_conformance_a",
            "cp_conformance_c",
            "cp_conformance_d"
        ]
    );
}

/// Writing an existing id replaces it (parks rely on this).
pub async fn replaces_a_checkpoint_written_twice_under_one_id(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    write(&store, &a, &checkpoint("1", 1), None).await;
    let mut second = checkpoint("1", 2);
    second.state.insert("iteration".into(), json!(2));
    write(&store, &a, &second, None).await;
    let all = store.list_checkpoints(&a).await.expect("list");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state["iteration"], json!(2));
    let page = list(&store, &listing(), Default::default(), 0).await;
    assert_eq!(page.entries[0].checkpoint_count, 1);
    assert_eq!(page.entries[0].latest_checkpoint_at, Some(at(2)));
}

/// Missing data is absence, not an error; delete is idempotent.
pub async fn answers_absence_and_deletes_idempotently(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let id = checkpoint("1", 0).id;
    assert_eq!(store.read_checkpoint(&a, &id).await.expect("read"), None);
    assert!(store.list_checkpoints(&a).await.expect("list").is_empty());
    assert!(!store
        .delete_checkpoint(&a, &id, None)
        .await
        .expect("delete absent"));
    write(&store, &a, &checkpoint("1", 0), None).await;
    assert!(store
        .delete_checkpoint(&a, &id, None)
        .await
        .expect("delete"));
    assert!(!store
        .delete_checkpoint(&a, &id, None)
        .await
        .expect("delete again"));
    assert!(
        list(&store, &listing(), Default::default(), 0)
            .await
            .entries
            .is_empty(),
        "a run with no checkpoints is listed"
    );
}

/// Invalid checkpoints are refused on write and change nothing.
pub async fn refuses_an_invalid_checkpoint_and_changes_nothing(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    write(&store, &a, &checkpoint("ok", 0), None).await;
    let mut foreign = checkpoint("foreign", 1);
    foreign
        .state
        .insert("runId".into(), json!("run_somebody_else"));
    let r = store.write_checkpoint(&a, &foreign, None).await;
    assert!(
        matches!(r, Err(runkeep::Error::InvalidInput { .. })),
        "runId mismatch accepted: {r:?}"
    );
    let mut reserved = checkpoint("reserved", 1);
    reserved.state.insert("createdAt".into(), json!(1));
    assert!(matches!(
        store.write_checkpoint(&a, &reserved, None).await,
        Err(runkeep::Error::InvalidInput { .. })
    ));
    let mut bad_park = parked("badpark", 1, 1, None);
    if let Some(p) = bad_park.pending.as_mut() {
        p.request.remove("type");
    }
    assert!(matches!(
        store.write_checkpoint(&a, &bad_park, None).await,
        Err(runkeep::Error::InvalidInput { .. })
    ));
    let ids: Vec<String> = store
        .list_checkpoints(&a)
        .await
        .expect("list")
        .iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(ids, ["cp_conformance_ok"]);
}

/// Mutating what was written or returned never changes the store.
pub async fn hands_out_copies_not_references(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let mut cp = checkpoint("1", 0);
    let stored = write(&store, &a, &cp, None).await;
    cp.state.insert("iteration".into(), json!(42));
    let mut read = store
        .read_checkpoint(&a, &cp.id)
        .await
        .expect("read")
        .expect("present");
    read.state.insert("iteration".into(), json!(43));
    let again = store
        .read_checkpoint(&a, &cp.id)
        .await
        .expect("read")
        .expect("present");
    assert_eq!(again, stored);
    assert_eq!(again.state["iteration"], json!(1));
}
