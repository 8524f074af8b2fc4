//! Retention (`prune_finished`): due finished runs are deleted with all
//! their evidence and their sub-runs; active, held, reopened, not-yet-due
//! and longer-kept runs stay; a batch stops at its limit and says so.

use std::sync::Arc;

use runkeep::scheduling::{PruneReport, RetentionPolicy};
use runkeep::{
    EnqueueOptions, ManualClock, NewAuditEvent, NewEvent, Outcome, RunScope, RunStore, Ttl,
};
use serde_json::{json, Map};

use crate::support::*;

/// Finished runs are kept this long by the cases' policy.
const KEEP_MS: u64 = 10_000;

fn policy() -> RetentionPolicy {
    RetentionPolicy::keep_for(Ttl::from_millis(KEEP_MS).expect("ttl"))
}

async fn prune(store: &Arc<dyn RunStore>, limit: usize) -> PruneReport {
    store
        .prune_finished(&listing(), &policy(), None, limit)
        .await
        .unwrap_or_else(|e| panic!("prune_finished (limit {limit}) failed: {e}"))
}

/// Enqueues `r` with `options`, claims it and finishes it as completed at
/// the store clock's instant.
async fn finished_run(store: &Arc<dyn RunStore>, r: &RunScope, options: &EnqueueOptions) {
    store
        .enqueue(r, &checkpoint(r.run_id.as_str(), 0), options)
        .await
        .unwrap_or_else(|e| panic!("enqueue of {r} failed: {e}"));
    let l = take(store, r, claim_now("w1", 60_000)).await;
    store
        .finish(r, l.fence, &Outcome::completed(Some(json!({"ok": true}))))
        .await
        .unwrap_or_else(|e| panic!("finish of {r} failed: {e}"));
}

/// Writes one of every kind of evidence for `r` (unfenced).
async fn all_evidence(store: &Arc<dyn RunStore>, r: &RunScope) {
    store
        .append_events(
            r,
            &[NewEvent::new(
                "step",
                Map::from_iter([("n".into(), json!(1))]),
            )],
            None,
        )
        .await
        .expect("append events");
    store
        .append_audit(r, &[NewAuditEvent::new("ops", "looked", "ok")], None)
        .await
        .expect("append audit");
    let record = Map::from_iter([("id".into(), json!(r.run_id.as_str()))]);
    store
        .write_run_record(r, &record, None)
        .await
        .expect("run record");
    store
        .write_messages(r, &[json!({"role": "user", "content": "hi"})], 1, None)
        .await
        .expect("messages");
    store.write_report(r, "done", None).await.expect("report");
}

fn names(report: &PruneReport) -> Vec<String> {
    report
        .deleted
        .iter()
        .map(|s| s.run_id.to_string())
        .collect()
}

/// A finished run past its retention is deleted with every kind of
/// evidence and its sub-runs: every read of it (and of its sub-run)
/// answers as for a run that never existed, and its id can be enqueued
/// again.
pub async fn prunes_a_due_finished_run_with_all_its_evidence(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    let due = run("due");
    let child = run("due_child").with_parent(due.run_id.clone());
    let keyed = EnqueueOptions {
        concurrency: Some(runkeep::Concurrency::new("pruned-key", 1).expect("key")),
        ..EnqueueOptions::default()
    };
    finished_run(&store, &due, &keyed).await;
    all_evidence(&store, &due).await;
    write(&store, &child, &checkpoint("child", 0), None).await;
    let l = take(&store, &child, claim_now("w2", 60_000)).await;
    store
        .finish(&child, l.fence, &Outcome::failed("gave up"))
        .await
        .expect("finish the sub-run");
    all_evidence(&store, &child).await;
    clock.advance(KEEP_MS as i64);
    let report = prune(&store, 100).await;
    assert_eq!(
        names(&report),
        ["run_conformance_due"],
        "the due run must be deleted: {report:?}"
    );
    assert_eq!(report.sub_runs_deleted, 1, "its sub-run goes with it");
    assert!(!report.more, "nothing more was due: {report:?}");
    let never = run("never_existed");
    let never_child = run("never_existed_child").with_parent(never.run_id.clone());
    let now = clock.now();
    let blank = read_back(&store, &never, now).await;
    assert_eq!(
        read_back(&store, &due, now).await,
        blank,
        "a pruned run must read as a run that never existed"
    );
    assert_eq!(
        read_back(&store, &child, now).await,
        read_back(&store, &never_child, now).await,
        "a pruned run's sub-run must read as a run that never existed"
    );
    assert!(
        walk(
            &store,
            &listing(),
            Default::default(),
            now.as_millis() - NOW
        )
        .await
        .is_empty(),
        "the listing must not show a pruned run or its sub-run"
    );
    store
        .enqueue(&due, &checkpoint("again", 0), &keyed)
        .await
        .expect("a pruned run's id can be enqueued again");
    assert_eq!(
        store
            .key_holdings(&listing(), "pruned-key")
            .await
            .expect("key_holdings"),
        Vec::new(),
        "a pruned run's holdings must be gone from its key's history, also once its id is enqueued again"
    );
    assert_eq!(
        prune(&store, 100).await.deleted,
        Vec::<RunScope>::new(),
        "a second prune finds nothing due"
    );
}

