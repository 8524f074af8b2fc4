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
//! readable line, appended together with the lines. A tolerant read is a
//! page: it binary-searches the records with `pread`, reads from the last
//! line at or before the cursor and stops at the line that fills its
//! `limit`, so it costs O(log n + page), not the log's length. Its
//! `last_seq` is the `seq` of the index's last record below the file's
//! length (records are monotone, so it is the highest of every line up to
//! it), verified against its line, and of the lines after that record,
//! which it scans: the lines a lock-less writer (the reference) appended
//! without indexing them, normally none. The index is only a hint: a reader
//! uses it only if it names this very file, is monotone, and the line at
//! each offset it relies on is the recorded one; otherwise (missing, stale,
//! written by the reference) the page is read from the file's start and
//! the rest of the file is scanned for `last_seq`. Readers never write it;
//! the next append repairs it. Strict reads check the whole file.
//!
//! # Failed and torn appends
//!
//! An append is all or nothing. The batch is one buffer written at the end
//! of the log under the run lock; if the write or its fsync fails, the log
//! is truncated back to its length before the call (and the index's
//! pending records dropped), so the file is byte-identical and a retry
//! does not duplicate anything ([`roll_back`]).
//!
//! A process killed mid-append leaves a final fragment without a newline.
//! Only an appender holding the run lock touches it (a read never modifies
//! the file):
//!
//! - a transcript append records its batch in the index as *pending*
//!   before writing it ([`FLAG_PENDING`]); the next appender finding a
//!   pending batch whose appender is gone (it holds the lock now) and a log
//!   ending in a prefix of that batch removes the prefix, whole lines of it
//!   included ([`IndexWriter::resolve_pending`]);
//! - any other fragment (the audit trail, a transcript without a usable
//!   index, a reference writer's line) is removed only once the file has
//!   been unmodified for [`TORN_GRACE`], else terminated with `\n` as the
//!   reference does, so a line a lock-less writer is still writing is never
//!   cut ([`settle_tail`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use runkeep::evidence::SkippedRecord;
use runkeep::{
    AuditRecord, Error, EventBatch, Fence, Integrity, NewAuditEvent, NewEvent, PersistedEvent,
    ReadEventsOptions, Result, Timestamp,
};
use rustix::fs::{Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
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
    /// Where a tolerant page stopped because it held `limit` events: the
    /// end of the line that filled it and the position of the line after
    /// it. `None`: it read to the end.
    stop: Option<(u64, u64)>,
}

fn strict_error(ctx: &Ctx, path: &Path, what: String) -> Error {
    Error::corrupted(format!(
        "{} on run {}: invalid run transcript in {}: {what}",
        ctx.operation,
        ctx.run,
        path.display()
    ))
}

/// The most of a transcript a read holds at a time: a read's memory is this
/// plus the events it returns, whatever the log's length (issue 11, item 4).
const READ_CHUNK: usize = 1 << 20;
/// A read's first chunk; each next one doubles, up to [`READ_CHUNK`], so a
/// small page (or the head) reads little and a long read few times.
const FIRST_CHUNK: usize = 64 << 10;

/// What a read cost: bytes of the transcript read, lines parsed (the test
/// seams count them: `testing_hooks::note_transcript_read`).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadCost {
    pub(crate) bytes: u64,
    pub(crate) lines: u64,
}

/// Feeds every non-empty line of `file` in `[start, end)` to `f` (absolute
/// offset, bytes, newline-terminated), reading [`FIRST_CHUNK`] bytes first,
/// then twice as many each time up to [`READ_CHUNK`]; the same lines as
/// [`lines`] over the whole range. Stops when `f` answers false. Adds the
/// bytes it read to `cost`.
fn stream_lines(
    file: &File,
    start: u64,
    end: u64,
    cost: &mut ReadCost,
    f: &mut dyn FnMut(u64, &[u8], bool) -> bool,
) -> io::Result<()> {
    let read = stream_lines_by(file, start, end, FIRST_CHUNK, READ_CHUNK, f);
    cost.bytes += read.as_ref().map_or(0, |n| *n);
    read.map(|_| ())
}

/// [`stream_lines`] with chunks of `first` bytes growing to `max`; answers
/// how many bytes it read.
fn stream_lines_by(
    file: &File,
    start: u64,
    end: u64,
    first: usize,
    max: usize,
    f: &mut dyn FnMut(u64, &[u8], bool) -> bool,
) -> io::Result<u64> {
    let span = end.saturating_sub(start);
    let max = max.max(1);
    let mut size = first.clamp(1, max);
    let mut chunk = vec![0u8; size.min(usize::try_from(span).unwrap_or(usize::MAX))];
    // The unfinished line at the end of the previous chunk, and its offset.
    let mut carry: Vec<u8> = Vec::new();
    let mut carry_off = start;
    let mut off = start;
    while off < end {
        let want = usize::try_from(end - off).unwrap_or(usize::MAX).min(size);
        if chunk.len() < want {
            chunk.resize(want, 0);
        }
        let n = want;
        file.read_exact_at(&mut chunk[..n], off)?;
        size = (size * 2).min(max);
        let buf = &chunk[..n];
        let mut s = 0usize;
        while let Some(i) = buf[s..].iter().position(|b| *b == b'\n') {
            let line_end = s + i;
            if carry.is_empty() {
                let line = &buf[s..line_end];
                if !line.is_empty() && !f(off + s as u64, line, true) {
                    return Ok(off + n as u64 - start);
                }
            } else {
                carry.extend_from_slice(&buf[s..line_end]);
                if !f(carry_off, &carry, true) {
                    return Ok(off + n as u64 - start);
                }
                carry.clear();
            }
            s = line_end + 1;
        }
        if s < n {
            if carry.is_empty() {
                carry_off = off + s as u64;
            }
            carry.extend_from_slice(&buf[s..]);
        }
        off += n as u64;
    }
    if !carry.is_empty() {
        f(carry_off, &carry, false);
    }
    Ok(off - start)
}

