//! `runkeep checkpoints RUN`: a run's resume points.

use clap::Args;
use runkeep::{Checkpoint, ParkState, Timestamp};
use serde_json::{json, Value};

use crate::cli::RunArg;
use crate::commands::require_run;
use crate::context::Ctx;
use crate::error::{CliResult, Exit};
use crate::output::{emit, emit_json, note, relative, when, Cell, Color, Table};

/// `runkeep checkpoints`.
#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    #[command(flatten)]
    run: RunArg,
    /// With --json: each checkpoint in full (host state included).
    #[arg(long)]
    full: bool,
}

/// Lists a run's checkpoints.
pub async fn run(ctx: &Ctx, args: CheckpointsArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store_read_only().await?;
    let store = opened.store.as_ref();
    let cps = store.list_checkpoints(&scope).await?;
    if cps.is_empty() {
        require_run(store, &scope).await?;
    }
    let now = Timestamp::now();
    if ctx.json() {
        let docs: Vec<Value> = cps
            .iter()
            .map(|c| {
                if args.full {
                    Value::Object(c.to_json())
                } else {
                    summary(c, now)
                }
            })
            .collect();
        emit_json(&docs)?;
        return Ok(Exit::Ok);
    }
    if cps.is_empty() {
        note(&format!("run {} has no checkpoints", scope.run_id));
        return Ok(Exit::Ok);
    }
    let mut table = Table::new(&["ID", "CREATED", "FENCE", "PARK", "STATE"]);
    for c in &cps {
        let park = match &c.pending {
            None => Cell::colored("-", Color::Dim),
            Some(p) => {
                let state = p.state(now);
                let color = match state {
                    ParkState::Outstanding => Color::Blue,
                    ParkState::Expired => Color::Red,
                    ParkState::Resolved => Color::Dim,
                };
                let detail = match (state, p.deadline_at, p.resolved_at) {
                    (ParkState::Resolved, _, Some(at)) => {
                        format!(" (answered {})", relative(at, now))
                    }
                    (_, Some(d), _) => format!(" (deadline {})", relative(d, now)),
                    _ => String::new(),
                };
                Cell::colored(
                    format!("{} {}{detail}", state.as_str(), p.request_type()),
                    color,
                )
            }
        };
        table.row(vec![
            c.id.to_string().into(),
            when(c.created_at, now).into(),
            c.fence.map_or("-".into(), |f| f.to_string()).into(),
            park,
            format!("{} key(s)", c.state.len()).into(),
        ]);
    }
    emit(&table.render(&ctx.style))?;
    Ok(Exit::Ok)
}

/// The header of a checkpoint, its park in full, and the names of its state keys.
fn summary(c: &Checkpoint, now: Timestamp) -> Value {
    json!({
        "id": c.id,
        "createdAt": c.created_at,
        "runCreatedAt": c.run_created_at,
        "fence": c.fence,
        "pending": c.pending.as_ref().map(|p| {
            let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.insert("state".into(), json!(p.state(now).as_str()));
            }
            v
        }),
        "stateKeys": c.state.keys().collect::<Vec<_>>(),
    })
}
