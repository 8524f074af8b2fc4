//! Which run goes next (issue 30): priorities, concurrency keys and their
//! holdings history, and the dedupe window
//! (`runkeep::scheduling`).

use std::sync::Arc;

use runkeep::scheduling::concurrency::max_held_at_once;
use runkeep::{
    ClaimNextFilter, ClaimOutcome, Concurrency, Dedupe, EnqueueOptions, Error, ListOptions,
    ListOrder, ListingScope, Outcome, Priority, RunScope, RunStore, Ttl,
};

use crate::support::*;

fn prio(p: i64) -> EnqueueOptions {
    EnqueueOptions {
        priority: Priority::new(p).expect("priority"),
        ..EnqueueOptions::default()
    }
}

fn keyed(key: &str, limit: u32) -> EnqueueOptions {
    EnqueueOptions {
        concurrency: Some(Concurrency::new(key, limit).expect("key")),
        ..EnqueueOptions::default()
    }
}

async fn enqueue(store: &Arc<dyn RunStore>, name: &str, options: EnqueueOptions) -> RunScope {
    let scope = run(name);
    store
        .enqueue(&scope, &checkpoint(name, 0), &options)
        .await
        .unwrap_or_else(|e| panic!("enqueue of {name} failed: {e}"));
    scope
}

async fn claim_key(store: &Arc<dyn RunStore>, scope: &RunScope, who: &str) -> ClaimOutcome {
    store
        .claim(scope, &claim_now(who, 60_000))
        .await
        .unwrap_or_else(|e| panic!("claim of {} by {who} failed: {e}", scope.run_id))
}

/// `claim_next` takes the highest priority first and, among equal
/// priorities, the filter's order; an operator's new priority counts from
/// the next call, and the lifecycle and the row carry it.
pub async fn claim_next_takes_the_highest_priority_first_then_the_order(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = enqueue(&store, "a", prio(0)).await;
    let b = enqueue(&store, "b", prio(5)).await;
    let c = enqueue(&store, "c", prio(5)).await;
    let d = enqueue(&store, "d", prio(-1)).await;
    assert_eq!(
        store.lifecycle(&b).await.expect("lifecycle").priority,
        Priority::new(5).unwrap(),
        "the lifecycle does not carry the enqueued priority"
    );
    let l = store
        .set_priority(&d, Priority::new(10).unwrap())
        .await
        .expect("set_priority");
    assert_eq!(l.priority, Priority::new(10).unwrap());
    assert_eq!(
        row_of(&store, &d, 0).await.expect("listed").priority,
        Priority::new(10).unwrap(),
        "the row does not carry the new priority"
    );
    let mut taken = Vec::new();
    while let Some(s) = next_run(&store, "w").await {
        taken.push(s);
    }
    assert_eq!(
        taken,
        vec![d, b, c, a],
        "claim_next must take priority 10, then the two 5s in run-id order, then 0"
    );
}

/// The listing sorts by priority (highest first, then run id), filters by
/// a lowest priority, and pages through both without losing a row.
pub async fn lists_runs_by_priority_and_filters_by_a_lowest_priority(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for (name, p) in [("a", 0), ("b", 7), ("c", -3), ("d", 7), ("e", 2)] {
        enqueue(&store, name, prio(p)).await;
    }
    let names = |rows: Vec<runkeep::RunRow>| -> Vec<String> {
        rows.into_iter()
            .map(|r| {
                r.scope
                    .run_id
                    .as_str()
                    .trim_start_matches("run_conformance_")
                    .to_string()
            })
            .collect()
    };
    let all = walk(
        &store,
        &listing(),
        ListOptions {
            order: ListOrder::Priority,
            limit: Some(2),
            ..ListOptions::default()
        },
        0,
    )
    .await;
    assert_eq!(names(all), ["b", "d", "e", "a", "c"], "priority order");
    let high = walk(
        &store,
        &listing(),
        ListOptions {
            order: ListOrder::Priority,
            min_priority: Some(Priority::new(2).unwrap()),
            limit: Some(1),
            ..ListOptions::default()
        },
        0,
    )
    .await;
    assert_eq!(
        names(high),
        ["b", "d", "e"],
        "minPriority 2 in priority order"
    );
    let by_id = walk(
        &store,
        &listing(),
        ListOptions {
            min_priority: Some(Priority::new(0).unwrap()),
            ..ListOptions::default()
        },
        0,
    )
    .await;
    assert_eq!(
        names(by_id),
        ["a", "b", "d", "e"],
        "minPriority 0 in run-id order"
    );
}

