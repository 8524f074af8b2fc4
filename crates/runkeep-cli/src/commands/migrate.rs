//! `runkeep migrate`: creates or upgrades a PostgreSQL store's tables.
//!
//! The embedded migrations are applied in one transaction under an advisory
//! lock (two `migrate`s at once are safe: the second finds the work done);
//! running it again changes nothing. Read commands never migrate: they refuse
//! a schema that is missing, older or newer (exit 78) and say to run this.

use clap::Args;
use serde_json::json;

use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json};
use crate::store::{pg, PoolDemand, StoreAddress};

/// `runkeep migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {}

/// Applies the migrations and prints the version.
pub async fn run(ctx: &Ctx, _args: MigrateArgs) -> CliResult<Exit> {
    let StoreAddress::Postgres(address) = &ctx.global.store else {
        return Err(CliError::usage(format!(
            "`runkeep migrate` applies to a PostgreSQL store, not {}",
            ctx.global.store
        ))
        .hint("pass --store postgres://USER@HOST:PORT/DATABASE (a directory store needs no migration)"));
    };
    let store_options = ctx.store_options(PoolDemand::Command);
    let pg_options = pg::options(address, &store_options);
    let before = runkeep_postgres::PgStore::schema_version(address.url(), &pg_options)
        .await
        .map_err(|e| pg::open_error(address, &pg_options, e))?;
    let (version, options) = pg::migrate(address, &store_options).await?;
    let store = ctx.global.store.to_string();
    if ctx.json() {
        emit_json(&json!({
            "store": store,
            "schema": options.schema,
            "from": before,
            "version": version,
            "changed": before != version,
        }))?;
        return Ok(Exit::Ok);
    }
    let what = if before == version {
        format!("already at runkeep schema version {version}; nothing to do")
    } else if before == 0 {
        format!("created the tables: runkeep schema version {version}")
    } else {
        format!("migrated from runkeep schema version {before} to {version}")
    };
    emit(&format!("{store} schema {}: {what}\n", options.schema))?;
    Ok(Exit::Ok)
}
