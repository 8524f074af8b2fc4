//! [`Worker`]: the drain loop over `claim_next`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::error::WorkerError;
use crate::handle::RunHandle;
use crate::keeper::{KeeperOptions, LeaseKeeper};
use runkeep::checkpoint::Checkpoint;
use runkeep::error::{BoxError, Error, Result};
use runkeep::id::Holder;
use runkeep::lease::{ClaimOptions, Fence, Lease};
use runkeep::scope::{ListingScope, RunScope};
use runkeep::store::{ClaimNextFilter, RunStore};
use runkeep::time::Ttl;

/// How many failures of each kind a [`DrainReport`] lists (the counters
/// count all of them).
pub const MAX_LISTED: usize = 100;

/// How many finished runs a drain remembers, to skip them when `claim_next`
/// hands them back. Older ones are forgotten (and stepped again if handed
/// back: correct, only slower).
pub const MAX_REMEMBERED_FINISHED: usize = 100_000;

/// What a step tells the drain about the run it was given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StepOutcome {
    /// The run needs no more work (it completed, or there is nothing this
    /// worker can do for it). The drain does not step it again.
    Finished,
    /// More work remains: release it; it may be stepped again in the next
    /// pass, by this worker or another.
    Yield,
}

/// When a drain stops on its own.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum DrainMode {
    /// Poll forever (backing off while idle) until shutdown.
    #[default]
    Continuous,
    /// Stop after the first pass in which no step succeeded (the queue held
    /// nothing new, or only runs that keep failing).
    UntilIdle,
}

/// Backoff while the queue is empty: `min × 2^streak`, capped at `max`, each
/// delay shortened by a random part of up to `jitter` of itself (so a pool of
/// idle workers does not poll in step).
#[derive(Clone, Debug)]
pub struct IdleBackoff {
    /// First delay. Default 100 ms.
    pub min: Duration,
    /// Largest delay. Default 5 s.
    pub max: Duration,
    /// Fraction of each delay that is random, in `[0, 1]`. Default 0.5.
    pub jitter: f64,
}

impl Default for IdleBackoff {
    fn default() -> Self {
        Self {
            min: Duration::from_millis(100),
            max: Duration::from_secs(5),
            jitter: 0.5,
        }
    }
}

impl IdleBackoff {
    /// Refuses a zero `min`, `max < min` and a jitter outside `[0, 1]`.
    pub fn validate(&self) -> Result<()> {
        if self.min.is_zero() {
            return Err(Error::invalid("idle backoff minimum must be positive"));
        }
        if self.max < self.min {
            return Err(Error::invalid(format!(
                "idle backoff maximum {:?} is below its minimum {:?}",
                self.max, self.min
            )));
        }
        if !(self.jitter.is_finite() && (0.0..=1.0).contains(&self.jitter)) {
            return Err(Error::invalid(format!(
                "idle backoff jitter {} must lie in [0, 1]",
                self.jitter
            )));
        }
        Ok(())
    }

    /// The delay after `streak` idle rounds in a row, given a uniform draw
    /// `unit` in `[0, 1)`: the pure rule behind [`IdleBackoff::next_delay`].
    pub fn delay(&self, streak: u32, unit: f64) -> Duration {
        let base = self
            .min
            .saturating_mul(2u32.saturating_pow(streak.min(31)))
            .min(self.max);
        base.mul_f64(1.0 - self.jitter * unit.clamp(0.0, 1.0))
    }

    /// The delay after `streak` idle rounds, with a random draw.
    pub fn next_delay(&self, streak: u32) -> Duration {
        self.delay(streak, rand::thread_rng().gen::<f64>())
    }
}

