//! The drain's batched claim (`WorkerOptions::claim_batch`): with several
//! slots free, one `claim_next_batch` call fills them, each run started at
//! once in its own slot. Against the reference model (`MemoryStore`)
//! behind a wrapper that records the batch calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, Holder, Lease,
    ListingScope, MemoryStore, RunScope, RunStatus, RunStore, Ttl,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_worker::{DrainMode, DrainStop, StepOutcome, Worker, WorkerOptions};
use serde_json::json;
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

fn run(id: &str) -> RunScope {
    RunScope::new(
        "tnt_b".parse().unwrap(),
        "prj_b".parse().unwrap(),
        "ses_b".parse().unwrap(),
        id.parse().unwrap(),
    )
}

fn tenant() -> ListingScope {
    ListingScope::tenant("tnt_b".parse().unwrap())
}

/// The batch calls a drain made: (`max` asked, runs answered), in order,
/// and the single `claim_next` calls.
#[derive(Debug, Default)]
struct Recording {
    inner: MemoryStore,
    batches: Mutex<Vec<(usize, usize)>>,
    singles: Mutex<u32>,
}

#[async_trait]
impl Intercept for Recording {
    fn inner(&self) -> &dyn RunStore {
        &self.inner
    }
    async fn claim_next(
        &self,
        s: &ListingScope,
        f: &ClaimNextFilter,
        o: &ClaimOptions,
    ) -> runkeep::Result<Option<(RunScope, Lease)>> {
        *self.singles.lock().unwrap() += 1;
        self.inner.claim_next(s, f, o).await
    }
    async fn claim_next_batch(
        &self,
        s: &ListingScope,
        f: &ClaimNextFilter,
        o: &ClaimOptions,
        max: usize,
    ) -> runkeep::Result<Vec<(RunScope, Lease)>> {
        let got = self.inner.claim_next_batch(s, f, o, max).await?;
        self.batches.lock().unwrap().push((max, got.len()));
        Ok(got)
    }
}

async fn store_with(n: usize) -> Arc<Intercepted<Recording>> {
    let store = Arc::new(Intercepted(Recording::default()));
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

fn options(concurrency: usize, batch: usize) -> WorkerOptions {
    let mut o = WorkerOptions::new(
        Holder::new("batcher").unwrap(),
        Ttl::from_millis(30_000).unwrap(),
    );
    o.concurrency = concurrency;
    o.claim_batch = batch;
    o.mode = DrainMode::UntilIdle;
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_slots_are_filled_by_one_batch_and_every_run_is_worked_once() {
    let store = store_with(8).await;
    let worker = Worker::new(store.clone(), tenant(), options(4, 4)).unwrap();
    // The first four steps wait for each other: they can only all pass if
    // the four runs were started side by side.
    let barrier = Arc::new(Barrier::new(4));
    let worked: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let (b, w) = (barrier.clone(), worked.clone());
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        worker.drain(CancellationToken::new(), move |h, _| {
            let (b, w) = (b.clone(), w.clone());
            async move {
                let first_four = {
                    let mut w = w.lock().unwrap();
                    *w.entry(h.scope().run_id.to_string()).or_default() += 1;
                    w.len() <= 4
                };
                if first_four {
                    b.wait().await;
                }
                Ok::<_, std::io::Error>(StepOutcome::Finished)
            }
        }),
    )
    .await
    .expect("the drain ends");
    assert_eq!(report.stopped, DrainStop::Idle, "{report:?}");
    let worked = worked.lock().unwrap().clone();
    assert_eq!(worked.len(), 8, "{worked:?}");
    assert!(
        worked.values().all(|n| *n == 1),
        "a run worked twice: {worked:?}"
    );
    let batches = store.batches.lock().unwrap().clone();
    assert_eq!(
        batches.first(),
        Some(&(4, 4)),
        "the first claim fills the four free slots in one call: {batches:?}"
    );
    assert!(batches.iter().all(|(max, _)| *max <= 4), "{batches:?}");
    for i in 1..=8 {
        let l = store.lifecycle(&run(&format!("run_{i:02}"))).await.unwrap();
        assert_eq!(l.status, RunStatus::Completed);
    }
    assert_eq!(report.claimed, 8, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_one_claims_one_run_a_call_as_before() {
    let store = store_with(3).await;
    let worker = Worker::new(store.clone(), tenant(), options(4, 1)).unwrap();
    let report = worker
        .drain(CancellationToken::new(), |_, _| async {
            Ok::<_, std::io::Error>(StepOutcome::Finished)
        })
        .await;
    assert_eq!(report.stopped, DrainStop::Idle);
    assert_eq!(report.claimed, 3);
    assert!(store.batches.lock().unwrap().is_empty());
    assert!(*store.singles.lock().unwrap() >= 3);
}

#[test]
fn a_batch_of_zero_or_above_the_limit_is_refused() {
    for batch in [0, runkeep::batch::MAX_BATCH + 1] {
        let e = options(4, batch).validate().unwrap_err().to_string();
        assert!(e.contains("claim_batch"), "{e}");
    }
}
