//! Test seams (feature `testing`): injected I/O faults scoped to a directory.
//!
//! Used by this crate's own tests and benches. Faults are process-global but
//! match only paths under the directory they were injected for, so tests
//! running in parallel in one binary (each in its own temp directory) do not
//! see each other's faults. Cross-process tests switch on broken publish
//! modes and pause points with environment variables instead:
//!
//! - `RUNKEEP_FS_TEST_MUTATION=per-fence-scratch | open-exclusive-then-write`
//! - `RUNKEEP_FS_TEST_PUBLISH=scratch` (no `O_TMPFILE`)
//! - `RUNKEEP_FS_TEST_PAUSE=<point>` (SIGSTOP self at a named point, e.g.
//!   `after-fence-check`)
//! - `RUNKEEP_FS_TEST_LOCK_WAIT_MS=<n>` (the run lock's wait bound)

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

pub use crate::testing_hooks::Point as FaultPoint;

/// One store's test seams: [`crate::FsStore::testing`]. Every switch and
/// counter a test may use on a store is a method of this one handle.
#[derive(Clone, Copy, Debug)]
pub struct StoreSeams<'a>(pub(crate) &'a crate::FsStore);

impl StoreSeams<'_> {
    /// Test seam: publish holdings through scratch names, never `O_TMPFILE`.
    #[doc(hidden)]
    pub fn force_scratch_publish(&self) {
        self.0.inner.disable_tmpfile();
    }

    /// Test seam: `watch` never uses inotify (the polling fallback).
    #[doc(hidden)]
    pub fn disable_inotify(&self) {
        self.0
            .inner
            .switches
            .switch_off(crate::testing_hooks::Switch::Inotify);
    }

    /// Test seam: whether holdings are published through `O_TMPFILE`.
    #[doc(hidden)]
    pub fn uses_tmpfile(&self) -> bool {
        self.0.inner.tmpfile_enabled()
    }
}

/// One root's test seams: [`crate::FsRootStore::testing`].
#[derive(Clone, Copy, Debug)]
pub struct RootSeams<'a>(pub(crate) &'a crate::FsRootStore);

impl RootSeams<'_> {
    /// Test seam: rows read from the sessions' listings so far.
    #[doc(hidden)]
    pub fn rows_fetched(&self) -> u64 {
        self.0.inner.fetched.load(Ordering::Relaxed)
    }

    /// Test seam: the next `claim_next` records the first candidate it is
    /// about to claim in `seen`, then waits at `barrier` before claiming it
    /// (two callers made to race for one run).
    #[doc(hidden)]
    pub fn pause_first_claim(
        &self,
        barrier: std::sync::Arc<tokio::sync::Barrier>,
        seen: std::sync::Arc<Mutex<Vec<runkeep::RunScope>>>,
    ) {
        *self.0.inner.pause.lock().unwrap_or_else(|p| p.into_inner()) = Some((barrier, seen));
    }
}

struct Fault {
    id: u64,
    point: FaultPoint,
    under: PathBuf,
    errno: i32,
    remaining: Option<u32>,
}

static FAULTS: Mutex<Vec<Fault>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Removes its fault when dropped.
#[derive(Debug)]
#[must_use = "the fault is removed when the guard is dropped"]
pub struct FaultGuard(u64);

impl Drop for FaultGuard {
    fn drop(&mut self) {
        let mut f = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
        f.retain(|x| x.id != self.0);
    }
}

/// Makes every call at `point` on a path under `under` fail with `errno`.
pub fn inject(point: FaultPoint, under: impl AsRef<Path>, errno: i32) -> FaultGuard {
    add(point, under.as_ref(), errno, None)
}

/// Like [`inject`], for the next `times` matching calls only.
pub fn inject_times(
    point: FaultPoint,
    under: impl AsRef<Path>,
    errno: i32,
    times: u32,
) -> FaultGuard {
    add(point, under.as_ref(), errno, Some(times))
}

fn add(point: FaultPoint, under: &Path, errno: i32, remaining: Option<u32>) -> FaultGuard {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let under = std::fs::canonicalize(under).unwrap_or_else(|_| under.to_path_buf());
    FAULTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Fault {
            id,
            point,
            under,
            errno,
            remaining,
        });
    FaultGuard(id)
}

pub(crate) fn check(point: FaultPoint, path: &Path) -> io::Result<()> {
    let mut faults = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
    if faults.is_empty() {
        return Ok(());
    }
    let canon = canonical_prefix(path);
    for f in faults.iter_mut() {
        if f.point == point && canon.starts_with(&f.under) {
            match &mut f.remaining {
                Some(0) => continue,
                Some(n) => *n -= 1,
                None => {}
            }
            return Err(io::Error::from_raw_os_error(f.errno));
        }
    }
    Ok(())
}

