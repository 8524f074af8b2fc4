//! The store clock (contract v2): a call that passes no instant is judged
//! by the store's clock, never the caller's.

use std::sync::Arc;

use runkeep::{ClaimOutcome, ListOptions, ManualClock, RunStore, Timestamp};

use crate::support::*;

/// With no instant passed, claims, expiry and the listing are judged on the
/// store clock, and `now()` reads it.
pub async fn judges_expiry_on_the_store_clock_when_no_instant_is_passed(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    assert_eq!(
        store.now(),
        at(0),
        "the store's now() does not read its clock"
    );
    clock.advance(1_234);
    assert_eq!(
        store.now(),
        at(1_234),
        "the store's now() does not follow its clock"
    );
    clock.set(at(0));
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    let w1 = take(&store, &a, claim_now("w1", 1_000)).await;
    assert_eq!(
        w1.expires_at,
        at(1_000),
        "the lease was not timed from the store clock"
    );
    let listed_expired = |store: Arc<dyn RunStore>| async move {
        let page = store
            .list_runs(&listing(), &ListOptions::default())
            .await
            .expect("listing");
        page.entries[0]
            .claim
            .as_ref()
            .expect("a claim column")
            .expired
    };
    for (now, live) in [(0, true), (999, true), (1_000, false)] {
        clock.set(at(now));
        let answer = store
            .claim(&a, &claim_now("w2", 1_000))
            .await
            .expect("claim");
        if live {
            assert!(
                matches!(answer, ClaimOutcome::Held(_)),
                "at +{now} ms (store clock) the lease expiring at +1000 ms is live, yet the claim answered {answer:?}"
            );
            assert!(
                !listed_expired(store.clone()).await,
                "listed as expired at +{now} ms"
            );
        } else {
            assert!(
                matches!(answer, ClaimOutcome::Acquired(_)),
                "at +{now} ms (store clock) the lease expired, yet the claim answered {answer:?}"
            );
        }
    }
}

/// A client whose own clock is off by minutes but passes no instant: the
/// store's clock decides, so it never takes a lease that is live on the
/// store clock. Both skews are forced: the fast client's own clock says the
/// other's lease expired while the store says it is live (asserted).
pub async fn never_lets_two_clients_with_skewed_clocks_both_hold_a_live_lease(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    const MINUTES: i64 = 5 * 60_000;
    let clock = env.clock();
    let slow = ManualClock::new(at(-MINUTES)); // client "slow": 5 minutes behind
    let fast = ManualClock::new(at(MINUTES)); // client "fast": 5 minutes ahead
    let a = run("a");
    write(&store, &a, &checkpoint("a", 0), None).await;
    // Grants as (holder, fence, granted at, expires at), on the store clock.
    let mut grants: Vec<(String, u64, Timestamp, Timestamp)> = Vec::new();
    let mut skew_mattered = 0;
    // Each client renews its holding for three ticks, then stalls (a paused
    // process) for twenty, so the run changes hands.
    let mut held_for = [0u32; 2];
    let mut stalled_until = [0u32; 2];
    for tick in 0..60u32 {
        for (i, (name, own)) in [("slow", &slow), ("fast", &fast)].into_iter().enumerate() {
            if tick < stalled_until[i] {
                continue;
            }
            if held_for[i] == 3 {
                held_for[i] = 0;
                stalled_until[i] = tick + 20;
                continue;
            }
            // What the client believes, from its own clock.
            let believed_free = match store.lease(&a, own.now()).await.expect("lease") {
                None => true,
                Some(s) => s.expired || s.holder == name,
            };
            let truly_live_other = match store.lease(&a, clock.now()).await.expect("lease") {
                Some(s) => !s.expired && s.holder != name,
                None => false,
            };
            if believed_free && truly_live_other {
                skew_mattered += 1;
            }
            if !believed_free {
                continue;
            }
            match store.claim(&a, &claim_now(name, 60_000)).await.expect("claim") {
                ClaimOutcome::Acquired(l) => {
                    held_for[i] += 1;
                    grants.push((name.to_string(), l.fence.get(), clock.now(), l.expires_at));
                }
                ClaimOutcome::Held(s) => assert!(
                    truly_live_other,
                    "tick {tick}: {name} was refused a run whose lease (by {}) expired on the store clock",
                    s.holder
                ),
                other => panic!("tick {tick}: {name}'s claim answered {other:?}"),
            }
        }
        let step = if tick % 3 == 0 { 25_000 } else { 20_000 };
        for c in [&clock, &slow, &fast] {
            c.advance(step);
        }
    }
    assert!(
        skew_mattered > 0,
        "the skew never made a client believe a live lease expired: the case did not test anything"
    );
    for (i, g) in grants.iter().enumerate() {
        for h in &grants[i + 1..] {
            if g.0 != h.0 {
                assert!(
                    h.2 >= g.3,
                    "{} was granted fence {} at {} while {}'s fence {} was live until {} (store clock)",
                    h.0,
                    h.1,
                    h.2,
                    g.0,
                    g.1,
                    g.3
                );
            }
        }
    }
    let holders: std::collections::HashSet<_> = grants.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        holders.len(),
        2,
        "both clients must have held the run at some point: {grants:?}"
    );
}
