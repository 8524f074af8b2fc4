//! Regression tests for the reference's fixed defects that concern the
//! shared rules (spec §8.1), run against the reference model.

use runkeep::{
    Checkpoint, CheckpointId, ListOptions, ListingScope, MemoryStore, ParkState, PendingDecision,
    RunScope, Timestamp,
};
use runkeep::{CheckpointStore, RunStore};
use serde_json::Map;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms).unwrap()
}

fn scope(tenant: &str, run: &str) -> RunScope {
    RunScope::new(
        tenant.parse().unwrap(),
        "prj_x".parse().unwrap(),
        "ses_x".parse().unwrap(),
        run.parse().unwrap(),
    )
}

fn parked(id: &str) -> Checkpoint {
    Checkpoint::new(CheckpointId::new(id).unwrap(), at(10), Map::new())
        .with_pending(PendingDecision::new("plan_approval", Map::new(), at(10)))
}

/// An approval inbox — three parked runs over two tenants (one a
/// sub-run) and an unparked run ⇒ exactly the tenant's two parked runs, the
/// sub-run with its parent.
#[tokio::test]
async fn the_approval_inbox_lists_exactly_the_tenants_parked_runs() {
    let store = MemoryStore::new();
    let parent = scope("tnt_a", "run_parent");
    let child = scope("tnt_a", "run_child").with_parent(parent.run_id.clone());
    store
        .write_checkpoint(&parent, &parked("cp_p"), None)
        .await
        .unwrap();
    store
        .write_checkpoint(&child, &parked("cp_c"), None)
        .await
        .unwrap();
    store
        .write_checkpoint(&scope("tnt_b", "run_other"), &parked("cp_o"), None)
        .await
        .unwrap();
    store
        .write_checkpoint(
            &scope("tnt_a", "run_plain"),
            &Checkpoint::new(CheckpointId::new("cp_x").unwrap(), at(1), Map::new()),
            None,
        )
        .await
        .unwrap();
    let page = store
        .list_runs(
            &ListingScope::tenant("tnt_a".parse().unwrap()),
            &ListOptions {
                park: Some(vec![ParkState::Outstanding]),
                now: Some(at(20)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let rows: Vec<(String, Option<String>)> = page
        .entries
        .iter()
        .map(|r| {
            (
                r.scope.run_id.to_string(),
                r.scope.parent_run_id.as_ref().map(ToString::to_string),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("run_child".into(), Some("run_parent".into())),
            ("run_parent".into(), None)
        ]
    );
}

/// The store is usable as `Arc<dyn RunStore>` (dyn-compatible contract).
#[tokio::test]
async fn the_contract_is_dyn_compatible() {
    let store: std::sync::Arc<dyn RunStore> = std::sync::Arc::new(MemoryStore::new());
    assert!(store
        .lease(&scope("tnt_a", "run_a"), at(0))
        .await
        .unwrap()
        .is_none());
}
