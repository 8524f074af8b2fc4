//! Contract v2's lifecycle operations on a directory (enqueue, finish,
//! snooze, reopen, the lifecycle read) and the answers read from the digest
//! (latest checkpoint, pending park, resume point). Where each piece of
//! state lives: [`crate::run_state`].

use std::path::Path;

use runkeep::lifecycle::check_enqueue;
use runkeep::lifecycle::{self, EnqueueOptions, Lifecycle, Outcome};
use runkeep::{Checkpoint, Error, Fence, Result, RunScope, Timestamp, TopHolding};

use crate::checkpoints::{self, Fresh};
use crate::claims::{self, PublishError, CLAIMS_DIR};
use crate::inner::Inner;
use crate::run_state::{self, Record};
use crate::sys::{self, Ctx};
use crate::{documents, fenced_write, testing_hooks, transcript};

/// True when the run has any state at all: a checkpoint, a holding, a
/// transcript or a run record (the memory store's rule).
pub(crate) fn run_exists(run_dir: &Path, ctx: &Ctx) -> Result<bool> {
    let cps = run_dir.join(checkpoints::CHECKPOINTS_DIR);
    let has_cps = checkpoints::entries(&cps)
        .map_err(|e| ctx.io("list the checkpoints", &cps, e))?
        .is_some_and(|l| !l.is_empty());
    if has_cps {
        return Ok(true);
    }
    let claims_dir = run_dir.join(CLAIMS_DIR);
    let has_claims = claims::scan(&claims_dir)
        .map_err(|e| ctx.io("list the claims directory", &claims_dir, e))?
        .is_some_and(|s| !s.holdings.is_empty());
    Ok(has_claims
        || run_dir.join(transcript::TRANSCRIPT).exists()
        || run_dir.join(documents::RUN_RECORD).exists())
}

pub(crate) fn lifecycle(inner: &Inner, scope: &RunScope) -> Result<Lifecycle> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "lifecycle");
    Ok(run_state::read_state(&inner.run_dir(scope), &ctx)?.lifecycle)
}

pub(crate) fn enqueue(
    inner: &Inner,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    options: &EnqueueOptions,
) -> Result<Checkpoint> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    checkpoint.validate_for_write(scope)?;
    options.validate(&scope.run_id)?;
    refuse_unlisted(scope)?;
    let ctx = Ctx::new(scope, "enqueue");
    let run_dir = inner.run_dir(scope);
    // Refused before anything is created.
    check_enqueue(run_exists(&run_dir, &ctx)?, &scope.run_id)?;
    let mut stored = checkpoint.clone();
    stored.fence = None;
    let record = Record::new(options.lifecycle(), 0);
    let rebuild = fenced_write::judged_write(inner, scope, "enqueue", |ctx, run_dir, _| {
        check_enqueue(run_exists(run_dir, ctx)?, &scope.run_id)?;
        // The record first: a crash before the checkpoint leaves a run
        // that does not exist yet (no checkpoint), which enqueue may
        // create again; the checkpoint is the commit point.
        run_state::write(run_dir, &record, inner.durability, ctx)?;
        testing_hooks::pause(testing_hooks::Pause::EnqueueAfterRecord);
        checkpoints::put_checkpoint(inner, ctx, run_dir, &stored)
    })?;
    if rebuild {
        checkpoints::rebuild(&run_dir, inner.durability, &ctx);
    }
    Ok(stored)
}

/// Publishes the tombstone of a finish at `tomb` (the caller holds the
/// run lock). `Exists`: someone (only the reference, which takes no
/// run lock) took that number; the record still spends the fence.
pub(crate) fn publish_finish_tombstone(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    tomb: Fence,
    attempts: u32,
) -> Result<()> {
    let claims_dir = run_dir.join(CLAIMS_DIR);
    sys::ensure_dir(&claims_dir, inner.durability)
        .map_err(|e| ctx.io("create the claims directory", &claims_dir, e))?;
    match claims::publish(
        inner,
        &claims_dir,
        tomb,
        &claims::tomb_body(attempts, None, None),
        ctx,
    ) {
        Ok(()) => Ok(()),
        Err(PublishError::Exists) => {
            tracing::warn!(run = %ctx.run, %tomb, "the finish's tombstone number was taken by another writer (the reference implementation?); the lifecycle record spends the fence");
            Ok(())
        }
        Err(PublishError::Failed(e)) => Err(e),
    }
}

