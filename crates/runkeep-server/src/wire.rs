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

// A `Problem` is returned straight into a response, once per refused
// request: its size costs nothing measurable, boxing it would cost clarity.
#![allow(clippy::result_large_err)]

use runkeep::evidence::SkippedRecord;
use runkeep::lease::Fence;
use runkeep::step::MessagesUpdate;
use runkeep::{
    AuditRecord, Checkpoint, CheckpointId, ClaimOutcome, EventBatch, FinishStatus, Holder, Lease,
    LeaseSummary, Lifecycle, ListOrder, MessageSnapshot, NewAuditEvent, NewEvent, Outcome,
    ParkResolution, ParkState, ParkSummary, PendingDecision, PersistedEvent, ProjectId, RunId,
    RunPage, RunRow, RunScope, RunStatus, SessionId, Step, StepReceipt, TenantId, Timestamp, Ttl,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::problem::Problem;

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

/// The address of one run.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunAddress {
    /// Tenant.
    pub tenant_id: String,
    /// Project.
    pub project_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
    /// The parent run, for a sub-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
}

impl From<&RunScope> for RunAddress {
    fn from(s: &RunScope) -> Self {
        Self {
            tenant_id: s.tenant_id.to_string(),
            project_id: s.project_id.to_string(),
            session_id: s.session_id.to_string(),
            run_id: s.run_id.to_string(),
            parent_run_id: s.parent_run_id.as_ref().map(ToString::to_string),
        }
    }
}

impl RunAddress {
    /// The core scope (ids validated).
    pub fn to_scope(&self, field: &str) -> Result<RunScope, Problem> {
        let f = |n: &str| format!("{field}.{n}");
        let mut s = RunScope::new(
            TenantId::new(&self.tenant_id).map_err(|e| bad(&f("tenantId"), e))?,
            ProjectId::new(&self.project_id).map_err(|e| bad(&f("projectId"), e))?,
            SessionId::new(&self.session_id).map_err(|e| bad(&f("sessionId"), e))?,
            RunId::new(&self.run_id).map_err(|e| bad(&f("runId"), e))?,
        );
        if let Some(p) = &self.parent_run_id {
            s = s.with_parent(RunId::new(p).map_err(|e| bad(&f("parentRunId"), e))?);
        }
        Ok(s)
    }
}

/// A lease handed to its taker.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseBody {
    /// Who took it.
    pub holder: String,
    /// The fence every write under it presents.
    pub fence: u64,
    /// Expiry, epoch ms (store clock).
    pub expires_at: i64,
}

impl From<&Lease> for LeaseBody {
    fn from(l: &Lease) -> Self {
        Self {
            holder: crate::api::ownership::display(l.holder.as_str()).to_string(),
            fence: l.fence.get(),
            expires_at: ms(l.expires_at),
        }
    }
}

impl LeaseBody {
    /// The core lease.
    pub fn to_lease(&self) -> Result<Lease, Problem> {
        Ok(Lease {
            holder: Holder::new(&self.holder).map_err(|e| bad("lease.holder", e))?,
            fence: fence("lease.fence", self.fence)?,
            expires_at: instant("lease.expiresAt", self.expires_at)?,
        })
    }
}

/// A run's top holding as a listing shows it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSummaryBody {
    /// Holder; empty for a released or unreadable holding.
    pub holder: String,
    /// The top fence.
    pub fence: u64,
    /// Expiry, epoch ms; 0 for a released or unreadable holding.
    pub expires_at: i64,
    /// Expired at the answer's instant.
    pub expired: bool,
}

impl From<&LeaseSummary> for LeaseSummaryBody {
    fn from(l: &LeaseSummary) -> Self {
        Self {
            holder: crate::api::ownership::display(&l.holder).to_string(),
            fence: l.fence.get(),
            expires_at: ms(l.expires_at),
            expired: l.expired,
        }
    }
}

impl LeaseSummaryBody {
    /// The core summary.
    pub fn to_summary(&self) -> Result<LeaseSummary, Problem> {
        Ok(LeaseSummary {
            holder: self.holder.clone(),
            fence: fence("fence", self.fence)?,
            expires_at: instant("expiresAt", self.expires_at)?,
            expired: self.expired,
        })
    }
}

/// The state of a park.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParkStateBody {
    /// Waiting for an answer.
    Outstanding,
    /// Deadline passed unanswered.
    Expired,
    /// Answered.
    Resolved,
}

impl From<ParkState> for ParkStateBody {
    fn from(p: ParkState) -> Self {
        match p {
            ParkState::Outstanding => Self::Outstanding,
            ParkState::Expired => Self::Expired,
            ParkState::Resolved => Self::Resolved,
        }
    }
}

