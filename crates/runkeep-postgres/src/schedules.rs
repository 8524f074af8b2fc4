//! Recurring schedules ([`runkeep::scheduling::schedule`]) in the
//! `schedules` table (migration 4): one row per (tenant, project, session,
//! name), the schedule as `body` (its cursor stripped) and the cursor in
//! `cursor_at`. A put and a cursor's compare-and-set each run in one
//! transaction holding the row lock (`SELECT … FOR UPDATE`) from the read
//! to the write, and apply the core rule ([`schedule::on_put`],
//! [`schedule::advance`]); a create races with `ON CONFLICT DO NOTHING`,
//! and the loser takes the replace path under the winner's row lock.

use runkeep::scheduling::schedule::{self, Schedule, ScheduleEntry};
use runkeep::{Error, ListingScope, ProjectId, Result, SessionId, TenantId, Timestamp};
use serde_json::Value;

use crate::db::Db;
use crate::error::map_pg;

struct Key {
    tenant: String,
    project: String,
    session: String,
}

fn key(session: &ListingScope) -> Result<(ListingScope, Key)> {
    let s = schedule::session_of(session)?;
    let k = Key {
        tenant: s.tenant_id().to_string(),
        project: s.project_id().expect("a session").to_string(),
        session: s.session_id().expect("a session").to_string(),
    };
    Ok((s, k))
}

fn body_of(s: &Schedule) -> Result<Value> {
    let mut v = s.clone();
    v.cursor = None;
    serde_json::to_value(v).map_err(|e| Error::invalid(e.to_string()))
}

fn from_row(body: Value, cursor: Option<i64>) -> Result<Schedule> {
    let mut s: Schedule = serde_json::from_value(body).map_err(|e| Error::Corrupted {
        message: format!("a stored schedule does not parse: {e}"),
    })?;
    s.cursor = cursor.map(Timestamp::from_millis).transpose()?;
    Ok(s)
}

pub(crate) async fn put(db: &Db, session: &ListingScope, incoming: &Schedule) -> Result<Schedule> {
    let (_, k) = key(session)?;
    let created = schedule::on_put(None, incoming, db.now())?;
    let mut c = db.conn("put_schedule").await?;
    let tx = c
        .transaction()
        .await
        .map_err(|e| map_pg("put_schedule: begin", e))?;
    let inserted = db
        .rows(
            &tx,
            "put_schedule: insert",
            "INSERT INTO schedules (tenant_id, project_id, session_id, name, body, cursor_at)
             VALUES ($1, $2, $3, $4, $5, NULL) ON CONFLICT DO NOTHING RETURNING 1",
            &[
                &k.tenant,
                &k.project,
                &k.session,
                &incoming.name,
                &body_of(&created)?,
            ],
        )
        .await?
        .len();
    let stored = if inserted == 1 {
        created
    } else {
        let row = db
            .row_opt(
                &tx,
                "put_schedule: lock",
                "SELECT body, cursor_at FROM schedules
                 WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND name = $4
                 FOR UPDATE",
                &[&k.tenant, &k.project, &k.session, &incoming.name],
            )
            .await?
            .ok_or_else(|| Error::corrupted("put_schedule: the conflicting schedule is gone"))?;
        let existing = from_row(row.get(0), row.get(1))?;
        let stored = schedule::on_put(Some(&existing), incoming, db.now())?;
        db.rows(
            &tx,
            "put_schedule: update",
            "UPDATE schedules SET body = $5
             WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND name = $4",
            &[
                &k.tenant,
                &k.project,
                &k.session,
                &incoming.name,
                &body_of(&stored)?,
            ],
        )
        .await?;
        stored
    };
    tx.commit()
        .await
        .map_err(|e| map_pg("put_schedule: commit", e))?;
    Ok(stored)
}

pub(crate) async fn get(db: &Db, session: &ListingScope, name: &str) -> Result<Option<Schedule>> {
    let (_, k) = key(session)?;
    schedule::check_name(name)?;
    let c = db.conn("get_schedule").await?;
    let row = db
        .row_opt(
            &c,
            "get_schedule",
            "SELECT body, cursor_at FROM schedules
             WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND name = $4",
            &[&k.tenant, &k.project, &k.session, &name],
        )
        .await?;
    row.map(|r| from_row(r.get(0), r.get(1))).transpose()
}

pub(crate) async fn list(db: &Db, scope: &ListingScope) -> Result<Vec<ScheduleEntry>> {
    let tenant = scope.tenant_id().to_string();
    let project = scope.project_id().map(|p| p.to_string());
    let session = scope.session_id().map(|s| s.to_string());
    let c = db.conn("list_schedules").await?;
    let rows = db
        .rows(
            &c,
            "list_schedules",
            "SELECT tenant_id, project_id, session_id, body, cursor_at FROM schedules
             WHERE tenant_id = $1
               AND ($2::text IS NULL OR project_id = $2)
               AND ($3::text IS NULL OR session_id = $3)
             ORDER BY tenant_id, project_id, session_id, name",
            &[&tenant, &project, &session],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let session = ListingScope::session(
            TenantId::new(r.get::<_, String>(0))?,
            ProjectId::new(r.get::<_, String>(1))?,
            SessionId::new(r.get::<_, String>(2))?,
        );
        out.push(ScheduleEntry {
            session,
            schedule: from_row(r.get(3), r.get(4))?,
        });
    }
    schedule::sort_entries(&mut out);
    Ok(out)
}

pub(crate) async fn delete(db: &Db, session: &ListingScope, name: &str) -> Result<bool> {
    let (_, k) = key(session)?;
    schedule::check_name(name)?;
    let c = db.conn("delete_schedule").await?;
    let n = db
        .rows(
            &c,
            "delete_schedule",
            "DELETE FROM schedules
             WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND name = $4
             RETURNING 1",
            &[&k.tenant, &k.project, &k.session, &name],
        )
        .await?
        .len();
    Ok(n == 1)
}

pub(crate) async fn advance(
    db: &Db,
    session: &ListingScope,
    name: &str,
    from: Option<Timestamp>,
    to: Timestamp,
) -> Result<bool> {
    let (s, k) = key(session)?;
    schedule::check_name(name)?;
    let mut c = db.conn("advance_schedule").await?;
    let tx = c
        .transaction()
        .await
        .map_err(|e| map_pg("advance_schedule: begin", e))?;
    let row = db
        .row_opt(
            &tx,
            "advance_schedule: lock",
            "SELECT body, cursor_at FROM schedules
             WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND name = $4
             FOR UPDATE",
            &[&k.tenant, &k.project, &k.session, &name],
        )
        .await?
        .ok_or_else(|| schedule::not_found(&s, name))?;
    let mut stored = from_row(row.get(0), row.get(1))?;
    if !schedule::advance(&mut stored, from, to)? {
        return Ok(false);
    }
    db.rows(
        &tx,
        "advance_schedule: update",
        "UPDATE schedules SET cursor_at = $5
         WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND name = $4",
        &[&k.tenant, &k.project, &k.session, &name, &to.as_millis()],
    )
    .await?;
    tx.commit()
        .await
        .map_err(|e| map_pg("advance_schedule: commit", e))?;
    Ok(true)
}
