//! The `store` and `leases` checks of a PostgreSQL store: its schema
//! version, whether autovacuum keeps its tables, and transactions holding
//! row locks too long.

use super::*;

/// PostgreSQL: the schema's recorded runkeep version against this
/// binary's. Missing (never migrated) and older fail with "run `runkeep
/// migrate`"; newer fails with "upgrade runkeep". Skipped on other backends.
pub(super) async fn schema_version(env: &Env) -> CliResult<Outcome> {
    let Some((_, target)) = env.store()?.postgres() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a PostgreSQL store: it has no schema version",
            env.address
        )));
    };
    let schema = &target.options.schema;
    let ours = runkeep_postgres::SCHEMA_VERSION;
    let found = runkeep_postgres::PgStore::schema_version(target.address.url(), &target.options)
        .await
        .map_err(|e| CliError::from(e).context("read the schema version"))?;
    Ok(match found {
        0 => Outcome::fail(format!(
            "schema {schema} holds no runkeep tables (never migrated)"
        ))
        .remedy("run `runkeep migrate` with the same --store (and --pg-schema); every other command refuses the schema until then"),
        v if v < ours => Outcome::fail(format!(
            "schema {schema} is at runkeep schema version {v}, older than {ours}"
        ))
        .remedy("run `runkeep migrate` to bring it to this binary's version"),
        v if v > ours => Outcome::fail(format!(
            "schema {schema} is at runkeep schema version {v}, newer than version {ours} this binary knows"
        ))
        .remedy("upgrade runkeep (a newer binary migrated it); this one refuses to read or write it"),
        v => Outcome::pass(format!(
            "schema {schema} is at runkeep schema version {v}, this binary's"
        )),
    })
}

/// What store.autovacuum reads: the server's `autovacuum` setting, whether
/// the schema's `runs` table opts out (`autovacuum_enabled = false`), and
/// its live and dead row versions.
const AUTOVACUUM_SQL: &str = "
SELECT current_setting('autovacuum')::boolean,
       NOT coalesce((SELECT split_part(o, '=', 2)::boolean
                       FROM unnest(c.reloptions) o
                      WHERE split_part(o, '=', 1) = 'autovacuum_enabled'), true),
       coalesce(s.n_live_tup, 0),
       coalesce(s.n_dead_tup, 0)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE n.nspname = $1 AND c.relname = 'runs'";

/// The rule of store.autovacuum. Every claim, step and finish writes a new
/// version of the run's row; without vacuum the dead ones pile up and
/// `claim_next`'s index scan walks them (measured: the drain at 1 worker
/// fell from 185 to 61 cycles/s as 323 000 accumulated). Names every
/// reason it is off (the server's setting and the table's), each with its
/// fix.
fn judge_autovacuum(
    schema: &str,
    server_on: bool,
    table_off: bool,
    live: i64,
    dead: i64,
) -> Outcome {
    let counts = format!("{live} live and {dead} dead row versions in {schema}.runs");
    let mut why = Vec::new();
    let mut fix = Vec::new();
    if !server_on {
        why.push("autovacuum is off on this PostgreSQL server".to_string());
        fix.push("turn it on: `ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();` (or VACUUM the schema's tables on a schedule)".to_string());
    }
    if table_off {
        why.push(format!("autovacuum is disabled on table {schema}.runs"));
        fix.push(format!(
            "`ALTER TABLE {schema}.runs RESET (autovacuum_enabled);`"
        ));
    }
    if why.is_empty() {
        return Outcome::pass(format!("autovacuum is on ({counts})"));
    }
    Outcome::warn(format!(
        "{} ({counts}): every claim, step and finish leaves a dead version of its run's row, and claim_next slows down as they pile up",
        why.join("; ")
    ))
    .remedy(fix.join("; "))
}

/// PostgreSQL: autovacuum keeps the store's `runs` table (server-wide and
/// for the table). Skipped on other backends.
pub(super) async fn autovacuum(env: &Env) -> CliResult<Outcome> {
    let Some((pg, target)) = env.store()?.postgres() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a PostgreSQL store: nothing to vacuum",
            env.address
        )));
    };
    let schema = &target.options.schema;
    let c = pg.pool().get().await.map_err(|e| {
        CliError::failed(format!(
            "no connection to read the autovacuum settings: {e}"
        ))
        .hint("see store.reachable and store.schema-version")
    })?;
    let rows = c
        .query(AUTOVACUUM_SQL, &[schema])
        .await
        .map_err(|e| CliError::failed(format!("read the autovacuum settings: {e}")))?;
    let Some(r) = rows.first() else {
        return Ok(Outcome::skipped(format!(
            "schema {schema} has no runs table (see store.schema-version)"
        )));
    };
    Ok(judge_autovacuum(
        schema,
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
    ))
}

