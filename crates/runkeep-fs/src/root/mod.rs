//! [`FsRootStore`]: one directory holding many tenants, projects and
//! sessions, each session laid out as the reference lays out one.
//!
//! ```text
//! ROOT/
//!   .runkeep-root.json              ← marks ROOT as a root (layout version)
//!   <tenant>/<project>/<session>/   ← one session directory
//!     runs/                         ← exactly what FsStore::open takes, and
//!       <run>/…                       the reference's `baseDir`
//! ```
//!
//! Every [`RunScope`] is routed to `ROOT/<tenant>/<project>/<session>/runs`
//! and served by an [`FsStore`] bound to that session (opened on first use,
//! cached for the store's life, created on the first write). The ids are
//! path-safe by construction (the core's id rule: `[A-Za-z0-9_-]`, no `.`),
//! so a scope cannot name a directory outside its own session; a tenant,
//! project, session or `runs` directory that is a symbolic link is refused
//! on every per-run call (never followed) and skipped by listings, as
//! [`FsStore`] refuses and skips a symlinked run directory. Tenant isolation
//! on a directory is therefore by path: two tenants never share a
//! directory, whatever ids they use below the tenant.
//!
//! A listing over a tenant or a project merges the sessions' own listings
//! (k-way, in the core's total order: the row key, then project and
//! session) and pages through each session with the page's limit, so a
//! page reads at most `limit + 1` rows of each session, never a session's
//! whole listing. The cursor is the core's ([`runkeep::listing`]): it
//! carries the project and session of its row, so runs sharing an id in
//! several sessions page correctly. `claim_next` over a prefix takes the
//! first claimable run in that same merged order, exactly the rule
//! [`runkeep::MemoryStore`] applies, claiming each candidate through its
//! session's lease.
//!
//! A root and a session are told apart on open: [`FsRootStore::open`]
//! refuses a directory holding `runs/` (a session directory) or `run_*`
//! entries (a session's `runs/`), and [`FsStore::open`] refuses a directory
//! carrying the root marker, each naming the open to use instead.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runkeep::{
    Clock, Error, ListingScope, ProjectId, Result, RunScope, SessionId, SystemClock, TenantId,
    Timestamp,
};

mod across_sessions;
mod layout;
mod prefix_watch;
mod routing;
mod session_cache;

use crate::diagnose::Diagnosis;
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::FsStore;
pub(crate) use layout::refuse_root_as_session;
use layout::{key_of, marker_body, read_marker, refuse_session_as_root};

/// The file that marks a directory as a root of many sessions.
pub const ROOT_MARKER: &str = ".runkeep-root.json";
/// The root layout version this crate writes and reads.
pub const ROOT_LAYOUT_VERSION: u64 = 1;
/// The directory inside a session directory that [`FsStore::open`] takes
/// (the reference's `baseDir`).
pub const SESSION_RUNS_DIR: &str = "runs";
/// Above this many sessions a prefix watch stops adding per-session
/// watches (each holds an inotify thread) and wakes on every rescan
/// instead (once a second).
pub const MAX_WATCHED_SESSIONS: usize = 64;
/// How many candidates `claim_next` reads from a session at a time (the
/// first claimable run is usually near the front; more are read as the
/// merge consumes them).
const CLAIM_FETCH: usize = 32;
/// How often a prefix watch looks for new sessions (and, like a session's
/// own watch, wakes at least this often: a lapsed lease changes no file).
const RESCAN: Duration = Duration::from_secs(1);

/// Options of [`FsRootStore::open`]: those of [`crate::FsOptions`] that apply to
/// every session (attribution comes from each run's scope). The default is
/// that of [`crate::FsOptions`].
#[derive(Clone, Debug)]
pub struct FsRootOptions {
    /// The durability level of every session.
    pub durability: Durability,
    /// Open for reading only: nothing is created (no marker, no session
    /// directory, no hard-link probe), and every write is refused with
    /// [`Error::Unsupported`]. The root must exist and carry the marker.
    pub read_only: bool,
    /// The store's clock, shared by every session (`None`: the machine
    /// clock).
    pub clock: Option<Arc<dyn Clock>>,
    /// The prune grace period of every session
    /// ([`crate::FsOptions::prune_grace`]; default
    /// [`crate::FsOptions::DEFAULT_PRUNE_GRACE`]).
    pub prune_grace: Duration,
}