pub(crate) fn finish(
    inner: &Inner,
    scope: &RunScope,
    fence: Fence,
    outcome: &Outcome,
) -> Result<Lifecycle> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    outcome.validate(&scope.run_id)?;
    let now = inner.now();
    let ctx = Ctx::new(scope, "finish");
    let run_dir = inner.run_dir(scope);
    // Refused (finished run, then fence) before anything is created. A
    // finished run answers `Conflict` whatever the fence (its own spent
    // one included), as the memory store does: the caller learns the run
    // is finished, not only that it lost it.
    let state0 = run_state::read_state(&run_dir, &ctx)?;
    let l0 = lifecycle::after_finish(&scope.run_id, &state0.lifecycle, outcome, fence, now)?;
    fenced_write::check_fence(inner, &ctx, &run_dir, fence, state0.top.as_ref(), scope)?;
    let tomb = fence.next(&scope.run_id)?;
    inner.check_poison()?;
    // Written (and synced) before the lock; under it only the checks and
    // the rename.
    let temp = run_state::prepare(
        &run_dir,
        &Record::new(l0.clone(), tomb.get()),
        inner.durability,
        &ctx,
    )
    .map_err(|e| inner.note(e))?;
    // The fence is checked under the lock by `finish_locked` (after the
    // finished-run check, as above).
    fenced_write::judged_write(inner, scope, "finish", |ctx, run_dir, _| {
        finish_locked(
            inner,
            ctx,
            run_dir,
            scope,
            fence,
            outcome,
            now,
            Some((l0, temp)),
        )
    })
}

/// The finish under the run lock: the finished-run check, the fence
/// check, the record (the commit point), then the tombstone at
/// `fence + 1`.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site passes what the locked write needs; a struct would only rename the arguments"
)]
pub(crate) fn finish_locked(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    scope: &RunScope,
    fence: Fence,
    outcome: &Outcome,
    now: Timestamp,
    prepared: Option<(Lifecycle, sys::TempFile)>,
) -> Result<Lifecycle> {
    let state = run_state::read_state(run_dir, ctx)?;
    let l = lifecycle::after_finish(&scope.run_id, &state.lifecycle, outcome, fence, now)?;
    fenced_write::check_fence(inner, ctx, run_dir, fence, state.top.as_ref(), scope)?;
    let tomb = fence.next(&scope.run_id)?;
    let temp = match prepared {
        Some((l0, t)) if l0 == l => t,
        _ => run_state::prepare(
            run_dir,
            &Record::new(l.clone(), tomb.get()),
            inner.durability,
            ctx,
        )?,
    };
    run_state::publish(run_dir, temp, ctx)?;
    testing_hooks::pause(testing_hooks::Pause::FinishAfterRecord);
    if let Err(e) = publish_finish_tombstone(inner, ctx, run_dir, tomb, l.attempts) {
        // Committed by the record: the fence is spent whether or not its
        // tombstone exists (reads apply the record); reopen publishes it.
        let e = inner.note(e);
        tracing::warn!(run = %scope.run_id, "the finish is recorded, but its tombstone could not be published: {e}");
    }
    Ok(l)
}

pub(crate) fn snooze(
    inner: &Inner,
    scope: &RunScope,
    fence: Fence,
    until: Timestamp,
) -> Result<bool> {
    inner.check_scope(scope)?;
    claims::release_with(inner, scope, fence, Some(until), "snooze")
}

pub(crate) fn reopen(inner: &Inner, scope: &RunScope) -> Result<Lifecycle> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "reopen");
    let run_dir = inner.run_dir(scope);
    let not_found = || Error::NotFound {
        what: format!("run {}", scope.run_id),
    };
    if !run_dir.is_dir() || !run_exists(&run_dir, &ctx)? {
        return Err(not_found());
    }
    fenced_write::judged_write(inner, scope, "reopen", |ctx, run_dir, _| {
        let real = claims::read_holding(run_dir, ctx)?;
        let state = run_state::read_state(run_dir, ctx)?;
        let l = lifecycle::after_reopen(&scope.run_id, &state.lifecycle)?;
        let mut as_of = real.as_ref().map_or(0, |h| h.top.fence().get());
        if let Some(TopHolding::Released { fence }) = state.top {
            if fence.get() > as_of {
                // A finish whose tombstone never landed: publish it now,
                // so the next claim is above every fence issued.
                publish_finish_tombstone(inner, ctx, run_dir, fence, state.lifecycle.attempts)?;
                as_of = fence.get();
            }
        }
        run_state::write(
            run_dir,
            &Record::new(l.clone(), as_of),
            inner.durability,
            ctx,
        )?;
        Ok(l)
    })
}

