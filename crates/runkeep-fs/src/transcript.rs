//! The event transcript (`transcript.jsonl`) with its offset index, and the
//! audit trail (`audit.jsonl`).
//!
//! Lines are compact JSON objects, `\n`-terminated, in the reference's shape
//! (the payload's fields, `type`, `seq`, `timestamp`, and `generation` when
//! fenced). The store assigns `seq` under the run lock, so two appenders
//! never share a number.
//!
//! # Offset index
//!
//! `.runkeep/transcript.idx` (additive) is a 40-byte header — magic
//! `RKTXIDX1`, the transcript's device and inode, flags, the highest `seq` —
//! followed by one fixed 24-byte record `(byte offset, seq, position)` per
//! readable line, appended together with the lines. A `since_seq` read
//! binary-searches the records with `pread` and reads only from the last line
//! at or before the cursor: O(log n + tail), not a scan. The index is only a
//! hint: a reader uses it only if it names this very file, is monotone, and
//! the line at the chosen offset is the recorded one; otherwise (missing,
//! stale, written by the reference) it scans the file. Readers never write
//! it; the next append repairs it.
//!
//! # Torn tails
//!
//! A process killed mid-append can leave a final fragment without a newline.
//! Only an appender holding the run lock heals it (by terminating the
//! fragment with `\n`, so it stays a skipped damaged record and the next
//! event starts on its own line); a read never modifies the file.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use runkeep::evidence::SkippedRecord;
use runkeep::{
    AuditRecord, Error, EventBatch, Fence, Integrity, NewAuditEvent, NewEvent, PersistedEvent,
    ReadEventsOptions, Result, Timestamp,
};
use serde_json::{Map, Value};

use crate::lock::{RunLock, META_DIR};
use crate::sys::{self, Ctx};
use crate::testing_hooks::{self, Point};
use crate::Durability;

/// The transcript file of a run.
pub(crate) const TRANSCRIPT: &str = "transcript.jsonl";
/// The audit trail of a run.
pub(crate) const AUDIT: &str = "audit.jsonl";
/// The offset index inside the run's meta directory.
pub(crate) const INDEX_FILE: &str = "transcript.idx";

const MAGIC: &[u8; 8] = b"RKTXIDX1";
const HDR: u64 = 40;
const REC: u64 = 24;
const FLAG_NON_MONOTONE: u64 = 1;

/// What one non-empty line is.
enum Parsed {
    Event(PersistedEvent),
    /// An object whose `seq` is not a positive integer.
    BadSeq(Value),
    Damaged(String),
}

fn parse_line(bytes: &[u8], position: u64) -> Parsed {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => {
            if !matches!(m.get("type"), Some(Value::String(_))) {
                return Parsed::Damaged("is not an event object".into());
            }
            if let Some(v) = m.get("seq") {
                if v.as_u64().is_none_or(|s| s == 0) {
                    return Parsed::BadSeq(v.clone());
                }
            }
            match PersistedEvent::from_json(m, position) {
                Ok(e) => Parsed::Event(e),
                Err(reason) => Parsed::Damaged(reason),
            }
        }
        Ok(_) => Parsed::Damaged("is not an event object".into()),
        Err(_) => Parsed::Damaged("is not valid JSON".into()),
    }
}

/// Non-empty lines of `buf` with their absolute offsets and whether each is
/// newline-terminated.
fn lines(buf: &[u8], base: u64) -> impl Iterator<Item = (u64, &[u8], bool)> {
    let mut start = 0usize;
    std::iter::from_fn(move || loop {
        if start >= buf.len() {
            return None;
        }
        let (end, next, terminated) = match buf[start..].iter().position(|b| *b == b'\n') {
            Some(i) => (start + i, start + i + 1, true),
            None => (buf.len(), buf.len(), false),
        };
        let off = base + start as u64;
        let line = &buf[start..end];
        start = next;
        if !line.is_empty() {
            return Some((off, line, terminated));
        }
    })
}

#[derive(Default)]
struct Collected {
    events: Vec<PersistedEvent>,
    skipped: Vec<SkippedRecord>,
    max_seq: u64,
}

fn strict_error(ctx: &Ctx, path: &Path, what: String) -> Error {
    Error::corrupted(format!(
        "{} on run {}: invalid run transcript in {}: {what}",
        ctx.operation,
        ctx.run,
        path.display()
    ))
}

