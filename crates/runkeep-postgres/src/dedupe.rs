//! `enqueue_once`: an enqueue that carries an idempotency key
//! ([`runkeep::scheduling::dedupe`]).
//!
//! One transaction: first the key's advisory lock (a hash of the schema,
//! the session and the key; taken before the run's row lock, always in
//! that order), then the run's row (created) and lock, the clock, and the
//! key's window with whether its run still exists. The core's
//! `dedupe::decide` judges: an open window answers its run (and its latest
//! checkpoint, read with the window) and the transaction rolls back; otherwise the run is enqueued as `enqueue`
//! does and the window is written (`INSERT … ON CONFLICT DO UPDATE`) with
//! `COMMIT`, which releases the lock. Concurrent callers with one key
//! therefore judge one after the other, and all but the first find the
//! window open.

use runkeep::scheduling::{dedupe, DedupeRecord};
use serde_json::Value;

use runkeep::{Checkpoint, Dedupe, EnqueueOptions, Enqueued, Error, Result, RunId, RunScope};

use crate::db::pipeline::Stmt;
use crate::db::row::{checkpoint_of, Key};
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;

/// What the judge decided.
enum Judged {
    Created(Box<Checkpoint>),
    /// The window's run and its latest checkpoint (read with the window).
    Existing(RunScope, Option<Box<Checkpoint>>),
}

pub(crate) async fn enqueue_once(
    db: &Db,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    options: &EnqueueOptions,
    d: Option<&Dedupe>,
) -> Result<Enqueued> {
    let Some(d) = d else {
        let cp = crate::lifecycle::enqueue(db, scope, checkpoint, options).await?;
        return Ok(Enqueued {
            run: scope.clone(),
            created: true,
            checkpoint: Some(cp),
        });
    };
    d.validate()?;
    checkpoint.validate_for_write(scope)?;
    options.validate(&scope.run_id)?;
    let key = Key::of(scope);
    let session = |n: usize| -> Vec<crate::db::pipeline::Param> {
        let mut p: Vec<crate::db::pipeline::Param> = vec![
            Box::new(key.tenant.clone()),
            Box::new(key.project.clone()),
            Box::new(key.session.clone()),
            Box::new(d.key.clone()),
        ];
        p.truncate(n);
        p
    };
    let mut lock_params = session(4);
    lock_params.push(Box::new(db.options.schema.clone()));
    let lock = Stmt::new(
        "lock the idempotency key",
        "SELECT pg_advisory_xact_lock(hashtextextended(concat_ws(chr(1), 'runkeep-dedupe', $5::text, $1::text, $2::text, $3::text, $4::text), 0))::text",
        lock_params,
    );
    let window = Stmt::new(
        "read the idempotency key's window",
        "SELECT d.run_id, d.parent_id, d.enqueued_at, d.expires_at, \
                coalesce(r.checkpoint_count > 0 OR r.top_kind IS NOT NULL OR r.last_seq > 0 OR r.record IS NOT NULL, false), \
                c.body \
         FROM dedupe d LEFT JOIN runs r \
           ON (r.tenant_id, r.project_id, r.session_id, r.run_id, r.parent_id) \
            = (d.tenant_id, d.project_id, d.session_id, d.run_id, d.parent_id) \
         LEFT JOIN checkpoints c \
           ON (c.tenant_id, c.project_id, c.session_id, c.run_id, c.parent_id) \
            = (r.tenant_id, r.project_id, r.session_id, r.run_id, r.parent_id) \
          AND c.checkpoint_id = r.digest->'latest'->>'id' \
         WHERE d.tenant_id = $1 AND d.project_id = $2 AND d.session_id = $3 AND d.dkey = $4",
        session(4),
    );
    let opening = Opening {
        first: vec![lock],
        create: true,
        clock: true,
        checkpoint: Some(checkpoint.id.as_str()),
        more: vec![window],
    };
    let judged = db
        .write_locked("enqueue_once", scope, opening, |l| {
            let now = l.now;
            let existing = match l.more[0].first() {
                Some(r) => {
                    let run: String = r.get(0);
                    let parent: String = r.get(1);
                    let stamp = |ms: i64| {
                        runkeep::Timestamp::from_millis(ms).map_err(|e| {
                            Error::corrupted(format!("an idempotency key's window: {e}"))
                        })
                    };
                    let id = |s: &str| {
                        s.parse::<RunId>().map_err(|e| {
                            Error::corrupted(format!("an idempotency key's run id: {e}"))
                        })
                    };
                    let record = DedupeRecord {
                        run_id: id(&run)?,
                        parent_run_id: if parent.is_empty() {
                            None
                        } else {
                            Some(id(&parent)?)
                        },
                        enqueued_at: stamp(r.get(2))?,
                        expires_at: stamp(r.get(3))?,
                    };
                    Some((record, r.get::<_, bool>(4)))
                }
                None => None,
            };
            if let Some(r) = dedupe::decide(existing.as_ref().map(|(r, e)| (r, *e)), now) {
                let run = r.scope_in(scope);
                let latest = match l.more[0].first().and_then(|r| r.get::<_, Option<Value>>(5)) {
                    Some(body) => Some(Box::new(checkpoint_of(&run, body)?)),
                    None => None,
                };
                return Ok(Verdict::Keep(Judged::Existing(run, latest)));
            }
            runkeep::lifecycle::check_enqueue(l.run.exists(), &scope.run_id)?;
            let mut stored = checkpoint.clone();
            stored.fence = None;
            l.run.lifecycle = options.lifecycle();
            let record = DedupeRecord::new(scope, d, now);
            let mut params = session(4);
            params.push(Box::new(key.run.clone()));
            params.push(Box::new(key.parent.clone()));
            params.push(Box::new(record.enqueued_at.as_millis()));
            params.push(Box::new(record.expires_at.as_millis()));
            let upsert = Stmt::new(
                "record the idempotency key's window",
                "INSERT INTO dedupe (tenant_id, project_id, session_id, dkey, run_id, parent_id, enqueued_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (tenant_id, project_id, session_id, dkey) DO UPDATE SET \
                   run_id = EXCLUDED.run_id, parent_id = EXCLUDED.parent_id, \
                   enqueued_at = EXCLUDED.enqueued_at, expires_at = EXCLUDED.expires_at",
                params,
            );
            let writes = Writes::default()
                .checkpoint(stored.clone(), l.checkpoint_exists)
                .save()
                .stmt(upsert)
                .notify(Wake::Changed);
            Ok(Verdict::Write(Judged::Created(Box::new(stored)), writes))
        })
        .await?;
    match judged {
        Judged::Created(cp) => Ok(Enqueued {
            run: scope.clone(),
            created: true,
            checkpoint: Some(*cp),
        }),
        Judged::Existing(run, latest) => Ok(Enqueued {
            run,
            created: false,
            checkpoint: latest.map(|c| *c),
        }),
    }
}
