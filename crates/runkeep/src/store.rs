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
//!
//! # Contract revision 2
//!
//! Revision 2 makes the store a work queue: run lifecycle ([`finish`],
//! [`reopen`], [`lifecycle`], [`enqueue`]), attempts and dead-lettering,
//! deferral ([`snooze`], `available_at`), the atomic step
//! ([`EvidenceStore::commit_step`]), the answers a backend can index
//! ([`latest_checkpoint`], [`find_pending`], [`resume_point`] are contract
//! methods a backend may answer from an index), the store's clock
//! ([`CheckpointStore::now`]: claims, expiry, deadlines and `finished_at` are
//! judged by it when a call passes no instant) and waiting instead of
//! polling ([`CheckpointStore::watch`]).
//!
//! [`finish`]: CheckpointStore::finish
//! [`reopen`]: CheckpointStore::reopen
//! [`lifecycle`]: CheckpointStore::lifecycle
//! [`enqueue`]: CheckpointStore::enqueue
//! [`snooze`]: CheckpointStore::snooze
//! [`latest_checkpoint`]: CheckpointStore::latest_checkpoint
//! [`find_pending`]: CheckpointStore::find_pending
//! [`resume_point`]: CheckpointStore::resume_point

/// The contract revision this crate defines: 3 added scheduling (priorities,
/// concurrency keys, the dedupe window, schedules), retention and
/// `update_checkpoint` to revision 2.
pub const CONTRACT_REVISION: u32 = 3;

use async_trait::async_trait;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::evidence::{
    completed_tools, AuditRecord, CompletedTools, EventBatch, MessageSnapshot, NewAuditEvent,
    NewEvent, PersistedEvent, ReadEventsOptions, RunRecord,
};
use crate::failure::AttemptError;
use crate::id::CheckpointId;
use crate::lease::{ClaimOptions, ClaimOutcome, Fence, Lease, LeaseSummary};
use crate::lifecycle::{EnqueueOptions, Lifecycle, Outcome};
use crate::listing::{ListOptions, ListOrder, RunPage};
use crate::park::{self, ParkResolution, ParkState};
use crate::scheduling::schedule::{Schedule, ScheduleEntry};
use crate::scheduling::{Dedupe, Enqueued, KeyHolding, Priority};
use crate::scheduling::{PruneReport, RetentionPolicy};
use crate::scope::{ListingScope, RunScope};
use crate::step::{Step, StepReceipt};
use crate::time::Timestamp;
use crate::watch::{Watch, WatchTopic, DEFAULT_POLL};

/// What `claim_next` may take. It never takes a finished run or one
/// deferred past the claim's instant (contract v2, [`crate::lifecycle`]).
#[derive(Clone, Debug, Default)]
pub struct ClaimNextFilter {
    /// Only runs whose park is in this set (`None`: any run).
    pub park: Option<Vec<ParkState>>,
    /// Which run comes first.
    pub order: ListOrder,
}

/// Which checkpoint ids [`CheckpointStore::checkpoint_ids`] answers: those
/// starting with `prefix`, strictly below `before` (byte order), at most
/// `limit` of them, greatest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointIdQuery {
    /// Only ids starting with this (`""`: every id). At most
    /// [`crate::id::MAX_ID_LEN`] characters of `[A-Za-z0-9_-]`.
    pub prefix: String,
    /// Only ids strictly below this one in byte order.
    pub before: Option<CheckpointId>,
    /// At most this many (`None`: all; `Some(0)` is refused).
    pub limit: Option<usize>,
}