impl From<ParkStateBody> for ParkState {
    fn from(p: ParkStateBody) -> Self {
        match p {
            ParkStateBody::Outstanding => Self::Outstanding,
            ParkStateBody::Expired => Self::Expired,
            ParkStateBody::Resolved => Self::Resolved,
        }
    }
}

/// A run's lifecycle status.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStatusBody {
    /// Runnable or running.
    Active,
    /// Finished successfully.
    Completed,
    /// Finished unsuccessfully (or dead-lettered).
    Failed,
    /// Called off.
    Cancelled,
}

impl From<RunStatus> for RunStatusBody {
    fn from(s: RunStatus) -> Self {
        match s {
            RunStatus::Active => Self::Active,
            RunStatus::Completed => Self::Completed,
            RunStatus::Failed => Self::Failed,
            RunStatus::Cancelled => Self::Cancelled,
        }
    }
}

impl From<RunStatusBody> for RunStatus {
    fn from(s: RunStatusBody) -> Self {
        match s {
            RunStatusBody::Active => Self::Active,
            RunStatusBody::Completed => Self::Completed,
            RunStatusBody::Failed => Self::Failed,
            RunStatusBody::Cancelled => Self::Cancelled,
        }
    }
}

/// How a holder ends a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FinishStatusBody {
    /// Done.
    Completed,
    /// Failed, not to be retried.
    Failed,
    /// Called off.
    Cancelled,
}

/// A listing order.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum OrderBody {
    /// By run id (default).
    #[default]
    RunId,
    /// By run start, unrecorded first.
    CreatedAt,
}

impl From<OrderBody> for ListOrder {
    fn from(o: OrderBody) -> Self {
        match o {
            OrderBody::RunId => ListOrder::RunId,
            OrderBody::CreatedAt => ListOrder::CreatedAt,
        }
    }
}

impl From<ListOrder> for OrderBody {
    fn from(o: ListOrder) -> Self {
        match o {
            ListOrder::CreatedAt => OrderBody::CreatedAt,
            _ => OrderBody::RunId,
        }
    }
}

/// The park a listing row shows.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParkSummaryBody {
    /// State at the page's instant.
    pub state: ParkStateBody,
    /// The checkpoint that parked.
    pub checkpoint_id: String,
    /// `request.type`.
    pub request_type: String,
    /// Parked at, epoch ms.
    pub parked_at: i64,
    /// Deadline, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<i64>,
    /// Answered at, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<i64>,
}

impl From<&ParkSummary> for ParkSummaryBody {
    fn from(p: &ParkSummary) -> Self {
        Self {
            state: p.state.into(),
            checkpoint_id: p.checkpoint_id.to_string(),
            request_type: p.request_type.clone(),
            parked_at: ms(p.parked_at),
            deadline_at: p.deadline_at.map(ms),
            resolved_at: p.resolved_at.map(ms),
        }
    }
}

impl ParkSummaryBody {
    fn to_summary(&self) -> Result<ParkSummary, Problem> {
        Ok(ParkSummary {
            state: self.state.into(),
            checkpoint_id: CheckpointId::new(&self.checkpoint_id)
                .map_err(|e| bad("park.checkpointId", e))?,
            request_type: self.request_type.clone(),
            parked_at: instant("park.parkedAt", self.parked_at)?,
            deadline_at: opt_instant("park.deadlineAt", self.deadline_at)?,
            resolved_at: opt_instant("park.resolvedAt", self.resolved_at)?,
        })
    }
}

/// One row of the listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRowBody {
    /// The run's address.
    pub run: RunAddress,
    /// Run start, epoch ms; absent when never recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_created_at: Option<i64>,
    /// Number of checkpoints.
    pub checkpoint_count: u64,
    /// The latest checkpoint (total order); absent only on a damaged row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint_id: Option<String>,
    /// Its `createdAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint_at: Option<i64>,
    /// The park by precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ParkSummaryBody>,
    /// The top holding; absent when never claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<LeaseSummaryBody>,
    /// Set when the run's records could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
    /// Lifecycle status.
    pub status: RunStatusBody,
    /// When finished, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Takeovers from expired leases so far.
    pub attempts: u32,
    /// Not claimable before, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<i64>,
    /// Dead-lettered: failed because its holders kept losing it (the store
    /// finished it at its attempt limit), not failed by a worker.
    #[serde(default)]
    pub dead_lettered: bool,
}

