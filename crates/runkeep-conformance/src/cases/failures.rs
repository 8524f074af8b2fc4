//! Failed attempts, cancel and a release that sticks (contract v2,
//! `runkeep::failure`): a step that raises is counted like a takeover,
//! deferred by its backoff and dead-lettered at the limit with its error; an
//! operator's cancel ends the holding and tells the holder why; a holder
//! that released cannot renew its way back to the fence it gave up.

use std::sync::Arc;

use runkeep::failure::RetryPolicy;
use runkeep::lifecycle::ATTEMPTS_EXHAUSTED;
use runkeep::{
    AttemptError, ClaimOutcome, EnqueueOptions, Error, Outcome, RunScope, RunStatus, RunStore,
};

use crate::support::*;

fn policy() -> RetryPolicy {
    RetryPolicy {
        base_ms: 1_000,
        factor: 2.0,
        cap_ms: 10_000,
    }
}

async fn enqueue(store: &Arc<dyn RunStore>, scope: &RunScope, max_attempts: u32) {
    store
        .enqueue(
            scope,
            &checkpoint(scope.run_id.as_str(), 0),
            &EnqueueOptions {
                max_attempts: Some(max_attempts),
                retry: Some(policy()),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue");
}

fn boom(n: u32) -> AttemptError {
    AttemptError::new("ValueError", format!("step raised #{n}"))
}

/// A failed attempt is recorded with its error and fence, counts one
/// attempt, spends the fence, and defers the run by exactly the policy's
/// backoff for that attempt (the same instant on every backend).
pub async fn records_a_failed_attempt_and_defers_the_run_by_its_backoff(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 5).await;
    let lease = take(&store, &a, claim_now("w1", 60_000)).await;
    let failed_at = clock.now();
    let l = store
        .fail_attempt(&a, lease.fence, &boom(1), None)
        .await
        .expect("fail_attempt");
    let expected = failed_at.offset(policy().delay(&a.run_id, 1).as_millis() as i64);
    assert_eq!(
        l.status,
        RunStatus::Active,
        "one failure of five is not the end"
    );
    assert_eq!(l.attempts, 1, "a failed attempt counts one attempt");
    assert_eq!(
        l.available_at,
        Some(expected),
        "the run must be deferred by the policy's backoff for attempt 1"
    );
    let f = l.failures.last().expect("the failure is in the history");
    assert_eq!(
        (f.attempt, f.fence, f.at, f.retry_at),
        (1, lease.fence, failed_at, Some(expected))
    );
    assert_eq!(
        (f.error.kind.as_str(), f.error.message.as_str()),
        ("ValueError", "step raised #1")
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle"),
        l,
        "the lifecycle read back differs from the one fail_attempt answered"
    );
    let row = row_of(&store, &a, 0).await.expect("row");
    assert_eq!(
        (row.attempts, row.available_at),
        (1, Some(expected)),
        "the row"
    );
    // The fence is spent.
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("late", 1), Some(lease.fence))
            .await,
        lease.fence,
        "a write under the failed attempt's fence",
    );
    // Deferred until the backoff has passed, then claimable by anyone, and
    // that claim is not a second attempt.
    match store
        .claim(&a, &claim_now("w2", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::NotBefore(at) => assert_eq!(at, expected),
        other => panic!("a claim during the backoff answered {other:?}"),
    }
    assert!(
        next_run(&store, "w2").await.is_none(),
        "claim_next handed out a run in its backoff"
    );
    clock.set(expected);
    let again = take(&store, &a, claim_now("w2", 60_000)).await;
    assert!(again.fence > lease.fence);
    assert_eq!(store.lifecycle(&a).await.expect("lifecycle").attempts, 1);
}