/// `set_priority` refuses a run that does not exist (`NotFound`) and a
/// finished one (`Conflict`), changing nothing.
pub async fn sets_a_priority_only_on_an_active_run(store: Arc<dyn RunStore>, _env: CaseEnv) {
    match store
        .set_priority(&run("ghost"), Priority::new(1).unwrap())
        .await
    {
        Err(Error::NotFound { .. }) => {}
        other => panic!("set_priority of a missing run answered {other:?}"),
    }
    let a = enqueue(&store, "a", prio(3)).await;
    let l = take(&store, &a, claim_now("w", 60_000)).await;
    store
        .finish(&a, l.fence, &Outcome::completed(None))
        .await
        .expect("finish");
    expect_conflict(
        store.set_priority(&a, Priority::new(9).unwrap()).await,
        "set_priority of a finished run",
    );
    assert_eq!(
        store.lifecycle(&a).await.expect("lifecycle").priority,
        Priority::new(3).unwrap(),
        "a refused set_priority changed the run"
    );
}

/// At most `limit` runs of one key are held live at once: a claim past it
/// answers `AtLimit` and changes nothing, a release frees a slot, a
/// renewal of a live lease is always admitted, and runs without the key
/// (or of another key) are not counted.
pub async fn holds_at_most_the_limit_of_runs_of_one_key(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = enqueue(&store, "a", keyed("cust-1", 2)).await;
    let b = enqueue(&store, "b", keyed("cust-1", 2)).await;
    let c = enqueue(&store, "c", keyed("cust-1", 2)).await;
    let other = enqueue(&store, "other", keyed("cust-2", 1)).await;
    let plain = enqueue(&store, "plain", EnqueueOptions::default()).await;
    let la = claim_key(&store, &a, "w1").await.lease().expect("a taken");
    claim_key(&store, &b, "w2").await.lease().expect("b taken");
    claim_key(&store, &other, "w4")
        .await
        .lease()
        .expect("another key's run is not counted");
    claim_key(&store, &plain, "w5")
        .await
        .lease()
        .expect("a run without a key is not counted");
    match claim_key(&store, &c, "w3").await {
        ClaimOutcome::AtLimit(busy) => {
            assert_eq!(busy.key, "cust-1");
            assert_eq!(busy.limit, 2);
            assert_eq!(busy.held, 2);
        }
        other => panic!("a third run of a key limited to 2 answered {other:?}"),
    }
    assert!(
        store.lease(&c, at(0)).await.expect("lease").is_none(),
        "a claim refused at the limit left a holding"
    );
    // A renewal of a live lease adds no holding: admitted at the limit.
    let renewed = claim_key(&store, &a, "w1")
        .await
        .lease()
        .expect("the holder's renewal at the limit was refused");
    assert!(renewed.fence > la.fence);
    assert!(store.release(&a, renewed.fence).await.expect("release"));
    claim_key(&store, &c, "w3")
        .await
        .lease()
        .expect("a run of the key after one was released");
    let history = store
        .key_holdings(&listing(), "cust-1")
        .await
        .expect("key_holdings");
    let (most, _) = max_held_at_once(&history);
    assert_eq!(most, 2, "the key's history: {history:?}");
    assert_eq!(
        history.len(),
        4,
        "a, its renewal, b and c are four holdings: {history:?}"
    );
}

