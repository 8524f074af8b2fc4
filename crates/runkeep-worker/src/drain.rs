//! [`Worker`]: the drain loop over `claim_next`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runkeep::backoff;
use runkeep::checkpoint::Checkpoint;
use runkeep::error::{BoxError, Error, Result};
use runkeep::failure::AttemptError;
use runkeep::id::Holder;
use runkeep::lease::Fence;
use runkeep::lifecycle::{Lifecycle, Outcome};
use runkeep::scope::{ListingScope, RunScope};
use runkeep::step::Step;
use runkeep::store::{ClaimNextFilter, RunStore};
use runkeep::time::Ttl;
use runkeep::watch::WatchTopic;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::error::{LeaseLoss, WorkerError};
use crate::group::GroupCommit;
use crate::handle::RunHandle;
use crate::handover::{Handed, Handoff, Taken};
use crate::keeper::{KeeperOptions, LeaseKeeper};

/// How many failures of each kind a [`DrainReport`] lists (the counters
/// count all of them).
pub const MAX_LISTED: usize = 100;

/// What a step tells the drain about the run it was given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum StepOutcome {
    /// The run needs no more work: the drain finishes it as `completed`
    /// (contract v2; nothing hands it out again), unless the step already
    /// finished it through its handle ([`RunHandle::finish`], or a
    /// [`RunHandle::commit_step`] with `finish`), whose outcome stands.
    Finished,
    /// More work remains: release it; it is runnable again at once, by this
    /// worker or another.
    Yield,
    /// More work remains, but not before this long has passed: the drain
    /// gives it back with a not-before time
    /// ([`CheckpointStore::snooze`](runkeep::CheckpointStore::snooze)), so
    /// no worker sleeps on it.
    RetryAfter(Duration),
}

/// When a drain stops on its own.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum DrainMode {
    /// Wait for work forever (woken by the store's watch, with idle backoff
    /// as the polling fallback) until shutdown.
    #[default]
    Continuous,
    /// Stop the first time `claim_next` finds no runnable run while no run
    /// is in flight.
    UntilIdle,
}

/// The polling fallback while the queue is empty: `min × 2^streak`, capped
/// at `max`, each delay shortened by a random part of up to `jitter` of
/// itself (so a pool of idle workers does not poll in step). The store's
/// [`watch`](runkeep::CheckpointStore::watch) wakes an idle drain sooner
/// when it can notify; this bounds how late a change it cannot see (a lease
/// that lapsed, a not-before time that passed) is noticed.
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
        backoff::shorten(
            backoff::doubling(self.min, self.max, streak),
            self.jitter,
            unit,
        )
    }

    /// The delay after `streak` idle rounds, with a random draw.
    pub fn next_delay(&self, streak: u32) -> Duration {
        backoff::jitter(backoff::doubling(self.min, self.max, streak), self.jitter)
    }
}

