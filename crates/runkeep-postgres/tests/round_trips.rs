//! Round trips per operation, counted by a proxy between the store and the
//! server (`common::counting`: a round trip is a wait for the server, so
//! statements pipelined together count once), each held to its budget: a
//! change that adds a wait to an operation fails here.
//!
//! The store has one pooled connection and runs on a current-thread
//! runtime (the count is exact there; see `common::counting`). Every
//! operation runs once first on runs of their own, so every statement is
//! prepared on that connection before anything is counted.

mod common;

use std::future::Future;

use common::counting::{Counter, Snapshot};
use runkeep::batch::StepCommit;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, Concurrency, Dedupe, EnqueueOptions,
    EvidenceStore, Fence, ListOptions, ListingScope, NewAuditEvent, NextClaim, Outcome,
    ParkResolution, Priority, ReadEventsOptions, RunId, RunScope, SessionId, Step, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore};
use serde_json::json;

struct Meter<'a> {
    counter: &'a Counter,
    /// Recording (false while warming up).
    on: bool,
    rows: Vec<(&'static str, usize, Snapshot)>,
}

impl Meter<'_> {
    /// Runs `op` and, when recording, keeps its count against `budget`.
    async fn op<T>(&mut self, name: &'static str, budget: usize, op: impl Future<Output = T>) -> T {
        // Let background work of the previous operation (a rollback sent
        // after the caller had its answer) finish before counting.
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        let before = self.counter.snapshot();
        let out = op.await;
        let used = self.counter.snapshot() - before;
        if self.on {
            self.rows.push((name, budget, used));
        }
        out
    }
}

fn scope(phase: &str, name: &str) -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        SessionId::new(format!("ses_rt_{phase}")).unwrap(),
        RunId::new(format!("run_rt_{name}")).unwrap(),
    )
}

fn listing(phase: &str) -> ListingScope {
    ListingScope::session(
        support::tenant(),
        support::project(),
        SessionId::new(format!("ses_rt_{phase}")).unwrap(),
    )
}

fn opts() -> ClaimOptions {
    ClaimOptions::new(support::holder("w"), Ttl::from_millis(600_000).unwrap())
}

fn step(cp: &str, finish: bool) -> Step {
    Step {
        events: vec![support::event("tick", json!({"cp": cp}))],
        checkpoint: Some(support::checkpoint(cp, 0)),
        finish: finish.then(|| Outcome::completed(None)),
        ..Step::default()
    }
}

