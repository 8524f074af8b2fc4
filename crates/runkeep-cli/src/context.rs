//! What every command gets: the global options, the validated scope, and a
//! way to open the store.

use runkeep::RunScope;

use crate::cli::{GlobalArgs, RunArg};
use crate::error::CliResult;
use crate::output::Style;
use crate::scope::ScopeParts;
use crate::store::{open_store_as, OpenMode, OpenedStore, PoolDemand, StoreOptions};

/// The command's context.
#[derive(Debug)]
pub struct Ctx {
    /// Global options.
    pub global: GlobalArgs,
    /// The scope from flags or environment.
    pub scope: ScopeParts,
    /// Style of stdout.
    pub style: Style,
}

impl Ctx {
    /// Validates the global options.
    pub fn new(mut global: GlobalArgs) -> CliResult<Self> {
        global.store = crate::store::with_pg_schema(&global.store, global.pg_schema.as_deref())?;
        global.store = crate::store::with_token(&global.store, global.token.as_deref());
        let scope = ScopeParts::parse(&global.tenant, &global.project, &global.session)?;
        Ok(Self {
            global,
            scope,
            style: Style::stdout(),
        })
    }

    /// True with `--json`.
    pub fn json(&self) -> bool {
        self.global.json
    }

    /// The options a command with `demand` opens its store with:
    /// `--durability`, and `--pg-pool-size` (or `RUNKEEP_PG_POOL_SIZE`)
    /// when given, else the demand's pool; `--pg-direct-url`.
    pub fn store_options(&self, demand: PoolDemand) -> StoreOptions {
        StoreOptions {
            pg_direct_url: self.global.pg_direct_url.clone(),
            ..StoreOptions::new(self.global.durability, self.global.pg_pool_size, demand)
        }
    }

    /// Opens the configured store in `mode` with `options`.
    pub async fn open(&self, mode: OpenMode, options: &StoreOptions) -> CliResult<OpenedStore> {
        open_store_as(&self.global.store, &self.scope, options, mode).await
    }

    /// Opens the configured store with a command's options; a missing
    /// directory is an error.
    pub async fn store(&self) -> CliResult<OpenedStore> {
        self.open(OpenMode::Existing, &self.store_options(PoolDemand::Command))
            .await
    }

    /// Opens the configured store for reading only (nothing in it is
    /// created or changed; writes are refused).
    pub async fn store_read_only(&self) -> CliResult<OpenedStore> {
        self.open(OpenMode::ReadOnly, &self.store_options(PoolDemand::Command))
            .await
    }

    /// Opens the configured store, creating its directory if missing (for
    /// commands that write new runs).
    pub async fn store_creating(&self) -> CliResult<OpenedStore> {
        self.open(OpenMode::Create, &self.store_options(PoolDemand::Command))
            .await
    }

    /// The full scope of the run `arg` names.
    pub fn run_scope(&self, arg: &RunArg) -> CliResult<RunScope> {
        self.scope.run(&arg.run, arg.parent.as_ref())
    }
}
