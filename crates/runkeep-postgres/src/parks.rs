//! Parks: `resolve_park`, `find_pending` and `resume_point`.

use runkeep::lease::stamp_fence;
use runkeep::park::{self, ParkState};
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, Error, Fence, ParkResolution, Result, RunScope,
    Timestamp,
};

use crate::pipeline::Stmt;
use crate::row::{checkpoint_of, Key, KEY_WHERE};
use crate::store::PgStore;
use crate::tx::{Opening, Verdict, Writes};

pub(crate) async fn resolve_park(
    store: &PgStore,
    scope: &RunScope,
    id: &CheckpointId,
    resolution: ParkResolution,
    now: Timestamp,
    fence: Option<Fence>,
) -> Result<Checkpoint> {
    let what = "resolve_park";
    let not_found = || Error::NotFound {
        what: format!("checkpoint {id} of run {}", scope.run_id),
    };
    let opening = Opening {
        more: vec![Stmt::new(
            "read a checkpoint",
            format!("SELECT body FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
            Key::of(scope).owned(vec![Box::new(id.to_string())]),
        )],
        ..Opening::default()
    };
    store
        .write_locked(what, scope, opening, |l| {
            if !l.found || l.run.is_blank() {
                return Err(not_found());
            }
            l.run.check(scope, what, fence)?;
            let Some(body) = std::mem::take(&mut l.more).into_iter().flatten().next() else {
                return Err(not_found());
            };
            let current = checkpoint_of(scope, body.get(0))?;
            let mut updated = current.clone();
            park::resolve(&mut updated, resolution, now)?;
            updated.fence = stamp_fence(fence, l.run.top.as_ref()).or(current.fence);
            let writes = Writes::default()
                .checkpoint(updated.clone(), true)
                .save()
                .notify(false);
            Ok(Verdict::Write(updated, writes))
        })
        .await
}

pub(crate) async fn find_pending(
    store: &PgStore,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<Checkpoint>> {
    let key = Key::of(scope);
    let c = store.conn("find_pending").await?;
    let Some(run) = store.read_state(&c, scope, &key).await? else {
        return Ok(None);
    };
    let Some(d) = run.digest else { return Ok(None) };
    // The core's rule over the digest's park headers: outstanding at
    // `now`, latest by the total order (park::find_pending's rule).
    let best = d
        .parks
        .iter()
        .filter(|h| {
            h.park
                .as_ref()
                .is_some_and(|p| p.state(now) == ParkState::Outstanding)
        })
        .max_by_key(|h| h.order_key(&d.fence_history));
    match best {
        Some(h) => {
            store
                .read_checkpoint_in(&c, scope, &key, h.id.as_str())
                .await
        }
        None => Ok(None),
    }
}

pub(crate) async fn resume_point(
    store: &PgStore,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<Checkpoint>> {
    if let Some(p) = store.find_pending(scope, now).await? {
        return Ok(Some(p));
    }
    store.latest_checkpoint(scope).await
}
