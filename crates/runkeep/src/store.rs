//! The store contract.
//!
//! A backend implements [`CheckpointStore`] and [`EvidenceStore`]; together
//! they are a [`RunStore`], usable as `Arc<dyn RunStore>`. Fencing, exclusive
//! claims and ordered appends are part of the contract, not capabilities: a
//! backend that cannot provide one refuses at construction.
//!
//! Conveniences built on the contract live in [`RunStoreExt`], implemented for
//! every store, so the implementor traits stay small. Every `# Contract`
//! bullet has a case in `runkeep-conformance`.

use async_trait::async_trait;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::evidence::{
    completed_tools, AuditRecord, CompletedTools, EventBatch, MessageSnapshot, NewAuditEvent,
    NewEvent, PersistedEvent, ReadEventsOptions, RunRecord,
};
use crate::id::CheckpointId;
use crate::lease::{ClaimOptions, ClaimOutcome, Fence, Lease, LeaseSummary};
use crate::listing::{ListOptions, ListOrder, RunPage};
use crate::park::{self, ParkResolution, ParkState};
use crate::scope::{ListingScope, RunScope};
use crate::time::Timestamp;

/// What `claim_next` may take.
///
/// The store keeps no run status (a checkpoint is written mid-flight, so it
/// cannot tell a finished run from a dead one), and a finished run stays
/// listed. To make a queue that forgets finished work, express each work
/// item as a park and filter on `Outstanding`: answering the park (compare-
/// and-set, once) takes the run out of the queue. This is how `runkeep
/// soak` drives its workers. Without a park filter, the worker runtime's
/// drain steps each run at most once per pass instead.
#[derive(Clone, Debug, Default)]
pub struct ClaimNextFilter {
    /// Only runs whose park is in this set (`None`: any run).
    pub park: Option<Vec<ParkState>>,
    /// Which run comes first.
    pub order: ListOrder,
}

/// Checkpoints, leases and the listing.
#[async_trait]
pub trait CheckpointStore: Send + Sync + std::fmt::Debug {
    /// Persists a checkpoint, replacing one with the same id, and returns it
    /// as stored.
    ///
    /// # Contract
    /// - The input is validated first (ids, reserved keys, `runId` matching the
    ///   scope, park shape, size); invalid input changes nothing.
    /// - With `Some(fence)`, the write is refused with `FencedOut` if the run's
    ///   top holding is above `fence` or is a release tombstone, and with
    ///   `InvalidInput` if `fence` was never issued; the check is atomic with
    ///   the write (or, on a filesystem, as close as documented), and a refused
    ///   write leaves nothing behind.
    /// - With `None`, the write is accepted whatever the lease state.
    /// - The stored checkpoint's `fence` is the presented fence, or the run's
    ///   top fence for an unfenced write (none if never claimed).
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint>;

    /// Reads one checkpoint.
    ///
    /// # Contract
    /// - Absent ⇒ `Ok(None)`; present but unreadable ⇒ `Corrupted`, never `None`.
    /// - Has no side effects (creates nothing).
    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>>;

    /// All checkpoints of a run in the total order `(fence, created_at, id)`,
    /// oldest first.
    ///
    /// # Contract
    /// - Never silently short: an unreadable checkpoint fails the call.
    /// - No side effects.
    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>>;

    /// Deletes a checkpoint; `Ok(false)` if it was absent (idempotent).
    ///
    /// # Contract
    /// - Fenced like a write when `fence` is given.
    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool>;

    /// Answers the park on a checkpoint, compare-and-set, and returns the
    /// checkpoint as stored.
    ///
    /// # Contract
    /// - Absent checkpoint ⇒ `NotFound`; not parked or already answered ⇒
    ///   `Conflict`, and nothing changes (a second answer never overwrites the
    ///   first, even when two answer at once).
    /// - Fenced like a write when `fence` is given.
    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint>;

    /// Deletes all but the newest `keep_last` checkpoints (total order), never
    /// an unanswered park; returns the deleted ids.
    ///
    /// # Contract
    /// - Unanswered parks (outstanding or expired) are never deleted.
    /// - Fenced like a write when `fence` is given.
    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>>;

    /// One page of runs with at least one checkpoint under `scope`.
    ///
    /// # Contract
    /// - Filters, orders and cursors follow [`crate::listing`]; bad options are
    ///   refused with `InvalidInput`.
    /// - A run whose records cannot be read is a row flagged `damaged`, never a
    ///   failed page and never a missing row.
    /// - No side effects; cost proportional to the page, not the store.
    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage>;

