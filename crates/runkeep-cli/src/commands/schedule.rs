//! `runkeep schedule …`: recurring schedules (a cron in a time zone that
//! enqueues one run per tick; docs/design/schedules.md) and the scheduler
//! loop (`runkeep schedule run`).

use std::time::Duration;

use clap::{Args, Subcommand};
use runkeep::scheduling::schedule::{
    self, MissedTicks, Schedule, ScheduleEntry, ScheduledRunOptions,
};
use runkeep::{Concurrency, ListingScope, Priority, RunStore, Timestamp};
use serde_json::{json, Value};

use crate::context::Ctx;
use crate::duration::parse_duration;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit_json, emit_json_line, iso};

/// `runkeep schedule`.
#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Create a schedule in the session (refused if the name is taken).
    Create(CreateArgs),
    /// List the schedules under the scope: cron, zone, next tick, last run.
    List,
    /// One schedule, whole.
    Show(NameArg),
    /// Delete a schedule (its runs stay).
    Delete(NameArg),
    /// Stop a schedule's ticks until it is resumed.
    Pause(NameArg),
    /// Resume a paused schedule (the ticks of the pause are not enqueued).
    Resume(NameArg),
    /// The scheduler: enqueue each due tick's run, in the foreground until Ctrl-C.
    Run(RunArgs),
}

/// A schedule's name.
#[derive(Args, Debug)]
pub struct NameArg {
    /// The schedule's name.
    #[arg(value_name = "NAME")]
    name: String,
}

/// `runkeep schedule create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The schedule's name (unique in the session; runs are run_NAME-TICK).
    #[arg(value_name = "NAME")]
    name: String,
    /// The cron expression: 5 fields (minute first) or 6 (seconds first), e.g. "*/5 * * * *".
    #[arg(long, value_name = "EXPR")]
    cron: String,
    /// The cron's time zone (IANA name).
    #[arg(long, default_value = "UTC", value_name = "ZONE")]
    timezone: String,
    /// Each run's input (JSON), in its first checkpoint.
    #[arg(long, value_parser = parse_json, value_name = "JSON")]
    input: Option<Value>,
    /// Ticks missed while no scheduler ran: skip (only the newest is enqueued) or catch-up (catch-up:MAX to bound it).
    #[arg(long, default_value = "skip", value_parser = parse_missed, value_name = "POLICY")]
    missed: MissedTicks,
    /// Each run's priority.
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    priority: i64,
    /// Each run's concurrency key (with --concurrency-limit).
    #[arg(long, requires = "concurrency_limit", value_name = "KEY")]
    concurrency_key: Option<String>,
    /// At most this many runs of the key held at once.
    #[arg(long, requires = "concurrency_key", value_name = "N")]
    concurrency_limit: Option<u32>,
    /// Each run's attempt limit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    max_attempts: Option<u32>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
}

/// `runkeep schedule run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// One pass, then exit.
    #[arg(long)]
    once: bool,
    /// Stop after this long (by the store's clock; a last pass is made at the end).
    #[arg(long = "for", value_parser = parse_duration, value_name = "DURATION")]
    run_for: Option<Duration>,
    /// The longest wait between passes (new schedules are seen within it).
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    poll: Duration,
}

/// One line of human output.
fn line(text: &str) -> CliResult<()> {
    crate::output::emit(&format!("{text}\n"))
}

fn parse_json(s: &str) -> Result<Value, String> {
    serde_json::from_str(s)
        .map_err(|e| format!("{s:?} is not JSON ({e}); quote a string as JSON, e.g. '\"text\"'"))
}

fn parse_missed(s: &str) -> Result<MissedTicks, String> {
    MissedTicks::parse(s).map_err(|e| e.to_string())
}

/// Runs a `schedule` subcommand.
pub async fn run(ctx: &Ctx, command: ScheduleCommand) -> CliResult<Exit> {
    match command {
        ScheduleCommand::Create(args) => create(ctx, args).await,
        ScheduleCommand::List => list(ctx).await,
        ScheduleCommand::Show(a) => show(ctx, &a.name).await,
        ScheduleCommand::Delete(a) => delete(ctx, &a.name).await,
        ScheduleCommand::Pause(a) => set_paused(ctx, &a.name, true).await,
        ScheduleCommand::Resume(a) => set_paused(ctx, &a.name, false).await,
        ScheduleCommand::Run(args) => run_loop(ctx, args).await,
    }
}

fn session(ctx: &Ctx) -> CliResult<ListingScope> {
    schedule::session_of(&ctx.scope.listing()?).map_err(|e| {
        CliError::from(e).hint("give --project and --session (a schedule lives in one session)")
    })
}