impl From<&RunRow> for RunRowBody {
    fn from(r: &RunRow) -> Self {
        Self {
            run: (&r.scope).into(),
            run_created_at: r.run_created_at.map(ms),
            checkpoint_count: r.checkpoint_count,
            latest_checkpoint_id: r.latest_checkpoint_id.as_ref().map(ToString::to_string),
            latest_checkpoint_at: r.latest_checkpoint_at.map(ms),
            park: r.park.as_ref().map(Into::into),
            claim: r.claim.as_ref().map(Into::into),
            damaged: r.damaged.as_deref().map(crate::problem::redact_paths),
            status: r.status.into(),
            finished_at: r.finished_at.map(ms),
            attempts: r.attempts,
            available_at: r.available_at.map(ms),
            dead_lettered: r.dead_lettered,
        }
    }
}

impl RunRowBody {
    /// The core row.
    pub fn to_row(&self) -> Result<RunRow, Problem> {
        Ok(RunRow {
            scope: self.run.to_scope("run")?,
            run_created_at: opt_instant("runCreatedAt", self.run_created_at)?,
            checkpoint_count: self.checkpoint_count,
            latest_checkpoint_id: self
                .latest_checkpoint_id
                .as_ref()
                .map(CheckpointId::new)
                .transpose()
                .map_err(|e| bad("latestCheckpointId", e))?,
            latest_checkpoint_at: opt_instant("latestCheckpointAt", self.latest_checkpoint_at)?,
            park: self.park.as_ref().map(|p| p.to_summary()).transpose()?,
            claim: self.claim.as_ref().map(|c| c.to_summary()).transpose()?,
            damaged: self.damaged.clone(),
            status: self.status.into(),
            finished_at: opt_instant("finishedAt", self.finished_at)?,
            attempts: self.attempts,
            available_at: opt_instant("availableAt", self.available_at)?,
            dead_lettered: self.dead_lettered,
        })
    }
}

/// A page of the listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct RunPageBody {
    /// Rows.
    pub entries: Vec<RunRowBody>,
    /// Present iff more rows remain: pass it back as `cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

impl From<&RunPage> for RunPageBody {
    fn from(p: &RunPage) -> Self {
        Self {
            entries: p.entries.iter().map(Into::into).collect(),
            cursor: p.cursor.clone(),
        }
    }
}

impl RunPageBody {
    /// The core page.
    pub fn to_page(&self) -> Result<RunPage, Problem> {
        Ok(RunPage {
            entries: self
                .entries
                .iter()
                .map(RunRowBody::to_row)
                .collect::<Result<_, _>>()?,
            cursor: self.cursor.clone(),
        })
    }
}

/// A finish: status, result, reason.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutcomeBody {
    /// Final status.
    pub status: FinishStatusBody,
    /// The run's result, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<&Outcome> for OutcomeBody {
    fn from(o: &Outcome) -> Self {
        Self {
            status: match o.status {
                FinishStatus::Completed => FinishStatusBody::Completed,
                FinishStatus::Failed => FinishStatusBody::Failed,
                FinishStatus::Cancelled => FinishStatusBody::Cancelled,
            },
            result: o.result.clone(),
            reason: o.reason.clone(),
        }
    }
}

impl From<&OutcomeBody> for Outcome {
    fn from(o: &OutcomeBody) -> Self {
        Outcome {
            status: match o.status {
                FinishStatusBody::Completed => FinishStatus::Completed,
                FinishStatusBody::Failed => FinishStatus::Failed,
                FinishStatusBody::Cancelled => FinishStatus::Cancelled,
            },
            result: o.result.clone(),
            reason: o.reason.clone(),
        }
    }
}

/// A run's lifecycle.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleBody {
    /// Status.
    pub status: RunStatusBody,
    /// Finished at, epoch ms (store clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// The fence the finish spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_fence: Option<u64>,
    /// The finish's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The finish's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Takeovers from expired leases.
    pub attempts: u32,
    /// The run's own attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Not claimable before, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<i64>,
}

impl From<&Lifecycle> for LifecycleBody {
    fn from(l: &Lifecycle) -> Self {
        Self {
            status: l.status.into(),
            finished_at: l.finished_at.map(ms),
            finished_fence: l.finished_fence.map(Fence::get),
            result: l.result.clone(),
            reason: l.reason.clone(),
            attempts: l.attempts,
            max_attempts: l.max_attempts,
            available_at: l.available_at.map(ms),
        }
    }
}

impl LifecycleBody {
    /// The core lifecycle.
    pub fn to_lifecycle(&self) -> Result<Lifecycle, Problem> {
        Ok(Lifecycle {
            status: self.status.into(),
            finished_at: opt_instant("finishedAt", self.finished_at)?,
            finished_fence: opt_fence("finishedFence", self.finished_fence)?,
            result: self.result.clone(),
            reason: self.reason.clone(),
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            available_at: opt_instant("availableAt", self.available_at)?,
        })
    }
}

