//! The per-run digest (`.runkeep/digest.json`) that lets a listing build a
//! row without parsing any checkpoint, and the stamp that says whether it
//! is still fresh.
//!
//! # Digest freshness
//!
//! The digest records a *stamp* of the checkpoints directory taken when it
//! was written: the number of `*.json` entries, a hash of every
//! `(name, inode)` pair (from `readdir`), the directory's modification time
//! in nanoseconds, and a hash of every entry's `(name, size, mtime, ctime)`
//! (one `fstatat` per entry). Any create, delete or rename-replace in the
//! directory — ours, the reference's, or a crash between a checkpoint and
//! its digest — changes the stamp, and so does an in-place rewrite of a
//! checkpoint file (truncation, overwrite) that changes its size, mtime or
//! ctime; see [`stamp`] for what it still cannot see. A digest is used only
//! while the stamp still matches; otherwise the reader rebuilds the answer
//! from the checkpoint files (read-only, nothing is written; a damaged file
//! makes the listing flag the run) and the next write of the run persists a
//! fresh digest.
//!
//! # The writer's update
//!
//! A checkpoint's sidecar is written in `.runkeep/` (see [`sidecar`]), so
//! only the publishing rename touches the checkpoints directory. Under the
//! run lock, the writer trusts the stored digest when the directory's mtime
//! is still the one the last writer stored (after its own rename), and
//! updates the stamp by XOR-ing the replaced entry's shares out and the new
//! entry's in, from one `lstat` before and one after the rename: O(1)
//! syscalls whatever the run's size. Readers keep the full check above.

use std::fs;
use std::hash::Hasher;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use runkeep::listing::RunDigest;
use runkeep::{Checkpoint, CheckpointHeader, Result};
use serde::{Deserialize, Serialize};

use super::files::{entries, read_entries, Entry, CHECKPOINTS_DIR};
use crate::lock::META_DIR;
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::testing_hooks;

/// The digest file inside the run's meta directory.
pub(crate) const DIGEST_FILE: &str = "digest.json";
/// The digest file's format tag.
pub(crate) const DIGEST_FORMAT: &str = "runkeep.run-digest.v1";

/// The stamp a digest is checked against.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Stamp {
    pub(crate) count: u64,
    pub(crate) ino_hash: String,
    pub(crate) mtime_ns: i64,
    /// XOR of a hash of every entry's `(name, size, mtime ns, ctime ns)`
    /// (one `fstatat` per entry): an in-place rewrite of a checkpoint (same
    /// name and inode, so the directory does not change) changes it. Absent
    /// in digests written before it existed, which therefore never match.
    #[serde(default)]
    pub(crate) content_hash: String,
}

/// FNV-1a 64 of an entry's name and inode number (little-endian): the
/// stamps on disk hold it, so its bytes do not change.
fn entry_hash(name: &str, ino: u64) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(name.as_bytes());
    h.write(&ino.to_le_bytes());
    h.finish()
}