/// Options of a [`Worker`].
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Who claims. Unique per process ([`Holder::unique`]): it is the only
    /// thing that tells a renewal from a theft (a claim by the same holder
    /// renews; by another holder it is refused while the lease is live).
    pub holder: Holder,
    /// Lease TTL for claims and renewals.
    pub ttl: Ttl,
    /// Runs held and stepped at once (at least 1). Default 1.
    pub concurrency: usize,
    /// Renewal settings (and, rarely, a judging clock of the host's own).
    pub keeper: KeeperOptions,
    /// Which runs `claim_next` may take, in which order.
    pub filter: ClaimNextFilter,
    /// The polling fallback while idle.
    pub idle: IdleBackoff,
    /// Stop on an empty queue, or keep waiting for work.
    pub mode: DrainMode,
    /// After shutdown is requested, how long runs in flight may take to
    /// finish before their steps are dropped and the runs released. Default
    /// 10 s.
    pub shutdown_grace: Duration,
    /// A step running longer than this is stopped and its attempt reported
    /// failed (kind `timeout`). `None` (the default): no limit but the
    /// run's own (set on enqueue, carried by its lease); with both, the
    /// shorter holds.
    pub attempt_timeout: Option<Duration>,
    /// The attempt limit the drain's failure reports carry, over the run's
    /// own limit (set on enqueue) and the store's default. `None` (the
    /// default): the run's.
    pub max_attempts: Option<u32>,
    /// Hand over from a finished run to the next one in one store call.
    /// Default `true`. When a step's [`RunHandle::commit_step`] carries the
    /// run's `finish` and the drain would claim again anyway (it runs, is
    /// not shutting down, and the finishing run's slot is the one the next
    /// run takes), the commit goes through
    /// [`EvidenceStore::commit_step_and_claim_next`](runkeep::EvidenceStore::commit_step_and_claim_next)
    /// with the drain's own claim (`scope`, `filter`, `holder`, `ttl`), and
    /// the run it returns is stepped next in the same slot, as if the
    /// drain's `claim_next` had returned it. PostgreSQL does both in one
    /// transaction and `HttpStore` in one request; other stores commit,
    /// then claim. `false`: every claim is the drain's own `claim_next`.
    /// See [`Worker`] (the hand-over).
    pub handover: bool,
    /// How long a run handed over waits for the step that finished the run
    /// before it to return. A step that goes on past its finishing commit
    /// for longer gives the run back (released, unstepped: the drain or
    /// another worker claims it again) rather than keep it held and
    /// unstepped for as long as the step takes. Default 5 s; at least 1 ms.
    pub handover_wait: Duration,
    /// Claim up to this many runs in one store call when several slots are
    /// free ([`CheckpointStore::claim_next_batch`](runkeep::CheckpointStore::claim_next_batch)):
    /// the drain takes as many free slots as it finds, up to this, and
    /// asks for that many runs, each started at once in its own slot (no
    /// run waits claimed in a local queue, so no lease runs down unworked).
    /// Default 1: one `claim_next` a slot. At most
    /// [`runkeep::batch::MAX_BATCH`].
    pub claim_batch: usize,
    /// Commit the finishing steps of up to this many runs in one store call
    /// (a group commit,
    /// [`EvidenceStore::commit_steps`](runkeep::EvidenceStore::commit_steps)).
    /// A step that finishes a run ([`RunHandle::commit_step`] with `finish`,
    /// or the drain's own finish of a step that returned
    /// [`StepOutcome::Finished`]) waits for the drain's committer, which
    /// sends what is waiting, up to this many; while one group is in flight
    /// the next one queues. Each step presents its run's current
    /// fence (no renewal swaps it while the step waits: the run's gate is
    /// held) and gets its own outcome: a stale one is refused alone. Other
    /// writes go one by one as before. With more than 1, finishing steps
    /// do not hand over ([`WorkerOptions::handover`] is not used): the
    /// drain claims itself, in batches with
    /// [`claim_batch`](WorkerOptions::claim_batch). Default 1: every step
    /// is its own call. At most [`runkeep::batch::MAX_BATCH`].
    pub commit_batch: usize,
    /// How long a finishing step waits for others to join its group when
    /// none is in flight. Default 0: a group is what is waiting when the
    /// committer is free (under load the steps queue behind the call in
    /// flight, so groups form without waiting); a lone step goes at once.
    /// At most 1 s; it holds the run's renewals back while it waits.
    pub commit_linger: Duration,
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
            attempt_timeout: None,
            max_attempts: None,
            handover: true,
            handover_wait: Duration::from_secs(5),
            claim_batch: 1,
            commit_batch: 1,
            commit_linger: Duration::ZERO,
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
        if self.attempt_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid(
                "worker attempt_timeout is 0: every step would time out at once; set None for no limit",
            ));
        }
        if self.max_attempts == Some(0) {
            return Err(Error::invalid(
                "worker max_attempts is 0: a run could never be attempted; it must be at least 1, or None for the run's own limit",
            ));
        }
        if self.handover_wait.is_zero() {
            return Err(Error::invalid(
                "worker handover_wait is 0: a handed-over run would be given back at once; to take no runs by hand-over, set handover to false",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid(
                "worker concurrency is 0; it must be at least 1 (runs held and stepped at once)",
            ));
        }
        runkeep::batch::check_size("worker claim_batch", self.claim_batch)?;
        runkeep::batch::check_size("worker commit_batch", self.commit_batch)?;
        if self.commit_linger > Duration::from_secs(1) {
            return Err(Error::invalid(format!(
                "worker commit_linger is {:?}: a finishing step would hold its run's renewals back that long; use at most 1 s (0, the default, groups what queues while a commit is in flight)",
                self.commit_linger
            )));
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
    /// [`DrainMode::UntilIdle`] and no runnable run while none was in flight.
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
    /// The step (or reading its resume point) returned an error or panicked;
    /// the attempt was reported failed.
    Failed,
    /// The step ran past [`WorkerOptions::attempt_timeout`] and was
    /// stopped; the attempt was reported failed.
    TimedOut,
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

/// How the drain ended a holding after its step (or a failure to do so).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EndAction {
    /// Released: runnable again at once.
    Release,
    /// Finished as completed.
    Finish,
    /// Given back with a not-before time.
    Snooze,
    /// Reported as a failed attempt (`fail_attempt`): deferred by the run's
    /// backoff, or dead-lettered at its limit.
    FailAttempt,
}

/// A release, finish or snooze of the drain's that failed (a failed release
/// or snooze leaves the run unclaimable until its lease expires; a failed
/// finish leaves it active, to be stepped again).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ReleaseFailure {
    /// The run.
    pub scope: RunScope,
    /// The fence presented.
    pub fence: Fence,
    /// What the drain tried.
    pub action: EndAction,
    /// The store's error.
    pub message: String,
}

