//! Waiting instead of polling (contract v2): a store can wake idle workers
//! and followers when something they wait for may have changed — a run
//! became runnable in a scope, or a run got new events.
//!
//! A [`Watch`] resolves [`changed`](Watch::changed) on a notification, or
//! after its polling interval when the store cannot notify (the fallback
//! every store has). Wake-ups may be spurious: the caller re-reads the store
//! and waits again. The memory store notifies in process ([`Notifier`]); a
//! directory store can use inotify; PostgreSQL LISTEN/NOTIFY.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use crate::scope::{ListingScope, RunScope};

/// The polling interval of a store that cannot notify.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);

/// What to wait for.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum WatchTopic {
    /// A run under this scope may have become runnable (written, released,
    /// snoozed, reopened, enqueued, its lease lapsed).
    Runnable(ListingScope),
    /// This run may have new events.
    Events(RunScope),
}

/// A subscription; see the module docs.
#[derive(Debug)]
pub struct Watch {
    rx: Option<watch::Receiver<u64>>,
    every: Duration,
}

impl Watch {
    /// A watch that only polls, every `every`.
    pub fn polling(every: Duration) -> Self {
        Self { rx: None, every }
    }

    /// A watch woken by `rx`, and in any case every `fallback` (so a lost
    /// notification, or a change by another process the notifier cannot
    /// see, costs at most one interval).
    pub fn notified(rx: watch::Receiver<u64>, fallback: Duration) -> Self {
        Self {
            rx: Some(rx),
            every: fallback,
        }
    }

    /// True when this watch is woken only by its interval.
    pub fn is_polling(&self) -> bool {
        self.rx.is_none()
    }

    /// The polling (or fallback) interval.
    pub fn interval(&self) -> Duration {
        self.every
    }

    /// Resolves when something may have changed.
    pub async fn changed(&mut self) {
        match &mut self.rx {
            None => tokio::time::sleep(self.every).await,
            Some(rx) => {
                tokio::select! {
                    r = rx.changed() => {
                        if r.is_err() {
                            // The notifier is gone: fall back to polling.
                            self.rx = None;
                            tokio::time::sleep(self.every).await;
                        }
                    }
                    _ = tokio::time::sleep(self.every) => {}
                }
            }
        }
    }
}

/// In-process notifications by topic (what the memory store uses; any
/// backend can use it for the changes its own process makes).
#[derive(Debug, Default)]
pub struct Notifier {
    topics: Mutex<HashMap<WatchTopic, watch::Sender<u64>>>,
}

impl Notifier {
    /// A subscription to `topic`.
    pub fn subscribe(&self, topic: &WatchTopic, fallback: Duration) -> Watch {
        let mut t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let tx = t
            .entry(topic.clone())
            .or_insert_with(|| watch::channel(0).0);
        Watch::notified(tx.subscribe(), fallback)
    }

    /// Wakes the watchers of `topic`.
    pub fn notify(&self, topic: &WatchTopic) {
        let t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = t.get(topic) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every watcher (what a store's listener does once it listens
    /// again, after starting or reconnecting: a change committed while it
    /// could not hear was not delivered, so every watch re-reads).
    pub fn notify_all(&self) {
        let t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        for tx in t.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes the watchers of every `Runnable` scope that contains `run`, and
    /// (with `events`) the run's event watchers.
    pub fn notify_run(&self, run: &RunScope, events: bool) {
        let t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        for (topic, tx) in t.iter() {
            let hit = match topic {
                WatchTopic::Runnable(scope) => run.is_within(scope),
                WatchTopic::Events(r) => events && r == run,
            };
            if hit {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }
}
