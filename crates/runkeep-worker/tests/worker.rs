//! The worker runtime against the reference model (`MemoryStore`), on tokio's
//! paused clock: the store judges expiry by a [`TokioClock`], so several
//! lease TTLs pass in an instant and deterministically.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::evidence::SkippedRecord;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Error,
    EventBatch, EvidenceStore, Fence, Holder, Lease, ListingScope, MemoryStore, NewEvent,
    PersistedEvent, ReadEventsOptions, RunRecord, RunScope, RunStatus, RunStore, RunStoreExt,
    Timestamp, Ttl,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_worker::{
    admit_fence, Clock, DrainMode, DrainStop, FailureKind, FenceGate, FenceToken, KeeperOptions,
    LeaseKeeper, LeaseLoss, StepOutcome, TokioClock, Worker, WorkerError, WorkerOptions,
};
use serde_json::{json, Map, Value};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

const TTL_MS: u64 = 1_000;

fn ttl() -> Ttl {
    Ttl::from_millis(TTL_MS).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn f(n: u64) -> Fence {
    Fence::new(n).unwrap()
}

fn holder(name: &str) -> Holder {
    Holder::new(name).unwrap()
}

fn run(id: &str) -> RunScope {
    RunScope::new(
        "tnt_w".parse().unwrap(),
        "prj_w".parse().unwrap(),
        "ses_w".parse().unwrap(),
        id.parse().unwrap(),
    )
}

fn tenant() -> ListingScope {
    ListingScope::tenant("tnt_w".parse().unwrap())
}

fn clock() -> Arc<TokioClock> {
    Arc::new(TokioClock::new(
        Timestamp::from_millis(1_000_000_000).unwrap(),
    ))
}

/// Keeper options for tests: the store judges on the clock injected into
/// it (the keeper passes no instant), as in production.
fn keeper_options(_clock: &Arc<TokioClock>) -> KeeperOptions {
    KeeperOptions::default()
}

fn event(kind: &str, n: u64) -> NewEvent {
    let mut p = Map::new();
    p.insert("n".into(), json!(n));
    NewEvent::new(kind, p)
}

fn checkpoint(id: &str, at: Timestamp, state: Value) -> Checkpoint {
    Checkpoint::new(
        CheckpointId::new(id).unwrap(),
        at,
        state.as_object().cloned().unwrap_or_default(),
    )
}

/// Claims `scope` for `who` judged at `at` (for takeovers "after expiry").
async fn claim_at(
    store: &dyn RunStore,
    scope: &RunScope,
    who: &str,
    at: Timestamp,
) -> ClaimOutcome {
    store
        .claim(scope, &ClaimOptions::new(holder(who), ttl()).at(at))
        .await
        .unwrap()
}

async fn events(store: &dyn RunStore, scope: &RunScope) -> Vec<PersistedEvent> {
    store
        .read_events(scope, &ReadEventsOptions::default())
        .await
        .unwrap()
        .events
}

/// A store that delegates to a `MemoryStore` and can be made to misbehave
/// (an `Intercept`: its hand-overs commit and claim through the overrides
/// below).
#[derive(Debug, Default)]
struct Faulty {
    inner: MemoryStore,
    /// Claims answer `Unavailable` (retryable).
    fail_claims: AtomicBool,
    claim_calls: AtomicU64,
    /// Each claim waits this long (virtual time) before reaching the store.
    claim_delay_ms: AtomicU64,
    /// The next claim is frozen this long mid-call (the whole process, as
    /// under SIGSTOP: tokio time jumps while the call is in progress).
    freeze_next_claim_ms: AtomicU64,
    /// Each append waits this long (virtual time) before reaching the store.
    append_delay_ms: AtomicU64,
    /// Event reads report a damaged record.
    damaged_transcript: AtomicBool,
    /// The instant every claim and claim_next was asked to be judged at
    /// (`None`: by the store's clock).
    judged_at: Mutex<Vec<Option<Timestamp>>>,
    /// The next step commit loses its acknowledgement: 1 = it is stored and
    /// answers outcome unknown; 2 = it is not stored and answers outcome
    /// unknown.
    lose_next_ack: AtomicU64,
    /// Step commits that reached the store.
    step_calls: AtomicU64,
}

impl Faulty {
    /// A faulty store whose inner store judges on `clock`.
    fn on(clock: &Arc<TokioClock>) -> Self {
        Self {
            inner: MemoryStore::with_clock(clock.clone()),
            ..Self::default()
        }
    }
}

#[async_trait]
impl Intercept for Faulty {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    async fn claim(&self, s: &RunScope, o: &ClaimOptions) -> runkeep::Result<ClaimOutcome> {
        self.claim_calls.fetch_add(1, Ordering::SeqCst);
        self.judged_at.lock().unwrap().push(o.now);
        let delay = self.claim_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            sleep(ms(delay)).await;
        }
        let freeze = self.freeze_next_claim_ms.swap(0, Ordering::SeqCst);
        if freeze > 0 {
            tokio::time::advance(ms(freeze)).await;
        }
        if self.fail_claims.load(Ordering::SeqCst) {
            return Err(Error::unavailable(
                "claim",
                std::io::Error::other("injected outage"),
            ));
        }
        self.inner.claim(s, o).await
    }
    async fn claim_next(
        &self,
        s: &ListingScope,
        f: &ClaimNextFilter,
        o: &ClaimOptions,
    ) -> runkeep::Result<Option<(RunScope, Lease)>> {
        self.judged_at.lock().unwrap().push(o.now);
        self.inner.claim_next(s, f, o).await
    }
    async fn commit_step(
        &self,
        s: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> runkeep::Result<runkeep::StepReceipt> {
        self.step_calls.fetch_add(1, Ordering::SeqCst);
        let lost =
            || Error::outcome_unknown("commit_step", std::io::Error::other("injected lost ack"));
        match self.lose_next_ack.swap(0, Ordering::SeqCst) {
            1 => {
                self.inner.commit_step(s, fence, step).await?;
                Err(lost())
            }
            2 => Err(lost()),
            _ => self.inner.commit_step(s, fence, step).await,
        }
    }
    async fn append_events(
        &self,
        s: &RunScope,
        e: &[NewEvent],
        fence: Option<Fence>,
    ) -> runkeep::Result<Vec<PersistedEvent>> {
        let delay = self.append_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            sleep(ms(delay)).await;
        }
        self.inner.append_events(s, e, fence).await
    }
    async fn read_events(
        &self,
        s: &RunScope,
        o: &ReadEventsOptions,
    ) -> runkeep::Result<EventBatch> {
        let mut batch = self.inner.read_events(s, o).await?;
        if self.damaged_transcript.load(Ordering::SeqCst) {
            batch.skipped.push(SkippedRecord {
                position: batch.last_seq + 1,
                reason: "injected damage".into(),
            });
        }
        Ok(batch)
    }
}

// ---------------------------------------------------------------- keeper