/// The latest checkpoint, from the digest when it is fresh (one
/// checkpoint read), else from every checkpoint.
/// The checkpoint ids `query` admits, from the directory's names alone (one
/// readdir; no checkpoint file is opened or parsed).
pub(crate) fn checkpoint_ids(
    inner: &Inner,
    scope: &RunScope,
    query: &runkeep::CheckpointIdQuery,
) -> Result<Vec<runkeep::CheckpointId>> {
    query.validate()?;
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "checkpoint_ids");
    let dir = inner.run_dir(scope).join(checkpoints::CHECKPOINTS_DIR);
    let Some(list) =
        checkpoints::entries(&dir).map_err(|e| ctx.io("list the checkpoints", &dir, e))?
    else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::with_capacity(list.len());
    for e in &list {
        let stem = &e.name[..e.name.len() - ".json".len()];
        // Never silently short: a name that is no id is damage, as on a read.
        let id = runkeep::CheckpointId::new(stem).map_err(|_| {
            ctx.corrupted(
                &dir.join(&e.name),
                "not a usable checkpoint: its name is not a checkpoint id ([A-Za-z0-9_-], starting with a letter or digit)",
            )
        })?;
        ids.push(id);
    }
    Ok(query.answer(ids))
}

pub(crate) fn latest_checkpoint(inner: &Inner, scope: &RunScope) -> Result<Option<Checkpoint>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "latest_checkpoint");
    let run_dir = inner.run_dir(scope);
    match checkpoints::fresh_digest(&run_dir) {
        Fresh::NoDirectory => return Ok(None),
        Fresh::Digest(d) => match &d.latest {
            None if d.checkpoint_count == 0 => return Ok(None),
            Some(h) => {
                if let Some(cp) = checkpoints::read_one(&run_dir, &h.id, &ctx)? {
                    if cp.header() == *h {
                        return Ok(Some(cp));
                    }
                }
            }
            None => {}
        },
        Fresh::Stale => {}
    }
    Ok(checkpoints::read_all(&run_dir, &ctx)?.pop())
}

/// The pending checkpoint, from the digest's park headers when it is
/// fresh (one checkpoint read at most), else from every checkpoint.
pub(crate) fn find_pending(
    inner: &Inner,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<Checkpoint>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "find_pending");
    let run_dir = inner.run_dir(scope);
    match checkpoints::fresh_digest(&run_dir) {
        Fresh::NoDirectory => return Ok(None),
        Fresh::Digest(d) => {
            let Some(h) = d.pending_park(now) else {
                return Ok(None);
            };
            if let Some(cp) = checkpoints::read_one(&run_dir, &h.id, &ctx)? {
                if cp.header() == *h {
                    return Ok(Some(cp));
                }
            }
        }
        Fresh::Stale => {}
    }
    let cps = checkpoints::read_all(&run_dir, &ctx)?;
    Ok(runkeep::park::find_pending(&cps, now).cloned())
}

/// The pending checkpoint if any, else the latest (both indexed).
pub(crate) fn resume_point(
    inner: &Inner,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<Checkpoint>> {
    match find_pending(inner, scope, now)? {
        Some(p) => Ok(Some(p)),
        None => latest_checkpoint(inner, scope),
    }
}

/// A directory lists, and `claim_next` hands out, only run directories named
/// `run_*` (the reference layout's listing rule): a run enqueued under
/// any other id would wait in the queue forever, invisible. Refused here —
/// enqueue is runkeep's own (the reference has no queue), so no shared
/// directory depends on it — while plain checkpoint writes under such ids
/// stay allowed, as the reference allows them.
fn refuse_unlisted(scope: &RunScope) -> Result<()> {
    let unlisted = |id: &str| !crate::listing::is_listed_run_name(id);
    if unlisted(scope.run_id.as_str())
        || scope
            .parent_run_id
            .as_ref()
            .is_some_and(|p| unlisted(p.as_str()))
    {
        return Err(Error::invalid(format!(
            "enqueue: run id {:?} does not start with \"run_\": a directory store lists and hands out only run_* runs (the layout it shares with the reference), so this run would never be listed or claimed by claim_next. Use an id such as \"run_{}\" (runkeep's generated ids already are)",
            scope.parent_run_id.as_ref().filter(|p| unlisted(p.as_str())).unwrap_or(&scope.run_id).as_str(),
            scope.run_id.as_str().trim_start_matches("run_")
        )));
    }
    Ok(())
}
