//! Reading the transcript: strict reads check the whole file; tolerant
//! reads are pages served through the offset index when it can be trusted,
//! else from the file's start, with `last_seq` from the index's last record
//! and the unindexed lines after it.

use std::fs::File;
use std::io::{self};
use std::os::unix::fs::FileExt;
use std::path::Path;

use runkeep::evidence::SkippedRecord;
use runkeep::{Error, EventBatch, Integrity, PersistedEvent, ReadEventsOptions, Result};

use super::format::{parse_line, Parsed, TRANSCRIPT};
use super::offset_index::IndexView;
use crate::lock::RunLock;
use crate::sys::{self, Ctx};
use crate::testing_hooks::{self};

#[derive(Default)]
pub(super) struct Collected {
    pub(super) events: Vec<PersistedEvent>,
    pub(super) skipped: Vec<SkippedRecord>,
    pub(super) max_seq: u64,
    /// Where a tolerant page stopped because it held `limit` events: the
    /// end of the line that filled it and the position of the line after
    /// it. `None`: it read to the end.
    pub(super) stop: Option<(u64, u64)>,
}

pub(super) fn strict_error(ctx: &Ctx, path: &Path, what: String) -> Error {
    Error::corrupted(format!(
        "{} on run {}: invalid run transcript in {}: {what}",
        ctx.operation,
        ctx.run,
        path.display()
    ))
}

/// The most of a transcript a read holds at a time: a read's memory is this
/// plus the events it returns, whatever the log's length.
pub(super) const READ_CHUNK: usize = 1 << 20;

/// A read's first chunk; each next one doubles, up to [`READ_CHUNK`], so a
/// small page (or the head) reads little and a long read few times.
pub(super) const FIRST_CHUNK: usize = 64 << 10;

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
/// [`super::lines`] over the whole range. Stops when `f` answers false. Adds the
/// bytes it read to `cost`.
pub(super) fn stream_lines(
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
pub(super) fn stream_lines_by(
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

/// How a read judges a damaged record.
#[derive(Clone, Copy)]
pub(super) enum Judging<'a> {
    /// Skipped and reported ([`SkippedRecord`]); a page ends at its `limit`.
    Tolerant,
    /// The read fails, naming the file; it checks the whole log.
    Strict {
        /// The operation, for the error.
        ctx: &'a Ctx,
        /// The transcript, for the error.
        path: &'a Path,
    },
}

/// What [`Collector::feed`] says about a line.
pub(super) enum Fed {
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
pub(super) struct Collector<'a> {
    pub(super) out: Collected,
    /// `None`: every event.
    pub(super) limit: Option<usize>,
    pub(super) pos: u64,
    pub(super) expected: u64,
    pub(super) first: bool,
    pub(super) expect_first: Option<u64>,
    pub(super) options: &'a ReadEventsOptions,
    pub(super) judging: Judging<'a>,
}

impl<'a> Collector<'a> {
    pub(super) fn new(
        first_pos: u64,
        expect_first: Option<u64>,
        options: &'a ReadEventsOptions,
        judging: Judging<'a>,
    ) -> Self {
        Self {
            out: Collected::default(),
            limit: options.limit,
            pos: first_pos - 1,
            expected: 1,
            first: true,
            expect_first,
            options,
            judging,
        }
    }

    /// One line.
    pub(super) fn feed(&mut self, line: &[u8], terminated: bool) -> Result<Fed> {
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
                if let Judging::Strict { ctx, path } = self.judging {
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
                } else if self.limit.is_none_or(|l| out.events.len() < l) {
                    out.events.push(e);
                    // A tolerant page ends at its last event (what follows
                    // is the next page's); a strict read checks on to the
                    // end of the log.
                    if Some(out.events.len()) == self.limit
                        && matches!(self.judging, Judging::Tolerant)
                    {
                        return Ok(Fed::Full);
                    }
                }
            }
            Parsed::BadSeq(v) => {
                if let Judging::Strict { ctx, path } = self.judging {
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
                if let Judging::Strict { ctx, path } = self.judging {
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
#[expect(
    clippy::too_many_arguments,
    reason = "the window, the page limits and the expected first record are separate inputs of one streaming read"
)]
pub(super) fn collect(
    file: &File,
    start: u64,
    end: u64,
    first_pos: u64,
    expect_first: Option<u64>,
    options: &ReadEventsOptions,
    judging: Judging<'_>,
    ctx: &Ctx,
    path: &Path,
    cost: &mut ReadCost,
) -> Result<Option<Collected>> {
    let mut c = Collector::new(first_pos, expect_first, options, judging);
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
pub(super) fn max_seq_in(
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

/// Reads the transcript: strict or tolerant, with no side effects.
pub(crate) fn read_transcript(
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

/// The highest `seq` in the transcript (0 when it has none): a tolerant
/// page of no events, so it costs what the page's `last_seq` costs
/// (O(log n) with a usable index), not a read of the log.
pub(crate) fn last_seq(run_dir: &Path, ctx: &Ctx) -> Result<u64> {
    let head_only = ReadEventsOptions {
        limit: Some(0),
        ..ReadEventsOptions::default()
    };
    Ok(read_transcript(run_dir, &head_only, ctx)?.last_seq)
}

/// A strict read checks the whole file, whatever `limit` says: a
/// strict reader must learn of damage anywhere in the log.
pub(super) fn read_strict(
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
        Judging::Strict { ctx, path },
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
pub(super) fn read_tolerant(
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
                    Judging::Tolerant,
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
            None => collect(
                file,
                0,
                len,
                1,
                None,
                options,
                Judging::Tolerant,
                ctx,
                path,
                cost,
            )?
            .unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use runkeep::{NewEvent, Timestamp};
    use serde_json::{Map, Value};

    use super::super::append::append_to_transcript;
    use super::super::format::{lines, INDEX_FILE};
    use super::*;
    use crate::lock::META_DIR;
    use crate::options::Durability;

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
            append_to_transcript(
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
        let batch = read_transcript(dir, &options, &Ctx::store("read_events")).unwrap();
        let after = testing_hooks::transcript_reads(&path);
        let cost = ReadCost {
            bytes: after.bytes - before.bytes,
            lines: after.lines - before.lines,
        };
        (batch, cost)
    }

    /// Catch-up costs a page, not the log: a tolerant page of 10 events reads its
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