/// `claim_next` skips the runs of a key at its limit and takes the next
/// run it may; once the key's holding ends, its next run is taken.
pub async fn claim_next_skips_runs_of_a_key_at_its_limit(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = enqueue(&store, "a", keyed("k", 1)).await;
    let b = enqueue(&store, "b", keyed("k", 1)).await;
    enqueue(&store, "c", keyed("k", 1)).await;
    let z = enqueue(&store, "z", EnqueueOptions::default()).await;
    let first = store
        .claim_next(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now("w1", 60_000),
        )
        .await
        .expect("claim_next")
        .expect("a run");
    assert_eq!(first.0, a);
    assert_eq!(
        next_run(&store, "w2").await,
        Some(z),
        "claim_next must skip b and c (their key is at its limit) and take z"
    );
    assert_eq!(next_run(&store, "w3").await, None);
    store
        .finish(&a, first.1.fence, &Outcome::completed(None))
        .await
        .expect("finish");
    assert_eq!(
        next_run(&store, "w3").await,
        Some(b),
        "after a finished, the key has room for b"
    );
}

/// An expired holding stops counting at its expiry (on the store clock),
/// and its holder's late renewal is then judged against the key like any
/// new claim.
pub async fn an_expired_holding_frees_its_slot_and_a_late_renewal_is_judged(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = enqueue(&store, "a", keyed("k", 1)).await;
    let b = enqueue(&store, "b", keyed("k", 1)).await;
    take(&store, &a, claim_now("w1", 1_000)).await;
    match claim_key(&store, &b, "w2").await {
        ClaimOutcome::AtLimit(_) => {}
        other => panic!("b while a is held live answered {other:?}"),
    }
    clock.set(at(1_000));
    claim_key(&store, &b, "w2")
        .await
        .lease()
        .expect("b once a's lease expired");
    match store
        .claim(&a, &claim_now("w1", 1_000))
        .await
        .expect("claim")
    {
        ClaimOutcome::AtLimit(busy) => assert_eq!(busy.held, 1),
        other => panic!("a's renewal after its lease expired, with b held, answered {other:?}"),
    }
    let history = store
        .key_holdings(&listing(), "k")
        .await
        .expect("key_holdings");
    assert_eq!(max_held_at_once(&history).0, 1, "{history:?}");
}

/// The key's history keeps every holding of its runs with its fence, its
/// start and its end; a key with no holdings has an empty history; a bad
/// key or a scope without a session is `InvalidInput`.
pub async fn keeps_every_holding_of_a_keyed_run_in_the_keys_history(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let a = enqueue(&store, "a", keyed("k", 3)).await;
    let l1 = take(&store, &a, claim_now("w1", 60_000)).await;
    clock.set(at(100));
    let l2 = take(&store, &a, claim_now("w1", 60_000)).await;
    clock.set(at(200));
    assert!(store.release(&a, l2.fence).await.expect("release"));
    clock.set(at(300));
    let l3 = take(&store, &a, claim_now("w2", 60_000)).await;
    clock.set(at(400));
    store
        .finish(&a, l3.fence, &Outcome::completed(None))
        .await
        .expect("finish");
    let h = store
        .key_holdings(&listing(), "k")
        .await
        .expect("key_holdings");
    let seen: Vec<_> = h
        .iter()
        .map(|x| (x.fence, x.acquired_at, x.until()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (l1.fence, at(0), at(100)),
            (l2.fence, at(100), at(200)),
            (l3.fence, at(300), at(400)),
        ],
        "each holding with its start and end (a renewal ends the one before): {h:?}"
    );
    assert!(h.iter().all(|x| x.run_id == a.run_id));
    assert!(store
        .key_holdings(&listing(), "never-used")
        .await
        .expect("key_holdings of an unused key")
        .is_empty());
    expect_invalid(
        store.key_holdings(&listing(), "a key").await,
        "key_holdings of a key with a space",
    );
    expect_invalid(
        store
            .key_holdings(&ListingScope::tenant(tenant()), "k")
            .await,
        "key_holdings over a scope that names no session",
    );
}

fn window(key: &str, ms: u64) -> Dedupe {
    Dedupe {
        key: key.into(),
        window: Ttl::from_millis(ms).expect("ttl"),
    }
}