/// Only due runs go: an active run, a held one, one finished then
/// reopened, one not yet due, one whose own retention is longer than the
/// policy, and a due parent with an active sub-run all stay whole; a run
/// whose own retention is shorter than the policy goes early.
pub async fn keeps_every_run_that_is_not_due(store: Arc<dyn RunStore>, env: CaseEnv) {
    let clock: ManualClock = env.clock();
    let long = EnqueueOptions {
        retention: Some(Ttl::from_millis(KEEP_MS * 100).expect("ttl")),
        ..EnqueueOptions::default()
    };
    let short = EnqueueOptions {
        retention: Some(Ttl::from_millis(10).expect("ttl")),
        ..EnqueueOptions::default()
    };
    let reopened = run("reopened");
    finished_run(&store, &reopened, &EnqueueOptions::default()).await;
    let kept_longer = run("kept_longer");
    finished_run(&store, &kept_longer, &long).await;
    let parent = run("parent");
    finished_run(&store, &parent, &EnqueueOptions::default()).await;
    let busy_child = run("busy_child").with_parent(parent.run_id.clone());
    store
        .enqueue(
            &busy_child,
            &checkpoint("busy", 0),
            &EnqueueOptions::default(),
        )
        .await
        .expect("enqueue the sub-run");
    clock.advance(KEEP_MS as i64);
    store.reopen(&reopened).await.expect("reopen");
    let active = run("active");
    store
        .enqueue(
            &active,
            &checkpoint("active", 0),
            &EnqueueOptions::default(),
        )
        .await
        .expect("enqueue");
    let held = run("held");
    store
        .enqueue(&held, &checkpoint("held", 0), &EnqueueOptions::default())
        .await
        .expect("enqueue");
    take(&store, &held, claim_now("w9", 600_000)).await;
    let recent = run("recent");
    finished_run(&store, &recent, &EnqueueOptions::default()).await;
    let early = run("early");
    finished_run(&store, &early, &short).await;
    clock.advance(10);
    let kept = [
        &reopened,
        &kept_longer,
        &parent,
        &busy_child,
        &active,
        &held,
        &recent,
    ];
    let now = clock.now();
    let mut before = Vec::new();
    for r in kept {
        before.push(read_back(&store, r, now).await);
    }
    let report = prune(&store, 100).await;
    assert_eq!(
        names(&report),
        ["run_conformance_early"],
        "only the run whose own retention is shorter than the policy is due: {report:?}"
    );
    for (r, b) in kept.into_iter().zip(before) {
        assert_eq!(
            read_back(&store, r, now).await,
            b,
            "{r} is not due and must be kept whole"
        );
    }
    // Once the sub-run is finished and due, its parent goes with it.
    let l = take(&store, &busy_child, claim_now("w3", 60_000)).await;
    store
        .finish(&busy_child, l.fence, &Outcome::completed(None))
        .await
        .expect("finish the sub-run");
    clock.advance(KEEP_MS as i64);
    let report = prune(&store, 100).await;
    assert!(
        names(&report).contains(&"run_conformance_parent".to_string()),
        "the parent is due once its sub-run is: {report:?}"
    );
    assert_eq!(report.sub_runs_deleted, 1, "{report:?}");
    assert!(
        !names(&report).contains(&"run_conformance_reopened".to_string())
            && !names(&report).contains(&"run_conformance_kept_longer".to_string()),
        "a reopened run and a run kept longer stay: {report:?}"
    );
}

/// A batch deletes at most `limit` runs and says when more are due; a
/// limit of 0 is refused.
pub async fn prunes_at_most_the_limit_and_says_when_more_are_due(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let clock = env.clock();
    for i in 0..5 {
        finished_run(&store, &run(&format!("r{i}")), &EnqueueOptions::default()).await;
    }
    clock.advance(KEEP_MS as i64);
    expect_invalid(
        store.prune_finished(&listing(), &policy(), None, 0).await,
        "a prune with limit 0",
    );
    let mut seen = Vec::new();
    for (limit, want, more) in [(2, 2, true), (2, 2, true), (2, 1, false)] {
        let report = prune(&store, limit).await;
        assert_eq!(
            (report.deleted.len(), report.more),
            (want, more),
            "a batch of {limit}: {report:?}"
        );
        seen.extend(names(&report));
    }
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen.len(),
        5,
        "every due run deleted exactly once: {seen:?}"
    );
    assert!(
        walk(
            &store,
            &listing(),
            Default::default(),
            clock.now().as_millis() - NOW
        )
        .await
        .is_empty(),
        "every run is gone"
    );
}