/// Reads lines of `buf` (starting at position `first_pos`) into a batch.
/// `expect_first`: the index record the first line must match.
fn collect(
    buf: &[u8],
    base: u64,
    first_pos: u64,
    expect_first: Option<u64>,
    options: &ReadEventsOptions,
    strict: Option<(&Ctx, &Path)>,
) -> Result<Option<Collected>> {
    let mut out = Collected::default();
    let limit = options.limit.unwrap_or(usize::MAX);
    let mut pos = first_pos - 1;
    let mut expected = 1u64;
    for (i, (_, line, terminated)) in lines(buf, base).enumerate() {
        pos += 1;
        let parsed = parse_line(line, pos);
        if i == 0 {
            if let Some(seq) = expect_first {
                if !matches!(&parsed, Parsed::Event(e) if e.seq == seq) {
                    return Ok(None);
                }
            }
        }
        match parsed {
            Parsed::Event(e) => {
                if let Some((ctx, path)) = strict {
                    if e.seq != expected {
                        return Err(strict_error(
                            ctx,
                            path,
                            format!("record {pos} has sequence {}, expected {expected}", e.seq),
                        ));
                    }
                    expected += 1;
                }
                out.max_seq = out.max_seq.max(e.seq);
                if e.seq <= options.since_seq {
                    // Damage before the reader's cursor is not its concern.
                    out.skipped.clear();
                } else if out.events.len() < limit {
                    out.events.push(e);
                }
            }
            Parsed::BadSeq(v) => {
                if let Some((ctx, path)) = strict {
                    return Err(strict_error(
                        ctx,
                        path,
                        format!("record {pos} has sequence {v}, expected {expected}"),
                    ));
                }
                out.skipped.push(SkippedRecord {
                    position: pos,
                    reason: format!("has sequence {v}, which is not a positive integer"),
                });
            }
            Parsed::Damaged(reason) => {
                if let Some((ctx, path)) = strict {
                    return Err(strict_error(ctx, path, format!("record {pos} {reason}")));
                }
                let reason = if terminated {
                    reason
                } else {
                    format!("{reason}; it is the final record and is not newline-terminated (a torn write)")
                };
                out.skipped.push(SkippedRecord {
                    position: pos,
                    reason,
                });
            }
        }
    }
    Ok(Some(out))
}

#[derive(Clone, Copy, Debug)]
struct Rec {
    off: u64,
    seq: u64,
    pos: u64,
}

fn rec_at(idx: &File, i: u64) -> io::Result<Rec> {
    let mut b = [0u8; REC as usize];
    idx.read_exact_at(&mut b, HDR + i * REC)?;
    let n = |k: usize| u64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap_or_default());
    Ok(Rec {
        off: n(0),
        seq: n(1),
        pos: n(2),
    })
}

#[derive(Clone, Copy, Debug)]
struct Header {
    dev: u64,
    ino: u64,
    flags: u64,
    max_seq: u64,
}

fn read_header(idx: &File) -> Option<Header> {
    let mut b = [0u8; HDR as usize];
    idx.read_exact_at(&mut b, 0).ok()?;
    if &b[..8] != MAGIC {
        return None;
    }
    let n = |k: usize| u64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap_or_default());
    Some(Header {
        dev: n(1),
        ino: n(2),
        flags: n(3),
        max_seq: n(4),
    })
}