/// Options of a [`Worker`].
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Who claims. Unique per process ([`Holder::unique`]): it is the only
    /// thing that tells a renewal from a theft (CS-52).
    pub holder: Holder,
    /// Lease TTL for claims and renewals.
    pub ttl: Ttl,
    /// Runs held and stepped at once (at least 1). Default 1.
    pub concurrency: usize,
    /// Renewal settings (and the clock).
    pub keeper: KeeperOptions,
    /// Which runs `claim_next` may take, in which order.
    pub filter: ClaimNextFilter,
    /// Backoff while idle.
    pub idle: IdleBackoff,
    /// Stop on an empty queue, or keep polling.
    pub mode: DrainMode,
    /// After shutdown is requested, how long runs in flight may take to
    /// finish before their steps are dropped and the runs released. Default
    /// 10 s.
    pub shutdown_grace: Duration,
}

impl WorkerOptions {
    /// Defaults for `holder` and `ttl`.
    pub fn new(holder: Holder, ttl: Ttl) -> Self {
        Self {
            holder,
            ttl,
            concurrency: 1,
            keeper: KeeperOptions::default(),
            filter: ClaimNextFilter::default(),
            idle: IdleBackoff::default(),
            mode: DrainMode::default(),
            shutdown_grace: Duration::from_secs(10),
        }
    }

    /// Refuses an empty holder, a zero concurrency and bad keeper or backoff
    /// settings.
    pub fn validate(&self) -> Result<()> {
        if self.holder.as_str().trim().is_empty() {
            return Err(Error::invalid(
                "worker holder is empty; it must name this process uniquely (Holder::unique)",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid(
                "worker concurrency is 0; it must be at least 1 (runs held and stepped at once)",
            ));
        }
        if let Some(p) = &self.filter.park {
            if p.is_empty() {
                return Err(Error::invalid(
                    "park filter is an empty set; pass none to take any run, or name at least one park state",
                ));
            }
        }
        self.keeper.validate()?;
        self.idle.validate()
    }
}

/// Why a drain returned.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub enum DrainStop {
    /// Shutdown was requested.
    #[default]
    Shutdown,
    /// [`DrainMode::UntilIdle`] and a pass in which no step succeeded.
    Idle,
    /// `claim_next` failed with an error retrying cannot fix.
    ClaimError {
        /// [`Error::kind`].
        kind: &'static str,
        /// The message.
        message: String,
    },
}

/// How a stepped run ended, when it did not end well.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FailureKind {
    /// The step (or reading its resume point) returned an error or panicked.
    Failed,
    /// The lease was lost while the run was being stepped.
    FencedOut,
    /// Shutdown's grace ran out and the step was dropped.
    Interrupted,
}

/// A run that did not end well.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RunFailure {
    /// The run.
    pub scope: RunScope,
    /// How.
    pub kind: FailureKind,
    /// Why.
    pub message: String,
}

/// A release that failed (the run stays unclaimable until its lease expires).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ReleaseFailure {
    /// The run.
    pub scope: RunScope,
    /// The fence the release presented.
    pub fence: Fence,
    /// The store's error.
    pub message: String,
}

/// What a drain did.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct DrainReport {
    /// Runs claimed and stepped.
    pub claimed: u64,
    /// Steps that answered [`StepOutcome::Finished`].
    pub completed: u64,
    /// Steps that answered [`StepOutcome::Yield`].
    pub yielded: u64,
    /// Steps that failed (error or panic, or the resume point could not be
    /// read).
    pub failed: u64,
    /// Runs whose lease was lost while stepped (the step was stopped).
    pub fenced_out: u64,
    /// Runs whose step was dropped when the shutdown grace ran out.
    pub interrupted: u64,
    /// Releases that took effect (stepped runs and skip holds).
    pub released: u64,
    /// Releases that found the fence already superseded (nothing to release).
    pub release_superseded: u64,
    /// Releases that failed.
    pub release_failed: u64,
    /// Runs `claim_next` handed back that this drain had already stepped in
    /// the pass (or finished): held without work until the pass ended, so
    /// the queue could move past them.
    pub skipped: u64,
    /// Passes over the queue (a pass ends when `claim_next` finds nothing
    /// and no run is in flight).
    pub passes: u64,
    /// `claim_next` calls that failed.
    pub claim_errors: u64,
    /// The first [`MAX_LISTED`] failed, fenced-out and interrupted runs.
    pub failures: Vec<RunFailure>,
    /// The first [`MAX_LISTED`] failed releases.
    pub release_failures: Vec<ReleaseFailure>,
    /// Why the drain returned.
    pub stopped: DrainStop,
}

