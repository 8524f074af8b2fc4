//! A directory shared with the reference implementation.
//! The reference writes checkpoints without a fence stamp; runkeep stamps
//! every checkpoint it writes. After a takeover in either direction, the
//! takeover's checkpoint must be what `latest_checkpoint`, `resume_point`
//! and the listing's latest name, so a worker resuming the run continues
//! from the newest holder's progress (rule: `runkeep::checkpoint` module
//! docs, "Unstamped checkpoints among stamped ones").
//!
//! The reference's side is written here exactly as the reference writes it
//! (its holding bodies and its pretty-printed, `schemaVersion`-stamped
//! checkpoint without `fence`; see `tests/fixtures/reference`).

mod common;

use std::path::Path;

use common::*;
use runkeep::{CheckpointStore, ClaimOptions, ClaimOutcome, ListOptions, ListingScope, Ttl};
use serde_json::json;

/// A checkpoint as the reference writes it: no `fence`.
fn reference_checkpoint(base: &Path, run: &str, id: &str, created_at: i64, step: u64) {
    let dir = base.join(run).join("checkpoints");
    std::fs::create_dir_all(&dir).unwrap();
    let body = json!({
        "id": id,
        "runId": run,
        "runCreatedAt": 1_000,
        "iteration": step,
        "createdAt": created_at,
        "schemaVersion": 1,
    });
    std::fs::write(
        dir.join(format!("{id}.json")),
        serde_json::to_vec_pretty(&body).unwrap(),
    )
    .unwrap();
}

/// A reference claim: the next holding, linked as the reference does.
fn reference_claim(base: &Path, run: &str, fence: u64, holder: &str, expires_at: i64) {
    let dir = base.join(run).join("claims");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!(".tmp-ref-{fence}"));
    std::fs::write(
        &tmp,
        serde_json::to_vec(&json!({"holder": holder, "expiresAt": expires_at})).unwrap(),
    )
    .unwrap();
    std::fs::hard_link(&tmp, dir.join(format!("{fence}.json"))).unwrap();
    std::fs::remove_file(&tmp).unwrap();
}

fn listing_latest(store: &runkeep_fs::FsStore, run: &str) -> String {
    let rt = rt();
    let page = rt
        .block_on(store.list_runs(
            &ListingScope::session(tenant(), project(), session()),
            &ListOptions::default(),
        ))
        .unwrap();
    page.entries
        .iter()
        .find(|r| r.scope.run_id.as_str() == run)
        .and_then(|r| r.latest_checkpoint_id.as_ref())
        .map(|id| id.to_string())
        .unwrap_or_default()
}

