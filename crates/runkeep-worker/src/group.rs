//! Group commit: the finishing steps of several runs a drain holds, sent
//! as one [`EvidenceStore::commit_steps`](runkeep::EvidenceStore::commit_steps)
//! call ([`WorkerOptions::commit_batch`](crate::WorkerOptions::commit_batch)).
//!
//! A run's handle hands its finishing step to the drain's committer while
//! it holds the run's gate exclusively (as for any ending write), so no
//! renewal swaps the fence the step presents while the step waits here or
//! is in flight. The committer takes what is waiting, up to the batch, and
//! sends it; while that call is in flight the next steps queue, so groups
//! form on their own under load and a lone step waits at most
//! [`commit_linger`](crate::WorkerOptions::commit_linger) for company.
//!
//! Each step gets its own answer: a stale fence refuses that step alone
//! (the store judges every step on its own). When the call as a whole
//! fails:
//! - its outcome is unknown: every step of it answers outcome unknown, and
//!   each run's handle resolves its own (fence off, read back), as a single
//!   commit's would be;
//! - otherwise nothing was written, and one run's fault must not be
//!   another's: the steps are sent again one by one, each answering alone.

use std::sync::Arc;
use std::time::Duration;

use runkeep::{Error, Fence, Result, RunScope, RunStore, Step, StepCommit, StepReceipt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout_at, Instant};

/// A step waiting for its group, and where its answer goes.
struct Waiting {
    commit: StepCommit,
    answer: oneshot::Sender<Result<StepReceipt>>,
}

/// The drain's committer of finishing steps. Lives while any handle or the
/// drain holds it; its task ends once the last is dropped.
#[derive(Debug)]
pub(crate) struct GroupCommit {
    queue: mpsc::UnboundedSender<Waiting>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("run", &self.commit.scope)
            .finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// Starts the committer: groups of at most `batch` steps (at least 2:
    /// a batch of 1 has no committer), the first one waiting at most
    /// `linger` for others.
    pub(crate) fn start(store: Arc<dyn RunStore>, batch: usize, linger: Duration) -> Arc<Self> {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(committer(store, waiting, batch, linger));
        Arc::new(Self { queue })
    }

    /// Commits `step` under `fence` in the next group; answers the step's
    /// own outcome.
    pub(crate) async fn commit(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        let (answer, answered) = oneshot::channel();
        let waiting = Waiting {
            commit: StepCommit {
                scope: scope.clone(),
                fence,
                step: step.clone(),
            },
            answer,
        };
        if self.queue.send(waiting).is_err() {
            // Nothing was sent: the committer is gone (its runtime is
            // shutting down).
            return Err(Error::unavailable(
                format!("commit_step on run {}: the worker's group committer has stopped; nothing was written", scope.run_id),
                "group committer stopped",
            ));
        }
        match answered.await {
            Ok(answer) => answer,
            // The committer died with the step taken: it may have been sent.
            Err(_) => Err(Error::outcome_unknown(
                format!(
                    "commit_step on run {}: the worker's group committer stopped with the step in hand; it may have been sent",
                    scope.run_id
                ),
                "group committer stopped",
            )),
        }
    }
}

async fn committer(
    store: Arc<dyn RunStore>,
    mut waiting: mpsc::UnboundedReceiver<Waiting>,
    batch: usize,
    linger: Duration,
) {
    while let Some(first) = waiting.recv().await {
        let mut group = vec![first];
        // What queued while the last group was in flight joins at once.
        while group.len() < batch {
            match waiting.try_recv() {
                Ok(w) => group.push(w),
                Err(_) => break,
            }
        }
        if !linger.is_zero() {
            let until = Instant::now() + linger;
            while group.len() < batch {
                match timeout_at(until, waiting.recv()).await {
                    Ok(Some(w)) => group.push(w),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        send(&*store, group).await;
    }
}

/// Sends one group and answers each of its steps.
async fn send(store: &dyn RunStore, group: Vec<Waiting>) {
    let (commits, answers): (Vec<StepCommit>, Vec<_>) =
        group.into_iter().map(|w| (w.commit, w.answer)).unzip();
    if commits.len() == 1 {
        let c = &commits[0];
        let answer = store.commit_step(&c.scope, c.fence, &c.step).await;
        if let Some(a) = answers.into_iter().next() {
            let _ = a.send(answer);
        }
        return;
    }
    match store.commit_steps(&commits).await {
        Ok(outcomes) if outcomes.len() == commits.len() => {
            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                let _ = answer.send(outcome);
            }
        }
        Ok(outcomes) => {
            // A store answering the wrong number of outcomes cannot be
            // matched to the steps: none is known to have landed or not.
            let n = outcomes.len();
            for (answer, c) in answers.into_iter().zip(&commits) {
                let _ = answer.send(Err(Error::outcome_unknown(
                    format!(
                        "commit_steps on run {}: the store answered {n} outcomes for {} steps",
                        c.scope.run_id,
                        commits.len()
                    ),
                    "group commit answered the wrong number of outcomes",
                )));
            }
        }
        Err(e) if e.is_outcome_unknown() => {
            for (answer, c) in answers.into_iter().zip(&commits) {
                let _ = answer.send(Err(Error::outcome_unknown(
                    format!(
                        "commit_step on run {} (in a group commit of {}): {e}",
                        c.scope.run_id,
                        commits.len()
                    ),
                    e.to_string(),
                )));
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, steps = commits.len(), "the group commit failed as a whole; sending its steps one by one");
            for (answer, c) in answers.into_iter().zip(&commits) {
                let _ = answer.send(store.commit_step(&c.scope, c.fence, &c.step).await);
            }
        }
    }
}
