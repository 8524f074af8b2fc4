//! Run evidence: the transcript, run record, messages, report, audit and the
//! completed-tool ledger.

use std::collections::HashSet;
use std::sync::Arc;

use runkeep::{
    Integrity, MessageSnapshot, NewAuditEvent, NewEvent, ReadEventsOptions, RunStore, RunStoreExt,
};
use serde_json::{json, Map, Value};

use crate::support::*;

fn ev(t: &str, payload: Value) -> NewEvent {
    NewEvent::new(t, payload.as_object().cloned().unwrap_or_default())
}

/// Appends are numbered 1, 2, 3… across batches; payloads survive whole.
pub async fn numbers_events_contiguously_from_one(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    assert!(store
        .read_events(&a, &Default::default())
        .await
        .expect("read")
        .events
        .is_empty());
    let first = store
        .append_events(
            &a,
            &[
                ev("run_started", json!({"runId": "x"})),
                ev("step", json!({"n": 1})),
            ],
            None,
        )
        .await
        .expect("append");
    let second = store
        .append_events(&a, &[ev("step", json!({"n": {"deep": [1, "two"]}}))], None)
        .await
        .expect("append");
    let seqs: Vec<u64> = first.iter().chain(&second).map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    let back = store
        .read_events(
            &a,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        )
        .await
        .expect("strict read");
    assert_eq!(back.events, [first, second].concat());
    assert_eq!(back.last_seq, 3);
    assert!(back.skipped.is_empty());
    assert_eq!(back.events[2].payload["n"], json!({"deep": [1, "two"]}));
    assert!(
        back.events[0].timestamp.as_millis() > 0,
        "the store did not stamp a timestamp"
    );
}

/// `since_seq` is exclusive; at the head the answer is empty.
pub async fn reads_events_after_since_seq_exclusively(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    for i in 0..4 {
        store
            .append_events(&a, &[ev("step", json!({"i": i}))], None)
            .await
            .expect("append");
    }
    let after2 = store
        .read_events(
            &a,
            &ReadEventsOptions {
                since_seq: 2,
                ..Default::default()
            },
        )
        .await
        .expect("read");
    assert_eq!(
        after2.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4]
    );
    let head = store
        .read_events(
            &a,
            &ReadEventsOptions {
                since_seq: 4,
                ..Default::default()
            },
        )
        .await
        .expect("read");
    assert!(head.events.is_empty());
    assert_eq!(head.last_seq, 4);
    let limited = store
        .read_events(
            &a,
            &ReadEventsOptions {
                since_seq: 0,
                limit: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("read");
    assert_eq!(
        limited.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [1, 2]
    );
}

/// Concurrent appenders never share a number and never leave a gap.
pub async fn never_gives_two_concurrent_appends_one_number(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (store, a) = (store.clone(), a.clone());
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..25 {
                let got = store
                    .append_events(&a, &[ev("step", json!({"w": w, "i": i}))], None)
                    .await
                    .expect("append");
                seqs.push(got[0].seq);
            }
            seqs
        }));
    }
    let mut all = HashSet::new();
    for t in tasks {
        for s in t.await.expect("task") {
            assert!(all.insert(s), "seq {s} given twice");
        }
    }
    assert_eq!(all.len(), 200);
    let back = store
        .read_events(
            &a,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        )
        .await
        .expect("strict");
    assert_eq!(back.events.len(), 200);
    assert!(back
        .events
        .iter()
        .enumerate()
        .all(|(i, e)| e.seq == i as u64 + 1));
}

/// Fenced appends carry their fence as `generation`; unfenced ones none.
pub async fn stamps_events_with_their_generation(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let l = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    store
        .append_events(&a, &[ev("fenced", json!({}))], Some(l.fence))
        .await
        .expect("append");
    store
        .append_events(&a, &[ev("unfenced", json!({}))], None)
        .await
        .expect("append");
    let back = store
        .read_events(&a, &Default::default())
        .await
        .expect("read");
    assert_eq!(back.events[0].generation, Some(l.fence));
    assert_eq!(back.events[1].generation, None);
    let bad = store
        .append_events(&a, &[ev("x", json!({"seq": 9}))], None)
        .await;
    assert!(
        matches!(bad, Err(runkeep::Error::InvalidInput { .. })),
        "reserved key accepted: {bad:?}"
    );
    assert_eq!(
        store
            .read_events(&a, &Default::default())
            .await
            .expect("read")
            .events
            .len(),
        2
    );
}

