//! `runkeep prune RUN --keep N` (a run's checkpoints) and `runkeep prune
//! --finished-before DURATION` (finished runs, whole: retention).

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runkeep::park::prune_victims;
use runkeep::scheduling::retention::{self, MAX_PRUNE_BATCH};
use runkeep::scheduling::{PruneDuty, RetentionPolicy};
use runkeep::{Fence, ListOptions, ListingScope, RunId, RunScope, RunStatus, RunStore, Ttl};
use serde_json::json;

use crate::cli::parse_id;
use crate::commands::require_run;
use crate::context::Ctx;
use crate::duration::parse_ttl;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, emit_json_line};

/// `runkeep prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {
    /// The run whose checkpoints to prune (with --keep).
    #[arg(
        value_name = "RUN",
        value_parser = parse_id::<RunId>,
        required_unless_present = "finished_before",
        conflicts_with = "finished_before"
    )]
    run: Option<RunId>,
    /// The parent run, when RUN is a sub-run.
    #[arg(long, value_name = "PARENT_RUN", value_parser = parse_id::<RunId>, requires = "run")]
    parent: Option<RunId>,
    /// How many of the newest checkpoints to keep (at least 1: a run with none
    /// drops out of the listing). Unanswered parks are always kept.
    #[arg(
        long,
        value_parser = clap::value_parser!(u64).range(1..),
        required_unless_present = "finished_before",
        requires = "run"
    )]
    keep: Option<u64>,
    /// Prune under this fence (refused if the run was taken over since).
    #[arg(long, value_parser = parse_id::<Fence>, requires = "run")]
    fence: Option<Fence>,
    /// Delete whole finished runs (every checkpoint, event, record and
    /// sub-run) finished longer ago than this (e.g. 30d, 12h), in the scope
    /// of --tenant/--project/--session; a run enqueued with its own
    /// retention is kept for that instead. Active, held and reopened runs
    /// are never deleted.
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
    finished_before: Option<Ttl>,
    /// Runs deleted per batch (each batch is one bounded call to the store).
    #[arg(
        long,
        default_value_t = 1000,
        value_parser = clap::value_parser!(u32).range(1..=MAX_PRUNE_BATCH as i64),
        requires = "finished_before"
    )]
    batch: u32,
    /// Show what would be deleted, delete nothing.
    #[arg(long)]
    dry_run: bool,
}

/// `runkeep prune`: checkpoints of one run, or finished runs.
pub async fn run(ctx: &Ctx, args: PruneArgs) -> CliResult<Exit> {
    match (args.finished_before, &args.run) {
        (Some(keep), _) => finished_runs(ctx, keep, args.batch as usize, args.dry_run).await,
        (None, Some(run)) => {
            let keep = args.keep.unwrap_or(1);
            let scope = ctx.scope.run(run, args.parent.as_ref())?;
            checkpoints(ctx, scope, keep, args.fence, args.dry_run).await
        }
        (None, None) => Err(CliError::usage(
            "prune needs a RUN with --keep N, or --finished-before DURATION",
        )),
    }
}

/// Deletes finished runs due under a policy of `keep`, batch by batch,
/// printing each run deleted (a JSON line each with --json).
async fn finished_runs(ctx: &Ctx, keep: Ttl, batch: usize, dry_run: bool) -> CliResult<Exit> {
    let listing = ctx.scope.listing()?;
    let policy = RetentionPolicy::keep_for(keep);
    let opened = ctx.store().await?;
    let store = opened.store.clone();
    let bar = ProgressBar::new_spinner().with_message(if dry_run {
        "looking for due runs"
    } else {
        "pruning finished runs"
    });
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} runs, {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let show = |scope: &RunScope, sub_runs: Option<u64>| -> CliResult<()> {
        if ctx.json() {
            bar.suspend(|| {
                emit_json_line(&json!({"run": scope, "dryRun": dry_run, "subRuns": sub_runs}))
            })
        } else {
            bar.suspend(|| emit(&format!("{}\n", scope.run_id)))
        }
    };
    let mut total = 0u64;
    let mut sub_runs = 0u64;
    let mut scanned = 0u64;
    let mut batches = 0u64;
    if dry_run {
        let due = match due_runs(store.as_ref(), &listing, &policy).await {
            Ok(d) => d,
            Err(e) => {
                bar.finish_and_clear();
                return Err(e);
            }
        };
        for (scope, subs) in &due {
            show(scope, Some(*subs))?;
            total += 1;
            sub_runs += subs;
            bar.inc(1);
        }
    } else {
        loop {
            let report = match store.prune_finished(&listing, &policy, None, batch).await {
                Ok(r) => r,
                Err(e) => {
                    bar.finish_and_clear();
                    return Err(
                        CliError::from(e).context(format!("prune finished runs of {listing}"))
                    );
                }
            };
            batches += 1;
            scanned += report.scanned;
            sub_runs += report.sub_runs_deleted;
            for scope in &report.deleted {
                show(scope, None)?;
            }
            total += report.deleted.len() as u64;
            bar.inc(report.deleted.len() as u64);
            if !report.more {
                break;
            }
        }
    }
    bar.finish_and_clear();
    let verb = if dry_run { "would delete" } else { "deleted" };
    if ctx.json() {
        emit_json_line(&json!({
            "summary": true,
            "dryRun": dry_run,
            "deleted": total,
            "subRunsDeleted": sub_runs,
            "scanned": scanned,
            "batches": batches,
        }))?;
    } else {
        emit(&format!(
            "{verb} {total} finished run(s) and {sub_runs} sub-run(s) of {listing} finished more than {} ago (or past their own retention)\n",
            crate::output::human_duration(keep.as_duration())
        ))?;
    }
    Ok(Exit::Ok)
}