#[tokio::test(start_paused = true)]
async fn renewal_keeps_a_run_held_past_several_ttls_and_every_writer_sees_each_new_fence() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_long");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .expect("a fresh run is claimable");
    let first = keeper.handle();
    let second = first.clone();
    let watcher = first.subscribe();
    assert_eq!(first.fence(), f(1));

    let mut seen = vec![first.fence()];
    for i in 0..15u64 {
        sleep(ms(TTL_MS * 2 / 5)).await; // 6 TTLs in all
                                         // Both clones present the same, current fence, and the store takes it.
        assert_eq!(first.fence(), second.fence());
        let writer = if i % 2 == 0 { &first } else { &second };
        let e = writer
            .append_event(event("step", i))
            .await
            .expect("a kept run accepts writes");
        assert_eq!(e.generation, Some(writer.fence()));
        let top = store.lease(&scope, clock.now()).await.unwrap().unwrap();
        assert_eq!(
            top.fence,
            writer.fence(),
            "the handle writes under the store's top fence"
        );
        assert!(!top.expired);
        seen.push(first.fence());
    }
    assert!(watcher.has_changed().unwrap(), "subscribers see renewals");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]));
    let renewals = first.renewals();
    assert!(
        renewals >= 15,
        "renewed every third of the TTL over 6 TTLs, got {renewals}"
    );
    assert_eq!(
        first.fence().get(),
        1 + renewals,
        "each renewal minted a new, higher fence"
    );
    // Nobody else could take it at any point, and cannot now.
    assert!(matches!(
        claim_at(&*store, &scope, "w-b", clock.now()).await,
        ClaimOutcome::Held(_)
    ));
    assert!(!first.is_lost());
    assert!(keeper.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_takeover_stops_the_work_before_its_next_write_and_that_write_writes_nothing() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_taken");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let handle = keeper.handle();
    let token = keeper.cancellation_token();
    handle.append_event(event("before", 0)).await.unwrap();

    // Another worker judges the lease expired (its clock is ahead, or ours
    // stalled) and takes the run over.
    let later = clock.now().offset(2 * TTL_MS as i64);
    let ClaimOutcome::Acquired(theirs) = claim_at(&*store, &scope, "w-b", later).await else {
        panic!("the takeover after expiry succeeds")
    };
    assert_eq!(theirs.fence, f(2));

    // The next renewal answers Held: the token is cancelled right then,
    // before any further write is attempted.
    tokio::time::timeout(ms(TTL_MS), token.cancelled())
        .await
        .expect("the keeper cancels the work at its next renewal");
    assert_eq!(
        handle.loss(),
        Some(LeaseLoss::Superseded {
            current: f(2),
            holder: Some("w-b".into())
        })
    );
    let before = events(&*store, &scope).await.len();
    let cp = checkpoint("cp_late", clock.now(), json!({"late": true}));
    let refused = handle.write_checkpoint(&cp).await.unwrap_err();
    assert!(
        matches!(
            refused,
            WorkerError::LeaseLost {
                operation: "write_checkpoint",
                ..
            }
        ),
        "{refused}"
    );
    assert!(refused.is_fenced_out());
    let refused = handle.append_event(event("late", 1)).await.unwrap_err();
    assert!(
        matches!(refused, WorkerError::LeaseLost { .. }),
        "{refused}"
    );
    assert!(handle.write_report("late").await.is_err());
    assert_eq!(events(&*store, &scope).await.len(), before, "no late event");
    assert!(
        store
            .read_checkpoint(&scope, &cp.id)
            .await
            .unwrap()
            .is_none(),
        "no late checkpoint"
    );
    assert_eq!(
        store.read_report(&scope).await.unwrap(),
        None,
        "no late report"
    );
    // Releasing the lost run leaves the new holder alone.
    assert!(!keeper.release().await.unwrap());
    assert_eq!(
        store.lease(&scope, later).await.unwrap().unwrap().holder,
        "w-b"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_refused_as_fenced_out_stops_every_writer_of_the_run() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_refused");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let (one, two) = (keeper.handle(), keeper.handle());
    let later = clock.now().offset(2 * TTL_MS as i64);
    assert!(claim_at(&*store, &scope, "w-b", later)
        .await
        .lease()
        .is_some());
    // Before the keeper's next renewal notices, the store itself refuses.
    let refused = one.append_event(event("x", 0)).await.unwrap_err();
    assert!(
        matches!(&refused, WorkerError::Store(e) if e.is_fenced_out()),
        "{refused}"
    );
    assert!(two.is_lost(), "the refusal is shared by every clone");
    assert!(matches!(
        two.append_event(event("y", 1)).await.unwrap_err(),
        WorkerError::LeaseLost { .. }
    ));
    drop(keeper);
}

#[tokio::test(start_paused = true)]
async fn renewals_that_keep_failing_stop_the_work_before_the_lease_lapses() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_outage");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let claimed_at = tokio::time::Instant::now();
    let handle = keeper.handle();
    let token = keeper.cancellation_token();
    faulty.fail_claims.store(true, Ordering::SeqCst);

    tokio::time::timeout(ms(5 * TTL_MS), token.cancelled())
        .await
        .expect("the keeper gives up on a lease it cannot renew");
    let stopped_after = claimed_at.elapsed();
    assert!(
        stopped_after < ms(TTL_MS),
        "stopped {stopped_after:?} after the claim: before the lease could lapse"
    );
    assert!(
        faulty.claim_calls.load(Ordering::SeqCst) >= 3,
        "the retryable failure was retried ({} claim calls)",
        faulty.claim_calls.load(Ordering::SeqCst)
    );
    assert!(
        matches!(handle.loss(), Some(LeaseLoss::Expiring { .. })),
        "{:?}",
        handle.loss()
    );
    // The store would still accept fence 1 (nobody took over), but the
    // handle refuses: it can no longer prove it holds the run.
    assert!(matches!(
        handle.append_event(event("x", 0)).await.unwrap_err(),
        WorkerError::LeaseLost { .. }
    ));
    assert!(events(&*store, &scope).await.is_empty());
    // Once expired, someone else takes it.
    sleep(ms(TTL_MS)).await;
    faulty.fail_claims.store(false, Ordering::SeqCst);
    assert!(claim_at(&*store, &scope, "w-b", clock.now())
        .await
        .lease()
        .is_some());
    drop(keeper);
}

