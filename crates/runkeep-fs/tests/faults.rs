//! Faults: no hard links (injected errnos and a real exFAT volume), a full
//! disk, a read-only volume, permission denied, failed fsync, damaged files
//! and foreign files in the store's directories. Each gives a clear error
//! naming the run and the operation, and loses nothing already accepted.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use runkeep::{
    CheckpointId, CheckpointStore, Error, EvidenceStore, Integrity, ListingScope, MessageSnapshot,
    NewEvent, ReadEventsOptions,
};
use runkeep_fs::testing::{inject, FaultPoint};
use runkeep_fs::{Durability, FsOptions, FsStore};
use serde_json::{json, Map};

/// Entry point of the worker processes the tests below spawn (this binary
/// re-entered with a role in `RUNKEEP_FS_WORKER`); a no-op otherwise.
#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    assert_eq!(role, "unprivileged");
    unprivileged_worker();
}

const EPERM: i32 = 1;
const EIO: i32 = 5;
const EACCES: i32 = 13;
const EEXIST: i32 = 17;
const ENOSPC: i32 = 28;
const EMLINK: i32 = 31;
const ENOSYS: i32 = 38;
const EOPNOTSUPP: i32 = 95;
const EXDEV: i32 = 18;

fn expect_err<T: std::fmt::Debug>(r: runkeep::Result<T>) -> Error {
    match r {
        Ok(v) => panic!("expected an error, the call resolved: {v:?}"),
        Err(e) => e,
    }
}

fn ev(t: &str) -> NewEvent {
    NewEvent::new(t, Map::new())
}

/// Each no-hard-link errno from `link` is refused as
/// `Unsupported`, naming the errno, the directory and both ways out; with
/// both publish paths; and nothing is published.
#[test]
fn every_no_hard_link_errno_is_refused_with_the_ways_out() {
    for scratch in [false, true] {
        for (code, name) in [
            (EPERM, "EPERM"),
            (EOPNOTSUPP, "ENOTSUP"),
            (ENOSYS, "ENOSYS"),
            (EXDEV, "EXDEV"),
            (EMLINK, "EMLINK"),
        ] {
            let dir = tempdir();
            let base = dir.path().join("runs");
            let store = open(&base);
            if scratch {
                store.testing().force_scratch_publish();
            }
            let _f = inject(FaultPoint::Link, &base, code);
            let e =
                expect_err(rt().block_on(store.claim(&scope("run_a"), &opts("w1", 60_000, 1_000))));
            let msg = e.to_string();
            assert!(matches!(e, Error::Unsupported { .. }), "{msg}");
            for needle in [
                name,
                "claims",
                "hard-link support",
                "single writer per run",
                "run_a",
                "claim",
            ] {
                assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
            }
            let names: Vec<_> = std::fs::read_dir(base.join("run_a/claims"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert!(names.is_empty(), "left behind: {names:?}");
        }
    }
}

/// A volume without hard links is refused when the store opens.
#[test]
fn opening_on_a_volume_without_hard_links_is_refused() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    std::fs::create_dir_all(&base).unwrap();
    let _f = inject(FaultPoint::Link, &base, EPERM);
    let e = FsStore::open(&base, FsOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{msg}");
    for needle in [
        "EPERM",
        "hard-link support",
        "single writer per run",
        &base.display().to_string(),
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
}

/// `ENOSPC` from `link` is not a missing capability: it is
/// reported as the backend error it is.
#[test]
fn enospc_from_link_is_a_backend_error_not_unsupported() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let _f = inject(FaultPoint::Link, &base, ENOSPC);
    let e = expect_err(rt().block_on(store.claim(&scope("run_a"), &opts("w1", 60_000, 1_000))));
    assert!(matches!(e, Error::Backend { .. }), "{e}");
    assert!(e.to_string().contains("ENOSPC"), "{e}");
    assert!(e.to_string().contains("full"), "{e}");
}

/// "Already exists" from the scratch write is a storage
/// error ("scratch name … already exists"), never a lost race (which would
/// answer `Held`/`Contended` for a run nobody holds).
#[test]
fn a_scratch_name_collision_is_an_error_not_a_lost_race() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    store.testing().force_scratch_publish();
    let _f = inject(FaultPoint::ScratchCreate, &base, EEXIST);
    let e = expect_err(rt().block_on(store.claim(&scope("run_a"), &opts("w1", 60_000, 1_000))));
    let msg = e.to_string();
    assert!(matches!(e, Error::Backend { .. }), "{msg}");
    assert!(
        msg.contains("scratch name") && msg.contains("already exists"),
        "{msg}"
    );
}

/// A failing scratch write names the claims directory and the
/// operation, not just a dotted temp file.
#[test]
fn a_failing_scratch_write_names_the_claims_directory_and_operation() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    store.testing().force_scratch_publish();
    let _f = inject(FaultPoint::ScratchCreate, &base, EACCES);
    let e = expect_err(rt().block_on(store.claim(&scope("run_a"), &opts("w1", 60_000, 1_000))));
    let msg = e.to_string();
    assert!(matches!(e, Error::Backend { .. }), "{msg}");
    let claims = base.join("run_a").join("claims").display().to_string();
    assert!(
        msg.contains(&claims) && msg.contains("claim on run run_a"),
        "{msg}"
    );
    assert!(
        msg.contains("EACCES") && msg.contains("permission"),
        "{msg}"
    );
}

