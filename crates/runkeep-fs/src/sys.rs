//! Low-level file operations shared by every part of the store: error
//! context, unique temporary names, atomic whole-file publish, directory
//! creation and the durability (fsync) policy.
//!
//! It is also the one I/O layer tests break: every system call that a test
//! injects a fault into (an errno, a short write) is made here, behind its
//! fault point ([`crate::testing::FaultPoint`]): creating directories and
//! scratch files, whole-file writes, renames, hard links, log appends and
//! truncations, fsync.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use runkeep::{Error, RunScope};

use crate::options::Durability;

/// `EEXIST` and friends, by number (Linux values; rustix keeps them portable).
pub(crate) mod errno {
    use rustix::io::Errno;

    pub(crate) const EXIST: i32 = Errno::EXIST.raw_os_error();
    pub(crate) const NOENT: i32 = Errno::NOENT.raw_os_error();
    pub(crate) const PERM: i32 = Errno::PERM.raw_os_error();
    pub(crate) const ACCES: i32 = Errno::ACCESS.raw_os_error();
    pub(crate) const NOTSUP: i32 = Errno::NOTSUP.raw_os_error();
    pub(crate) const OPNOTSUPP: i32 = Errno::OPNOTSUPP.raw_os_error();
    pub(crate) const NOSYS: i32 = Errno::NOSYS.raw_os_error();
    pub(crate) const XDEV: i32 = Errno::XDEV.raw_os_error();
    pub(crate) const MLINK: i32 = Errno::MLINK.raw_os_error();
    pub(crate) const NOSPC: i32 = Errno::NOSPC.raw_os_error();
    pub(crate) const DQUOT: i32 = Errno::DQUOT.raw_os_error();
    pub(crate) const ROFS: i32 = Errno::ROFS.raw_os_error();
    pub(crate) const ISDIR: i32 = Errno::ISDIR.raw_os_error();
    pub(crate) const NOTDIR: i32 = Errno::NOTDIR.raw_os_error();
    pub(crate) const INVAL: i32 = Errno::INVAL.raw_os_error();
    pub(crate) const IO: i32 = Errno::IO.raw_os_error();

    /// The symbolic name of an errno, for messages an operator greps for.
    pub(crate) fn name(code: i32) -> String {
        let known = [
            (EXIST, "EEXIST"),
            (NOENT, "ENOENT"),
            (PERM, "EPERM"),
            (ACCES, "EACCES"),
            (NOTSUP, "ENOTSUP"),
            (OPNOTSUPP, "EOPNOTSUPP"),
            (NOSYS, "ENOSYS"),
            (XDEV, "EXDEV"),
            (MLINK, "EMLINK"),
            (NOSPC, "ENOSPC"),
            (DQUOT, "EDQUOT"),
            (ROFS, "EROFS"),
            (ISDIR, "EISDIR"),
            (NOTDIR, "ENOTDIR"),
            (INVAL, "EINVAL"),
            (IO, "EIO"),
        ];
        known
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, n)| (*n).to_string())
            .unwrap_or_else(|| format!("errno {code}"))
    }
}

/// The mode of every file the store creates: its owner's only. A run's
/// data is whatever its agent saw (prompts, tool output, what it was
/// handed), and every process writing a store runs as one user; the umask
/// can only narrow it. Share a store with other users through `runkeep
/// serve` (a reader token), not through the directory.
pub const FILE_MODE: u32 = 0o600;

/// The mode of every directory the store creates (see [`FILE_MODE`]).
pub const DIR_MODE: u32 = 0o700;

/// Who is doing what: every error names the run and the operation.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub(crate) run: String,
    pub(crate) operation: &'static str,
}

impl Ctx {
    pub(crate) fn new(scope: &RunScope, operation: &'static str) -> Self {
        let run = match &scope.parent_run_id {
            Some(p) => format!("{} (sub-run of {p})", scope.run_id),
            None => scope.run_id.to_string(),
        };
        Self { run, operation }
    }

    pub(crate) fn store(operation: &'static str) -> Self {
        Self {
            run: String::new(),
            operation,
        }
    }

    fn prefix(&self) -> String {
        if self.run.is_empty() {
            self.operation.to_string()
        } else {
            format!("{} on run {}", self.operation, self.run)
        }
    }

