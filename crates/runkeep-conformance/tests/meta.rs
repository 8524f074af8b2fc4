//! Meta-tests: the kit must be able to fail. Stores broken on purpose must
//! fail the cases named for them, and the reference model must fail none.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::evidence::{AuditRecord, NewAuditEvent, NewEvent, PersistedEvent, RunRecord};
use runkeep::{
    CheckpointId, CheckpointStore, CheckpointUpdate, ClaimNextFilter, ClaimOptions, ClaimOutcome,
    Error, EvidenceStore, Fence, Lease, LeaseSummary, ListOptions, ListingScope, ManualClock,
    MemoryStore, ParkResolution, Result, RunPage, RunRow, RunScope, RunStatus, RunStore, TenantId,
    Timestamp,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_conformance::{all_cases, differential, outcome_of, support, CaseEnv, Fixture};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// Grants every claim, always at fence 1.
    GrantsEveryClaimAtFenceOne,
    /// Mints fences correctly but writes ignore the presented fence.
    IgnoresFenceOnWrite,
    /// Deletes the claim on release and counts from the live claim, so the
    /// next holder is issued a fence that was issued before.
    RewindsFenceAfterRelease,
    /// Answers every listing as if it were for the conformance tenant.
    IgnoresListingScope,
    /// Answers each listing page in reverse order.
    ReversesEachPage,
    /// Starts every page after the first with the row its cursor names
    /// (the previous page's last row) again.
    RepeatsTheCursorRow,
    /// A second answer to a park overwrites the first (no compare-and-set).
    AnswersAParkTwice,
    /// An append after the first answers its first event with the previous
    /// batch's last seq.
    ReusesASeq,
    /// `claim_next` reopens finished runs and hands them out.
    HandsOutFinishedRuns,
    /// A finish does not spend the fence: writes under it are accepted.
    KeepsTheFenceAfterFinish,
    /// A refused step's events are appended anyway.
    AppliesTheEventsOfARefusedStep,
    /// `snooze` only releases: the run is not deferred.
    IgnoresAvailableAt,
    /// A claim that passes no instant is judged on the machine clock, not
    /// the store's.
    JudgesClaimsOnTheMachineClock,
    /// `latest_checkpoint` answers the newest by `created_at` (an index on
    /// the wrong column).
    IndexesLatestByClock,
    /// `fail_attempt` only releases the run: nothing is counted, kept or
    /// deferred.
    OnlyReleasesAFailedAttempt,
    /// A holder's write refused on a cancelled run answers `FencedOut`, as
    /// if another worker had taken over.
    HidesTheCancel,
    /// `release` answers `true` and changes nothing: the holder's next
    /// claim is a renewal of the fence it gave up.
    ReleaseKeepsTheHolding,
    /// `enqueue` drops the run's deadline and attempt timeout.
    ForgetsTheTimeouts,
    /// `checkpoint_ids` ignores `before` (an index walked from the top).
    IdsIgnoreBefore,
    /// `advance_schedule` ignores the cursor the caller read: every
    /// advance wins (no compare-and-set).
    AdvancesFromAnyCursor,
    /// `update_checkpoint` reads, then writes the update's result with no
    /// lock held between: the first reader waits (bounded) for a second
    /// reader, so concurrent updates start from the same old checkpoint.
    UpdatesWithoutALock,
    /// `claim_next_batch` takes one run more than asked (and takes one
    /// when asked for none).
    OverfillsABatch,
    /// `commit_steps` answers the first refused step as the whole call's
    /// error: the caller cannot tell which steps committed.
    FailsAGroupCommitTogether,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryStore,
    flaw: Flaw,
    live: Mutex<HashMap<RunScope, Lease>>,
    /// RepeatsTheCursorRow: the last row of the page each cursor ended.
    cursor_rows: Mutex<HashMap<String, RunRow>>,
    /// KeepsTheFenceAfterFinish: the fence each run was finished under.
    spent: Mutex<HashMap<RunScope, Fence>>,
    /// UpdatesWithoutALock: how many updates have read, and a wake-up
    /// for the reader waiting on a second.
    readers: tokio::sync::watch::Sender<usize>,
}

impl Broken {
    /// A factory of broken stores on the case's store clock.
    fn on(flaw: Flaw) -> impl Fn(ManualClock) -> Arc<dyn RunStore> {
        move |clock| {
            Arc::new(Intercepted(Self {
                inner: MemoryStore::with_clock(Arc::new(clock)),
                flaw,
                live: Mutex::default(),
                cursor_rows: Mutex::default(),
                spent: Mutex::default(),
                readers: tokio::sync::watch::Sender::new(0),
            }))
        }
    }

    fn naive_check(&self, scope: &RunScope, fence: Option<Fence>) -> Result<()> {
        if let (Some(f), Some(l)) = (fence, self.live.lock().unwrap().get(scope)) {
            if f < l.fence {
                return Err(Error::FencedOut {
                    run: scope.run_id.to_string(),
                    operation: "write",
                    presented: f,
                    current: l.fence,
                });
            }
        }
        Ok(())
    }

