//! Retention on a directory (`runkeep::scheduling::retention`): deleting
//! finished runs, whole, in bounded batches.
//!
//! A batch takes its candidates from the session index's summaries when
//! it can be used (top-level runs that read finished; no run is read
//! before its lock), else pages through the listing filtered to finished
//! runs (rows whose `finished_at` could be due), and judges each candidate
//! again **under its run lock** (exclusive, taken only if the lock file
//! exists: a deletion never creates a directory):
//!
//! 1. the top holding and lifecycle are read under the lock and
//!    [`retention::is_due`] decides; a run reopened or claimed since the
//!    listing read it is kept (reopen and every write take the same lock);
//! 2. each sub-run under `<run>/children/` is locked and judged the same
//!    way; one not due keeps the parent (and all of them);
//! 3. the run directory is **renamed** to a trash name in the store
//!    directory (`.trash.<run>.<pid>.<n>`: a name no run id can have, so no
//!    listing, index or reader takes it for a run), with every sub-run
//!    inside it; under [`Durability::PowerLoss`] the store directory is
//!    synced;
//! 4. the locks are released and the trash directory removed. A trash
//!    directory left by a crash between 3 and 4 is removed by the next
//!    prune.
//!
//! After step 3 the run is gone for every reader at once (one rename):
//! the index drops it from the rename's inotify event (or the sweep of a
//! swept run), so the next listing page no longer shows it.
//!
//! # The window
//!
//! A claim waits for the run lock only up to its bound and then proceeds
//! without it (`crate::lock`). A claim that gave up waiting while a prune
//! held the lock can publish a holding into the run's `claims/` just before
//! the rename: it is deleted with the run, and the claimer's next write
//! finds no holding (`FencedOut`/`InvalidInput`). That needs a claim of a
//! finished run (which answers `Finished` and never takes it) racing a
//! reopen and a prune of the same run; `claim_next` never hands out a run
//! it cannot list. The reference implementation takes no lock at all: a
//! reference writer racing a prune of a finished run can lose its write
//! with the run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use runkeep::lease::is_expired;
use runkeep::listing::RowKey;
use runkeep::scheduling::retention::{self, PruneReport, RetentionPolicy};
use runkeep::{
    Lifecycle, ListOptions, ListingScope, Result, RunScope, RunStatus, Timestamp, TopHolding,
};

use crate::inner::Inner;
use crate::lock::RunLock;
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::testing_hooks::{self, Mutation, Pause, Trace};
use crate::{listing, run_state};

/// The prefix of a run directory being deleted (never a run id: ids have
/// no `.`).
pub(crate) const TRASH_PREFIX: &str = ".trash.";

/// Sub-run directories inside a top-level run's directory.
const CHILDREN_DIR: &str = "children";

/// [`runkeep::CheckpointStore::prune_finished`] on one session directory.
pub(crate) fn prune_finished(
    inner: &Inner,
    scope: &ListingScope,
    policy: &RetentionPolicy,
    now: Option<Timestamp>,
    limit: usize,
) -> Result<PruneReport> {
    retention::check_limit(limit)?;
    inner.check_poison()?;
    let now = now.unwrap_or_else(|| inner.now());
    sweep_trash(inner);
    let mut report = PruneReport::default();
    let mut pages = Pages::Index(None);
    'pages: loop {
        let (runs, more) = match next_page(inner, scope, now, &mut pages)? {
            Some(p) => p,
            None => continue,
        };
        for run in &runs {
            report.scanned += 1;
            if report.deleted.len() == limit {
                // One more due run means "more"; judged read-only.
                if is_due_unlocked(inner, run, policy, now) {
                    report.more = true;
                    break 'pages;
                }
                continue;
            }
            let id = run.run_id.as_str();
            testing_hooks::trace(Trace::PruneListed(id));
            testing_hooks::pause_once(Pause::PruneBeforeLock);
            match delete_if_due(inner, run, policy, now)? {
                Some(subs) => {
                    testing_hooks::trace(Trace::PruneDeleted(id));
                    report.sub_runs_deleted += subs;
                    report.deleted.push(run.clone());
                }
                None => testing_hooks::trace(Trace::PruneKept(id)),
            }
        }
        if !more {
            break;
        }
    }
    Ok(report)
}

/// Where the prune's candidates come from, and where the next page starts.
enum Pages {
    /// The session index's summaries (no run read before its lock), after
    /// this key.
    Index(Option<RowKey>),
    /// The listing (the index cannot answer), at this cursor.
    Listing(Option<String>),
}

