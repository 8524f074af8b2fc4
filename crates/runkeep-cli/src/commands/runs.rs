//! `runkeep runs`: the listing (work queue).

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runkeep::{ListOptions, ListOrder, ParkState, Priority, RunRow, RunStatus, Timestamp};

use crate::cli::parse_id;
use crate::commands::lifecycle::{parse_priority, status_cell};
use crate::commands::{claim_cell, park_cell};
use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, emit_json_line, note, relative, when, Cell, Color, Table};
use crate::store::OpenedStore;

/// `runkeep runs`.
#[derive(Args, Debug)]
pub struct RunsArgs {
    /// Only runs whose park is in this list (outstanding, expired, resolved; comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = parse_id::<ParkState>, value_name = "STATES")]
    park: Vec<ParkState>,
    /// Only runs someone holds live.
    #[arg(long, conflicts_with = "unclaimed")]
    claimed: bool,
    /// Only runs nobody holds live (never claimed, released or expired).
    #[arg(long)]
    unclaimed: bool,
    /// Only runs whose status is in this list (active, completed, failed, cancelled; comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = parse_id::<RunStatus>, value_name = "STATUSES")]
    status: Vec<RunStatus>,
    /// Only dead-lettered runs: failed by the store because their holders
    /// kept losing them (a page may hold fewer rows than --limit).
    #[arg(long, conflicts_with = "status")]
    dead_lettered: bool,
    /// Order: run-id (default), created-at (unrecorded first) or priority
    /// (highest first, then run id: the order workers take them in).
    #[arg(long, default_value = "run-id", value_parser = parse_id::<ListOrder>)]
    order: ListOrder,
    /// Only runs whose priority is at least N.
    #[arg(long, value_parser = parse_priority, allow_negative_numbers = true, value_name = "N")]
    min_priority: Option<Priority>,
    /// Page size (1..=1000; default 100).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    limit: Option<u64>,
    /// Continue after this cursor (printed by the previous page).
    #[arg(long)]
    cursor: Option<String>,
    /// Walk every page (with --json: one row per line, JSON lines).
    #[arg(long)]
    all: bool,
}

/// Lists runs.
pub async fn run(ctx: &Ctx, args: RunsArgs) -> CliResult<Exit> {
    let listing = ctx.scope.listing()?;
    let opened = ctx.store_read_only().await?;
    if opened.is_single_session() && ctx.scope.session.is_none() {
        return Err(CliError::usage(format!(
            "{} is one session's runs directory; it cannot list the wider scope {listing}",
            opened.address
        ))
        .hint("give --project and --session (the directory does not record them; the defaults are `default`), or keep many sessions in a root (--store root:DIR) to list a project or tenant"));
    }
    let now = Timestamp::now();
    let mut options = ListOptions {
        order: args.order,
        park: (!args.park.is_empty()).then_some(args.park),
        claimed: match (args.claimed, args.unclaimed) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        limit: args.limit.map(|l| l as usize),
        cursor: args.cursor,
        now: Some(now),
        status: if args.dead_lettered {
            Some(vec![RunStatus::Failed])
        } else {
            (!args.status.is_empty()).then_some(args.status)
        },
        min_priority: args.min_priority,
    };
    let dead_lettered = args.dead_lettered;
    if !args.all {
        let mut page = opened.store.list_runs(&listing, &options).await?;
        if dead_lettered {
            page.entries = only_dead_lettered(page.entries);
        }
        if ctx.json() {
            emit_json(&page)?;
        } else {
            print_rows(ctx, &opened, &page.entries, now, &listing.to_string())?;
            if dead_lettered {
                print_last_errors(&opened, &page.entries).await?;
            }
            if let Some(c) = &page.cursor {
                emit(&format!("more: runkeep runs --cursor {c}\n"))?;
            }
        }
        return Ok(Exit::Ok);
    }
    // Walk every page. JSON lines stream; the table needs every row for its widths.
    let bar = ProgressBar::new_spinner().with_message("listing runs");
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} runs, {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let mut rows = Vec::new();
    loop {
        let listed = match opened.store.list_runs(&listing, &options).await {
            Ok(mut p) if dead_lettered => {
                p.entries = only_dead_lettered(std::mem::take(&mut p.entries));
                Ok(p)
            }
            Ok(p) => Ok(p),
            Err(e) => Err(e.into()),
        };
        let page = match listed {
            Ok(p) => p,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e);
            }
        };
        bar.inc(page.entries.len() as u64);
        if ctx.json() {
            for row in &page.entries {
                bar.suspend(|| emit_json_line(row))?;
            }
        } else {
            rows.extend(page.entries);
        }
        match page.cursor {
            Some(c) => options.cursor = Some(c),
            None => break,
        }
    }
    bar.finish_and_clear();
    if !ctx.json() {
        print_rows(ctx, &opened, &rows, now, &listing.to_string())?;
        if dead_lettered {
            print_last_errors(&opened, &rows).await?;
        }
    }
    Ok(Exit::Ok)
}