fn header_bytes(h: &Header) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for v in [h.dev, h.ino, h.flags, h.max_seq] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Where an indexed `since_seq` read starts: the last indexed line with
/// `seq <= since` (its offset, position, seq) and the header's highest seq.
fn index_start(run_dir: &Path, tmeta: &std::fs::Metadata, since: u64) -> Option<(Rec, u64)> {
    let idx = File::open(run_dir.join(META_DIR).join(INDEX_FILE)).ok()?;
    let ilen = idx.metadata().ok()?.len();
    let h = read_header(&idx)?;
    if h.dev != tmeta.dev() || h.ino != tmeta.ino() || h.flags & FLAG_NON_MONOTONE != 0 {
        return None;
    }
    let n = ilen.checked_sub(HDR)? / REC;
    if n == 0 {
        return None;
    }
    // First record with seq > since.
    let (mut lo, mut hi) = (0u64, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if rec_at(&idx, mid).ok()?.seq > since {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if lo == 0 {
        return None;
    }
    let r = rec_at(&idx, lo - 1).ok()?;
    (r.off < tmeta.len() && r.pos >= 1).then_some((r, h.max_seq))
}

/// Reads the transcript (spec §4.4/4.5; no side effects).
pub(crate) fn read_events(
    run_dir: &Path,
    options: &ReadEventsOptions,
    ctx: &Ctx,
) -> Result<EventBatch> {
    let path = run_dir.join(TRANSCRIPT);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if sys::is_not_found(&e) => return Ok(EventBatch::default()),
        Err(e) => return Err(ctx.io("open the transcript", &path, e)),
    };
    // The committed length: taken while no appender is mid-write (appenders
    // hold the run lock exclusive). The log only grows, so the prefix up to
    // it is stable and is read without holding the lock.
    let meta = {
        let _lock = RunLock::for_read(run_dir, ctx);
        file.metadata()
            .map_err(|e| ctx.io("read the transcript", &path, e))?
    };
    let len = meta.len();
    if options.integrity == Integrity::Tolerant && options.since_seq > 0 {
        if let Some((r, hdr_max)) = index_start(run_dir, &meta, options.since_seq) {
            let start = r.off.saturating_sub(1);
            let mut buf = vec![0u8; (len - start) as usize];
            file.read_exact_at(&mut buf, start)
                .map_err(|e| ctx.io("read the transcript", &path, e))?;
            let aligned = r.off == 0 || buf.first() == Some(&b'\n');
            let body = if r.off == 0 { &buf[..] } else { &buf[1..] };
            if aligned {
                if let Some(c) = collect(body, r.off, r.pos, Some(r.seq), options, None)? {
                    return Ok(EventBatch {
                        events: c.events,
                        skipped: c.skipped,
                        last_seq: c.max_seq.max(hdr_max),
                    });
                }
            }
        }
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| ctx.io("read the transcript", &path, e))?;
    let strict = options.integrity == Integrity::Strict;
    if strict && !buf.is_empty() && buf.last() != Some(&b'\n') {
        return Err(strict_error(
            ctx,
            &path,
            "final record is not newline-terminated".into(),
        ));
    }
    let c = collect(&buf, 0, 1, None, options, strict.then_some((ctx, &path)))?.unwrap_or_default();
    Ok(EventBatch {
        events: c.events,
        skipped: c.skipped,
        last_seq: c.max_seq,
    })
}

/// The index, opened for appending (under the run lock).
struct IndexWriter {
    file: File,
    header: Header,
    count: u64,
}

impl IndexWriter {
    fn open(run_dir: &Path, tmeta: &std::fs::Metadata) -> io::Result<Self> {
        let path = run_dir.join(META_DIR).join(INDEX_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)?;
        let ilen = file.metadata()?.len();
        let mut me = Self {
            file,
            header: Header {
                dev: tmeta.dev(),
                ino: tmeta.ino(),
                flags: 0,
                max_seq: 0,
            },
            count: 0,
        };
        match read_header(&me.file) {
            Some(h) if h.dev == tmeta.dev() && h.ino == tmeta.ino() && ilen >= HDR => {
                me.header = h;
                me.count = (ilen - HDR) / REC;
                if HDR + me.count * REC != ilen {
                    me.file.set_len(HDR + me.count * REC)?;
                }
            }
            _ => me.reset()?,
        }
        Ok(me)
    }

    fn reset(&mut self) -> io::Result<()> {
        self.header.flags = 0;
        self.header.max_seq = 0;
        self.count = 0;
        self.file.set_len(0)?;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    fn last(&self) -> Option<Rec> {
        self.count
            .checked_sub(1)
            .and_then(|i| rec_at(&self.file, i).ok())
    }

    fn append(&mut self, recs: &[Rec], max_seq: u64, non_monotone: bool) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(recs.len() * REC as usize);
        for r in recs {
            for v in [r.off, r.seq, r.pos] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.file.write_all_at(&bytes, HDR + self.count * REC)?;
        self.count += recs.len() as u64;
        self.header.max_seq = self.header.max_seq.max(max_seq);
        if non_monotone {
            self.header.flags |= FLAG_NON_MONOTONE;
        }
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }
}

/// What an appender learns about the existing log.
struct Tail {
    max_seq: u64,
    last_pos: u64,
    new_recs: Vec<Rec>,
    non_monotone: bool,
}

/// Brings the index up to the file's current end (scanning only what it does
/// not cover) and answers the log's highest seq and last position.
fn catch_up(file: &File, len: u64, index: Option<&mut IndexWriter>) -> io::Result<Tail> {
    let mut resume: Option<(Rec, u64, bool, Vec<u8>)> = None;
    if let Some(ix) = index {
        if let Some(r) = ix.last() {
            if r.off < len {
                let from = r.off.saturating_sub(1);
                let mut buf = vec![0u8; (len - from) as usize];
                file.read_exact_at(&mut buf, from)?;
                let aligned = r.off == 0 || buf.first() == Some(&b'\n');
                if r.off > 0 {
                    buf.remove(0);
                }
                let line = buf.split(|b| *b == b'\n').next().unwrap_or(&[]);
                let same = matches!(parse_line(line, r.pos), Parsed::Event(e) if e.seq == r.seq);
                if aligned && same {
                    let non_mono = ix.header.flags & FLAG_NON_MONOTONE != 0;
                    resume = Some((r, ix.header.max_seq, non_mono, buf));
                }
            }
            if resume.is_none() {
                ix.reset()?;
            }
        }
    }
    let (from, first_pos, skip_seq, mut max_seq, mut non_monotone, buf) = match resume {
        Some((r, max, nm, buf)) => (r.off, r.pos, Some(r.seq), max, nm, buf),
        None => {
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, 0)?;
            (0, 1, None, 0, false, buf)
        }
    };
    let mut pos = first_pos - 1;
    let mut prev = skip_seq;
    let mut new_recs = Vec::new();
    for (i, (off, line, _)) in lines(&buf, from).enumerate() {
        pos += 1;
        if i == 0 && skip_seq.is_some() {
            continue;
        }
        if let Parsed::Event(e) = parse_line(line, pos) {
            if prev.is_some_and(|p| e.seq < p) {
                non_monotone = true;
            }
            prev = Some(e.seq);
            max_seq = max_seq.max(e.seq);
            new_recs.push(Rec {
                off,
                seq: e.seq,
                pos,
            });
        }
    }
    Ok(Tail {
        max_seq,
        last_pos: pos,
        new_recs,
        non_monotone,
    })
}

fn open_log(dir: &Path, name: &str, durability: Durability, ctx: &Ctx) -> Result<(File, u64)> {
    let path = dir.join(name);
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
        .open(&path)
        .map_err(|e| ctx.io("open", &path, e))?;
    if !existed && durability == Durability::PowerLoss {
        sys::sync_dir(dir).map_err(|e| ctx.io("sync the run directory", dir, e))?;
    }
    let len = file.metadata().map_err(|e| ctx.io("read", &path, e))?.len();
    Ok((file, len))
}

/// Terminates a torn final record (under the run lock only). Returns the
/// new length.
fn heal(file: &mut File, len: u64, path: &Path, ctx: &Ctx) -> Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)
        .map_err(|e| ctx.io("read", path, e))?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    testing_hooks::fault(Point::Append, path)
        .and_then(|()| file.write_all(b"\n"))
        .map_err(|e| ctx.io("terminate the torn final record of", path, e))?;
    Ok(len + 1)
}

