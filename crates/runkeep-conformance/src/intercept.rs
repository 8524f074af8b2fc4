//! A store wrapper for tests that change a few calls and forward the rest.
//!
//! Fault injection, call counting and the deliberately broken stores of the
//! meta-tests all wrap a working store and change two or three of its ~35
//! methods. Implement [`Intercept`] for the wrapper, naming the store every
//! other call goes to ([`Intercept::inner`]) and overriding only what it
//! changes, then wrap it in [`Intercepted`], which is the [`RunStore`]:
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//!
//! use async_trait::async_trait;
//! use runkeep::{CheckpointStore, ClaimOptions, ClaimOutcome, MemoryStore, RunScope, RunStore};
//! use runkeep_conformance::intercept::{Intercept, Intercepted};
//!
//! /// Counts claims; everything else is the memory store's.
//! #[derive(Debug, Default)]
//! struct CountingClaims {
//!     inner: MemoryStore,
//!     claims: AtomicU64,
//! }
//!
//! #[async_trait]
//! impl Intercept for CountingClaims {
//!     fn inner(&self) -> &dyn RunStore {
//!         &self.inner
//!     }
//!     async fn claim(&self, s: &RunScope, o: &ClaimOptions) -> runkeep::Result<ClaimOutcome> {
//!         self.claims.fetch_add(1, Ordering::SeqCst);
//!         self.inner.claim(s, o).await
//!     }
//! }
//!
//! let counting = Arc::new(Intercepted(CountingClaims::default()));
//! let store: Arc<dyn RunStore> = counting.clone();
//! // ... drive `store`; read the wrapper's own state through `counting`
//! // (`Intercepted` derefs to the wrapper):
//! assert_eq!(counting.claims.load(Ordering::SeqCst), 0);
//! # let _ = store;
//! ```
//!
//! [`Intercepted`] exists because the store traits are foreign to this
//! crate: a blanket `impl<T: Intercept> CheckpointStore for T` would break
//! the orphan rules, so the wrapper type carries the impls.
//!
//! # What a method that is not overridden does
//!
//! Every method of [`CheckpointStore`] and [`EvidenceStore`] has a default
//! here. Methods the contract requires forward to the inner store. For the
//! methods the contract *provides* (a default body built from other
//! methods), the default is chosen per method:
//!
//! | method | default | why |
//! |---|---|---|
//! | [`now`](Intercept::now) | the inner store's | the contract's default is the machine clock; the wrapped store judges time by its own clock (a `ManualClock`, the database's) |
//! | [`watch`](Intercept::watch) | the inner store's | writes land in the inner store, so its notifications fire; the contract's default only polls. A wrapper that keeps state outside the inner store (answers claims itself, say) may be woken only by the inner store's fallback interval, and can override this with [`Watch::polling`] |
//! | [`latest_checkpoint`](Intercept::latest_checkpoint), [`find_pending`](Intercept::find_pending), [`resume_point`](Intercept::resume_point) | the inner store's | the checkpoints live in the inner store: its own (possibly indexed) answer is the one under test. A wrapper that changes what `list_checkpoints` answers overrides these too if they must agree |
//! | [`commit_step_and_claim_next`](Intercept::commit_step_and_claim_next) | the contract's provided body over **this wrapper's** [`commit_step`](Intercept::commit_step) and [`claim_next`](Intercept::claim_next) | the hand-over is how a draining worker commits its last step and claims its next run, so a fault injected into `commit_step` or `claim_next` (or a count of them) must see it. The cost: a store that does both in one transaction (PostgreSQL) or one request (HTTP) is exercised through the two-call body. To keep the inner store's own, override it with `self.inner().commit_step_and_claim_next(..)` |
//! | [`claim_next_batch`](Intercept::claim_next_batch), [`commit_steps`](Intercept::commit_steps) | the contract's provided bodies over **this wrapper's** [`claim_next`](Intercept::claim_next) and [`commit_step`](Intercept::commit_step) | the same reason: a fault injected into a claim or a step must reach the runs of a batch. Override with `self.inner().claim_next_batch(..)` / `commit_steps(..)` to keep the inner store's |
//!
//! The conveniences of [`runkeep::RunStoreExt`] (`expired_parks`,
//! `completed_tools`) are implemented for every store and cannot be
//! overridden: they run on the wrapper's `list_checkpoints` and
//! `read_events`.
//!
//! An override that needs the untouched store calls the inner store
//! directly (`self.inner` or [`Intercept::inner`]); one that calls a method
//! on `self` gets this wrapper's version of it, override or default.

