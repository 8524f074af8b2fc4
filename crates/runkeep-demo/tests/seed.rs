//! The demo data `runkeep serve --demo` serves: every kind of run an
//! operator meets, readable, and never seeded twice into one store.

use runkeep::{
    CheckpointStore, EvidenceStore, ListOptions, MemoryStore, ParkState, RunStatus, TenantId,
};

#[tokio::test]
async fn the_demo_seeds_every_kind_of_run_an_operator_meets_and_refuses_to_seed_twice() {
    let store = MemoryStore::new();
    let tenant = TenantId::new("default").unwrap();
    let runs = runkeep_demo::seed(&store, &tenant).await.unwrap();
    assert_eq!(runs.len(), 35);
    let scope = runkeep_demo::scope(&tenant);
    let count = |options: ListOptions| {
        let store = &store;
        let scope = &scope;
        async move {
            let options = ListOptions {
                limit: Some(1000),
                now: Some(store.now()),
                ..options
            };
            store.list_runs(scope, &options).await.unwrap().entries
        }
    };
    assert_eq!(count(ListOptions::default()).await.len(), 35);
    let parked = count(ListOptions {
        park: Some(vec![ParkState::Outstanding]),
        ..ListOptions::default()
    })
    .await;
    assert_eq!(parked.len(), 8);
    let expired = count(ListOptions {
        park: Some(vec![ParkState::Expired]),
        ..ListOptions::default()
    })
    .await;
    assert_eq!(expired.len(), 2);
    let held = count(ListOptions {
        claimed: Some(true),
        ..ListOptions::default()
    })
    .await;
    assert_eq!(held.len(), 5);
    let failed = count(ListOptions {
        status: Some(vec![RunStatus::Failed]),
        ..ListOptions::default()
    })
    .await;
    assert_eq!(failed.len(), 5);
    let mut dead = 0;
    for row in &failed {
        let scope = row.scope.clone();
        let l = store.lifecycle(&scope).await.unwrap();
        if l.is_dead_lettered() {
            dead += 1;
        }
    }
    assert_eq!(dead, 3, "three runs are dead-lettered");
    // Every parked run's request is readable: a question to show.
    for row in parked.iter().chain(&expired) {
        let scope = row.scope.clone();
        let cp = store.find_pending(&scope, store.now()).await.unwrap();
        let cp = match cp {
            Some(cp) => cp,
            None => store.latest_checkpoint(&scope).await.unwrap().unwrap(),
        };
        let request = &cp.pending.unwrap().request;
        assert!(
            request.get("question").and_then(|q| q.as_str()).is_some(),
            "{request:?}"
        );
    }
    // Every run has a transcript.
    for r in &runs {
        let events = store
            .read_events(&r.scope, &runkeep::ReadEventsOptions::default())
            .await
            .unwrap();
        assert!(
            !events.events.is_empty(),
            "{} has no events",
            r.scope.run_id
        );
    }
    let snapshot = || async {
        let mut all = Vec::new();
        for r in &runs {
            let cps = store.list_checkpoints(&r.scope).await.unwrap();
            let events = store
                .read_events(&r.scope, &runkeep::ReadEventsOptions::default())
                .await
                .unwrap();
            all.push((cps, events.last_seq));
        }
        all
    };
    let before = snapshot().await;
    assert!(matches!(
        runkeep_demo::seed(&store, &tenant).await,
        Err(runkeep::Error::Conflict { .. })
    ));
    assert!(
        before == snapshot().await,
        "a refused second seed changed a run"
    );
}
