//! Run lifecycle (contract v2): finish, the spent fence, finished runs in
//! the listing and the queue, reopen, and runs without a record.

use std::sync::Arc;

use runkeep::{
    ClaimNextFilter, ClaimOutcome, Fence, Lifecycle, ListOptions, Outcome, RunStatus, RunStore,
    Step,
};
use serde_json::json;

use crate::support::*;

/// Finishes `scope` under `fence`, expecting success.
async fn finish(
    store: &Arc<dyn RunStore>,
    scope: &runkeep::RunScope,
    fence: Fence,
    outcome: &Outcome,
) -> Lifecycle {
    store
        .finish(scope, fence, outcome)
        .await
        .unwrap_or_else(|e| panic!("finishing {scope} at fence {fence} failed: {e}"))
}

/// Each finish status is recorded with its result or reason and the store
/// clock's instant, and read back the same.
pub async fn finishes_a_run_with_each_status_and_keeps_its_result_and_reason(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let outcomes = [
        (
            "completed",
            Outcome::completed(Some(json!({"answer": 42, "notes": ["a", "b"]}))),
            RunStatus::Completed,
        ),
        (
            "failed",
            Outcome::failed("the tool kept timing out"),
            RunStatus::Failed,
        ),
        (
            "cancelled",
            Outcome::cancelled("the user called it off"),
            RunStatus::Cancelled,
        ),
    ];
    for (i, (name, outcome, status)) in outcomes.into_iter().enumerate() {
        let r = run(name);
        write(&store, &r, &checkpoint(name, 0), None).await;
        let l = take(&store, &r, claim_now("w1", 60_000)).await;
        clock.advance(100 * (i as i64 + 1));
        let at_finish = clock.now();
        let recorded = finish(&store, &r, l.fence, &outcome).await;
        assert_eq!(recorded.status, status, "{name}: recorded status");
        assert_eq!(recorded.result, outcome.result, "{name}: recorded result");
        assert_eq!(recorded.reason, outcome.reason, "{name}: recorded reason");
        assert_eq!(
            recorded.finished_at,
            Some(at_finish),
            "{name}: finished_at is not the store clock's instant"
        );
        assert_eq!(
            store.lifecycle(&r).await.expect("lifecycle"),
            recorded,
            "{name}: the lifecycle read back differs from the one finish answered"
        );
        assert_eq!(
            store.list_checkpoints(&r).await.expect("list").len(),
            1,
            "{name}: a finished run must keep its evidence"
        );
    }
}

/// A finish is fenced like a write: a superseded or released fence is
/// `FencedOut`, a never-issued one `InvalidInput`, and a refused finish
/// leaves the run active.
pub async fn refuses_a_finish_under_a_stale_released_or_never_issued_fence(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let done = Outcome::completed(None);
    // Superseded.
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let w1 = take(&store, &a, claim_now("w1", 1_000)).await;
    clock.advance(2_000);
    take(&store, &a, claim_now("w2", 60_000)).await;
    expect_fenced(
        store.finish(&a, w1.fence, &done).await,
        w1.fence,
        "a superseded finish",
    );
    // Released.
    let b = run("b");
    write(&store, &b, &checkpoint("b", 0), None).await;
    let l = take(&store, &b, claim_now("w1", 60_000)).await;
    assert!(store.release(&b, l.fence).await.expect("release"));
    expect_fenced(
        store.finish(&b, l.fence, &done).await,
        l.fence,
        "a released finish",
    );
    // Never issued.
    let c = run("c");
    write(&store, &c, &checkpoint("c", 0), None).await;
    let l = take(&store, &c, claim_now("w1", 60_000)).await;
    let forged = Fence::new(l.fence.get() + 7).expect("fence");
    expect_invalid(
        store.finish(&c, forged, &done).await,
        "a finish under a never-issued fence",
    );
    for r in [&a, &b, &c] {
        assert_eq!(
            store.lifecycle(r).await.expect("lifecycle").status,
            RunStatus::Active,
            "a refused finish changed the status of {r}"
        );
    }
}