use std::ops::{Deref, DerefMut};

use async_trait::async_trait;
use runkeep::scheduling::schedule::{Schedule, ScheduleEntry};
use runkeep::{
    AttemptError, AuditRecord, Checkpoint, CheckpointId, CheckpointStore, CheckpointUpdate,
    ClaimNextFilter, ClaimOptions, ClaimOutcome, Dedupe, EnqueueOptions, Enqueued, EventBatch,
    EvidenceStore, Fence, Handover, KeyHolding, Lease, LeaseSummary, Lifecycle, ListOptions,
    ListingScope, MessageSnapshot, NewAuditEvent, NewEvent, NextClaim, Outcome, ParkResolution,
    PersistedEvent, Priority, ReadEventsOptions, Result, RunPage, RunRecord, RunScope, RunStore,
    Step, StepCommit, StepReceipt, Timestamp, Watch, WatchTopic,
};
use serde_json::Value;

/// A store wrapper that overrides some calls and forwards the rest to
/// [`inner`](Self::inner); see the [module docs](self) for what each
/// default does. Wrap an implementor in [`Intercepted`] to use it as a
/// [`RunStore`].
#[async_trait]
pub trait Intercept: Send + Sync + std::fmt::Debug {
    /// The store every call that is not overridden goes to.
    fn inner(&self) -> &dyn RunStore;

    // ------------------------------------------------ CheckpointStore

