//! The drain's hand-over (`WorkerOptions::handover`): a run's finishing
//! `commit_step` also claims the drain's next run
//! (`EvidenceStore::commit_step_and_claim_next`), and the drain steps that
//! run in the finished run's slot. Against the reference model
//! (`MemoryStore`) behind a counting wrapper, on tokio's paused clock.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, Error, EvidenceStore,
    Fence, Handover, Holder, Lease, ListingScope, MemoryStore, NewEvent, NextClaim, RunScope,
    RunStatus, RunStore, Timestamp, Ttl,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_worker::{
    Clock, DrainMode, DrainReport, DrainStop, LeaseKeeper, StepOutcome, TokioClock, Worker,
    WorkerError, WorkerOptions,
};
use serde_json::{json, Map};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

const TTL_MS: u64 = 1_000;

fn ttl() -> Ttl {
    Ttl::from_millis(TTL_MS).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn run(id: &str) -> RunScope {
    RunScope::new(
        "tnt_h".parse().unwrap(),
        "prj_h".parse().unwrap(),
        "ses_h".parse().unwrap(),
        id.parse().unwrap(),
    )
}

fn tenant() -> ListingScope {
    ListingScope::tenant("tnt_h".parse().unwrap())
}

fn clock() -> Arc<TokioClock> {
    Arc::new(TokioClock::new(
        Timestamp::from_millis(1_000_000_000).unwrap(),
    ))
}

fn ids(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("run_{i:02}")).collect()
}

async fn enqueue(store: &dyn RunStore, ids: &[String], at: Timestamp) {
    for id in ids {
        let cp = Checkpoint::new(
            CheckpointId::new("cp_0").unwrap(),
            at,
            json!({"n": 0}).as_object().cloned().unwrap(),
        );
        store
            .enqueue(&run(id), &cp, &runkeep::EnqueueOptions::default())
            .await
            .unwrap();
    }
}

fn options(who: &str, concurrency: usize) -> WorkerOptions {
    let mut o = WorkerOptions::new(Holder::new(who).unwrap(), ttl());
    o.concurrency = concurrency;
    o.mode = DrainMode::UntilIdle;
    o.shutdown_grace = ms(500);
    o
}

/// The last step of a run: one event and the finish, in one commit.
fn last_step(id: &str) -> runkeep::Step {
    let mut p = Map::new();
    p.insert("run".into(), json!(id));
    runkeep::Step {
        events: vec![NewEvent::new("done", p)],
        finish: Some(runkeep::Outcome::completed(Some(json!({"run": id})))),
        ..runkeep::Step::default()
    }
}

/// What the counting store saw.
#[derive(Debug, Default)]
struct Seen {
    claim_next: u64,
    /// `claim_next` calls that took a run.
    claim_next_took: u64,
    commit_step: u64,
    handovers: u64,
    /// Finishing commits that took effect, per run.
    finished: HashMap<RunScope, u32>,
    /// Runs held right now, as the store's answers tell: a claim or a
    /// hand-over's next run adds one; a finish, release or snooze ends one.
    held: HashSet<RunScope>,
    /// The most runs held at once.
    peak_held: usize,
}

impl Seen {
    fn hold(&mut self, scope: &RunScope) {
        self.held.insert(scope.clone());
        self.peak_held = self.peak_held.max(self.held.len());
    }
}

/// A `MemoryStore` that counts the calls a drain makes (and forwards the
/// hand-over to the memory store's own, not `Intercept`'s default provided
/// body, so the wrapper is not judged by that body), and can make
/// hand-overs misbehave.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryStore,
    seen: Mutex<Seen>,
    /// The next this many hand-overs commit their step, then answer their
    /// claim with these errors (first popped first).
    fail_next_claims: Mutex<Vec<Error>>,
    /// The next hand-over commits and claims, then loses its answer
    /// (outcome unknown).
    lose_next_answer: AtomicU64,
}

impl Counting {
    fn on(clock: &Arc<TokioClock>) -> Self {
        Self {
            inner: MemoryStore::with_clock(clock.clone()),
            ..Self::default()
        }
    }

    fn seen<T>(&self, f: impl FnOnce(&mut Seen) -> T) -> T {
        f(&mut self.seen.lock().unwrap())
    }