/// Every operation once, in `phase`'s own session.
async fn scenario(store: &PgStore, m: &mut Meter<'_>, phase: &str) {
    let a = scope(phase, "a");
    let b = scope(phase, "b");
    let (ls, filter, co) = (listing(phase), ClaimNextFilter::default(), opts());
    let next = || store.claim_next(&ls, &filter, &co);
    let enq = EnqueueOptions::default();

    m.op(
        "enqueue",
        2,
        store.enqueue(&a, &support::checkpoint("start", 0), &enq),
    )
    .await
    .unwrap();
    let (got, lease) = m.op("claim_next", 2, next()).await.unwrap().unwrap();
    assert_eq!(got, a);
    let f = lease.fence;
    m.op(
        "commit_step: the first step of an enqueued run",
        2,
        store.commit_step(&a, f, &step("s1", false)),
    )
    .await
    .unwrap();
    m.op(
        "commit_step: a later step",
        2,
        store.commit_step(&a, f, &step("s2", false)),
    )
    .await
    .unwrap();
    m.op(
        "append_events (fenced)",
        2,
        store.append_events(&a, &[support::event("e", json!({}))], Some(f)),
    )
    .await
    .unwrap();
    m.op(
        "write_checkpoint (fenced)",
        2,
        store.write_checkpoint(&a, &support::checkpoint("s3", 0), Some(f)),
    )
    .await
    .unwrap();
    let f = m
        .op("claim (renewal)", 2, store.claim(&a, &opts()))
        .await
        .unwrap()
        .lease()
        .unwrap()
        .fence;
    m.op("finish", 2, store.finish(&a, f, &Outcome::failed("stop")))
        .await
        .unwrap();
    m.op("reopen", 2, store.reopen(&a)).await.unwrap();

    // The drain cycle's step: an event, a checkpoint and the finish.
    store
        .enqueue(&b, &support::checkpoint("start", 0), &enq)
        .await
        .unwrap();
    let (got, lease) = next().await.unwrap().unwrap();
    assert_eq!(got, a, "the reopened run sorts first");
    let (got_b, lease_b) = next().await.unwrap().unwrap();
    assert_eq!(got_b, b);
    m.op(
        "commit_step: event, checkpoint and finish (the drain cycle)",
        2,
        store.commit_step(&b, lease_b.fence, &step("end", true)),
    )
    .await
    .unwrap();
    // A new lease on a run mixing its unstamped enqueued checkpoint with
    // stamped ones: the digest is rebuilt from the headers (one more wait).
    m.op(
        "commit_step: first step under a new lease, digest rebuilt",
        3,
        store.commit_step(&a, lease.fence, &step("s4", true)),
    )
    .await
    .unwrap();
    let none = m
        .op("claim_next: nothing to claim", 1, next())
        .await
        .unwrap();
    assert!(none.is_none());

    // The hand-over: the drain cycle's step and the next claim, one
    // transaction in two waits.
    let (h1, h2) = (scope(phase, "h1"), scope(phase, "h2"));
    for h in [&h1, &h2] {
        store
            .enqueue(h, &support::checkpoint("start", 0), &enq)
            .await
            .unwrap();
    }
    let (got, lease_h1) = next().await.unwrap().unwrap();
    assert_eq!(got, h1);
    let hand = NextClaim {
        scope: ls.clone(),
        filter: filter.clone(),
        options: co.clone(),
    };
    let over = m
        .op(
            "commit_step_and_claim_next: the step and the next run",
            2,
            store.commit_step_and_claim_next(&h1, lease_h1.fence, &step("end", true), &hand),
        )
        .await
        .unwrap();
    let (got, lease_h2) = over.next.unwrap().unwrap();
    assert_eq!(got, h2);
    let over = m
        .op(
            "commit_step_and_claim_next: the step, nothing next",
            2,
            store.commit_step_and_claim_next(&h2, lease_h2.fence, &step("end", true), &hand),
        )
        .await
        .unwrap();
    assert!(over.next.unwrap().is_none());

    // A batch of four runs without keys: four candidates with BEGIN, their
    // saves with one COMMIT: 2 waits and one durable commit where four
    // claim_next calls take 8 waits and four commits.
    let batch_ls = listing(&format!("{phase}_batch"));
    for i in 1..=4 {
        store
            .enqueue(
                &scope(&format!("{phase}_batch"), &format!("k{i}")),
                &support::checkpoint("start", 0),
                &enq,
            )
            .await
            .unwrap();
    }
    let taken = m
        .op(
            "claim_next_batch: four runs",
            2,
            store.claim_next_batch(&batch_ls, &filter, &co, 4),
        )
        .await
        .unwrap();
    assert_eq!(taken.len(), 4);

    // A batch of four runs over two concurrency keys (limit 2 each; a
    // fifth run of the first key queued behind): the candidates with
    // their keys' locks tried, with BEGIN; the keys' holders counted for
    // the whole batch; the saves and the keys' history with one COMMIT.
    // 3 waits, where the search one keyed candidate at a time took a
    // round trip per run. (A batch that takes fewer runs than it asked
    // for searches once more before its COMMIT: 4.)
    let keyed_ls = listing(&format!("{phase}_keyed"));
    for i in 1..=5 {
        let key = if i % 2 == 1 { "ka" } else { "kb" };
        store
            .enqueue(
                &scope(&format!("{phase}_keyed"), &format!("q{i}")),
                &support::checkpoint("start", 0),
                &EnqueueOptions {
                    concurrency: Some(Concurrency::new(key, 2).unwrap()),
                    ..EnqueueOptions::default()
                },
            )
            .await
            .unwrap();
    }
    let keyed_batch = m
        .op(
            "claim_next_batch: four keyed runs of two keys",
            3,
            store.claim_next_batch(&keyed_ls, &filter, &co, 4),
        )
        .await
        .unwrap();
    assert_eq!(
        keyed_batch
            .iter()
            .map(|(s, _)| s.clone())
            .collect::<Vec<_>>(),
        [1, 2, 3, 4].map(|i| scope(&format!("{phase}_keyed"), &format!("q{i}"))),
        "the first four runs in claim order"
    );

    // The group commit of those four runs' finishing steps, one of them
    // under a stale fence: every row locked and read with BEGIN, the
    // accepted steps' writes with one COMMIT: 2 waits where four
    // commit_step calls take 8.
    let mut group: Vec<StepCommit> = taken
        .iter()
        .map(|(s, l)| StepCommit {
            scope: s.clone(),
            fence: l.fence,
            step: step("end", true),
        })
        .collect();
    group[2].fence = Fence::new(group[2].fence.get() + 1000).unwrap();
    let outcomes = m
        .op(
            "commit_steps: four finishing steps, one stale",
            2,
            store.commit_steps(&group),
        )
        .await
        .unwrap();
    assert_eq!(
        outcomes.iter().map(Result::is_ok).collect::<Vec<_>>(),
        [true, true, false, true]
    );

    let c = scope(phase, "c");
    let lc = m
        .op("claim (a new run)", 2, store.claim(&c, &opts()))
        .await
        .unwrap()
        .lease()
        .unwrap();
    let until = store.now().offset(3_600_000);
    assert!(m
        .op("snooze", 2, store.snooze(&c, lc.fence, until))
        .await
        .unwrap());
    let d = scope(phase, "d");
    let ld = store.claim(&d, &opts()).await.unwrap().lease().unwrap();
    assert!(m
        .op("release", 2, store.release(&d, ld.fence))
        .await
        .unwrap());
    let e = scope(phase, "e");
    m.op(
        "append_events (unfenced, a new run)",
        2,
        store.append_events(&e, &[support::event("e", json!({}))], None),
    )
    .await
    .unwrap();
    m.op(
        "write_checkpoint (unfenced)",
        2,
        store.write_checkpoint(&e, &support::checkpoint("u1", 0), None),
    )
    .await
    .unwrap();

    // Parks, checkpoint upkeep, audit and documents, on a run of their own.
    let g = scope(phase, "g");
    let fg = Some(
        store
            .claim(&g, &opts())
            .await
            .unwrap()
            .lease()
            .unwrap()
            .fence,
    );
    let mut ids = Vec::new();
    for cp in [
        support::checkpoint("g1", 0),
        support::parked("g2", 1, 1, None),
        support::checkpoint("g3", 2),
    ] {
        ids.push(store.write_checkpoint(&g, &cp, fg).await.unwrap().id);
    }
    let id = |s: &str| {
        ids.iter()
            .find(|i| i.as_str().ends_with(s))
            .unwrap()
            .clone()
    };
    let pending = m
        .op("find_pending", 1, store.find_pending(&g, store.now()))
        .await
        .unwrap();
    assert_eq!(pending.map(|c| c.id), Some(id("g2")));
    let resume = m
        .op(
            "resume_point (a park is pending)",
            1,
            store.resume_point(&g, store.now()),
        )
        .await
        .unwrap();
    assert_eq!(resume.map(|c| c.id), Some(id("g2")));
    m.op(
        "resolve_park",
        2,
        store.resolve_park(
            &g,
            &id("g2"),
            ParkResolution::Answer(json!({"approve": true})),
            store.now(),
            fg,
        ),
    )
    .await
    .unwrap();
    let resume = m
        .op(
            "resume_point (no park pending: the latest)",
            1,
            store.resume_point(&g, store.now()),
        )
        .await
        .unwrap();
    assert!(resume.is_some());
    m.op("read_checkpoint", 1, store.read_checkpoint(&g, &id("g1")))
        .await
        .unwrap()
        .unwrap();
    m.op("list_checkpoints", 1, store.list_checkpoints(&g))
        .await
        .unwrap();
    assert!(m
        .op(
            "delete_checkpoint",
            2,
            store.delete_checkpoint(&g, &id("g3"), fg)
        )
        .await
        .unwrap());
    m.op("prune_checkpoints", 2, store.prune_checkpoints(&g, 1, fg))
        .await
        .unwrap();
    m.op(
        "append_audit",
        2,
        store.append_audit(&g, &[NewAuditEvent::new("w", "step", "ok")], fg),
    )
    .await
    .unwrap();
    m.op("read_audit", 1, store.read_audit(&g, 0))
        .await
        .unwrap();
    let h = scope(phase, "h");
    let record = serde_json::Map::new();
    let messages = [json!({"role": "user"})];
    m.op(
        "write_run_record (fenced)",
        2,
        store.write_run_record(&g, &record, fg),
    )
    .await
    .unwrap();
    m.op(
        "write_run_record (unfenced)",
        1,
        store.write_run_record(&h, &record, None),
    )
    .await
    .unwrap();
    m.op(
        "write_messages (fenced)",
        2,
        store.write_messages(&g, &messages, 0, fg),
    )
    .await
    .unwrap();
    m.op(
        "write_messages (unfenced)",
        1,
        store.write_messages(&h, &messages, 0, None),
    )
    .await
    .unwrap();
    m.op(
        "write_report (fenced)",
        2,
        store.write_report(&g, "report", fg),
    )
    .await
    .unwrap();
    m.op(
        "write_report (unfenced)",
        1,
        store.write_report(&h, "report", None),
    )
    .await
    .unwrap();
    m.op("read_run_record", 1, store.read_run_record(&h))
        .await
        .unwrap()
        .unwrap();
    m.op("read_messages", 1, store.read_messages(&h))
        .await
        .unwrap();
    m.op("read_report", 1, store.read_report(&h))
        .await
        .unwrap()
        .unwrap();

    m.op("lease", 1, store.lease(&a, store.now()))
        .await
        .unwrap();
    m.op("lifecycle", 1, store.lifecycle(&a)).await.unwrap();
    m.op(
        "read_events",
        1,
        store.read_events(&a, &ReadEventsOptions::default()),
    )
    .await
    .unwrap();
    m.op("latest_checkpoint", 1, store.latest_checkpoint(&a))
        .await
        .unwrap()
        .unwrap();
    m.op(
        "list_runs",
        1,
        store.list_runs(&listing(phase), &ListOptions::default()),
    )
    .await
    .unwrap();
    keyed(store, m, phase).await;
}

