//! Per-run documents: the run record, message snapshots, the report, audit records.

use super::*;

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
    #[schema(maximum = 9_007_199_254_740_991_i64)]
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
    #[schema(min_length = 1)]
    pub who: String,
    /// What was done.
    #[schema(min_length = 1)]
    pub what: String,
    /// How it ended.
    #[schema(min_length = 1)]
    pub outcome: String,
    /// Any other fields.
    #[serde(default)]
    #[schema(schema_with = new_audit_extra)]
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
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub run_id: String,
    /// 1-based position in the audit trail.
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub seq: u64,
    /// Recorded at, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub timestamp: i64,
    /// Who.
    pub who: String,
    /// What.
    pub what: String,
    /// Outcome.
    pub outcome: String,
    /// Fence appended under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
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

/// A run record write.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordBody {
    /// The record.
    #[schema(value_type = Object)]
    pub record: Object,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
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
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub through_event_seq: u64,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
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
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
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
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// Audit records.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    /// In trail order.
    pub records: Vec<AuditBody>,
}

/// The keys an audit event's extra fields may not use
/// (`runkeep::evidence::NewAuditEvent::validate`).
const AUDIT_RESERVED_KEYS: [&str; 8] = [
    "id",
    "runId",
    "seq",
    "timestamp",
    "who",
    "what",
    "outcome",
    "generation",
];

/// [`NewAuditBody::extra`]'s schema: an object without the record's own
/// keys ([`AUDIT_RESERVED_KEYS`]).
fn new_audit_extra() -> utoipa::openapi::Schema {
    crate::openapi::object_refusing_keys("Any other fields.", &AUDIT_RESERVED_KEYS)
}
