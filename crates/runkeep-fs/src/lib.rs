//! runkeep's directory backend: fenced leases, checkpoints and run evidence
//! in a plain directory, correct across processes.
//!
//! [`FsStore`] implements [`runkeep::CheckpointStore`] and
//! [`runkeep::EvidenceStore`] over one session's `runs/` directory, laid out
//! as the reference design lays it out (so the reference can still read it)
//! plus a few additive, ignorable files under each run's `.runkeep/`.
//! [`FsRootStore`] holds many tenants in one directory, one such session
//! per `ROOT/<tenant>/<project>/<session>/runs/` (isolation by path,
//! listings and `claim_next` over a project or tenant).
//!
//! # Why it looks like this
//!
//! - **The fence is the file name.** A holding is `claims/<fence>.json`,
//!   published by hard `link` from a body that is already whole: the kernel
//!   picks exactly one winner per number, and no reader ever sees the name
//!   without its body. There is no lock file that could go stale and need a
//!   breaker. A volume without hard links is refused when the store opens.
//! - **Every write of a run is fenced**, and the check is made under a
//!   kernel-released advisory lock on the run (exclusive for writes, shared
//!   for claims), so a takeover cannot slip between "check the fence" and
//!   "publish". Waits for that lock are bounded, so a stopped process cannot
//!   wedge a run; what remains of the window is documented in
//!   `docs/design/directory/lease-and-fencing.md`.
//! - **Reads have no side effects.** Listing, event reads, checkpoint reads
//!   and the doctor's scan create and modify nothing.
//! - **Listing costs O(page) file reads**: each run keeps a digest (latest
//!   checkpoint, count, run start, parks) checked for freshness against its
//!   checkpoints directory, so a row never parses a checkpoint; a damaged run
//!   is a flagged row, never a failed page.
//! - **Durability is explicit** ([`Durability`]).
//! - **Private by default**: every file it creates is mode [`FILE_MODE`]
//!   (0600) and every directory [`DIR_MODE`] (0700), whatever the umask
//!   allows beyond that: run data is whatever an agent saw. Every process
//!   of a store runs as one user; other users read it through `runkeep
//!   serve` and a reader token. (A directory made before this was the
//!   rule keeps its mode; `chmod -R go-rwx` makes it private.)
//!
//! ```no_run
//! use runkeep::{CheckpointStore, ClaimOptions, Holder, Ttl};
//! use runkeep_fs::{Attribution, FsOptions, FsStore};
//!
//! # async fn demo(run: runkeep::RunScope, cp: runkeep::Checkpoint) -> runkeep::Result<()> {
//! let store = FsStore::open(
//!     "/var/lib/agents/projects/prj_a/sessions/ses_a/runs",
//!     FsOptions {
//!         attribution: Some(Attribution {
//!             tenant_id: run.tenant_id.clone(),
//!             project_id: run.project_id.clone(),
//!             session_id: run.session_id.clone(),
//!         }),
//!         ..Default::default()
//!     },
//! )?;
//! let opts = ClaimOptions::new(Holder::unique("worker"), Ttl::from_millis(30_000)?);
//! if let Some(lease) = store.claim(&run, &opts).await?.lease() {
//!     store.write_checkpoint(&run, &cp, Some(lease.fence)).await?;
//!     store.release(&run, lease.fence).await?;
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::watch::{Watch, WatchTopic};
use runkeep::{
    AuditRecord, CheckpointId, ClaimNextFilter, ClaimOptions, ClaimOutcome, Error, EventBatch,
    Fence, Lease, LeaseSummary, ListOptions, ListingScope, MessageSnapshot, NewAuditEvent,
    NewEvent, ParkResolution, PersistedEvent, ReadEventsOptions, Result, RunPage, RunRecord,
    RunScope, SystemClock, Timestamp,
};
use serde_json::Value;

mod checkpoints;
mod claims;
mod diagnose;
mod documents;
mod failures;
mod fenced_write;
mod hard_links;
mod index;
mod inner;
mod listing;
mod lock;
mod options;
mod queue;
mod root;
mod run_state;
mod steps;
mod sys;
mod testing_hooks;
mod transcript;
mod watching;

