//! `list_runs`, the listing SQL it shares with `claim_next` (prefilters
//! that mirror the core's rules, keyset continuation) and the `EXPLAIN`s.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use runkeep::listing::{ListQuery, RowKey};
use runkeep::{
    ClaimNextFilter, Error, LeaseSummary, ListOptions, ListOrder, ListingScope, Result, RunId,
    RunPage, RunRow, RunScope, Timestamp,
};

use crate::db::row::{corrupted, digest_of, lifecycle_of, top_of, RunState, CLOCK};
use crate::db::Db;
use crate::keys::{self, KeyLock};

/// The query plan (`EXPLAIN`) of the first page `list_runs` would read
/// for `scope` and `options`: what an operator (or a test) checks for
/// index use.
pub(crate) async fn explain_list_runs(
    db: &Db,
    scope: &ListingScope,
    options: &ListOptions,
) -> Result<String> {
    let c = db.conn("explain list_runs").await?;
    let fixed = db.fixed_now(options.now);
    let query = ListQuery::new(scope, &options.judged_at(|| fixed.unwrap_or(db.now())))?;
    let mut listing = Listing::of(scope, &query);
    listing.now = fixed.map(Timestamp::as_millis);
    let after = After::of_cursor(query.after.as_ref());
    let fetch = i64::try_from(query.limit + 1).unwrap_or(i64::MAX);
    let (sql, params) = listing.sql_and_params(&after, fetch, false);
    explain(db, &c, &sql, &params).await
}

/// The query plan of `claim_next`'s candidate search for `scope` and
/// `filter` (its first, row-locking step).
pub(crate) async fn explain_claim_next(
    db: &Db,
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    analyze: bool,
) -> Result<String> {
    let c = db.conn("explain claim_next").await?;
    let listing = Listing {
        scope,
        order: filter.order,
        statuses: None,
        claimed: Some(false),
        parks: filter.park.is_some(),
        runnable: true,
        scan: false,
        min_priority: None,
        slack: db.head_slack.get(),
        per_key: false,
        now: db.fixed_now(None).map(Timestamp::as_millis),
    };
    let (sql, params) = listing.sql_and_params(&After::None, 1, true);
    if analyze {
        let sql = format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}");
        let rs = db
            .rows(&c, "explain analyze", &sql, &params_ref(&params))
            .await?;
        return Ok(rs
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n"));
    }
    explain(db, &c, &sql, &params).await
}

/// The listing's SQL: scope prefix, the filters SQL can judge exactly
/// (status, claimed, "has a park" as a prefilter), keyset continuation and
/// the order (the core's `RowKey`, then project and session).
pub(crate) struct Listing<'a> {
    pub(crate) scope: &'a ListingScope,
    pub(crate) order: ListOrder,
    pub(crate) statuses: Option<Vec<String>>,
    pub(crate) claimed: Option<bool>,
    pub(crate) parks: bool,
    /// `claim_next`'s candidates: active, available, not held, their key
    /// not at its limit, highest priority first.
    pub(crate) runnable: bool,
    /// With `runnable`: the scan of every runnable run in claim order
    /// (passing saturated keys' runs one by one) instead of the statement
    /// that reads the first run of each unsaturated key
    /// ([`Self::heads_sql`]); the fallback when every head is locked.
    pub(crate) scan: bool,
    /// Only runs of at least this priority.
    pub(crate) min_priority: Option<i32>,
    /// With `runnable` (and not `scan`): how many runs without a key past
    /// the `limit` first the candidate statement reads, so that its
    /// `SKIP LOCKED` passes the ones other claimers hold locked
    /// (`claims::HeadSlack`).
    pub(crate) slack: i64,
    /// With `runnable` (and not `scan`): a batch's statement, which reads
    /// up to `limit` runs of each unsaturated key (at most the key's
    /// limit) instead of its first one, so one statement can fill a
    /// batch from runs of few keys (`claims::NextSearch::many`).
    pub(crate) per_key: bool,
    /// The instant the filters use; `None`: the server's clock, read once
    /// by the statement (and answered in its last column).
    pub(crate) now: Option<i64>,
}

