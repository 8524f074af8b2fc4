//! The worker runtime of runkeep: what a host needs to work on runs without
//! getting the lease wrong. It lives apart from the core (`runkeep`) so a
//! backend or a tool that only reads and writes runs does not pull in
//! tokio's signal handling or `tokio-util`.
//!
//! It implements the worker protocol every runkeep runtime follows (this
//! crate, the TypeScript and the Python clients' workers), written down
//! once in the repository's `docs/design/worker-protocol.md`: take a run,
//! keep the lease, write under the fence, resolve an unknown outcome by
//! reading back, end the holding.
//!
//! - [`LeaseKeeper`] renews a held run in the background at a fraction of its
//!   TTL and cancels the run's token the moment the lease is lost or could
//!   lapse — before the next write, not after.
//! - [`RunHandle`] is the one door a run's writes go through. It presents the
//!   current fence on every write (a step cannot forget), swaps to the new
//!   fence for every clone at once when the keeper renews, and
//!   refuses every write once the lease is lost. [`RunHandle::commit_step`]
//!   writes a whole step (events, checkpoint, messages, record, and for the
//!   last step the finish) as one atomic commit; [`RunHandle::finish`] and
//!   [`RunHandle::snooze`] end the holding (contract v2).
//! - [`Worker`] drains a store: `claim_next` → resume point → the host's step
//!   → finish, release or snooze, with a concurrency limit, waiting on the
//!   store's watch when idle, and graceful shutdown ([`cancel_on_signal`]).
//!   A run's finishing step hands over to the next run: its commit claims
//!   the drain's next run in the same store call (one transaction on
//!   PostgreSQL, one request over HTTP), so a busy drain sends one call per
//!   run instead of two ([`WorkerOptions::handover`]).
//! - [`RunHandle::run_tool`] consults the completed-tool ledger, so a resumed
//!   run does not repeat a tool whose result is recorded.
//! - [`FenceGate`] is the check an external side-effect system applies to
//!   refuse a zombie.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use runkeep_worker::{cancel_on_signal, StepOutcome, Worker, WorkerError, WorkerOptions};
//! use runkeep::{Holder, ListingScope, MemoryStore, RunStore, TenantId, Ttl};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> runkeep::Result<()> {
//! let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
//! let scope = ListingScope::tenant(TenantId::new("acme")?);
//! let options = WorkerOptions::new(Holder::unique("worker"), Ttl::from_millis(30_000)?);
//! let worker = Worker::new(store, scope, options)?;
//! let shutdown = CancellationToken::new();
//! cancel_on_signal(shutdown.clone());
//! let report = worker
//!     .drain(shutdown, |run, resume| async move {
//!         // `resume` is the checkpoint to continue from (None: a fresh run).
//!         let _ = resume;
//!         let weather = run
//!             .run_tool("toolu_1", "weather", |fence| async move {
//!                 // Pass `fence` to the external system with the effect.
//!                 Ok(format!("sunny (issued under fence {})", fence.fence))
//!             })
//!             .await?;
//!         run.write_report(&weather.tool.result).await?;
//!         Ok::<_, WorkerError>(StepOutcome::Finished)
//!     })
//!     .await;
//! println!("{report:?}");
//! # Ok(()) }
//! ```
//!
//! # Fencing side effects outside the store
//!
//! The store refuses a superseded worker's writes, but it cannot refuse what
//! that worker does elsewhere: a payment, an e-mail, a row in another
//! database. A worker that stalled past its lease (GC pause, SIGSTOP,
//! partition) wakes up believing it still holds the run. Stopping it takes
//! the other system's cooperation, and the fence is what makes that possible,
//! because fences of a run only increase (a renewal mints a new one too):
//!
//! 1. The worker sends the run and its current fence with every effect:
//!    [`RunHandle::fence_token`] (or the token [`RunHandle::run_tool`] hands
//!    to the tool). Call [`RunHandle::ensure_held`] right before an effect to
//!    refuse locally when the lease is already known lost.
//! 2. The receiving system remembers, per run, the highest fence it has
//!    admitted, and refuses an effect that presents a lower one
//!    ([`admit_fence`] is the rule). Check and record atomically with the
//!    effect itself — one transaction, or one conditional write.
//! 3. A new holder announces its fence to the system when it takes the run
//!    ([`FenceGate::observe`]), so a zombie is refused even before the new
//!    holder's first effect.
//!
//! [`FenceGate`] implements this in-process. Across processes, keep the
//! highest fence next to the effect's own data and apply [`admit_fence`]
//! there.
//!
//! What remains is the at-least-once window: a worker that crashes after an
//! effect and before recording it (see [`RunHandle::run_tool`]) leaves no
//! record, so the next holder runs the effect again — under a higher fence,
//! which the system admits. Make effects idempotent by `tool_use_id` where a
//! repeat would hurt.
//!
//! # Time
//!
//! Lease expiry is judged by the **store's clock**: the worker's claims and
//! renewals carry no instant, so workers on machines with skewed
//! clocks cannot take each other's live leases (on PostgreSQL the database's
//! clock decides). The worker's own deadline is measured on its monotonic
//! clock from when the claim was *sent*, minus a safety margin, so it never
//! outlives the store's expiry whatever either wall clock says. A host that
//! must judge on a clock of its own sets [`KeeperOptions::clock`]. Tests
//! inject a [`TokioClock`] into the store (e.g.
//! `MemoryStore::with_clock`), so a paused tokio runtime moves both.

mod clock;
mod drain;
mod error;
mod gate;
mod group;
mod handle;
mod handover;
mod keeper;

pub use clock::{Clock, SystemClock, TokioClock};
pub use drain::{
    cancel_on_signal, DrainMode, DrainReport, DrainStop, EndAction, FailureKind, IdleBackoff,
    ReleaseFailure, RunFailure, StepOutcome, Worker, WorkerOptions, MAX_LISTED,
};
pub use error::{LeaseLoss, WorkerError};
pub use gate::{admit_fence, EffectRefused, FenceGate};
pub use handle::{FenceToken, HeldLease, RunHandle, ToolRun, STEP_ID_FIELD, TOOL_COMPLETED_EVENT};
pub use keeper::{KeeperOptions, LeaseKeeper};
