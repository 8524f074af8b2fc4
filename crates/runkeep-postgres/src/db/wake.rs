//! Wake-ups across processes without serialising commits.
//!
//! A `NOTIFY` inside a data transaction takes PostgreSQL's global notify
//! lock at commit and holds it until the commit record is flushed, so every
//! committing transaction that notifies waits for the previous one's flush:
//! commits stop sharing a WAL flush (measured: 0.58× at 16 clients). So the
//! store never notifies inside a data transaction. A change's notification
//! ([`NOTIFY_SQL`]) is the statement right after its `COMMIT`, on the same
//! connection and in the same write (no round trip of its own: the caller
//! does not wait for its reply), in a transaction of its own committed with
//! `synchronous_commit = off`: the notify lock is held for a moment, never
//! across a flush, and a notification is worth nothing after a server crash
//! anyway (it ends every `LISTEN`).
//!
//! It leaves with the `COMMIT`, before the caller has its answer, so a
//! process that exits right after a change (a `runkeep enqueue`) has sent
//! it; the server runs it only after the `COMMIT`, so a watcher woken by it
//! reads the change. A change that was rolled back (a write refused in the
//! same round trip) still notifies: a spurious wake-up, which watchers
//! allow. The store cannot know which processes watch (each store
//! `LISTEN`s on its own connection), so every change notifies.
//!
//! That is [`NotifyMode::Immediate`](crate::NotifyMode::Immediate), the
//! default. [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced) queues
//! a change's payload once its `COMMIT` succeeded instead, and
//! [`coalesce_loop`] sends what a window of [`COALESCE_WINDOW`] gathered in
//! one statement ([`NOTIFY_MANY_SQL`]) on a connection of its own: one
//! statement for many quick commits, for up to the window of latency.
//!
//! [`listen_loop`] is that connection: it wakes this process's watches of
//! every change any process (this one included) commits, and reconnects
//! after a fault (watches poll at their fallback interval meanwhile). Each
//! time its `LISTEN` is up (at the start, and after a reconnection) it
//! wakes every watch once: a change committed while it could not hear was
//! never delivered, and a watch made meanwhile must not wait for its
//! fallback to see it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runkeep::backoff::Doubling;
use runkeep::watch::Notifier;
use runkeep::RunScope;
use serde_json::{json, Value};
use tokio_postgres::NoTls;

/// A change's notification: `$1` the channel, `$2` the payload.
pub(crate) const NOTIFY_SQL: &str =
    "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)";

/// The notifications of a batch (`$2`, distinct payloads) in one statement,
/// as a transaction of its own committed without waiting for a flush.
pub(crate) const NOTIFY_MANY_SQL: &str = "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)) SELECT pg_notify($1, p) FROM s, unnest($2::text[]) AS p";

/// How long [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced) gathers
/// notifications after the first before sending them together.
pub const COALESCE_WINDOW: Duration = Duration::from_millis(2);

/// The payload naming a changed run (and whether it has new events).
pub(crate) fn payload(scope: &RunScope, events: bool) -> String {
    json!({ "s": scope, "e": events }).to_string()
}

/// Wakes the watchers a notification's payload names.
fn deliver(notifier: &Notifier, payload: &str) {
    let Ok(v) = serde_json::from_str::<Value>(payload) else {
        return;
    };
    let events = v.get("e").and_then(Value::as_bool).unwrap_or(true);
    if let Some(scope) = v
        .get("s")
        .and_then(|s| serde_json::from_value::<RunScope>(s.clone()).ok())
    {
        notifier.notify_run(&scope, events);
    }
}

/// [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced)'s task: gathers
/// the payloads queued within [`COALESCE_WINDOW`] of the first, and sends
/// them (each once) in one statement on a connection of its own, opened on
/// first use and again after a fault (one retry per batch; a batch that
/// still fails is dropped: watchers wake at their fallback poll). Ends when
/// the queue closes (the store was dropped) and is drained.
pub(crate) async fn coalesce_loop(
    config: tokio_postgres::Config,
    channel: String,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<String>,
    reply_timeout: Duration,
    sent: Arc<AtomicU64>,
) {
    let mut client: Option<tokio_postgres::Client> = None;
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + COALESCE_WINDOW;
        while let Ok(Some(p)) = tokio::time::timeout_at(until, queue.recv()).await {
            batch.push(p);
        }
        batch.sort_unstable();
        batch.dedup();
        for _attempt in 0..2 {
            if client
                .as_ref()
                .is_none_or(tokio_postgres::Client::is_closed)
            {
                client = match tokio::time::timeout(reply_timeout, config.connect(NoTls)).await {
                    Ok(Ok((c, conn))) => {
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                tracing::debug!(error = %e, "runkeep-postgres: the notify connection ended");
                            }
                        });
                        Some(c)
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "runkeep-postgres: cannot open the notify connection; watchers poll meanwhile");
                        None
                    }
                    Err(_) => None,
                };
            }
            let Some(c) = client.as_ref() else { continue };
            sent.fetch_add(1, Ordering::Relaxed);
            match tokio::time::timeout(
                reply_timeout,
                c.execute(NOTIFY_MANY_SQL, &[&channel, &batch]),
            )
            .await
            {
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "runkeep-postgres: coalesced NOTIFY failed");
                    client = None;
                }
                Err(_) => client = None,
            }
        }
    }
}

/// The dedicated LISTEN connection: wakes the watchers of every change a
/// connection (of this or any process) commits. Reconnects after a fault;
/// watches poll at their fallback interval meanwhile.
pub(crate) async fn listen_loop(
    config: tokio_postgres::Config,
    channel: String,
    notifier: Arc<Notifier>,
) {
    use futures_util::StreamExt;
    let mut backoff = Doubling::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut conn)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(m) = messages.next().await {
                        match m {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                if tx.send(n.payload().to_string()).is_err() {
                                    break;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "runkeep-postgres: the LISTEN connection failed; reconnecting");
                                break;
                            }
                        }
                    }
                });
                if let Err(e) = client.batch_execute(&format!("LISTEN {channel}")).await {
                    tracing::warn!(error = %e, "runkeep-postgres: LISTEN failed; reconnecting");
                } else {
                    backoff.reset();
                    tracing::debug!(channel, "runkeep-postgres: listening");
                    // A change committed before this LISTEN (while the
                    // listener was starting, or down after a fault) was
                    // not delivered: every watch made meanwhile re-reads.
                    notifier.notify_all();
                    while let Some(payload) = rx.recv().await {
                        deliver(&notifier, &payload);
                    }
                }
                drop(client);
                driver.abort();
            }
            Err(e) => {
                tracing::warn!(error = %e, "runkeep-postgres: cannot open the LISTEN connection; watches poll meanwhile");
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