/// Run record, messages and report read back; never-written and empty are
/// told apart.
pub async fn reads_back_the_run_record_messages_and_report(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    assert_eq!(store.read_run_record(&a).await.expect("record"), None);
    assert_eq!(
        store.read_messages(&a).await.expect("messages"),
        MessageSnapshot::Unavailable
    );
    assert_eq!(store.read_report(&a).await.expect("report"), None);
    let mut record = Map::new();
    record.insert("id".into(), json!("run_conformance_a"));
    record.insert("status".into(), json!("running"));
    record.insert("tokenUsage".into(), json!({"totalTokens": 3}));
    store
        .write_run_record(&a, &record, None)
        .await
        .expect("record");
    assert_eq!(
        store.read_run_record(&a).await.expect("record"),
        Some(record)
    );
    store
        .write_messages(&a, &[], 0, None)
        .await
        .expect("messages");
    assert_eq!(
        store.read_messages(&a).await.expect("messages"),
        MessageSnapshot::Available {
            through_event_seq: 0,
            messages: vec![]
        }
    );
    let msgs = vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": null}),
    ];
    store
        .write_messages(&a, &msgs, 7, None)
        .await
        .expect("messages");
    assert_eq!(
        store.read_messages(&a).await.expect("messages"),
        MessageSnapshot::Available {
            through_event_seq: 7,
            messages: msgs
        }
    );
    store
        .write_report(&a, "# Done\n\nAll good.\n", None)
        .await
        .expect("report");
    assert_eq!(
        store.read_report(&a).await.expect("report").as_deref(),
        Some("# Done\n\nAll good.\n")
    );
}

/// The audit trail has its own sequence, separate from events.
pub async fn keeps_the_audit_trail_in_its_own_sequence(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    store
        .append_events(&a, &[ev("x", json!({})), ev("y", json!({}))], None)
        .await
        .expect("events");
    let mut extra = Map::new();
    extra.insert("cost".into(), json!(0.5));
    let mut e1 = NewAuditEvent::new("operator", "approve", "ok");
    e1.extra = extra;
    let recs = store
        .append_audit(
            &a,
            &[e1, NewAuditEvent::new("worker", "tool", "error")],
            None,
        )
        .await
        .expect("audit");
    assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
    let back = store.read_audit(&a, 0).await.expect("read");
    assert_eq!(back, recs);
    assert_eq!(back[0].extra["cost"], json!(0.5));
    assert_eq!(store.read_audit(&a, 1).await.expect("read").len(), 1);
    let bad = store
        .append_audit(&a, &[NewAuditEvent::new("", "x", "ok")], None)
        .await;
    assert!(matches!(bad, Err(runkeep::Error::InvalidInput { .. })));
}

/// The ledger keeps the last completion per tool use id.
pub async fn records_the_last_completion_of_each_tool(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    store
        .append_events(
            &a,
            &[
                ev("tool_completed", json!({"toolUseId": "t1", "toolName": "bash", "result": "first", "isError": true})),
                ev("tool_completed", json!({"toolUseId": "t2", "toolName": "grep", "result": 5})),
                ev("tool_completed", json!({"toolUseId": "t1", "toolName": "bash", "result": "second"})),
                ev("tool_completed", json!({"toolName": "no_id"})),
            ],
            None,
        )
        .await
        .expect("append");
    let tools = store.completed_tools(&a).await.expect("tools");
    assert!(tools.complete);
    assert_eq!(tools.tools.len(), 2);
    assert_eq!(
        (
            tools.tools["t1"].result.as_str(),
            tools.tools["t1"].is_error
        ),
        ("second", false)
    );
    assert_eq!(tools.tools["t2"].result, "");
}