#[tokio::test(start_paused = true)]
async fn without_renewals_the_handle_refuses_writes_at_its_own_deadline() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_unkept");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let handle = keeper.handle();
    // No keeper task: renewals stop (as when the runtime is starved or the
    // process was stopped and the writer wakes first).
    drop(keeper);
    handle.append_event(event("early", 0)).await.unwrap();
    sleep(ms(TTL_MS * 95 / 100)).await;
    // The store would still accept fence 1 (nobody took over)...
    let top = store.lease(&scope, clock.now()).await.unwrap().unwrap();
    assert_eq!(top.fence, f(1));
    // ...but less than the safety margin is left: the handle refuses.
    let refused = handle.append_event(event("late", 1)).await.unwrap_err();
    assert!(
        matches!(
            &refused,
            WorkerError::LeaseLost {
                loss: LeaseLoss::Expiring { .. },
                ..
            }
        ),
        "{refused}"
    );
    assert!(handle.cancellation_token().is_cancelled());
    assert_eq!(events(&*store, &scope).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_write_in_flight_during_a_renewal_keeps_its_fence_and_the_next_write_takes_the_new_one() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_race");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let handle = keeper.handle();
    // The renewal is due at TTL/3; this write starts before and reaches the
    // store after it.
    sleep(ms(TTL_MS / 4)).await;
    faulty.append_delay_ms.store(TTL_MS / 4, Ordering::SeqCst);
    let slow = handle
        .append_event(event("slow", 0))
        .await
        .expect("not refused by our own renewal");
    assert_eq!(slow.generation, Some(f(1)));
    faulty.append_delay_ms.store(0, Ordering::SeqCst);
    sleep(ms(1)).await;
    assert_eq!(
        handle.renewals(),
        1,
        "the renewal ran once the write was done"
    );
    let next = handle.append_event(event("next", 1)).await.unwrap();
    assert_eq!(next.generation, Some(f(2)));
    assert!(!handle.is_lost());
    assert!(keeper.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_write_that_arrives_during_a_renewal_waits_for_it_and_presents_the_new_fence() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_wait");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let handle = keeper.handle();
    // The renewal starts at TTL/3 and takes TTL/10 to land; this write
    // arrives in between.
    faulty.claim_delay_ms.store(TTL_MS / 10, Ordering::SeqCst);
    sleep(ms(TTL_MS / 3 + TTL_MS / 50)).await;
    assert_eq!(handle.renewals(), 0, "the renewal is still in flight");
    let e = handle
        .append_event(event("during", 0))
        .await
        .expect("not refused by our own renewal");
    assert_eq!(
        e.generation,
        Some(f(2)),
        "written after the renewal, under its fence"
    );
    assert_eq!(handle.renewals(), 1);
    assert!(keeper.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_answers_after_the_deadline_does_not_count() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_frozen");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let handle = keeper.handle();
    // The process freezes in the middle of its first renewal (sent at a
    // third of the TTL) until past the old lease's deadline, though not past
    // the deadline the renewal itself would set. The store answers "renewed"
    // as the process thaws, but the run could have changed hands (claimed
    // and released) while the old lease had lapsed: the answer is not proof.
    faulty
        .freeze_next_claim_ms
        .store(TTL_MS * 8 / 10, Ordering::SeqCst);
    tokio::time::timeout(ms(5 * TTL_MS), handle.lost())
        .await
        .expect("the late renewal is not trusted");
    assert!(
        matches!(handle.loss(), Some(LeaseLoss::Expiring { .. })),
        "{:?}",
        handle.loss()
    );
    assert!(matches!(
        handle.append_event(event("x", 0)).await.unwrap_err(),
        WorkerError::LeaseLost { .. }
    ));
    assert!(events(&*store, &scope).await.is_empty());
    // Release still frees the fence the late renewal minted.
    assert!(keeper.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn release_leaves_a_tombstone_and_refuses_later_writes() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_rel");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let handle = keeper.handle();
    assert!(keeper.release().await.unwrap());
    let top = store.lease(&scope, clock.now()).await.unwrap().unwrap();
    assert_eq!(
        (top.holder.as_str(), top.fence, top.expired),
        ("", f(2), true)
    );
    assert_eq!(handle.loss(), Some(LeaseLoss::Released));
    assert!(handle.append_event(event("x", 0)).await.is_err());
    assert_eq!(
        claim_at(&*store, &scope, "w-b", clock.now())
            .await
            .lease()
            .unwrap()
            .fence,
        f(3)
    );
}

#[tokio::test(start_paused = true)]
async fn a_keeper_started_from_a_lease_taken_elsewhere_judges_it_by_its_expiry() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_adopted");
    let lease = claim_at(&*store, &scope, "w-a", clock.now())
        .await
        .lease()
        .unwrap();
    // Half the TTL passes before the keeper takes over: its renewal (due at
    // a third) is overdue and runs at once.
    sleep(ms(TTL_MS / 2)).await;
    let keeper = LeaseKeeper::start(
        store.clone(),
        scope.clone(),
        lease,
        ttl(),
        keeper_options(&clock),
    )
    .unwrap();
    let handle = keeper.handle();
    sleep(ms(1)).await;
    assert_eq!((handle.renewals(), handle.fence()), (1, f(2)));
    handle.append_event(event("x", 0)).await.unwrap();
    assert!(keeper.release().await.unwrap());

    // A lease that already lapsed by the clock is not kept: writes are
    // refused at once, whatever the store would say.
    let stale = claim_at(
        &*store,
        &scope,
        "w-a",
        clock.now().offset(-(2 * TTL_MS as i64)),
    )
    .await
    .lease()
    .unwrap();
    let keeper = LeaseKeeper::start(
        store.clone(),
        scope.clone(),
        stale,
        ttl(),
        keeper_options(&clock),
    )
    .unwrap();
    let refused = keeper
        .handle()
        .append_event(event("y", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, WorkerError::LeaseLost { .. }),
        "{refused}"
    );
    assert_eq!(events(&*store, &scope).await.len(), 1);
}

#[test]
fn keeper_and_worker_options_refuse_nonsense() {
    let bad = |k: KeeperOptions| k.validate().is_err();
    assert!(bad(KeeperOptions {
        renew_fraction: 0.0,
        ..Default::default()
    }));
    assert!(bad(KeeperOptions {
        renew_fraction: 1.0,
        ..Default::default()
    }));
    assert!(bad(KeeperOptions {
        renew_fraction: f64::NAN,
        ..Default::default()
    }));
    assert!(bad(KeeperOptions {
        renew_fraction: 0.6,
        safety_fraction: 0.4,
        ..Default::default()
    }));
    assert!(bad(KeeperOptions {
        retry_delay: Duration::ZERO,
        ..Default::default()
    }));
    assert!(KeeperOptions::default().validate().is_ok());
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let mut o = WorkerOptions::new(holder("w"), ttl());
    o.concurrency = 0;
    let e = Worker::new(store.clone(), tenant(), o).unwrap_err();
    assert!(e.to_string().contains("concurrency"), "{e}");
    let mut o = WorkerOptions::new(holder("w"), ttl());
    o.filter.park = Some(vec![]);
    assert!(Worker::new(store.clone(), tenant(), o).is_err());
    assert!(
        Holder::new("  ").is_err(),
        "an empty holder cannot even be built"
    );
    assert!(Worker::new(store, tenant(), WorkerOptions::new(holder("w"), ttl())).is_ok());
}

// ----------------------------------------------------------------- drain

fn worker_options(
    clock: &Arc<TokioClock>,
    who: &str,
    concurrency: usize,
    mode: DrainMode,
) -> WorkerOptions {
    let mut o = WorkerOptions::new(holder(who), ttl());
    o.concurrency = concurrency;
    o.mode = mode;
    o.keeper = keeper_options(clock);
    o.shutdown_grace = ms(500);
    o
}

/// Stops a drain whose step is called more than `limit` times, so a livelock
/// fails the test's assertions instead of hanging it (a hot loop never lets
/// the paused clock reach a timeout).
#[derive(Clone)]
struct Watchdog {
    steps: Arc<AtomicU64>,
    limit: u64,
    shutdown: CancellationToken,
}

impl Watchdog {
    fn new(limit: u64) -> Self {
        Self {
            steps: Arc::default(),
            limit,
            shutdown: CancellationToken::new(),
        }
    }

    fn tick(&self) {
        if self.steps.fetch_add(1, Ordering::SeqCst) + 1 > self.limit {
            self.shutdown.cancel();
        }
    }
}

async fn seed(store: &dyn RunStore, ids: &[&str], at: Timestamp) {
    for id in ids {
        store
            .write_checkpoint(&run(id), &checkpoint("cp_0", at, json!({"n": 0})), None)
            .await
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn drain_steps_every_run_once_with_concurrency_n_and_stops_on_an_empty_queue() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let ids = [
        "run_1", "run_2", "run_3", "run_4", "run_5", "run_6", "run_7", "run_8",
    ];
    seed(&*store, &ids, clock.now()).await;
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 3, DrainMode::UntilIdle),
    )
    .unwrap();
    let (c, n, p) = (calls.clone(), now.clone(), peak.clone());
    let dog = Watchdog::new(20);
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(dog.shutdown.clone(), move |h, resume| {
            let (c, n, p, dog) = (c.clone(), n.clone(), p.clone(), dog.clone());
            async move {
                dog.tick();
                *c.lock()
                    .unwrap()
                    .entry(h.scope().run_id.to_string())
                    .or_default() += 1;
                let inside = n.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(inside, Ordering::SeqCst);
                assert_eq!(
                    resume.unwrap().id.as_str(),
                    "cp_0",
                    "the step starts from the resume point"
                );
                sleep(ms(100)).await;
                h.write_checkpoint(&checkpoint("cp_done", h.now(), json!({"done": true})))
                    .await?;
                n.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .expect("the drain stops on an empty queue");

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), ids.len(), "{calls:?}");
    assert!(
        calls.values().all(|&n| n == 1),
        "each run stepped exactly once: {calls:?}"
    );
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "three runs at a time, never more"
    );
    assert_eq!(report.stopped, DrainStop::Idle);
    assert_eq!(
        (
            report.claimed,
            report.completed,
            report.failed,
            report.fenced_out
        ),
        (8, 8, 0, 0)
    );
    assert_eq!(report.release_failed, 0);
    assert_eq!(
        (report.released, report.release_superseded),
        (0, 0),
        "finished runs are finished, not released: {report:?}"
    );
    for id in ids {
        let top = store.lease(&run(id), clock.now()).await.unwrap().unwrap();
        assert!(
            top.expired && top.holder.is_empty(),
            "{id}: the finish ended the lease: {top:?}"
        );
        let life = store.lifecycle(&run(id)).await.unwrap();
        assert_eq!(life.status, RunStatus::Completed, "{id}: {life:?}");
        let latest = store.latest_checkpoint(&run(id)).await.unwrap().unwrap();
        assert_eq!(latest.id.as_str(), "cp_done");
    }
}

#[tokio::test(start_paused = true)]
async fn drain_until_idle_comes_back_to_yielded_runs_until_they_finish() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let ids = ["run_a", "run_b", "run_c"];
    seed(&*store, &ids, clock.now()).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 2, DrainMode::UntilIdle),
    )
    .unwrap();
    let steps = Arc::new(AtomicU64::new(0));
    let s = steps.clone();
    let dog = Watchdog::new(30);
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(dog.shutdown.clone(), move |h, resume| {
            let (s, dog) = (s.clone(), dog.clone());
            async move {
                dog.tick();
                s.fetch_add(1, Ordering::SeqCst);
                let n = resume
                    .and_then(|c| c.state.get("n").and_then(Value::as_u64))
                    .unwrap_or(0)
                    + 1;
                let cp = checkpoint(
                    &format!("cp_{n}"),
                    h.now().offset(n as i64),
                    json!({"n": n}),
                );
                h.write_checkpoint(&cp).await?;
                Ok::<_, WorkerError>(if n < 3 {
                    StepOutcome::Yield
                } else {
                    StepOutcome::Finished
                })
            }
        }),
    )
    .await
    .expect("the drain stops once every run finished");
    assert_eq!(
        steps.load(Ordering::SeqCst),
        9,
        "three steps for each of three runs: {report:?}"
    );
    assert_eq!((report.yielded, report.completed), (6, 3));
    assert_eq!(report.stopped, DrainStop::Idle);
    for id in ids {
        let latest = store.latest_checkpoint(&run(id)).await.unwrap().unwrap();
        assert_eq!(latest.state["n"], json!(3), "{id}");
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_runs_finish_within_the_grace_and_releases_every_held_run() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    seed(&*store, &["run_coop", "run_stuck"], clock.now()).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 2, DrainMode::Continuous),
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let started = Arc::new(AtomicUsize::new(0));
    let st = started.clone();
    let drain = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            worker
                .drain(shutdown, move |h, _| {
                    let st = st.clone();
                    async move {
                        st.fetch_add(1, Ordering::SeqCst);
                        if h.scope().run_id.as_str() == "run_coop" {
                            // Finish at a safe point when asked to stop.
                            h.stop_token().cancelled().await;
                            h.write_checkpoint(&checkpoint(
                                "cp_stop",
                                h.now(),
                                json!({"stopped": true}),
                            ))
                            .await?;
                            Ok::<_, WorkerError>(StepOutcome::Yield)
                        } else {
                            // Ignores the request; dropped when the grace runs out.
                            std::future::pending::<()>().await;
                            Ok(StepOutcome::Finished)
                        }
                    }
                })
                .await
        }
    });
    while started.load(Ordering::SeqCst) < 2 {
        sleep(ms(10)).await;
    }
    sleep(ms(3 * TTL_MS)).await; // held well past their TTL: renewals work
    for id in ["run_coop", "run_stuck"] {
        let top = store.lease(&run(id), clock.now()).await.unwrap().unwrap();
        assert!(
            !top.expired && top.holder == "w-a",
            "{id} held while running: {top:?}"
        );
    }
    shutdown.cancel();
    let report = tokio::time::timeout(ms(10_000), drain)
        .await
        .expect("drain returns")
        .unwrap();
    assert_eq!(report.stopped, DrainStop::Shutdown);
    assert_eq!(
        (report.claimed, report.yielded, report.interrupted),
        (2, 1, 1),
        "{report:?}"
    );
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].kind, FailureKind::Interrupted);
    assert_eq!((report.released, report.release_failed), (2, 0));
    for id in ["run_coop", "run_stuck"] {
        let top = store.lease(&run(id), clock.now()).await.unwrap().unwrap();
        assert!(
            top.expired && top.holder.is_empty(),
            "{id}: release tombstone expected, got {top:?}"
        );
        assert!(
            claim_at(&*store, &run(id), "w-b", clock.now())
                .await
                .lease()
                .is_some(),
            "{id} claimable at once"
        );
    }
    let stopped = store
        .read_checkpoint(&run("run_coop"), &CheckpointId::new("cp_stop").unwrap())
        .await
        .unwrap();
    assert!(
        stopped.is_some(),
        "the cooperative run wrote its last checkpoint before release"
    );
}

