//! Meta-tests: the kit must be able to fail. Stores broken on purpose must
//! fail the cases named for them, and the reference model must fail none.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::evidence::{
    AuditRecord, EventBatch, MessageSnapshot, NewAuditEvent, NewEvent, PersistedEvent,
    ReadEventsOptions, RunRecord,
};
use runkeep::{
    CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Error,
    EvidenceStore, Fence, Lease, LeaseSummary, ListOptions, ListingScope, MemoryStore,
    ParkResolution, Result, RunPage, RunScope, RunStore, TenantId, Timestamp,
};
use runkeep_conformance::{all_cases, outcome_of};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// Grants every claim, always at fence 1.
    GrantsEveryClaimAtFenceOne,
    /// Mints fences correctly but writes ignore the presented fence.
    IgnoresFenceOnWrite,
    /// Deletes the claim on release and counts from the live claim (the
    /// reference's DF-17/DF-18 defect).
    RewindsFenceAfterRelease,
    /// Answers every listing as if it were for the conformance tenant.
    IgnoresListingScope,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryStore,
    flaw: Flaw,
    live: Mutex<HashMap<RunScope, Lease>>,
}

impl Broken {
    fn store(flaw: Flaw) -> Arc<dyn RunStore> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            flaw,
            live: Mutex::default(),
        })
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

    /// What fence to hand the inner store for an evidence write.
    fn pass(&self, scope: &RunScope, fence: Option<Fence>) -> Result<Option<Fence>> {
        match self.flaw {
            Flaw::IgnoresFenceOnWrite | Flaw::GrantsEveryClaimAtFenceOne => Ok(None),
            Flaw::RewindsFenceAfterRelease => self.naive_check(scope, fence).map(|_| None),
            Flaw::IgnoresListingScope => Ok(fence),
        }
    }
}

#[async_trait]
impl CheckpointStore for Broken {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        cp: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let f = self.pass(scope, fence)?;
        self.inner.write_checkpoint(scope, cp, f).await
    }
    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        self.inner.read_checkpoint(scope, id).await
    }
    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        self.inner.list_checkpoints(scope).await
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
        self.inner.resolve_park(scope, id, r, now, f).await
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
        if self.flaw == Flaw::IgnoresListingScope {
            let everything = ListingScope::tenant(TenantId::new("tnt_conformance").unwrap());
            return self.inner.list_runs(&everything, options).await;
        }
        self.inner.list_runs(scope, options).await
    }
    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        match self.flaw {
            Flaw::GrantsEveryClaimAtFenceOne => {
                let _ = self.inner.claim(scope, options).await?;
                Ok(ClaimOutcome::Acquired(Lease {
                    holder: options.holder.clone(),
                    fence: Fence::FIRST,
                    expires_at: options.now().plus(options.ttl),
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
                };
                live.insert(scope.clone(), lease.clone());
                Ok(ClaimOutcome::Acquired(lease))
            }
            _ => self.inner.claim(scope, options).await,
        }
    }
    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
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
        self.inner.claim_next(scope, filter, options).await
    }
    fn now(&self) -> Timestamp {
        self.inner.now()
    }
    async fn lifecycle(&self, s: &RunScope) -> runkeep::Result<runkeep::Lifecycle> {
        self.inner.lifecycle(s).await
    }
    async fn enqueue(
        &self,
        s: &RunScope,
        c: &Checkpoint,
        o: &runkeep::EnqueueOptions,
    ) -> runkeep::Result<Checkpoint> {
        self.inner.enqueue(s, c, o).await
    }
    async fn finish(
        &self,
        s: &RunScope,
        fence: Fence,
        o: &runkeep::Outcome,
    ) -> runkeep::Result<runkeep::Lifecycle> {
        self.inner.finish(s, fence, o).await
    }
    async fn snooze(&self, s: &RunScope, fence: Fence, until: Timestamp) -> runkeep::Result<bool> {
        self.inner.snooze(s, fence, until).await
    }
    async fn reopen(&self, s: &RunScope) -> runkeep::Result<runkeep::Lifecycle> {
        self.inner.reopen(s).await
    }
}

#[async_trait]
impl EvidenceStore for Broken {
    async fn commit_step(
        &self,
        s: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> runkeep::Result<runkeep::StepReceipt> {
        self.inner.commit_step(s, fence, step).await
    }
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        let f = self.pass(scope, fence)?;
        self.inner.append_events(scope, events, f).await
    }
    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        self.inner.read_events(scope, options).await
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
    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        self.inner.read_run_record(scope).await
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
    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        self.inner.read_messages(scope).await
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
    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        self.inner.read_report(scope).await
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
    async fn read_audit(&self, scope: &RunScope, since: u64) -> Result<Vec<AuditRecord>> {
        self.inner.read_audit(scope, since).await
    }
}

/// Runs every case against a fresh store from `make`; answers the failed
/// case names with their messages.
async fn failures(
    make: impl Fn() -> Arc<dyn RunStore>,
    version: u32,
) -> HashMap<&'static str, String> {
    let mut failed = HashMap::new();
    for case in all_cases() {
        if let Err(msg) = outcome_of(case, make(), version).await {
            failed.insert(case.name, msg);
        }
    }
    failed
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
    let failed = failures(|| Arc::new(MemoryStore::new()), 1).await;
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
async fn a_store_granting_every_claim_at_fence_one_fails_the_exclusivity_cases() {
    let failed = failures(|| Broken::store(Flaw::GrantsEveryClaimAtFenceOne), 1).await;
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
    let failed = failures(|| Broken::store(Flaw::IgnoresFenceOnWrite), 1).await;
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
    let failed = failures(|| Broken::store(Flaw::RewindsFenceAfterRelease), 1).await;
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
    let failed = failures(|| Broken::store(Flaw::IgnoresListingScope), 1).await;
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
    let failed = failures(
        || Arc::new(MemoryStore::new()),
        runkeep_conformance::CONTRACT_VERSION - 1,
    )
    .await;
    let msg = failed
        .get("declares_the_contract_revision_this_suite_implements")
        .expect("version case did not fail");
    assert!(msg.contains("v0") && msg.contains("v1"), "{msg}");
    assert_eq!(failed.len(), 1, "{failed:#?}");
}

#[test]
fn the_contract_revision_is_pinned() {
    assert_eq!(runkeep_conformance::CONTRACT_VERSION, 1);
}
