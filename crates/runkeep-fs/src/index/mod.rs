//! The session index: what a listing page and `claim_next` consult instead
//! of walking every run directory, so a page costs O(page).
//!
//! # What it holds, and where
//!
//! One entry per run directory at both levels (`<base>/run_*`,
//! `<base>/run_*/children/run_*`), each with a small [`Summary`] of the run's
//! row: whether it is a row at all, damaged or not, its `runCreatedAt` (the
//! created-at key), lifecycle status, deferral, when its live lease ends and
//! when its parks change state. That is enough to order every row in both
//! orders and to decide the park, claimed and status filters (and
//! claimability) at any instant, so a page visits only the entries it
//! returns (plus the ones a filter rejects, decided in memory); each row on
//! the page is still built from the run's files, exactly as the walk builds
//! it, and the entry is corrected from what was read.
//!
//! Where each part lives, top-down: this file keeps the lifecycle of the
//! index (built, refused, rebuilt) and its test seams; `store.rs` its
//! state, the tables and every change to them; `sweep.rs` the stamps and
//! the sweeper; `summary.rs` the summary and the filters; `outlook.rs` what
//! it needs from the machine (`runkeep doctor`); `common.rs`, below them
//! all, the run directories it watches (keys, kinds, masks), `Refusal` and
//! `Found`.
//!
//! The entries and both orders live in an ordered on-disk B-tree (redb) in
//! an unnamed temporary file (`O_TMPFILE` on the store's filesystem, else
//! the system temporary directory), with a fixed page cache
//! ([`store::CACHE_BYTES`]): the process keeps nothing per run in memory, so a
//! listing's resident memory does not grow with the store. The file is
//! scratch — never synced for durability, gone with the process, rebuilt by
//! the next one — and a failure of it drops the index (the listing walks).
//!
//! # How it stays true: inotify, not trust
//!
//! The index never believes it saw every write. Every directory a row
//! depends on is watched with inotify — the store directory, each run
//! directory, its `checkpoints/`, `claims/` and `.runkeep/` (for the
//! lifecycle record), and each `children/` — and every listing first drains
//! the events queued since the last one and re-reads the runs they name:
//! O(changed runs), whoever changed them (this process, another runkeep
//! process, the reference implementation, a hand edit). The kernel queues an
//! event before the changing system call returns, so a change whose call
//! returned before the listing started is in the drained queue: the
//! listing sees it (nothing is seen *late* on a local filesystem). Watches
//! are added before a directory is read, so a change racing the first read
//! is either read or queued.
//!
//! Where this cannot be honoured the index is not used and the listing walks
//! the directories as before (correct, O(runs) per page), with one log line
//! saying why:
//! - a network or FUSE filesystem (NFS, SMB, 9p, Ceph, …: inotify does not
//!   see other hosts' writes);
//! - inotify unavailable;
//! - after an inotify queue overflow the index is rebuilt (one walk).
//!
//! # Over the watch budget: swept by stamp
//!
//! A run directory costs up to five watches (see [`common::watched_dirs`]) from a
//! per-user limit (`fs.inotify.max_user_watches`). The indexes of one
//! process hold at most half of that limit together (a second listing
//! process and the user's other inotify users keep theirs), or less if
//! `add_watch` says the limit is reached. Run directories past it are **swept** instead: each keeps the
//! [`sweep::Stamp`] of its directories taken before it was read, and a sweeper
//! thread compares every swept stamp with the directories at least every
//! [`sweep::SWEEP_EVERY`] (pausing four times as long as a pass took) and re-reads
//! the runs whose stamp moved or was too young to trust. A run read as not
//! finished whose stamp moves takes the watches of a finished one (which is
//! then swept; at most 256 per transaction, never during a build: each
//! dropped watch queues an event), so the runs that keep changing see every
//! change at once. What a swept run's
//! row sees late, and the bound: a change that adds, removes or renames a
//! name in the run's directory, `checkpoints/`, `claims/`, `.runkeep/` or
//! `children/` (every write of this store and of the reference does) is in
//! the index after the next sweep pass that starts after it — within one
//! pause plus two passes; a change that rewrites a file in place without
//! touching a name (a hand edit with `>`) is not seen until the run's next
//! such change. A page's rows are read from the files anyway; what is late
//! is a swept run's place in the order and its filters.
//!
//! What the kernel does not report, and the index therefore sees late (at
//! the run's next reported change, or never): a change written through a
//! shared memory mapping (`mmap`, no `IN_MODIFY`), bytes changed beneath the
//! filesystem (block device, another host on a shared block device), and a
//! row that changes with time only (a lease lapsing, a park deadline, a
//! deferral ending) — which is not a change at all: the summary keeps the
//! instants and every filter is judged at the page's `now`.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use runkeep::listing::RowKey;
use runkeep::{ListOrder, Timestamp};

