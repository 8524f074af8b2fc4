//! The `store` and `leases` checks of a PostgreSQL store: its schema
//! version, whether autovacuum keeps its tables, whether its commits wait
//! for a synchronous standby, and transactions holding row locks too long.

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

/// What store.replication reads on the store's own connection (so
/// `synchronous_commit` is the value the store's role and database give
/// it): the setting, where it comes from, `synchronous_standby_names`,
/// and one row per standby streaming from this server (none: the query
/// answers one row of NULLs for the standby columns).
const REPLICATION_SQL: &str = "
SELECT current_setting('synchronous_commit'),
       (SELECT source FROM pg_settings WHERE name = 'synchronous_commit'),
       current_setting('synchronous_standby_names'),
       current_user::text,
       current_database()::text,
       r.application_name,
       r.sync_state
  FROM (SELECT 1) one
  LEFT JOIN pg_stat_replication r ON true";

/// One standby in `pg_stat_replication`: its `application_name` and
/// `sync_state` (`None`: hidden from this role, which lacks
/// `pg_read_all_stats`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Standby {
    name: String,
    sync_state: Option<String>,
}

/// What store.replication found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Replication {
    synchronous_commit: String,
    /// `pg_settings.source` of it: `default`, `configuration file`,
    /// `database`, `user`, `database user`, …
    source: String,
    standby_names: String,
    role: String,
    database: String,
    standbys: Vec<Standby>,
}

/// The docs page every replication warning points to.
const DEPLOYING: &str = "docs/design/deploying-postgres.md";

/// The rule of store.replication. A fencing store must not acknowledge a
/// claim or a step that a failover can lose: after one, the promoted
/// standby may not know a claim a worker already holds (and hands the
/// same fence to a second worker) and steps the workers were told are
/// stored are gone. So: every standby synchronous (`sync` or `quorum`),
/// and `synchronous_commit` at least `on` for the store's connections.
fn judge_replication(r: &Replication) -> Outcome {
    let mut why = Vec::new();
    let mut fix = Vec::new();
    let hidden: Vec<&str> = r
        .standbys
        .iter()
        .filter(|s| s.sync_state.is_none())
        .map(|s| s.name.as_str())
        .collect();
    let not_sync: Vec<String> = r
        .standbys
        .iter()
        .filter_map(|s| match s.sync_state.as_deref() {
            Some("sync" | "quorum") | None => None,
            Some(state) => Some(format!("{} ({state})", s.name)),
        })
        .collect();
    if !not_sync.is_empty() {
        why.push(format!(
            "{} of {} standby(s) replicate asynchronously: {}; a commit is acknowledged before they have it, so after a failover to one of them a claim a worker holds may be unknown there (the same fence handed to a second worker) and acknowledged steps are gone",
            not_sync.len(),
            r.standbys.len(),
            not_sync.join(", ")
        ));
        fix.push(format!(
            "make every standby that may be promoted synchronous (`ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (name, …)'` or `'ANY 1 (…)'`; `SELECT pg_reload_conf();`, set once the standbys stream), and promote only a synchronous one (now: synchronous_standby_names = '{}')",
            r.standby_names
        ));
    }
    let weak = matches!(
        r.synchronous_commit.as_str(),
        "off" | "local" | "remote_write"
    );
    if weak {
        let risk = if r.standbys.is_empty() {
            "commits are acknowledged before they are durable, so a crash of this server loses acknowledged claims and steps"
        } else {
            "commits are acknowledged before the synchronous standby has them durably, so a failover can lose acknowledged claims (the same fence to two workers) and steps"
        };
        why.push(format!(
            "synchronous_commit is {} for the store's connections (role {}, database {}; set by: {}): {risk}",
            r.synchronous_commit, r.role, r.database, r.source
        ));
        fix.push(match r.source.as_str() {
            "user" => format!("`ALTER ROLE \"{}\" RESET synchronous_commit;`", r.role),
            "database" => format!(
                "`ALTER DATABASE \"{}\" RESET synchronous_commit;`",
                r.database
            ),
            "database user" => format!(
                "`ALTER ROLE \"{}\" IN DATABASE \"{}\" RESET synchronous_commit;`",
                r.role, r.database
            ),
            _ => "`ALTER SYSTEM SET synchronous_commit = on; SELECT pg_reload_conf();` (or remove it from the configuration file or the connection options)".to_string(),
        });
    }
    if !why.is_empty() {
        return Outcome::warn(why.join("; "))
            .remedy(format!("{} (see {DEPLOYING})", fix.join("; ")));
    }
    if !hidden.is_empty() {
        return Outcome::inconclusive(format!(
            "{} standby(s) stream from this server but role {} cannot see whether they are synchronous (pg_stat_replication.sync_state is hidden from it)",
            hidden.len(),
            r.role
        ))
        .remedy(format!(
            "run the doctor as a role with pg_read_all_stats (`GRANT pg_read_all_stats TO \"{}\";`)",
            r.role
        ));
    }
    if r.standbys.is_empty() {
        return Outcome::pass(format!(
            "no standby streams from this server (nothing to fail over to; a crash waits for this server's restart); synchronous_commit is {}",
            r.synchronous_commit
        ));
    }
    let names: Vec<&str> = r.standbys.iter().map(|s| s.name.as_str()).collect();
    Outcome::pass(format!(
        "every standby is synchronous ({}) and synchronous_commit is {}: a failover to one of them loses no acknowledged commit",
        names.join(", "),
        r.synchronous_commit
    ))
}

