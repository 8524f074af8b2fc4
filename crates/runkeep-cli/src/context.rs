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
    pub fn new(global: GlobalArgs) -> CliResult<Self> {
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
    pub fn store(&self) -> CliResult<OpenedStore> {
        open_store(
            &self.global.store,
            &self.scope,
            self.global.durability,
            false,
        )
    }

    /// Opens the configured store for reading only (nothing in it is
    /// created or changed; writes are refused).
    pub fn store_read_only(&self) -> CliResult<OpenedStore> {
        crate::store::open_store_read_only(&self.global.store, &self.scope, self.global.durability)
    }

    /// Opens the configured store, creating its directory if missing (for
    /// commands that write new runs).
    pub fn store_creating(&self) -> CliResult<OpenedStore> {
        open_store(
            &self.global.store,
            &self.scope,
            self.global.durability,
            true,
        )
    }

    /// The full scope of the run `arg` names.
    pub fn run_scope(&self, arg: &RunArg) -> CliResult<RunScope> {
        self.scope.run(&arg.run, arg.parent.as_ref())
    }
}
