//! What the runtime does when a step fails, runs too long, or an operator
//! steps in (issue: failures a fleet meets on its first day): a step that
//! raises is a failed attempt, retried after the run's backoff and
//! dead-lettered at its limit; an attempt past its timeout is stopped and
//! counted; a cancel or a release under a running step stops that step
//! within one renewal interval and no later write of it lands.
//!
//! On tokio's paused clock, with the store judging time by the same clock,
//! so backoffs and renewal intervals pass deterministically.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runkeep::lifecycle::ATTEMPTS_EXHAUSTED;
use runkeep::Clock as _;
use runkeep::{
    Checkpoint, CheckpointId, EnqueueOptions, Holder, ListingScope, MemoryStore, RetryPolicy,
    RunScope, RunStatus, RunStore, Timestamp, Ttl,
};
use runkeep_worker::{
    DrainMode, KeeperOptions, LeaseKeeper, LeaseLoss, StepOutcome, TokioClock, Worker,
    WorkerOptions,
};
use serde_json::Map;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

const TTL_MS: u64 = 3_000;

fn ttl() -> Ttl {
    Ttl::from_millis(TTL_MS).unwrap()
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

fn setup() -> (Arc<TokioClock>, Arc<dyn RunStore>) {
    let clock = Arc::new(TokioClock::new(
        Timestamp::from_millis(1_000_000_000).unwrap(),
    ));
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::with_clock(clock.clone()));
    (clock, store)
}

