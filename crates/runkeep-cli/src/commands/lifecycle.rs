//! `runkeep enqueue`, `runkeep finish`, `runkeep cancel`, `runkeep reopen` and
//! `runkeep priority`: a run's lifecycle (contract v2) from the command line.
//!
//! - `enqueue` creates a runnable run: its first checkpoint holds the input
//!   (`state.input`), and its lifecycle the not-before instant and its own
//!   attempt limit. An existing run is refused (`Conflict`, exit 1).
//! - `finish` ends the run held at `--fence` as completed, failed or
//!   cancelled, with an optional JSON result and a reason; the fence is
//!   spent. A superseded fence is `FencedOut`, a finished run `Conflict`
//!   (both exit 1); a fence never issued for the run is a bad argument
//!   (exit 64).
//! - `reopen` makes a finished run active and claimable again (attempts
//!   restart at 0). An active run is `Conflict`, an unknown one exit 1.
//! - `priority` sets an active run's priority (an operator's act): workers
//!   take the highest first. A finished run is `Conflict`, an unknown one
//!   exit 1.
//! - `cancel` finishes an active run as cancelled, claimed or not (an
//!   operator's act): its holder's next write or renewal is refused as
//!   cancelled and its worker stops the step. A finished run is `Conflict`,
//!   an unknown one exit 1.
//!
//! A backend that does not keep lifecycles answers `Unsupported`: exit 1,
//! naming the store and the operation, never a silent no-op.

use std::time::Duration;

use clap::Args;
use runkeep::lifecycle::DEFAULT_MAX_ATTEMPTS;
use runkeep::{
    Checkpoint, CheckpointId, Concurrency, Dedupe, EnqueueOptions, Fence, FinishStatus, Lifecycle,
    Outcome, Priority, RetryPolicy, RunScope, RunStatus, Timestamp, Ttl,
};
use serde_json::{json, Map, Value};

use crate::cli::{parse_id, RunArg};
use crate::commands::{read_error, require_run, unknown_run};
use crate::context::Ctx;
use crate::duration::parse_duration;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, iso, parse_instant, relative, truncate, when, Cell, Color};
use crate::store::OpenedStore;

/// The id of the checkpoint `enqueue` writes when `--checkpoint` is not given.
pub const ENQUEUE_CHECKPOINT: &str = "cp_enqueued";

/// `runkeep enqueue`.
#[derive(Args, Debug)]
pub struct EnqueueArgs {
    #[command(flatten)]
    run: RunArg,
    /// The run's input, as JSON (kept in the first checkpoint as `state.input`;
    /// quote a string: '"text"').
    #[arg(long, value_parser = parse_json, value_name = "JSON")]
    input: Option<Value>,
    /// Not claimable before then: a duration from now on the store's clock
    /// (30s, 5m, 1h30m) or a UTC instant (2026-11-29T12:00:00Z).
    #[arg(long, value_parser = parse_not_before, value_name = "DURATION|INSTANT")]
    not_before: Option<NotBefore>,
    /// The run's own attempt limit: it is dead-lettered (failed, "attempts
    /// exhausted") once this many attempts were lost: a holder gone (its
    /// lease expired) or a step that failed (default 25).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    max_attempts: Option<u32>,
    /// After a failed attempt, the first retry delay (default 1s); each
    /// later one is --retry-factor times longer, up to --retry-cap, with
    /// jitter (half to all of it).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    retry_base: Option<Duration>,
    /// The growth of the retry delay per failed attempt, 1 to 100 (default 2).
    #[arg(long, value_name = "FACTOR")]
    retry_factor: Option<f64>,
    /// The longest retry delay (default 10m, at most 7d).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    retry_cap: Option<Duration>,
    /// Each attempt's time limit: a worker stops a step that runs longer
    /// and reports the attempt failed (kind `timeout`).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    attempt_timeout: Option<Duration>,
    /// The run must be finished by then: a duration from now on the store's
    /// clock or a UTC instant. Its first claim after it (a renewal
    /// included) finishes it as failed, reason `deadline`.
    #[arg(long, value_parser = parse_not_before, value_name = "DURATION|INSTANT")]
    deadline: Option<NotBefore>,
    /// The id of the first checkpoint.
    #[arg(long, default_value = ENQUEUE_CHECKPOINT, value_parser = parse_id::<CheckpointId>, value_name = "ID")]
    checkpoint: CheckpointId,
    /// Its priority, -1000000 to 1000000 (default 0): workers take the
    /// highest first.
    #[arg(long, value_parser = parse_priority, allow_negative_numbers = true, value_name = "N")]
    priority: Option<Priority>,
    /// Its concurrency key (a customer, a thread, …; letters, digits and _ . : @ / -):
    /// at most --concurrency-limit runs of the key in the session are held
    /// at once.
    #[arg(long, value_name = "KEY")]
    concurrency_key: Option<String>,
    /// How many runs of --concurrency-key may be held at once (1 to 10000;
    /// default 1).
    #[arg(long, requires = "concurrency_key", value_name = "N")]
    concurrency_limit: Option<u32>,
    /// How long it is kept once finished (30d, 12h; default: the store's
    /// retention policy).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    retention: Option<Duration>,
    /// An idempotency key: while the window of a first enqueue with it is
    /// open (and its run exists), this enqueue creates nothing and prints
    /// that run.
    #[arg(long, requires = "dedupe_window", value_name = "KEY")]
    dedupe_key: Option<String>,
    /// The idempotency key's window (10m, 1h; at most 30d).
    #[arg(long, requires = "dedupe_key", value_parser = parse_duration, value_name = "DURATION")]
    dedupe_window: Option<Duration>,
}

