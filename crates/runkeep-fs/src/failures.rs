//! Failed attempts and cancel on a directory (`runkeep::failure`): where
//! each lands and in what order, so a crash between two steps leaves a
//! state the rules read right.
//!
//! - **A failed attempt that retries**: the release tombstone at
//!   `fence + 1`, carrying the new attempt count and `availableAt`, is the
//!   commit point (one hard link, as a snooze); the lifecycle record written
//!   after it adds the error history. A crash between the two loses that
//!   one error message, never the count or the deferral.
//! - **A failed attempt that dead-letters, and a cancel**: as a finish, the
//!   record (status, reason, history, the spent fence) is the commit point
//!   and the tombstone follows; a record without its tombstone already
//!   reads as released (`run_state::effective`).
//!
//! Both run under the run lock held exclusive, so no claim of this store
//! lands between the judgement and the writes.

use runkeep::failure::{self, AttemptError};
use runkeep::{Error, Fence, Lifecycle, Result, RunScope, TopHolding};

use crate::claims::{self, PublishError, CLAIMS_DIR};
use crate::inner::Inner;
use crate::run_state::{self, Record};
use crate::sys::{self, Ctx};
use crate::{fenced_write, queue};

/// A failed attempt of the lease at `fence`: retried (tombstone first) or,
/// past `limit`, dead-lettered (record first).
pub(crate) fn fail_attempt(
    inner: &Inner,
    scope: &RunScope,
    fence: Fence,
    error: &AttemptError,
    limit: Option<u32>,
) -> Result<Lifecycle> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    error.validate(&scope.run_id)?;
    let now = inner.now();
    let ctx = Ctx::new(scope, "fail_attempt");
    let run_dir = inner.run_dir(scope);
    // Judged before anything is created, then again under the lock.
    let state0 = run_state::read_state(&run_dir, &ctx)?;
    failure::after_failure(&scope.run_id, &state0.lifecycle, fence, error, limit, now)?;
    fenced_write::check_fence(inner, &ctx, &run_dir, fence, state0.top.as_ref(), scope)?;
    inner.check_poison()?;
    fenced_write::judged_write(inner, scope, "fail_attempt", |ctx, run_dir, _| {
        let state = run_state::read_state(run_dir, ctx)?;
        let l = failure::after_failure(&scope.run_id, &state.lifecycle, fence, error, limit, now)?;
        fenced_write::check_fence(inner, ctx, run_dir, fence, state.top.as_ref(), scope)?;
        let tomb = fence.next(&scope.run_id)?;
        let record = Record::new(l.clone(), tomb.get());
        if l.status.is_finished() {
            run_state::write(run_dir, &record, inner.durability, ctx)?;
            if let Err(e) = queue::publish_finish_tombstone(inner, ctx, run_dir, tomb, l.attempts) {
                let e = inner.note(e);
                tracing::warn!(run = %scope.run_id, "the dead-lettering is recorded, but its tombstone could not be published: {e}");
            }
            return Ok(l);
        }
        let claims_dir = run_dir.join(CLAIMS_DIR);
        sys::ensure_dir(&claims_dir, inner.durability)
            .map_err(|e| ctx.io("create the claims directory", &claims_dir, e))?;
        let body = claims::tomb_body(l.attempts, l.available_at, None);
        match claims::publish(inner, &claims_dir, tomb, &body, ctx) {
            Ok(()) => {}
            // Only a writer that takes no run lock (the reference) can
            // have taken the number: the run moved on without us.
            Err(PublishError::Exists) => {
                return Err(Error::FencedOut {
                    run: scope.run_id.to_string(),
                    operation: "fail_attempt",
                    presented: fence,
                    current: tomb,
                })
            }
            Err(PublishError::Failed(e)) => return Err(e),
        }
        if let Err(e) = run_state::write(run_dir, &record, inner.durability, ctx) {
            let e = inner.note(e);
            tracing::warn!(run = %scope.run_id, "the failed attempt is counted and the run deferred, but its error could not be kept: {e}");
        }
        Ok(l)
    })
}

/// An operator's cancel: the record first, then the tombstone of a live
/// lease.
pub(crate) fn cancel(inner: &Inner, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    failure::check_cancel_reason(&scope.run_id, reason)?;
    let now = inner.now();
    let ctx = Ctx::new(scope, "cancel");
    let run_dir = inner.run_dir(scope);
    if !run_dir.is_dir() || !queue::run_exists(&run_dir, &ctx)? {
        return Err(Error::NotFound {
            what: format!("run {}", scope.run_id),
        });
    }
    fenced_write::judged_write(inner, scope, "cancel", |ctx, run_dir, _| {
        let real = claims::read_holding(run_dir, ctx)?;
        let state = run_state::read_state(run_dir, ctx)?;
        let (l, tomb) = failure::after_cancel(
            &scope.run_id,
            true,
            &state.lifecycle,
            state.top.as_ref(),
            reason,
            now,
        )?;
        let as_of = match (tomb, &state.top) {
            (Some(t), _) => t.get(),
            (None, Some(TopHolding::Released { fence })) => fence.get(),
            (None, _) => real.as_ref().map_or(0, |h| h.top.fence().get()),
        };
        run_state::write(
            run_dir,
            &Record::new(l.clone(), as_of),
            inner.durability,
            ctx,
        )?;
        if let Some(t) = tomb {
            if let Err(e) = queue::publish_finish_tombstone(inner, ctx, run_dir, t, l.attempts) {
                let e = inner.note(e);
                tracing::warn!(run = %scope.run_id, "the cancel is recorded, but its tombstone could not be published: {e}");
            }
        }
        Ok(l)
    })
}
