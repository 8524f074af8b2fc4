//! The transcript and audit operations of a directory store: each takes
//! the store's state ([`Inner`]), checks the scope, and runs the file-level
//! work of [`super::append`], [`super::reading`] and [`super::audit`]
//! (appends through the fenced-write skeleton, [`crate::fenced_write`]).

use runkeep::{
    AuditRecord, EventBatch, Fence, NewAuditEvent, NewEvent, PersistedEvent, ReadEventsOptions,
    Result, RunScope,
};

use super::append::append_to_transcript;
use super::audit::{append_to_trail, read_trail};
use super::reading::read_transcript;
use crate::fenced_write;
use crate::inner::Inner;
use crate::sys::Ctx;
use crate::testing_hooks::{self, Mutation};

/// The fenced append of events: under the run lock, the fence checked
/// again just before the batch is written.
pub(crate) fn append_events(
    inner: &Inner,
    scope: &RunScope,
    events: &[NewEvent],
    fence: Option<Fence>,
) -> Result<Vec<PersistedEvent>> {
    inner.check_scope(scope)?;
    for e in events {
        e.validate()?;
    }
    fenced_write::locked_write(inner, scope, "append_events", fence, |ctx, run_dir, _| {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let recheck = || match fence {
            Some(_) if testing_hooks::mutation() == Mutation::NoAppendRecheck => Ok(()),
            Some(f) => fenced_write::recheck_fence(inner, ctx, run_dir, f, scope),
            None => Ok(()),
        };
        append_to_transcript(
            run_dir,
            events,
            fence,
            inner.durability,
            ctx,
            &recheck,
            inner.now(),
        )
    })
}

/// A read of the run's events (strict or tolerant); creates nothing.
pub(crate) fn read_events(
    inner: &Inner,
    scope: &RunScope,
    options: &ReadEventsOptions,
) -> Result<EventBatch> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "read_events");
    read_transcript(&inner.run_dir(scope), options, &ctx)
}

/// The fenced append of audit events, under the run lock.
pub(crate) fn append_audit(
    inner: &Inner,
    scope: &RunScope,
    events: &[NewAuditEvent],
    fence: Option<Fence>,
) -> Result<Vec<AuditRecord>> {
    inner.check_scope(scope)?;
    for e in events {
        e.validate()?;
    }
    fenced_write::locked_write(inner, scope, "append_audit", fence, |ctx, run_dir, _| {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        append_to_trail(
            run_dir,
            scope.run_id.as_str(),
            events,
            fence,
            inner.durability,
            ctx,
            inner.now(),
        )
    })
}

/// The audit records after `since_seq`; creates nothing.
pub(crate) fn read_audit(
    inner: &Inner,
    scope: &RunScope,
    since_seq: u64,
) -> Result<Vec<AuditRecord>> {
    inner.check_scope(scope)?;
    let ctx = Ctx::new(scope, "read_audit");
    read_trail(&inner.run_dir(scope), since_seq, &ctx)
}
