//! Fixtures shared by the cases: the fixed binding, clock, ids and builders.
//!
//! A test store that wraps another and changes a few of its calls is built
//! with [`crate::intercept`].

use std::sync::Arc;

use runkeep::{
    AuditRecord, Checkpoint, CheckpointId, ClaimOptions, ClaimOutcome, Fence, Holder, Integrity,
    Lease, LeaseSummary, Lifecycle, ListOptions, ListingScope, ManualClock, MessageSnapshot,
    NewEvent, PendingDecision, PersistedEvent, ProjectId, ReadEventsOptions, RunId, RunPage,
    RunRecord, RunRow, RunScope, RunStore, SessionId, TenantId, Timestamp, Ttl,
};
use serde_json::{json, Map, Value};

pub use crate::CaseEnv;
pub use runkeep::Clock;

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

/// A store clock at [`NOW`], for a fixture's store (`MemoryStore::with_clock`,
/// the directory store's `FsOptions::clock`) and [`crate::Fixture::with_clock`].
pub fn store_clock() -> ManualClock {
    ManualClock::new(at(0))
}

/// Claim options judged on the store's clock (no instant passed).
pub fn claim_now(name: &str, ttl_ms: u64) -> ClaimOptions {
    ClaimOptions::new(holder(name), Ttl::from_millis(ttl_ms).expect("ttl"))
}

/// An event of `event_type` with a JSON object payload.
pub fn event(event_type: &str, payload: Value) -> NewEvent {
    NewEvent::new(event_type, payload.as_object().cloned().unwrap_or_default())
}

/// Expects a refusal as fenced out of the presented fence (whatever the
/// current one).
pub fn expect_fenced<T: std::fmt::Debug>(result: runkeep::Result<T>, presented: Fence, what: &str) {
    match result {
        Err(runkeep::Error::FencedOut { presented: p, .. }) => {
            assert_eq!(p, presented, "{what}: fenced out naming another fence");
        }
        Err(other) => {
            panic!("{what}: expected a fenced-out refusal of fence {presented}, got: {other}")
        }
        Ok(v) => panic!(
            "{what}: expected a fenced-out refusal of fence {presented}; the call resolved: {v:?}"
        ),
    }
}

/// Expects an `InvalidInput` refusal.
pub fn expect_invalid<T: std::fmt::Debug>(result: runkeep::Result<T>, what: &str) {
    match result {
        Err(runkeep::Error::InvalidInput { .. }) => {}
        Err(other) => panic!("{what}: expected an invalid-input refusal, got: {other}"),
        Ok(v) => panic!("{what}: expected an invalid-input refusal; the call resolved: {v:?}"),
    }
}

/// Expects a `Conflict` refusal.
pub fn expect_conflict<T: std::fmt::Debug>(result: runkeep::Result<T>, what: &str) {
    match result {
        Err(runkeep::Error::Conflict { .. }) => {}
        Err(other) => panic!("{what}: expected a conflict, got: {other}"),
        Ok(v) => panic!("{what}: expected a conflict; the call resolved: {v:?}"),
    }
}

/// Everything a store says about one run, read through the contract: what
/// "leaves nothing behind" and the differential test compare.
#[derive(Clone, PartialEq, Debug)]
pub struct ReadBack {
    /// Every checkpoint, in the total order.
    pub checkpoints: Vec<Checkpoint>,
    /// The transcript (strict read).
    pub events: Vec<PersistedEvent>,
    /// The transcript's head.
    pub last_seq: u64,
    /// The run record.
    pub record: Option<RunRecord>,
    /// The message snapshot.
    pub messages: MessageSnapshot,
    /// The report.
    pub report: Option<String>,
    /// The audit trail.
    pub audit: Vec<AuditRecord>,
    /// The lifecycle.
    pub lifecycle: Lifecycle,
    /// The top holding at the read's instant.
    pub lease: Option<LeaseSummary>,
    /// The run's listing row at the read's instant (`None`: not listed).
    pub row: Option<RunRow>,
}

/// Reads back everything about `scope` at `now` (the row from a listing of
/// the run's session).
pub async fn read_back(store: &Arc<dyn RunStore>, scope: &RunScope, now: Timestamp) -> ReadBack {
    let ctx = |what: &str, e: runkeep::Error| -> ReadBack {
        panic!("reading back {what} of {scope} failed: {e}")
    };
    let events = match store
        .read_events(
            scope,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        )
        .await
    {
        Ok(b) => b,
        Err(e) => return ctx("the transcript", e),
    };
    let session = scope.session_scope();
    let rows = walk(
        store,
        &session,
        ListOptions::default(),
        now.as_millis() - NOW,
    )
    .await;
    ReadBack {
        checkpoints: store
            .list_checkpoints(scope)
            .await
            .unwrap_or_else(|e| panic!("reading back the checkpoints of {scope} failed: {e}")),
        events: events.events,
        last_seq: events.last_seq,
        record: store
            .read_run_record(scope)
            .await
            .unwrap_or_else(|e| panic!("reading back the run record of {scope} failed: {e}")),
        messages: store
            .read_messages(scope)
            .await
            .unwrap_or_else(|e| panic!("reading back the messages of {scope} failed: {e}")),
        report: store
            .read_report(scope)
            .await
            .unwrap_or_else(|e| panic!("reading back the report of {scope} failed: {e}")),
        audit: store
            .read_audit(scope, 0)
            .await
            .unwrap_or_else(|e| panic!("reading back the audit of {scope} failed: {e}")),
        lifecycle: store
            .lifecycle(scope)
            .await
            .unwrap_or_else(|e| panic!("reading back the lifecycle of {scope} failed: {e}")),
        lease: store
            .lease(scope, now)
            .await
            .unwrap_or_else(|e| panic!("reading back the lease of {scope} failed: {e}")),
        row: rows.into_iter().find(|r| &r.scope == scope),
    }
}

/// The listing row of `scope` at [`NOW`] + offset (`None`: not listed).
pub async fn row_of(store: &Arc<dyn RunStore>, scope: &RunScope, offset_ms: i64) -> Option<RunRow> {
    walk(store, &listing(), ListOptions::default(), offset_ms)
        .await
        .into_iter()
        .find(|r| &r.scope == scope)
}

/// `claim_next` over the binding's session on the store clock; answers the
/// run taken.
pub async fn next_run(store: &Arc<dyn RunStore>, name: &str) -> Option<RunScope> {
    store
        .claim_next(
            &listing(),
            &runkeep::ClaimNextFilter::default(),
            &claim_now(name, 60_000),
        )
        .await
        .unwrap_or_else(|e| panic!("claim_next for {name} failed: {e}"))
        .map(|(s, _)| s)
}
