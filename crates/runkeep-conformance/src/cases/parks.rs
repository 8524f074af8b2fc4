//! Parks: compare-and-set answers, expiry, pruning safety, precedence.

use std::sync::Arc;

use runkeep::{ListOptions, ParkResolution, ParkState, RunStore, RunStoreExt};
use serde_json::json;

use crate::support::*;

/// One answer; the second is refused and the first kept.
pub async fn answers_a_park_once_and_refuses_the_second_answer(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let cp = parked("p", 0, 0, None);
    write(&store, &a, &cp, None).await;
    let first = store
        .resolve_park(
            &a,
            &cp.id,
            ParkResolution::Answer(json!({"approve": true})),
            at(10),
            None,
        )
        .await
        .expect("first answer");
    assert_eq!(
        first.pending.as_ref().and_then(|p| p.resolved_at),
        Some(at(10))
    );
    let second = store
        .resolve_park(
            &a,
            &cp.id,
            ParkResolution::Answer(json!({"approve": false})),
            at(20),
            None,
        )
        .await;
    assert!(
        matches!(second, Err(runkeep::Error::Conflict { .. })),
        "second answer: {second:?}"
    );
    let back = store
        .read_checkpoint(&a, &cp.id)
        .await
        .expect("read")
        .expect("present");
    let p = back.pending.expect("park kept");
    assert_eq!(p.decision, Some(json!({"approve": true})));
    assert_eq!(p.resolved_at, Some(at(10)));
    let missing = store
        .resolve_park(
            &a,
            &checkpoint("nope", 0).id,
            ParkResolution::Answer(json!(1)),
            at(1),
            None,
        )
        .await;
    assert!(
        matches!(missing, Err(runkeep::Error::NotFound { .. })),
        "{missing:?}"
    );
}

/// Eight concurrent answers: exactly one wins and its decision is the one kept.
pub async fn lets_exactly_one_of_concurrent_answers_win(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let cp = parked("p", 0, 0, None);
    write(&store, &a, &cp, None).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (store, a, id) = (store.clone(), a.clone(), cp.id.clone());
        tasks.push(tokio::spawn(async move {
            store
                .resolve_park(&a, &id, ParkResolution::Answer(json!(i)), at(i), None)
                .await
                .map(|_| i)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(i) => winners.push(i),
            Err(runkeep::Error::Conflict { .. }) => {}
            Err(e) => panic!("answer failed: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let back = store
        .read_checkpoint(&a, &cp.id)
        .await
        .expect("read")
        .expect("present");
    assert_eq!(
        back.pending.and_then(|p| p.decision),
        Some(json!(winners[0]))
    );
}

/// Expiring is refused before the deadline and recorded as a pause after.
pub async fn expires_a_park_only_after_its_deadline(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let cp = parked("p", 0, 0, Some(100));
    write(&store, &a, &cp, None).await;
    assert!(matches!(
        store
            .resolve_park(&a, &cp.id, ParkResolution::Expire, at(99), None)
            .await,
        Err(runkeep::Error::Conflict { .. })
    ));
    assert_eq!(
        store
            .expired_parks(&a, at(99))
            .await
            .expect("expired")
            .len(),
        0
    );
    assert_eq!(
        store
            .expired_parks(&a, at(100))
            .await
            .expect("expired")
            .len(),
        1
    );
    let done = store
        .resolve_park(&a, &cp.id, ParkResolution::Expire, at(100), None)
        .await
        .expect("expire");
    let p = done.pending.expect("park");
    assert_eq!(
        p.decision.as_ref().and_then(|d| d.get("action")),
        Some(&json!("pause"))
    );
    assert_eq!(p.state(at(100)), ParkState::Resolved);
}

/// An answer given after the deadline reads resolved, not expired.
pub async fn reads_an_answer_after_the_deadline_as_resolved(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let cp = parked("p", 0, 0, Some(10));
    write(&store, &a, &cp, None).await;
    store
        .resolve_park(
            &a,
            &cp.id,
            ParkResolution::Answer(json!("late")),
            at(50),
            None,
        )
        .await
        .expect("late answer");
    let page = list(&store, &listing(), Default::default(), 60).await;
    assert_eq!(
        page.entries[0].park.as_ref().map(|p| p.state),
        Some(ParkState::Resolved)
    );
}

/// Pruning keeps unanswered parks (outstanding or expired).
pub async fn never_prunes_an_unanswered_park(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    write(&store, &a, &parked("outstanding", 1, 1, None), None).await;
    write(&store, &a, &parked("expired", 2, 2, Some(3)), None).await;
    write(&store, &a, &checkpoint("plain", 3), None).await;
    write(&store, &a, &checkpoint("newest", 4), None).await;
    let deleted = store.prune_checkpoints(&a, 1, None).await.expect("prune");
    let deleted: Vec<String> = deleted.iter().map(|d| d.to_string()).collect();
    assert_eq!(deleted, ["cp_conformance_plain"]);
    let left: Vec<String> = store
        .list_checkpoints(&a)
        .await
        .expect("list")
        .iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(
        left,
        [
            "cp_conformance_outstanding",
            "cp_conformance_expired",
            "cp_conformance_newest"
        ]
    );
}

/// The listing's park and the pending lookup name the same
/// checkpoint.
pub async fn agrees_between_pending_lookup_and_listing(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    write(&store, &a, &parked("older", 1, 50, None), None).await;
    write(&store, &a, &parked("newer", 2, 40, None), None).await;
    let pending = store
        .find_pending(&a, at(100))
        .await
        .expect("pending")
        .expect("one");
    let page = list(
        &store,
        &listing(),
        ListOptions {
            park: Some(vec![ParkState::Outstanding]),
            ..Default::default()
        },
        100,
    )
    .await;
    let park = page.entries[0].park.clone().expect("park");
    assert_eq!(park.checkpoint_id, pending.id);
    assert_eq!(pending.id, parked("newer", 0, 0, None).id);
}

/// A live park outranks a newer resolved one.
pub async fn shows_a_live_park_over_a_newer_resolved_one(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    write(&store, &a, &parked("live", 1, 1, None), None).await;
    let done = parked("done", 2, 2, None);
    write(&store, &a, &done, None).await;
    store
        .resolve_park(
            &a,
            &done.id,
            ParkResolution::Answer(json!("ok")),
            at(3),
            None,
        )
        .await
        .expect("answer");
    let page = list(&store, &listing(), Default::default(), 10).await;
    let park = page.entries[0].park.clone().expect("park");
    assert_eq!(
        (park.state, park.checkpoint_id),
        (ParkState::Outstanding, parked("live", 0, 0, None).id)
    );
}
