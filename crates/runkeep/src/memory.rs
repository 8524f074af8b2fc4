//! `MemoryStore`: the whole contract in one process, the reference model every
//! other backend is compared with.
//!
//! Values are copied in and out: nothing a caller holds can reach into the
//! store, and nothing the store returns aliases its state. Fences never rewind:
//! a release leaves a tombstone at `fence + 1`, exactly as on disk. It can hold
//! any number of tenants. It keeps nothing across processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::Value;

use crate::checkpoint::{sort_checkpoints, Checkpoint};
use crate::error::{Error, Result};
use crate::evidence::{
    check_document_size, check_json_document, first_sequence_violation, AuditRecord, EventBatch,
    Integrity, MessageSnapshot, NewAuditEvent, NewEvent, PersistedEvent, ReadEventsOptions,
    RunRecord,
};
use crate::failure::{self, AttemptError};
use crate::id::{CheckpointId, RunId};
use crate::lease::{
    check_write, check_write_fence, decide_release, stamp_fence, ClaimOptions, ClaimOutcome, Fence,
    Lease, LeaseSummary, TopHolding,
};
use crate::lifecycle::{self, EnqueueOptions, Lifecycle, Outcome};
use crate::listing::{ListOptions, ListQuery, RunDigest, RunPage, RunRow};
use crate::park::{self, ParkResolution};
use crate::scheduling::concurrency::{self, KeyHolding, KeyLog};
use crate::scheduling::dedupe::{self, Dedupe, DedupeRecord, Enqueued};
use crate::scheduling::retention::{self, PruneReport, RetentionPolicy};
use crate::scheduling::schedule::{self, Schedule, ScheduleEntry};
use crate::scheduling::Priority;
use crate::scope::{ListingScope, RunScope};
use crate::step::{Step, StepReceipt};
use crate::store::{
    checked_update, CheckpointStore, CheckpointUpdate, ClaimNextFilter, EvidenceStore,
};
use crate::time::Timestamp;
use crate::time::{Clock, SystemClock};
use crate::watch::{Notifier, Watch, WatchTopic, DEFAULT_POLL};

#[derive(Debug, Default)]
struct RunState {
    checkpoints: BTreeMap<CheckpointId, Checkpoint>,
    top: Option<TopHolding>,
    events: Vec<PersistedEvent>,
    audit: Vec<AuditRecord>,
    record: Option<RunRecord>,
    messages: Option<MessageSnapshot>,
    report: Option<String>,
    lifecycle: Lifecycle,
}

impl RunState {
    fn check(&self, scope: &RunScope, operation: &'static str, fence: Option<Fence>) -> Result<()> {
        check_write(&scope.run_id, operation, fence, self.top.as_ref())
            .map_err(|e| failure::refine_refusal(e, &self.lifecycle))
    }

    fn row(&self, scope: &RunScope, now: Timestamp) -> Option<RunRow> {
        let headers: Vec<_> = self.checkpoints.values().map(Checkpoint::header).collect();
        RunDigest::from_headers(&headers)
            .row(scope.clone(), self.top.as_ref(), now)
            .map(|r| r.with_lifecycle(&self.lifecycle))
    }

    /// True when nothing was ever stored for the run (an entry a refused
    /// write left): answered like a run that does not exist, as a backend
    /// that creates nothing on a refusal answers.
    fn is_blank(&self) -> bool {
        !self.exists()
            && self.messages.is_none()
            && self.report.is_none()
            && self.audit.is_empty()
            && self.lifecycle == Lifecycle::default()
    }

    /// True when the run has any state at all.
    fn exists(&self) -> bool {
        !self.checkpoints.is_empty()
            || self.top.is_some()
            || !self.events.is_empty()
            || self.record.is_some()
    }

    fn claim(
        &mut self,
        scope: &RunScope,
        options: &ClaimOptions,
        now: Timestamp,
        key_held_by_others: u32,
    ) -> Result<ClaimOutcome> {
        lifecycle::apply_claim(
            &scope.run_id,
            &mut self.top,
            &mut self.lifecycle,
            options,
            now,
            key_held_by_others,
        )
    }

    /// The live lease's fence at `now`, if any.
    fn live_fence(&self, now: Timestamp) -> Option<Fence> {
        match &self.top {
            Some(TopHolding::Lease {
                fence, expires_at, ..
            }) if !crate::lease::is_expired(*expires_at, now) => Some(*fence),
            _ => None,
        }
    }