/// The failed attempt that reaches the limit dead-letters the run with the
/// last error on top of its history; nothing hands it out again.
pub async fn dead_letters_the_run_when_failed_attempts_reach_the_limit(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 3).await;
    let mut last = None;
    for n in 1..=3 {
        let lease = take(&store, &a, claim_now("w", 60_000)).await;
        let l = store
            .fail_attempt(&a, lease.fence, &boom(n), None)
            .await
            .expect("fail_attempt");
        assert_eq!(l.attempts, n);
        if n < 3 {
            assert_eq!(l.status, RunStatus::Active, "attempt {n} of 3");
            clock.set(l.available_at.expect("deferred"));
        }
        last = Some((l, clock.now()));
    }
    let (dead, when) = last.expect("three attempts");
    assert!(dead.is_dead_lettered(), "{dead:?}");
    assert_eq!(dead.reason.as_deref(), Some(ATTEMPTS_EXHAUSTED));
    assert_eq!(dead.finished_at, Some(when));
    assert_eq!(dead.available_at, None);
    let history: Vec<_> = dead
        .failures
        .iter()
        .map(|f| f.error.message.clone())
        .collect();
    assert_eq!(
        history,
        ["step raised #1", "step raised #2", "step raised #3"],
        "the error history"
    );
    assert_eq!(
        dead.failures[2].retry_at, None,
        "the last failure retries nothing"
    );
    match store
        .claim(&a, &claim_now("w", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Failed) => {}
        other => panic!("a claim of the dead-lettered run answered {other:?}"),
    }
    clock.advance(3_600_000);
    assert!(next_run(&store, "w").await.is_none());
    let row = row_of(&store, &a, 0).await.expect("row");
    assert!(
        row.dead_lettered && row.status == RunStatus::Failed,
        "{row:?}"
    );
}

/// Takeovers of expired leases and failed attempts count toward one limit;
/// a report's own limit wins over the run's.
pub async fn counts_takeovers_and_failed_attempts_toward_one_limit(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 2).await;
    take(&store, &a, claim_now("w0", 1_000)).await;
    clock.advance(2_000);
    let w1 = take(&store, &a, claim_now("w1", 60_000)).await;
    assert_eq!(store.lifecycle(&a).await.expect("lifecycle").attempts, 1);
    let l = store
        .fail_attempt(&a, w1.fence, &boom(1), None)
        .await
        .expect("fail_attempt");
    assert!(
        l.is_dead_lettered() && l.attempts == 2,
        "a takeover and a failure are two attempts of two: {l:?}"
    );

    let b = run("b");
    enqueue(&store, &b, 10).await;
    let lease = take(&store, &b, claim_now("w", 60_000)).await;
    let l = store
        .fail_attempt(&b, lease.fence, &boom(1), Some(1))
        .await
        .expect("fail_attempt");
    assert!(
        l.is_dead_lettered(),
        "the report's limit of 1 must win over the run's 10: {l:?}"
    );
}

/// A failed attempt under a superseded, released or never-issued fence, with
/// a bad error, or on a finished run is refused and changes nothing.
pub async fn refuses_a_failed_attempt_it_cannot_record_and_changes_nothing(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 5).await;
    let old = take(&store, &a, claim_now("w1", 1_000)).await;
    clock.advance(2_000);
    let new = take(&store, &a, claim_now("w2", 60_000)).await;
    let before = store.lifecycle(&a).await.expect("lifecycle");
    expect_fenced(
        store.fail_attempt(&a, old.fence, &boom(1), None).await,
        old.fence,
        "a failure reported under a superseded fence",
    );
    let never = runkeep::Fence::new(new.fence.get() + 5).expect("fence");
    expect_invalid(
        store.fail_attempt(&a, never, &boom(1), None).await,
        "a failure under a fence never issued",
    );
    let empty = AttemptError {
        kind: " ".into(),
        message: "x".into(),
    };
    expect_invalid(
        store.fail_attempt(&a, new.fence, &empty, None).await,
        "an error without a kind",
    );
    let long = AttemptError {
        kind: "error".into(),
        message: "x".repeat(runkeep::failure::MAX_ERROR_MESSAGE_CHARS + 1),
    };
    expect_invalid(
        store.fail_attempt(&a, new.fence, &long, None).await,
        "an error message above the limit",
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle"),
        before,
        "a refused failure changed the lifecycle"
    );
    store
        .write_checkpoint(&a, &checkpoint("still", 3), Some(new.fence))
        .await
        .expect("the holder still holds the run after refused reports");
    store
        .finish(&a, new.fence, &Outcome::completed(None))
        .await
        .expect("finish");
    expect_conflict(
        store.fail_attempt(&a, new.fence, &boom(2), None).await,
        "a failure reported on a finished run",
    );
}

