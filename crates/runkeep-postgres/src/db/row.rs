//! A run's row: its key columns, the state columns the core judges
//! ([`RunState`]), and their mapping to and from the core's types; the
//! `UPDATE` that saves a judged row.

use serde_json::{Map, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use runkeep::lease::check_write;
use runkeep::{
    Checkpoint, Error, Fence, Holder, Lifecycle, Result, RunDigest, RunScope, Timestamp, TopHolding,
};

use crate::db::pipeline::{Param, Stmt};
use crate::db::Db;

/// The columns of a run's row that its operations decide with.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunState {
    pub(crate) top: Option<TopHolding>,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) digest: Option<RunDigest>,
    pub(crate) last_seq: u64,
    pub(crate) last_audit: u64,
    pub(crate) has_record: bool,
    pub(crate) has_messages: bool,
    pub(crate) has_report: bool,
}

impl RunState {
    pub(crate) fn check(
        &self,
        scope: &RunScope,
        operation: &'static str,
        fence: Option<Fence>,
    ) -> Result<()> {
        check_write(&scope.run_id, operation, fence, self.top.as_ref())
            .map_err(|e| runkeep::failure::refine_refusal(e, &self.lifecycle))
    }

    pub(crate) fn checkpoint_count(&self) -> u64 {
        self.digest.as_ref().map_or(0, |d| d.checkpoint_count)
    }

    /// The run has any state at all (as `MemoryStore` judges it).
    pub(crate) fn exists(&self) -> bool {
        self.checkpoint_count() > 0 || self.top.is_some() || self.last_seq > 0 || self.has_record
    }

    /// Nothing was ever stored (a row a write of nothing left).
    pub(crate) fn is_blank(&self) -> bool {
        !self.exists()
            && !self.has_messages
            && !self.has_report
            && self.last_audit == 0
            && self.lifecycle == Lifecycle::default()
    }
}

/// The five key columns of a run (ordered as the lock order of a group
/// commit).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(crate) tenant: String,
    pub(crate) project: String,
    pub(crate) session: String,
    pub(crate) run: String,
    pub(crate) parent: String,
}

impl Key {
    pub(crate) fn of(scope: &RunScope) -> Self {
        Self {
            tenant: scope.tenant_id.to_string(),
            project: scope.project_id.to_string(),
            session: scope.session_id.to_string(),
            run: scope.run_id.to_string(),
            parent: scope
                .parent_run_id
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_default(),
        }
    }

    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.tenant,
            &self.project,
            &self.session,
            &self.run,
            &self.parent,
        ]
    }

    pub(crate) fn with<'a>(
        &'a self,
        more: &[&'a (dyn ToSql + Sync)],
    ) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut p = self.params();
        p.extend_from_slice(more);
        p
    }

    /// The key as owned parameters `$1`..`$5`, then `more`.
    pub(crate) fn owned(&self, more: Vec<Param>) -> Vec<Param> {
        let mut p: Vec<Param> = vec![
            Box::new(self.tenant.clone()),
            Box::new(self.project.clone()),
            Box::new(self.session.clone()),
            Box::new(self.run.clone()),
            Box::new(self.parent.clone()),
        ];
        p.extend(more);
        p
    }
}

pub(crate) const KEY_WHERE: &str =
    "tenant_id = $1 AND project_id = $2 AND session_id = $3 AND run_id = $4 AND parent_id = $5";
pub(crate) const KEY_COLS: &str = "tenant_id, project_id, session_id, run_id, parent_id";
pub(crate) const STATE_COLS: &str = "top_kind, top_fence, holder, expires_at, lifecycle, digest, last_seq, last_audit_seq, record IS NOT NULL, messages IS NOT NULL, report IS NOT NULL";
/// The server's clock in epoch milliseconds.
pub(crate) const CLOCK: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
pub(crate) const NOW_SQL: &str =
    "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

