//! `commit_step` on a directory: one fence check under the run lock, the
//! parts written in a fixed order so that a crash between two of them
//! leaves a prefix an at-least-once worker already tolerates
//! (`docs/design/directory/lifecycle.md`):
//!
//! 1. events (one all-or-nothing append),
//! 2. the message snapshot (it names only events that exist),
//! 3. the run record,
//! 4. the checkpoint (the resume point: it never references events that
//!    are not there, because they landed first),
//! 5. the finish: the lifecycle record (its commit point), then the
//!    tombstone at `fence + 1`.
//!
//! Every whole file is written (and synced) to its sidecar before the run
//! lock is taken; under the lock only the fence check, the append and the
//! renames run, and the fence is checked again before each publish.

use runkeep::step::{Step, StepReceipt};
use runkeep::{Fence, Result, RunScope};

use crate::checkpoints;
use crate::inner::Inner;
use crate::run_state::{self, Record};
use crate::sys::{self, Ctx};
use crate::{documents, fenced_write, queue, testing_hooks, transcript};

pub(crate) fn commit_step(
    inner: &Inner,
    scope: &RunScope,
    fence: Fence,
    step: &Step,
) -> Result<StepReceipt> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    step.validate(scope)?;
    let record_bytes = step
        .run_record
        .as_ref()
        .map(documents::encode_record)
        .transpose()?;
    let now = inner.now();
    let ctx = Ctx::new(scope, "commit_step");
    let run_dir = inner.run_dir(scope);

    // Refused (stale fence, finished run) before anything is created.
    let state0 = run_state::read_state(&run_dir, &ctx)?;
    fenced_write::check_fence(inner, &ctx, &run_dir, fence, state0.top.as_ref(), scope)?;
    let finish0 = step.plan_finish(&scope.run_id, &state0.lifecycle, fence, now)?;
    inner.check_poison()?;

    // The whole files, written before the lock.
    sys::ensure_dir(&run_dir, inner.durability)
        .map_err(|e| inner.note(ctx.io("create the run directory", &run_dir, e)))?;
    let last0 = transcript::last_seq(&run_dir, &ctx).unwrap_or(0);
    let predicted_through = step.messages.as_ref().map(|m| {
        m.through_event_seq
            .unwrap_or(last0 + step.events.len() as u64)
    });
    let messages_temp = match (&step.messages, predicted_through) {
        (Some(m), Some(through)) => Some((
            through,
            sys::TempFile::write(
                &run_dir,
                documents::MESSAGES,
                &documents::encode_messages(&m.messages, through),
                inner.durability,
            )
            .map_err(|e| inner.note(ctx.io("write", &run_dir.join(documents::MESSAGES), e)))?,
        )),
        _ => None,
    };
    let record_temp = match &record_bytes {
        Some(bytes) => Some(
            sys::TempFile::write(&run_dir, documents::RUN_RECORD, bytes, inner.durability)
                .map_err(|e| {
                    inner.note(ctx.io("write", &run_dir.join(documents::RUN_RECORD), e))
                })?,
        ),
        None => None,
    };
    let stored_cp = step.checkpoint.as_ref().map(|cp| {
        let mut stored = cp.clone();
        stored.fence = Some(fence);
        stored
    });
    let cp_temp = match &stored_cp {
        Some(cp) => Some(
            checkpoints::checkpoint_sidecar(inner, &ctx, &run_dir, cp)
                .map_err(|e| inner.note(e))?,
        ),
        None => None,
    };
    let finish_temp = match &finish0 {
        Some(f0) => Some((
            f0.lifecycle.clone(),
            run_state::prepare(
                &run_dir,
                &Record::new(f0.lifecycle.clone(), f0.tombstone.get()),
                inner.durability,
                &ctx,
            )
            .map_err(|e| inner.note(e))?,
        )),
        None => None,
    };

    let (receipt, rebuild) = fenced_write::locked_write(
        inner,
        scope,
        "commit_step",
        Some(fence),
        |ctx, run_dir, _| {
            // `locked_write` checked the fence; a finished run is refused
            // by it too (its fence is spent).
            let recheck = || fenced_write::recheck_fence(inner, ctx, run_dir, fence, scope);
            if step.finish.is_some() {
                let state = run_state::read_state(run_dir, ctx)?;
                step.plan_finish(&scope.run_id, &state.lifecycle, fence, now)?;
            }
            let mut cp_temp = cp_temp;
            let mut rebuild = false;
            let mut publish_checkpoint = |temp: Option<sys::TempFile>| -> Result<()> {
                if let (Some(cp), Some(temp)) = (&stored_cp, temp) {
                    recheck()?;
                    rebuild =
                        checkpoints::publish_checkpoint(inner, ctx, run_dir, temp, cp.header())?;
                }
                Ok(())
            };
            if testing_hooks::mutation() == testing_hooks::Mutation::StepCheckpointFirst {
                // Mutation only: the checkpoint before its events (the
                // order the crash test must catch).
                publish_checkpoint(cp_temp.take())?;
            }
            testing_hooks::pause(testing_hooks::Pause::StepAfterCheck);

            // 1. Events.
            let events = if step.events.is_empty() {
                Vec::new()
            } else {
                transcript::append_to_transcript(
                    run_dir,
                    &step.events,
                    Some(fence),
                    inner.durability,
                    ctx,
                    &recheck,
                    now,
                )?
            };
            testing_hooks::pause(testing_hooks::Pause::StepAfterEvents);

            // 2. Messages.
            if let Some(m) = &step.messages {
                let last_before = match events.first() {
                    Some(e) => e.seq - 1,
                    None => transcript::last_seq(run_dir, ctx)?,
                };
                let through = Step::through_seq(m, &events, last_before);
                let temp = match messages_temp {
                    Some((predicted, t)) if predicted == through => t,
                    _ => sys::TempFile::write(
                        run_dir,
                        documents::MESSAGES,
                        &documents::encode_messages(&m.messages, through),
                        inner.durability,
                    )
                    .map_err(|e| ctx.io("write", &run_dir.join(documents::MESSAGES), e))?,
                };
                recheck()?;
                temp.publish(documents::MESSAGES)
                    .map_err(|e| ctx.io("publish", &run_dir.join(documents::MESSAGES), e))?;
            }
            testing_hooks::pause(testing_hooks::Pause::StepAfterMessages);

            // 3. Run record.
            if let Some(temp) = record_temp {
                recheck()?;
                temp.publish(documents::RUN_RECORD)
                    .map_err(|e| ctx.io("publish", &run_dir.join(documents::RUN_RECORD), e))?;
            }
            testing_hooks::pause(testing_hooks::Pause::StepAfterRecord);

            // 4. Checkpoint.
            publish_checkpoint(cp_temp.take())?;
            testing_hooks::pause(testing_hooks::Pause::StepAfterCheckpoint);

            // 5. Finish.
            let finished = match &step.finish {
                Some(o) => {
                    recheck()?;
                    Some(queue::finish_locked(
                        inner,
                        ctx,
                        run_dir,
                        scope,
                        fence,
                        o,
                        now,
                        finish_temp,
                    )?)
                }
                None => None,
            };
            Ok((
                StepReceipt {
                    events,
                    checkpoint: stored_cp.clone(),
                    lifecycle: finished,
                },
                rebuild,
            ))
        },
    )?;
    if rebuild {
        checkpoints::rebuild(&run_dir, inner.durability, &ctx);
    }
    Ok(receipt)
}