/// The lock query of store.row-locks: every backend other than the
/// doctor's own holding a lock on one of the store's tables, with how
/// long its transaction has been open. Row locks (`SELECT … FOR UPDATE`,
/// `UPDATE`) show in `pg_locks` as `RowShareLock` / `RowExclusiveLock` on
/// the table, held until the transaction ends; a runkeep write holds them
/// for one short transaction, so an old one is a stuck or partitioned
/// client blocking the runs it locked (claimers skip them, writers wait up
/// to `lock_timeout`).
const ROW_LOCKS_SQL: &str = "
SELECT a.pid,
       coalesce(a.application_name, ''),
       coalesce(host(a.client_addr), 'local'),
       coalesce(a.state, ''),
       floor(extract(epoch FROM (clock_timestamp() - a.xact_start)) * 1000)::bigint,
       string_agg(DISTINCT c.relname || ' ' || l.mode || CASE WHEN l.granted THEN '' ELSE ' (waiting)' END, ', '),
       left(coalesce(a.query, ''), 120)
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE n.nspname = $1
   AND c.relname IN ('runs', 'checkpoints', 'events', 'audit')
   AND l.mode IN ('RowShareLock', 'RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
   AND a.pid <> pg_backend_pid()
   AND a.application_name IS DISTINCT FROM $2
   AND a.xact_start IS NOT NULL
   AND clock_timestamp() - a.xact_start >= make_interval(secs => $3::double precision)
 GROUP BY a.pid, a.application_name, a.client_addr, a.state, a.xact_start, a.query
 ORDER BY a.xact_start";

/// PostgreSQL: transactions that have held locks on the store's tables
/// for longer than `--lock-age` (all tenants: locks are the server's).
pub(super) async fn row_locks(env: &Env) -> CliResult<Outcome> {
    let Some((pg, target)) = env.store()?.postgres() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a PostgreSQL store: it takes no row locks",
            env.address
        )));
    };
    let schema = &target.options.schema;
    let c = pg.pool().get().await.map_err(|e| {
        CliError::failed(format!("no connection to read pg_locks: {e}"))
            .hint("see store.reachable and store.schema-version")
    })?;
    let me = crate::doctor::doctor_application_name();
    let age = env.lock_age.as_secs_f64();
    let rows = c
        .query(ROW_LOCKS_SQL, &[schema, &me, &age])
        .await
        .map_err(|e| CliError::failed(format!("read pg_locks and pg_stat_activity: {e}")))?;
    let after = crate::output::human_duration(env.lock_age);
    if rows.is_empty() {
        return Ok(Outcome::pass(format!(
            "no transaction has held locks on schema {schema}'s tables for longer than {after}"
        )));
    }
    let found: Vec<String> = rows
        .iter()
        .map(|r| {
            let pid: i32 = r.get(0);
            let app: String = r.get(1);
            let client: String = r.get(2);
            let state: String = r.get(3);
            let held_ms: i64 = r.get(4);
            let locks: String = r.get(5);
            let query: String = r.get(6);
            format!(
                "pid {pid} ({}{client}, {state}, transaction open {}: {locks}; last query: {})",
                if app.is_empty() {
                    String::new()
                } else {
                    format!("{app} from ")
                },
                crate::output::human_duration(std::time::Duration::from_millis(
                    u64::try_from(held_ms).unwrap_or(0)
                )),
                query.split_whitespace().collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    let first: i32 = rows[0].get(0);
    Ok(Outcome::warn(format!(
        "{} transaction(s) have held locks on schema {schema}'s tables for longer than {after}: {}",
        found.len(),
        env.list(found)
    ))
    .remedy(format!(
        "a client stopped mid-transaction (stuck or partitioned): the runs it locked are skipped by claim_next and their writers wait up to lock_timeout; runkeep's own connections end such a transaction after idle_in_transaction_session_timeout (60 s); end one now with `SELECT pg_terminate_backend({first})` (--lock-age sets the threshold)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autovacuum_off_on_the_server_or_the_table_is_a_warning() {
        let off = judge_autovacuum("runkeep", false, false, 10, 5);
        assert_eq!(off.status, Status::Warn);
        assert!(
            off.message.contains("off on this PostgreSQL server"),
            "{}",
            off.message
        );
        assert!(off
            .remediation
            .as_deref()
            .unwrap_or("")
            .contains("ALTER SYSTEM SET autovacuum = on"));
        let table = judge_autovacuum("runkeep", true, true, 10, 5);
        assert_eq!(table.status, Status::Warn);
        assert!(
            table.message.contains("disabled on table runkeep.runs"),
            "{}",
            table.message
        );
        assert!(table
            .remediation
            .as_deref()
            .unwrap_or("")
            .contains("RESET (autovacuum_enabled)"));
        let both = judge_autovacuum("runkeep", false, true, 10, 5);
        assert_eq!(both.status, Status::Warn);
        assert!(
            both.message.contains("off on this PostgreSQL server"),
            "{}",
            both.message
        );
        assert!(
            both.message.contains("disabled on table runkeep.runs"),
            "{}",
            both.message
        );
        let fixes = both.remediation.unwrap_or_default();
        assert!(
            fixes.contains("ALTER SYSTEM") && fixes.contains("RESET (autovacuum_enabled)"),
            "{fixes}"
        );
        let on = judge_autovacuum("runkeep", true, false, 10, 5);
        assert_eq!(on.status, Status::Pass);
        assert!(on.message.contains("10 live and 5 dead"), "{}", on.message);
    }
}
