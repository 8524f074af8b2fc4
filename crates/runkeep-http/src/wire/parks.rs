//! Parks: their state, the pending decision a parked run waits on, and its answer.

use super::*;

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

/// The park a listing row shows.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParkSummaryBody {
    /// State at the page's instant.
    pub state: ParkStateBody,
    /// The checkpoint that parked.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub checkpoint_id: String,
    /// `request.type`.
    pub request_type: String,
    /// Parked at, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub parked_at: i64,
    /// Deadline, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub deadline_at: Option<i64>,
    /// Answered at, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
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
    pub(super) fn to_summary(&self) -> Result<ParkSummary, Problem> {
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

/// A park: the human decision a run waits on.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingBody {
    /// The human-facing request; carries a string `type`.
    #[schema(schema_with = park_request)]
    pub request: Object,
    /// Parked at, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub parked_at: i64,
    /// Deadline, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub deadline_at: Option<i64>,
    /// Answered at, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
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
    pub(super) fn to_pending(&self, field: &str) -> Result<PendingDecision, Problem> {
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
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
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

/// A park's `request` ([`PendingBody::request`],
/// [`threads::ThreadParkBody::request`]): an object carrying a `type`, a
/// string that is not empty.
pub(crate) fn park_request() -> utoipa::openapi::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("The human-facing request; carries a string `type`."))
        .required("type")
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1)),
        )
        .build()
        .into()
}