/// `runkeep priority`.
#[derive(Args, Debug)]
pub struct PriorityArgs {
    #[command(flatten)]
    run: RunArg,
    /// The run's new priority, -1000000 to 1000000: workers take the
    /// highest first (default 0).
    #[arg(value_parser = parse_priority, allow_negative_numbers = true, value_name = "N")]
    priority: Priority,
}

/// Parses a priority (an integer in the core's range).
pub fn parse_priority(s: &str) -> Result<Priority, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an integer priority"))?;
    Priority::new(n).map_err(|e| e.to_string())
}

/// `runkeep finish`.
#[derive(Args, Debug)]
pub struct FinishArgs {
    #[command(flatten)]
    run: RunArg,
    /// The fence the run is held at (printed by `runkeep claim`).
    #[arg(long, value_parser = parse_id::<Fence>)]
    fence: Fence,
    /// How it ends: completed, failed or cancelled.
    #[arg(long, value_parser = parse_finish_status, value_name = "STATUS")]
    status: FinishStatus,
    /// The run's result, as JSON (quote a string: '"done"').
    #[arg(long, value_parser = parse_json, value_name = "JSON")]
    result: Option<Value>,
    /// Why, for operators (free text).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// `runkeep cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    #[command(flatten)]
    run: RunArg,
    /// Why (kept as the run's finish reason; the holder is told it).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// `runkeep reopen`.
#[derive(Args, Debug)]
pub struct ReopenArgs {
    #[command(flatten)]
    run: RunArg,
}

/// When an enqueued run becomes claimable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NotBefore {
    /// This long after the store's clock reads at enqueue.
    After(Duration),
    /// At this instant.
    At(Timestamp),
}

fn parse_not_before(s: &str) -> Result<NotBefore, String> {
    if s.trim().as_bytes().first().is_some_and(u8::is_ascii_digit) && s.contains('T') {
        return parse_instant(s).map(NotBefore::At);
    }
    parse_duration(s)
        .map(NotBefore::After)
        .map_err(|e| format!("{e}; or give {}", crate::output::INSTANT_FORMS))
}

fn parse_json(s: &str) -> Result<Value, String> {
    serde_json::from_str(s)
        .map_err(|e| format!("{s:?} is not JSON ({e}); quote a string as JSON, e.g. '\"text\"'"))
}

fn parse_finish_status(s: &str) -> Result<FinishStatus, String> {
    match s.parse::<RunStatus>().map_err(|e| e.to_string())? {
        RunStatus::Completed => Ok(FinishStatus::Completed),
        RunStatus::Failed => Ok(FinishStatus::Failed),
        RunStatus::Cancelled => Ok(FinishStatus::Cancelled),
        RunStatus::Active => Err(
            "a run is finished as completed, failed or cancelled (`runkeep reopen` makes a finished run active again)"
                .into(),
        ),
    }
}

