//! `runkeep park …`: answering a run that waits on a human.

use clap::{Args, Subcommand};
use runkeep::{CheckpointId, Fence, ParkResolution, RunStoreExt, Timestamp};
use serde_json::{json, Value};

use crate::cli::{parse_id, RunArg};
use crate::commands::require_run;
use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, when};

/// `runkeep park`.
#[derive(Subcommand, Debug)]
pub enum ParkCommand {
    /// Answer a run's park (exactly once; a second answer is refused).
    Resolve(ResolveArgs),
}

/// `runkeep park resolve`.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    #[command(flatten)]
    run: RunArg,
    /// The parked checkpoint (default: the run's outstanding park).
    #[arg(long, value_parser = parse_id::<CheckpointId>)]
    checkpoint: Option<CheckpointId>,
    /// The answer: JSON (e.g. '{"action":"approve"}') or plain text (stored as a string).
    #[arg(long, required_unless_present = "expire", conflicts_with = "expire")]
    decision: Option<String>,
    /// Close an expired park without an answer (recorded as a pause).
    #[arg(long)]
    expire: bool,
    /// Resolve under this fence (refused if the run was taken over since).
    #[arg(long, value_parser = parse_id::<Fence>)]
    fence: Option<Fence>,
}

/// Runs a `park` subcommand.
pub async fn run(ctx: &Ctx, command: ParkCommand) -> CliResult<Exit> {
    match command {
        ParkCommand::Resolve(args) => resolve(ctx, args).await,
    }
}

async fn resolve(ctx: &Ctx, args: ResolveArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    require_run(store, &scope).await?;
    let now = Timestamp::now();
    let checkpoint = match args.checkpoint {
        Some(id) => id,
        None if args.expire => match store.expired_parks(&scope, now).await?.as_slice() {
            [one] => one.id.clone(),
            [] => {
                return Err(CliError::failed(format!(
                    "run {} has no expired park",
                    scope.run_id
                )));
            }
            many => {
                return Err(CliError::failed(format!(
                    "run {} has {} expired parks",
                    scope.run_id,
                    many.len()
                ))
                .hint("name one with --checkpoint ID (see `runkeep checkpoints RUN`)"))
            }
        },
        None => match store.find_pending(&scope, now).await? {
            Some(cp) => cp.id,
            None => {
                let expired = store.expired_parks(&scope, now).await?;
                let err = CliError::failed(format!("run {} has no outstanding park", scope.run_id));
                return Err(match expired.first() {
                    Some(cp) => err.hint(format!(
                        "its park on {} expired; answer it anyway with --checkpoint {}, or close it with --expire",
                        cp.id, cp.id
                    )),
                    None => err.hint(format!("see its parks with `runkeep checkpoints {}`", scope.run_id)),
                });
            }
        },
    };
    let resolution = match &args.decision {
        Some(text) => ParkResolution::Answer(
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone())),
        ),
        None => ParkResolution::Expire,
    };
    let stored = match store
        .resolve_park(&scope, &checkpoint, resolution, now, args.fence)
        .await
    {
        Ok(stored) => stored,
        Err(e @ runkeep::Error::Conflict { .. }) => {
            // Say what the first answer was, in the operator's terms.
            let first = store
                .read_checkpoint(&scope, &checkpoint)
                .await
                .ok()
                .flatten()
                .and_then(|c| c.pending)
                .and_then(|p| {
                    p.resolved_at
                        .map(|at| (at, p.decision.unwrap_or(Value::Null)))
                });
            let hint = match first {
                Some((at, decision)) => format!(
                    "a park is answered exactly once; it was answered {} with {decision}",
                    when(at, now)
                ),
                None => format!(
                    "see the run's parks with `runkeep checkpoints {}`",
                    scope.run_id
                ),
            };
            return Err(CliError::from(e)
                .context(format!("park resolve {}", scope.run_id))
                .hint(hint));
        }
        Err(e) => return Err(CliError::from(e).context(format!("park resolve {}", scope.run_id))),
    };
    let pending = stored.pending.as_ref();
    let decision = pending
        .and_then(|p| p.decision.clone())
        .unwrap_or(Value::Null);
    let resolved_at = pending.and_then(|p| p.resolved_at).unwrap_or(now);
    if ctx.json() {
        emit_json(&json!({
            "run": scope,
            "checkpointId": checkpoint,
            "resolvedAt": resolved_at,
            "decision": decision,
        }))?;
    } else {
        emit(&format!(
            "answered the park on {} of run {} at {}\ndecision: {}\n",
            checkpoint,
            scope.run_id,
            when(resolved_at, now),
            decision
        ))?;
    }
    Ok(Exit::Ok)
}