impl DrainReport {
    fn fail(&mut self, scope: RunScope, kind: FailureKind, message: String) {
        match kind {
            FailureKind::Failed => self.failed += 1,
            FailureKind::FencedOut => self.fenced_out += 1,
            FailureKind::Interrupted => self.interrupted += 1,
        }
        if self.failures.len() < MAX_LISTED {
            self.failures.push(RunFailure {
                scope,
                kind,
                message,
            });
        }
    }

    fn release(&mut self, scope: &RunScope, fence: Fence, result: Result<bool>) {
        match result {
            Ok(true) => self.released += 1,
            Ok(false) => self.release_superseded += 1,
            Err(e) => {
                tracing::warn!(run = %scope, %fence, error = %e, "release failed; the run stays unclaimable until its lease expires");
                self.release_failed += 1;
                if self.release_failures.len() < MAX_LISTED {
                    self.release_failures.push(ReleaseFailure {
                        scope: scope.clone(),
                        fence,
                        message: e.to_string(),
                    });
                }
            }
        }
    }
}

/// A pool of runs drained from one store: `claim_next` → resume point → the
/// host's step → release, up to `concurrency` runs at once, each kept by a
/// [`LeaseKeeper`].
///
/// # The loop
///
/// 1. Wait for a free slot, then `claim_next(scope, filter)`. Leases are
///    taken only as work starts.
/// 2. Read the run's resume point ([`RunStoreExt::resume_point`]) and call
///    the step with a [`RunHandle`] and that checkpoint. The step runs in its
///    own task; renewals run in the background.
/// 3. When the step returns (or panics), when the lease is lost (the step is
///    then dropped at once: its writes would be refused anyway), or when
///    shutdown's grace runs out, release the run. Always; a failed release
///    is reported, never swallowed.
///
/// # Passes, and runs that stay in the queue
///
/// The store keeps no run status: a finished run stays claimable, and
/// `claim_next` always answers the first claimable run in order, so a naive
/// loop would step the same run forever. The drain therefore works in
/// passes: within a pass each run is stepped at most once, and a run
/// `claim_next` hands back again (or one the step called
/// [`StepOutcome::Finished`]) is held without work until the pass ends, so
/// the queue moves past it. A pass ends when `claim_next` finds nothing and
/// no run is in flight; the skip holds are then released. A pass in which no
/// step succeeded (nothing to step, or every step failed) is idle:
/// [`DrainMode::UntilIdle`] stops there, [`DrainMode::Continuous`] backs off
/// ([`IdleBackoff`]) and polls again. So a failing run is retried once per
/// pass while other runs progress, and never in a hot loop.
/// Runs that stay finished cost one claim and one release per pass: moving
/// them out of the queue (answer their park, filter on park state) is
/// cheaper for large queues.
///
/// # Shutdown
///
/// Cancel the `shutdown` token (see [`cancel_on_signal`]): no new run is
/// claimed, runs in flight see their [`RunHandle::stop_token`] cancelled and
/// get `shutdown_grace` to finish; then their steps are dropped and every
/// held run (and skip hold) is released before `drain` returns.
#[derive(Debug)]
pub struct Worker {
    store: Arc<dyn RunStore>,
    scope: ListingScope,
    options: WorkerOptions,
}

struct Ran {
    scope: RunScope,
    fence: Fence,
    outcome: Result<StepOutcome, (FailureKind, String)>,
    release: Result<bool>,
}