#[tokio::test(start_paused = true)]
async fn a_drained_run_that_loses_its_lease_is_stopped_and_reported_fenced_out() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    seed(&*store, &["run_z"], clock.now()).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 1, DrainMode::UntilIdle),
    )
    .unwrap();
    let writes_after = Arc::new(AtomicU64::new(0));
    let w = writes_after.clone();
    let (st, c2) = (store.clone(), clock.clone());
    let dog = Watchdog::new(10);
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(dog.shutdown.clone(), move |h, _| {
            let (w, st, c2, dog) = (w.clone(), st.clone(), c2.clone(), dog.clone());
            async move {
                dog.tick();
                h.append_event(event("first", 0)).await?;
                // A zombie's view: someone takes the run over behind our back.
                let later = c2.now().offset(2 * TTL_MS as i64);
                claim_at(&*st, h.scope(), "w-b", later)
                    .await
                    .lease()
                    .unwrap();
                for i in 0..1_000 {
                    sleep(ms(50)).await;
                    h.append_event(event("more", i)).await?;
                    w.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        writes_after.load(Ordering::SeqCst),
        0,
        "no write after the takeover got through"
    );
    assert_eq!(
        (report.claimed, report.fenced_out, report.failed),
        (1, 1, 0),
        "{report:?}"
    );
    assert_eq!(
        report.release_superseded, 1,
        "the superseded fence released nothing"
    );
    assert_eq!(
        store
            .lease(&run("run_z"), clock.now())
            .await
            .unwrap()
            .unwrap()
            .holder,
        "w-b"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_step_is_reported_as_a_failed_attempt_and_its_run_deferred_by_its_backoff() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    seed(&*store, &["run_err", "run_panic"], clock.now()).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 2, DrainMode::UntilIdle),
    )
    .unwrap();
    let dog = Watchdog::new(10);
    let d = dog.clone();
    let drain = worker.drain(dog.shutdown.clone(), move |h, _| {
        d.tick();
        async move {
            if h.scope().run_id.as_str() == "run_panic" {
                panic!("step bug");
            }
            Err::<StepOutcome, _>("tool said no".to_string())
        }
    });
    let report = tokio::time::timeout(ms(60_000), drain)
        .await
        .expect("a pass where every step failed is idle: the drain stops, it does not retry hot");
    assert_eq!(
        (report.claimed, report.failed, report.completed),
        (2, 2, 0),
        "{report:?}"
    );
    assert_eq!(report.stopped, DrainStop::Idle);
    assert_eq!(
        (report.snoozed, report.released, report.release_failed),
        (0, 0, 0),
        "failed runs are reported as failed attempts, not snoozed or released: {report:?}"
    );
    let messages: Vec<_> = report.failures.iter().map(|f| f.message.clone()).collect();
    assert!(
        messages.iter().any(|m| m.contains("tool said no")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("panicked")),
        "{messages:?}"
    );
    for id in ["run_err", "run_panic"] {
        assert!(store
            .lease(&run(id), clock.now())
            .await
            .unwrap()
            .unwrap()
            .holder
            .is_empty());
        let life = store.lifecycle(&run(id)).await.unwrap();
        assert_eq!(life.status, RunStatus::Active, "{id}: a failure is retried");
        assert_eq!(life.attempts, 1, "{id}: one failed attempt counted");
        let delay = runkeep::RetryPolicy::default().delay(&run(id).run_id, 1);
        assert_eq!(
            life.available_at,
            Some(clock.now().offset(delay.as_millis() as i64)),
            "{id}: not before the run's backoff for attempt 1 (default policy): {life:?}"
        );
        let kind = if id == "run_panic" { "panic" } else { "error" };
        assert_eq!(life.failures.len(), 1, "{id}: {life:?}");
        assert_eq!(life.failures[0].error.kind, kind, "{id}");
    }
}

// ----------------------------------------------------------- tool ledger

#[tokio::test(start_paused = true)]
async fn the_tool_ledger_skips_a_recorded_tool_after_a_crash_and_runs_an_unrecorded_one() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_tools");
    let executions: Arc<Mutex<HashMap<&'static str, u32>>> = Arc::default();
    let tool = |name: &'static str, answer: Result<&'static str, &'static str>| {
        let executions = executions.clone();
        move |token: FenceToken| async move {
            *executions.lock().unwrap().entry(name).or_default() += 1;
            answer
                .map(|a| format!("{a}@{}", token.fence))
                .map_err(|a| format!("{a}@{}", token.fence))
        }
    };

    // First life: two tools complete and are recorded, then the process dies
    // (the keeper is dropped without releasing).
    let first = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let h = first.handle();
    let a = h
        .run_tool("toolu_1", "search", tool("t1", Ok("found")))
        .await
        .unwrap();
    assert!(!a.replayed);
    assert_eq!(a.tool.result, "found@1");
    let b = h
        .run_tool("toolu_2", "shell", tool("t2", Err("exit 1")))
        .await
        .unwrap();
    assert!(b.tool.is_error);
    // Within one holding, a repeat is answered from the ledger too.
    assert!(
        h.run_tool("toolu_1", "search", tool("t1", Ok("again")))
            .await
            .unwrap()
            .replayed
    );
    drop(first);
    drop(h);

    // Second life, after the lease lapsed: another worker resumes.
    sleep(ms(2 * TTL_MS)).await;
    let second = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-b"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .expect("claimable after expiry");
    let h = second.handle();
    let again = h
        .run_tool("toolu_1", "search", tool("t1", Ok("twice")))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(
        again.tool.result, "found@1",
        "the recorded result, not a new one"
    );
    let failed = h
        .run_tool("toolu_2", "shell", tool("t2", Ok("fixed")))
        .await
        .unwrap();
    assert!(
        failed.replayed && failed.tool.is_error,
        "a recorded failure is an answer too"
    );
    let fresh = h
        .run_tool("toolu_3", "search", tool("t3", Ok("new")))
        .await
        .unwrap();
    assert!(!fresh.replayed);
    assert_eq!(fresh.tool.result, format!("new@{}", h.fence()));

    let executions = executions.lock().unwrap().clone();
    assert_eq!(executions, HashMap::from([("t1", 1), ("t2", 1), ("t3", 1)]));
    let ledger = store.completed_tools(&scope).await.unwrap();
    assert!(ledger.complete);
    assert_eq!(ledger.tools.len(), 3);
    let recorded = events(&*store, &scope).await;
    assert_eq!(recorded.len(), 3, "one tool_completed event per execution");
    assert_eq!(recorded[0].payload["toolUseId"], json!("toolu_1"));
    assert_eq!(recorded[1].payload["isError"], json!(true));
    assert_eq!(recorded[2].generation, Some(h.fence()));
    assert!(second.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn an_incomplete_ledger_refuses_to_run_an_unrecorded_tool_but_replays_a_recorded_one() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_damaged");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let mut payload = Map::new();
    payload.insert("toolUseId".into(), json!("toolu_1"));
    payload.insert("toolName".into(), json!("search"));
    payload.insert("result".into(), json!("r1"));
    store
        .append_events(
            &scope,
            &[NewEvent::new("tool_completed", payload)],
            Some(f(1)),
        )
        .await
        .unwrap();
    faulty.damaged_transcript.store(true, Ordering::SeqCst);
    let h = keeper.handle();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let refused = h
        .run_tool("toolu_2", "shell", |_| async move {
            r.store(true, Ordering::SeqCst);
            Ok("x".to_string())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(refused, WorkerError::LedgerIncomplete { .. }),
        "{refused}"
    );
    assert!(!ran.load(Ordering::SeqCst), "not executed blindly");
    let replay = h
        .run_tool("toolu_1", "search", |_| async { Ok("new".to_string()) })
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.tool.result, "r1");
    drop(keeper);
}

