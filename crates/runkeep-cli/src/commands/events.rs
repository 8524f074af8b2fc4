//! `runkeep events RUN`: the transcript, optionally tailed.

use std::collections::HashSet;
use std::time::Duration;

use clap::Args;
use runkeep::{
    EventBatch, PersistedEvent, ReadEventsOptions, RunScope, RunStore, Timestamp, Watch, WatchTopic,
};

use crate::cli::RunArg;
use crate::commands::{read_error, require_run};
use crate::context::Ctx;
use crate::duration::parse_duration;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, iso, note, truncate, warn, Color, Style};
use crate::store::{OpenMode, PoolDemand};

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
    /// How often --follow polls a store that cannot wake it (a store that
    /// notifies wakes it when events land; on PostgreSQL this is also how
    /// soon a notification missed while its listener reconnects is caught up).
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    interval: Duration,
}

/// Prints (and tails) a run's events. Human output is one line per event
/// (seq, time, type, fence, payload); `--json` is JSON lines, one event per
/// line in the store's flat form.
pub async fn run(ctx: &Ctx, args: EventsArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let mut options = ctx.store_options(PoolDemand::Command);
    if args.follow {
        options = options.with_pg_watch_fallback(args.interval);
    }
    let opened = ctx.open(OpenMode::ReadOnly, &options).await?;
    let store = opened.store.as_ref();
    let mut printer = Printer {
        json: ctx.json(),
        style: ctx.style,
        header_done: false,
        warned: HashSet::new(),
    };
    if !args.follow {
        let first = read(store, &scope, args.since, args.limit).await?;
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
    // Listen before the first read, so an early Ctrl-C is not the default
    // (exit 130); subscribe before it too, so an event that lands between
    // the read and the wait wakes the wait.
    let mut stop = Stop::listen()?;
    let watch = follow_watch(store, &scope, args.interval);
    note(&format!(
        "following run {} (Ctrl-C to stop; {})",
        scope.run_id,
        if watch.is_polling() {
            format!(
                "this store cannot notify: polling every {}",
                crate::output::human_duration(watch.interval())
            )
        } else {
            "woken by the store when events land".to_string()
        }
    ));
    follow(store, &scope, args.since, watch, stop.wait(), |batch| {
        printer.batch(batch)
    })
    .await?;
    Ok(Exit::Ok)
}

/// The watch `--follow` waits on: the store's own for the run's events; when
/// the store can only poll, polling every `interval` (the operator's choice).
fn follow_watch(store: &dyn RunStore, scope: &RunScope, interval: Duration) -> Watch {
    let watch = store.watch(&WatchTopic::Events(scope.clone()));
    if watch.is_polling() {
        Watch::polling(interval)
    } else {
        watch
    }
}

/// Reads the events after `since`, hands every batch to `print`, then waits
/// on `watch` (a notification, or its interval) and reads again, until
/// `stop` resolves. A spurious wake-up costs one read that finds nothing.
async fn follow<F>(
    store: &dyn RunStore,
    scope: &RunScope,
    since: u64,
    mut watch: Watch,
    stop: impl std::future::Future<Output = ()>,
    mut print: F,
) -> CliResult<()>
where
    F: FnMut(&EventBatch) -> CliResult<Option<u64>>,
{
    tokio::pin!(stop);
    let mut since = since;
    loop {
        let batch = read(store, scope, since, None).await?;
        if let Some(last) = print(&batch)? {
            since = last;
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = watch.changed() => {}
        }
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use runkeep::watch::Notifier;
    use runkeep::{EvidenceStore, MemoryStore, NewEvent};
    use serde_json::Map;

    use super::*;

    fn scope() -> RunScope {
        crate::scope::ScopeParts::parse("t", "p", "s")
            .unwrap()
            .run(&"run_f".parse().unwrap(), None)
            .unwrap()
    }

    /// Runs `follow` on its own task; every read's event seqs arrive on the
    /// returned channel (an empty vector for a read that found nothing).
    fn spawn_follow(
        store: Arc<MemoryStore>,
        watch: Watch,
    ) -> (
        tokio::sync::mpsc::UnboundedReceiver<Vec<u64>>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<CliResult<()>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async move {
                let _ = stop_rx.await;
            };
            follow(store.as_ref(), &scope(), 0, watch, stop, |batch| {
                let _ = tx.send(batch.events.iter().map(|e| e.seq).collect());
                Ok(batch.events.last().map(|e| e.seq))
            })
            .await
        });
        (rx, stop_tx, task)
    }

    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u64>>) -> Vec<u64> {
        tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("follow read within 60 s")
            .expect("follow still running")
    }

    async fn append(store: &MemoryStore) {
        store
            .append_events(&scope(), &[NewEvent::new("e", Map::new())], None)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_notification_wakes_the_follow_long_before_its_interval() {
        let store = Arc::new(MemoryStore::new());
        let notifier = Notifier::default();
        let topic = WatchTopic::Events(scope());
        // An hour of fallback: only the notification can wake it in time.
        let watch = notifier.subscribe(&topic, Duration::from_secs(3600));
        let (mut rx, stop, task) = spawn_follow(store.clone(), watch);
        assert_eq!(next(&mut rx).await, Vec::<u64>::new(), "the first read");
        append(&store).await;
        notifier.notify(&topic);
        assert_eq!(next(&mut rx).await, vec![1]);
        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_watch_that_only_polls_still_sees_new_events() {
        let store = Arc::new(MemoryStore::new());
        // The store notifies its own subscribers; this watch is not one of
        // them, so only its polling can find the event.
        let (mut rx, stop, task) =
            spawn_follow(store.clone(), Watch::polling(Duration::from_millis(20)));
        assert_eq!(next(&mut rx).await, Vec::<u64>::new());
        append(&store).await;
        let mut seen = next(&mut rx).await;
        while seen.is_empty() {
            seen = next(&mut rx).await;
        }
        assert_eq!(seen, vec![1]);
        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }

    #[test]
    fn follow_uses_the_store_watch_and_the_interval_only_when_it_polls() {
        let store = MemoryStore::new();
        let w = follow_watch(&store, &scope(), Duration::from_millis(123));
        assert!(!w.is_polling(), "the memory store notifies");
        let dir = tempfile::tempdir().unwrap();
        let fs = runkeep_fs::FsStore::open(dir.path(), runkeep_fs::FsOptions::default()).unwrap();
        let w = follow_watch(&fs, &scope(), Duration::from_millis(123));
        if w.is_polling() {
            assert_eq!(w.interval(), Duration::from_millis(123));
        }
    }
}
