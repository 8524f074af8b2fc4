//! Fixtures shared by the cases: the fixed binding, clock, ids and builders.

use std::sync::Arc;

use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, ClaimOutcome, Fence, Holder, Lease, ListOptions,
    ListingScope, PendingDecision, ProjectId, RunId, RunPage, RunRow, RunScope, RunStore,
    SessionId, TenantId, Timestamp, Ttl,
};
use serde_json::{json, Map};

/// The fixed clock of every case.
pub const NOW: i64 = 5_000_000;

/// An instant relative to [`NOW`].
pub fn at(offset_ms: i64) -> Timestamp {
    Timestamp::from_millis(NOW + offset_ms).expect("valid instant")
}

/// The binding tenant.
pub fn tenant() -> TenantId {
    TenantId::new("tnt_conformance").expect("id")
}
/// The binding project.
pub fn project() -> ProjectId {
    ProjectId::new("prj_conformance").expect("id")
}
/// The binding session.
pub fn session() -> SessionId {
    SessionId::new("ses_conformance").expect("id")
}
/// A foreign tenant.
pub fn other_tenant() -> TenantId {
    TenantId::new("tnt_conformance_other").expect("id")
}
/// A foreign project.
pub fn other_project() -> ProjectId {
    ProjectId::new("prj_conformance_other").expect("id")
}

/// A top-level run under the binding.
pub fn run(name: &str) -> RunScope {
    RunScope::new(
        tenant(),
        project(),
        session(),
        RunId::new(format!("run_conformance_{name}")).expect("id"),
    )
}

/// The binding's session as a listing scope.
pub fn listing() -> ListingScope {
    ListingScope::session(tenant(), project(), session())
}

/// A holder.
pub fn holder(name: &str) -> Holder {
    Holder::new(name).expect("holder")
}

/// Claim options at an instant.
pub fn claim_opts(name: &str, ttl_ms: u64, offset_ms: i64) -> ClaimOptions {
    ClaimOptions::new(holder(name), Ttl::from_millis(ttl_ms).expect("ttl")).at(at(offset_ms))
}

/// A checkpoint with a small realistic state.
pub fn checkpoint(id: &str, created_offset_ms: i64) -> Checkpoint {
    let mut state = Map::new();
    state.insert("iteration".into(), json!(1));
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "hello"}]),
    );
    state.insert("tokenUsage".into(), json!({"promptTokens": 1, "completionTokens": 1, "totalTokens": 2, "cachedTokens": 0, "cacheWriteTokens": 0}));
    state.insert(
        "costInfo".into(),
        json!({"totalCost": 0, "cacheDiscount": 0, "unpricedTokens": 0}),
    );
    state.insert(
        "guardState".into(),
        json!({"iterationCount": 1, "elapsedMs": 1}),
    );
    Checkpoint::new(
        CheckpointId::new(format!("cp_conformance_{id}")).expect("id"),
        at(created_offset_ms),
        state,
    )
}

/// A checkpoint parked at `parked_offset_ms` with an optional deadline.
pub fn parked(
    id: &str,
    created_offset_ms: i64,
    parked_offset_ms: i64,
    deadline_offset_ms: Option<i64>,
) -> Checkpoint {
    let mut p = PendingDecision::new("tool_review", Map::new(), at(parked_offset_ms));
    if let Some(d) = deadline_offset_ms {
        p = p.with_deadline(at(d));
    }
    checkpoint(id, created_offset_ms).with_pending(p)
}

/// Claims and expects a lease.
pub async fn take(store: &Arc<dyn RunStore>, scope: &RunScope, opts: ClaimOptions) -> Lease {
    match store.claim(scope, &opts).await.expect("claim call failed") {
        ClaimOutcome::Acquired(l) => l,
        other => panic!("expected to acquire {scope}, but the claim answered {other:?}"),
    }
}

/// Writes a checkpoint and expects success.
pub async fn write(
    store: &Arc<dyn RunStore>,
    scope: &RunScope,
    cp: &Checkpoint,
    fence: Option<Fence>,
) -> Checkpoint {
    store
        .write_checkpoint(scope, cp, fence)
        .await
        .unwrap_or_else(|e| panic!("writing {} to {scope} failed: {e}", cp.id))
}

/// Run ids of a page's rows.
pub fn ids(page: &RunPage) -> Vec<String> {
    page.entries
        .iter()
        .map(|r| r.scope.run_id.to_string())
        .collect()
}

/// Lists with options at [`NOW`] + offset.
pub async fn list(
    store: &Arc<dyn RunStore>,
    scope: &ListingScope,
    mut opts: ListOptions,
    offset_ms: i64,
) -> RunPage {
    opts.now = Some(at(offset_ms));
    store.list_runs(scope, &opts).await.expect("listing failed")
}

/// Walks every page (at most 20, failing loudly past that: a broken cursor
/// must not hang the suite).
pub async fn walk(
    store: &Arc<dyn RunStore>,
    scope: &ListingScope,
    opts: ListOptions,
    offset_ms: i64,
) -> Vec<RunRow> {
    let mut rows = Vec::new();
    let mut cursor = opts.cursor.clone();
    for _ in 0..20 {
        let page = list(
            store,
            scope,
            ListOptions {
                cursor: cursor.clone(),
                ..opts.clone()
            },
            offset_ms,
        )
        .await;
        assert!(
            !(page.entries.is_empty() && page.cursor.is_some()),
            "an empty page carried a cursor"
        );
        rows.extend(page.entries);
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => return rows,
        }
    }
    panic!("listing did not terminate within 20 pages");
}

/// Expects a fenced-out refusal carrying the two fences.
pub fn expect_fenced_out<T: std::fmt::Debug>(
    result: runkeep::Result<T>,
    presented: Fence,
    current: Fence,
) {
    match result {
        Err(runkeep::Error::FencedOut { presented: p, current: c, .. }) => {
            assert_eq!((p, c), (presented, current), "fenced out with unexpected fences");
        }
        Err(other) => panic!("expected a fenced-out refusal (presented {presented}, current {current}), got: {other}"),
        Ok(v) => panic!("expected a fenced-out refusal (presented {presented}, current {current}); the call resolved: {v:?}"),
    }
}