    /// [`CheckpointStore::write_checkpoint`]; forwards.
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.inner()
            .write_checkpoint(scope, checkpoint, fence)
            .await
    }

    /// [`CheckpointStore::read_checkpoint`]; forwards.
    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        self.inner().read_checkpoint(scope, id).await
    }

    /// [`CheckpointStore::list_checkpoints`]; forwards.
    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        self.inner().list_checkpoints(scope).await
    }

    /// [`CheckpointStore::delete_checkpoint`]; forwards.
    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        self.inner().delete_checkpoint(scope, id, fence).await
    }

    /// [`CheckpointStore::update_checkpoint`]; forwards.
    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.inner()
            .update_checkpoint(scope, id, update, fence)
            .await
    }

    /// [`CheckpointStore::resolve_park`]; forwards.
    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.inner()
            .resolve_park(scope, id, resolution, now, fence)
            .await
    }

    /// [`CheckpointStore::prune_checkpoints`]; forwards.
    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        self.inner()
            .prune_checkpoints(scope, keep_last, fence)
            .await
    }

    /// [`CheckpointStore::list_runs`]; forwards.
    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        self.inner().list_runs(scope, options).await
    }

    /// [`CheckpointStore::claim`]; forwards.
    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        self.inner().claim(scope, options).await
    }

    /// [`CheckpointStore::release`]; forwards.
    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        self.inner().release(scope, fence).await
    }

    /// [`CheckpointStore::lease`]; forwards.
    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        self.inner().lease(scope, now).await
    }

    /// [`CheckpointStore::claim_next`]; forwards. The default hand-over
    /// claims through this method.
    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        self.inner().claim_next(scope, filter, options).await
    }

    /// [`CheckpointStore::claim_next_batch`]: the contract's provided body
    /// over **this wrapper's** [`claim_next`](Self::claim_next). Override
    /// with `self.inner().claim_next_batch(..)` to keep the inner store's.
    async fn claim_next_batch(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        max: usize,
    ) -> Result<Vec<(RunScope, Lease)>> {
        runkeep::batch::claim_one_by_one(max, || self.claim_next(scope, filter, options)).await
    }

    /// [`CheckpointStore::now`]: the inner store's clock (not the
    /// contract's machine-clock default).
    fn now(&self) -> Timestamp {
        self.inner().now()
    }

    /// [`CheckpointStore::lifecycle`]; forwards.
    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        self.inner().lifecycle(scope).await
    }

    /// [`CheckpointStore::enqueue`]; forwards.
    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        self.inner().enqueue(scope, checkpoint, options).await
    }

    /// [`CheckpointStore::finish`]; forwards.
    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        self.inner().finish(scope, fence, outcome).await
    }

    /// [`CheckpointStore::snooze`]; forwards.
    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        self.inner().snooze(scope, fence, until).await
    }

    /// [`CheckpointStore::fail_attempt`]; forwards.
    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle> {
        self.inner()
            .fail_attempt(scope, fence, error, max_attempts)
            .await
    }

    /// [`CheckpointStore::cancel`]; forwards.
    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
        self.inner().cancel(scope, reason).await
    }

    /// [`CheckpointStore::reopen`]; forwards.
    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        self.inner().reopen(scope).await
    }

    /// [`CheckpointStore::set_priority`]; forwards.
    async fn set_priority(&self, scope: &RunScope, priority: Priority) -> Result<Lifecycle> {
        self.inner().set_priority(scope, priority).await
    }

    /// [`CheckpointStore::enqueue_once`]; forwards.
    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
        dedupe: Option<&Dedupe>,
    ) -> Result<Enqueued> {
        self.inner()
            .enqueue_once(scope, checkpoint, options, dedupe)
            .await
    }

    /// [`CheckpointStore::key_holdings`]; forwards.
    async fn key_holdings(&self, session: &ListingScope, key: &str) -> Result<Vec<KeyHolding>> {
        self.inner().key_holdings(session, key).await
    }

    /// [`CheckpointStore::put_schedule`]; forwards.
    async fn put_schedule(&self, session: &ListingScope, schedule: &Schedule) -> Result<Schedule> {
        self.inner().put_schedule(session, schedule).await
    }

    /// [`CheckpointStore::get_schedule`]; forwards.
    async fn get_schedule(&self, session: &ListingScope, name: &str) -> Result<Option<Schedule>> {
        self.inner().get_schedule(session, name).await
    }

    /// [`CheckpointStore::list_schedules`]; forwards.
    async fn list_schedules(&self, scope: &ListingScope) -> Result<Vec<ScheduleEntry>> {
        self.inner().list_schedules(scope).await
    }

    /// [`CheckpointStore::delete_schedule`]; forwards.
    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        self.inner().delete_schedule(session, name).await
    }

    /// [`CheckpointStore::advance_schedule`]; forwards.
    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        self.inner().advance_schedule(session, name, from, to).await
    }

    /// [`CheckpointStore::prune_finished`]; forwards.
    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &runkeep::scheduling::RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        self.inner().prune_finished(scope, policy, now, limit).await
    }

    /// [`CheckpointStore::latest_checkpoint`]: the inner store's own answer
    /// (its index, if it has one), not the provided body over this
    /// wrapper's `list_checkpoints`.
    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        self.inner().latest_checkpoint(scope).await
    }

    /// [`CheckpointStore::checkpoint_ids`]: the inner store's own answer.
    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &runkeep::CheckpointIdQuery,
    ) -> Result<Vec<runkeep::CheckpointId>> {
        self.inner().checkpoint_ids(scope, query).await
    }

    /// [`CheckpointStore::find_pending`]: the inner store's own answer, like
    /// [`latest_checkpoint`](Self::latest_checkpoint).
    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        self.inner().find_pending(scope, now).await
    }

    /// [`CheckpointStore::resume_point`]: the inner store's own answer, like
    /// [`latest_checkpoint`](Self::latest_checkpoint).
    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        self.inner().resume_point(scope, now).await
    }

    /// [`CheckpointStore::watch`]: the inner store's subscription (not the
    /// contract's polling default).
    fn watch(&self, topic: &WatchTopic) -> Watch {
        self.inner().watch(topic)
    }

    // -------------------------------------------------- EvidenceStore

    /// [`EvidenceStore::append_events`]; forwards.
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        self.inner().append_events(scope, events, fence).await
    }

    /// [`EvidenceStore::read_events`]; forwards.
    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        self.inner().read_events(scope, options).await
    }

    /// [`EvidenceStore::write_run_record`]; forwards.
    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        self.inner().write_run_record(scope, record, fence).await
    }

    /// [`EvidenceStore::read_run_record`]; forwards.
    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        self.inner().read_run_record(scope).await
    }

    /// [`EvidenceStore::write_messages`]; forwards.
    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        self.inner()
            .write_messages(scope, messages, through_event_seq, fence)
            .await
    }

    /// [`EvidenceStore::read_messages`]; forwards.
    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        self.inner().read_messages(scope).await
    }

    /// [`EvidenceStore::write_report`]; forwards.
    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        self.inner().write_report(scope, report, fence).await
    }

    /// [`EvidenceStore::read_report`]; forwards.
    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        self.inner().read_report(scope).await
    }

    /// [`EvidenceStore::append_audit`]; forwards.
    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        self.inner().append_audit(scope, events, fence).await
    }

    /// [`EvidenceStore::read_audit`]; forwards.
    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        self.inner().read_audit(scope, since_seq).await
    }

    /// [`EvidenceStore::commit_step`]; forwards. The default hand-over
    /// commits through this method.
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        self.inner().commit_step(scope, fence, step).await
    }

    /// [`EvidenceStore::commit_step_and_claim_next`]: the contract's
    /// provided body over **this wrapper's** [`commit_step`](Self::commit_step)
    /// and [`claim_next`](Self::claim_next), so their overrides are seen by
    /// hand-overs; not the inner store's own (one transaction in
    /// PostgreSQL). Override with `self.inner().commit_step_and_claim_next(..)`
    /// to keep the inner store's.
    async fn commit_step_and_claim_next(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
        next: &NextClaim,
    ) -> Result<Handover> {
        let receipt = self.commit_step(scope, fence, step).await?;
        let next = self
            .claim_next(&next.scope, &next.filter, &next.options)
            .await;
        Ok(Handover { receipt, next })
    }

    /// [`EvidenceStore::commit_steps`]: the contract's provided body over
    /// **this wrapper's** [`commit_step`](Self::commit_step). Override with
    /// `self.inner().commit_steps(..)` to keep the inner store's.
    async fn commit_steps(&self, steps: &[StepCommit]) -> Result<Vec<Result<StepReceipt>>> {
        runkeep::batch::commit_one_by_one(steps, |s| self.commit_step(&s.scope, s.fence, &s.step))
            .await
    }
}

