//! Why a handle refuses a write: the lease is gone, or the store said no.

use std::fmt;

use runkeep::error::Error;
use runkeep::lease::Fence;
use runkeep::lifecycle::RunStatus;
use runkeep::time::Timestamp;

/// How a run's lease was lost. Once lost, a handle refuses every write.
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum LeaseLoss {
    /// Another holding was issued after ours: a renewal answered `Held`, or
    /// the store refused a write as fenced out.
    Superseded {
        /// The run's fence as the store reported it.
        current: Fence,
        /// The holder now holding the run, when the store said (`""` for a
        /// release tombstone or an unreadable holding).
        holder: Option<String>,
    },
    /// The lease would lapse before a renewal could land: renewals kept
    /// failing with retryable errors or did not answer in time, the renewal
    /// task did not run (a starved runtime, a stopped process), or a renewal
    /// answered after the lease's deadline (which proves nothing about the
    /// time in between).
    Expiring {
        /// What happened.
        detail: String,
    },
    /// A renewal failed with an error that retrying cannot fix.
    RenewalFailed {
        /// The store error's kind ([`Error::kind`]).
        kind: &'static str,
        /// The store error's message.
        message: String,
    },
    /// The worker released the run itself.
    Released,
    /// This handle finished the run (contract v2): the fence is spent. Not a
    /// loss of the lease to anyone else: the run's token is not cancelled.
    Finished {
        /// The status recorded.
        status: RunStatus,
    },
    /// This handle gave the run back with a not-before time (`snooze`). Not
    /// a loss to anyone else: the run's token is not cancelled.
    Snoozed {
        /// Not claimable before this instant.
        until: Timestamp,
    },
    /// This handle reported a failed attempt (`fail_attempt`): the holding
    /// ended, the run is deferred by its backoff or dead-lettered. Not a
    /// loss to anyone else: the run's token is not cancelled.
    AttemptFailed {
        /// The run's attempt count now.
        attempts: u32,
        /// The attempt reached the limit and the run was dead-lettered.
        dead_lettered: bool,
    },
    /// An operator cancelled the run: a renewal answered it finished as
    /// cancelled, or the store refused a write as [`Error::Cancelled`].
    Cancelled {
        /// The operator's reason.
        reason: Option<String>,
    },
    /// The holding was ended by someone else (an operator's release, or a
    /// takeover that was released again) between two renewals: the
    /// renewal got a fence that does not follow ours. The run is not ours
    /// any more, whatever that new claim answered; it was given back.
    Gap {
        /// The fence this worker held.
        held: Fence,
        /// The fence the renewal was answered with.
        answered: Fence,
    },
}

impl LeaseLoss {
    /// True when this worker itself ended the holding (released, finished
    /// or snoozed it), rather than losing it.
    pub fn is_own_end(&self) -> bool {
        matches!(
            self,
            LeaseLoss::Released
                | LeaseLoss::Finished { .. }
                | LeaseLoss::Snoozed { .. }
                | LeaseLoss::AttemptFailed { .. }
        )
    }
}

impl fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLoss::Superseded { current, holder } => {
                write!(f, "superseded: the run is now at fence {current}")?;
                match holder.as_deref() {
                    Some("") => write!(f, " (released or unreadable holding)"),
                    Some(h) => write!(f, ", held by {h:?}"),
                    None => Ok(()),
                }
            }
            LeaseLoss::Expiring { detail } => {
                write!(f, "lease expiring without a renewal: {detail}")
            }
            LeaseLoss::RenewalFailed { kind, message } => {
                write!(f, "renewal failed ({kind}): {message}")
            }
            LeaseLoss::Released => f.write_str("the run was released by this worker"),
            LeaseLoss::Finished { status } => {
                write!(f, "the run was finished ({status}) by this worker")
            }
            LeaseLoss::Snoozed { until } => {
                write!(f, "the run was given back by this worker until {until}")
            }
            LeaseLoss::AttemptFailed {
                attempts,
                dead_lettered,
            } => {
                write!(f, "this worker reported attempt {attempts} failed")?;
                if *dead_lettered {
                    f.write_str("; the run was dead-lettered")?;
                }
                Ok(())
            }
            LeaseLoss::Cancelled { reason } => {
                f.write_str("an operator cancelled the run")?;
                match reason {
                    Some(r) => write!(f, " ({r})"),
                    None => Ok(()),
                }
            }
            LeaseLoss::Gap { held, answered } => write!(
                f,
                "the holding at fence {held} was ended by someone else (released by an operator, or taken over): the renewal answered fence {answered}, not {}",
                held.get() + 1
            ),
        }
    }
}

/// What a [`RunHandle`](crate::RunHandle) answers when it does not write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The handle no longer holds the run; the write was refused before it
    /// reached the store, and nothing was written. Stop working on the run.
    #[error(
        "lease lost: {operation} on run {run} was refused before writing (fence {fence}): {loss}"
    )]
    LeaseLost {
        /// The run.
        run: String,
        /// The refused operation.
        operation: &'static str,
        /// The fence the handle held last.
        fence: Fence,
        /// How the lease was lost.
        loss: LeaseLoss,
    },

    /// The completed-tool ledger could not be read completely (the
    /// transcript has damaged records) and this tool has no entry in what
    /// could be read. An absent entry is then no proof that the tool never
    /// ran, so it is not executed again blindly. Repair the transcript or
    /// decide by other means.
    #[error(
        "the completed-tool ledger of run {run} is incomplete (damaged transcript records), and tool use {tool_use_id} has no entry in what could be read; it may already have run, so it is not executed again"
    )]
    LedgerIncomplete {
        /// The run.
        run: String,
        /// The tool use id asked for.
        tool_use_id: String,
    },

    /// The store refused or failed the call (a `FencedOut` answer also marks
    /// the handle's lease as lost).
    #[error(transparent)]
    Store(#[from] Error),
}

impl WorkerError {
    /// True when the write was refused because this worker no longer holds
    /// the run: either the handle knew it before writing, or the store said
    /// [`Error::FencedOut`].
    pub fn is_fenced_out(&self) -> bool {
        match self {
            WorkerError::LeaseLost { .. } => true,
            WorkerError::Store(e) => e.is_fenced_out(),
            WorkerError::LedgerIncomplete { .. } => false,
        }
    }

    /// True when repeating the same call later may succeed (a retryable store
    /// error; never a lost lease).
    pub fn is_retryable(&self) -> bool {
        matches!(self, WorkerError::Store(e) if e.is_retryable())
    }
}