/// A mount that is always undone, pass or fail.
struct Mount {
    dir: PathBuf,
    loop_dev: Option<String>,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = sh("umount", &["-l", &self.dir.display().to_string()]);
        if let Some(dev) = &self.loop_dev {
            let _ = sh("losetup", &["-d", dev]);
        }
    }
}

fn tmpfs(dir: &Path, size: &str) -> Mount {
    std::fs::create_dir_all(dir).unwrap();
    sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            &dir.display().to_string(),
        ],
    )
    .expect("mount a tmpfs (root)");
    Mount {
        dir: dir.to_path_buf(),
        loop_dev: None,
    }
}

/// Full disk, injected: `ENOSPC` from a checkpoint write is a backend
/// error that names the run, the operation and the full volume; what was
/// accepted before is still there, nothing is half-written, and once the
/// fault is gone writes succeed again. (The real full volume is the ignored
/// test below.)
#[test]
fn an_injected_enospc_fails_writes_clearly_and_loses_nothing_accepted() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_full");
    let l = rt
        .block_on(store.claim(&s, &opts("w1", 600_000, now_ms())))
        .unwrap()
        .lease()
        .unwrap();
    let f = Some(l.fence);
    rt.block_on(store.write_checkpoint(&s, &big_cp(0), f))
        .unwrap();
    let full = {
        let _g = inject(FaultPoint::Write, &base, ENOSPC);
        expect_err(rt.block_on(store.write_checkpoint(&s, &big_cp(1), f)))
    };
    assert_full_disk_error(&full);
    assert_only_accepted(&store, &base, &s, &["cp_000".to_string()], 0);
    assert_writes_again(&store, &s, f);
}

