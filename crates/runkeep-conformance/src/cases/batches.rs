//! Batches (`runkeep::batch`): `claim_next_batch` takes many runs in one
//! call, `commit_steps` commits many runs' steps in one call. A batch only
//! shares the trip: each run is leased, fenced and judged on its own.

use std::collections::HashSet;
use std::sync::Arc;

use runkeep::batch::MAX_BATCH;
use runkeep::{
    ClaimNextFilter, Concurrency, EnqueueOptions, Lease, RunScope, RunStore, Step, StepCommit,
};
use serde_json::json;

use crate::support::*;

async fn batch(store: &Arc<dyn RunStore>, who: &str, max: usize) -> Vec<(RunScope, Lease)> {
    store
        .claim_next_batch(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now(who, 60_000),
            max,
        )
        .await
        .unwrap_or_else(|e| panic!("claim_next_batch of {max} by {who} failed: {e}"))
}

/// The runs taken, in the order taken.
fn names(taken: &[(RunScope, Lease)]) -> Vec<RunScope> {
    taken.iter().map(|(s, _)| s.clone()).collect()
}

fn one_event(tag: &str) -> Step {
    Step {
        events: vec![event("tool_result", json!({ "tag": tag }))],
        ..Step::default()
    }
}

async fn event_count(store: &Arc<dyn RunStore>, scope: &RunScope) -> usize {
    store
        .read_events(scope, &Default::default())
        .await
        .expect("read_events")
        .events
        .len()
}