/// How many candidates a page of the index holds.
const INDEX_PAGE: usize = 1000;

/// The next page of top-level runs that may be due, and whether more
/// follow; `None` when the index stopped answering (`pages` then moves to
/// the listing, from its start). A candidate is only a candidate: each is
/// judged under its lock.
fn next_page(
    inner: &Inner,
    scope: &ListingScope,
    now: Timestamp,
    pages: &mut Pages,
) -> Result<Option<(Vec<RunScope>, bool)>> {
    match pages {
        Pages::Index(after) => {
            match listing::finished_page(inner, scope, after.as_ref(), INDEX_PAGE)? {
                Some((runs, next)) => {
                    let more = next.is_some();
                    *after = next;
                    Ok(Some((runs, more)))
                }
                None => {
                    *pages = Pages::Listing(None);
                    Ok(None)
                }
            }
        }
        Pages::Listing(cursor) => {
            let options = ListOptions {
                status: Some(vec![
                    RunStatus::Completed,
                    RunStatus::Failed,
                    RunStatus::Cancelled,
                ]),
                limit: Some(runkeep::listing::MAX_LIMIT),
                now: Some(now),
                cursor: cursor.take(),
                ..ListOptions::default()
            };
            let page = listing::list_runs(inner, scope, &options)?;
            // A cheap first look: finished at or before `now` (whatever
            // the run's own retention says, it is not due before that).
            let runs = page
                .entries
                .into_iter()
                .filter(|r| r.scope.parent_run_id.is_none())
                .filter(|r| r.finished_at.is_some_and(|at| at <= now) && r.damaged.is_none())
                .map(|r| r.scope)
                .collect();
            let more = page.cursor.is_some();
            *cursor = page.cursor;
            Ok(Some((runs, more)))
        }
    }
}

/// The run's lifecycle when the run at `run_dir` is due at `now` (`None`:
/// kept), from its holding and lifecycle as read (the caller holds its
/// lock, or only looks).
fn due(
    run_dir: &Path,
    policy: &RetentionPolicy,
    now: Timestamp,
    ctx: &Ctx,
) -> Result<Option<Lifecycle>> {
    let state = run_state::read_state(run_dir, ctx)?;
    let held = matches!(
        state.top,
        Some(TopHolding::Lease { expires_at, .. }) if !is_expired(expires_at, now)
    );
    Ok(retention::is_due(&state.lifecycle, held, policy, now).then_some(state.lifecycle))
}

/// The read-only verdict for `more` (no lock; a run it calls due may turn
/// out kept by the next batch, which is all `more` promises).
fn is_due_unlocked(
    inner: &Inner,
    scope: &RunScope,
    policy: &RetentionPolicy,
    now: Timestamp,
) -> bool {
    let ctx = Ctx::new(scope, "prune_finished");
    matches!(due(&inner.run_dir(scope), policy, now, &ctx), Ok(Some(_)))
}

/// Deletes the run (and its sub-runs) if it is due, judged under its lock
/// and theirs (module docs); answers the number of sub-runs deleted, or
/// `None` when the run was kept (or is gone already).
fn delete_if_due(
    inner: &Inner,
    scope: &RunScope,
    policy: &RetentionPolicy,
    now: Timestamp,
) -> Result<Option<u64>> {
    let ctx = Ctx::new(scope, "prune_finished");
    let run_dir = inner.run_dir(scope);
    let Some(lock) = RunLock::acquire_existing(&run_dir, &ctx)? else {
        return Ok(None);
    };
    // The lock file may be held in a directory renamed away since it was
    // opened (another pruner): then there is nothing here to judge.
    if !run_dir.join(crate::lock::META_DIR).is_dir() {
        return Ok(None);
    }
    // Judged again under the lock: the listing's verdict is older than any
    // reopen or claim that took the lock since.
    let lifecycle = if testing_hooks::mutation() == Mutation::PruneNoRejudge {
        run_state::read_state(&run_dir, &ctx)?.lifecycle
    } else {
        match due(&run_dir, policy, now, &ctx)? {
            Some(l) => l,
            None => return Ok(None),
        }
    };
    // What names the run elsewhere (its key's history), read before it
    // goes: the lifecycles just judged.
    let mut forget = vec![(scope.clone(), lifecycle)];
    let mut child_locks = Vec::new();
    for child in sub_run_dirs(&run_dir, &ctx)? {
        let Some(l) = RunLock::acquire_existing(&child, &ctx)? else {
            // A sub-run never written through this store's locks (the
            // reference's) has no finish of its own: not due.
            return Ok(None);
        };
        let Some(lifecycle) = due(&child, policy, now, &ctx)? else {
            return Ok(None);
        };
        child_locks.push(l);
        let id = child
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| runkeep::RunId::new(n).ok());
        if let Some(id) = id {
            let mut sub = scope.clone();
            sub.run_id = id;
            sub.parent_run_id = Some(scope.run_id.clone());
            forget.push((sub, lifecycle));
        }
    }
    let subs = child_locks.len() as u64;
    let trash = trash_name(inner, scope);
    std::fs::rename(&run_dir, &trash)
        .map_err(|e| inner.note(ctx.io("move the run to the trash", &run_dir, e)))?;
    if inner.durability == Durability::PowerLoss {
        sys::sync_dir(inner.base())
            .map_err(|e| inner.note(ctx.io("sync the store directory", inner.base(), e)))?;
    }
    for (s, l) in &forget {
        forget_run(inner, s, l);
    }
    drop(child_locks);
    drop(lock);
    // The run is gone for every reader; a failure here leaves only a trash
    // directory, removed by the next prune.
    if let Err(e) = std::fs::remove_dir_all(&trash) {
        tracing::warn!(
            target: "runkeep_fs::retention",
            path = %trash.display(),
            error = %e,
            "could not remove a pruned run's trash directory; the next prune retries"
        );
    }
    Ok(Some(subs))
}

