//! Parks: `resolve_park`, `find_pending` and `resume_point`.

use serde_json::Value;

use runkeep::lease::stamp_fence;
use runkeep::park;
use runkeep::{
    Checkpoint, CheckpointId, Error, Fence, ParkResolution, Result, RunScope, Timestamp,
};

use crate::db::pipeline::Stmt;
use crate::db::row::{checkpoint_of, digest_of, Key, KEY_WHERE};
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;

pub(crate) async fn resolve_park(
    db: &Db,
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
    db.write_locked(what, scope, opening, |l| {
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
            .notify(Wake::Changed);
        Ok(Verdict::Write(updated, writes))
    })
    .await
}

pub(crate) async fn find_pending(
    db: &Db,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<Checkpoint>> {
    pending_or_latest(db, "find_pending", scope, now, false).await
}

pub(crate) async fn resume_point(
    db: &Db,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<Checkpoint>> {
    pending_or_latest(db, "resume_point", scope, now, true).await
}

/// The run's digest, the bodies of its parked checkpoints whose park is
/// not resolved (a prefilter: a resolved park is never outstanding), and
/// (`$6`) the latest checkpoint's body: one statement, one snapshot.
fn sql_pending_or_latest() -> String {
    let same_run = "(c.tenant_id, c.project_id, c.session_id, c.run_id, c.parent_id) = (r.tenant_id, r.project_id, r.session_id, r.run_id, r.parent_id)";
    format!(
        "SELECT r.digest,
           (SELECT coalesce(jsonb_agg(c.body), '[]'::jsonb) FROM checkpoints c
             WHERE {same_run}
               AND c.checkpoint_id IN (SELECT p->>'id' FROM jsonb_array_elements(coalesce(r.digest->'parks', '[]'::jsonb)) p
                                        WHERE coalesce(p->'park'->'resolvedAt', 'null'::jsonb) = 'null'::jsonb)),
           (SELECT c.body FROM checkpoints c
             WHERE $6::boolean AND {same_run} AND c.checkpoint_id = r.digest->'latest'->>'id')
         FROM runs r
         WHERE r.tenant_id = $1 AND r.project_id = $2 AND r.session_id = $3 AND r.run_id = $4 AND r.parent_id = $5"
    )
}

/// The pending park (the core's rule over the digest's park headers:
/// outstanding at `now`, latest by the total order, as
/// `park::find_pending` judges), else, when `latest`, the latest
/// checkpoint: one round trip.
async fn pending_or_latest(
    db: &Db,
    what: &'static str,
    scope: &RunScope,
    now: Timestamp,
    latest: bool,
) -> Result<Option<Checkpoint>> {
    let key = Key::of(scope);
    let c = db.conn(what).await?;
    let Some(r) = db
        .row_opt(
            &c,
            "read the parks and the latest checkpoint",
            &sql_pending_or_latest(),
            &key.with(&[&latest]),
        )
        .await?
    else {
        return Ok(None);
    };
    let Some(d) = digest_of(scope, r.get(0))? else {
        return Ok(None);
    };
    if let Some(h) = d.pending_park(now) {
        let bodies: Value = r.get(1);
        if let Value::Array(bodies) = bodies {
            for body in bodies {
                let cp = checkpoint_of(scope, body)?;
                if cp.id == h.id {
                    return Ok(Some(cp));
                }
            }
        }
        // Not among those read (the prefilter missed it): read it alone.
        return crate::checkpoints::read_checkpoint_in(db, &c, scope, &key, h.id.as_str()).await;
    }
    if !latest {
        return Ok(None);
    }
    r.get::<_, Option<Value>>(2)
        .map(|b| checkpoint_of(scope, b))
        .transpose()
}
