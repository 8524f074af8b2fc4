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

use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::listing::{ListQuery, RowKey, MAX_LIMIT};
use runkeep::watch::{Watch, WatchTopic, DEFAULT_POLL};
use runkeep::{
    AuditRecord, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Clock,
    Error, EventBatch, EvidenceStore, Fence, Lease, LeaseSummary, ListOptions, ListingScope,
    MessageSnapshot, NewAuditEvent, NewEvent, ParkResolution, PersistedEvent, ProjectId,
    ReadEventsOptions, Result, RunDigest, RunPage, RunRecord, RunRow, RunScope, SessionId,
    SystemClock, TenantId, Timestamp,
};
use serde_json::Value;

use crate::sys::{self, Ctx};
use crate::{blocking, Attribution, Diagnosis, Durability, FsOptions, FsStore};

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

/// Options of [`FsRootStore::open`]: those of [`FsOptions`] that apply to
/// every session (attribution comes from each run's scope).
#[derive(Clone, Debug, Default)]
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
}

/// A session under a root.
type SessionKey = (TenantId, ProjectId, SessionId);

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

/// What a root directory holds, besides what a root may hold.
enum Shape {
    /// Empty, or only what a root holds.
    Root,
    /// It holds `runs/`: a session directory.
    SessionDir,
    /// It holds `run_*` directories or `index.json`: a session's `runs/`.
    RunsDir,
}

fn shape_of(dir: &Path) -> Result<Shape> {
    let ctx = Ctx::store("open");
    let items = sys::list_dir(dir)
        .map_err(|e| ctx.io("list", dir, e))?
        .unwrap_or_default();
    if items
        .iter()
        .any(|i| i.name == SESSION_RUNS_DIR && i.file_type.is_dir())
    {
        return Ok(Shape::SessionDir);
    }
    if items.iter().any(|i| {
        (crate::listing::is_listed_run_name(&i.name) && i.file_type.is_dir())
            || i.name == "index.json"
    }) {
        return Ok(Shape::RunsDir);
    }
    Ok(Shape::Root)
}

/// Refuses a directory that is a session, not a root, naming the open to
/// use instead.
fn refuse_session_as_root(dir: &Path) -> Result<()> {
    match shape_of(dir)? {
        Shape::Root => Ok(()),
        Shape::SessionDir => Err(Error::invalid(format!(
            "{} is one session's directory (it holds {SESSION_RUNS_DIR}/), not a root of many sessions; open {}/{SESSION_RUNS_DIR} as one session (FsStore::open; CLI: --store fs:{}/{SESSION_RUNS_DIR}), or give the root another, empty directory",
            dir.display(),
            dir.display(),
            dir.display()
        ))),
        Shape::RunsDir => Err(Error::invalid(format!(
            "{} is one session's runs/ directory (it holds run_* directories or index.json), not a root of many sessions; open it as one session (FsStore::open; CLI: --store fs:{}), or give the root another, empty directory",
            dir.display(),
            dir.display()
        ))),
    }
}

/// Refuses to open a root of many sessions as one session's `runs/`
/// directory ([`FsStore::open`] calls it): its runs would be written
/// beside the tenants, outside every session.
pub(crate) fn refuse_root_as_session(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir.join(ROOT_MARKER)) {
        Ok(_) => Err(Error::invalid(format!(
            "{} is a root of many sessions ({ROOT_MARKER}), not one session's runs/ directory; open it with FsRootStore::open (CLI: --store root:{}), or open one session's directory {}/<tenant>/<project>/<session>/{SESSION_RUNS_DIR}",
            dir.display(),
            dir.display(),
            dir.display()
        ))),
        Err(_) => Ok(()),
    }
}

fn marker_body() -> Value {
    serde_json::json!({
        "runkeepRoot": ROOT_LAYOUT_VERSION,
        "layout": "<tenant>/<project>/<session>/runs",
    })
}

