//! The atomic step (contract v2): one commit of events, checkpoint,
//! messages, run record and finish under one fence check, all or nothing.

use std::sync::Arc;

use runkeep::lifecycle::MAX_REASON_CHARS;
use runkeep::{
    ClaimOutcome, Fence, MessageSnapshot, MessagesUpdate, Outcome, RunScope, RunStatus, RunStore,
    Step,
};
use serde_json::{json, Map};

use crate::support::*;

/// A step with every part, the finish optional.
fn full_step(tag: &str, finish: Option<Outcome>) -> Step {
    let mut record = Map::new();
    record.insert("status".into(), json!(format!("step {tag}")));
    Step {
        events: vec![
            event("tool_call", json!({"tag": tag, "tool": "search"})),
            event("tool_result", json!({"tag": tag, "ok": true})),
        ],
        checkpoint: Some(checkpoint(&format!("step_{tag}"), 10)),
        messages: Some(MessagesUpdate {
            messages: vec![json!({"role": "assistant", "content": tag})],
            through_event_seq: None,
        }),
        run_record: Some(record),
        finish,
    }
}

/// A run with some evidence already (a checkpoint, events, a record and a
/// snapshot), held by `w1`; answers the lease's fence.
async fn seeded(store: &Arc<dyn RunStore>, scope: &RunScope, ttl_ms: u64) -> Fence {
    write(store, scope, &checkpoint("seed", 0), None).await;
    let l = take(store, scope, claim_now("w1", ttl_ms)).await;
    store
        .commit_step(scope, l.fence, &full_step("seed", None))
        .await
        .expect("seed step");
    l.fence
}

