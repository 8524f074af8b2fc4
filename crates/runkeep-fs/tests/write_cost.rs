//! A fenced checkpoint write does O(1) file-system work on the checkpoints
//! directory: with the stored digest fresh, writing into
//! a run that already has 2 000 checkpoints lists the directory 0 times and
//! stats a bounded number of entries, and the digest it leaves behind is
//! exact (a listing answers from it without reading a checkpoint file).

mod common;

use common::*;
use runkeep::{CheckpointStore, ClaimOutcome, ListOptions, ListingScope, Ttl};
use runkeep_fs::testing::{checkpoint_dir_listings, checkpoint_dir_stats, checkpoint_reads};

/// Checkpoints already in the run before the measured writes.
const EXISTING: usize = 2_000;
/// Stats per write allowed: the directory before and after the rename,
/// the target name before and after it.
const STATS_PER_WRITE: u64 = 4;

#[test]
fn a_fenced_write_into_a_big_run_lists_nothing_and_stats_a_bounded_number() {
    let dir = tempdir();
    let store = open(dir.path());
    let rt = rt();
    let s = scope("run_big");
    let lease = match rt
        .block_on(store.claim(
            &s,
            &runkeep::ClaimOptions::new(holder("w1"), Ttl::from_millis(600_000).unwrap()),
        ))
        .unwrap()
    {
        ClaimOutcome::Acquired(l) => l,
        other => panic!("not acquired: {other:?}"),
    };
    let fence = Some(lease.fence);
    for i in 0..EXISTING {
        rt.block_on(store.write_checkpoint(&s, &cp(&format!("cp_{i:05}"), i as i64), fence))
            .unwrap();
    }
    let run_dir = store.run_dir(&s);

    // One new checkpoint, and one replacing an existing one.
    let (l0, s0, r0) = (
        checkpoint_dir_listings(&run_dir),
        checkpoint_dir_stats(&run_dir),
        checkpoint_reads(&run_dir),
    );
    rt.block_on(store.write_checkpoint(&s, &cp("cp_new", 5_000), fence))
        .unwrap();
    rt.block_on(store.write_checkpoint(&s, &cp("cp_00007", 5_001), fence))
        .unwrap();
    let listings = checkpoint_dir_listings(&run_dir) - l0;
    let stats = checkpoint_dir_stats(&run_dir) - s0;
    let reads = checkpoint_reads(&run_dir) - r0;
    assert_eq!(
        listings, 0,
        "two writes listed the checkpoints directory {listings} times"
    );
    assert!(
        stats <= 2 * STATS_PER_WRITE,
        "two writes made {stats} stats on the checkpoints directory (bound {})",
        2 * STATS_PER_WRITE
    );
    assert_eq!(reads, 0, "two writes parsed {reads} checkpoint files");

    // The incrementally stamped digest matches the reader's full check: the
    // row comes from it (no checkpoint parsed) and is right.
    let r1 = checkpoint_reads(&run_dir);
    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &ListOptions::default()))
        .unwrap();
    let row = page
        .entries
        .iter()
        .find(|r| r.scope.run_id.as_str() == "run_big")
        .unwrap();
    assert_eq!(row.damaged, None, "{row:?}");
    assert_eq!(row.checkpoint_count, EXISTING as u64 + 1);
    assert_eq!(
        checkpoint_reads(&run_dir) - r1,
        0,
        "the listing did not trust the digest the writes left: its stamp is not exact"
    );
    // And the reader's full check did list the directory (it is not skipped).
    assert!(checkpoint_dir_listings(&run_dir) > l0);
}

/// A sidecar left in the meta directory by a writer that died before its
/// rename is not a checkpoint, does not stale the digest, and is reported
/// by nothing but the doctor's scratch sweep.
#[test]
fn a_leftover_checkpoint_sidecar_is_ignored() {
    let dir = tempdir();
    let store = open(dir.path());
    let rt = rt();
    let s = scope("run_left");
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), None))
        .unwrap();
    let run_dir = store.run_dir(&s);
    std::fs::write(
        run_dir.join(".runkeep/cp_b.json.1.1.abcdefgh.tmp"),
        b"{\"half\":",
    )
    .unwrap();
    let r0 = checkpoint_reads(&run_dir);
    let all = rt.block_on(store.list_checkpoints(&s)).unwrap();
    assert_eq!(all.len(), 1);
    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &ListOptions::default()))
        .unwrap();
    let row = page
        .entries
        .iter()
        .find(|r| r.scope.run_id.as_str() == "run_left")
        .unwrap();
    assert_eq!(row.damaged, None, "{row:?}");
    assert_eq!(row.checkpoint_count, 1);
    // The listing started the session index's build, which reads every run
    // on its own thread: let it finish, so only the write below is counted.
    let _ = store.testing().wait_index();
    assert_eq!(
        checkpoint_reads(&run_dir) - r0,
        1,
        "only list_checkpoints read"
    );
    // The next write is still incremental (the leftover is outside the
    // checkpoints directory).
    let l0 = checkpoint_dir_listings(&run_dir);
    rt.block_on(store.write_checkpoint(&s, &cp("cp_c", 2), None))
        .unwrap();
    assert_eq!(checkpoint_dir_listings(&run_dir) - l0, 0);
}