/// The error of a lifecycle operation refused by the store, with the hint
/// that fits the refusal.
fn refusal(err: runkeep::Error, op: &str, scope: &RunScope, opened: &OpenedStore) -> CliError {
    use runkeep::Error as E;
    let run = &scope.run_id;
    let hint = match &err {
        E::Unsupported { .. } => Some(format!(
            "store {} cannot {op} runs; use a store that implements contract v2's lifecycle (memory:, or a directory store once its backend does)",
            opened.address
        )),
        E::FencedOut { .. } => Some(format!(
            "that fence no longer holds the run (superseded, released or already spent by a finish); see the run with `runkeep show {run}`, claim it again for a current fence"
        )),
        E::Conflict { .. } if op == "finish" => Some(format!(
            "see how it ended with `runkeep show {run}`; `runkeep reopen {run}` makes it runnable again"
        )),
        E::Conflict { .. } if op == "reopen" => Some(format!(
            "only a finished run is reopened; see its status with `runkeep show {run}`"
        )),
        E::Conflict { .. } if op == "enqueue" => Some(
            "enqueue creates a new run: pick another run id, or reopen a finished one with `runkeep reopen`".into(),
        ),
        E::Conflict { .. } if op == "set the priority of" => Some(format!(
            "only an active run's priority is set; `runkeep show {run}` shows how it ended, `runkeep reopen {run}` makes it active again"
        )),
        E::Conflict { .. } if op == "cancel" => Some(format!(
            "only an active run can be cancelled; `runkeep show {run}` shows how it ended, `runkeep reopen {run}` makes it active again"
        )),
        E::InvalidInput { .. } if op == "finish" => Some(format!(
            "the fence must be one the store issued for this run; `runkeep show {run}` shows its lease and fence"
        )),
        _ => None,
    };
    let not_found = matches!(err, E::NotFound { .. });
    let e = read_error(err).context(format!("{op} {run}"));
    if not_found {
        return unknown_run(scope);
    }
    match hint {
        Some(h) => e.hint(h),
        None => e,
    }
}

