//! Whole-file run evidence: the run record (`run.json`), the message
//! snapshot (`messages.json`) and the final report (`report.md`). Each is
//! replaced atomically (sidecar + rename); reads create nothing.

use std::path::Path;

use runkeep::{Error, MessageSnapshot, Result, RunRecord};
use serde_json::{Map, Value};

use crate::checkpoints::{check_schema, SCHEMA_VERSION};
use crate::fenced_write::{self, FencedWrite};
use crate::inner::Inner;
use crate::sys::{self, Ctx};
use crate::testing_hooks;
use runkeep::{Fence, RunScope};

/// The run record file.
pub(crate) const RUN_RECORD: &str = "run.json";
/// The message snapshot file.
pub(crate) const MESSAGES: &str = "messages.json";
/// The report file.
pub(crate) const REPORT: &str = "report.md";
/// The message snapshot's format tag (the reference's).
pub(crate) const MESSAGES_FORMAT: &str = "namzu.run-message-snapshot.v1";

/// The bytes of a run record (stamped).
pub(crate) fn encode_record(record: &RunRecord) -> Result<Vec<u8>> {
    if record.contains_key("schemaVersion") {
        return Err(Error::invalid(
            "run record uses the reserved key \"schemaVersion\"; the store stamps it",
        ));
    }
    let mut m = record.clone();
    m.insert("schemaVersion".into(), Value::from(SCHEMA_VERSION));
    Ok(sys::record_json(&Value::Object(m)))
}

/// Reads the run record.
fn read_record_file(run_dir: &Path, ctx: &Ctx) -> Result<Option<RunRecord>> {
    let path = run_dir.join(RUN_RECORD);
    let Some(bytes) = sys::read_opt(&path).map_err(|e| ctx.io("read the run record", &path, e))?
    else {
        return Ok(None);
    };
    let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(ctx.corrupted(&path, "the run record is not a JSON object"));
    };
    check_schema(&m, &path, ctx)?;
    m.remove("schemaVersion");
    Ok(Some(m))
}

/// The bytes of a message snapshot.
pub(crate) fn encode_messages(messages: &[Value], through_event_seq: u64) -> Vec<u8> {
    let mut m = Map::new();
    m.insert("format".into(), Value::from(MESSAGES_FORMAT));
    m.insert("throughEventSeq".into(), Value::from(through_event_seq));
    m.insert("messages".into(), Value::Array(messages.to_vec()));
    m.insert("schemaVersion".into(), Value::from(SCHEMA_VERSION));
    sys::record_json(&Value::Object(m))
}

/// Reads the message snapshot: missing ⇒ unavailable; a bare
/// array ⇒ legacy-unverified; the versioned envelope ⇒ available; anything
/// else is refused, never degraded to an empty snapshot.
fn read_messages_file(run_dir: &Path, ctx: &Ctx) -> Result<MessageSnapshot> {
    let path = run_dir.join(MESSAGES);
    let Some(bytes) =
        sys::read_opt(&path).map_err(|e| ctx.io("read the message snapshot", &path, e))?
    else {
        return Ok(MessageSnapshot::Unavailable);
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|_| ctx.corrupted(&path, "invalid run message snapshot: invalid JSON"))?;
    match v {
        Value::Array(messages) => Ok(MessageSnapshot::LegacyUnverified { messages }),
        Value::Object(mut m) => {
            check_schema(&m, &path, ctx)?;
            let through = m
                .get("throughEventSeq")
                .and_then(Value::as_u64)
                .filter(|n| *n < (1u64 << 53));
            let tagged = m.get("format").and_then(Value::as_str) == Some(MESSAGES_FORMAT);
            match (tagged, through, m.remove("messages")) {
                (true, Some(through_event_seq), Some(Value::Array(messages))) => {
                    Ok(MessageSnapshot::Available {
                        through_event_seq,
                        messages,
                    })
                }
                _ => Err(ctx.corrupted(
                    &path,
                    format!("invalid run message snapshot: expected a versioned snapshot ({MESSAGES_FORMAT} with throughEventSeq and messages)"),
                )),
            }
        }
        _ => Err(ctx.corrupted(
            &path,
            "invalid run message snapshot: expected a versioned snapshot",
        )),
    }
}