impl Worker {
    /// A worker over `scope`; refuses invalid options.
    pub fn new(
        store: Arc<dyn RunStore>,
        scope: ListingScope,
        options: WorkerOptions,
    ) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            store,
            scope,
            options,
        })
    }

    /// The options in force.
    pub fn options(&self) -> &WorkerOptions {
        &self.options
    }

    /// Drains until shutdown (or, in [`DrainMode::UntilIdle`], an idle pass,
    /// or a `claim_next` error retrying cannot fix) and reports what
    /// happened. See the type's documentation for the loop.
    pub async fn drain<F, Fut, E>(&self, shutdown: CancellationToken, step: F) -> DrainReport
    where
        F: Fn(RunHandle, Option<Checkpoint>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<StepOutcome, E>> + Send + 'static,
        E: Into<BoxError> + Send + 'static,
    {
        let opts = &self.options;
        let step = Arc::new(step);
        let slots = Arc::new(Semaphore::new(opts.concurrency));
        let mut tasks: JoinSet<Ran> = JoinSet::new();
        let mut in_flight: HashMap<tokio::task::Id, RunScope> = HashMap::new();
        let mut report = DrainReport::default();
        let mut visited: HashSet<RunScope> = HashSet::new();
        let mut finished = Remembered::default();
        let mut skip_holds: HashMap<RunScope, Fence> = HashMap::new();
        let mut progressed = false;
        let mut idle_streak = 0u32;

        let stopped = 'drain: loop {
            while let Some(joined) = tasks.try_join_next_with_id() {
                progressed |= absorb(joined, &mut in_flight, &mut report, &mut finished);
            }
            let slot = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break 'drain DrainStop::Shutdown,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break 'drain DrainStop::Shutdown,
                },
            };
            let sent_at = Instant::now();
            let claim =
                ClaimOptions::new(opts.holder.clone(), opts.ttl).at(opts.keeper.clock.now());
            match self
                .store
                .claim_next(&self.scope, &opts.filter, &claim)
                .await
            {
                Ok(Some((run, lease))) => {
                    if visited.contains(&run) || finished.contains(&run) {
                        report.skipped += 1;
                        skip_holds.insert(run, lease.fence);
                        continue;
                    }
                    visited.insert(run.clone());
                    report.claimed += 1;
                    let job = run_one(
                        self.store.clone(),
                        run.clone(),
                        lease,
                        sent_at,
                        opts.clone(),
                        step.clone(),
                        shutdown.clone(),
                    );
                    let handle = tasks.spawn(async move {
                        let ran = job.await;
                        drop(slot);
                        ran
                    });
                    in_flight.insert(handle.id(), run);
                }
                Ok(None) => {
                    drop(slot);
                    if !tasks.is_empty() {
                        // The pass goes on: wait for a run to come back, or
                        // poll again after a short pause.
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => break 'drain DrainStop::Shutdown,
                            Some(joined) = tasks.join_next_with_id() => {
                                progressed |= absorb(joined, &mut in_flight, &mut report, &mut finished);
                            }
                            _ = sleep(opts.idle.next_delay(0)) => {}
                        }
                        continue;
                    }
                    report.passes += 1;
                    visited.clear();
                    release_holds(&*self.store, &mut skip_holds, &mut report).await;
                    if std::mem::take(&mut progressed) {
                        idle_streak = 0;
                        continue;
                    }
                    if opts.mode == DrainMode::UntilIdle {
                        break 'drain DrainStop::Idle;
                    }
                    let pause = opts.idle.next_delay(idle_streak);
                    idle_streak = idle_streak.saturating_add(1);
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break 'drain DrainStop::Shutdown,
                        _ = sleep(pause) => {}
                    }
                }
                Err(e) => {
                    drop(slot);
                    report.claim_errors += 1;
                    if !e.is_retryable() {
                        tracing::error!(error = %e, "claim_next failed; the drain stops claiming");
                        break 'drain DrainStop::ClaimError {
                            kind: e.kind(),
                            message: e.to_string(),
                        };
                    }
                    tracing::debug!(error = %e, "claim_next failed; backing off");
                    let pause = opts.idle.next_delay(idle_streak);
                    idle_streak = idle_streak.saturating_add(1);
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break 'drain DrainStop::Shutdown,
                        _ = sleep(pause) => {}
                    }
                }
            }
        };
        // Runs in flight watch the shutdown token themselves (grace, then
        // drop and release); otherwise they finish normally.
        while let Some(joined) = tasks.join_next_with_id().await {
            absorb(joined, &mut in_flight, &mut report, &mut finished);
        }
        release_holds(&*self.store, &mut skip_holds, &mut report).await;
        report.stopped = stopped;
        report
    }
}

