//! Whole-file records are stored compact: a record takes on disk about what
//! its JSON body is, whatever its nesting. (Pretty-printed, a 240 KB body
//! nested 100 deep was a 23.9 MB file: every value on its own line behind
//! up to 200 spaces of indentation.)

mod common;

use common::{at, open, rt, scope};
use runkeep::{Checkpoint, CheckpointId, CheckpointStore, EvidenceStore, RunRecord};
use serde_json::{json, Map, Value};

/// `[[[…[0,0,…,0]…]]]`: `depth` arrays around `zeros` zeros, about
/// `2 × zeros` bytes.
fn nested(depth: usize, zeros: usize) -> Value {
    let mut v = Value::Array(vec![json!(0); zeros]);
    for _ in 1..depth {
        v = Value::Array(vec![v]);
    }
    v
}

fn file_len(path: &std::path::Path) -> usize {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len() as usize
}

#[test]
fn a_deeply_nested_checkpoint_is_stored_within_a_tenth_of_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = scope("nested");
    let mut state = Map::new();
    state.insert("x".into(), nested(99, 120_000));
    let cp = Checkpoint::new(CheckpointId::new("deep").unwrap(), at(1), state);
    let body = serde_json::to_vec(&cp.state).unwrap().len();
    assert!(body > 200_000, "{body}");
    rt().block_on(store.write_checkpoint(&s, &cp, None))
        .unwrap();
    let stored = file_len(&dir.path().join("nested/checkpoints/deep.json"));
    assert!(
        stored as f64 <= 1.1 * body as f64,
        "a {body}-byte nested state was stored as {stored} bytes"
    );
    // And it reads back as written.
    let back = rt()
        .block_on(store.read_checkpoint(&s, &cp.id))
        .unwrap()
        .unwrap();
    assert_eq!(back.state, cp.state);
}

#[test]
fn a_deeply_nested_run_record_is_stored_within_a_tenth_of_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = scope("nested");
    let record: RunRecord = serde_json::from_value(json!({
        "id": "nested",
        "status": "running",
        "createdAt": 1,
        "deep": nested(99, 120_000),
    }))
    .unwrap();
    let body = serde_json::to_vec(&record).unwrap().len();
    rt().block_on(store.write_run_record(&s, &record, None))
        .unwrap();
    let stored = file_len(&dir.path().join("nested/run.json"));
    assert!(
        stored as f64 <= 1.1 * body as f64,
        "a {body}-byte nested run record was stored as {stored} bytes"
    );
}
