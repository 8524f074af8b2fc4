//! Format freeze: `tests/fixtures/v1/runs` is a session directory written by
//! this crate in on-disk format version 1 (by `examples/format_fixture.rs`).
//! It must keep opening and reading back exactly, forever. Copying it moves
//! every file to new inodes, so its digests and transcript index are stale
//! here: the test also proves readers fall back correctly on stale additive
//! files.

mod common;

use std::path::Path;

use common::rt;
use runkeep::{
    CheckpointStore, ClaimOptions, EvidenceStore, Fence, Holder, Integrity, ListingScope,
    MessageSnapshot, NewEvent, ProjectId, ReadEventsOptions, RunId, RunScope, SessionId, TenantId,
    Timestamp, Ttl,
};
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::json;

const T0: i64 = 1_800_000_000_000;

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn the_v1_format_fixture_opens_and_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("runs");
    copy(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1/runs"),
        &base,
    );
    let a = Attribution {
        tenant_id: TenantId::new("tnt_frozen").unwrap(),
        project_id: ProjectId::new("prj_frozen").unwrap(),
        session_id: SessionId::new("ses_frozen").unwrap(),
    };
    let store = FsStore::open(
        &base,
        FsOptions {
            attribution: Some(a.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let rt = rt();
    let scope = |run: &str| {
        RunScope::new(
            a.tenant_id.clone(),
            a.project_id.clone(),
            a.session_id.clone(),
            RunId::new(run).unwrap(),
        )
    };
    let at = |o: i64| Timestamp::from_millis(T0 + o).unwrap();

    let page = rt
        .block_on(store.list_runs(
            &ListingScope::tenant(a.tenant_id.clone()),
            &runkeep::ListOptions {
                now: Some(at(1_000)),
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(
        serde_json::to_value(&page).unwrap(),
        json!({"entries": [
            {"tenantId": "tnt_frozen", "projectId": "prj_frozen", "sessionId": "ses_frozen", "runId": "run_frozen_a",
             "runCreatedAt": T0, "checkpointCount": 2, "latestCheckpointId": "cp_frozen_2", "latestCheckpointAt": T0 + 200,
             "park": {"state": "outstanding", "checkpointId": "cp_frozen_2", "requestType": "tool_review", "parkedAt": T0 + 250, "deadlineAt": T0 + 3_600_000},
             "claim": {"holder": "", "fence": 2, "expiresAt": 0, "expired": true}},
            {"tenantId": "tnt_frozen", "projectId": "prj_frozen", "sessionId": "ses_frozen", "runId": "run_frozen_c", "parentRunId": "run_frozen_b",
             "runCreatedAt": T0, "checkpointCount": 1, "latestCheckpointId": "cp_frozen_3", "latestCheckpointAt": T0 + 300}
        ]})
    );

    let s = scope("run_frozen_a");
    let cps = rt.block_on(store.list_checkpoints(&s)).unwrap();
    assert_eq!(
        cps.iter()
            .map(|c| (
                c.id.to_string(),
                c.fence.map(Fence::get),
                c.state["iteration"].clone()
            ))
            .collect::<Vec<_>>(),
        [
            ("cp_frozen_1".to_string(), Some(1), json!(1)),
            ("cp_frozen_2".to_string(), Some(1), json!(2))
        ]
    );
    let strict = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(
        strict
            .events
            .iter()
            .map(|e| (e.seq, e.event_type.as_str(), e.generation.map(Fence::get)))
            .collect::<Vec<_>>(),
        [
            (1, "run_started", Some(1)),
            (2, "tool_completed", Some(1)),
            (3, "run_parked", Some(1))
        ]
    );
    let since = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                since_seq: 2,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(
        (since.events.len(), since.events[0].seq, since.last_seq),
        (1, 3, 3)
    );
    let audit = rt.block_on(store.read_audit(&s, 0)).unwrap();
    assert_eq!(
        (audit.len(), audit[0].who.as_str(), audit[0].generation),
        (1, "frozen-worker", Fence::new(1).ok())
    );
    let record = rt.block_on(store.read_run_record(&s)).unwrap().unwrap();
    assert_eq!(
        serde_json::Value::Object(record),
        json!({"id": "run_frozen_a", "status": "parked"})
    );
    assert_eq!(
        rt.block_on(store.read_messages(&s)).unwrap(),
        MessageSnapshot::Available {
            through_event_seq: 3,
            messages: vec![json!({"role": "user", "content": "freeze the format"})]
        }
    );
    assert_eq!(
        rt.block_on(store.read_report(&s)).unwrap().as_deref(),
        Some("# Frozen\n")
    );
    let d = store.diagnose(at(1_000)).unwrap();
    assert_eq!(d.fenced_out_refusals, [(s.clone(), 1)]);
    assert!(d.damaged_checkpoints.is_empty() && d.torn_transcripts.is_empty());

    // Writable: the next claim continues above the tombstone, appends
    // continue the sequence (repairing the stale index), and the new digest
    // is used.
    let opts = ClaimOptions::new(
        Holder::new("thaw").unwrap(),
        Ttl::from_millis(60_000).unwrap(),
    )
    .at(at(2_000));
    let l = rt
        .block_on(store.claim(&s, &opts))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(l.fence.get(), 3);
    let more = rt
        .block_on(store.append_events(
            &s,
            &[NewEvent::new("thawed", Default::default())],
            Some(l.fence),
        ))
        .unwrap();
    assert_eq!(more[0].seq, 4);
    let tail = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                since_seq: 3,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(tail.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [4]);
}
