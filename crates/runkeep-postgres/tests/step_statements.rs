//! Issue 32: a step's writes (and a hand-over's claim) leave as one
//! data-modifying statement (`PgOptions::merge_step_writes`, the default)
//! instead of one statement each. Two guarantees:
//!
//! - **The same rows.** The same script of steps and hand-overs, on the
//!   same test clock, on a store that merges and one that does not, leaves
//!   every table (`runs` with every column, `events`, `checkpoints`,
//!   `key_holdings`) identical, and answers the same (a stale fence is
//!   refused with the same error). A merged write that updated the run's
//!   row twice (a document `UPDATE` beside the save) would keep only one of
//!   them, and the tables would differ.
//! - **Fewer statements.** Counted by the proxy of `tests/round_trips.rs`
//!   (`Query` + `Sync` messages: one per statement): the hand-over in 7
//!   statements (10 one each), the drain cycle's `commit_step` in 6 (8);
//!   the round trips stay 2.

mod common;

use std::sync::Arc;

use common::counting::Counter;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, Concurrency, EnqueueOptions, EvidenceStore,
    ListingScope, ManualClock, MessagesUpdate, NextClaim, Outcome, RunId, RunScope, SessionId,
    Step, Ttl,
};
use runkeep_conformance::support;
use runkeep_postgres::{PgOptions, PgStore};
use serde_json::{json, Map};

fn scope(name: &str) -> RunScope {
    RunScope::new(
        support::tenant(),
        support::project(),
        SessionId::new("ses_steps").unwrap(),
        RunId::new(format!("run_{name}")).unwrap(),
    )
}

fn listing() -> ListingScope {
    ListingScope::session(
        support::tenant(),
        support::project(),
        SessionId::new("ses_steps").unwrap(),
    )
}

fn opts() -> ClaimOptions {
    ClaimOptions::new(support::holder("w"), Ttl::from_millis(600_000).unwrap())
}

fn next() -> NextClaim {
    NextClaim {
        scope: listing(),
        filter: ClaimNextFilter::default(),
        options: opts(),
    }
}

/// The drain cycle's step: an event, a checkpoint, the finish.
fn step(cp: &str, finish: bool) -> Step {
    Step {
        events: vec![support::event("tick", json!({"cp": cp}))],
        checkpoint: Some(support::checkpoint(cp, 0)),
        finish: finish.then(|| Outcome::completed(None)),
        ..Step::default()
    }
}

/// A step with every part: events, a checkpoint, the message snapshot and
/// the run record (two document columns the save sets with the row).
fn full_step(tag: &str, finish: bool) -> Step {
    let mut record = Map::new();
    record.insert("status".into(), json!(format!("step {tag}")));
    Step {
        events: vec![
            support::event("tool_call", json!({"tag": tag})),
            support::event("tool_result", json!({"tag": tag, "ok": true})),
        ],
        checkpoint: Some(support::checkpoint(&format!("cp_{tag}"), 10)),
        messages: Some(MessagesUpdate {
            messages: vec![json!({"role": "assistant", "content": tag})],
            through_event_seq: None,
        }),
        run_record: Some(record),
        finish: finish.then(|| Outcome::completed(Some(json!({"tag": tag})))),
    }
}

async fn store_in(
    url: &str,
    label: &str,
    merge: bool,
    clock: &ManualClock,
) -> (PgStore, common::SchemaGuard) {
    let schema = common::unique_schema(label);
    let guard = common::SchemaGuard::new(url, &schema);
    let store = PgStore::connect(
        url,
        PgOptions {
            merge_step_writes: merge,
            clock: Some(Arc::new(clock.clone()) as Arc<dyn runkeep::Clock>),
            ..common::options(&schema, None)
        },
    )
    .await
    .expect("connect");
    (store, guard)
}

/// The script: unkeyed and keyed runs, hand-overs with full steps, a
/// non-finishing step, a refused stale fence. Answers what each call
/// answered, as text.
async fn script(store: &PgStore, clock: &ManualClock) -> Vec<String> {
    let mut out = Vec::new();
    let enq = EnqueueOptions::default();
    let keyed = EnqueueOptions {
        concurrency: Some(Concurrency::new("k", 1).unwrap()),
        ..EnqueueOptions::default()
    };
    for (name, o) in [
        ("a", &enq),
        ("b", &enq),
        ("c", &keyed),
        ("d", &keyed),
        ("e", &enq),
    ] {
        store
            .enqueue(&scope(name), &support::checkpoint("start", 0), o)
            .await
            .unwrap();
        clock.advance(1);
    }
    let (mut run, mut lease) = store
        .claim_next(&listing(), &ClaimNextFilter::default(), &opts())
        .await
        .unwrap()
        .unwrap();
    out.push(format!("claimed {run:?} {lease:?}"));
    // A later step that does not finish, then a stale fence refused.
    clock.advance(5);
    let r = store
        .commit_step(&run, lease.fence, &full_step("mid", false))
        .await
        .unwrap();
    out.push(format!("{r:?}"));
    let stale = runkeep::Fence::new(lease.fence.get() + 7).unwrap();
    let refused = store
        .commit_step(&run, stale, &full_step("stale", true))
        .await
        .expect_err("a stale fence is refused");
    out.push(format!("refused: {refused}"));
    let mut i = 0;
    loop {
        clock.advance(3);
        let s = if i % 2 == 0 {
            full_step(&format!("h{i}"), true)
        } else {
            step(&format!("h{i}"), true)
        };
        let h = store
            .commit_step_and_claim_next(&run, lease.fence, &s, &next())
            .await
            .unwrap();
        out.push(format!("{:?}", h.receipt));
        match h.next.unwrap() {
            Some((r, l)) => {
                out.push(format!("next {r:?} {l:?}"));
                (run, lease) = (r, l);
            }
            None => break,
        }
        i += 1;
    }
    out
}