// ------------------------------------------------------------ fence gate

#[tokio::test(start_paused = true)]
async fn the_effect_sink_refuses_a_lower_fence() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let scope = run("run_effects");
    let sink = FenceGate::new();
    let applied = Mutex::new(Vec::new());

    let zombie = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let z = zombie.handle();
    let t1 = z.ensure_held("pay").unwrap();
    sink.apply(&t1, || applied.lock().unwrap().push("a1"))
        .unwrap();
    // The zombie's own renewal raises its fence; the sink admits it.
    sleep(ms(TTL_MS / 2)).await;
    let t2 = z.fence_token();
    assert!(t2.fence > t1.fence);
    sink.apply(&t2, || applied.lock().unwrap().push("a2"))
        .unwrap();
    assert_eq!(sink.highest(&scope), Some(t2.fence));

    // The zombie stalls (no renewals, no writes); another worker takes over
    // after expiry and announces its fence to the sink.
    drop(zombie);
    sleep(ms(2 * TTL_MS)).await;
    let heir = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-b"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    sink.observe(&heir.handle().fence_token());
    // The zombie wakes and tries an effect with the fence it had.
    let stale = z.fence_token();
    let refused = sink
        .apply(&stale, || applied.lock().unwrap().push("zombie"))
        .unwrap_err();
    assert_eq!(
        (refused.presented, refused.highest),
        (t2.fence, heir.handle().fence())
    );
    sink.apply(&heir.handle().fence_token(), || {
        applied.lock().unwrap().push("b1")
    })
    .unwrap();
    assert_eq!(*applied.lock().unwrap(), ["a1", "a2", "b1"]);
    // The handle itself also refuses locally before any effect.
    assert!(z.ensure_held("pay").is_err());
    // The pure rule.
    assert!(
        admit_fence(Some(f(4)), f(4))
            && admit_fence(Some(f(4)), f(5))
            && !admit_fence(Some(f(4)), f(3))
    );
    drop(heir);
}