    /// HidesTheCancel: a `Cancelled` refusal answered as a plain fence
    /// refusal.
    fn hide_cancel<T>(&self, r: Result<T>) -> Result<T> {
        match r {
            Err(Error::Cancelled { run, operation, .. }) if self.flaw == Flaw::HidesTheCancel => {
                Err(Error::FencedOut {
                    run,
                    operation,
                    presented: Fence::FIRST,
                    current: Fence::FIRST,
                })
            }
            other => other,
        }
    }

    /// What fence to hand the inner store for an evidence write.
    fn pass(&self, scope: &RunScope, fence: Option<Fence>) -> Result<Option<Fence>> {
        match self.flaw {
            Flaw::IgnoresFenceOnWrite | Flaw::GrantsEveryClaimAtFenceOne => Ok(None),
            Flaw::RewindsFenceAfterRelease => self.naive_check(scope, fence).map(|_| None),
            Flaw::KeepsTheFenceAfterFinish
                if fence.is_some() && self.spent.lock().unwrap().get(scope) == fence.as_ref() =>
            {
                Ok(None)
            }
            _ => Ok(fence),
        }
    }
}

#[async_trait]
impl Intercept for Broken {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        cp: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let f = self.pass(scope, fence)?;
        let written = self.inner.write_checkpoint(scope, cp, f).await;
        self.hide_cancel(written)
    }
    async fn update_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        update: CheckpointUpdate,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        if self.flaw != Flaw::UpdatesWithoutALock {
            return self.inner.update_checkpoint(scope, id, update, fence).await;
        }
        let old = self.inner.read_checkpoint(scope, id).await?;
        self.readers.send_modify(|n| *n += 1);
        let mut seen = self.readers.subscribe();
        // Waiting only widens the window; a lone update goes on after it.
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(500),
            seen.wait_for(|n| *n >= 2),
        )
        .await;
        let next = runkeep::checked_update(scope, id, &update, old.as_ref())?;
        self.inner.write_checkpoint(scope, &next, fence).await
    }
    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        let f = self.pass(scope, fence)?;
        self.inner.delete_checkpoint(scope, id, f).await
    }
    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        r: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let f = self.pass(scope, fence)?;
        match self.inner.resolve_park(scope, id, r.clone(), now, f).await {
            Err(Error::Conflict { .. }) if self.flaw == Flaw::AnswersAParkTwice => {
                // No compare-and-set: clear the first answer and answer again.
                let mut cp = self
                    .inner
                    .read_checkpoint(scope, id)
                    .await?
                    .expect("a conflicting park exists");
                if let Some(p) = cp.pending.as_mut() {
                    p.resolved_at = None;
                    p.decision = None;
                }
                self.inner.write_checkpoint(scope, &cp, None).await?;
                self.inner.resolve_park(scope, id, r, now, f).await
            }
            other => other,
        }
    }
    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let f = self.pass(scope, fence)?;
        self.inner.prune_checkpoints(scope, keep, f).await
    }
    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        match self.flaw {
            Flaw::IgnoresListingScope => {
                let everything = ListingScope::tenant(TenantId::new("tnt_conformance").unwrap());
                self.inner.list_runs(&everything, options).await
            }
            Flaw::ReversesEachPage => {
                let mut page = self.inner.list_runs(scope, options).await?;
                page.entries.reverse();
                Ok(page)
            }
            Flaw::RepeatsTheCursorRow => {
                let mut page = self.inner.list_runs(scope, options).await?;
                let mut rows = self.cursor_rows.lock().unwrap();
                if let (Some(c), Some(last)) = (&page.cursor, page.entries.last()) {
                    rows.insert(c.clone(), last.clone());
                }
                if let Some(repeat) = options.cursor.as_ref().and_then(|c| rows.get(c)) {
                    page.entries.insert(0, repeat.clone());
                }
                Ok(page)
            }
            _ => self.inner.list_runs(scope, options).await,
        }
    }
    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        match self.flaw {
            Flaw::JudgesClaimsOnTheMachineClock if options.now.is_none() => {
                self.inner
                    .claim(scope, &options.clone().at(Timestamp::now()))
                    .await
            }
            Flaw::GrantsEveryClaimAtFenceOne => {
                let _ = self.inner.claim(scope, options).await?;
                Ok(ClaimOutcome::Acquired(Lease {
                    holder: options.holder.clone(),
                    fence: Fence::FIRST,
                    expires_at: options.now().plus(options.ttl),
                    attempt_timeout_ms: None,
                }))
            }
            Flaw::RewindsFenceAfterRelease => {
                let now = options.now();
                let mut live = self.live.lock().unwrap();
                if let Some(l) = live.get(scope) {
                    if l.holder != options.holder && now < l.expires_at {
                        return Ok(ClaimOutcome::Held(LeaseSummary {
                            holder: l.holder.to_string(),
                            fence: l.fence,
                            expires_at: l.expires_at,
                            expired: false,
                        }));
                    }
                }
                let next = live.get(scope).map_or(1, |l| l.fence.get() + 1);
                let lease = Lease {
                    holder: options.holder.clone(),
                    fence: Fence::new(next)?,
                    expires_at: now.plus(options.ttl),
                    attempt_timeout_ms: None,
                };
                live.insert(scope.clone(), lease.clone());
                Ok(ClaimOutcome::Acquired(lease))
            }
            _ => self.inner.claim(scope, options).await,
        }
    }
    async fn enqueue(
        &self,
        scope: &RunScope,
        cp: &Checkpoint,
        options: &runkeep::EnqueueOptions,
    ) -> Result<Checkpoint> {
        let mut options = options.clone();
        if self.flaw == Flaw::ForgetsTheTimeouts {
            options.deadline = None;
            options.attempt_timeout = None;
        }
        self.inner.enqueue(scope, cp, &options).await
    }
    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &runkeep::AttemptError,
        limit: Option<u32>,
    ) -> Result<runkeep::Lifecycle> {
        if self.flaw == Flaw::OnlyReleasesAFailedAttempt {
            self.inner.release(scope, fence).await?;
            return self.inner.lifecycle(scope).await;
        }
        self.inner.fail_attempt(scope, fence, error, limit).await
    }
    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        if self.flaw == Flaw::ReleaseKeepsTheHolding {
            return Ok(true);
        }
        if self.flaw == Flaw::RewindsFenceAfterRelease {
            let mut live = self.live.lock().unwrap();
            if live.get(scope).is_some_and(|l| l.fence == fence) {
                live.remove(scope);
                return Ok(true);
            }
            return Ok(false);
        }
        self.inner.release(scope, fence).await
    }
    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        if self.flaw == Flaw::RewindsFenceAfterRelease {
            return Ok(self.live.lock().unwrap().get(scope).map(|l| LeaseSummary {
                holder: l.holder.to_string(),
                fence: l.fence,
                expires_at: l.expires_at,
                expired: now >= l.expires_at,
            }));
        }
        self.inner.lease(scope, now).await
    }
    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        if self.flaw == Flaw::HandsOutFinishedRuns {
            let every = ListOptions {
                status: Some(vec![
                    RunStatus::Completed,
                    RunStatus::Failed,
                    RunStatus::Cancelled,
                ]),
                ..Default::default()
            };
            for row in self.inner.list_runs(scope, &every).await?.entries {
                self.inner.reopen(&row.scope).await?;
            }
        }
        self.inner.claim_next(scope, filter, options).await
    }
    async fn claim_next_batch(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        max: usize,
    ) -> Result<Vec<(RunScope, Lease)>> {
        let max = if self.flaw == Flaw::OverfillsABatch {
            max + 1
        } else {
            max
        };
        self.inner
            .claim_next_batch(scope, filter, options, max)
            .await
    }
    async fn finish(
        &self,
        s: &RunScope,
        fence: Fence,
        o: &runkeep::Outcome,
    ) -> runkeep::Result<runkeep::Lifecycle> {
        let l = self.inner.finish(s, fence, o).await?;
        self.spent.lock().unwrap().insert(s.clone(), fence);
        Ok(l)
    }
    async fn snooze(&self, s: &RunScope, fence: Fence, until: Timestamp) -> runkeep::Result<bool> {
        if self.flaw == Flaw::IgnoresAvailableAt {
            return self.inner.release(s, fence).await;
        }
        self.inner.snooze(s, fence, until).await
    }
    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        if self.flaw == Flaw::AdvancesFromAnyCursor {
            // Reads the cursor and moves from it, whatever the caller read.
            let stored = self
                .inner
                .get_schedule(session, name)
                .await?
                .ok_or_else(|| Error::NotFound { what: name.into() })?;
            if stored.cursor.is_some_and(|c| to <= c) {
                return Ok(true);
            }
            return self
                .inner
                .advance_schedule(session, name, stored.cursor, to)
                .await;
        }
        self.inner.advance_schedule(session, name, from, to).await
    }
    async fn checkpoint_ids(
        &self,
        s: &RunScope,
        q: &runkeep::CheckpointIdQuery,
    ) -> Result<Vec<runkeep::CheckpointId>> {
        if self.flaw == Flaw::IdsIgnoreBefore {
            let q = runkeep::CheckpointIdQuery {
                before: None,
                ..q.clone()
            };
            return self.inner.checkpoint_ids(s, &q).await;
        }
        self.inner.checkpoint_ids(s, q).await
    }
    async fn latest_checkpoint(&self, s: &RunScope) -> Result<Option<Checkpoint>> {
        if self.flaw == Flaw::IndexesLatestByClock {
            let cps = self.inner.list_checkpoints(s).await?;
            return Ok(cps.into_iter().max_by_key(|c| c.created_at));
        }
        self.inner.latest_checkpoint(s).await
    }
    async fn commit_step(
        &self,
        s: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> runkeep::Result<runkeep::StepReceipt> {
        let answer = self.inner.commit_step(s, fence, step).await;
        if answer.is_err() && self.flaw == Flaw::AppliesTheEventsOfARefusedStep {
            let _ = self.inner.append_events(s, &step.events, None).await;
        }
        answer
    }
    async fn commit_steps(
        &self,
        steps: &[runkeep::StepCommit],
    ) -> Result<Vec<Result<runkeep::StepReceipt>>> {
        let outcomes = self.inner.commit_steps(steps).await?;
        if self.flaw == Flaw::FailsAGroupCommitTogether {
            if let Some(i) = outcomes.iter().position(Result::is_err) {
                return Err(outcomes.into_iter().nth(i).unwrap().unwrap_err());
            }
        }
        Ok(outcomes)
    }
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        let f = self.pass(scope, fence)?;
        let mut out = self.hide_cancel(self.inner.append_events(scope, events, f).await)?;
        if self.flaw == Flaw::ReusesASeq {
            if let Some(first) = out.first_mut() {
                if first.seq > 1 {
                    first.seq -= 1;
                }
            }
        }
        Ok(out)
    }
    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        let f = self.pass(scope, fence)?;
        self.inner.write_run_record(scope, record, f).await
    }
    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        let f = self.pass(scope, fence)?;
        self.inner.write_messages(scope, messages, through, f).await
    }
    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        let f = self.pass(scope, fence)?;
        self.inner.write_report(scope, report, f).await
    }
    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        let f = self.pass(scope, fence)?;
        self.inner.append_audit(scope, events, f).await
    }
}

