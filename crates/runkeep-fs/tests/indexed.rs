//! The indexed answers (contract v2): `latest_checkpoint`,
//! `find_pending` and `resume_point` answer from the run's digest and read
//! one checkpoint file; they agree with the full read on mixed runs
//! (unstamped reference-style checkpoints, stamped ones, parks), and fall
//! back to the full read when the digest cannot be trusted.

mod common;

use common::*;
use runkeep::checkpoint::sort_checkpoints;
use runkeep::park;
use runkeep::PendingDecision;
use runkeep::{Checkpoint, CheckpointStore, RunScope, Timestamp};
use runkeep_fs::testing::checkpoint_reads;
use runkeep_fs::FsStore;
use serde_json::Map;

fn parked(id: &str, created: i64, deadline: Option<i64>) -> Checkpoint {
    let mut p = PendingDecision::new("approval", Map::new(), at(created));
    if let Some(d) = deadline {
        p = p.with_deadline(at(d));
    }
    cp(id, created).with_pending(p)
}

/// A run mixing unstamped checkpoints (written before any claim, as the
/// reference writes them), stamped ones, an outstanding park, an expired
/// one and an answered one.
fn mixed_run(store: &FsStore, s: &RunScope) {
    let rt = rt();
    rt.block_on(store.write_checkpoint(s, &cp("a_unstamped", 5_000), None))
        .unwrap();
    rt.block_on(store.write_checkpoint(s, &parked("b_park_old", 6_000, None), None))
        .unwrap();
    let l = rt
        .block_on(store.claim(s, &opts("w", 600_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(store.write_checkpoint(s, &cp("c_stamped", 1_000), Some(l.fence)))
        .unwrap();
    rt.block_on(store.write_checkpoint(
        s,
        &parked("d_park_deadline", 2_000, Some(50_000)),
        Some(l.fence),
    ))
    .unwrap();
    rt.block_on(store.write_checkpoint(s, &parked("e_park_answered", 3_000, None), Some(l.fence)))
        .unwrap();
    rt.block_on(store.resolve_park(
        s,
        &runkeep::CheckpointId::new("e_park_answered").unwrap(),
        runkeep::ParkResolution::Answer(serde_json::json!({"approved": true})),
        at(3_500),
        Some(l.fence),
    ))
    .unwrap();
}

fn full(store: &FsStore, s: &RunScope, now: Timestamp) -> (Option<Checkpoint>, Option<Checkpoint>) {
    let rt = rt();
    let mut cps = rt.block_on(store.list_checkpoints(s)).unwrap();
    sort_checkpoints(&mut cps);
    let pending = park::find_pending(&cps, now).cloned();
    (cps.pop(), pending)
}

#[test]
fn the_indexed_answers_agree_with_the_full_read_and_read_one_checkpoint() {
    let dir = tempdir();
    let store = open(dir.path());
    let rt = rt();
    let s = scope("run_indexed");
    mixed_run(&store, &s);
    let run_dir = store.run_dir(&s);
    assert!(
        run_dir.join(".runkeep/digest.json").exists(),
        "the writes keep a digest"
    );
    for now in [10_000, 49_999, 50_000, 90_000] {
        let now = at(now);
        let (latest, pending) = full(&store, &s, now);
        let before = checkpoint_reads(&run_dir);
        let got_latest = rt.block_on(store.latest_checkpoint(&s)).unwrap();
        let after_latest = checkpoint_reads(&run_dir);
        let got_pending = rt.block_on(store.find_pending(&s, now)).unwrap();
        let after_pending = checkpoint_reads(&run_dir);
        let got_resume = rt.block_on(store.resume_point(&s, now)).unwrap();
        assert_eq!(got_latest, latest, "latest at {now:?}");
        assert_eq!(got_pending, pending, "pending at {now:?}");
        assert_eq!(
            got_resume,
            pending.clone().or(latest.clone()),
            "resume at {now:?}"
        );
        assert_eq!(after_latest - before, 1, "latest read one checkpoint");
        assert_eq!(
            after_pending - after_latest,
            u64::from(pending.is_some()),
            "pending read at most the one chosen checkpoint"
        );
    }
}

#[test]
fn a_digest_that_cannot_be_trusted_falls_back_to_the_full_read() {
    let dir = tempdir();
    let store = open(dir.path());
    let rt = rt();
    let s = scope("run_stale");
    mixed_run(&store, &s);
    let run_dir = store.run_dir(&s);
    // A checkpoint written by another tool behind the digest's back (the
    // reference does not keep it): the stamp no longer matches.
    let foreign = cp("z_foreign", 999_000);
    let mut m = foreign.to_json();
    m.insert("schemaVersion".into(), 1.into());
    std::fs::write(
        run_dir.join("checkpoints/z_foreign.json"),
        serde_json::to_vec_pretty(&serde_json::Value::Object(m)).unwrap(),
    )
    .unwrap();
    let now = at(10_000);
    let (latest, pending) = full(&store, &s, now);
    let before = checkpoint_reads(&run_dir);
    assert_eq!(rt.block_on(store.latest_checkpoint(&s)).unwrap(), latest);
    assert!(
        checkpoint_reads(&run_dir) - before > 1,
        "a stale digest is not trusted: every checkpoint is read"
    );
    assert_eq!(
        latest.as_ref().map(|c| c.id.as_str()),
        Some("z_foreign"),
        "the foreign checkpoint is the latest"
    );
    assert_eq!(rt.block_on(store.find_pending(&s, now)).unwrap(), pending);
    std::fs::remove_file(run_dir.join(".runkeep/digest.json")).unwrap();
    assert_eq!(rt.block_on(store.latest_checkpoint(&s)).unwrap(), latest);
    assert_eq!(
        rt.block_on(store.resume_point(&s, now)).unwrap(),
        pending.or(latest)
    );
    // A run with no checkpoints at all.
    let empty = scope("run_empty");
    assert_eq!(rt.block_on(store.latest_checkpoint(&empty)).unwrap(), None);
    assert_eq!(rt.block_on(store.find_pending(&empty, now)).unwrap(), None);
}
