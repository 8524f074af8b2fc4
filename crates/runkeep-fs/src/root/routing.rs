//! Every per-run call routed to its session's [`FsStore`]: reads answer
//! "nothing" for a session that does not exist, writes create the session
//! and tidy it away again when the call left it empty ([`write_op!`]).

use std::sync::Arc;

use runkeep::{ListingScope, Result, RunScope};

use super::layout::{self, key_of, SessionKey};
use super::session_cache::RootInner;
use crate::blocking;
use crate::fs_store::FsStore;

/// Whether a write's session directory was there before the call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum SessionDir {
    /// It existed: the call leaves it, whatever happens.
    Existed,
    /// This call created it: [`tidy`] removes it again if it is empty.
    Created,
}

/// Runs the blocking part of finding a session store off the runtime.
async fn with_inner<T, F>(inner: &Arc<RootInner>, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&RootInner) -> Result<T> + Send + 'static,
{
    let inner = inner.clone();
    blocking::run(move || f(&inner)).await
}

/// The store of the run's session when it exists (reads).
pub(super) async fn reading(inner: &Arc<RootInner>, scope: &RunScope) -> Result<Option<FsStore>> {
    let k = key_of(scope);
    with_inner(inner, move |i| i.existing(&k)).await
}

/// The store of the run's session, created if missing (writes), and
/// whether this call created the session's directory.
pub(super) async fn writing(
    inner: &Arc<RootInner>,
    scope: &RunScope,
) -> Result<(FsStore, SessionDir)> {
    let k = key_of(scope);
    with_inner(inner, move |i| {
        let dir = if layout::check_path(&i.root, &k)? {
            SessionDir::Existed
        } else {
            SessionDir::Created
        };
        i.creating(&k).map(|s| (s, dir))
    })
    .await
}

/// After a call that created its session's directory: removes it again
/// when the call left nothing in it (a refused write, a release of a run
/// that never existed), so such a call changes nothing on disk. Only empty
/// directories are removed (`rmdir`), so a run another process writes
/// meanwhile is never touched; that writer recreates what it needs.
pub(super) async fn tidy(inner: &Arc<RootInner>, scope: &RunScope, dir: SessionDir) {
    if dir == SessionDir::Existed {
        return;
    }
    let k = key_of(scope);
    let _ = with_inner(inner, move |i| {
        let runs = layout::session_path(&i.root, &k);
        let mut dirs = vec![runs.clone()];
        let mut up = runs.as_path();
        for _ in 0..3 {
            match up.parent() {
                Some(p) => {
                    dirs.push(p.to_path_buf());
                    up = p;
                }
                None => break,
            }
        }
        for (n, d) in dirs.iter().enumerate() {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
            if n == 0 {
                i.forget(&k);
            }
        }
        Ok(())
    })
    .await;
}

/// The sessions under `scope` that have a directory, with their stores.
pub(super) async fn sessions(
    inner: &Arc<RootInner>,
    scope: &ListingScope,
) -> Result<Vec<(SessionKey, FsStore)>> {
    let scope = scope.clone();
    with_inner(inner, move |i| i.sessions_under(&scope)).await
}

/// Runs a call that may write on the run's session store, creating the
/// session if missing and tidying it away again if the call left it empty.
macro_rules! write_op {
    ($inner:expr, $scope:ident, |$s:ident| $call:expr) => {{
        let ($s, dir) = $crate::root::routing::writing(&$inner, $scope).await?;
        let r = $call.await;
        $crate::root::routing::tidy(&$inner, $scope, dir).await;
        r
    }};
}
pub(super) use write_op;
