//! The run's lifecycle: `enqueue`, `finish`, `snooze`, `fail_attempt`,
//! `cancel`, `reopen` and the
//! lifecycle read.

use runkeep::failure::{self, AttemptError};
use runkeep::lifecycle;
use runkeep::{
    Checkpoint, EnqueueOptions, Error, Fence, Lifecycle, Outcome, Result, RunScope, Timestamp,
};

use crate::db::row::Key;
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;

pub(crate) async fn lifecycle(db: &Db, scope: &RunScope) -> Result<Lifecycle> {
    let c = db.conn("lifecycle").await?;
    Ok(db
        .read_state(&c, scope, &Key::of(scope))
        .await?
        .map(|r| r.lifecycle)
        .unwrap_or_default())
}

pub(crate) async fn enqueue(
    db: &Db,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    options: &EnqueueOptions,
) -> Result<Checkpoint> {
    checkpoint.validate_for_write(scope)?;
    options.validate(&scope.run_id)?;
    let opening = Opening {
        create: true,
        checkpoint: Some(checkpoint.id.as_str()),
        ..Opening::default()
    };
    db.write_locked("enqueue", scope, opening, |l| {
        runkeep::lifecycle::check_enqueue(l.run.exists(), &scope.run_id)?;
        let mut stored = checkpoint.clone();
        stored.fence = None;
        l.run.lifecycle = options.lifecycle();
        let writes = Writes::default()
            .checkpoint(stored.clone(), l.checkpoint_exists)
            .save()
            .notify(Wake::Changed);
        Ok(Verdict::Write(stored, writes))
    })
    .await
}

pub(crate) async fn finish(
    db: &Db,
    scope: &RunScope,
    fence: Fence,
    outcome: &Outcome,
) -> Result<Lifecycle> {
    outcome.validate(&scope.run_id)?;
    if let Some(r) = &outcome.result {
        db.check_json("finish result", r)?;
    }
    let opening = Opening {
        clock: true,
        ..Opening::default()
    };
    db.write_locked("finish", scope, opening, |l| {
        let run = &mut l.run;
        let done = lifecycle::apply_finish(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            outcome,
            fence,
            l.now,
        )?;
        Ok(Verdict::Write(
            done,
            Writes::default().save().notify(Wake::Changed),
        ))
    })
    .await
}

pub(crate) async fn snooze(
    db: &Db,
    scope: &RunScope,
    fence: Fence,
    until: Timestamp,
) -> Result<bool> {
    db.write_locked("snooze", scope, Opening::default(), |l| {
        let run = &mut l.run;
        if !l.found
            || !lifecycle::apply_snooze(
                &scope.run_id,
                &mut run.top,
                &mut run.lifecycle,
                fence,
                until,
            )?
        {
            return Ok(Verdict::Keep(false));
        }
        Ok(Verdict::Write(
            true,
            Writes::default().save().notify(Wake::Changed),
        ))
    })
    .await
}

pub(crate) async fn fail_attempt(
    db: &Db,
    scope: &RunScope,
    fence: Fence,
    error: &AttemptError,
    max_attempts: Option<u32>,
) -> Result<Lifecycle> {
    error.validate(&scope.run_id)?;
    let opening = Opening {
        clock: true,
        ..Opening::default()
    };
    db.write_locked("fail_attempt", scope, opening, |l| {
        let run = &mut l.run;
        let done = failure::apply_failure(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            fence,
            error,
            max_attempts,
            l.now,
        )?;
        Ok(Verdict::Write(
            done,
            Writes::default().save().notify(Wake::Changed),
        ))
    })
    .await
}

pub(crate) async fn cancel(db: &Db, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
    failure::check_cancel_reason(&scope.run_id, reason)?;
    let opening = Opening {
        clock: true,
        ..Opening::default()
    };
    db.write_locked("cancel", scope, opening, |l| {
        let exists = l.found && l.run.exists();
        let run = &mut l.run;
        let done = failure::apply_cancel(
            &scope.run_id,
            exists,
            &mut run.top,
            &mut run.lifecycle,
            reason,
            l.now,
        )?;
        Ok(Verdict::Write(
            done,
            Writes::default().save().notify(Wake::Changed),
        ))
    })
    .await
}

pub(crate) async fn set_priority(
    db: &Db,
    scope: &RunScope,
    priority: runkeep::Priority,
) -> Result<Lifecycle> {
    priority.validate()?;
    db.write_locked("set_priority", scope, Opening::default(), |l| {
        if !l.found || !l.run.exists() {
            return Err(Error::NotFound {
                what: format!("run {}", scope.run_id),
            });
        }
        let l2 = lifecycle::after_set_priority(&scope.run_id, &l.run.lifecycle, priority)?;
        l.run.lifecycle = l2.clone();
        Ok(Verdict::Write(
            l2,
            Writes::default().save().notify(Wake::Changed),
        ))
    })
    .await
}

pub(crate) async fn reopen(db: &Db, scope: &RunScope) -> Result<Lifecycle> {
    db.write_locked("reopen", scope, Opening::default(), |l| {
        if !l.run.exists() {
            return Err(Error::NotFound {
                what: format!("run {}", scope.run_id),
            });
        }
        let reopened = lifecycle::after_reopen(&scope.run_id, &l.run.lifecycle)?;
        l.run.lifecycle = reopened.clone();
        Ok(Verdict::Write(
            reopened,
            Writes::default().save().notify(Wake::Changed),
        ))
    })
    .await
}
