//! `runkeep events RUN`: the transcript, optionally tailed.

use std::collections::HashSet;
use std::time::Duration;

use clap::Args;
use runkeep::{EventBatch, PersistedEvent, ReadEventsOptions, RunScope, RunStore, Timestamp};

use crate::cli::RunArg;
use crate::commands::{read_error, require_run};
use crate::context::Ctx;
use crate::duration::parse_duration;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, iso, note, truncate, warn, Color, Style};

/// `runkeep events`.
#[derive(Args, Debug)]
pub struct EventsArgs {
    #[command(flatten)]
    run: RunArg,
    /// Only events after this sequence number.
    #[arg(long, default_value_t = 0, value_name = "SEQ")]
    since: u64,
    /// At most this many events (without --follow).
    #[arg(long, conflicts_with = "follow")]
    limit: Option<usize>,
    /// Keep printing new events as they land, until Ctrl-C (exits 0).
    #[arg(long, short = 'f')]
    follow: bool,
    /// How often --follow polls the store.
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    interval: Duration,
}

/// Prints (and tails) a run's events. Human output is one line per event
/// (seq, time, type, fence, payload); `--json` is JSON lines, one event per
/// line in the store's flat form.
pub async fn run(ctx: &Ctx, args: EventsArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store_read_only()?;
    let store = opened.store.as_ref();
    let mut printer = Printer {
        json: ctx.json(),
        style: ctx.style,
        header_done: false,
        warned: HashSet::new(),
    };
    let first = read(store, &scope, args.since, args.limit).await?;
    if !args.follow {
        if first.events.is_empty() {
            require_run(store, &scope).await?;
            note(&format!(
                "no events after seq {} (last seq {})",
                args.since, first.last_seq
            ));
        }
        printer.batch(&first)?;
        return Ok(Exit::Ok);
    }
    // Listen before the first read, so an early Ctrl-C is not the default (exit 130).
    let mut stop = Stop::listen()?;
    note(&format!("following run {} (Ctrl-C to stop)", scope.run_id));
    let mut since = printer.batch(&first)?.unwrap_or(args.since);
    loop {
        tokio::select! {
            _ = stop.wait() => break,
            _ = tokio::time::sleep(args.interval) => {}
        }
        let batch = read(store, &scope, since, None).await?;
        if let Some(last) = printer.batch(&batch)? {
            since = last;
        }
    }
    Ok(Exit::Ok)
}

/// Ctrl-C (SIGINT) or SIGTERM.
struct Stop {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Stop {
    fn listen() -> CliResult<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| {
            signal(kind).map_err(|e| CliError::internal(format!("cannot listen for signals: {e}")))
        };
        Ok(Self {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
        })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

async fn read(
    store: &dyn RunStore,
    scope: &RunScope,
    since: u64,
    limit: Option<usize>,
) -> CliResult<EventBatch> {
    let options = ReadEventsOptions {
        since_seq: since,
        limit,
        ..ReadEventsOptions::default()
    };
    store.read_events(scope, &options).await.map_err(read_error)
}

struct Printer {
    json: bool,
    style: Style,
    header_done: bool,
    /// Line positions of damaged records already warned about: `--follow`
    /// re-reads a torn tail on every poll, and says so once. (A torn tail
    /// healed by the next append stays the same damaged line: not new.)
    warned: HashSet<u64>,
}

impl Printer {
    /// Prints a batch; returns the last printed seq.
    fn batch(&mut self, batch: &EventBatch) -> CliResult<Option<u64>> {
        for s in &batch.skipped {
            if !self.warned.insert(s.position) {
                continue;
            }
            warn(&format!(
                "skipped damaged transcript record at line {}: {}",
                s.position, s.reason
            ));
        }
        if batch.events.is_empty() {
            return Ok(None);
        }
        let mut text = String::new();
        if !self.json && !self.header_done {
            text.push_str(
                &self
                    .style
                    .paint(&line("SEQ", "TIME", "TYPE", "FENCE", "DATA"), Color::Bold),
            );
            text.push('\n');
            self.header_done = true;
        }
        for e in &batch.events {
            if self.json {
                text.push_str(&serde_json::to_string(&e.to_json()).unwrap_or_default());
            } else {
                text.push_str(&human(e));
            }
            text.push('\n');
        }
        // One write per batch keeps lines whole when tailing.
        emit(&text)?;
        Ok(batch.events.last().map(|e| e.seq))
    }
}

fn line(seq: &str, time: &str, kind: &str, fence: &str, data: &str) -> String {
    format!("{seq:>6}  {time:<20}  {kind:<20}  {fence:>5}  {data}")
        .trim_end()
        .to_string()
}

fn human(e: &PersistedEvent) -> String {
    let time = if e.timestamp == Timestamp::EPOCH {
        "-".to_string()
    } else {
        iso(e.timestamp)
    };
    let data = if e.payload.is_empty() {
        String::new()
    } else {
        truncate(&serde_json::to_string(&e.payload).unwrap_or_default(), 100)
    };
    line(
        &e.seq.to_string(),
        &time,
        &e.event_type,
        &e.generation.map_or("-".into(), |g| g.to_string()),
        &data,
    )
}