pub(crate) fn sql_lock() -> String {
    format!("SELECT {STATE_COLS} FROM runs WHERE {KEY_WHERE} FOR UPDATE")
}
pub(crate) fn sql_state() -> String {
    format!("SELECT {STATE_COLS} FROM runs WHERE {KEY_WHERE}")
}
pub(crate) fn sql_ensure() -> String {
    format!("INSERT INTO runs ({KEY_COLS}) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING")
}
/// Read after the lock, in a statement of its own (so its snapshot is taken
/// once the lock is held): the clock (`$6` when the test clock decides,
/// else the server's) and whether checkpoint `$7` exists.
pub(crate) fn sql_after_lock() -> String {
    format!(
        "SELECT coalesce($6::bigint, {CLOCK}), EXISTS (SELECT 1 FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $7::text)"
    )
}
pub(crate) fn sql_headers() -> String {
    format!("SELECT header FROM checkpoints WHERE {KEY_WHERE}")
}
/// The save's `UPDATE` of every state column (`$6`..`$24`), also setting
/// `also` (`$25`, `$26`, …).
pub(crate) fn sql_save_also(also: &[&str]) -> String {
    let more: String = also
        .iter()
        .enumerate()
        .map(|(i, c)| format!(", {c} = ${}", 25 + i))
        .collect();
    format!(
        "UPDATE runs SET top_kind = $6, top_fence = $7, holder = $8, expires_at = $9, lifecycle = $10, status = $11, available_at = $12, digest = $13, checkpoint_count = $14, created_rank = $15, created_stamp = $16, park_count = $17, last_seq = $18, last_audit_seq = $19, priority = $20, ckey = $21, climit = $22, deadline = $23, finished_at = $24{more} WHERE {KEY_WHERE}"
    )
}

pub(crate) fn corrupted(scope: &RunScope, what: &str, e: impl std::fmt::Display) -> Error {
    Error::corrupted(format!(
        "run {} in PostgreSQL: {what} does not parse: {e}",
        scope.run_id
    ))
}

pub(crate) fn ts(scope: &RunScope, what: &str, ms: i64) -> Result<Timestamp> {
    Timestamp::from_millis(ms).map_err(|e| corrupted(scope, what, e))
}

pub(crate) fn fence_of(scope: &RunScope, what: &str, v: i64) -> Result<Fence> {
    u64::try_from(v)
        .map_err(|e| corrupted(scope, what, e))
        .and_then(|v| Fence::new(v).map_err(|e| corrupted(scope, what, e)))
}

pub(crate) fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn top_of(scope: &RunScope, row: &Row, base: usize) -> Result<Option<TopHolding>> {
    let kind: Option<i16> = row.get(base);
    let fence: Option<i64> = row.get(base + 1);
    match (kind, fence) {
        (None, _) => Ok(None),
        (Some(1), Some(f)) => {
            let holder: Option<String> = row.get(base + 2);
            let expires: Option<i64> = row.get(base + 3);
            Ok(Some(TopHolding::Lease {
                fence: fence_of(scope, "the lease fence", f)?,
                holder: Holder::new(holder.unwrap_or_default())
                    .map_err(|e| corrupted(scope, "the lease holder", e))?,
                expires_at: ts(scope, "the lease expiry", expires.unwrap_or(0))?,
            }))
        }
        (Some(2), Some(f)) => Ok(Some(TopHolding::Released {
            fence: fence_of(scope, "the tombstone fence", f)?,
        })),
        (k, f) => Err(corrupted(scope, "the top holding", format!("{k:?}/{f:?}"))),
    }
}

pub(crate) fn lifecycle_of(scope: &RunScope, v: Option<Value>) -> Result<Lifecycle> {
    match v {
        None => Ok(Lifecycle::default()),
        Some(v) => serde_json::from_value(v).map_err(|e| corrupted(scope, "the lifecycle", e)),
    }
}

pub(crate) fn digest_of(scope: &RunScope, v: Option<Value>) -> Result<Option<RunDigest>> {
    v.map(|v| serde_json::from_value(v).map_err(|e| corrupted(scope, "the digest", e)))
        .transpose()
}

pub(crate) fn state_of(scope: &RunScope, row: &Row) -> Result<RunState> {
    let last_seq: i64 = row.get(6);
    let last_audit: i64 = row.get(7);
    Ok(RunState {
        top: top_of(scope, row, 0)?,
        lifecycle: lifecycle_of(scope, row.get(4))?,
        digest: digest_of(scope, row.get(5))?,
        last_seq: u64::try_from(last_seq).unwrap_or(0),
        last_audit: u64::try_from(last_audit).unwrap_or(0),
        has_record: row.get(8),
        has_messages: row.get(9),
        has_report: row.get(10),
    })
}

pub(crate) fn checkpoint_of(scope: &RunScope, body: Value) -> Result<Checkpoint> {
    match body {
        Value::Object(obj) => {
            Checkpoint::from_json(obj).map_err(|e| corrupted(scope, "a checkpoint", e))
        }
        other => Err(corrupted(
            scope,
            "a checkpoint",
            format!("not an object: {other}"),
        )),
    }
}

