//! [`RunHandle`]: the one door a run's writes go through.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{watch, Mutex, RwLock};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::error::{LeaseLoss, WorkerError};
use crate::group::GroupCommit;
use crate::handover::{Handed, Handoff, Taken};
use crate::keeper::LeaseKeeper;
use runkeep::checkpoint::Checkpoint;
use runkeep::error::Error;
use runkeep::evidence::{
    completed_tools, AuditRecord, CompletedTool, CompletedTools, EventBatch, NewAuditEvent,
    NewEvent, PersistedEvent, RunRecord,
};
use runkeep::failure::AttemptError;
use runkeep::id::{CheckpointId, Holder};
use runkeep::lease::{Fence, Lease};
use runkeep::lifecycle::{Lifecycle, Outcome};
use runkeep::park::ParkResolution;
use runkeep::scope::RunScope;
use runkeep::step::{Step, StepReceipt};
use runkeep::store::{RunStore, RunStoreExt};
use runkeep::time::{Timestamp, Ttl};

/// Event type of a completed-tool record in the transcript.
pub const TOOL_COMPLETED_EVENT: &str = "tool_completed";

/// The payload field [`RunHandle::commit_step`] adds to every event of a
/// step: the step's id (`<holder>#<first fence of the holding>#<n>`), unique
/// per step. When a commit's outcome is unknown, the handle finds the step's
/// events by it instead of appending them again.
pub const STEP_ID_FIELD: &str = "runkeepStep";

/// The lease a handle currently writes under, as its keeper last set it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HeldLease {
    /// The lease (its fence is the one every write presents).
    pub lease: Lease,
    /// When the claim that minted this fence was sent (monotonic clock).
    pub acquired_at: Instant,
    /// The local deadline: `acquired_at + ttl`. The store cannot have judged
    /// the lease expired before it (on one clock), so writes admitted before
    /// it, minus the safety margin, still hold the run.
    pub deadline: Instant,
    /// How many renewals have landed since the run was claimed.
    pub renewals: u64,
}

/// What a side-effect system needs to refuse a zombie: the run and the fence
/// the effect was issued under. See [`FenceGate`](crate::FenceGate).
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct FenceToken {
    /// The run.
    pub scope: RunScope,
    /// The fence the effect is issued under.
    pub fence: Fence,
}

/// The outcome of [`RunHandle::run_tool`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ToolRun {
    /// The ledger entry (recorded earlier, or just now).
    pub tool: CompletedTool,
    /// True when the result came from the ledger and the tool was not run.
    pub replayed: bool,
}

/// State shared by a run's handles and its lease keeper.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) scope: RunScope,
    pub(crate) holder: Holder,
    pub(crate) ttl: Ttl,
    pub(crate) margin: Duration,
    /// The host's judging clock, when it judges (`KeeperOptions::clock`).
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) state: watch::Sender<HeldLease>,
    /// Writes hold it shared; a renewal holds it exclusively, so no write
    /// can present a fence that this worker's own renewal just superseded.
    pub(crate) gate: RwLock<()>,
    pub(crate) loss: OnceLock<LeaseLoss>,
    /// Cancelled the moment the lease is lost.
    pub(crate) lost: CancellationToken,
    /// Cancelled when the lease is lost or the worker asks the run to stop.
    pub(crate) stopping: CancellationToken,
    /// Cancelled when the holding ends, lost or by this worker's own
    /// finish, snooze or release: the keeper stops renewing.
    pub(crate) ended: CancellationToken,
    /// The completed-tool ledger, read once per holding on first use.
    pub(crate) ledger: Mutex<Option<CompletedTools>>,
    /// The fence the holding started at (part of every step id).
    pub(crate) first_fence: Fence,
    /// Steps committed (or tried) through this holding's handles.
    pub(crate) steps: std::sync::atomic::AtomicU64,
    /// The drain's claim parameters, when a drain holds the run: a
    /// finishing step then hands over to the drain's next run.
    pub(crate) handoff: OnceLock<Arc<Handoff>>,
    /// The drain's committer, when it groups finishing steps
    /// ([`WorkerOptions::commit_batch`](crate::WorkerOptions::commit_batch)).
    pub(crate) group: OnceLock<Arc<GroupCommit>>,
    /// What the holding handed over (see [`crate::handover`]).
    pub(crate) handed: std::sync::Mutex<Handed>,
    /// Notified when a hand-over leaves a run in `handed`.
    pub(crate) handed_run: tokio::sync::Notify,
}