#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;

pub use diagnose::Diagnosis;
pub use hard_links::{
    is_no_hard_link_errno, probe_hard_links, HardLinkProbeError, HardLinks, NO_HARD_LINK_ERRNOS,
};
pub use index::IndexOutlook;
pub use listing::{is_listed_run_name, LISTED_RUN_PREFIX};
pub use options::{Attribution, Durability, FsOptions};
pub use root::{
    FsRootOptions, FsRootStore, MAX_WATCHED_SESSIONS, ROOT_LAYOUT_VERSION, ROOT_MARKER,
    SESSION_RUNS_DIR,
};
pub use sys::{DIR_MODE, FILE_MODE};

use inner::Inner;
use sys::Ctx;

/// The directory backend. Cheap to clone; safe to share between threads and
/// between processes (through the directory).
#[derive(Clone)]
pub struct FsStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for FsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FsStore")
            .field("base_dir", &self.inner.base)
            .field("attribution", &self.inner.attribution)
            .field("durability", &self.inner.durability)
            .field("clock", &self.inner.clock)
            .finish()
    }
}

impl FsStore {
    /// Opens (creating if missing) a session's `runs/` directory.
    ///
    /// Probes once that the volume supports hard links (the lease needs
    /// them) and refuses with [`Error::Unsupported`] if it does not. A
    /// directory that cannot be written (read-only volume, no permission)
    /// still opens, for reading; its writes fail with an error naming the
    /// run, the operation and the path.
    ///
    /// With [`FsOptions::read_only`] nothing is created or probed: a missing
    /// directory is [`Error::NotFound`] and every write is refused.
    pub fn open(base_dir: impl AsRef<Path>, options: FsOptions) -> Result<FsStore> {
        let ctx = Ctx::store("open");
        let base = std::path::absolute(base_dir.as_ref())
            .unwrap_or_else(|_| base_dir.as_ref().to_path_buf());
        root::refuse_root_as_session(&base)?;
        if options.read_only {
            match std::fs::metadata(&base) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(Error::invalid(format!(
                        "{} is not a directory; open the store on a session's runs/ directory",
                        base.display()
                    )))
                }
                Err(e) if sys::is_not_found(&e) => {
                    return Err(Error::NotFound {
                        what: format!(
                            "a directory store at {} (opened read-only, so it is not created; the first write creates it)",
                            base.display()
                        ),
                    })
                }
                Err(e) => return Err(ctx.io("open the store directory", &base, e)),
            }
            return Ok(FsStore {
                inner: Arc::new(Inner {
                    base,
                    attribution: options.attribution,
                    durability: options.durability,
                    read_only: true,
                    tmpfile: AtomicBool::new(false),
                    poisoned: Mutex::new(None),
                    clock: options.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                    no_inotify: AtomicBool::new(false),
                    index: index::SessionIndex::default(),
                    no_index: AtomicBool::new(false),
                }),
            });
        }
        if let Err(e) = sys::ensure_dir(&base, options.durability) {
            if !base.is_dir() {
                return Err(ctx.io("create the store directory", &base, e));
            }
        }
        if !base.is_dir() {
            return Err(Error::invalid(format!(
                "{} is not a directory; open the store on a session's runs/ directory",
                base.display()
            )));
        }
        let tmpfile = probe_links(&base, &ctx)?;
        Ok(FsStore {
            inner: Arc::new(Inner {
                base,
                attribution: options.attribution,
                durability: options.durability,
                read_only: false,
                tmpfile: AtomicBool::new(tmpfile),
                poisoned: Mutex::new(None),
                clock: options.clock.unwrap_or_else(|| Arc::new(SystemClock)),
                no_inotify: AtomicBool::new(false),
                index: index::SessionIndex::default(),
                no_index: AtomicBool::new(false),
            }),
        })
    }

    /// The directory the store was opened on (absolute).
    pub fn base_dir(&self) -> &Path {
        &self.inner.base
    }

    /// The directory of a run: `<base>/<run>` for a top-level run,
    /// `<base>/<parent>/children/<run>` for a sub-run. Pure: touches nothing.
    pub fn run_dir(&self, scope: &RunScope) -> PathBuf {
        self.inner.run_dir(scope)
    }

    /// A read-only health scan of every run directory (the `runkeep doctor`
    /// command). `now` judges lease expiry; scratch ages use the wall clock.
    pub fn diagnose(&self, now: Timestamp) -> Result<Diagnosis> {
        diagnose::diagnose(&self.inner, now)
    }

    /// The test seams of this store, behind one door (feature `testing`):
    /// `store.testing().disable_index()`, `.wait_index()`, ….
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn testing(&self) -> crate::testing::StoreSeams<'_> {
        crate::testing::StoreSeams(self)
    }
}