/// A park: the human decision a run waits on.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingBody {
    /// The human-facing request; carries a string `type`.
    #[schema(value_type = Object)]
    pub request: Object,
    /// Parked at, epoch ms.
    pub parked_at: i64,
    /// Deadline, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<i64>,
    /// Answered at, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<i64>,
    /// The answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Value>,
    /// Any other fields, preserved.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[schema(value_type = Object)]
    pub extra: Object,
}

impl From<&PendingDecision> for PendingBody {
    fn from(p: &PendingDecision) -> Self {
        Self {
            request: p.request.clone(),
            parked_at: ms(p.parked_at),
            deadline_at: p.deadline_at.map(ms),
            resolved_at: p.resolved_at.map(ms),
            decision: p.decision.clone(),
            extra: p.extra.clone(),
        }
    }
}

impl PendingBody {
    fn to_pending(&self, field: &str) -> Result<PendingDecision, Problem> {
        Ok(PendingDecision {
            request: self.request.clone(),
            parked_at: instant(&format!("{field}.parkedAt"), self.parked_at)?,
            deadline_at: opt_instant(&format!("{field}.deadlineAt"), self.deadline_at)?,
            resolved_at: opt_instant(&format!("{field}.resolvedAt"), self.resolved_at)?,
            decision: self.decision.clone(),
            extra: self.extra.clone(),
        })
    }
}

/// A checkpoint: its header and the host's state, apart.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointBody {
    /// Id; writing an existing id replaces it.
    pub id: String,
    /// Written at, epoch ms.
    pub created_at: i64,
    /// Run start, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_created_at: Option<i64>,
    /// The park, when the run parks here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingBody>,
    /// The fence it was written under (set by the store; ignored on input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The host's state, kept as given.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub state: Object,
}

impl From<&Checkpoint> for CheckpointBody {
    fn from(c: &Checkpoint) -> Self {
        Self {
            id: c.id.to_string(),
            created_at: ms(c.created_at),
            run_created_at: c.run_created_at.map(ms),
            pending: c.pending.as_ref().map(Into::into),
            fence: c.fence.map(Fence::get),
            state: c.state.clone(),
        }
    }
}

impl From<Checkpoint> for CheckpointBody {
    /// Moves the state (an answer's checkpoint is not copied).
    fn from(mut c: Checkpoint) -> Self {
        let state = std::mem::take(&mut c.state);
        Self {
            state,
            ..Self::from(&c)
        }
    }
}

impl CheckpointBody {
    /// The core checkpoint, moving the state (a request's checkpoint is not
    /// copied); `field` names it in errors.
    pub fn into_checkpoint(self, field: &str) -> Result<Checkpoint, Problem> {
        let mut cp = self.clone_header().to_checkpoint(field)?;
        cp.state = self.state;
        Ok(cp)
    }

    fn clone_header(&self) -> Self {
        Self {
            id: self.id.clone(),
            created_at: self.created_at,
            run_created_at: self.run_created_at,
            pending: self.pending.clone(),
            fence: self.fence,
            state: Map::new(),
        }
    }

    /// The core checkpoint; `field` names it in errors.
    pub fn to_checkpoint(&self, field: &str) -> Result<Checkpoint, Problem> {
        let f = |n: &str| format!("{field}.{n}");
        Ok(Checkpoint {
            id: CheckpointId::new(&self.id).map_err(|e| bad(&f("id"), e))?,
            created_at: instant(&f("createdAt"), self.created_at)?,
            run_created_at: opt_instant(&f("runCreatedAt"), self.run_created_at)?,
            pending: self
                .pending
                .as_ref()
                .map(|p| p.to_pending(&f("pending")))
                .transpose()?,
            fence: opt_fence(&f("fence"), self.fence)?,
            state: self.state.clone(),
        })
    }
}

/// An event to append.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewEventBody {
    /// The `type` discriminator.
    #[serde(rename = "type")]
    pub event_type: String,
    /// Every other field (`type`, `seq`, `timestamp`, `generation` are the
    /// store's and refused here).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub payload: Object,
}

impl From<&NewEvent> for NewEventBody {
    fn from(e: &NewEvent) -> Self {
        Self {
            event_type: e.event_type.clone(),
            payload: e.payload.clone(),
        }
    }
}

impl From<&NewEventBody> for NewEvent {
    fn from(e: &NewEventBody) -> Self {
        NewEvent::new(e.event_type.clone(), e.payload.clone())
    }
}

/// An event as recorded.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventBody {
    /// 1-based position in the run's log (the SSE event id).
    pub seq: u64,
    /// Recorded at, epoch ms (store clock).
    pub timestamp: i64,
    /// `type`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The fence it was appended under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Every other field.
    #[schema(value_type = Object)]
    pub payload: Object,
}

