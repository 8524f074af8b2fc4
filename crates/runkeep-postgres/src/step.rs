//! `commit_step`: a step's events, checkpoint, messages, record and finish
//! in one transaction under one fence check; and the hand-over, the same
//! transaction also taking the worker's next run.

use runkeep::batch::StepCommit;
use runkeep::{Error, Fence, Handover, NextClaim, Result, RunScope, Step, StepReceipt, Timestamp};
use serde_json::Value;
use std::collections::HashMap;

use crate::claims::{NextSearch, Searched};
use crate::db::pipeline::{Param, Stmt};
use crate::db::row::{state_of, Key, CLOCK, KEY_COLS, STATE_COLS};
use crate::db::tx::{Locked, Opened, Opening, Verdict, Wake, Writes};
use crate::db::Db;

pub(crate) async fn commit_step(
    db: &Db,
    scope: &RunScope,
    fence: Fence,
    step: &Step,
) -> Result<StepReceipt> {
    let record = checked(db, scope, step)?;
    // Round trip 1: BEGIN, the row lock, then the clock and whether the
    // checkpoint exists. No row is created: the fence needs a holding.
    // Round trip 2: every write and COMMIT.
    db.write_locked("commit_step", scope, opening(step), |l| {
        let (receipt, writes) = judge(db, scope, fence, step, record, l)?;
        Ok(Verdict::Write(receipt, writes))
    })
    .await
}

/// The step, then the next run, in one transaction: round trip 1 also
/// fetches the first candidate; round trip 2 sends the step's writes, the
/// claim and `COMMIT` (one more per candidate the core does not take).
pub(crate) async fn commit_step_and_claim_next(
    db: &Db,
    scope: &RunScope,
    fence: Fence,
    step: &Step,
    next: &NextClaim,
) -> Result<Handover> {
    let what = "commit_step_and_claim_next";
    let record = checked(db, scope, step)?;
    let mut search = NextSearch::new(db, &next.scope, &next.filter, &next.options)?;
    let mut opening = opening(step);
    opening.more.push(search.first());
    let (tx, mut locked) = db.lock_row(what, scope, opening).await?;
    let mut first = std::mem::take(&mut locked.more);
    let (receipt, writes) = judge(db, scope, fence, step, record, &mut locked)?;
    let merge = db.options.merge_step_writes;
    // The step's writes, merged below with the claim's (another row).
    let (mut stmts, notify) = db
        .written(&tx, what, scope, &mut locked, writes.merged(false))
        .await?;
    if ends_a_key_holding(&locked) {
        // The step ends a holding of a concurrency key: the next claim must
        // count without it, as a claim after the step's commit would. The
        // step's writes go first (same transaction, still one commit), then
        // the first candidate again: the one read with the lock predates
        // them (and the key may have looked saturated then). One more round
        // trip, only for such a step.
        if merge {
            stmts = merged(stmts);
        }
        stmts.push(search.first());
        first = db.run(&tx, what, std::mem::take(&mut stmts)).await?;
        first = first.pop().into_iter().collect();
    }
    let searched = search
        .search(db, &tx, what, first, Some(scope), &mut stmts)
        .await?;
    if merge {
        stmts = merged(stmts);
    }
    db.commit_notify(tx, what, stmts, scope, notify).await?;
    let next = match searched {
        Searched::Taken(taken) => Ok(taken),
        // A keyed candidate was judged and not taken, or the step's own
        // run came up (its lease lapsed; its row as read predates the
        // step): the step commits (ending the key's lock), and the next
        // run is claimed after it, as `claim_next` would (the contract's
        // "claims after the step committed": an error there leaves the
        // step standing).
        Searched::KeyJudged(_) | Searched::AfterCommit => {
            crate::claims::claim_next(db, &next.scope, &next.filter, &next.options).await
        }
    };
    Ok(Handover { receipt, next })
}

/// The step's (and the claim's) writes as one statement
/// ([`pipeline::merged`](crate::db::pipeline::merged)): no two of them
/// touch the same row (the step saves its run's row once, its documents
/// with it; the claim saves another run's).
fn merged(stmts: Vec<Stmt>) -> Vec<Stmt> {
    crate::db::pipeline::merged("the step's writes", stmts)
        .into_iter()
        .collect()
}

/// True when the judged step ends the run's holding of a concurrency key
/// (its lease stops being the top: a finishing step).
fn ends_a_key_holding(l: &Locked) -> bool {
    l.run.lifecycle.concurrency.is_some()
        && matches!(l.before, Some(runkeep::TopHolding::Lease { .. }))
        && !matches!(l.run.top, Some(runkeep::TopHolding::Lease { .. }))
}