async fn enqueue(store: &Arc<dyn RunStore>, id: &str, max_attempts: u32, at: Timestamp) {
    let cp = Checkpoint::new(CheckpointId::new("cp_0").unwrap(), at, Map::new());
    store
        .enqueue(
            &run(id),
            &cp,
            &EnqueueOptions {
                max_attempts: Some(max_attempts),
                retry: Some(RetryPolicy {
                    base_ms: 1_000,
                    factor: 2.0,
                    cap_ms: 8_000,
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

fn options(who: &str, mode: DrainMode) -> WorkerOptions {
    let mut o = WorkerOptions::new(Holder::new(who).unwrap(), ttl());
    o.mode = mode;
    o.shutdown_grace = Duration::from_millis(200);
    o
}

/// A run whose step raises every time ends dead-lettered after exactly its
/// limit of attempts, with every error kept and nothing committed; a run
/// whose step raises once then succeeds completes with one failure on
/// record. The drain waits out each backoff on its own (not a hot loop).
#[tokio::test(start_paused = true)]
async fn a_step_that_raises_is_retried_with_backoff_and_dead_lettered_at_its_limit() {
    let (clock, store) = setup();
    enqueue(&store, "run_poison", 3, clock.now()).await;
    enqueue(&store, "run_flaky", 3, clock.now()).await;
    let calls: Arc<Mutex<Vec<(String, Timestamp)>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let worker = Worker::new(store.clone(), tenant(), options("w", DrainMode::Continuous)).unwrap();
    let (c, clk) = (calls.clone(), clock.clone());
    let drain = worker.drain(shutdown.clone(), move |h, _| {
        let id = h.scope().run_id.to_string();
        let n = {
            let mut c = c.lock().unwrap();
            c.push((id.clone(), clk.now()));
            c.iter().filter(|(r, _)| *r == id).count()
        };
        async move {
            if id == "run_poison" || n == 1 {
                return Err::<StepOutcome, _>(format!("{id} raised on call {n}"));
            }
            Ok(StepOutcome::Finished)
        }
    });
    // Backoffs of the poison run: < 1 s, < 2 s; give the drain a minute.
    let stop = async {
        sleep(Duration::from_secs(60)).await;
        shutdown.cancel();
    };
    let (report, ()) = tokio::join!(drain, stop);
    let poison = store.lifecycle(&run("run_poison")).await.unwrap();
    assert!(poison.is_dead_lettered(), "{poison:?}");
    assert_eq!(poison.reason.as_deref(), Some(ATTEMPTS_EXHAUSTED));
    assert_eq!(poison.attempts, 3, "exactly the limit: {poison:?}");
    let errors: Vec<_> = poison
        .failures
        .iter()
        .map(|f| f.error.message.clone())
        .collect();
    assert_eq!(
        errors,
        [
            "run_poison raised on call 1",
            "run_poison raised on call 2",
            "run_poison raised on call 3"
        ]
    );
    let calls = calls.lock().unwrap().clone();
    let poison_calls: Vec<_> = calls.iter().filter(|(r, _)| r == "run_poison").collect();
    assert_eq!(poison_calls.len(), 3, "stepped exactly 3 times: {calls:?}");
    // Each retry waited its backoff: attempt n's retry is at least half of
    // base × 2^(n-1) after the failure (equal jitter).
    for (n, pair) in poison_calls.windows(2).enumerate() {
        let gap = pair[1].1.as_millis() - pair[0].1.as_millis();
        let half = 500 * (1 << n);
        assert!(
            gap >= half,
            "retry {} came {gap} ms after the failure, before its backoff",
            n + 1
        );
    }
    let flaky = store.lifecycle(&run("run_flaky")).await.unwrap();
    assert_eq!(flaky.status, RunStatus::Completed, "{flaky:?}");
    assert_eq!(flaky.failures.len(), 1, "one failed attempt on record");
    assert_eq!(flaky.attempts, 1);
    assert_eq!(
        (report.failed, report.dead_lettered, report.completed),
        (4, 1, 1),
        "{report:?}"
    );
}

/// A step running past the attempt timeout is stopped and its attempt
/// reported failed with kind `timeout`.
#[tokio::test(start_paused = true)]
async fn a_step_past_the_attempt_timeout_is_stopped_and_counted() {
    let (clock, store) = setup();
    enqueue(&store, "run_slow", 5, clock.now()).await;
    let mut o = options("w", DrainMode::UntilIdle);
    o.attempt_timeout = Some(Duration::from_secs(2));
    let worker = Worker::new(store.clone(), tenant(), o).unwrap();
    let report = worker
        .drain(CancellationToken::new(), move |_h, _| async move {
            sleep(Duration::from_secs(60)).await;
            Ok::<_, String>(StepOutcome::Finished)
        })
        .await;
    assert_eq!((report.failed, report.timed_out), (1, 1), "{report:?}");
    let l = store.lifecycle(&run("run_slow")).await.unwrap();
    assert_eq!(l.attempts, 1);
    assert_eq!(l.failures[0].error.kind, "timeout", "{l:?}");
    assert_eq!(l.status, RunStatus::Active);
}

/// Holds `id` with a keeper and starts a step that would run for a minute,
/// writing every 100 ms when `writes` (else only waiting); answers the keeper, when the step stopped, and the
/// number of writes the store accepted.
struct LongStep {
    keeper: LeaseKeeper,
    stopped: Arc<Mutex<Option<Instant>>>,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

async fn long_step(store: &Arc<dyn RunStore>, id: &str, writes: bool) -> LongStep {
    let keeper = LeaseKeeper::claim(
        store.clone(),
        run(id),
        Holder::new("w-long").unwrap(),
        ttl(),
        KeeperOptions::default(),
    )
    .await
    .unwrap()
    .expect("claimed");
    let handle = keeper.handle();
    let token = keeper.cancellation_token();
    let (stopped, accepted) = (Arc::new(Mutex::new(None)), Arc::new(AtomicU64::new(0)));
    let (s, a) = (stopped.clone(), accepted.clone());
    let task = tokio::spawn(async move {
        let work = async {
            for n in 0..600u64 {
                let mut p = Map::new();
                p.insert("n".into(), n.into());
                if writes
                    && handle
                        .append_events(&[runkeep::NewEvent::new("tick", p)])
                        .await
                        .is_ok()
                {
                    a.fetch_add(1, Ordering::SeqCst);
                }
                sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            _ = token.cancelled() => { *s.lock().unwrap() = Some(Instant::now()); }
            _ = work => {}
        }
    });
    LongStep {
        keeper,
        stopped,
        accepted,
        task,
    }
}

/// An operator's cancel of a run being worked stops its step (the
/// cancellation signal fires) within one renewal interval, says why, and
/// no write of that step lands afterwards.
#[tokio::test(start_paused = true)]
async fn a_cancel_stops_the_running_step_within_one_renewal_interval() {
    let (clock, store) = setup();
    enqueue(&store, "run_c", 5, clock.now()).await;
    let step = long_step(&store, "run_c", true).await;
    sleep(Duration::from_millis(1_500)).await;
    let cancelled_at = Instant::now();
    store
        .cancel(&run("run_c"), Some("customer left"))
        .await
        .unwrap();
    let events_at_cancel = store
        .read_events(&run("run_c"), &Default::default())
        .await
        .unwrap()
        .events
        .len();
    step.task.await.unwrap();
    let stopped = step.stopped.lock().unwrap().expect("the step was stopped");
    let interval = KeeperOptions::default().renew_every(ttl());
    assert!(
        stopped - cancelled_at <= interval + Duration::from_millis(100),
        "stopped {:?} after the cancel; one renewal interval is {interval:?}",
        stopped - cancelled_at
    );
    assert!(
        matches!(step.keeper.handle().loss(), Some(LeaseLoss::Cancelled { reason: Some(ref r) }) if r == "customer left"),
        "{:?}",
        step.keeper.handle().loss()
    );
    let events = store
        .read_events(&run("run_c"), &Default::default())
        .await
        .unwrap()
        .events
        .len();
    assert_eq!(events, events_at_cancel, "a write landed after the cancel");
    assert!(step.accepted.load(Ordering::SeqCst) > 0);
    assert_eq!(
        store.lifecycle(&run("run_c")).await.unwrap().status,
        RunStatus::Cancelled
    );
}

/// A release sticks: an operator's release under a running worker makes
/// the keeper's next renewal a new claim with a gap in the fences; the
/// runtime takes it as a lost lease, stops the step, gives the new holding
/// back, and no write of that step lands after the release.
#[tokio::test(start_paused = true)]
async fn an_operator_release_under_a_running_worker_stops_its_step() {
    let (clock, store) = setup();
    enqueue(&store, "run_r", 5, clock.now()).await;
    let step = long_step(&store, "run_r", false).await;
    sleep(Duration::from_millis(1_500)).await;
    let fence = step.keeper.handle().fence();
    let released_at = Instant::now();
    assert!(store.release(&run("run_r"), fence).await.unwrap());
    let events_at_release = store
        .read_events(&run("run_r"), &Default::default())
        .await
        .unwrap()
        .events
        .len();
    step.task.await.unwrap();
    let stopped = step.stopped.lock().unwrap().expect("the step was stopped");
    let interval = KeeperOptions::default().renew_every(ttl());
    assert!(
        stopped - released_at <= interval + Duration::from_millis(100),
        "stopped {:?} after the release; one renewal interval is {interval:?}",
        stopped - released_at
    );
    match step.keeper.handle().loss() {
        Some(LeaseLoss::Gap { held, answered }) => {
            assert_eq!(held, fence);
            assert_eq!(
                answered.get(),
                fence.get() + 2,
                "the claim over the tombstone"
            );
        }
        other => panic!("the loss was {other:?}, not a gap"),
    }
    let events = store
        .read_events(&run("run_r"), &Default::default())
        .await
        .unwrap()
        .events
        .len();
    assert_eq!(
        events, events_at_release,
        "a write landed after the release"
    );
    assert!(
        step.keeper
            .handle()
            .append_events(&[runkeep::NewEvent::new("late", Map::new())])
            .await
            .is_err(),
        "the released worker's write was accepted"
    );
    // The holding the renewal took by mistake was given back: anyone can
    // claim the run at once.
    let lease = store
        .lease(&run("run_r"), clock.now())
        .await
        .unwrap()
        .unwrap();
    assert!(lease.holder.is_empty(), "{lease:?}");
}

/// A run's own attempt timeout (set on enqueue, carried by its lease) is
/// honoured with no timeout configured on the worker.
#[tokio::test(start_paused = true)]
async fn the_runs_own_attempt_timeout_stops_its_step() {
    let (clock, store) = setup();
    let cp = Checkpoint::new(CheckpointId::new("cp_0").unwrap(), clock.now(), Map::new());
    store
        .enqueue(
            &run("run_own"),
            &cp,
            &EnqueueOptions {
                attempt_timeout: Some(Ttl::from_millis(1_500).unwrap()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let worker = Worker::new(store.clone(), tenant(), options("w", DrainMode::UntilIdle)).unwrap();
    let started = Instant::now();
    let report = worker
        .drain(CancellationToken::new(), move |_h, _| async move {
            sleep(Duration::from_secs(60)).await;
            Ok::<_, String>(StepOutcome::Finished)
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the step ran its minute"
    );
    assert_eq!((report.failed, report.timed_out), (1, 1), "{report:?}");
    let l = store.lifecycle(&run("run_own")).await.unwrap();
    assert_eq!(l.failures[0].error.kind, "timeout", "{l:?}");
}

/// A cancel under a step that writes nothing is learnt from the renewal
/// alone (it answers the run finished as cancelled): the step is stopped
/// within one renewal interval, and the loss says cancelled with the
/// operator's reason, not a generic renewal failure.
#[tokio::test(start_paused = true)]
async fn a_cancel_is_learnt_from_the_renewal_when_the_step_writes_nothing() {
    let (clock, store) = setup();
    enqueue(&store, "run_quiet", 5, clock.now()).await;
    let step = long_step(&store, "run_quiet", false).await;
    sleep(Duration::from_millis(1_500)).await;
    let cancelled_at = Instant::now();
    store
        .cancel(&run("run_quiet"), Some("quiet"))
        .await
        .unwrap();
    step.task.await.unwrap();
    let stopped = step.stopped.lock().unwrap().expect("the step was stopped");
    let interval = KeeperOptions::default().renew_every(ttl());
    assert!(
        stopped - cancelled_at <= interval + Duration::from_millis(100),
        "stopped {:?} after the cancel; one renewal interval is {interval:?}",
        stopped - cancelled_at
    );
    match step.keeper.handle().loss() {
        Some(LeaseLoss::Cancelled { reason }) => assert_eq!(reason.as_deref(), Some("quiet")),
        other => panic!("the loss was {other:?}, not Cancelled"),
    }
}