impl Shared {
    /// True when a finishing step may hand over now: a drain holds the run,
    /// it would claim again anyway, and it has not collected this holding.
    pub(crate) fn may_hand_over(&self) -> bool {
        self.handoff.get().is_some_and(|h| h.open())
            && matches!(
                *self.handed.lock().unwrap_or_else(|p| p.into_inner()),
                Handed::Open
            )
    }

    /// Waits until a hand-over has left a run for the drain to collect.
    pub(crate) async fn run_handed_over(&self) {
        loop {
            let arrived = self.handed_run.notified();
            tokio::pin!(arrived);
            // Registered before the look, so a run left in between wakes it.
            arrived.as_mut().enable();
            if matches!(
                *self.handed.lock().unwrap_or_else(|p| p.into_inner()),
                Handed::Run(_)
            ) {
                return;
            }
            arrived.await;
        }
    }

    /// Collects what the holding handed over, and closes it to hand-overs.
    pub(crate) fn collect_handed(&self) -> Handed {
        std::mem::replace(
            &mut *self.handed.lock().unwrap_or_else(|p| p.into_inner()),
            Handed::Closed,
        )
    }

    /// Records the loss (the first reason wins) and cancels the tokens.
    pub(crate) fn lose(&self, loss: LeaseLoss) {
        let released = loss == LeaseLoss::Released;
        if self.loss.set(loss).is_ok() {
            let loss = self.loss.get().map(ToString::to_string).unwrap_or_default();
            if released {
                tracing::debug!(run = %self.scope, "run released; its handles write no more");
            } else {
                tracing::warn!(run = %self.scope, %loss, "lease lost; the run's writes are refused from now on");
            }
        }
        self.lost.cancel();
        self.stopping.cancel();
        self.ended.cancel();
    }

    /// Marks the lease lost when the store refused a write for it: fenced
    /// out (superseded) or cancelled by an operator.
    pub(crate) fn lose_on_refusal(&self, e: &Error) {
        match e {
            Error::FencedOut { current, .. } => self.lose(LeaseLoss::Superseded {
                current: *current,
                holder: None,
            }),
            Error::Cancelled { reason, .. } => self.lose(LeaseLoss::Cancelled {
                reason: reason.clone(),
            }),
            _ => {}
        }
    }

    /// Records that this worker ended the holding itself (finish, snooze):
    /// writes are refused from now on, the keeper stops, but the run's
    /// "lost" token is not cancelled (nothing was lost to anyone).
    pub(crate) fn end(&self, end: LeaseLoss) {
        if self.loss.set(end).is_ok() {
            let end = self.loss.get().map(ToString::to_string).unwrap_or_default();
            tracing::debug!(run = %self.scope, %end, "holding ended; its handles write no more");
        }
        self.stopping.cancel();
        self.ended.cancel();
    }

    fn lost_error(&self, operation: &'static str, fence: Fence, loss: LeaseLoss) -> WorkerError {
        WorkerError::LeaseLost {
            run: self.scope.run_id.to_string(),
            operation,
            fence,
            loss,
        }
    }

    /// The fence to write under, or a refusal: the lease is lost, or its
    /// deadline (minus the safety margin) has passed without a renewal — in
    /// which case the lease is marked lost here, before the write.
    pub(crate) fn admit(&self, operation: &'static str) -> Result<Fence, WorkerError> {
        let (fence, deadline) = {
            let s = self.state.borrow();
            (s.lease.fence, s.deadline)
        };
        if let Some(loss) = self.loss.get() {
            return Err(self.lost_error(operation, fence, loss.clone()));
        }
        if Instant::now() + self.margin >= deadline {
            self.lose(LeaseLoss::Expiring {
                detail: format!(
                    "no renewal landed and less than the safety margin ({} ms) of the lease was left when {operation} was attempted",
                    self.margin.as_millis()
                ),
            });
            let loss = self.loss.get().cloned().unwrap_or(LeaseLoss::Released);
            return Err(self.lost_error(operation, fence, loss));
        }
        Ok(fence)
    }
}

/// The door every write of one held run goes through.
///
/// A handle carries the run's current fence and presents it on every write,
/// so a step cannot forget to fence one. Clones share one fence: when the
/// [`LeaseKeeper`](crate::LeaseKeeper) renews, every clone writes under the
/// new fence from then on. A write racing a renewal waits for it (the
/// renewal excludes writes while it runs), so it presents either the old
/// fence before the renewal or the new one after it — both valid at the time
/// — and never one the worker's own renewal superseded. The exclusion costs
/// little: a renewal is one `claim` call, and while it retries through an
/// outage writes wait (they could not be trusted to land anyway). A write
/// that is still in flight when the safety margin arrives makes the keeper
/// give the lease up, so keep single writes short.
///
/// Before every write the handle checks that the lease is still held: not
/// marked lost by the keeper, not refused as fenced out earlier, and not past
/// its local deadline minus the safety margin. Otherwise the write is refused
/// with [`WorkerError::LeaseLost`] and reaches nothing. A `FencedOut` answer
/// from the store also marks the lease lost, for every clone.
///
/// Reads go straight to the store: [`RunHandle::store`].
#[derive(Clone, Debug)]
pub struct RunHandle {
    pub(crate) shared: Arc<Shared>,
}

