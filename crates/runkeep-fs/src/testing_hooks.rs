//! Test seams, compiled to no-ops without the `testing` feature.
//!
//! Production code calls these at the points a test may want to break: an
//! injected errno before a system call, a deliberately broken publish mode
//! (to prove the race tests can fail), a pause point inside the critical
//! section (to measure the residual window). Without the feature every hook
//! is an empty inline function.

use std::io;
use std::path::Path;

/// Where a fault can be injected.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Point {
    /// Creating a directory.
    Mkdir,
    /// Creating or writing a whole-file sidecar.
    Write,
    /// Renaming a sidecar onto its target.
    Rename,
    /// `fsync` of a file or directory.
    Fsync,
    /// Appending to a transcript or audit trail.
    Append,
    /// Creating a claim scratch file.
    ScratchCreate,
    /// The hard link that publishes a holding (also the probe at open).
    Link,
}

/// A publish deliberately broken for a mutation test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(
    not(feature = "testing"),
    allow(dead_code, reason = "read only by the test seams")
)]
pub(crate) enum Mutation {
    /// The correct publish.
    None,
    /// The scratch name is a function of the fence (`.tmp-<fence>`), created
    /// without exclusivity: two publishers of one fence share it.
    PerFenceScratch,
    /// The holding is created exclusively and then written (no link).
    OpenExclusiveThenWrite,
    /// Writes skip the fence check (a store that fences nothing).
    NoWriteFence,
    /// The run lock is never taken (check-then-act and seq assignment
    /// unprotected).
    NoRunLock,
}