/// An enqueue with an idempotency key inside its window returns the run
/// the first one created and changes nothing; after the window it creates
/// a new run; a run id that exists stays a `Conflict`.
pub async fn dedupes_an_enqueue_inside_its_window_and_not_after(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let (a, b, c) = (run("a"), run("b"), run("c"));
    let d = window("order-17", 10_000);
    let first = store
        .enqueue_once(&a, &checkpoint("a", 0), &prio(1), Some(&d))
        .await
        .expect("first enqueue");
    assert!(first.created);
    assert_eq!(first.run, a);
    clock.set(at(9_999));
    let again = store
        .enqueue_once(&b, &checkpoint("b", 0), &prio(1), Some(&d))
        .await
        .expect("second enqueue");
    assert!(
        !again.created,
        "a second enqueue inside the window created a run"
    );
    assert_eq!(again.run, a, "the second enqueue must answer the first run");
    assert_eq!(
        again.checkpoint.map(|c| c.id),
        Some(checkpoint("a", 0).id),
        "the answer carries the first run's latest checkpoint"
    );
    assert!(
        store.list_checkpoints(&b).await.expect("list").is_empty()
            && store.lifecycle(&b).await.expect("lifecycle") == Default::default(),
        "a deduplicated enqueue created state for its own run id"
    );
    clock.set(at(10_000));
    let third = store
        .enqueue_once(&c, &checkpoint("c", 0), &prio(1), Some(&d))
        .await
        .expect("enqueue after the window");
    assert!(
        third.created && third.run == c,
        "after the window: {third:?}"
    );
    let fourth = store
        .enqueue_once(&b, &checkpoint("b", 0), &prio(1), Some(&d))
        .await
        .expect("inside the new window");
    assert_eq!(fourth.run, c, "the new window belongs to c");
    expect_conflict(
        store
            .enqueue_once(
                &a,
                &checkpoint("a2", 1),
                &prio(1),
                Some(&window("other", 5_000)),
            )
            .await,
        "enqueue_once of an existing run id under a new key",
    );
    let plain = store
        .enqueue_once(&b, &checkpoint("b", 0), &prio(1), None)
        .await
        .expect("enqueue_once without a key");
    assert!(plain.created && plain.run == b);
}

/// Concurrent enqueues with one idempotency key create exactly one run.
pub async fn concurrent_enqueues_with_one_key_create_one_run(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let d = window("charge-42", 60_000);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            let s = run(&format!("dup{i}"));
            store
                .enqueue_once(
                    &s,
                    &checkpoint("c", 0),
                    &EnqueueOptions::default(),
                    Some(&d),
                )
                .await
        }));
    }
    let mut created = 0;
    let mut runs = Vec::new();
    for t in tasks {
        let e = t.await.expect("task").expect("enqueue_once");
        created += usize::from(e.created);
        runs.push(e.run);
    }
    assert_eq!(
        created, 1,
        "8 concurrent enqueues with one key created {created} runs"
    );
    runs.dedup();
    assert_eq!(runs.len(), 1, "they answered different runs: {runs:?}");
    let page = list(&store, &listing(), ListOptions::default(), 0).await;
    assert_eq!(page.entries.len(), 1, "the store holds {:?}", ids(&page));
}

/// Bad scheduling options are `InvalidInput` and change nothing.
pub async fn refuses_bad_scheduling_options_and_changes_nothing(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let bad = [
        EnqueueOptions {
            concurrency: Some(Concurrency {
                key: "k".into(),
                limit: 0,
            }),
            ..EnqueueOptions::default()
        },
        EnqueueOptions {
            concurrency: Some(Concurrency {
                key: "has space".into(),
                limit: 1,
            }),
            ..EnqueueOptions::default()
        },
    ];
    for o in &bad {
        expect_invalid(
            store.enqueue(&a, &checkpoint("a", 0), o).await,
            "enqueue with a bad concurrency key",
        );
    }
    expect_invalid(
        store
            .enqueue_once(
                &a,
                &checkpoint("a", 0),
                &EnqueueOptions::default(),
                Some(&window("", 1_000)),
            )
            .await,
        "enqueue_once with an empty idempotency key",
    );
    expect_invalid(
        store
            .enqueue_once(
                &a,
                &checkpoint("a", 0),
                &EnqueueOptions::default(),
                Some(&window("k", 31 * 24 * 3600 * 1000)),
            )
            .await,
        "enqueue_once with a window above 30 days",
    );
    assert!(
        store.list_checkpoints(&a).await.expect("list").is_empty(),
        "a refused enqueue created the run"
    );
    assert!(next_run(&store, "w").await.is_none());
}
