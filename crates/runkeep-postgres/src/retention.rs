//! Retention on PostgreSQL (`runkeep::scheduling::retention`): one
//! transaction per batch.
//!
//! 1. `SELECT … FOR UPDATE SKIP LOCKED` takes up to `limit + 1` top-level
//!    finished runs under the scope whose `finished_at` plus their own
//!    retention (else the policy's) has passed, oldest finish first, served
//!    by the partial index `runs_finished_by_finished_at` (schema v5). A
//!    row locked by a writer in flight (a reopen, a claim) is skipped, not
//!    waited for; a row changed since the statement's snapshot is
//!    re-checked by PostgreSQL against the `WHERE` on its new version.
//! 2. Each locked row is judged again by [`retention::is_due`] (the one
//!    rule; the SQL only narrows what is read), and its sub-runs are locked
//!    (`FOR UPDATE`, through `runs_sub_runs_by_parent`) and judged too: one
//!    not due keeps the parent.
//! 3. One `DELETE` removes the due runs and their sub-runs; their
//!    checkpoints, events and audit records (and every table naming a run
//!    by foreign key) go by `ON DELETE CASCADE`. Then `COMMIT`.
//!
//! A run reopened or claimed after the batch locked it waits for the
//! commit and then finds no run (a claim of an unknown run takes fence 1,
//! as for any run never claimed; `claim_next` never lists it).

use std::collections::HashMap;

use runkeep::lease::is_expired;
use runkeep::scheduling::retention::{self, PruneReport, RetentionPolicy};
use runkeep::{
    Error, ListingScope, ProjectId, Result, RunId, RunScope, SessionId, Timestamp, TopHolding,
};
use tokio_postgres::Row;

use crate::db::row::{i64_of, lifecycle_of, top_of};
use crate::db::Db;
use crate::error::map_pg;

/// The batch's candidates: top-level finished runs past their keep.
const SQL_CANDIDATES: &str =
    "SELECT project_id, session_id, run_id, top_kind, top_fence, holder, expires_at, lifecycle
FROM runs
WHERE tenant_id = $1
  AND ($2::text IS NULL OR project_id = $2)
  AND ($3::text IS NULL OR session_id = $3)
  AND status <> 'active' AND parent_id = ''
  AND (lifecycle->>'finishedAt')::bigint + coalesce((lifecycle->>'retentionMs')::bigint, $4) <= $5
ORDER BY (lifecycle->>'finishedAt')::bigint
LIMIT $6
FOR UPDATE SKIP LOCKED";

/// The sub-runs of the candidates, locked.
const SQL_SUB_RUNS: &str = "SELECT r.project_id, r.session_id, r.parent_id, r.run_id, r.top_kind, r.top_fence, r.holder, r.expires_at, r.lifecycle
FROM runs r, unnest($2::text[], $3::text[], $4::text[]) AS v(p, s, id)
WHERE r.tenant_id = $1 AND r.project_id = v.p AND r.session_id = v.s AND r.parent_id = v.id
ORDER BY r.project_id, r.session_id, r.parent_id, r.run_id
FOR UPDATE OF r";

/// The due runs and their sub-runs.
const SQL_DELETE: &str = "DELETE FROM runs r
USING unnest($2::text[], $3::text[], $4::text[]) AS v(p, s, id)
WHERE r.tenant_id = $1 AND r.project_id = v.p AND r.session_id = v.s
  AND ((r.parent_id = '' AND r.run_id = v.id) OR r.parent_id = v.id)";

