//! What the index needs from this machine (`runkeep doctor`).

use std::path::Path;

use super::common::{is_real_dir, remote, run_names, watched_dirs, CHILDREN_DIR};

/// What the session index of one store directory needs from this machine
/// (`runkeep doctor`'s `store.listing-index`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexOutlook {
    /// Run directories the index would hold (top-level runs and sub-runs).
    pub run_dirs: u64,
    /// inotify watches one process's index of this store holds: one per
    /// directory it watches (counted as the index counts them).
    pub watches: u64,
    /// Why the index is never used on this store, whatever the limits (a
    /// network or FUSE filesystem), if so.
    pub refused: Option<String>,
}

impl IndexOutlook {
    /// The outlook of the store directory `base` (reads every run
    /// directory's entries: O(runs), for diagnosis, not for a listing).
    pub fn of(base: &Path) -> IndexOutlook {
        let mut out = IndexOutlook {
            refused: remote(base),
            watches: 1,
            ..Default::default()
        };
        let mut count = |dir: &Path, top: bool| {
            out.run_dirs += 1;
            out.watches += watched_dirs(dir, top)
                .iter()
                .filter(|(p, _)| is_real_dir(p))
                .count() as u64;
        };
        for run in run_names(base) {
            let dir = base.join(run.as_str());
            count(&dir, true);
            for child in run_names(&dir.join(CHILDREN_DIR)) {
                count(&dir.join(CHILDREN_DIR).join(child.as_str()), false);
            }
        }
        out
    }

    /// The watches one process's indexes may hold together: half of this
    /// user's limit, so a second listing process and the user's other
    /// inotify users still get theirs; past it, run directories are swept
    /// by stamp instead of watched. `None` when the limit cannot be read.
    pub fn watch_budget() -> Option<u64> {
        Some(Self::budget_of(Self::watch_limit()?))
    }

    /// The budget a watch limit gives (see [`IndexOutlook::watch_budget`]).
    pub fn budget_of(limit: u64) -> u64 {
        limit / 2
    }

    /// This user's inotify watch limit (`fs.inotify.max_user_watches`),
    /// shared by every process of the user; `None` when it cannot be read.
    pub fn watch_limit() -> Option<u64> {
        std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}
