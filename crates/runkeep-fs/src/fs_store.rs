//! [`FsStore`]: one session's `runs/` directory as a
//! [`runkeep::CheckpointStore`] and [`runkeep::EvidenceStore`].
//!
//! Only delegation lives here: every method clones what its job needs,
//! runs the job module's function off the async runtime
//! ([`crate::blocking`]) and returns its answer. The rules are in the job
//! modules (`checkpoints`, `claims`, `queue`, `steps`, `transcript`,
//! `documents`, `failures`, `listing`, `watching`, `diagnose`), the store's state and
//! guards in [`crate::inner`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::watch::{Watch, WatchTopic};
use runkeep::{
    AttemptError, AuditRecord, CheckpointId, ClaimNextFilter, ClaimOptions, ClaimOutcome,
    EnqueueOptions, EventBatch, Fence, Lease, LeaseSummary, Lifecycle, ListOptions, ListingScope,
    MessageSnapshot, NewAuditEvent, NewEvent, Outcome, ParkResolution, PersistedEvent,
    ReadEventsOptions, Result, RunPage, RunRecord, RunScope, Step, StepReceipt, Timestamp,
    TopHolding,
};
use serde_json::Value;

use crate::diagnose::{self, Diagnosis};
use crate::inner::Inner;
use crate::options::FsOptions;
use crate::{
    blocking, checkpoints, claims, dedupe, documents, failures, keys, listing, opening, queue,
    steps, transcript, watching,
};
use runkeep::scheduling::{concurrency, Dedupe, Enqueued, KeyHolding, Priority};

/// The directory backend. Cheap to clone; safe to share between threads and
/// between processes (through the directory).
#[derive(Clone)]
pub struct FsStore {
    pub(crate) inner: Arc<Inner>,
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
    /// them) and refuses with [`runkeep::Error::Unsupported`] if it does
    /// not. A directory that cannot be written (read-only volume, no
    /// permission) still opens, for reading; its writes fail with an error
    /// naming the run, the operation and the path.
    ///
    /// With [`FsOptions::read_only`] nothing is created or probed: a missing
    /// directory is [`runkeep::Error::NotFound`] and every write is refused.
    pub fn open(base_dir: impl AsRef<Path>, options: FsOptions) -> Result<FsStore> {
        let inner = opening::open(base_dir.as_ref(), options)?;
        Ok(FsStore {
            inner: Arc::new(inner),
        })
    }

    /// The directory the store was opened on (absolute).
    pub fn base_dir(&self) -> &Path {
        self.inner.base()
    }