/// [`runkeep::CheckpointStore::prune_finished`] on PostgreSQL.
pub(crate) async fn prune_finished(
    db: &Db,
    scope: &ListingScope,
    policy: &RetentionPolicy,
    now: Option<Timestamp>,
    limit: usize,
) -> Result<PruneReport> {
    retention::check_limit(limit)?;
    let what = "prune_finished";
    let mut conn = db.conn(what).await?;
    let tx = conn
        .transaction()
        .await
        .map_err(|e| map_pg(&format!("{what}: begin"), e))?;
    let now = match db.fixed_now(now) {
        Some(t) => t,
        None => db.server_now(&tx).await?,
    };
    let tenant = scope.tenant_id().to_string();
    let project = scope.project_id().map(ToString::to_string);
    let session = scope.session_id().map(ToString::to_string);
    let keep = i64_of(policy.keep_finished_for.as_millis());
    let at = now.as_millis();
    let take = i64_of(limit as u64 + 1);
    let rows = db
        .rows(
            &tx,
            what,
            SQL_CANDIDATES,
            &[&tenant, &project, &session, &keep, &at, &take],
        )
        .await?;
    let mut report = PruneReport {
        scanned: rows.len() as u64,
        ..PruneReport::default()
    };
    let mut due: Vec<RunScope> = Vec::new();
    for row in &rows {
        let s = scope_of(scope, row, None)?;
        if judge(&s, row, 3, 7, policy, now)? {
            due.push(s);
        }
    }
    if due.len() > limit {
        due.truncate(limit);
        report.more = true;
    }
    // Sub-runs: every one must be due for its parent to go.
    let (ps, ss, ids) = columns(&due);
    let subs = db
        .rows(&tx, what, SQL_SUB_RUNS, &[&tenant, &ps, &ss, &ids])
        .await?;
    let mut kept: HashMap<(String, String, String), ()> = HashMap::new();
    let mut sub_count: HashMap<(String, String, String), u64> = HashMap::new();
    for row in &subs {
        let parent: String = row.get(2);
        let slot = (row.get::<_, String>(0), row.get::<_, String>(1), parent);
        let s = scope_of(scope, row, Some(&slot.2))?;
        if judge(&s, row, 4, 8, policy, now)? {
            *sub_count.entry(slot).or_default() += 1;
        } else {
            kept.insert(slot, ());
        }
    }
    due.retain(|s| !kept.contains_key(&slot_of(s)));
    let (ps, ss, ids) = columns(&due);
    if !due.is_empty() {
        db.rows(&tx, what, SQL_DELETE, &[&tenant, &ps, &ss, &ids])
            .await?;
    }
    tx.commit()
        .await
        .map_err(|e| map_pg(&format!("{what}: commit"), e))?;
    for s in due {
        report.sub_runs_deleted += sub_count.get(&slot_of(&s)).copied().unwrap_or(0);
        report.deleted.push(s);
    }
    Ok(report)
}

fn slot_of(s: &RunScope) -> (String, String, String) {
    (
        s.project_id.to_string(),
        s.session_id.to_string(),
        s.run_id.to_string(),
    )
}

/// The project, session and run id columns of `runs`, as arrays.
fn columns(runs: &[RunScope]) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for s in runs {
        let (p, se, r) = slot_of(s);
        out.0.push(p);
        out.1.push(se);
        out.2.push(r);
    }
    out
}

/// The run a row names (project, session at 0 and 1; the run id at 2, or
/// at 3 after the parent for a sub-run).
fn scope_of(scope: &ListingScope, row: &Row, parent: Option<&str>) -> Result<RunScope> {
    let bad = |e: Error| Error::corrupted(format!("a run row in PostgreSQL: {e}"));
    let project: String = row.get(0);
    let session: String = row.get(1);
    let run: String = row.get(if parent.is_some() { 3 } else { 2 });
    let s = RunScope::new(
        scope.tenant_id().clone(),
        ProjectId::new(project).map_err(bad)?,
        SessionId::new(session).map_err(bad)?,
        RunId::new(run).map_err(bad)?,
    );
    Ok(match parent {
        Some(p) => s.with_parent(RunId::new(p).map_err(bad)?),
        None => s,
    })
}

/// The retention rule on a locked row (holding columns from `top`, the
/// lifecycle at `lifecycle`).
fn judge(
    s: &RunScope,
    row: &Row,
    top: usize,
    lifecycle: usize,
    policy: &RetentionPolicy,
    now: Timestamp,
) -> Result<bool> {
    let held = matches!(
        top_of(s, row, top)?,
        Some(TopHolding::Lease { expires_at, .. }) if !is_expired(expires_at, now)
    );
    let l = lifecycle_of(s, row.get(lifecycle))?;
    Ok(retention::is_due(&l, held, policy, now))
}