/// Priorities, concurrency keys and the dedupe window (issue 30).
async fn keyed(store: &PgStore, m: &mut Meter<'_>, phase: &str) {
    let (ls, co) = (listing(phase), opts());
    let keyed = |priority: i64| EnqueueOptions {
        priority: Priority::new(priority).unwrap(),
        concurrency: Some(Concurrency::new("rk", 1).unwrap()),
        ..EnqueueOptions::default()
    };
    let (k1, k2, k3) = (scope(phase, "k1"), scope(phase, "k2"), scope(phase, "k3"));
    for (k, p) in [(&k1, 100), (&k2, 99), (&k3, 98)] {
        store
            .enqueue(k, &support::checkpoint("start", 0), &keyed(p))
            .await
            .unwrap();
    }
    let l1 = m
        .op("claim (a keyed run)", 2, store.claim(&k1, &co))
        .await
        .unwrap();
    let runkeep::ClaimOutcome::Acquired(l1) = l1 else {
        panic!("{l1:?}")
    };
    // Refused at the limit: rolled back unwaited.
    m.op("claim (a keyed run at its limit)", 1, store.claim(&k2, &co))
        .await
        .unwrap();
    m.op(
        "finish (a keyed run)",
        2,
        store.finish(&k1, l1.fence, &Outcome::completed(None)),
    )
    .await
    .unwrap();
    // The candidate with its key's lock and the key's count, then the
    // claim: the round trips of a run without a key (`claim_next`, above).
    let (got, l2) = m
        .op(
            "claim_next (a keyed run)",
            2,
            store.claim_next(&ls, &ClaimNextFilter::default(), &co),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, k2);
    // The step's writes go before the search (one more round trip), then
    // the keyed candidate's lock and count (one more).
    let hand = NextClaim {
        scope: ls.clone(),
        filter: ClaimNextFilter::default(),
        options: co.clone(),
    };
    let h = m
        .op(
            "commit_step_and_claim_next (finishing a keyed run, taking one)",
            4,
            store.commit_step_and_claim_next(
                &k2,
                l2.fence,
                &Step {
                    finish: Some(Outcome::completed(None)),
                    ..Step::default()
                },
                &hand,
            ),
        )
        .await
        .unwrap();
    assert_eq!(h.next.unwrap().map(|(s, _)| s), Some(k3.clone()));
    m.op(
        "set_priority",
        2,
        store.set_priority(&k3, Priority::new(5).unwrap()),
    )
    .await
    .unwrap();
    let d = Dedupe {
        key: "rt".into(),
        window: Ttl::from_millis(600_000).unwrap(),
    };
    let e = m
        .op(
            "enqueue_once (a new window)",
            2,
            store.enqueue_once(
                &scope(phase, "d1"),
                &support::checkpoint("start", 0),
                &EnqueueOptions::default(),
                Some(&d),
            ),
        )
        .await
        .unwrap();
    assert!(e.created);
    // The window and its run's latest checkpoint are read with the lock;
    // rolled back unwaited.
    let e = m
        .op(
            "enqueue_once (inside the window)",
            1,
            store.enqueue_once(
                &scope(phase, "d2"),
                &support::checkpoint("start", 0),
                &EnqueueOptions::default(),
                Some(&d),
            ),
        )
        .await
        .unwrap();
    assert!(!e.created);
    // Last, a read: the refusal's rollback above finishes meanwhile (one
    // left in flight when the test ends holds the schema's drop).
    m.op("key_holdings", 1, store.key_holdings(&ls, "rk"))
        .await
        .unwrap();
}