#[cfg(feature = "testing")]
pub(crate) fn fault(point: Point, path: &Path) -> io::Result<()> {
    crate::testing::check(point, path)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn fault(_point: Point, _path: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(feature = "testing")]
pub(crate) fn mutation() -> Mutation {
    match std::env::var("RUNKEEP_FS_TEST_MUTATION").as_deref() {
        Ok("per-fence-scratch") => Mutation::PerFenceScratch,
        Ok("open-exclusive-then-write") => Mutation::OpenExclusiveThenWrite,
        Ok("no-write-fence") => Mutation::NoWriteFence,
        Ok("no-run-lock") => Mutation::NoRunLock,
        _ => Mutation::None,
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn mutation() -> Mutation {
    Mutation::None
}

/// True when a test forces the scratch-name publish (no `O_TMPFILE`).
#[cfg(feature = "testing")]
pub(crate) fn force_scratch() -> bool {
    std::env::var("RUNKEEP_FS_TEST_PUBLISH").as_deref() == Ok("scratch")
        || matches!(
            mutation(),
            Mutation::PerFenceScratch | Mutation::OpenExclusiveThenWrite
        )
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn force_scratch() -> bool {
    false
}

/// Stops this process (SIGSTOP) at `point` when a test asked for it.
#[cfg(feature = "testing")]
pub(crate) fn pause(point: &str) {
    if std::env::var("RUNKEEP_FS_TEST_PAUSE").as_deref() == Ok(point) {
        if let Some(pid) = rustix::process::Pid::from_raw(std::process::id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::Stop);
            // A process-directed stop reaches this thread at its next signal
            // check; sleep so that happens here, inside the critical section.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn pause(_point: &str) {}

/// A test's override of the lock wait bound, in milliseconds.
#[cfg(feature = "testing")]
pub(crate) fn lock_wait_override() -> Option<u64> {
    std::env::var("RUNKEEP_FS_TEST_LOCK_WAIT_MS")
        .ok()?
        .parse()
        .ok()
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn lock_wait_override() -> Option<u64> {
    None
}

/// Stops this process (SIGSTOP) at `point` the first time it is reached,
/// when a test asked for it; later passes run on (so a retry loop after the
/// pause is not stopped again).
#[cfg(feature = "testing")]
pub(crate) fn pause_once(point: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    if std::env::var("RUNKEEP_FS_TEST_PAUSE").as_deref() == Ok(point)
        && !DONE.swap(true, Ordering::SeqCst)
    {
        pause(point);
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn pause_once(_point: &str) {}

/// Records `event` in the file a test named in `RUNKEEP_FS_TEST_TRACE`, one
/// `<pid> <event>` line per call (a single `O_APPEND` write, so lines of
/// concurrent processes never interleave). Lets a race test prove which
/// interleaving happened.
#[cfg(feature = "testing")]
pub(crate) fn trace(event: impl FnOnce() -> String) {
    use std::io::Write;
    let Ok(path) = std::env::var("RUNKEEP_FS_TEST_TRACE") else {
        return;
    };
    let line = format!("{} {}\n", std::process::id(), event());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn trace(_event: impl FnOnce() -> String) {}

/// True when a test removed the post-link check (the mutation that brings
/// back "a fence issued twice"), to prove the race tests catch it.
#[cfg(feature = "testing")]
pub(crate) fn skip_post_link_check() -> bool {
    std::env::var("RUNKEEP_FS_TEST_MUTATION").as_deref() == Ok("no-post-link-check")
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn skip_post_link_check() -> bool {
    false
}

/// Sleeps at `point` for the milliseconds a test gave in
/// `RUNKEEP_FS_TEST_DELAY=<point>:<ms>` (a slow disk or a descheduled
/// process, without stopping it).
#[cfg(feature = "testing")]
pub(crate) fn delay(point: &str) {
    let Ok(spec) = std::env::var("RUNKEEP_FS_TEST_DELAY") else {
        return;
    };
    for item in spec.split(',') {
        if let Some((p, ms)) = item.split_once(':') {
            if p == point {
                if let Ok(ms) = ms.parse::<u64>() {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
            }
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn delay(_point: &str) {}

/// When a test asked for a short write at `point` on `path`: the error the
/// write fails with after landing part of its buffer (half of it).
#[cfg(feature = "testing")]
pub(crate) fn short_write(point: Point, path: &Path) -> Option<io::Error> {
    crate::testing::check_short_write(point, path)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn short_write(_point: Point, _path: &Path) -> Option<io::Error> {
    None
}

/// True when a test asked this process to stop at pause point `point` (so a
/// caller can put the point inside a write: part of it landed, the rest not).
#[cfg(feature = "testing")]
pub(crate) fn pause_requested(point: &str) -> bool {
    std::env::var("RUNKEEP_FS_TEST_PAUSE").as_deref() == Ok(point)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn pause_requested(_point: &str) -> bool {
    false
}

/// True when a test switched on the mutation called `name` in
/// `RUNKEEP_FS_TEST_MUTATION` (for mutations that only one place knows).
#[cfg(feature = "testing")]
pub(crate) fn mutation_named(name: &str) -> bool {
    std::env::var("RUNKEEP_FS_TEST_MUTATION").as_deref() == Ok(name)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn mutation_named(_name: &str) -> bool {
    false
}

/// True when a test removed the `fsync` of `path` (a directory when `dir`)
/// to prove the power-loss harness (`crates/runkeep-powerloss`) catches a
/// missing sync: `RUNKEEP_FS_TEST_MUTATION=no-dir-fsync` (every directory
/// sync), `no-file-fsync` (every file sync), or either with `:<name>`,
/// only for paths with a component equal to `<name>` or a file name
/// starting with `<name>.` (`no-dir-fsync:claims`,
/// `no-file-fsync:transcript.jsonl`).
#[cfg(feature = "testing")]
pub(crate) fn skip_sync(dir: bool, path: &Path) -> bool {
    let Ok(m) = std::env::var("RUNKEEP_FS_TEST_MUTATION") else {
        return false;
    };
    let (kind, only) = match m.split_once(':') {
        Some((k, n)) => (k, Some(n)),
        None => (m.as_str(), None),
    };
    if kind != if dir { "no-dir-fsync" } else { "no-file-fsync" } {
        return false;
    }
    match only {
        None => true,
        Some(name) => {
            path.components().any(|c| c.as_os_str() == name)
                || path
                    .file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with(&format!("{name}.")))
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn skip_sync(_dir: bool, _path: &Path) -> bool {
    false
}

/// Counts one checkpoint body parsed at `path` (tests ask how many
/// checkpoint files an answer read).
#[cfg(feature = "testing")]
pub(crate) fn count_checkpoint_read(path: &Path) {
    crate::testing::note_checkpoint_read(path);
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn count_checkpoint_read(_path: &Path) {}

/// Counts one listing of a checkpoints directory (`cps_dir`).
#[cfg(feature = "testing")]
pub(crate) fn count_checkpoint_listing(cps_dir: &Path) {
    crate::testing::note_checkpoint_dir_op(cps_dir, false);
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn count_checkpoint_listing(_cps_dir: &Path) {}

/// Counts one `stat` of a checkpoints directory or of one of its entries.
#[cfg(feature = "testing")]
pub(crate) fn count_checkpoint_stat(cps_dir: &Path) {
    crate::testing::note_checkpoint_dir_op(cps_dir, true);
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn count_checkpoint_stat(_cps_dir: &Path) {}

/// Counts what one transcript read cost (bytes read, lines parsed), keyed
/// by the transcript's path: the test that a page costs O(log n + page),
/// not the log's length, counts it (`transcript.rs`).
#[cfg(feature = "testing")]
pub(crate) fn note_transcript_read(path: &Path, cost: crate::transcript::ReadCost) {
    if !crate::testing::counting() {
        return;
    }
    let mut r = TRANSCRIPT_READS.lock().unwrap_or_else(|p| p.into_inner());
    match r.get_mut(path) {
        Some(c) => {
            c.bytes += cost.bytes;
            c.lines += cost.lines;
        }
        None => {
            r.insert(path.to_path_buf(), cost);
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn note_transcript_read(_path: &Path, _cost: crate::transcript::ReadCost) {}

/// Per transcript path: what its reads have cost so far (a hash map: a
/// lookup per read must not grow with the runs a process has read).
#[cfg(feature = "testing")]
static TRANSCRIPT_READS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, crate::transcript::ReadCost>>,
> = std::sync::LazyLock::new(Default::default);

/// What the reads of the transcript at `path` have cost so far (by any
/// store of this process).
#[cfg(feature = "testing")]
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "read by the integration tests, not by this crate")
)]
pub(crate) fn transcript_reads(path: &Path) -> crate::transcript::ReadCost {
    let r = TRANSCRIPT_READS.lock().unwrap_or_else(|p| p.into_inner());
    r.get(path).copied().unwrap_or_default()
}
