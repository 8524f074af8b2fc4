//! `runkeep prune RUN --keep N`.

use clap::Args;
use runkeep::park::prune_victims;
use runkeep::Fence;
use serde_json::json;

use crate::cli::{parse_id, RunArg};
use crate::commands::require_run;
use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json};

/// `runkeep prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {
    #[command(flatten)]
    run: RunArg,
    /// How many of the newest checkpoints to keep (at least 1: a run with none
    /// drops out of the listing). Unanswered parks are always kept.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    keep: u64,
    /// Prune under this fence (refused if the run was taken over since).
    #[arg(long, value_parser = parse_id::<Fence>)]
    fence: Option<Fence>,
    /// Show what would be deleted, delete nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Prunes a run's checkpoints.
pub async fn run(ctx: &Ctx, args: PruneArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    require_run(store, &scope).await?;
    let keep = usize::try_from(args.keep).unwrap_or(usize::MAX);
    let deleted = if args.dry_run {
        prune_victims(&store.list_checkpoints(&scope).await?, keep)
    } else {
        store
            .prune_checkpoints(&scope, keep, args.fence)
            .await
            .map_err(|e| CliError::from(e).context(format!("prune {}", scope.run_id)))?
    };
    let remaining =
        store.list_checkpoints(&scope).await?.len() - if args.dry_run { deleted.len() } else { 0 };
    if ctx.json() {
        emit_json(
            &json!({"run": scope, "dryRun": args.dry_run, "deleted": deleted, "remaining": remaining}),
        )?;
        return Ok(Exit::Ok);
    }
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let list = deleted
        .iter()
        .map(|d| d.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    emit(&format!(
        "{verb} {} checkpoint(s) of {}{}{list}; {remaining} remain (unanswered parks are never pruned)\n",
        deleted.len(),
        scope.run_id,
        if deleted.is_empty() { "" } else { ": " },
    ))?;
    Ok(Exit::Ok)
}
