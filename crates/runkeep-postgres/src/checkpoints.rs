//! Checkpoints: write, read, list, delete, prune, latest; the digest kept
//! from the headers it holds (read from the table only when it cannot be).

use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::Row;

use runkeep::checkpoint::sort_checkpoints;
use runkeep::lease::stamp_fence;
use runkeep::park::{self};
use runkeep::{
    Checkpoint, CheckpointHeader, CheckpointId, Error, Fence, Result, RunDigest, RunScope,
};

use crate::pipeline::{Stmt, Tx};
use crate::row::{checkpoint_of, corrupted, sql_headers, Key, RunState, KEY_COLS, KEY_WHERE};
use crate::store::PgStore;
use crate::tx::{Opening, Verdict, Writes};

impl PgStore {
    /// The upsert of `stored` (already stamped), keeping `run`'s digest.
    /// `exists`: a checkpoint with its id exists (read under the lock).
    /// The digest is updated by the core's incremental rule, or rebuilt
    /// from the headers it holds when it holds every checkpoint's (a run
    /// with one unstamped checkpoint, as enqueued, taking its first fenced
    /// one); only otherwise are the run's headers read (one more round
    /// trip).
    pub(crate) async fn checkpoint_stmt(
        &self,
        tx: &Tx,
        what: &str,
        scope: &RunScope,
        run: &mut RunState,
        stored: &Checkpoint,
        exists: bool,
    ) -> Result<Stmt> {
        let key = Key::of(scope);
        let header = stored.header();
        let header_json =
            serde_json::to_value(&header).map_err(|e| Error::backend("encode a header", e))?;
        let body = Value::Object(stored.to_json());
        self.check_json(&format!("checkpoint {}", stored.id), &body)?;
        let digest = match next_digest(run.digest.take(), &header, exists) {
            Some(d) => d,
            None => {
                let mut headers = self.read_headers(tx, what, scope, &key).await?;
                headers.retain(|h| h.id != header.id);
                headers.push(header);
                RunDigest::from_headers(&headers)
            }
        };
        run.digest = Some(digest);
        Ok(Stmt::new(
            "write the checkpoint",
            format!(
                "INSERT INTO checkpoints ({KEY_COLS}, checkpoint_id, header, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT ({KEY_COLS}, checkpoint_id) DO UPDATE SET header = EXCLUDED.header, body = EXCLUDED.body"
            ),
            key.owned(vec![
                Box::new(stored.id.to_string()),
                Box::new(header_json),
                Box::new(body),
            ]),
        ))
    }

    /// Every checkpoint header of the run, in the open transaction.
    pub(crate) async fn read_headers(
        &self,
        tx: &Tx,
        what: &str,
        scope: &RunScope,
        key: &Key,
    ) -> Result<Vec<CheckpointHeader>> {
        let rows = self
            .run(
                tx,
                what,
                vec![Stmt::new(
                    "read the checkpoint headers",
                    sql_headers(),
                    key.owned(vec![]),
                )],
            )
            .await?;
        headers_of(scope, rows.into_iter().flatten())
    }

    pub(crate) async fn read_checkpoint_in<C: GenericClient + Sync>(
        &self,
        c: &C,
        scope: &RunScope,
        key: &Key,
        id: &str,
    ) -> Result<Option<Checkpoint>> {
        let id = id.to_string();
        match self
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
}

/// The digest after writing `h` (`replaced`: a checkpoint with its id
/// existed): the core's incremental rule ([`RunDigest::apply_write`]);
/// where it gives up, [`RunDigest::from_headers`] over the headers the
/// digest holds, when it holds every checkpoint's (the latest and the
/// parked ones are all of them: the count says so); else `None`, and the
/// caller reads the headers.
pub(crate) fn next_digest(
    digest: Option<RunDigest>,
    h: &CheckpointHeader,
    replaced: bool,
) -> Option<RunDigest> {
    let mut d = digest.unwrap_or_default();
    if d.checkpoint_count == 0 && replaced {
        // A digest that lost its checkpoints: start over.
        d = RunDigest::default();
    }
    if d.apply_write(h.clone(), replaced) {
        return Some(d);
    }
    let mut known: Vec<CheckpointHeader> = Vec::new();
    for k in d.latest.iter().chain(d.parks.iter()) {
        if !known.iter().any(|x| x.id == k.id) {
            known.push(k.clone());
        }
    }
    if u64::try_from(known.len()).ok() != Some(d.checkpoint_count) {
        return None;
    }
    known.retain(|k| k.id != h.id);
    known.push(h.clone());
    Some(RunDigest::from_headers(&known))
}

pub(crate) fn headers_of(
    scope: &RunScope,
    rows: impl IntoIterator<Item = Row>,
) -> Result<Vec<CheckpointHeader>> {
    rows.into_iter()
        .map(|r| {
            serde_json::from_value(r.get(0)).map_err(|e| corrupted(scope, "a checkpoint header", e))
        })
        .collect()
}

pub(crate) async fn write_checkpoint(
    store: &PgStore,
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
    store
        .write_locked(what, scope, opening, |l| {
            l.run.check(scope, what, fence)?;
            let mut stored = checkpoint.clone();
            stored.fence = stamp_fence(fence, l.run.top.as_ref());
            let writes = Writes::default()
                .checkpoint(stored.clone(), l.checkpoint_exists)
                .save()
                .notify(false);
            Ok(Verdict::Write(stored, writes))
        })
        .await
}

pub(crate) async fn read_checkpoint(
    store: &PgStore,
    scope: &RunScope,
    id: &CheckpointId,
) -> Result<Option<Checkpoint>> {
    let c = store.conn("read_checkpoint").await?;
    store
        .read_checkpoint_in(&c, scope, &Key::of(scope), id.as_str())
        .await
}

pub(crate) async fn list_checkpoints(store: &PgStore, scope: &RunScope) -> Result<Vec<Checkpoint>> {
    let key = Key::of(scope);
    let c = store.conn("list_checkpoints").await?;
    let rs = store
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
    store: &PgStore,
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
    store
        .write_locked(what, scope, opening, |l| {
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
    store: &PgStore,
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
    store
        .write_locked(what, scope, opening, |l| {
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

pub(crate) async fn latest_checkpoint(
    store: &PgStore,
    scope: &RunScope,
) -> Result<Option<Checkpoint>> {
    // One indexed read: the digest names the latest, the join reads it.
    let key = Key::of(scope);
    let c = store.conn("latest_checkpoint").await?;
    let r = store.row_opt(
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
