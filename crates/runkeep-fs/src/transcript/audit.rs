//! The audit trail (`audit.jsonl`): its own `seq`, appended and read like
//! the transcript but without an index.

use std::fs::File;
use std::io::{self};
use std::os::unix::fs::FileExt;
use std::path::Path;

use runkeep::{AuditRecord, Error, Fence, NewAuditEvent, Result, Timestamp};
use serde_json::{Map, Value};

use super::append::open_log;
use super::format::AUDIT;
use super::torn_tail::{roll_back, settle_tail};
use crate::lock::RunLock;
use crate::options::Durability;
use crate::sys::{self, Ctx};

/// Parses an audit line leniently: the reference writes `who`/`what` as
/// objects; they are kept as their compact JSON text.
pub(super) fn parse_audit(line: &[u8]) -> Option<AuditRecord> {
    let Value::Object(mut m) = serde_json::from_slice::<Value>(line).ok()? else {
        return None;
    };
    let text = |v: Option<Value>| -> Option<String> {
        match v? {
            Value::String(s) => Some(s),
            other => Some(other.to_string()),
        }
    };
    let seq = m.remove("seq")?.as_u64().filter(|s| *s > 0)?;
    let id = text(m.remove("id"))?;
    let run_id = text(m.remove("runId")).unwrap_or_default();
    let timestamp = m
        .remove("timestamp")
        .and_then(|t| t.as_f64())
        .and_then(|t| Timestamp::from_f64(t.trunc().max(0.0)).ok())
        .unwrap_or(Timestamp::EPOCH);
    let who = text(m.remove("who")).unwrap_or_default();
    let what = text(m.remove("what")).unwrap_or_default();
    let outcome = text(m.remove("outcome")).unwrap_or_default();
    let generation = m
        .remove("generation")
        .and_then(|g| g.as_u64())
        .and_then(|g| Fence::new(g).ok());
    Some(AuditRecord {
        id,
        run_id,
        seq,
        timestamp,
        who,
        what,
        outcome,
        generation,
        extra: m,
    })
}

/// The highest `seq` of the audit trail, reading from the end.
pub(super) fn audit_last_seq(file: &File, len: u64) -> io::Result<u64> {
    let chunk = len.min(64 * 1024);
    let mut buf = vec![0u8; chunk as usize];
    file.read_exact_at(&mut buf, len - chunk)?;
    let found = buf
        .split(|b| *b == b'\n')
        .rev()
        .filter(|l| !l.is_empty())
        .find_map(|l| {
            serde_json::from_slice::<Map<String, Value>>(l)
                .ok()
                .and_then(|m| m.get("seq").and_then(Value::as_u64))
        });
    match found {
        Some(s) => Ok(s),
        None if chunk < len => {
            let mut all = vec![0u8; len as usize];
            file.read_exact_at(&mut all, 0)?;
            Ok(all
                .split(|b| *b == b'\n')
                .filter_map(|l| serde_json::from_slice::<Map<String, Value>>(l).ok())
                .filter_map(|m| m.get("seq").and_then(Value::as_u64))
                .max()
                .unwrap_or(0))
        }
        None => Ok(0),
    }
}

/// Appends audit events (caller holds the run lock and checked the fence).
pub(crate) fn append_to_trail(
    run_dir: &Path,
    run_id: &str,
    events: &[NewAuditEvent],
    fence: Option<Fence>,
    durability: Durability,
    ctx: &Ctx,
    now: Timestamp,
) -> Result<Vec<AuditRecord>> {
    let path = run_dir.join(AUDIT);
    let (mut file, len) = open_log(run_dir, AUDIT, durability, ctx)?;
    let len = settle_tail(&mut file, len, &path, ctx)?;
    let last = audit_last_seq(&file, len).map_err(|e| ctx.io("read", &path, e))?;
    let mut buf = Vec::new();
    let mut out = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let rec = e.record(run_id, last + 1 + i as u64, now, fence);
        serde_json::to_writer(&mut buf, &rec)
            .map_err(|e| Error::invalid(format!("audit event is not serializable: {e}")))?;
        buf.push(b'\n');
        out.push(rec);
    }
    // All or nothing, as for events (no pending record: a trail torn by a
    // dead appender is left to the grace rule of `settle_tail`).
    let mut written = 0u64;
    let wrote = crate::sys::write_log(&mut file, &buf, &path, &mut written)
        .map_err(|e| ctx.io("append to", &path, e))
        .and_then(|()| match durability {
            Durability::PowerLoss => {
                sys::sync_file(&file, &path).map_err(|e| ctx.io("sync", &path, e))
            }
            Durability::ProcessCrash => Ok(()),
        });
    if let Err(e) = wrote {
        roll_back(&file, len, written, &path, ctx);
        return Err(e);
    }
    Ok(out)
}

/// Reads the audit trail after `since_seq`; unparseable lines are skipped.
pub(crate) fn read_trail(run_dir: &Path, since_seq: u64, ctx: &Ctx) -> Result<Vec<AuditRecord>> {
    let path = run_dir.join(AUDIT);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if sys::is_not_found(&e) => return Ok(Vec::new()),
        Err(e) => return Err(ctx.io("open the audit trail", &path, e)),
    };
    let len = {
        let _lock = RunLock::for_read(run_dir, ctx);
        file.metadata()
            .map_err(|e| ctx.io("read the audit trail", &path, e))?
            .len()
    };
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| ctx.io("read the audit trail", &path, e))?;
    Ok(buf
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(parse_audit)
        .filter(|r| r.seq > since_seq)
        .collect())
}
