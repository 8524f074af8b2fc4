//! The hand-over (`commit_step_and_claim_next`): a worker's step on the run
//! it is done with, and its next run, in one call.

use std::collections::HashMap;
use std::sync::Arc;

use runkeep::{
    ClaimNextFilter, ClaimOptions, Fence, Handover, Lease, NextClaim, Outcome, RunScope, RunStatus,
    RunStore, Step,
};
use serde_json::json;

use crate::support::*;

/// The drain cycle's step: an event, a checkpoint and the finish.
fn last_step(tag: &str) -> Step {
    Step {
        events: vec![event("tool_result", json!({"tag": tag}))],
        checkpoint: Some(checkpoint(&format!("end_{tag}"), 10)),
        finish: Some(Outcome::completed(Some(json!({"tag": tag})))),
        ..Step::default()
    }
}

fn next_claim(options: ClaimOptions) -> NextClaim {
    NextClaim {
        scope: listing(),
        filter: ClaimNextFilter::default(),
        options,
    }
}

async fn hand_over(
    store: &Arc<dyn RunStore>,
    scope: &RunScope,
    fence: Fence,
    tag: &str,
    options: ClaimOptions,
) -> runkeep::Result<Handover> {
    store
        .commit_step_and_claim_next(scope, fence, &last_step(tag), &next_claim(options))
        .await
}

/// The run a hand-over took is held live by `holder` under its lease's
/// fence, as the store reads it back.
async fn held_live_by(store: &Arc<dyn RunStore>, scope: &RunScope, lease: &Lease, holder: &str) {
    assert_eq!(lease.holder.as_str(), holder);
    let summary = store
        .lease(scope, store.now())
        .await
        .expect("lease")
        .expect("the next run is held");
    assert_eq!(summary.fence, lease.fence);
    assert_eq!(summary.holder, holder);
    assert!(!summary.expired, "the next run's lease is not live");
}