/// A step with events, checkpoint, messages, record and finish lands whole:
/// the receipt and every read agree, and the run is finished with the lease
/// ended in the same commit.
pub async fn commits_a_whole_step_with_its_finish(store: Arc<dyn RunStore>, env: CaseEnv) {
    let clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let l = take(&store, &a, claim_now("w1", 60_000)).await;
    clock.advance(40);
    let step = full_step(
        "last",
        Some(Outcome::completed(Some(json!({"done": true})))),
    );
    let receipt = store
        .commit_step(&a, l.fence, &step)
        .await
        .expect("commit_step");
    assert_eq!(
        receipt.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(
        receipt.events.iter().all(|e| e.generation == Some(l.fence)),
        "events not stamped with the step's fence"
    );
    let cp = receipt
        .checkpoint
        .clone()
        .expect("the receipt names the checkpoint");
    assert_eq!(cp.fence, Some(l.fence));
    let finished = receipt
        .lifecycle
        .clone()
        .expect("the receipt carries the finish");
    assert_eq!(
        (finished.status, finished.finished_at),
        (RunStatus::Completed, Some(at(40)))
    );
    let back = read_back(&store, &a, clock.now()).await;
    assert_eq!(back.events, receipt.events);
    assert_eq!(back.checkpoints.last(), Some(&cp));
    assert_eq!(
        back.messages,
        MessageSnapshot::Available {
            through_event_seq: 2,
            messages: step.messages.clone().expect("messages").messages,
        }
    );
    assert_eq!(back.record, step.run_record);
    assert_eq!(back.lifecycle, finished);
    let row = back.row.expect("listed");
    assert_eq!(row.status, RunStatus::Completed);
    assert!(
        row.is_unheld(),
        "the lease did not end with the finishing step: {row:?}"
    );
    match store
        .claim(&a, &claim_now("w2", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Completed) => {}
        other => panic!("a claim after the finishing step answered {other:?}"),
    }
}

/// `through_event_seq` defaults to the step's last event, or the run's last
/// event when the step appends none; an explicit value is kept.
pub async fn defaults_the_message_boundary_to_the_steps_last_event(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    let a = run("a");
    let fence = seeded(&store, &a, 60_000).await; // events 1, 2
    let boundary = |store: Arc<dyn RunStore>, a: RunScope| async move {
        match store.read_messages(&a).await.expect("messages") {
            MessageSnapshot::Available {
                through_event_seq, ..
            } => through_event_seq,
            other => panic!("the snapshot reads back as {other:?}"),
        }
    };
    assert_eq!(boundary(store.clone(), a.clone()).await, 2);
    store
        .commit_step(&a, fence, &full_step("b", None))
        .await
        .expect("step"); // events 3, 4
    assert_eq!(
        boundary(store.clone(), a.clone()).await,
        4,
        "not the step's last event"
    );
    let no_events = Step {
        messages: Some(MessagesUpdate {
            messages: vec![json!("m")],
            through_event_seq: None,
        }),
        ..Default::default()
    };
    store
        .commit_step(&a, fence, &no_events)
        .await
        .expect("step");
    assert_eq!(
        boundary(store.clone(), a.clone()).await,
        4,
        "not the run's last event"
    );
    let explicit = Step {
        events: vec![event("step", json!({"n": 5}))],
        messages: Some(MessagesUpdate {
            messages: vec![json!("m")],
            through_event_seq: Some(1),
        }),
        ..Default::default()
    };
    store.commit_step(&a, fence, &explicit).await.expect("step");
    assert_eq!(
        boundary(store.clone(), a.clone()).await,
        1,
        "the explicit boundary was not kept"
    );
}

/// Commits `step` expecting a refusal, and checks the run reads back
/// exactly as before.
async fn refused_leaves_nothing(
    store: &Arc<dyn RunStore>,
    scope: &RunScope,
    fence: Fence,
    step: &Step,
    what: &str,
) -> runkeep::Error {
    let now = store.now();
    let before = read_back(store, scope, now).await;
    let err = match store.commit_step(scope, fence, step).await {
        Ok(r) => panic!("{what}: the step was accepted: {r:?}"),
        Err(e) => e,
    };
    let after = read_back(store, scope, now).await;
    assert_eq!(
        after, before,
        "{what}: the refused step ({err}) left something behind"
    );
    err
}

/// A step under a superseded, released or never-issued fence is refused and
/// writes nothing of any part.
pub async fn leaves_nothing_of_a_step_refused_for_its_fence(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    let stale = seeded(&store, &a, 1_000).await;
    clock.advance(2_000);
    let w2 = take(&store, &a, claim_now("w2", 60_000)).await;
    let e = refused_leaves_nothing(
        &store,
        &a,
        stale,
        &full_step("x", None),
        "a superseded fence",
    )
    .await;
    assert!(
        matches!(e, runkeep::Error::FencedOut { .. }),
        "a superseded step answered {e}"
    );
    let e = refused_leaves_nothing(
        &store,
        &a,
        stale,
        &full_step("x", Some(Outcome::completed(None))),
        "a superseded fence with a finish",
    )
    .await;
    assert!(
        matches!(e, runkeep::Error::FencedOut { .. }),
        "a superseded finishing step answered {e}"
    );
    assert!(store.release(&a, w2.fence).await.expect("release"));
    let e = refused_leaves_nothing(
        &store,
        &a,
        w2.fence,
        &full_step("y", None),
        "a released fence",
    )
    .await;
    assert!(
        matches!(e, runkeep::Error::FencedOut { .. }),
        "a released step answered {e}"
    );
    let w3 = take(&store, &a, claim_now("w3", 60_000)).await;
    let forged = Fence::new(w3.fence.get() + 9).expect("fence");
    let e = refused_leaves_nothing(
        &store,
        &a,
        forged,
        &full_step("z", None),
        "a never-issued fence",
    )
    .await;
    assert!(
        matches!(e, runkeep::Error::InvalidInput { .. }),
        "a never-issued step answered {e}"
    );
}

/// A step with one invalid part (an event or checkpoint using a reserved
/// key, an oversize finish reason, nothing at all) is refused whole under a
/// live fence.
pub async fn leaves_nothing_of_a_step_with_one_invalid_part(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    let a = run("a");
    let fence = seeded(&store, &a, 60_000).await;
    let mut bad_event = full_step("e", None);
    bad_event.events.push(event("step", json!({"seq": 99})));
    let mut bad_checkpoint = full_step("c", None);
    let mut cp = checkpoint("reserved", 11);
    cp.state.insert("fence".into(), json!(1));
    bad_checkpoint.checkpoint = Some(cp);
    let bad_finish = full_step("f", Some(Outcome::failed("r".repeat(MAX_REASON_CHARS + 1))));
    let mut wrong_run = full_step("w", None);
    let mut cp = checkpoint("elsewhere", 12);
    cp.state
        .insert("runId".into(), json!("run_conformance_someone_else"));
    wrong_run.checkpoint = Some(cp);
    for (step, what) in [
        (bad_event, "an event with a reserved key"),
        (bad_checkpoint, "a checkpoint with a reserved key"),
        (bad_finish, "a finish reason over the limit"),
        (wrong_run, "a checkpoint naming another run"),
        (Step::default(), "an empty step"),
    ] {
        let e = refused_leaves_nothing(&store, &a, fence, &step, what).await;
        assert!(
            matches!(e, runkeep::Error::InvalidInput { .. }),
            "{what}: answered {e}"
        );
    }
    store
        .commit_step(&a, fence, &full_step("ok", None))
        .await
        .expect("the holder can still commit");
}

/// A step on a finished run is refused and writes nothing.
pub async fn leaves_nothing_of_a_step_on_a_finished_run(store: Arc<dyn RunStore>, env: CaseEnv) {
    let _clock = env.clock();
    let a = run("a");
    let fence = seeded(&store, &a, 60_000).await;
    store
        .finish(&a, fence, &Outcome::completed(None))
        .await
        .expect("finish");
    refused_leaves_nothing(
        &store,
        &a,
        fence,
        &full_step("late", None),
        "a step after the finish",
    )
    .await;
    refused_leaves_nothing(
        &store,
        &a,
        fence,
        &full_step("late", Some(Outcome::failed("again"))),
        "a finishing step after the finish",
    )
    .await;
}