/// Every row of the tables a step writes, as JSON text, in key order.
async fn tables(url: &str, schema: &str) -> Vec<String> {
    let c = common::raw_client(url, schema).await;
    let mut out = Vec::new();
    for (table, order) in [
        ("runs", "run_id"),
        ("events", "run_id, seq"),
        ("checkpoints", "run_id, checkpoint_id"),
        ("key_holdings", "id"),
    ] {
        for r in c
            .query(
                &format!("SELECT to_jsonb(t)::text FROM {table} t ORDER BY {order}"),
                &[],
            )
            .await
            .unwrap()
        {
            out.push(format!("{table}: {}", r.get::<_, String>(0)));
        }
    }
    out
}

#[tokio::test]
async fn merged_and_separate_step_writes_leave_the_same_rows() {
    let Some(url) = common::url_or_skip("step_statements") else {
        return;
    };
    let (clock_m, clock_s) = (support::store_clock(), support::store_clock());
    let (merged, gm) = store_in(&url, "stm", true, &clock_m).await;
    let (split, gs) = store_in(&url, "sts", false, &clock_s).await;
    let answers_m = script(&merged, &clock_m).await;
    let answers_s = script(&split, &clock_s).await;
    assert_eq!(answers_m, answers_s, "the two paths answered differently");
    assert!(
        answers_m.iter().any(|a| a.starts_with("refused: ")),
        "the stale fence was tried"
    );
    let (rows_m, rows_s) = (
        tables(&url, &gm.schema).await,
        tables(&url, &gs.schema).await,
    );
    assert_eq!(rows_m.len(), rows_s.len(), "{rows_m:#?}\n{rows_s:#?}");
    for (m, s) in rows_m.iter().zip(&rows_s) {
        assert_eq!(
            m, s,
            "a row differs between the merged and the separate writes"
        );
    }
    // What was compared holds what the steps wrote: every run finished,
    // the documents and the keyed holdings stored.
    let count = |prefix: &str, needle: &str| {
        rows_m
            .iter()
            .filter(|r| r.starts_with(prefix) && r.contains(needle))
            .count()
    };
    assert_eq!(
        count("runs: ", "\"status\": \"completed\""),
        5,
        "{rows_m:#?}"
    );
    assert!(
        count("runs: ", "\"record\": {\"status\": \"step h") >= 2,
        "{rows_m:#?}"
    );
    assert!(
        count("runs: ", "\"messages\": [{\"role\"") >= 2,
        "{rows_m:#?}"
    );
    assert_eq!(
        count("key_holdings: ", "\"ended_at\": null"),
        0,
        "{rows_m:#?}"
    );
    assert_eq!(count("key_holdings: ", "\"ckey\": \"k\""), 2, "{rows_m:#?}");
    assert!(count("events: ", "tool_result") >= 3, "{rows_m:#?}");
}

/// Statements and round trips of one drain cycle's `commit_step` and one
/// hand-over, on a store of one connection, after a warm-up.
async fn counted(url: &str, merge: bool) -> [(usize, usize); 2] {
    let (_direct, guard) = common::store(url, "stc", None).await;
    let counter = Counter::start(&common::server_addr(url)).await;
    let store = PgStore::connect(
        &counter.url(url),
        PgOptions {
            pool_size: 1,
            merge_step_writes: merge,
            ..common::options(&guard.schema, None)
        },
    )
    .await
    .expect("connect through the counting proxy");
    let mut out = [(0, 0); 2];
    for round in 0..2 {
        for n in ["x", "y", "z"] {
            store
                .enqueue(
                    &scope(&format!("{n}{round}")),
                    &support::checkpoint("start", 0),
                    &EnqueueOptions::default(),
                )
                .await
                .unwrap();
        }
        let (r, l) = store
            .claim_next(&listing(), &ClaimNextFilter::default(), &opts())
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        let before = counter.snapshot();
        store
            .commit_step(&r, l.fence, &step("end", true))
            .await
            .unwrap();
        let used = counter.snapshot() - before;
        out[0] = (used.exchanges, used.waits);
        let (r, l) = store
            .claim_next(&listing(), &ClaimNextFilter::default(), &opts())
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        let before = counter.snapshot();
        let h = store
            .commit_step_and_claim_next(&r, l.fence, &step("end", true), &next())
            .await
            .unwrap();
        let used = counter.snapshot() - before;
        out[1] = (used.exchanges, used.waits);
        let (r, l) = h.next.unwrap().expect("the third run");
        store
            .commit_step(&r, l.fence, &step("end", true))
            .await
            .unwrap();
    }
    out
}

#[tokio::test]
async fn merged_step_writes_take_fewer_statements() {
    let Some(url) = common::url_or_skip("step_statements") else {
        return;
    };
    let merged = counted(&url, true).await;
    let split = counted(&url, false).await;
    eprintln!(
        "statements (round trips): commit_step {:?} merged vs {:?} separate; hand-over {:?} vs {:?}",
        merged[0], split[0], merged[1], split[1]
    );
    assert_eq!(split, [(8, 2), (10, 2)], "the separate path as before");
    assert_eq!(merged, [(6, 2), (7, 2)], "the merged path");
}