// Top-down: this file (the index's life) uses the store and the sweeper;
// they use the summary and what every part shares (`common`).
mod common;
mod outlook;
mod store;
mod summary;
mod sweep;

pub(crate) use common::Found;
use common::{remote, Refusal};
pub use outlook::IndexOutlook;
use store::{refused, BuildHook, BuildSettings, Built, State};
pub(crate) use summary::Summary;

/// The index of one store (shared by its clones and its build thread).
#[derive(Default)]
pub(crate) struct SessionIndex {
    state: Arc<Mutex<State>>,
    hook: Mutex<Option<BuildHook>>,
    /// Test seams: the watch budget and racy window of the next build.
    settings: Mutex<BuildSettings>,
    /// Test seam: the sweeper skips its passes while set.
    sweeper_paused: Arc<AtomicBool>,
}

/// Index builds running in this process, and how many may.
static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const MAX_BUILDS: usize = 2;

/// Builds the index of `base` and installs it, unless the state moved on.
fn build_into(
    state: &Arc<Mutex<State>>,
    base: &Path,
    hook: Option<BuildHook>,
    settings: BuildSettings,
    paused: &Arc<AtomicBool>,
) {
    let built = match remote(base) {
        Some(why) => Err(Refusal(why)),
        None => Built::build(base, hook, settings),
    };
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*st, State::Building) {
        *st = match built {
            Ok(mut b) => {
                if b.tally.swept > 0 {
                    tracing::warn!(
                        "the index of {} holds {} inotify watches (its budget: half of fs.inotify.max_user_watches); {} run directories past it are swept by stamp, so other processes' changes to them are seen within seconds rather than at once (raise fs.inotify.max_user_watches, e.g. `sysctl fs.inotify.max_user_watches=1048576`)",
                        base.display(),
                        b.tally.watches,
                        b.tally.swept
                    );
                }
                b.ensure_sweeper(state, paused);
                State::Built(Box::new(b))
            }
            Err(Refusal(why)) => refused(base, why),
        };
    }
}

impl SessionIndex {
    /// Starts the build on a background thread (the caller holds the lock
    /// and has seen `Unbuilt`): the listing that needs the index first
    /// walks, so a one-shot listing (a CLI call) costs what the walk costs.
    fn start_build(&self, st: &mut State, base: &Path) {
        use std::sync::atomic::Ordering;
        if BUILDS.fetch_add(1, Ordering::SeqCst) >= MAX_BUILDS {
            // Enough builds running in this process (a root store opening
            // many sessions): stay unbuilt, walk, and try at the next page.
            BUILDS.fetch_sub(1, Ordering::SeqCst);
            *st = State::Unbuilt;
            return;
        }
        *st = State::Building;
        let (state, dir) = (self.state.clone(), base.to_path_buf());
        let hook = self.hook.lock().unwrap_or_else(|p| p.into_inner()).take();
        let settings = *self.settings.lock().unwrap_or_else(|p| p.into_inner());
        let paused = self.sweeper_paused.clone();
        let spawned = std::thread::Builder::new()
            .name("runkeep-fs-index".into())
            .spawn(move || {
                build_into(&state, &dir, hook, settings, &paused);
                BUILDS.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            BUILDS.fetch_sub(1, Ordering::SeqCst);
            *st = refused(base, format!("cannot start the index thread ({e})"));
        }
    }

    /// Runs `f` on the index brought up to date with the directory, or
    /// answers `None` when the index cannot be used (yet): the caller walks.
    fn with<T>(&self, base: &Path, f: impl FnOnce(&Built) -> Result<T, Refusal>) -> Option<T> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *st {
            State::Refused(_) | State::Building => None,
            State::Unbuilt => {
                self.start_build(&mut st, base);
                None
            }
            State::Built(b) => match b.sync() {
                Ok(true) => match f(b) {
                    Ok(v) => {
                        b.ensure_sweeper(&self.state, &self.sweeper_paused);
                        Some(v)
                    }
                    Err(Refusal(why)) => {
                        *st = refused(base, why);
                        None
                    }
                },
                Ok(false) => {
                    tracing::info!(
                        "the directory store's index at {} missed events (inotify queue overflow); rebuilding it",
                        base.display()
                    );
                    self.start_build(&mut st, base);
                    None
                }
                Err(Refusal(why)) => {
                    *st = refused(base, why);
                    None
                }
            },
        }
    }