/// Full disk, for real: a 1 MiB tmpfs filled up. Writes fail with a backend
/// error that names the run, the operation and the full volume; everything
/// accepted before is still there; once space is freed writes succeed
/// again.
#[test]
#[ignore = "needs root: mounts a 1 MiB tmpfs to fill a real volume; scripts/test.sh runs it as root"]
fn a_full_disk_fails_writes_clearly_and_loses_nothing_accepted() {
    assert!(is_root(), "this test mounts a tmpfs: run it as root");
    let dir = tempdir();
    let mnt = dir.path().join("mnt");
    let _mount = tmpfs(&mnt, "1m");
    let base = mnt.join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_full");
    let l = rt
        .block_on(store.claim(&s, &opts("w1", 600_000, now_ms())))
        .unwrap()
        .lease()
        .unwrap();
    let f = Some(l.fence);
    let mut accepted = Vec::new();
    let mut acked_events = 0;
    let filler = mnt.join("filler");
    // Fill the volume, leaving only a little room.
    let _ = std::fs::write(&filler, vec![0u8; 700_000]);
    let mut err = None;
    for i in 0..20 {
        match rt.block_on(store.write_checkpoint(&s, &big_cp(i), f)) {
            Ok(_) => accepted.push(format!("cp_{i:03}")),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
        if rt
            .block_on(store.append_events(&s, &[ev("step")], f))
            .is_ok()
        {
            acked_events += 1;
        }
    }
    let full = err.expect("the volume never filled up");
    assert_full_disk_error(&full);
    assert_only_accepted(&store, &base, &s, &accepted, acked_events);
    // Free space: writing works again.
    let _ = std::fs::remove_file(&filler);
    for id in accepted.iter().skip(1) {
        rt.block_on(store.delete_checkpoint(&s, &CheckpointId::new(id.as_str()).unwrap(), f))
            .unwrap();
    }
    assert_writes_again(&store, &s, f);
}

fn big_cp(i: usize) -> runkeep::Checkpoint {
    let mut c = cp(&format!("cp_{i:03}"), 1000 + i as i64);
    c.state.insert("blob".into(), json!("y".repeat(100_000)));
    c
}

fn assert_full_disk_error(full: &Error) {
    let msg = full.to_string();
    assert!(matches!(full, Error::Backend { .. }), "{msg}");
    for needle in ["write_checkpoint on run run_full", "ENOSPC", "full"] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
}

fn assert_only_accepted(
    store: &FsStore,
    base: &Path,
    s: &runkeep::RunScope,
    accepted: &[String],
    acked_events: usize,
) {
    let rt = rt();
    let ids: Vec<String> = rt
        .block_on(store.list_checkpoints(s))
        .unwrap()
        .iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(
        ids, accepted,
        "accepted checkpoints lost or a refused one half-written"
    );
    let leftovers: Vec<_> = std::fs::read_dir(base.join("run_full/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(
        rt.block_on(store.read_events(s, &Default::default()))
            .unwrap()
            .events
            .len(),
        acked_events
    );
}

fn assert_writes_again(store: &FsStore, s: &runkeep::RunScope, f: Option<runkeep::Fence>) {
    let rt = rt();
    rt.block_on(store.write_checkpoint(s, &cp("cp_after", 9_999), f))
        .unwrap();
    rt.block_on(store.append_events(s, &[ev("after")], f))
        .unwrap();
    let back = rt
        .block_on(store.read_events(
            s,
            &ReadEventsOptions {
                integrity: Integrity::Tolerant,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(back.events.last().unwrap().event_type, "after");
}

/// Read-only volume: the store still opens and reads; every kind of write
/// fails with an error naming the run, the operation and the read-only
/// volume, and changes nothing. (A directory without write permission is
/// `permission_denied_reads_fine_and_refuses_writes_clearly`.)
#[test]
#[ignore = "needs root: mounts a tmpfs and remounts it read-only; scripts/test.sh runs it as root"]
fn a_read_only_volume_reads_fine_and_refuses_writes_clearly() {
    assert!(is_root(), "this test mounts a tmpfs: run it as root");
    let dir = tempdir();
    let mnt = dir.path().join("mnt");
    let _mount = tmpfs(&mnt, "8m");
    let base = mnt.join("runs");
    {
        let store = open(&base);
        let rt = rt();
        let s = scope("run_ro");
        let l = rt
            .block_on(store.claim(&s, &opts("w1", 600_000, now_ms())))
            .unwrap()
            .lease()
            .unwrap();
        rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), Some(l.fence)))
            .unwrap();
        rt.block_on(store.append_events(&s, &[ev("one")], Some(l.fence)))
            .unwrap();
    }
    sh("mount", &["-o", "remount,ro", &mnt.display().to_string()]).expect("remount read-only");
    let marker = "read-only";
    let before = tree(&base);
    let store = open(&base);
    let rt = rt();
    let s = scope("run_ro");
    assert_eq!(rt.block_on(store.list_checkpoints(&s)).unwrap().len(), 1);
    assert_eq!(
        rt.block_on(store.read_events(&s, &Default::default()))
            .unwrap()
            .events
            .len(),
        1
    );
    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &Default::default()))
        .unwrap();
    assert_eq!(page.entries.len(), 1);
    let fence = rt.block_on(store.lease(&s, at(0))).unwrap().unwrap().fence;
    let errors = [
        (
            "write_checkpoint",
            expect_err(rt.block_on(store.write_checkpoint(&s, &cp("cp_b", 2), Some(fence)))),
        ),
        (
            "append_events",
            expect_err(rt.block_on(store.append_events(&s, &[ev("two")], Some(fence)))),
        ),
        (
            "claim",
            expect_err(rt.block_on(store.claim(&scope("run_new"), &opts("w2", 1_000, 1)))),
        ),
        (
            "write_report",
            expect_err(rt.block_on(store.write_report(&s, "r", None))),
        ),
    ];
    for (op, e) in errors {
        let msg = e.to_string();
        assert!(matches!(e, Error::Backend { .. }), "{op}: {msg}");
        assert!(msg.contains(op), "{op}: {msg}");
        assert!(msg.contains(marker), "{op}: {msg}");
    }
    assert_eq!(tree(&base), before, "a refused write changed the directory");
}

