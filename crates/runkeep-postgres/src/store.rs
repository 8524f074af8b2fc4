//! [`PgStore`]: its constructors, its accessors and its `CheckpointStore` /
//! `EvidenceStore` impls, which only delegate: to the floor ([`Db`], module
//! `db`) or to the module of each job, passing it the floor.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use serde_json::Value;

use runkeep::scheduling::RetentionPolicy;
use runkeep::{
    AuditRecord, Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions,
    ClaimOutcome, EnqueueOptions, EventBatch, EvidenceStore, Fence, Lease, LeaseSummary, Lifecycle,
    ListOptions, ListingScope, MessageSnapshot, NewAuditEvent, NewEvent, Outcome, ParkResolution,
    PersistedEvent, ReadEventsOptions, Result, RunPage, RunRecord, RunScope, Step, StepReceipt,
    Timestamp, Watch, WatchTopic,
};
use runkeep::{Handover, NextClaim};

use crate::db::Db;
use crate::options::PgOptions;

/// The PostgreSQL store. Cheap to share (`Arc<PgStore>`); every call takes
/// a pooled connection for its one transaction.
pub struct PgStore {
    db: Db,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("PgStore")
            .field("schema", &self.db.options.schema)
            .field("pool_size", &self.db.options.pool_size)
            .field("test_clock", &self.db.options.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` (a `postgres://` URL or a key=value string),
    /// applies the embedded migrations to `options.schema` (under an
    /// advisory lock: concurrent `connect`s are safe) and checks the
    /// server answers.
    ///
    /// # Errors
    /// `Unsupported` when the schema is at a newer version than this binary
    /// ([`crate::SCHEMA_VERSION`]); `Unavailable` when the server cannot be
    /// reached; `InvalidInput` for a bad URL, schema name or option.
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self> {
        Ok(Self {
            db: Db::connect(url, options).await?,
        })
    }

    /// Applies the embedded migrations to `options.schema` on a connection
    /// of its own and answers the version now applied (`runkeep migrate`).
    pub async fn migrate(url: &str, options: &PgOptions) -> Result<i32> {
        Db::migrate(url, options).await
    }

    /// The runkeep schema version recorded in `options.schema` (0 when the
    /// schema has never been migrated), read on a connection of its own
    /// without changing anything: what `runkeep` checks before a read-only
    /// command and what the doctor reports.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached; `InvalidInput` for a
    /// bad URL or schema name.
    pub async fn schema_version(url: &str, options: &PgOptions) -> Result<i32> {
        Db::schema_version(url, options).await
    }

    /// Builds a store on a schema that [`PgStore::migrate`] (or
    /// [`PgStore::connect`]) already brought to [`crate::SCHEMA_VERSION`], without
    /// connecting yet: connections open on first use, on the runtime that
    /// uses them. For callers that must build a store inside a running
    /// runtime without awaiting (test fixtures); everyone else calls
    /// `connect`. Every pooled connection checks the schema version when
    /// it opens and refuses a newer one.
    pub fn open_migrated(url: &str, options: PgOptions) -> Result<Self> {
        Ok(Self {
            db: Db::open_migrated(url, options)?,
        })
    }

    /// How many `NOTIFY` statements this store has sent: one per change
    /// in [`NotifyMode::Immediate`](crate::NotifyMode::Immediate), one per
    /// batch in [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced)
    /// (what an operator or a test compares).
    pub fn notify_statements(&self) -> u64 {
        self.db.notify_statements.load(Ordering::Relaxed)
    }

    /// The options this store was built with.
    pub fn options(&self) -> &PgOptions {
        &self.db.options
    }

    /// The pool (for operators' checks and tests: e.g. the doctor).
    pub fn pool(&self) -> &Pool {
        &self.db.pool
    }

    /// Takes one pooled connection and gives it back: what a store opened
    /// with [`PgStore::open_migrated`] checks before its first operation
    /// (the schema version; behind a pooler, the session's settings), so a
    /// caller can refuse at start rather than at the first write.
    pub async fn check_connection(&self) -> Result<()> {
        self.db.conn("check a pooled connection").await.map(drop)
    }

    /// The query plan (`EXPLAIN`) of the first page `list_runs` would read
    /// for `scope` and `options`: what an operator (or a test) checks for
    /// index use.
    pub async fn explain_list_runs(
        &self,
        scope: &ListingScope,
        options: &ListOptions,
    ) -> Result<String> {
        crate::listing::explain_list_runs(&self.db, scope, options).await
    }

    /// The query plan of `claim_next`'s candidate search for `scope` and
    /// `filter` (its first, row-locking step).
    pub async fn explain_claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
    ) -> Result<String> {
        crate::listing::explain_claim_next(&self.db, scope, filter, false).await
    }

    /// `EXPLAIN (ANALYZE, BUFFERS)` of `claim_next`'s candidate statement:
    /// runs it (its row lock ends with the statement) and answers the plan
    /// with the rows and pages each node read.
    pub async fn explain_analyze_claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
    ) -> Result<String> {
        crate::listing::explain_claim_next(&self.db, scope, filter, true).await
    }

    /// The query plans of one `prune_finished` batch at `now` (the store
    /// clock when `None`): its scan, and the lock, sub-run and delete
    /// statements for the candidates the scan finds. Locks and deletes
    /// nothing.
    pub async fn explain_prune_finished(
        &self,
        scope: &ListingScope,
        policy: &RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<String> {
        crate::retention::explain_prune_finished(&self.db, scope, policy, now, limit).await
    }
}