#[tokio::test]
async fn round_trips_per_operation_stay_within_their_budgets() {
    let Some(url) = common::url_or_skip("round_trips") else {
        return;
    };
    let (_direct, guard) = common::store(&url, "rt", None).await;
    let counter = Counter::start(&common::server_addr(&url)).await;
    let store = PgStore::connect(
        &counter.url(&url),
        PgOptions {
            pool_size: 1,
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .expect("connect through the counting proxy");
    let mut m = Meter {
        counter: &counter,
        on: false,
        rows: Vec::new(),
    };
    scenario(&store, &mut m, "warm").await;
    let connections = counter.snapshot().connections;
    m.on = true;
    scenario(&store, &mut m, "measured").await;
    assert_eq!(
        counter.snapshot().connections,
        connections,
        "no connection was opened while counting"
    );

    let mut table = String::from("round trips (statements) per operation:\n");
    let mut over = Vec::new();
    for (name, budget, used) in &m.rows {
        table.push_str(&format!(
            "  {name:<62} {:>2} ({:>2})  budget {budget}\n",
            used.waits, used.exchanges
        ));
        if used.waits > *budget {
            over.push(format!("{name}: {} > {budget}", used.waits));
        }
    }
    eprintln!("{table}");
    assert!(over.is_empty(), "over budget: {over:#?}\n{table}");
}
