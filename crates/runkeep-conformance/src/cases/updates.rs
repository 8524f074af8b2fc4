//! `update_checkpoint`: a read-modify-write of one checkpoint that loses
//! nothing to a concurrent one, fenced like a write, and a refusal (of the
//! fence, of the update, of what it returned) that changes nothing. The
//! concurrent case runs the core's own LangGraph pending-writes rule
//! ([`runkeep::thread_writes::merge`]), the update the HTTP server makes.

use std::sync::Arc;

use runkeep::thread_writes::{merge, stored_writes, WritesBatch};
use runkeep::{CheckpointId, CheckpointUpdate, PendingDecision, RunStore};
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
        resume_of: None,
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

/// One LangGraph interrupt (`id`, asking `q`) of `task`, as a batch.
fn asking(task: &str, id: &str, q: &str) -> WritesBatch {
    let request = json!({ "taskId": task, "interrupts": [{ "id": id, "value": { "q": q } }] });
    let request = request.as_object().cloned().expect("object");
    WritesBatch {
        task_id: task.into(),
        writes: vec![(-3, "__interrupt__".into(), "json".into(), None)],
        park: Some(PendingDecision::new(
            runkeep::thread_writes::INTERRUPT_REQUEST,
            request,
            at(1),
        )),
        ..batch(0)
    }
}

/// A `Command(resume=…)`'s write answering the interrupts `of`.
fn resuming(value: &str, of: &[&str]) -> WritesBatch {
    WritesBatch {
        task_id: "00000000-0000-0000-0000-000000000000".into(),
        writes: vec![(-4, "__resume__".into(), "json".into(), None)],
        resume: Some(json!(value)),
        resume_of: Some(of.iter().map(|i| (*i).to_string()).collect()),
        ..batch(0)
    }
}

fn updating(b: WritesBatch, offset_ms: i64) -> CheckpointUpdate {
    let id = writes_id();
    Arc::new(move |old| Ok(merge(&id, old, &b, at(offset_ms))))
}

/// The pending lookup's park: its checkpoint and the questions it waits on.
async fn waiting_on(store: &Arc<dyn RunStore>, a: &runkeep::RunScope) -> Option<Vec<String>> {
    let found = store.find_pending(a, at(100)).await.expect("pending")?;
    assert_eq!(found.id, writes_id());
    let pending = found.pending.expect("a park");
    assert!(pending.resolved_at.is_none(), "{pending:?}");
    Some(
        pending.request["interrupts"]
            .as_array()
            .expect("interrupts")
            .iter()
            .map(|i| i["value"]["q"].as_str().expect("q").to_string())
            .collect(),
    )
}

/// The pending-writes rule through the store: a node asked, was resumed
/// in code and asked again on the same checkpoint, and its next question
/// reached the store before the resume did (LangGraph sends both at once).
/// The resume answers the question it was made for; the next one is what
/// the run waits on, in the pending lookup as in the record. Then its own
/// answer closes it.
pub async fn an_overtaken_resume_leaves_the_next_question_waiting(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let send = |b: WritesBatch, offset_ms: i64| {
        let (store, a) = (store.clone(), a.clone());
        async move {
            store
                .update_checkpoint(&a, &writes_id(), updating(b, offset_ms), None)
                .await
                .expect("update")
        }
    };
    send(asking("node", "i1", "first?"), 1).await;
    assert_eq!(
        waiting_on(&store, &a).await,
        Some(vec!["first?".to_string()])
    );
    // The node's batch only asks (LangGraph.js): merged into the open park.
    send(asking("node", "i2", "second?"), 2).await;
    let late = send(resuming("one", &["i1"]), 3).await;
    assert_eq!(
        waiting_on(&store, &a).await,
        Some(vec!["second?".to_string()]),
        "the question asked after the resume is still waiting: {late:?}"
    );
    let closed = send(resuming("two", &["i2"]), 4).await;
    assert_eq!(waiting_on(&store, &a).await, None, "answered: {closed:?}");
    let pending = closed.pending.expect("park");
    assert_eq!(
        (pending.resolved_at, pending.decision),
        (Some(at(4)), Some(json!("two")))
    );
}