impl CheckpointIdQuery {
    /// Refuses a query no id could be asked by: a `prefix` outside the id
    /// alphabet or longer than an id, a `limit` of 0.
    pub fn validate(&self) -> Result<()> {
        if self.prefix.len() > crate::id::MAX_ID_LEN {
            return Err(crate::Error::invalid(format!(
                "checkpoint id prefix is {} bytes long; ids are at most {} bytes",
                self.prefix.len(),
                crate::id::MAX_ID_LEN
            )));
        }
        if let Some(bad) = self
            .prefix
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(crate::Error::invalid(format!(
                "checkpoint id prefix {:?} contains {bad:?}; ids only use [A-Za-z0-9_-]",
                self.prefix
            )));
        }
        if self.limit == Some(0) {
            return Err(crate::Error::invalid(
                "checkpoint id limit is 0; ask for at least one id, or none for all",
            ));
        }
        Ok(())
    }

    /// Whether `id` is one this query answers (prefix and `before`; not
    /// the limit).
    pub fn admits(&self, id: &CheckpointId) -> bool {
        id.as_str().starts_with(&self.prefix)
            && self
                .before
                .as_ref()
                .is_none_or(|b| id.as_str().as_bytes() < b.as_str().as_bytes())
    }

    /// The answer over `ids` (any order, no duplicates): the admitted ones,
    /// greatest first, cut at `limit`.
    pub fn answer(&self, ids: impl IntoIterator<Item = CheckpointId>) -> Vec<CheckpointId> {
        let mut v: Vec<CheckpointId> = ids.into_iter().filter(|id| self.admits(id)).collect();
        v.sort_by(|a, b| b.as_str().as_bytes().cmp(a.as_str().as_bytes()));
        if let Some(n) = self.limit {
            v.truncate(n);
        }
        v
    }
}

fn schedules_unsupported(name: &str) -> Error {
    Error::Unsupported {
        message: format!("schedule {name:?}: this store does not implement schedules"),
    }
}

/// How [`CheckpointStore::update_checkpoint`] makes a checkpoint from the
/// one stored (`None`: absent). Called under the store's lock or
/// transaction, so it must be quick and pure.
pub type CheckpointUpdate =
    std::sync::Arc<dyn Fn(Option<&Checkpoint>) -> Result<Checkpoint> + Send + Sync>;