// ------------------------------------------------------------ contract v2

fn enqueue_options(max_attempts: Option<u32>) -> runkeep::EnqueueOptions {
    runkeep::EnqueueOptions {
        max_attempts,
        ..Default::default()
    }
}

async fn enqueue(store: &dyn RunStore, id: &str, at: Timestamp, max_attempts: Option<u32>) {
    store
        .enqueue(
            &run(id),
            &checkpoint("cp_0", at, json!({"n": 0})),
            &enqueue_options(max_attempts),
        )
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_last_step_committed_with_its_finish_ends_the_run_and_the_drain_leaves_it_alone() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    enqueue(&*store, "run_s", clock.now(), None).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 1, DrainMode::UntilIdle),
    )
    .unwrap();
    let after: Arc<Mutex<Option<WorkerError>>> = Arc::default();
    let a = after.clone();
    let dog = Watchdog::new(5);
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(dog.shutdown.clone(), move |h, _| {
            let (a, dog) = (a.clone(), dog.clone());
            async move {
                dog.tick();
                let step = runkeep::Step {
                    events: vec![event("last", 1)],
                    checkpoint: Some(checkpoint("cp_1", h.now(), json!({"n": 1}))),
                    finish: Some(runkeep::Outcome::completed(Some(json!({"ok": true})))),
                    ..Default::default()
                };
                let receipt = h.commit_step(&step).await?;
                assert_eq!(receipt.events.len(), 1);
                // The holding ended with the commit: the handle writes no more.
                *a.lock().unwrap() = h.append_event(event("late", 2)).await.err();
                assert!(!h.is_lost(), "a finish is not a lost lease");
                Ok::<_, WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .unwrap();
    let late = after
        .lock()
        .unwrap()
        .take()
        .expect("a write after the finish is refused");
    assert!(
        matches!(
            &late,
            WorkerError::LeaseLost {
                loss: LeaseLoss::Finished {
                    status: RunStatus::Completed
                },
                ..
            }
        ),
        "{late}"
    );
    assert_eq!(
        (
            report.claimed,
            report.completed,
            report.failed,
            report.fenced_out
        ),
        (1, 1, 0, 0),
        "{report:?}"
    );
    assert_eq!(
        (
            report.released,
            report.release_superseded,
            report.release_failed
        ),
        (0, 0, 0),
        "the drain neither released nor finished the run again: {report:?}"
    );
    let life = store.lifecycle(&run("run_s")).await.unwrap();
    assert_eq!(life.status, RunStatus::Completed);
    assert_eq!(life.result, Some(json!({"ok": true})));
    let kinds: Vec<String> = events(&*store, &run("run_s"))
        .await
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(
        kinds,
        vec!["last".to_string()],
        "the late write wrote nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_one_worker_finished_is_never_stepped_by_another_or_after_a_restart() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    seed(&*store, &["run_1", "run_2", "run_3"], clock.now()).await;
    let steps = Arc::new(AtomicU64::new(0));
    for who in ["w-a", "w-b", "w-a-restarted"] {
        let worker = Worker::new(
            store.clone(),
            tenant(),
            worker_options(&clock, who, 2, DrainMode::UntilIdle),
        )
        .unwrap();
        let s = steps.clone();
        let dog = Watchdog::new(10);
        let report = tokio::time::timeout(
            ms(60_000),
            worker.drain(dog.shutdown.clone(), move |_, _| {
                let (s, dog) = (s.clone(), dog.clone());
                async move {
                    dog.tick();
                    s.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, WorkerError>(StepOutcome::Finished)
                }
            }),
        )
        .await
        .unwrap();
        assert_eq!(report.stopped, DrainStop::Idle, "{who}: {report:?}");
    }
    assert_eq!(
        steps.load(Ordering::SeqCst),
        3,
        "each run stepped once across three drains (the store keeps the status, no drain remembers)"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_gives_the_run_back_with_a_not_before_time() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    enqueue(&*store, "run_r", clock.now(), None).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-a", 1, DrainMode::UntilIdle),
    )
    .unwrap();
    let dog = Watchdog::new(5);
    let d = dog.clone();
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(dog.shutdown.clone(), move |_, _| {
            d.tick();
            async move { Ok::<_, WorkerError>(StepOutcome::RetryAfter(ms(5_000))) }
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            report.claimed,
            report.deferred,
            report.snoozed,
            report.released
        ),
        (1, 1, 1, 0),
        "stepped once, then deferred (not handed out again at once): {report:?}"
    );
    assert_eq!(report.stopped, DrainStop::Idle);
    let life = store.lifecycle(&run("run_r")).await.unwrap();
    assert_eq!(
        life.available_at,
        Some(clock.now().offset(5_000)),
        "{life:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_finish_through_the_handle_stops_the_keeper_and_refuses_later_writes() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    enqueue(&*store, "run_f", clock.now(), None).await;
    let keeper = LeaseKeeper::claim(
        store.clone(),
        run("run_f"),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .unwrap();
    let h = keeper.handle();
    let fence = h.fence();
    h.finish(&runkeep::Outcome::failed("gave up"))
        .await
        .unwrap();
    sleep(ms(3 * TTL_MS)).await; // renewals would have been due twice
    assert_eq!(h.renewals(), 0, "the keeper stopped renewing at the finish");
    let top = store
        .lease(&run("run_f"), clock.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        top.fence,
        fence.next(&run("run_f").run_id).unwrap(),
        "{top:?}"
    );
    assert!(h
        .write_run_record(&RunRecord::default())
        .await
        .unwrap_err()
        .is_fenced_out());
    assert!(h.ended_by_handle().is_some() && !h.is_lost());
    assert!(!keeper.release().await.unwrap(), "nothing left to release");
}

/// A poison run (its step kills the worker every time) is handed out until
/// its attempt limit, then dead-lettered by `claim_next` instead of being
/// handed to the next worker. Each "crash" abandons the drain mid-step (its
/// tasks are dropped, nothing is released), as `kill -9` would.
#[tokio::test(start_paused = true)]
async fn a_poison_run_that_crashes_every_worker_is_dead_lettered_at_its_attempt_limit() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    enqueue(&*store, "run_poison", clock.now(), Some(3)).await;
    enqueue(&*store, "run_fine", clock.now(), None).await;
    let crashed = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    for n in 0..3 {
        let worker = Worker::new(
            store.clone(),
            tenant(),
            worker_options(&clock, &format!("w-{n}"), 1, DrainMode::Continuous),
        )
        .unwrap();
        let started = Arc::new(tokio::sync::Notify::new());
        let (st, c) = (started.clone(), completed.clone());
        let dog = Watchdog::new(20);
        let drain = tokio::spawn(async move {
            worker
                .drain(dog.shutdown.clone(), move |h, _| {
                    let (st, c, dog) = (st.clone(), c.clone(), dog.clone());
                    async move {
                        dog.tick();
                        if h.scope().run_id.as_str() == "run_poison" {
                            st.notify_one();
                            std::future::pending::<()>().await;
                        }
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, WorkerError>(StepOutcome::Finished)
                    }
                })
                .await
        });
        tokio::time::timeout(ms(60_000), started.notified())
            .await
            .expect("the poison run is handed out again until its limit");
        drain.abort(); // the crash: nothing is released
        let _ = drain.await;
        crashed.fetch_add(1, Ordering::SeqCst);
        sleep(ms(2 * TTL_MS)).await; // its lease lapses
    }
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-last", 1, DrainMode::UntilIdle),
    )
    .unwrap();
    let stepped_poison = Arc::new(AtomicBool::new(false));
    let sp = stepped_poison.clone();
    let dog = Watchdog::new(5);
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(dog.shutdown.clone(), move |h, _| {
            let (sp, dog) = (sp.clone(), dog.clone());
            async move {
                dog.tick();
                sp.fetch_or(h.scope().run_id.as_str() == "run_poison", Ordering::SeqCst);
                Ok::<_, WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .unwrap();
    assert!(!stepped_poison.load(Ordering::SeqCst), "{report:?}");
    let life = store.lifecycle(&run("run_poison")).await.unwrap();
    assert_eq!(life.status, RunStatus::Failed, "{life:?}");
    assert_eq!(
        life.reason.as_deref(),
        Some(runkeep::lifecycle::ATTEMPTS_EXHAUSTED)
    );
    assert_eq!((crashed.load(Ordering::SeqCst), life.attempts), (3, 3));
    let fine = store.lifecycle(&run("run_fine")).await.unwrap();
    assert_eq!(fine.status, RunStatus::Completed, "the other run completed");
}

/// An idle drain is woken by the store's watch, not by its polling
/// fallback: on tokio's paused clock, the run enqueued while the drain
/// waits is stepped without any time passing, though the fallback is a
/// minute and the memory store's own watch fallback is seconds.
#[tokio::test(start_paused = true)]
async fn an_idle_drain_is_woken_by_the_stores_watch_not_by_polling() {
    let clock = clock();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    let mut o = worker_options(&clock, "w-a", 1, DrainMode::Continuous);
    o.idle = runkeep_worker::IdleBackoff {
        min: ms(60_000),
        max: ms(60_000),
        jitter: 0.0,
    };
    let worker = Worker::new(store.clone(), tenant(), o).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<tokio::time::Instant>();
    let shutdown = CancellationToken::new();
    let drain = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            worker
                .drain(shutdown, move |_, _| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(tokio::time::Instant::now());
                        Ok::<_, WorkerError>(StepOutcome::Finished)
                    }
                })
                .await
        }
    });
    sleep(ms(1_000)).await; // the drain found nothing and waits
    let enqueued = tokio::time::Instant::now();
    enqueue(&*store, "run_w", clock.now(), None).await;
    let stepped = tokio::time::timeout(ms(120_000), rx.recv())
        .await
        .expect("the run is stepped")
        .unwrap();
    let waited = stepped - enqueued;
    assert!(
        waited < ms(100),
        "woken after {waited:?} of tokio time: by a poll, not by the watch"
    );
    shutdown.cancel();
    let report = drain.await.unwrap();
    assert!(report.woken_by_watch >= 1, "{report:?}");
    assert_eq!(report.woken_by_poll, 0, "{report:?}");
}

/// Measures (does not assert) the wall-clock wake-up latency of an idle
/// drain on the memory store: enqueue → the step starts. Reported with
/// `--nocapture`; the polling fallback is a minute, so every wake-up counted
/// here is the watch's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_up_latency_of_an_idle_drain_on_the_memory_store() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let mut o = WorkerOptions::new(holder("w-lat"), ttl());
    o.idle = runkeep_worker::IdleBackoff {
        min: ms(60_000),
        max: ms(60_000),
        jitter: 0.0,
    };
    let worker = Worker::new(store.clone(), tenant(), o).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<std::time::Instant>();
    let shutdown = CancellationToken::new();
    let drain = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            worker
                .drain(shutdown, move |_, _| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(std::time::Instant::now());
                        Ok::<_, WorkerError>(StepOutcome::Finished)
                    }
                })
                .await
        }
    });
    let mut latencies = Vec::new();
    for i in 0..50 {
        tokio::time::sleep(ms(5)).await; // let the drain go idle
        let sent = std::time::Instant::now();
        enqueue(&*store, &format!("run_lat{i}"), Timestamp::now(), None).await;
        let stepped = tokio::time::timeout(ms(30_000), rx.recv())
            .await
            .expect("stepped within the bound")
            .unwrap();
        latencies.push(stepped - sent);
    }
    shutdown.cancel();
    let report = tokio::time::timeout(ms(30_000), drain)
        .await
        .unwrap()
        .unwrap();
    latencies.sort();
    eprintln!(
        "wake-up latency (memory store, enqueue → step start, {} samples): min {:?}, median {:?}, p90 {:?}, max {:?}; woken by watch {}, by poll {}",
        latencies.len(),
        latencies[0],
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 9 / 10],
        latencies[latencies.len() - 1],
        report.woken_by_watch,
        report.woken_by_poll
    );
    assert_eq!(report.woken_by_poll, 0, "{report:?}");
    assert_eq!(report.completed, 50);
}