    /// Up to `want` candidates after `after` in `order` whose summary passes
    /// `keep`, from an index brought up to date first; `None` when the index
    /// cannot be used (yet).
    pub(crate) fn candidates(
        &self,
        base: &Path,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        keep: &dyn Fn(&Summary) -> bool,
    ) -> Option<Vec<Found>> {
        self.with(base, |b| b.scan(order, after, want, keep))
    }

    /// [`Self::candidates`] in `claim_next`'s order for `order` (priority
    /// first, [`runkeep::RunRow::claim_key`]), the streams of keys `skip`
    /// answers true for (at their limit) dropped unvisited; `skip` is given
    /// the key's live leases at `now` as the index has them.
    #[expect(
        clippy::too_many_arguments,
        reason = "the scan's inputs, passed straight through to the built index"
    )]
    pub(crate) fn claim_candidates_skipping(
        &self,
        base: &Path,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        now: Timestamp,
        keep: &dyn Fn(&Summary) -> bool,
        skip: &dyn Fn(&str, u32, u32) -> bool,
    ) -> Option<Vec<Found>> {
        self.with(base, |b| b.scan_claim(order, after, want, now, keep, skip))
    }

    /// Corrects a run's entry from a read the caller made after the index
    /// answered, unless the entry was re-read since (then the read may be
    /// older than the entry). A change after the read is still queued and
    /// re-read at the next sync (or, for a swept run, moves its stamp and
    /// is re-read at the next sweep).
    pub(crate) fn reconcile(&self, found: &Found, summary: Option<Summary>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State::Built(b) = &mut *st else { return };
        let key = (found.candidate.parent.clone(), found.candidate.run.clone());
        // Read first: a write transaction only when the entry is wrong.
        let stale = match b.entry(&key) {
            Ok(e) => e.is_some_and(|e| e.generation == found.generation && e.summary != summary),
            Err(_) => false,
        };
        if stale {
            if let Err(Refusal(why)) = b.write(|w| w.set_summary(&key, summary)) {
                *st = refused(b.base.clone().as_path(), why);
            }
        }
    }

    /// Whether the index is in use, and why not (tests, benches).
    #[cfg(feature = "testing")]
    pub(crate) fn status(&self) -> std::result::Result<usize, String> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*st {
            State::Built(b) => Ok(b.tally.entries),
            State::Refused(why) => Err(why.clone()),
            State::Unbuilt => Err("not built yet (the first listing starts it)".into()),
            State::Building => Err("being built".into()),
        }
    }

    /// `(entries, swept, watches held)` of the built index (tests).
    #[cfg(feature = "testing")]
    pub(crate) fn counts(&self) -> std::result::Result<(usize, usize, u64), String> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*st {
            State::Built(b) => Ok((b.tally.entries, b.tally.swept, b.tally.watches)),
            _ => Err("the index is not built".into()),
        }
    }

    /// Evictions the built index made (tests).
    #[cfg(feature = "testing")]
    pub(crate) fn evicted(&self) -> Option<u64> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*st {
            State::Built(b) => Some(b.tally.evicted),
            _ => None,
        }
    }

    /// Starts the build if needed and waits for it (tests, benches).
    #[cfg(feature = "testing")]
    pub(crate) fn wait_built(&self, base: &Path) -> std::result::Result<usize, String> {
        loop {
            {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                match &*st {
                    State::Unbuilt => self.start_build(&mut st, base),
                    State::Building => {}
                    _ => break,
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.status()
    }
}

#[cfg(feature = "testing")]
impl crate::testing::StoreSeams<'_> {
    /// Test seam: never use the session index (every listing walks).
    #[doc(hidden)]
    pub fn disable_index(&self) {
        self.0
            .inner
            .switches
            .switch_off(crate::testing_hooks::Switch::Index);
    }

    /// Test seam: `Ok(run directories indexed)` when the index is in use,
    /// else why not.
    #[doc(hidden)]
    pub fn index_status(&self) -> std::result::Result<usize, String> {
        self.0.inner.index.status()
    }

    /// Test seam: the inotify watches the next index build may hold (the
    /// store directory's included); run directories past it are swept.
    #[doc(hidden)]
    pub fn set_index_watch_budget(&self, watches: u64) {
        self.0
            .inner
            .index
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .watch_budget = Some(watches);
    }

    /// Test seam: stamps of the next index build are trusted however young
    /// (no racy window), so a sweep re-reads only runs whose stamp moved.
    #[doc(hidden)]
    pub fn trust_young_index_stamps(&self) {
        self.0
            .inner
            .index
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .racy_ns = Some(0);
    }

    /// Test seam: the index's background sweeper skips its passes while
    /// `paused` (so a test decides when a sweep happens).
    #[doc(hidden)]
    pub fn pause_index_sweeper(&self, paused: bool) {
        self.0
            .inner
            .index
            .sweeper_paused
            .store(paused, std::sync::atomic::Ordering::Relaxed);
    }

    /// Test seam: one sweep pass now; `Some((checked, re-read))`.
    #[doc(hidden)]
    pub fn index_sweep(&self) -> Option<(usize, usize)> {
        sweep::sweep_pass(&self.0.inner.index.state, false)
    }

    /// Test seam: `(run directories indexed, swept by stamp, inotify
    /// watches held)`.
    #[doc(hidden)]
    pub fn index_counts(&self) -> std::result::Result<(usize, usize, u64), String> {
        self.0.inner.index.counts()
    }

    /// Test seam: how many times the index gave a finished run's watches
    /// to a run that moved; `None` when it is not built.
    #[doc(hidden)]
    pub fn index_evictions(&self) -> Option<u64> {
        self.0.inner.index.evicted()
    }

    /// Test seam: runs `f` inside the next index build, after the store
    /// directory was read and before any run directory is.
    #[doc(hidden)]
    pub fn on_index_build(&self, f: impl FnOnce() + Send + 'static) {
        *self
            .0
            .inner
            .index
            .hook
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    /// Test seam: starts building the index if needed and waits for it;
    /// answers as [`StoreSeams::index_status`](crate::testing::StoreSeams::index_status).
    #[doc(hidden)]
    pub fn wait_index(&self) -> std::result::Result<usize, String> {
        self.0.inner.index.wait_built(self.0.inner.base())
    }

    /// Test seam: the listing by walking every run directory, never the
    /// index (the oracle the index is checked against).
    #[doc(hidden)]
    pub fn list_runs_walk(
        &self,
        scope: &runkeep::ListingScope,
        options: &runkeep::ListOptions,
    ) -> runkeep::Result<runkeep::RunPage> {
        crate::listing::list_runs_walk(&self.0.inner, scope, options)
    }

    /// Test seam: every `claim_next` candidate of `options` (claimed
    /// `false`, its filters and instant) in `claim_next`'s order, read page
    /// by page from the index (`walk` false) or by the walk.
    #[doc(hidden)]
    pub fn claim_order(
        &self,
        scope: &runkeep::ListingScope,
        options: &runkeep::ListOptions,
        walk: bool,
    ) -> runkeep::Result<Vec<runkeep::RunRow>> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let (rows, next) =
                crate::listing::claim_page_with(&self.0.inner, scope, options, after, !walk)?;
            out.extend(rows);
            match next {
                Some(k) => after = Some(k),
                None => return Ok(out),
            }
        }
    }
}