pub(crate) fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

impl Db {
    pub(crate) async fn read_state<C: crate::db::Session>(
        &self,
        c: &C,
        scope: &RunScope,
        key: &Key,
    ) -> Result<Option<RunState>> {
        match self
            .row_opt(c, "read the run row", &sql_state(), &key.params())
            .await?
        {
            Some(r) => Ok(Some(state_of(scope, &r)?)),
            None => Ok(None),
        }
    }
}

/// The `UPDATE` that writes `run` back to its row.
pub(crate) fn save_stmt(key: &Key, run: &RunState) -> Result<Stmt> {
    save_stmt_with(key, run, Vec::new())
}

/// [`save_stmt`], also setting each of `also`'s columns to its value.
pub(crate) fn save_stmt_with(
    key: &Key,
    run: &RunState,
    also: Vec<(&'static str, Param)>,
) -> Result<Stmt> {
    let r = Saved::of(run)?;
    let (columns, values): (Vec<&str>, Vec<Param>) = also.into_iter().unzip();
    let mut params = key.owned(vec![
        Box::new(r.kind),
        Box::new(r.fence),
        Box::new(r.holder),
        Box::new(r.expires),
        Box::new(r.lifecycle),
        Box::new(r.status),
        Box::new(r.available),
        Box::new(r.digest),
        Box::new(r.count),
        Box::new(r.rank),
        Box::new(r.stamp),
        Box::new(r.parks),
        Box::new(r.last_seq),
        Box::new(r.last_audit),
        Box::new(r.priority),
        Box::new(r.ckey),
        Box::new(r.climit),
        Box::new(r.deadline),
        Box::new(r.finished_at),
    ]);
    params.extend(values);
    Ok(Stmt::new(
        "save the run row",
        sql_save_also(&columns),
        params,
    ))
}

/// The `UPDATE` that writes each run back to its row, as one statement
/// whatever their number (the values as arrays, `unnest`ed: one text, so
/// one prepared statement and one executor start for a batch's claims).
/// The runs are distinct rows. [`save_stmt`] for one run.
pub(crate) fn save_many_stmt(runs: &[(Key, RunState)]) -> Result<Stmt> {
    if let [(key, run)] = runs {
        return save_stmt(key, run);
    }
    let n = runs.len();
    let mut keys: [Vec<String>; 5] = Default::default();
    let mut rows = Vec::with_capacity(n);
    for (key, run) in runs {
        for (column, v) in keys.iter_mut().zip([
            &key.tenant,
            &key.project,
            &key.session,
            &key.run,
            &key.parent,
        ]) {
            column.push(v.clone());
        }
        rows.push(Saved::of(run)?);
    }
    fn column<T: ToSql + Sync + Send + 'static>(rows: &[Saved], f: impl Fn(&Saved) -> T) -> Param {
        Box::new(rows.iter().map(f).collect::<Vec<T>>())
    }
    let mut params: Vec<Param> = keys.into_iter().map(|k| Box::new(k) as Param).collect();
    params.extend([
        column(&rows, |r| r.kind),
        column(&rows, |r| r.fence),
        column(&rows, |r| r.holder.clone()),
        column(&rows, |r| r.expires),
        column(&rows, |r| r.lifecycle.clone()),
        column(&rows, |r| r.status.clone()),
        column(&rows, |r| r.available),
        column(&rows, |r| r.digest.clone()),
        column(&rows, |r| r.count),
        column(&rows, |r| r.rank),
        column(&rows, |r| r.stamp),
        column(&rows, |r| r.parks),
        column(&rows, |r| r.last_seq),
        column(&rows, |r| r.last_audit),
        column(&rows, |r| r.priority),
        column(&rows, |r| r.ckey.clone()),
        column(&rows, |r| r.climit),
        column(&rows, |r| r.deadline),
        column(&rows, |r| r.finished_at),
    ]);
    Ok(Stmt::new("save the run rows", SQL_SAVE_MANY, params))
}

