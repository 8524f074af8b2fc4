//! Wake-ups across processes without serialising commits.
//!
//! A `NOTIFY` inside a data transaction takes PostgreSQL's global notify
//! lock at commit and holds it until the commit record is flushed, so every
//! committing transaction that notifies waits for the previous one's flush:
//! commits stop sharing a WAL flush. So the store never notifies inside a
//! data transaction. After a change commits, [`Bus::announce`]:
//!
//! - wakes this process's watchers at once, in memory (no server involved);
//! - queues the change for the other processes. The store's one listener
//!   connection (the one that `LISTEN`s) sends whatever is queued as one
//!   statement, `pg_notify` per distinct run, in a transaction of its own
//!   committed with `synchronous_commit = off` (a notification is worth
//!   nothing after a server crash, which ends every `LISTEN` anyway), and
//!   sends the next batch only after that reply: at most one notify
//!   transaction per store at a time, however many commits it covers, and
//!   none of them in any caller's round trips.
//!
//! Every process that watches listens on the store's channel, and every
//! change is announced (the store cannot know which other processes watch:
//! it costs one small transaction per batch to tell them all). A
//! notification from the store's own listener connection is skipped there
//! (its watchers were already woken). Wake-ups may be spurious, never
//! lost while the process lives: a batch that fails is queued again and
//! sent on the next connection; what a process that dies between its commit
//! and the batch would have sent is caught by the watchers' fallback poll,
//! as a lapsed lease is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runkeep::watch::Notifier;
use runkeep::RunScope;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_postgres::NoTls;

/// Most notifications sent in one statement.
const BATCH: usize = 1000;

/// The statement that sends a batch: one notification per payload, in an
/// implicit transaction whose commit does not wait for its flush.
const NOTIFY_SQL: &str = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, p) FROM unnest($2::text[]) AS p";

/// Changes waiting to be announced to other processes, and the signals of
/// the listener task.
#[derive(Debug, Default)]
pub(crate) struct Bus {
    /// Run scope (its JSON) → whether it has new events.
    pending: Mutex<HashMap<String, bool>>,
    wake: Notify,
    closing: Notify,
    closed: AtomicBool,
}

impl Bus {
    /// A committed change of `scope` (with new events when `events`):
    /// wakes `local` watchers now and queues the notification.
    pub fn announce(&self, local: &Notifier, scope: &RunScope, events: bool) {
        local.notify_run(scope, events);
        let Ok(key) = serde_json::to_string(scope) else {
            return;
        };
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let e = p.entry(key).or_insert(false);
            *e |= events;
        }
        self.wake.notify_one();
    }

    /// The store is gone: the task sends what is queued and ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.closing.notify_one();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Up to [`BATCH`] queued changes.
    fn take(&self) -> Vec<(String, bool)> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() <= BATCH {
            return p.drain().collect();
        }
        let keys: Vec<String> = p.keys().take(BATCH).cloned().collect();
        keys.into_iter()
            .filter_map(|k| p.remove_entry(&k))
            .collect()
    }

    fn put_back(&self, batch: Vec<(String, bool)>) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (k, events) in batch {
            *p.entry(k).or_insert(false) |= events;
        }
    }

    fn has_pending(&self) -> bool {
        !self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

fn payload(scope_json: &str, events: bool) -> String {
    format!("{{\"s\":{scope_json},\"e\":{events}}}")
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

/// Sends one batch; false when the connection failed (the batch is queued
/// again).
async fn send_batch(
    client: &tokio_postgres::Client,
    statement: &tokio_postgres::Statement,
    channel: &str,
    bus: &Bus,
    bound: Duration,
) -> bool {
    let batch = bus.take();
    if batch.is_empty() {
        return true;
    }
    let payloads: Vec<String> = batch.iter().map(|(k, e)| payload(k, *e)).collect();
    let channel = channel.to_string();
    match tokio::time::timeout(bound, client.execute(statement, &[&channel, &payloads])).await {
        Ok(Ok(_)) => {
            if bus.has_pending() {
                bus.wake.notify_one();
            }
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "runkeep-postgres: sending wake-ups failed; reconnecting");
            bus.put_back(batch);
            false
        }
        Err(_) => {
            tracing::warn!("runkeep-postgres: sending wake-ups got no reply; reconnecting");
            bus.put_back(batch);
            false
        }
    }
}

/// The listener connection: `LISTEN`s and wakes this process's watchers of
/// every change another process (or another store) commits, and sends this
/// store's queued announcements. Reconnects after a fault (watches poll at
/// their fallback interval meanwhile); ends when the store closes the bus.
pub(crate) async fn listen_loop(
    config: tokio_postgres::Config,
    channel: String,
    notifier: Arc<Notifier>,
    bus: Arc<Bus>,
    reply_timeout: Duration,
) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(100);
    loop {
        if bus.is_closed() {
            return;
        }
        match config.connect(NoTls).await {
            Ok((client, mut conn)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i32, String)>();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(m) = messages.next().await {
                        match m {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                if tx.send((n.process_id(), n.payload().to_string())).is_err() {
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
                let ready = async {
                    let own: i32 = client
                        .query_one("SELECT pg_backend_pid()", &[])
                        .await?
                        .get(0);
                    let st = client.prepare(NOTIFY_SQL).await?;
                    // Last: until something is sent, `pg_stat_activity`
                    // shows this connection's LISTEN.
                    client.batch_execute(&format!("LISTEN {channel}")).await?;
                    Ok::<_, tokio_postgres::Error>((own, st))
                };
                match tokio::time::timeout(reply_timeout, ready).await {
                    Ok(Ok((own, statement))) => {
                        backoff = Duration::from_millis(100);
                        tracing::debug!(channel, "runkeep-postgres: listening");
                        // Send what queued up while there was no connection.
                        bus.wake.notify_one();
                        loop {
                            tokio::select! {
                                m = rx.recv() => match m {
                                    Some((pid, payload)) => {
                                        if pid != own {
                                            deliver(&notifier, &payload);
                                        }
                                    }
                                    None => break,
                                },
                                () = bus.wake.notified() => {
                                    if !send_batch(&client, &statement, &channel, &bus, reply_timeout).await {
                                        break;
                                    }
                                }
                                () = bus.closing.notified() => {
                                    while bus.has_pending() {
                                        if !send_batch(&client, &statement, &channel, &bus, reply_timeout).await {
                                            break;
                                        }
                                    }
                                    driver.abort();
                                    return;
                                }
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "runkeep-postgres: LISTEN failed; reconnecting");
                    }
                    Err(_) => {
                        tracing::warn!("runkeep-postgres: LISTEN got no reply; reconnecting");
                    }
                }
                drop(client);
                driver.abort();
            }
            Err(e) => {
                tracing::warn!(error = %e, "runkeep-postgres: cannot open the LISTEN connection; watches poll meanwhile");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = bus.closing.notified() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