impl<'a> Listing<'a> {
    /// The listing a validated query asks for (not restricted to runnable
    /// runs): what `list_runs` and its `EXPLAIN` share.
    pub(crate) fn of(scope: &'a ListingScope, query: &ListQuery) -> Self {
        Listing {
            scope,
            order: query.order,
            statuses: query
                .status
                .as_ref()
                .map(|v| v.iter().map(|s| s.as_str().to_string()).collect()),
            claimed: query.claimed,
            parks: query.park.is_some(),
            runnable: false,
            scan: false,
            min_priority: query.min_priority.map(|p| p.get()),
            slack: 0,
            per_key: false,
            now: Some(query.now.as_millis()),
        }
    }
}

#[derive(Clone)]
pub(crate) enum After {
    None,
    /// The user's cursor: strictly after this `RowKey`.
    Cursor(RowKey),
    /// Our own continuation: strictly after this row (key, project, session).
    Row(RowKey, String, String),
}

impl After {
    /// Where a user's cursor continues: strictly after its key, and after
    /// its project and session too when it carries them (the core's
    /// tie-break between runs of one id in different sessions).
    pub(crate) fn of_cursor(key: Option<&RowKey>) -> Self {
        match key {
            None => After::None,
            Some(k) if k.has_tie() => After::Row(k.clone(), k.project.clone(), k.session.clone()),
            Some(k) => After::Cursor(k.clone()),
        }
    }
}

