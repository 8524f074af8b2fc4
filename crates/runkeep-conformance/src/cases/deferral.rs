//! Deferral and enqueue (contract v2): `snooze`, `available_at` judged on
//! the store clock, and creating runnable runs.

use std::sync::Arc;

use runkeep::{ClaimOutcome, EnqueueOptions, Lifecycle, RunStore};

use crate::support::*;

/// Snooze releases the run and defers it: claims answer `NotBefore` until
/// `available_at` on the store clock, then the run is claimable; a snooze
/// under a fence that does not hold the run changes nothing.
pub async fn snooze_releases_the_run_and_defers_it_until_its_instant(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let l = take(&store, &a, claim_now("w1", 60_000)).await;
    let stale = runkeep::Fence::new(l.fence.get() + 5).expect("fence");
    assert!(
        !store.snooze(&a, stale, at(1)).await.unwrap_or(false),
        "a snooze under a fence that does not hold the run answered true"
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle").available_at,
        None
    );
    assert!(
        store.snooze(&a, l.fence, at(10_000)).await.expect("snooze"),
        "the holder's snooze answered false"
    );
    expect_fenced(
        store
            .write_checkpoint(&a, &checkpoint("late", 1), Some(l.fence))
            .await,
        l.fence,
        "a write under the snoozed fence",
    );
    let row = row_of(&store, &a, 0).await.expect("listed");
    assert_eq!(row.available_at, Some(at(10_000)));
    assert!(
        row.is_unheld(),
        "the snoozed run is listed as held: {row:?}"
    );
    assert!(!row.is_claimable(at(0)));
    for now in [0, 9_999] {
        clock.set(at(now));
        match store
            .claim(&a, &claim_now("w2", 60_000))
            .await
            .expect("claim")
        {
            ClaimOutcome::NotBefore(t) => assert_eq!(t, at(10_000)),
            other => {
                panic!("a claim at +{now} ms of a run deferred to +10000 ms answered {other:?}")
            }
        }
    }
    clock.set(at(10_000));
    let w2 = take(&store, &a, claim_now("w2", 60_000)).await;
    assert_eq!(
        w2.fence.get(),
        l.fence.get() + 2,
        "a snooze releases: the next claim is fence + 2"
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle").available_at,
        None,
        "a successful claim clears available_at"
    );
}

/// `claim_next` skips a deferred run until its instant on the store clock.
pub async fn claim_next_skips_a_deferred_run_until_it_is_available(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    for r in ["a", "b"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let l = take(&store, &run("a"), claim_now("w1", 60_000)).await;
    assert!(store
        .snooze(&run("a"), l.fence, at(5_000))
        .await
        .expect("snooze"));
    assert_eq!(next_run(&store, "w2").await, Some(run("b")));
    clock.set(at(4_999));
    assert_eq!(
        next_run(&store, "w2").await,
        None,
        "claim_next took a run before its available_at"
    );
    clock.set(at(5_000));
    assert_eq!(next_run(&store, "w2").await, Some(run("a")));
}

/// Enqueue creates a runnable run with its first checkpoint (unfenced), its
/// not-before time and its own attempt limit.
pub async fn enqueues_a_runnable_run_with_its_not_before_time_and_attempt_limit(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = run("a");
    let stored = store
        .enqueue(
            &a,
            &checkpoint("a", 0),
            &EnqueueOptions {
                available_at: Some(at(3_000)),
                max_attempts: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("enqueue");
    assert_eq!(stored.fence, None, "an enqueued checkpoint is unfenced");
    assert_eq!(
        store.read_checkpoint(&a, &stored.id).await.expect("read"),
        Some(stored.clone())
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle"),
        Lifecycle {
            available_at: Some(at(3_000)),
            max_attempts: Some(3),
            ..Lifecycle::default()
        }
    );
    let row = row_of(&store, &a, 0)
        .await
        .expect("an enqueued run is listed");
    assert_eq!(row.available_at, Some(at(3_000)));
    match store
        .claim(&a, &claim_now("w1", 60_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::NotBefore(t) => assert_eq!(t, at(3_000)),
        other => panic!("a claim before the enqueued not-before time answered {other:?}"),
    }
    let b = run("b");
    store
        .enqueue(&b, &checkpoint("b", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue");
    assert_eq!(
        next_run(&store, "w2").await,
        Some(b),
        "an enqueued run is claimable at once"
    );
    assert_eq!(next_run(&store, "w2").await, None);
    clock.set(at(3_000));
    assert_eq!(next_run(&store, "w2").await, Some(a));
}

/// Enqueue refuses a run that exists (`Conflict`) and a zero attempt limit
/// (`InvalidInput`), changing nothing.
pub async fn refuses_to_enqueue_an_existing_run_or_a_zero_attempt_limit(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    store
        .enqueue(&a, &checkpoint("a", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue");
    let before = read_back(&store, &a, at(0)).await;
    expect_conflict(
        store
            .enqueue(
                &a,
                &checkpoint("again", 1),
                &EnqueueOptions {
                    available_at: Some(at(9_000)),
                    max_attempts: Some(2),
                    ..Default::default()
                },
            )
            .await,
        "enqueue of a run that has a checkpoint",
    );
    assert_eq!(
        read_back(&store, &a, at(0)).await,
        before,
        "a refused enqueue changed the run"
    );
    let b = run("b");
    take(&store, &b, claim_opts("w1", 60_000, 0)).await;
    expect_conflict(
        store
            .enqueue(&b, &checkpoint("b", 0), &EnqueueOptions::default())
            .await,
        "enqueue of a run that has a holding",
    );
    assert!(store.list_checkpoints(&b).await.expect("list").is_empty());
    let c = run("c");
    expect_invalid(
        store
            .enqueue(
                &c,
                &checkpoint("c", 0),
                &EnqueueOptions {
                    max_attempts: Some(0),
                    ..Default::default()
                },
            )
            .await,
        "enqueue with max_attempts 0",
    );
    assert!(
        store.list_checkpoints(&c).await.expect("list").is_empty(),
        "a refused enqueue wrote its checkpoint"
    );
    assert_eq!(
        store.lifecycle(&c).await.expect("lifecycle"),
        Lifecycle::default()
    );
    assert!(
        row_of(&store, &c, 0).await.is_none(),
        "a refused enqueue is listed"
    );
}