impl Default for FsRootOptions {
    fn default() -> Self {
        Self {
            durability: Durability::default(),
            read_only: false,
            clock: None,
            prune_grace: crate::options::FsOptions::DEFAULT_PRUNE_GRACE,
        }
    }
}

/// A session under a root: its directory is
/// `<tenant>/<project>/<session>/`. Ordered tenant, project, session (the
/// order sessions are listed in).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct SessionKey {
    tenant_id: TenantId,
    project_id: ProjectId,
    session_id: SessionId,
}

/// A directory store of many tenants. Cheap to clone; safe to share
/// between threads and (through the directory) between processes.
#[derive(Clone)]
pub struct FsRootStore {
    inner: Arc<RootInner>,
}

struct RootInner {
    root: PathBuf,
    durability: Durability,
    read_only: bool,
    clock: Arc<dyn Clock>,
    prune_grace: Duration,
    sessions: Mutex<HashMap<SessionKey, FsStore>>,
    /// Rows read from sessions' listings (what a page cost; a test seam).
    fetched: Arc<AtomicU64>,
    /// Test seam: a pause before `claim_next`'s first claim.
    #[cfg(feature = "testing")]
    pause: Mutex<Option<ClaimPause>>,
}

/// Where `claim_next` pauses once (test seam): the candidate it is about
/// to claim is recorded, then it waits at the barrier.
#[cfg(feature = "testing")]
type ClaimPause = (Arc<tokio::sync::Barrier>, Arc<Mutex<Vec<RunScope>>>);

