//! The one path every fenced write of a run takes.
//!
//! ```text
//! judge early  read the holding (when fenced or asked), check the fence,
//!              refuse a sticky-failed store; nothing is created before this
//! prepare      create the run directory, write the heavy part (whole files
//!              to sidecars, synced under PowerLoss): outside the lock, so a
//!              slow disk cannot stretch the window
//! lock         take the run lock exclusive (bounded wait)
//! read state   read the holding again, under the lock
//! judge        check the fence again: a takeover between the early check
//!              and the lock is caught here; an unfenced write made for a
//!              principal is judged here (runkeep::acting)
//! write        the caller's act: renames, appends, deletes
//! publish      the caller's act ends with its publish; the lock is released
//!              when the act returns, and a failed fsync turns the store
//!              sticky-failed
//! ```
//!
//! [`fenced_write`] is the skeleton; [`locked_write`] is the
//! same path with nothing to prepare. A write whose rule needs more than
//! the holding (a finish, a step: the lifecycle record too) passes no
//! fence to the skeleton and judges inside its act, under the same lock.
//! Every refusal is appended to the run's `.runkeep/fenced-out.jsonl`,
//! which the doctor reads to spot two writers on one run.

use std::path::Path;

use runkeep::failure;
use runkeep::lease::{check_unfenced_write, check_write_fence};
use runkeep::{Error, Fence, Result, RunScope, Timestamp, TopHolding};

use crate::inner::Inner;
use crate::lock::{self, Mode, RunLock};
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::{claims, run_state, testing_hooks};

/// The log in a run's meta directory that records every fenced-out write.
pub(crate) const FENCED_OUT_LOG: &str = "fenced-out.jsonl";

/// What a fenced write is: the run, the operation (for messages and the
/// refusal log), the fence presented, and whether the early step reads the
/// holding even without a fence (a checkpoint stamps the holder's fence).
#[derive(Clone, Copy)]
pub(crate) struct FencedWrite<'a> {
    pub(crate) scope: &'a RunScope,
    pub(crate) operation: &'static str,
    pub(crate) fence: Option<Fence>,
    pub(crate) read_top_early: bool,
    /// The act judges the write itself (a finish, an enqueue, a reopen:
    /// their rules need the lifecycle record too); the skeleton applies
    /// no rule to it, not even the unfenced one.
    pub(crate) judged_in_act: bool,
}

impl<'a> FencedWrite<'a> {
    pub(crate) fn new(scope: &'a RunScope, operation: &'static str, fence: Option<Fence>) -> Self {
        FencedWrite {
            scope,
            operation,
            fence,
            read_top_early: false,
            judged_in_act: false,
        }
    }

    /// The early step reads the holding even when no fence is presented.
    pub(crate) fn reading_top_early(mut self) -> Self {
        self.read_top_early = true;
        self
    }
}

/// The fenced-write skeleton (see the module doc): judge early, prepare
/// outside the lock, lock, read the holding, judge again, act.
///
/// `prepare` sees the holding read early (`None` when it was not read);
/// `act` sees the one read under the lock and what `prepare` made.
pub(crate) fn fenced_write<P, T>(
    inner: &Inner,
    w: FencedWrite<'_>,
    prepare: impl FnOnce(&Ctx, &Path, Option<&TopHolding>) -> Result<P>,
    act: impl FnOnce(&Ctx, &Path, Option<&TopHolding>, P) -> Result<T>,
) -> Result<T> {
    inner.refuse_read_only()?;
    let ctx = Ctx::new(w.scope, w.operation);
    let run_dir = inner.run_dir(w.scope);
    let top0 = if w.fence.is_some() || w.read_top_early {
        claims::read_top(&run_dir, &ctx)?
    } else {
        None
    };
    if let Some(f) = w.fence {
        check_fence(inner, &ctx, &run_dir, f, top0.as_ref(), w.scope)?;
    }
    inner.check_poison()?;
    sys::ensure_dir(&run_dir, inner.durability)
        .map_err(|e| inner.note(ctx.io("create the run directory", &run_dir, e)))?;
    let prepared = prepare(&ctx, &run_dir, top0.as_ref()).map_err(|e| inner.note(e))?;
    let _lock = RunLock::acquire(&run_dir, Mode::Exclusive, inner.durability, &ctx)?;
    let top = claims::read_top(&run_dir, &ctx)?;
    match w.fence {
        Some(f) => check_fence(inner, &ctx, &run_dir, f, top.as_ref(), w.scope)?,
        None if !w.judged_in_act => {
            check_unfenced_write(&w.scope.run_id, w.operation, top.as_ref())?
        }
        None => {}
    }
    testing_hooks::pause(testing_hooks::Pause::AfterFenceCheck);
    act(&ctx, &run_dir, top.as_ref(), prepared).map_err(|e| inner.note(e))
}

