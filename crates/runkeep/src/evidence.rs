//! A run's evidence: the event transcript, the run record, the message
//! snapshot, the final report, the completed-tool ledger and the audit trail.
//!
//! Every write of evidence takes the same optional fence as a checkpoint write
//! and is refused the same way when it is superseded: a lease buys a coherent
//! run, not only a coherent resume point.
//!
//! Events are numbered by the store: an append assigns `seq = last + 1`
//! atomically with the write, so two appenders can never share a number, and
//! a superseded appender is refused before it writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::lease::Fence;
use crate::time::Timestamp;

/// Largest serialized event accepted, in bytes (4 MiB).
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Keys the store owns in an event line.
pub const RESERVED_EVENT_KEYS: [&str; 4] = ["type", "seq", "timestamp", "generation"];

/// Event types that are never persisted (the emitter excludes them; a store
/// does not re-filter).
pub const EPHEMERAL_EVENT_TYPES: [&str; 4] = [
    "text_delta",
    "tool_input_delta",
    "reasoning_delta",
    "tool_progress",
];

/// An event to append.
#[derive(Clone, PartialEq, Debug)]
pub struct NewEvent {
    /// The `type` discriminator.
    pub event_type: String,
    /// Every other field.
    pub payload: Map<String, Value>,
}

impl NewEvent {
    /// An event of `event_type` with `payload`.
    pub fn new(event_type: impl Into<String>, payload: Map<String, Value>) -> Self {
        Self {
            event_type: event_type.into(),
            payload,
        }
    }

    /// The event as recorded at `seq` and `timestamp` under `generation`
    /// (the store's stamping rule, shared by every backend).
    pub fn persist(
        &self,
        seq: u64,
        timestamp: Timestamp,
        generation: Option<Fence>,
    ) -> PersistedEvent {
        PersistedEvent {
            seq,
            timestamp,
            event_type: self.event_type.clone(),
            generation,
            payload: self.payload.clone(),
        }
    }

    /// Checks type, reserved keys and size.
    pub fn validate(&self) -> Result<()> {
        if self.event_type.is_empty() || self.event_type.len() > 128 {
            return Err(Error::invalid(format!(
                "event type {:?} must be 1 to 128 bytes",
                self.event_type
            )));
        }
        if self.event_type.chars().any(char::is_control) {
            return Err(Error::invalid("event type contains a control character"));
        }
        for key in RESERVED_EVENT_KEYS {
            if self.payload.contains_key(key) {
                return Err(Error::invalid(format!(
                    "event payload uses the reserved key {key:?}; the store assigns it"
                )));
            }
        }
        let size = serde_json::to_vec(&self.payload)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_EVENT_BYTES {
            return Err(Error::invalid(format!(
                "event of type {} is {size} bytes; the limit is {MAX_EVENT_BYTES}. Store large bodies elsewhere and reference them",
                self.event_type
            )));
        }
        Ok(())
    }
}

/// An event as recorded.
#[derive(Clone, PartialEq, Debug)]
pub struct PersistedEvent {
    /// 1-based position in the run's log.
    pub seq: u64,
    /// When the store recorded it (0 for legacy undated lines).
    pub timestamp: Timestamp,
    /// `type`.
    pub event_type: String,
    /// The fence it was appended under (absent for unfenced appends).
    pub generation: Option<Fence>,
    /// Every other field.
    pub payload: Map<String, Value>,
}