/// Runs every case against a fresh store from `make`, built on a fresh
/// store clock; answers the failed case names with their messages.
async fn failures(
    make: impl Fn(ManualClock) -> Arc<dyn RunStore>,
    version: u32,
) -> HashMap<&'static str, String> {
    let mut failed = HashMap::new();
    for case in all_cases() {
        let clock = support::store_clock();
        let env = CaseEnv {
            contract_version: version,
            clock: Some(clock.clone()),
        };
        if let Err(msg) = outcome_of(case, make(clock), env).await {
            failed.insert(case.name, msg);
        }
    }
    failed
}

fn memory(clock: ManualClock) -> Arc<dyn RunStore> {
    Arc::new(MemoryStore::with_clock(Arc::new(clock)))
}

/// Exactly the `expected` cases fail: each is caught, and nothing else
/// broke (a flaw that failed unrelated cases would not show which case
/// guards it).
fn assert_fails_exactly(failed: &HashMap<&'static str, String>, expected: &[&str]) {
    let all: BTreeSet<&&str> = failed.keys().collect();
    let missing: BTreeSet<&&str> = expected
        .iter()
        .filter(|c| !failed.contains_key(**c))
        .collect();
    assert!(
        missing.is_empty(),
        "the kit did not catch the flaw in: {missing:?} (failed: {all:?})"
    );
    let extra: BTreeSet<&&str> = failed.keys().filter(|c| !expected.contains(*c)).collect();
    assert!(
        extra.is_empty(),
        "the flaw also failed: {extra:?}\n{failed:#?}"
    );
}