/// Each hand-over finishes its run with the step and takes the next queued
/// run under a live lease for the caller; the last one answers no run.
pub async fn hands_over_from_a_finished_step_to_the_next_run(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for r in ["a", "b", "c"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let mut held = (
        run("a"),
        take(&store, &run("a"), claim_now("w1", 60_000)).await,
    );
    for (tag, expected) in [("a", Some(run("b"))), ("b", Some(run("c"))), ("c", None)] {
        let (scope, lease) = held.clone();
        let over = hand_over(&store, &scope, lease.fence, tag, claim_now("w1", 60_000))
            .await
            .expect("commit_step_and_claim_next");
        let finished = over
            .receipt
            .lifecycle
            .as_ref()
            .expect("the receipt carries the finish");
        assert_eq!(finished.status, RunStatus::Completed);
        assert_eq!(over.receipt.events.len(), 1, "the step's event");
        let life = store.lifecycle(&scope).await.expect("lifecycle");
        assert_eq!(
            life.status,
            RunStatus::Completed,
            "the step's run is not finished"
        );
        let next = over.next.expect("the claim");
        assert_eq!(
            next.as_ref().map(|(s, _)| s.clone()),
            expected,
            "the hand-over from {scope} took the wrong run"
        );
        let Some((s, l)) = next else { break };
        held_live_by(&store, &s, &l, "w1").await;
        held = (s, l);
    }
}

/// A step refused for its fence claims nothing: the next run stays
/// unclaimed, and the refused step left nothing.
pub async fn a_refused_hand_over_claims_nothing(store: Arc<dyn RunStore>, _env: CaseEnv) {
    for r in ["a", "b"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let l = take(&store, &run("a"), claim_now("w1", 60_000)).await;
    assert!(store.release(&run("a"), l.fence).await.expect("release"));
    let refused = hand_over(&store, &run("a"), l.fence, "a", claim_now("w1", 60_000)).await;
    expect_fenced(refused, l.fence, "a hand-over under a released fence");
    assert!(
        store
            .lease(&run("b"), store.now())
            .await
            .expect("lease")
            .is_none(),
        "the refused hand-over claimed the next run"
    );
    let events = store
        .read_events(&run("a"), &Default::default())
        .await
        .expect("read_events");
    assert!(events.events.is_empty(), "the refused step left events");
    let (s, _) = store
        .claim_next(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now("w2", 60_000),
        )
        .await
        .expect("claim_next")
        .expect("a run is left to claim");
    assert_eq!(s, run("a"), "the released run sorts first");
}

/// The claim sees the step's writes: a run the step finished is never the
/// next one, even judged at an instant where its lease has run out.
pub async fn never_hands_over_to_the_run_the_step_just_finished(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(&store, &run("a"), &checkpoint("a", 0), None).await;
    let l = take(&store, &run("a"), claim_now("w1", 60_000)).await;
    // The next claim judged two minutes on: the step's own lease (one
    // minute) has run out by then, so only the finish keeps it off.
    let over = hand_over(
        &store,
        &run("a"),
        l.fence,
        "a",
        claim_opts("w2", 60_000, 120_000),
    )
    .await
    .expect("commit_step_and_claim_next");
    let next = over.next.expect("the claim");
    assert!(
        next.is_none(),
        "the hand-over took back the run its step finished: {next:?}"
    );
    let life = store.lifecycle(&run("a")).await.expect("lifecycle");
    assert_eq!(
        life.status,
        RunStatus::Completed,
        "the finish did not survive the hand-over"
    );
}

/// Four workers chaining hand-overs through eight runs: every run is taken
/// by exactly one worker and finished once.
pub async fn concurrent_hand_overs_never_give_one_run_to_two_workers(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let runs: Vec<String> = (0..8).map(|i| format!("h{i}")).collect();
    for r in &runs {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let who = format!("w{w}");
            let mut got = Vec::new();
            let mut held = loop {
                match store
                    .claim_next(
                        &listing(),
                        &ClaimNextFilter::default(),
                        &claim_now(&who, 60_000),
                    )
                    .await
                {
                    Ok(h) => break h,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("claim_next failed: {e}"),
                }
            };
            while let Some((s, l)) = held.take() {
                got.push(s.run_id.to_string());
                // A store that hands out a finished run again would chain
                // forever: more runs than were queued is already the failure.
                assert!(
                    got.len() <= 8,
                    "one worker took more runs than were queued: {got:?}"
                );
                let over = loop {
                    match hand_over(&store, &s, l.fence, &who, claim_now(&who, 60_000)).await {
                        Ok(o) => break o,
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("hand-over failed: {e}"),
                    }
                };
                held = match over.next {
                    Ok(n) => n,
                    Err(e) if e.is_retryable() => None,
                    Err(e) => panic!("the hand-over's claim failed: {e}"),
                };
            }
            got
        }));
    }
    let mut owners: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for r in t.await.expect("task") {
            *owners.entry(r).or_default() += 1;
        }
    }
    assert!(
        owners.values().all(|&n| n == 1),
        "a run went to two workers: {owners:?}"
    );
    for r in &runs {
        let life = store.lifecycle(&run(r)).await.expect("lifecycle");
        assert_eq!(life.status, RunStatus::Completed, "{r} was not finished");
    }
    assert_eq!(
        owners.len(),
        runs.len(),
        "not every run was taken: {owners:?}"
    );
}

/// A step whose own lease has lapsed (nobody took the run over, so its
/// fence still stands) is accepted, and the hand-over's claim then judges
/// the step's run as `claim_next` would after the step: still active and
/// no longer held live, it is the next run, taken again by its holder
/// under the next fence. (Found by the differential test's hand-over: a
/// store must not leave the step's own run out of the claim.)
pub async fn a_hand_over_after_its_own_lease_lapsed_takes_the_run_again(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    write(&store, &run("a"), &checkpoint("a", 0), None).await;
    let l = take(&store, &run("a"), claim_now("w1", 1_000)).await;
    clock.advance(1_000);
    let step = Step {
        events: vec![event("tool_result", json!({"late": true}))],
        ..Step::default()
    };
    let over = store
        .commit_step_and_claim_next(
            &run("a"),
            l.fence,
            &step,
            &next_claim(claim_now("w1", 1_000)),
        )
        .await
        .expect("a step under a lapsed but not superseded fence is accepted");
    assert_eq!(over.receipt.events.len(), 1, "the step's event");
    let (s, next) = over
        .next
        .expect("the claim")
        .expect("the step's own run is claimable after the step");
    assert_eq!(s, run("a"), "the next run");
    assert_eq!(
        next.fence.get(),
        l.fence.get() + 1,
        "taken again under the next fence"
    );
    held_live_by(&store, &s, &next, "w1").await;
}