impl PersistedEvent {
    /// The flat JSON line form (reference layout: payload fields, `type`,
    /// `seq`, `timestamp`, plus `generation` when fenced).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("type".into(), Value::String(self.event_type.clone()));
        for (k, v) in &self.payload {
            out.insert(k.clone(), v.clone());
        }
        out.insert("seq".into(), Value::from(self.seq));
        out.insert("timestamp".into(), Value::from(self.timestamp.as_millis()));
        if let Some(g) = self.generation {
            out.insert("generation".into(), Value::from(g.get()));
        }
        out
    }

    /// Parses a line object; `position` is the line's 1-based position, used
    /// as `seq` for legacy unsequenced lines. Errors describe why the line is
    /// not an event.
    pub fn from_json(
        mut obj: Map<String, Value>,
        position: u64,
    ) -> std::result::Result<Self, String> {
        let event_type = match obj.remove("type") {
            Some(Value::String(t)) => t,
            _ => return Err("is not an event object (no string `type`)".into()),
        };
        let seq = match obj.remove("seq") {
            None => position,
            Some(v) => match v.as_u64() {
                Some(s) if s > 0 => s,
                _ => return Err(format!("has sequence {v}, which is not a positive integer")),
            },
        };
        let timestamp = match obj.remove("timestamp") {
            Some(v) => v
                .as_i64()
                .and_then(|t| Timestamp::from_millis(t).ok())
                .or_else(|| v.as_f64().and_then(|f| Timestamp::from_f64(f.trunc()).ok()))
                .unwrap_or(Timestamp::EPOCH),
            None => Timestamp::EPOCH,
        };
        let generation = match obj.remove("generation") {
            None | Some(Value::Null) => None,
            Some(v) => v.as_u64().and_then(|g| Fence::new(g).ok()),
        };
        Ok(Self {
            seq,
            timestamp,
            event_type,
            generation,
            payload: obj,
        })
    }
}

/// How strictly a read judges the log.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Integrity {
    /// Skip damaged records and report them in [`EventBatch::skipped`] (default).
    #[default]
    Tolerant,
    /// Refuse ([`Error::Corrupted`]) on any damaged record, torn tail, or
    /// sequence that is not exactly 1, 2, 3, …; the whole log is checked.
    Strict,
}

/// Options of an event read.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReadEventsOptions {
    /// Return only events with `seq > since_seq` (exclusive).
    pub since_seq: u64,
    /// Integrity mode.
    pub integrity: Integrity,
    /// At most this many events (all when `None`).
    pub limit: Option<usize>,
}

/// A record a tolerant read skipped.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SkippedRecord {
    /// 1-based line position.
    pub position: u64,
    /// Why.
    pub reason: String,
}

/// The answer of an event read.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct EventBatch {
    /// Events in log order with `seq > since_seq`.
    pub events: Vec<PersistedEvent>,
    /// Damaged records skipped (tolerant mode); empty in a clean log.
    ///
    /// A read reports the damaged records of the span of the log it
    /// covered: those after the reader's cursor (the last record with
    /// `seq <= since_seq`, in log order) up to the last event it returns
    /// when it returns `limit` events, up to the log's end otherwise; a
    /// `limit` of 0 covers nothing. A reader paging with `since_seq` set to
    /// the last `seq` it got, until a page comes back with fewer than
    /// `limit` events, is told of each damaged record once, by the page
    /// that passed over it.
    pub skipped: Vec<SkippedRecord>,
    /// The log's last `seq` (0 when empty).
    pub last_seq: u64,
}

/// The run's message history as last published.
#[derive(Clone, PartialEq, Debug)]
pub enum MessageSnapshot {
    /// Published together with the event-log head it was published after.
    Available {
        /// Log head at publish time.
        through_event_seq: u64,
        /// Messages.
        messages: Vec<Value>,
    },
    /// A pre-boundary snapshot (a bare array): no boundary is invented.
    LegacyUnverified {
        /// Messages.
        messages: Vec<Value>,
    },
    /// Never written.
    Unavailable,
}

impl MessageSnapshot {
    /// Stable kind name: `available`, `legacy-unverified`, `unavailable`.
    pub fn kind(&self) -> &'static str {
        match self {
            MessageSnapshot::Available { .. } => "available",
            MessageSnapshot::LegacyUnverified { .. } => "legacy-unverified",
            MessageSnapshot::Unavailable => "unavailable",
        }
    }
}

/// A completed tool call recorded in the transcript.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletedTool {
    /// Tool use id.
    pub tool_use_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Result text ("" when not a string).
    pub result: String,
    /// Whether the tool reported an error.
    pub is_error: bool,
}

/// The completed-tool ledger. `complete` is false when the log had damaged
/// records: an entry present means "answered", but an absent one is then not
/// proof of "not answered".
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CompletedTools {
    /// By tool use id; the last completion wins.
    pub tools: BTreeMap<String, CompletedTool>,
    /// True when every record of the log was readable.
    pub complete: bool,
}

