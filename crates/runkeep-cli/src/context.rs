//! What every command gets: the global options, the validated scope, and a
//! way to open the store.

use runkeep::RunScope;

use crate::cli::{GlobalArgs, RunArg};
use crate::error::CliResult;
use crate::output::Style;
use crate::scope::ScopeParts;
use crate::store::{open_store, OpenedStore};

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
        crate::store::set_pg_pool_size(global.pg_pool_size);
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

    /// Opens the configured store; a missing directory is an error.
    pub async fn store(&self) -> CliResult<OpenedStore> {
        open_store(
            &self.global.store,
            &self.scope,
            self.global.durability,
            false,
        )
        .await
    }

    /// Opens the configured store for reading only (nothing in it is
    /// created or changed; writes are refused).
    pub async fn store_read_only(&self) -> CliResult<OpenedStore> {
        crate::store::open_store_read_only(&self.global.store, &self.scope, self.global.durability)
            .await
    }

    /// Opens the configured store, creating its directory if missing (for
    /// commands that write new runs).
    pub async fn store_creating(&self) -> CliResult<OpenedStore> {
        open_store(
            &self.global.store,
            &self.scope,
            self.global.durability,
            true,
        )
        .await
    }

    /// The full scope of the run `arg` names.
    pub fn run_scope(&self, arg: &RunArg) -> CliResult<RunScope> {
        self.scope.run(&arg.run, arg.parent.as_ref())
    }
}
