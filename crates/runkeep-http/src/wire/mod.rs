//! The API's JSON shapes (version 1), with lossless conversions to and from
//! the core types.
//!
//! The wire types are the API's own (not the core's serde forms), so the
//! OpenAPI document describes exactly what travels, the API can be
//! versioned apart from the storage formats, and a checkpoint's state is
//! carried apart from its header (a state that uses a reserved key reaches
//! the store and is refused there, instead of being silently folded into
//! the header). Input is validated by the core constructors on conversion;
//! a bad value is an `invalid-input` problem naming its field.
//!
//! One module per area of the API; every type is re-exported here, so
//! `wire::RunAddress` and `wire::runs::RunAddress` name the same type.
//!
//! - [`runs`]: addresses, listings, status, lifecycle, the run summary, the
//!   clock and `whoami`;
//! - [`leases`]: claims, renewals, release, finish, snooze, enqueue;
//! - [`checkpoints`]: checkpoints, their writes and prunes;
//! - [`parks`]: parks, pending decisions and their answers;
//! - [`events`]: event appends, reads and batches;
//! - [`documents`]: the run record, message snapshots, reports, audit;
//! - [`steps`]: the all-or-nothing step commit;
//! - [`schedules`]: recurring schedules and their cursor;
//! - [`threads`]: the thread routes (a LangGraph-style checkpoint chain);
//! - [`scheduling`]: an enqueue's idempotency key and answer, a priority
//!   change, a concurrency key's holdings;
//! - [`params`]: every operation's path and query parameters.

use runkeep::evidence::SkippedRecord;
use runkeep::failure::{AttemptError, FailedAttempt, RetryPolicy};
use runkeep::lease::Fence;
use runkeep::step::MessagesUpdate;
use runkeep::{
    AuditRecord, Checkpoint, CheckpointId, ClaimOutcome, EventBatch, FinishStatus, Holder, Lease,
    LeaseSummary, Lifecycle, ListOrder, MessageSnapshot, NewAuditEvent, NewEvent, Outcome,
    ParkResolution, ParkState, ParkSummary, PendingDecision, PersistedEvent, ProjectId, RunId,
    RunPage, RunRow, RunScope, RunStatus, SessionId, Step, StepReceipt, TenantId, Timestamp, Ttl,
};
use runkeep::{Concurrency, Dedupe, EnqueueOptions, KeyBusy, Priority};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::problem::Problem;

pub mod checkpoints;
pub mod documents;
pub mod events;
pub mod leases;
pub mod params;
pub mod parks;
pub mod retention;
pub mod runs;
pub mod schedules;
pub mod scheduling;
pub mod steps;
pub mod threads;

pub use checkpoints::*;
pub use documents::*;
pub use events::*;
pub use leases::*;
pub use params::*;
pub use parks::*;
pub use retention::*;
pub use runs::*;
pub use schedules::*;
pub use scheduling::*;
pub use steps::*;

/// The longest long-poll, ms (`claim_next`'s `waitMs`, the waits'
/// `timeoutMs`).
pub const MAX_WAIT_MS: u64 = 30_000;

/// No request body: the body of an operation that takes none
/// ([`OperationSpec::Body`](crate::routes::OperationSpec::Body));
/// `HttpStore` sends nothing.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct NoBody;

/// An answer that is a JSON array of `T` (a checkpoint listing).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Array<T>(pub Vec<T>);

/// A rule on a whole object that its fields' attributes cannot carry: a
/// JSON Schema keyword beside `properties` (`anyOf`, `dependentSchemas`),
/// for which utoipa's derive has no attribute. Declared with its type; the
/// document adds it to the type's schema ([`object_rules`]).
pub trait ObjectRule: ToSchema {
    /// The keyword and its value.
    fn rule() -> (&'static str, Value);
}

/// Every wire type with an [`ObjectRule`]: its schema's name, keyword and
/// value.
pub fn object_rules() -> Vec<(String, &'static str, Value)> {
    fn of<T: ObjectRule>() -> (String, &'static str, Value) {
        let (keyword, value) = T::rule();
        (T::name().into_owned(), keyword, value)
    }
    vec![
        of::<StepBody>(),
        of::<ClaimNextBody>(),
        of::<NextClaimBody>(),
        of::<PruneFinishedBody>(),
    ]
}

/// A listing scope is a prefix of tenant → project → session: a `session`
/// needs its `project` ([`ClaimNextBody`], [`NextClaimBody`],
/// [`PruneFinishedBody`]).
fn session_needs_project() -> (&'static str, Value) {
    (
        "dependentSchemas",
        serde_json::json!({ "session": {
            "required": ["project"],
            "properties": { "project": { "type": "string" } },
        } }),
    )
}

/// A JSON object.
pub type Object = Map<String, Value>;

fn bad(field: &str, e: runkeep::Error) -> Problem {
    Problem::from(e).with_field(field)
}

/// Parses an instant (epoch ms) named `field`.
pub fn instant(field: &str, ms: i64) -> Result<Timestamp, Problem> {
    Timestamp::from_millis(ms).map_err(|e| bad(field, e))
}

fn opt_instant(field: &str, ms: Option<i64>) -> Result<Option<Timestamp>, Problem> {
    ms.map(|m| instant(field, m)).transpose()
}

/// Parses a fence named `field`.
pub fn fence(field: &str, n: u64) -> Result<Fence, Problem> {
    Fence::new(n).map_err(|e| bad(field, e))
}

/// Parses an optional fence named `field`.
pub fn opt_fence(field: &str, n: Option<u64>) -> Result<Option<Fence>, Problem> {
    n.map(|n| fence(field, n)).transpose()
}

fn ms(t: Timestamp) -> i64 {
    t.as_millis()
}