/// What [`Collector::feed`] says about a line.
enum Fed {
    /// Go on.
    More,
    /// A tolerant page now holds `limit` events: it ends after this line.
    Full,
    /// The first line is not the index record the read started at.
    NotTheRecord,
}

/// Builds a batch from lines fed in order (starting at position
/// `first_pos`). `expect_first`: the index record the first line must
/// match.
struct Collector<'a> {
    out: Collected,
    limit: usize,
    pos: u64,
    expected: u64,
    first: bool,
    expect_first: Option<u64>,
    options: &'a ReadEventsOptions,
    strict: Option<(&'a Ctx, &'a Path)>,
}

impl<'a> Collector<'a> {
    fn new(
        first_pos: u64,
        expect_first: Option<u64>,
        options: &'a ReadEventsOptions,
        strict: Option<(&'a Ctx, &'a Path)>,
    ) -> Self {
        Self {
            out: Collected::default(),
            limit: options.limit.unwrap_or(usize::MAX),
            pos: first_pos - 1,
            expected: 1,
            first: true,
            expect_first,
            options,
            strict,
        }
    }

    /// One line.
    fn feed(&mut self, line: &[u8], terminated: bool) -> Result<Fed> {
        self.pos += 1;
        let pos = self.pos;
        let parsed = parse_line(line, pos);
        if std::mem::take(&mut self.first) {
            if let Some(seq) = self.expect_first {
                if !matches!(&parsed, Parsed::Event(e) if e.seq == seq) {
                    return Ok(Fed::NotTheRecord);
                }
            }
        }
        let out = &mut self.out;
        match parsed {
            Parsed::Event(e) => {
                if let Some((ctx, path)) = self.strict {
                    if e.seq != self.expected {
                        return Err(strict_error(
                            ctx,
                            path,
                            format!(
                                "record {pos} has sequence {}, expected {}",
                                e.seq, self.expected
                            ),
                        ));
                    }
                    self.expected += 1;
                }
                out.max_seq = out.max_seq.max(e.seq);
                if e.seq <= self.options.since_seq {
                    // Damage before the reader's cursor is not its concern.
                    out.skipped.clear();
                } else if out.events.len() < self.limit {
                    out.events.push(e);
                    // A tolerant page ends at its last event (what follows
                    // is the next page's); a strict read checks on to the
                    // end of the log.
                    if out.events.len() == self.limit && self.strict.is_none() {
                        return Ok(Fed::Full);
                    }
                }
            }
            Parsed::BadSeq(v) => {
                if let Some((ctx, path)) = self.strict {
                    return Err(strict_error(
                        ctx,
                        path,
                        format!("record {pos} has sequence {v}, expected {}", self.expected),
                    ));
                }
                out.skipped.push(SkippedRecord {
                    position: pos,
                    reason: format!("has sequence {v}, which is not a positive integer"),
                });
            }
            Parsed::Damaged(reason) => {
                if let Some((ctx, path)) = self.strict {
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
        Ok(Fed::More)
    }
}

/// Reads the lines of `file` in `[start, end)` (the first at position
/// `first_pos`) into a batch, streaming, up to the end or (tolerant) to the
/// line that fills the page; `None` when the first line is not the record
/// `expect_first` names.
#[allow(clippy::too_many_arguments)]
fn collect(
    file: &File,
    start: u64,
    end: u64,
    first_pos: u64,
    expect_first: Option<u64>,
    options: &ReadEventsOptions,
    strict: Option<(&Ctx, &Path)>,
    ctx: &Ctx,
    path: &Path,
    cost: &mut ReadCost,
) -> Result<Option<Collected>> {
    let mut c = Collector::new(first_pos, expect_first, options, strict);
    let mut outcome: Result<Fed> = Ok(Fed::More);
    let mut lines = 0u64;
    stream_lines(file, start, end, cost, &mut |off, line, terminated| {
        lines += 1;
        outcome = c.feed(line, terminated);
        match outcome {
            Ok(Fed::More) => true,
            Ok(Fed::Full) => {
                let end = off + line.len() as u64 + u64::from(terminated);
                c.out.stop = Some((end, c.pos + 1));
                false
            }
            _ => false,
        }
    })
    .map_err(|e| ctx.io("read the transcript", path, e))?;
    cost.lines += lines;
    match outcome? {
        Fed::NotTheRecord => Ok(None),
        Fed::More | Fed::Full => Ok(Some(c.out)),
    }
}

/// The highest `seq` of the events in `[start, end)` (the first line at
/// position `first_pos`: a legacy line's `seq` is its position), streaming;
/// `None` when `expect_first` names a record the first line is not.
fn max_seq_in(
    file: &File,
    start: u64,
    end: u64,
    first_pos: u64,
    expect_first: Option<u64>,
    cost: &mut ReadCost,
) -> io::Result<Option<u64>> {
    if start > 0 && start < end && expect_first.is_some() {
        let mut before = [0u8];
        file.read_exact_at(&mut before, start - 1)?;
        cost.bytes += 1;
        if before[0] != b'\n' {
            return Ok(None);
        }
    }
    let (mut max, mut first, mut matched) = (0u64, true, expect_first.is_none());
    let mut lines = 0u64;
    stream_lines(file, start, end, cost, &mut |_, line, _| {
        let pos = first_pos + lines;
        lines += 1;
        let seq = match parse_line(line, pos) {
            Parsed::Event(e) => Some(e.seq),
            _ => None,
        };
        if std::mem::take(&mut first) && expect_first.is_some() {
            matched = seq.is_some() && seq == expect_first;
            if !matched {
                return false;
            }
        }
        max = max.max(seq.unwrap_or(0));
        true
    })?;
    cost.lines += lines;
    Ok(matched.then_some(max))
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

/// The offset index as a reader sees it: only when it names this very
/// transcript (`st_dev`/`st_ino`) and its records are monotone, and only
/// its records at offsets below the length the read took (a batch being
/// appended after that is not this read's). Every record it answers is
/// still verified against the line at its offset before it is relied on.
struct IndexView {
    file: File,
    /// Records at offsets below the read's length.
    n: u64,
}

impl IndexView {
    fn open(run_dir: &Path, tmeta: &std::fs::Metadata, len: u64) -> Option<Self> {
        let file = File::open(run_dir.join(META_DIR).join(INDEX_FILE)).ok()?;
        let ilen = file.metadata().ok()?.len();
        let h = read_header(&file)?;
        if h.dev != tmeta.dev() || h.ino != tmeta.ino() || h.flags & FLAG_NON_MONOTONE != 0 {
            return None;
        }
        let total = ilen.checked_sub(HDR)? / REC;
        let mut view = Self { file, n: total };
        view.n = view.first(|r| r.off >= len)?;
        (view.n > 0).then_some(view)
    }

    fn rec(&self, i: u64) -> Option<Rec> {
        rec_at(&self.file, i).ok()
    }

    /// The first of the records (in `[0, n)`) for which `past` holds (`n`
    /// when none does); `past` must be false then true along the records.
    fn first(&self, past: impl Fn(Rec) -> bool) -> Option<u64> {
        let (mut lo, mut hi) = (0u64, self.n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if past(self.rec(mid)?) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }

    /// The last record with `seq <= since`: where a read after `since`
    /// starts.
    fn last_at_or_before(&self, since: u64) -> Option<Rec> {
        let i = self.first(|r| r.seq > since)?;
        self.rec(i.checked_sub(1)?).filter(|r| r.pos >= 1)
    }

    /// The last record below the read's length: with monotone records, its
    /// `seq` is the highest of every indexed line up to it.
    fn last(&self) -> Option<Rec> {
        self.rec(self.n.checked_sub(1)?)
    }
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
    let mut cost = ReadCost::default();
    let got = if options.integrity == Integrity::Strict {
        read_strict(&file, meta.len(), options, ctx, &path, &mut cost)
    } else {
        read_tolerant(run_dir, &file, &meta, options, ctx, &path, &mut cost)
    };
    testing_hooks::note_transcript_read(&path, cost);
    got
}

/// A strict read checks the whole file, whatever `limit` says (EV-21).
fn read_strict(
    file: &File,
    len: u64,
    options: &ReadEventsOptions,
    ctx: &Ctx,
    path: &Path,
    cost: &mut ReadCost,
) -> Result<EventBatch> {
    if len > 0 {
        let mut last = [0u8];
        file.read_exact_at(&mut last, len - 1)
            .map_err(|e| ctx.io("read the transcript", path, e))?;
        if last[0] != b'\n' {
            return Err(strict_error(
                ctx,
                path,
                "final record is not newline-terminated".into(),
            ));
        }
    }
    let c = collect(
        file,
        0,
        len,
        1,
        None,
        options,
        Some((ctx, path)),
        ctx,
        path,
        cost,
    )?
    .unwrap_or_default();
    Ok(EventBatch {
        events: c.events,
        skipped: c.skipped,
        last_seq: c.max_seq,
    })
}

/// A tolerant read is a page: it starts at the reader's cursor (the index
/// record at or before `since_seq`, found by binary search, when the index
/// can be used) and stops at the line that fills `limit`, so it costs
/// O(log n + page), not the log's length. `last_seq` then comes from the
/// index's last record below the read's length (verified against its line)
/// plus a scan of the lines after it, which no index record covers (a
/// lock-less writer's, normally none); where the index cannot be used, from
/// a scan of everything after the page.
#[allow(clippy::too_many_arguments)]
fn read_tolerant(
    run_dir: &Path,
    file: &File,
    meta: &std::fs::Metadata,
    options: &ReadEventsOptions,
    ctx: &Ctx,
    path: &Path,
    cost: &mut ReadCost,
) -> Result<EventBatch> {
    let len = meta.len();
    if len == 0 {
        return Ok(EventBatch::default());
    }
    let mut index = IndexView::open(run_dir, meta, len);
    let io = |e| ctx.io("read the transcript", path, e);
    let page = if options.limit == Some(0) {
        // A page of nothing covers nothing: only the head is asked for.
        Collected {
            stop: Some((0, 1)),
            ..Default::default()
        }
    } else {
        let start = match &index {
            Some(ix) if options.since_seq > 0 => ix.last_at_or_before(options.since_seq),
            _ => None,
        };
        let mut page = None;
        if let Some(r) = start {
            let mut before = [b'\n'];
            if r.off > 0 {
                file.read_exact_at(&mut before, r.off - 1).map_err(io)?;
                cost.bytes += 1;
            }
            if before[0] == b'\n' {
                page = collect(
                    file,
                    r.off,
                    len,
                    r.pos,
                    Some(r.seq),
                    options,
                    None,
                    ctx,
                    path,
                    cost,
                )?;
            }
            if page.is_none() {
                // The index does not describe this file after all.
                index = None;
            }
        }
        match page {
            Some(p) => p,
            None => {
                collect(file, 0, len, 1, None, options, None, ctx, path, cost)?.unwrap_or_default()
            }
        }
    };
    let last_seq = match page.stop {
        None => page.max_seq,
        Some((stop, next_pos)) => {
            let covered = match index.as_ref().and_then(IndexView::last) {
                Some(r) if r.off >= stop => {
                    max_seq_in(file, r.off, len, r.pos, Some(r.seq), cost).map_err(io)?
                }
                _ => None,
            };
            let rest = match covered {
                Some(max) => max,
                None => max_seq_in(file, stop, len, next_pos, None, cost)
                    .map_err(io)?
                    .unwrap_or(0),
            };
            page.max_seq.max(rest)
        }
    };
    Ok(EventBatch {
        events: page.events,
        skipped: page.skipped,
        last_seq,
    })
}

/// The index, opened for appending (under the run lock).
struct IndexWriter {
    file: File,
    header: Header,
    /// Committed records.
    count: u64,
    /// Records of the batch in flight, after the committed ones.
    pending: u64,
    /// The file was created (or was empty) when opened: under
    /// `Durability::PowerLoss` its directory entry must be synced before a
    /// pending record in it can be relied on.
    created: bool,
}

impl IndexWriter {
    fn open(run_dir: &Path, tmeta: &std::fs::Metadata) -> io::Result<Self> {
        let path = run_dir.join(META_DIR).join(INDEX_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(crate::sys::FILE_MODE)
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
            pending: 0,
            created: ilen == 0,
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
        self.pending = 0;
        self.file.set_len(0)?;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    fn last(&self) -> Option<Rec> {
        self.count
            .checked_sub(1)
            .and_then(|i| rec_at(&self.file, i).ok())
    }

    /// Records what this append is about to write, before the write: the
    /// records of lines others appended since the index was last written
    /// (committed), then the batch's records as pending, with
    /// [`FLAG_PENDING`] and the batch's fingerprint in the header. The
    /// pending records are the trailing ones numbered above the header's
    /// highest `seq` (the batch is numbered above everything in the log).
    fn begin(&mut self, tail: &Tail, batch: &[Rec], fp: u32) -> io::Result<()> {
        let mut bytes = Vec::with_capacity((tail.new_recs.len() + batch.len()) * REC as usize);
        for r in tail.new_recs.iter().chain(batch) {
            for v in [r.off, r.seq, r.pos] {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.file.write_all_at(&bytes, HDR + self.count * REC)?;
        self.count += tail.new_recs.len() as u64;
        self.pending = batch.len() as u64;
        self.header.max_seq = self.header.max_seq.max(tail.max_seq);
        if tail.non_monotone {
            self.header.flags |= FLAG_NON_MONOTONE;
        }
        self.header.flags &= FLAGS_KEPT;
        if !batch.is_empty() {
            self.header.flags |= FLAG_PENDING | (u64::from(fp) << 32);
        }
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    /// Makes the pending record durable before the batch is written, so a
    /// power cut that tears a batch of several events after a complete line
    /// still finds the record and cuts the batch back whole. (A single
    /// event needs none of this: its line is either complete — the whole
    /// batch — or incomplete and removed as a torn tail.) The power-loss
    /// harness (`crates/runkeep-powerloss`) found the gap this closes.
    fn sync_pending(&mut self, run_dir: &Path) -> io::Result<()> {
        let meta = run_dir.join(META_DIR);
        sys::sync_file(&self.file, &meta.join(INDEX_FILE))?;
        if self.created {
            sys::sync_dir(&meta)?;
            sys::sync_dir(run_dir)?;
            self.created = false;
        }
        Ok(())
    }

    /// The pending batch landed whole: its records become committed.
    fn commit(&mut self, max_seq: u64) -> io::Result<()> {
        self.count += self.pending;
        self.pending = 0;
        self.header.max_seq = self.header.max_seq.max(max_seq);
        self.header.flags &= FLAGS_KEPT;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    /// The pending batch is not in the log (rolled back, removed, or landed
    /// somewhere else): drops its records.
    fn drop_pending_io(&mut self) -> io::Result<()> {
        self.pending = 0;
        self.file.set_len(HDR + self.count * REC)?;
        self.header.flags &= FLAGS_KEPT;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    fn drop_pending(&mut self) {
        if let Err(e) = self.drop_pending_io() {
            tracing::debug!("could not update a transcript index: {e}");
        }
    }

    /// Resolves a batch left pending by an appender that died (or failed
    /// and could not roll back) mid-write; called under the run lock, so
    /// that appender is not running. If the batch landed whole it is
    /// committed. If what follows its start is exactly a prefix of it —
    /// whole lines carrying its offsets and numbers, then an unterminated
    /// fragment (when no line of it is whole, a fragment whose first bytes
    /// match the recorded fingerprint) — returns `Some(start)`: the caller
    /// truncates the log there (all or nothing: whole lines of an
    /// unacknowledged batch go too) and calls [`Self::drop_pending`].
    /// Anything else (someone else wrote there) drops the pending records
    /// and leaves the bytes to [`settle_tail`].
    fn resolve_pending(&mut self, log: &File, len: u64) -> io::Result<Option<u64>> {
        if self.header.flags & FLAG_PENDING == 0 {
            return Ok(None);
        }
        let mut first = self.count;
        while first > 0 && rec_at(&self.file, first - 1)?.seq > self.header.max_seq {
            first -= 1;
        }
        let pending = (first..self.count)
            .map(|i| rec_at(&self.file, i))
            .collect::<io::Result<Vec<_>>>()?;
        self.count = first;
        self.pending = pending.len() as u64;
        let floor = match first.checked_sub(1) {
            Some(i) => Some(rec_at(&self.file, i)?.off),
            None => None,
        };
        let fp = (self.header.flags >> 32) as u32;
        match judge_pending(log, len, &pending, floor, fp)? {
            Pending::Landed(max) => self.commit(max).map(|()| None),
            Pending::Torn(start) => Ok(Some(start)),
            Pending::Foreign => self.drop_pending_io().map(|()| None),
        }
    }
}

/// Header flag: a batch is being written (its records are pending).
const FLAG_PENDING: u64 = 2;
/// The flags that outlive an append (the others describe the one in
/// flight; bits 32..63 hold its fingerprint).
const FLAGS_KEPT: u64 = FLAG_NON_MONOTONE;
/// How many leading bytes of a batch its fingerprint covers.
const FP_LEN: usize = 64;

/// FNV-1a of a batch's first [`FP_LEN`] bytes.
fn fingerprint(bytes: &[u8]) -> u32 {
    bytes[..bytes.len().min(FP_LEN)]
        .iter()
        .fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        })
}

/// What became of a pending batch.
enum Pending {
    /// Whole, up to this `seq`.
    Landed(u64),
    /// A prefix of it from this offset to the end of the log.
    Torn(u64),
    /// Not recognisably it.
    Foreign,
}

fn judge_pending(
    log: &File,
    len: u64,
    pending: &[Rec],
    floor: Option<u64>,
    fp: u32,
) -> io::Result<Pending> {
    let Some(start) = pending.first().map(|r| r.off) else {
        return Ok(Pending::Foreign);
    };
    if start >= len || floor.is_some_and(|f| f >= start) {
        return Ok(Pending::Foreign);
    }
    if start > 0 {
        let mut b = [0u8; 1];
        log.read_exact_at(&mut b, start - 1)?;
        if b[0] != b'\n' {
            return Ok(Pending::Foreign);
        }
    }
    let mut buf = vec![0u8; (len - start) as usize];
    log.read_exact_at(&mut buf, start)?;
    let mut at = 0usize;
    for (j, r) in pending.iter().enumerate() {
        if start + at as u64 != r.off {
            return Ok(Pending::Foreign);
        }
        let rest = &buf[at..];
        match rest.iter().position(|b| *b == b'\n') {
            Some(i) => {
                if !matches!(parse_line(&rest[..i], r.pos), Parsed::Event(e) if e.seq == r.seq) {
                    return Ok(Pending::Foreign);
                }
                at += i + 1;
            }
            None if rest.is_empty() => {
                // Whole lines of the batch, then nothing.
                return Ok(Pending::Torn(start));
            }
            None => {
                if j == 0 && (rest.len() < FP_LEN || fingerprint(rest) != fp) {
                    return Ok(Pending::Foreign);
                }
                return Ok(Pending::Torn(start));
            }
        }
    }
    Ok(Pending::Landed(pending.last().map_or(0, |r| r.seq)))
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
        .mode(crate::sys::FILE_MODE)
        .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
        .open(&path)
        .map_err(|e| ctx.io("open", &path, e))?;
    if !existed && durability == Durability::PowerLoss {
        sys::sync_dir(dir).map_err(|e| ctx.io("sync the run directory", dir, e))?;
    }
    let len = file.metadata().map_err(|e| ctx.io("read", &path, e))?.len();
    Ok((file, len))
}

/// How long a torn final line must have gone unmodified (by the
/// filesystem's clock) before an appender may remove it when nothing says
/// whose it is. See [`settle_tail`].
const TORN_GRACE: Duration = Duration::from_secs(2);

/// The file's modification time and the filesystem's "now", both from the
/// filesystem's own clock: "now" is read back after setting the file's
/// mtime to `UTIME_NOW` (on NFS the server stamps it, so client clock skew
/// does not count). Falls back to this machine's clock if the touch fails.
fn fragment_age(file: &File) -> io::Result<Duration> {
    let before = file.metadata()?.modified()?;
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: UTIME_NOW,
    };
    let omit = Timespec {
        tv_sec: 0,
        tv_nsec: UTIME_OMIT,
    };
    let fs_now = match rustix::fs::futimens(
        file,
        &Timestamps {
            last_access: omit,
            last_modification: now,
        },
    ) {
        Ok(()) => file.metadata()?.modified()?,
        Err(_) => SystemTime::now(),
    };
    // A modification time in the future (skew) reads as "just now".
    Ok(fs_now.duration_since(before).unwrap_or(Duration::ZERO))
}

/// The end of the last complete (`\n`-terminated) line at or before `len`.
fn last_line_end(file: &File, len: u64) -> io::Result<u64> {
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let from = end.saturating_sub(chunk.len() as u64);
        let part = &mut chunk[..(end - from) as usize];
        file.read_exact_at(part, from)?;
        if let Some(i) = part.iter().rposition(|b| *b == b'\n') {
            return Ok(from + i as u64 + 1);
        }
        end = from;
    }
    Ok(0)
}

/// Settles a torn final line nobody has claimed (caller holds the run lock;
/// an intent left by a dead runkeep appender was resolved before). Returns
/// the length to append at.
///
/// The rule. Every runkeep appender holds the run lock across its write, so
/// a fragment seen under the lock was not written by a live runkeep
/// appender; but the reference takes no lock and may be writing one large
/// line in several chunks right now. So:
///
/// - the fragment is **removed** (the file is truncated to the end of its
///   last complete line) when the file has not been modified for
///   [`TORN_GRACE`] (2 s), measured with the filesystem's clock
///   ([`fragment_age`]): a live writer would have written its next chunk by
///   then, so its writer is dead (or stopped for longer than that);
/// - otherwise it is **sealed** as before (a `\n` terminates it, the
///   reference's own EV-23 heal): nothing anyone wrote is removed and the
///   new lines start on their own line; the fragment stays a skipped
///   damaged record (and, if a live lock-less writer was mid-line, its line
///   is split: the WK-9 hazard of mixing lock-less writers, not made worse).
fn settle_tail(file: &mut File, len: u64, path: &Path, ctx: &Ctx) -> Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)
        .map_err(|e| ctx.io("read", path, e))?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    let age = fragment_age(file).map_err(|e| ctx.io("read", path, e))?;
    if age >= TORN_GRACE {
        let keep = last_line_end(file, len).map_err(|e| ctx.io("read", path, e))?;
        testing_hooks::fault(Point::Append, path)
            .and_then(|()| file.set_len(keep))
            .map_err(|e| ctx.io("remove the torn final record of", path, e))?;
        tracing::info!(
            "{} on run {}: removed a torn final record of {} bytes from {} (unmodified for {age:?}; its writer is gone)",
            ctx.operation,
            ctx.run,
            len - keep,
            path.display()
        );
        return Ok(keep);
    }
    testing_hooks::fault(Point::Append, path)
        .and_then(|()| file.write_all(b"\n"))
        .map_err(|e| ctx.io("terminate the torn final record of", path, e))?;
    tracing::warn!(
        "{} on run {}: {} ends in a partial line modified {age:?} ago (a lock-less writer mid-line, or one that just died); terminated it instead of removing it",
        ctx.operation,
        ctx.run,
        path.display()
    );
    Ok(len + 1)
}

/// The one log write of an append (with its test seams: an injected errno
/// before it, a short write that lands half the buffer and fails, a pause
/// point in the middle of it). `written` counts the bytes that landed.
fn write_log(file: &mut File, buf: &[u8], path: &Path, written: &mut u64) -> io::Result<()> {
    testing_hooks::fault(Point::Append, path)?;
    let mut write = |bytes: &[u8]| -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            match file.write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    *written += n as u64;
                    rest = &rest[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    if let Some(e) = testing_hooks::short_write(Point::Append, path) {
        write(&buf[..buf.len() / 2])?;
        return Err(e);
    }
    if testing_hooks::pause_requested("mid-append-write") {
        let half = buf.len() / 2;
        write(&buf[..half])?;
        testing_hooks::pause("mid-append-write");
        return write(&buf[half..]);
    }
    write(buf)
}

/// After a failed append (under the run lock): truncates the log back to
/// `start`, its length before the append, so the file is as it was — when
/// the bytes past `start` are exactly the ones this append wrote (a
/// lock-less writer's line appended meanwhile is never cut). Returns
/// whether the file is back to `start`.
fn roll_back(file: &File, start: u64, written: u64, path: &Path, ctx: &Ctx) -> bool {
    match file.metadata() {
        Ok(m) if m.len() == start => true,
        Ok(m) if m.len() == start + written => match file.set_len(start) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "{} on run {}: could not truncate {} back after a failed append ({e}); the next append removes the partial batch",
                    ctx.operation,
                    ctx.run,
                    path.display()
                );
                false
            }
        },
        _ => {
            tracing::warn!(
                "{} on run {}: {} grew during a failed append (a lock-less writer?); not truncating it back",
                ctx.operation,
                ctx.run,
                path.display()
            );
            false
        }
    }
}

/// Appends events (caller holds the run lock and has checked the fence).
///
/// All or nothing: the batch is one buffer written at the end of the log.
/// Before writing, the index records the batch as *pending* (its line
/// records, flag [`FLAG_PENDING`] and a fingerprint of its first bytes);
/// after the write it is committed. If the write (or its fsync) fails, the
/// log is truncated back and the pending records dropped. If the appender
/// dies mid-write, the next appender finds the pending batch and removes
/// what landed of it ([`IndexWriter::resolve_pending`]).
/// `recheck` is the fence check, run again once the long work (settling the
/// tail, catching the index up, serializing the batch) is done and just
/// before the batch is written, so a writer slowed down in that work
/// cannot land a batch after a takeover it passed its first check before.
pub(crate) fn append_events(
    run_dir: &Path,
    events: &[NewEvent],
    fence: Option<Fence>,
    durability: Durability,
    ctx: &Ctx,
    recheck: &dyn Fn() -> Result<()>,
    now: Timestamp,
) -> Result<Vec<PersistedEvent>> {
    let path = run_dir.join(TRANSCRIPT);
    let (mut file, len) = open_log(run_dir, TRANSCRIPT, durability, ctx)?;
    let tmeta = file.metadata().map_err(|e| ctx.io("read", &path, e))?;
    let mut index = IndexWriter::open(run_dir, &tmeta).ok();
    let mut len = len;
    if let Some(ix) = index.as_mut() {
        match ix.resolve_pending(&file, len) {
            Ok(Some(cut)) => {
                testing_hooks::fault(Point::Append, &path)
                    .and_then(|()| file.set_len(cut))
                    .map_err(|e| ctx.io("remove the torn final record of", &path, e))?;
                ix.drop_pending();
                tracing::info!(
                    "{} on run {}: removed {} bytes of a batch its appender (now dead) did not finish writing to {}",
                    ctx.operation,
                    ctx.run,
                    len - cut,
                    path.display()
                );
                len = cut;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!("could not read the transcript index of {}: {e}", ctx.run);
                index = None;
            }
        }
    }
    let len = settle_tail(&mut file, len, &path, ctx)?;
    let tail = catch_up(&file, len, index.as_mut()).map_err(|e| ctx.io("read", &path, e))?;
    let mut buf = Vec::new();
    let mut out = Vec::with_capacity(events.len());
    let mut recs = Vec::with_capacity(events.len());
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
    testing_hooks::delay("append-before-recheck");
    recheck()?;
    if let Some(ix) = index.as_mut() {
        if let Err(e) = ix.begin(&tail, &recs, fingerprint(&buf)) {
            // Without a recorded intent a crash mid-write leaves a fragment
            // for the grace rule; a failure is still rolled back below.
            tracing::debug!("could not update the transcript index of {}: {e}", ctx.run);
            index = None;
        } else if durability == Durability::PowerLoss && recs.len() > 1 {
            // Nothing of the batch is written yet: a failure here refuses
            // the append (the next appender drops the unlanded record).
            ix.sync_pending(run_dir)
                .map_err(|e| ctx.io("sync the transcript index of", &path, e))?;
        }
    }
    // Numbers are assigned; only the write is left (the soak once caught a
    // writer stopped exactly here while another appended without the lock).
    testing_hooks::pause("before-append-write");
    let mut written = 0u64;
    let wrote = write_log(&mut file, &buf, &path, &mut written)
        .map_err(|e| ctx.io("append to", &path, e))
        .and_then(|()| match durability {
            Durability::PowerLoss => {
                sys::sync_file(&file, &path).map_err(|e| ctx.io("sync", &path, e))
            }
            Durability::ProcessCrash => Ok(()),
        });
    if let Err(e) = wrote {
        if roll_back(&file, len, written, &path, ctx) {
            if let Some(ix) = index.as_mut() {
                ix.drop_pending();
            }
        }
        return Err(e);
    }
    // With O_APPEND the write landed at the end; if that is not where we
    // computed (someone appended without the lock), the pending records are
    // wrong: drop them, the next append catches the index up by scanning.
    let end = file.stream_position().unwrap_or(0);
    if let Some(ix) = index.as_mut() {
        let max = out.last().map_or(tail.max_seq, |e| e.seq);
        let done = if end == len + buf.len() as u64 {
            ix.commit(max)
        } else {
            ix.drop_pending_io()
        };
        if let Err(e) = done {
            tracing::debug!("could not update the transcript index of {}: {e}", ctx.run);
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
    let wrote = write_log(&mut file, &buf, &path, &mut written)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The streamed lines are the whole buffer's lines, at every chunk size
    /// (lines longer than a chunk, empty lines, an unterminated tail) and
    /// every start offset.
    #[test]
    fn streamed_lines_are_the_buffers_lines_at_every_chunk_size() {
        let texts: [&[u8]; 6] = [
            b"",
            b"\n\n",
            b"a\nbb\n\nccc\n",
            b"a\nbb\n\nccc",
            b"{\"type\":\"x\",\"seq\":1}\n\n{\"type\":\"y\",\"seq\":2}\ntorn",
            b"x",
        ];
        for text in texts {
            let f = tempfile_in_memory(text);
            for start in 0..=text.len() {
                let want: Vec<(u64, Vec<u8>, bool)> = lines(&text[start..], start as u64)
                    .map(|(o, l, t)| (o, l.to_vec(), t))
                    .collect();
                for chunk in 1..=text.len() + 2 {
                    // Fixed chunks, and chunks growing from `chunk` to 4×.
                    for max in [chunk, chunk * 4] {
                        let mut got = Vec::new();
                        let read = stream_lines_by(
                            &f,
                            start as u64,
                            text.len() as u64,
                            chunk,
                            max,
                            &mut |o, l, t| {
                                got.push((o, l.to_vec(), t));
                                true
                            },
                        )
                        .unwrap();
                        assert_eq!(got, want, "{text:?} from {start} by {chunk} to {max}");
                        assert_eq!(read, (text.len() - start) as u64);
                    }
                }
            }
        }
    }

    /// A run directory holding `n` events appended by the store's own
    /// append (batches of 1 000), so with its offset index.
    fn run_of(n: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(META_DIR)).unwrap();
        let ctx = Ctx::store("append_events");
        let mut done = 0;
        while done < n {
            let batch: Vec<NewEvent> = (done..n.min(done + 1_000))
                .map(|i| {
                    let mut p = Map::new();
                    p.insert("i".into(), Value::from(i));
                    p.insert("text".into(), Value::from("a payload of some size"));
                    NewEvent::new("step", p)
                })
                .collect();
            let now = Timestamp::from_millis(1_700_000_000_000).unwrap();
            append_events(
                dir.path(),
                &batch,
                None,
                Durability::ProcessCrash,
                &ctx,
                &|| Ok(()),
                now,
            )
            .unwrap();
            done += batch.len() as u64;
        }
        dir
    }

    /// One tolerant read and what it cost (the test seam's counters).
    #[cfg(feature = "testing")]
    fn read_costing(dir: &Path, since_seq: u64, limit: Option<usize>) -> (EventBatch, ReadCost) {
        let path = dir.join(TRANSCRIPT);
        let before = testing_hooks::transcript_reads(&path);
        let options = ReadEventsOptions {
            since_seq,
            limit,
            ..Default::default()
        };
        let batch = read_events(dir, &options, &Ctx::store("read_events")).unwrap();
        let after = testing_hooks::transcript_reads(&path);
        let cost = ReadCost {
            bytes: after.bytes - before.bytes,
            lines: after.lines - before.lines,
        };
        (batch, cost)
    }

    /// Issue 11, item 4 (catch-up): a tolerant page of 10 events reads its
    /// own lines, the line it starts from and the index's last line — the
    /// same count of lines, and at most a first chunk of bytes, over a log
    /// of 2 000 events as over one of 20 000 — with `last_seq` exact. A
    /// page used to parse the log to its end for `last_seq` and the
    /// skipped records: 20 000 lines for a page at the start (the mutation
    /// "no early stop", `Fed::Full` answered as `Fed::More`, fails this
    /// test: tried when this was written).
    #[cfg(feature = "testing")]
    #[test]
    fn a_page_costs_its_own_lines_whatever_the_logs_length() {
        let small = run_of(2_000);
        let large = run_of(20_000);
        let large_len = std::fs::metadata(large.path().join(TRANSCRIPT))
            .unwrap()
            .len();
        assert!(
            large_len > 16 * FIRST_CHUNK as u64,
            "the log is {large_len} bytes"
        );
        for since in [0u64, 1, 999, 1_500] {
            let (s, s_cost) = read_costing(small.path(), since, Some(10));
            let (l, l_cost) = read_costing(large.path(), since, Some(10));
            let want: Vec<u64> = (since + 1..=since + 10).collect();
            for (b, last) in [(&s, 2_000), (&l, 20_000)] {
                assert_eq!(b.events.iter().map(|e| e.seq).collect::<Vec<_>>(), want);
                assert_eq!(b.last_seq, last, "since {since}");
                assert!(b.skipped.is_empty());
            }
            // The page's 10 lines, the cursor's line (since > 0), the
            // index's last line.
            let lines = 10 + u64::from(since > 0) + 1;
            assert_eq!(s_cost.lines, lines, "since {since}: {s_cost:?}");
            assert_eq!(l_cost.lines, lines, "since {since}: {l_cost:?}");
            assert!(
                l_cost.bytes <= FIRST_CHUNK as u64 + 1_024,
                "since {since}: {l_cost:?}"
            );
        }
        // The head (the wait and the tail ask it): one line whatever the
        // length, with no limit from the last event and with a limit of 0.
        for (since, limit) in [(u64::MAX, None), (0, Some(0)), (20_000, Some(10))] {
            let (b, cost) = read_costing(large.path(), since, limit);
            assert!(b.events.is_empty() && b.skipped.is_empty());
            assert_eq!(b.last_seq, 20_000);
            assert_eq!(cost.lines, 1, "since {since}, limit {limit:?}: {cost:?}");
        }
        // Without the index, the same answers by a scan of everything
        // after the page.
        std::fs::remove_file(large.path().join(META_DIR).join(INDEX_FILE)).unwrap();
        let (b, cost) = read_costing(large.path(), 0, Some(10));
        assert_eq!(b.events.len(), 10);
        assert_eq!(b.last_seq, 20_000);
        assert_eq!(cost.lines, 20_000);
    }

    fn tempfile_in_memory(bytes: &[u8]) -> File {
        let dir = std::env::temp_dir().join(format!(
            "runkeep-fs-stream-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        std::fs::write(&dir, bytes).unwrap();
        let f = File::open(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        f
    }
}
