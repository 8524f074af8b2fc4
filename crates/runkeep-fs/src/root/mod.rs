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

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::watch::{Watch, WatchTopic};
use runkeep::{
    AuditRecord, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Clock,
    EventBatch, EvidenceStore, Fence, Lease, LeaseSummary, ListOptions, ListingScope,
    MessageSnapshot, NewAuditEvent, NewEvent, ParkResolution, PersistedEvent, ProjectId,
    ReadEventsOptions, Result, RunPage, RunRecord, RunScope, SessionId, SystemClock, TenantId,
    Timestamp,
};
use serde_json::Value;

// Top-down: the store below delegates to these; each imports only the
// ones after it.
mod across_sessions;
mod layout;
mod prefix_watch;
mod routing;
mod session_cache;

use crate::diagnose::Diagnosis;
use crate::fs_store::FsStore;
use crate::options::Durability;
use layout::key_of;
pub(crate) use layout::refuse_root_as_session;
pub use layout::{ROOT_LAYOUT_VERSION, ROOT_MARKER, SESSION_RUNS_DIR};
pub use prefix_watch::MAX_WATCHED_SESSIONS;
use routing::write_op;
use session_cache::RootInner;

/// Options of [`FsRootStore::open`]: those of [`crate::FsOptions`] that apply to
/// every session (attribution comes from each run's scope). The default is
/// that of [`crate::FsOptions`].
#[derive(Clone, Debug)]
pub struct FsRootOptions {
    /// The durability level of every session.
    pub durability: Durability,
    /// Open for reading only: nothing is created (no marker, no session
    /// directory, no hard-link probe), and every write is refused with
    /// [`runkeep::Error::Unsupported`]. The root must exist and carry the marker.
    pub read_only: bool,
    /// The store's clock, shared by every session (`None`: the machine
    /// clock).
    pub clock: Option<Arc<dyn Clock>>,
    /// The prune grace period of every session
    /// ([`crate::FsOptions::prune_grace`]; default
    /// [`crate::FsOptions::DEFAULT_PRUNE_GRACE`]).
    pub prune_grace: std::time::Duration,
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

/// A directory store of many tenants. Cheap to clone; safe to share
/// between threads and (through the directory) between processes.
#[derive(Clone)]
pub struct FsRootStore {
    pub(crate) inner: Arc<RootInner>,
}

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
    /// Refused with [`runkeep::Error::InvalidInput`]: a directory that is
    /// one session (it holds `runs/`, or `run_*` directories) — the message
    /// says to open it with [`FsStore::open`]. A root is marked with
    /// [`ROOT_MARKER`] when first opened; nothing else is created until a
    /// run is written. With [`FsRootOptions::read_only`] nothing is
    /// created: a missing root is [`runkeep::Error::NotFound`], one without
    /// the marker is refused.
    pub fn open(root: impl AsRef<Path>, options: FsRootOptions) -> Result<FsRootStore> {
        let root = layout::open_root(root.as_ref(), options.durability, options.read_only)?;
        let clock = options.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let inner = RootInner::new(
            root,
            options.durability,
            options.read_only,
            clock,
            options.prune_grace,
        );
        Ok(FsRootStore {
            inner: Arc::new(inner),
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
        layout::session_path(&self.inner.root, &key_of(scope))
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
        let sessions = self.inner.sessions_under(scope)?;
        Ok(sessions
            .into_iter()
            .map(|(k, s)| (layout::session_scope(&k), s))
            .collect())
    }

    /// A read-only health scan of every session under `scope`: each
    /// session's own scan ([`FsStore::diagnose`]) summed, plus a tenant,
    /// project, session or `runs` entry that is a symbolic link (listed in
    /// `unreadable`: runkeep never follows it).
    pub fn diagnose(&self, scope: &ListingScope, now: Timestamp) -> Result<Diagnosis> {
        across_sessions::diagnose(&self.inner, scope, now)
    }
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
        write_op!(self.inner, scope, |s| s
            .write_checkpoint(scope, checkpoint, fence))
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        match routing::reading(&self.inner, scope).await? {
            Some(s) => s.read_checkpoint(scope, id).await,
            None => Ok(None),
        }
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        match routing::reading(&self.inner, scope).await? {
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
        write_op!(self.inner, scope, |s| s.delete_checkpoint(scope, id, fence))
    }

    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: runkeep::CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        write_op!(self.inner, scope, |s| s.update_checkpoint(
            scope,
            id,
            update.clone(),
            fence
        ))
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        write_op!(self.inner, scope, |s| s
            .resolve_park(scope, id, resolution, now, fence))
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        write_op!(self.inner, scope, |s| s
            .prune_checkpoints(scope, keep_last, fence))
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        across_sessions::list_across(&self.inner, scope, options).await
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        write_op!(self.inner, scope, |s| s.claim(scope, options))
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        write_op!(self.inner, scope, |s| s.release(scope, fence))
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        match routing::reading(&self.inner, scope).await? {
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
        across_sessions::claim_next_across(&self.inner, scope, filter, options).await
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        match routing::reading(&self.inner, scope).await? {
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
        write_op!(self.inner, scope, |s| s.enqueue(scope, checkpoint, options))
    }

    async fn finish(
        &self,
        scope: &RunScope,
        fence: Fence,
        outcome: &runkeep::Outcome,
    ) -> Result<runkeep::Lifecycle> {
        outcome.validate(&scope.run_id)?;
        write_op!(self.inner, scope, |s| s.finish(scope, fence, outcome))
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        write_op!(self.inner, scope, |s| s.snooze(scope, fence, until))
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &runkeep::AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<runkeep::Lifecycle> {
        error.validate(&scope.run_id)?;
        write_op!(self.inner, scope, |s| s.fail_attempt(
            scope,
            fence,
            error,
            max_attempts
        ))
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<runkeep::Lifecycle> {
        runkeep::failure::check_cancel_reason(&scope.run_id, reason)?;
        write_op!(self.inner, scope, |s| s.cancel(scope, reason))
    }

    async fn reopen(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        write_op!(self.inner, scope, |s| s.reopen(scope))
    }

    async fn set_priority(
        &self,
        scope: &RunScope,
        priority: runkeep::scheduling::Priority,
    ) -> Result<runkeep::Lifecycle> {
        priority.validate()?;
        write_op!(self.inner, scope, |s| s.set_priority(scope, priority))
    }

    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &runkeep::EnqueueOptions,
        dedupe: Option<&runkeep::scheduling::Dedupe>,
    ) -> Result<runkeep::scheduling::Enqueued> {
        checkpoint.validate_for_write(scope)?;
        options.validate(&scope.run_id)?;
        if let Some(d) = dedupe {
            d.validate()?;
        }
        write_op!(self.inner, scope, |s| s
            .enqueue_once(scope, checkpoint, options, dedupe))
    }

    async fn key_holdings(
        &self,
        session: &ListingScope,
        key: &str,
    ) -> Result<Vec<runkeep::scheduling::KeyHolding>> {
        runkeep::scheduling::concurrency::check_key(key)?;
        let session = runkeep::scheduling::concurrency::session_of(session)?;
        match routing::sessions(&self.inner, &session).await?.pop() {
            Some((_, store)) => store.key_holdings(&session, key).await,
            None => Ok(Vec::new()),
        }
    }

    async fn put_schedule(
        &self,
        session: &ListingScope,
        schedule: &runkeep::scheduling::Schedule,
    ) -> Result<runkeep::scheduling::Schedule> {
        let k = schedule_session(session)?;
        schedule.validate()?;
        let inner = self.inner.clone();
        let store = crate::blocking::run(move || inner.creating(&k)).await?;
        store.put_schedule(session, schedule).await
    }

    async fn get_schedule(
        &self,
        session: &ListingScope,
        name: &str,
    ) -> Result<Option<runkeep::scheduling::Schedule>> {
        let k = schedule_session(session)?;
        let inner = self.inner.clone();
        match crate::blocking::run(move || inner.existing(&k)).await? {
            Some(s) => s.get_schedule(session, name).await,
            None => {
                runkeep::scheduling::schedule::check_name(name)?;
                Ok(None)
            }
        }
    }

    async fn list_schedules(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<runkeep::scheduling::ScheduleEntry>> {
        let (inner, under) = (self.inner.clone(), scope.clone());
        let sessions = crate::blocking::run(move || inner.sessions_under(&under)).await?;
        let mut out = Vec::new();
        for (k, store) in sessions {
            out.extend(
                store
                    .list_schedules(&layout::session_scope(&k))
                    .await?
                    .into_iter()
                    .filter(|e| e.session == layout::session_scope(&k)),
            );
        }
        Ok(out)
    }

    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        let k = schedule_session(session)?;
        let inner = self.inner.clone();
        match crate::blocking::run(move || inner.existing(&k)).await? {
            Some(s) => s.delete_schedule(session, name).await,
            None => {
                runkeep::scheduling::schedule::check_name(name)?;
                Ok(false)
            }
        }
    }

    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        let k = schedule_session(session)?;
        let inner = self.inner.clone();
        match crate::blocking::run(move || inner.existing(&k)).await? {
            Some(s) => s.advance_schedule(session, name, from, to).await,
            None => Err(runkeep::scheduling::schedule::not_found(session, name)),
        }
    }

    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &runkeep::scheduling::RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        let now = now.unwrap_or_else(|| self.inner.clock.now());
        let sessions = routing::sessions(&self.inner, scope).await?;
        let sessions = sessions
            .into_iter()
            .map(|(k, s)| (layout::session_scope(&k), s))
            .collect();
        crate::retention::prune_across(sessions, policy, now, limit).await
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        match routing::reading(&self.inner, scope).await? {
            Some(s) => s.latest_checkpoint(scope).await,
            None => Ok(None),
        }
    }

    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &runkeep::CheckpointIdQuery,
    ) -> Result<Vec<runkeep::CheckpointId>> {
        query.validate()?;
        match routing::reading(&self.inner, scope).await? {
            Some(s) => s.checkpoint_ids(scope, query).await,
            None => Ok(Vec::new()),
        }
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        match routing::reading(&self.inner, scope).await? {
            Some(s) => s.find_pending(scope, now).await,
            None => Ok(None),
        }
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        match routing::reading(&self.inner, scope).await? {
            Some(s) => s.resume_point(scope, now).await,
            None => Ok(None),
        }
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        prefix_watch::watch(&self.inner, topic)
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
        write_op!(self.inner, scope, |s| s.commit_step(scope, fence, step))
    }

    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        write_op!(self.inner, scope, |s| s.append_events(scope, events, fence))
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        match routing::reading(&self.inner, scope).await? {
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
        write_op!(self.inner, scope, |s| s
            .write_run_record(scope, record, fence))
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        match routing::reading(&self.inner, scope).await? {
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
        write_op!(self.inner, scope, |s| s.write_messages(
            scope,
            messages,
            through_event_seq,
            fence
        ))
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        match routing::reading(&self.inner, scope).await? {
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
        write_op!(self.inner, scope, |s| s.write_report(scope, report, fence))
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        match routing::reading(&self.inner, scope).await? {
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
        write_op!(self.inner, scope, |s| s.append_audit(scope, events, fence))
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        match routing::reading(&self.inner, scope).await? {
            Some(s) => s.read_audit(scope, since_seq).await,
            None => Ok(Vec::new()),
        }
    }
}

/// The session a schedule call names (`InvalidInput` for a wider scope).
fn schedule_session(session: &ListingScope) -> Result<layout::SessionKey> {
    let s = runkeep::scheduling::schedule::session_of(session)?;
    Ok(layout::SessionKey {
        tenant_id: s.tenant_id().clone(),
        project_id: s.project_id().expect("a session").clone(),
        session_id: s.session_id().expect("a session").clone(),
    })
}
