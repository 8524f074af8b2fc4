//! The offset index (`.runkeep/transcript.idx`): its header and records,
//! the view a reader trusts only when it names this very file and is
//! monotone, and the writer that records a batch as pending before it is
//! appended (so the next appender can tell a dead appender's torn batch).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::format::{parse_line, Parsed, INDEX_FILE};
use super::torn_tail::Tail;
use crate::lock::META_DIR;
use crate::sys::{self};

pub(super) const MAGIC: &[u8; 8] = b"RKTXIDX1";

pub(super) const HDR: u64 = 40;

pub(super) const REC: u64 = 24;

pub(super) const FLAG_NON_MONOTONE: u64 = 1;

#[derive(Clone, Copy, Debug)]
pub(super) struct Rec {
    pub(super) off: u64,
    pub(super) seq: u64,
    pub(super) pos: u64,
}

pub(super) fn rec_at(idx: &File, i: u64) -> io::Result<Rec> {
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
pub(super) struct Header {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) flags: u64,
    pub(super) max_seq: u64,
}

pub(super) fn read_header(idx: &File) -> Option<Header> {
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

pub(super) fn header_bytes(h: &Header) -> Vec<u8> {
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
pub(super) struct IndexView {
    pub(super) file: File,
    /// Records at offsets below the read's length.
    pub(super) n: u64,
}

impl IndexView {
    pub(super) fn open(run_dir: &Path, tmeta: &std::fs::Metadata, len: u64) -> Option<Self> {
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

    pub(super) fn rec(&self, i: u64) -> Option<Rec> {
        rec_at(&self.file, i).ok()
    }

    /// The first of the records (in `[0, n)`) for which `past` holds (`n`
    /// when none does); `past` must be false then true along the records.
    pub(super) fn first(&self, past: impl Fn(Rec) -> bool) -> Option<u64> {
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
    pub(super) fn last_at_or_before(&self, since: u64) -> Option<Rec> {
        let i = self.first(|r| r.seq > since)?;
        self.rec(i.checked_sub(1)?).filter(|r| r.pos >= 1)
    }

    /// The last record below the read's length: with monotone records, its
    /// `seq` is the highest of every indexed line up to it.
    pub(super) fn last(&self) -> Option<Rec> {
        self.rec(self.n.checked_sub(1)?)
    }
}

/// The index, opened for appending (under the run lock).
pub(super) struct IndexWriter {
    pub(super) file: File,
    pub(super) header: Header,
    /// Committed records.
    pub(super) count: u64,
    /// Records of the batch in flight, after the committed ones.
    pub(super) pending: u64,
    /// The file was created (or was empty) when opened: under
    /// `Durability::PowerLoss` its directory entry must be synced before a
    /// pending record in it can be relied on.
    pub(super) created: bool,
}

impl IndexWriter {
    pub(super) fn open(run_dir: &Path, tmeta: &std::fs::Metadata) -> io::Result<Self> {
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

    pub(super) fn reset(&mut self) -> io::Result<()> {
        self.header.flags = 0;
        self.header.max_seq = 0;
        self.count = 0;
        self.pending = 0;
        self.file.set_len(0)?;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    pub(super) fn last(&self) -> Option<Rec> {
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
    pub(super) fn begin(&mut self, tail: &Tail, batch: &[Rec], fp: u32) -> io::Result<()> {
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
    pub(super) fn sync_pending(&mut self, run_dir: &Path) -> io::Result<()> {
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
    pub(super) fn commit(&mut self, max_seq: u64) -> io::Result<()> {
        self.count += self.pending;
        self.pending = 0;
        self.header.max_seq = self.header.max_seq.max(max_seq);
        self.header.flags &= FLAGS_KEPT;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    /// The pending batch is not in the log (rolled back, removed, or landed
    /// somewhere else): drops its records.
    pub(super) fn drop_pending_io(&mut self) -> io::Result<()> {
        self.pending = 0;
        self.file.set_len(HDR + self.count * REC)?;
        self.header.flags &= FLAGS_KEPT;
        self.file.write_all_at(&header_bytes(&self.header), 0)
    }

    pub(super) fn drop_pending(&mut self) {
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
    /// and leaves the bytes to [`super::torn_tail::settle_tail`].
    pub(super) fn resolve_pending(&mut self, log: &File, len: u64) -> io::Result<Option<u64>> {
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
pub(super) const FLAG_PENDING: u64 = 2;

/// The flags that outlive an append (the others describe the one in
/// flight; bits 32..63 hold its fingerprint).
pub(super) const FLAGS_KEPT: u64 = FLAG_NON_MONOTONE;

/// How many leading bytes of a batch its fingerprint covers.
pub(super) const FP_LEN: usize = 64;

/// FNV-1a of a batch's first [`FP_LEN`] bytes.
pub(super) fn fingerprint(bytes: &[u8]) -> u32 {
    bytes[..bytes.len().min(FP_LEN)]
        .iter()
        .fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        })
}

/// What became of a pending batch.
pub(super) enum Pending {
    /// Whole, up to this `seq`.
    Landed(u64),
    /// A prefix of it from this offset to the end of the log.
    Torn(u64),
    /// Not recognisably it.
    Foreign,
}

pub(super) fn judge_pending(
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
