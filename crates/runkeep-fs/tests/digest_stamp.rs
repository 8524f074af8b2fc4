//! The digest's freshness stamp notices a checkpoint rewritten in place:
//! truncating a checkpoint file or overwriting it with
//! garbage — same name, same inode, no rename, so the checkpoints
//! directory itself does not change — must not leave the listing showing
//! the run as healthy while reading its checkpoints fails.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use common::*;
use runkeep::{CheckpointStore, ListOptions, ListingScope, RunRow};
use runkeep_fs::FsStore;

fn row(store: &FsStore, run: &str) -> RunRow {
    let page = rt()
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &ListOptions::default()))
        .unwrap();
    page.entries
        .into_iter()
        .find(|r| r.scope.run_id.as_str() == run)
        .unwrap_or_else(|| panic!("{run} not listed"))
}

/// A run with two checkpoints, listed once (healthy, from a fresh digest).
fn healthy_run(base: &Path, run: &str) -> (FsStore, std::path::PathBuf) {
    let store = open(base);
    let rt = rt();
    let s = scope(run);
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), None))
        .unwrap();
    rt.block_on(store.write_checkpoint(&s, &cp("cp_b", 2), None))
        .unwrap();
    let r = row(&store, run);
    assert_eq!(r.damaged, None, "{r:?}");
    assert_eq!(r.checkpoint_count, 2);
    assert!(
        store.run_dir(&s).join(".runkeep/digest.json").exists(),
        "no digest to go stale"
    );
    // Past a coarse timestamp tick, so the rewrite below gets a new ctime.
    std::thread::sleep(Duration::from_millis(20));
    (store, store_file(base, run))
}

fn store_file(base: &Path, run: &str) -> std::path::PathBuf {
    base.join(run).join("checkpoints/cp_a.json")
}

fn assert_flagged(store: &FsStore, run: &str) {
    let s = scope(run);
    let shown = rt().block_on(store.list_checkpoints(&s));
    assert!(shown.is_err(), "the damage is not real: {shown:?}");
    let r = row(store, run);
    let why = r.damaged.clone().unwrap_or_else(|| {
        panic!("the listing shows the damaged run as healthy: {r:?} (show says: {shown:?})")
    });
    assert!(why.contains("cp_a.json"), "{why}");
}

/// Truncated in place (`set_len`): size and mtime change.
#[test]
fn a_checkpoint_truncated_in_place_flags_the_run() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let (store, file) = healthy_run(&base, "run_cut");
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(10)
        .unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap()),
        ino
    );
    assert_flagged(&store, "run_cut");
}

/// Overwritten in place with garbage of the same length, the old mtime put
/// back: same name, inode, size and mtime. Only the change time (which no
/// unprivileged writer can set back) shows it.
#[test]
fn a_checkpoint_overwritten_in_place_with_its_mtime_restored_flags_the_run() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let (store, file) = healthy_run(&base, "run_garbage");
    let meta = std::fs::metadata(&file).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&vec![b'#'; meta.len() as usize]).unwrap();
    f.set_times(std::fs::FileTimes::new().set_modified(meta.modified().unwrap()))
        .unwrap();
    drop(f);
    let now = std::fs::metadata(&file).unwrap();
    assert_eq!(now.len(), meta.len());
    assert_eq!(now.modified().unwrap(), meta.modified().unwrap());
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&now),
        std::os::unix::fs::MetadataExt::ino(&meta)
    );
    assert_flagged(&store, "run_garbage");
}

/// Overwritten in place keeping its size, mtime not restored.
#[test]
fn a_checkpoint_overwritten_in_place_flags_the_run() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let (store, file) = healthy_run(&base, "run_over");
    let len = std::fs::metadata(&file).unwrap().len() as usize;
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all(&vec![b'#'; len]).unwrap();
    drop(f);
    assert_flagged(&store, "run_over");
}

/// The flag is not sticky: a writer replacing the damaged checkpoint (by
/// rename) makes the run healthy again, and an untouched run keeps using
/// its digest (listing twice changes nothing on disk).
#[test]
fn a_repaired_run_lists_healthy_again_and_listing_writes_nothing() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let (store, file) = healthy_run(&base, "run_fix");
    let before = tree(&base);
    assert_eq!(row(&store, "run_fix").damaged, None);
    assert_eq!(tree(&base), before, "a listing changed the tree");
    // The untouched run is listed from its digest (the extended stamp still
    // matches after the writer's incremental update): a planted count shows.
    let digest = base.join("run_fix/.runkeep/digest.json");
    let text = std::fs::read_to_string(&digest).unwrap();
    assert!(text.contains("\"checkpointCount\":2"), "{text}");
    std::fs::write(
        &digest,
        text.replace("\"checkpointCount\":2", "\"checkpointCount\":7"),
    )
    .unwrap();
    assert_eq!(
        row(&store, "run_fix").checkpoint_count,
        7,
        "the fresh digest was not used"
    );
    std::fs::write(&digest, text).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(3)
        .unwrap();
    assert_flagged(&store, "run_fix");
    rt().block_on(store.write_checkpoint(&scope("run_fix"), &cp("cp_a", 1), None))
        .unwrap();
    let r = row(&store, "run_fix");
    assert_eq!(r.damaged, None, "{r:?}");
    assert_eq!(r.checkpoint_count, 2);
}
