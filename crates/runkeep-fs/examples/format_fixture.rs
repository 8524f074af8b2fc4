//! Writes the checked-in format fixture (`tests/fixtures/v1/runs`): a small
//! session directory in this crate's on-disk format, version 1, used by the
//! format-freeze test. Run by hand only when the format version changes:
//!
//! ```sh
//! cargo run -p runkeep-fs --example format_fixture -- crates/runkeep-fs/tests/fixtures/v1/runs
//! ```

use runkeep::{
    Checkpoint, CheckpointStore, ClaimOptions, EvidenceStore, Holder, NewAuditEvent, NewEvent,
    PendingDecision, ProjectId, RunId, RunScope, SessionId, TenantId, Timestamp, Ttl,
};
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::{json, Map};

const T0: i64 = 1_800_000_000_000;

fn at(offset: i64) -> Timestamp {
    Timestamp::from_millis(T0 + offset).expect("instant")
}

fn checkpoint(id: &str, offset: i64, iteration: u64) -> Checkpoint {
    let mut state = Map::new();
    state.insert("iteration".into(), json!(iteration));
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "freeze the format"}]),
    );
    state.insert("tokenUsage".into(), json!({"promptTokens": 10, "completionTokens": 5, "totalTokens": 15, "cachedTokens": 0, "cacheWriteTokens": 0}));
    state.insert(
        "costInfo".into(),
        json!({"totalCost": 0.001, "cacheDiscount": 0, "unpricedTokens": 0}),
    );
    state.insert(
        "guardState".into(),
        json!({"iterationCount": iteration, "elapsedMs": 100}),
    );
    Checkpoint::new(id.parse().expect("id"), at(offset), state).with_run_created_at(at(0))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> runkeep::Result<()> {
    let out = std::env::args()
        .nth(1)
        .expect("usage: format_fixture <output runs/ directory>");
    if std::path::Path::new(&out).exists() {
        panic!("{out} exists; remove it first");
    }
    let attribution = Attribution {
        tenant_id: TenantId::new("tnt_frozen")?,
        project_id: ProjectId::new("prj_frozen")?,
        session_id: SessionId::new("ses_frozen")?,
    };
    let store = FsStore::open(
        &out,
        FsOptions {
            attribution: Some(attribution.clone()),
            ..Default::default()
        },
    )?;
    let scope = |run: &str| {
        RunScope::new(
            attribution.tenant_id.clone(),
            attribution.project_id.clone(),
            attribution.session_id.clone(),
            RunId::new(run).expect("id"),
        )
    };
    let a = scope("run_frozen_a");
    let opts =
        ClaimOptions::new(Holder::new("frozen-worker")?, Ttl::from_millis(60_000)?).at(at(0));
    let lease = store.claim(&a, &opts).await?.lease().expect("fresh run");
    let f = Some(lease.fence);
    store
        .write_checkpoint(&a, &checkpoint("cp_frozen_1", 100, 1), f)
        .await?;
    let park =
        PendingDecision::new("tool_review", Map::new(), at(250)).with_deadline(at(3_600_000));
    store
        .write_checkpoint(&a, &checkpoint("cp_frozen_2", 200, 2).with_pending(park), f)
        .await?;
    let mut p = Map::new();
    p.insert("runId".into(), json!("run_frozen_a"));
    store
        .append_events(
            &a,
            &[
                NewEvent::new("run_started", p.clone()),
                NewEvent::new("tool_completed", {
                    let mut t = p.clone();
                    t.insert("toolUseId".into(), json!("call_1"));
                    t.insert("toolName".into(), json!("bash"));
                    t.insert("result".into(), json!("ok"));
                    t
                }),
            ],
            f,
        )
        .await?;
    store
        .append_events(&a, &[NewEvent::new("run_parked", p)], f)
        .await?;
    store
        .append_audit(
            &a,
            &[NewAuditEvent::new("frozen-worker", "tool_call", "ok")],
            f,
        )
        .await?;
    let mut record = Map::new();
    record.insert("id".into(), json!("run_frozen_a"));
    record.insert("status".into(), json!("parked"));
    store.write_run_record(&a, &record, f).await?;
    store
        .write_messages(
            &a,
            &[json!({"role": "user", "content": "freeze the format"})],
            3,
            f,
        )
        .await?;
    store.write_report(&a, "# Frozen\n", f).await?;
    store.release(&a, lease.fence).await?;
    // A zombie write after the release: refused and counted.
    assert!(store.write_report(&a, "zombie", f).await.is_err());
    let child = scope("run_frozen_c").with_parent(RunId::new("run_frozen_b")?);
    store
        .write_checkpoint(&child, &checkpoint("cp_frozen_3", 300, 1), None)
        .await?;
    println!("wrote {out}");
    Ok(())
}