/// [`fenced_write`] with nothing to prepare before the lock.
pub(crate) fn locked_write<T>(
    inner: &Inner,
    scope: &RunScope,
    operation: &'static str,
    fence: Option<Fence>,
    act: impl FnOnce(&Ctx, &Path, Option<&TopHolding>) -> Result<T>,
) -> Result<T> {
    fenced_write(
        inner,
        FencedWrite::new(scope, operation, fence),
        |_, _, _| Ok(()),
        |ctx, run_dir, top, ()| act(ctx, run_dir, top),
    )
}

/// [`locked_write`] for a write whose act judges it itself
/// ([`FencedWrite::judged_in_act`]).
pub(crate) fn judged_write<T>(
    inner: &Inner,
    scope: &RunScope,
    operation: &'static str,
    act: impl FnOnce(&Ctx, &Path, Option<&TopHolding>) -> Result<T>,
) -> Result<T> {
    let mut w = FencedWrite::new(scope, operation, None);
    w.judged_in_act = true;
    fenced_write(
        inner,
        w,
        |_, _, _| Ok(()),
        |ctx, run_dir, top, ()| act(ctx, run_dir, top),
    )
}

/// The fence rule (the core's), recording every refusal in the run's
/// fenced-out log.
pub(crate) fn check_fence(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    fence: Fence,
    top: Option<&TopHolding>,
    scope: &RunScope,
) -> Result<()> {
    if testing_hooks::mutation() == testing_hooks::Mutation::NoWriteFence {
        return Ok(());
    }
    let r = check_write_fence(&scope.run_id, ctx.operation, fence, top);
    if let Err(Error::FencedOut {
        presented, current, ..
    }) = &r
    {
        if !inner.read_only {
            record_refusal(run_dir, ctx.operation, *presented, *current);
        }
        // Told why when an operator cancelled the run (the record is
        // read only on this refusal path).
        if let Ok(Some(record)) = run_state::read_record(run_dir, ctx) {
            return r.map_err(|e| failure::refine_refusal(e, &record.lifecycle));
        }
    }
    r
}

/// Reads the holding and checks `fence` against it (a re-check inside
/// an act, before a publish that must not outlive a takeover).
pub(crate) fn recheck_fence(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    fence: Fence,
    scope: &RunScope,
) -> Result<()> {
    let top = claims::read_top(run_dir, ctx)?;
    check_fence(inner, ctx, run_dir, fence, top.as_ref(), scope)
}

/// Appends one line to the run's fenced-out log: the evidence the doctor
/// uses to report two processes writing one run (a single open writer per
/// run is the rule). Best effort: a refusal is reported to the caller
/// whether or not it could be recorded.
fn record_refusal(run_dir: &Path, operation: &str, presented: Fence, current: Fence) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let meta = run_dir.join(lock::META_DIR);
    if sys::ensure_dir(&meta, Durability::ProcessCrash).is_err() {
        return;
    }
    let line = serde_json::json!({
        "at": Timestamp::now().as_millis(),
        "operation": operation,
        "presented": presented.get(),
        "current": current.get(),
        "pid": std::process::id(),
    });
    let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
    bytes.push(b'\n');
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(sys::FILE_MODE)
        .open(meta.join(FENCED_OUT_LOG))
    {
        let _ = f.write_all(&bytes);
    }
}
