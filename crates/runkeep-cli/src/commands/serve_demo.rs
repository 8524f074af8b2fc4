//! `runkeep serve --demo`: the console with something to look at, in one
//! command.
//!
//! Serves a fresh in-memory store seeded with the demo runs of
//! [`runkeep_demo`] (parked with readable requests,
//! claimed, stuck, queued, finished, dead-lettered; each with a
//! transcript) for `--tenant`, with three new tokens (operator, worker,
//! reader) in a token file in a temporary directory. It prints the
//! console's address and the tokens, then serves like `runkeep serve`
//! until SIGTERM or Ctrl-C. Nothing outlives the process: the store is in
//! memory and the token directory is removed at exit.
//!
//! With `RUNKEEP_DEMO_EXTRA_RUNS=N` it also enqueues N plain queued runs
//! (project `bulk`, session `load`): the console at scale.
//!
//! It refuses a `--store` or `--tokens` other than the defaults rather
//! than ignore them: demo data is never written into a real store (seed
//! one with `runkeep seed`).

use std::path::Path;
use std::sync::Arc;

use runkeep::{MemoryStore, RunStore};
use runkeep_server::auth::Role;
use runkeep_server::server::{self, ServerConfig};
use runkeep_server::tokens::TokenFile;
use serde_json::json;

use crate::commands::serve::{serve_error, serve_until_signal, ServeArgs};
use crate::commands::token::token_error;
use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json_line};
use crate::store::StoreAddress;

/// The environment variable asking for that many more queued runs (project
/// `bulk`, session `load`), to try the console at scale.
pub const EXTRA_RUNS_ENV: &str = "RUNKEEP_DEMO_EXTRA_RUNS";

/// The bulk runs [`EXTRA_RUNS_ENV`] asks for (0 when unset).
fn extra_runs() -> CliResult<usize> {
    match std::env::var(EXTRA_RUNS_ENV) {
        Err(_) => Ok(0),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n <= 1_000_000)
            .ok_or_else(|| {
                CliError::usage(format!(
                    "{EXTRA_RUNS_ENV}={v:?} is not a number of runs from 0 to 1000000"
                ))
            }),
    }
}

/// The default value of `--{id}` (of `runkeep serve` when `serve`).
fn default_of(id: &str, serve: bool) -> Option<String> {
    let mut command = <crate::cli::Cli as clap::CommandFactory>::command();
    let command = if serve {
        command.find_subcommand_mut("serve")?.clone()
    } else {
        command
    };
    let arg = command.get_arguments().find(|a| a.get_id() == id)?;
    arg.get_default_values()
        .first()
        .map(|v| v.to_string_lossy().into_owned())
}

/// Runs `runkeep serve --demo` with the checked `config`.
pub async fn run(ctx: &Ctx, args: &ServeArgs, mut config: ServerConfig) -> CliResult<Exit> {
    let default_store = default_of("store", false).and_then(|d| d.parse::<StoreAddress>().ok());
    let store_is_default = matches!(ctx.global.store, StoreAddress::Memory)
        || default_store.as_ref() == Some(&ctx.global.store);
    if !store_is_default {
        return Err(CliError::usage(format!(
            "--demo serves its own in-memory store and would not use --store {}",
            ctx.global.store
        ))
        .hint("drop --store (and RUNKEEP_STORE) for the demo, or write demo runs into that store with `runkeep seed` and serve it without --demo"));
    }
    if default_of("tokens", true).as_deref().map(Path::new) != Some(args.file.tokens.as_path()) {
        return Err(CliError::usage(format!(
            "--demo makes its own tokens in a temporary file and would not use --tokens {}",
            args.file.tokens.display()
        ))
        .hint("drop --tokens (and RUNKEEP_TOKENS) for the demo"));
    }

    let store = Arc::new(MemoryStore::new());
    let tenant = ctx.scope.tenant.clone();
    let runs = runkeep_demo::seed(store.as_ref(), &tenant)
        .await
        .map_err(|e| CliError::from(e).context("seed the demo runs"))?;

    let extra = extra_runs()?;
    if extra > 0 {
        runkeep_demo::seed_bulk(store.as_ref(), &tenant, extra)
            .await
            .map_err(|e| CliError::from(e).context("seed the bulk demo runs"))?;
    }

    let dir = tempfile::Builder::new()
        .prefix("runkeep-demo-")
        .tempdir()
        .map_err(|e| {
            CliError::failed(format!(
                "create a temporary directory for the demo's tokens: {e}"
            ))
        })?;
    config.tokens = dir.path().join("tokens.json");
    config.readiness_scope = runkeep_demo::scope(&tenant);
    let file = TokenFile::new(&config.tokens);
    let mut tokens = Vec::new();
    for role in [Role::Operator, Role::Worker, Role::Reader] {
        let created = file
            .create(&tenant, role, Some("runkeep serve --demo"))
            .map_err(token_error)?;
        tokens.push((role, created.secret().to_string()));
    }

    let store: Arc<dyn RunStore> = store;
    let state = server::state(&config, store).map_err(serve_error)?;
    let count = runs.len() + extra;
    let exit = serve_until_signal(ctx, config, state, "memory: (demo)", |address| {
        let console = format!("http://{address}/");
        if ctx.json() {
            let by_role: serde_json::Map<String, serde_json::Value> = tokens
                .iter()
                .map(|(role, secret)| (role.as_str().to_string(), json!(secret)))
                .collect();
            emit_json_line(&json!({
                "event": "demo",
                "console": console,
                "tenant": tenant.as_str(),
                "runs": count,
                "tokens": by_role,
            }))
        } else {
            let mut text = format!(
                "\nThe console: {console}\nDemo data: {count} runs in tenant {tenant} (projects {}), in memory: gone when this stops.\nSign in with one of these tokens (what the console offers follows the role):\n\n",
                runkeep_demo::PROJECTS
                    .iter()
                    .map(|(p, _)| *p)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for (role, secret) in &tokens {
                text.push_str(&format!("    {:<9} {secret}\n", role.as_str()));
            }
            text.push('\n');
            emit(&text)
        }
    })
    .await;
    drop(dir);
    exit
}
