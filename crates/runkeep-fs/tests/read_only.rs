//! A store opened with `FsOptions::read_only` reads
//! everything and changes nothing: opening creates, probes and links
//! nothing, and every write is refused as `Unsupported` before it touches
//! the directory (fenced or not, stale fence or not).

mod common;

use common::*;
use runkeep::{
    CheckpointStore, ClaimOutcome, Error, EvidenceStore, ListOptions, ListingScope, NewEvent,
    ParkResolution, ReadEventsOptions,
};
use runkeep_fs::{FsOptions, FsStore};

#[test]
fn a_read_only_store_reads_and_refuses_every_write_without_touching_the_directory() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let rw = open(&base);
    let rt = rt();
    let s = scope("run_ro");
    let ClaimOutcome::Acquired(l) = rt
        .block_on(rw.claim(&s, &opts("w", 60_000, now_ms())))
        .unwrap()
    else {
        panic!("claim")
    };
    rt.block_on(rw.write_checkpoint(&s, &cp("cp_1", 1), Some(l.fence)))
        .unwrap();
    rt.block_on(rw.append_events(
        &s,
        &[NewEvent::new("step", Default::default())],
        Some(l.fence),
    ))
    .unwrap();
    let before = tree(&base);

    let ro = FsStore::open(
        &base,
        FsOptions {
            attribution: Some(attribution()),
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        tree(&base),
        before,
        "opening read-only changed the directory"
    );
    // Reads work.
    assert_eq!(
        rt.block_on(ro.latest_checkpoint(&s))
            .unwrap()
            .unwrap()
            .id
            .as_str(),
        "cp_1"
    );
    assert_eq!(
        rt.block_on(ro.read_events(&s, &ReadEventsOptions::default()))
            .unwrap()
            .events
            .len(),
        1
    );
    let page = rt
        .block_on(ro.list_runs(
            &ListingScope::session(tenant(), project(), session()),
            &ListOptions::default(),
        ))
        .unwrap();
    assert_eq!(page.entries.len(), 1);
    // Every write is refused, whatever fence it presents.
    let stale = runkeep::Fence::new(l.fence.get() + 5).unwrap();
    let refusals: Vec<(&str, runkeep::Result<()>)> = vec![
        (
            "claim",
            rt.block_on(ro.claim(&s, &opts("x", 60_000, now_ms() + 120_000)))
                .map(|_| ()),
        ),
        ("release", rt.block_on(ro.release(&s, l.fence)).map(|_| ())),
        (
            "write_checkpoint",
            rt.block_on(ro.write_checkpoint(&s, &cp("cp_2", 2), Some(l.fence)))
                .map(|_| ()),
        ),
        (
            "unfenced write_checkpoint",
            rt.block_on(ro.write_checkpoint(&s, &cp("cp_3", 3), None))
                .map(|_| ()),
        ),
        (
            "write_checkpoint with a never-issued fence",
            rt.block_on(ro.write_checkpoint(&s, &cp("cp_4", 4), Some(stale)))
                .map(|_| ()),
        ),
        (
            "append_events",
            rt.block_on(ro.append_events(
                &s,
                &[NewEvent::new("x", Default::default())],
                Some(l.fence),
            ))
            .map(|_| ()),
        ),
        (
            "delete_checkpoint",
            rt.block_on(ro.delete_checkpoint(
                &s,
                &runkeep::CheckpointId::new("cp_1").unwrap(),
                Some(l.fence),
            ))
            .map(|_| ()),
        ),
        (
            "prune_checkpoints",
            rt.block_on(ro.prune_checkpoints(&s, 0, Some(l.fence)))
                .map(|_| ()),
        ),
        (
            "resolve_park",
            rt.block_on(ro.resolve_park(
                &s,
                &runkeep::CheckpointId::new("cp_1").unwrap(),
                ParkResolution::Answer(serde_json::json!({"ok": true})),
                at(5),
                Some(l.fence),
            ))
            .map(|_| ()),
        ),
        (
            "write_report",
            rt.block_on(ro.write_report(&s, "# r", Some(l.fence))),
        ),
    ];
    for (what, r) in refusals {
        match r {
            Err(Error::Unsupported { message }) => {
                assert!(message.contains("read-only"), "{what}: {message}")
            }
            other => panic!("{what}: expected a read-only refusal, got {other:?}"),
        }
        assert_eq!(tree(&base), before, "{what} changed the directory");
    }
}

#[test]
fn opening_a_missing_directory_read_only_creates_nothing() {
    let dir = tempdir();
    let base = dir.path().join("absent");
    let e = FsStore::open(
        &base,
        FsOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(!base.exists());
}

/// A run directory that is a symbolic link to somewhere
/// outside the store is neither read nor written through: every operation
/// on it is refused and nothing appears outside the store (before the fix,
/// `claim` wrote `claims/1.json` into the link's target).
#[test]
fn a_run_directory_linked_outside_the_store_is_never_followed() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(outside.join("checkpoints")).unwrap();
    std::fs::write(
        outside.join("checkpoints/cp_x.json"),
        br#"{"id":"cp_x","createdAt":1,"schemaVersion":1}"#,
    )
    .unwrap();
    std::os::unix::fs::symlink(&outside, base.join("run_linked")).unwrap();
    // A sub-run whose parent's children/ directory is the link.
    std::fs::create_dir_all(base.join("run_parent")).unwrap();
    std::os::unix::fs::symlink(&outside, base.join("run_parent/children")).unwrap();
    let outside_before = tree(&outside);
    for s in [scope("run_linked"), child_scope("run_sub", "run_parent")] {
        let results: Vec<(&str, Result<(), Error>)> = vec![
            (
                "claim",
                rt.block_on(store.claim(&s, &opts("w", 60_000, now_ms())))
                    .map(|_| ()),
            ),
            (
                "list_checkpoints",
                rt.block_on(store.list_checkpoints(&s)).map(|_| ()),
            ),
            (
                "write_checkpoint",
                rt.block_on(store.write_checkpoint(&s, &cp("cp_1", 1), None))
                    .map(|_| ()),
            ),
            (
                "append_events",
                rt.block_on(store.append_events(
                    &s,
                    &[NewEvent::new("x", Default::default())],
                    None,
                ))
                .map(|_| ()),
            ),
            (
                "read_events",
                rt.block_on(store.read_events(&s, &ReadEventsOptions::default()))
                    .map(|_| ()),
            ),
            ("lease", rt.block_on(store.lease(&s, at(1))).map(|_| ())),
        ];
        for (what, r) in results {
            match r {
                Err(Error::Unsupported { message }) => {
                    assert!(message.contains("symbolic link"), "{what}: {message}")
                }
                other => panic!("{what} on {}: expected a refusal, got {other:?}", s.run_id),
            }
        }
    }
    assert_eq!(
        tree(&outside),
        outside_before,
        "something was written outside the store"
    );
    assert!(!outside.join("claims").exists());
}
