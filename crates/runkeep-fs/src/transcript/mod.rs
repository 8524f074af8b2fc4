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
//! does not duplicate anything ([`torn_tail::roll_back`]).
//!
//! A process killed mid-append leaves a final fragment without a newline.
//! Only an appender holding the run lock touches it (a read never modifies
//! the file):
//!
//! - a transcript append records its batch in the index as *pending*
//!   before writing it ([`offset_index::FLAG_PENDING`]); the next appender finding a
//!   pending batch whose appender is gone (it holds the lock now) and a log
//!   ending in a prefix of that batch removes the prefix, whole lines of it
//!   included ([`offset_index::IndexWriter::resolve_pending`]);
//! - any other fragment (the audit trail, a transcript without a usable
//!   index, a reference writer's line) is removed only once the file has
//!   been unmodified for [`torn_tail::TORN_GRACE`], else terminated with `\n` as the
//!   reference does, so a line a lock-less writer is still writing is never
//!   cut ([`torn_tail::settle_tail`]).
//!
//! # Where each part lives
//!
//! Top-down: [`operations`] is what the store calls; below it
//!
//! - [`reading`]: strict and tolerant (paged) reads of the transcript;
//! - [`offset_index`]: the index file, its reader view and its writer;
//! - [`append`]: appending a batch of events;
//! - [`torn_tail`]: catching up, torn fragments, rolling a failed append back;
//! - [`audit`]: the audit trail;
//! - [`format`], below them all: the line format and the file names.

mod append;
mod audit;
mod format;
mod offset_index;
mod operations;
mod reading;
mod torn_tail;

pub(crate) use append::append_to_transcript;
pub(crate) use format::{is_torn, AUDIT, TRANSCRIPT};
pub(crate) use operations::{append_audit, append_events, read_audit, read_events};
pub(crate) use reading::{last_seq, read_transcript, ReadCost};
pub(crate) use torn_tail::TORN_GRACE;