    /// Claims, renews or reclaims a run.
    ///
    /// # Contract
    /// - Never claimed ⇒ fence 1. Released, expired or unreadable top holding,
    ///   or a renewal by the same holder ⇒ a fence above every fence ever
    ///   issued (release leaves a tombstone: the next claim is `fence + 2`).
    /// - Held live by another holder ⇒ `Held`, not an error.
    /// - Among any number of simultaneous claimers, at most one acquires each
    ///   fence; no fence is ever issued twice.
    /// - Losing every attempt to other takers ⇒ `Contended` (retryable).
    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome>;

    /// Releases the run if `fence` is its current holding; `Ok(false)` and no
    /// change otherwise (never an error for a stale or unknown fence).
    ///
    /// # Contract
    /// - Only the top holding's own fence releases; a superseded holder's late
    ///   release leaves the new holder untouched.
    /// - Afterwards the run is claimable at once and `fence` is refused on write.
    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool>;

    /// The run's top holding as a listing would show it at `now`; `None` if
    /// never claimed. No side effects.
    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>>;

    /// Atomically takes the next run under `scope` that nobody holds live and
    /// that matches `filter`, in the filter's order.
    ///
    /// # Contract
    /// - Returns `None` when no such run exists; never returns a run held live
    ///   by someone else; two concurrent callers never get the same run at the
    ///   same fence.
    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>>;
}

/// The run's evidence.
#[async_trait]
pub trait EvidenceStore: Send + Sync + std::fmt::Debug {
    /// Appends events in order and returns them as recorded.
    ///
    /// # Contract
    /// - `seq` is assigned by the store: `last + 1, last + 2, …`, atomically
    ///   with the write; two appenders never share a number.
    /// - `timestamp` is stamped by the store; `generation` is the presented fence.
    /// - Fenced like a checkpoint write; a refused batch writes nothing.
    /// - Invalid events (reserved keys, size) refuse the whole batch.
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>>;

    /// Reads the transcript after `since_seq` (exclusive), in log order.
    ///
    /// # Contract
    /// - Missing log ⇒ empty batch; no side effects.
    /// - Tolerant mode skips damaged records and lists them; strict mode
    ///   refuses them with `Corrupted`.
    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch>;

    /// Replaces the run record.
    ///
    /// # Contract
    /// - Fenced like a checkpoint write. Read back exactly by `read_run_record`.
    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()>;

    /// Reads the run record (`None` if never written).
    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>>;

    /// Publishes the message history with the event-log head it follows.
    ///
    /// # Contract
    /// - Fenced like a checkpoint write. An explicit empty list reads back as
    ///   `Available` with no messages; never-written reads back `Unavailable`.
    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()>;

    /// Reads the message snapshot.
    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot>;

    /// Stores the final report.
    ///
    /// # Contract
    /// - Fenced like a checkpoint write.
    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()>;

    /// Reads the final report (`None` if never written).
    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>>;

    /// Appends to the audit trail (its own `seq` space) and returns the records.
    ///
    /// # Contract
    /// - Fenced like a checkpoint write; a refused append writes nothing.
    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>>;

    /// Reads the audit trail after `since_seq` (exclusive).
    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>>;
}

/// A complete store.
pub trait RunStore: CheckpointStore + EvidenceStore {}
impl<T: CheckpointStore + EvidenceStore + ?Sized> RunStore for T {}

/// Conveniences over the contract, for every store.
#[async_trait]
pub trait RunStoreExt: RunStore {
    /// The latest checkpoint under the total order.
    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        Ok(self.list_checkpoints(scope).await?.pop())
    }

    /// The checkpoint whose park is outstanding at `now` (latest by the
    /// total order), if any.
    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let cps = self.list_checkpoints(scope).await?;
        Ok(park::find_pending(&cps, now).cloned())
    }

    /// The resume point: the pending checkpoint if any, else the latest.
    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let mut cps = self.list_checkpoints(scope).await?;
        if let Some(p) = park::find_pending(&cps, now) {
            return Ok(Some(p.clone()));
        }
        Ok(cps.pop())
    }

    /// Every checkpoint whose park expired unanswered at `now`.
    async fn expired_parks(&self, scope: &RunScope, now: Timestamp) -> Result<Vec<Checkpoint>> {
        let cps = self.list_checkpoints(scope).await?;
        Ok(park::expired_parks(&cps, now)
            .into_iter()
            .cloned()
            .collect())
    }

    /// The completed-tool ledger from the transcript.
    async fn completed_tools(&self, scope: &RunScope) -> Result<CompletedTools> {
        let batch = self
            .read_events(scope, &ReadEventsOptions::default())
            .await?;
        Ok(completed_tools(&batch))
    }
}

impl<T: RunStore + ?Sized> RunStoreExt for T {}