impl fmt::Debug for FsRootStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FsRootStore")
            .field("root", &self.inner.root)
            .field("durability", &self.inner.durability)
            .field("read_only", &self.inner.read_only)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl FsRootStore {
    /// Opens (creating if missing) a root of many sessions.
    ///
    /// Refused with [`Error::InvalidInput`]: a directory that is one
    /// session (it holds `runs/`, or `run_*` directories) — the message
    /// says to open it with [`FsStore::open`]. A root is marked with
    /// [`ROOT_MARKER`] when first opened; nothing else is created until a
    /// run is written. With [`FsRootOptions::read_only`] nothing is
    /// created: a missing root is [`Error::NotFound`], one without the
    /// marker is refused.
    pub fn open(root: impl AsRef<Path>, options: FsRootOptions) -> Result<FsRootStore> {
        let ctx = Ctx::store("open");
        let root =
            std::path::absolute(root.as_ref()).unwrap_or_else(|_| root.as_ref().to_path_buf());
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "{} is not a directory; a root of many sessions is a directory",
                    root.display()
                )))
            }
            Err(e) if sys::is_not_found(&e) && options.read_only => {
                return Err(Error::NotFound {
                    what: format!(
                        "a root of many sessions at {} (opened read-only, so it is not created; the first write creates it)",
                        root.display()
                    ),
                })
            }
            Err(e) if sys::is_not_found(&e) => sys::ensure_dir(&root, options.durability)
                .map_err(|e| ctx.io("create the root directory", &root, e))?,
            Err(e) => return Err(ctx.io("open the root directory", &root, e)),
        }
        let marked = read_marker(&root)?;
        if !marked {
            refuse_session_as_root(&root)?;
            if options.read_only {
                return Err(Error::invalid(format!(
                    "{} is not a runkeep root (no {ROOT_MARKER}); opened read-only, it is not marked: open it once for writing, or check the path",
                    root.display()
                )));
            }
            let body = sys::record_json(&marker_body());
            sys::write_atomic(&root, ROOT_MARKER, &body, options.durability)
                .map_err(|e| ctx.io("write the root marker in", &root, e))?;
        }
        Ok(FsRootStore {
            inner: Arc::new(RootInner {
                root,
                durability: options.durability,
                read_only: options.read_only,
                clock: options.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                prune_grace: options.prune_grace,
                sessions: Mutex::new(HashMap::new()),
                fetched: Arc::new(AtomicU64::new(0)),
                #[cfg(feature = "testing")]
                pause: Mutex::new(None),
            }),
        })
    }

    /// The test seams of this root, behind one door (feature `testing`).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn testing(&self) -> crate::testing::RootSeams<'_> {
        crate::testing::RootSeams(self)
    }

    /// The root directory (absolute).
    pub fn root_dir(&self) -> &Path {
        &self.inner.root
    }

    /// The directory of one session: `ROOT/<tenant>/<project>/<session>`
    /// (it holds `runs/`, the reference's session layout). Pure.
    pub fn session_dir(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        session: &SessionId,
    ) -> PathBuf {
        self.inner
            .root
            .join(tenant.as_str())
            .join(project.as_str())
            .join(session.as_str())
    }

    /// The `runs/` directory of a run's session: what [`FsStore::open`]
    /// takes to open that session alone. Pure.
    pub fn runs_dir(&self, scope: &RunScope) -> PathBuf {
        self.session_dir(&scope.tenant_id, &scope.project_id, &scope.session_id)
            .join(SESSION_RUNS_DIR)
    }

    /// The directory of a run (inside its session's `runs/`). Pure.
    pub fn run_dir(&self, scope: &RunScope) -> PathBuf {
        let runs = self.runs_dir(scope);
        match &scope.parent_run_id {
            Some(p) => runs
                .join(p.as_str())
                .join("children")
                .join(scope.run_id.as_str()),
            None => runs.join(scope.run_id.as_str()),
        }
    }

    /// The session store of an existing session (`None` when the session
    /// has no directory yet), for what only a directory store does (the
    /// doctor's checks, a run's top holding). Creates nothing.
    pub fn session_store(&self, scope: &RunScope) -> Result<Option<FsStore>> {
        self.inner.existing(&key_of(scope))
    }

    /// The sessions under `scope` that have a directory, in (project,
    /// session) order, with their stores. Symlinked entries are skipped
    /// (see [`FsRootStore::diagnose`]).
    pub fn sessions(&self, scope: &ListingScope) -> Result<Vec<(ListingScope, FsStore)>> {
        Ok(self
            .inner
            .sessions_under(scope)?
            .into_iter()
            .map(|(k, s)| {
                (
                    ListingScope::session(k.tenant_id, k.project_id, k.session_id),
                    s,
                )
            })
            .collect())
    }

    /// A read-only health scan of every session under `scope`: each
    /// session's own scan ([`FsStore::diagnose`]) summed, plus a tenant,
    /// project, session or `runs` entry that is a symbolic link (listed in
    /// `unreadable`: runkeep never follows it).
    pub fn diagnose(&self, scope: &ListingScope, now: Timestamp) -> Result<Diagnosis> {
        let mut d = Diagnosis::default();
        for (_, store) in self.inner.sessions_under(scope)? {
            let s = store.diagnose(now)?;
            d.runs_scanned += s.runs_scanned;
            d.scratch_leftovers.extend(s.scratch_leftovers);
            d.torn_transcripts.extend(s.torn_transcripts);
            d.damaged_checkpoints.extend(s.damaged_checkpoints);
            d.oversized_claims.extend(s.oversized_claims);
            d.damaged_transcripts.extend(s.damaged_transcripts);
            d.unreadable.extend(s.unreadable);
            d.expired_unreclaimed.extend(s.expired_unreclaimed);
            d.unreadable_holdings.extend(s.unreadable_holdings);
            d.fence_ceiling.extend(s.fence_ceiling);
            d.fenced_out_refusals.extend(s.fenced_out_refusals);
        }
        for link in self.inner.links_under(scope)? {
            d.unreadable.push((
                link,
                "a symbolic link: runkeep never follows a link out of the root, so the sessions behind it are neither listed nor written".into(),
            ));
        }
        Ok(d)
    }
}

#[cfg(feature = "testing")]
impl crate::testing::RootSeams<'_> {
    /// Test seam: rows read from the sessions' listings so far.
    #[doc(hidden)]
    pub fn rows_fetched(&self) -> u64 {
        self.0
            .inner
            .fetched
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Test seam: the next `claim_next` records the first candidate it is
    /// about to claim in `seen`, then waits at `barrier` before claiming it
    /// (two callers made to race for one run).
    #[doc(hidden)]
    pub fn pause_first_claim(
        &self,
        barrier: Arc<tokio::sync::Barrier>,
        seen: Arc<Mutex<Vec<RunScope>>>,
    ) {
        *self.0.inner.pause.lock().unwrap_or_else(|p| p.into_inner()) = Some((barrier, seen));
    }
}
