//! Retention: how long a finished run is kept, and which runs a prune may
//! delete.
//!
//! A store deletes finished runs on request
//! ([`CheckpointStore::prune_finished`](crate::CheckpointStore::prune_finished)),
//! in bounded batches, judged by one rule ([`is_due`]):
//!
//! - only a **finished** run (completed, failed, cancelled) with a
//!   `finished_at` is ever due; an active run — one never finished, or one
//!   an operator **reopened** — never is;
//! - it is due once `finished_at + keep` has passed, where `keep` is the
//!   run's own retention (`EnqueueOptions::retention`, kept as
//!   `Lifecycle::retention_ms`) when it has one, else the policy's
//!   [`RetentionPolicy::keep_finished_for`]: the run's own value wins both
//!   ways (shorter or longer);
//! - a run **held** live at the instant is never due (a finished run holds
//!   no lease; the rule keeps the guard so a backend that judges a stale
//!   read is still safe).
//!
//! Each deletion is judged again under the run's lock or transaction, so a
//! run reopened or claimed between the scan and the delete is kept.
//!
//! # Sub-runs
//!
//! A prune judges **top-level** runs. A top-level run's sub-runs (the runs
//! of its session whose `parent_run_id` is its id) share its fate: the run
//! is due only when it is due and each of its sub-runs is due by its own
//! lifecycle (an active, held or not-yet-due sub-run keeps its parent), and
//! deleting it deletes them. A sub-run is never deleted on its own. (A
//! sub-run of a sub-run is addressed by its direct parent and is not
//! touched.)
//!
//! # What "deleted" means
//!
//! Everything of the run goes: checkpoints, events, audit, run record,
//! messages, report, holdings, lifecycle, the run's entries in its
//! concurrency key's holdings history and a dedupe record naming it.
//! Afterwards every read answers as for a run that never existed, and the
//! run id can be enqueued again.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::lifecycle::Lifecycle;
use crate::scope::RunScope;
use crate::time::{Timestamp, Ttl};

/// The largest batch one prune call takes.
pub const MAX_PRUNE_BATCH: usize = 10_000;

/// The store's retention policy: how long a finished run is kept when it
/// has no retention of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// Keep a finished run this long after `finished_at`.
    pub keep_finished_for: Ttl,
}

impl RetentionPolicy {
    /// A policy keeping finished runs for `keep`.
    pub fn keep_for(keep: Ttl) -> Self {
        Self {
            keep_finished_for: keep,
        }
    }

    /// How long `lifecycle`'s run is kept once finished, ms: its own
    /// retention, else the policy's.
    pub fn keep_ms(&self, lifecycle: &Lifecycle) -> u64 {
        lifecycle
            .retention_ms
            .unwrap_or(self.keep_finished_for.as_millis())
    }

    /// The instant from which `lifecycle`'s run is due (`None`: never,
    /// not being finished).
    pub fn due_at(&self, lifecycle: &Lifecycle) -> Option<Timestamp> {
        if !lifecycle.status.is_finished() {
            return None;
        }
        let keep = i64::try_from(self.keep_ms(lifecycle)).unwrap_or(i64::MAX);
        lifecycle.finished_at.map(|t| t.offset(keep))
    }
}

/// The retention rule (module docs): true when a prune at `now` may delete
/// the run whose lifecycle is `lifecycle` and which is (`held_live`) or is
/// not held live at `now`.
pub fn is_due(
    lifecycle: &Lifecycle,
    held_live: bool,
    policy: &RetentionPolicy,
    now: Timestamp,
) -> bool {
    !held_live && policy.due_at(lifecycle).is_some_and(|at| at <= now)
}

/// Refuses a batch size of 0 or above [`MAX_PRUNE_BATCH`].
pub fn check_limit(limit: usize) -> Result<()> {
    if limit == 0 || limit > MAX_PRUNE_BATCH {
        return Err(Error::invalid(format!(
            "prune batch of {limit} runs: a batch takes 1 to {MAX_PRUNE_BATCH} runs"
        )));
    }
    Ok(())
}

