//! Recurring schedules ([`runkeep::scheduling::schedule`]): kept per
//! session, refused when bad, the cursor moved only by compare-and-set, and
//! each tick enqueued once however many schedulers pass at once.

use std::sync::Arc;

use runkeep::scheduling::schedule::{self, MissedTicks, Schedule};
use runkeep::{Error, ListingScope, RunStore};
use serde_json::json;

use crate::support::*;

fn every_second(name: &str) -> Schedule {
    let mut s = Schedule::new(name, "* * * * * *", at(0));
    s.input = json!({ "report": name });
    s.missed = MissedTicks::CatchUp { max: 100 };
    s
}

/// A schedule is put, read back whole, listed under its session, project
/// and tenant (and no other), replaced without losing its cursor or
/// creation time, and deleted once; a bad one is refused and changes
/// nothing.
pub async fn keeps_schedules_and_refuses_bad_ones(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let session = listing();
    let s = every_second("nightly");
    let stored = store.put_schedule(&session, &s).await.expect("put");
    assert_eq!(stored, s, "a new schedule is stored as given");
    assert_eq!(
        store.get_schedule(&session, "nightly").await.expect("get"),
        Some(s.clone())
    );
    assert_eq!(
        store.get_schedule(&session, "other").await.expect("get"),
        None
    );
    store
        .put_schedule(&session, &every_second("hourly"))
        .await
        .expect("put a second");
    for scope in [
        session.clone(),
        ListingScope::project(tenant(), project()),
        ListingScope::tenant(tenant()),
    ] {
        let names: Vec<String> = store
            .list_schedules(&scope)
            .await
            .expect("list")
            .into_iter()
            .map(|e| {
                assert_eq!(e.session, session, "a listed schedule names its session");
                e.schedule.name
            })
            .collect();
        assert_eq!(names, ["hourly", "nightly"], "the listing under {scope}");
    }
    assert!(store
        .list_schedules(&ListingScope::tenant(other_tenant()))
        .await
        .expect("list")
        .is_empty());
    assert!(store
        .list_schedules(&ListingScope::project(tenant(), other_project()))
        .await
        .expect("list")
        .is_empty());

    // A replacement keeps the cursor and the creation time.
    assert!(store
        .advance_schedule(&session, "nightly", None, at(1000))
        .await
        .expect("advance"));
    let mut changed = s.clone();
    changed.cron = "*/5 * * * *".into();
    changed.paused = true;
    changed.created_at = at(99_000);
    changed.cursor = None;
    let stored = store
        .put_schedule(&session, &changed)
        .await
        .expect("replace");
    assert_eq!(stored.cursor, Some(at(1000)), "a put moved the cursor");
    assert_eq!(stored.created_at, at(0), "a put changed the creation time");
    assert!(stored.paused);
    assert_eq!(
        store.get_schedule(&session, "nightly").await.expect("get"),
        Some(stored.clone())
    );

    // Refusals change nothing.
    let mut bad = changed.clone();
    bad.cron = "61 * * * *".into();
    expect_invalid(store.put_schedule(&session, &bad).await, "a bad cron");
    let mut bad = changed.clone();
    bad.timezone = "Mars/Olympus".into();
    expect_invalid(store.put_schedule(&session, &bad).await, "a bad time zone");
    let mut bad = changed.clone();
    bad.missed = MissedTicks::CatchUp { max: 0 };
    expect_invalid(store.put_schedule(&session, &bad).await, "a catch-up of 0");
    let mut bad = changed.clone();
    bad.name = "no.dots".into();
    expect_invalid(store.put_schedule(&session, &bad).await, "a bad name");
    expect_invalid(
        store
            .put_schedule(&ListingScope::project(tenant(), project()), &changed)
            .await,
        "a schedule put in a scope naming no session",
    );
    expect_invalid(
        store.get_schedule(&session, "no.dots").await,
        "a get by a bad name",
    );
    assert_eq!(
        store.get_schedule(&session, "nightly").await.expect("get"),
        Some(stored),
        "a refused put changed the schedule"
    );

    assert!(store
        .delete_schedule(&session, "nightly")
        .await
        .expect("delete"));
    assert!(!store
        .delete_schedule(&session, "nightly")
        .await
        .expect("delete again"));
    assert_eq!(
        store.get_schedule(&session, "nightly").await.expect("get"),
        None
    );
    let left: Vec<String> = store
        .list_schedules(&session)
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.schedule.name)
        .collect();
    assert_eq!(left, ["hourly"]);
}

