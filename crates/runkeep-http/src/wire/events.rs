//! Events: appends, reads and the batches a reader pages through.

use super::*;

/// The `limit` of an event read that gives none.
pub const DEFAULT_EVENTS_PAGE: usize = 1000;
/// The largest `limit` an event read accepts (400 above it).
pub const MAX_EVENTS_PAGE: usize = 10_000;

/// An event to append.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewEventBody {
    /// The `type` discriminator: 1 to 128 bytes, no control characters.
    #[serde(rename = "type")]
    #[schema(pattern = r"^(?:[\x20-\x7e]{1,128}|[^\x00-\x1f\x7f-\x9f]{1,32})$")]
    pub event_type: String,
    /// Every other field (`type`, `seq`, `timestamp`, `generation` are the
    /// store's and refused here).
    #[serde(default)]
    #[schema(schema_with = new_event_payload)]
    pub payload: Object,
}

/// [`NewEventBody::payload`]'s schema: an object without the store's keys
/// ([`runkeep::evidence::RESERVED_EVENT_KEYS`]).
fn new_event_payload() -> utoipa::openapi::Schema {
    crate::openapi::object_refusing_keys(
        "Every other field (`type`, `seq`, `timestamp`, `generation` are the store's and refused here).",
        &runkeep::evidence::RESERVED_EVENT_KEYS,
    )
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
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub seq: u64,
    /// Recorded at, epoch ms (store clock).
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub timestamp: i64,
    /// `type`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The fence it was appended under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
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
    #[schema(maximum = 9_007_199_254_740_991_i64)]
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
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub last_seq: u64,
    /// Events follow this page: it stopped at its `limit` (a read answers
    /// at most [`MAX_EVENTS_PAGE`] events). Read on with `sinceSeq` =
    /// `nextSinceSeq`.
    #[serde(default)]
    pub more: bool,
    /// Where the next page starts: the last `seq` of this page (absent
    /// when it has no events: read on from the same `sinceSeq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub next_since_seq: Option<u64>,
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
            more: false,
            next_since_seq: None,
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

/// An event append.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendEventsBody {
    /// Events, in order.
    pub events: Vec<NewEventBody>,
    /// The holding (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// Events as recorded.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Appended {
    /// With their `seq`.
    pub events: Vec<EventBody>,
}

/// The answer of the live tail (`GET …/events/stream`): Server-Sent Events,
/// not JSON. [`HttpStore::follow_events`](crate::HttpStore::follow_events)
/// reads it frame by frame; the document states its frames
/// ([`EventStream::frame_schema`]).
#[derive(Clone, Copy, Debug)]
pub struct EventStream;

impl EventStream {
    /// One frame of the tail, as a Server-Sent Events reader sees it:
    /// `event: event` with the event's `seq` as `id` and an [`EventBody`]
    /// as `data`, or, when the log can no longer be read, one
    /// `event: problem` frame with a problem detail, and the stream ends.
    pub fn frame_schema() -> utoipa::openapi::Schema {
        let json_of = |schema: &str| {
            serde_json::json!({
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": { "$ref": format!("#/components/schemas/{schema}") },
            })
        };
        let frame = utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::SchemaType::AnyValue)
            .description(Some(
                "One Server-Sent Events frame: `event: event`, `id:` the event's `seq`, `data:` an EventBody; or a last `event: problem` frame whose `data` is a problem detail.",
            ));
        crate::openapi::with_keyword(
            frame,
            "oneOf",
            serde_json::json!([
                {
                    "type": "object",
                    "required": ["event", "id", "data"],
                    "properties": {
                        "event": { "const": "event" },
                        "id": { "type": "string", "pattern": "^[1-9][0-9]*$" },
                        "data": json_of("EventBody"),
                    },
                },
                {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "event": { "const": "problem" },
                        "data": json_of("Problem"),
                    },
                },
            ]),
        )
    }
}