    /// A failed I/O call, as `Error::Backend` naming run, operation, action
    /// and path, with a hint for the errnos an operator can act on.
    pub(crate) fn io(&self, action: &str, path: &Path, err: io::Error) -> Error {
        let raw = err.raw_os_error().or_else(|| {
            err.get_ref()
                .and_then(|r| r.downcast_ref::<SyncFailed>())
                .and_then(|s| s.0.raw_os_error())
        });
        let hint = match raw {
            Some(c) if c == errno::NOSPC || c == errno::DQUOT => {
                " — the volume (or quota) is full; free space and retry, nothing already accepted was lost"
            }
            Some(c) if c == errno::ROFS => {
                " — the volume is mounted read-only; remount it read-write or open the store elsewhere"
            }
            Some(c) if c == errno::ACCES || c == errno::PERM => {
                " — permission denied; check that this process's user may read and write the store directory"
            }
            _ => "",
        };
        let code = raw
            .map(|c| format!(" ({})", errno::name(c)))
            .unwrap_or_default();
        let synced = if is_sync_failure(&err) {
            " (fsync failed: what was written before may not be durable)"
        } else {
            ""
        };
        Error::Backend {
            message: format!(
                "{}: could not {action} {}{code}{synced}{hint}",
                self.prefix(),
                path.display()
            ),
            source: Some(Box::new(err)),
        }
    }

    /// Stored data that cannot be understood.
    pub(crate) fn corrupted(&self, path: &Path, what: impl std::fmt::Display) -> Error {
        Error::corrupted(format!("{}: {}: {what}", self.prefix(), path.display()))
    }
}

/// The refusal of a path on the way to a run or a session that is a
/// symbolic link (the one wording for both): runkeep never follows a link
/// out of the `container` (`"store"`, `"root"`), so the `noun` (`"run"`,
/// `"session"`) named `name` can be neither read nor written; `moved` says
/// what to move in place of the link.
pub(crate) fn symlink_refusal(
    noun: &str,
    name: &str,
    path: &Path,
    container: &str,
    moved: &str,
) -> Error {
    let target = fs::read_link(path)
        .map(|t| t.display().to_string())
        .unwrap_or_else(|_| "?".into());
    Error::Unsupported {
        message: format!(
            "{noun} {name}: {} is a symbolic link (to {target}); runkeep never follows a link out of the {container}, so this {noun} can be neither read nor written. Move {moved} into the {container} in place of the link, or remove the link",
            path.display()
        ),
    }
}

/// True for "no such file or directory" (and "not a directory" on a path
/// component, which also means the thing is not there).
pub(crate) fn is_not_found(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(errno::NOTDIR)
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A per-attempt unique suffix: pid (separates processes), a per-process
/// counter (separates attempts in one process), and randomness (separates
/// processes that reuse a pid, on this host or another sharing the volume).
pub(crate) fn unique_parts() -> (u32, u64, String) {
    use rand::Rng;
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let pid = std::process::id();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) + 1;
    let mut rng = rand::thread_rng();
    let r: String = (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    (pid, n, r)
}

/// The sidecar name of an atomic whole-file write of `target_name`:
/// `<target>.<pid>.<counter>.<8 random>.tmp` (the reference's shape; it
/// ends in `.tmp`, so no enumerator takes it for a record).
pub(crate) fn sidecar_name(target_name: &str) -> String {
    let (pid, n, r) = unique_parts();
    format!("{target_name}.{pid}.{n}.{r}.tmp")
}

/// True for a name this store (or the reference) uses for a transient file.
pub(crate) fn is_transient_name(name: &str) -> bool {
    name.starts_with(".tmp-") || name.ends_with(".tmp")
}

/// Creates `dir` and any missing parents (mode [`DIR_MODE`]); under
/// [`Durability::PowerLoss`] every new directory entry is made durable by
/// syncing its parent.
pub(crate) fn ensure_dir(dir: &Path, durability: Durability) -> io::Result<()> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io::Error::from_raw_os_error(errno::NOTDIR));
        }
        Err(e) if !is_not_found(&e) => return Err(e),
        Err(_) => {}
    }
    if let Some(parent) = dir.parent() {
        ensure_dir(parent, durability)?;
    }
    crate::testing_hooks::fault(crate::testing_hooks::Point::Mkdir, dir)?;
    match fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {
            if durability == Durability::PowerLoss {
                if let Some(parent) = dir.parent() {
                    sync_dir(parent)?;
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// An `fsync` that failed: durability of what was written before it can no
/// longer be assumed (the store turns sticky-failed when it sees one).
#[derive(Debug)]
pub(crate) struct SyncFailed(pub(crate) io::Error);

impl std::fmt::Display for SyncFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fsync failed: {}", self.0)
    }
}

impl std::error::Error for SyncFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn sync_failed(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), SyncFailed(e))
}

