//! What every part of the index shares: the run directories it reads and
//! watches (their keys, kinds and inotify masks), the filesystems where it
//! is not used, why it gives up ([`Refusal`]) and what it answers
//! ([`Found`]).

use std::path::{Path, PathBuf};

use runkeep::listing::RowKey;
use runkeep::RunId;
use rustix::fs::inotify::WatchFlags;

use crate::checkpoints::CHECKPOINTS_DIR;
use crate::claims::CLAIMS_DIR;
use crate::listing::{self, Candidate};
use crate::lock::META_DIR;

/// The directory a run's sub-runs live in.
pub(super) const CHILDREN_DIR: &str = "children";

/// A run directory: `(parent, run)`.
pub(super) type DirKey = (Option<RunId>, RunId);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    /// The store directory: run directories come and go here.
    Base,
    /// A run directory: its subdirectories come and go here.
    Run,
    /// `checkpoints/` or `claims/`: every change matters.
    Rows,
    /// `.runkeep/`: only the lifecycle record matters.
    Meta,
    /// A run's `children/`: sub-run directories come and go here.
    Children,
}

/// The events a watch asks for.
pub(super) fn mask(kind: Kind) -> WatchFlags {
    let tree = WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR;
    match kind {
        Kind::Base | Kind::Run | Kind::Children => tree,
        // In-place rewrites too (a truncated checkpoint, an edited body).
        Kind::Rows => tree | WatchFlags::MODIFY | WatchFlags::ATTRIB | WatchFlags::CLOSE_WRITE,
        Kind::Meta => tree | WatchFlags::CLOSE_WRITE,
    }
}

/// A candidate the index found, with its entry's generation.
pub(crate) struct Found {
    pub(crate) key: RowKey,
    pub(crate) candidate: Candidate,
    pub(super) generation: u64,
    /// The run's concurrency key and limit, as the entry says.
    pub(crate) concurrency: Option<(String, u32)>,
    /// The run's deadline, as the entry says.
    pub(crate) deadline: Option<runkeep::Timestamp>,
}

impl Found {
    /// [`crate::index::Summary::skippable_key`] of the entry.
    pub(crate) fn skippable_key(&self, now: runkeep::Timestamp) -> Option<&(String, u32)> {
        crate::listing::skippable_key(self.concurrency.as_ref(), self.deadline, now)
    }
}

/// Why the index cannot be used.
#[derive(Clone, Debug)]
pub(super) struct Refusal(pub(super) String);

/// A failure of the scratch store: the index is dropped and the listing
/// walks (correct, O(runs)), rather than answering from a store it cannot
/// trust.
pub(super) fn store_failed(e: impl std::fmt::Display) -> Refusal {
    Refusal(format!("the session index's scratch file failed ({e})"))
}

/// Whether `path` is a real directory (not a link to one).
pub(super) fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Run directories named `run_*` in `dir` (the walk's rule).
pub(super) fn run_names(dir: &Path) -> Vec<RunId> {
    crate::sys::list_dir(dir)
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.file_type.is_dir() && listing::is_listed_run_name(&i.name))
        .filter_map(|i| RunId::new(&i.name).ok())
        .collect()
}

/// The directories watched for one run directory: itself, `checkpoints/`,
/// `claims/`, `.runkeep/` and (a top-level run's) `children/` — those that
/// exist get a watch.
pub(super) fn watched_dirs(dir: &Path, top_level: bool) -> Vec<(PathBuf, Kind)> {
    let mut out = vec![
        (dir.to_path_buf(), Kind::Run),
        (dir.join(CHECKPOINTS_DIR), Kind::Rows),
        (dir.join(CLAIMS_DIR), Kind::Rows),
        (dir.join(META_DIR), Kind::Meta),
    ];
    if top_level {
        out.push((dir.join(CHILDREN_DIR), Kind::Children));
    }
    out
}

/// The directory of a run in the store at `base`.
pub(super) fn dir_of(base: &Path, k: &DirKey) -> PathBuf {
    match &k.0 {
        Some(p) => base.join(p.as_str()).join(CHILDREN_DIR).join(k.1.as_str()),
        None => base.join(k.1.as_str()),
    }
}

/// Filesystems where inotify does not see other hosts' (or the server's)
/// writes: `statfs` magic numbers.
const REMOTE_MAGIC: &[i64] = &[
    0x6969,                 // NFS
    0x517B,                 // SMB
    0xFF53_4D42_u32 as i64, // CIFS
    0xFE53_4D42_u32 as i64, // SMB2
    0x6573_5546,            // FUSE
    0x0102_1997,            // 9P
    0x00C3_6400,            // Ceph
    0x5346_414F,            // AFS
    0x7375_7245,            // Coda
    0x564C,                 // NCP
    0x0116_1970,            // GFS2
    0x7461_636F,            // OCFS2
    0x0BD0_0BD0,            // Lustre
    0x4750_4653,            // GPFS
];

pub(super) fn remote(base: &Path) -> Option<String> {
    let st = rustix::fs::statfs(base).ok()?;
    #[allow(
        clippy::unnecessary_cast,
        reason = "the stat field types differ between platforms: the cast is needed where they are signed"
    )]
    let magic = st.f_type as i64;
    REMOTE_MAGIC.contains(&magic).then(|| {
        format!("{} is on a network or FUSE filesystem (statfs type {magic:#x}), where inotify does not see other hosts' writes", base.display())
    })
}