/// The stamp of a checkpoints directory and its entries; `None` when it
/// does not exist.
///
/// What it sees: any create, delete or rename in the directory (count,
/// names and inodes, directory mtime), and any in-place change of an
/// entry's bytes that changes its size, its mtime or its ctime — a
/// truncation, an append, an overwrite, even one of the same length whose
/// writer put the old mtime back (`utimensat` cannot set the ctime back).
///
/// What it cannot see without reading the files: an in-place rewrite of
/// the same length that leaves size, mtime *and* ctime as they were — a
/// rewrite within the same timestamp tick as the entry's previous change
/// (filesystems with coarse timestamps: FAT/exFAT's 2 s or 10 ms, a
/// kernel's coarse clock tick), the system clock set back, or the bytes
/// changed under the filesystem (block device, bit rot).
///
/// Cost: one `fstatat` per entry on every reader's freshness check (a
/// listing row, a rebuild), on top of the `readdir`. A writer never takes
/// it: it checks and updates the stored stamp in O(1) ([`before`],
/// [`after_put`]).
pub(crate) fn stamp(cps_dir: &Path) -> io::Result<Option<(Stamp, Vec<Entry>)>> {
    let Some(list) = entries(cps_dir)? else {
        return Ok(None);
    };
    let dir = match rustix::fs::open(
        cps_dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(d) => d,
        Err(e) if e == rustix::io::Errno::NOENT => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta = match fs::metadata(cps_dir) {
        Ok(m) => m,
        Err(e) if sys::is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let content = content_hash(&dir, cps_dir, &list)?;
    Ok(Some((stamp_of(&list, &meta, content), list)))
}

/// The words an entry gone since the `readdir` hashes with: the stamps on
/// disk were made with these, so they do not change.
const GONE_WORDS: [u64; 5] = [u64::MAX; 5];

/// XOR over the entries of [`content_entry_hash`], each entry read with
/// `fstatat` (not following symlinks). An entry gone since the `readdir`
/// hashes as absent (the directory's mtime changed anyway).
fn content_hash(dir: &rustix::fd::OwnedFd, cps_dir: &Path, list: &[Entry]) -> io::Result<u64> {
    let mut h = 0u64;
    for e in list {
        testing_hooks::count_checkpoint_stat(cps_dir);
        let words =
            match rustix::fs::statat(dir, e.name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => stat_words(&st),
                Err(err) if err == rustix::io::Errno::NOENT => GONE_WORDS,
                Err(err) => return Err(err.into()),
            };
        h ^= content_entry_hash(&e.name, &words);
    }
    Ok(h)
}

/// The `(size, mtime s, mtime ns, ctime s, ctime ns)` words of a stat.
// The `stat` field types differ between platforms (signed on some).
#[allow(
    clippy::unnecessary_cast,
    reason = "the stat field types differ between platforms: the cast is needed where they are signed"
)]
fn stat_words(st: &rustix::fs::Stat) -> [u64; 5] {
    [
        st.st_size as u64,
        st.st_mtime as u64,
        st.st_mtime_nsec as u64,
        st.st_ctime as u64,
        st.st_ctime_nsec as u64,
    ]
}

/// One entry's share of the content hash: FNV-1a of its name and words.
fn content_entry_hash(name: &str, words: &[u64; 5]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(name.as_bytes());
    for w in words {
        h.write(&w.to_le_bytes());
    }
    h.finish()
}

fn stamp_of(list: &[Entry], meta: &fs::Metadata, content: u64) -> Stamp {
    let hash = list
        .iter()
        .fold(0u64, |h, e| h ^ entry_hash(&e.name, e.ino));
    Stamp {
        count: list.len() as u64,
        ino_hash: format!("{hash:016x}"),
        mtime_ns: mtime_ns_of(meta),
        content_hash: format!("{content:016x}"),
    }
}

fn mtime_ns_of(meta: &fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// The digest file as stored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredDigest {
    format: String,
    stamp: Stamp,
    digest: RunDigest,
}

fn digest_path(run_dir: &Path) -> PathBuf {
    run_dir.join(META_DIR).join(DIGEST_FILE)
}

fn read_stored(run_dir: &Path) -> Option<StoredDigest> {
    let bytes = sys::read_opt(&digest_path(run_dir)).ok()??;
    let d: StoredDigest = serde_json::from_slice(&bytes).ok()?;
    (d.format == DIGEST_FORMAT).then_some(d)
}

/// The run's digest for a listing row, from the digest file when it is
/// fresh, else rebuilt from the checkpoint files (read-only). `None` when
/// the run has no checkpoints directory.
pub(crate) fn current_digest(run_dir: &Path, ctx: &Ctx) -> Result<Option<RunDigest>> {
    let dir = run_dir.join(CHECKPOINTS_DIR);
    let Some((now, list)) = stamp(&dir).map_err(|e| ctx.io("list the checkpoints", &dir, e))?
    else {
        return Ok(None);
    };
    if let Some(stored) = read_stored(run_dir) {
        if stored.stamp == now {
            return Ok(Some(stored.digest));
        }
    }
    let cps = read_entries(&dir, &list, ctx)?;
    let headers: Vec<CheckpointHeader> = cps.iter().map(Checkpoint::header).collect();
    Ok(Some(RunDigest::from_headers(&headers)))
}