/// The ledger rule over a log read: each `tool_completed` event with string
/// `toolUseId` and `toolName` records `{result (string or ""), isError}`;
/// the last one for an id wins.
pub fn completed_tools(batch: &EventBatch) -> CompletedTools {
    let mut tools = BTreeMap::new();
    for e in &batch.events {
        if e.event_type != "tool_completed" {
            continue;
        }
        let (Some(id), Some(name)) = (
            e.payload.get("toolUseId").and_then(Value::as_str),
            e.payload.get("toolName").and_then(Value::as_str),
        ) else {
            continue;
        };
        tools.insert(
            id.to_string(),
            CompletedTool {
                tool_use_id: id.to_string(),
                tool_name: name.to_string(),
                result: e
                    .payload
                    .get("result")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                is_error: e.payload.get("isError") == Some(&Value::Bool(true)),
            },
        );
    }
    CompletedTools {
        tools,
        complete: batch.skipped.is_empty(),
    }
}

/// The strict-mode sequence rule: `seqs` (in log order) must be exactly
/// 1, 2, 3, …  Returns `(position, found, expected)` of the first violation.
pub fn first_sequence_violation(
    seqs: impl IntoIterator<Item = (u64, u64)>,
) -> Option<(u64, u64, u64)> {
    (1..)
        .zip(seqs)
        .find(|(expected, (_, seq))| seq != expected)
        .map(|(expected, (position, seq))| (position, seq, expected))
}

/// An audit event to append. `who`, `what` and `outcome` are required; the
/// store assigns `seq` (its own sequence, separate from events), `timestamp`
/// and `id`.
#[derive(Clone, PartialEq, Debug)]
pub struct NewAuditEvent {
    /// Who acted.
    pub who: String,
    /// What was done.
    pub what: String,
    /// How it ended.
    pub outcome: String,
    /// Any other fields (cost, reason, trace ids…).
    pub extra: Map<String, Value>,
}

impl NewAuditEvent {
    /// An audit event.
    pub fn new(
        who: impl Into<String>,
        what: impl Into<String>,
        outcome: impl Into<String>,
    ) -> Self {
        Self {
            who: who.into(),
            what: what.into(),
            outcome: outcome.into(),
            extra: Map::new(),
        }
    }

    /// The audit record of run `run_id` at `seq` and `timestamp` under
    /// `generation`, with a fresh `aud_…` id (the store's stamping rule,
    /// shared by every backend).
    pub fn record(
        &self,
        run_id: &str,
        seq: u64,
        timestamp: Timestamp,
        generation: Option<Fence>,
    ) -> AuditRecord {
        AuditRecord {
            id: format!("aud_{}", crate::id::random_suffix(12)),
            run_id: run_id.to_string(),
            seq,
            timestamp,
            who: self.who.clone(),
            what: self.what.clone(),
            outcome: self.outcome.clone(),
            generation,
            extra: self.extra.clone(),
        }
    }

    /// Checks required fields, reserved keys and size.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("who", &self.who),
            ("what", &self.what),
            ("outcome", &self.outcome),
        ] {
            if v.is_empty() {
                return Err(Error::invalid(format!("audit event `{name}` is empty")));
            }
        }
        for key in [
            "id",
            "runId",
            "seq",
            "timestamp",
            "who",
            "what",
            "outcome",
            "generation",
        ] {
            if self.extra.contains_key(key) {
                return Err(Error::invalid(format!(
                    "audit event extra fields use the reserved key {key:?}"
                )));
            }
        }
        let size = serde_json::to_vec(&self.extra)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_EVENT_BYTES {
            return Err(Error::invalid(format!(
                "audit event is {size} bytes; the limit is {MAX_EVENT_BYTES}"
            )));
        }
        Ok(())
    }
}

/// An audit event as recorded.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// `aud_…` id.
    pub id: String,
    /// The run.
    pub run_id: String,
    /// 1-based position in the audit trail.
    pub seq: u64,
    /// When recorded.
    pub timestamp: Timestamp,
    /// Who.
    pub who: String,
    /// What.
    pub what: String,
    /// Outcome.
    pub outcome: String,
    /// Fence appended under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<Fence>,
    /// Other fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Run record (the host's projection of its run: status, usage, timings…).