/// Creates a runnable run.
pub async fn enqueue(ctx: &Ctx, args: EnqueueArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    let now = store.now();
    let available_at = match args.not_before {
        None => None,
        Some(NotBefore::At(at)) => Some(at),
        Some(NotBefore::After(d)) => Some(now.plus(Ttl::from_duration(d).map_err(|e| {
            CliError::usage(format!("--not-before: {}", CliError::from(e).message))
        })?)),
    };
    let mut state = Map::new();
    if let Some(input) = args.input {
        state.insert("input".into(), input);
    }
    let checkpoint = Checkpoint::new(args.checkpoint, now, state).with_run_created_at(now);
    let retry = match (args.retry_base, args.retry_factor, args.retry_cap) {
        (None, None, None) => None,
        (base, factor, cap) => {
            let d = RetryPolicy::default();
            let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            Some(RetryPolicy {
                base_ms: base.map_or(d.base_ms, ms),
                factor: factor.unwrap_or(d.factor),
                cap_ms: cap.map_or(d.cap_ms, ms),
            })
        }
    };
    let attempt_timeout = args
        .attempt_timeout
        .map(|d| {
            Ttl::from_duration(d).map_err(|e| {
                CliError::usage(format!("--attempt-timeout: {}", CliError::from(e).message))
            })
        })
        .transpose()?;
    let deadline =
        match args.deadline {
            None => None,
            Some(NotBefore::At(at)) => Some(at),
            Some(NotBefore::After(d)) => Some(now.plus(Ttl::from_duration(d).map_err(|e| {
                CliError::usage(format!("--deadline: {}", CliError::from(e).message))
            })?)),
        };
    let concurrency = args
        .concurrency_key
        .map(|key| {
            Concurrency::new(key, args.concurrency_limit.unwrap_or(1)).map_err(|e| {
                CliError::usage(format!(
                    "--concurrency-key/--concurrency-limit: {}",
                    CliError::from(e).message
                ))
            })
        })
        .transpose()?;
    let retention = args
        .retention
        .map(|d| {
            Ttl::from_duration(d)
                .map_err(|e| CliError::usage(format!("--retention: {}", CliError::from(e).message)))
        })
        .transpose()?;
    let dedupe = match (args.dedupe_key, args.dedupe_window) {
        (Some(key), Some(window)) => {
            let window = Ttl::from_duration(window).map_err(|e| {
                CliError::usage(format!("--dedupe-window: {}", CliError::from(e).message))
            })?;
            let d = Dedupe { key, window };
            d.validate().map_err(|e| {
                CliError::usage(format!(
                    "--dedupe-key/--dedupe-window: {}",
                    CliError::from(e).message
                ))
            })?;
            Some(d)
        }
        _ => None,
    };
    let options = EnqueueOptions {
        available_at,
        max_attempts: args.max_attempts,
        retry,
        attempt_timeout,
        deadline,
        priority: args.priority.unwrap_or_default(),
        concurrency,
        retention,
    };
    let enqueued = store
        .enqueue_once(&scope, &checkpoint, &options, dedupe.as_ref())
        .await
        .map_err(|e| refusal(e, "enqueue", &scope, &opened))?;
    let scope = enqueued.run.clone();
    let lifecycle = store
        .lifecycle(&scope)
        .await
        .map_err(|e| refusal(e, "read the lifecycle of", &scope, &opened))?;
    if ctx.json() {
        emit_json(&json!({
            "run": scope,
            "created": enqueued.created,
            "checkpoint": enqueued.checkpoint.as_ref().map(|c| json!({"id": c.id, "createdAt": c.created_at})),
            "lifecycle": lifecycle,
        }))?;
        return Ok(Exit::Ok);
    }
    let Some(stored) = enqueued.checkpoint.filter(|_| enqueued.created) else {
        emit(&format!(
            "not enqueued: idempotency key {:?} belongs to run {}, enqueued inside its window ({}); nothing was changed
see it with: runkeep show {}
",
            dedupe.as_ref().map(|d| d.key.as_str()).unwrap_or_default(),
            scope.run_id,
            lifecycle.status,
            scope.run_id
        ))?;
        return Ok(Exit::Ok);
    };
    let available = match lifecycle.available_at {
        Some(at) if at > now => format!("not claimable before {}", when(at, now)),
        _ => "claimable now".to_string(),
    };
    let mut rules = String::new();
    if !lifecycle.priority.is_default() {
        rules.push_str(&format!(", priority {}", lifecycle.priority));
    }
    if let Some(c) = &lifecycle.concurrency {
        rules.push_str(&format!(
            ", concurrency key {} (at most {} held at once)",
            c.key, c.limit
        ));
    }
    emit(&format!(
        "enqueued {} (checkpoint {}): active, {available}, attempt limit {}{rules}\nworkers take it with claim_next; see it with: runkeep show {}\n",
        scope.run_id,
        stored.id,
        limit_text(&lifecycle),
        scope.run_id
    ))?;
    Ok(Exit::Ok)
}

/// Sets an active run's priority (an operator's act).
pub async fn set_priority(ctx: &Ctx, args: PriorityArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    let lifecycle = store
        .set_priority(&scope, args.priority)
        .await
        .map_err(|e| refusal(e, "set the priority of", &scope, &opened))?;
    if ctx.json() {
        emit_json(&json!({"run": scope, "priority": lifecycle.priority, "lifecycle": lifecycle}))?;
        return Ok(Exit::Ok);
    }
    emit(&format!(
        "priority of {} is now {}: workers take it before runs of lower priority (a holding is not touched)\n",
        scope.run_id, lifecycle.priority
    ))?;
    Ok(Exit::Ok)
}

/// Finishes a run held at `--fence`.
pub async fn finish(ctx: &Ctx, args: FinishArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    require_run(store, &scope).await?;
    let outcome = Outcome {
        status: args.status,
        result: args.result,
        reason: args.reason,
    };
    let lifecycle = store
        .finish(&scope, args.fence, &outcome)
        .await
        .map_err(|e| refusal(e, "finish", &scope, &opened))?;
    if ctx.json() {
        emit_json(&json!({"run": scope, "fence": args.fence, "lifecycle": lifecycle}))?;
        return Ok(Exit::Ok);
    }
    let now = Timestamp::now();
    emit(&format!(
        "finished {} as {}{}; fence {} is spent and no claim takes the run again\nreopen it with: runkeep reopen {}\n",
        scope.run_id,
        lifecycle.status,
        lifecycle
            .finished_at
            .map(|t| format!(" at {}", when(t, now)))
            .unwrap_or_default(),
        args.fence,
        scope.run_id
    ))?;
    Ok(Exit::Ok)
}