/// Queues `keyed` runs of the key `customer-1` with limit `limit`, in
/// that order, then the run `z` without a key.
async fn queue_keyed_and_free(store: &Arc<dyn RunStore>, keyed: &[&str], limit: u32) {
    let options = EnqueueOptions {
        concurrency: Some(Concurrency::new("customer-1", limit).expect("key")),
        ..EnqueueOptions::default()
    };
    for r in keyed {
        store
            .enqueue(&run(r), &checkpoint(r, 0), &options)
            .await
            .expect("enqueue");
    }
    store
        .enqueue(&run("z"), &checkpoint("z", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue");
}

/// A batch takes the runs `claim_next` would hand out, in its order, each
/// under its own lease: releasing one leaves the others held at their
/// fences; a released run is in the next batch; an empty queue answers an
/// empty batch.
pub async fn claim_next_batch_takes_runs_in_claim_order_each_leased_alone(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for r in ["a", "b", "c", "d", "e"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let first = batch(&store, "w1", 3).await;
    assert_eq!(
        names(&first),
        [run("a"), run("b"), run("c")],
        "the first batch of 3"
    );
    for (s, l) in &first {
        assert_eq!(l.holder.as_str(), "w1");
        let summary = store
            .lease(s, store.now())
            .await
            .expect("lease")
            .unwrap_or_else(|| panic!("{} of the batch is not held", s.run_id));
        assert_eq!(summary.fence, l.fence, "{} held at another fence", s.run_id);
        assert!(!summary.expired);
    }
    let (b, lb) = &first[1];
    assert!(store.release(b, lb.fence).await.expect("release of b"));
    for (s, l) in [&first[0], &first[2]] {
        let summary = store
            .lease(s, store.now())
            .await
            .expect("lease")
            .expect("held");
        assert_eq!(
            (summary.fence, summary.expired),
            (l.fence, false),
            "releasing b changed the holding of {}",
            s.run_id
        );
    }
    let second = batch(&store, "w2", 3).await;
    assert_eq!(
        names(&second),
        [run("b"), run("d"), run("e")],
        "the second batch of 3"
    );
    assert!(batch(&store, "w3", 3).await.is_empty(), "nothing is left");
}

/// The runs a batch takes count against their key's limit like runs
/// claimed one by one: of four runs of a key with limit 2, a batch of 5
/// takes two, and the free run.
pub async fn claim_next_batch_counts_its_own_runs_against_a_key_limit(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    queue_keyed_and_free(&store, &["k1", "k2", "k3", "k4"], 2).await;
    let taken = batch(&store, "w1", 5).await;
    assert_eq!(
        names(&taken),
        [run("k1"), run("k2"), run("z")],
        "a batch past the key's limit of 2"
    );
}

/// A batch counts the key's live holders and its own runs together: of
/// five runs of a key with limit 3, one already claimed by another worker,
/// a batch of 5 takes two more, and the free run; the next batch takes
/// nothing of the key, and after a release, only the one run freed.
pub async fn claim_next_batch_counts_the_keys_holders_and_its_own_runs_together(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    queue_keyed_and_free(&store, &["k1", "k2", "k3", "k4", "k5"], 3).await;
    let first = batch(&store, "w0", 1).await;
    assert_eq!(names(&first), [run("k1")], "the first run, alone");
    let taken = batch(&store, "w1", 5).await;
    assert_eq!(
        names(&taken),
        [run("k2"), run("k3"), run("z")],
        "a batch beside a holder of the key (limit 3)"
    );
    assert!(
        batch(&store, "w2", 5).await.is_empty(),
        "the key is at its limit and nothing else is queued"
    );
    let (k2, l2) = &taken[0];
    assert!(store.release(k2, l2.fence).await.expect("release of k2"));
    assert_eq!(
        names(&batch(&store, "w3", 5).await),
        [run("k2")],
        "one place freed, one run taken"
    );
}

/// A batch of 0 runs or above the limit is refused and claims nothing.
pub async fn claim_next_batch_refuses_a_size_of_zero_or_above_the_limit(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(&store, &run("a"), &checkpoint("a", 0), None).await;
    for max in [0, MAX_BATCH + 1] {
        let r = store
            .claim_next_batch(
                &listing(),
                &ClaimNextFilter::default(),
                &claim_now("w1", 60_000),
                max,
            )
            .await;
        expect_invalid(r, &format!("a batch of {max}"));
    }
    assert!(
        store
            .lease(&run("a"), store.now())
            .await
            .expect("lease")
            .is_none(),
        "a refused batch claimed a run"
    );
}

/// A group commit judges each step under its own fence: the step of a run
/// whose holding was released is refused alone (fenced out, nothing of it
/// written); the other steps commit, answered in the order given.
pub async fn commit_steps_refuses_only_the_stale_step_and_commits_the_others(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for r in ["a", "b", "c"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let held = batch(&store, "w1", 3).await;
    assert_eq!(names(&held), [run("a"), run("b"), run("c")]);
    let (b, lb) = &held[1];
    assert!(store.release(b, lb.fence).await.expect("release of b"));
    let steps: Vec<StepCommit> = held
        .iter()
        .map(|(s, l)| StepCommit {
            scope: s.clone(),
            fence: l.fence,
            step: one_event(s.run_id.as_ref()),
        })
        .collect();
    let outcomes = store.commit_steps(&steps).await.expect("commit_steps");
    assert_eq!(outcomes.len(), 3, "one outcome per step");
    let mut outcomes = outcomes.into_iter();
    let a = outcomes.next().unwrap().expect("a's step commits");
    expect_fenced(
        outcomes.next().unwrap(),
        lb.fence,
        "b's step under its released fence",
    );
    let c = outcomes.next().unwrap().expect("c's step commits");
    assert_eq!(
        (a.events.len(), c.events.len()),
        (1, 1),
        "each receipt's event"
    );
    assert_eq!(event_count(&store, &run("a")).await, 1);
    assert_eq!(
        event_count(&store, &run("b")).await,
        0,
        "the refused step left events"
    );
    assert_eq!(event_count(&store, &run("c")).await, 1);
}

/// A batch that cannot be judged step by step is refused whole and writes
/// nothing: empty, one run twice, or one invalid step (one that writes nothing)
/// among valid ones.
pub async fn commit_steps_refuses_a_bad_batch_and_writes_nothing(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for r in ["a", "b"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let held = batch(&store, "w1", 2).await;
    let good = |i: usize| StepCommit {
        scope: held[i].0.clone(),
        fence: held[i].1.fence,
        step: one_event("ok"),
    };
    expect_invalid(store.commit_steps(&[]).await, "an empty batch");
    expect_invalid(
        store.commit_steps(&[good(0), good(1), good(0)]).await,
        "a batch with run a twice",
    );
    let mut bad = good(1);
    bad.step = Step::default();
    expect_invalid(
        store.commit_steps(&[good(0), bad]).await,
        "a batch with a step that writes nothing",
    );
    let written: HashSet<usize> = [
        event_count(&store, &run("a")).await,
        event_count(&store, &run("b")).await,
    ]
    .into();
    assert_eq!(written, HashSet::from([0]), "a refused batch wrote events");
}