/// An [`Intercept`] as a store: `Arc::new(Intercepted(wrapper))` is a
/// [`RunStore`] whose every call goes to the wrapper's version of it. It
/// derefs to the wrapper, so a test reaches the wrapper's own state (its
/// switches and counters) through the same `Arc`.
#[derive(Debug, Default)]
pub struct Intercepted<I>(pub I);

impl<I> Deref for Intercepted<I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.0
    }
}

impl<I> DerefMut for Intercepted<I> {
    fn deref_mut(&mut self) -> &mut I {
        &mut self.0
    }
}

#[async_trait]
impl<I: Intercept> CheckpointStore for Intercepted<I> {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.0.write_checkpoint(scope, checkpoint, fence).await
    }
    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        self.0.read_checkpoint(scope, id).await
    }
    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        self.0.list_checkpoints(scope).await
    }
    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        self.0.delete_checkpoint(scope, id, fence).await
    }
    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.0.update_checkpoint(scope, id, update, fence).await
    }
    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.0.resolve_park(scope, id, resolution, now, fence).await
    }
    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        self.0.prune_checkpoints(scope, keep_last, fence).await
    }
    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        self.0.list_runs(scope, options).await
    }
    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        self.0.claim(scope, options).await
    }
    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        self.0.release(scope, fence).await
    }
    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        self.0.lease(scope, now).await
    }
    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        self.0.claim_next(scope, filter, options).await
    }
    async fn claim_next_batch(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        max: usize,
    ) -> Result<Vec<(RunScope, Lease)>> {
        self.0.claim_next_batch(scope, filter, options, max).await
    }
    fn now(&self) -> Timestamp {
        self.0.now()
    }
    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        self.0.lifecycle(scope).await
    }
    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        self.0.enqueue(scope, checkpoint, options).await
    }
    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        self.0.finish(scope, fence, outcome).await
    }
    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        self.0.snooze(scope, fence, until).await
    }
    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle> {
        self.0.fail_attempt(scope, fence, error, max_attempts).await
    }
    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
        self.0.cancel(scope, reason).await
    }
    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        self.0.reopen(scope).await
    }
    async fn set_priority(&self, scope: &RunScope, priority: Priority) -> Result<Lifecycle> {
        self.0.set_priority(scope, priority).await
    }
    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
        dedupe: Option<&Dedupe>,
    ) -> Result<Enqueued> {
        self.0
            .enqueue_once(scope, checkpoint, options, dedupe)
            .await
    }
    async fn key_holdings(&self, session: &ListingScope, key: &str) -> Result<Vec<KeyHolding>> {
        self.0.key_holdings(session, key).await
    }
    async fn put_schedule(&self, session: &ListingScope, schedule: &Schedule) -> Result<Schedule> {
        self.0.put_schedule(session, schedule).await
    }
    async fn get_schedule(&self, session: &ListingScope, name: &str) -> Result<Option<Schedule>> {
        self.0.get_schedule(session, name).await
    }
    async fn list_schedules(&self, scope: &ListingScope) -> Result<Vec<ScheduleEntry>> {
        self.0.list_schedules(scope).await
    }
    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        self.0.delete_schedule(session, name).await
    }
    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        self.0.advance_schedule(session, name, from, to).await
    }

    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &runkeep::scheduling::RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        self.0.prune_finished(scope, policy, now, limit).await
    }
    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        self.0.latest_checkpoint(scope).await
    }
    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &runkeep::CheckpointIdQuery,
    ) -> Result<Vec<runkeep::CheckpointId>> {
        self.0.checkpoint_ids(scope, query).await
    }
    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        self.0.find_pending(scope, now).await
    }
    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        self.0.resume_point(scope, now).await
    }
    fn watch(&self, topic: &WatchTopic) -> Watch {
        self.0.watch(topic)
    }
}