impl From<&PersistedEvent> for EventBody {
    fn from(e: &PersistedEvent) -> Self {
        Self {
            seq: e.seq,
            timestamp: ms(e.timestamp),
            event_type: e.event_type.clone(),
            generation: e.generation.map(Fence::get),
            payload: e.payload.clone(),
        }
    }
}

impl EventBody {
    /// The core event.
    pub fn to_event(&self) -> Result<PersistedEvent, Problem> {
        Ok(PersistedEvent {
            seq: self.seq,
            timestamp: instant("timestamp", self.timestamp)?,
            event_type: self.event_type.clone(),
            generation: opt_fence("generation", self.generation)?,
            payload: self.payload.clone(),
        })
    }
}

/// A record a tolerant read skipped.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct SkippedBody {
    /// 1-based line position.
    pub position: u64,
    /// Why.
    pub reason: String,
}

/// An event read.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventBatchBody {
    /// Events after `sinceSeq`, in log order.
    pub events: Vec<EventBody>,
    /// Damaged records skipped (tolerant mode).
    #[serde(default)]
    pub skipped: Vec<SkippedBody>,
    /// The log's last `seq` (0 when empty).
    pub last_seq: u64,
}

impl From<&EventBatch> for EventBatchBody {
    fn from(b: &EventBatch) -> Self {
        Self {
            events: b.events.iter().map(Into::into).collect(),
            skipped: b
                .skipped
                .iter()
                .map(|s| SkippedBody {
                    position: s.position,
                    reason: crate::problem::redact_paths(&s.reason),
                })
                .collect(),
            last_seq: b.last_seq,
        }
    }
}

impl EventBatchBody {
    /// The core batch.
    pub fn to_batch(&self) -> Result<EventBatch, Problem> {
        Ok(EventBatch {
            events: self
                .events
                .iter()
                .map(EventBody::to_event)
                .collect::<Result<_, _>>()?,
            skipped: self
                .skipped
                .iter()
                .map(|s| SkippedRecord {
                    position: s.position,
                    reason: s.reason.clone(),
                })
                .collect(),
            last_seq: self.last_seq,
        })
    }
}

/// The kind of a message snapshot.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MessagesKind {
    /// Published with the event-log head it follows.
    Available,
    /// A pre-boundary snapshot: no boundary is invented.
    LegacyUnverified,
    /// Never written.
    Unavailable,
}

/// The message history as last published.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessagesBody {
    /// Which kind of snapshot.
    pub kind: MessagesKind,
    /// Log head at publish time (`available`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_event_seq: Option<u64>,
    /// The messages (absent when `unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Value>>,
}

impl From<&MessageSnapshot> for MessagesBody {
    fn from(m: &MessageSnapshot) -> Self {
        match m {
            MessageSnapshot::Available {
                through_event_seq,
                messages,
            } => Self {
                kind: MessagesKind::Available,
                through_event_seq: Some(*through_event_seq),
                messages: Some(messages.clone()),
            },
            MessageSnapshot::LegacyUnverified { messages } => Self {
                kind: MessagesKind::LegacyUnverified,
                through_event_seq: None,
                messages: Some(messages.clone()),
            },
            MessageSnapshot::Unavailable => Self {
                kind: MessagesKind::Unavailable,
                through_event_seq: None,
                messages: None,
            },
        }
    }
}

impl MessagesBody {
    /// The core snapshot.
    pub fn to_snapshot(&self) -> MessageSnapshot {
        match self.kind {
            MessagesKind::Available => MessageSnapshot::Available {
                through_event_seq: self.through_event_seq.unwrap_or(0),
                messages: self.messages.clone().unwrap_or_default(),
            },
            MessagesKind::LegacyUnverified => MessageSnapshot::LegacyUnverified {
                messages: self.messages.clone().unwrap_or_default(),
            },
            MessagesKind::Unavailable => MessageSnapshot::Unavailable,
        }
    }
}

/// An audit event to append.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewAuditBody {
    /// Who acted.
    pub who: String,
    /// What was done.
    pub what: String,
    /// How it ended.
    pub outcome: String,
    /// Any other fields.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub extra: Object,
}

impl From<&NewAuditEvent> for NewAuditBody {
    fn from(a: &NewAuditEvent) -> Self {
        Self {
            who: a.who.clone(),
            what: a.what.clone(),
            outcome: a.outcome.clone(),
            extra: a.extra.clone(),
        }
    }
}

impl From<&NewAuditBody> for NewAuditEvent {
    fn from(a: &NewAuditBody) -> Self {
        NewAuditEvent {
            who: a.who.clone(),
            what: a.what.clone(),
            outcome: a.outcome.clone(),
            extra: a.extra.clone(),
        }
    }
}

