//! Behind a transaction-mode pooler ([`PgOptions::direct_url`]): a pooled
//! connection is a different server session from one transaction to the
//! next, so nothing may outlive a transaction on it.
//!
//! - Statements go unnamed: tokio-postgres's `query_typed` parses, binds and
//!   executes the unnamed statement in one request (no `Describe` round
//!   trip), given the parameter types. Those are described once per SQL
//!   text on a session of the store's own, straight to PostgreSQL, and kept
//!   for the process (the same text has the same types on every session).
//!   A named statement prepared through the pooler would stay on whichever
//!   server session parsed it, and the next transaction would find it
//!   missing, or another client's of the same name.
//! - Settings come from the role: a pooler refuses the `options` startup
//!   parameter, and a session-level `SET` would leak to whichever client
//!   gets the server session next. So each new pooled connection checks the
//!   role's defaults ([`check_session`]) and refuses, saying which
//!   `ALTER ROLE` statements to run, when they differ from the options.
//! - `LISTEN`, the coalescing `NOTIFY` task, the migration and the version
//!   check connect directly (module `connect`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::NoTls;

use runkeep::{Error, Result};

use crate::error::map_pg;
use crate::options::PgOptions;
use crate::schema::{self, SCHEMA_VERSION};

/// What the store keeps to run statements unnamed through a pooler.
pub(crate) struct Pooled {
    /// PostgreSQL directly (with the store's session settings).
    direct: tokio_postgres::Config,
    /// The direct session statements are described on (opened on first
    /// need, again after a fault).
    describer: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    /// Parameter types by SQL text.
    types: Mutex<HashMap<String, Arc<[Type]>>>,
    reply_timeout: Duration,
}

impl Pooled {
    pub(crate) fn new(direct: tokio_postgres::Config, reply_timeout: Duration) -> Self {
        Self {
            direct,
            describer: tokio::sync::Mutex::new(None),
            types: Mutex::new(HashMap::new()),
            reply_timeout,
        }
    }

    fn cached(&self, sql: &str) -> Option<Arc<[Type]>> {
        self.types
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sql)
            .cloned()
    }

    /// The parameter types of each of `sqls`; the ones not known yet are
    /// described on the direct session (one round trip each, once per
    /// process). On an error, the index of the statement that failed.
    pub(crate) async fn types(
        &self,
        sqls: &[&str],
    ) -> std::result::Result<Vec<Arc<[Type]>>, (usize, Error)> {
        let mut out = Vec::with_capacity(sqls.len());
        for (i, sql) in sqls.iter().enumerate() {
            let t = match self.cached(sql) {
                Some(t) => t,
                None => self.describe(sql).await.map_err(|e| (i, e))?,
            };
            out.push(t);
        }
        Ok(out)
    }

    async fn describe(&self, sql: &str) -> Result<Arc<[Type]>> {
        let mut guard = self.describer.lock().await;
        if guard.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            let (client, conn) =
                tokio::time::timeout(self.reply_timeout, self.direct.connect(NoTls))
                    .await
                    .map_err(|_| no_reply("connect directly (to describe a statement)"))?
                    .map_err(|e| map_pg("connect directly (to describe a statement)", e))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "runkeep-postgres: the describing connection ended");
                }
            });
            *guard = Some(client);
        }
        let client = guard.as_ref().expect("opened above");
        let described = match tokio::time::timeout(self.reply_timeout, client.prepare(sql)).await {
            Ok(Ok(st)) => st,
            Ok(Err(e)) => {
                if e.code().is_none() {
                    *guard = None;
                }
                return Err(map_pg("describe a statement", e));
            }
            Err(_) => {
                *guard = None;
                return Err(no_reply("describe a statement"));
            }
        };
        let types: Arc<[Type]> = described.params().into();
        // The statement (named, on the direct session) is closed when
        // `described` drops.
        self.types
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sql.to_string(), types.clone());
        Ok(types)
    }
}

fn no_reply(what: &str) -> Error {
    Error::Unavailable {
        message: format!("PostgreSQL: {what}: no reply (PgOptions::reply_timeout); retry"),
        source: None,
        outcome_unknown: false,
    }
}