impl Listing<'_> {
    const COLS: &'static str = "project_id, session_id, run_id, parent_id, top_kind, top_fence, holder, expires_at, lifecycle, digest";
    /// The rest of the row's state, read with a candidate `claim_next`
    /// locks (what a claim writes back), and its concurrency key (read by
    /// [`Self::candidate_sql_and_params`]'s key lock, not answered).
    const STATE_COLS: &'static str =
        "last_seq, last_audit_seq, record IS NOT NULL AS has_record, messages IS NOT NULL AS has_messages, report IS NOT NULL AS has_report, ckey";
    /// The columns of a locking candidate statement: `COLS`,
    /// `STATE_COLS`, the instant.
    const LOCKED_WIDTH: usize = 17;

    /// The scope's condition on a table with the key columns (the tenant,
    /// and the project and session when the scope names them).
    fn scope_where(&self, params: &mut Vec<Box<dyn ToSql + Sync + Send>>) -> String {
        let mut push = |p: Box<dyn ToSql + Sync + Send>| {
            params.push(p);
            format!("${}", params.len())
        };
        let mut wh = vec![format!(
            "tenant_id = {}",
            push(Box::new(self.scope.tenant_id().to_string()))
        )];
        if let Some(p) = self.scope.project_id() {
            wh.push(format!("project_id = {}", push(Box::new(p.to_string()))));
        }
        if let Some(s) = self.scope.session_id() {
            wh.push(format!("session_id = {}", push(Box::new(s.to_string()))));
        }
        wh.join(" AND ")
    }

    /// The statement: `COLS` (then `STATE_COLS` when it locks), then the
    /// instant it judged at, in epoch ms (the last column: `now`, or the
    /// server's clock read once at its start).
    pub(crate) fn sql_and_params(
        &self,
        after: &After,
        limit: i64,
        lock: bool,
    ) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        let push = |p: Box<dyn ToSql + Sync + Send>,
                    params: &mut Vec<Box<dyn ToSql + Sync + Send>>| {
            params.push(p);
            format!("${}", params.len())
        };
        let clock = format!(
            "WITH clock AS (SELECT coalesce({}::bigint, {CLOCK}) AS now_ms) ",
            push(Box::new(self.now), &mut params)
        );
        let mut wh = vec![format!(
            "tenant_id = {}",
            push(Box::new(self.scope.tenant_id().to_string()), &mut params)
        )];
        if let Some(p) = self.scope.project_id() {
            wh.push(format!(
                "project_id = {}",
                push(Box::new(p.to_string()), &mut params)
            ));
        }
        if let Some(s) = self.scope.session_id() {
            wh.push(format!(
                "session_id = {}",
                push(Box::new(s.to_string()), &mut params)
            ));
        }
        wh.push("checkpoint_count > 0".into());
        let now = "(SELECT now_ms FROM clock)";
        if self.runnable {
            wh.push("status = 'active'".into());
            wh.push(format!("(available_at IS NULL OR available_at <= {now})"));
        }
        if let Some(st) = &self.statuses {
            wh.push(format!(
                "status = ANY({}::text[])",
                push(Box::new(st.clone()), &mut params)
            ));
        }
        // Held live ⇔ a lease whose expiry is after the instant (the core's
        // `is_expired`: the boundary counts as expired).
        match self.claimed {
            Some(true) => wh.push(format!("(top_kind = 1 AND expires_at > {now})")),
            Some(false) => wh.push(format!(
                "(top_kind IS DISTINCT FROM 1 OR expires_at <= {now})"
            )),
            None => {}
        }
        if self.parks {
            wh.push("park_count > 0".into());
        }
        if let Some(p) = self.min_priority {
            wh.push(format!(
                "priority >= {}::integer",
                push(Box::new(p), &mut params)
            ));
        }
        let mut clock = clock;
        if self.runnable {
            // Skip the runs of keys at their limit without reading them: the
            // open holdings live now, grouped by key (few: at most the runs
            // held), against each candidate's own limit. A prefilter: the
            // claim re-counts under the key's lock. A run past its deadline
            // stays a candidate: the core finishes it before it looks at
            // the key (`plan_claim`), as `MemoryStore`'s claim_next does.
            clock.push_str(&format!(
                ", held AS (SELECT project_id, session_id, ckey, count(*) AS n FROM key_holdings \
                 WHERE {} AND ended_at IS NULL AND expires_at > {now} GROUP BY project_id, session_id, ckey) ",
                self.scope_where(&mut params)
            ));
            wh.push(
                format!("(ckey IS NULL OR deadline <= {now} \
                 OR NOT EXISTS (SELECT 1 FROM held WHERE held.project_id = runs.project_id \
                 AND held.session_id = runs.session_id AND held.ckey = runs.ckey AND held.n >= runs.climit))"),
            );
        }
        // The priority comes first in the priority order and in claim_next
        // (the core's `RunRow::claim_key`): `(-priority)` ascending is the
        // highest first, as the indexes store it.
        let by_priority = self.runnable || self.order == ListOrder::Priority;
        let (base_cols, base_order) = match self.order {
            ListOrder::RunId | ListOrder::Priority => (
                "run_id, parent_id",
                "run_id, parent_id, project_id, session_id",
            ),
            ListOrder::CreatedAt => (
                "created_rank, created_stamp, run_id, parent_id",
                "created_rank, created_stamp, run_id, parent_id, project_id, session_id",
            ),
        };
        let (key_cols, order_by) = if by_priority {
            (
                format!("(-priority), {base_cols}"),
                format!("(-priority), {base_order}"),
            )
        } else {
            (base_cols.to_string(), base_order.to_string())
        };
        let key_vals = |k: &RowKey,
                        params: &mut Vec<Box<dyn ToSql + Sync + Send>>|
         -> Vec<String> {
            let mut v = Vec::new();
            if by_priority {
                let prio = i32::try_from(k.prio.clamp(i64::from(i32::MIN), i64::from(i32::MAX)))
                    .unwrap_or_default();
                v.push(format!("{}::integer", push(Box::new(prio), params)));
            }
            if self.order == ListOrder::CreatedAt {
                v.push(format!(
                    "{}::smallint",
                    push(Box::new(i16::from(k.rank)), params)
                ));
                v.push(format!("{}::bigint", push(Box::new(k.stamp), params)));
            }
            v.push(format!(
                "{}::text",
                push(Box::new(k.run_id.clone()), params)
            ));
            v.push(format!(
                "{}::text",
                push(Box::new(k.parent.clone()), params)
            ));
            v
        };
        match after {
            After::None => {}
            After::Cursor(k) => {
                let vals = key_vals(k, &mut params);
                wh.push(format!("({key_cols}) > ({})", vals.join(", ")));
            }
            After::Row(k, p, s) => {
                let mut vals = key_vals(k, &mut params);
                vals.push(format!("{}::text", push(Box::new(p.clone()), &mut params)));
                vals.push(format!("{}::text", push(Box::new(s.clone()), &mut params)));
                wh.push(format!("({order_by}) > ({})", vals.join(", ")));
            }
        }
        let limit = format!("{}::bigint", push(Box::new(limit), &mut params));
        if self.runnable && !self.scan {
            let slack = format!("{}::bigint", push(Box::new(self.slack), &mut params));
            let sql = self.heads_sql(&clock, &wh, &order_by, &limit, &slack, lock);
            return (sql, params);
        }
        let sql = format!(
            "{clock}SELECT {}{}, {now} AS now_ms FROM runs WHERE {} ORDER BY {order_by} LIMIT {limit}{}",
            Self::COLS,
            if lock {
                format!(", {}", Self::STATE_COLS)
            } else {
                String::new()
            },
            wh.join(" AND "),
            if lock {
                " FOR UPDATE OF runs SKIP LOCKED"
            } else {
                ""
            }
        );
        (sql, params)
    }
}