#[async_trait]
impl<I: Intercept> EvidenceStore for Intercepted<I> {
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        self.0.append_events(scope, events, fence).await
    }
    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        self.0.read_events(scope, options).await
    }
    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        self.0.write_run_record(scope, record, fence).await
    }
    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        self.0.read_run_record(scope).await
    }
    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        self.0
            .write_messages(scope, messages, through_event_seq, fence)
            .await
    }
    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        self.0.read_messages(scope).await
    }
    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        self.0.write_report(scope, report, fence).await
    }
    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        self.0.read_report(scope).await
    }
    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        self.0.append_audit(scope, events, fence).await
    }
    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        self.0.read_audit(scope, since_seq).await
    }
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        self.0.commit_step(scope, fence, step).await
    }
    async fn commit_step_and_claim_next(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
        next: &NextClaim,
    ) -> Result<Handover> {
        self.0
            .commit_step_and_claim_next(scope, fence, step, next)
            .await
    }
    async fn commit_steps(&self, steps: &[StepCommit]) -> Result<Vec<Result<StepReceipt>>> {
        self.0.commit_steps(steps).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use runkeep::{Clock, ManualClock, MemoryStore, Ttl};

    use super::*;
    use crate::support::{self, checkpoint, claim_now, listing, run};
    use crate::{all_cases, differential, outcome_of, CaseEnv, Fixture};

    /// Overrides nothing.
    #[derive(Debug)]
    struct Transparent<S>(S);

    impl<S: RunStore> Intercept for Transparent<S> {
        fn inner(&self) -> &dyn RunStore {
            &self.0
        }
    }

    fn transparent(clock: ManualClock) -> Arc<dyn RunStore> {
        Arc::new(Intercepted(Transparent(MemoryStore::with_clock(Arc::new(
            clock,
        )))))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrapper_that_overrides_nothing_passes_every_conformance_case() {
        let mut failed = Vec::new();
        for case in all_cases() {
            let clock = support::store_clock();
            let env = CaseEnv {
                contract_version: crate::CONTRACT_VERSION,
                clock: Some(clock.clone()),
            };
            if let Err(msg) = outcome_of(case, transparent(clock), env).await {
                failed.push((case.name, msg));
            }
        }
        assert!(failed.is_empty(), "{failed:#?}");
    }

    #[test]
    fn a_wrapper_that_overrides_nothing_agrees_with_the_reference_model() {
        let report = differential::check(
            |clock| Fixture::new(transparent(clock.clone()), 3, ()).with_clock(clock),
            differential::Config::default(),
        );
        assert_eq!(report.cases, differential::Config::default().cases);
    }

    /// A store whose indexed answers disagree with its full read, so a
    /// wrapper's forwarding to them can be told from the provided bodies.
    #[derive(Debug)]
    struct NoIndex(MemoryStore);

    #[async_trait]
    impl Intercept for NoIndex {
        fn inner(&self) -> &dyn RunStore {
            &self.0
        }
        async fn latest_checkpoint(&self, _: &RunScope) -> Result<Option<Checkpoint>> {
            Ok(None)
        }
        async fn find_pending(&self, _: &RunScope, _: Timestamp) -> Result<Option<Checkpoint>> {
            Ok(None)
        }
        async fn resume_point(&self, _: &RunScope, _: Timestamp) -> Result<Option<Checkpoint>> {
            Ok(None)
        }
    }

    #[tokio::test]
    async fn the_provided_reads_the_clock_and_the_watch_are_the_inner_stores_own() {
        let clock = ManualClock::new(support::at(-123_456));
        let inner = Intercepted(NoIndex(MemoryStore::with_clock(Arc::new(clock.clone()))));
        let store: Arc<dyn RunStore> = Arc::new(Intercepted(Transparent(inner)));
        let a = run("a");
        support::write(&store, &a, &support::parked("p", 0, 0, None), None).await;
        assert_eq!(store.list_checkpoints(&a).await.unwrap().len(), 1);
        // The inner store's answers, not the provided bodies over the full read.
        assert_eq!(store.latest_checkpoint(&a).await.unwrap(), None);
        assert_eq!(store.find_pending(&a, clock.now()).await.unwrap(), None);
        assert_eq!(store.resume_point(&a, clock.now()).await.unwrap(), None);
        // The inner store's clock, not the machine's.
        assert_eq!(store.now(), support::at(-123_456));
        // The memory store's notifying watch, not the contract's polling one.
        assert!(!store.watch(&WatchTopic::Runnable(listing())).is_polling());
    }

    /// Counts step commits and `claim_next` calls.
    #[derive(Debug, Default)]
    struct Counting {
        inner: MemoryStore,
        steps: AtomicU64,
        claims: AtomicU64,
    }

    #[async_trait]
    impl Intercept for Counting {
        fn inner(&self) -> &dyn RunStore {
            &self.inner
        }
        async fn claim_next(
            &self,
            scope: &ListingScope,
            filter: &ClaimNextFilter,
            options: &ClaimOptions,
        ) -> Result<Option<(RunScope, Lease)>> {
            self.claims.fetch_add(1, Ordering::SeqCst);
            self.inner.claim_next(scope, filter, options).await
        }
        async fn commit_step(
            &self,
            scope: &RunScope,
            fence: Fence,
            step: &Step,
        ) -> Result<StepReceipt> {
            self.steps.fetch_add(1, Ordering::SeqCst);
            self.inner.commit_step(scope, fence, step).await
        }
    }

    #[tokio::test]
    async fn an_override_is_called_directly_and_by_the_hand_over() {
        let counting = Arc::new(Intercepted(Counting::default()));
        let store: Arc<dyn RunStore> = counting.clone();
        let counts = || {
            (
                counting.steps.load(Ordering::SeqCst),
                counting.claims.load(Ordering::SeqCst),
            )
        };
        let (a, b) = (run("a"), run("b"));
        for s in [&a, &b] {
            store
                .enqueue(s, &checkpoint("c", 0), &EnqueueOptions::default())
                .await
                .unwrap();
        }
        let (taken, lease) = store
            .claim_next(
                &listing(),
                &ClaimNextFilter::default(),
                &claim_now("w", 60_000),
            )
            .await
            .unwrap()
            .expect("a run");
        assert_eq!(counts(), (0, 1));
        let note = Step {
            events: vec![support::event("note", serde_json::json!({}))],
            ..Step::default()
        };
        store.commit_step(&taken, lease.fence, &note).await.unwrap();
        assert_eq!(counts(), (1, 1));
        // The hand-over commits and claims through the overrides.
        let next = NextClaim {
            scope: listing(),
            filter: ClaimNextFilter::default(),
            options: ClaimOptions::new(support::holder("w"), Ttl::from_millis(60_000).unwrap()),
        };
        let step = Step {
            finish: Some(Outcome::completed(None)),
            ..Step::default()
        };
        let h = store
            .commit_step_and_claim_next(&taken, lease.fence, &step, &next)
            .await
            .unwrap();
        let (other, _) = h.next.unwrap().expect("the other run");
        assert_eq!(other, if taken == a { b } else { a });
        assert_eq!(counts(), (2, 2));
        // Methods not overridden reach the inner store.
        assert!(store.lifecycle(&taken).await.unwrap().status.is_finished());
    }
}