    /// (`claim_next` calls, those that took a run, hand-overs, plain
    /// `commit_step`s).
    fn counts(&self) -> (u64, u64, u64, u64) {
        self.seen(|s| (s.claim_next, s.claim_next_took, s.handovers, s.commit_step))
    }
}

#[async_trait]
impl Intercept for Counting {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    // `claim` forwards uncounted: renewals (and the outcome-unknown
    // fence-off) of runs already held.
    async fn release(&self, s: &RunScope, fence: Fence) -> runkeep::Result<bool> {
        let released = self.inner.release(s, fence).await?;
        if released {
            self.seen(|x| x.held.remove(s));
        }
        Ok(released)
    }
    async fn claim_next(
        &self,
        s: &ListingScope,
        f: &ClaimNextFilter,
        o: &ClaimOptions,
    ) -> runkeep::Result<Option<(RunScope, Lease)>> {
        let next = self.inner.claim_next(s, f, o).await?;
        self.seen(|x| {
            x.claim_next += 1;
            if let Some((run, _)) = &next {
                x.claim_next_took += 1;
                x.hold(run);
            }
        });
        Ok(next)
    }
    async fn finish(
        &self,
        s: &RunScope,
        fence: Fence,
        o: &runkeep::Outcome,
    ) -> runkeep::Result<runkeep::Lifecycle> {
        let life = self.inner.finish(s, fence, o).await?;
        self.seen(|x| {
            x.held.remove(s);
            *x.finished.entry(s.clone()).or_default() += 1;
        });
        Ok(life)
    }
    async fn snooze(&self, s: &RunScope, fence: Fence, until: Timestamp) -> runkeep::Result<bool> {
        let snoozed = self.inner.snooze(s, fence, until).await?;
        if snoozed {
            self.seen(|x| x.held.remove(s));
        }
        Ok(snoozed)
    }
    async fn commit_step(
        &self,
        s: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> runkeep::Result<runkeep::StepReceipt> {
        let receipt = self.inner.commit_step(s, fence, step).await?;
        self.seen(|x| {
            x.commit_step += 1;
            if step.finish.is_some() {
                x.held.remove(s);
                *x.finished.entry(s.clone()).or_default() += 1;
            }
        });
        Ok(receipt)
    }
    async fn commit_step_and_claim_next(
        &self,
        s: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
        next: &NextClaim,
    ) -> runkeep::Result<Handover> {
        let Handover { receipt, next } = self
            .inner
            .commit_step_and_claim_next(s, fence, step, next)
            .await?;
        let fail = self.fail_next_claims.lock().unwrap().pop();
        let next = match fail {
            Some(e) => {
                // Nothing was claimed: give back what the inner store took.
                if let Ok(Some((run, lease))) = &next {
                    self.inner.release(run, lease.fence).await?;
                }
                Err(e)
            }
            None => next,
        };
        self.seen(|x| {
            x.handovers += 1;
            if step.finish.is_some() {
                x.held.remove(s);
                *x.finished.entry(s.clone()).or_default() += 1;
            }
            if let Ok(Some((run, _))) = &next {
                x.hold(run);
            }
        });
        if self.lose_next_answer.swap(0, Ordering::SeqCst) == 1 {
            return Err(Error::outcome_unknown(
                "commit_step_and_claim_next",
                std::io::Error::other("injected lost answer"),
            ));
        }
        Ok(Handover { receipt, next })
    }
}

/// Per run: how often its step was called, and what its finishing
/// `commit_step` answered (`Ok` = committed as far as the host knows).
#[derive(Clone, Default)]
struct Log {
    steps: Arc<Mutex<HashMap<String, u32>>>,
    commits: Arc<Mutex<HashMap<String, Result<(), String>>>>,
    /// Steps running right now, and the most at once.
    inside: Arc<AtomicUsize>,
    peak_inside: Arc<AtomicUsize>,
}

impl Log {
    fn steps(&self) -> HashMap<String, u32> {
        self.steps.lock().unwrap().clone()
    }
    fn commits(&self) -> HashMap<String, Result<(), String>> {
        self.commits.lock().unwrap().clone()
    }
}

/// Drains `store` with a step that (after `before`) commits the run's last
/// step with its finish, then waits `after`; stops the drain if it is
/// called more than `limit` times (a livelock fails instead of hanging).
async fn drain_finishing(
    store: Arc<dyn RunStore>,
    options: WorkerOptions,
    before: Duration,
    after: Duration,
    limit: u32,
) -> (DrainReport, Log) {
    let worker = Worker::new(store, tenant(), options).unwrap();
    let log = Log::default();
    let shutdown = CancellationToken::new();
    let (l, stop) = (log.clone(), shutdown.clone());
    let report = tokio::time::timeout(
        ms(120_000),
        worker.drain(shutdown, move |h, _resume| {
            let (l, stop) = (l.clone(), stop.clone());
            async move {
                let id = h.scope().run_id.to_string();
                let called = {
                    let mut steps = l.steps.lock().unwrap();
                    let n = steps.entry(id.clone()).or_default();
                    *n += 1;
                    steps.values().sum::<u32>()
                };
                if called > limit {
                    stop.cancel();
                }
                let inside = l.inside.fetch_add(1, Ordering::SeqCst) + 1;
                l.peak_inside.fetch_max(inside, Ordering::SeqCst);
                sleep(before).await;
                let committed = h.commit_step(&last_step(&id)).await;
                l.commits.lock().unwrap().insert(
                    id,
                    committed
                        .as_ref()
                        .map(|_| ())
                        .map_err(|e: &WorkerError| e.to_string()),
                );
                sleep(after).await;
                l.inside.fetch_sub(1, Ordering::SeqCst);
                committed?;
                Ok::<_, WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .expect("the drain stops on an empty queue");
    (report, log)
}

/// A counting store on a fresh clock with `n` runs queued: the clock, the
/// store (as itself and as a `RunStore`) and the runs' ids.
async fn queued(
    n: usize,
) -> (
    Arc<TokioClock>,
    Arc<Intercepted<Counting>>,
    Arc<dyn RunStore>,
    Vec<String>,
) {
    let clock = clock();
    let counting = Arc::new(Intercepted(Counting::on(&clock)));
    let store: Arc<dyn RunStore> = counting.clone();
    let all = ids(n);
    enqueue(&*store, &all, clock.now()).await;
    (clock, counting, store, all)
}

async fn assert_all_completed(store: &Counting, ids: &[String]) {
    for id in ids {
        let life = store.lifecycle(&run(id)).await.unwrap();
        assert_eq!(life.status, RunStatus::Completed, "{id}: {life:?}");
        assert_eq!(life.result, Some(json!({"run": id})), "{id}");
    }
}

/// With one slot, each finished run hands over to the next in the same
/// call: `claim_next` is called once to start and once when the queue ran
/// dry, and every run is stepped and finished exactly once.
#[tokio::test(start_paused = true)]
async fn a_busy_drain_hands_over_from_each_finished_run_to_the_next_in_one_call() {
    let (clock, counting, store, first) = queued(6).await;

    let (report, log) = drain_finishing(store.clone(), options("w-a", 1), ms(10), ms(0), 20).await;
    assert_eq!(report.stopped, DrainStop::Idle, "{report:?}");
    // claim_next took one run, the first; every run's finish was a
    // hand-over, and all but the last took the next run. claim_next found
    // the queue dry twice: once while the last run's slot task was still
    // being joined (the drain does not call itself idle with a run in
    // flight), once after. (The old drain: 6 calls that took a run, and
    // 6 plain commits.)
    assert_eq!(
        counting.counts(),
        (3, 1, 6, 0),
        "(claim_next, claim_next that took a run, hand-overs, commit_step)"
    );
    assert_eq!(
        (report.claimed, report.handed_over, report.completed),
        (6, 5, 6),
        "{report:?}"
    );
    assert_eq!(
        (report.failed, report.fenced_out, report.claim_errors),
        (0, 0, 0)
    );
    assert_eq!(
        (
            report.released,
            report.release_superseded,
            report.release_failed
        ),
        (0, 0, 0),
        "{report:?}"
    );
    assert_eq!(report.passes, 1);
    let steps = log.steps();
    assert_eq!(steps.len(), 6, "{steps:?}");
    assert!(
        steps.values().all(|&n| n == 1),
        "each run stepped once: {steps:?}"
    );
    assert!(
        log.commits().values().all(Result::is_ok),
        "{:?}",
        log.commits()
    );
    counting.seen(|s| {
        assert_eq!(s.finished.len(), 6);
        assert!(
            s.finished.values().all(|&n| n == 1),
            "finished once: {:?}",
            s.finished
        );
        assert!(s.held.is_empty(), "nothing left held: {:?}", s.held);
        assert_eq!(s.peak_held, 1, "one run held at a time");
    });
    assert_all_completed(&counting, &first).await;

    // The queue ran dry; more work arrives: one claim_next starts the next
    // chain, one more finds the queue dry again.
    let second: Vec<String> = (7..=10).map(|i| format!("run_{i:02}")).collect();
    enqueue(&*store, &second, clock.now()).await;
    let (report, log) = drain_finishing(store.clone(), options("w-a", 1), ms(10), ms(0), 20).await;
    assert_eq!(counting.counts(), (6, 2, 10, 0));
    assert_eq!(
        (report.claimed, report.handed_over, report.completed),
        (4, 3, 4)
    );
    assert!(log.steps().values().all(|&n| n == 1));
    assert_all_completed(&counting, &second).await;
    counting.seen(|s| assert!(s.finished.values().all(|&n| n == 1)));
}

/// `handover: false`: every claim is the drain's own `claim_next`, and a
/// finishing step is a plain `commit_step`.
#[tokio::test(start_paused = true)]
async fn with_the_hand_over_off_every_claim_is_the_drains_own() {
    let (_, counting, store, all) = queued(4).await;
    let mut o = options("w-a", 1);
    o.handover = false;
    let (report, log) = drain_finishing(store.clone(), o, ms(10), ms(0), 20).await;
    assert_eq!(
        counting.counts(),
        (6, 4, 0, 4),
        "(claim_next, claim_next that took a run, hand-overs, commit_step)"
    );
    assert_eq!(
        (report.claimed, report.handed_over, report.completed),
        (4, 0, 4)
    );
    assert!(log.steps().values().all(|&n| n == 1));
    assert_all_completed(&counting, &all).await;
}

/// A hand-over whose claim fails after its step committed (retryable or
/// not): the host is told the step committed, the run is finished, and the
/// drain claims the remaining runs itself.
#[tokio::test(start_paused = true)]
async fn a_hand_over_whose_claim_fails_keeps_its_step_and_the_drain_claims_the_rest_itself() {
    let (_, counting, store, all) = queued(5).await;
    // The first hand-over's claim fails retryably, the second's for good.
    *counting.fail_next_claims.lock().unwrap() = vec![
        Error::backend("claim_next", std::io::Error::other("injected failure")),
        Error::unavailable("claim_next", std::io::Error::other("injected outage")),
    ];
    let (report, log) = drain_finishing(store.clone(), options("w-a", 1), ms(10), ms(0), 20).await;
    assert_eq!(report.stopped, DrainStop::Idle, "{report:?}");
    // claim_next took the first run and one after each failed hand-over
    // claim (and found the queue dry twice at the end).
    assert_eq!(
        counting.counts(),
        (5, 3, 5, 0),
        "(claim_next, claim_next that took a run, hand-overs, commit_step)"
    );
    assert_eq!(
        (report.claimed, report.handed_over, report.completed),
        (5, 2, 5),
        "{report:?}"
    );
    assert_eq!((report.claim_errors, report.failed), (2, 0), "{report:?}");
    let commits = log.commits();
    assert_eq!(commits.len(), 5);
    assert!(
        commits.values().all(Result::is_ok),
        "every step reported committed: {commits:?}"
    );
    assert!(log.steps().values().all(|&n| n == 1), "{:?}", log.steps());
    counting.seen(|s| {
        assert!(s.finished.values().all(|&n| n == 1), "{:?}", s.finished);
        assert!(s.held.is_empty(), "{:?}", s.held);
    });
    assert_all_completed(&counting, &all).await;
}

/// Two slots and slow steps that linger after their finishing commit: a
/// handed-over run waits for its slot, so neither the runs held (as the
/// store's answers tell) nor the steps running ever exceed two.
#[tokio::test(start_paused = true)]
async fn hand_overs_never_hold_or_step_more_runs_than_the_concurrency() {
    let (_, counting, store, all) = queued(9).await;
    let (report, log) =
        drain_finishing(store.clone(), options("w-a", 2), ms(100), ms(50), 30).await;
    assert_eq!(report.stopped, DrainStop::Idle, "{report:?}");
    assert_eq!(
        log.peak_inside.load(Ordering::SeqCst),
        2,
        "two steps at a time, never more"
    );
    counting.seen(|s| {
        assert_eq!(s.peak_held, 2, "two runs held at a time, never more");
        assert!(s.held.is_empty(), "{:?}", s.held);
        assert!(s.finished.values().all(|&n| n == 1), "{:?}", s.finished);
    });
    assert_eq!((report.claimed, report.completed), (9, 9), "{report:?}");
    assert!(
        report.handed_over >= 6,
        "most runs came by hand-over: {report:?}"
    );
    let (_, took, handovers, plain) = counting.counts();
    assert_eq!((handovers, plain), (9, 0));
    assert_eq!(took + report.handed_over, 9, "{report:?}");
    assert!(log.steps().values().all(|&n| n == 1));
    assert_all_completed(&counting, &all).await;
}

/// A hand-over whose answer is lost: the step is resolved by reading back
/// (landed, not repeated), and the run the lost answer claimed is not
/// recovered: it stays held until its lease expires, then is taken again.
#[tokio::test(start_paused = true)]
async fn a_lost_hand_over_answer_is_read_back_and_its_claimed_run_waits_out_its_lease() {
    let (clock, counting, store, all) = queued(3).await;
    counting.lose_next_answer.store(1, Ordering::SeqCst);
    let (report, log) = drain_finishing(store.clone(), options("w-a", 1), ms(10), ms(0), 20).await;
    // run_01's hand-over took run_02 and lost the answer: run_01 is read
    // back as finished; run_02 was never seen by the drain.
    let commits = log.commits();
    assert_eq!(commits.get("run_01"), Some(&Ok(())), "{commits:?}");
    assert_eq!(
        (report.claimed, report.handed_over, report.completed),
        (2, 0, 2),
        "{report:?}"
    );
    assert!(!log.steps().contains_key("run_02"), "{:?}", log.steps());
    counting.seen(|s| assert!(s.finished.values().all(|&n| n == 1), "not repeated"));
    let top = store
        .lease(&run("run_02"), clock.now())
        .await
        .unwrap()
        .unwrap();
    assert!(!top.expired && top.holder == "w-a", "still held: {top:?}");
    assert_eq!(
        store.lifecycle(&run("run_02")).await.unwrap().status,
        RunStatus::Active
    );
    // Once its lease ran out, it is claimable again and finished.
    sleep(ms(TTL_MS + 1)).await;
    let (report, _) = drain_finishing(store.clone(), options("w-b", 1), ms(10), ms(0), 5).await;
    assert_eq!((report.claimed, report.completed), (1, 1), "{report:?}");
    assert_all_completed(&counting, &all).await;
}

/// Shutdown requested right after a hand-over: the run it took is released
/// at once, unstepped.
#[tokio::test(start_paused = true)]
async fn a_run_handed_over_as_shutdown_begins_is_released_unstepped() {
    let (clock, counting, store, _) = queued(2).await;
    let mut o = options("w-a", 1);
    o.mode = DrainMode::Continuous;
    let worker = Worker::new(store.clone(), tenant(), o).unwrap();
    let shutdown = CancellationToken::new();
    let stepped: Arc<Mutex<Vec<String>>> = Arc::default();
    let (st, stop) = (stepped.clone(), shutdown.clone());
    let report = tokio::time::timeout(
        ms(60_000),
        worker.drain(shutdown, move |h, _| {
            let (st, stop) = (st.clone(), stop.clone());
            async move {
                let id = h.scope().run_id.to_string();
                st.lock().unwrap().push(id.clone());
                h.commit_step(&last_step(&id)).await?;
                stop.cancel();
                Ok::<_, WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .expect("the drain stops");
    assert_eq!(report.stopped, DrainStop::Shutdown);
    assert_eq!(*stepped.lock().unwrap(), vec!["run_01".to_string()]);
    assert_eq!(
        (
            report.claimed,
            report.handed_over,
            report.completed,
            report.released
        ),
        (2, 1, 1, 1),
        "{report:?}"
    );
    let top = store
        .lease(&run("run_02"), clock.now())
        .await
        .unwrap()
        .unwrap();
    assert!(top.expired && top.holder.is_empty(), "released: {top:?}");
    assert_eq!(counting.counts(), (1, 1, 1, 0));
}

/// A handle the host took itself (not from a drain) commits its finishing
/// step with a plain `commit_step`: no hand-over.
#[tokio::test(start_paused = true)]
async fn a_handle_outside_a_drain_never_hands_over() {
    let (clock, counting, store, _) = queued(2).await;
    let keeper = LeaseKeeper::claim(
        store.clone(),
        run("run_01"),
        Holder::new("w-a").unwrap(),
        ttl(),
        Default::default(),
    )
    .await
    .unwrap()
    .expect("claimed");
    let h = keeper.handle();
    h.commit_step(&last_step("run_01")).await.unwrap();
    assert_eq!(counting.counts(), (0, 0, 0, 1));
    let top = store.lease(&run("run_02"), clock.now()).await.unwrap();
    assert!(top.is_none(), "nothing else was claimed: {top:?}");
}

/// A step that goes on after its finishing commit does not keep the run it
/// was handed: after `handover_wait` that run is given back (released
/// unstepped, claimable at once by anyone) while the step still runs, and
/// the drain takes it again with its own `claim_next` once the step ends.
#[tokio::test(start_paused = true)]
async fn a_step_going_on_after_its_finish_gives_the_run_handed_over_back_after_the_wait() {
    let (clock, counting, store, all) = queued(2).await;
    let mut o = options("w-a", 1);
    o.handover_wait = ms(300);
    let worker = Worker::new(store.clone(), tenant(), o).unwrap();
    let stepped: Arc<Mutex<Vec<String>>> = Arc::default();
    // The first run's step goes on after its finish until this is cancelled.
    let go_on = CancellationToken::new();
    let (st, hold) = (stepped.clone(), go_on.clone());
    let drain = tokio::spawn(async move {
        worker
            .drain(CancellationToken::new(), move |h, _| {
                let (st, hold) = (st.clone(), hold.clone());
                async move {
                    let id = h.scope().run_id.to_string();
                    st.lock().unwrap().push(id.clone());
                    h.commit_step(&last_step(&id)).await?;
                    if id == "run_01" {
                        hold.cancelled().await;
                    }
                    Ok::<_, WorkerError>(StepOutcome::Finished)
                }
            })
            .await
    });
    let next = run("run_02");
    // Within the wait: run_02 was handed over and is held by the drain.
    sleep(ms(200)).await;
    let top = store.lease(&next, clock.now()).await.unwrap().unwrap();
    assert!(
        !top.expired && top.holder == "w-a",
        "handed over and held: {top:?}"
    );
    // Past it, with run_01's step still going on: given back.
    sleep(ms(200)).await;
    assert_eq!(*stepped.lock().unwrap(), vec!["run_01".to_string()]);
    let top = store.lease(&next, clock.now()).await.unwrap().unwrap();
    assert!(
        top.expired && top.holder.is_empty(),
        "given back while the step that finished run_01 still runs: {top:?}"
    );
    // Claimable at once by another worker (who gives it back again).
    let other = ClaimOptions::new(Holder::new("w-b").unwrap(), ttl());
    let lease = match store.claim(&next, &other).await.unwrap() {
        runkeep::ClaimOutcome::Acquired(l) => l,
        refused => panic!("another worker could not take the run given back: {refused:?}"),
    };
    assert!(store.release(&next, lease.fence).await.unwrap());
    // The step ends; the drain claims run_02 itself and steps it once.
    go_on.cancel();
    let report = tokio::time::timeout(ms(60_000), drain)
        .await
        .expect("the drain stops")
        .unwrap();
    assert_eq!(report.stopped, DrainStop::Idle);
    assert_eq!(
        *stepped.lock().unwrap(),
        vec!["run_01".to_string(), "run_02".to_string()]
    );
    assert_eq!(
        (
            report.claimed,
            report.handed_over,
            report.completed,
            report.released
        ),
        (3, 1, 2, 1),
        "{report:?}"
    );
    assert_all_completed(&counting, &all).await;
}

#[test]
fn a_zero_handover_wait_is_refused_with_what_to_do_instead() {
    let mut o = options("w-a", 1);
    o.handover_wait = Duration::ZERO;
    let e = o.validate().expect_err("0 is refused");
    assert!(e.to_string().contains("handover to false"), "{e}");
}
