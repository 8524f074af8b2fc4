//! `commit_step`: a step's events, checkpoint, messages, record and finish
//! in one transaction under one fence check.

use runkeep::{Error, Fence, Result, RunScope, Step, StepReceipt};

use crate::pipeline::Stmt;
use crate::row::Key;
use crate::store::PgStore;
use crate::tx::Opening;

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
    let key = Key::of(scope);
    let what = "commit_step";
    // Round trip 1: BEGIN, the row lock, then the clock and whether the
    // checkpoint exists. No row is created: the fence needs a holding.
    let opening = Opening {
        clock: true,
        checkpoint: step.checkpoint.as_ref().map(|c| c.id.as_str()),
        ..Opening::default()
    };
    let (tx, o) = store.open(what, scope, &key, opening).await?;
    let now = o.now();
    let mut run = o.state.unwrap_or_default();
    run.check(scope, what, Some(fence))?;
    // Everything that can refuse is decided before anything is sent.
    let finished = step.plan_finish(&scope.run_id, &run.lifecycle, fence, now)?;
    let last_before = run.last_seq;
    let (events, insert) = store.events_stmt(&key, &mut run, &step.events, now, Some(fence))?;
    let mut writes: Vec<Stmt> = insert.into_iter().collect();
    let checkpoint = match &step.checkpoint {
        Some(cp) => {
            let mut stored = cp.clone();
            stored.fence = Some(fence);
            writes.push(
                store
                    .checkpoint_stmt(&tx, what, scope, &mut run, &stored, o.checkpoint_exists)
                    .await?,
            );
            Some(stored)
        }
        None => None,
    };
    if let Some(m) = &step.messages {
        let through = Step::through_seq(m, &events, last_before);
        writes.push(store.messages_stmt(&key, &m.messages, through)?);
    }
    if let Some(v) = record {
        writes.push(PgStore::document_stmt(&key, "record", Box::new(v)));
    }
    if let Some(f) = &finished {
        f.apply(&mut run.top, &mut run.lifecycle);
    }
    writes.push(PgStore::save_stmt(&key, &run)?);
    // Round trip 2: every write and COMMIT.
    store
        .commit_notify(tx, what, writes, scope, !events.is_empty())
        .await?;
    Ok(StepReceipt {
        events,
        checkpoint,
        lifecycle: finished.map(|f| f.lifecycle),
    })
}
