//! Power-loss durability of `runkeep-fs`, proven by cutting power at every
//! operation of a recorded workload.
//!
//! A `kill -9` keeps the page cache, so it cannot test an fsync order. This
//! crate serves an in-memory model filesystem over FUSE ([`fs::ModelFs`])
//! that logs every mutating operation, runs a workload of every write path
//! of `FsStore` on it ([`harness::workload`]), then, for every prefix of
//! the log, computes what a power cut at that instant leaves
//! ([`model::CrashModel`]: only what was synced), materialises it into a
//! fresh directory and checks it with a fresh `FsStore`
//! ([`harness::check`]): every acknowledged write is there, nothing is
//! torn, every run passes the strict read, and no fence is handed out
//! again.
//!
//! [`run`] does all of it and returns a [`harness::Report`]. It needs root
//! and `/dev/fuse` (the mount is made with `mount(2)` directly: no libfuse
//! and no `fusermount` needed). See the crate README and
//! `docs/design/directory/durability-and-limits.md`.

pub mod fs;
pub mod harness;
pub mod model;

use std::path::Path;

pub use harness::{Loss, ModelReport, Report};
pub use model::CrashModel;
use runkeep_fs::Durability;

/// Why the harness cannot run here, with what to do about it.
#[derive(Debug)]
pub struct Unusable(pub String);

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unusable {}

/// Checks that a FUSE mount can be made here: root, `/dev/fuse`.
pub fn fuse_usable() -> Result<(), Unusable> {
    if !Path::new("/dev/fuse").exists() {
        return Err(Unusable(
            "/dev/fuse does not exist: load the fuse module (modprobe fuse) or run the container with --device /dev/fuse".into(),
        ));
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid_root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !euid_root {
        return Err(Unusable(
            "the power-loss harness mounts FUSE with mount(2) and needs root (run scripts/test.sh as root)".into(),
        ));
    }
    Ok(())
}

/// Mounts a fresh model filesystem at `mountpoint` (served on a background
/// thread until the session is dropped or unmounted).
pub fn mount(mountpoint: &Path) -> Result<(fuser::BackgroundSession, fs::Recorder), Unusable> {
    fuse_usable()?;
    let fs = fs::ModelFs::default();
    let recorder = fs.recorder();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("runkeep-powerloss".into()),
        fuser::MountOption::Subtype("runkeep-powerloss".into()),
    ];
    let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(|e| {
        Unusable(format!(
            "could not mount the FUSE model filesystem at {}: {e} (needs root, /dev/fuse and the fuse kernel module; in a container, --device /dev/fuse and CAP_SYS_ADMIN)",
            mountpoint.display()
        ))
    })?;
    Ok((session, recorder))
}

/// Records the workload on a fresh mount with `durability` (and whatever
/// `RUNKEEP_FS_TEST_MUTATION` says), then judges every cut under every crash
/// model.
pub fn run(durability: Durability) -> Result<Report, Unusable> {
    run_models(
        durability,
        &[
            CrashModel::SyncedOnly,
            CrashModel::EagerMetadata,
            CrashModel::TornWrites,
            CrashModel::TornWithIndex,
        ],
    )
}

/// [`run`], judging only under `models`.
pub fn run_models(durability: Durability, models: &[CrashModel]) -> Result<Report, Unusable> {
    let started = std::time::Instant::now();
    let mnt = tempfile::tempdir().map_err(|e| Unusable(format!("a temp directory: {e}")))?;
    let (session, recorder) = mount(mnt.path())?;
    let recording = harness::record(mnt.path(), durability, recorder);
    session
        .umount_and_join()
        .map_err(|e| Unusable(format!("unmount {}: {e}", mnt.path().display())))?;
    let scratch = tempfile::tempdir_in(harness::scratch_dir())
        .map_err(|e| Unusable(format!("a scratch directory: {e}")))?;
    let record_ms = started.elapsed().as_millis() as u64;
    let models = models
        .iter()
        .map(|m| harness::check(&recording, *m, scratch.path()))
        .collect();
    Ok(Report {
        durability: format!("{durability:?}"),
        mutation: std::env::var("RUNKEEP_FS_TEST_MUTATION").ok(),
        ops_logged: recording.log.len(),
        fsyncs: harness::fsync_counts(&recording.log),
        acked_calls: recording.steps.len(),
        calls: recording.steps.iter().map(|s| s.label.clone()).collect(),
        tmpfile_publish: recording.tmpfile_publish,
        record_ms,
        models,
    })
}