/// What a drain did.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct DrainReport {
    /// Runs claimed, by the drain's `claim_next` or by a hand-over
    /// (`handed_over`), and stepped — except a run handed over just as
    /// shutdown began, which is released without being stepped.
    pub claimed: u64,
    /// Runs finished: by the drain after [`StepOutcome::Finished`], or by
    /// the step through its handle.
    pub completed: u64,
    /// Steps that answered [`StepOutcome::Yield`].
    pub yielded: u64,
    /// Steps that answered [`StepOutcome::RetryAfter`].
    pub deferred: u64,
    /// Steps that failed (error or panic, or the resume point could not be
    /// read, or past the attempt timeout); each was reported as a failed
    /// attempt, which defers its run by the run's backoff or dead-letters
    /// it at its limit.
    pub failed: u64,
    /// Of `failed`, the steps stopped by the attempt timeout.
    pub timed_out: u64,
    /// Failed attempts that reached their run's limit: the run was
    /// dead-lettered.
    pub dead_lettered: u64,
    /// Runs whose step was stopped because an operator cancelled them.
    pub cancelled: u64,
    /// Runs whose lease was lost while stepped (the step was stopped).
    pub fenced_out: u64,
    /// Runs whose step was dropped when the shutdown grace ran out.
    pub interrupted: u64,
    /// Releases that took effect.
    pub released: u64,
    /// Snoozes that took effect (deferred and failed runs, and steps that
    /// snoozed through their handle).
    pub snoozed: u64,
    /// Releases, finishes and snoozes that found the fence superseded
    /// (nothing to end).
    pub release_superseded: u64,
    /// Releases, finishes and snoozes that failed.
    pub release_failed: u64,
    /// Times the drain found no runnable run and nothing in flight.
    pub passes: u64,
    /// Idle waits ended by the store's watch (a notification).
    pub woken_by_watch: u64,
    /// Idle waits ended by the polling fallback ([`IdleBackoff`]).
    pub woken_by_poll: u64,
    /// `claim_next` calls that failed, and hand-overs whose claim failed
    /// after their step committed.
    pub claim_errors: u64,
    /// Runs taken by a hand-over: a finishing step's commit claimed them
    /// ([`WorkerOptions::handover`]). Counted in `claimed` too.
    pub handed_over: u64,
    /// The first [`MAX_LISTED`] failed, fenced-out and interrupted runs.
    pub failures: Vec<RunFailure>,
    /// The first [`MAX_LISTED`] failed releases, finishes and snoozes.
    pub release_failures: Vec<ReleaseFailure>,
    /// Why the drain returned.
    pub stopped: DrainStop,
}

