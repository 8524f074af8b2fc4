//! A watch over several sessions, or over one that does not exist yet:
//! each session's own watch forwarded into one, and the prefix rescanned
//! for new sessions.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use runkeep::watch::{Watch, WatchTopic, DEFAULT_POLL};
use runkeep::CheckpointStore;

use super::layout::{key_of, session_scope, SessionKey};
use super::routing;
use super::session_cache::RootInner;

/// Above this many sessions a prefix watch stops adding per-session
/// watches (each holds an inotify thread) and wakes on every rescan
/// instead (once a second).
pub const MAX_WATCHED_SESSIONS: usize = 64;
/// How often a prefix watch looks for new sessions (and, like a session's
/// own watch, wakes at least this often: a lapsed lease changes no file).
const RESCAN: Duration = Duration::from_secs(1);

/// The watch of a root: one existing session's own watch, else (a prefix,
/// or a session not created yet) the forwarding [`prefix_watch`].
pub(super) fn watch(inner: &Arc<RootInner>, topic: &WatchTopic) -> Watch {
    let one = match topic {
        WatchTopic::Events(run) => Some(key_of(run)),
        WatchTopic::Runnable(s) => match (s.project_id(), s.session_id()) {
            (Some(p), Some(ses)) => Some(SessionKey {
                tenant_id: s.tenant_id().clone(),
                project_id: p.clone(),
                session_id: ses.clone(),
            }),
            _ => None,
        },
    };
    if let Some(k) = one {
        if let Ok(Some(store)) = inner.existing(&k) {
            return store.watch(topic);
        }
    }
    prefix_watch(inner, topic)
}

/// A watch over several sessions (or one that does not exist yet):
/// each session's own watch forwarded into one, and the prefix
/// rescanned every second for new sessions (a new one wakes it).
fn prefix_watch(inner: &Arc<RootInner>, topic: &WatchTopic) -> Watch {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return Watch::polling(DEFAULT_POLL);
    };
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let tx = Arc::new(tx);
    let (inner, topic) = (inner.clone(), topic.clone());
    let scope = match &topic {
        WatchTopic::Runnable(s) => s.clone(),
        WatchTopic::Events(r) => r.session_scope(),
    };
    let spawner = handle.clone();
    handle.spawn(async move {
        let mut watched: HashSet<SessionKey> = HashSet::new();
        let mut first = true;
        loop {
            let sessions = routing::sessions(&inner, &scope).await.unwrap_or_default();
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
