//! Attempts and dead-lettering (contract v2): only a takeover from an
//! expired lease counts; the takeover reaching the limit finishes the run as
//! failed ("attempts exhausted").

use std::sync::Arc;

use runkeep::lifecycle::{ATTEMPTS_EXHAUSTED, DEFAULT_MAX_ATTEMPTS};
use runkeep::{
    ClaimNextFilter, ClaimOptions, ClaimOutcome, EnqueueOptions, ManualClock, Outcome, RunScope,
    RunStatus, RunStore,
};

use crate::support::*;

async fn attempts(store: &Arc<dyn RunStore>, scope: &RunScope, when: &str) -> u32 {
    let l = store.lifecycle(scope).await.expect("lifecycle").attempts;
    let row = row_of(store, scope, 0).await;
    if let Some(row) = row {
        assert_eq!(
            row.attempts, l,
            "{when}: the row's attempts differ from the lifecycle's"
        );
    }
    l
}

/// Lets the current lease lapse and takes the run over as `who`.
async fn lapse_and_claim(
    store: &Arc<dyn RunStore>,
    clock: &ManualClock,
    scope: &RunScope,
    opts: ClaimOptions,
) -> ClaimOutcome {
    clock.advance(2_000);
    store.claim(scope, &opts).await.expect("claim")
}

/// First claim, renewal, claim after a clean release and claim after a
/// snooze count nothing; a takeover from another holder's expired lease
/// counts one, shown by `lifecycle` and the row.
pub async fn counts_an_attempt_only_for_a_takeover_from_an_expired_lease(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    take(&store, &a, claim_now("w1", 1_000)).await;
    assert_eq!(attempts(&store, &a, "after the first claim").await, 0);
    clock.advance(500);
    let renewed = take(&store, &a, claim_now("w1", 1_000)).await;
    assert_eq!(attempts(&store, &a, "after a renewal").await, 0);
    assert!(store.release(&a, renewed.fence).await.expect("release"));
    let w2 = take(&store, &a, claim_now("w2", 1_000)).await;
    assert_eq!(
        attempts(&store, &a, "after a claim following a release").await,
        0
    );
    assert!(store
        .snooze(&a, w2.fence, clock.now().offset(100))
        .await
        .expect("snooze"));
    clock.advance(100);
    take(&store, &a, claim_now("w3", 1_000)).await;
    assert_eq!(
        attempts(&store, &a, "after a claim following a snooze").await,
        0
    );
    match lapse_and_claim(&store, &clock, &a, claim_now("w4", 1_000)).await {
        ClaimOutcome::Acquired(_) => {}
        other => panic!("the takeover answered {other:?}"),
    }
    assert_eq!(
        attempts(&store, &a, "after a takeover from an expired lease").await,
        1
    );
    match lapse_and_claim(&store, &clock, &a, claim_now("w5", 1_000)).await {
        ClaimOutcome::Acquired(_) => {}
        other => panic!("the second takeover answered {other:?}"),
    }
    assert_eq!(attempts(&store, &a, "after a second takeover").await, 2);
}