/// What the digest can answer without reading the checkpoints.
#[derive(Debug)]
pub(crate) enum Fresh {
    /// The run has no checkpoints directory: no checkpoints.
    NoDirectory,
    /// The digest matches the directory's stamp.
    Digest(Box<RunDigest>),
    /// Missing, unreadable or stale: read the checkpoints.
    Stale,
}

/// The run's digest only when it can be trusted (its stamp matches the
/// directory now); never rebuilt here.
pub(crate) fn fresh_digest(run_dir: &Path) -> Fresh {
    match stamp(&run_dir.join(CHECKPOINTS_DIR)) {
        Ok(None) => Fresh::NoDirectory,
        Ok(Some((now, _))) => match read_stored(run_dir) {
            Some(d) if d.stamp == now => Fresh::Digest(Box::new(d.digest)),
            _ => Fresh::Stale,
        },
        Err(_) => Fresh::Stale,
    }
}

/// What a writer knows before its change (taken under the run lock, with
/// O(1) file-system work: the digest file, one `stat` of the directory,
/// one `lstat` of the target name).
#[derive(Debug)]
pub(crate) struct Before {
    /// The stored stamp and digest, when the directory's mtime is still the
    /// one the last writer stored (nothing renamed, created or deleted
    /// since, up to the filesystem's timestamp granularity).
    fresh: Option<(Stamp, RunDigest)>,
    /// The entry the write replaces: its inode and stat words.
    old: Option<(u64, [u64; 5])>,
}

/// `lstat` of one entry of the checkpoints directory: `Ok(None)` when absent.
fn lstat_entry(cps_dir: &Path, name: &str) -> io::Result<Option<rustix::fs::Stat>> {
    testing_hooks::count_checkpoint_stat(cps_dir);
    match rustix::fs::lstat(cps_dir.join(name)) {
        Ok(st) => Ok(Some(st)),
        Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `stat` of the checkpoints directory: its mtime in nanoseconds.
fn dir_mtime_ns(cps_dir: &Path) -> io::Result<i64> {
    testing_hooks::count_checkpoint_stat(cps_dir);
    fs::metadata(cps_dir).map(|m| mtime_ns_of(&m))
}

/// Snapshot before this writer renames its sidecar onto `name`.
///
/// The stored digest is trusted when its stamp's directory mtime equals the
/// directory's now: every create, delete and rename in the directory since
/// the last writer stored it (after its own rename) changes that mtime. An
/// in-place rewrite of an entry does not, and is not looked for here: its
/// stale share of the content hash stays in the stamp this writer stores,
/// so a reader's full check still fails and the reader answers from the
/// files.
pub(crate) fn before(run_dir: &Path, name: &str) -> Before {
    let dir = run_dir.join(CHECKPOINTS_DIR);
    let fresh = read_stored(run_dir).and_then(|d| match dir_mtime_ns(&dir) {
        Ok(m) if m == d.stamp.mtime_ns => Some((d.stamp, d.digest)),
        _ => None,
    });
    if fresh.is_none() {
        return Before { fresh, old: None };
    }
    match lstat_entry(&dir, name) {
        Ok(old) => Before {
            fresh,
            #[allow(
                clippy::unnecessary_cast,
                reason = "the stat field types differ between platforms: the cast is needed where they are signed"
            )]
            old: old.map(|st| (st.st_ino as u64, stat_words(&st))),
        },
        Err(_) => Before {
            fresh: None,
            old: None,
        },
    }
}

fn parse_hash(h: &str) -> Option<u64> {
    u64::from_str_radix(h, 16).ok()
}

