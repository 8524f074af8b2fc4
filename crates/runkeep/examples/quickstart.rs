//! A run through its life on the in-memory store: claim → fenced checkpoint →
//! events → park → listing → answer → release, and a zombie refused.
//!
//! `cargo run -p runkeep --example quickstart`

use std::sync::Arc;

use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, ClaimOutcome, Holder, ListOptions, MemoryStore,
    NewEvent, ParkResolution, ParkState, PendingDecision, RunId, RunScope, RunStore, RunStoreExt,
    Timestamp, Ttl,
};
use serde_json::{json, Map};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), runkeep::Error> {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let run = RunScope::new(
        "tnt_demo".parse()?,
        "prj_demo".parse()?,
        "ses_demo".parse()?,
        RunId::generate(),
    );
    let now = Timestamp::now();
    println!("run {run}");

    // 1. A worker claims the run.
    let w1 = Holder::new("worker-1")?;
    let lease = match store
        .claim(
            &run,
            &ClaimOptions::new(w1, Ttl::from_millis(1_000)?).at(now),
        )
        .await?
    {
        ClaimOutcome::Acquired(l) => l,
        other => panic!("a fresh run must be acquired, got {other:?}"),
    };
    println!(
        "claimed by {} at fence {} (expires {})",
        lease.holder, lease.fence, lease.expires_at
    );

    // 2. It records events and a fenced checkpoint.
    let events = store
        .append_events(
            &run,
            &[
                NewEvent::new("run_started", Map::new()),
                NewEvent::new(
                    "tool_completed",
                    json!({"toolUseId": "t1", "toolName": "search", "result": "3 hits"})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                ),
            ],
            Some(lease.fence),
        )
        .await?;
    println!(
        "appended events seq {:?} (generation {})",
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        lease.fence
    );
    let mut state = Map::new();
    state.insert("iteration".into(), json!(1));
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "tidy the README"}]),
    );
    let cp = Checkpoint::new(CheckpointId::generate(), now, state).with_run_created_at(now);
    let stored = store.write_checkpoint(&run, &cp, Some(lease.fence)).await?;
    println!(
        "checkpoint {} written under fence {:?}",
        stored.id,
        stored.fence.map(|f| f.get())
    );

    // 3. It parks, waiting on a human.
    let park_id = CheckpointId::generate();
    let parked = Checkpoint::new(park_id.clone(), now.offset(1), Map::new())
        .with_run_created_at(now)
        .with_pending(
            PendingDecision::new("plan_approval", Map::new(), now.offset(1))
                .with_deadline(now.offset(3_600_000)),
        );
    store
        .write_checkpoint(&run, &parked, Some(lease.fence))
        .await?;
    println!("parked at checkpoint {park_id} (plan_approval)");

    // 4. The worker stalls past its lease; another takes over.
    let later = now.offset(2_000);
    let w2 = Holder::new("worker-2")?;
    let lease2 = store
        .claim(
            &run,
            &ClaimOptions::new(w2, Ttl::from_millis(60_000)?).at(later),
        )
        .await?
        .lease()
        .expect("expired lease is reclaimable");
    println!("worker-2 took over at fence {}", lease2.fence);

    // 5. The zombie wakes and tries to write: refused, with both fences.
    match store.write_checkpoint(&run, &cp, Some(lease.fence)).await {
        Err(e @ runkeep::Error::FencedOut { .. }) => println!("zombie refused: {e}"),
        other => panic!("zombie write was not refused: {other:?}"),
    }

    // 6. The approval inbox: parked runs nobody holds... and who holds what.
    let page = store
        .list_runs(
            &run.session_scope(),
            &ListOptions {
                park: Some(vec![ParkState::Outstanding]),
                now: Some(later),
                ..Default::default()
            },
        )
        .await?;
    for row in &page.entries {
        println!(
            "listing: {} park={:?} claim={:?} checkpoints={}",
            row.scope.run_id,
            row.park.as_ref().map(|p| p.state),
            row.claim
                .as_ref()
                .map(|c| (c.holder.clone(), c.fence.get(), c.expired)),
            row.checkpoint_count
        );
    }

    // 7. A human answers; a second answer is refused.
    store
        .resolve_park(
            &run,
            &park_id,
            ParkResolution::Answer(json!({"approve": true})),
            later,
            Some(lease2.fence),
        )
        .await?;
    let second = store
        .resolve_park(
            &run,
            &park_id,
            ParkResolution::Answer(json!({"approve": false})),
            later,
            Some(lease2.fence),
        )
        .await;
    println!(
        "second answer: {}",
        second.err().map(|e| e.to_string()).unwrap_or_default()
    );

    // 8. Resume point and ledger, then release.
    let resume = store
        .resume_point(&run, later)
        .await?
        .expect("a checkpoint");
    let tools = store.completed_tools(&run).await?;
    println!(
        "resume from {} (fence {:?}); recorded tools: {:?}",
        resume.id,
        resume.fence.map(|f| f.get()),
        tools.tools.keys().collect::<Vec<_>>()
    );
    store.release(&run, lease2.fence).await?;
    let after = store.lease(&run, later).await?.expect("tombstone");
    println!(
        "released: top holding is now fence {} (holder {:?}, expired {})",
        after.fence, after.holder, after.expired
    );
    Ok(())
}