/// An audit record.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditBody {
    /// `aud_…` id.
    pub id: String,
    /// The run.
    pub run_id: String,
    /// 1-based position in the audit trail.
    pub seq: u64,
    /// Recorded at, epoch ms.
    pub timestamp: i64,
    /// Who.
    pub who: String,
    /// What.
    pub what: String,
    /// Outcome.
    pub outcome: String,
    /// Fence appended under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Other fields.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub extra: Object,
}

impl From<&AuditRecord> for AuditBody {
    fn from(a: &AuditRecord) -> Self {
        Self {
            id: a.id.clone(),
            run_id: a.run_id.clone(),
            seq: a.seq,
            timestamp: ms(a.timestamp),
            who: a.who.clone(),
            what: a.what.clone(),
            outcome: a.outcome.clone(),
            generation: a.generation.map(Fence::get),
            extra: a.extra.clone(),
        }
    }
}

impl AuditBody {
    /// The core record.
    pub fn to_record(&self) -> Result<AuditRecord, Problem> {
        Ok(AuditRecord {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            seq: self.seq,
            timestamp: instant("timestamp", self.timestamp)?,
            who: self.who.clone(),
            what: self.what.clone(),
            outcome: self.outcome.clone(),
            generation: opt_fence("generation", self.generation)?,
            extra: self.extra.clone(),
        })
    }
}

/// What a claim takes: holder, lease length and attempt limit (never an
/// instant: the store's clock judges every claim).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimBody {
    /// The claiming worker (unique per process). The same holder renews.
    pub holder: String,
    /// Lease length, ms.
    pub ttl_ms: u64,
    /// Attempt limit for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

impl ClaimBody {
    /// The core options.
    pub fn to_options(&self) -> Result<runkeep::ClaimOptions, Problem> {
        let mut o = runkeep::ClaimOptions::new(
            Holder::new(&self.holder).map_err(|e| bad("holder", e))?,
            Ttl::from_millis(self.ttl_ms).map_err(|e| bad("ttlMs", e))?,
        );
        o.max_attempts = self.max_attempts;
        Ok(o)
    }

    /// The wire form of core options. Refuses an explicit
    /// [`ClaimOptions::now`](runkeep::ClaimOptions::now): over HTTP the
    /// store's clock judges every expiry, and a claim cannot choose it.
    pub fn of(o: &runkeep::ClaimOptions) -> runkeep::Result<Self> {
        if o.now.is_some() {
            return Err(runkeep::Error::invalid(
                "ClaimOptions::now cannot be sent over HTTP: the server judges every claim at its store's clock. Leave it None (use a ManualClock on the backing store to test time in process)",
            ));
        }
        Ok(Self {
            holder: o.holder.to_string(),
            ttl_ms: o.ttl.as_millis(),
            max_attempts: o.max_attempts,
        })
    }
}

/// What a claim answered.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum ClaimAnswer {
    /// The run is yours at this fence.
    Acquired {
        /// The lease.
        lease: LeaseBody,
    },
    /// Someone else holds it live.
    Held {
        /// Their holding.
        lease: LeaseSummaryBody,
    },
    /// The run is finished.
    Finished {
        /// Its status.
        status: RunStatusBody,
    },
    /// Deferred until this instant.
    #[serde(rename_all = "camelCase")]
    NotBefore {
        /// Epoch ms.
        available_at: i64,
    },
}

impl From<&ClaimOutcome> for ClaimAnswer {
    fn from(o: &ClaimOutcome) -> Self {
        match o {
            ClaimOutcome::Acquired(l) => Self::Acquired { lease: l.into() },
            ClaimOutcome::Held(s) => Self::Held { lease: s.into() },
            ClaimOutcome::Finished(s) => Self::Finished {
                status: (*s).into(),
            },
            ClaimOutcome::NotBefore(t) => Self::NotBefore {
                available_at: ms(*t),
            },
        }
    }
}

impl ClaimAnswer {
    /// The core outcome.
    pub fn to_outcome(&self) -> Result<ClaimOutcome, Problem> {
        Ok(match self {
            Self::Acquired { lease } => ClaimOutcome::Acquired(lease.to_lease()?),
            Self::Held { lease } => ClaimOutcome::Held(lease.to_summary()?),
            Self::Finished { status } => ClaimOutcome::Finished((*status).into()),
            Self::NotBefore { available_at } => {
                ClaimOutcome::NotBefore(instant("availableAt", *available_at)?)
            }
        })
    }

    /// The short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Acquired { .. } => "acquired",
            Self::Held { .. } => "held",
            Self::Finished { .. } => "finished",
            Self::NotBefore { .. } => "not_before",
        }
    }
}