/// The one log write of an append (with its test seams: an injected errno
/// before it, a short write that lands half the buffer and fails, a pause
/// point in the middle of it).
fn write_log(file: &mut File, buf: &[u8], path: &Path) -> io::Result<()> {
    testing_hooks::fault(Point::Append, path)?;
    if let Some(e) = testing_hooks::short_write(Point::Append, path) {
        file.write_all(&buf[..buf.len() / 2])?;
        return Err(e);
    }
    if testing_hooks::pause_requested("mid-append-write") {
        let half = buf.len() / 2;
        file.write_all(&buf[..half])?;
        testing_hooks::pause("mid-append-write");
        return file.write_all(&buf[half..]);
    }
    file.write_all(buf)
}

/// Appends events (caller holds the run lock and has checked the fence).
pub(crate) fn append_events(
    run_dir: &Path,
    events: &[NewEvent],
    fence: Option<Fence>,
    durability: Durability,
    ctx: &Ctx,
) -> Result<Vec<PersistedEvent>> {
    let path = run_dir.join(TRANSCRIPT);
    let (mut file, len) = open_log(run_dir, TRANSCRIPT, durability, ctx)?;
    let tmeta = file.metadata().map_err(|e| ctx.io("read", &path, e))?;
    let mut index = IndexWriter::open(run_dir, &tmeta).ok();
    let tail = catch_up(&file, len, index.as_mut()).map_err(|e| ctx.io("read", &path, e))?;
    let len = heal(&mut file, len, &path, ctx)?;
    let now = Timestamp::now();
    let mut buf = Vec::new();
    let mut out = Vec::with_capacity(events.len());
    let mut recs = tail.new_recs;
    let non_monotone = tail.non_monotone;
    for (i, e) in events.iter().enumerate() {
        let pe = e.persist(tail.max_seq + 1 + i as u64, now, fence);
        let off = len + buf.len() as u64;
        serde_json::to_writer(&mut buf, &Value::Object(pe.to_json()))
            .map_err(|e| Error::invalid(format!("event is not serializable: {e}")))?;
        buf.push(b'\n');
        recs.push(Rec {
            off,
            seq: pe.seq,
            pos: tail.last_pos + 1 + i as u64,
        });
        out.push(pe);
    }
    // Numbers are assigned; only the write is left (the soak once caught a
    // writer stopped exactly here while another appended without the lock).
    testing_hooks::pause("before-append-write");
    write_log(&mut file, &buf, &path).map_err(|e| ctx.io("append to", &path, e))?;
    if durability == Durability::PowerLoss {
        sys::sync_file(&file, &path).map_err(|e| ctx.io("sync", &path, e))?;
    }
    // With O_APPEND the write landed at the end; if that is not where we
    // computed (someone appended without the lock), leave the index behind:
    // the next append catches it up by scanning.
    let end = file.stream_position().unwrap_or(0);
    if let Some(ix) = index.as_mut() {
        if end == len + buf.len() as u64 {
            let max = out.last().map_or(tail.max_seq, |e| e.seq);
            if let Err(e) = ix.append(&recs, max, non_monotone) {
                tracing::debug!("could not update the transcript index of {}: {e}", ctx.run);
            }
        }
    }
    Ok(out)
}

