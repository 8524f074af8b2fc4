//! Checkpoints: write, read, list, delete, prune, latest; the digest kept
//! from the headers it holds (read from the table only when it cannot be).

use tokio_postgres::Row;

use runkeep::checkpoint::sort_checkpoints;
use runkeep::lease::stamp_fence;
use runkeep::park::{self};
use runkeep::{
    checked_update, Checkpoint, CheckpointHeader, CheckpointId, CheckpointUpdate, Fence, Result,
    RunDigest, RunScope,
};

use crate::db::digest::headers_of;
use crate::db::pipeline::Stmt;
use crate::db::row::{checkpoint_of, sql_headers, Key, KEY_WHERE};
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;

pub(crate) async fn read_checkpoint_in<C: crate::db::Session>(
    db: &Db,
    c: &C,
    scope: &RunScope,
    key: &Key,
    id: &str,
) -> Result<Option<Checkpoint>> {
    let id = id.to_string();
    match db
        .row_opt(
            c,
            "read a checkpoint",
            &format!("SELECT body FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
            &key.with(&[&id]),
        )
        .await?
    {
        Some(r) => Ok(Some(checkpoint_of(scope, r.get(0))?)),
        None => Ok(None),
    }
}

pub(crate) async fn write_checkpoint(
    db: &Db,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    fence: Option<Fence>,
) -> Result<Checkpoint> {
    checkpoint.validate_for_write(scope)?;
    let what = "write_checkpoint";
    let opening = Opening {
        create: fence.is_none(),
        checkpoint: Some(checkpoint.id.as_str()),
        ..Opening::default()
    };
    db.write_locked(what, scope, opening, |l| {
        l.run.check(scope, what, fence)?;
        let mut stored = checkpoint.clone();
        stored.fence = stamp_fence(fence, l.run.top.as_ref());
        let writes = Writes::default()
            .checkpoint(stored.clone(), l.checkpoint_exists)
            .save()
            .notify(Wake::Changed);
        Ok(Verdict::Write(stored, writes))
    })
    .await
}

/// A read-modify-write of one checkpoint in one transaction: the run's row
/// locked (`FOR UPDATE`, held by every write of the run on any server),
/// then the checkpoint read, `update` judged and the result written.
pub(crate) async fn update_checkpoint(
    db: &Db,
    scope: &RunScope,
    id: &CheckpointId,
    update: &CheckpointUpdate,
    fence: Option<Fence>,
) -> Result<Checkpoint> {
    let what = "update_checkpoint";
    let opening = Opening {
        create: fence.is_none(),
        more: vec![Stmt::new(
            "read a checkpoint",
            format!("SELECT body FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
            Key::of(scope).owned(vec![Box::new(id.to_string())]),
        )],
        ..Opening::default()
    };
    db.write_locked(what, scope, opening, |l| {
        l.run.check(scope, what, fence)?;
        let current = match std::mem::take(&mut l.more).into_iter().flatten().next() {
            Some(row) => Some(checkpoint_of(scope, row.get(0))?),
            None => None,
        };
        let exists = current.is_some();
        let mut stored = checked_update(scope, id, update, current.as_ref())?;
        stored.fence = stamp_fence(fence, l.run.top.as_ref());
        let writes = Writes::default()
            .checkpoint(stored.clone(), exists)
            .save()
            .notify(Wake::Changed);
        Ok(Verdict::Write(stored, writes))
    })
    .await
}

pub(crate) async fn read_checkpoint(
    db: &Db,
    scope: &RunScope,
    id: &CheckpointId,
) -> Result<Option<Checkpoint>> {
    let c = db.conn("read_checkpoint").await?;
    read_checkpoint_in(db, &c, scope, &Key::of(scope), id.as_str()).await
}

pub(crate) async fn list_checkpoints(db: &Db, scope: &RunScope) -> Result<Vec<Checkpoint>> {
    let key = Key::of(scope);
    let c = db.conn("list_checkpoints").await?;
    let rs = db
        .rows(
            &c,
            "list checkpoints",
            &format!("SELECT body FROM checkpoints WHERE {KEY_WHERE}"),
            &key.params(),
        )
        .await?;
    let mut cps = rs
        .into_iter()
        .map(|r| checkpoint_of(scope, r.get(0)))
        .collect::<Result<Vec<_>>>()?;
    sort_checkpoints(&mut cps);
    Ok(cps)
}

pub(crate) async fn delete_checkpoint(
    db: &Db,
    scope: &RunScope,
    id: &CheckpointId,
    fence: Option<Fence>,
) -> Result<bool> {
    let what = "delete_checkpoint";
    let opening = Opening {
        more: vec![Stmt::new(
            "read the checkpoint headers",
            sql_headers(),
            Key::of(scope).owned(vec![]),
        )],
        ..Opening::default()
    };
    db.write_locked(what, scope, opening, |l| {
        // No row: only the fence check (against no holding).
        l.run.check(scope, what, fence)?;
        if !l.found {
            return Ok(Verdict::Keep(false));
        }
        let mut headers = headers_of(scope, std::mem::take(&mut l.more).into_iter().flatten())?;
        let before = headers.len();
        headers.retain(|h| h.id != *id);
        if headers.len() == before {
            return Ok(Verdict::Keep(false));
        }
        l.run.digest = (!headers.is_empty()).then(|| RunDigest::from_headers(&headers));
        let delete = Stmt::new(
            "delete a checkpoint",
            format!("DELETE FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
            l.key.owned(vec![Box::new(id.to_string())]),
        );
        Ok(Verdict::Write(true, Writes::default().stmt(delete).save()))
    })
    .await
}

pub(crate) async fn prune_checkpoints(
    db: &Db,
    scope: &RunScope,
    keep_last: usize,
    fence: Option<Fence>,
) -> Result<Vec<CheckpointId>> {
    let what = "prune_checkpoints";
    let opening = Opening {
        more: vec![Stmt::new(
            "read checkpoints to prune",
            format!("SELECT header, body FROM checkpoints WHERE {KEY_WHERE}"),
            Key::of(scope).owned(vec![]),
        )],
        ..Opening::default()
    };
    db.write_locked(what, scope, opening, |l| {
        if !l.found || l.run.is_blank() {
            return Ok(Verdict::Keep(Vec::new()));
        }
        l.run.check(scope, what, fence)?;
        let rows: Vec<Row> = std::mem::take(&mut l.more).into_iter().flatten().collect();
        let cps = rows
            .iter()
            .map(|r| checkpoint_of(scope, r.get(1)))
            .collect::<Result<Vec<_>>>()?;
        let victims = park::prune_victims(&cps, keep_last);
        if victims.is_empty() {
            return Ok(Verdict::Keep(victims));
        }
        // The digest of what stays, from the headers read under the lock.
        let headers = headers_of(scope, rows)?;
        let rest: Vec<CheckpointHeader> = headers
            .into_iter()
            .filter(|h| !victims.contains(&h.id))
            .collect();
        l.run.digest = (!rest.is_empty()).then(|| RunDigest::from_headers(&rest));
        let ids: Vec<String> = victims.iter().map(ToString::to_string).collect();
        let delete = Stmt::new(
            "delete pruned checkpoints",
            format!(
                "DELETE FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = ANY($6::text[])"
            ),
            l.key.owned(vec![Box::new(ids)]),
        );
        Ok(Verdict::Write(
            victims,
            Writes::default().stmt(delete).save(),
        ))
    })
    .await
}

pub(crate) async fn checkpoint_ids(
    db: &Db,
    scope: &RunScope,
    query: &runkeep::CheckpointIdQuery,
) -> Result<Vec<runkeep::CheckpointId>> {
    query.validate()?;
    // Names only, served by the primary key as one range scan: the ids
    // with the prefix are exactly those in [prefix, prefix || U+007F) (ids
    // use only [A-Za-z0-9_-], all below U+007F, under COLLATE "C"), cut
    // at `before`, walked down from the top.
    let key = Key::of(scope);
    let low = query.prefix.clone();
    let mut high = format!("{}\u{7f}", query.prefix);
    if let Some(b) = &query.before {
        if b.as_str() < high.as_str() {
            high = b.as_str().to_string();
        }
    }
    let limit: Option<i64> = query.limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let mut params = key.params();
    params.push(&low);
    params.push(&high);
    params.push(&limit);
    let c = db.conn("checkpoint_ids").await?;
    let rows = db
        .rows(
            &c,
            "list checkpoint ids",
            "SELECT checkpoint_id FROM checkpoints
              WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND run_id = $4 AND parent_id = $5
                AND checkpoint_id >= $6 AND checkpoint_id < $7
              ORDER BY checkpoint_id DESC
              LIMIT $8",
            &params,
        )
        .await?;
    rows.iter()
        .map(|r| {
            runkeep::CheckpointId::new(r.get::<_, String>(0))
                .map_err(|e| runkeep::Error::corrupted(e.to_string()))
        })
        .collect()
}

pub(crate) async fn latest_checkpoint(db: &Db, scope: &RunScope) -> Result<Option<Checkpoint>> {
    // One indexed read: the digest names the latest, the join reads it.
    let key = Key::of(scope);
    let c = db.conn("latest_checkpoint").await?;
    let r = db.row_opt(
        &c,
        "read the latest checkpoint",
        "SELECT c.body FROM runs r JOIN checkpoints c
               ON (c.tenant_id, c.project_id, c.session_id, c.run_id, c.parent_id)
                = (r.tenant_id, r.project_id, r.session_id, r.run_id, r.parent_id)
              AND c.checkpoint_id = r.digest->'latest'->>'id'
             WHERE r.tenant_id = $1 AND r.project_id = $2 AND r.session_id = $3 AND r.run_id = $4 AND r.parent_id = $5",
        &key.params(),
    )
    .await?;
    r.map(|r| checkpoint_of(scope, r.get(0))).transpose()
}
