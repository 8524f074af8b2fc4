//! A watch over several sessions, or over one that does not exist yet:
//! each session's own watch forwarded into one, and the prefix rescanned
//! for new sessions.

use std::collections::HashSet;
use std::sync::Arc;

use runkeep::watch::{Watch, WatchTopic, DEFAULT_POLL};
use runkeep::CheckpointStore;

use super::layout::session_scope;
use super::{FsRootStore, SessionKey, MAX_WATCHED_SESSIONS, RESCAN};

impl FsRootStore {
    /// A watch over several sessions (or one that does not exist yet):
    /// each session's own watch forwarded into one, and the prefix
    /// rescanned every second for new sessions (a new one wakes it).
    pub(super) fn prefix_watch(&self, topic: &WatchTopic) -> Watch {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Watch::polling(DEFAULT_POLL);
        };
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let tx = Arc::new(tx);
        let (this, topic) = (self.clone(), topic.clone());
        let scope = match &topic {
            WatchTopic::Runnable(s) => s.clone(),
            WatchTopic::Events(r) => r.session_scope(),
        };
        let spawner = handle.clone();
        handle.spawn(async move {
            let mut watched: HashSet<SessionKey> = HashSet::new();
            let mut first = true;
            loop {
                let sessions = this.sessions_async(&scope).await.unwrap_or_default();
                let mut grew = false;
                let mut over = false;
                for (k, store) in sessions {
                    if watched.contains(&k) {
                        continue;
                    }
                    if watched.len() >= MAX_WATCHED_SESSIONS {
                        over = true;
                        continue;
                    }
                    watched.insert(k.clone());
                    grew = true;
                    let inner_topic = match &topic {
                        WatchTopic::Runnable(_) => WatchTopic::Runnable(session_scope(&k)),
                        WatchTopic::Events(r) => WatchTopic::Events(r.clone()),
                    };
                    let mut w = store.watch(&inner_topic);
                    let tx = tx.clone();
                    spawner.spawn(async move {
                        loop {
                            tokio::select! {
                                _ = tx.closed() => break,
                                _ = w.changed() => tx.send_modify(|n| *n = n.wrapping_add(1)),
                            }
                        }
                    });
                }
                if (grew && !first) || over {
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
                first = false;
                tokio::select! {
                    _ = tx.closed() => break,
                    _ = tokio::time::sleep(RESCAN) => {}
                }
            }
        });
        Watch::notified(rx, RESCAN)
    }
}