/// The store's other records naming a deleted run go with it: its lines
/// of its concurrency key's history and its held-set entry (under the key
/// lock, as `KeyLog::forget` in the memory store). A dedupe record naming
/// it needs nothing: a window whose run is gone is closed
/// (`dedupe::decide`). A failure is logged, not returned: the run is
/// already gone, and `key_holdings` drops the holdings of runs that no
/// longer exist.
fn forget_run(inner: &Inner, scope: &RunScope, lifecycle: &Lifecycle) {
    let Some(c) = &lifecycle.concurrency else {
        return;
    };
    let ctx = Ctx::new(scope, "prune_finished");
    let r = crate::keys::KeyGuard::lock(inner, &c.key, &ctx).and_then(|g| g.forget(scope, &ctx));
    if let Err(e) = r {
        tracing::warn!(run = %scope.run_id, key = %c.key, error = %e, "a pruned run's key history could not be rewritten; key_holdings skips runs that no longer exist");
    }
}

/// The sub-run directories of a top-level run, in name order.
fn sub_run_dirs(run_dir: &Path, ctx: &Ctx) -> Result<Vec<PathBuf>> {
    let dir = run_dir.join(CHILDREN_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if sys::is_not_found(&e) => return Ok(Vec::new()),
        Err(e) => return Err(ctx.io("list the sub-runs", &dir, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| ctx.io("list the sub-runs", &dir, e))?;
        let is_dir = e
            .file_type()
            .map_err(|err| ctx.io("inspect a sub-run", &e.path(), err))?
            .is_dir();
        if is_dir {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// A trash name for `scope`'s directory, unique within the process and
/// across processes (the pid).
fn trash_name(inner: &Inner, scope: &RunScope) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    inner.base().join(format!(
        "{TRASH_PREFIX}{}.{}.{n}",
        scope.run_id,
        std::process::id()
    ))
}

/// Removes trash directories a crashed prune left (best effort).
fn sweep_trash(inner: &Inner) {
    let Ok(entries) = std::fs::read_dir(inner.base()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_string_lossy().starts_with(TRASH_PREFIX) {
            let path = e.path();
            // Another process's prune in flight renames, then removes at
            // once; removing its trash early is harmless.
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// [`runkeep::CheckpointStore::prune_finished`] of the root store: each
/// session under the scope in turn, with what is left of the limit. When
/// the limit is reached at the end of a session and sessions remain,
/// `more` is set (they may hold due runs).
pub(crate) async fn prune_across(
    sessions: Vec<(ListingScope, crate::FsStore)>,
    policy: &RetentionPolicy,
    now: Timestamp,
    limit: usize,
) -> Result<PruneReport> {
    use runkeep::CheckpointStore;
    retention::check_limit(limit)?;
    let mut report = PruneReport::default();
    for (session, store) in sessions {
        let left = limit - report.deleted.len();
        if left == 0 {
            report.more = true;
            break;
        }
        let r = store
            .prune_finished(&session, policy, Some(now), left)
            .await?;
        report.scanned += r.scanned;
        report.sub_runs_deleted += r.sub_runs_deleted;
        report.deleted.extend(r.deleted);
        if r.more {
            report.more = true;
            break;
        }
    }
    Ok(report)
}