/// An operator cancels a claimed run: finished as cancelled with the
/// reason, the holder's next write is refused as `Cancelled` (not as a
/// takeover), its renewal answers `Finished(Cancelled)`, and nothing hands
/// the run out until it is reopened.
pub async fn cancels_a_claimed_run_and_tells_its_holder_why(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 5).await;
    let lease = take(&store, &a, claim_now("w1", 60_000)).await;
    let l = store
        .cancel(&a, Some("customer closed the ticket"))
        .await
        .expect("cancel");
    assert_eq!(l.status, RunStatus::Cancelled);
    assert_eq!(l.reason.as_deref(), Some("customer closed the ticket"));
    assert_eq!(l.finished_at, Some(clock.now()));
    assert_eq!(store.lifecycle(&a).await.expect("lifecycle"), l);
    match store
        .write_checkpoint(&a, &checkpoint("late", 1), Some(lease.fence))
        .await
    {
        Err(Error::Cancelled { reason, .. }) => {
            assert_eq!(reason.as_deref(), Some("customer closed the ticket"))
        }
        other => panic!("the holder's write after a cancel answered {other:?}, not Cancelled"),
    }
    match store
        .append_events(
            &a,
            &[event("note", serde_json::json!({}))],
            Some(lease.fence),
        )
        .await
    {
        Err(Error::Cancelled { .. }) => {}
        other => panic!("the holder's append after a cancel answered {other:?}, not Cancelled"),
    }
    match store
        .finish(&a, lease.fence, &runkeep::Outcome::completed(None))
        .await
    {
        Err(Error::Cancelled { .. }) => {}
        other => panic!("the holder's finish after a cancel answered {other:?}, not Cancelled"),
    }
    match store.fail_attempt(&a, lease.fence, &boom(1), None).await {
        Err(Error::Cancelled { .. }) => {}
        other => {
            panic!("the holder's failure report after a cancel answered {other:?}, not Cancelled")
        }
    }
    match store
        .claim(&a, &claim_now("w1", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Cancelled) => {}
        other => panic!("the holder's renewal after a cancel answered {other:?}"),
    }
    assert!(next_run(&store, "w2").await.is_none());
    let row = row_of(&store, &a, 0).await.expect("row");
    assert_eq!(row.status, RunStatus::Cancelled);
    store.reopen(&a).await.expect("reopen");
    let again = take(&store, &a, claim_now("w2", 60_000)).await;
    assert!(
        again.fence.get() > lease.fence.get() + 1,
        "the claim after reopen must be above the cancel's tombstone: {again:?} after {lease:?}"
    );
}

/// A run nobody holds can be cancelled too; a finished or missing run, or
/// a reason above the limit, is refused and changes nothing.
pub async fn cancels_an_unclaimed_run_and_refuses_what_it_cannot_cancel(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 5).await;
    let long = "r".repeat(runkeep::lifecycle::MAX_REASON_CHARS + 1);
    expect_invalid(
        store.cancel(&a, Some(&long)).await,
        "a reason above the limit",
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle").status,
        RunStatus::Active
    );
    let l = store.cancel(&a, None).await.expect("cancel");
    assert_eq!(l.status, RunStatus::Cancelled);
    assert!(
        l.reason.is_some(),
        "a cancel without a reason still records one"
    );
    match store
        .claim(&a, &claim_now("w", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Cancelled) => {}
        other => panic!("a claim of the cancelled run answered {other:?}"),
    }
    expect_conflict(store.cancel(&a, None).await, "a second cancel");
    match store.cancel(&run("never"), None).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("cancelling a run that does not exist answered {other:?}"),
    }
    assert!(
        row_of(&store, &run("never"), 0).await.is_none(),
        "a refused cancel created the run"
    );
}

