//! The run's lifecycle: `enqueue`, `finish`, `snooze`, `reopen` and the
//! lifecycle read.

use runkeep::lifecycle;
use runkeep::{
    Checkpoint, EnqueueOptions, Error, Fence, Lifecycle, Outcome, Result, RunScope, Timestamp,
};

use crate::row::{Key, RunState};
use crate::store::PgStore;
use crate::tx::Opening;

pub(crate) async fn lifecycle(store: &PgStore, scope: &RunScope) -> Result<Lifecycle> {
    let c = store.conn("lifecycle").await?;
    Ok(store
        .read_state(&c, scope, &Key::of(scope))
        .await?
        .map(|r| r.lifecycle)
        .unwrap_or_default())
}

pub(crate) async fn enqueue(
    store: &PgStore,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    options: &EnqueueOptions,
) -> Result<Checkpoint> {
    checkpoint.validate_for_write(scope)?;
    options.validate(&scope.run_id)?;
    let key = Key::of(scope);
    let what = "enqueue";
    let opening = Opening {
        create: true,
        checkpoint: Some(checkpoint.id.as_str()),
        ..Opening::default()
    };
    let (tx, o) = store.open(what, scope, &key, opening).await?;
    let mut run = o.state.unwrap_or_default();
    if run.exists() {
        return Err(Error::Conflict {
            message: format!(
                "enqueue of run {}: the run already exists; enqueue creates a new run (use another run id, or reopen a finished one)",
                scope.run_id
            ),
        });
    }
    let mut stored = checkpoint.clone();
    stored.fence = None;
    let write = store
        .checkpoint_stmt(&tx, what, scope, &mut run, &stored, o.checkpoint_exists)
        .await?;
    run.lifecycle = Lifecycle {
        max_attempts: options.max_attempts,
        available_at: options.available_at,
        ..Lifecycle::default()
    };
    let save = PgStore::save_stmt(&key, &run)?;
    store
        .commit_notify(tx, what, vec![write, save], scope, false)
        .await?;
    Ok(stored)
}

pub(crate) async fn finish(
    store: &PgStore,
    scope: &RunScope,
    fence: Fence,
    outcome: &Outcome,
) -> Result<Lifecycle> {
    outcome.validate(&scope.run_id)?;
    if let Some(r) = &outcome.result {
        store.check_json("finish result", r)?;
    }
    let key = Key::of(scope);
    let what = "finish";
    let opening = Opening {
        clock: true,
        ..Opening::default()
    };
    let (tx, o) = store.open(what, scope, &key, opening).await?;
    let now = o.now();
    let mut run = o.state.unwrap_or_default();
    let l = lifecycle::apply_finish(
        &scope.run_id,
        &mut run.top,
        &mut run.lifecycle,
        outcome,
        fence,
        now,
    )?;
    store
        .commit_notify(
            tx,
            what,
            vec![PgStore::save_stmt(&key, &run)?],
            scope,
            false,
        )
        .await?;
    Ok(l)
}

pub(crate) async fn snooze(
    store: &PgStore,
    scope: &RunScope,
    fence: Fence,
    until: Timestamp,
) -> Result<bool> {
    let key = Key::of(scope);
    let what = "snooze";
    let (tx, o) = store.open(what, scope, &key, Opening::default()).await?;
    let Some(mut run) = o.state else {
        return Ok(false);
    };
    if !lifecycle::apply_snooze(
        &scope.run_id,
        &mut run.top,
        &mut run.lifecycle,
        fence,
        until,
    )? {
        return Ok(false);
    }
    store
        .commit_notify(
            tx,
            what,
            vec![PgStore::save_stmt(&key, &run)?],
            scope,
            false,
        )
        .await?;
    Ok(true)
}

pub(crate) async fn reopen(store: &PgStore, scope: &RunScope) -> Result<Lifecycle> {
    let key = Key::of(scope);
    let what = "reopen";
    let (tx, o) = store.open(what, scope, &key, Opening::default()).await?;
    let Some(mut run) = o.state.filter(RunState::exists) else {
        return Err(Error::NotFound {
            what: format!("run {}", scope.run_id),
        });
    };
    let l = lifecycle::after_reopen(&scope.run_id, &run.lifecycle)?;
    run.lifecycle = l.clone();
    store
        .commit_notify(
            tx,
            what,
            vec![PgStore::save_stmt(&key, &run)?],
            scope,
            false,
        )
        .await?;
    Ok(l)
}