/// The runs a prune at the store's clock would delete now (a dry run),
/// with their sub-run counts: the listing, each finished top-level row's
/// lifecycle and its sub-runs' judged by the retention rule.
async fn due_runs(
    store: &dyn RunStore,
    listing: &ListingScope,
    policy: &RetentionPolicy,
) -> CliResult<Vec<(RunScope, u64)>> {
    let now = store.now();
    let mut options = ListOptions {
        limit: Some(runkeep::listing::MAX_LIMIT),
        now: Some(now),
        ..ListOptions::default()
    };
    // (run, its sub-runs, all due so far); sub-runs are listed after
    // their parent, so a top-level run's verdict is known at the next one.
    let mut due: Vec<(RunScope, u64)> = Vec::new();
    let mut open: Option<(RunScope, u64, bool)> = None;
    let mut close = |open: &mut Option<(RunScope, u64, bool)>| {
        if let Some((s, n, true)) = open.take() {
            due.push((s, n));
        }
    };
    loop {
        let page = store.list_runs(listing, &options).await?;
        for row in &page.entries {
            let held = row.claim.as_ref().is_some_and(|c| !c.expired);
            let verdict = row.status != RunStatus::Active
                && retention::is_due(&store.lifecycle(&row.scope).await?, held, policy, now);
            match &row.scope.parent_run_id {
                None => {
                    close(&mut open);
                    open = Some((row.scope.clone(), 0, verdict));
                }
                Some(p) => {
                    if let Some((s, n, ok)) = open.as_mut() {
                        if &s.run_id == p && s.session_id == row.scope.session_id {
                            *n += 1;
                            *ok &= verdict;
                        }
                    }
                }
            }
        }
        match page.cursor {
            Some(c) => options.cursor = Some(c),
            None => break,
        }
    }
    close(&mut open);
    Ok(due)
}

/// The server's periodic retention (`runkeep serve --retain-finished`):
/// every `every`, prunes `scope` batch by batch (after each batch a pause
/// of `pause`, or the duty cycle's pause when longer, so claims and
/// listings keep their share of the store: `PruneDuty`), logging each
/// batch with tracing. Runs until the task is dropped.
pub(crate) async fn retain_finished(
    store: Arc<dyn RunStore>,
    scope: ListingScope,
    policy: RetentionPolicy,
    batch: usize,
    every: Duration,
    pause: Duration,
    duty: PruneDuty,
) {
    loop {
        let mut deleted = 0u64;
        loop {
            let started = std::time::Instant::now();
            let pruned = store.prune_finished(&scope, &policy, None, batch).await;
            let pause = pause.max(duty.pause_after(started.elapsed()));
            match pruned {
                Ok(r) => {
                    deleted += r.deleted.len() as u64;
                    tracing::info!(
                        target: "runkeep::retention",
                        scope = %scope,
                        deleted = r.deleted.len(),
                        sub_runs = r.sub_runs_deleted,
                        scanned = r.scanned,
                        more = r.more,
                        "pruned a batch of finished runs"
                    );
                    if !r.more {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "runkeep::retention", scope = %scope, error = %e, "prune of finished runs failed; retrying at the next round");
                    break;
                }
            }
            tokio::time::sleep(pause).await;
        }
        tracing::debug!(target: "runkeep::retention", scope = %scope, deleted, "retention round done");
        tokio::time::sleep(every).await;
    }
}

/// Prunes a run's checkpoints.
async fn checkpoints(
    ctx: &Ctx,
    scope: RunScope,
    keep: u64,
    fence: Option<Fence>,
    dry_run: bool,
) -> CliResult<Exit> {
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    require_run(store, &scope).await?;
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    let deleted = if dry_run {
        prune_victims(&store.list_checkpoints(&scope).await?, keep)
    } else {
        store
            .prune_checkpoints(&scope, keep, fence)
            .await
            .map_err(|e| CliError::from(e).context(format!("prune {}", scope.run_id)))?
    };
    let remaining =
        store.list_checkpoints(&scope).await?.len() - if dry_run { deleted.len() } else { 0 };
    if ctx.json() {
        emit_json(
            &json!({"run": scope, "dryRun": dry_run, "deleted": deleted, "remaining": remaining}),
        )?;
        return Ok(Exit::Ok);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
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
