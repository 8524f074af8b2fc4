//! The checkpoint operations of a directory store (write, read, list,
//! delete, resolve a park, prune): each write goes through the fenced-write
//! skeleton ([`crate::fenced_write`]) and keeps the digest (incrementally
//! under the lock, or rebuilt after it, so a long rebuild never holds the
//! lock).

use std::path::Path;

use runkeep::lease::{check_write_fence, stamp_fence};
use runkeep::{
    checked_update, Checkpoint, CheckpointHeader, CheckpointId, CheckpointUpdate, Error, Fence,
    ParkResolution, Result, RunScope, Timestamp,
};

use super::digest::{after_put, before, rebuild, stamp};
use super::files::{encode, file_name, read_all, read_one, sidecar, CHECKPOINTS_DIR};
use crate::fenced_write::{self, FencedWrite};
use crate::inner::Inner;
use crate::options::Durability;
use crate::sys::{self, Ctx};

/// Writes `cp` to its sidecar (the heavy part, before the lock),
/// creating the checkpoints directory if needed.
pub(crate) fn checkpoint_sidecar(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    cp: &Checkpoint,
) -> Result<sys::TempFile> {
    let cps_dir = run_dir.join(CHECKPOINTS_DIR);
    sys::ensure_dir(&cps_dir, inner.durability)
        .map_err(|e| ctx.io("create the checkpoints directory", &cps_dir, e))?;
    let name = file_name(&cp.id);
    sidecar(run_dir, &name, &encode(cp), inner.durability)
        .map_err(|e| ctx.io("write the checkpoint", &cps_dir.join(&name), e))
}

/// Publishes a sidecar written for `header` (under the lock) and keeps
/// the digest; answers whether the digest needs a rebuild (after the
/// lock).
pub(crate) fn publish_checkpoint(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    temp: sys::TempFile,
    header: CheckpointHeader,
) -> Result<bool> {
    let name = file_name(&header.id);
    let before = before(run_dir, &name);
    let ino = temp.ino();
    temp.publish(&name).map_err(|e| {
        ctx.io(
            "publish the checkpoint",
            &run_dir.join(CHECKPOINTS_DIR).join(&name),
            e,
        )
    })?;
    Ok(!after_put(
        run_dir,
        before,
        &name,
        ino,
        header,
        inner.durability,
    ))
}

/// Writes a checkpoint file (under the lock) and keeps the digest;
/// answers whether the digest needs a rebuild (after the lock).
pub(crate) fn put_checkpoint(
    inner: &Inner,
    ctx: &Ctx,
    run_dir: &Path,
    cp: &Checkpoint,
) -> Result<bool> {
    let temp = checkpoint_sidecar(inner, ctx, run_dir, cp)?;
    publish_checkpoint(inner, ctx, run_dir, temp, cp.header())
}

/// A checkpoint write: stamped with the fence presented, else the
/// holder's (the early read), written to its sidecar before the lock;
/// under the lock, re-stamped (and rewritten) only if the holding
/// changed meanwhile, then published.
pub(crate) fn write_checkpoint(
    inner: &Inner,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    fence: Option<Fence>,
) -> Result<Checkpoint> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    checkpoint.validate_for_write(scope)?;
    let w = FencedWrite::new(scope, "write_checkpoint", fence).reading_top_early();
    let (stored, stale) = fenced_write::fenced_write(
        inner,
        w,
        |ctx, run_dir, top0| {
            let mut stored = checkpoint.clone();
            stored.fence = stamp_fence(fence, top0);
            let temp = checkpoint_sidecar(inner, ctx, run_dir, &stored)?;
            Ok((stored, temp))
        },
        |ctx, run_dir, top, (mut stored, mut temp)| {
            let now_stamp = stamp_fence(fence, top);
            if now_stamp != stored.fence {
                stored.fence = now_stamp;
                drop(temp);
                temp = checkpoint_sidecar(inner, ctx, run_dir, &stored)?;
            }
            let stale = publish_checkpoint(inner, ctx, run_dir, temp, stored.header())?;
            Ok((stored, stale))
        },
    )?;
    if stale {
        let ctx = Ctx::new(scope, "write_checkpoint");
        rebuild(&inner.run_dir(scope), inner.durability, &ctx);
    }
    Ok(stored)
}

pub(crate) fn read_checkpoint(
    inner: &Inner,
    scope: &RunScope,
    id: &CheckpointId,
) -> Result<Option<Checkpoint>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "read_checkpoint");
    read_one(&inner.run_dir(scope), id, &ctx)
}

pub(crate) fn list_checkpoints(inner: &Inner, scope: &RunScope) -> Result<Vec<Checkpoint>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "list_checkpoints");
    read_all(&inner.run_dir(scope), &ctx)
}