impl Listing<'_> {
    /// The column of a [`Self::candidate_sql_and_params`] row with the key
    /// lock's answer (`keys::candidate_locked`).
    pub(crate) const CANDIDATE_LOCK: usize = 15;

    /// `claim_next`'s candidate statement: [`Self::sql_and_params`] locking
    /// one row, or up to `limit` for a batch (or answering the row of NULLs
    /// when every head is locked),
    /// wrapped so that the picked row's concurrency key is locked in the
    /// same statement, after its row lock (`keys::candidate_lock_sql`;
    /// `lock` says how). Its columns: `COLS`, the first five of
    /// `STATE_COLS`, the key lock's answer ([`Self::CANDIDATE_LOCK`]), the
    /// candidate's name (set for `keys::count_candidate_stmt`), the
    /// instant (last, as every listing statement).
    pub(crate) fn candidate_sql_and_params(
        &self,
        after: &After,
        lock: KeyLock,
        schema: &str,
        limit: i64,
    ) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
        let (inner, mut params) = self.sql_and_params(after, limit, true);
        let (schema_p, tenant_p) = if lock == KeyLock::None {
            // Unused parameters would have no type.
            (String::new(), String::new())
        } else {
            params.push(Box::new(schema.to_string()));
            let s = format!("${}", params.len());
            params.push(Box::new(self.scope.tenant_id().to_string()));
            (s, format!("${}", params.len()))
        };
        let sql = format!(
            "WITH cand AS MATERIALIZED ({inner}) \
             SELECT {}, last_seq, last_audit_seq, has_record, has_messages, has_report, {}, now_ms FROM cand",
            Self::COLS,
            keys::candidate_lock_sql(lock, "cand", &schema_p, &tenant_p)
        );
        (sql, params)
    }

    /// `claim_next`'s candidate statement without reading the runs of
    /// saturated keys. `wh` holds every runnable filter (the scope, the
    /// keyset continuation, the per-row saturation prefilter); the first
    /// admissible run in claim order is the least of:
    ///
    /// - the first runs without a key (`runs_unkeyed_by_*`): `limit`, and
    ///   `slack` more, which the statement's `SKIP LOCKED` reaches when
    ///   other claimers hold the first ones locked;
    /// - for each group (session, key, limit) with runnable runs, found
    ///   by a skip scan of `runs_keyed_by_*` (one probe per group) and
    ///   dropped when the key's live holdings reach the limit, its first
    ///   run (a `LATERAL … LIMIT 1` on the same index);
    /// - the first keyed run past its deadline (`runs_keyed_deadline`: a
    ///   candidate whatever its key's count).
    ///
    /// Those heads (at most groups + 2 rows) are sorted and the first one
    /// another claimer does not hold locked is locked and returned. The
    /// cost grows with the number of groups, not with their runs.
    fn heads_sql(
        &self,
        clock: &str,
        wh: &[String],
        order_by: &str,
        limit: &str,
        slack: &str,
        lock: bool,
    ) -> String {
        let all = wh.join(" AND ");
        // The scope part of `wh` (tenant, and project/session when named)
        // is its leading conditions up to `checkpoint_count > 0`.
        let scope_len = wh
            .iter()
            .position(|c| c == "checkpoint_count > 0")
            .unwrap_or(1);
        let scope = wh[..scope_len].join(" AND ");
        let group_order = "project_id, session_id, ckey, climit";
        // The skip scan's step: strictly after the last group, compared
        // on the columns after those the scope fixes (a row comparison
        // whose first column is fixed by an equality would start the
        // index scan at the scope's first entry, not at the last group).
        let fixed = scope_len - 1;
        let group_cols = ["project_id", "session_id", "ckey", "climit"];
        let group_next = group_cols[fixed..].join(", ");
        let group_prev = group_cols[fixed..]
            .iter()
            .map(|c| format!("g.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let keyed_cols = "project_id, session_id, run_id, parent_id, created_rank, created_stamp, (-priority) AS prio, ctid AS tid";
        // The heads, renamed (the outer join reads `runs` unqualified), and
        // the claim order on them: the runs are read by primary key, in the
        // heads' order, not by a scan of an index in claim order.
        let head_cols = "project_id AS hp, session_id AS hs, run_id AS hr, parent_id AS hpa, created_rank AS hcr, created_stamp AS hcs, prio AS hprio, tid AS htid";
        // The keyed runs past their deadline are found by their own index
        // (`runs_keyed_deadline`) and sorted apart: with the claim order's
        // `ORDER BY … LIMIT 1` on `runs`, the planner could walk a session's
        // keyed runs in claim order instead, reading every one of them
        // when none is overdue (measured: 100 000 rows, 134 ms a call).
        let overdue_order = order_by
            .split(", ")
            .map(|c| if c == "(-priority)" { "prio" } else { c })
            .collect::<Vec<_>>()
            .join(", ");
        let head_order = order_by
            .split(", ")
            .map(|c| match c {
                "(-priority)" => "h.hprio",
                "project_id" => "h.hp",
                "session_id" => "h.hs",
                "run_id" => "h.hr",
                "parent_id" => "h.hpa",
                "created_rank" => "h.hcr",
                "created_stamp" => "h.hcs",
                other => other,
            })
            .collect::<Vec<_>>()
            .join(", ");
        let tenant = wh[0].trim_start_matches("tenant_id = ");
        let live = "checkpoint_count > 0 AND status = 'active'";
        let now = "(SELECT now_ms FROM clock)";
        let clock = clock.replacen("WITH ", "WITH RECURSIVE ", 1);
        // A run of each open key's group and one overdue run; a batch's
        // statement, as many as the batch asks for (of a group, at most
        // its key's limit).
        let (per_key, overdue) = if self.per_key {
            (format!("LEAST({limit}, g.climit)"), limit.to_string())
        } else {
            ("1".to_string(), "1".to_string())
        };
        format!(
            "{clock}, groups AS ( \
               (SELECT {group_order} FROM runs WHERE {scope} AND {live} AND ckey IS NOT NULL \
                ORDER BY {group_order} LIMIT 1) \
               UNION ALL \
               SELECT nx.* FROM groups g CROSS JOIN LATERAL \
                (SELECT {group_order} FROM runs WHERE {scope} AND {live} AND ckey IS NOT NULL \
                 AND ({group_next}) > ({group_prev}) \
                 ORDER BY {group_order} LIMIT 1) nx), \
             open_groups AS MATERIALIZED (SELECT g.* FROM groups g \
                WHERE NOT EXISTS (SELECT 1 FROM held WHERE held.project_id = g.project_id \
                 AND held.session_id = g.session_id AND held.ckey = g.ckey AND held.n >= g.climit)), \
             overdue AS MATERIALIZED (SELECT {keyed_cols} FROM runs WHERE {all} AND ckey IS NOT NULL \
                AND deadline IS NOT NULL AND deadline <= {now}), \
             heads AS ( \
               (SELECT {keyed_cols} FROM runs WHERE {all} AND ckey IS NULL ORDER BY {order_by} LIMIT {limit} + {slack}) \
               UNION ALL \
               (SELECT h.* FROM open_groups g CROSS JOIN LATERAL \
                (SELECT {keyed_cols} FROM runs WHERE {all} AND ckey IS NOT NULL \
                 AND project_id = g.project_id AND session_id = g.session_id \
                 AND ckey = g.ckey AND climit = g.climit ORDER BY {order_by} LIMIT {per_key}) h) \
               UNION ALL \
               (SELECT * FROM overdue ORDER BY {overdue_order} LIMIT {overdue})) \
             {}SELECT {}{}, {now} AS now_ms FROM (SELECT DISTINCT {head_cols} FROM heads) h \
             JOIN runs ON runs.ctid = h.htid AND tenant_id = {tenant} AND project_id = h.hp \
             AND session_id = h.hs AND run_id = h.hr AND parent_id = h.hpa WHERE {all} \
             ORDER BY {head_order} LIMIT {limit}{}",
            // Locking: a row of NULLs when every head is locked by
            // another claimer (`claims::NextSearch` then scans).
            if lock { ", picked AS (" } else { "" },
            Self::COLS,
            if lock {
                format!(", {}", Self::STATE_COLS)
            } else {
                String::new()
            },
            if lock {
                format!(
                    " FOR UPDATE OF runs SKIP LOCKED) SELECT * FROM picked UNION ALL \
                     SELECT {} WHERE NOT EXISTS (SELECT 1 FROM picked) AND EXISTS (SELECT 1 FROM heads)",
                    vec!["NULL"; Self::LOCKED_WIDTH].join(", ")
                )
            } else {
                String::new()
            }
        )
    }
}

/// A listing row from a `Listing::COLS` row, plus its scope and state.
pub(crate) fn listed_row(
    tenant: &runkeep::TenantId,
    r: &Row,
    now: Timestamp,
) -> Result<(RunScope, RunState, RunRow)> {
    let project: String = r.get(0);
    let session: String = r.get(1);
    let run: String = r.get(2);
    let parent: String = r.get(3);
    let mut scope = RunScope::new(
        tenant.clone(),
        project
            .parse()
            .map_err(|e| Error::corrupted(format!("a stored project id: {e}")))?,
        session
            .parse()
            .map_err(|e| Error::corrupted(format!("a stored session id: {e}")))?,
        run.parse()
            .map_err(|e| Error::corrupted(format!("a stored run id: {e}")))?,
    );
    if !parent.is_empty() {
        scope = scope.with_parent(
            parent
                .parse::<RunId>()
                .map_err(|e| Error::corrupted(format!("a stored parent id: {e}")))?,
        );
    }
    let top = top_of(&scope, r, 4);
    let lifecycle = lifecycle_of(&scope, r.get(8));
    let digest = digest_of(&scope, r.get(9));
    let built = (|| -> Result<(RunState, RunRow)> {
        let top = top?;
        let lifecycle = lifecycle?;
        let digest = digest?;
        let row = digest
            .as_ref()
            .and_then(|d| d.row(scope.clone(), top.as_ref(), now))
            .map(|row| row.with_lifecycle(&lifecycle))
            .ok_or_else(|| corrupted(&scope, "the digest", "listed without checkpoints"))?;
        Ok((
            RunState {
                top,
                lifecycle,
                digest,
                ..RunState::default()
            },
            row,
        ))
    })();
    match built {
        Ok((state, row)) => Ok((scope, state, row)),
        Err(e) => {
            let claim: Option<LeaseSummary> =
                top_of(&scope, r, 4).ok().flatten().map(|t| t.summary(now));
            let row = RunRow::damaged(scope.clone(), &e, claim);
            Ok((scope, RunState::default(), row))
        }
    }
}

/// The rest of a locked candidate's state (`Listing::STATE_COLS`, after
/// `Listing::COLS`).
pub(crate) fn fill_state(state: &mut RunState, r: &Row) {
    let last_seq: i64 = r.get(10);
    let last_audit: i64 = r.get(11);
    state.last_seq = u64::try_from(last_seq).unwrap_or(0);
    state.last_audit = u64::try_from(last_audit).unwrap_or(0);
    state.has_record = r.get(12);
    state.has_messages = r.get(13);
    state.has_report = r.get(14);
}

pub(crate) async fn explain(
    db: &Db,
    c: &deadpool_postgres::Object,
    sql: &str,
    params: &[Box<dyn ToSql + Sync + Send>],
) -> Result<String> {
    let rs = db
        .rows(c, "explain", &format!("EXPLAIN {sql}"), &params_ref(params))
        .await?;
    Ok(rs
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n"))
}

pub(crate) fn params_ref(p: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    p.iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

pub(crate) async fn list_runs(
    db: &Db,
    scope: &ListingScope,
    options: &ListOptions,
) -> Result<RunPage> {
    let c = db.conn("list_runs").await?;
    // The instant: the caller's (or the test clock's), else the
    // server's, read by the listing statement itself (one round trip).
    let fixed = db.fixed_now(options.now);
    let mut query = ListQuery::new(scope, &options.judged_at(|| fixed.unwrap_or(db.now())))?;
    let mut listing = Listing::of(scope, &query);
    listing.now = fixed.map(Timestamp::as_millis);
    let mut judged = fixed;
    let fetch = i64::try_from(query.limit + 1).unwrap_or(i64::MAX);
    let mut after = After::of_cursor(query.after.as_ref());
    let mut out: Vec<(RowKey, RunRow)> = Vec::new();
    loop {
        let (sql, params) = listing.sql_and_params(&after, fetch, false);
        let rs = db.rows(&c, "list runs", &sql, &params_ref(&params)).await?;
        let n = rs.len();
        for r in &rs {
            if judged.is_none() {
                let now = db.listed_now(r, fixed)?;
                query = ListQuery::new(scope, &options.judged_at(|| now))?;
                listing.now = Some(now.as_millis());
                judged = Some(now);
            }
            let (s, _, row) = listed_row(scope.tenant_id(), r, query.now)?;
            let k = row.key(query.order);
            after = After::Row(
                k.clone(),
                s.project_id.to_string(),
                s.session_id.to_string(),
            );
            if query.is_after_cursor(&k) && query.matches(&row) {
                out.push((k, row));
            }
            if out.len() > query.limit {
                break;
            }
        }
        if out.len() > query.limit || i64::try_from(n).unwrap_or(0) < fetch {
            break;
        }
    }
    Ok(query.page_from_sorted(out))
}