pub type RunRecord = Map<String, Value>;

/// Largest run record, report or message snapshot accepted (64 MiB).
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024 * 1024;

/// Checks a document's size.
pub fn check_document_size(what: &str, bytes: usize) -> Result<()> {
    if bytes > MAX_DOCUMENT_BYTES {
        return Err(Error::invalid(format!(
            "{what} is {bytes} bytes; the limit is {MAX_DOCUMENT_BYTES}"
        )));
    }
    Ok(())
}

/// Checks a JSON document (a run record, a message snapshot): its compact
/// size ([`MAX_DOCUMENT_BYTES`]) and its values (at most
/// [`crate::checkpoint::MAX_CHECKPOINT_VALUES`], the checkpoint's limit, for
/// the same reason: a value costs a reader far more than its bytes).
pub fn check_json_document<'a, T: Serialize + ?Sized>(
    what: &str,
    document: &T,
    values: impl IntoIterator<Item = &'a Value>,
) -> Result<()> {
    use crate::checkpoint::{count_values, json_len, MAX_CHECKPOINT_VALUES};
    check_document_size(what, json_len(document))?;
    if count_values(values, MAX_CHECKPOINT_VALUES) > MAX_CHECKPOINT_VALUES {
        return Err(Error::invalid(format!(
            "{what} holds more than {MAX_CHECKPOINT_VALUES} JSON values; store large arrays as one string (e.g. base64) or elsewhere, referenced from it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_document_of_too_many_values_is_refused_whatever_its_bytes() {
        let limit = crate::checkpoint::MAX_CHECKPOINT_VALUES;
        let ok = vec![Value::from(0); limit];
        check_json_document("message snapshot", &ok, &ok).unwrap();
        let over = vec![Value::from(0); limit + 1];
        let e = check_json_document("message snapshot", &over, &over)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 1048576 JSON values"), "{e}");
        let mut record = RunRecord::new();
        record.insert("xs".into(), Value::Array(vec![Value::from(0); limit]));
        let e = check_json_document("run record", &record, record.values())
            .unwrap_err()
            .to_string();
        assert!(e.contains("run record holds more than"), "{e}");
    }

    #[test]
    fn legacy_lines_take_their_position_and_undated_lines_read_zero() {
        let e = PersistedEvent::from_json(json!({"type": "x"}).as_object().unwrap().clone(), 3)
            .unwrap();
        assert_eq!(e.seq, 3);
        assert_eq!(e.timestamp, Timestamp::EPOCH);
        assert!(
            PersistedEvent::from_json(json!({"seq": 1}).as_object().unwrap().clone(), 1).is_err()
        );
        assert!(PersistedEvent::from_json(
            json!({"type": "x", "seq": -1}).as_object().unwrap().clone(),
            1
        )
        .is_err());
    }

    #[test]
    fn sequence_rule() {
        assert_eq!(first_sequence_violation([(1, 1), (2, 2)]), None);
        assert_eq!(first_sequence_violation([(1, 1), (2, 3)]), Some((2, 3, 2)));
        assert_eq!(first_sequence_violation([(1, 2)]), Some((1, 2, 1)));
    }

    #[test]
    fn ledger_last_completion_wins_and_damage_marks_it_incomplete() {
        let ev = |seq, result: &str| PersistedEvent {
            seq,
            timestamp: Timestamp::EPOCH,
            event_type: "tool_completed".into(),
            generation: None,
            payload: json!({"toolUseId": "t1", "toolName": "bash", "result": result})
                .as_object()
                .unwrap()
                .clone(),
        };
        let mut batch = EventBatch {
            events: vec![ev(1, "a"), ev(2, "b")],
            skipped: vec![],
            last_seq: 2,
        };
        let t = completed_tools(&batch);
        assert_eq!(t.tools["t1"].result, "b");
        assert!(t.complete);
        batch.skipped.push(SkippedRecord {
            position: 3,
            reason: "bad".into(),
        });
        assert!(!completed_tools(&batch).complete);
    }

    #[test]
    fn events_refuse_reserved_keys_and_huge_payloads() {
        let mut p = Map::new();
        p.insert("seq".into(), json!(3));
        assert!(NewEvent::new("x", p).validate().is_err());
        let mut p = Map::new();
        p.insert("blob".into(), json!("x".repeat(MAX_EVENT_BYTES + 1)));
        assert!(NewEvent::new("x", p)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("limit"));
        assert!(NewEvent::new("", Map::new()).validate().is_err());
    }
}

/// A consumer's position in a run's transcript.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReplayCursor {
    /// The last `seq` the consumer saw.
    pub since_seq: u64,
    /// The generation (fence) it was reading under, if known.
    pub generation: Option<Fence>,
}

/// Why a catch-up cannot be trusted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReplayGap {
    /// The log was written under another holding; sequences are not comparable.
    GenerationChanged,
    /// The consumer is ahead of the log (the log did not survive).
    CursorAhead,
    /// The first event returned is not `since_seq + 1`.
    Gap,
}

/// The verdict on a catch-up read.
#[derive(Clone, PartialEq, Debug)]
pub enum ReplayVerdict {
    /// The consumer is at the head; nothing to deliver.
    Complete,
    /// Deliver these events: they continue the consumer's cursor exactly.
    Replayed(Vec<PersistedEvent>),
    /// Deliver nothing: a short catch-up would fold a hole into the consumer.
    Unavailable(ReplayGap),
}

/// The replay rule, in this order: generations both known and
/// different ⇒ `GenerationChanged`; cursor past the head ⇒ `CursorAhead`; at
/// the head ⇒ `Complete`; first event not `since_seq + 1` ⇒ `Gap`; else
/// `Replayed`. An unknown generation on either side neither matches nor
/// mismatches.
pub fn replay_verdict(
    cursor: ReplayCursor,
    head_seq: u64,
    head_generation: Option<Fence>,
    events: Vec<PersistedEvent>,
) -> ReplayVerdict {
    if let (Some(a), Some(b)) = (cursor.generation, head_generation) {
        if a != b {
            return ReplayVerdict::Unavailable(ReplayGap::GenerationChanged);
        }
    }
    if cursor.since_seq > head_seq {
        return ReplayVerdict::Unavailable(ReplayGap::CursorAhead);
    }
    if cursor.since_seq == head_seq {
        return ReplayVerdict::Complete;
    }
    match events.first() {
        Some(e) if e.seq == cursor.since_seq + 1 => ReplayVerdict::Replayed(events),
        _ => ReplayVerdict::Unavailable(ReplayGap::Gap),
    }
}

#[cfg(test)]
mod replay_tests {
    use super::*;

    fn ev(seq: u64) -> PersistedEvent {
        PersistedEvent {
            seq,
            timestamp: Timestamp::EPOCH,
            event_type: "x".into(),
            generation: None,
            payload: Map::new(),
        }
    }

    #[test]
    fn verdicts_in_their_order() {
        let f = |n| Fence::new(n).ok();
        let c = |s, g| ReplayCursor {
            since_seq: s,
            generation: g,
        };
        assert_eq!(
            replay_verdict(c(9, f(1)), 3, f(2), vec![]),
            ReplayVerdict::Unavailable(ReplayGap::GenerationChanged)
        );
        assert_eq!(
            replay_verdict(c(9, None), 3, f(2), vec![]),
            ReplayVerdict::Unavailable(ReplayGap::CursorAhead)
        );
        assert_eq!(
            replay_verdict(c(3, f(2)), 3, f(2), vec![]),
            ReplayVerdict::Complete
        );
        assert_eq!(
            replay_verdict(c(1, None), 3, None, vec![ev(3)]),
            ReplayVerdict::Unavailable(ReplayGap::Gap)
        );
        assert_eq!(
            replay_verdict(c(1, None), 3, None, vec![]),
            ReplayVerdict::Unavailable(ReplayGap::Gap)
        );
        assert_eq!(
            replay_verdict(c(1, None), 3, None, vec![ev(2), ev(3)]),
            ReplayVerdict::Replayed(vec![ev(2), ev(3)])
        );
    }
}
