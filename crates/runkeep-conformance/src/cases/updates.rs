//! `update_checkpoint`: a read-modify-write of one checkpoint that loses
//! nothing to a concurrent one, fenced like a write, and a refusal (of the
//! fence, of the update, of what it returned) that changes nothing. The
//! concurrent case runs the core's own LangGraph pending-writes rule
//! ([`runkeep::thread_writes::merge`]), the update the HTTP server makes.

use std::sync::Arc;

use runkeep::thread_writes::{merge, stored_writes, WritesBatch};
use runkeep::{CheckpointId, CheckpointUpdate, RunStore};
use serde_json::json;

use crate::support::*;

/// How many batches the concurrent case sends at once.
const BATCHES: usize = 16;

fn writes_id() -> CheckpointId {
    CheckpointId::new("tw-0-rc1").expect("id")
}

fn batch(task: usize) -> WritesBatch {
    WritesBatch {
        thread: "t".into(),
        ns: String::new(),
        checkpoint_id: "c1".into(),
        task_id: format!("task-{task}"),
        task_path: String::new(),
        writes: vec![(0, format!("channel-{task}"), "json".into(), None)],
        park: None,
        resume: None,
    }
}

fn merging(task: usize, offset_ms: i64) -> CheckpointUpdate {
    let (id, b) = (writes_id(), batch(task));
    Arc::new(move |old| Ok(merge(&id, old, &b, at(offset_ms))))
}

/// The update sees the stored checkpoint (none at first) and its result
/// is what is stored and answered.
pub async fn updates_a_checkpoint_from_what_is_stored(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let first = store
        .update_checkpoint(&a, &writes_id(), merging(1, 1), None)
        .await
        .expect("first update");
    let second = store
        .update_checkpoint(&a, &writes_id(), merging(2, 2), None)
        .await
        .expect("second update");
    assert_eq!(stored_writes(&first).len(), 1, "first: {first:?}");
    let back = store
        .read_checkpoint(&a, &writes_id())
        .await
        .expect("read")
        .expect("present");
    assert_eq!(back, second, "the answer is what is stored");
    let tasks: Vec<String> = stored_writes(&back)
        .into_iter()
        .map(|w| w.task_id)
        .collect();
    assert_eq!(
        tasks,
        ["task-1", "task-2"],
        "the second update saw the first"
    );
}

/// Concurrent updates of one checkpoint: every batch is kept.
pub async fn concurrent_updates_of_one_checkpoint_lose_none(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let start = Arc::new(tokio::sync::Barrier::new(BATCHES));
    let mut tasks = Vec::new();
    for i in 0..BATCHES {
        let (store, a, start) = (store.clone(), a.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            store
                .update_checkpoint(&a, &writes_id(), merging(i, 1), None)
                .await
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("update");
    }
    let back = store
        .read_checkpoint(&a, &writes_id())
        .await
        .expect("read")
        .expect("present");
    let mut tasks: Vec<String> = stored_writes(&back)
        .into_iter()
        .map(|w| w.task_id)
        .collect();
    tasks.sort();
    let mut want: Vec<String> = (0..BATCHES).map(|i| format!("task-{i}")).collect();
    want.sort();
    assert_eq!(tasks, want, "a concurrent batch was lost");
}

/// Fenced like a write: a superseded fence is refused and changes nothing;
/// the holder's update is stamped with its fence.
pub async fn fences_an_update_like_a_write(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    let refused = store
        .update_checkpoint(&a, &writes_id(), merging(1, 3), Some(w1.fence))
        .await;
    expect_fenced(refused, w1.fence, "an update under a superseded fence");
    assert_eq!(
        store.read_checkpoint(&a, &writes_id()).await.expect("read"),
        None,
        "a refused update left a checkpoint"
    );
    let stored = store
        .update_checkpoint(&a, &writes_id(), merging(2, 3), Some(w2.fence))
        .await
        .expect("the holder's update");
    assert_eq!(stored.fence, Some(w2.fence));
}

/// An update that fails, or returns another id or an invalid checkpoint,
/// is refused and the stored checkpoint stays as it was.
pub async fn refuses_a_failed_or_invalid_update_and_changes_nothing(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let kept = store
        .update_checkpoint(&a, &writes_id(), merging(1, 1), None)
        .await
        .expect("first update");
    let failing: CheckpointUpdate =
        Arc::new(|_| Err(runkeep::Error::invalid("the update refuses")));
    expect_invalid(
        store
            .update_checkpoint(&a, &writes_id(), failing, None)
            .await,
        "an update that fails",
    );
    let other: CheckpointUpdate = Arc::new(|_| Ok(checkpoint("elsewhere", 2)));
    expect_invalid(
        store.update_checkpoint(&a, &writes_id(), other, None).await,
        "an update returning another id",
    );
    let reserved: CheckpointUpdate = Arc::new(|old| {
        let mut cp = old.cloned().expect("stored");
        cp.state.insert("runId".into(), json!("another-run"));
        Ok(cp)
    });
    expect_invalid(
        store
            .update_checkpoint(&a, &writes_id(), reserved, None)
            .await,
        "an update returning an invalid checkpoint",
    );
    let back = store
        .read_checkpoint(&a, &writes_id())
        .await
        .expect("read")
        .expect("present");
    assert_eq!(back, kept, "a refused update changed the checkpoint");
    assert_eq!(
        store.list_checkpoints(&a).await.expect("list").len(),
        1,
        "a refused update added a checkpoint"
    );
}