/// The schedule as JSON: the stored fields plus its next tick and last run.
fn to_json(entry: &ScheduleEntry, now: Timestamp) -> Value {
    let s = &entry.schedule;
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("tenantId".into(), json!(entry.session.tenant_id()));
        m.insert("projectId".into(), json!(entry.session.project_id()));
        m.insert("sessionId".into(), json!(entry.session.session_id()));
        m.insert("nextTick".into(), json!(next_tick(s, now)));
        m.insert("lastRun".into(), json!(s.last_run()));
    }
    v
}

fn next_tick(s: &Schedule, now: Timestamp) -> Option<Timestamp> {
    s.next_tick(now)
}

async fn create(ctx: &Ctx, args: CreateArgs) -> CliResult<Exit> {
    let session = session(ctx)?;
    let opened = ctx.store_creating().await?;
    let store = opened.store.as_ref();
    let now = store.now();
    let concurrency = match (args.concurrency_key, args.concurrency_limit) {
        (Some(k), Some(l)) => Some(Concurrency::new(k, l)?),
        _ => None,
    };
    let mut s = Schedule::new(args.name, args.cron, now);
    s.timezone = args.timezone;
    s.input = args.input.unwrap_or(Value::Null);
    s.missed = args.missed;
    s.paused = args.paused;
    s.options = ScheduledRunOptions {
        priority: Priority::new(args.priority)?,
        concurrency,
        max_attempts: args.max_attempts,
        retention_ms: None,
    };
    s.validate()?;
    if store.get_schedule(&session, &s.name).await?.is_some() {
        return Err(
            CliError::failed(format!("schedule {:?} already exists in {session}", s.name))
                .hint("delete it first, or pick another name"),
        );
    }
    let stored = store.put_schedule(&session, &s).await?;
    let entry = ScheduleEntry {
        session,
        schedule: stored,
    };
    if ctx.json() {
        emit_json(&to_json(&entry, now))?;
    } else {
        line(&format!(
            "created schedule {} ({} {}, missed ticks: {}); next tick {}",
            entry.schedule.name,
            entry.schedule.cron,
            entry.schedule.timezone,
            entry.schedule.missed,
            next_tick(&entry.schedule, now)
                .map(iso)
                .unwrap_or_else(|| "none (paused)".into())
        ))?;
    }
    Ok(Exit::Ok)
}

async fn list(ctx: &Ctx) -> CliResult<Exit> {
    let opened = ctx.store_read_only().await?;
    let store = opened.store.as_ref();
    let now = store.now();
    let entries = store.list_schedules(&ctx.scope.listing()?).await?;
    if ctx.json() {
        let all: Vec<Value> = entries.iter().map(|e| to_json(e, now)).collect();
        emit_json(&all)?;
        return Ok(Exit::Ok);
    }
    if entries.is_empty() {
        line("no schedules")?;
        return Ok(Exit::Ok);
    }
    let mut out = format!(
        "{:<24} {:<18} {:<14} {:<13} {:<21} {}",
        "NAME", "CRON", "ZONE", "MISSED", "NEXT TICK", "LAST RUN"
    );
    for e in &entries {
        let s = &e.schedule;
        out.push('\n');
        out.push_str(&format!(
            "{:<24} {:<18} {:<14} {:<13} {:<21} {}",
            s.name,
            s.cron,
            s.timezone,
            s.missed.to_string(),
            if s.paused {
                "paused".to_string()
            } else {
                next_tick(s, now).map(iso).unwrap_or_else(|| "-".into())
            },
            s.last_run()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".into())
        ));
    }
    line(&out)?;
    Ok(Exit::Ok)
}

async fn get(store: &dyn RunStore, session: &ListingScope, name: &str) -> CliResult<Schedule> {
    store.get_schedule(session, name).await?.ok_or_else(|| {
        CliError::failed(format!("no schedule {name:?} in {session}"))
            .hint("list the schedules with `runkeep schedule list`")
    })
}

async fn show(ctx: &Ctx, name: &str) -> CliResult<Exit> {
    let session = session(ctx)?;
    let opened = ctx.store_read_only().await?;
    let store = opened.store.as_ref();
    let now = store.now();
    let s = get(store, &session, name).await?;
    let entry = ScheduleEntry {
        session,
        schedule: s,
    };
    let v = to_json(&entry, now);
    if ctx.json() {
        emit_json(&v)?;
    } else {
        line(&serde_json::to_string_pretty(&v).unwrap_or_default())?;
    }
    Ok(Exit::Ok)
}