fn unprivileged_worker() {
    let base = PathBuf::from(env("BASE"));
    let store = match FsStore::open(
        &base,
        runkeep_fs::FsOptions {
            attribution: Some(attribution()),
            ..Default::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => {
            report(format!("open {e}"));
            return;
        }
    };
    let rt = rt();
    let s = scope("run_root");
    let o = |name: &str, r: Result<String, Error>| match r {
        Ok(v) => report(format!("{name} ok {v}")),
        Err(e) => report(format!(
            "{name} {} {}",
            e.kind(),
            e.to_string().replace('\n', " ")
        )),
    };
    o(
        "list",
        rt.block_on(store.list_checkpoints(&s))
            .map(|v| v.len().to_string()),
    );
    o(
        "events",
        rt.block_on(store.read_events(&s, &Default::default()))
            .map(|b| b.events.len().to_string()),
    );
    o(
        "runs",
        rt.block_on(store.list_runs(&ListingScope::tenant(tenant()), &Default::default()))
            .map(|p| p.entries.len().to_string()),
    );
    o(
        "write_checkpoint",
        rt.block_on(store.write_checkpoint(&s, &cp("cp_nobody", 5), None))
            .map(|_| String::new()),
    );
    o(
        "append_events",
        rt.block_on(store.append_events(&s, &[ev("nobody")], None))
            .map(|_| String::new()),
    );
    o(
        "claim",
        rt.block_on(store.claim(&s, &opts("nobody", 60_000, now_ms())))
            .map(|c| format!("{c:?}")),
    );
    report("done");
}

/// Permission denied: a process running as `nobody` against a directory
/// owned by root reads everything and is refused every write with an error
/// naming the run, the operation and the permission problem. (Root ignores
/// file modes, so the process under test runs through
/// `setpriv --reuid=nobody`.)
#[test]
#[ignore = "needs root: runs the store as nobody (setpriv) against a root-owned directory; scripts/test.sh runs it as root"]
fn permission_denied_reads_fine_and_refuses_writes_clearly() {
    assert!(
        is_root(),
        "this test runs a process as another user: run it as root"
    );
    assert!(
        sh("which", &["setpriv"]).is_ok(),
        "setpriv is needed to run a process as nobody (util-linux)"
    );
    let dir = tempdir();
    let base = dir.path().join("runs");
    {
        let store = open(&base);
        let rt = rt();
        rt.block_on(store.write_checkpoint(&scope("run_root"), &cp("cp_a", 1), None))
            .unwrap();
        rt.block_on(store.append_events(&scope("run_root"), &[ev("one")], None))
            .unwrap();
    }
    // Run data is private by default (0600/0700): the owner shares the
    // store for reading, as an operator would.
    assert!(sh("chmod", &["-R", "go+rX", base.to_str().unwrap()]).is_ok());
    let before = tree(&base);
    let reports = spawn_as(
        "unprivileged",
        &[("BASE", base.display().to_string())],
        Some(&[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
        ]),
    )
    .finish(Duration::from_secs(30));
    eprintln!("{reports:?}");
    assert!(reports.contains(&"list ok 1".to_string()), "{reports:?}");
    assert!(reports.contains(&"events ok 1".to_string()), "{reports:?}");
    assert!(reports.contains(&"runs ok 1".to_string()), "{reports:?}");
    for op in ["write_checkpoint", "append_events", "claim"] {
        let r = reports.iter().find(|r| r.starts_with(op)).unwrap();
        assert!(r.starts_with(&format!("{op} backend")), "{r}");
        assert!(
            r.contains("EACCES") && r.contains("permission denied") && r.contains("run_root"),
            "{r}"
        );
    }
    assert_eq!(tree(&base), before);
}

/// A real filesystem without hard links: exFAT over FUSE on a loop device
/// (`link` answers EPERM). The store refuses to open on it.
#[test]
#[ignore = "needs root, /dev/fuse, a loop device and exfat-fuse + exfatprogs; scripts/test.sh installs them and runs it as root"]
fn a_real_exfat_volume_is_refused_at_open() {
    assert!(is_root(), "this test mounts a filesystem: run it as root");
    for tool in ["mkfs.exfat", "mount.exfat-fuse", "losetup"] {
        assert!(
            sh("which", &[tool]).is_ok(),
            "{tool} is missing: apt-get install exfat-fuse exfatprogs"
        );
    }
    let dir = tempdir();
    let img = dir.path().join("exfat.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    sh("mkfs.exfat", &[&img.display().to_string()]).unwrap();
    let dev = sh("losetup", &["-f", "--show", &img.display().to_string()]).unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = Mount {
        dir: mnt.clone(),
        loop_dev: Some(dev.clone()),
    };
    sh("mount.exfat-fuse", &[&dev, &mnt.display().to_string()]).unwrap();
    let base = mnt.join("runs");
    let e = FsStore::open(&base, FsOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{msg}");
    for needle in [
        "EPERM",
        "hard-link support",
        "single writer per run",
        &base.display().to_string(),
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    drop(mount);
}

/// Sticky failure: under `PowerLoss`, a failed fsync makes the store refuse
/// every later write (it cannot promise durability any more); reads go on.
#[test]
fn a_failed_fsync_turns_the_store_read_only() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = FsStore::open(
        &base,
        FsOptions {
            attribution: Some(attribution()),
            durability: Durability::PowerLoss,
            ..Default::default()
        },
    )
    .unwrap();
    let rt = rt();
    let s = scope("run_sync");
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), None))
        .unwrap();
    let e = {
        let _f = inject(FaultPoint::Fsync, &base, EIO);
        expect_err(rt.block_on(store.append_events(&s, &[ev("x")], None)))
    };
    assert!(e.to_string().contains("fsync failed"), "{e}");
    let later = expect_err(rt.block_on(store.write_checkpoint(&s, &cp("cp_b", 2), None)));
    assert!(
        later
            .to_string()
            .contains("refuses writes since an fsync failed"),
        "{later}"
    );
    assert_eq!(rt.block_on(store.list_checkpoints(&s)).unwrap().len(), 1);
}