/// The cursor moves only from the value the caller read: a stale advance
/// answers false and changes nothing, a backward one is refused, one of a
/// missing schedule is `NotFound`, and of many concurrent advances from one
/// cursor exactly one wins.
pub async fn moves_a_schedule_cursor_only_by_compare_and_set(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let session = listing();
    store
        .put_schedule(&session, &every_second("cas"))
        .await
        .expect("put");
    assert!(store
        .advance_schedule(&session, "cas", None, at(1000))
        .await
        .expect("first advance"));
    assert!(
        !store
            .advance_schedule(&session, "cas", None, at(2000))
            .await
            .expect("stale advance"),
        "an advance from a cursor that is no longer stored answered true"
    );
    let cursor = |s: Option<Schedule>| s.expect("the schedule").cursor;
    assert_eq!(
        cursor(store.get_schedule(&session, "cas").await.expect("get")),
        Some(at(1000)),
        "a stale advance moved the cursor"
    );
    expect_invalid(
        store
            .advance_schedule(&session, "cas", Some(at(1000)), at(500))
            .await,
        "an advance backwards",
    );
    match store
        .advance_schedule(&session, "missing", None, at(1000))
        .await
    {
        Err(Error::NotFound { .. }) => {}
        other => panic!("an advance of a missing schedule answered {other:?}"),
    }

    let racers: Vec<_> = (0..8)
        .map(|i| {
            let (store, session) = (store.clone(), session.clone());
            tokio::spawn(async move {
                store
                    .advance_schedule(&session, "cas", Some(at(1000)), at(2000 + i * 1000))
                    .await
                    .expect("advance")
            })
        })
        .collect();
    let mut won = Vec::new();
    for (i, r) in racers.into_iter().enumerate() {
        if r.await.expect("task") {
            won.push(i as i64);
        }
    }
    assert_eq!(
        won.len(),
        1,
        "{} of 8 concurrent advances from one cursor answered true: {won:?}",
        won.len()
    );
    assert_eq!(
        cursor(store.get_schedule(&session, "cas").await.expect("get")),
        Some(at(2000 + won[0] * 1000)),
        "the cursor is not the winner's"
    );
}

/// Three scheduler passes at once over a schedule with three ticks due,
/// all from one read of the schedule, enqueue each tick's run exactly once,
/// under the id derived from the schedule and the tick, with the schedule's
/// input; the others count each tick as already enqueued, exactly one moves
/// the cursor, and it ends at the last tick.
pub async fn enqueues_each_tick_once_whoever_runs_the_scheduler(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let session = listing();
    store
        .put_schedule(&session, &every_second("tick"))
        .await
        .expect("put");
    clock.set(at(3000));
    // Three schedulers that all read the schedule before any of them
    // enqueued (the race forced: each pass runs from the same stale read).
    let entries = store.list_schedules(&session).await.expect("list");
    assert_eq!(entries.len(), 1);
    let stale = entries[0].clone();
    let passes: Vec<_> = (0..3)
        .map(|_| {
            let (store, stale) = (store.clone(), stale.clone());
            tokio::spawn(async move { schedule::run_one(store.as_ref(), &stale, at(3000)).await })
        })
        .collect();
    let mut enqueued = Vec::new();
    let mut already = 0;
    let mut advanced = 0;
    for p in passes {
        let pass = p.await.expect("task");
        assert_eq!(pass.error, None, "a pass failed");
        enqueued.extend(pass.enqueued);
        already += pass.already.len();
        advanced += usize::from(pass.advanced);
    }
    assert_eq!(
        advanced, 1,
        "{advanced} of 3 passes from one cursor moved it"
    );
    assert_eq!(
        already, 6,
        "the two later passes must each find the three runs already enqueued"
    );
    enqueued.sort();
    let expected: Vec<_> = [1000, 2000, 3000]
        .into_iter()
        .map(|t| schedule::run_id_for("tick", at(t)))
        .collect();
    assert_eq!(
        enqueued, expected,
        "each tick must be enqueued exactly once"
    );
    for id in &expected {
        let scope =
            runkeep::RunScope::new(tenant(), project(), crate::support::session(), id.clone());
        let cp = store
            .latest_checkpoint(&scope)
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("the run {id} of a tick was not enqueued"));
        assert_eq!(cp.state.get("input"), Some(&json!({ "report": "tick" })));
    }
    assert_eq!(
        store
            .get_schedule(&session, "tick")
            .await
            .expect("get")
            .expect("schedule")
            .cursor,
        Some(at(3000)),
        "the cursor did not reach the last tick"
    );
    // A later pass at the same instant finds nothing due.
    let again = schedule::run_due(store.as_ref(), &session, at(3000))
        .await
        .expect("pass");
    assert!(again
        .iter()
        .all(|p| p.enqueued.is_empty() && p.already.is_empty()));
}