/// True when `err` (anywhere in its chain) is a failed `fsync`.
pub(crate) fn is_sync_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.is::<SyncFailed>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<SyncFailed>()) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

/// `fsync` of a directory (makes its entries durable).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::Fsync, dir).map_err(sync_failed)?;
    if crate::testing_hooks::skip_sync(crate::testing_hooks::Synced::Dir, dir) {
        return Ok(());
    }
    let f = File::open(dir)?;
    f.sync_all().map_err(sync_failed)
}

/// `fsync` of a file's data.
pub(crate) fn sync_file(file: &File, path: &Path) -> io::Result<()> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::Fsync, path).map_err(sync_failed)?;
    crate::testing_hooks::delay(crate::testing_hooks::Delay::Fsync);
    if crate::testing_hooks::skip_sync(crate::testing_hooks::Synced::File, path) {
        return Ok(());
    }
    file.sync_data().map_err(sync_failed)
}

/// `link(2)`: `from` also under the new name `to` (which must not exist).
/// Fault point `Link`.
pub(crate) fn hard_link(from: &Path, to: &Path) -> io::Result<()> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::Link, to)?;
    fs::hard_link(from, to)
}

/// Gives the unnamed (`O_TMPFILE`) `file` the name `to` (`linkat` through
/// `/proc/self/fd`; fails if `to` exists). Fault point `Link`.
pub(crate) fn link_unnamed(file: &File, to: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    crate::testing_hooks::fault(crate::testing_hooks::Point::Link, to)?;
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(
        rustix::fs::CWD,
        proc_path.as_str(),
        rustix::fs::CWD,
        to,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    )
    .map_err(io::Error::from)
}

/// Creates a claim's scratch file at `path` and writes `body` into it:
/// exclusively when `unique`, else over whatever is there. Fault point
/// `ScratchCreate`.
pub(crate) fn create_scratch(path: &Path, body: &[u8], unique: bool) -> io::Result<File> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::ScratchCreate, path)?;
    let mut opts = OpenOptions::new();
    opts.write(true)
        .mode(FILE_MODE)
        .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32);
    if unique {
        opts.create_new(true);
    } else {
        opts.create(true).truncate(true);
    }
    let mut f = opts.open(path)?;
    f.write_all(body)?;
    Ok(f)
}

/// The one log write of an append (with its test seams: an injected errno
/// before it, a short write that lands half the buffer and fails, a pause
/// point in the middle of it). `written` counts the bytes that landed.
pub(crate) fn write_log(
    file: &mut File,
    buf: &[u8],
    path: &Path,
    written: &mut u64,
) -> io::Result<()> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::Append, path)?;
    let mut write = |bytes: &[u8]| -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            match file.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    *written += n as u64;
                    rest = &rest[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    if let Some(e) = crate::testing_hooks::short_write(crate::testing_hooks::Point::Append, path) {
        write(&buf[..buf.len() / 2])?;
        return Err(e);
    }
    if crate::testing_hooks::pause_requested(crate::testing_hooks::Pause::MidAppendWrite) {
        let half = buf.len() / 2;
        write(&buf[..half])?;
        crate::testing_hooks::pause(crate::testing_hooks::Pause::MidAppendWrite);
        return write(&buf[half..]);
    }
    write(buf)
}

/// Cuts the log `file` (at `path`) back to `len` bytes: a torn final
/// record removed. Fault point `Append`.
pub(crate) fn truncate_log(file: &File, path: &Path, len: u64) -> io::Result<()> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::Append, path)?;
    file.set_len(len)
}

