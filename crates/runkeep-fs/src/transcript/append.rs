//! Appending a batch of events to the transcript under the run lock: one
//! buffer, all or nothing, `seq` assigned here, recorded in the index.

use std::fs::{File, OpenOptions};
use std::io::Seek;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use runkeep::{Error, Fence, NewEvent, PersistedEvent, Result, Timestamp};
use serde_json::Value;

use super::format::TRANSCRIPT;
use super::offset_index::{fingerprint, IndexWriter, Rec};
use super::torn_tail::{catch_up, roll_back, settle_tail};
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::testing_hooks;

pub(super) fn open_log(
    dir: &Path,
    name: &str,
    durability: Durability,
    ctx: &Ctx,
) -> Result<(File, u64)> {
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

/// Appends events (caller holds the run lock and has checked the fence).
///
/// All or nothing: the batch is one buffer written at the end of the log.
/// Before writing, the index records the batch as *pending* (its line
/// records, flag [`super::offset_index::FLAG_PENDING`] and a fingerprint of its first bytes);
/// after the write it is committed. If the write (or its fsync) fails, the
/// log is truncated back and the pending records dropped. If the appender
/// dies mid-write, the next appender finds the pending batch and removes
/// what landed of it ([`IndexWriter::resolve_pending`]).
/// `recheck` is the fence check, run again once the long work (settling the
/// tail, catching the index up, serializing the batch) is done and just
/// before the batch is written, so a writer slowed down in that work
/// cannot land a batch after a takeover it passed its first check before.
pub(crate) fn append_to_transcript(
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
                sys::truncate_log(&file, &path, cut)
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
    testing_hooks::delay(testing_hooks::Delay::AppendBeforeRecheck);
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
    testing_hooks::pause(testing_hooks::Pause::BeforeAppendWrite);
    let mut written = 0u64;
    let wrote = sys::write_log(&mut file, &buf, &path, &mut written)
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