    /// Appends events under the already-checked fence.
    fn push_events(
        &mut self,
        events: &[NewEvent],
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Vec<PersistedEvent> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            let persisted = e.persist(self.events.len() as u64 + 1, now, fence);
            self.events.push(persisted.clone());
            out.push(persisted);
        }
        out
    }
}

/// A concurrency key or an idempotency key, within its session.
type SessionKey = (String, String);

/// The in-memory reference store.
#[derive(Debug)]
pub struct MemoryStore {
    runs: Mutex<BTreeMap<RunScope, RunState>>,
    /// Each key's holdings history; locked after `runs`, only under it.
    keys: Mutex<BTreeMap<SessionKey, KeyLog>>,
    /// Each idempotency key's window; locked after `runs`, only under it.
    dedupe: Mutex<BTreeMap<SessionKey, DedupeRecord>>,
    /// Each session's schedules, by session then name (its own lock).
    schedules: Mutex<BTreeMap<SessionKey, ScheduleEntry>>,
    clock: Arc<dyn Clock>,
    notifier: Notifier,
}

/// Runs of `key` in `session`, other than `scope`, held live at `now`.
fn key_held_by_others(
    runs: &BTreeMap<RunScope, RunState>,
    scope: &RunScope,
    now: Timestamp,
) -> u32 {
    let Some(key) = runs
        .get(scope)
        .and_then(|r| r.lifecycle.concurrency.as_ref())
        .map(|c| &c.key)
    else {
        return 0;
    };
    let session = scope.session_scope();
    runs.iter()
        .filter(|(s, r)| {
            *s != scope
                && s.session_scope() == session
                && r.lifecycle.concurrency.as_ref().map(|c| &c.key) == Some(key)
                && r.live_fence(now).is_some()
        })
        .count() as u32
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// An empty store on the machine clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store judging time by `clock` (the store's clock of
    /// contract v2: every call that passes no instant uses it).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            runs: Mutex::new(BTreeMap::new()),
            keys: Mutex::new(BTreeMap::new()),
            dedupe: Mutex::new(BTreeMap::new()),
            schedules: Mutex::new(BTreeMap::new()),
            clock,
            notifier: Notifier::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<RunScope, RunState>> {
        // A panic while holding the lock cannot leave a half-applied change:
        // every mutation validates first and then assigns.
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings the key history of `scope` up to its top holding at `now`
    /// (called under the runs lock after every change of a holding): a new
    /// fence starts a holding, and a holding that is no longer the run's
    /// lease ends at `now`.
    fn note_holding(&self, runs: &BTreeMap<RunScope, RunState>, scope: &RunScope, now: Timestamp) {
        let Some(run) = runs.get(scope) else {
            return;
        };
        let Some(c) = &run.lifecycle.concurrency else {
            return;
        };
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let log = keys
            .entry((scope.session_scope().to_string(), c.key.clone()))
            .or_default();
        let parent = scope.parent_run_id.as_ref();
        let open = log
            .entries()
            .iter()
            .rev()
            .find(|h| {
                h.run_id == scope.run_id
                    && h.parent_run_id.as_ref() == parent
                    && h.ended_at.is_none()
            })
            .map(|h| h.fence);
        match &run.top {
            Some(TopHolding::Lease {
                fence, expires_at, ..
            }) => {
                if open != Some(*fence) {
                    log.acquired(&scope.run_id, parent, *fence, now, *expires_at);
                }
            }
            _ => {
                if open.is_some() {
                    log.ended(&scope.run_id, parent, now);
                }
            }
        }
    }

    fn claim_in(
        &self,
        runs: &mut BTreeMap<RunScope, RunState>,
        scope: &RunScope,
        options: &ClaimOptions,
        now: Timestamp,
    ) -> Result<ClaimOutcome> {
        let held = key_held_by_others(runs, scope, now);
        let out = runs
            .entry(scope.clone())
            .or_default()
            .claim(scope, options, now, held)?;
        self.note_holding(runs, scope, now);
        Ok(out)
    }
}

#[async_trait]
impl CheckpointStore for MemoryStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "write_checkpoint", fence)?;
        let mut stored = checkpoint.clone();
        stored.fence = stamp_fence(fence, run.top.as_ref());
        run.checkpoints.insert(stored.id.clone(), stored.clone());
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(stored)
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        Ok(self
            .lock()
            .get(scope)
            .and_then(|r| r.checkpoints.get(id).cloned()))
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        let mut cps: Vec<Checkpoint> = self
            .lock()
            .get(scope)
            .map(|r| r.checkpoints.values().cloned().collect())
            .unwrap_or_default();
        sort_checkpoints(&mut cps);
        Ok(cps)
    }

    async fn checkpoint_ids(
        &self,
        scope: &RunScope,
        query: &crate::CheckpointIdQuery,
    ) -> Result<Vec<CheckpointId>> {
        query.validate()?;
        let runs = self.lock();
        let Some(run) = runs.get(scope) else {
            return Ok(Vec::new());
        };
        // The map is in id order: walk down from `before`, stop at `limit`.
        let upper = match &query.before {
            Some(b) => std::ops::Bound::Excluded(b.clone()),
            None => std::ops::Bound::Unbounded,
        };
        Ok(run
            .checkpoints
            .range((std::ops::Bound::Unbounded, upper))
            .rev()
            .map(|(id, _)| id)
            .skip_while(|id| {
                id.as_str() > query.prefix.as_str() && !id.as_str().starts_with(&query.prefix)
            })
            .take_while(|id| id.as_str().starts_with(&query.prefix))
            .take(query.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect())
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(scope) else {
            if let Some(f) = fence {
                check_write_fence(&scope.run_id, "delete_checkpoint", f, None)?;
            }
            return Ok(false);
        };
        run.check(scope, "delete_checkpoint", fence)?;
        Ok(run.checkpoints.remove(id).is_some())
    }

    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "update_checkpoint", fence)?;
        let mut stored = checked_update(scope, id, &update, run.checkpoints.get(id))?;
        stored.fence = stamp_fence(fence, run.top.as_ref());
        run.checkpoints.insert(id.clone(), stored.clone());
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(stored)
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let mut runs = self.lock();
        let run = runs.get_mut(scope).filter(|r| !r.is_blank());
        let Some(run) = run else {
            return Err(Error::NotFound {
                what: format!("checkpoint {id} of run {}", scope.run_id),
            });
        };
        run.check(scope, "resolve_park", fence)?;
        let Some(current) = run.checkpoints.get(id) else {
            return Err(Error::NotFound {
                what: format!("checkpoint {id} of run {}", scope.run_id),
            });
        };
        let mut updated = current.clone();
        park::resolve(&mut updated, resolution, now)?;
        updated.fence = stamp_fence(fence, run.top.as_ref()).or(current.fence);
        run.checkpoints.insert(id.clone(), updated.clone());
        Ok(updated)
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(scope).filter(|r| !r.is_blank()) else {
            return Ok(Vec::new());
        };
        run.check(scope, "prune_checkpoints", fence)?;
        let cps: Vec<Checkpoint> = run.checkpoints.values().cloned().collect();
        let victims = park::prune_victims(&cps, keep_last);
        for v in &victims {
            run.checkpoints.remove(v);
        }
        Ok(victims)
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        let query = ListQuery::new(scope, &options.judged_at(|| self.clock.now()))?;
        let runs = self.lock();
        let rows: Vec<RunRow> = runs
            .iter()
            .filter(|(s, _)| s.is_within(scope))
            .filter_map(|(s, r)| r.row(s, query.now))
            .collect();
        Ok(query.paginate(rows))
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        // The instant is read under the lock: a change made before this
        // claim (a finish ending a key's holding) is never later than it,
        // so the key history's holdings follow the real order.
        let mut runs = self.lock();
        let now = options.judged_at(|| self.clock.now());
        self.claim_in(&mut runs, scope, options, now)
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(scope) else {
            return Ok(false);
        };
        match decide_release(&scope.run_id, run.top.as_ref(), fence)? {
            Some(tomb) => {
                run.top = Some(TopHolding::Released { fence: tomb });
                self.note_holding(&runs, scope, self.clock.now());
                drop(runs);
                self.notifier.notify_run(scope, false);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        Ok(self
            .lock()
            .get(scope)
            .and_then(|r| r.top.as_ref().map(|t| t.summary(now))))
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        let mut runs = self.lock();
        let now = options.judged_at(|| self.clock.now());
        let query = ListQuery::claim_next(scope, filter, now)?;
        let mut candidates: Vec<_> = runs
            .iter()
            .filter(|(s, _)| s.is_within(scope))
            .filter_map(|(s, r)| r.row(s, now))
            .filter(|row| query.matches(row) && row.is_claimable(now))
            .map(|row| (row.claim_key(filter.order), row.scope))
            .collect();
        candidates.sort();
        for (_, run_scope) in candidates {
            if let ClaimOutcome::Acquired(lease) =
                self.claim_in(&mut runs, &run_scope, options, now)?
            {
                return Ok(Some((run_scope, lease)));
            }
        }
        Ok(None)
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        Ok(self
            .lock()
            .get(scope)
            .map(|r| r.lifecycle.clone())
            .unwrap_or_default())
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        options.validate(&scope.run_id)?;
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        crate::lifecycle::check_enqueue(run.exists(), &scope.run_id)?;
        let mut stored = checkpoint.clone();
        stored.fence = None;
        run.checkpoints.insert(stored.id.clone(), stored.clone());
        run.lifecycle = options.lifecycle();
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(stored)
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        outcome.validate(&scope.run_id)?;
        let now = self.clock.now();
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        let l = lifecycle::apply_finish(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            outcome,
            fence,
            now,
        )?;
        self.note_holding(&runs, scope, now);
        Ok(l)
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(scope) else {
            return Ok(false);
        };
        let snoozed = lifecycle::apply_snooze(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            fence,
            until,
        )?;
        self.note_holding(&runs, scope, self.clock.now());
        drop(runs);
        if snoozed {
            self.notifier.notify_run(scope, false);
        }
        Ok(snoozed)
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle> {
        let now = self.clock.now();
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        let l = failure::apply_failure(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            fence,
            error,
            max_attempts,
            now,
        )?;
        self.note_holding(&runs, scope, now);
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(l)
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
        let now = self.clock.now();
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        let exists = run.exists();
        let l = failure::apply_cancel(
            &scope.run_id,
            exists,
            &mut run.top,
            &mut run.lifecycle,
            reason,
            now,
        );
        if !exists {
            runs.remove(scope);
        }
        self.note_holding(&runs, scope, now);
        drop(runs);
        let l = l?;
        self.notifier.notify_run(scope, false);
        Ok(l)
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(scope).filter(|r| r.exists()) else {
            return Err(Error::NotFound {
                what: format!("run {}", scope.run_id),
            });
        };
        let l = lifecycle::after_reopen(&scope.run_id, &run.lifecycle)?;
        run.lifecycle = l.clone();
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(l)
    }

    async fn set_priority(&self, scope: &RunScope, priority: Priority) -> Result<Lifecycle> {
        priority.validate()?;
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(scope).filter(|r| r.exists()) else {
            return Err(Error::NotFound {
                what: format!("run {}", scope.run_id),
            });
        };
        let l = lifecycle::after_set_priority(&scope.run_id, &run.lifecycle, priority)?;
        run.lifecycle = l.clone();
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(l)
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
        d.validate()?;
        checkpoint.validate_for_write(scope)?;
        options.validate(&scope.run_id)?;
        let now = self.clock.now();
        let mut runs = self.lock();
        let mut windows = self.dedupe.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (scope.session_scope().to_string(), d.key.clone());
        let existing = windows.get(&slot).map(|r| {
            let exists = runs.get(&r.scope_in(scope)).is_some_and(RunState::exists);
            (r, exists)
        });
        if let Some(r) = dedupe::decide(existing, now) {
            let run = r.scope_in(scope);
            let latest = runs.get(&run).and_then(|st| {
                let mut cps: Vec<Checkpoint> = st.checkpoints.values().cloned().collect();
                sort_checkpoints(&mut cps);
                cps.pop()
            });
            return Ok(Enqueued {
                run,
                created: false,
                checkpoint: latest,
            });
        }
        let run = runs.entry(scope.clone()).or_default();
        crate::lifecycle::check_enqueue(run.exists(), &scope.run_id)?;
        let mut stored = checkpoint.clone();
        stored.fence = None;
        run.checkpoints.insert(stored.id.clone(), stored.clone());
        run.lifecycle = options.lifecycle();
        windows.insert(slot, DedupeRecord::new(scope, d, now));
        drop(windows);
        drop(runs);
        self.notifier.notify_run(scope, false);
        Ok(Enqueued {
            run: scope.clone(),
            created: true,
            checkpoint: Some(stored),
        })
    }

    async fn key_holdings(&self, session: &ListingScope, key: &str) -> Result<Vec<KeyHolding>> {
        concurrency::check_key(key)?;
        let session = concurrency::session_of(session)?;
        let _runs = self.lock();
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        Ok(keys
            .get(&(session.to_string(), key.to_string()))
            .map(|l| l.entries().to_vec())
            .unwrap_or_default())
    }

    async fn put_schedule(&self, session: &ListingScope, schedule: &Schedule) -> Result<Schedule> {
        let session = schedule::session_of(session)?;
        let mut all = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (session.to_string(), schedule.name.clone());
        let stored = schedule::on_put(
            all.get(&slot).map(|e| &e.schedule),
            schedule,
            self.clock.now(),
        )?;
        all.insert(
            slot,
            ScheduleEntry {
                session,
                schedule: stored.clone(),
            },
        );
        Ok(stored)
    }

    async fn get_schedule(&self, session: &ListingScope, name: &str) -> Result<Option<Schedule>> {
        let session = schedule::session_of(session)?;
        schedule::check_name(name)?;
        let all = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        Ok(all
            .get(&(session.to_string(), name.to_string()))
            .map(|e| e.schedule.clone()))
    }

    async fn list_schedules(&self, scope: &ListingScope) -> Result<Vec<ScheduleEntry>> {
        let all = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<ScheduleEntry> = all
            .values()
            .filter(|e| schedule::is_under(&e.session, scope))
            .cloned()
            .collect();
        schedule::sort_entries(&mut out);
        Ok(out)
    }

    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        let session = schedule::session_of(session)?;
        schedule::check_name(name)?;
        let mut all = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        Ok(all
            .remove(&(session.to_string(), name.to_string()))
            .is_some())
    }

    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        let session = schedule::session_of(session)?;
        schedule::check_name(name)?;
        let mut all = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        let entry = all
            .get_mut(&(session.to_string(), name.to_string()))
            .ok_or_else(|| schedule::not_found(&session, name))?;
        schedule::advance(&mut entry.schedule, from, to)
    }

    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<PruneReport> {
        retention::check_limit(limit)?;
        let now = now.unwrap_or_else(|| self.clock.now());
        let mut runs = self.lock();
        // Sub-runs by (session, parent): one pass, so judging a parent
        // costs its own sub-runs, not the store.
        let mut children: BTreeMap<(String, RunId), Vec<RunScope>> = BTreeMap::new();
        for s in runs.keys().filter(|s| s.is_within(scope)) {
            if let Some(p) = &s.parent_run_id {
                children
                    .entry((s.session_scope().to_string(), p.clone()))
                    .or_default()
                    .push(s.clone());
            }
        }
        let due = |s: &RunScope, r: &RunState| {
            retention::is_due(&r.lifecycle, r.live_fence(now).is_some(), policy, now)
                && r.exists()
                && s.parent_run_id.is_none()
        };
        let mut report = PruneReport::default();
        let mut victims: Vec<(RunScope, Vec<RunScope>)> = Vec::new();
        for (s, r) in runs.iter() {
            if !s.is_within(scope) || s.parent_run_id.is_some() || !r.lifecycle.status.is_finished()
            {
                continue;
            }
            report.scanned += 1;
            if !due(s, r) {
                continue;
            }
            let subs = children
                .remove(&(s.session_scope().to_string(), s.run_id.clone()))
                .unwrap_or_default();
            let subs_due = subs.iter().all(|c| {
                runs.get(c).is_none_or(|cr| {
                    retention::is_due(&cr.lifecycle, cr.live_fence(now).is_some(), policy, now)
                        || !cr.exists()
                })
            });
            if !subs_due {
                continue;
            }
            if victims.len() == limit {
                report.more = true;
                break;
            }
            victims.push((s.clone(), subs));
        }
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let mut windows = self.dedupe.lock().unwrap_or_else(|p| p.into_inner());
        let mut gone_all = std::collections::BTreeSet::new();
        for (s, subs) in victims {
            for gone in std::iter::once(&s).chain(subs.iter()) {
                if let Some(r) = runs.remove(gone) {
                    if let Some(c) = &r.lifecycle.concurrency {
                        let slot = (gone.session_scope().to_string(), c.key.clone());
                        if let Some(log) = keys.get_mut(&slot) {
                            log.forget(&gone.run_id, gone.parent_run_id.as_ref());
                        }
                    }
                }
                gone_all.insert((
                    gone.session_scope().to_string(),
                    gone.run_id.clone(),
                    gone.parent_run_id.clone(),
                ));
            }
            report.sub_runs_deleted += subs.len() as u64;
            report.deleted.push(s);
        }
        if !gone_all.is_empty() {
            // A dedupe record naming a deleted run goes with it.
            windows.retain(|(session, _), rec| {
                !gone_all.contains(&(
                    session.clone(),
                    rec.run_id.clone(),
                    rec.parent_run_id.clone(),
                ))
            });
        }
        drop(windows);
        drop(keys);
        drop(runs);
        for s in &report.deleted {
            self.notifier.notify_run(s, false);
        }
        Ok(report)
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        // Only this process writes a memory store: every change notifies, so
        // the fallback interval only bounds a missed wake-up.
        self.notifier.subscribe(topic, DEFAULT_POLL * 20)
    }
}

