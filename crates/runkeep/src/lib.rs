//! runkeep: durable state for long-running agent and workflow runs.
//!
//! A host runs many worker processes. runkeep lets them checkpoint runs,
//! resume them after a crash, hand parked runs (waiting on a human) from
//! worker to worker, and guarantees that a worker which lost its lease cannot
//! overwrite the work of the one that took over: every write presents the
//! fence it holds and the store checks it, not the writer.
//!
//! # Why it looks like this
//!
//! - **One contract, many media.** [`RunStore`] is an async, dyn-compatible
//!   trait ([`CheckpointStore`] + [`EvidenceStore`]); hosts inject
//!   `Arc<dyn RunStore>`. [`MemoryStore`] is the reference model; the
//!   directory and PostgreSQL backends live in their own crates and pass the
//!   same conformance kit (`runkeep-conformance`).
//! - **Rules live once.** Lease rules ([`lease`]), the checkpoint total order
//!   ([`checkpoint`]), parks ([`park`]), listing order, filters and cursors
//!   ([`listing`]) and evidence rules ([`evidence`]) are pure functions here,
//!   used by every backend, so they cannot drift.
//! - **Invalid values cannot exist.** Ids, scopes, fences, TTLs and instants
//!   validate where they are built ([`id`], [`scope`], [`time`]).
//! - **One error enum** ([`Error`]), one meaning per variant; fenced out is its
//!   own variant carrying both fences.

pub mod acting;
pub mod backoff;
pub mod batch;
pub mod checkpoint;
pub mod error;
pub mod evidence;
pub mod failure;
pub mod id;
pub mod lease;
pub mod lifecycle;
pub mod listing;
pub mod memory;
pub mod park;
pub mod scheduling;
pub mod scope;
pub mod step;
pub mod store;
pub mod thread_writes;
pub mod time;
pub mod watch;

pub use batch::StepCommit;
pub use checkpoint::{Checkpoint, CheckpointHeader, OrderKey};
pub use error::{Error, Result};
pub use evidence::{
    AuditRecord, CompletedTool, CompletedTools, EventBatch, Integrity, MessageSnapshot,
    NewAuditEvent, NewEvent, PersistedEvent, ReadEventsOptions, RunRecord,
};
pub use failure::{AttemptError, FailedAttempt, RetryPolicy};
pub use id::{CheckpointId, Holder, ProjectId, RunId, SessionId, TenantId};
pub use lease::{ClaimOptions, ClaimOutcome, Fence, Lease, LeaseSummary, TopHolding};
pub use lifecycle::{EnqueueOptions, FinishStatus, Lifecycle, Outcome, RunStatus};
pub use listing::{ListOptions, ListOrder, RunDigest, RunPage, RunRow};
pub use memory::MemoryStore;
pub use park::{ParkResolution, ParkState, ParkSummary, PendingDecision};
pub use scheduling::{Concurrency, Dedupe, Enqueued, KeyBusy, KeyHolding, Priority};
pub use scope::{ListingScope, RunScope};
pub use step::{MessagesUpdate, Step, StepFinish, StepReceipt};
pub use store::{
    checked_update, CheckpointIdQuery, CheckpointStore, CheckpointUpdate, ClaimNextFilter,
    EvidenceStore, Handover, NextClaim, RunStore, RunStoreExt, CONTRACT_REVISION,
};
pub use time::{Clock, ManualClock, RemoteClock, SystemClock, Timestamp, Ttl};
pub use watch::{Watch, WatchTopic};
