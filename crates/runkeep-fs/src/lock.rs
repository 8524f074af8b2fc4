//! The per-run advisory lock that narrows check-then-act.
//!
//! A kernel-released `flock` on `<run>/.runkeep/lock`: the kernel drops it
//! when the holding process dies, so there is no stale lock and no breaker
//! (a stale lock and its breaker are how two writers once both won a run). Writers (every fenced or unfenced
//! write of the run) take it exclusive across "read the top holding → check
//! the fence → publish"; claims and releases take it shared, so claimers
//! still race each other on the hard link (the arbitration the race tests
//! exercise) but cannot publish a new holding inside a writer's check→act.
//!
//! Every wait is bounded ([`LOCK_WAIT`]). What happens past the bound
//! depends on the side:
//!
//! - a **write** is refused with the retryable [`runkeep::Error::Unavailable`]
//!   and nothing is written: two writers inside one run's critical section
//!   could give one `seq` to two events, or let a stopped writer's late
//!   rename replace a newer record. Safety wins over liveness: a stopped lock
//!   holder delays the run's writes (never its claims) until it resumes or
//!   dies, and the error names the lock file;
//! - a **claim or release** proceeds without the lock (the hard link still
//!   arbitrates), so a stopped process can never keep a run from being taken
//!   over: that is the residual window documented in
//!   `docs/design/directory/lease-and-fencing.md`;
//! - a **read** proceeds without it and reads what is committed.
//!
//! Readers never create the lock file. When it exists they take it shared
//! (bounded) so a transcript read does not observe an append in flight.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use runkeep::backoff::{self, Doubling};
use rustix::fs::{flock, FlockOperation};

use crate::options::Durability;
use crate::sys::{self, Ctx};

/// The directory of files this store adds to a run (ignored by the reference).
pub(crate) const META_DIR: &str = ".runkeep";
/// The lock file inside [`META_DIR`].
pub(crate) const LOCK_FILE: &str = "lock";
/// How long any caller waits for the run lock (then: writes are refused,
/// claims and reads proceed without it).
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Which side of the lock.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// Claims, releases and reads.
    Shared,
    /// Writes.
    Exclusive,
}

/// A held (or, past the wait bound, not held) run lock; released on drop.
#[derive(Debug)]
pub(crate) struct RunLock {
    _file: Option<File>,
}

impl RunLock {
    /// Takes the lock for a write (creating the lock file if needed).
    pub(crate) fn acquire(
        run_dir: &Path,
        mode: Mode,
        durability: Durability,
        ctx: &Ctx,
    ) -> runkeep::Result<Self> {
        let meta = run_dir.join(META_DIR);
        let path = meta.join(LOCK_FILE);
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(sys::FILE_MODE)
                .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
                .open(&path)
        };
        let file = match open() {
            Ok(f) => f,
            Err(e) if sys::is_not_found(&e) => {
                sys::ensure_dir(&meta, durability)
                    .map_err(|e| ctx.io("create the run's lock directory", &meta, e))?;
                open().map_err(|e| ctx.io("open the run lock", &path, e))?
            }
            Err(e) => return Err(ctx.io("open the run lock", &path, e)),
        };
        wait(file, mode, &path, ctx)
    }

    /// Takes the lock at `path` (a store-level lock file such as a
    /// concurrency key's; its directory exists), as [`Self::acquire`] does.
    pub(crate) fn acquire_at(path: &Path, mode: Mode, ctx: &Ctx) -> runkeep::Result<Self> {
        if crate::testing_hooks::mutation() == crate::testing_hooks::Mutation::NoKeyLock {
            return Ok(RunLock { _file: None });
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(sys::FILE_MODE)
            .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
            .open(path)
            .map_err(|e| ctx.io("open the lock", path, e))?;
        wait(file, mode, path, ctx)
    }

    /// Takes the lock shared for a read, only if the lock file exists (a read
    /// creates nothing). Never fails: a read proceeds unlocked if need be.
    pub(crate) fn for_read(run_dir: &Path, ctx: &Ctx) -> Self {
        let path = run_dir.join(META_DIR).join(LOCK_FILE);
        match File::open(&path) {
            Ok(file) => wait(file, Mode::Shared, &path, ctx).unwrap_or(Self { _file: None }),
            Err(_) => Self { _file: None },
        }
    }
}