/// The checks every [`CheckpointStore::update_checkpoint`] applies to what
/// its `update` returned: the id asked for, and a checkpoint
/// [`CheckpointStore::write_checkpoint`] would accept.
pub fn checked_update(
    scope: &RunScope,
    id: &CheckpointId,
    update: &CheckpointUpdate,
    existing: Option<&Checkpoint>,
) -> Result<Checkpoint> {
    let next = update(existing)?;
    if next.id != *id {
        return Err(Error::invalid(format!(
            "update_checkpoint of {id} returned checkpoint {}; an update keeps the id",
            next.id
        )));
    }
    next.validate_for_write(scope)?;
    Ok(next)
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

    /// Replaces checkpoint `id` with what `update` makes of the one stored
    /// (`None`: absent), atomically, and returns it as stored: a
    /// read-modify-write that needs no lock of the caller's.
    ///
    /// # Contract
    /// - The read, `update` and the write are one step with respect to every
    ///   other write of the run, across every process sharing the store: of
    ///   two concurrent updates of one checkpoint, the later one sees the
    ///   earlier one's result (none is lost).
    /// - `update` may be called more than once (a store may retry); only
    ///   the write of its last call is kept. Its error is returned and
    ///   nothing changes.
    /// - What `update` returns must carry `id` and is validated like
    ///   [`Self::write_checkpoint`]'s input; a refusal changes nothing.
    /// - Fenced and stamped like [`Self::write_checkpoint`].
    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint>;

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

    /// Takes up to `max` runs as [`claim_next`](Self::claim_next) would,
    /// one after the other, for a worker's local queue: each run is leased
    /// and fenced on its own, exactly as if claimed alone (its own fence,
    /// its own expiry, its key counted with the runs taken before it in
    /// the same batch).
    ///
    /// # Contract
    /// - `max` from 1 to [`crate::batch::MAX_BATCH`], else `InvalidInput`
    ///   and nothing is claimed.
    /// - Answers the runs taken, in the order `claim_next` would have
    ///   handed them out; fewer than `max` (or none) when no more is
    ///   claimable. A run appears at most once.
    /// - An error after some runs were taken answers those runs (they are
    ///   held: work them or release them); an error before any was taken is
    ///   the error.
    ///
    /// The provided body calls `claim_next` `max` times; a database store
    /// claims the batch in one transaction.
    async fn claim_next_batch(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        max: usize,
    ) -> Result<Vec<(RunScope, Lease)>> {
        crate::batch::claim_one_by_one(max, || self.claim_next(scope, filter, options)).await
    }

    /// The store's clock: what every judgement of time uses when a call
    /// passes no instant (`ClaimOptions::now`, `ListOptions::now` `None`).
    /// The memory and directory stores use the machine clock unless given
    /// another; a database store uses the database's.
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    /// The run's lifecycle ([`crate::lifecycle`]); a run without a record
    /// (never enqueued or finished, or written by the reference) is
    /// `Lifecycle::default()` (active).
    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle>;

    /// Creates a runnable run: writes its first checkpoint (unfenced) and its
    /// lifecycle (`available_at`, its own attempt limit).
    ///
    /// # Contract
    /// - Refused with `Conflict` when the run already exists (any checkpoint
    ///   or holding); bad options are `InvalidInput`; a refusal changes
    ///   nothing.
    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint>;

    /// Finishes the run its holder holds at `fence`, ending the lease in the
    /// same change, and returns the lifecycle recorded.
    ///
    /// # Contract
    /// - Fenced like a write: a superseded or released fence is `FencedOut`,
    ///   a never-issued one `InvalidInput`. A finished run is `Conflict`
    ///   whatever the fence (a second finish under the spent fence
    ///   included): the answer says the run is finished, not only lost.
    /// - Afterwards `fence` is spent (writes under it are refused), the run
    ///   is listed with its status and `finished_at` (store clock), and no
    ///   claim takes it (`ClaimOutcome::Finished`).
    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle>;

    /// Releases the run held at `fence` and defers it until `until`: claims
    /// answer `NotBefore` until then. `Ok(false)` and no change when `fence`
    /// is not the run's current holding (like `release`).
    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool>;

    /// Records a failed attempt of the holding at `fence` (its step returned
    /// an error, panicked or timed out) and ends the holding
    /// ([`crate::failure`]). Returns the lifecycle recorded: active and
    /// deferred by the run's backoff (`available_at`), or dead-lettered
    /// (failed, [`crate::lifecycle::ATTEMPTS_EXHAUSTED`]) when this attempt
    /// reaches the limit (`max_attempts` of the report, else the run's own,
    /// else the default).
    ///
    /// # Contract
    /// - Fenced like a finish: a superseded or released fence is
    ///   `FencedOut` (`Cancelled` on a cancelled run), a never-issued one
    ///   `InvalidInput`, a finished run `Conflict`; a bad error is
    ///   `InvalidInput`. A refusal changes nothing.
    /// - Afterwards `fence` is spent, `attempts` is one higher, the error is
    ///   the newest entry of `failures`, and claims answer `NotBefore` until
    ///   the backoff has passed.
    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle>;

    /// Cancels an active run, claimed or not (an operator's act; unfenced):
    /// it is finished as cancelled with `reason`, its holding (if any) ends
    /// with a tombstone, and the holder's next write is refused with
    /// `Cancelled`, its renewal with `ClaimOutcome::Finished(Cancelled)`.
    ///
    /// # Contract
    /// - `NotFound` for a run that does not exist, `Conflict` for a finished
    ///   one, `InvalidInput` for a reason above the limit; a refusal changes
    ///   nothing.
    /// - No claim takes the run until it is reopened.
    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle>;

    /// Makes a finished run active and claimable again (an operator's act;
    /// unfenced). Its next claim gets a fence above every fence ever
    /// issued; attempts restart at 0. `Conflict` for an active run,
    /// `NotFound` for a run that does not exist.
    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle>;

    /// Sets an active run's priority (an operator's act; unfenced) and
    /// returns the lifecycle recorded. Later `claim_next` calls see it; a
    /// holding is not touched ([`crate::scheduling::priority`]).
    ///
    /// # Contract
    /// - `NotFound` for a run that does not exist, `Conflict` for a
    ///   finished one; a refusal changes nothing.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn set_priority(&self, scope: &RunScope, priority: Priority) -> Result<Lifecycle> {
        let _ = priority;
        Err(Error::Unsupported {
            message: format!(
                "set_priority of run {}: this store does not implement priorities",
                scope.run_id
            ),
        })
    }

    /// Enqueues like [`enqueue`](Self::enqueue), unless `dedupe` names a
    /// key whose window is still open: then it returns the run the window
    /// belongs to and changes nothing ([`crate::scheduling::dedupe`]).
    ///
    /// # Contract
    /// - Judged under one lock per key: any number of concurrent calls with
    ///   one key inside one window create exactly one run.
    /// - A run id that exists is `Conflict`, as for `enqueue` (also when it
    ///   is the run the key's window belongs to: the caller asked for a
    ///   specific id; the answer says which run holds the key).
    /// - Bad options or a bad key are `InvalidInput`; a refusal changes
    ///   nothing.
    ///
    /// The provided body enqueues when `dedupe` is `None` and refuses
    /// (`Unsupported`) otherwise; every backend overrides it.
    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
        dedupe: Option<&Dedupe>,
    ) -> Result<Enqueued> {
        if dedupe.is_some() {
            return Err(Error::Unsupported {
                message: format!(
                    "enqueue of run {} with an idempotency key: this store does not implement the dedupe window",
                    scope.run_id
                ),
            });
        }
        let cp = self.enqueue(scope, checkpoint, options).await?;
        Ok(Enqueued {
            run: scope.clone(),
            created: true,
            checkpoint: Some(cp),
        })
    }

    /// Every holding of a run carrying concurrency key `key` in `session`
    /// (a scope naming a session), oldest first
    /// ([`crate::scheduling::concurrency`]): the evidence that the key's
    /// limit held. Holdings of deleted runs are gone with them.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn key_holdings(&self, session: &ListingScope, key: &str) -> Result<Vec<KeyHolding>> {
        let _ = session;
        Err(Error::Unsupported {
            message: format!(
                "key_holdings of key {key:?}: this store does not implement concurrency keys"
            ),
        })
    }

    /// Creates or replaces the schedule named `schedule.name` in `session`
    /// (a scope naming a session) and returns it as stored
    /// ([`crate::scheduling::schedule`]).
    ///
    /// # Contract
    /// - A bad schedule or a scope naming no session is `InvalidInput`; a
    ///   refusal changes nothing.
    /// - A replacement keeps the stored `created_at` and cursor
    ///   ([`crate::scheduling::schedule::on_put`]); a new schedule has no cursor.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn put_schedule(&self, session: &ListingScope, schedule: &Schedule) -> Result<Schedule> {
        let _ = session;
        Err(schedules_unsupported(&schedule.name))
    }

    /// The schedule `name` of `session` (`None`: there is none).
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn get_schedule(&self, session: &ListingScope, name: &str) -> Result<Option<Schedule>> {
        let _ = session;
        Err(schedules_unsupported(name))
    }

    /// Every schedule under `scope` (a tenant, project or session), by
    /// session then name.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn list_schedules(&self, scope: &ListingScope) -> Result<Vec<ScheduleEntry>> {
        let _ = scope;
        Err(schedules_unsupported("*"))
    }

    /// Deletes the schedule `name` of `session`; `Ok(false)` if it was
    /// absent. Its runs stay.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        let _ = session;
        Err(schedules_unsupported(name))
    }

    /// Moves the cursor of schedule `name` from `from` to `to`,
    /// compare-and-set ([`crate::scheduling::schedule::advance`]).
    ///
    /// # Contract
    /// - `Ok(true)` only when the stored cursor was `from`; otherwise
    ///   `Ok(false)` and nothing changes (any number of concurrent advances
    ///   from one cursor: exactly one moves it).
    /// - `to` not after `from` is `InvalidInput`; an absent schedule is
    ///   `NotFound`.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        let _ = (session, from, to);
        Err(schedules_unsupported(name))
    }

    /// Deletes up to `limit` top-level runs under `scope` that the retention
    /// rule finds due at `now` (the store clock when `None`), each with all
    /// its evidence and its sub-runs ([`crate::scheduling::retention`]).
    ///
    /// # Contract
    /// - Each deletion is judged again under the run's lock or transaction:
    ///   a run reopened, claimed or otherwise made not due between the scan
    ///   and the delete is kept. An active, reopened or held run, and one
    ///   with a sub-run that is not due, is never deleted.
    /// - A deleted run answers every read as a run that never existed (no
    ///   checkpoints, events, audit, record, messages, report, holding,
    ///   lifecycle, listing row or key holdings) and can be enqueued again.
    /// - At most `limit` runs are deleted (`0` or above
    ///   [`MAX_PRUNE_BATCH`](crate::scheduling::retention::MAX_PRUNE_BATCH)
    ///   is `InvalidInput`); `more` is set when the call stopped at the
    ///   limit. Memory is bounded by the batch, not the store.
    ///
    /// The provided body refuses (`Unsupported`); every backend overrides it.
    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<PruneReport> {
        let _ = (policy, now, limit);
        Err(Error::Unsupported {
            message: format!(
                "prune_finished under {scope}: this store does not implement retention"
            ),
        })
    }

    /// The ids of the run's checkpoints that `query` admits, greatest first
    /// in byte order, without reading their bodies.
    ///
    /// A contract method a backend answers from its index or key order (a
    /// read whose cost follows the answer, not the run); the provided body
    /// reads every checkpoint and is correct for every backend.
    ///
    /// # Contract
    /// - A bad query ([`CheckpointIdQuery::validate`]) is `InvalidInput`.
    /// - Exactly the ids starting with `prefix` and strictly below `before`,
    ///   in descending byte order, the first `limit` of them; a run without
    ///   checkpoints answers empty.
    /// - No side effects.
    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &CheckpointIdQuery,
    ) -> Result<Vec<CheckpointId>> {
        query.validate()?;
        let all = self.list_checkpoints(scope).await?;
        Ok(query.answer(all.into_iter().map(|c| c.id)))
    }

    /// The latest checkpoint under the total order.
    ///
    /// A contract method (not a convenience) so a backend can answer it from
    /// an index; the provided body reads every checkpoint and is correct for
    /// every backend.
    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        Ok(self.list_checkpoints(scope).await?.pop())
    }

    /// The checkpoint whose park is outstanding at `now` (latest by the
    /// total order), if any. Indexable, like [`Self::latest_checkpoint`].
    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let cps = self.list_checkpoints(scope).await?;
        Ok(park::find_pending(&cps, now).cloned())
    }

    /// The resume point: the pending checkpoint if any, else the latest.
    /// Indexable, like [`Self::latest_checkpoint`].
    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let mut cps = self.list_checkpoints(scope).await?;
        if let Some(p) = park::find_pending(&cps, now) {
            return Ok(Some(p.clone()));
        }
        Ok(cps.pop())
    }

    /// A subscription that wakes when `topic` may have changed (spurious
    /// wake-ups allowed: re-read, then wait again). The provided body polls
    /// every [`DEFAULT_POLL`]; a backend that can notify overrides it.
    fn watch(&self, topic: &WatchTopic) -> Watch {
        let _ = topic;
        Watch::polling(DEFAULT_POLL)
    }
}