#[async_trait]
impl CheckpointStore for PgStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        crate::checkpoints::write_checkpoint(&self.db, scope, checkpoint, fence).await
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        crate::checkpoints::read_checkpoint(&self.db, scope, id).await
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        crate::checkpoints::list_checkpoints(&self.db, scope).await
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        crate::checkpoints::delete_checkpoint(&self.db, scope, id, fence).await
    }

    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: runkeep::CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        crate::checkpoints::update_checkpoint(&self.db, scope, id, &update, fence).await
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        crate::parks::resolve_park(&self.db, scope, id, resolution, now, fence).await
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        crate::checkpoints::prune_checkpoints(&self.db, scope, keep_last, fence).await
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        crate::listing::list_runs(&self.db, scope, options).await
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        crate::claims::claim(&self.db, scope, options).await
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        crate::claims::release(&self.db, scope, fence).await
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        crate::claims::lease(&self.db, scope, now).await
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        crate::claims::claim_next(&self.db, scope, filter, options).await
    }

    async fn claim_next_batch(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        max: usize,
    ) -> Result<Vec<(RunScope, Lease)>> {
        crate::batch::claim_next_batch(&self.db, scope, filter, options, max).await
    }

    fn now(&self) -> Timestamp {
        self.db.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        crate::lifecycle::lifecycle(&self.db, scope).await
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        crate::lifecycle::enqueue(&self.db, scope, checkpoint, options).await
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        crate::lifecycle::finish(&self.db, scope, fence, outcome).await
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        crate::lifecycle::snooze(&self.db, scope, fence, until).await
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &runkeep::AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle> {
        crate::lifecycle::fail_attempt(&self.db, scope, fence, error, max_attempts).await
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
        crate::lifecycle::cancel(&self.db, scope, reason).await
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        crate::lifecycle::reopen(&self.db, scope).await
    }

    async fn set_priority(
        &self,
        scope: &RunScope,
        priority: runkeep::Priority,
    ) -> Result<Lifecycle> {
        crate::lifecycle::set_priority(&self.db, scope, priority).await
    }

    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
        dedupe: Option<&runkeep::Dedupe>,
    ) -> Result<runkeep::Enqueued> {
        crate::dedupe::enqueue_once(&self.db, scope, checkpoint, options, dedupe).await
    }

    async fn key_holdings(
        &self,
        session: &ListingScope,
        key: &str,
    ) -> Result<Vec<runkeep::KeyHolding>> {
        crate::keys::key_holdings(&self.db, session, key).await
    }

    async fn put_schedule(
        &self,
        session: &ListingScope,
        schedule: &runkeep::scheduling::Schedule,
    ) -> Result<runkeep::scheduling::Schedule> {
        crate::schedules::put(&self.db, session, schedule).await
    }

    async fn get_schedule(
        &self,
        session: &ListingScope,
        name: &str,
    ) -> Result<Option<runkeep::scheduling::Schedule>> {
        crate::schedules::get(&self.db, session, name).await
    }

    async fn list_schedules(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<runkeep::scheduling::ScheduleEntry>> {
        crate::schedules::list(&self.db, scope).await
    }

    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        crate::schedules::delete(&self.db, session, name).await
    }

    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        crate::schedules::advance(&self.db, session, name, from, to).await
    }

    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        crate::retention::prune_finished(&self.db, scope, policy, now, limit).await
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        crate::checkpoints::latest_checkpoint(&self.db, scope).await
    }

    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &runkeep::CheckpointIdQuery,
    ) -> Result<Vec<runkeep::CheckpointId>> {
        crate::checkpoints::checkpoint_ids(&self.db, scope, query).await
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        crate::parks::find_pending(&self.db, scope, now).await
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        crate::parks::resume_point(&self.db, scope, now).await
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        self.db.watch(topic)
    }
}

#[async_trait]
impl EvidenceStore for PgStore {
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        crate::events::append_events(&self.db, scope, events, fence).await
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        crate::events::read_events(&self.db, scope, options).await
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        crate::documents::write_run_record(&self.db, scope, record, fence).await
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        crate::documents::read_run_record(&self.db, scope).await
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        crate::documents::write_messages(&self.db, scope, messages, through_event_seq, fence).await
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        crate::documents::read_messages(&self.db, scope).await
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        crate::documents::write_report(&self.db, scope, report, fence).await
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        crate::documents::read_report(&self.db, scope).await
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        crate::events::append_audit(&self.db, scope, events, fence).await
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        crate::events::read_audit(&self.db, scope, since_seq).await
    }

    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        crate::step::commit_step(&self.db, scope, fence, step).await
    }

    async fn commit_step_and_claim_next(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
        next: &NextClaim,
    ) -> Result<Handover> {
        crate::step::commit_step_and_claim_next(&self.db, scope, fence, step, next).await
    }

    async fn commit_steps(
        &self,
        steps: &[runkeep::batch::StepCommit],
    ) -> Result<Vec<Result<StepReceipt>>> {
        crate::step::commit_steps(&self.db, steps).await
    }
}