/// The worker's claims, renewals and `claim_next` carry no instant,
/// so the store's clock judges them (the database's on PostgreSQL); the
/// keeper still renews on its own monotonic schedule and the handle's
/// `now` is the store's clock.
#[tokio::test(start_paused = true)]
async fn the_worker_leaves_judging_claims_and_renewals_to_the_stores_clock() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_store_clock");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .expect("claimed");
    let h = keeper.handle();
    // Three TTLs pass: the keeper renewed several times on the store's clock.
    sleep(ms(3 * TTL_MS)).await;
    assert!(h.renewals() >= 3, "renewals {}", h.renewals());
    assert!(!h.is_lost(), "{:?}", h.loss());
    assert_eq!(
        h.now(),
        clock.now(),
        "the handle's now is the store's clock"
    );
    keeper.release().await.unwrap();
    // The drain's claim_next too.
    seed(&*store, &["run_store_clock_2"], clock.now()).await;
    let worker = Worker::new(
        store.clone(),
        tenant(),
        worker_options(&clock, "w-b", 1, DrainMode::UntilIdle),
    )
    .unwrap();
    let report = worker
        .drain(CancellationToken::new(), |_run, _resume| async move {
            Ok::<_, WorkerError>(StepOutcome::Finished)
        })
        .await;
    assert!(report.claimed >= 1, "{report:?}");
    let judged = faulty.judged_at.lock().unwrap().clone();
    assert!(judged.len() >= 5, "{judged:?}");
    assert!(
        judged.iter().all(Option::is_none),
        "every claim must leave the instant to the store: {judged:?}"
    );
}