/// The settings a pooled session must have (`name`, value in ms or the
/// schema), as `ALTER ROLE … SET` takes them.
fn wanted(options: &PgOptions) -> [(&'static str, String); 4] {
    let ms = |d: Duration| d.as_millis().max(1).to_string();
    [
        ("search_path", options.schema.clone()),
        ("statement_timeout", ms(options.statement_timeout)),
        ("lock_timeout", ms(options.lock_timeout)),
        (
            "idle_in_transaction_session_timeout",
            ms(options.idle_in_transaction_timeout),
        ),
    ]
}

const SESSION_SQL: &str =
    "SELECT current_schema()::text, current_user::text, current_database()::text, \
     (SELECT setting FROM pg_settings WHERE name = 'statement_timeout'), \
     (SELECT setting FROM pg_settings WHERE name = 'lock_timeout'), \
     (SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'), \
     to_regclass($1) IS NOT NULL";

/// The statements that give `role`'s sessions in `database` the settings
/// a store with `options` needs behind a transaction-mode pooler (run them
/// on PostgreSQL as a superuser or the role itself; sessions opened after
/// them have the settings).
pub fn role_settings(options: &PgOptions, role: &str, database: &str) -> Vec<String> {
    wanted(options)
        .iter()
        .map(|(name, want)| {
            let value = if *name == "search_path" {
                quoted(want)
            } else {
                want.clone()
            };
            format!(
                "ALTER ROLE {} IN DATABASE {} SET {name} = {value};",
                quoted(role),
                quoted(database)
            )
        })
        .collect()
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Checks a new pooled connection: the role's defaults give runkeep's
/// settings, and the schema is migrated to this version. Unnamed
/// statements only. The refusal names the `ALTER ROLE` statements to run.
pub(crate) async fn check_session(c: &tokio_postgres::Client, options: &PgOptions) -> Result<()> {
    let table = format!("{}.runkeep_schema", schema::ident(&options.schema));
    let row = c
        .query_typed(SESSION_SQL, &[(&table, Type::TEXT)])
        .await
        .map_err(|e| map_pg("read a pooled session's settings", e))?
        .into_iter()
        .next()
        .ok_or_else(|| Error::corrupted("the session settings query answered no row"))?;
    let found_schema: Option<String> = row.get(0);
    let user: String = row.get(1);
    let database: String = row.get(2);
    let found = [
        found_schema.unwrap_or_default(),
        row.get::<_, Option<String>>(3).unwrap_or_default(),
        row.get::<_, Option<String>>(4).unwrap_or_default(),
        row.get::<_, Option<String>>(5).unwrap_or_default(),
    ];
    let exists: bool = row.get(6);
    let differ: Vec<String> = wanted(options)
        .iter()
        .zip(&found)
        .filter(|((_, want), got)| want != *got)
        .map(|((name, want), got)| format!("{name} is {got:?}, not {want:?}"))
        .collect();
    if !differ.is_empty() {
        let alter = role_settings(options, &user, &database).join(" ");
        return Err(Error::Unsupported {
            message: format!(
                "PostgreSQL through a pooler (PgOptions::direct_url is set): a pooled session lacks runkeep's settings ({}); a transaction-mode pooler cannot pass them at connect, so they must be the role's defaults: run on PostgreSQL (then reconnect the pooler's server sessions, e.g. pgbouncer's RECONNECT): {alter}",
                differ.join(", ")
            ),
        });
    }
    let version = if exists {
        let sql = format!("SELECT coalesce(max(version), 0) FROM {}", table);
        c.query_typed(&sql, &[])
            .await
            .map_err(|e| map_pg("read the schema version", e))?
            .first()
            .map_or(0, |r| r.get::<_, i32>(0))
    } else {
        0
    };
    schema::refuse_newer(&options.schema, version)?;
    if version < SCHEMA_VERSION {
        return Err(Error::Unsupported {
            message: format!(
                "PostgreSQL schema {:?} is at runkeep schema version {version}, older than {SCHEMA_VERSION}; run `runkeep migrate` (or PgStore::connect) first",
                options.schema
            ),
        });
    }
    Ok(())
}

/// The refusal for a URL whose server refused runkeep's session settings
/// at connect: a pooler, reached without [`PgOptions::direct_url`].
pub(crate) fn refused_options(what: &str, e: &tokio_postgres::Error) -> Option<Error> {
    let db = e.as_db_error()?;
    if !db.message().contains("unsupported startup parameter") {
        return None;
    }
    Some(Error::Unsupported {
        message: format!(
            "PostgreSQL: {what}: the server refused runkeep's session settings at connect ({}): the URL names a connection pooler (pgbouncer?); keep that URL and set PgOptions::direct_url (runkeep: --pg-direct-url) to a URL straight to PostgreSQL, whose role carries runkeep's settings (docs/design/postgres.md, \"Behind a pooler\"), or point the store at PostgreSQL itself",
            db.message()
        ),
    })
}