fn assert_fails(failed: &HashMap<&'static str, String>, expected: &[&str]) {
    let missing: BTreeSet<&&str> = expected
        .iter()
        .filter(|c| !failed.contains_key(**c))
        .collect();
    assert!(
        missing.is_empty(),
        "the kit did not catch the flaw in: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_model_fails_no_case_and_the_kit_is_not_trivial() {
    let failed = failures(memory, runkeep_conformance::CONTRACT_VERSION).await;
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        all_cases().len() > 50,
        "only {} cases registered",
        all_cases().len()
    );
    let names: BTreeSet<_> = all_cases().iter().map(|c| c.name).collect();
    assert_eq!(names.len(), all_cases().len(), "duplicate case names");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_overfilling_a_batch_fails_the_batch_claim_cases() {
    let failed = failures(
        Broken::on(Flaw::OverfillsABatch),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "claim_next_batch_takes_runs_in_claim_order_each_leased_alone",
            "claim_next_batch_counts_the_keys_holders_and_its_own_runs_together",
            "claim_next_batch_refuses_a_size_of_zero_or_above_the_limit",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failing_a_group_commit_together_fails_the_stale_step_case() {
    let failed = failures(
        Broken::on(Flaw::FailsAGroupCommitTogether),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &["commit_steps_refuses_only_the_stale_step_and_commits_the_others"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_granting_every_claim_at_fence_one_fails_the_exclusivity_cases() {
    let failed = failures(
        Broken::on(Flaw::GrantsEveryClaimAtFenceOne),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails(
        &failed,
        &[
            "gives_the_run_to_the_first_taker_and_refuses_the_second",
            "advances_the_fence_on_renewal_so_a_stalled_twin_cannot_write",
            "releases_only_on_the_fence_that_currently_holds_it",
            "gives_exactly_one_lease_to_simultaneous_takers",
            "never_reissues_a_fence_across_claim_release_cycles",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_ignoring_the_fence_on_write_fails_the_fenced_out_cases_only_there() {
    let failed = failures(
        Broken::on(Flaw::IgnoresFenceOnWrite),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails(
        &failed,
        &[
            "fences_the_stalled_holder_out_at_the_moment_it_writes",
            "still_refuses_a_superseded_fence_after_the_new_holder_releases",
            "refuses_the_fence_its_own_holder_just_released",
            "refuses_a_fence_that_was_never_issued",
            "a_refused_write_leaves_nothing_behind",
            "fences_every_kind_of_run_evidence",
            "advances_the_fence_on_renewal_so_a_stalled_twin_cannot_write",
        ],
    );
    assert!(!failed.contains_key("gives_the_run_to_the_first_taker_and_refuses_the_second"));
    assert!(!failed.contains_key("issues_fence_plus_two_after_a_release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_rewinding_the_fence_after_release_fails_the_monotonic_cases() {
    let failed = failures(
        Broken::on(Flaw::RewindsFenceAfterRelease),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails(
        &failed,
        &[
            "issues_fence_plus_two_after_a_release",
            "never_reissues_a_fence_across_claim_release_cycles",
            "refuses_the_fence_its_own_holder_just_released",
            "still_refuses_a_superseded_fence_after_the_new_holder_releases",
        ],
    );
    assert!(!failed.contains_key("gives_the_run_to_the_first_taker_and_refuses_the_second"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_ignoring_the_listing_scope_fails_the_isolation_cases() {
    let failed = failures(
        Broken::on(Flaw::IgnoresListingScope),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails(
        &failed,
        &[
            "answers_nothing_for_a_tenant_it_does_not_hold",
            "answers_nothing_for_a_project_it_does_not_hold",
            "narrows_the_listing_to_a_session",
        ],
    );
    assert!(!failed.contains_key("fences_the_stalled_holder_out_at_the_moment_it_writes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_an_older_contract_fails_the_version_case_with_both_numbers() {
    let failed = failures(memory, 1).await;
    let msg = failed
        .get("declares_the_contract_revision_this_suite_implements")
        .expect("version case did not fail");
    assert!(msg.contains("v1") && msg.contains("v3"), "{msg}");
    for change in [
        "lifecycle",
        "attempts",
        "deferral",
        "atomic step",
        "indexed answers",
        "store clock",
        "watch",
        "priorities",
        "update_checkpoint",
    ] {
        assert!(
            msg.contains(change),
            "the refusal does not say {change:?} changed: {msg}"
        );
    }
    assert_eq!(failed.len(), 1, "{failed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_revision_two_names_only_what_three_added() {
    let failed = failures(memory, 2).await;
    let msg = failed
        .get("declares_the_contract_revision_this_suite_implements")
        .expect("version case did not fail");
    assert!(msg.contains("v2") && msg.contains("v3"), "{msg}");
    for change in [
        "priorities",
        "concurrency keys",
        "dedupe window",
        "schedules",
        "retention",
        "update_checkpoint",
    ] {
        assert!(
            msg.contains(change),
            "the refusal does not say {change:?} changed: {msg}"
        );
    }
    assert!(
        !msg.contains("contract v2 added"),
        "a v2 backend is not told what v2 added: {msg}"
    );
    assert_eq!(failed.len(), 1, "{failed:#?}");
}

#[test]
fn the_contract_revision_is_pinned() {
    assert_eq!(runkeep_conformance::CONTRACT_VERSION, 3);
    assert_eq!(
        runkeep_conformance::CONTRACT_VERSION,
        runkeep::CONTRACT_REVISION
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_needing_the_store_clock_fails_loudly_without_one() {
    let case = all_cases()
        .into_iter()
        .find(|c| c.name == "judges_expiry_on_the_store_clock_when_no_instant_is_passed")
        .expect("registered");
    let env = CaseEnv {
        contract_version: runkeep_conformance::CONTRACT_VERSION,
        clock: None,
    };
    let msg = outcome_of(case, Arc::new(MemoryStore::new()), env)
        .await
        .expect_err("a clock case passed without a store clock");
    assert!(
        msg.contains("store's clock") && msg.contains("with_clock"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reversing_each_page_fails_the_listing_order_cases() {
    let failed = failures(
        Broken::on(Flaw::ReversesEachPage),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "walks_every_row_exactly_once_in_both_orders",
            "carries_a_cursor_only_while_rows_remain",
            "rebuilds_an_addressable_row_for_every_run_it_holds",
            "shows_the_queue_reader_which_runs_nobody_holds",
            "filters_the_listing_by_park_state",
            "lists_sub_runs_with_their_parent",
            "lists_a_finished_run_with_its_status_and_finish_time",
            "lists_runs_by_priority_and_filters_by_a_lowest_priority",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_repeating_the_cursor_row_fails_the_cursor_cases() {
    let failed = failures(
        Broken::on(Flaw::RepeatsTheCursorRow),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "walks_every_row_exactly_once_in_both_orders",
            "keeps_paging_stable_when_a_run_checkpoints_between_pages",
            "carries_a_cursor_only_while_rows_remain",
            "treats_limit_zero_as_one",
            "puts_unrecorded_start_first_and_recorded_zero_after",
            "lists_runs_by_priority_and_filters_by_a_lowest_priority",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_answering_a_park_twice_fails_the_compare_and_set_cases() {
    let failed = failures(
        Broken::on(Flaw::AnswersAParkTwice),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "answers_a_park_once_and_refuses_the_second_answer",
            "lets_exactly_one_of_concurrent_answers_win",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_updating_without_a_lock_fails_the_lost_update_case() {
    let failed = failures(
        Broken::on(Flaw::UpdatesWithoutALock),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(&failed, &["concurrent_updates_of_one_checkpoint_lose_none"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reusing_a_seq_fails_the_evidence_seq_cases() {
    let failed = failures(
        Broken::on(Flaw::ReusesASeq),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "numbers_events_contiguously_from_one",
            "never_gives_two_concurrent_appends_one_number",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_handing_out_finished_runs_fails_the_lifecycle_cases() {
    let failed = failures(
        Broken::on(Flaw::HandsOutFinishedRuns),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "answers_finished_to_a_claim_and_claim_next_never_takes_it",
            "dead_letters_the_run_when_the_takeover_reaches_the_limit",
            "dead_letters_the_run_when_failed_attempts_reach_the_limit",
            "cancels_a_claimed_run_and_tells_its_holder_why",
            "finishes_a_run_past_its_deadline_at_its_next_claim",
            "hands_over_from_a_finished_step_to_the_next_run",
            "never_hands_over_to_the_run_the_step_just_finished",
            "concurrent_hand_overs_never_give_one_run_to_two_workers",
            "claim_next_skips_runs_of_a_key_at_its_limit",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_keeping_the_fence_after_finish_fails_the_spent_fence_cases() {
    let failed = failures(
        Broken::on(Flaw::KeepsTheFenceAfterFinish),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "spends_the_fence_on_finish_so_writes_under_it_are_refused",
            "reopens_a_finished_run_at_a_fence_above_every_fence_issued",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_applying_the_events_of_a_refused_step_fails_the_step_atomicity_cases() {
    let failed = failures(
        Broken::on(Flaw::AppliesTheEventsOfARefusedStep),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "leaves_nothing_of_a_step_refused_for_its_fence",
            "leaves_nothing_of_a_step_with_one_invalid_part",
            "leaves_nothing_of_a_step_on_a_finished_run",
            "spends_the_fence_on_finish_so_writes_under_it_are_refused",
            "a_refused_hand_over_claims_nothing",
        ],
    );
}

/// The differential test must be able to fail: against each of these
/// broken stores it reports a disagreement with the reference model.
#[test]
fn the_differential_test_catches_broken_stores() {
    for flaw in [
        Flaw::HandsOutFinishedRuns,
        Flaw::KeepsTheFenceAfterFinish,
        Flaw::AppliesTheEventsOfARefusedStep,
        Flaw::ReusesASeq,
        Flaw::IgnoresFenceOnWrite,
    ] {
        let make = Broken::on(flaw);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            differential::check(
                |clock| Fixture::new(make(clock.clone()), 3, ()).with_clock(clock),
                differential::Config {
                    max_shrink_iters: 64,
                    ..Default::default()
                },
            )
        }));
        let msg = match outcome {
            Ok(report) => panic!("the differential test passed a store with {flaw:?}: {report:?}"),
            Err(p) => p.downcast_ref::<String>().cloned().unwrap_or_default(),
        };
        assert!(
            msg.contains("disagrees with the reference model"),
            "{flaw:?}: the differential test failed for another reason: {msg}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_ignoring_available_at_fails_the_deferral_cases() {
    let failed = failures(
        Broken::on(Flaw::IgnoresAvailableAt),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "snooze_releases_the_run_and_defers_it_until_its_instant",
            "claim_next_skips_a_deferred_run_until_it_is_available",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_judging_claims_on_the_machine_clock_fails_the_store_clock_cases() {
    let failed = failures(
        Broken::on(Flaw::JudgesClaimsOnTheMachineClock),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "judges_expiry_on_the_store_clock_when_no_instant_is_passed",
            "never_lets_two_clients_with_skewed_clocks_both_hold_a_live_lease",
            "counts_an_attempt_only_for_a_takeover_from_an_expired_lease",
            "dead_letters_the_run_when_the_takeover_reaches_the_limit",
            "takes_the_attempt_limit_from_the_claim_over_the_run_over_the_default",
            "enqueues_a_runnable_run_with_its_not_before_time_and_attempt_limit",
            "snooze_releases_the_run_and_defers_it_until_its_instant",
            "refuses_a_finish_under_a_stale_released_or_never_issued_fence",
            "reopens_a_finished_run_at_a_fence_above_every_fence_issued",
            "leaves_nothing_of_a_step_refused_for_its_fence",
            "refuses_an_unfenced_write_for_a_principal_while_a_lease_is_on_top",
            "records_a_failed_attempt_and_defers_the_run_by_its_backoff",
            "counts_takeovers_and_failed_attempts_toward_one_limit",
            "refuses_a_failed_attempt_it_cannot_record_and_changes_nothing",
            "finishes_a_run_past_its_deadline_at_its_next_claim",
            "an_expired_holding_frees_its_slot_and_a_late_renewal_is_judged",
            "keeps_every_holding_of_a_keyed_run_in_the_keys_history",
            "a_hand_over_after_its_own_lease_lapsed_takes_the_run_again",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_the_deadline_and_the_attempt_timeout_fails_the_timeout_cases() {
    let failed = failures(
        Broken::on(Flaw::ForgetsTheTimeouts),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "finishes_a_run_past_its_deadline_at_its_next_claim",
            "hands_the_runs_attempt_timeout_to_every_taker",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_only_releases_a_failed_attempt_fails_the_failure_cases() {
    let failed = failures(
        Broken::on(Flaw::OnlyReleasesAFailedAttempt),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "records_a_failed_attempt_and_defers_the_run_by_its_backoff",
            "dead_letters_the_run_when_failed_attempts_reach_the_limit",
            "counts_takeovers_and_failed_attempts_toward_one_limit",
            "refuses_a_failed_attempt_it_cannot_record_and_changes_nothing",
            "cancels_a_claimed_run_and_tells_its_holder_why",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_not_saying_a_run_was_cancelled_fails_the_cancel_case() {
    let failed = failures(
        Broken::on(Flaw::HidesTheCancel),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(&failed, &["cancels_a_claimed_run_and_tells_its_holder_why"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_release_keeps_the_holding_fails_the_release_cases() {
    let failed = failures(
        Broken::on(Flaw::ReleaseKeepsTheHolding),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails(
        &failed,
        &[
            "a_claim_after_a_release_is_a_new_claim_not_a_renewal",
            "refuses_the_fence_its_own_holder_just_released",
        ],
    );
}

/// A store that does its writes on another task without carrying the
/// principal it acts for (`runkeep::acting`): the fence rule holds, the
/// actor rule is lost, as in a backend that forgot to carry it to its I/O.
#[derive(Debug)]
struct LosesTheActor(Arc<MemoryStore>);

#[async_trait]
impl Intercept for LosesTheActor {
    fn inner(&self) -> &dyn RunStore {
        self.0.as_ref()
    }
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        cp: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let (inner, scope, cp) = (self.0.clone(), scope.clone(), cp.clone());
        tokio::spawn(async move { inner.write_checkpoint(&scope, &cp, fence).await })
            .await
            .expect("write task")
    }
    async fn finish(
        &self,
        scope: &RunScope,
        fence: Fence,
        outcome: &runkeep::Outcome,
    ) -> Result<runkeep::Lifecycle> {
        let (inner, scope, outcome) = (self.0.clone(), scope.clone(), outcome.clone());
        tokio::spawn(async move { inner.finish(&scope, fence, &outcome).await })
            .await
            .expect("finish task")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_losing_the_actor_fails_the_actor_cases_only() {
    let failed = failures(
        |clock| {
            Arc::new(Intercepted(LosesTheActor(Arc::new(
                MemoryStore::with_clock(Arc::new(clock)),
            ))))
        },
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "refuses_every_fenced_act_on_a_holding_another_principal_claimed",
            "refuses_a_fence_issued_to_another_principal_after_the_act_was_prepared",
            "refuses_an_unfenced_write_for_a_principal_while_a_lease_is_on_top",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_indexing_latest_by_clock_fails_the_indexed_answer_cases() {
    let failed = failures(
        Broken::on(Flaw::IndexesLatestByClock),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &[
            "agrees_on_the_latest_checkpoint_with_the_full_read",
            "orders_latest_by_fence_before_clock",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_checkpoint_ids_ignore_before_fails_the_ids_case() {
    let failed = failures(
        Broken::on(Flaw::IdsIgnoreBefore),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(
        &failed,
        &["lists_checkpoint_ids_by_prefix_before_and_limit_greatest_first"],
    );
}

/// What a store broken on the queue's scheduling rules forgets.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Forgets {
    /// Stores every run at priority 0 and ignores `set_priority`.
    Priority,
    /// Stores no run's concurrency key (so none is ever at its limit).
    ConcurrencyKey,
    /// Enqueues as if no idempotency key were given.
    DedupeWindow,
}

#[derive(Debug)]
struct ForgetsScheduling(Arc<MemoryStore>, Forgets);

#[async_trait]
impl Intercept for ForgetsScheduling {
    fn inner(&self) -> &dyn RunStore {
        self.0.as_ref()
    }
    async fn enqueue(
        &self,
        scope: &RunScope,
        cp: &Checkpoint,
        options: &runkeep::EnqueueOptions,
    ) -> Result<Checkpoint> {
        let mut o = options.clone();
        match self.1 {
            Forgets::Priority => o.priority = runkeep::Priority::default(),
            Forgets::ConcurrencyKey => o.concurrency = None,
            Forgets::DedupeWindow => {}
        }
        self.0.enqueue(scope, cp, &o).await
    }
    async fn enqueue_once(
        &self,
        scope: &RunScope,
        cp: &Checkpoint,
        options: &runkeep::EnqueueOptions,
        dedupe: Option<&runkeep::Dedupe>,
    ) -> Result<runkeep::Enqueued> {
        if self.1 == Forgets::DedupeWindow {
            if let Some(d) = dedupe {
                d.validate()?;
            }
            let stored = self.enqueue(scope, cp, options).await?;
            return Ok(runkeep::Enqueued {
                run: scope.clone(),
                created: true,
                checkpoint: Some(stored),
            });
        }
        let mut o = options.clone();
        match self.1 {
            Forgets::Priority => o.priority = runkeep::Priority::default(),
            Forgets::ConcurrencyKey => o.concurrency = None,
            Forgets::DedupeWindow => {}
        }
        self.0.enqueue_once(scope, cp, &o, dedupe).await
    }
    async fn set_priority(
        &self,
        scope: &RunScope,
        priority: runkeep::Priority,
    ) -> Result<runkeep::Lifecycle> {
        if self.1 == Forgets::Priority {
            return self.0.lifecycle(scope).await;
        }
        self.0.set_priority(scope, priority).await
    }
}

async fn forgetting(what: Forgets) -> HashMap<&'static str, String> {
    failures(
        move |clock| {
            Arc::new(Intercepted(ForgetsScheduling(
                Arc::new(MemoryStore::with_clock(Arc::new(clock))),
                what,
            )))
        },
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_forgetting_priorities_fails_the_priority_cases() {
    let failed = forgetting(Forgets::Priority).await;
    assert_fails(
        &failed,
        &[
            "claim_next_takes_the_highest_priority_first_then_the_order",
            "lists_runs_by_priority_and_filters_by_a_lowest_priority",
            "sets_a_priority_only_on_an_active_run",
        ],
    );
    assert!(
        !failed.contains_key("holds_at_most_the_limit_of_runs_of_one_key"),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_forgetting_concurrency_keys_fails_the_key_cases() {
    let failed = forgetting(Forgets::ConcurrencyKey).await;
    assert_fails(
        &failed,
        &[
            "holds_at_most_the_limit_of_runs_of_one_key",
            "claim_next_skips_runs_of_a_key_at_its_limit",
            "an_expired_holding_frees_its_slot_and_a_late_renewal_is_judged",
            "keeps_every_holding_of_a_keyed_run_in_the_keys_history",
        ],
    );
    assert!(
        !failed.contains_key("claim_next_takes_the_highest_priority_first_then_the_order"),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_forgetting_the_dedupe_window_fails_the_dedupe_cases() {
    let failed = forgetting(Forgets::DedupeWindow).await;
    assert_fails(
        &failed,
        &[
            "dedupes_an_enqueue_inside_its_window_and_not_after",
            "concurrent_enqueues_with_one_key_create_one_run",
        ],
    );
    assert!(
        !failed.contains_key("holds_at_most_the_limit_of_runs_of_one_key"),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_schedule_advance_ignores_the_cursor_read_fails_the_cas_cases() {
    let failed = failures(
        Broken::on(Flaw::AdvancesFromAnyCursor),
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    // The CAS case, and the scheduler case (three passes from one read:
    // every advance wins, where exactly one may).
    assert_fails_exactly(
        &failed,
        &[
            "moves_a_schedule_cursor_only_by_compare_and_set",
            "enqueues_each_tick_once_whoever_runs_the_scheduler",
        ],
    );
}

/// A store that prunes from a stale scan: it remembers every run it saw
/// finished and, besides the inner store's correct prune, deletes those
/// whose finish is past the policy even when they were reopened since (a
/// deletion not judged again under the run's lock). Its deletions hide the
/// run's lifecycle and checkpoints.
#[derive(Debug)]
struct PrunesFromAStaleScan {
    inner: MemoryStore,
    finished: Mutex<Vec<RunScope>>,
    hidden: Mutex<BTreeSet<RunScope>>,
}

#[async_trait]
impl Intercept for PrunesFromAStaleScan {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    async fn finish(
        &self,
        s: &RunScope,
        fence: Fence,
        o: &runkeep::Outcome,
    ) -> Result<runkeep::Lifecycle> {
        let l = self.inner.finish(s, fence, o).await?;
        self.finished.lock().unwrap().push(s.clone());
        Ok(l)
    }
    async fn lifecycle(&self, s: &RunScope) -> Result<runkeep::Lifecycle> {
        if self.hidden.lock().unwrap().contains(s) {
            return Ok(runkeep::Lifecycle::default());
        }
        self.inner.lifecycle(s).await
    }
    async fn list_checkpoints(&self, s: &RunScope) -> Result<Vec<Checkpoint>> {
        if self.hidden.lock().unwrap().contains(s) {
            return Ok(Vec::new());
        }
        self.inner.list_checkpoints(s).await
    }
    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &runkeep::scheduling::RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        let mut report = self.inner.prune_finished(scope, policy, now, limit).await?;
        self.finished
            .lock()
            .unwrap()
            .retain(|s| !report.deleted.contains(s));
        let seen: Vec<RunScope> = self.finished.lock().unwrap().clone();
        for s in seen {
            let l = self.inner.lifecycle(&s).await?;
            // Reopened since the (stale) scan saw it finished.
            let exists = !self.inner.list_checkpoints(&s).await?.is_empty();
            if exists && !l.status.is_finished() && !report.deleted.contains(&s) {
                self.hidden.lock().unwrap().insert(s.clone());
                report.deleted.push(s);
            }
        }
        Ok(report)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_deleting_a_reopened_run_fails_the_retention_case() {
    let failed = failures(
        |clock| {
            Arc::new(Intercepted(PrunesFromAStaleScan {
                inner: MemoryStore::with_clock(Arc::new(clock)),
                finished: Mutex::default(),
                hidden: Mutex::default(),
            }))
        },
        runkeep_conformance::CONTRACT_VERSION,
    )
    .await;
    assert_fails_exactly(&failed, &["keeps_every_run_that_is_not_due"]);
}