/// Parses an audit line leniently: the reference writes `who`/`what` as
/// objects; they are kept as their compact JSON text.
fn parse_audit(line: &[u8]) -> Option<AuditRecord> {
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
fn audit_last_seq(file: &File, len: u64) -> io::Result<u64> {
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
pub(crate) fn append_audit(
    run_dir: &Path,
    run_id: &str,
    events: &[NewAuditEvent],
    fence: Option<Fence>,
    durability: Durability,
    ctx: &Ctx,
) -> Result<Vec<AuditRecord>> {
    let path = run_dir.join(AUDIT);
    let (mut file, len) = open_log(run_dir, AUDIT, durability, ctx)?;
    let len = heal(&mut file, len, &path, ctx)?;
    let last = audit_last_seq(&file, len).map_err(|e| ctx.io("read", &path, e))?;
    let now = Timestamp::now();
    let mut buf = Vec::new();
    let mut out = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let rec = e.record(run_id, last + 1 + i as u64, now, fence);
        serde_json::to_writer(&mut buf, &rec)
            .map_err(|e| Error::invalid(format!("audit event is not serializable: {e}")))?;
        buf.push(b'\n');
        out.push(rec);
    }
    write_log(&mut file, &buf, &path).map_err(|e| ctx.io("append to", &path, e))?;
    if durability == Durability::PowerLoss {
        sys::sync_file(&file, &path).map_err(|e| ctx.io("sync", &path, e))?;
    }
    Ok(out)
}

/// Reads the audit trail after `since_seq`; unparseable lines are skipped.
pub(crate) fn read_audit(run_dir: &Path, since_seq: u64, ctx: &Ctx) -> Result<Vec<AuditRecord>> {
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

/// True when a non-empty log file's last byte is not a newline.
pub(crate) fn is_torn(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    let Ok(len) = f.metadata().map(|m| m.len()) else {
        return false;
    };
    let mut b = [0u8; 1];
    len > 0 && f.read_exact_at(&mut b, len - 1).is_ok() && b[0] != b'\n'
}
