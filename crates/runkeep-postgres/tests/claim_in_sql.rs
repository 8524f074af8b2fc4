//! A hand-over's claim taken in SQL (`PgOptions::claim_in_sql`,
//! `claims::TAKE_IN_SQL` and its Rust twin `claims::takes_in_sql`): for
//! each shape a queued run can be in, the same script on a `MemoryStore`
//! (the reference) and on a `PgStore`, on clocks of their own set alike,
//! gives the same hand-over answer and the same run afterwards; and the
//! PostgreSQL store's count of claims taken in SQL moves exactly for the
//! shapes the twin admits (never claimed, released), never for the
//! others (deferred, past its deadline, an expired lease taken over, a
//! concurrency key), with no claim the core overrode. A drift of the SQL
//! from the twin fails here deterministically: in debug builds the core's
//! check stops at the first disagreement, and the counts differ.

mod common;

use std::sync::Arc;

use runkeep::{
    ClaimNextFilter, ClaimOptions, ClaimOutcome, Clock, Concurrency, EnqueueOptions, Fence,
    Handover, ListingScope, ManualClock, MemoryStore, NextClaim, Outcome, RunId, RunScope,
    RunStore, SessionId, Step, Timestamp, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore};
use serde_json::json;

/// The shapes of the run a hand-over finds next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// Enqueued, never claimed.
    Fresh,
    /// Claimed, then released (a tombstone on top).
    Released,
    /// Snoozed, the deferral passed (`available_at` set, in the past).
    DeferralPassed,
    /// Enqueued with a deadline that has passed (dead-lettered by the
    /// claim, which then finds nothing else).
    PastDeadline,
    /// Claimed by another worker whose lease expired (a takeover).
    LeaseExpired,
    /// Claimed by another worker whose lease expired, its attempt limit
    /// reached (dead-lettered by the claim).
    Exhausted,
    /// Enqueued with a concurrency key.
    Keyed,
}

impl Shape {
    const ALL: [Shape; 7] = [
        Shape::Fresh,
        Shape::Released,
        Shape::DeferralPassed,
        Shape::PastDeadline,
        Shape::LeaseExpired,
        Shape::Exhausted,
        Shape::Keyed,
    ];

    /// Whether the twin rule admits the run: the claim taken in SQL.
    fn taken_in_sql(self) -> bool {
        matches!(self, Shape::Fresh | Shape::Released)
    }
}

const START: i64 = 1_800_000_000_000;

fn scope(shape: Shape, name: &str) -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        SessionId::new(format!("ses_{shape:?}").to_lowercase()).unwrap(),
        RunId::new(format!("run_{name}")).unwrap(),
    )
}

fn claim(holder: &str, ttl_ms: u64) -> ClaimOptions {
    ClaimOptions::new(support::holder(holder), Ttl::from_millis(ttl_ms).unwrap())
}

fn acquired(o: ClaimOutcome) -> Fence {
    match o {
        ClaimOutcome::Acquired(l) => l.fence,
        other => panic!("expected the claim to succeed: {other:?}"),
    }
}

