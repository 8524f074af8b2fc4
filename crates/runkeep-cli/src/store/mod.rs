//! Store addresses and opening a store.
//!
//! Every command reaches its backend through [`open_store_as`], so a new
//! backend is one more arm here and no change to any command.
//!
//! - [`address`]: parsing and printing `--store` (and `--pg-schema`,
//!   `--token`); [`secrets`] keeps theirs out of every printed line ([`redact`]).
//! - [`options`]: [`StoreOptions`], what a command opens its store with
//!   (durability, the PostgreSQL pool, the HTTP request timeout), built
//!   from the command's [`PoolDemand`] and passed to every open.
//! - `fs`, [`pg`], [`http`]: opening each backend.
//! - [`opened`]: [`OpenedStore`] and what only its backend can do;
//!   `scratch`: the doctor's write probe.
//!
//! # Directory addresses
//!
//! - `root:PATH` (the default, `root:./runkeep-data`): a root of many
//!   tenants, `PATH/<tenant>/<project>/<session>/runs/`
//!   ([`runkeep_fs::FsRootStore`]). `--tenant`/`--project`/`--session` pick
//!   the directory, so two tenants can never see each other's runs, and a
//!   listing may cover a whole project or tenant.
//! - `fs:PATH`: one session's `runs/` directory ([`runkeep_fs::FsStore`]),
//!   exactly the reference's `baseDir`, for sharing a session with the
//!   reference implementation. The scope flags only label it.
//!
//! `fs:` keeps the meaning it always had (an address written for it still
//! opens the same directory, and a root given to it is refused by name);
//! the root is a new form rather than a new meaning of an old one, so no
//! existing address silently changes what it reads. Each refuses the
//! other's directory, saying which form to use.

use std::path::Path;
use std::sync::Arc;

use runkeep::MemoryStore;

use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;

pub mod address;
mod fs;
pub mod http;
pub mod opened;
pub mod options;
pub mod pg;
mod scratch;
pub mod secrets;

pub use address::{
    with_pg_schema, with_token, HttpAddress, PgAddress, StoreAddress, DEFAULT_PG_SCHEMA,
};
pub use opened::{Backend, Diagnosis, OpenedStore, PgTarget};
pub use options::{
    parse_pg_direct_url, parse_pg_pool_size, DurabilityArg, PoolDemand, StoreOptions,
};
pub use secrets::redact;

/// How a command opens its store.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OpenMode {
    /// The store must exist: a missing directory, or a PostgreSQL schema
    /// that was never migrated, is a configuration error (exit 78), so a
    /// typo in `--store` does not silently create an empty store.
    Existing,
    /// Commands that write new runs (`seed`, `soak`): a missing directory is
    /// created; a PostgreSQL schema is migrated.
    Create,
    /// Reading only: nothing is created, linked or removed, and any write
    /// is refused (a directory opened read-only; a PostgreSQL session with
    /// `default_transaction_read_only`). The commands that only read:
    /// `runs`, `show`, `checkpoints`, `events`.
    ReadOnly,
    /// The doctor: open whatever is there without judging it (a PostgreSQL
    /// schema that is missing or newer is a finding of its checks).
    Examine,
}

/// Opens the store at `address` for `scope` in `mode`, with `options`.
pub async fn open_store_as(
    address: &StoreAddress,
    scope: &ScopeParts,
    options: &StoreOptions,
    mode: OpenMode,
) -> CliResult<OpenedStore> {
    let durability = options.durability;
    match address {
        StoreAddress::Memory => Ok(OpenedStore {
            address: address.clone(),
            store: Arc::new(MemoryStore::new()),
            backend: Backend::Memory,
            durability,
            scope: scope.clone(),
        }),
        StoreAddress::Fs(path) => {
            check_directory(address, path, mode == OpenMode::Create)?;
            fs::refuse_session_dir(path)?;
            let store = Arc::new(fs::open(
                path,
                scope,
                durability,
                mode == OpenMode::ReadOnly,
            )?);
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::Fs(store),
                durability,
                scope: scope.clone(),
            })
        }
        StoreAddress::Root(path) => {
            check_directory(address, path, mode == OpenMode::Create)?;
            let store = Arc::new(fs::open_root(path, durability, mode == OpenMode::ReadOnly)?);
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::FsRoot(store),
                durability,
                scope: scope.clone(),
            })
        }
        StoreAddress::Http(h) => {
            let store = Arc::new(http::open(h, scope, options).await?);
            Ok(OpenedStore {
                address: address.clone(),
                store,
                backend: Backend::Http,
                durability,
                scope: scope.clone(),
            })
        }
        StoreAddress::Postgres(pg) => {
            let (store, target) = pg::open(pg, mode, options).await?;
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::Postgres(store, target),
                durability,
                scope: scope.clone(),
            })
        }
    }
}

/// Refuses a store directory this process may not list and enter (exit 78):
/// every read would fail with permission denied, one run at a time.
pub fn check_readable(address: &StoreAddress, path: &Path) -> CliResult<()> {
    use rustix::fs::{access, Access};
    match access(path, Access::READ_OK | Access::EXEC_OK) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::ACCESS || e == rustix::io::Errno::PERM => {
            Err(CliError::config(format!(
                "cannot read store {address}: permission denied (EACCES): this user (uid {}) may not list the directory",
                rustix::process::getuid().as_raw()
            ))
            .hint("run as the user that owns the store (the workers' user), or grant this user read and search permission on the directory (chmod/chgrp)"))
        }
        Err(e) => Err(CliError::config(format!(
            "cannot reach store {address}: {}",
            std::io::Error::from(e)
        ))),
    }
}

fn check_directory(address: &StoreAddress, path: &Path, create: bool) -> CliResult<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => check_readable(address, path),
        Ok(_) => Err(
            CliError::config(format!("store {address} is not a directory"))
                .hint("point --store (or RUNKEEP_STORE) at a directory"),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            std::fs::create_dir_all(path).map_err(|e| {
                CliError::config(format!(
                    "cannot create store directory {}: {e}",
                    path.display()
                ))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CliError::config(format!(
            "no store at {address}: the directory does not exist"
        ))
        .hint("check --store / RUNKEEP_STORE, or create a demo store with `runkeep seed`")),
        Err(e) => Err(CliError::config(format!(
            "cannot reach store {address}: {e}"
        ))),
    }
}