pub(crate) fn delete_checkpoint(
    inner: &Inner,
    scope: &RunScope,
    id: &CheckpointId,
    fence: Option<Fence>,
) -> Result<bool> {
    inner.check_scope(scope)?;
    let run_dir = inner.run_dir(scope);
    if !run_dir.is_dir() {
        if let Some(f) = fence {
            check_write_fence(&scope.run_id, "delete_checkpoint", f, None)?;
        }
        return Ok(false);
    }
    let deleted = fenced_write::locked_write(
        inner,
        scope,
        "delete_checkpoint",
        fence,
        |ctx, run_dir, _| {
            let dir = run_dir.join(CHECKPOINTS_DIR);
            let path = dir.join(file_name(id));
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    if inner.durability == Durability::PowerLoss {
                        sys::sync_dir(&dir).map_err(|e| ctx.io("sync", &dir, e))?;
                    }
                    Ok(true)
                }
                Err(e) if sys::is_not_found(&e) => Ok(false),
                Err(e) => Err(ctx.io("delete the checkpoint", &path, e)),
            }
        },
    )?;
    if deleted {
        let ctx = Ctx::new(scope, "delete_checkpoint");
        rebuild(&run_dir, inner.durability, &ctx);
    }
    Ok(deleted)
}

/// A read-modify-write of one checkpoint: read, `update` and publish all
/// under the run lock, so a concurrent update (another process's too)
/// waits and then reads this one's result.
pub(crate) fn update_checkpoint(
    inner: &Inner,
    scope: &RunScope,
    id: &CheckpointId,
    update: &CheckpointUpdate,
    fence: Option<Fence>,
) -> Result<Checkpoint> {
    inner.check_scope(scope)?;
    let what = "update_checkpoint";
    let (stored, stale) =
        fenced_write::locked_write(inner, scope, what, fence, |ctx, run_dir, top| {
            let current = read_one(run_dir, id, ctx)?;
            let mut stored = checked_update(scope, id, update, current.as_ref())?;
            stored.fence = stamp_fence(fence, top);
            let stale = put_checkpoint(inner, ctx, run_dir, &stored)?;
            Ok((stored, stale))
        })?;
    if stale {
        let ctx = Ctx::new(scope, what);
        rebuild(&inner.run_dir(scope), inner.durability, &ctx);
    }
    Ok(stored)
}

pub(crate) fn resolve_park(
    inner: &Inner,
    scope: &RunScope,
    id: &CheckpointId,
    resolution: ParkResolution,
    now: Timestamp,
    fence: Option<Fence>,
) -> Result<Checkpoint> {
    inner.check_scope(scope)?;
    let not_found = || Error::NotFound {
        what: format!("checkpoint {id} of run {}", scope.run_id),
    };
    if !inner.run_dir(scope).is_dir() {
        return Err(not_found());
    }
    let (updated, stale) =
        fenced_write::locked_write(inner, scope, "resolve_park", fence, |ctx, run_dir, top| {
            let current = read_one(run_dir, id, ctx)?.ok_or_else(not_found)?;
            let mut updated = current.clone();
            runkeep::park::resolve(&mut updated, resolution, now)?;
            updated.fence = stamp_fence(fence, top).or(current.fence);
            let stale = put_checkpoint(inner, ctx, run_dir, &updated)?;
            Ok((updated, stale))
        })?;
    if stale {
        let ctx = Ctx::new(scope, "resolve_park");
        rebuild(&inner.run_dir(scope), inner.durability, &ctx);
    }
    Ok(updated)
}

pub(crate) fn prune_checkpoints(
    inner: &Inner,
    scope: &RunScope,
    keep_last: usize,
    fence: Option<Fence>,
) -> Result<Vec<CheckpointId>> {
    inner.check_scope(scope)?;
    if !inner.run_dir(scope).is_dir() {
        return Ok(Vec::new());
    }
    // Read everything before taking the lock (checkpoints can be large);
    // under the lock, use that read only if the directory has not
    // changed since (else a park written meanwhile could be deleted).
    let victims = fenced_write::fenced_write(
        inner,
        FencedWrite::new(scope, "prune_checkpoints", fence),
        |ctx, run_dir, _| {
            let stamp0 = stamp(&run_dir.join(CHECKPOINTS_DIR))
                .ok()
                .flatten()
                .map(|(s, _)| s);
            Ok((stamp0, read_all(run_dir, ctx)?))
        },
        |ctx, run_dir, _, (stamp0, early)| {
            let stamp1 = stamp(&run_dir.join(CHECKPOINTS_DIR))
                .ok()
                .flatten()
                .map(|(s, _)| s);
            let cps = if stamp0.is_some() && stamp0 == stamp1 {
                early
            } else {
                read_all(run_dir, ctx)?
            };
            let victims = runkeep::park::prune_victims(&cps, keep_last);
            let dir = run_dir.join(CHECKPOINTS_DIR);
            for v in &victims {
                let path = dir.join(file_name(v));
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if sys::is_not_found(&e) => {}
                    Err(e) => return Err(ctx.io("delete the checkpoint", &path, e)),
                }
            }
            if !victims.is_empty() && inner.durability == Durability::PowerLoss {
                sys::sync_dir(&dir).map_err(|e| ctx.io("sync", &dir, e))?;
            }
            Ok(victims)
        },
    )?;
    if !victims.is_empty() {
        let ctx = Ctx::new(scope, "prune_checkpoints");
        rebuild(&inner.run_dir(scope), inner.durability, &ctx);
    }
    Ok(victims)
}