/// Reopens a finished run.
pub async fn reopen(ctx: &Ctx, args: ReopenArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    let lifecycle = store
        .reopen(&scope)
        .await
        .map_err(|e| refusal(e, "reopen", &scope, &opened))?;
    if ctx.json() {
        emit_json(&json!({"run": scope, "lifecycle": lifecycle}))?;
        return Ok(Exit::Ok);
    }
    emit(&format!(
        "reopened {}: active and claimable now, attempts back to 0 (limit {}); its next claim gets a fence above every fence issued\n",
        scope.run_id,
        limit_text(&lifecycle)
    ))?;
    Ok(Exit::Ok)
}

/// Cancels a run (an operator's act): finished as cancelled whoever holds
/// it; its holder's next write or renewal is refused and its step stopped.
pub async fn cancel(ctx: &Ctx, args: CancelArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    let now = store.now();
    let before = store
        .lease(&scope, now)
        .await
        .map_err(|e| refusal(e, "read the lease of", &scope, &opened))?;
    let lifecycle = store
        .cancel(&scope, args.reason.as_deref())
        .await
        .map_err(|e| refusal(e, "cancel", &scope, &opened))?;
    if ctx.json() {
        emit_json(&json!({"run": scope, "lifecycle": lifecycle}))?;
        return Ok(Exit::Ok);
    }
    let holder = match before {
        Some(l) if !l.holder.is_empty() && !l.expired => format!(
            "; its holder {} (fence {}) is refused from its next write or renewal, and its step is stopped",
            l.holder, l.fence
        ),
        _ => String::new(),
    };
    emit(&format!(
        "cancelled {}: {}{holder}. `runkeep reopen {}` makes it runnable again\n",
        scope.run_id,
        lifecycle.reason.as_deref().unwrap_or("no reason given"),
        scope.run_id,
    ))?;
    Ok(Exit::Ok)
}

/// `3` or `25 (default)`.
fn limit_text(l: &Lifecycle) -> String {
    match l.max_attempts {
        Some(n) => n.to_string(),
        None => format!("{DEFAULT_MAX_ATTEMPTS} (default)"),
    }
}

/// A run's status for humans: `active`, `active · not before … (in 5m)`,
/// `failed 2m ago: attempts exhausted`, coloured by what it means.
pub fn status_cell(
    status: RunStatus,
    finished_at: Option<Timestamp>,
    available_at: Option<Timestamp>,
    reason: Option<&str>,
    now: Timestamp,
) -> Cell {
    let reason = reason
        .map(|r| format!(": {}", truncate(r, 60)))
        .unwrap_or_default();
    let at = finished_at
        .map(|t| format!(" {}", relative(t, now)))
        .unwrap_or_default();
    match status {
        RunStatus::Active => match available_at {
            Some(t) if t > now => Cell::colored(
                format!("active · not before {} ({})", iso(t), relative(t, now)),
                Color::Blue,
            ),
            _ => "active".into(),
        },
        RunStatus::Completed => Cell::colored(format!("completed{at}{reason}"), Color::Green),
        RunStatus::Failed => Cell::colored(format!("failed{at}{reason}"), Color::Red),
        RunStatus::Cancelled => Cell::colored(format!("cancelled{at}{reason}"), Color::Dim),
    }
}