/// `claim_next`: scope narrowing, filter, claim options, optional wait.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimNextBody {
    /// Only this project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Only this session (needs `project`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Only runs whose park is in this set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<Vec<ParkStateBody>>,
    /// Which run first.
    #[serde(default)]
    pub order: OrderBody,
    /// The claiming worker (unique per process).
    pub holder: String,
    /// Lease length, ms.
    pub ttl_ms: u64,
    /// Attempt limit for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Wait up to this many ms (at most 30 000) for a run to become
    /// runnable when none is; 0 or absent answers at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

impl ClaimNextBody {
    /// The claim part, as a [`ClaimBody`].
    pub fn claim(&self) -> ClaimBody {
        ClaimBody {
            holder: self.holder.clone(),
            ttl_ms: self.ttl_ms,
            max_attempts: self.max_attempts,
        }
    }
}

/// A run taken by `claim_next`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Claimed {
    /// The run.
    pub run: RunAddress,
    /// Its lease.
    pub lease: LeaseBody,
}

/// The answer of `claim_next`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimNextAnswer {
    /// The run taken, or `null` when none was runnable (within the wait).
    pub claimed: Option<Claimed>,
}

/// A fence, for release (absent: an operator's release of whoever holds it).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The holding to release; absent releases the current holding
    /// (operator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// Whether a release or snooze took effect.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Done {
    /// True when the holding was the current one and is gone.
    pub done: bool,
}

/// Snooze: release and defer.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnoozeBody {
    /// The holding.
    pub fence: u64,
    /// Not claimable before, epoch ms.
    pub until: i64,
}

/// Finish: the holding and the outcome.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishBody {
    /// The holding (spent by the finish).
    pub fence: u64,
    /// How it ended.
    pub outcome: OutcomeBody,
}

/// Enqueue: the first checkpoint and the run's options.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueueBody {
    /// The run's first checkpoint.
    pub checkpoint: CheckpointBody,
    /// Not claimable before, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<i64>,
    /// The run's own attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// A checkpoint write.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteCheckpointBody {
    /// The checkpoint.
    pub checkpoint: CheckpointBody,
    /// The holding it is written under (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// A checkpoint (or none).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeCheckpoint {
    /// The checkpoint, `null` when there is none.
    pub checkpoint: Option<CheckpointBody>,
}

/// How a park is answered.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum ResolutionBody {
    /// A person's answer.
    Answer {
        /// The decision, kept as evidence.
        decision: Value,
    },
    /// Give up on an expired park (recorded as a pause).
    Expire,
}

/// A park answer.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    /// The answer.
    pub resolution: ResolutionBody,
    /// The holding it is written under; absent: an operator's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

impl ResolutionBody {
    /// The core resolution.
    pub fn to_resolution(&self) -> ParkResolution {
        match self {
            Self::Answer { decision } => ParkResolution::Answer(decision.clone()),
            Self::Expire => ParkResolution::Expire,
        }
    }

    /// The wire form.
    pub fn of(r: &ParkResolution) -> Self {
        match r {
            ParkResolution::Answer(d) => Self::Answer {
                decision: d.clone(),
            },
            ParkResolution::Expire => Self::Expire,
        }
    }
}

/// Prune: keep the newest `keepLast`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PruneBody {
    /// How many to keep (unanswered parks are always kept).
    pub keep_last: usize,
    /// The holding; absent: an operator's prune.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// The ids a prune deleted.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Pruned {
    /// Deleted checkpoint ids.
    pub deleted: Vec<String>,
}

/// An event append.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendEventsBody {
    /// Events, in order.
    pub events: Vec<NewEventBody>,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// Events as recorded.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Appended {
    /// With their `seq`.
    pub events: Vec<EventBody>,
}

/// A run record write.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordBody {
    /// The record.
    #[schema(value_type = Object)]
    pub record: Object,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// A run record read.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeRecord {
    /// The record, `null` when never written.
    #[schema(value_type = Option<Object>)]
    pub record: Option<Object>,
}

/// A message snapshot write.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WriteMessagesBody {
    /// The conversation.
    pub messages: Vec<Value>,
    /// The last event it accounts for.
    pub through_event_seq: u64,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// A report write.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    /// The report text.
    pub report: String,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// A report read.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeReport {
    /// The report, `null` when never written.
    pub report: Option<String>,
}

/// An audit append.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendAuditBody {
    /// Audit events, in order.
    pub events: Vec<NewAuditBody>,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
}

/// Audit records.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// In trail order.
    pub records: Vec<AuditBody>,
}

/// A message update inside a step.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepMessagesBody {
    /// The conversation as of this step.
    pub messages: Vec<Value>,
    /// The last event it accounts for; absent: the step's last event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_event_seq: Option<u64>,
}