#[cfg(feature = "testing")]
impl crate::testing::StoreSeams<'_> {
    /// Test seam: publish holdings through scratch names, never `O_TMPFILE`.
    #[doc(hidden)]
    pub fn force_scratch_publish(&self) {
        self.0.inner.disable_tmpfile();
    }

    /// Test seam: `watch` never uses inotify (the polling fallback).
    #[doc(hidden)]
    pub fn disable_inotify(&self) {
        self.0.inner.no_inotify.store(true, Ordering::Relaxed);
    }

    /// Test seam: whether holdings are published through `O_TMPFILE`.
    #[doc(hidden)]
    pub fn uses_tmpfile(&self) -> bool {
        self.0.inner.tmpfile_enabled()
    }
}

/// Probes the store directory once: a volume without hard links is
/// refused; one that cannot be written opens for reading (every write will
/// say why it failed). Answers whether `O_TMPFILE` + `linkat` publishes
/// work.
fn probe_links(base: &Path, ctx: &Ctx) -> Result<bool> {
    match hard_links::probe_hard_links(base) {
        Ok(HardLinks::Supported) => Ok(hard_links::tmpfile_links_work(base)),
        Ok(HardLinks::Unsupported { errno }) => {
            Err(claims::no_hard_links(ctx, base, errno.raw_os_error()))
        }
        Err(HardLinkProbeError::CannotCreate(e)) => {
            tracing::debug!("{}: cannot probe hard links: {e}", base.display());
            Ok(false)
        }
        Err(HardLinkProbeError::Link(e)) => Err(ctx.io("probe hard links in", base, e)),
    }
}

/// Runs a blocking store operation off the async runtime's worker threads.
async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    // The principal the task acts for (runkeep::acting) goes with the work
    // to the blocking thread, where the fence checks read it.
    let actor = runkeep::acting::current();
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => match handle
            .spawn_blocking(move || runkeep::acting::sync_scope(actor, f))
            .await
        {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::Backend {
                message: format!("a directory-store operation was cancelled: {e}"),
                source: None,
            }),
        },
        Err(_) => f(),
    }
}