/// A release sticks: the holder that released (or was released by an
/// operator) and claims again gets a new claim two fences up, never the
/// renewal it would have had, and its old fence stays refused.
pub async fn a_claim_after_a_release_is_a_new_claim_not_a_renewal(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    let a = run("a");
    enqueue(&store, &a, 5).await;
    let first = take(&store, &a, claim_now("w1", 60_000)).await;
    let renewed = take(&store, &a, claim_now("w1", 60_000)).await;
    assert_eq!(
        renewed.fence.get(),
        first.fence.get() + 1,
        "a renewal is the next fence"
    );
    assert!(store.release(&a, renewed.fence).await.expect("release"));
    let after = take(&store, &a, claim_now("w1", 60_000)).await;
    assert_eq!(
        after.fence.get(),
        renewed.fence.get() + 2,
        "the same holder's claim after a release must skip the tombstone: a gap a runtime sees"
    );
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("stale", 1), Some(renewed.fence))
            .await,
        renewed.fence,
        "a write under the released fence",
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle").attempts,
        0,
        "a claim after a release is not an attempt"
    );
}

/// A run past its deadline is finished as failed ("deadline") by its next
/// claim, the holder's renewal included, and never handed out again;
/// `claim_next` finishes it and moves on.
pub async fn finishes_a_run_past_its_deadline_at_its_next_claim(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let (a, b) = (run("a"), run("b"));
    for scope in [&a, &b] {
        store
            .enqueue(
                scope,
                &checkpoint(scope.run_id.as_str(), 0),
                &EnqueueOptions {
                    deadline: Some(at(5_000)),
                    ..Default::default()
                },
            )
            .await
            .expect("enqueue");
    }
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle").deadline,
        Some(at(5_000))
    );
    let lease = take(&store, &a, claim_now("w1", 60_000)).await;
    clock.set(at(4_999));
    let renewed = take(&store, &a, claim_now("w1", 60_000)).await;
    clock.set(at(5_000));
    match store
        .claim(&a, &claim_now("w1", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Failed) => {}
        other => panic!("the holder's renewal at the deadline answered {other:?}"),
    }
    let l = store.lifecycle(&a).await.expect("lifecycle");
    assert_eq!(l.status, RunStatus::Failed);
    assert_eq!(
        l.reason.as_deref(),
        Some(runkeep::lifecycle::DEADLINE_PASSED)
    );
    assert_eq!(l.finished_at, Some(at(5_000)));
    assert!(!l.is_dead_lettered(), "a deadline is not a dead-letter");
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("late", 1), Some(renewed.fence))
            .await,
        renewed.fence,
        "a write of the holder after its run's deadline was judged",
    );
    assert!(lease.fence < renewed.fence);
    // Nobody holds b: claim_next finishes it and finds nothing else.
    assert!(next_run(&store, "w2").await.is_none());
    let lb = store.lifecycle(&b).await.expect("lifecycle");
    assert_eq!(
        (lb.status, lb.reason.as_deref()),
        (RunStatus::Failed, Some(runkeep::lifecycle::DEADLINE_PASSED))
    );
}

/// Every lease of a run carries its attempt timeout, for the runtime that
/// steps it.
pub async fn hands_the_runs_attempt_timeout_to_every_taker(store: Arc<dyn RunStore>, env: CaseEnv) {
    let _clock = env.clock();
    let a = run("a");
    store
        .enqueue(
            &a,
            &checkpoint("a", 0),
            &EnqueueOptions {
                attempt_timeout: Some(runkeep::Ttl::from_millis(30_000).expect("ttl")),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue");
    let (scope, lease) = store
        .claim_next(
            &listing(),
            &runkeep::ClaimNextFilter::default(),
            &claim_now("w", 60_000),
        )
        .await
        .expect("claim_next")
        .expect("a run");
    assert_eq!(scope, a);
    assert_eq!(lease.attempt_timeout_ms, Some(30_000), "claim_next's lease");
    let renewed = take(&store, &a, claim_now("w", 60_000)).await;
    assert_eq!(renewed.attempt_timeout_ms, Some(30_000), "a claim's lease");
    let b = run("b");
    write(&store, &b, &checkpoint("b", 0), None).await;
    let plain = take(&store, &b, claim_now("w", 60_000)).await;
    assert_eq!(plain.attempt_timeout_ms, None, "a run without one");
}
