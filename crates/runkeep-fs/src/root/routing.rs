//! Every per-run call routed to its session's [`FsStore`]: reads answer
//! "nothing" for a session that does not exist, writes create the session
//! and tidy it away again when the call left it empty.

use async_trait::async_trait;
use runkeep::checkpoint::Checkpoint;
use runkeep::watch::{Watch, WatchTopic};
use runkeep::{
    AuditRecord, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome,
    EventBatch, EvidenceStore, Fence, Lease, LeaseSummary, ListOptions, ListingScope,
    MessageSnapshot, NewAuditEvent, NewEvent, ParkResolution, PersistedEvent, ReadEventsOptions,
    Result, RunPage, RunRecord, RunScope, Timestamp,
};
use serde_json::Value;

use super::layout::key_of;
use super::{FsRootStore, RootInner, SessionKey};
use crate::{blocking, FsStore};

impl FsRootStore {
    /// Runs the blocking part of finding a session store off the runtime.
    pub(super) async fn with_inner<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&RootInner) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(move || f(&inner)).await
    }

    /// The store of the run's session when it exists (reads).
    pub(super) async fn reading(&self, scope: &RunScope) -> Result<Option<FsStore>> {
        let k = key_of(scope);
        self.with_inner(move |i| i.existing(&k)).await
    }

    /// The store of the run's session, created if missing (writes), and
    /// whether this call created the session's directory.
    pub(super) async fn writing(&self, scope: &RunScope) -> Result<(FsStore, bool)> {
        let k = key_of(scope);
        self.with_inner(move |i| {
            let existed = i.check_path(&k)?;
            i.creating(&k).map(|s| (s, !existed))
        })
        .await
    }

    /// After a call that created its session's directory: removes it again
    /// when the call left nothing in it (a refused write, a release of a
    /// run that never existed), so such a call changes nothing on disk.
    /// Only empty directories are removed (`rmdir`), so a run another
    /// process writes meanwhile is never touched; that writer recreates
    /// what it needs.
    pub(super) async fn tidy(&self, scope: &RunScope, created: bool) {
        if !created {
            return;
        }
        let k = key_of(scope);
        let _ = self
            .with_inner(move |i| {
                let runs = i.session_path(&k);
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
                        i.sessions
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&k);
                    }
                }
                Ok(())
            })
            .await;
    }

    pub(super) async fn sessions_async(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<(SessionKey, FsStore)>> {
        let scope = scope.clone();
        self.with_inner(move |i| i.sessions_under(&scope)).await
    }
}

/// Runs a call that may write on the run's session store, creating the
/// session if missing and tidying it away again if the call left it empty.
macro_rules! write_op {
    ($self:ident, $scope:ident, |$s:ident| $call:expr) => {{
        let ($s, created) = $self.writing($scope).await?;
        let r = $call.await;
        $self.tidy($scope, created).await;
        r
    }};
}

#[async_trait]
impl CheckpointStore for FsRootStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        write_op!(self, scope, |s| s
            .write_checkpoint(scope, checkpoint, fence))
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.read_checkpoint(scope, id).await,
            None => Ok(None),
        }
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.list_checkpoints(scope).await,
            None => Ok(Vec::new()),
        }
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        write_op!(self, scope, |s| s.delete_checkpoint(scope, id, fence))
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        write_op!(self, scope, |s| s
            .resolve_park(scope, id, resolution, now, fence))
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        write_op!(self, scope, |s| s
            .prune_checkpoints(scope, keep_last, fence))
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        self.list_across(scope, options).await
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        write_op!(self, scope, |s| s.claim(scope, options))
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        write_op!(self, scope, |s| s.release(scope, fence))
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        match self.reading(scope).await? {
            Some(s) => s.lease(scope, now).await,
            None => Ok(None),
        }
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        self.claim_next_across(scope, filter, options).await
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        match self.reading(scope).await? {
            Some(s) => s.lifecycle(scope).await,
            None => Ok(runkeep::Lifecycle::default()),
        }
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &runkeep::EnqueueOptions,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        options.validate(&scope.run_id)?;
        write_op!(self, scope, |s| s.enqueue(scope, checkpoint, options))
    }

    async fn finish(
        &self,
        scope: &RunScope,
        fence: Fence,
        outcome: &runkeep::Outcome,
    ) -> Result<runkeep::Lifecycle> {
        outcome.validate(&scope.run_id)?;
        write_op!(self, scope, |s| s.finish(scope, fence, outcome))
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        write_op!(self, scope, |s| s.snooze(scope, fence, until))
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &runkeep::AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<runkeep::Lifecycle> {
        error.validate(&scope.run_id)?;
        write_op!(self, scope, |s| s.fail_attempt(
            scope,
            fence,
            error,
            max_attempts
        ))
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<runkeep::Lifecycle> {
        runkeep::failure::check_cancel_reason(&scope.run_id, reason)?;
        write_op!(self, scope, |s| s.cancel(scope, reason))
    }

    async fn reopen(&self, scope: &RunScope) -> Result<runkeep::Lifecycle> {
        write_op!(self, scope, |s| s.reopen(scope))
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.latest_checkpoint(scope).await,
            None => Ok(None),
        }
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.find_pending(scope, now).await,
            None => Ok(None),
        }
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        match self.reading(scope).await? {
            Some(s) => s.resume_point(scope, now).await,
            None => Ok(None),
        }
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        // One existing session: its own watch. A prefix, or a session not
        // created yet: the forwarding watch.
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
            if let Ok(Some(store)) = self.inner.existing(&k) {
                return store.watch(topic);
            }
        }
        self.prefix_watch(topic)
    }
}

#[async_trait]
impl EvidenceStore for FsRootStore {
    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &runkeep::Step,
    ) -> Result<runkeep::StepReceipt> {
        write_op!(self, scope, |s| s.commit_step(scope, fence, step))
    }

    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        write_op!(self, scope, |s| s.append_events(scope, events, fence))
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        match self.reading(scope).await? {
            Some(s) => s.read_events(scope, options).await,
            None => Ok(EventBatch::default()),
        }
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        write_op!(self, scope, |s| s.write_run_record(scope, record, fence))
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        match self.reading(scope).await? {
            Some(s) => s.read_run_record(scope).await,
            None => Ok(None),
        }
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        write_op!(self, scope, |s| s.write_messages(
            scope,
            messages,
            through_event_seq,
            fence
        ))
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        match self.reading(scope).await? {
            Some(s) => s.read_messages(scope).await,
            None => Ok(MessageSnapshot::Unavailable),
        }
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        write_op!(self, scope, |s| s.write_report(scope, report, fence))
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        match self.reading(scope).await? {
            Some(s) => s.read_report(scope).await,
            None => Ok(None),
        }
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        write_op!(self, scope, |s| s.append_audit(scope, events, fence))
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        match self.reading(scope).await? {
            Some(s) => s.read_audit(scope, since_seq).await,
            None => Ok(Vec::new()),
        }
    }
}