/// The script: run `a` claimed by `w`; run `b` put in `shape`; `w`
/// finishes `a` and hands over to the session's next run. Answers the
/// hand-over, and `b`'s lease and lifecycle afterwards.
async fn script(
    store: &dyn RunStore,
    clock: &ManualClock,
    shape: Shape,
) -> (Handover, Option<runkeep::LeaseSummary>, runkeep::Lifecycle) {
    let (a, b) = (scope(shape, "a"), scope(shape, "b"));
    let now = clock.now().as_millis();
    let mut options = EnqueueOptions::default();
    match shape {
        Shape::PastDeadline => options.deadline = Some(Timestamp::from_millis(now + 500).unwrap()),
        Shape::Exhausted => options.max_attempts = Some(1),
        Shape::Keyed => options.concurrency = Some(Concurrency::new("k", 1).unwrap()),
        _ => {}
    }
    // `b` first in claim order: enqueued before `a`, and ordered by id.
    store
        .enqueue(&b, &support::checkpoint("start", 0), &options)
        .await
        .unwrap();
    store
        .enqueue(
            &a,
            &support::checkpoint("start", 0),
            &EnqueueOptions::default(),
        )
        .await
        .unwrap();
    match shape {
        Shape::Released => {
            let f = acquired(store.claim(&b, &claim("x", 60_000)).await.unwrap());
            assert!(store.release(&b, f).await.unwrap());
        }
        Shape::DeferralPassed => {
            let f = acquired(store.claim(&b, &claim("x", 60_000)).await.unwrap());
            let until = Timestamp::from_millis(now + 1_000).unwrap();
            assert!(store.snooze(&b, f, until).await.unwrap());
        }
        Shape::LeaseExpired | Shape::Exhausted => {
            acquired(store.claim(&b, &claim("x", 1_000)).await.unwrap());
        }
        _ => {}
    }
    // `a` is claimed while `b` is not claimable; then time passes.
    let fa = acquired(store.claim(&a, &claim("w", 600_000)).await.unwrap());
    clock.advance(2_000);
    let step = Step {
        events: vec![support::event("tick", json!({}))],
        finish: Some(Outcome::completed(None)),
        ..Step::default()
    };
    let next = NextClaim {
        scope: ListingScope::session(
            b.tenant_id.clone(),
            b.project_id.clone(),
            b.session_id.clone(),
        ),
        filter: ClaimNextFilter::default(),
        options: claim("w", 30_000),
    };
    let h = store
        .commit_step_and_claim_next(&a, fa, &step, &next)
        .await
        .unwrap();
    let lease = store.lease(&b, clock.now()).await.unwrap();
    (h, lease, store.lifecycle(&b).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_taken_in_sql_exactly_where_the_core_would_write_only_the_holding() {
    let Some(url) = common::url_or_skip("claim_in_sql") else {
        return;
    };
    let start = Timestamp::from_millis(START).unwrap();
    let pg_clock = ManualClock::new(start);
    let (pg, _guard) = common::store(&url, "claim_in_sql", Some(pg_clock.clone())).await;
    for shape in Shape::ALL {
        let mem_clock = ManualClock::new(pg_clock.now());
        let mem = MemoryStore::with_clock(Arc::new(mem_clock.clone()));
        let (want, want_lease, want_life) = script(&mem, &mem_clock, shape).await;
        let before = pg.claims_taken_in_sql();
        let (got, got_lease, got_life) = script(&pg, &pg_clock, shape).await;
        let after = pg.claims_taken_in_sql();
        assert_eq!(
            format!("{:?}", got.next),
            format!("{:?}", want.next),
            "{shape:?}: the hand-over's next run"
        );
        assert_eq!(got.receipt, want.receipt, "{shape:?}: the step");
        assert_eq!(got_lease, want_lease, "{shape:?}: the run's lease after");
        assert_eq!(got_life, want_life, "{shape:?}: the run's lifecycle after");
        assert_eq!(
            after.0 - before.0,
            u64::from(shape.taken_in_sql()),
            "{shape:?}: taken in SQL"
        );
        assert_eq!(after.1, 0, "{shape:?}: a claim the core overrode");
        if shape.taken_in_sql() {
            assert!(
                matches!(&got.next, Ok(Some((s, _))) if s.run_id.as_str() == "run_b"),
                "{shape:?}: {:?}",
                got.next
            );
        }
    }
}

/// Off (`PgOptions::claim_in_sql = false`), nothing is taken in SQL: the
/// count above comes from the statement, not from the core's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_the_claim_is_judged_and_written_apart() {
    let Some(url) = common::url_or_skip("claim_in_sql") else {
        return;
    };
    let clock = ManualClock::new(Timestamp::from_millis(START).unwrap());
    let (_first, guard) = common::store(&url, "claim_in_sql_off", None).await;
    let pg = PgStore::connect(
        &url,
        PgOptions {
            claim_in_sql: false,
            ..common::options(&guard.schema, Some(clock.clone()))
        },
    )
    .await
    .unwrap();
    let (h, _, _) = script(&pg, &clock, Shape::Fresh).await;
    assert!(matches!(&h.next, Ok(Some(_))), "{:?}", h.next);
    assert_eq!(pg.claims_taken_in_sql(), (0, 0));
}