/// Writes all of `bytes` at the end of the log `file` (at `path`), in one
/// call as far as the kernel allows. Fault point `Append`.
pub(crate) fn append_log(file: &mut File, path: &Path, bytes: &[u8]) -> io::Result<()> {
    crate::testing_hooks::fault(crate::testing_hooks::Point::Append, path)?;
    file.write_all(bytes)
}

/// Reads a whole file; `None` when it does not exist.
pub(crate) fn read_opt(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match File::open(path) {
        Ok(mut f) => {
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)?;
            Ok(Some(buf))
        }
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A whole file written under a unique sidecar name in its target's
/// directory, waiting to be published by `rename`. Dropped unpublished, the
/// sidecar is removed (best effort; leftovers end in `.tmp` and are ignored
/// by every reader and reported by the doctor).
#[derive(Debug)]
pub(crate) struct TempFile {
    path: PathBuf,
    dir: PathBuf,
    ino: u64,
    durability: Durability,
    published: bool,
}

impl TempFile {
    /// Writes `bytes` to a fresh sidecar for `dir/target_name`.
    pub(crate) fn write(
        dir: &Path,
        target_name: &str,
        bytes: &[u8],
        durability: Durability,
    ) -> io::Result<Self> {
        Self::write_beside(dir, dir, target_name, bytes, durability)
    }

    /// Writes `bytes` to a fresh sidecar in `scratch_dir` (which must be on
    /// the same filesystem as `dir`, so the publishing rename stays atomic)
    /// for `dir/target_name`: creating it leaves `dir` untouched.
    pub(crate) fn write_beside(
        scratch_dir: &Path,
        dir: &Path,
        target_name: &str,
        bytes: &[u8],
        durability: Durability,
    ) -> io::Result<Self> {
        let path = scratch_dir.join(sidecar_name(target_name));
        crate::testing_hooks::fault(crate::testing_hooks::Point::Write, &path)?;
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
            .open(&path)?;
        let mut me = Self {
            path,
            dir: dir.to_path_buf(),
            ino: 0,
            durability,
            published: false,
        };
        f.write_all(bytes)?;
        if durability == Durability::PowerLoss {
            sync_file(&f, &me.path)?;
        }
        me.ino = std::os::unix::fs::MetadataExt::ino(&f.metadata()?);
        Ok(me)
    }

    /// The sidecar's inode (the target's inode once published).
    pub(crate) fn ino(&self) -> u64 {
        self.ino
    }

    /// Atomically replaces `dir/target_name` with this file.
    pub(crate) fn publish(mut self, target_name: &str) -> io::Result<()> {
        let target = self.dir.join(target_name);
        crate::testing_hooks::fault(crate::testing_hooks::Point::Rename, &target)?;
        fs::rename(&self.path, &target)?;
        self.published = true;
        if self.durability == Durability::PowerLoss {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Writes a whole file atomically (sidecar + rename).
pub(crate) fn write_atomic(
    dir: &Path,
    target_name: &str,
    bytes: &[u8],
    durability: Durability,
) -> io::Result<()> {
    TempFile::write(dir, target_name, bytes, durability)?.publish(target_name)
}

/// Whole-file records as stored: compact JSON, no trailing newline.
/// The reference writes pretty JSON (2-space indent); readers on both sides
/// parse either, and compact is what the contract's byte limits count:
/// indentation grows with nesting, so a 240 KB body nested 100 deep was a
/// 23.9 MB file pretty-printed (and `[0,0,…]` grew 4×).
pub(crate) fn record_json(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// One directory entry, as the listers need it.
#[derive(Debug)]
pub(crate) struct DirItem {
    /// UTF-8 name (entries whose name is not UTF-8 are never ours and are skipped).
    pub(crate) name: String,
    /// Its type, without following a symlink.
    pub(crate) file_type: fs::FileType,
    /// Inode number.
    pub(crate) ino: u64,
}

/// Lists a directory: `None` when it does not exist; an entry that vanishes
/// while it is being listed is left out (it is gone), never an error.
pub(crate) fn list_dir(dir: &Path) -> io::Result<Option<Vec<DirItem>>> {
    use std::os::unix::fs::DirEntryExt;
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = match entry {
            Ok(e) => e,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        out.push(DirItem {
            name,
            file_type,
            ino: entry.ino(),
        });
    }
    Ok(Some(out))
}