/// Runs remembered as finished, oldest forgotten first.
#[derive(Default)]
struct Remembered {
    set: HashSet<RunScope>,
    order: VecDeque<RunScope>,
}

impl Remembered {
    fn contains(&self, run: &RunScope) -> bool {
        self.set.contains(run)
    }

    fn insert(&mut self, run: RunScope) {
        if self.set.insert(run.clone()) {
            self.order.push_back(run);
            if self.order.len() > MAX_REMEMBERED_FINISHED {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// Books a run's end; true when its step succeeded (the pass progressed).
fn absorb(
    joined: std::result::Result<(tokio::task::Id, Ran), JoinError>,
    in_flight: &mut HashMap<tokio::task::Id, RunScope>,
    report: &mut DrainReport,
    finished: &mut Remembered,
) -> bool {
    match joined {
        Ok((id, ran)) => {
            in_flight.remove(&id);
            let progressed = ran.outcome.is_ok();
            match ran.outcome {
                Ok(StepOutcome::Finished) => {
                    report.completed += 1;
                    finished.insert(ran.scope.clone());
                }
                Ok(StepOutcome::Yield) => report.yielded += 1,
                Err((kind, message)) => report.fail(ran.scope.clone(), kind, message),
            }
            report.release(&ran.scope, ran.fence, ran.release);
            progressed
        }
        Err(e) => {
            // The run's own task (not the step) died: nothing was released.
            let scope = in_flight.remove(&e.id());
            tracing::error!(run = ?scope, error = %e, "a run task of the drain died");
            if let Some(scope) = scope {
                report.fail(
                    scope,
                    FailureKind::Failed,
                    format!("the worker's run task died: {e}"),
                );
            }
            false
        }
    }
}

async fn release_holds(
    store: &dyn RunStore,
    holds: &mut HashMap<RunScope, Fence>,
    report: &mut DrainReport,
) {
    for (scope, fence) in holds.drain() {
        let result = store.release(&scope, fence).await;
        report.release(&scope, fence, result);
    }
}

/// One run: keep its lease, step it, release it.
async fn run_one<F, Fut, E>(
    store: Arc<dyn RunStore>,
    scope: RunScope,
    lease: Lease,
    sent_at: Instant,
    opts: WorkerOptions,
    step: Arc<F>,
    shutdown: CancellationToken,
) -> Ran
where
    F: Fn(RunHandle, Option<Checkpoint>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<StepOutcome, E>> + Send + 'static,
    E: Into<BoxError> + Send + 'static,
{
    let fence = lease.fence;
    let keeper = match LeaseKeeper::start_at(
        store.clone(),
        scope.clone(),
        lease,
        opts.ttl,
        opts.keeper.clone(),
        sent_at,
    ) {
        Ok(k) => k,
        Err(e) => {
            let release = store.release(&scope, fence).await;
            return Ran {
                scope,
                fence,
                outcome: Err((
                    FailureKind::Failed,
                    format!("could not keep the lease: {e}"),
                )),
                release,
            };
        }
    };
    let handle = keeper.handle();
    let outcome = async {
        let resume = store
            .resume_point(&scope, handle.now())
            .await
            .map_err(|e| (FailureKind::Failed, format!("reading the resume point: {e}")))?;
        let mut task = tokio::spawn((step)(handle.clone(), resume));
        let lost = handle.cancellation_token();
        let mut grace_ends: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                joined = &mut task => return classify(joined, &handle),
                _ = lost.cancelled() => {
                    task.abort();
                    let _ = task.await;
                    let loss = handle.loss().map(|l| l.to_string()).unwrap_or_default();
                    return Err((FailureKind::FencedOut, format!("the step was stopped: {loss}")));
                }
                _ = shutdown.cancelled(), if grace_ends.is_none() => {
                    keeper.request_stop();
                    grace_ends = Some(Instant::now() + opts.shutdown_grace);
                }
                _ = sleep_until(grace_ends.unwrap_or_else(Instant::now)), if grace_ends.is_some() => {
                    task.abort();
                    let _ = task.await;
                    return Err((
                        FailureKind::Interrupted,
                        format!("the step did not finish within the shutdown grace of {:?}", opts.shutdown_grace),
                    ));
                }
            }
        }
    }
    .await;
    let fence = handle.fence();
    let release = keeper.release().await;
    Ran {
        scope,
        fence,
        outcome,
        release,
    }
}

fn classify<E: Into<BoxError>>(
    joined: std::result::Result<std::result::Result<StepOutcome, E>, JoinError>,
    handle: &RunHandle,
) -> std::result::Result<StepOutcome, (FailureKind, String)> {
    let lost = || handle.loss().map(|l| l.to_string());
    match joined {
        Ok(Ok(outcome)) => match lost() {
            // The step returned normally, but the lease was lost on the way:
            // its work may be incomplete (a refused write it did not report).
            Some(loss) => Err((
                FailureKind::FencedOut,
                format!("the step returned after the lease was lost: {loss}"),
            )),
            None => Ok(outcome),
        },
        Ok(Err(e)) => {
            let e: BoxError = e.into();
            let fenced = e
                .downcast_ref::<WorkerError>()
                .is_some_and(WorkerError::is_fenced_out)
                || e.downcast_ref::<Error>().is_some_and(Error::is_fenced_out);
            if fenced || lost().is_some() {
                Err((FailureKind::FencedOut, e.to_string()))
            } else {
                Err((FailureKind::Failed, e.to_string()))
            }
        }
        Err(e) if e.is_panic() => Err((FailureKind::Failed, format!("the step panicked: {e}"))),
        Err(e) => Err((
            FailureKind::Failed,
            format!("the step's task ended abnormally: {e}"),
        )),
    }
}

/// Cancels `shutdown` on Ctrl-C (SIGINT) or, on Unix, SIGTERM. Returns the
/// listening task; it ends when a signal arrives or `shutdown` is cancelled
/// some other way. Must run inside a tokio runtime.
pub fn cancel_on_signal(shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ctrl_c() => tracing::info!("interrupt received; shutting down"),
            _ = terminate() => tracing::info!("SIGTERM received; shutting down"),
        }
        shutdown.cancel();
    })
}

async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(unix)]
async fn terminate() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

#[cfg(not(unix))]
async fn terminate() {
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_jitter_only_shortens() {
        let b = IdleBackoff {
            min: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            jitter: 0.5,
        };
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(100));
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(800));
        assert_eq!(b.delay(4, 0.0), Duration::from_millis(1000));
        assert_eq!(b.delay(u32::MAX, 0.0), Duration::from_millis(1000));
        assert_eq!(b.delay(4, 1.0), Duration::from_millis(500));
        for s in 0..10 {
            let d = b.next_delay(s);
            assert!(d <= b.max && d >= b.min / 2, "{d:?}");
        }
        assert!(IdleBackoff {
            jitter: 1.5,
            ..b.clone()
        }
        .validate()
        .is_err());
        assert!(IdleBackoff {
            min: Duration::ZERO,
            ..b.clone()
        }
        .validate()
        .is_err());
        assert!(IdleBackoff {
            max: Duration::from_millis(1),
            ..b
        }
        .validate()
        .is_err());
    }
}