/// Finishing spends the fence: every write presenting it afterwards is
/// refused, and the holder's renewal answers `Finished`.
pub async fn spends_the_fence_on_finish_so_writes_under_it_are_refused(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let l = take(&store, &a, claim_now("w1", 60_000)).await;
    finish(&store, &a, l.fence, &Outcome::completed(None)).await;
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("late", 1), Some(l.fence))
            .await,
        l.fence,
        "a checkpoint under the spent fence",
    );
    expect_fenced(
        store
            .append_events(&a, &[event("step", json!({"n": 1}))], Some(l.fence))
            .await,
        l.fence,
        "an append under the spent fence",
    );
    expect_fenced(
        store.write_report(&a, "late", Some(l.fence)).await,
        l.fence,
        "a report under the spent fence",
    );
    let step = Step {
        events: vec![event("step", json!({"n": 2}))],
        ..Default::default()
    };
    assert!(
        store.commit_step(&a, l.fence, &step).await.is_err(),
        "a step under the spent fence was accepted"
    );
    assert!(
        store
            .read_events(&a, &Default::default())
            .await
            .expect("read")
            .events
            .is_empty(),
        "an event landed under the spent fence"
    );
    match store
        .claim(&a, &claim_now("w1", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Completed) => {}
        other => {
            panic!("the finished holder's renewal answered {other:?}, not Finished(completed)")
        }
    }
}

/// A finished run stays listed with its status and `finished_at`; the
/// status filter narrows the listing; an empty status set is refused.
pub async fn lists_a_finished_run_with_its_status_and_finish_time(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    for r in ["a", "b", "c"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let la = take(&store, &run("a"), claim_now("w1", 60_000)).await;
    clock.advance(250);
    finish(&store, &run("a"), la.fence, &Outcome::completed(None)).await;
    let lc = take(&store, &run("c"), claim_now("w1", 60_000)).await;
    clock.advance(250);
    finish(&store, &run("c"), lc.fence, &Outcome::cancelled("stop")).await;
    let rows = walk(&store, &listing(), ListOptions::default(), 500).await;
    let by = |name: &str| {
        rows.iter()
            .find(|r| r.scope == run(name))
            .unwrap_or_else(|| panic!("run {name} is missing from the listing"))
            .clone()
    };
    let (a, b, c) = (by("a"), by("b"), by("c"));
    assert_eq!(
        (a.status, a.finished_at),
        (RunStatus::Completed, Some(at(250)))
    );
    assert_eq!((b.status, b.finished_at), (RunStatus::Active, None));
    assert_eq!(
        (c.status, c.finished_at),
        (RunStatus::Cancelled, Some(at(500)))
    );
    assert!(
        a.is_unheld() && c.is_unheld(),
        "a finished run is listed as held: {a:?} {c:?}"
    );
    let only = |statuses: Vec<RunStatus>| ListOptions {
        status: Some(statuses),
        ..Default::default()
    };
    let ids_of = |rows: Vec<runkeep::RunRow>| {
        rows.into_iter()
            .map(|r| r.scope.run_id.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids_of(walk(&store, &listing(), only(vec![RunStatus::Completed]), 500).await),
        ["run_conformance_a"]
    );
    assert_eq!(
        ids_of(walk(&store, &listing(), only(vec![RunStatus::Active]), 500).await),
        ["run_conformance_b"]
    );
    assert_eq!(
        ids_of(
            walk(
                &store,
                &listing(),
                only(vec![RunStatus::Cancelled, RunStatus::Completed]),
                500
            )
            .await
        ),
        ["run_conformance_a", "run_conformance_c"]
    );
    assert!(walk(&store, &listing(), only(vec![RunStatus::Failed]), 500)
        .await
        .is_empty());
    expect_invalid(
        store.list_runs(&listing(), &only(Vec::new())).await,
        "an empty status filter",
    );
}

/// No claim takes a finished run, however late: `claim` answers
/// `Finished`, `claim_next` passes over it.
pub async fn answers_finished_to_a_claim_and_claim_next_never_takes_it(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let l = take(&store, &a, claim_now("w1", 1_000)).await;
    finish(&store, &a, l.fence, &Outcome::failed("no")).await;
    clock.advance(86_400_000);
    match store
        .claim(&a, &claim_now("w2", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Failed) => {}
        other => panic!("a claim of a failed run answered {other:?}"),
    }
    assert_eq!(
        next_run(&store, "w3").await,
        None,
        "claim_next took a finished run"
    );
    write(&store, &run("b"), &checkpoint("b", 0), None).await;
    assert_eq!(next_run(&store, "w3").await, Some(run("b")));
    assert_eq!(
        next_run(&store, "w3").await,
        None,
        "claim_next took a finished run"
    );
}

/// A run is finished once: a second finish is a `Conflict` and changes
/// nothing.
pub async fn refuses_a_second_finish_as_a_conflict(store: Arc<dyn RunStore>, env: CaseEnv) {
    let _clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let l = take(&store, &a, claim_now("w1", 60_000)).await;
    let first = finish(&store, &a, l.fence, &Outcome::completed(Some(json!(1)))).await;
    expect_conflict(
        store.finish(&a, l.fence, &Outcome::failed("again")).await,
        "a second finish",
    );
    assert_eq!(store.lifecycle(&a).await.expect("lifecycle"), first);
}

/// Reopen makes a finished run active and claimable at a fence above every
/// fence issued, with attempts back to 0 and its evidence kept.
pub async fn reopens_a_finished_run_at_a_fence_above_every_fence_issued(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    take(&store, &a, claim_now("w1", 1_000)).await;
    clock.advance(2_000);
    let w2 = take(&store, &a, claim_now("w2", 60_000)).await;
    assert_eq!(store.lifecycle(&a).await.expect("lifecycle").attempts, 1);
    finish(&store, &a, w2.fence, &Outcome::failed("try later")).await;
    let reopened = store.reopen(&a).await.expect("reopen");
    assert_eq!(reopened.status, RunStatus::Active);
    assert_eq!(reopened.attempts, 0, "reopen must restart attempts at 0");
    assert_eq!(
        (reopened.finished_at, reopened.reason.as_deref()),
        (None, None)
    );
    assert_eq!(store.lifecycle(&a).await.expect("lifecycle"), reopened);
    let row = row_of(&store, &a, 2_000)
        .await
        .expect("the reopened run is listed");
    assert_eq!(
        (row.status, row.finished_at, row.attempts),
        (RunStatus::Active, None, 0)
    );
    assert_eq!(
        store.list_checkpoints(&a).await.expect("list").len(),
        1,
        "reopen lost evidence"
    );
    let (s, l) = store
        .claim_next(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now("w3", 60_000),
        )
        .await
        .expect("claim_next")
        .expect("the reopened run is claimable");
    assert_eq!(s, a);
    assert!(
        l.fence.get() > w2.fence.get() + 1,
        "the reopened run was claimed at fence {} (the finish spent {} and its end {})",
        l.fence,
        w2.fence,
        w2.fence.get() + 1
    );
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("old", 1), Some(w2.fence))
            .await,
        w2.fence,
        "the finished holder's fence after the reopen",
    );
}