/// Updates the digest after this writer put `header` under `name` (inode
/// `ino`), incrementally when the digest was fresh ([`before`]): the stamp's
/// count, inode hash and content hash have the replaced entry's share
/// XOR-ed out (from the `lstat` before the rename) and the new entry's
/// XOR-ed in (from an `lstat` after it: the rename changed its ctime), and
/// the directory's mtime after the rename is stored. Returns false when the
/// digest must be rebuilt from the files instead ([`rebuild`], which the
/// caller runs after releasing the run lock, so a long rebuild never holds
/// it). Best effort: the digest is an index; a failure leaves it stale (and
/// therefore unused), never wrong.
#[must_use]
pub(crate) fn after_put(
    run_dir: &Path,
    before: Before,
    name: &str,
    ino: u64,
    header: CheckpointHeader,
    durability: Durability,
) -> bool {
    let Some((s0, mut d)) = before.fresh else {
        return false;
    };
    let dir = run_dir.join(CHECKPOINTS_DIR);
    let (Ok(Some(new)), Ok(mtime_ns)) = (lstat_entry(&dir, name), dir_mtime_ns(&dir)) else {
        return false;
    };
    #[allow(
        clippy::unnecessary_cast,
        reason = "the stat field types differ between platforms: the cast is needed where they are signed"
    )]
    if new.st_ino as u64 != ino {
        return false;
    }
    let (Some(h0), Some(c0)) = (parse_hash(&s0.ino_hash), parse_hash(&s0.content_hash)) else {
        return false;
    };
    let (h_old, c_old) = before.old.map_or((0, 0), |(old_ino, words)| {
        (entry_hash(name, old_ino), content_entry_hash(name, &words))
    });
    let ino_hash = h0 ^ h_old ^ entry_hash(name, ino);
    let content = c0 ^ c_old ^ content_entry_hash(name, &stat_words(&new));
    let now = Stamp {
        count: s0.count + u64::from(before.old.is_none()),
        ino_hash: format!("{ino_hash:016x}"),
        mtime_ns,
        content_hash: format!("{content:016x}"),
    };
    if !d.apply_write(header, before.old.is_some()) {
        return false;
    }
    store(run_dir, now, d, durability);
    true
}

/// Rebuilds the digest from the files (best effort; needs no lock: the stamp
/// is taken before the files are read, so a concurrent change leaves the
/// result stale, never wrong).
pub(crate) fn rebuild(run_dir: &Path, durability: Durability, ctx: &Ctx) {
    let dir = run_dir.join(CHECKPOINTS_DIR);
    let Ok(Some((now, list))) = stamp(&dir) else {
        return;
    };
    if let Ok(cps) = read_entries(&dir, &list, ctx) {
        let headers: Vec<CheckpointHeader> = cps.iter().map(Checkpoint::header).collect();
        store(run_dir, now, RunDigest::from_headers(&headers), durability);
    }
}

fn store(run_dir: &Path, stamp: Stamp, digest: RunDigest, durability: Durability) {
    let stored = StoredDigest {
        format: DIGEST_FORMAT.into(),
        stamp,
        digest,
    };
    let Ok(bytes) = serde_json::to_vec(&stored) else {
        return;
    };
    // Never synced, whatever the durability: after a power loss a lost or
    // older digest does not match the (synced) directory and is not used.
    let _ = durability;
    let meta = run_dir.join(META_DIR);
    if let Err(e) = sys::ensure_dir(&meta, Durability::ProcessCrash)
        .and_then(|()| sys::write_atomic(&meta, DIGEST_FILE, &bytes, Durability::ProcessCrash))
    {
        tracing::debug!("could not update the run digest in {}: {e}", meta.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stamps on disk hold these hashes: their bytes must not change
    /// (values from the hand-written FNV-1a 64 they were first made with).
    #[test]
    fn stamp_hashes_are_the_fnv_1a_64_on_disk() {
        assert_eq!(
            entry_hash("cp-0001.json", 123_456_789),
            0x6333_5b15_e023_b23a
        );
        assert_eq!(
            content_entry_hash(
                "cp-0001.json",
                &[4096, 1_700_000_000, 123, 1_700_000_001, 456]
            ),
            0xe800_741f_5736_08c3
        );
    }
}