/// Reads the marker: `Ok(false)` when absent; a newer layout is refused.
fn read_marker(root: &Path) -> Result<bool> {
    let ctx = Ctx::store("open");
    let path = root.join(ROOT_MARKER);
    let Some(bytes) = sys::read_opt(&path).map_err(|e| ctx.io("read the root marker", &path, e))?
    else {
        return Ok(false);
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|_| ctx.corrupted(&path, "the root marker is not valid JSON"))?;
    match v.get("runkeepRoot").and_then(Value::as_u64) {
        Some(n) if n <= ROOT_LAYOUT_VERSION => Ok(true),
        Some(n) => Err(Error::Unsupported {
            message: format!(
                "{} declares root layout version {n}, newer than version {ROOT_LAYOUT_VERSION} this runkeep knows; upgrade runkeep",
                path.display()
            ),
        }),
        None => Err(ctx.corrupted(&path, "the root marker has no runkeepRoot version")),
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
            let body = sys::pretty(&marker_body());
            sys::write_atomic(&root, ROOT_MARKER, &body, options.durability)
                .map_err(|e| ctx.io("write the root marker in", &root, e))?;
        }
        Ok(FsRootStore {
            inner: Arc::new(RootInner {
                root,
                durability: options.durability,
                read_only: options.read_only,
                clock: options.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                sessions: Mutex::new(HashMap::new()),
                fetched: Arc::new(AtomicU64::new(0)),
                #[cfg(feature = "testing")]
                pause: Mutex::new(None),
            }),
        })
    }

    /// Test seam: rows read from the sessions' listings so far.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn testing_rows_fetched(&self) -> u64 {
        self.inner.fetched.load(Ordering::Relaxed)
    }

    /// Test seam: the next `claim_next` records the first candidate it is
    /// about to claim in `seen`, then waits at `barrier` before claiming it
    /// (two callers made to race for one run).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn testing_pause_first_claim(
        &self,
        barrier: Arc<tokio::sync::Barrier>,
        seen: Arc<Mutex<Vec<RunScope>>>,
    ) {
        *self.inner.pause.lock().unwrap_or_else(|p| p.into_inner()) = Some((barrier, seen));
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
            .map(|(k, s)| (ListingScope::session(k.0, k.1, k.2), s))
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

fn key_of(scope: &RunScope) -> SessionKey {
    (
        scope.tenant_id.clone(),
        scope.project_id.clone(),
        scope.session_id.clone(),
    )
}

fn session_scope(k: &SessionKey) -> ListingScope {
    ListingScope::session(k.0.clone(), k.1.clone(), k.2.clone())
}

impl RootInner {
    fn session_path(&self, k: &SessionKey) -> PathBuf {
        self.root
            .join(k.0.as_str())
            .join(k.1.as_str())
            .join(k.2.as_str())
            .join(SESSION_RUNS_DIR)
    }

    /// Refuses a session whose tenant, project, session or `runs`
    /// directory is a symbolic link (or not a directory). `Ok(false)` when
    /// the session has no `runs/` directory yet.
    fn check_path(&self, k: &SessionKey) -> Result<bool> {
        let mut path = self.root.clone();
        for part in [k.0.as_str(), k.1.as_str(), k.2.as_str(), SESSION_RUNS_DIR] {
            path.push(part);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = std::fs::read_link(&path)
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|_| "?".into());
                    return Err(Error::Unsupported {
                        message: format!(
                            "session {}/{}/{}: {} is a symbolic link (to {target}); runkeep never follows a link out of the root, so this session can be neither read nor written. Move the directory into the root in place of the link, or remove the link",
                            k.0,
                            k.1,
                            k.2,
                            path.display()
                        ),
                    });
                }
                Ok(m) if !m.is_dir() => {
                    return Err(Error::invalid(format!(
                        "session {}/{}/{}: {} is not a directory; a root holds <tenant>/<project>/<session>/{SESSION_RUNS_DIR}/ directories only",
                        k.0,
                        k.1,
                        k.2,
                        path.display()
                    )))
                }
                Ok(_) => {}
                Err(e) if sys::is_not_found(&e) => return Ok(false),
                Err(e) => {
                    return Err(Ctx::store("open a session").io(
                        "inspect the session directory",
                        &path,
                        e,
                    ))
                }
            }
        }
        Ok(true)
    }

    fn cached(&self, k: &SessionKey) -> Option<FsStore> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(k)
            .cloned()
    }

    fn open_session(&self, k: &SessionKey) -> Result<FsStore> {
        let store = FsStore::open(
            self.session_path(k),
            FsOptions {
                attribution: Some(Attribution {
                    tenant_id: k.0.clone(),
                    project_id: k.1.clone(),
                    session_id: k.2.clone(),
                }),
                durability: self.durability,
                read_only: self.read_only,
                clock: Some(self.clock.clone()),
            },
        )?;
        let mut cache = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cache.entry(k.clone()).or_insert(store).clone())
    }

    /// The store of a session that exists; `None` (and nothing created)
    /// when it does not.
    fn existing(&self, k: &SessionKey) -> Result<Option<FsStore>> {
        if !self.check_path(k)? {
            return Ok(None);
        }
        if let Some(s) = self.cached(k) {
            return Ok(Some(s));
        }
        self.open_session(k).map(Some)
    }

    /// The store of a session, creating its directory (a call that may
    /// write). Refused on a read-only root before anything is created.
    fn creating(&self, k: &SessionKey) -> Result<FsStore> {
        if self.read_only {
            return Err(Error::Unsupported {
                message: format!(
                    "the root at {} was opened read-only, so it refuses writes; open it without `read_only` to write",
                    self.root.display()
                ),
            });
        }
        if self.check_path(k)? {
            if let Some(s) = self.cached(k) {
                return Ok(s);
            }
        }
        let store = match self.open_session(k) {
            Ok(s) => s,
            // Another process tidied the directory away between the open's
            // create and its check (a refused call of its own): once more.
            Err(_) if !self.check_path(k)? => self.open_session(k)?,
            Err(e) => return Err(e),
        };
        // Created by the open: a link swapped in meanwhile is refused too.
        self.check_path(k)?;
        Ok(store)
    }

    /// Directory names under `dir` that are ids, skipping symlinks and
    /// anything else that is not a plain directory.
    fn child_ids<T>(dir: &Path, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>> {
        let ctx = Ctx::store("list sessions");
        let items = sys::list_dir(dir)
            .map_err(|e| ctx.io("list", dir, e))?
            .unwrap_or_default();
        Ok(items
            .into_iter()
            .filter(|i| i.file_type.is_dir())
            .filter_map(|i| parse(&i.name))
            .collect())
    }

    /// The existing sessions under a prefix, in (project, session) order.
    fn session_keys(&self, scope: &ListingScope) -> Result<Vec<SessionKey>> {
        let t = scope.tenant_id().clone();
        let tenant_dir = self.root.join(t.as_str());
        if std::fs::symlink_metadata(&tenant_dir).is_ok_and(|m| !m.is_dir()) {
            return Ok(Vec::new());
        }
        let projects = match scope.project_id() {
            Some(p) => vec![p.clone()],
            None => Self::child_ids(&tenant_dir, |n| ProjectId::new(n).ok())?,
        };
        let mut out = Vec::new();
        for p in projects {
            let project_dir = tenant_dir.join(p.as_str());
            if std::fs::symlink_metadata(&project_dir).is_ok_and(|m| !m.is_dir()) {
                continue;
            }
            let sessions = match scope.session_id() {
                Some(s) => vec![s.clone()],
                None => Self::child_ids(&project_dir, |n| SessionId::new(n).ok())?,
            };
            for s in sessions {
                let runs = project_dir.join(s.as_str()).join(SESSION_RUNS_DIR);
                let session_dir = project_dir.join(s.as_str());
                let plain = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
                if plain(&session_dir) && plain(&runs) {
                    out.push((t.clone(), p.clone(), s));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn sessions_under(&self, scope: &ListingScope) -> Result<Vec<(SessionKey, FsStore)>> {
        let mut out = Vec::new();
        for k in self.session_keys(scope)? {
            match self.existing(&k) {
                Ok(Some(s)) => out.push((k, s)),
                // Vanished, or swapped for a link since it was listed.
                Ok(None) | Err(Error::Unsupported { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Tenant, project, session and `runs` entries under a prefix that are
    /// symbolic links (what listings skip).
    fn links_under(&self, scope: &ListingScope) -> Result<Vec<PathBuf>> {
        let ctx = Ctx::store("diagnose");
        let is_link =
            |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
        let links = |dir: &Path| -> Result<Vec<PathBuf>> {
            Ok(sys::list_dir(dir)
                .map_err(|e| ctx.io("list", dir, e))?
                .unwrap_or_default()
                .into_iter()
                .filter(|i| i.file_type.is_symlink() && !i.name.starts_with('.'))
                .map(|i| dir.join(i.name))
                .collect())
        };
        let mut out = Vec::new();
        let tenant_dir = self.root.join(scope.tenant_id().as_str());
        if is_link(&tenant_dir) {
            return Ok(vec![tenant_dir]);
        }
        let projects: Vec<PathBuf> = match scope.project_id() {
            Some(p) => vec![tenant_dir.join(p.as_str())],
            None => {
                out.extend(links(&tenant_dir)?);
                Self::child_ids(&tenant_dir, |n| Some(tenant_dir.join(n)))?
            }
        };
        for project_dir in projects {
            if is_link(&project_dir) {
                out.push(project_dir);
                continue;
            }
            let sessions: Vec<PathBuf> = match scope.session_id() {
                Some(s) => vec![project_dir.join(s.as_str())],
                None => {
                    out.extend(links(&project_dir)?);
                    Self::child_ids(&project_dir, |n| Some(project_dir.join(n)))?
                }
            };
            for session_dir in sessions {
                let runs = session_dir.join(SESSION_RUNS_DIR);
                if is_link(&session_dir) {
                    out.push(session_dir);
                } else if is_link(&runs) {
                    out.push(runs);
                }
            }
        }
        Ok(out)
    }
}

/// One session's rows in order, read a page at a time.
struct Stream {
    store: FsStore,
    scope: ListingScope,
    rows: VecDeque<RunRow>,
    next: Option<String>,
}

/// The k-way merge of the sessions' listings in the core's order.
struct Merge {
    fetched: Arc<AtomicU64>,
    order: runkeep::ListOrder,
    options: ListOptions,
    streams: Vec<Stream>,
    heads: BinaryHeap<std::cmp::Reverse<(RowKey, usize)>>,
}

impl Merge {
    /// Starts every session's listing after the query's cursor. `options`
    /// are what each session is asked (filters, the page's instant, the
    /// fetch size); the cursor is re-issued for each session's scope.
    async fn start(
        fetched: Arc<AtomicU64>,
        sessions: Vec<(SessionKey, FsStore)>,
        query: &ListQuery,
        options: ListOptions,
    ) -> Result<Self> {
        let mut m = Merge {
            fetched,
            order: query.order,
            options,
            streams: Vec::with_capacity(sessions.len()),
            heads: BinaryHeap::new(),
        };
        for (k, store) in sessions {
            let scope = session_scope(&k);
            // The same position as a cursor the session's listing accepts
            // (bound to its scope, order and filters; a session's keys
            // carry no tie-break): strictly after the cursor's run in the
            // cursor's own session and before it, and from that run on
            // (just before it) in a session that sorts after it.
            let cursor = match &query.after {
                Some(after) => {
                    let later = after.has_tie()
                        && (k.1.as_str(), k.2.as_str())
                            > (after.project.as_str(), after.session.as_str());
                    let at = if later {
                        after.just_before()
                    } else {
                        after.without_tie()
                    };
                    Some(ListQuery::new(&scope, &m.options)?.encode_cursor(&at))
                }
                None => None,
            };
            m.streams.push(Stream {
                store,
                scope,
                rows: VecDeque::new(),
                next: cursor,
            });
            let i = m.streams.len() - 1;
            m.fetch(i, true).await?;
        }
        Ok(m)
    }

    /// Reads the next page of stream `i` (the first one with `first`) and
    /// queues its head.
    async fn fetch(&mut self, i: usize, first: bool) -> Result<()> {
        let s = &mut self.streams[i];
        if !first && s.next.is_none() {
            return Ok(());
        }
        let page = s
            .store
            .list_runs(
                &s.scope,
                &ListOptions {
                    cursor: s.next.take(),
                    ..self.options.clone()
                },
            )
            .await?;
        self.fetched
            .fetch_add(page.entries.len() as u64, Ordering::Relaxed);
        s.rows.extend(page.entries);
        s.next = page.cursor;
        if let Some(r) = s.rows.front() {
            self.heads.push(std::cmp::Reverse((r.key(self.order), i)));
        }
        Ok(())
    }

    /// The next row in merged order.
    async fn next(&mut self) -> Result<Option<(RowKey, RunRow)>> {
        let Some(std::cmp::Reverse((key, i))) = self.heads.pop() else {
            return Ok(None);
        };
        let Some(row) = self.streams[i].rows.pop_front() else {
            return Ok(None);
        };
        match self.streams[i].rows.front() {
            Some(r) => self.heads.push(std::cmp::Reverse((r.key(self.order), i))),
            None => self.fetch(i, false).await?,
        }
        Ok(Some((key, row)))
    }
}

impl FsRootStore {
    /// Runs the blocking part of finding a session store off the runtime.
    async fn with_inner<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&RootInner) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(move || f(&inner)).await
    }

    /// The store of the run's session when it exists (reads).
    async fn reading(&self, scope: &RunScope) -> Result<Option<FsStore>> {
        let k = key_of(scope);
        self.with_inner(move |i| i.existing(&k)).await
    }

    /// The store of the run's session, created if missing (writes), and
    /// whether this call created the session's directory.
    async fn writing(&self, scope: &RunScope) -> Result<(FsStore, bool)> {
        let k = key_of(scope);
        self.with_inner(move |i| {
            let existed = i.check_path(&k)?;
            i.creating(&k).map(|s| (s, !existed))
        })
        .await
    }

    /// After a call that created its session's directory: removes it again
    /// when the call left nothing in it (a refused write, a release of a
    /// run that never existed), so such a call changes nothing on disk.
    /// Only empty directories are removed (`rmdir`), so a run another
    /// process writes meanwhile is never touched; that writer recreates
    /// what it needs.
    async fn tidy(&self, scope: &RunScope, created: bool) {
        if !created {
            return;
        }
        let k = key_of(scope);
        let _ = self
            .with_inner(move |i| {
                let runs = i.session_path(&k);
                let mut dirs = vec![runs.clone()];
                let mut up = runs.as_path();
                for _ in 0..3 {
                    match up.parent() {
                        Some(p) => {
                            dirs.push(p.to_path_buf());
                            up = p;
                        }
                        None => break,
                    }
                }
                for (n, d) in dirs.iter().enumerate() {
                    if std::fs::remove_dir(d).is_err() {
                        break;
                    }
                    if n == 0 {
                        i.sessions
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&k);
                    }
                }
                Ok(())
            })
            .await;
    }

    async fn sessions_async(&self, scope: &ListingScope) -> Result<Vec<(SessionKey, FsStore)>> {
        let scope = scope.clone();
        self.with_inner(move |i| i.sessions_under(&scope)).await
    }

    /// A watch over several sessions (or one that does not exist yet):
    /// each session's own watch forwarded into one, and the prefix
    /// rescanned every second for new sessions (a new one wakes it).
    fn prefix_watch(&self, topic: &WatchTopic) -> Watch {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Watch::polling(DEFAULT_POLL);
        };
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let tx = Arc::new(tx);
        let (this, topic) = (self.clone(), topic.clone());
        let scope = match &topic {
            WatchTopic::Runnable(s) => s.clone(),
            WatchTopic::Events(r) => r.session_scope(),
        };
        let spawner = handle.clone();
        handle.spawn(async move {
            let mut watched: HashSet<SessionKey> = HashSet::new();
            let mut first = true;
            loop {
                let sessions = this.sessions_async(&scope).await.unwrap_or_default();
                let mut grew = false;
                let mut over = false;
                for (k, store) in sessions {
                    if watched.contains(&k) {
                        continue;
                    }
                    if watched.len() >= MAX_WATCHED_SESSIONS {
                        over = true;
                        continue;
                    }
                    watched.insert(k.clone());
                    grew = true;
                    let inner_topic = match &topic {
                        WatchTopic::Runnable(_) => WatchTopic::Runnable(session_scope(&k)),
                        WatchTopic::Events(r) => WatchTopic::Events(r.clone()),
                    };
                    let mut w = store.watch(&inner_topic);
                    let tx = tx.clone();
                    spawner.spawn(async move {
                        loop {
                            tokio::select! {
                                _ = tx.closed() => break,
                                _ = w.changed() => tx.send_modify(|n| *n = n.wrapping_add(1)),
                            }
                        }
                    });
                }
                if (grew && !first) || over {
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
                first = false;
                tokio::select! {
                    _ = tx.closed() => break,
                    _ = tokio::time::sleep(RESCAN) => {}
                }
            }
        });
        Watch::notified(rx, RESCAN)
    }
}

/// Re-reads a just-claimed run's park against the filter (it may have
/// been answered between the listing and the claim).
async fn still_matches(
    store: &FsStore,
    scope: &RunScope,
    filter: &ClaimNextFilter,
    now: Timestamp,
) -> Result<bool> {
    let Some(states) = &filter.park else {
        return Ok(true);
    };
    let cps = store.list_checkpoints(scope).await?;
    let headers: Vec<_> = cps.iter().map(Checkpoint::header).collect();
    let d = RunDigest::from_headers(&headers);
    Ok(
        runkeep::park::park_precedence(&d.parks, &d.fence_history, now)
            .is_some_and(|p| states.contains(&p.state)),
    )
}

/// Runs a call that may write on the run's session store, creating the
/// session if missing and tidying it away again if the call left it empty.
macro_rules! write_op {
    ($self:ident, $scope:ident, |$s:ident| $call:expr) => {{
        let ($s, created) = $self.writing($scope).await?;
        let r = $call.await;
        $self.tidy($scope, created).await;
        r
    }};
}

#[async_trait]
impl CheckpointStore for FsRootStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        write_op!(self, scope, |s| s
            .write_checkpoint(scope, checkpoint, fence))
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.read_checkpoint(scope, id).await,
            None => Ok(None),
        }
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.list_checkpoints(scope).await,
            None => Ok(Vec::new()),
        }
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        write_op!(self, scope, |s| s.delete_checkpoint(scope, id, fence))
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        write_op!(self, scope, |s| s
            .resolve_park(scope, id, resolution, now, fence))
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        write_op!(self, scope, |s| s
            .prune_checkpoints(scope, keep_last, fence))
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        let query = ListQuery::new(scope, &options.judged_at(|| self.inner.clock.now()))?;
        let sessions = self.sessions_async(scope).await?;
        let fetch = ListOptions {
            order: query.order,
            park: query.park.clone(),
            claimed: query.claimed,
            status: query.status.clone(),
            // One row past the page tells whether more remain.
            limit: Some((query.limit + 1).min(MAX_LIMIT)),
            cursor: None,
            now: Some(query.now),
        };
        let mut merge = Merge::start(self.inner.fetched.clone(), sessions, &query, fetch).await?;
        let mut rows = Vec::with_capacity(query.limit + 1);
        while rows.len() <= query.limit {
            let Some((key, row)) = merge.next().await? else {
                break;
            };
            if row.scope.is_within(scope) && query.is_after_cursor(&key) && query.matches(&row) {
                rows.push((key, row));
            }
        }
        Ok(query.page_from_sorted(rows))
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        write_op!(self, scope, |s| s.claim(scope, options))
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        write_op!(self, scope, |s| s.release(scope, fence))
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        match self.reading(scope).await? {
            Some(s) => s.lease(scope, now).await,
            None => Ok(None),
        }
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        let now = options.judged_at(|| self.inner.clock.now());
        let query = ListQuery::claim_next(scope, filter, now)?;
        let options = options.clone().at(now);
        let sessions = self.sessions_async(scope).await?;
        let fetch = ListOptions {
            order: filter.order,
            park: filter.park.clone(),
            claimed: Some(false),
            status: None,
            limit: Some(CLAIM_FETCH),
            cursor: None,
            now: Some(now),
        };
        let stores: HashMap<SessionKey, FsStore> = sessions.iter().cloned().collect();
        let mut merge = Merge::start(self.inner.fetched.clone(), sessions, &query, fetch).await?;
        let mut contended = None;
        // The first claimable run in the merged order, the rule MemoryStore
        // applies over (row key, scope); each candidate is claimed through
        // its session's lease, so two callers never get one run at one
        // fence.
        while let Some((_, row)) = merge.next().await? {
            if !(query.matches(&row) && row.is_claimable(now)) {
                continue;
            }
            let Some(store) = stores.get(&key_of(&row.scope)) else {
                continue;
            };
            #[cfg(feature = "testing")]
            {
                let pause = self
                    .inner
                    .pause
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some((barrier, seen)) = pause {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(row.scope.clone());
                    barrier.wait().await;
                }
            }
            match store.claim(&row.scope, &options).await {
                Ok(ClaimOutcome::Acquired(lease)) => {
                    if !still_matches(store, &row.scope, filter, now).await? {
                        store.release(&row.scope, lease.fence).await?;
                        continue;
                    }
                    return Ok(Some((row.scope, lease)));
                }
                Ok(
                    ClaimOutcome::Held(_) | ClaimOutcome::Finished(_) | ClaimOutcome::NotBefore(_),
                ) => {}
                Err(e @ Error::Contended { .. }) => contended = Some(e),
                Err(e) => return Err(e),
            }
        }
        match contended {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        match self.reading(scope).await? {
            Some(s) => s.lifecycle(scope).await,
            None => Ok(runkeep::Lifecycle::default()),
        }
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &runkeep::EnqueueOptions,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        options.validate(&scope.run_id)?;
        write_op!(self, scope, |s| s.enqueue(scope, checkpoint, options))
    }

    async fn finish(
        &self,
        scope: &RunScope,
        fence: Fence,
        outcome: &runkeep::Outcome,
    ) -> Result<runkeep::Lifecycle> {
        outcome.validate(&scope.run_id)?;
        write_op!(self, scope, |s| s.finish(scope, fence, outcome))
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        write_op!(self, scope, |s| s.snooze(scope, fence, until))
    }

    async fn reopen(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        write_op!(self, scope, |s| s.reopen(scope))
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.latest_checkpoint(scope).await,
            None => Ok(None),
        }
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.find_pending(scope, now).await,
            None => Ok(None),
        }
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.resume_point(scope, now).await,
            None => Ok(None),
        }
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        // One existing session: its own watch. A prefix, or a session not
        // created yet: the forwarding watch.
        let one = match topic {
            WatchTopic::Events(run) => Some(key_of(run)),
            WatchTopic::Runnable(s) => match (s.project_id(), s.session_id()) {
                (Some(p), Some(ses)) => Some((s.tenant_id().clone(), p.clone(), ses.clone())),
                _ => None,
            },
        };
        if let Some(k) = one {
            if let Ok(Some(store)) = self.inner.existing(&k) {
                return store.watch(topic);
            }
        }
        self.prefix_watch(topic)
    }
}