impl RunLock {
    /// Takes the lock exclusive only if the run's lock file exists (never
    /// creating it, nor the run's directory): `Ok(None)` when it does not.
    /// For a deletion (retention), which must not bring a removed run
    /// back. Past the wait bound: refused like a write.
    pub(crate) fn acquire_existing(run_dir: &Path, ctx: &Ctx) -> runkeep::Result<Option<Self>> {
        let path = run_dir.join(META_DIR).join(LOCK_FILE);
        match OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
            .open(&path)
        {
            Ok(file) => wait(file, Mode::Exclusive, &path, ctx).map(Some),
            Err(e) if sys::is_not_found(&e) || e.raw_os_error() == Some(sys::errno::NOTDIR) => {
                Ok(None)
            }
            Err(e) => Err(ctx.io("open the run lock", &path, e)),
        }
    }
}

fn wait(file: File, mode: Mode, path: &Path, ctx: &Ctx) -> runkeep::Result<RunLock> {
    if crate::testing_hooks::mutation() == crate::testing_hooks::Mutation::NoRunLock {
        return Ok(RunLock { _file: None });
    }
    let op = match mode {
        Mode::Shared => FlockOperation::NonBlockingLockShared,
        Mode::Exclusive => FlockOperation::NonBlockingLockExclusive,
    };
    let bound = crate::testing_hooks::lock_wait_override()
        .map(Duration::from_millis)
        .unwrap_or(LOCK_WAIT);
    let start = Instant::now();
    let mut pause = Doubling::new(Duration::from_micros(20), Duration::from_millis(5));
    loop {
        match flock(&file, op) {
            Ok(()) => return Ok(RunLock { _file: Some(file) }),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK || e == rustix::io::Errno::INTR => {}
            Err(e) if mode == Mode::Exclusive => {
                // Without the lock two writers could share a `seq` or replace
                // each other's records: refuse rather than degrade.
                return Err(runkeep::Error::Unsupported {
                    message: format!(
                        "{} on run {}: cannot lock {} ({}); runkeep needs advisory locks (flock) to keep a run's writes ordered. Move the store to a local filesystem (ext4, xfs, tmpfs) or one with flock support",
                        ctx.operation,
                        ctx.run,
                        path.display(),
                        io::Error::from(e)
                    ),
                });
            }
            Err(e) => {
                // Claims and reads: proceed unlocked (the hard-link lease
                // still arbitrates claims) and say so.
                tracing::warn!(
                    "{} on run {}: cannot lock {} ({}); proceeding without the run lock",
                    ctx.operation,
                    ctx.run,
                    path.display(),
                    io::Error::from(e)
                );
                return Ok(RunLock { _file: None });
            }
        }
        if start.elapsed() >= bound {
            if mode == Mode::Exclusive {
                return Err(runkeep::Error::Unavailable {
                    message: format!(
                        "{} on run {}: the run lock {} has been held by another process for over {:?} (stopped, frozen or stuck?); nothing was written. Retry; if it persists, find the holder with `fuser {}`",
                        ctx.operation,
                        ctx.run,
                        path.display(),
                        bound,
                        path.display()
                    ),
                    source: None,
                    outcome_unknown: false,
                });
            }
            tracing::warn!(
                "{} on run {}: the run lock {} stayed held for {:?} (a stopped or stuck process?); proceeding without it",
                ctx.operation,
                ctx.run,
                path.display(),
                bound
            );
            return Ok(RunLock { _file: None });
        }
        std::thread::sleep(backoff::jitter(pause.next_delay(), 0.5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_holder_makes_readers_wait_until_the_bound_and_refuses_writers_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Ctx::store("test");
        let a =
            RunLock::acquire(dir.path(), Mode::Exclusive, Durability::ProcessCrash, &ctx).unwrap();
        assert!(a._file.is_some());
        let t = Instant::now();
        let b = RunLock::acquire(dir.path(), Mode::Shared, Durability::ProcessCrash, &ctx).unwrap();
        assert!(
            b._file.is_none(),
            "shared lock granted while an exclusive one is held"
        );
        assert!(t.elapsed() >= LOCK_WAIT, "{:?}", t.elapsed());
        let t = Instant::now();
        let w = RunLock::acquire(dir.path(), Mode::Exclusive, Durability::ProcessCrash, &ctx)
            .expect_err("a second writer must not proceed without the lock");
        assert!(w.is_retryable(), "{w}");
        assert!(w.to_string().contains("nothing was written"), "{w}");
        assert!(t.elapsed() >= LOCK_WAIT, "{:?}", t.elapsed());
        drop(a);
        let c = RunLock::acquire(dir.path(), Mode::Shared, Durability::ProcessCrash, &ctx).unwrap();
        assert!(c._file.is_some());
    }
}
