//! The checkpoint upsert that keeps the run's digest: the core's
//! incremental rule, or the digest rebuilt from the headers it holds, or
//! (only when neither can) the run's headers read in the open
//! transaction. What the write skeleton (`tx::Db::written`) sends for a
//! verdict that stores a checkpoint.

use serde_json::Value;
use tokio_postgres::Row;

use runkeep::{Checkpoint, CheckpointHeader, Error, Result, RunDigest, RunScope};

use crate::db::pipeline::{Stmt, Tx};
use crate::db::row::{corrupted, sql_headers, Key, RunState, KEY_COLS};
use crate::db::Db;

/// The upsert of `stored` (already stamped), keeping `run`'s digest.
/// `exists`: a checkpoint with its id exists (read under the lock).
/// The digest is updated by the core's incremental rule, or rebuilt
/// from the headers it holds when it holds every checkpoint's (a run
/// with one unstamped checkpoint, as enqueued, taking its first fenced
/// one); only otherwise are the run's headers read (one more round
/// trip).
pub(crate) async fn checkpoint_stmt(
    db: &Db,
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
    db.check_json(&format!("checkpoint {}", stored.id), &body)?;
    let digest = match next_digest(run.digest.take(), &header, exists) {
        Some(d) => d,
        None => {
            let mut headers = read_headers(db, tx, what, scope, &key).await?;
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
    db: &Db,
    tx: &Tx,
    what: &str,
    scope: &RunScope,
    key: &Key,
) -> Result<Vec<CheckpointHeader>> {
    let rows = db
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