/// [`save_many_stmt`]'s statement: the columns of [`sql_save_also`], from
/// arrays in the same order (the key's five first).
const SQL_SAVE_MANY: &str = "UPDATE runs SET top_kind = u.top_kind, top_fence = u.top_fence, holder = u.holder, expires_at = u.expires_at, lifecycle = u.lifecycle, status = u.status, available_at = u.available_at, digest = u.digest, checkpoint_count = u.checkpoint_count, created_rank = u.created_rank, created_stamp = u.created_stamp, park_count = u.park_count, last_seq = u.last_seq, last_audit_seq = u.last_audit_seq, priority = u.priority, ckey = u.ckey, climit = u.climit, deadline = u.deadline, finished_at = u.finished_at \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int2[], $7::int8[], $8::text[], $9::int8[], $10::jsonb[], $11::text[], $12::int8[], $13::jsonb[], $14::int8[], $15::int2[], $16::int8[], $17::int4[], $18::int8[], $19::int8[], $20::int4[], $21::text[], $22::int4[], $23::int8[], $24::int8[]) \
     AS u(tenant_id, project_id, session_id, run_id, parent_id, top_kind, top_fence, holder, expires_at, lifecycle, status, available_at, digest, checkpoint_count, created_rank, created_stamp, park_count, last_seq, last_audit_seq, priority, ckey, climit, deadline, finished_at) \
     WHERE runs.tenant_id = u.tenant_id AND runs.project_id = u.project_id AND runs.session_id = u.session_id AND runs.run_id = u.run_id AND runs.parent_id = u.parent_id";

/// The values a save writes to a run's row, typed as its columns.
struct Saved {
    kind: Option<i16>,
    fence: Option<i64>,
    holder: Option<String>,
    expires: Option<i64>,
    lifecycle: Option<Value>,
    status: String,
    available: Option<i64>,
    digest: Option<Value>,
    count: i64,
    rank: i16,
    stamp: i64,
    parks: i32,
    last_seq: i64,
    last_audit: i64,
    priority: i32,
    ckey: Option<String>,
    climit: Option<i32>,
    deadline: Option<i64>,
    finished_at: Option<i64>,
}

impl Saved {
    fn of(run: &RunState) -> Result<Self> {
        let (kind, fence, holder, expires): (
            Option<i16>,
            Option<i64>,
            Option<String>,
            Option<i64>,
        ) = match &run.top {
            None => (None, None, None, None),
            Some(TopHolding::Lease {
                fence,
                holder,
                expires_at,
            }) => (
                Some(1),
                Some(i64_of(fence.get())),
                Some(holder.as_str().to_string()),
                Some(expires_at.as_millis()),
            ),
            Some(TopHolding::Released { fence } | TopHolding::Unreadable { fence }) => {
                (Some(2), Some(i64_of(fence.get())), None, None)
            }
        };
        let lifecycle = if run.lifecycle == Lifecycle::default() {
            None
        } else {
            Some(
                serde_json::to_value(&run.lifecycle)
                    .map_err(|e| Error::backend("encode the lifecycle", e))?,
            )
        };
        let status = run.lifecycle.status.as_str().to_string();
        let available: Option<i64> = run.lifecycle.available_at.map(Timestamp::as_millis);
        let digest = match &run.digest {
            Some(d) if d.checkpoint_count > 0 => {
                Some(serde_json::to_value(d).map_err(|e| Error::backend("encode the digest", e))?)
            }
            _ => None,
        };
        let d = run.digest.as_ref().filter(|d| d.checkpoint_count > 0);
        let count = i64_of(d.map_or(0, |d| d.checkpoint_count));
        let rank: i16 = i16::from(d.and_then(|d| d.run_created_at).is_some());
        let stamp: i64 = d
            .and_then(|d| d.run_created_at)
            .map_or(0, Timestamp::as_millis);
        let parks: i32 = d.map_or(0, |d| i32::try_from(d.parks.len()).unwrap_or(i32::MAX));
        let priority: i32 = run.lifecycle.priority.get();
        let ckey: Option<String> = run.lifecycle.concurrency.as_ref().map(|c| c.key.clone());
        let climit: Option<i32> = run
            .lifecycle
            .concurrency
            .as_ref()
            .map(|c| i32::try_from(c.limit).unwrap_or(i32::MAX));
        let deadline: Option<i64> = run.lifecycle.deadline.map(Timestamp::as_millis);
        // Only while finished (schema v7): a reopened run leaves the prune's index.
        let finished_at: Option<i64> = run
            .lifecycle
            .finished_at
            .filter(|_| run.lifecycle.status.is_finished())
            .map(Timestamp::as_millis);
        Ok(Self {
            kind,
            fence,
            holder,
            expires,
            lifecycle,
            status,
            available,
            digest,
            count,
            rank,
            stamp,
            parks,
            last_seq: i64_of(run.last_seq),
            last_audit: i64_of(run.last_audit),
            priority,
            ckey,
            climit,
            deadline,
            finished_at,
        })
    }
}