/// Damaged files: a checkpoint that does not parse, a malformed message
/// snapshot, a run record that is not an object, a holding body that does
/// not parse, a damaged transcript line. Each read names the file and run;
/// the listing flags the run instead of failing; the claim takes the next
/// fence; the other runs are untouched.
#[test]
fn damaged_files_are_reported_by_name_and_never_hide_other_runs() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let (bad, good) = (scope("run_bad"), scope("run_good"));
    for s in [&bad, &good] {
        let l = rt
            .block_on(store.claim(s, &opts("w1", 60_000, 1_000)))
            .unwrap()
            .lease()
            .unwrap();
        rt.block_on(store.write_checkpoint(s, &cp("cp_a", 1), Some(l.fence)))
            .unwrap();
        rt.block_on(store.append_events(s, &[ev("one"), ev("two")], Some(l.fence)))
            .unwrap();
    }
    let rd = base.join("run_bad");
    std::fs::write(
        rd.join("checkpoints/cp_broken.json"),
        "{\"id\":\"cp_broken\",",
    )
    .unwrap();
    std::fs::write(rd.join("messages.json"), "{\"format\": \"something-else\"}").unwrap();
    std::fs::write(rd.join("run.json"), "[1, 2]").unwrap();
    std::fs::write(rd.join("claims/1.json"), "{\"holder\":\"wor").unwrap();
    let mut t = std::fs::read(rd.join("transcript.jsonl")).unwrap();
    t.splice(0..0, b"{\"type\":\"tool_comp\n".iter().copied());
    std::fs::write(rd.join("transcript.jsonl"), t).unwrap();

    let e = expect_err(
        rt.block_on(store.read_checkpoint(&bad, &CheckpointId::new("cp_broken").unwrap())),
    );
    assert!(
        matches!(e, Error::Corrupted { .. })
            && e.to_string().contains("cp_broken.json")
            && e.to_string().contains("run_bad"),
        "{e}"
    );
    let e = expect_err(rt.block_on(store.list_checkpoints(&bad)));
    assert!(e.to_string().contains("not a usable checkpoint"), "{e}");
    let e = expect_err(rt.block_on(store.read_messages(&bad)));
    assert!(
        e.to_string().contains("invalid run message snapshot"),
        "{e}"
    );
    let e = expect_err(rt.block_on(store.read_run_record(&bad)));
    assert!(e.to_string().contains("run.json"), "{e}");
    let tolerant = rt
        .block_on(store.read_events(&bad, &Default::default()))
        .unwrap();
    assert_eq!(tolerant.events.len(), 2);
    assert_eq!(tolerant.skipped[0].position, 1);
    let e = expect_err(rt.block_on(store.read_events(
        &bad,
        &ReadEventsOptions {
            integrity: Integrity::Strict,
            ..Default::default()
        },
    )));
    assert!(e.to_string().contains("record 1 is not valid JSON"), "{e}");

    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &Default::default()))
        .unwrap();
    assert_eq!(page.entries.len(), 2);
    let b = page
        .entries
        .iter()
        .find(|r| r.scope.run_id.as_str() == "run_bad")
        .unwrap();
    assert!(
        b.damaged.as_deref().unwrap().contains("cp_broken.json"),
        "{b:?}"
    );
    let g = page
        .entries
        .iter()
        .find(|r| r.scope.run_id.as_str() == "run_good")
        .unwrap();
    assert!(g.damaged.is_none() && g.checkpoint_count == 1);
    // The unreadable holding reads expired and anonymous: the next claim
    // takes fence 2 (an unreadable value never grants, and never wedges).
    let lease = rt.block_on(store.lease(&bad, at(1_000))).unwrap().unwrap();
    assert_eq!((lease.holder.as_str(), lease.expired), ("", true));
    let l = rt
        .block_on(store.claim(&bad, &opts("w2", 60_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(l.fence.get(), 2);
    // Appending heals nothing that is not torn and keeps numbering.
    let more = rt
        .block_on(store.append_events(&bad, &[ev("three")], Some(l.fence)))
        .unwrap();
    assert_eq!(more[0].seq, 3);
    assert!(matches!(
        rt.block_on(store.read_messages(&good)).unwrap(),
        MessageSnapshot::Unavailable
    ));
}

/// Foreign files in `claims/` and `checkpoints/`: a directory named like the
/// next holding, non-canonical numeric names, a symlink, stray text; none is
/// a holding or wedges the run; a stray non-JSON file in `checkpoints/` is
/// ignored, a stray `*.json` that is not a checkpoint is reported (a
/// checkpoint list is never silently short).
#[test]
fn foreign_files_neither_wedge_nor_jump_the_lease_nor_hide_as_checkpoints() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_foreign");
    let l = rt
        .block_on(store.claim(&s, &opts("w1", 1_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), Some(l.fence)))
        .unwrap();
    let claims = base.join("run_foreign/claims");
    std::fs::create_dir(claims.join("2.json")).unwrap();
    std::os::unix::fs::symlink("1.json", claims.join("3.json")).unwrap();
    for name in [
        "0x10.json",
        "007.json",
        "1e21.json",
        " 7.json",
        "1000000000000000.json",
        "README",
        "0.json",
    ] {
        std::fs::write(
            claims.join(name),
            r#"{"holder":"intruder","expiresAt":99999999999999}"#,
        )
        .unwrap();
    }
    let cps = base.join("run_foreign/checkpoints");
    std::fs::write(cps.join("notes.txt"), "hello").unwrap();
    std::fs::write(cps.join(".hidden.json"), "{}").unwrap();

    // Still the holder's run at fence 1: nothing foreign was read as a holding.
    let lease = rt.block_on(store.lease(&s, at(1_500))).unwrap().unwrap();
    assert_eq!((lease.fence.get(), lease.holder.as_str()), (1, "w1"));
    rt.block_on(store.write_checkpoint(&s, &cp("cp_b", 2), Some(l.fence)))
        .unwrap();
    assert_eq!(rt.block_on(store.list_checkpoints(&s)).unwrap().len(), 2);
    // After expiry another worker takes it: the directory at 2 and the
    // symlink at 3 are stepped over, not wedging the claim.
    let l2 = rt
        .block_on(store.claim(&s, &opts("w2", 60_000, 5_000)))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(l2.fence.get(), 4);
    let top = rt.block_on(store.lease(&s, at(5_000))).unwrap().unwrap();
    assert_eq!((top.fence.get(), top.holder.as_str()), (4, "w2"));
    assert!(rt
        .block_on(store.write_checkpoint(&s, &cp("cp_c", 3), Some(l.fence)))
        .unwrap_err()
        .is_fenced_out());

    std::fs::write(cps.join("not.a.checkpoint.json"), "{}").unwrap();
    let e = expect_err(rt.block_on(store.list_checkpoints(&s)));
    assert!(
        e.to_string().contains("not.a.checkpoint.json")
            && e.to_string()
                .contains("list_checkpoints on run run_foreign"),
        "{e}"
    );
    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &Default::default()))
        .unwrap();
    assert!(page.entries[0].damaged.is_some());
    assert!(rt.block_on(store.latest_checkpoint(&s)).is_err());
}
