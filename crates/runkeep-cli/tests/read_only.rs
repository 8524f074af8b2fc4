//! Commands that only read leave the store directory
//! exactly as it was: no probe file created, linked or unlinked in the
//! store root, no directory created, nothing in any run touched; and so do
//! commands refused as usage errors.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::*;

/// Every entry under `dir` with its size, mtime and ctime (a create, link
/// or unlink in a directory changes that directory's mtime and ctime).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, i64, i64, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let m = std::fs::symlink_metadata(&d).unwrap();
        out.insert(
            d.clone(),
            (
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            ),
        );
        if m.is_dir() {
            for e in std::fs::read_dir(&d).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

#[test]
fn read_commands_and_usage_errors_do_not_change_the_store_directory() {
    let store = Store::seeded();
    // A run with a claim, events and a park, so every reader has work.
    store
        .cmd(&["claim", "run_demo_005", "--holder", "alice"])
        .assert()
        .success();
    let before = snapshot(store.path());
    let reads: &[&[&str]] = &[
        &["runs"],
        &["runs", "--parked"],
        &["show", "run_demo_001"],
        &["checkpoints", "run_demo_001"],
        &["events", "run_demo_001"],
        &["show", "run_does_not_exist"],
        // Usage errors: refused before anything is opened.
        &["runs", "--limit", "nope"],
        &["claim", "run_demo_001", "--ttl", "forever"],
        &["show", "../etc"],
    ];
    for args in reads {
        let _ = store.cmd(args).output().expect("run runkeep");
        let after = snapshot(store.path());
        let changed: Vec<&PathBuf> = before
            .keys()
            .chain(after.keys())
            .filter(|p| before.get(*p) != after.get(*p))
            .collect();
        assert!(
            changed.is_empty(),
            "`runkeep {}` changed the store directory: {changed:?}",
            args.join(" ")
        );
    }
}

#[test]
fn reading_a_missing_store_does_not_create_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing-here");
    for args in [&["runs"][..], &["show", "run_x"], &["events", "run_x"]] {
        let out = runkeep()
            .arg("--store")
            .arg(format!("fs:{}", path.display()))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(
            !path.exists(),
            "`runkeep {}` created the store",
            args.join(" ")
        );
    }
}
