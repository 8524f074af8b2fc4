//! `commit_step`: a step's events, checkpoint, messages, record and finish
//! in one transaction under one fence check.

use runkeep::{Error, Fence, Result, RunScope, Step, StepReceipt};

use crate::store::PgStore;
use crate::tx::{Opening, Verdict, Writes};

pub(crate) async fn commit_step(
    store: &PgStore,
    scope: &RunScope,
    fence: Fence,
    step: &Step,
) -> Result<StepReceipt> {
    step.validate(scope)?;
    if let Some(r) = step.finish.as_ref().and_then(|o| o.result.as_ref()) {
        store.check_json("finish result", r)?;
    }
    let record = match &step.run_record {
        Some(r) => {
            let v =
                serde_json::to_value(r).map_err(|e| Error::invalid(format!("run record: {e}")))?;
            store.check_json("run record", &v)?;
            Some(v)
        }
        None => None,
    };
    let what = "commit_step";
    // Round trip 1: BEGIN, the row lock, then the clock and whether the
    // checkpoint exists. No row is created: the fence needs a holding.
    let opening = Opening {
        clock: true,
        checkpoint: step.checkpoint.as_ref().map(|c| c.id.as_str()),
        ..Opening::default()
    };
    // Round trip 2: every write and COMMIT.
    store
        .write_locked(what, scope, opening, |l| {
            let (key, run, now) = (&l.key, &mut l.run, l.now);
            run.check(scope, what, Some(fence))?;
            // Everything that can refuse is decided before anything is sent.
            let finished = step.plan_finish(&scope.run_id, &run.lifecycle, fence, now)?;
            let last_before = run.last_seq;
            let (events, insert) = store.events_stmt(key, run, &step.events, now, Some(fence))?;
            let mut writes = Writes::default().stmts(insert);
            let checkpoint = step.checkpoint.as_ref().map(|cp| {
                let mut stored = cp.clone();
                stored.fence = Some(fence);
                stored
            });
            if let Some(stored) = &checkpoint {
                writes = writes.checkpoint(stored.clone(), l.checkpoint_exists);
            }
            if let Some(m) = &step.messages {
                let through = Step::through_seq(m, &events, last_before);
                writes = writes.stmt(store.messages_stmt(key, &m.messages, through)?);
            }
            if let Some(v) = record {
                writes = writes.stmt(PgStore::document_stmt(key, "record", Box::new(v)));
            }
            if let Some(f) = &finished {
                f.apply(&mut run.top, &mut run.lifecycle);
            }
            let writes = writes.save().notify(!events.is_empty());
            let receipt = StepReceipt {
                events,
                checkpoint,
                lifecycle: finished.map(|f| f.lifecycle),
            };
            Ok(Verdict::Write(receipt, writes))
        })
        .await
}