/// The run's evidence (and the step, which writes evidence and may hand the
/// worker its next run: hence a checkpoint store too).
#[async_trait]
pub trait EvidenceStore: CheckpointStore {
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

    /// Writes one step of a run ([`crate::step`]): its events, checkpoint,
    /// message snapshot, run record and finish, under one fence check.
    ///
    /// # Contract
    /// - Every part is validated first; invalid input changes nothing.
    /// - A superseded, released or never-issued `fence`, or a finished run,
    ///   is refused and nothing of the step is written.
    /// - All or nothing: a reader never observes part of a step (memory and
    ///   SQL backends). The directory backend documents the one order in
    ///   which a crash can leave a prefix of a step.
    /// - With `finish`, the step's writes and the finish are one commit: the
    ///   lease ends with it.
    async fn commit_step(&self, scope: &RunScope, fence: Fence, step: &Step)
        -> Result<StepReceipt>;

    /// Commits `step` on `scope` under `fence`, then takes the next run as
    /// [`CheckpointStore::claim_next`] would with `next`: a worker's hand-over
    /// from the run it is done with to the next one, in one call.
    ///
    /// # Contract
    /// - The step is judged exactly as by [`commit_step`](Self::commit_step);
    ///   `Err` means it was not committed and nothing was claimed, except
    ///   [`Error::Unavailable`] with
    ///   `outcome_unknown`: then both may have been (read the step's run
    ///   back; a run claimed in a lost answer stays held until its lease
    ///   runs out).
    /// - The claim is judged as `claim_next`'s, at `next.options`' instant,
    ///   against the run states the step left: the step's own run is never
    ///   the next one (a run the step finished is not claimable; one it left
    ///   held is the caller's already).
    /// - A store that commits both in one transaction (PostgreSQL) never
    ///   leaves the step committed without the claim's outcome; the provided
    ///   body commits the step, then claims, and reports a claim that failed
    ///   after the step committed in [`Handover::next`].
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

