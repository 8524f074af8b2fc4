//! [`PgStore`] and its `CheckpointStore` / `EvidenceStore` impls, which only
//! delegate to the module of each job; the payload limit checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deadpool_postgres::Pool;
use serde_json::Value;

use runkeep::watch::Notifier;
use runkeep::{
    AuditRecord, Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions,
    ClaimOutcome, EnqueueOptions, Error, EventBatch, EvidenceStore, Fence, Lease, LeaseSummary,
    Lifecycle, ListOptions, ListingScope, MessageSnapshot, NewAuditEvent, NewEvent, Outcome,
    ParkResolution, PersistedEvent, ReadEventsOptions, Result, RunPage, RunRecord, RunScope, Step,
    StepReceipt, Timestamp, Watch, WatchTopic,
};
use runkeep::{Clock, Handover, NextClaim, RemoteClock};

use crate::options::PgOptions;

/// The PostgreSQL store. Cheap to share (`Arc<PgStore>`); every call takes
/// a pooled connection for its one transaction.
pub struct PgStore {
    pub(crate) pool: Pool,
    pub(crate) config: tokio_postgres::Config,
    pub(crate) options: PgOptions,
    pub(crate) channel: String,
    /// The server's clock: the local clock plus the offset last measured.
    pub(crate) server_clock: RemoteClock,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Where [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced) queues
    /// payloads for its background task (started on first use).
    pub(crate) coalescer: Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
    /// `NOTIFY` statements sent (each may carry many notifications).
    pub(crate) notify_statements: Arc<AtomicU64>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("PgStore")
            .field("schema", &self.options.schema)
            .field("pool_size", &self.options.pool_size)
            .field("test_clock", &self.options.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(h) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.abort();
        }
    }
}

impl PgStore {
    /// How many `NOTIFY` statements this store has sent: one per change
    /// in [`NotifyMode::Immediate`](crate::NotifyMode::Immediate), one per
    /// batch in [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced)
    /// (what an operator or a test compares).
    pub fn notify_statements(&self) -> u64 {
        self.notify_statements.load(Ordering::Relaxed)
    }

    /// The options this store was built with.
    pub fn options(&self) -> &PgOptions {
        &self.options
    }

    /// The pool (for operators' checks and tests: e.g. the doctor).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn check_payload(&self, what: &str, bytes: usize) -> Result<()> {
        if bytes > self.options.max_payload_bytes {
            return Err(Error::invalid(format!(
                "{what} is {bytes} bytes of JSON; this PostgreSQL store's limit is {} bytes (PgOptions::max_payload_bytes); store large bodies elsewhere and reference them",
                self.options.max_payload_bytes
            )));
        }
        Ok(())
    }

    pub(crate) fn check_json(&self, what: &str, v: &Value) -> Result<()> {
        let bytes = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
        self.check_payload(what, bytes)
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
        crate::checkpoints::write_checkpoint(self, scope, checkpoint, fence).await
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        crate::checkpoints::read_checkpoint(self, scope, id).await
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        crate::checkpoints::list_checkpoints(self, scope).await
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        crate::checkpoints::delete_checkpoint(self, scope, id, fence).await
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        crate::parks::resolve_park(self, scope, id, resolution, now, fence).await
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        crate::checkpoints::prune_checkpoints(self, scope, keep_last, fence).await
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        crate::listing::list_runs(self, scope, options).await
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        crate::claims::claim(self, scope, options).await
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        crate::claims::release(self, scope, fence).await
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        crate::claims::lease(self, scope, now).await
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        crate::claims::claim_next(self, scope, filter, options).await
    }

    fn now(&self) -> Timestamp {
        match &self.options.clock {
            Some(c) => c.now(),
            None => self.server_clock.now(),
        }
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        crate::lifecycle::lifecycle(self, scope).await
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        crate::lifecycle::enqueue(self, scope, checkpoint, options).await
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        crate::lifecycle::finish(self, scope, fence, outcome).await
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        crate::lifecycle::snooze(self, scope, fence, until).await
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        crate::lifecycle::reopen(self, scope).await
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        crate::checkpoints::latest_checkpoint(self, scope).await
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        crate::parks::find_pending(self, scope, now).await
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        crate::parks::resume_point(self, scope, now).await
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        if !self.ensure_listener() {
            return Watch::polling(self.options.watch_fallback);
        }
        self.notifier.subscribe(topic, self.options.watch_fallback)
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
        crate::events::append_events(self, scope, events, fence).await
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        crate::events::read_events(self, scope, options).await
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        crate::documents::write_run_record(self, scope, record, fence).await
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        crate::documents::read_run_record(self, scope).await
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        crate::documents::write_messages(self, scope, messages, through_event_seq, fence).await
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        crate::documents::read_messages(self, scope).await
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        crate::documents::write_report(self, scope, report, fence).await
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        crate::documents::read_report(self, scope).await
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        crate::events::append_audit(self, scope, events, fence).await
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        crate::events::read_audit(self, scope, since_seq).await
    }

    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        crate::step::commit_step(self, scope, fence, step).await
    }

    async fn commit_step_and_claim_next(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
        next: &NextClaim,
    ) -> Result<Handover> {
        crate::step::commit_step_and_claim_next(self, scope, fence, step, next).await
    }
}
