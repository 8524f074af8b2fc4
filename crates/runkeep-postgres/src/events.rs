//! The event log and the audit log: appends numbered under the row lock,
//! and their reads.

use serde_json::Value;

use runkeep::{
    AuditRecord, Error, EventBatch, Fence, NewAuditEvent, NewEvent, PersistedEvent,
    ReadEventsOptions, Result, RunScope, Timestamp,
};

use crate::db::pipeline::Stmt;
use crate::db::row::{corrupted, i64_of, object, Key, RunState, KEY_COLS, KEY_WHERE};
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;

/// The events as stored under the already-checked fence, advancing
/// `last_seq`, and the `INSERT` that stores them (none for none).
pub(crate) fn events_stmt(
    db: &Db,
    key: &Key,
    run: &mut RunState,
    events: &[NewEvent],
    now: Timestamp,
    fence: Option<Fence>,
) -> Result<(Vec<PersistedEvent>, Option<Stmt>)> {
    if events.is_empty() {
        return Ok((Vec::new(), None));
    }
    let mut out = Vec::with_capacity(events.len());
    let mut seqs = Vec::with_capacity(events.len());
    let mut bodies = Vec::with_capacity(events.len());
    for e in events {
        let p = e.persist(run.last_seq + 1, now, fence);
        run.last_seq += 1;
        let body = Value::Object(p.to_json());
        db.check_json(&format!("event of type {}", p.event_type), &body)?;
        seqs.push(i64_of(p.seq));
        bodies.push(body);
        out.push(p);
    }
    let stmt = Stmt::new(
        "append events",
        format!(
            "INSERT INTO events ({KEY_COLS}, seq, body) SELECT $1, $2, $3, $4, $5, s, b FROM unnest($6::bigint[], $7::jsonb[]) AS t(s, b)"
        ),
        key.owned(vec![Box::new(seqs), Box::new(bodies)]),
    );
    Ok((out, Some(stmt)))
}

pub(crate) async fn append_events(
    db: &Db,
    scope: &RunScope,
    events: &[NewEvent],
    fence: Option<Fence>,
) -> Result<Vec<PersistedEvent>> {
    for e in events {
        e.validate()?;
    }
    let what = "append_events";
    let opening = Opening {
        create: fence.is_none(),
        clock: true,
        ..Opening::default()
    };
    db.write_locked(what, scope, opening, |l| {
        l.run.check(scope, what, fence)?;
        let (out, insert) = events_stmt(db, &l.key, &mut l.run, events, l.now, fence)?;
        Ok(Verdict::Write(
            out,
            Writes::default()
                .stmts(insert)
                .save()
                .notify(Wake::NewEvents),
        ))
    })
    .await
}

pub(crate) async fn read_events(
    db: &Db,
    scope: &RunScope,
    options: &ReadEventsOptions,
) -> Result<EventBatch> {
    // One statement, one snapshot: the head and the events agree.
    let key = Key::of(scope);
    let since = i64_of(options.since_seq);
    let limit: Option<i64> = options.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
    let c = db.conn("read_events").await?;
    let Some(r) = db.row_opt(
        &c,
        "read events",
        &format!(
            "SELECT last_seq, (SELECT coalesce(jsonb_agg(e.body ORDER BY e.seq), '[]'::jsonb) FROM
                (SELECT seq, body FROM events WHERE {KEY_WHERE} AND seq > $6 ORDER BY seq LIMIT $7) e)
             FROM runs WHERE {KEY_WHERE}"
        ),
        &key.with(&[&since, &limit]),
    )
    .await?
    else {
        return Ok(EventBatch::default());
    };
    let last: i64 = r.get(0);
    let arr: Value = r.get(1);
    let mut events = Vec::new();
    if let Value::Array(items) = arr {
        for v in items {
            let seq = v.get("seq").and_then(Value::as_u64).unwrap_or(0);
            let e = PersistedEvent::from_json(object(v), seq)
                .map_err(|m| corrupted(scope, &format!("event {seq}"), m))?;
            events.push(e);
        }
    }
    Ok(EventBatch {
        events,
        skipped: Vec::new(),
        last_seq: u64::try_from(last).unwrap_or(0),
    })
}

pub(crate) async fn append_audit(
    db: &Db,
    scope: &RunScope,
    events: &[NewAuditEvent],
    fence: Option<Fence>,
) -> Result<Vec<AuditRecord>> {
    for e in events {
        e.validate()?;
    }
    let what = "append_audit";
    let opening = Opening {
        create: fence.is_none(),
        clock: true,
        ..Opening::default()
    };
    db
        .write_locked(what, scope, opening, |l| {
            l.run.check(scope, what, fence)?;
            let mut out = Vec::new();
            let mut seqs = Vec::new();
            let mut bodies = Vec::new();
            for e in events {
                let rec = e.record(scope.run_id.as_str(), l.run.last_audit + 1, l.now, fence);
                l.run.last_audit += 1;
                let body = serde_json::to_value(&rec)
                    .map_err(|e| Error::invalid(format!("audit event: {e}")))?;
                db.check_json("audit event", &body)?;
                seqs.push(i64_of(rec.seq));
                bodies.push(body);
                out.push(rec);
            }
            let mut writes = Writes::default();
            if !out.is_empty() {
                writes = writes.stmt(Stmt::new(
                    "append audit records",
                    format!(
                        "INSERT INTO audit ({KEY_COLS}, seq, body) SELECT $1, $2, $3, $4, $5, s, b FROM unnest($6::bigint[], $7::jsonb[]) AS t(s, b)"
                    ),
                    l.key.owned(vec![Box::new(seqs), Box::new(bodies)]),
                ));
            }
            Ok(Verdict::Write(out, writes.save()))
        })
        .await
}

pub(crate) async fn read_audit(
    db: &Db,
    scope: &RunScope,
    since_seq: u64,
) -> Result<Vec<AuditRecord>> {
    let key = Key::of(scope);
    let since = i64_of(since_seq);
    let c = db.conn("read_audit").await?;
    let rs = db
        .rows(
            &c,
            "read audit records",
            &format!("SELECT body FROM audit WHERE {KEY_WHERE} AND seq > $6 ORDER BY seq"),
            &key.with(&[&since]),
        )
        .await?;
    rs.into_iter()
        .map(|r| {
            serde_json::from_value(r.get(0)).map_err(|e| corrupted(scope, "an audit record", e))
        })
        .collect()
}
