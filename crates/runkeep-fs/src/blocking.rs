//! Running a blocking store operation off the async runtime's worker
//! threads: what every async method of [`crate::FsStore`] and
//! [`crate::FsRootStore`] does with its job.

use runkeep::{Error, Result};

/// Runs `f` on the runtime's blocking pool (inline when there is no
/// runtime), with the principal the task acts for.
pub(crate) async fn run<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    // The principal the task acts for (runkeep::acting) goes with the work
    // to the blocking thread, where the fence checks read it.
    let actor = runkeep::acting::current();
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => match handle
            .spawn_blocking(move || runkeep::acting::sync_scope(actor, f))
            .await
        {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::Backend {
                message: format!("a directory-store operation was cancelled: {e}"),
                source: None,
            }),
        },
        Err(_) => f(),
    }
}
