//! `runkeep claim` and `runkeep release`.

use clap::Args;
use runkeep::{ClaimOptions, ClaimOutcome, Fence, Holder, Timestamp, Ttl};
use serde_json::json;

use crate::cli::{parse_id, RunArg};
use crate::commands::{lease_cell, read_error, require_run, run_exists, unknown_run};
use crate::context::Ctx;
use crate::duration::parse_ttl;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, relative, when};

/// `runkeep claim`.
#[derive(Args, Debug)]
pub struct ClaimArgs {
    #[command(flatten)]
    run: RunArg,
    /// Who holds the lease; the same holder renews, anyone else waits for expiry
    /// (default: a name unique to this invocation).
    #[arg(long, value_parser = parse_holder)]
    holder: Option<Holder>,
    /// Lease duration: 1500ms, 30s, 5m, 2h, 1h30m.
    #[arg(long, default_value = "30s", value_parser = parse_ttl, value_name = "DURATION", allow_hyphen_values = true)]
    ttl: Ttl,
    /// Allow claiming a run the store holds nothing for yet.
    #[arg(long)]
    new: bool,
}

fn parse_holder(s: &str) -> Result<Holder, String> {
    Holder::new(s).map_err(|e| e.to_string())
}

/// `runkeep release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    run: RunArg,
    /// The fence the lease was claimed at.
    #[arg(long, value_parser = parse_id::<Fence>)]
    fence: Fence,
}

/// Claims (or renews) a run. A run held live by someone else exits 1.
pub async fn claim(ctx: &Ctx, args: ClaimArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    // Only a run the store holds nothing for needs --new; a run that cannot
    // be read keeps the read error and its own hint (permission denied).
    if !args.new && !run_exists(store, &scope).await? {
        return Err(unknown_run(&scope).hint(
            "pass --new to claim a run that has no state yet; otherwise check the run id and --tenant/--project/--session",
        ));
    }
    let holder = args.holder.unwrap_or_else(|| Holder::unique("runkeep-cli"));
    let now = Timestamp::now();
    let outcome = store
        // Judged at the store's clock (an HTTP store refuses an instant
        // sent from here).
        .claim(&scope, &ClaimOptions::new(holder, args.ttl))
        .await
        .map_err(|e| read_error(e).context(format!("claim {}", scope.run_id)))?;
    match outcome {
        ClaimOutcome::Acquired(lease) => {
            if ctx.json() {
                emit_json(&json!({"outcome": "acquired", "run": scope, "lease": lease}))?;
            } else {
                emit(&format!(
                    "claimed {} at fence {} for {}, until {}\nwrite under fence {}; release with: runkeep release {} --fence {}\n",
                    scope.run_id,
                    lease.fence,
                    lease.holder,
                    when(lease.expires_at, now),
                    lease.fence,
                    scope.run_id,
                    lease.fence
                ))?;
            }
            Ok(Exit::Ok)
        }
        ClaimOutcome::Held(held) => {
            if ctx.json() {
                emit_json(&json!({"outcome": "held", "run": scope, "claim": held}))?;
            }
            Err(CliError::failed(format!(
                "run {} is held by {} at fence {} until {} ({})",
                scope.run_id,
                held.holder,
                held.fence,
                crate::output::iso(held.expires_at),
                relative(held.expires_at, now)
            ))
            .hint("wait for the lease to expire, or ask its holder to release it (the same --holder renews)"))
        }
        ClaimOutcome::Finished(status) => {
            if ctx.json() {
                emit_json(&json!({"outcome": "finished", "run": scope, "status": status}))?;
            }
            Err(CliError::failed(format!(
                "run {} is finished ({status}); a finished run is not claimed",
                scope.run_id
            ))
            .hint(format!(
                "see how it ended with `runkeep show {run}`; if it must run again: runkeep reopen {run}",
                run = scope.run_id
            )))
        }
        ClaimOutcome::NotBefore(at) => {
            if ctx.json() {
                emit_json(&json!({"outcome": "deferred", "run": scope, "availableAt": at}))?;
            }
            Err(CliError::failed(format!(
                "run {} is deferred until {} ({})",
                scope.run_id,
                crate::output::iso(at),
                relative(at, now)
            ))
            .hint("claim it after that instant"))
        }
        ClaimOutcome::AtLimit(busy) => {
            if ctx.json() {
                emit_json(
                    &json!({"outcome": "atLimit", "run": scope, "key": busy.key, "limit": busy.limit, "held": busy.held}),
                )?;
            }
            Err(CliError::failed(format!(
                "run {} carries concurrency key {:?}, which is at its limit: {} of {} runs of the key are held",
                scope.run_id, busy.key, busy.held, busy.limit
            ))
            .hint("claim it once one of them is finished or released (runkeep runs --claimed lists the holders)"))
        }
    }
}

/// Releases a run's lease held at `--fence`. A fence that is not the current
/// holding changes nothing and exits 1.
pub async fn release(ctx: &Ctx, args: ReleaseArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    require_run(store, &scope).await?;
    let released = store
        .release(&scope, args.fence)
        .await
        .map_err(|e| CliError::from(e).context(format!("release {}", scope.run_id)))?;
    let now = Timestamp::now();
    let after = store.lease(&scope, now).await?;
    if ctx.json() {
        emit_json(
            &json!({"released": released, "run": scope, "fence": args.fence, "lease": after}),
        )?;
    }
    if !released {
        return Err(CliError::failed(format!(
            "fence {} is not the current holding of run {}; nothing was released (now: {})",
            args.fence,
            scope.run_id,
            lease_cell(after.as_ref(), now).text()
        ))
        .hint(format!(
            "see the current lease with `runkeep show {}`",
            scope.run_id
        )));
    }
    if !ctx.json() {
        emit(&format!(
            "released {} (fence {}); the run is free and fence {} is now refused on write\n",
            scope.run_id, args.fence, args.fence
        ))?;
    }
    Ok(Exit::Ok)
}