#[async_trait]
impl EvidenceStore for FsRootStore {
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> Result<runkeep::StepReceipt> {
        write_op!(self, scope, |s| s.commit_step(scope, fence, step))
    }

    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        write_op!(self, scope, |s| s.append_events(scope, events, fence))
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        match self.reading(scope).await? {
            Some(s) => s.read_events(scope, options).await,
            None => Ok(EventBatch::default()),
        }
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        write_op!(self, scope, |s| s.write_run_record(scope, record, fence))
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        match self.reading(scope).await? {
            Some(s) => s.read_run_record(scope).await,
            None => Ok(None),
        }
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        write_op!(self, scope, |s| s.write_messages(
            scope,
            messages,
            through_event_seq,
            fence
        ))
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        match self.reading(scope).await? {
            Some(s) => s.read_messages(scope).await,
            None => Ok(MessageSnapshot::Unavailable),
        }
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        write_op!(self, scope, |s| s.write_report(scope, report, fence))
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        match self.reading(scope).await? {
            Some(s) => s.read_report(scope).await,
            None => Ok(None),
        }
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        write_op!(self, scope, |s| s.append_audit(scope, events, fence))
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        match self.reading(scope).await? {
            Some(s) => s.read_audit(scope, since_seq).await,
            None => Ok(Vec::new()),
        }
    }
}