    /// Commits many runs' steps at once (a group commit), each judged as
    /// [`commit_step`](Self::commit_step) judges it, under its own fence:
    /// answers one outcome per step, in the order given.
    ///
    /// # Contract
    /// - The batch is checked first ([`crate::batch::check_group`]: 1 to
    ///   [`crate::batch::MAX_BATCH`] steps, one per run, each step valid):
    ///   a refused batch is the call's `Err` and nothing is written.
    /// - Each step is all or nothing, as alone. A step refused (a stale
    ///   fence, a finished or cancelled run, another token's holding) is
    ///   that step's `Err`; the others are judged and committed as if it
    ///   were not in the batch.
    /// - [`Error::Unavailable`] with `outcome_unknown` on a step: that step
    ///   may have been committed (read its run back). A store that commits
    ///   the batch in one transaction answers it for every step it could
    ///   not confirm.
    ///
    /// The provided body commits the steps one after the other; a database
    /// store commits them in one transaction (one durable commit for all).
    async fn commit_steps(
        &self,
        steps: &[crate::batch::StepCommit],
    ) -> Result<Vec<Result<StepReceipt>>> {
        crate::batch::commit_one_by_one(steps, |s| self.commit_step(&s.scope, s.fence, &s.step))
            .await
    }
}

/// What [`EvidenceStore::commit_step_and_claim_next`] claims after the step:
/// [`CheckpointStore::claim_next`]'s arguments.
#[derive(Clone, Debug)]
pub struct NextClaim {
    /// Where the next run is looked for.
    pub scope: ListingScope,
    /// Which runs it may be.
    pub filter: ClaimNextFilter,
    /// The claim's holder, duration and instant.
    pub options: ClaimOptions,
}

/// What [`EvidenceStore::commit_step_and_claim_next`] did.
#[derive(Debug)]
pub struct Handover {
    /// The committed step.
    pub receipt: StepReceipt,
    /// The run taken next (`Ok(None)`: none was claimable). `Err` only from
    /// a store that claims after the step committed, when the claim failed:
    /// the step stands, nothing was claimed, and `claim_next` may be retried.
    pub next: Result<Option<(RunScope, Lease)>>,
}

/// A complete store.
pub trait RunStore: CheckpointStore + EvidenceStore {}
impl<T: CheckpointStore + EvidenceStore + ?Sized> RunStore for T {}

/// Conveniences over the contract, for every store.
#[async_trait]
pub trait RunStoreExt: RunStore {
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
