//! `claim_next`: the work queue without a list-then-race loop.

use std::collections::HashMap;
use std::sync::Arc;

use runkeep::{ClaimNextFilter, ParkState, RunStore};

use crate::support::*;

/// Takes unheld runs in order, skips live ones, answers `None` when empty.
pub async fn claim_next_takes_only_runs_nobody_holds(store: Arc<dyn RunStore>, _env: CaseEnv) {
    for r in ["a", "b", "c"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    take(&store, &run("a"), claim_opts("other", 60_000, 0)).await;
    let f = ClaimNextFilter::default();
    let (s1, l1) = store
        .claim_next(&listing(), &f, &claim_opts("w", 60_000, 1))
        .await
        .expect("claim_next")
        .expect("b");
    assert_eq!(s1, run("b"));
    assert_eq!(l1.holder.as_str(), "w");
    let (s2, _) = store
        .claim_next(&listing(), &f, &claim_opts("w2", 60_000, 2))
        .await
        .expect("claim_next")
        .expect("c");
    assert_eq!(s2, run("c"));
    assert!(store
        .claim_next(&listing(), &f, &claim_opts("w3", 60_000, 3))
        .await
        .expect("claim_next")
        .is_none());
    let after = store
        .claim_next(&listing(), &f, &claim_opts("w3", 60_000, 70_000))
        .await
        .expect("claim_next");
    assert_eq!(
        after.map(|(s, _)| s),
        Some(run("a")),
        "an expired run was not offered again"
    );
}

/// Only runs whose park matches are taken.
pub async fn claim_next_respects_the_park_filter(store: Arc<dyn RunStore>, _env: CaseEnv) {
    write(&store, &run("a"), &checkpoint("a", 0), None).await;
    write(&store, &run("b"), &parked("b", 0, 0, None), None).await;
    let f = ClaimNextFilter {
        park: Some(vec![ParkState::Outstanding]),
        ..Default::default()
    };
    let got = store
        .claim_next(&listing(), &f, &claim_opts("w", 60_000, 0))
        .await
        .expect("claim_next");
    assert_eq!(got.map(|(s, _)| s), Some(run("b")));
    assert!(store
        .claim_next(&listing(), &f, &claim_opts("w2", 60_000, 0))
        .await
        .expect("claim_next")
        .is_none());
}

/// Eight concurrent workers draining six runs: every run goes to exactly
/// one worker.
pub async fn concurrent_claim_next_never_hands_one_run_to_two_workers(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for i in 0..6 {
        write(
            &store,
            &run(&format!("q{i}")),
            &checkpoint(&format!("q{i}"), 0),
            None,
        )
        .await;
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                match store
                    .claim_next(
                        &listing(),
                        &ClaimNextFilter::default(),
                        &claim_opts(&format!("w{w}"), 60_000, 0),
                    )
                    .await
                {
                    Ok(Some((s, l))) => got.push((s.run_id.to_string(), l.fence)),
                    Ok(None) => return got,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("claim_next failed: {e}"),
                }
            }
        }));
    }
    let mut owners: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for (r, _) in t.await.expect("task") {
            *owners.entry(r).or_default() += 1;
        }
    }
    assert_eq!(owners.len(), 6, "not every run was taken: {owners:?}");
    assert!(
        owners.values().all(|&n| n == 1),
        "a run went to two workers: {owners:?}"
    );
}