#[async_trait]
impl EvidenceStore for MemoryStore {
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        for e in events {
            e.validate()?;
        }
        let now = self.clock.now();
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "append_events", fence)?;
        let out = run.push_events(events, now, fence);
        drop(runs);
        self.notifier.notify_run(scope, true);
        Ok(out)
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        let runs = self.lock();
        let Some(run) = runs.get(scope) else {
            return Ok(EventBatch::default());
        };
        if options.integrity == Integrity::Strict {
            if let Some((pos, found, expected)) = first_sequence_violation(
                run.events
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (i as u64 + 1, e.seq)),
            ) {
                return Err(Error::corrupted(format!(
                    "transcript of run {}: record {pos} has sequence {found}, expected {expected}",
                    scope.run_id
                )));
            }
        }
        let events: Vec<PersistedEvent> = run
            .events
            .iter()
            .filter(|e| e.seq > options.since_seq)
            .take(options.limit.unwrap_or(usize::MAX))
            .cloned()
            .collect();
        Ok(EventBatch {
            events,
            skipped: Vec::new(),
            last_seq: run.events.last().map_or(0, |e| e.seq),
        })
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        check_json_document("run record", record, record.values())?;
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "write_run_record", fence)?;
        run.record = Some(record.clone());
        Ok(())
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        Ok(self.lock().get(scope).and_then(|r| r.record.clone()))
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        check_json_document("message snapshot", messages, messages)?;
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "write_messages", fence)?;
        run.messages = Some(MessageSnapshot::Available {
            through_event_seq,
            messages: messages.to_vec(),
        });
        Ok(())
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        Ok(self
            .lock()
            .get(scope)
            .and_then(|r| r.messages.clone())
            .unwrap_or(MessageSnapshot::Unavailable))
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        check_document_size("report", report.len())?;
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "write_report", fence)?;
        run.report = Some(report.to_string());
        Ok(())
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        Ok(self.lock().get(scope).and_then(|r| r.report.clone()))
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        for e in events {
            e.validate()?;
        }
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "append_audit", fence)?;
        let now = self.clock.now();
        let mut out = Vec::new();
        for e in events {
            let rec = e.record(
                scope.run_id.as_str(),
                run.audit.len() as u64 + 1,
                now,
                fence,
            );
            run.audit.push(rec.clone());
            out.push(rec);
        }
        Ok(out)
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        Ok(self
            .lock()
            .get(scope)
            .map(|r| {
                r.audit
                    .iter()
                    .filter(|a| a.seq > since_seq)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        step.validate(scope)?;
        let now = self.clock.now();
        let mut runs = self.lock();
        let run = runs.entry(scope.clone()).or_default();
        run.check(scope, "commit_step", Some(fence))?;
        // Everything that can refuse is decided before anything is applied,
        // so a refused step leaves nothing.
        let finished = step.plan_finish(&scope.run_id, &run.lifecycle, fence, now)?;
        let last_before = run.events.last().map_or(0, |e| e.seq);
        let events = run.push_events(&step.events, now, Some(fence));
        let checkpoint = step.checkpoint.as_ref().map(|cp| {
            let mut stored = cp.clone();
            stored.fence = Some(fence);
            run.checkpoints.insert(stored.id.clone(), stored.clone());
            stored
        });
        if let Some(m) = &step.messages {
            run.messages = Some(MessageSnapshot::Available {
                through_event_seq: Step::through_seq(m, &events, last_before),
                messages: m.messages.clone(),
            });
        }
        if let Some(r) = &step.run_record {
            run.record = Some(r.clone());
        }
        if let Some(f) = &finished {
            f.apply(&mut run.top, &mut run.lifecycle);
            self.note_holding(&runs, scope, now);
        }
        drop(runs);
        self.notifier.notify_run(scope, !events.is_empty());
        Ok(StepReceipt {
            events,
            checkpoint,
            lifecycle: finished.map(|f| f.lifecycle),
        })
    }
}