impl RunHandle {
    /// The run.
    pub fn scope(&self) -> &RunScope {
        &self.shared.scope
    }

    /// The store, for reads (writes go through the handle).
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.shared.store
    }

    /// The holder this worker claims as.
    pub fn holder(&self) -> &Holder {
        &self.shared.holder
    }

    /// The lease TTL renewals ask for.
    pub fn ttl(&self) -> Ttl {
        self.shared.ttl
    }

    /// The host's own judging clock, when it judges claims itself
    /// (`KeeperOptions::clock`); `None`: the store's clock judges.
    pub fn clock(&self) -> Option<&Arc<dyn Clock>> {
        self.shared.clock.as_ref()
    }

    /// The instant now, on the clock that judges this run's lease: the
    /// host's (when it judges) or the store's
    /// ([`now`](runkeep::CheckpointStore::now)).
    pub fn now(&self) -> Timestamp {
        match &self.shared.clock {
            Some(c) => c.now(),
            None => self.shared.store.now(),
        }
    }

    /// The fence the next write will present (it changes on every renewal).
    pub fn fence(&self) -> Fence {
        self.shared.state.borrow().lease.fence
    }

    /// The run and current fence, to hand to an external side-effect system
    /// (see [`FenceGate`](crate::FenceGate)). Pass it with the effect; never
    /// cache it across awaits you do not control.
    pub fn fence_token(&self) -> FenceToken {
        FenceToken {
            scope: self.shared.scope.clone(),
            fence: self.fence(),
        }
    }

    /// The current lease and its local deadline.
    pub fn held(&self) -> HeldLease {
        self.shared.state.borrow().clone()
    }

    /// Renewals landed since the run was claimed.
    pub fn renewals(&self) -> u64 {
        self.shared.state.borrow().renewals
    }

    /// A receiver that sees every renewal (for hosts that keep the fence in
    /// a place of their own, e.g. an event envelope's `generation`).
    pub fn subscribe(&self) -> watch::Receiver<HeldLease> {
        self.shared.state.subscribe()
    }

    /// A token cancelled the moment the lease is lost (writes are refused
    /// from then on). A child: cancelling it affects nothing else.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// A token cancelled when the lease is lost *or* the worker is shutting
    /// down: finish at the next safe point (writes still work until the lease
    /// is lost or released). A child: cancelling it affects nothing else.
    pub fn stop_token(&self) -> CancellationToken {
        self.shared.stopping.child_token()
    }

    /// Waits until the lease is lost.
    pub async fn lost(&self) {
        self.shared.lost.cancelled().await;
    }

    /// True once the lease is lost (or released by the keeper). A finish or
    /// snooze through this handle is not a loss: see
    /// [`RunHandle::ended_by_handle`].
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<LeaseLoss> {
        self.shared.loss.get().cloned()
    }

    /// Checks the lease is held (as before a write) and returns the token to
    /// pass to an external side effect, or refuses. Call it right before the
    /// effect.
    pub fn ensure_held(&self, operation: &'static str) -> Result<FenceToken, WorkerError> {
        let fence = self.shared.admit(operation)?;
        Ok(FenceToken {
            scope: self.shared.scope.clone(),
            fence,
        })
    }

    /// Runs one store write under the gate with the current fence.
    async fn fenced<T, Fut>(
        &self,
        operation: &'static str,
        write: impl FnOnce(Fence) -> Fut,
    ) -> Result<T, WorkerError>
    where
        Fut: Future<Output = runkeep::Result<T>>,
    {
        self.shared.admit(operation)?;
        let _gate = self.shared.gate.read().await;
        // A renewal may have run (or failed) while we waited.
        let fence = self.shared.admit(operation)?;
        match write(fence).await {
            Ok(v) => Ok(v),
            Err(e) => {
                self.shared.lose_on_refusal(&e);
                Err(e.into())
            }
        }
    }

    /// Runs one store write that ends the holding (finish, snooze, a
    /// finishing step) under the gate held exclusively, so no other write
    /// of this run is in flight when the fence is spent; `end` says how the
    /// holding ended when the write succeeds.
    async fn ending<T, Fut>(
        &self,
        operation: &'static str,
        write: impl FnOnce(Fence) -> Fut,
        end: impl FnOnce(&T) -> Option<LeaseLoss>,
    ) -> Result<T, WorkerError>
    where
        Fut: Future<Output = runkeep::Result<T>>,
    {
        self.shared.admit(operation)?;
        let _gate = self.shared.gate.write().await;
        let fence = self.shared.admit(operation)?;
        match write(fence).await {
            Ok(v) => {
                if let Some(loss) = end(&v) {
                    self.shared.end(loss);
                }
                Ok(v)
            }
            Err(e) => {
                self.shared.lose_on_refusal(&e);
                Err(e.into())
            }
        }
    }

    /// Writes one step of the run under the current fence, atomically
    /// (contract v2, [`EvidenceStore::commit_step`](runkeep::EvidenceStore::commit_step)):
    /// its events, checkpoint (or park), message snapshot, run record and,
    /// for the last step, the finish — one fence check, all or nothing. A
    /// step with `finish` ends the holding: the handle writes no more
    /// ([`LeaseLoss::Finished`]) and the drain neither releases nor
    /// finishes the run again. `tool_completed` events update the ledger.
    ///
    /// # Outcome unknown
    ///
    /// Every event of the step carries the step's id in [`STEP_ID_FIELD`].
    /// When the store answers that the commit's outcome is unknown (its
    /// acknowledgement was lost, [`Error::is_outcome_unknown`]), the handle
    /// never repeats the step blindly. It first fences the attempt off: a
    /// renewal mints a higher fence, and on a store that checks fences under
    /// the run's lock the renewal cannot pass an attempt still in flight,
    /// so after it the attempt has landed or never will. Then it reads back
    /// by the step id (or, for a step without events, the finish's fence,
    /// the checkpoint, the snapshot or the record). Landed: the receipt as
    /// read back. Not landed: `Unavailable` saying so (retryable: repeat
    /// the step). When the attempt cannot be fenced off or read back, the
    /// outcome-unknown error is answered as it came: do not repeat the step.
    ///
    /// # In a drain: the hand-over
    ///
    /// On a run a [`Worker`](crate::Worker) gave out, a step with `finish`
    /// also claims the drain's next run in the same call
    /// ([`EvidenceStore::commit_step_and_claim_next`](runkeep::EvidenceStore::commit_step_and_claim_next))
    /// while the drain would claim again anyway; the drain steps that run
    /// once this step has returned ([`WorkerOptions::handover`](crate::WorkerOptions::handover)).
    /// What this method answers is the step's fate alone: a claim that
    /// failed after the step committed still answers the receipt, and an
    /// unknown outcome is resolved as above. A run claimed in an answer that
    /// was lost is not recovered: it stays held until its lease expires.
    /// Handles from [`LeaseKeeper::claim`] or [`LeaseKeeper::start`] never
    /// hand over.
    pub async fn commit_step(&self, step: &Step) -> Result<StepReceipt, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        let n = self
            .shared
            .steps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let step_id = format!("{}#{}#{n}", self.shared.holder, self.shared.first_fence);
        let mut marked = step.clone();
        for e in &mut marked.events {
            e.payload
                .insert(STEP_ID_FIELD.into(), Value::String(step_id.clone()));
        }
        let step = &marked;
        let used = std::sync::atomic::AtomicU64::new(0);
        let write = |f: Fence| {
            used.store(f.get(), std::sync::atomic::Ordering::Relaxed);
            store.commit_step(scope, f, step)
        };
        let finished = |r: &StepReceipt| {
            Some(LeaseLoss::Finished {
                status: r.lifecycle.as_ref().map(|l| l.status).unwrap_or_default(),
            })
        };
        let handoff = self.shared.handoff.get().cloned();
        let group = self.shared.group.get().cloned();
        let answer = if let (Some(group), Some(_)) = (group, &step.finish) {
            // A drained run's last step, grouped with other runs' (the
            // drain then takes no hand-over: it claims itself).
            let write = |f: Fence| {
                used.store(f.get(), std::sync::atomic::Ordering::Relaxed);
                let group = group.clone();
                async move { group.commit(scope, f, step).await }
            };
            self.ending("commit_step", write, finished).await
        } else if let (Some(handoff), Some(_)) = (handoff, &step.finish) {
            // A drained run's last step: hand over to the drain's next run
            // in the same call, when the drain would claim again anyway.
            let write = |f: Fence| {
                used.store(f.get(), std::sync::atomic::Ordering::Relaxed);
                let next = self.shared.may_hand_over().then(|| handoff.next_claim());
                async move {
                    let sent_at = Instant::now();
                    match next {
                        Some(next) => store
                            .commit_step_and_claim_next(scope, f, step, &next)
                            .await
                            .map(|h| (h.receipt, Some((h.next, sent_at)))),
                        None => store.commit_step(scope, f, step).await.map(|r| (r, None)),
                    }
                }
            };
            match self
                .ending("commit_step", write, |(r, _)| finished(r))
                .await
            {
                Ok((receipt, next)) => {
                    if let Some((next, sent_at)) = next {
                        self.take_handed_over(&handoff, next, sent_at).await;
                    }
                    Ok(receipt)
                }
                Err(e) => Err(e),
            }
        } else if step.finish.is_some() {
            self.ending("commit_step", write, finished).await
        } else {
            self.fenced("commit_step", write).await
        };
        let receipt = match answer {
            Err(WorkerError::Store(e)) if e.is_outcome_unknown() => {
                let fence = Fence::new(used.load(std::sync::atomic::Ordering::Relaxed))
                    .map_err(WorkerError::Store)?;
                self.resolve_unknown(step, &step_id, fence, e).await?
            }
            other => other?,
        };
        self.note_tools(&receipt.events).await;
        Ok(receipt)
    }

    /// Keeps what a hand-over claimed for the drain to collect: the run,
    /// with its keeper started at once, or the claim's error. A run handed
    /// over after the drain collected this holding (a clone of the handle
    /// outliving the step) is released at once instead.
    async fn take_handed_over(
        &self,
        handoff: &Handoff,
        next: runkeep::Result<Option<(RunScope, Lease)>>,
        sent_at: Instant,
    ) {
        let from = &self.shared.scope;
        let handed = match next {
            Ok(None) => {
                tracing::debug!(run = %from, "hand-over: no run to take next");
                return;
            }
            Ok(Some((scope, lease))) => {
                tracing::debug!(run = %from, next = %scope, fence = %lease.fence, "hand-over: the next run taken with the finishing step");
                let keeper = match LeaseKeeper::start_at(
                    self.shared.store.clone(),
                    scope.clone(),
                    lease.clone(),
                    handoff.ttl,
                    handoff.keeper.clone(),
                    sent_at,
                ) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        tracing::error!(run = %scope, error = %e, "hand-over: could not keep the lease of the next run");
                        None
                    }
                };
                Handed::Run(Taken {
                    scope,
                    lease,
                    sent_at,
                    keeper,
                })
            }
            Err(e) => {
                tracing::debug!(run = %from, error = %e, "hand-over: the step committed, but claiming the next run failed; the drain claims again itself");
                Handed::Failed(e)
            }
        };
        let refused = {
            let mut slot = self.shared.handed.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*slot, Handed::Open) {
                *slot = handed;
                self.shared.handed_run.notify_waiters();
                None
            } else {
                Some(handed)
            }
        };
        if let Some(Handed::Run(t)) = refused {
            tracing::warn!(run = %t.scope, "hand-over: the drain no longer collects this holding; releasing the run taken");
            let released = match t.keeper {
                Some(k) => k.release().await,
                None => self.shared.store.release(&t.scope, t.lease.fence).await,
            };
            if let Err(e) = released {
                tracing::warn!(run = %t.scope, error = %e, "hand-over: releasing the run taken failed; it stays held until its lease expires");
            }
        }
    }

    /// Fences off an attempt whose outcome is unknown, then reads back
    /// whether it landed (see [`RunHandle::commit_step`]).
    async fn resolve_unknown(
        &self,
        step: &Step,
        step_id: &str,
        fence: Fence,
        unknown: Error,
    ) -> Result<StepReceipt, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        tracing::warn!(run = %scope, %fence, step_id, error = %unknown, "step commit outcome unknown; fencing the attempt off and reading back");
        // 1. Fence the attempt off with a renewal (writes excluded).
        let fenced_off = {
            let _gate = self.shared.gate.write().await;
            let mut delay = runkeep::backoff::Doubling::uncapped(Duration::from_millis(50));
            loop {
                let deadline = self.shared.state.borrow().deadline;
                if Instant::now() + self.shared.margin >= deadline {
                    break false;
                }
                let sent_at = Instant::now();
                let options = crate::keeper::claim_options(
                    self.shared.holder.clone(),
                    self.shared.ttl,
                    self.shared.clock.as_ref(),
                );
                match store.claim(scope, &options).await {
                    Ok(runkeep::ClaimOutcome::Acquired(lease)) if lease.fence > fence => {
                        self.shared.state.send_modify(|s| {
                            s.lease = lease;
                            s.acquired_at = sent_at;
                            s.deadline = sent_at + self.shared.ttl.as_duration();
                            s.renewals += 1;
                        });
                        break true;
                    }
                    Ok(runkeep::ClaimOutcome::Held(summary)) => {
                        // Someone else holds it: our fence is superseded too.
                        self.shared.lose(LeaseLoss::Superseded {
                            current: summary.fence,
                            holder: Some(summary.holder),
                        });
                        break true;
                    }
                    // Finished (by this step's finish, or by an operator):
                    // the fence is spent, nothing more lands under it.
                    Ok(runkeep::ClaimOutcome::Finished(_)) => break true,
                    Ok(_) => break false,
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(delay.next_delay()).await;
                    }
                    Err(_) => break false,
                }
            }
        };
        if !fenced_off {
            return Err(WorkerError::Store(unknown));
        }
        // 2. Read back.
        let landed = match self.read_back(step, step_id, fence).await {
            Ok(r) => r,
            Err(_) => return Err(WorkerError::Store(unknown)),
        };
        match landed {
            Some(receipt) => {
                tracing::info!(run = %scope, %fence, step_id, "the step had landed; not repeated");
                if let Some(l) = &receipt.lifecycle {
                    self.shared.end(LeaseLoss::Finished { status: l.status });
                }
                Ok(receipt)
            }
            None => Err(WorkerError::Store(Error::Unavailable {
                message: format!(
                    "commit_step on run {}: the acknowledgement of the commit under fence {fence} was lost; after fencing the attempt off, the read-back shows the step was not stored: repeat it",
                    scope.run_id
                ),
                source: Some(Box::new(unknown)),
                outcome_unknown: false,
            })),
        }
    }

    /// The step as stored, when it landed under `fence`; `None` when not.
    async fn read_back(
        &self,
        step: &Step,
        step_id: &str,
        fence: Fence,
    ) -> runkeep::Result<Option<StepReceipt>> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        let landed = if !step.events.is_empty() {
            let batch = store
                .read_events(scope, &runkeep::ReadEventsOptions::default())
                .await?;
            let events: Vec<PersistedEvent> = batch
                .events
                .into_iter()
                .filter(|e| e.payload.get(STEP_ID_FIELD).and_then(Value::as_str) == Some(step_id))
                .collect();
            if events.is_empty() {
                return Ok(None);
            }
            events
        } else {
            let there = if step.finish.is_some() {
                store.lifecycle(scope).await?.finished_fence == Some(fence)
            } else if let Some(cp) = &step.checkpoint {
                store
                    .read_checkpoint(scope, &cp.id)
                    .await?
                    .is_some_and(|c| c.fence == Some(fence) && c.state == cp.state)
            } else if let Some(m) = &step.messages {
                matches!(store.read_messages(scope).await?,
                    runkeep::MessageSnapshot::Available { messages, .. } if messages == m.messages)
            } else if let Some(r) = &step.run_record {
                store.read_run_record(scope).await?.as_ref() == Some(r)
            } else {
                false
            };
            if !there {
                return Ok(None);
            }
            Vec::new()
        };
        // The step is atomic: one part there means all of it is.
        let checkpoint = match &step.checkpoint {
            Some(cp) => store.read_checkpoint(scope, &cp.id).await?,
            None => None,
        };
        let lifecycle = match &step.finish {
            Some(_) => Some(store.lifecycle(scope).await?),
            None => None,
        };
        Ok(Some(StepReceipt {
            events: landed,
            checkpoint,
            lifecycle,
        }))
    }

    /// Finishes the run under the current fence (contract v2,
    /// [`CheckpointStore::finish`](runkeep::CheckpointStore::finish)): the
    /// lease ends with it, the handle writes no more, and no claim takes the
    /// run again. To make the last step and the finish one commit, use
    /// [`RunHandle::commit_step`] with `finish` instead.
    pub async fn finish(&self, outcome: &Outcome) -> Result<Lifecycle, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.ending(
            "finish",
            |f| store.finish(scope, f, outcome),
            |l: &Lifecycle| Some(LeaseLoss::Finished { status: l.status }),
        )
        .await
    }

    /// Gives the run back, not claimable before `until` (contract v2,
    /// [`CheckpointStore::snooze`](runkeep::CheckpointStore::snooze)): retry
    /// with backoff without a sleeping worker. `Ok(false)` when the fence was
    /// no longer the run's holding (nothing changed; the lease is then
    /// marked lost). The handle writes no more either way.
    pub async fn snooze(&self, until: Timestamp) -> Result<bool, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        let fence = self.fence();
        let snoozed = self
            .ending(
                "snooze",
                |f| store.snooze(scope, f, until),
                |ok: &bool| ok.then_some(LeaseLoss::Snoozed { until }),
            )
            .await?;
        if !snoozed {
            self.shared.lose(LeaseLoss::Superseded {
                current: fence,
                holder: None,
            });
        }
        Ok(snoozed)
    }

    /// Reports that this attempt failed (contract v2, `runkeep::failure`):
    /// the store counts it, keeps `error`, ends the holding and defers the
    /// run by its backoff, or dead-letters it at the limit (`max_attempts`:
    /// this report's limit over the run's own). Answers the lifecycle
    /// recorded. The drain calls it for a step that returned an error,
    /// panicked or timed out; a host stepping runs itself calls it the same
    /// way.
    pub async fn fail_attempt(
        &self,
        error: &AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.ending(
            "fail_attempt",
            |f| store.fail_attempt(scope, f, error, max_attempts),
            |l: &Lifecycle| {
                Some(LeaseLoss::AttemptFailed {
                    attempts: l.attempts,
                    dead_lettered: l.is_dead_lettered(),
                })
            },
        )
        .await
    }

    /// How this worker ended the holding itself (finish or snooze through
    /// the handle), if it did.
    pub fn ended_by_handle(&self) -> Option<LeaseLoss> {
        self.shared
            .loss
            .get()
            .filter(|l| {
                matches!(
                    l,
                    LeaseLoss::Finished { .. }
                        | LeaseLoss::Snoozed { .. }
                        | LeaseLoss::AttemptFailed { .. }
                )
            })
            .cloned()
    }

    async fn note_tools(&self, recorded: &[PersistedEvent]) {
        if recorded
            .iter()
            .any(|e| e.event_type == TOOL_COMPLETED_EVENT)
        {
            let mut ledger = self.shared.ledger.lock().await;
            if let Some(ledger) = ledger.as_mut() {
                let batch = EventBatch {
                    events: recorded.to_vec(),
                    ..EventBatch::default()
                };
                ledger.tools.extend(completed_tools(&batch).tools);
            }
        }
    }

    /// Writes a checkpoint under the current fence.
    pub async fn write_checkpoint(
        &self,
        checkpoint: &Checkpoint,
    ) -> Result<Checkpoint, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("write_checkpoint", |f| {
            store.write_checkpoint(scope, checkpoint, Some(f))
        })
        .await
    }

    /// Deletes a checkpoint under the current fence.
    pub async fn delete_checkpoint(&self, id: &CheckpointId) -> Result<bool, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("delete_checkpoint", |f| {
            store.delete_checkpoint(scope, id, Some(f))
        })
        .await
    }

    /// Answers a park under the current fence.
    pub async fn resolve_park(
        &self,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
    ) -> Result<Checkpoint, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("resolve_park", |f| {
            store.resolve_park(scope, id, resolution, now, Some(f))
        })
        .await
    }

    /// Prunes checkpoints under the current fence.
    pub async fn prune_checkpoints(
        &self,
        keep_last: usize,
    ) -> Result<Vec<CheckpointId>, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("prune_checkpoints", |f| {
            store.prune_checkpoints(scope, keep_last, Some(f))
        })
        .await
    }

    /// Appends events under the current fence (their `generation` is that
    /// fence). `tool_completed` events also update the handle's ledger.
    pub async fn append_events(
        &self,
        events: &[NewEvent],
    ) -> Result<Vec<PersistedEvent>, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        let recorded = self
            .fenced("append_events", |f| {
                store.append_events(scope, events, Some(f))
            })
            .await?;
        self.note_tools(&recorded).await;
        Ok(recorded)
    }

    /// Appends one event under the current fence.
    pub async fn append_event(&self, event: NewEvent) -> Result<PersistedEvent, WorkerError> {
        let mut recorded = self.append_events(std::slice::from_ref(&event)).await?;
        recorded.pop().ok_or_else(|| {
            WorkerError::Store(Error::Backend {
                message: format!(
                    "append_events on run {} answered no record for one event",
                    self.shared.scope.run_id
                ),
                source: None,
            })
        })
    }

    /// Replaces the run record under the current fence.
    pub async fn write_run_record(&self, record: &RunRecord) -> Result<(), WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("write_run_record", |f| {
            store.write_run_record(scope, record, Some(f))
        })
        .await
    }

    /// Publishes the message history under the current fence.
    pub async fn write_messages(
        &self,
        messages: &[Value],
        through_event_seq: u64,
    ) -> Result<(), WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("write_messages", |f| {
            store.write_messages(scope, messages, through_event_seq, Some(f))
        })
        .await
    }

    /// Stores the final report under the current fence.
    pub async fn write_report(&self, report: &str) -> Result<(), WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("write_report", |f| {
            store.write_report(scope, report, Some(f))
        })
        .await
    }

    /// Appends to the audit trail under the current fence.
    pub async fn append_audit(
        &self,
        events: &[NewAuditEvent],
    ) -> Result<Vec<AuditRecord>, WorkerError> {
        let (store, scope) = (&self.shared.store, &self.shared.scope);
        self.fenced("append_audit", |f| {
            store.append_audit(scope, events, Some(f))
        })
        .await
    }

    /// The completed-tool ledger as this holding knows it: read from the
    /// transcript on first use, then kept up to date with what this handle
    /// appends (nobody else can append while the run is held).
    pub async fn completed_tools(&self) -> Result<CompletedTools, WorkerError> {
        let mut ledger = self.shared.ledger.lock().await;
        if ledger.is_none() {
            *ledger = Some(
                self.shared
                    .store
                    .completed_tools(&self.shared.scope)
                    .await?,
            );
        }
        Ok(ledger.clone().unwrap_or_default())
    }

    async fn ledger_entry(
        &self,
        tool_use_id: &str,
    ) -> Result<(Option<CompletedTool>, bool), WorkerError> {
        let mut ledger = self.shared.ledger.lock().await;
        if ledger.is_none() {
            *ledger = Some(
                self.shared
                    .store
                    .completed_tools(&self.shared.scope)
                    .await?,
            );
        }
        let ledger = ledger
            .as_ref()
            .map(|l| (l.tools.get(tool_use_id).cloned(), l.complete));
        Ok(ledger.unwrap_or((None, true)))
    }

    /// Runs a tool at most once per recorded completion.
    ///
    /// - If the ledger has an entry for `tool_use_id`, its recorded result is
    ///   returned and `tool` is **not** called (`replayed: true`).
    /// - If the ledger is incomplete (damaged transcript records) and has no
    ///   entry, the call is refused with [`WorkerError::LedgerIncomplete`]:
    ///   an absent entry is then no proof the tool never ran.
    /// - Otherwise the lease is checked, `tool` is called with the current
    ///   [`FenceToken`] (pass it to the effect), and its answer is appended
    ///   as a `tool_completed` event `{toolUseId, toolName, result, isError}`
    ///   through the fenced handle: `Ok(text)` records `isError: false`,
    ///   `Err(text)` records `isError: true` (a failed tool call is still an
    ///   answered one).
    ///
    /// A crash (or a lost lease) between the effect and its record leaves
    /// the tool unrecorded, so a resume runs it again: this is the
    /// at-least-once window, which the effect's own fence check (not the
    /// ledger) must make harmless. Run one `run_tool` per `tool_use_id` at a
    /// time.
    pub async fn run_tool<F, Fut>(
        &self,
        tool_use_id: &str,
        tool_name: &str,
        tool: F,
    ) -> Result<ToolRun, WorkerError>
    where
        F: FnOnce(FenceToken) -> Fut,
        Fut: Future<Output = Result<String, String>>,
    {
        if tool_use_id.is_empty() || tool_name.is_empty() {
            return Err(
                Error::invalid("run_tool needs a non-empty tool use id and tool name").into(),
            );
        }
        self.shared.admit("run_tool")?;
        let (entry, complete) = self.ledger_entry(tool_use_id).await?;
        if let Some(tool) = entry {
            return Ok(ToolRun {
                tool,
                replayed: true,
            });
        }
        if !complete {
            return Err(WorkerError::LedgerIncomplete {
                run: self.shared.scope.run_id.to_string(),
                tool_use_id: tool_use_id.to_string(),
            });
        }
        let token = self.ensure_held("run_tool")?;
        let (result, is_error) = match tool(token).await {
            Ok(text) => (text, false),
            Err(text) => (text, true),
        };
        let mut payload = Map::new();
        payload.insert("toolUseId".into(), Value::String(tool_use_id.to_string()));
        payload.insert("toolName".into(), Value::String(tool_name.to_string()));
        payload.insert("result".into(), Value::String(result.clone()));
        payload.insert("isError".into(), Value::Bool(is_error));
        self.append_event(NewEvent::new(TOOL_COMPLETED_EVENT, payload))
            .await?;
        Ok(ToolRun {
            tool: CompletedTool {
                tool_use_id: tool_use_id.to_string(),
                tool_name: tool_name.to_string(),
                result,
                is_error,
            },
            replayed: false,
        })
    }
}