/// Reopen refuses an active run (`Conflict`) and a run that does not exist
/// (`NotFound`).
pub async fn refuses_to_reopen_an_active_run_or_a_missing_one(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    match store.reopen(&run("missing")).await {
        Err(runkeep::Error::NotFound { .. }) => {}
        other => panic!("reopen of a run that does not exist answered {other:?}, not NotFound"),
    }
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    expect_conflict(store.reopen(&a).await, "reopen of an active run");
    take(&store, &a, claim_now("w1", 60_000)).await;
    expect_conflict(store.reopen(&a).await, "reopen of a held run");
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle"),
        Lifecycle::default()
    );
}

/// A run without a lifecycle record (written, never enqueued or finished,
/// as the reference writes them) is active, with no attempts and no
/// deferral, in `lifecycle` and in its row.
pub async fn treats_a_run_without_a_lifecycle_record_as_active(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    assert_eq!(
        store.lifecycle(&run("never")).await.expect("lifecycle"),
        Lifecycle::default(),
        "a run that does not exist"
    );
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle"),
        Lifecycle::default()
    );
    let row = row_of(&store, &a, 0).await.expect("listed");
    assert_eq!(
        (row.status, row.finished_at, row.attempts, row.available_at),
        (RunStatus::Active, None, 0, None)
    );
    assert!(row.is_claimable(at(0)));
}