    /// A page of `claim_next`'s candidates in its order (priority first),
    /// after `after` (the root store's merge).
    pub(crate) async fn claim_page(
        &self,
        scope: &ListingScope,
        list: &ListOptions,
        after: Option<runkeep::listing::RowKey>,
    ) -> Result<(Vec<runkeep::RunRow>, Option<runkeep::listing::RowKey>)> {
        let (inner, scope, list) = (self.inner.clone(), scope.clone(), list.clone());
        blocking::run(move || listing::claim_page(&inner, &scope, &list, after)).await
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

    /// The run's top holding as the store reads it, with the path of its
    /// file; `None` when the run was never claimed. Reads only.
    ///
    /// For operator tools: a listing row shows a release tombstone and an
    /// unreadable holding alike (holder `""`, expiry 0); this tells them
    /// apart and names the file.
    pub fn top_holding(&self, scope: &RunScope) -> Result<Option<(TopHolding, PathBuf)>> {
        diagnose::top_holding(&self.inner, scope)
    }

    /// The test seams of this store, behind one door (feature `testing`):
    /// `store.testing().disable_index()`, `.wait_index()`, ….
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn testing(&self) -> crate::testing::StoreSeams<'_> {
        crate::testing::StoreSeams(self)
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
        blocking::run(move || checkpoints::write_checkpoint(&inner, &scope, &cp, fence)).await
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        let (inner, scope, id) = (self.inner.clone(), scope.clone(), id.clone());
        blocking::run(move || checkpoints::read_checkpoint(&inner, &scope, &id)).await
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || checkpoints::list_checkpoints(&inner, &scope)).await
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        let (inner, scope, id) = (self.inner.clone(), scope.clone(), id.clone());
        blocking::run(move || checkpoints::delete_checkpoint(&inner, &scope, &id, fence)).await
    }

    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: runkeep::CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let (inner, scope, id) = (self.inner.clone(), scope.clone(), id.clone());
        blocking::run(move || checkpoints::update_checkpoint(&inner, &scope, &id, &update, fence))
            .await
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
        blocking::run(move || {
            checkpoints::resolve_park(&inner, &scope, &id, resolution, now, fence)
        })
        .await
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || checkpoints::prune_checkpoints(&inner, &scope, keep_last, fence))
            .await
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        let (inner, scope, options) = (self.inner.clone(), scope.clone(), options.clone());
        blocking::run(move || listing::list_runs(&inner, &scope, &options)).await
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        self.inner.check_scope(scope)?;
        let (inner, scope, options) = (self.inner.clone(), scope.clone(), options.clone());
        blocking::run(move || claims::claim(&inner, &scope, &options)).await
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        self.inner.check_scope(scope)?;
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || {
            let r = claims::release(&inner, &scope, fence);
            if matches!(r, Ok(true)) {
                keys::after_end(&inner, &scope, "release");
            }
            r
        })
        .await
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || inner.lease(&scope, now)).await
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        let inner = self.inner.clone();
        let (scope, filter, options) = (scope.clone(), filter.clone(), options.clone());
        blocking::run(move || listing::claim_next(&inner, &scope, &filter, &options)).await
    }

    fn now(&self) -> Timestamp {
        self.inner.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || queue::lifecycle(&inner, &scope)).await
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        let (cp, options) = (checkpoint.clone(), options.clone());
        blocking::run(move || queue::enqueue(&inner, &scope, &cp, &options)).await
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        let (inner, scope, outcome) = (self.inner.clone(), scope.clone(), outcome.clone());
        blocking::run(move || {
            let r = queue::finish(&inner, &scope, fence, &outcome);
            if r.is_ok() {
                keys::after_end(&inner, &scope, "finish");
            }
            r
        })
        .await
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || {
            let r = queue::snooze(&inner, &scope, fence, until);
            if matches!(r, Ok(true)) {
                keys::after_end(&inner, &scope, "snooze");
            }
            r
        })
        .await
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle> {
        let (inner, scope, error) = (self.inner.clone(), scope.clone(), error.clone());
        blocking::run(move || {
            let r = failures::fail_attempt(&inner, &scope, fence, &error, max_attempts);
            if r.is_ok() {
                keys::after_end(&inner, &scope, "fail_attempt");
            }
            r
        })
        .await
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        let reason = reason.map(str::to_owned);
        blocking::run(move || {
            let r = failures::cancel(&inner, &scope, reason.as_deref());
            if r.is_ok() {
                keys::after_end(&inner, &scope, "cancel");
            }
            r
        })
        .await
    }

    async fn set_priority(&self, scope: &RunScope, priority: Priority) -> Result<Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || dedupe::set_priority(&inner, &scope, priority)).await
    }

    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
        dedupe: Option<&Dedupe>,
    ) -> Result<Enqueued> {
        let Some(d) = dedupe else {
            let cp = self.enqueue(scope, checkpoint, options).await?;
            return Ok(Enqueued {
                run: scope.clone(),
                created: true,
                checkpoint: Some(cp),
            });
        };
        let (inner, scope, d) = (self.inner.clone(), scope.clone(), d.clone());
        let (cp, options) = (checkpoint.clone(), options.clone());
        blocking::run(move || dedupe::enqueue_once(&inner, &scope, &cp, &options, &d)).await
    }

    async fn key_holdings(&self, session: &ListingScope, key: &str) -> Result<Vec<KeyHolding>> {
        concurrency::check_key(key)?;
        let session = concurrency::session_of(session)?;
        if !self.inner.is_bound_to(&session) {
            return Ok(Vec::new());
        }
        let (inner, key) = (self.inner.clone(), key.to_owned());
        blocking::run(move || keys::key_holdings(&inner, &key)).await
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || queue::reopen(&inner, &scope)).await
    }

    async fn put_schedule(
        &self,
        session: &ListingScope,
        schedule: &runkeep::scheduling::Schedule,
    ) -> Result<runkeep::scheduling::Schedule> {
        let (inner, session, schedule) = (self.inner.clone(), session.clone(), schedule.clone());
        blocking::run(move || crate::schedules::put(&inner, &session, &schedule)).await
    }

    async fn get_schedule(
        &self,
        session: &ListingScope,
        name: &str,
    ) -> Result<Option<runkeep::scheduling::Schedule>> {
        let (inner, session, name) = (self.inner.clone(), session.clone(), name.to_string());
        blocking::run(move || crate::schedules::get(&inner, &session, &name)).await
    }

    async fn list_schedules(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<runkeep::scheduling::ScheduleEntry>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || crate::schedules::list(&inner, &scope)).await
    }

    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        let (inner, session, name) = (self.inner.clone(), session.clone(), name.to_string());
        blocking::run(move || crate::schedules::delete(&inner, &session, &name)).await
    }

    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        let (inner, session, name) = (self.inner.clone(), session.clone(), name.to_string());
        blocking::run(move || crate::schedules::advance(&inner, &session, &name, from, to)).await
    }

    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &runkeep::scheduling::RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        let (inner, scope, policy) = (self.inner.clone(), scope.clone(), *policy);
        blocking::run(move || crate::retention::prune_finished(&inner, &scope, &policy, now, limit))
            .await
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || queue::latest_checkpoint(&inner, &scope)).await
    }

    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &runkeep::CheckpointIdQuery,
    ) -> Result<Vec<runkeep::CheckpointId>> {
        let (inner, scope, query) = (self.inner.clone(), scope.clone(), query.clone());
        blocking::run(move || queue::checkpoint_ids(&inner, &scope, &query)).await
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || queue::find_pending(&inner, &scope, now)).await
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || queue::resume_point(&inner, &scope, now)).await
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        watching::watch(&self.inner, topic)
    }
}