/// One step of a run, written all or nothing.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepBody {
    /// Events to append.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<NewEventBody>,
    /// A checkpoint (with `pending` to park here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointBody>,
    /// A new message snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<StepMessagesBody>,
    /// A new run record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub run_record: Option<Object>,
    /// Finish the run with this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<OutcomeBody>,
}

impl From<&Step> for StepBody {
    fn from(s: &Step) -> Self {
        Self {
            events: s.events.iter().map(Into::into).collect(),
            checkpoint: s.checkpoint.as_ref().map(Into::into),
            messages: s.messages.as_ref().map(|m| StepMessagesBody {
                messages: m.messages.clone(),
                through_event_seq: m.through_event_seq,
            }),
            run_record: s.run_record.clone(),
            finish: s.finish.as_ref().map(Into::into),
        }
    }
}

impl StepBody {
    /// The core step, moving the payloads (a request's step is not copied).
    pub fn into_step(self) -> Result<Step, Problem> {
        Ok(Step {
            events: self
                .events
                .into_iter()
                .map(|e| NewEvent::new(e.event_type, e.payload))
                .collect(),
            checkpoint: self
                .checkpoint
                .map(|c| c.into_checkpoint("step.checkpoint"))
                .transpose()?,
            messages: self.messages.map(|m| MessagesUpdate {
                messages: m.messages,
                through_event_seq: m.through_event_seq,
            }),
            run_record: self.run_record,
            finish: self.finish.as_ref().map(Into::into),
        })
    }

    /// The core step.
    pub fn to_step(&self) -> Result<Step, Problem> {
        Ok(Step {
            events: self.events.iter().map(Into::into).collect(),
            checkpoint: self
                .checkpoint
                .as_ref()
                .map(|c| c.to_checkpoint("step.checkpoint"))
                .transpose()?,
            messages: self.messages.as_ref().map(|m| MessagesUpdate {
                messages: m.messages.clone(),
                through_event_seq: m.through_event_seq,
            }),
            run_record: self.run_record.clone(),
            finish: self.finish.as_ref().map(Into::into),
        })
    }
}

/// A step commit.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitStepBody {
    /// The holding; checked by the store with the whole step.
    pub fence: u64,
    /// The step.
    pub step: StepBody,
}

/// What a committed step wrote.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct StepReceiptBody {
    /// Events as recorded.
    pub events: Vec<EventBody>,
    /// The checkpoint as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointBody>,
    /// The lifecycle, when the step finished the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleBody>,
}

impl From<&StepReceipt> for StepReceiptBody {
    fn from(r: &StepReceipt) -> Self {
        Self {
            events: r.events.iter().map(Into::into).collect(),
            checkpoint: r.checkpoint.as_ref().map(Into::into),
            lifecycle: r.lifecycle.as_ref().map(Into::into),
        }
    }
}

impl StepReceiptBody {
    /// The core receipt.
    pub fn to_receipt(&self) -> Result<StepReceipt, Problem> {
        Ok(StepReceipt {
            events: self
                .events
                .iter()
                .map(EventBody::to_event)
                .collect::<Result<_, _>>()?,
            checkpoint: self
                .checkpoint
                .as_ref()
                .map(|c| c.to_checkpoint("checkpoint"))
                .transpose()?,
            lifecycle: self
                .lifecycle
                .as_ref()
                .map(LifecycleBody::to_lifecycle)
                .transpose()?,
        })
    }
}

/// A lease read.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeLease {
    /// The top holding, `null` when never claimed.
    pub lease: Option<LeaseSummaryBody>,
}

/// Everything the console shows of one run, in one call.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// The run.
    pub run: RunAddress,
    /// The top holding, judged at the store's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseSummaryBody>,
    /// The lifecycle.
    pub lifecycle: LifecycleBody,
    /// The latest checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint: Option<CheckpointBody>,
    /// The outstanding park's checkpoint, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<CheckpointBody>,
    /// The event log's last `seq`.
    pub last_seq: u64,
    /// The store's clock when this was read, epoch ms.
    pub now: i64,
}

/// The store's clock.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Clock {
    /// Epoch ms.
    pub now: i64,
}

/// Who a token is.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// The token's tenant.
    pub tenant: String,
    /// Its role: `reader`, `worker` or `operator`.
    pub role: String,
    /// Its id (never the secret).
    pub token_id: String,
}

/// The answer of a long-poll wait.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Waited {
    /// True when the store signalled a change before the timeout (it may be
    /// spurious: re-read).
    pub changed: bool,
    /// For an events wait: the log's last `seq` at the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<u64>,
}
