//! The PostgreSQL backend's wiring (the only place that names
//! `runkeep_postgres`'s constructors): options, opening in each mode,
//! migrating, and the messages of a store that cannot be opened.

use std::sync::Arc;

use runkeep_postgres::{PgOptions, PgStore, SCHEMA_VERSION};

use super::{OpenMode, PgAddress, PgTarget, StoreAddress, StoreOptions, DEFAULT_PG_SCHEMA};
use crate::error::{CliError, CliResult};

/// The options a PostgreSQL store is opened with: the address's schema
/// (default [`DEFAULT_PG_SCHEMA`]), the pool, the watch's fallback poll
/// and the direct URL behind a pooler of `options`.
pub fn options(address: &PgAddress, options: &StoreOptions) -> PgOptions {
    let defaults = PgOptions::default();
    PgOptions {
        watch_fallback: options.pg_watch_fallback.unwrap_or(defaults.watch_fallback),
        schema: address.schema().unwrap_or(DEFAULT_PG_SCHEMA).to_string(),
        pool_size: options.pg_pool_size,
        direct_url: options.pg_direct_url.clone(),
        ..defaults
    }
}

/// `store postgres://…@host/db (schema S)`: how messages name it.
pub fn describe(address: &PgAddress, options: &PgOptions) -> String {
    format!(
        "store {} (schema {})",
        StoreAddress::Postgres(address.clone()),
        options.schema
    )
}

/// Maps a store error met while opening: bad URL or schema name 64,
/// unreachable 69, a newer or older schema 78.
pub fn open_error(address: &PgAddress, options: &PgOptions, e: runkeep::Error) -> CliError {
    let what = describe(address, options);
    match &e {
        runkeep::Error::Unsupported { message } if message.contains("pooler") => CliError::config(format!(
            "{what}: {}",
            CliError::from(e).message
        ))
        .hint("behind a transaction-mode pooler: --pg-direct-url straight to PostgreSQL, and the role's defaults the message names (docs/design/postgres.md, \"Behind a pooler\")"),
        runkeep::Error::Unsupported { .. } => CliError::config(format!(
            "{what}: {}",
            CliError::from(e).message
        ))
        .hint("run `runkeep migrate` with a runkeep at least as new as the one that migrated it, or point --store/--pg-schema at another schema"),
        runkeep::Error::Unavailable { .. } => CliError::from(e)
            .context(format!("cannot reach {what}"))
            .hint("check that the server runs and the URL's host, port, user and database (`runkeep doctor` shows what fails)"),
        runkeep::Error::InvalidInput { .. } => CliError::from(e)
            .context(&what)
            .hint("pass --store postgres://USER@HOST:PORT/DATABASE and a schema of a-z, 0-9 and _ (?schema=NAME or --pg-schema)"),
        _ => CliError::from(e).context(&what),
    }
}

/// The schema version check of [`OpenMode::Existing`] and
/// [`OpenMode::ReadOnly`]: missing or older is exit 78 with "run
/// `runkeep migrate`", newer is exit 78 with "upgrade".
pub async fn require_current(address: &PgAddress, options: &PgOptions) -> CliResult<i32> {
    let found = PgStore::schema_version(address.url(), options)
        .await
        .map_err(|e| open_error(address, options, e))?;
    let what = describe(address, options);
    match found {
        0 => Err(CliError::config(format!(
            "{what}: the schema holds no runkeep tables (never migrated)"
        ))
        .hint("run `runkeep migrate` once with the same --store (and --pg-schema) to create them; read commands never migrate")),
        v if v < SCHEMA_VERSION => Err(CliError::config(format!(
            "{what}: the schema is at runkeep schema version {v}, older than {SCHEMA_VERSION}"
        ))
        .hint("run `runkeep migrate` to bring it to this binary's version")),
        v if v > SCHEMA_VERSION => Err(CliError::config(format!(
            "{what}: the schema is at runkeep schema version {v}, newer than version {SCHEMA_VERSION} this binary knows"
        ))
        .hint("upgrade runkeep (a newer binary migrated it), or point --store/--pg-schema at another schema")),
        v => Ok(v),
    }
}

/// Opens a PostgreSQL store in `mode`.
pub(super) async fn open(
    address: &PgAddress,
    mode: OpenMode,
    store_options: &StoreOptions,
) -> CliResult<(Arc<PgStore>, Box<PgTarget>)> {
    let given = options(address, store_options);
    let (url, options) = match (mode, &given.direct_url) {
        // The server refuses every write of a read-only command: a session
        // setting, which a transaction-mode pooler cannot carry, so behind
        // one the command reads on the direct URL.
        (OpenMode::ReadOnly, Some(direct)) => (
            read_only_url(direct),
            PgOptions {
                direct_url: None,
                ..given.clone()
            },
        ),
        (OpenMode::ReadOnly, None) => (read_only_url(address.url()), given.clone()),
        _ => (address.url().to_string(), given.clone()),
    };
    let store = match mode {
        OpenMode::Create => PgStore::connect(&url, options.clone())
            .await
            .map_err(|e| open_error(address, &options, e))?,
        OpenMode::Existing | OpenMode::ReadOnly => {
            require_current(address, &given).await?;
            let store = PgStore::open_migrated(&url, options.clone())
                .map_err(|e| open_error(address, &options, e))?;
            if options.direct_url.is_some() {
                // Behind a pooler: refuse now a role without runkeep's
                // settings, not at the first write.
                store
                    .check_connection()
                    .await
                    .map_err(|e| open_error(address, &options, e))?;
            }
            store
        }
        OpenMode::Examine => PgStore::open_migrated(&url, options.clone())
            .map_err(|e| open_error(address, &options, e))?,
    };
    Ok((
        Arc::new(store),
        Box::new(PgTarget {
            address: address.clone(),
            options,
        }),
    ))
}

/// Applies the embedded migrations (`runkeep migrate`): the version now
/// applied.
pub async fn migrate(
    address: &PgAddress,
    store_options: &StoreOptions,
) -> CliResult<(i32, PgOptions)> {
    let options = options(address, store_options);
    let v = PgStore::migrate(address.url(), &options)
        .await
        .map_err(|e| open_error(address, &options, e))?;
    Ok((v, options))
}

/// `url` with `-c default_transaction_read_only=on` added to its
/// `options` parameter.
fn read_only_url(url: &str) -> String {
    const RO: &str = "-c%20default_transaction_read_only%3Don";
    match url.split_once('?') {
        None => format!("{url}?options={RO}"),
        Some((base, query)) => {
            let mut found = false;
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some(("options", v)) => {
                        found = true;
                        format!("options={v}%20{RO}")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            let mut q = pairs.join("&");
            if !found {
                q.push_str(&format!("&options={RO}"));
            }
            format!("{base}?{q}")
        }
    }
}