/// PostgreSQL: the store's commits wait for every standby a failover may
/// promote. Skipped on other backends.
pub(super) async fn replication(env: &Env) -> CliResult<Outcome> {
    let Some((pg, _)) = env.store()?.postgres() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a PostgreSQL store: it has no standbys",
            env.address
        )));
    };
    let c = pg.pool().get().await.map_err(|e| {
        CliError::failed(format!("no connection to read the replication state: {e}"))
            .hint("see store.reachable")
    })?;
    let rows = c.query(REPLICATION_SQL, &[]).await.map_err(|e| {
        CliError::failed(format!(
            "read pg_stat_replication and synchronous_commit: {e}"
        ))
    })?;
    let Some(first) = rows.first() else {
        return Err(CliError::failed("the replication query answered no row"));
    };
    let found = Replication {
        synchronous_commit: first.get(0),
        source: first.get::<_, Option<String>>(1).unwrap_or_default(),
        standby_names: first.get(2),
        role: first.get(3),
        database: first.get(4),
        standbys: rows
            .iter()
            .filter_map(|r| {
                let name: Option<String> = r.get(5);
                let state: Option<String> = r.get(6);
                // A row of NULLs: no standby; a NULL name with a state
                // cannot happen, a name hidden with its state is kept.
                match (name, state) {
                    (None, None) => None,
                    (name, sync_state) => Some(Standby {
                        name: name.unwrap_or_else(|| "(hidden)".into()),
                        sync_state,
                    }),
                }
            })
            .collect(),
    };
    Ok(judge_replication(&found))
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

    fn replication(commit: &str, source: &str, standbys: &[(&str, Option<&str>)]) -> Replication {
        Replication {
            synchronous_commit: commit.into(),
            source: source.into(),
            standby_names: "standby1".into(),
            role: "rk".into(),
            database: "app".into(),
            standbys: standbys
                .iter()
                .map(|(n, s)| Standby {
                    name: (*n).into(),
                    sync_state: s.map(str::to_string),
                })
                .collect(),
        }
    }

    #[test]
    fn an_asynchronous_standby_is_a_warning_naming_the_fence_risk_and_the_fix() {
        let o = judge_replication(&replication(
            "on",
            "default",
            &[
                ("a", Some("sync")),
                ("b", Some("async")),
                ("c", Some("potential")),
            ],
        ));
        assert_eq!(o.status, Status::Warn);
        assert!(o.message.contains("2 of 3 standby(s)"), "{}", o.message);
        assert!(
            o.message.contains("b (async), c (potential)"),
            "{}",
            o.message
        );
        assert!(o.message.contains("same fence"), "{}", o.message);
        let fix = o.remediation.unwrap_or_default();
        assert!(fix.contains("synchronous_standby_names"), "{fix}");
    }

    #[test]
    fn synchronous_commit_below_on_is_a_warning_with_the_fix_for_where_it_is_set() {
        for (source, fix) in [
            ("user", "ALTER ROLE \"rk\" RESET"),
            ("database", "ALTER DATABASE \"app\" RESET"),
            (
                "database user",
                "ALTER ROLE \"rk\" IN DATABASE \"app\" RESET",
            ),
            (
                "configuration file",
                "ALTER SYSTEM SET synchronous_commit = on",
            ),
        ] {
            let o = judge_replication(&replication("local", source, &[("a", Some("sync"))]));
            assert_eq!(o.status, Status::Warn, "{source}");
            assert!(
                o.message.contains("synchronous_commit is local"),
                "{}",
                o.message
            );
            assert!(o.remediation.unwrap_or_default().contains(fix), "{source}");
        }
        let o = judge_replication(&replication("remote_write", "user", &[]));
        assert_eq!(o.status, Status::Warn);
        assert!(o.message.contains("crash of this server"), "{}", o.message);
    }

    #[test]
    fn synchronous_standbys_or_none_pass_and_say_which() {
        let sync = judge_replication(&replication(
            "on",
            "default",
            &[("a", Some("sync")), ("b", Some("quorum"))],
        ));
        assert_eq!(sync.status, Status::Pass, "{}", sync.message);
        assert!(sync.message.contains("every standby is synchronous (a, b)"));
        let apply = judge_replication(&replication(
            "remote_apply",
            "default",
            &[("a", Some("sync"))],
        ));
        assert_eq!(apply.status, Status::Pass, "{}", apply.message);
        let none = judge_replication(&replication("on", "default", &[]));
        assert_eq!(none.status, Status::Pass);
        assert!(
            none.message.contains("no standby streams"),
            "{}",
            none.message
        );
        assert!(!none.message.contains("asynchronous"), "{}", none.message);
    }

    #[test]
    fn a_standby_whose_state_is_hidden_from_the_role_is_not_a_pass() {
        let o = judge_replication(&replication("on", "default", &[("a", None)]));
        assert_eq!(o.status, Status::Inconclusive);
        assert!(o
            .remediation
            .unwrap_or_default()
            .contains("pg_read_all_stats"));
    }

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