async fn delete(ctx: &Ctx, name: &str) -> CliResult<Exit> {
    let session = session(ctx)?;
    let opened = ctx.store().await?;
    if !opened.store.delete_schedule(&session, name).await? {
        return Err(CliError::failed(format!(
            "no schedule {name:?} in {session}"
        )));
    }
    if ctx.json() {
        emit_json(&json!({ "deleted": name }))?;
    } else {
        line(&format!("deleted schedule {name} (its runs stay)"))?;
    }
    Ok(Exit::Ok)
}

async fn set_paused(ctx: &Ctx, name: &str, paused: bool) -> CliResult<Exit> {
    let session = session(ctx)?;
    let opened = ctx.store().await?;
    let store = opened.store.as_ref();
    let mut s = get(store, &session, name).await?;
    s.set_paused(paused, store.now());
    let stored = store.put_schedule(&session, &s).await?;
    if ctx.json() {
        emit_json(&to_json(
            &ScheduleEntry {
                session,
                schedule: stored,
            },
            store.now(),
        ))?;
    } else {
        line(&format!(
            "{} schedule {name}",
            if paused { "paused" } else { "resumed" }
        ))?;
    }
    Ok(Exit::Ok)
}

/// Prints what a pass did: one line (or JSON line) per tick handled.
fn report(ctx: &Ctx, passes: &[schedule::SchedulePass]) -> CliResult<()> {
    for p in passes {
        for (outcome, runs) in [("enqueued", &p.enqueued), ("already", &p.already)] {
            for r in runs {
                if ctx.json() {
                    emit_json_line(&json!({ "schedule": p.name, "run": r, "outcome": outcome }))?;
                } else if outcome == "enqueued" {
                    line(&format!("enqueued {r} (schedule {})", p.name))?;
                } else {
                    line(&format!(
                        "already  {r} (schedule {}; enqueued by another scheduler)",
                        p.name
                    ))?;
                }
            }
        }
        if let Some(e) = &p.error {
            crate::output::warn(&format!("schedule {}: {e}", p.name));
        }
    }
    Ok(())
}

async fn run_loop(ctx: &Ctx, args: RunArgs) -> CliResult<Exit> {
    let scope = ctx.scope.listing()?;
    let opened = ctx.store().await?;
    let store = opened.store.clone();
    if args.once {
        let passes = schedule::run_due(store.as_ref(), &scope, store.now()).await?;
        report(ctx, &passes)?;
        return Ok(Exit::Ok);
    }
    let until = args
        .run_for
        .map(|d| {
            runkeep::Ttl::from_duration(d)
                .map(|t| store.now().plus(t))
                .map_err(|e| CliError::usage(format!("--for: {}", CliError::from(e).message)))
        })
        .transpose()?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(Exit::Ok),
        r = drive(ctx, store.as_ref(), &scope, args.poll, until) => r.map(|_| Exit::Ok),
    }
}

/// The scheduler loop over every schedule under `scope`: a pass, then a
/// sleep until the earliest next tick (at most `poll`), until `until` (a
/// last pass is made at or after it) or forever. A pass that fails is
/// reported and the loop goes on. Used by `runkeep schedule run` and
/// `runkeep serve --schedules`.
pub async fn drive(
    ctx: &Ctx,
    store: &dyn RunStore,
    scope: &ListingScope,
    poll: Duration,
    until: Option<Timestamp>,
) -> CliResult<()> {
    loop {
        let now = store.now();
        match schedule::run_due(store, scope, now).await {
            Ok(passes) => report(ctx, &passes)?,
            Err(e) => crate::output::warn(&format!("scheduler pass over {scope}: {e}")),
        }
        if until.is_some_and(|u| now >= u) {
            return Ok(());
        }
        let wait = next_wait(store, scope, now, poll, until).await;
        tokio::time::sleep(wait).await;
    }
}

/// Until the earliest next tick of any schedule (or `poll`, or `until`).
async fn next_wait(
    store: &dyn RunStore,
    scope: &ListingScope,
    now: Timestamp,
    poll: Duration,
    until: Option<Timestamp>,
) -> Duration {
    let mut wake = now.offset(poll.as_millis().min(i64::MAX as u128) as i64);
    if let Ok(entries) = store.list_schedules(scope).await {
        for e in entries {
            if let Some(t) = next_tick(&e.schedule, now) {
                wake = wake.min(t);
            }
        }
    }
    if let Some(u) = until {
        wake = wake.min(u);
    }
    Duration::from_millis(wake.as_millis().saturating_sub(now.as_millis()).max(1) as u64)
}
