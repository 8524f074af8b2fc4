//! Waiting instead of polling (contract v2): a watch wakes after the change
//! it waits for, within its polling interval at most. The bounds are
//! generous on purpose: the cases assert that the watch woke, never how
//! fast (speed is for benchmarks).

use std::sync::Arc;
use std::time::Duration;

use runkeep::{EnqueueOptions, Outcome, RunStore, Watch, WatchTopic};
use serde_json::json;

use crate::support::*;

/// How long a watch may take to wake: its interval, plus a margin for a
/// loaded machine.
fn bound(w: &Watch) -> Duration {
    w.interval() * 2 + Duration::from_secs(30)
}

async fn expect_wake(mut w: Watch, what: &str) {
    let limit = bound(&w);
    if tokio::time::timeout(limit, w.changed()).await.is_err() {
        panic!(
            "{what}: the watch did not wake within {limit:?} (its interval is {:?})",
            w.interval()
        );
    }
}

/// A `Runnable` watch on the session wakes after a release, an enqueue and
/// a reopen of a run in it.
pub async fn wakes_a_runnable_watcher_after_a_release_an_enqueue_and_a_reopen(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let _clock = env.clock();
    let topic = WatchTopic::Runnable(listing());
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let l = take(&store, &a, claim_now("w1", 60_000)).await;
    let w = store.watch(&topic);
    assert!(store.release(&a, l.fence).await.expect("release"));
    expect_wake(w, "after a release").await;
    let w = store.watch(&topic);
    store
        .enqueue(&run("b"), &checkpoint("b", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue");
    expect_wake(w, "after an enqueue").await;
    let l = take(&store, &a, claim_now("w2", 60_000)).await;
    store
        .finish(&a, l.fence, &Outcome::completed(None))
        .await
        .expect("finish");
    let w = store.watch(&topic);
    store.reopen(&a).await.expect("reopen");
    expect_wake(w, "after a reopen").await;
}

/// An `Events` watch on a run wakes after an append to it.
pub async fn wakes_an_events_watcher_after_an_append(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let w = store.watch(&WatchTopic::Events(a.clone()));
    store
        .append_events(&a, &[event("step", json!({"n": 1}))], None)
        .await
        .expect("append");
    expect_wake(w, "after an append").await;
}