#[test]
fn a_reference_worker_taking_a_run_over_from_runkeep_is_resumed_from() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let run = "run_mixed_a";
    let s = scope(run);
    let t0 = now_ms();
    // runkeep works the run through fences 1..5 (renewals), checkpointing.
    let mut fence = None;
    for i in 0..5 {
        let got = rt
            .block_on(store.claim(&s, &opts("rk", 1_000, t0 + i)))
            .unwrap();
        let ClaimOutcome::Acquired(l) = got else {
            panic!("{got:?}")
        };
        fence = Some(l.fence);
    }
    let fence = fence.unwrap();
    assert_eq!(fence.get(), 5);
    rt.block_on(store.write_checkpoint(&s, &cp("cp_rk_step1", t0 + 10), Some(fence)))
        .unwrap();
    rt.block_on(store.write_checkpoint(&s, &cp("cp_rk_step2", t0 + 20), Some(fence)))
        .unwrap();
    // Let the listing's digest see the runkeep state first, so the test also
    // covers a digest that must notice the reference's write.
    assert_eq!(listing_latest(&store, run), "cp_rk_step2");
    // The runkeep worker stalls; a reference worker takes over (fence 6)
    // and checkpoints its progress, unstamped.
    reference_claim(&base, run, 6, "ref-host:42:abc", t0 + 60_000);
    reference_checkpoint(&base, run, "cp_ref_step3", t0 + 30, 3);

    let latest = rt.block_on(store.latest_checkpoint(&s)).unwrap().unwrap();
    assert_eq!(latest.id.as_str(), "cp_ref_step3");
    assert_eq!(latest.fence, None, "the stored checkpoint is not rewritten");
    let resume = rt
        .block_on(store.resume_point(&s, at(t0 + 40)))
        .unwrap()
        .unwrap();
    assert_eq!(resume.id.as_str(), "cp_ref_step3");
    assert_eq!(listing_latest(&store, run), "cp_ref_step3");
    // The order of the whole run.
    let ids: Vec<String> = rt
        .block_on(store.list_checkpoints(&s))
        .unwrap()
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(ids, ["cp_rk_step1", "cp_rk_step2", "cp_ref_step3"]);

    // The reverse: the reference worker dies; runkeep takes the run back
    // (fence 7) and resumes from the reference's checkpoint.
    let back = rt
        .block_on(store.claim(&s, &opts("rk2", 60_000, t0 + 70_000)))
        .unwrap();
    let ClaimOutcome::Acquired(l) = back else {
        panic!("{back:?}")
    };
    assert_eq!(l.fence.get(), 7);
    rt.block_on(store.write_checkpoint(&s, &cp("cp_rk_step4", t0 + 70_010), Some(l.fence)))
        .unwrap();
    assert_eq!(
        rt.block_on(store.latest_checkpoint(&s))
            .unwrap()
            .unwrap()
            .id
            .as_str(),
        "cp_rk_step4"
    );
    assert_eq!(listing_latest(&store, run), "cp_rk_step4");
}

#[test]
fn runkeep_taking_a_reference_run_over_is_latest_and_a_reference_takeback_again() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let run = "run_mixed_b";
    let s = scope(run);
    let t0 = now_ms();
    // The reference owns the run first (fences 1, 2), checkpointing.
    reference_claim(&base, run, 1, "ref-host:1:a", t0 + 5);
    reference_checkpoint(&base, run, "cp_ref_1", t0 + 1, 1);
    reference_claim(&base, run, 2, "ref-host:1:a", t0 + 10);
    reference_checkpoint(&base, run, "cp_ref_2", t0 + 8, 2);
    // Its lease lapses; runkeep takes over at fence 3.
    let got = rt
        .block_on(store.claim(
            &s,
            &ClaimOptions::new(holder("rk"), Ttl::from_millis(1_000).unwrap()).at(at(t0 + 20)),
        ))
        .unwrap();
    let ClaimOutcome::Acquired(l) = got else {
        panic!("{got:?}")
    };
    assert_eq!(l.fence.get(), 3);
    rt.block_on(store.write_checkpoint(&s, &cp("cp_rk_3", t0 + 21), Some(l.fence)))
        .unwrap();
    assert_eq!(
        rt.block_on(store.latest_checkpoint(&s))
            .unwrap()
            .unwrap()
            .id
            .as_str(),
        "cp_rk_3"
    );
    assert_eq!(listing_latest(&store, run), "cp_rk_3");
    // And the reference takes it back (fence 4) and checkpoints.
    reference_claim(&base, run, 4, "ref-host:2:b", t0 + 60_000);
    reference_checkpoint(&base, run, "cp_ref_4", t0 + 2_000, 4);
    assert_eq!(
        rt.block_on(store.latest_checkpoint(&s))
            .unwrap()
            .unwrap()
            .id
            .as_str(),
        "cp_ref_4"
    );
    assert_eq!(listing_latest(&store, run), "cp_ref_4");
    let ids: Vec<String> = rt
        .block_on(store.list_checkpoints(&s))
        .unwrap()
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(ids, ["cp_ref_1", "cp_ref_2", "cp_rk_3", "cp_ref_4"]);
}