/// Under the table of dead-lettered runs: each one's last error (one
/// lifecycle read per row of the page), so the operator sees why without a
/// `show` per run.
async fn print_last_errors(opened: &OpenedStore, rows: &[RunRow]) -> CliResult<()> {
    let mut lines = String::new();
    for r in rows {
        let line = match opened.store.lifecycle(&r.scope).await {
            Ok(l) => crate::commands::lifecycle::last_error(&l).unwrap_or_else(|| {
                "no error on record (its holders were lost: leases expired)".into()
            }),
            Err(e) => format!("lifecycle unreadable: {e}"),
        };
        lines.push_str(&format!("{}: {line}\n", r.scope.run_id));
    }
    if !lines.is_empty() {
        emit(&format!(
            "last errors (`runkeep show RUN` has the history):\n{lines}"
        ))?;
    }
    Ok(())
}

/// Keeps the rows of dead-lettered runs (the row says so:
/// [`RunRow::dead_lettered`], decided by the core from the lifecycle).
/// Damaged rows stay, as every filter keeps them.
fn only_dead_lettered(rows: Vec<RunRow>) -> Vec<RunRow> {
    rows.into_iter()
        .filter(|row| row.damaged.is_some() || row.dead_lettered)
        .collect()
}

fn print_rows(
    ctx: &Ctx,
    opened: &OpenedStore,
    rows: &[RunRow],
    now: Timestamp,
    scope: &str,
) -> CliResult<()> {
    if rows.is_empty() {
        note(&format!("no runs in {scope} match"));
        return Ok(());
    }
    let with_parent = rows.iter().any(|r| r.scope.parent_run_id.is_some());
    let wide_scope = ctx.scope.session.is_none();
    let mut headers = vec!["RUN"];
    if with_parent {
        headers.push("PARENT");
    }
    if wide_scope {
        headers.push("SCOPE");
    }
    // Priority and concurrency key only when some row has one.
    let with_priority = rows.iter().any(|r| !r.priority.is_default());
    let with_key = rows.iter().any(|r| r.concurrency_key.is_some());
    if with_priority {
        headers.push("PRIO");
    }
    if with_key {
        headers.push("KEY");
    }
    headers.extend([
        "STATUS", "CREATED", "CPS", "LATEST", "UPDATED", "PARK", "CLAIM", "ATTEMPTS",
    ]);
    let mut table = Table::new(&headers);
    for r in rows {
        let mut cells: Vec<Cell> = vec![r.scope.run_id.to_string().into()];
        if with_parent {
            cells.push(
                r.scope
                    .parent_run_id
                    .as_ref()
                    .map_or("-".into(), |p| p.to_string())
                    .into(),
            );
        }
        if wide_scope {
            cells.push(format!("{}/{}", r.scope.project_id, r.scope.session_id).into());
        }
        if with_priority {
            cells.push(r.priority.to_string().into());
        }
        if with_key {
            cells.push(
                r.concurrency_key
                    .as_deref()
                    .unwrap_or("-")
                    .to_string()
                    .into(),
            );
        }
        if let Some(damage) = &r.damaged {
            cells.extend([
                Cell::colored("DAMAGED", Color::Red),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                Cell::colored(crate::output::truncate(damage, 60), Color::Red),
                claim_cell(opened, &r.scope, r.claim.as_ref(), now),
                "-".into(),
            ]);
        } else {
            cells.extend([
                status_cell(r.status, r.finished_at, r.available_at, None, now),
                r.run_created_at.map_or("-".into(), |t| when(t, now)).into(),
                r.checkpoint_count.to_string().into(),
                r.latest_checkpoint_id
                    .as_ref()
                    .map_or("-".into(), |c| c.to_string())
                    .into(),
                r.latest_checkpoint_at
                    .map_or("-".into(), |t| relative(t, now))
                    .into(),
                park_cell(r.park.as_ref(), now),
                claim_cell(opened, &r.scope, r.claim.as_ref(), now),
                if r.attempts > 0 {
                    Cell::colored(r.attempts.to_string(), Color::Yellow)
                } else {
                    "0".into()
                },
            ]);
        }
        table.row(cells);
    }
    emit(&table.render(&ctx.style))?;
    note(&format!("{} run(s) in {scope}", rows.len()));
    Ok(())
}
