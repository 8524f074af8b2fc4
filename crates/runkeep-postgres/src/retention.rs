//! Retention on PostgreSQL (`runkeep::scheduling::retention`): one
//! transaction per batch.
//!
//! 1. **Scan** (no lock): up to `limit + 1` top-level finished runs under
//!    the scope whose `finished_at` plus their own retention (else the
//!    policy's) has passed, oldest finish first, read from the partial
//!    index `runs_finished_by_finished_at` on the `finished_at` column
//!    (schema v7). The first `limit` are the batch's candidates; the one
//!    past them only sets `more`.
//! 2. **Lock**: the candidates' rows by primary key, in key order,
//!    `FOR UPDATE` (waiting for a writer in flight: a reopen, a claim).
//!    The rows read are the latest versions, and each is judged again by
//!    [`retention::is_due`], the one rule (the scan only narrows what is
//!    read): a run reopened, claimed or re-finished since the scan's
//!    snapshot is kept; one deleted since is not returned.
//!    Writers hold a run's row for one short transaction; a row held past
//!    `PgOptions::lock_timeout` (a client stopped mid-transaction) fails
//!    the batch `Unavailable` with nothing deleted, and the next call
//!    retries it.
//! 3. **Sub-runs**: the due candidates' sub-runs are locked (`FOR UPDATE`,
//!    through `runs_sub_runs_by_parent`) and judged too: one not due keeps
//!    its parent.
//! 4. **Delete**: one `DELETE` by primary key removes the due runs and the
//!    sub-runs judged with them; their checkpoints, events and audit
//!    records (and every table naming a run by foreign key) go by
//!    `ON DELETE CASCADE`. Then `COMMIT`.
//!
//! A run reopened or claimed after the batch locked it waits for the
//! commit and then finds no run (a claim of an unknown run takes fence 1,
//! as for any run never claimed; `claim_next` never lists it). Locks are
//! taken in key order, parents before sub-runs, so two prunes at once
//! queue on each other instead of deadlocking.

use std::collections::{HashMap, HashSet};

use runkeep::lease::is_expired;
use runkeep::scheduling::retention::{self, PruneReport, RetentionPolicy};
use runkeep::{
    Error, ListingScope, ProjectId, Result, RunId, RunScope, SessionId, Timestamp, TopHolding,
};
use tokio_postgres::Row;

use crate::db::pipeline::Param;
use crate::db::row::{i64_of, lifecycle_of, top_of};
use crate::db::Db;
use crate::error::map_pg;
use crate::listing::{explain, params_ref};

/// The scan: the top-level finished runs past their keep, oldest finish
/// first (`$6`: the batch plus one).
const SQL_SCAN: &str = "SELECT project_id, session_id, run_id
FROM runs
WHERE tenant_id = $1
  AND ($2::text IS NULL OR project_id = $2)
  AND ($3::text IS NULL OR session_id = $3)
  AND finished_at IS NOT NULL AND parent_id = ''
  AND finished_at + coalesce((lifecycle->>'retentionMs')::bigint, $4) <= $5
ORDER BY finished_at
LIMIT $6";

/// The candidates, locked by primary key in key order, latest versions.
const SQL_LOCK: &str = "SELECT r.project_id, r.session_id, r.run_id, r.top_kind, r.top_fence, r.holder, r.expires_at, r.lifecycle
FROM runs r, unnest($2::text[], $3::text[], $4::text[]) AS v(p, s, id)
WHERE r.tenant_id = $1 AND r.project_id = v.p AND r.session_id = v.s AND r.run_id = v.id
  AND r.parent_id = ''
ORDER BY r.project_id, r.session_id, r.run_id
FOR UPDATE OF r";

/// The sub-runs of the due candidates, locked (`parent_id <> ''` lets the
/// planner use the partial index `runs_sub_runs_by_parent`).
const SQL_SUB_RUNS: &str = "SELECT r.project_id, r.session_id, r.parent_id, r.run_id, r.top_kind, r.top_fence, r.holder, r.expires_at, r.lifecycle
FROM runs r, unnest($2::text[], $3::text[], $4::text[]) AS v(p, s, id)
WHERE r.tenant_id = $1 AND r.project_id = v.p AND r.session_id = v.s
  AND r.parent_id <> '' AND r.parent_id = v.id
ORDER BY r.project_id, r.session_id, r.parent_id, r.run_id
FOR UPDATE OF r";