/// A step whose commit acknowledgement is lost: the handle fences the
/// attempt off (a renewal), reads back by the step id and never appends
/// the step twice; one that did not land is reported as not stored
/// (retryable, no longer "outcome unknown"), and repeating it stores it once.
#[tokio::test(start_paused = true)]
async fn a_lost_commit_acknowledgement_is_resolved_by_reading_back_never_by_repeating() {
    let clock = clock();
    let faulty = Arc::new(Intercepted(Faulty::on(&clock)));
    let store: Arc<dyn RunStore> = faulty.clone();
    let scope = run("run_lost_ack");
    let keeper = LeaseKeeper::claim(
        store.clone(),
        scope.clone(),
        holder("w-a"),
        ttl(),
        keeper_options(&clock),
    )
    .await
    .unwrap()
    .expect("claimed");
    let h = keeper.handle();
    let first_fence = h.fence();
    let step = runkeep::Step {
        events: vec![event("work", 1), event("work", 2)],
        checkpoint: Some(checkpoint("cp_1", clock.now(), json!({"n": 1}))),
        ..runkeep::Step::default()
    };
    // 1. Stored, acknowledgement lost: resolved as landed, not repeated.
    faulty.lose_next_ack.store(1, Ordering::SeqCst);
    let receipt = h.commit_step(&step).await.expect("resolved as landed");
    assert_eq!(
        faulty.step_calls.load(Ordering::SeqCst),
        1,
        "never repeated"
    );
    let evs = events(&*store, &scope).await;
    assert_eq!(evs.len(), 2, "the step's events exactly once: {evs:?}");
    assert_eq!(receipt.events, evs, "the receipt is the read-back");
    assert!(evs.iter().all(|e| e.generation == Some(first_fence)));
    assert_eq!(receipt.checkpoint.unwrap().fence, Some(first_fence));
    assert!(
        h.fence() > first_fence,
        "the attempt was fenced off by a renewal"
    );
    // 2. Not stored, acknowledgement lost: reported as not stored.
    faulty.lose_next_ack.store(2, Ordering::SeqCst);
    let second = runkeep::Step {
        events: vec![event("work", 3)],
        ..runkeep::Step::default()
    };
    let err = h.commit_step(&second).await.expect_err("not stored");
    assert!(err.is_retryable(), "{err}");
    assert!(
        matches!(&err, WorkerError::Store(e) if !e.is_outcome_unknown()),
        "resolved: {err}"
    );
    assert!(err.to_string().contains("not stored"), "{err}");
    assert_eq!(events(&*store, &scope).await.len(), 2);
    // Repeating it (the caller's choice) stores it once.
    h.commit_step(&second).await.unwrap();
    let evs = events(&*store, &scope).await;
    assert_eq!(evs.len(), 3);
    assert_eq!(faulty.step_calls.load(Ordering::SeqCst), 3);
    // 3. A finishing step: landed, the holding ends as finished.
    faulty.lose_next_ack.store(1, Ordering::SeqCst);
    let last = runkeep::Step {
        events: vec![event("done", 4)],
        finish: Some(runkeep::Outcome::completed(None)),
        ..runkeep::Step::default()
    };
    let r = h.commit_step(&last).await.expect("resolved as landed");
    assert_eq!(r.lifecycle.unwrap().status, RunStatus::Completed);
    assert!(h.ended_by_handle().is_some(), "{:?}", h.loss());
    assert_eq!(events(&*store, &scope).await.len(), 4);
}
