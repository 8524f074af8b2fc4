//! The end of a log: catching the index up with lines appended without it,
//! settling a fragment left by a killed appender (removed only once it has
//! been still for the grace period, else terminated), and rolling a failed
//! append back to the log's length before it.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use runkeep::Result;
use rustix::fs::{Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};

use super::format::{lines, parse_line, Parsed};
use super::offset_index::{IndexWriter, Rec, FLAG_NON_MONOTONE};
use crate::sys::{self, Ctx};

/// What an appender learns about the existing log.
pub(super) struct Tail {
    pub(super) max_seq: u64,
    pub(super) last_pos: u64,
    pub(super) new_recs: Vec<Rec>,
    pub(super) non_monotone: bool,
}

/// Brings the index up to the file's current end (scanning only what it does
/// not cover) and answers the log's highest seq and last position.
pub(super) fn catch_up(file: &File, len: u64, index: Option<&mut IndexWriter>) -> io::Result<Tail> {
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

/// How long a torn final line must have gone unmodified (by the
/// filesystem's clock) before an appender may remove it when nothing says
/// whose it is. See [`settle_tail`].
pub(crate) const TORN_GRACE: Duration = Duration::from_secs(2);

/// The file's modification time and the filesystem's "now", both from the
/// filesystem's own clock: "now" is read back after setting the file's
/// mtime to `UTIME_NOW` (on NFS the server stamps it, so client clock skew
/// does not count). Falls back to this machine's clock if the touch fails.
pub(super) fn fragment_age(file: &File) -> io::Result<Duration> {
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
pub(super) fn last_line_end(file: &File, len: u64) -> io::Result<u64> {
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
///   heal the reference applies itself): nothing anyone wrote is removed and the
///   new lines start on their own line; the fragment stays a skipped
///   damaged record (and, if a live lock-less writer was mid-line, its line
///   is split: the known hazard of mixing lock-less writers, not made worse).
pub(super) fn settle_tail(file: &mut File, len: u64, path: &Path, ctx: &Ctx) -> Result<u64> {
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
        sys::truncate_log(file, path, keep)
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
    sys::append_log(file, path, b"\n")
        .map_err(|e| ctx.io("terminate the torn final record of", path, e))?;
    tracing::warn!(
        "{} on run {}: {} ends in a partial line modified {age:?} ago (a lock-less writer mid-line, or one that just died); terminated it instead of removing it",
        ctx.operation,
        ctx.run,
        path.display()
    );
    Ok(len + 1)
}

/// After a failed append (under the run lock): truncates the log back to
/// `start`, its length before the append, so the file is as it was — when
/// the bytes past `start` are exactly the ones this append wrote (a
/// lock-less writer's line appended meanwhile is never cut). Returns
/// whether the file is back to `start`.
pub(super) fn roll_back(file: &File, start: u64, written: u64, path: &Path, ctx: &Ctx) -> bool {
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