/// The takeover that reaches the run's limit does not hand it out: the run
/// is finished as failed, "attempts exhausted", the claim answers
/// `Finished(Failed)`, the lost holder is fenced out and the queue skips it.
pub async fn dead_letters_the_run_when_the_takeover_reaches_the_limit(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    store
        .enqueue(
            &a,
            &checkpoint("a", 0),
            &EnqueueOptions {
                max_attempts: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue");
    take(&store, &a, claim_now("w0", 1_000)).await;
    let w1 = match lapse_and_claim(&store, &clock, &a, claim_now("w1", 1_000)).await {
        ClaimOutcome::Acquired(l) => l,
        other => panic!("the first takeover (attempt 1 of 2) answered {other:?}"),
    };
    let when = clock.now().offset(2_000);
    match lapse_and_claim(&store, &clock, &a, claim_now("w2", 1_000)).await {
        ClaimOutcome::Finished(RunStatus::Failed) => {}
        other => panic!("the takeover reaching the limit answered {other:?}, not Finished(failed)"),
    }
    let l = store.lifecycle(&a).await.expect("lifecycle");
    assert_eq!(l.status, RunStatus::Failed);
    assert_eq!(l.reason.as_deref(), Some(ATTEMPTS_EXHAUSTED));
    assert_eq!(l.attempts, 2);
    assert_eq!(
        l.finished_at,
        Some(when),
        "dead-lettered at another instant than the store clock's"
    );
    let row = row_of(&store, &a, 4_000)
        .await
        .expect("a dead-lettered run stays listed");
    assert_eq!((row.status, row.attempts), (RunStatus::Failed, 2));
    assert!(
        row.is_unheld(),
        "the dead-lettered run is listed as held: {row:?}"
    );
    assert!(
        row.dead_lettered,
        "the row of a dead-lettered run does not say so: {row:?}"
    );
    // A run its worker finished as failed is not a dead letter.
    let b = run("b");
    store
        .enqueue(&b, &checkpoint("b", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue b");
    let held = take(&store, &b, claim_now("w9", 1_000)).await;
    store
        .finish(&b, held.fence, &Outcome::failed("the tool kept timing out"))
        .await
        .expect("finish b as failed");
    let row_b = row_of(&store, &b, 4_000).await.expect("b is listed");
    assert_eq!(row_b.status, RunStatus::Failed);
    assert!(
        !row_b.dead_lettered,
        "a run its worker failed is listed as dead-lettered: {row_b:?}"
    );
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("late", 1), Some(w1.fence))
            .await,
        w1.fence,
        "the lost holder's write after dead-lettering",
    );
    match store
        .claim(&a, &claim_now("w3", 1_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::Finished(RunStatus::Failed) => {}
        other => panic!("a claim of a dead-lettered run answered {other:?}"),
    }
    assert_eq!(
        store
            .claim_next(
                &listing(),
                &ClaimNextFilter::default(),
                &claim_now("w4", 1_000)
            )
            .await
            .expect("claim_next"),
        None,
        "claim_next handed out a dead-lettered run"
    );
}

/// Runs a run through takeovers with `opts` until a claim does not acquire;
/// answers how many takeovers acquired and the final answer.
async fn takeovers_until_refused(
    store: &Arc<dyn RunStore>,
    clock: &ManualClock,
    scope: &RunScope,
    opts: impl Fn(usize) -> ClaimOptions,
) -> (usize, ClaimOutcome) {
    take(store, scope, opts(0)).await;
    for i in 1..=DEFAULT_MAX_ATTEMPTS as usize + 2 {
        match lapse_and_claim(store, clock, scope, opts(i)).await {
            ClaimOutcome::Acquired(_) => {}
            other => return (i - 1, other),
        }
    }
    panic!(
        "{scope} was taken over {} times without being dead-lettered",
        DEFAULT_MAX_ATTEMPTS + 2
    );
}

/// The limit in force is the claim's, over the run's own (from enqueue),
/// over the documented default.
pub async fn takes_the_attempt_limit_from_the_claim_over_the_run_over_the_default(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let own = |n| EnqueueOptions {
        max_attempts: Some(n),
        ..Default::default()
    };
    // The claim's limit (1) over the run's (5).
    let a = run("a");
    store
        .enqueue(&a, &checkpoint("a", 0), &own(5))
        .await
        .expect("enqueue");
    let (ok, last) = takeovers_until_refused(&store, &clock, &a, |i| {
        claim_now(&format!("a{i}"), 1_000).with_max_attempts(1)
    })
    .await;
    assert_eq!(
        (ok, &last),
        (0, &ClaimOutcome::Finished(RunStatus::Failed)),
        "claim limit 1 over run limit 5"
    );
    // The claim's limit (3) over the run's (1).
    let b = run("b");
    store
        .enqueue(&b, &checkpoint("b", 0), &own(1))
        .await
        .expect("enqueue");
    let (ok, last) = takeovers_until_refused(&store, &clock, &b, |i| {
        claim_now(&format!("b{i}"), 1_000).with_max_attempts(3)
    })
    .await;
    assert_eq!(
        (ok, &last),
        (2, &ClaimOutcome::Finished(RunStatus::Failed)),
        "claim limit 3 over run limit 1"
    );
    // The run's own limit (2) when the claim sets none.
    let c = run("c");
    store
        .enqueue(&c, &checkpoint("c", 0), &own(2))
        .await
        .expect("enqueue");
    let (ok, last) =
        takeovers_until_refused(&store, &clock, &c, |i| claim_now(&format!("c{i}"), 1_000)).await;
    assert_eq!(
        (ok, &last),
        (1, &ClaimOutcome::Finished(RunStatus::Failed)),
        "run limit 2"
    );
    // The default when neither does.
    let d = run("d");
    write(&store, &d, &checkpoint("d", 0), None).await;
    let (ok, last) =
        takeovers_until_refused(&store, &clock, &d, |i| claim_now(&format!("d{i}"), 1_000)).await;
    assert_eq!(
        (ok, &last),
        (
            DEFAULT_MAX_ATTEMPTS as usize - 1,
            &ClaimOutcome::Finished(RunStatus::Failed)
        ),
        "the default limit {DEFAULT_MAX_ATTEMPTS}"
    );
    assert_eq!(
        store.lifecycle(&d).await.expect("lifecycle").attempts,
        DEFAULT_MAX_ATTEMPTS
    );
}