impl DrainReport {
    fn fail(&mut self, scope: RunScope, kind: FailureKind, message: String) {
        match kind {
            FailureKind::Failed => self.failed += 1,
            FailureKind::TimedOut => {
                self.failed += 1;
                self.timed_out += 1;
            }
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

    fn ended(&mut self, scope: &RunScope, fence: Fence, end: &Ended) {
        match &end.result {
            Ok(true) => match end.action {
                EndAction::Release => self.released += 1,
                EndAction::Snooze => self.snoozed += 1,
                EndAction::Finish | EndAction::FailAttempt => {}
            },
            Ok(false) => self.release_superseded += 1,
            Err(e) => {
                tracing::warn!(run = %scope, %fence, action = ?end.action, error = %e, "ending the holding failed");
                self.release_failed += 1;
                if self.release_failures.len() < MAX_LISTED {
                    self.release_failures.push(ReleaseFailure {
                        scope: scope.clone(),
                        fence,
                        action: end.action,
                        message: e.clone(),
                    });
                }
            }
        }
    }
}

/// A pool of runs drained from one store: `claim_next` → resume point → the
/// host's step → finish (or release, or snooze), up to `concurrency` runs at
/// once, each kept by a [`LeaseKeeper`].
///
/// # The loop
///
/// 1. Wait for a free slot, then `claim_next(scope, filter)`. Leases are
///    taken only as work starts. Contract v2: `claim_next` never hands out a
///    finished run or one deferred past now, and it dead-letters a run whose
///    attempts reached their limit, so the drain keeps no memory of runs it
///    stepped: every run it is handed is work.
/// 2. Read the run's resume point (`resume_point`) and call the step with a
///    [`RunHandle`] and that checkpoint. The step runs in its own task;
///    renewals run in the background. Its writes go through the handle:
///    [`RunHandle::commit_step`] writes a step's events, checkpoint,
///    messages, record and (last step) the finish as one commit.
/// 3. When the step returns, end the holding by its [`StepOutcome`]:
///    `Finished` → finish as completed (unless the step finished the run
///    itself), `Yield` → release, `RetryAfter(d)` → snooze for `d`. A step
///    that failed (error, panic, past [`WorkerOptions::attempt_timeout`])
///    → a failed attempt (`fail_attempt`): the store keeps the error,
///    counts the attempt and defers the run by its backoff, or
///    dead-letters it at its limit. The lease lost (the step is then
///    dropped at once: its writes would be refused anyway; an operator's
///    cancel or release counts), or shutdown's grace ran out → release. A failed release,
///    finish or snooze is reported, never swallowed.
///
/// # The hand-over
///
/// With [`WorkerOptions::handover`] (the default), a step whose
/// [`RunHandle::commit_step`] carries the run's `finish` also takes the
/// drain's next run, in the same store call
/// ([`EvidenceStore::commit_step_and_claim_next`](runkeep::EvidenceStore::commit_step_and_claim_next),
/// one transaction on PostgreSQL, one request over HTTP), with the claim the
/// drain's own `claim_next` would send (`scope`, `filter`, `holder`, `ttl`,
/// and the host's clock if it judges). It does so only while the drain runs
/// and is not shutting down. The run it returns is the drain's as if
/// `claim_next` had returned it (counted in `claimed`, and in
/// `handed_over`): its keeper starts the moment the answer arrives, and its
/// step starts in the finished run's slot once that run's step has returned,
/// so no more than `concurrency` runs are held or stepped at any instant. A
/// drain whose runs keep finishing while work is queued thus claims with
/// `claim_next` only when a hand-over found nothing (or failed). Return
/// from the step soon after its finishing commit: until it returns, the run
/// handed over waits, held and renewed but not stepped; after
/// [`WorkerOptions::handover_wait`] it is given back (released unstepped,
/// counted in `claimed` and `handed_over`, and claimable again at once).
///
/// - The hand-over's claim failed after the step committed
///   ([`Handover::next`](runkeep::Handover::next) is `Err`): the step stands
///   and `commit_step` reports it committed; the drain counts a claim error
///   and claims with its own `claim_next`, which handles errors as always.
/// - The answer was lost (outcome unknown): the step is resolved exactly as
///   [`RunHandle::commit_step`] resolves any lost commit (fence the attempt
///   off, read back). A run the lost answer may have claimed is not
///   recovered: nobody keeps it, and it stays held, claimable by no one,
///   until its lease (`ttl`) runs out. The same holds for a hand-over still
///   in flight when its step is dropped (the lease lost, or shutdown's
///   grace over).
/// - Shutdown requested between the hand-over and the next run's step: that
///   run is released without being stepped.
/// - A handle the drain did not give out ([`LeaseKeeper::claim`],
///   [`LeaseKeeper::start`]) never hands over.
///
/// # Waiting
///
/// When `claim_next` finds nothing, the drain waits on the store's
/// [`watch`](runkeep::CheckpointStore::watch) of `Runnable(scope)` (a
/// notification: a run enqueued, released, reopened…), a run of its own
/// coming back, or the [`IdleBackoff`] polling fallback, whichever comes
/// first, and claims again. [`DrainMode::UntilIdle`] stops instead when no
/// run is in flight.
///
/// # Shutdown
///
/// Cancel the `shutdown` token (see [`cancel_on_signal`]): no new run is
/// claimed, runs in flight see their [`RunHandle::stop_token`] cancelled and
/// get `shutdown_grace` to finish; then their steps are dropped and every
/// held run is released before `drain` returns.
#[derive(Debug)]
pub struct Worker {
    store: Arc<dyn RunStore>,
    scope: ListingScope,
    options: WorkerOptions,
}

/// How a holding was ended.
struct Ended {
    action: EndAction,
    /// `Ok(true)` took effect, `Ok(false)` superseded, `Err` failed.
    result: std::result::Result<bool, String>,
}

struct Ran {
    scope: RunScope,
    fence: Fence,
    /// `None`: the run was not stepped (handed over as shutdown began).
    outcome: Option<std::result::Result<StepOutcome, (FailureKind, String)>>,
    /// `None`: the step ended the holding itself (finish or snooze).
    end: Option<Ended>,
    /// The step finished or snoozed the run through its handle.
    by_handle: Option<LeaseLoss>,
    /// The drain's failed-attempt report dead-lettered the run.
    dead_lettered: bool,
    /// The step was stopped because an operator cancelled the run.
    cancelled: bool,
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

    /// Drains until shutdown (or, in [`DrainMode::UntilIdle`], an empty
    /// queue with nothing in flight, or a `claim_next` error retrying cannot
    /// fix) and reports what happened. See the type's documentation.
    pub async fn drain<F, Fut, E>(&self, shutdown: CancellationToken, step: F) -> DrainReport
    where
        F: Fn(RunHandle, Option<Checkpoint>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<StepOutcome, E>> + Send + 'static,
        E: Into<BoxError> + Send + 'static,
    {
        let opts = &self.options;
        let step = Arc::new(step);
        let slots = Arc::new(Semaphore::new(opts.concurrency));
        let mut tasks: JoinSet<()> = JoinSet::new();
        // Each slot's task and the run it steps now (a hand-over moves the
        // task on to the next run).
        let mut in_flight: HashMap<tokio::task::Id, Arc<Mutex<RunScope>>> = HashMap::new();
        let report: Arc<Mutex<DrainReport>> = Arc::default();
        let mut idle_streak = 0u32;
        let claiming = CancellationToken::new();
        // Grouped finishing steps do not hand over: the drain claims itself.
        let group = (opts.commit_batch > 1)
            .then(|| GroupCommit::start(self.store.clone(), opts.commit_batch, opts.commit_linger));
        let handoff = (opts.handover && group.is_none()).then(|| {
            Arc::new(Handoff {
                scope: self.scope.clone(),
                filter: opts.filter.clone(),
                holder: opts.holder.clone(),
                ttl: opts.ttl,
                keeper: opts.keeper.clone(),
                shutdown: shutdown.clone(),
                claiming: claiming.clone(),
            })
        });
        // Subscribed before the first claim, so a change between a claim
        // that found nothing and the wait is not missed.
        let mut watch = self.store.watch(&WatchTopic::Runnable(self.scope.clone()));

        let stopped = 'drain: loop {
            while let Some(joined) = tasks.try_join_next_with_id() {
                absorb(joined, &mut in_flight, &report);
            }
            let slot = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break 'drain DrainStop::Shutdown,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break 'drain DrainStop::Shutdown,
                },
            };
            // More free slots, up to the batch: one claim call for all.
            let mut free = vec![slot];
            while free.len() < opts.claim_batch {
                match slots.clone().try_acquire_owned() {
                    Ok(more) => free.push(more),
                    Err(_) => break,
                }
            }
            let sent_at = Instant::now();
            let claim = crate::keeper::claim_options(
                opts.holder.clone(),
                opts.ttl,
                opts.keeper.clock.as_ref(),
            );
            let claimed = if free.len() == 1 {
                self.store
                    .claim_next(&self.scope, &opts.filter, &claim)
                    .await
                    .map(|got| got.into_iter().collect::<Vec<_>>())
            } else {
                self.store
                    .claim_next_batch(&self.scope, &opts.filter, &claim, free.len())
                    .await
            };
            match claimed {
                Ok(runs) if !runs.is_empty() => {
                    idle_streak = 0;
                    // A store answering more than asked is not trusted
                    // with the extra runs: they are released unworked.
                    let mut runs = runs.into_iter();
                    for ((run, lease), slot) in runs.by_ref().zip(free) {
                        book(&report, |r| r.claimed += 1);
                        let current = Arc::new(Mutex::new(run.clone()));
                        let job = slot_task(
                            Pool {
                                store: self.store.clone(),
                                opts: opts.clone(),
                                step: step.clone(),
                                shutdown: shutdown.clone(),
                                handoff: handoff.clone(),
                                group: group.clone(),
                                report: report.clone(),
                            },
                            Taken {
                                scope: run,
                                lease,
                                sent_at,
                                keeper: None,
                            },
                            current.clone(),
                            slot,
                        );
                        let handle = tasks.spawn(job);
                        in_flight.insert(handle.id(), current);
                    }
                    for (run, lease) in runs {
                        tracing::warn!(run = %run, "the store answered a batch larger than asked; releasing the extra run");
                        let _ = self.store.release(&run, lease.fence).await;
                    }
                }
                Ok(_) => {
                    drop(free);
                    if tasks.is_empty() {
                        book(&report, |r| r.passes += 1);
                        if opts.mode == DrainMode::UntilIdle {
                            break 'drain DrainStop::Idle;
                        }
                    }
                    let pause = opts.idle.next_delay(idle_streak);
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break 'drain DrainStop::Shutdown,
                        Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                            absorb(joined, &mut in_flight, &report);
                        }
                        _ = watch.changed() => book(&report, |r| r.woken_by_watch += 1),
                        _ = sleep(pause) => {
                            book(&report, |r| r.woken_by_poll += 1);
                            idle_streak = idle_streak.saturating_add(1);
                        }
                    }
                }
                Err(e) => {
                    drop(free);
                    book(&report, |r| r.claim_errors += 1);
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
        // No hand-over claims from here on: the drain has stopped claiming.
        claiming.cancel();
        // Runs in flight watch the shutdown token themselves (grace, then
        // drop and release); otherwise they finish normally.
        while let Some(joined) = tasks.join_next_with_id().await {
            absorb(joined, &mut in_flight, &report);
        }
        let mut report = std::mem::take(&mut *lock(&report));
        report.stopped = stopped;
        report
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Updates the drain's report (shared by the loop and the slots' tasks).
fn book(report: &Mutex<DrainReport>, update: impl FnOnce(&mut DrainReport)) {
    update(&mut lock(report));
}

/// Books a slot task's end: only a task that died has anything to report
/// (its runs book themselves as they end).
fn absorb(
    joined: std::result::Result<(tokio::task::Id, ()), JoinError>,
    in_flight: &mut HashMap<tokio::task::Id, Arc<Mutex<RunScope>>>,
    report: &Mutex<DrainReport>,
) {
    match joined {
        Ok((id, ())) => {
            in_flight.remove(&id);
        }
        Err(e) => {
            // The run's own task (not the step) died: nothing was released.
            let scope = in_flight.remove(&e.id()).map(|s| lock(&s).clone());
            tracing::error!(run = ?scope, error = %e, "a run task of the drain died");
            if let Some(scope) = scope {
                book(report, |r| {
                    r.fail(
                        scope,
                        FailureKind::Failed,
                        format!("the worker's run task died: {e}"),
                    )
                });
            }
        }
    }
}

/// Books a run's end.
fn book_ran(report: &mut DrainReport, ran: Ran) {
    report.dead_lettered += u64::from(ran.dead_lettered);
    report.cancelled += u64::from(ran.cancelled);
    match ran.outcome {
        None => {}
        Some(Ok(StepOutcome::Finished)) => {}
        Some(Ok(StepOutcome::Yield)) => report.yielded += 1,
        Some(Ok(StepOutcome::RetryAfter(_))) => report.deferred += 1,
        Some(Err((kind, message))) => report.fail(ran.scope.clone(), kind, message),
    }
    match (&ran.by_handle, &ran.end) {
        (Some(LeaseLoss::Finished { .. }), _) => report.completed += 1,
        (Some(LeaseLoss::Snoozed { .. }), _) => report.snoozed += 1,
        (_, Some(end)) => {
            if end.action == EndAction::Finish && end.result == Ok(true) {
                report.completed += 1;
            }
            report.ended(&ran.scope, ran.fence, end);
        }
        _ => {}
    }
}

/// What every slot's task shares.
struct Pool<F> {
    store: Arc<dyn RunStore>,
    opts: WorkerOptions,
    step: Arc<F>,
    shutdown: CancellationToken,
    /// `None`: hand-overs are off ([`WorkerOptions::handover`]).
    handoff: Option<Arc<Handoff>>,
    /// `None`: every step is its own commit ([`WorkerOptions::commit_batch`]).
    group: Option<Arc<GroupCommit>>,
    report: Arc<Mutex<DrainReport>>,
}

/// One pool slot: steps the run the drain claimed, then each run its
/// finishing step handed over, one after another, holding the slot's permit
/// throughout (a handed-over run's step starts only once the run before it
/// has ended). `current` names the run being stepped, for a task that dies.
async fn slot_task<F, Fut, E>(
    pool: Pool<F>,
    first: Taken,
    current: Arc<Mutex<RunScope>>,
    slot: OwnedSemaphorePermit,
) where
    F: Fn(RunHandle, Option<Checkpoint>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<StepOutcome, E>> + Send + 'static,
    E: Into<BoxError> + Send + 'static,
{
    let mut taken = first;
    loop {
        let (ran, handed) = run_one(&pool, taken).await;
        book(&pool.report, |r| book_ran(r, ran));
        match handed {
            Handed::Run(next) => {
                book(&pool.report, |r| {
                    r.claimed += 1;
                    r.handed_over += 1;
                });
                *lock(&current) = next.scope.clone();
                if pool.shutdown.is_cancelled() {
                    // Shutdown began after the hand-over: take no new work,
                    // give the run back at once.
                    let ran = give_back(&pool, next).await;
                    book(&pool.report, |r| book_ran(r, ran));
                    break;
                }
                taken = next;
            }
            Handed::Failed(e) => {
                // The step stands; the drain's own claim_next takes over.
                book(&pool.report, |r| r.claim_errors += 1);
                tracing::debug!(error = %e, "the hand-over's claim failed; the drain claims again itself");
                break;
            }
            Handed::Open | Handed::Closed => break,
        }
    }
    drop(slot);
}

/// Releases a handed-over run without stepping it.
async fn give_back<F>(pool: &Pool<F>, taken: Taken) -> Ran {
    let fence = taken.lease.fence;
    let result = match taken.keeper {
        Some(k) => k.release().await,
        None => pool.store.release(&taken.scope, fence).await,
    };
    Ran {
        scope: taken.scope,
        fence,
        outcome: None,
        end: Some(Ended {
            action: EndAction::Release,
            result: result.map_err(|e| e.to_string()),
        }),
        by_handle: None,
        dead_lettered: false,
        cancelled: false,
    }
}

/// One run: keep its lease, step it, end the holding. Also answers what
/// its finishing step handed over ([`Handed::Closed`] when nothing).
async fn run_one<F, Fut, E>(pool: &Pool<F>, taken: Taken) -> (Ran, Handed)
where
    F: Fn(RunHandle, Option<Checkpoint>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<StepOutcome, E>> + Send + 'static,
    E: Into<BoxError> + Send + 'static,
{
    let (store, opts, step, shutdown) = (&pool.store, &pool.opts, &pool.step, &pool.shutdown);
    let Taken {
        scope,
        lease,
        sent_at,
        keeper,
    } = taken;
    let fence = lease.fence;
    // The run's own attempt timeout (set on enqueue) and the drain's: the
    // shorter one holds.
    let timeout = match (
        lease.attempt_timeout_ms.map(Duration::from_millis),
        opts.attempt_timeout,
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let keeper = match keeper.map(Ok).unwrap_or_else(|| {
        LeaseKeeper::start_at(
            store.clone(),
            scope.clone(),
            lease,
            opts.ttl,
            opts.keeper.clone(),
            sent_at,
        )
    }) {
        Ok(k) => k,
        Err(e) => {
            let release = store.release(&scope, fence).await;
            let ran = Ran {
                scope,
                fence,
                outcome: Some(Err((
                    FailureKind::Failed,
                    format!("could not keep the lease: {e}"),
                ))),
                end: Some(Ended {
                    action: EndAction::Release,
                    result: release.map_err(|e| e.to_string()),
                }),
                by_handle: None,
                dead_lettered: false,
                cancelled: false,
            };
            return (ran, Handed::Closed);
        }
    };
    let handle = keeper.handle();
    if let Some(h) = &pool.handoff {
        let _ = handle.shared.handoff.set(h.clone());
    }
    if let Some(g) = &pool.group {
        let _ = handle.shared.group.set(g.clone());
    }
    let outcome = async {
        let resume = store
            .resume_point(&scope, handle.now())
            .await
            .map_err(|e| (FailureKind::Failed, format!("reading the resume point: {e}")))?;
        let mut task = tokio::spawn((step)(handle.clone(), resume));
        let lost = handle.cancellation_token();
        let mut grace_ends: Option<Instant> = None;
        // A run handed over waits for this step to return, at most
        // `handover_wait`; then it goes back.
        let handed_waited = async {
            handle.shared.run_handed_over().await;
            tokio::time::sleep(opts.handover_wait).await;
        };
        tokio::pin!(handed_waited);
        let mut gave_back = false;
        let attempt_ends = timeout.map(|t| Instant::now() + t);
        loop {
            tokio::select! {
                biased;
                joined = &mut task => return classify(joined, &handle),
                _ = sleep_until(attempt_ends.unwrap_or_else(Instant::now)), if attempt_ends.is_some() => {
                    task.abort();
                    let _ = task.await;
                    return Err((
                        FailureKind::TimedOut,
                        format!("the step ran past the attempt timeout of {:?}", timeout.unwrap_or_default()),
                    ));
                }
                () = &mut handed_waited, if !gave_back => {
                    gave_back = true;
                    // Closes the holding to hand-overs: the step may go on.
                    if let Handed::Run(next) = handle.shared.collect_handed() {
                        tracing::warn!(
                            run = %scope,
                            next = %next.scope,
                            wait = ?opts.handover_wait,
                            "the step goes on after its finishing commit; giving back the run handed over"
                        );
                        let ran = give_back(pool, next).await;
                        book(&pool.report, |r| {
                            r.claimed += 1;
                            r.handed_over += 1;
                            book_ran(r, ran);
                        });
                    }
                }
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
    // The step has returned (or was dropped): no hand-over from now on.
    let handed = handle.shared.collect_handed();
    let fence = handle.fence();
    let by_handle = handle.ended_by_handle();
    let mut dead_lettered = false;
    let cancelled = matches!(handle.loss(), Some(LeaseLoss::Cancelled { .. }));
    if by_handle.is_some() {
        // The step finished or snoozed the run itself; the keeper stopped.
        drop(keeper);
        let ran = Ran {
            scope,
            fence,
            outcome: Some(outcome),
            end: None,
            by_handle,
            dead_lettered: false,
            cancelled,
        };
        return (ran, handed);
    }
    let end = match &outcome {
        Ok(StepOutcome::Finished) => Some((EndAction::Finish, None)),
        Ok(StepOutcome::RetryAfter(d)) => Some((EndAction::Snooze, Some(*d))),
        Err((FailureKind::Failed | FailureKind::TimedOut, _)) => {
            Some((EndAction::FailAttempt, None))
        }
        Ok(StepOutcome::Yield) | Err(_) => None,
    };
    let end = match end {
        Some((EndAction::Finish, _)) if pool.group.is_some() => {
            // The finish as a step, so it joins the group commit.
            let finish = Step {
                finish: Some(Outcome::completed(None)),
                ..Step::default()
            };
            Ended {
                action: EndAction::Finish,
                result: end_result(handle.commit_step(&finish).await.map(|_| true)),
            }
        }
        Some((EndAction::Finish, _)) => Ended {
            action: EndAction::Finish,
            result: end_result(handle.finish(&Outcome::completed(None)).await.map(|_| true)),
        },
        Some((EndAction::FailAttempt, _)) => {
            let error = match &outcome {
                Err((kind, message)) => attempt_error(*kind, message),
                Ok(_) => AttemptError::new("error", "the step failed"),
            };
            let failed = handle.fail_attempt(&error, opts.max_attempts).await;
            dead_lettered = failed.as_ref().is_ok_and(Lifecycle::is_dead_lettered);
            Ended {
                action: EndAction::FailAttempt,
                result: end_result(failed.map(|_| true)),
            }
        }
        Some((_, Some(d))) => {
            let until = handle
                .now()
                .offset(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            Ended {
                action: EndAction::Snooze,
                result: end_result(handle.snooze(until).await),
            }
        }
        _ => Ended {
            action: EndAction::Release,
            result: keeper.release().await.map_err(|e| e.to_string()),
        },
    };
    let ran = Ran {
        scope,
        fence,
        outcome: Some(outcome),
        end: Some(end),
        by_handle: None,
        dead_lettered,
        cancelled,
    };
    (ran, handed)
}

/// The error a failed attempt reports, from how the step failed.
fn attempt_error(kind: FailureKind, message: &str) -> AttemptError {
    let kind = match kind {
        FailureKind::TimedOut => "timeout",
        _ if message.starts_with(PANICKED) => "panic",
        _ => "error",
    };
    AttemptError::new(kind, message)
}

/// How [`classify`] begins the message of a step that panicked.
const PANICKED: &str = "the step panicked";

/// A handle's finish or snooze as an end result: a lost lease is
/// "superseded" (nothing to end), other refusals are failures.
fn end_result(r: std::result::Result<bool, WorkerError>) -> std::result::Result<bool, String> {
    match r {
        Ok(v) => Ok(v),
        Err(e) if e.is_fenced_out() => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

fn classify<E: Into<BoxError>>(
    joined: std::result::Result<std::result::Result<StepOutcome, E>, JoinError>,
    handle: &RunHandle,
) -> std::result::Result<StepOutcome, (FailureKind, String)> {
    let lost = || {
        handle
            .is_lost()
            .then(|| handle.loss().map(|l| l.to_string()).unwrap_or_default())
    };
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
        Err(e) if e.is_panic() => Err((FailureKind::Failed, format!("{PANICKED}: {e}"))),
        Err(e) => Err((
            FailureKind::Failed,
            format!("the step's task ended abnormally: {e}"),
        )),
    }
}

/// Cancels `shutdown` on Ctrl-C (SIGINT) or, on Unix, SIGTERM. Returns the
/// listening task; it ends when a signal arrives or `shutdown` is cancelled
/// some other way. Must run inside a tokio runtime.
///
/// On Unix the handlers are installed before this returns, so a signal sent
/// right after the call stops the drain gracefully instead of killing the
/// process (installing them on the task's first poll left a window in which
/// SIGTERM still had its default, fatal action).
pub fn cancel_on_signal(shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    let mut signals = Signals::install();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            which = signals.next() => tracing::info!("{which} received; shutting down"),
        }
        shutdown.cancel();
    })
}

/// The signal streams of [`cancel_on_signal`], registered when made.
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    #[cfg(unix)]
    fn install() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        // A registration that fails leaves that signal's default action;
        // the other one still works.
        Self {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    #[cfg(not(unix))]
    fn install() -> Self {
        Self {}
    }

    /// Waits for the first signal and names it.
    #[cfg(unix)]
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            () = Self::recv(self.interrupt.as_mut()) => "interrupt",
            () = Self::recv(self.terminate.as_mut()) => "SIGTERM",
        }
    }

    #[cfg(not(unix))]
    async fn next(&mut self) -> &'static str {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        "interrupt"
    }

    #[cfg(unix)]
    async fn recv(signal: Option<&mut tokio::signal::unix::Signal>) {
        match signal {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_signal_listener_ends_when_shutdown_comes_from_elsewhere() {
        let shutdown = CancellationToken::new();
        let listener = cancel_on_signal(shutdown.clone());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), listener)
            .await
            .expect("the listener task ends")
            .unwrap();
    }

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