/// What the step's first round trip reads besides the locked row: the
/// clock, and whether the checkpoint exists.
fn opening(step: &Step) -> Opening<'_> {
    Opening {
        clock: true,
        checkpoint: step.checkpoint.as_ref().map(|c| c.id.as_str()),
        ..Opening::default()
    }
}

/// Validates the step before anything is sent; answers its run record as
/// JSON.
fn checked(db: &Db, scope: &RunScope, step: &Step) -> Result<Option<Value>> {
    step.validate(scope)?;
    if let Some(r) = step.finish.as_ref().and_then(|o| o.result.as_ref()) {
        db.check_json("finish result", r)?;
    }
    match &step.run_record {
        Some(r) => {
            let v =
                serde_json::to_value(r).map_err(|e| Error::invalid(format!("run record: {e}")))?;
            db.check_json("run record", &v)?;
            Ok(Some(v))
        }
        None => Ok(None),
    }
}

/// The core's judgement of the step on the locked row, and its writes.
fn judge(
    db: &Db,
    scope: &RunScope,
    fence: Fence,
    step: &Step,
    record: Option<Value>,
    l: &mut Locked,
) -> Result<(StepReceipt, Writes)> {
    let what = "commit_step";
    let (key, run, now) = (&l.key, &mut l.run, l.now);
    run.check(scope, what, Some(fence))?;
    // Everything that can refuse is decided before anything is sent.
    let finished = step.plan_finish(&scope.run_id, &run.lifecycle, fence, now)?;
    let last_before = run.last_seq;
    let (events, insert) =
        crate::events::events_stmt(db, key, run, &step.events, now, Some(fence))?;
    let mut writes = Writes::default().stmts(insert);
    let checkpoint = step.checkpoint.as_ref().map(|cp| {
        let mut stored = cp.clone();
        stored.fence = Some(fence);
        stored
    });
    if let Some(stored) = &checkpoint {
        writes = writes.checkpoint(stored.clone(), l.checkpoint_exists);
    }
    // The documents are set by the save's own `UPDATE` of the row: one
    // write of the row (what a merged write needs).
    let mut documents: Vec<(&'static str, Param)> = Vec::new();
    if let Some(m) = &step.messages {
        let through = Step::through_seq(m, &events, last_before);
        let (snapshot, through) = crate::documents::messages_values(db, &m.messages, through)?;
        documents.push(("messages", snapshot));
        documents.push(("messages_through", through));
    }
    if let Some(v) = record {
        documents.push(("record", Box::new(v)));
    }
    if let Some(f) = &finished {
        f.apply(&mut run.top, &mut run.lifecycle);
    }
    let writes = writes
        .save_also(documents)
        .merged(db.options.merge_step_writes)
        .notify(if events.is_empty() {
            Wake::Changed
        } else {
            Wake::NewEvents
        });
    let receipt = StepReceipt {
        events,
        checkpoint,
        lifecycle: finished.map(|f| f.lifecycle),
    };
    Ok((receipt, writes))
}

/// A group commit in one transaction: round trip 1 locks every step's row
/// with one statement (in key order, so two group commits never wait for
/// each other in a cycle) and reads the clock and which checkpoints exist
/// with one more; each step is then judged alone by the core, and round
/// trip 2 sends the writes of the steps it accepted with one `COMMIT`. A
/// refused step writes nothing and is answered alone.
pub(crate) async fn commit_steps(
    db: &Db,
    steps: &[StepCommit],
) -> Result<Vec<Result<StepReceipt>>> {
    let what = "commit_steps";
    runkeep::batch::check_group(steps)?;
    let records = steps
        .iter()
        .map(|s| checked(db, &s.scope, &s.step))
        .collect::<Result<Vec<_>>>()?;
    let keys: Vec<Key> = steps.iter().map(|s| Key::of(&s.scope)).collect();
    let test_clock = db.options.clock.as_ref().map(|c| c.now());
    let (tx, replies) = db
        .begin(what, group_opening(steps, &keys, test_clock))
        .await?;
    let [locked_rows, clock_rows]: [Vec<tokio_postgres::Row>; 2] = replies
        .try_into()
        .map_err(|_| Error::corrupted("commit_steps: the opening answered too few replies"))?;
    let mut states: HashMap<Key, tokio_postgres::Row> = HashMap::with_capacity(steps.len());
    for r in locked_rows {
        let key = Key {
            tenant: r.get(11),
            project: r.get(12),
            session: r.get(13),
            run: r.get(14),
            parent: r.get(15),
        };
        states.insert(key, r);
    }
    let clock = clock_rows
        .into_iter()
        .next()
        .ok_or_else(|| Error::corrupted("the clock query answered no row"))?;
    let ms: i64 = clock.get(0);
    let now = Timestamp::from_millis(ms)
        .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
    if test_clock.is_none() {
        db.note_server_now(now);
    }
    let existing: Vec<i64> = clock.get(1);
    let mut outcomes = Vec::with_capacity(steps.len());
    let mut writes = Vec::new();
    let mut payloads = Vec::new();
    // The plain saves of the accepted steps' rows, sent as one statement.
    let mut saves = Vec::new();
    for (i, (s, record)) in steps.iter().zip(records).enumerate() {
        let state = match states.get(&keys[i]) {
            Some(r) => Some(state_of(&s.scope, r)?),
            None => None,
        };
        let opened = Opened {
            state,
            now: Some(now),
            checkpoint_exists: existing.contains(&(i as i64 + 1)),
            more: Vec::new(),
        };
        let mut locked = Locked::new(keys[i].clone(), opened);
        match judge(db, &s.scope, s.fence, &s.step, record, &mut locked) {
            Ok((receipt, mut w)) => {
                let apart = w.save_apart(&locked.run);
                let (stmts, notify) = db.written(&tx, what, &s.scope, &mut locked, w).await?;
                writes.extend(stmts);
                if apart {
                    saves.push((locked.key.clone(), locked.run.clone()));
                }
                payloads.extend(notify.payload(&s.scope));
                outcomes.push(Ok(receipt));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    if !saves.is_empty() {
        writes.push(crate::db::row::save_many_stmt(&saves)?);
    }
    if writes.is_empty() {
        // Every step was refused: nothing to commit (rolls back unwaited).
        return Ok(outcomes);
    }
    if let Err(e) = db.commit_waking(tx, what, writes, payloads).await {
        if !e.is_outcome_unknown() {
            // Refused by the server: the transaction rolled back, no step
            // was written.
            return Err(e);
        }
        // Every accepted step may or may not be stored.
        let message = e.to_string();
        for o in outcomes.iter_mut().filter(|o| o.is_ok()) {
            *o = Err(Error::outcome_unknown(
                message.clone(),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
    }
    Ok(outcomes)
}

/// A group commit's first statements: every step's row locked, in key
/// order (the lock order of every group commit); then, in a statement of
/// its own (its snapshot taken once the locks are held), the instant (the
/// test clock's when set) and the 1-based positions of the steps whose
/// checkpoint already exists.
fn group_opening(steps: &[StepCommit], keys: &[Key], test_clock: Option<Timestamp>) -> Vec<Stmt> {
    let col =
        |f: fn(&Key) -> &String| -> Vec<String> { keys.iter().map(|k| f(k).clone()).collect() };
    let key_arrays = || -> Vec<Param> {
        vec![
            Box::new(col(|k| &k.tenant)),
            Box::new(col(|k| &k.project)),
            Box::new(col(|k| &k.session)),
            Box::new(col(|k| &k.run)),
            Box::new(col(|k| &k.parent)),
        ]
    };
    let lock = Stmt::new(
        "lock the runs' rows",
        format!(
            "SELECT {STATE_COLS}, {KEY_COLS} FROM runs \
             WHERE ({KEY_COLS}) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])) \
             ORDER BY {KEY_COLS} FOR UPDATE"
        ),
        key_arrays(),
    );
    let checkpoints: Vec<Option<String>> = steps
        .iter()
        .map(|s| s.step.checkpoint.as_ref().map(|c| c.id.to_string()))
        .collect();
    let mut params = key_arrays();
    params.push(Box::new(checkpoints));
    params.push(Box::new(test_clock.map(Timestamp::as_millis)));
    let read = Stmt::new(
        "read the clock and the checkpoints",
        format!(
            "SELECT coalesce($7::bigint, {CLOCK}), ARRAY(SELECT u.i FROM \
               unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) \
                 WITH ORDINALITY AS u(t, p, s, r, pa, cp, i) \
               WHERE u.cp IS NOT NULL AND EXISTS (SELECT 1 FROM checkpoints c \
                 WHERE c.tenant_id = u.t AND c.project_id = u.p AND c.session_id = u.s \
                 AND c.run_id = u.r AND c.parent_id = u.pa AND c.checkpoint_id = u.cp))"
        ),
        params,
    );
    vec![lock, read]
}