/// The path with its longest existing prefix canonicalized (the path itself
/// may not exist yet).
fn canonical_prefix(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(c) = std::fs::canonicalize(&cur) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return out;
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(n), Some(p)) => {
                rest.push(n);
                cur = p.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// A short write: the call lands the first half of its buffer, then fails.
struct ShortWrite {
    id: u64,
    point: FaultPoint,
    under: PathBuf,
    errno: i32,
    remaining: u32,
}

static SHORT_WRITES: Mutex<Vec<ShortWrite>> = Mutex::new(Vec::new());

/// Removes its short-write fault when dropped.
#[derive(Debug)]
#[must_use = "the fault is removed when the guard is dropped"]
pub struct ShortWriteGuard(u64);

impl Drop for ShortWriteGuard {
    fn drop(&mut self) {
        let mut f = SHORT_WRITES.lock().unwrap_or_else(|p| p.into_inner());
        f.retain(|x| x.id != self.0);
    }
}

/// Makes the next `times` writes at `point` (only [`FaultPoint::Append`]
/// has one: the log write of an append) on a path under `under` land the
/// first half of their buffer and then fail with `errno`, like a disk that
/// fills up in the middle of a large write.
pub fn inject_short_write(
    point: FaultPoint,
    under: impl AsRef<Path>,
    errno: i32,
    times: u32,
) -> ShortWriteGuard {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let under = under.as_ref();
    let under = std::fs::canonicalize(under).unwrap_or_else(|_| under.to_path_buf());
    SHORT_WRITES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(ShortWrite {
            id,
            point,
            under,
            errno,
            remaining: times,
        });
    ShortWriteGuard(id)
}

pub(crate) fn check_short_write(point: FaultPoint, path: &Path) -> Option<io::Error> {
    let mut faults = SHORT_WRITES.lock().unwrap_or_else(|p| p.into_inner());
    if faults.is_empty() {
        return None;
    }
    let canon = canonical_prefix(path);
    let f = faults
        .iter_mut()
        .find(|f| f.point == point && f.remaining > 0 && canon.starts_with(&f.under))?;
    f.remaining -= 1;
    Some(io::Error::from_raw_os_error(f.errno))
}

// Counters keyed by run directory, in hash maps: a lookup per counted
// operation must not grow with the number of runs a process has touched
// (the benches run with these seams compiled in).

/// Set by [`stop_counting`].
static NOT_COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stops the counters of this module for the rest of the process: they
/// hold an entry per run directory (and transcript) they count, which a
/// measurement of the store's own memory (`examples/rss.rs`, the benches)
/// must not include.
pub fn stop_counting() {
    NOT_COUNTING.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn counting() -> bool {
    !NOT_COUNTING.load(std::sync::atomic::Ordering::Relaxed)
}

static CHECKPOINT_READS: LazyLock<Mutex<HashMap<PathBuf, u64>>> = LazyLock::new(Default::default);

pub(crate) fn note_checkpoint_read(path: &Path) {
    if !counting() {
        return;
    }
    // Keyed by the run directory (`<run>/checkpoints/<id>.json`).
    let Some(run) = path.parent().and_then(Path::parent) else {
        return;
    };
    let mut r = CHECKPOINT_READS.lock().unwrap_or_else(|p| p.into_inner());
    match r.get_mut(run) {
        Some(n) => *n += 1,
        None => {
            r.insert(run.to_path_buf(), 1);
        }
    }
}

/// How many checkpoint files of the run directory `run_dir` have been
/// parsed (by any store of this process) so far.
pub fn checkpoint_reads(run_dir: impl AsRef<Path>) -> u64 {
    let r = CHECKPOINT_READS.lock().unwrap_or_else(|p| p.into_inner());
    r.get(run_dir.as_ref()).copied().unwrap_or(0)
}

/// Per run directory: (checkpoints directory listings, stats).
static CHECKPOINT_DIR_OPS: LazyLock<Mutex<HashMap<PathBuf, (u64, u64)>>> =
    LazyLock::new(Default::default);

/// An operation on a checkpoints directory the counters count.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DirOp {
    /// A listing (`readdir`).
    Listing,
    /// A `stat` of the directory or of one of its entries.
    Stat,
}

pub(crate) fn note_checkpoint_dir_op(cps_dir: &Path, op: DirOp) {
    if !counting() {
        return;
    }
    // Keyed by the run directory (`<run>/checkpoints`).
    let Some(run) = cps_dir.parent() else {
        return;
    };
    let mut r = CHECKPOINT_DIR_OPS.lock().unwrap_or_else(|p| p.into_inner());
    if !r.contains_key(run) {
        r.insert(run.to_path_buf(), (0, 0));
    }
    if let Some(n) = r.get_mut(run) {
        match op {
            DirOp::Listing => n.0 += 1,
            DirOp::Stat => n.1 += 1,
        }
    }
}

/// How many times the checkpoints directory of the run directory `run_dir`
/// has been listed (`readdir`, by any store of this process) so far.
pub fn checkpoint_dir_listings(run_dir: impl AsRef<Path>) -> u64 {
    let r = CHECKPOINT_DIR_OPS.lock().unwrap_or_else(|p| p.into_inner());
    r.get(run_dir.as_ref()).map_or(0, |n| n.0)
}

/// How many `stat`s of the checkpoints directory of `run_dir`, or of its
/// entries, the digest's freshness checks have made so far.
pub fn checkpoint_dir_stats(run_dir: impl AsRef<Path>) -> u64 {
    let r = CHECKPOINT_DIR_OPS.lock().unwrap_or_else(|p| p.into_inner());
    r.get(run_dir.as_ref()).map_or(0, |n| n.1)
}

/// Runs a store future to completion on this thread, without a runtime:
/// the directory store's futures do their work when first polled and never
/// wait on a waker (benches and examples measure the store, not a runtime).
pub fn inline<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}
