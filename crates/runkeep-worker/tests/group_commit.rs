//! The drain's group commit (`WorkerOptions::commit_batch`): the finishing
//! steps of runs held side by side go to the store in one `commit_steps`
//! call, each with its run's current fence and its own outcome. Against
//! the reference model (`MemoryStore`) behind a wrapper that records, and
//! where a test says so disturbs, the commit calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimOptions, ClaimOutcome, Error, EvidenceStore,
    Fence, Holder, ListingScope, MemoryStore, Outcome, RunScope, RunStatus, RunStore, Step,
    StepCommit, StepReceipt, Ttl,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_worker::{DrainMode, DrainStop, StepOutcome, Worker, WorkerOptions};
use serde_json::json;
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

fn run(id: &str) -> RunScope {
    RunScope::new(
        "tnt_g".parse().unwrap(),
        "prj_g".parse().unwrap(),
        "ses_g".parse().unwrap(),
        id.parse().unwrap(),
    )
}

fn tenant() -> ListingScope {
    ListingScope::tenant("tnt_g".parse().unwrap())
}

/// How the wrapper disturbs a group commit.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Disturb {
    #[default]
    Nothing,
    /// Before the group reaches the store, another holder takes `run_02`
    /// (released, then claimed): its step's fence is stale.
    StealRun2,
    /// The first group fails as a whole, with nothing written.
    FailFirstGroup,
    /// The first group is written, but its answer is lost.
    LoseFirstAnswer,
}

/// The commit calls a drain made: each group's runs, and the single
/// `commit_step` calls.
#[derive(Debug, Default)]
struct Recording {
    inner: MemoryStore,
    groups: Mutex<Vec<Vec<String>>>,
    singles: AtomicU32,
    disturb: Disturb,
}

#[async_trait]
impl Intercept for Recording {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> runkeep::Result<StepReceipt> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        self.inner.commit_step(scope, fence, step).await
    }
    async fn commit_steps(
        &self,
        steps: &[StepCommit],
    ) -> runkeep::Result<Vec<runkeep::Result<StepReceipt>>> {
        let first = {
            let mut g = self.groups.lock().unwrap();
            g.push(steps.iter().map(|s| s.scope.run_id.to_string()).collect());
            g.len() == 1
        };
        match self.disturb {
            Disturb::StealRun2 => {
                if let Some(s) = steps.iter().find(|s| s.scope == run("run_02")) {
                    assert!(self.inner.release(&s.scope, s.fence).await.unwrap());
                    let thief = ClaimOptions::new(
                        Holder::new("thief").unwrap(),
                        Ttl::from_millis(60_000).unwrap(),
                    );
                    let taken = self.inner.claim(&s.scope, &thief).await.unwrap();
                    assert!(matches!(taken, ClaimOutcome::Acquired(_)), "{taken:?}");
                }
            }
            Disturb::FailFirstGroup if first => {
                return Err(Error::unavailable(
                    "the store is briefly unreachable (test)",
                    "test",
                ));
            }
            Disturb::LoseFirstAnswer if first => {
                self.inner.commit_steps(steps).await?;
                return Err(Error::outcome_unknown(
                    "the group's answer was lost (test)",
                    "test",
                ));
            }
            _ => {}
        }
        self.inner.commit_steps(steps).await
    }
}

async fn store_with(n: usize, disturb: Disturb) -> Arc<Intercepted<Recording>> {
    let store = Arc::new(Intercepted(Recording {
        disturb,
        ..Recording::default()
    }));
    for i in 1..=n {
        let cp = Checkpoint::new(
            CheckpointId::new("cp_0").unwrap(),
            store.now(),
            json!({"n": i}).as_object().cloned().unwrap(),
        );
        store
            .enqueue(
                &run(&format!("run_{i:02}")),
                &cp,
                &runkeep::EnqueueOptions::default(),
            )
            .await
            .unwrap();
    }
    store
}

fn options(slots: usize, commit_batch: usize, linger_ms: u64) -> WorkerOptions {
    let mut o = WorkerOptions::new(
        Holder::new("grouper").unwrap(),
        Ttl::from_millis(30_000).unwrap(),
    );
    o.concurrency = slots;
    o.claim_batch = slots;
    o.commit_batch = commit_batch;
    o.commit_linger = Duration::from_millis(linger_ms);
    o.mode = DrainMode::UntilIdle;
    o
}