#[async_trait]
impl runkeep::EvidenceStore for FsStore {
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        let (inner, scope, step) = (self.inner.clone(), scope.clone(), step.clone());
        blocking::run(move || {
            let r = steps::commit_step(&inner, &scope, fence, &step);
            if r.is_ok() && step.finish.is_some() {
                keys::after_end(&inner, &scope, "commit_step");
            }
            r
        })
        .await
    }

    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        let (inner, scope, events) = (self.inner.clone(), scope.clone(), events.to_vec());
        blocking::run(move || transcript::append_events(&inner, &scope, &events, fence)).await
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        let (inner, scope, options) = (self.inner.clone(), scope.clone(), *options);
        blocking::run(move || transcript::read_events(&inner, &scope, &options)).await
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        let (inner, scope, record) = (self.inner.clone(), scope.clone(), record.clone());
        blocking::run(move || documents::write_run_record(&inner, &scope, &record, fence)).await
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || documents::read_run_record(&inner, &scope)).await
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        let (inner, scope, messages) = (self.inner.clone(), scope.clone(), messages.to_vec());
        blocking::run(move || {
            documents::write_messages(&inner, &scope, &messages, through_event_seq, fence)
        })
        .await
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || documents::read_messages(&inner, &scope)).await
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        let (inner, scope, report) = (self.inner.clone(), scope.clone(), report.to_string());
        blocking::run(move || documents::write_report(&inner, &scope, &report, fence)).await
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || documents::read_report(&inner, &scope)).await
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        let (inner, scope, events) = (self.inner.clone(), scope.clone(), events.to_vec());
        blocking::run(move || transcript::append_audit(&inner, &scope, &events, fence)).await
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        let (inner, scope) = (self.inner.clone(), scope.clone());
        blocking::run(move || transcript::read_audit(&inner, &scope, since_seq)).await
    }
}