/// A periodic prune's duty cycle: the share `d` of its time it spends in
/// batches. After a batch that took `t` it pauses `t × (1 − d) / d`, so a
/// batch slowed by the store's load is followed by a longer pause and the
/// prune's share of the store stays `d` (`runkeep serve --retain-duty`).
/// What a prune takes from other calls (`BENCHMARKS.md`, Retention) is
/// CPU and, on PostgreSQL, the WAL flushes of their commits, while a batch
/// runs: less overlap is the lever, not fewer locks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PruneDuty(f64);

impl PruneDuty {
    /// Batches back to back (no pause of the duty cycle's own).
    pub const FULL: PruneDuty = PruneDuty(1.0);

    /// Refuses a share outside (0, 1].
    pub fn new(share: f64) -> Result<Self> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(Error::invalid(format!(
                "a prune duty cycle of {share}: give the share of the time spent in batches, above 0 and at most 1 (e.g. 0.25)"
            )));
        }
        Ok(Self(share))
    }

    /// The share.
    pub fn share(self) -> f64 {
        self.0
    }

    /// The pause after a batch that took `took`.
    pub fn pause_after(self, took: std::time::Duration) -> std::time::Duration {
        took.mul_f64((1.0 - self.0) / self.0)
    }
}

/// What one prune call did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    /// The top-level runs deleted, in the order they were deleted.
    pub deleted: Vec<RunScope>,
    /// Their sub-runs deleted with them.
    #[serde(default)]
    pub sub_runs_deleted: u64,
    /// Top-level finished runs looked at (due or not).
    pub scanned: u64,
    /// The call stopped at its limit: more runs may be due (call again).
    pub more: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::RunStatus;

    #[test]
    fn a_duty_cycle_pauses_in_proportion_to_the_batch() {
        use std::time::Duration;
        let quarter = PruneDuty::new(0.25).unwrap();
        assert_eq!(
            quarter.pause_after(Duration::from_millis(200)),
            Duration::from_millis(600)
        );
        assert_eq!(
            PruneDuty::new(0.5)
                .unwrap()
                .pause_after(Duration::from_millis(80)),
            Duration::from_millis(80)
        );
        assert_eq!(
            PruneDuty::FULL.pause_after(Duration::from_secs(3)),
            Duration::ZERO
        );
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let e = PruneDuty::new(bad).unwrap_err();
            assert!(e.to_string().contains("at most 1"), "{bad}: {e}");
        }
    }

    fn policy(ms: u64) -> RetentionPolicy {
        RetentionPolicy::keep_for(Ttl::from_millis(ms).unwrap())
    }

    fn finished(at: i64, own: Option<u64>) -> Lifecycle {
        Lifecycle {
            status: RunStatus::Completed,
            finished_at: Some(Timestamp::from_millis(at).unwrap()),
            retention_ms: own,
            ..Lifecycle::default()
        }
    }

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }

    #[test]
    fn a_finished_run_is_due_once_its_keep_has_passed() {
        let l = finished(1_000, None);
        assert!(!is_due(&l, false, &policy(500), t(1_499)));
        assert!(is_due(&l, false, &policy(500), t(1_500)));
    }

    #[test]
    fn the_runs_own_retention_wins_both_ways() {
        assert!(is_due(
            &finished(1_000, Some(10)),
            false,
            &policy(500),
            t(1_010)
        ));
        assert!(!is_due(
            &finished(1_000, Some(10_000)),
            false,
            &policy(500),
            t(5_000)
        ));
    }

    #[test]
    fn an_active_or_held_run_is_never_due() {
        let active = Lifecycle {
            finished_at: Some(t(0)),
            ..Lifecycle::default()
        };
        assert!(!is_due(&active, false, &policy(1), t(1_000_000)));
        assert!(!is_due(&finished(0, None), true, &policy(1), t(1_000_000)));
        let no_instant = Lifecycle {
            status: RunStatus::Failed,
            ..Lifecycle::default()
        };
        assert!(!is_due(&no_instant, false, &policy(1), t(1_000_000)));
    }

    #[test]
    fn a_batch_is_bounded() {
        assert!(check_limit(0).is_err());
        assert!(check_limit(1).is_ok());
        assert!(check_limit(MAX_PRUNE_BATCH).is_ok());
        assert!(check_limit(MAX_PRUNE_BATCH + 1).is_err());
    }
}