/// The lifecycle lines of `runkeep show`.
pub fn show_rows(l: &Lifecycle, now: Timestamp) -> Vec<(&'static str, Cell)> {
    let mut rows = vec![(
        "status",
        status_cell(l.status, None, l.available_at, None, now),
    )];
    if let Some(t) = l.finished_at {
        rows.push((
            "",
            format!(
                "finished {}{}",
                when(t, now),
                l.finished_fence
                    .map(|f| format!(" at fence {f}"))
                    .unwrap_or_default()
            )
            .into(),
        ));
    }
    if let Some(r) = &l.reason {
        rows.push(("reason", truncate(r, 200).into()));
    }
    if let Some(r) = &l.result {
        rows.push((
            "result",
            truncate(&serde_json::to_string(r).unwrap_or_default(), 200).into(),
        ));
    }
    let attempts = format!("{} of {}", l.attempts, limit_text(l));
    rows.push((
        "attempts",
        if l.attempts > 0 {
            Cell::colored(attempts, Color::Yellow)
        } else {
            attempts.into()
        },
    ));
    if let Some(d) = l.deadline {
        let past = !l.status.is_finished() && d <= now;
        rows.push((
            "deadline",
            if past {
                Cell::colored(
                    format!(
                        "{} (passed: its next claim finishes it as failed)",
                        when(d, now)
                    ),
                    Color::Red,
                )
            } else {
                when(d, now).into()
            },
        ));
    }
    if let Some(ms) = l.attempt_timeout_ms {
        rows.push((
            "attempt timeout",
            format!(
                "{} per attempt",
                humantime::format_duration(Duration::from_millis(ms))
            )
            .into(),
        ));
    }
    let shown = l.failures.len().min(SHOWN_FAILURES);
    if l.failures.len() > shown {
        rows.push((
            "failures",
            format!(
                "{} kept, the newest {shown} shown (`--json` has them all)",
                l.failures.len()
            )
            .into(),
        ));
    }
    for (i, f) in l.failures[l.failures.len() - shown..].iter().enumerate() {
        let retry = match f.retry_at {
            Some(t) => format!(" · retried {}", when(t, now)),
            None if l.is_dead_lettered() => " · dead-lettered".to_string(),
            None => String::new(),
        };
        rows.push((
            if i == 0 && l.failures.len() == shown {
                "failures"
            } else {
                ""
            },
            Cell::colored(
                format!(
                    "#{} fence {} {}: {}: {}{retry}",
                    f.attempt,
                    f.fence,
                    when(f.at, now),
                    f.error.kind,
                    truncate(&f.error.message, 160),
                ),
                Color::Red,
            ),
        ));
    }
    if !l.priority.is_default() {
        rows.push(("priority", l.priority.to_string().into()));
    }
    if let Some(c) = &l.concurrency {
        rows.push((
            "concurrency",
            format!("key {} (at most {} held at once)", c.key, c.limit).into(),
        ));
    }
    if l.status.is_finished() {
        // The status cell shows the finish; say how to undo it.
        rows[0].1 = status_cell(l.status, None, None, None, now);
    }
    rows
}

/// How many failed attempts `show` lists (the newest).
const SHOWN_FAILURES: usize = 5;

/// The newest failed attempt of a run, on one line: `kind: message`.
pub fn last_error(l: &Lifecycle) -> Option<String> {
    l.failures
        .last()
        .map(|f| format!("{}: {}", f.error.kind, truncate(&f.error.message, 120)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn every_refusal_exits_1_with_its_own_hint_and_unknown_runs_are_named() {
        let opened = OpenedStore::memory_for_tests(Arc::new(runkeep::MemoryStore::new()));
        let scope = crate::scope::ScopeParts::parse("t", "p", "s")
            .unwrap()
            .run(&"run_x".parse().unwrap(), None)
            .unwrap();
        let unsupported = runkeep::Error::Unsupported {
            message: "enqueue: not here".into(),
        };
        let e = refusal(unsupported, "enqueue", &scope, &opened);
        assert_eq!(e.exit, Exit::Failed);
        assert!(e.message.starts_with("enqueue run_x: "), "{}", e.message);
        assert!(
            e.hint
                .unwrap()
                .contains("store memory: cannot enqueue runs"),
            "names the store and the operation"
        );
        let conflict = || runkeep::Error::Conflict {
            message: "x".into(),
        };
        let hint = |e: CliError| e.hint.unwrap_or_default();
        assert!(
            hint(refusal(conflict(), "finish", &scope, &opened)).contains("runkeep reopen run_x")
        );
        assert!(
            hint(refusal(conflict(), "reopen", &scope, &opened)).contains("only a finished run")
        );
        assert!(hint(refusal(conflict(), "enqueue", &scope, &opened)).contains("another run id"));
        let gone = runkeep::Error::NotFound {
            what: "run run_x".into(),
        };
        let e = refusal(gone, "reopen", &scope, &opened);
        assert_eq!(e.exit, Exit::Failed);
        assert!(e.message.starts_with("unknown run"), "{}", e.message);
    }
}