/// The finishing step every test's handler commits: an event, a
/// checkpoint and the finish with the run's id as result.
fn finishing(scope: &RunScope) -> Step {
    Step {
        events: vec![runkeep::NewEvent::new(
            "done",
            json!({}).as_object().cloned().unwrap(),
        )],
        checkpoint: Some(Checkpoint::new(
            CheckpointId::new("cp_1").unwrap(),
            runkeep::Timestamp::from_millis(1).unwrap(),
            json!({"done": true}).as_object().cloned().unwrap(),
        )),
        finish: Some(Outcome::completed(Some(json!(scope.run_id.to_string())))),
        ..Step::default()
    }
}

/// What each run's handler saw its finishing commit answer: `Ok(())` or
/// the error's text.
type Answers = Arc<Mutex<HashMap<String, Result<(), String>>>>;

/// Drains with `opts`: each of the first `together` runs waits for the
/// others at a barrier, then commits its finishing step (after `pause`).
async fn drain(
    store: Arc<Intercepted<Recording>>,
    opts: WorkerOptions,
    together: usize,
    pause: Duration,
) -> (runkeep_worker::DrainReport, Answers) {
    let worker = Worker::new(store, tenant(), opts).unwrap();
    let barrier = Arc::new(Barrier::new(together));
    let seen = Arc::new(AtomicU32::new(0));
    let answers: Answers = Arc::default();
    let a = answers.clone();
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        worker.drain(CancellationToken::new(), move |h, _| {
            let (barrier, seen, a) = (barrier.clone(), seen.clone(), a.clone());
            async move {
                if (seen.fetch_add(1, Ordering::SeqCst) as usize) < together {
                    barrier.wait().await;
                }
                tokio::time::sleep(pause).await;
                let answer = h.commit_step(&finishing(h.scope())).await;
                a.lock().unwrap().insert(
                    h.scope().run_id.to_string(),
                    answer.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                );
                answer?;
                Ok::<_, runkeep_worker::WorkerError>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .expect("the drain ends");
    (report, answers)
}

async fn status(store: &Intercepted<Recording>, id: &str) -> RunStatus {
    store.lifecycle(&run(id)).await.unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishing_steps_of_runs_held_side_by_side_go_in_one_call() {
    let store = store_with(8, Disturb::Nothing).await;
    let (report, answers) = drain(store.clone(), options(4, 4, 300), 4, Duration::ZERO).await;
    assert_eq!(report.stopped, DrainStop::Idle, "{report:?}");
    let groups = store.groups.lock().unwrap().clone();
    assert_eq!(
        groups.first().map(Vec::len),
        Some(4),
        "the four runs that met at the barrier finish in one call: {groups:?}"
    );
    let grouped: usize = groups.iter().map(Vec::len).sum();
    let singles = store.singles.load(Ordering::SeqCst) as usize;
    assert_eq!(grouped + singles, 8, "{groups:?}, {singles} single");
    assert!(
        groups.len() + singles < 8,
        "fewer calls than runs: {groups:?}"
    );
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers.len(), 8);
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    for i in 1..=8 {
        let id = format!("run_{i:02}");
        let l = store.lifecycle(&run(&id)).await.unwrap();
        assert_eq!(l.status, RunStatus::Completed, "{id}");
        assert_eq!(l.result, Some(json!(id)), "{id}: its own result");
    }
    assert_eq!(report.completed, 8, "{report:?}");
    assert_eq!(report.handed_over, 0, "grouped finishes do not hand over");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_step_is_refused_alone_and_the_others_of_its_group_commit() {
    let store = store_with(3, Disturb::StealRun2).await;
    let (report, answers) = drain(store.clone(), options(3, 3, 300), 3, Duration::ZERO).await;
    let groups = store.groups.lock().unwrap().clone();
    assert_eq!(groups.len(), 1, "one group of the three: {groups:?}");
    assert_eq!(groups[0].len(), 3, "{groups:?}");
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers["run_01"], Ok(()), "{answers:?}");
    assert_eq!(answers["run_03"], Ok(()), "{answers:?}");
    assert!(answers["run_02"].is_err(), "{answers:?}");
    assert_eq!(status(&store, "run_01").await, RunStatus::Completed);
    assert_eq!(status(&store, "run_03").await, RunStatus::Completed);
    assert_eq!(status(&store, "run_02").await, RunStatus::Active);
    let lease = store
        .lease(&run("run_02"), store.now())
        .await
        .unwrap()
        .expect("held");
    assert_eq!(lease.holder, "thief", "the thief keeps run_02");
    assert_eq!(report.completed, 2, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_waiting_for_its_group_presents_the_fence_its_keeper_renewed_to() {
    // A 300 ms lease renews every ~100 ms: by the time the steps commit
    // (after 700 ms) every run's fence has moved on from the claim's.
    let store = store_with(3, Disturb::Nothing).await;
    let mut opts = options(3, 3, 50);
    opts.ttl = Ttl::from_millis(300).unwrap();
    let (report, answers) = drain(store.clone(), opts, 3, Duration::from_millis(700)).await;
    let answers = answers.lock().unwrap().clone();
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    for i in 1..=3 {
        let l = store.lifecycle(&run(&format!("run_{i:02}"))).await.unwrap();
        assert_eq!(l.status, RunStatus::Completed);
        assert!(
            l.finished_fence.is_some_and(|f| f.get() > 1),
            "the finish presented a renewed fence: {l:?}"
        );
    }
    assert_eq!(report.completed, 3, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_failing_as_a_whole_is_sent_again_step_by_step() {
    let store = store_with(3, Disturb::FailFirstGroup).await;
    let (report, answers) = drain(store.clone(), options(3, 3, 300), 3, Duration::ZERO).await;
    let answers = answers.lock().unwrap().clone();
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert_eq!(store.singles.load(Ordering::SeqCst), 3, "one by one");
    for i in 1..=3 {
        assert_eq!(
            status(&store, &format!("run_{i:02}")).await,
            RunStatus::Completed
        );
    }
    assert_eq!(report.completed, 3, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_answer_was_lost_is_read_back_run_by_run_not_repeated() {
    let store = store_with(3, Disturb::LoseFirstAnswer).await;
    let (report, answers) = drain(store.clone(), options(3, 3, 300), 3, Duration::ZERO).await;
    let answers = answers.lock().unwrap().clone();
    assert!(answers.values().all(Result::is_ok), "{answers:?}");
    assert_eq!(
        store.singles.load(Ordering::SeqCst),
        0,
        "a step that may have landed is not sent again"
    );
    for i in 1..=3 {
        let id = format!("run_{i:02}");
        assert_eq!(status(&store, &id).await, RunStatus::Completed);
        let events = store
            .read_events(&run(&id), &runkeep::ReadEventsOptions::default())
            .await
            .unwrap();
        assert_eq!(events.events.len(), 1, "{id}: the step landed once");
    }
    assert_eq!(report.completed, 3, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_returning_finished_joins_the_group_with_its_own_finish() {
    let store = store_with(4, Disturb::Nothing).await;
    let worker = Worker::new(store.clone(), tenant(), options(4, 4, 300)).unwrap();
    let barrier = Arc::new(Barrier::new(4));
    let report = worker
        .drain(CancellationToken::new(), move |_, _| {
            let b = barrier.clone();
            async move {
                b.wait().await;
                Ok::<_, std::io::Error>(StepOutcome::Finished)
            }
        })
        .await;
    let groups = store.groups.lock().unwrap().clone();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].len(), 4, "{groups:?}");
    assert_eq!(report.completed, 4, "{report:?}");
    for i in 1..=4 {
        assert_eq!(
            status(&store, &format!("run_{i:02}")).await,
            RunStatus::Completed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_batch_of_one_sends_no_group() {
    let store = store_with(4, Disturb::Nothing).await;
    let (report, answers) = drain(store.clone(), options(4, 1, 0), 4, Duration::ZERO).await;
    assert!(store.groups.lock().unwrap().is_empty());
    assert!(answers.lock().unwrap().values().all(Result::is_ok));
    assert_eq!(report.completed, 4, "{report:?}");
}

#[test]
fn bad_group_settings_are_refused() {
    for batch in [0, runkeep::batch::MAX_BATCH + 1] {
        let e = options(4, batch, 0).validate().unwrap_err().to_string();
        assert!(e.contains("commit_batch"), "{e}");
    }
    let e = options(4, 4, 1_500).validate().unwrap_err().to_string();
    assert!(e.contains("commit_linger"), "{e}");
    assert!(options(4, 4, 1_000).validate().is_ok());
}
