//! The drain's hand-over: a drained run's finishing step also claims the
//! drain's next run, in one store call
//! ([`EvidenceStore::commit_step_and_claim_next`](runkeep::EvidenceStore::commit_step_and_claim_next)).
//!
//! The drain gives every run it holds a [`Handoff`] (its claim parameters and
//! whether it still claims). A [`RunHandle::commit_step`](crate::RunHandle::commit_step)
//! with `finish` on such a run sends the step and the claim together, starts
//! the keeper of the run it gets at once, and leaves that run in the
//! holding's [`Handed`] slot. The drain collects it when the finished run's
//! step has returned, and steps it in the same pool slot: the finished run
//! frees exactly the slot the next one takes, so the concurrency limit holds
//! at every instant. A handle without a `Handoff` (a run the host claimed
//! itself, [`LeaseKeeper::claim`](crate::LeaseKeeper::claim) or
//! [`LeaseKeeper::start`](crate::LeaseKeeper::start)) commits with
//! `commit_step` as before.

use runkeep::error::Error;
use runkeep::id::Holder;
use runkeep::lease::Lease;
use runkeep::scope::{ListingScope, RunScope};
use runkeep::store::{ClaimNextFilter, NextClaim};
use runkeep::time::Ttl;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::keeper::{KeeperOptions, LeaseKeeper};

/// A drain's claim parameters, shared by the runs it holds.
#[derive(Debug)]
pub(crate) struct Handoff {
    pub(crate) scope: ListingScope,
    pub(crate) filter: ClaimNextFilter,
    pub(crate) holder: Holder,
    pub(crate) ttl: Ttl,
    pub(crate) keeper: KeeperOptions,
    /// The drain's shutdown token.
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the drain stops claiming (shutdown, idle, a claim
    /// error retrying cannot fix).
    pub(crate) claiming: CancellationToken,
}

impl Handoff {
    /// True while the drain would claim again anyway: it runs and is not
    /// stopping.
    pub(crate) fn open(&self) -> bool {
        !self.shutdown.is_cancelled() && !self.claiming.is_cancelled()
    }

    /// The drain's `claim_next` arguments, exactly as its own loop builds
    /// them (the instant, when the host judges, taken now).
    pub(crate) fn next_claim(&self) -> NextClaim {
        NextClaim {
            scope: self.scope.clone(),
            filter: self.filter.clone(),
            options: crate::keeper::claim_options(
                self.holder.clone(),
                self.ttl,
                self.keeper.clock.as_ref(),
            ),
        }
    }
}

/// A run the drain took (by its own `claim_next` or by a hand-over).
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) scope: RunScope,
    pub(crate) lease: Lease,
    /// When the claim was sent (monotonic clock): the lease's local deadline
    /// is counted from it.
    pub(crate) sent_at: Instant,
    /// The keeper, when it was started already (a hand-over starts it the
    /// moment the answer arrives).
    pub(crate) keeper: Option<LeaseKeeper>,
}

/// What a holding handed over.
#[derive(Debug, Default)]
pub(crate) enum Handed {
    /// Nothing yet; a finishing step may hand over.
    #[default]
    Open,
    /// The run the hand-over claimed, its keeper running.
    Run(Taken),
    /// The step committed, but the hand-over's claim failed.
    Failed(Error),
    /// The drain has collected the holding: no more hand-overs.
    Closed,
}
