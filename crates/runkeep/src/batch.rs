//! Batches: many runs claimed by one `claim_next_batch` call, many runs'
//! steps committed by one `commit_steps` call (a group commit).
//!
//! A batch only shares the trip to the store: every run in it is still
//! leased and fenced on its own. A claimed batch is N leases, each with its
//! own fence; a group commit judges each step under its own fence check,
//! and one stale step is refused alone — the others commit.
//!
//! The rules every backend applies before touching anything live here: the
//! batch size ([`MAX_BATCH`]) and, for a group commit, one step per run.

use std::collections::HashSet;
use std::future::Future;

use crate::error::{Error, Result};
use crate::lease::{Fence, Lease};
use crate::scope::RunScope;
use crate::step::{Step, StepReceipt};

/// The most runs one batch may carry (claimed or committed).
pub const MAX_BATCH: usize = 256;

/// One run's step in a group commit
/// ([`EvidenceStore::commit_steps`](crate::EvidenceStore::commit_steps)).
#[derive(Clone, Debug)]
pub struct StepCommit {
    /// The run the step belongs to.
    pub scope: RunScope,
    /// The fence of the caller's holding of that run.
    pub fence: Fence,
    /// The step.
    pub step: Step,
}

/// Refuses a batch size of 0 or above [`MAX_BATCH`]; `what` names the
/// operation in the message.
pub fn check_size(what: &str, size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid(format!(
            "{what}: a batch of 0 runs; ask for 1 to {MAX_BATCH}"
        )));
    }
    if size > MAX_BATCH {
        return Err(Error::invalid(format!(
            "{what}: a batch of {size} runs is above the limit of {MAX_BATCH}; split it"
        )));
    }
    Ok(())
}

/// Checks a group commit before anything is written: its size, and that no
/// run appears twice (two steps of one run under one fence in one batch
/// have no order a reader could rely on: commit them in turn instead).
pub fn check_group(steps: &[StepCommit]) -> Result<()> {
    check_size("commit_steps", steps.len())?;
    let mut seen = HashSet::with_capacity(steps.len());
    for s in steps {
        if !seen.insert(&s.scope) {
            return Err(Error::invalid(format!(
                "commit_steps: run {} appears twice in one batch; commit one step per run per batch",
                s.scope.run_id
            )));
        }
    }
    Ok(())
}

/// `claim_next_batch` as calls of `claim_next` (`claim`), one after the
/// other: the contract's provided body, and a wrapper's that must see its
/// own `claim_next`. Stops at the first run not found; an error after some
/// runs were taken answers those runs.
pub async fn claim_one_by_one<F, Fut>(max: usize, mut claim: F) -> Result<Vec<(RunScope, Lease)>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<(RunScope, Lease)>>>,
{
    check_size("claim_next_batch", max)?;
    let mut taken = Vec::new();
    while taken.len() < max {
        match claim().await {
            Ok(Some(run)) => taken.push(run),
            Ok(None) => break,
            Err(e) if taken.is_empty() => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, taken = taken.len(), "claim_next_batch ends early");
                break;
            }
        }
    }
    Ok(taken)
}

/// `commit_steps` as calls of `commit_step` (`commit`), one after the
/// other, once the whole batch is checked: the contract's provided body,
/// and a wrapper's that must see its own `commit_step`.
pub async fn commit_one_by_one<'a, F, Fut>(
    steps: &'a [StepCommit],
    mut commit: F,
) -> Result<Vec<Result<StepReceipt>>>
where
    F: FnMut(&'a StepCommit) -> Fut,
    Fut: Future<Output = Result<StepReceipt>>,
{
    check_group(steps)?;
    for s in steps {
        s.step.validate(&s.scope)?;
    }
    let mut outcomes = Vec::with_capacity(steps.len());
    for s in steps {
        outcomes.push(commit(s).await);
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_outside_one_to_the_limit_are_refused_with_what_to_do() {
        assert!(check_size("x", 0)
            .unwrap_err()
            .to_string()
            .contains("ask for 1"));
        assert!(check_size("x", MAX_BATCH + 1)
            .unwrap_err()
            .to_string()
            .contains("split it"));
        check_size("x", 1).unwrap();
        check_size("x", MAX_BATCH).unwrap();
    }
}
