//! Contract revision, claim exclusivity, expiry and release.

use std::collections::HashSet;
use std::sync::Arc;

use runkeep::{ClaimOutcome, RunStore};

use crate::support::*;

/// The declared revision must equal the kit's. Both numbers are in the
/// compared values, so a truncated runner message still shows them; a
/// backend declaring an older revision is refused with what changed since.
pub async fn declares_the_contract_revision_this_suite_implements(
    _store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let declared = env.contract_version;
    assert!(
        declared >= crate::CONTRACT_VERSION,
        "the backend declares run-store contract v{declared}, but this kit checks run-store contract v{}; {}. Implement them, then declare {}",
        crate::CONTRACT_VERSION,
        crate::changes_since(declared),
        crate::CONTRACT_VERSION,
    );
    assert_eq!(
        format!("run-store contract v{declared}"),
        format!("run-store contract v{}", crate::CONTRACT_VERSION)
    );
}

/// Two takers at one instant: the first gets the run, the second is told it
/// is held (an answer, not an error).
pub async fn gives_the_run_to_the_first_taker_and_refuses_the_second(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let first = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    assert_eq!(first.holder.as_str(), "w1");
    match store
        .claim(&a, &claim_opts("w2", 60_000, 0))
        .await
        .expect("second claim call")
    {
        ClaimOutcome::Held(s) => {
            assert_eq!(s.holder, "w1");
            assert_eq!(s.fence, first.fence);
            assert!(!s.expired);
        }
        ClaimOutcome::Acquired(l) => panic!("second taker was granted a live run: {l:?}"),
        other => panic!("second taker of a live run must see it held, got {other:?}"),
    }
}

/// A renewal mints a higher fence, and the old fence is refused on write.
pub async fn advances_the_fence_on_renewal_so_a_stalled_twin_cannot_write(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let old = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    let new = take(&store, &a, claim_opts("w1", 60_000, 500)).await;
    assert!(
        new.fence > old.fence,
        "renewal kept fence {} (was {})",
        new.fence,
        old.fence
    );
    assert_eq!(new.expires_at, at(60_500));
    expect_fenced_out(
        store
            .write_checkpoint(&a, &checkpoint("1", 1), Some(old.fence))
            .await,
        old.fence,
        new.fence,
    );
}

/// Expiry is judged at the injected instant, with the boundary expired.
pub async fn judges_expiry_at_the_injected_instant(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    assert!(matches!(
        store
            .claim(&a, &claim_opts("w2", 1_000, 999))
            .await
            .expect("claim"),
        ClaimOutcome::Held(_)
    ));
    let l = take(&store, &a, claim_opts("w2", 1_000, 1_000)).await;
    assert_eq!(l.holder.as_str(), "w2");
    let s = store
        .lease(&a, at(1_999))
        .await
        .expect("lease")
        .expect("a lease");
    assert!(!s.expired);
    let s = store
        .lease(&a, at(2_000))
        .await
        .expect("lease")
        .expect("a lease");
    assert!(s.expired);
}

/// An expired holding is taken by a later worker at a higher fence.
pub async fn lets_a_later_worker_take_a_run_whose_holder_went_away(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    assert_eq!(w2.holder.as_str(), "w2");
    assert!(w2.fence > w1.fence);
}

/// After a release, another worker takes the run at once.
pub async fn returns_the_run_to_the_queue_when_its_holder_releases(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    assert!(
        store.release(&a, w1.fence).await.expect("release"),
        "release of the top fence answered false"
    );
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 1)).await;
    assert_eq!(w2.holder.as_str(), "w2");
}

/// A stale fence releases nothing.
pub async fn releases_only_on_the_fence_that_currently_holds_it(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    assert!(
        !store.release(&a, w1.fence).await.expect("release"),
        "a stale release answered true"
    );
    assert!(
        matches!(
            store
                .claim(&a, &claim_opts("w3", 60_000, 3_000))
                .await
                .expect("claim"),
            ClaimOutcome::Held(_)
        ),
        "a stale fence released the new holder's run"
    );
}

/// The new holder keeps its holding and fence after a stale release.
pub async fn a_superseded_holders_late_release_leaves_the_new_holder_intact(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let w1 = take(&store, &a, claim_opts("w1", 1_000, -4_000)).await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 0)).await;
    store.release(&a, w1.fence).await.expect("release");
    let s = store
        .lease(&a, at(1))
        .await
        .expect("lease")
        .expect("a lease");
    assert_eq!(
        (s.holder.as_str(), s.fence, s.expired),
        ("w2", w2.fence, false)
    );
    write(&store, &a, &checkpoint("1", 1), Some(w2.fence)).await;
}

/// Parity with the reference: claim → 1, release, claim → 3 (the release
/// tombstone takes 2).
pub async fn issues_fence_plus_two_after_a_release(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let first = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    assert_eq!(
        first.fence.get(),
        1,
        "a never-claimed run starts at fence 1"
    );
    store.release(&a, first.fence).await.expect("release");
    let second = take(&store, &a, claim_opts("w2", 60_000, 1)).await;
    assert_eq!(second.fence.get(), 3);
}

/// Five claim/release cycles give strictly increasing, unique fences.
pub async fn never_reissues_a_fence_across_claim_release_cycles(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let mut seen = Vec::new();
    for i in 0..5 {
        let l = take(&store, &a, claim_opts(&format!("w{i}"), 60_000, i)).await;
        seen.push(l.fence.get());
        store.release(&a, l.fence).await.expect("release");
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing: {seen:?}"
    );
}

/// 32 simultaneous takers ⇒ exactly one lease.
pub async fn gives_exactly_one_lease_to_simultaneous_takers(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = store.clone();
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            store
                .claim(&a, &claim_opts(&format!("w{i}"), 60_000, 0))
                .await
        }));
    }
    let mut fences = HashSet::new();
    let mut won = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(ClaimOutcome::Acquired(l)) => {
                won += 1;
                assert!(fences.insert(l.fence), "fence {} issued twice", l.fence);
            }
            Ok(ClaimOutcome::Held(_)) | Err(runkeep::Error::Contended { .. }) => {}
            Ok(other) => panic!("a fresh active run answered {other:?}"),
            Err(e) => panic!("claim failed: {e}"),
        }
    }
    assert_eq!(won, 1, "{won} of 32 simultaneous takers were given the run");
}

/// No lease is reported for a run nobody ever claimed.
pub async fn reports_no_lease_for_a_run_never_claimed(store: Arc<dyn RunStore>, _env: CaseEnv) {
    assert_eq!(store.lease(&run("a"), at(0)).await.expect("lease"), None);
}