/// The due runs and the sub-runs judged with them, by primary key.
const SQL_DELETE: &str = "DELETE FROM runs r
USING unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS v(p, s, id, parent)
WHERE r.tenant_id = $1 AND r.project_id = v.p AND r.session_id = v.s
  AND r.run_id = v.id AND r.parent_id = v.parent";

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
    let scan = scan_params(scope, policy, now, limit);
    let rows = db.rows(&tx, what, SQL_SCAN, &params_ref(&scan)).await?;
    let mut report = PruneReport {
        scanned: rows.len() as u64,
        more: rows.len() > limit,
        ..PruneReport::default()
    };
    let candidates: Vec<RunScope> = rows
        .iter()
        .take(limit)
        .map(|r| scope_of(scope, r, None))
        .collect::<Result<_>>()?;
    // Locked, then judged again on the latest version.
    let (ps, ss, ids) = columns(&candidates);
    let locked = db
        .rows(&tx, what, SQL_LOCK, &[&tenant, &ps, &ss, &ids])
        .await?;
    let mut judged_due: HashSet<Slot> = HashSet::new();
    for row in &locked {
        let s = scope_of(scope, row, None)?;
        if judge(&s, row, 3, 7, policy, now)? {
            judged_due.insert(slot_of(&s));
        }
    }
    // The scan's order (oldest finish first), due ones only.
    let mut due: Vec<RunScope> = candidates
        .into_iter()
        .filter(|s| judged_due.contains(&slot_of(s)))
        .collect();
    // Sub-runs: every one must be due for its parent to go.
    let (ps, ss, ids) = columns(&due);
    let subs = db
        .rows(&tx, what, SQL_SUB_RUNS, &[&tenant, &ps, &ss, &ids])
        .await?;
    let mut kept: HashSet<Slot> = HashSet::new();
    let mut sub_runs: HashMap<Slot, Vec<RunScope>> = HashMap::new();
    for row in &subs {
        let parent: String = row.get(2);
        let slot = (row.get::<_, String>(0), row.get::<_, String>(1), parent);
        let s = scope_of(scope, row, Some(&slot.2))?;
        if judge(&s, row, 4, 8, policy, now)? {
            sub_runs.entry(slot).or_default().push(s);
        } else {
            kept.insert(slot);
        }
    }
    due.retain(|s| !kept.contains(&slot_of(s)));
    if !due.is_empty() {
        let mut keys: [Vec<String>; 4] = Default::default();
        for s in &due {
            for r in std::iter::once(s).chain(sub_runs.get(&slot_of(s)).into_iter().flatten()) {
                keys[0].push(r.project_id.to_string());
                keys[1].push(r.session_id.to_string());
                keys[2].push(r.run_id.to_string());
                keys[3].push(
                    r.parent_run_id
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                );
            }
        }
        let [ps, ss, ids, parents] = keys;
        db.rows(&tx, what, SQL_DELETE, &[&tenant, &ps, &ss, &ids, &parents])
            .await?;
    }
    tx.commit()
        .await
        .map_err(|e| map_pg(&format!("{what}: commit"), e))?;
    for s in due {
        report.sub_runs_deleted += sub_runs.get(&slot_of(&s)).map_or(0, Vec::len) as u64;
        report.deleted.push(s);
    }
    Ok(report)
}

/// The scan's parameters (`SQL_SCAN`).
fn scan_params(
    scope: &ListingScope,
    policy: &RetentionPolicy,
    now: Timestamp,
    limit: usize,
) -> Vec<Param> {
    vec![
        Box::new(scope.tenant_id().to_string()),
        Box::new(scope.project_id().map(ToString::to_string)),
        Box::new(scope.session_id().map(ToString::to_string)),
        Box::new(i64_of(policy.keep_finished_for.as_millis())),
        Box::new(now.as_millis()),
        Box::new(i64_of(limit as u64 + 1)),
    ]
}

/// The query plans of a batch's statements at `now` (the store clock when
/// `None`): the scan, then the lock, sub-run and delete statements for the
/// candidates that scan finds (nothing is locked or deleted: `EXPLAIN`
/// without `ANALYZE`).
pub(crate) async fn explain_prune_finished(
    db: &Db,
    scope: &ListingScope,
    policy: &RetentionPolicy,
    now: Option<Timestamp>,
    limit: usize,
) -> Result<String> {
    retention::check_limit(limit)?;
    let what = "explain prune_finished";
    let c = db.conn(what).await?;
    let now = match db.fixed_now(now) {
        Some(t) => t,
        None => db.server_now(&c).await?,
    };
    let scan = scan_params(scope, policy, now, limit);
    let rows = db.rows(&c, what, SQL_SCAN, &params_ref(&scan)).await?;
    let candidates: Vec<RunScope> = rows
        .iter()
        .take(limit)
        .map(|r| scope_of(scope, r, None))
        .collect::<Result<_>>()?;
    let tenant = scope.tenant_id().to_string();
    let (ps, ss, ids) = columns(&candidates);
    let parents = vec![String::new(); ids.len()];
    let mut out = vec![format!(
        "-- scan\n{}",
        explain(db, &c, SQL_SCAN, &scan).await?
    )];
    let keyed: Vec<Param> = vec![
        Box::new(tenant.clone()),
        Box::new(ps.clone()),
        Box::new(ss.clone()),
        Box::new(ids.clone()),
    ];
    out.push(format!(
        "-- lock\n{}",
        explain(db, &c, SQL_LOCK, &keyed).await?
    ));
    out.push(format!(
        "-- sub-runs\n{}",
        explain(db, &c, SQL_SUB_RUNS, &keyed).await?
    ));
    let delete: Vec<Param> = vec![
        Box::new(tenant),
        Box::new(ps),
        Box::new(ss),
        Box::new(ids),
        Box::new(parents),
    ];
    out.push(format!(
        "-- delete\n{}",
        explain(db, &c, SQL_DELETE, &delete).await?
    ));
    Ok(out.join("\n"))
}

/// A run's project, session and run id (or parent id, for a sub-run's
/// parent).
type Slot = (String, String, String);

fn slot_of(s: &RunScope) -> Slot {
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