/// Reads the report.
fn read_report_file(run_dir: &Path, ctx: &Ctx) -> Result<Option<String>> {
    let path = run_dir.join(REPORT);
    let Some(bytes) = sys::read_opt(&path).map_err(|e| ctx.io("read the report", &path, e))? else {
        return Ok(None);
    };
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| ctx.corrupted(&path, "the report is not UTF-8 text"))
}

/// Writes the run record (its keys checked, `schemaVersion` stamped).
pub(crate) fn write_run_record(
    inner: &Inner,
    scope: &RunScope,
    record: &RunRecord,
    fence: Option<Fence>,
) -> Result<()> {
    runkeep::evidence::check_json_document("run record", record, record.values())?;
    let bytes = encode_record(record)?;
    write_document(inner, scope, "write_run_record", RUN_RECORD, bytes, fence)
}

/// Reads the run record of a run; creates nothing.
pub(crate) fn read_run_record(inner: &Inner, scope: &RunScope) -> Result<Option<RunRecord>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "read_run_record");
    read_record_file(&inner.run_dir(scope), &ctx)
}

/// Writes the message snapshot, current through `through_event_seq`.
pub(crate) fn write_messages(
    inner: &Inner,
    scope: &RunScope,
    messages: &[Value],
    through_event_seq: u64,
    fence: Option<Fence>,
) -> Result<()> {
    runkeep::evidence::check_json_document("message snapshot", messages, messages)?;
    let bytes = encode_messages(messages, through_event_seq);
    write_document(inner, scope, "write_messages", MESSAGES, bytes, fence)
}

/// Reads the message snapshot of a run; creates nothing.
pub(crate) fn read_messages(inner: &Inner, scope: &RunScope) -> Result<MessageSnapshot> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "read_messages");
    read_messages_file(&inner.run_dir(scope), &ctx)
}

/// Writes the final report.
pub(crate) fn write_report(
    inner: &Inner,
    scope: &RunScope,
    report: &str,
    fence: Option<Fence>,
) -> Result<()> {
    runkeep::evidence::check_document_size("report", report.len())?;
    let bytes = report.as_bytes().to_vec();
    write_document(inner, scope, "write_report", REPORT, bytes, fence)
}

/// Reads the report of a run; creates nothing.
pub(crate) fn read_report(inner: &Inner, scope: &RunScope) -> Result<Option<String>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "read_report");
    read_report_file(&inner.run_dir(scope), &ctx)
}

/// A whole-document write (run record, messages, report) through the
/// fenced-write skeleton.
fn write_document(
    inner: &Inner,
    scope: &RunScope,
    operation: &'static str,
    file: &'static str,
    bytes: Vec<u8>,
    fence: Option<Fence>,
) -> Result<()> {
    inner.check_scope(scope)?;
    // The long part — writing (and under `PowerLoss` syncing) the whole
    // document — happens before the lock; under the lock only the fence
    // check and the `rename` run, so a slow disk cannot stretch the
    // window between the check and the publish.
    fenced_write::fenced_write(
        inner,
        FencedWrite::new(scope, operation, fence),
        |ctx, run_dir, _| {
            let temp = sys::TempFile::write(run_dir, file, &bytes, inner.durability)
                .map_err(|e| ctx.io("write", &run_dir.join(file), e))?;
            testing_hooks::delay(testing_hooks::Delay::DocumentBeforeLock);
            Ok(temp)
        },
        |ctx, run_dir, _, temp| {
            temp.publish(file)
                .map_err(|e| ctx.io("publish", &run_dir.join(file), e))
        },
    )
}