#[async_trait]
impl runkeep::CheckpointStore for FsStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let (inner, scope, cp) = (self.inner.clone(), scope.clone(), checkpoint.clone());
        blocking(move || inner.write_checkpoint(&scope, &cp, fence)).await
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        let (inner, scope, id) = (self.inner.clone(), scope.clone(), id.clone());
        blocking(move || inner.read_checkpoint(&scope, &id)).await
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.list_checkpoints(&scope)).await
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        let (inner, scope, id) = (self.inner.clone(), scope.clone(), id.clone());
        blocking(move || inner.delete_checkpoint(&scope, &id, fence)).await
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let (inner, scope, id) = (self.inner.clone(), scope.clone(), id.clone());
        blocking(move || inner.resolve_park(&scope, &id, resolution, now, fence)).await
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.prune_checkpoints(&scope, keep_last, fence)).await
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        let (inner, scope, options) = (self.inner.clone(), scope.clone(), options.clone());
        blocking(move || listing::list_runs(&inner, &scope, &options)).await
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        self.inner.check_scope(scope)?;
        let (inner, scope, options) = (self.inner.clone(), scope.clone(), options.clone());
        blocking(move || claims::claim(&inner, &scope, &options)).await
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        self.inner.check_scope(scope)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || claims::release(&inner, &scope, fence)).await
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.lease(&scope, now)).await
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        let (inner, scope, filter, options) = (
            self.inner.clone(),
            scope.clone(),
            filter.clone(),
            options.clone(),
        );
        blocking(move || listing::claim_next(&inner, &scope, &filter, &options)).await
    }

    fn now(&self) -> Timestamp {
        self.inner.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.lifecycle(&scope)).await
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &runkeep::EnqueueOptions,
    ) -> Result<Checkpoint> {
        let (inner, scope, cp, options) = (
            self.inner.clone(),
            scope.clone(),
            checkpoint.clone(),
            options.clone(),
        );
        blocking(move || inner.enqueue(&scope, &cp, &options)).await
    }

    async fn finish(
        &self,
        scope: &RunScope,
        fence: Fence,
        outcome: &runkeep::Outcome,
    ) -> Result<runkeep::Lifecycle> {
        let (inner, scope, outcome) = (self.inner.clone(), scope.clone(), outcome.clone());
        blocking(move || inner.finish(&scope, fence, &outcome)).await
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.snooze(&scope, fence, until)).await
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &runkeep::AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<runkeep::Lifecycle> {
        let (inner, scope, error) = (self.inner.clone(), scope.clone(), error.clone());
        blocking(move || inner.fail_attempt(&scope, fence, &error, max_attempts)).await
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<runkeep::Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        let reason = reason.map(str::to_owned);
        blocking(move || inner.cancel(&scope, reason.as_deref())).await
    }

    async fn reopen(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.reopen(&scope)).await
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.latest_checkpoint(&scope)).await
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.find_pending(&scope, now)).await
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || inner.resume_point(&scope, now)).await
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        let run_dir = match topic {
            WatchTopic::Events(run) => Some(self.inner.run_dir(run)),
            WatchTopic::Runnable(_) => None,
        };
        watching::watch(
            &self.inner.base,
            run_dir,
            topic,
            self.inner.no_inotify.load(Ordering::Relaxed),
        )
    }
}

#[async_trait]
impl runkeep::EvidenceStore for FsStore {
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> Result<runkeep::StepReceipt> {
        let (inner, scope, step) = (self.inner.clone(), scope.clone(), step.clone());
        blocking(move || inner.commit_step(&scope, fence, &step)).await
    }
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        let (inner, scope, events) = (self.inner.clone(), scope.clone(), events.to_vec());
        blocking(move || inner.append_events(&scope, &events, fence)).await
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        let (inner, scope, options) = (self.inner.clone(), scope.clone(), *options);
        blocking(move || inner.read_events(&scope, &options)).await
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        runkeep::evidence::check_json_document("run record", record, record.values())?;
        let bytes = documents::encode_record(record)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            inner.write_document(
                &scope,
                "write_run_record",
                documents::RUN_RECORD,
                bytes,
                fence,
            )
        })
        .await
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        self.inner.check_scope(scope)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            let ctx = Ctx::new(&scope, "read_run_record");
            documents::read_record(&inner.run_dir(&scope), &ctx)
        })
        .await
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        runkeep::evidence::check_json_document("message snapshot", messages, messages)?;
        let bytes = documents::encode_messages(messages, through_event_seq);
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            inner.write_document(&scope, "write_messages", documents::MESSAGES, bytes, fence)
        })
        .await
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        self.inner.check_scope(scope)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            let ctx = Ctx::new(&scope, "read_messages");
            documents::read_messages(&inner.run_dir(&scope), &ctx)
        })
        .await
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        runkeep::evidence::check_document_size("report", report.len())?;
        let bytes = report.as_bytes().to_vec();
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            inner.write_document(&scope, "write_report", documents::REPORT, bytes, fence)
        })
        .await
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        self.inner.check_scope(scope)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            let ctx = Ctx::new(&scope, "read_report");
            documents::read_report(&inner.run_dir(&scope), &ctx)
        })
        .await
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        let (inner, scope, events) = (self.inner.clone(), scope.clone(), events.to_vec());
        blocking(move || inner.append_audit(&scope, &events, fence)).await
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        self.inner.check_scope(scope)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking(move || {
            let ctx = Ctx::new(&scope, "read_audit");
            transcript::read_audit(&inner.run_dir(&scope), since_seq, &ctx)
        })
        .await
    }
}
