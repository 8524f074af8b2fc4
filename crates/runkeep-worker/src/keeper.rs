//! [`LeaseKeeper`]: renews a held run in the background and stops the work
//! the moment the lease cannot be kept.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{watch, Mutex, RwLock};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::error::LeaseLoss;
use crate::handle::{HeldLease, RunHandle, Shared};
use runkeep::error::{Error, Result};
use runkeep::id::Holder;
use runkeep::lease::{ClaimOptions, ClaimOutcome, Lease};
use runkeep::lifecycle::RunStatus;
use runkeep::scope::RunScope;
use runkeep::store::RunStore;
use runkeep::time::Ttl;

/// How a [`LeaseKeeper`] renews.
#[derive(Clone, Debug)]
pub struct KeeperOptions {
    /// Renew every `renew_fraction × TTL` (measured from when the previous
    /// claim was sent). Default `1/3`: two renewals can fail before the
    /// lease lapses. Must lie in `(0, 1)`.
    pub renew_fraction: f64,
    /// Stop the work when less than `safety_fraction × TTL` of the lease is
    /// left and no renewal has landed: writes are refused from then on and a
    /// renewal still in flight is abandoned. Covers the time a write takes to
    /// reach the store and clock disagreement between processes. Default
    /// `0.1`. Must lie in `[0, 1)`, and `renew_fraction + safety_fraction`
    /// must be below 1.
    pub safety_fraction: f64,
    /// First pause before retrying a renewal that failed with a retryable
    /// error; doubles on each retry, and retries stop at the safety margin.
    /// Default 50 ms.
    pub retry_delay: Duration,
    /// `None` (the default): claims and renewals carry no instant, so the
    /// **store's clock** judges them (so skewed worker clocks cannot take
    /// live leases; the database's clock on
    /// PostgreSQL), and [`RunHandle::now`] answers the store's
    /// [`now`](runkeep::CheckpointStore::now). `Some(clock)`: every claim
    /// and renewal is judged at `clock.now()` (`ClaimOptions::at`), for a
    /// host that must judge on a clock of its own. Either way the keeper's
    /// own deadline is measured on the monotonic clock from when the claim
    /// was sent, so it never outlives the store's expiry.
    pub clock: Option<Arc<dyn Clock>>,
}

impl Default for KeeperOptions {
    fn default() -> Self {
        Self {
            renew_fraction: 1.0 / 3.0,
            safety_fraction: 0.1,
            retry_delay: Duration::from_millis(50),
            clock: None,
        }
    }
}

impl KeeperOptions {
    /// Refuses fractions outside their ranges and a zero retry delay.
    pub fn validate(&self) -> Result<()> {
        let (r, s) = (self.renew_fraction, self.safety_fraction);
        if !(r.is_finite() && r > 0.0 && r < 1.0) {
            return Err(Error::invalid(format!(
                "renew fraction {r} must lie strictly between 0 and 1 (a fraction of the lease TTL)"
            )));
        }
        if !(s.is_finite() && (0.0..1.0).contains(&s)) {
            return Err(Error::invalid(format!(
                "safety fraction {s} must lie in [0, 1) (a fraction of the lease TTL)"
            )));
        }
        if r + s >= 1.0 {
            return Err(Error::invalid(format!(
                "renew fraction {r} plus safety fraction {s} must be below 1, or the lease would be given up before its first renewal"
            )));
        }
        if self.retry_delay.is_zero() {
            return Err(Error::invalid("renewal retry delay must be positive"));
        }
        Ok(())
    }

    fn of_ttl(ttl: Ttl, fraction: f64) -> Duration {
        Duration::from_secs_f64(ttl.as_duration().as_secs_f64() * fraction)
    }

    /// The renewal interval for `ttl` (at least 1 ms).
    pub fn renew_every(&self, ttl: Ttl) -> Duration {
        Self::of_ttl(ttl, self.renew_fraction).max(Duration::from_millis(1))
    }

    /// The safety margin for `ttl`.
    pub fn safety_margin(&self, ttl: Ttl) -> Duration {
        Self::of_ttl(ttl, self.safety_fraction)
    }
}

/// Keeps one held run: renews it in the background and cancels the run's
/// token the moment the lease is lost.
///
/// Every `renew_fraction × TTL` it calls `claim` again with the same holder.
/// A renewal mints a **new, higher fence** (so a write under the old one
/// is refused once the renewal lands), which the keeper swaps
/// into every [`RunHandle`] of the run at once. It cancels the run's
/// cancellation token, before any further write is admitted, when:
///
/// - a renewal answers `Held` (someone else holds the run) or a write is
///   refused as fenced out;
/// - an operator cancelled the run (a renewal answers it finished as
///   cancelled, or a write is refused as `Cancelled`);
/// - a renewal answers a fence that does not follow ours: the holding was
///   ended by someone else in between (an operator's release), so the
///   answer is a new claim, not a renewal — the keeper gives it back;
/// - a renewal fails with a non-retryable error;
/// - retryable failures, a renewal that does not answer, or in-flight writes
///   holding the renewal off, run into the safety margin before the local
///   deadline;
/// - the keeper itself wakes too late (a starved runtime or a stopped
///   process): a renewal that lands after the lease could have lapsed proves
///   nothing about the time in between, so it does not count.
///
/// The local deadline is measured on the monotonic clock from the moment the
/// claim was *sent*, so it is never later than the store's own expiry on the
/// same clock. Handles refuse writes past `deadline − margin` on their own,
/// even if the keeper task never ran.
///
/// Dropping the keeper stops the renewals (writes then stop at the
/// deadline); [`LeaseKeeper::release`] stops them and releases the run; a
/// finish or snooze through a [`RunHandle`] stops them too (the holding
/// ended).
#[derive(Debug)]
pub struct LeaseKeeper {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    /// Claims `scope` for `holder` and keeps it; `Ok(None)` when another
    /// holder holds it live. Must run inside a tokio runtime.
    pub async fn claim(
        store: Arc<dyn RunStore>,
        scope: RunScope,
        holder: Holder,
        ttl: Ttl,
        options: KeeperOptions,
    ) -> Result<Option<Self>> {
        options.validate()?;
        let sent_at = Instant::now();
        let claim = claim_options(holder, ttl, options.clock.as_ref());
        match store.claim(&scope, &claim).await? {
            ClaimOutcome::Acquired(lease) => {
                Self::start_at(store, scope, lease, ttl, options, sent_at).map(Some)
            }
            ClaimOutcome::Held(_)
            | ClaimOutcome::Finished(_)
            | ClaimOutcome::NotBefore(_)
            | ClaimOutcome::AtLimit(_) => Ok(None),
        }
    }

    /// Keeps a lease the caller already took (from `claim` or `claim_next`).
    /// The local deadline is derived from `lease.expires_at` and the clock,
    /// so call it right after taking the lease. Must run inside a tokio
    /// runtime.
    pub fn start(
        store: Arc<dyn RunStore>,
        scope: RunScope,
        lease: Lease,
        ttl: Ttl,
        options: KeeperOptions,
    ) -> Result<Self> {
        options.validate()?;
        // The lease's expiry is on the judging clock (the store's, unless
        // the host judges): compare it with that clock's now.
        let judged_now = options
            .clock
            .as_ref()
            .map_or_else(|| store.now(), |c| c.now());
        let left_ms = lease.expires_at.as_millis() - judged_now.as_millis();
        let left =
            Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)).min(ttl.as_duration());
        let now = Instant::now();
        let sent_at = now.checked_sub(ttl.as_duration() - left).unwrap_or(now);
        Self::start_at(store, scope, lease, ttl, options, sent_at)
    }

    /// Keeps a lease whose claim was sent at `sent_at` (monotonic clock).
    pub(crate) fn start_at(
        store: Arc<dyn RunStore>,
        scope: RunScope,
        lease: Lease,
        ttl: Ttl,
        options: KeeperOptions,
        sent_at: Instant,
    ) -> Result<Self> {
        options.validate()?;
        let held = HeldLease {
            lease: lease.clone(),
            acquired_at: sent_at,
            deadline: sent_at + ttl.as_duration(),
            renewals: 0,
        };
        let (state, _) = watch::channel(held);
        let shared = Arc::new(Shared {
            store,
            scope,
            holder: lease.holder.clone(),
            ttl,
            margin: options.safety_margin(ttl),
            clock: options.clock.clone(),
            state,
            gate: RwLock::new(()),
            loss: OnceLock::new(),
            lost: CancellationToken::new(),
            stopping: CancellationToken::new(),
            ended: CancellationToken::new(),
            ledger: Mutex::new(None),
            first_fence: lease.fence,
            steps: std::sync::atomic::AtomicU64::new(0),
            handoff: OnceLock::new(),
            group: OnceLock::new(),
            handed: std::sync::Mutex::default(),
            handed_run: tokio::sync::Notify::new(),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(
            shared.clone(),
            stop.clone(),
            options.renew_every(ttl),
            options.retry_delay,
        ));
        Ok(Self {
            shared,
            stop,
            task: Some(task),
        })
    }

    /// A handle for the run's writes (clone it freely).
    pub fn handle(&self) -> RunHandle {
        RunHandle {
            shared: self.shared.clone(),
        }
    }

    /// A token cancelled the moment the lease is lost (a child: cancelling
    /// it affects nothing else).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Asks the run to stop at its next safe point (cancels the handles'
    /// [`RunHandle::stop_token`]); renewals and writes go on.
    pub fn request_stop(&self) {
        self.shared.stopping.cancel();
    }

    /// Stops renewing, waits for a renewal in flight and for writes in
    /// flight, refuses every later write, and releases the run at its current
    /// fence. `Ok(true)` when the release took effect; `Ok(false)` when the
    /// fence was no longer the run's top holding (superseded: nothing to
    /// release). Errors are the store's and are worth reporting: the run then
    /// stays unclaimable until its lease expires. A holding the handle
    /// already ended (finish, snooze) is not released again: `Ok(false)`.
    pub async fn release(mut self) -> Result<bool> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let _gate = self.shared.gate.write().await;
        if self
            .shared
            .loss
            .get()
            .is_some_and(|l| !matches!(l, LeaseLoss::Released) && l.is_own_end())
        {
            return Ok(false);
        }
        let fence = self.shared.state.borrow().lease.fence;
        self.shared.lose(LeaseLoss::Released);
        self.shared.store.release(&self.shared.scope, fence).await
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Claim options for `holder`: judged by the store's clock, unless the host
/// judges on a clock of its own.
pub(crate) fn claim_options(
    holder: Holder,
    ttl: Ttl,
    clock: Option<&Arc<dyn Clock>>,
) -> ClaimOptions {
    let options = ClaimOptions::new(holder, ttl);
    match clock {
        Some(c) => options.at(c.now()),
        None => options,
    }
}

/// The renewal loop.
async fn keep(
    shared: Arc<Shared>,
    stop: CancellationToken,
    every: Duration,
    retry_delay: Duration,
) {
    loop {
        let next = shared.state.borrow().acquired_at + every;
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = shared.ended.cancelled() => return,
            _ = sleep_until(next) => {}
        }
        if !renew(&shared, &stop, retry_delay).await {
            return;
        }
    }
}

/// One renewal with bounded retries. `false`: stop keeping (lost or stopped).
async fn renew(shared: &Shared, stop: &CancellationToken, retry_delay: Duration) -> bool {
    let (old_fence, deadline) = {
        let s = shared.state.borrow();
        (s.lease.fence, s.deadline)
    };
    let give_up_at = deadline.checked_sub(shared.margin).unwrap_or(deadline);
    if Instant::now() >= give_up_at {
        shared.lose(LeaseLoss::Expiring {
            detail: format!(
                "the renewal of fence {old_fence} was due long before, but the keeper only ran within the safety margin of the lease's deadline (runtime starved or process stopped)"
            ),
        });
        return false;
    }
    // Exclude writes for the renewal, so none presents the fence it retires.
    let _gate = tokio::select! {
        biased;
        _ = stop.cancelled() => return false,
        g = timeout_at(give_up_at, shared.gate.write()) => match g {
            Ok(g) => g,
            Err(_) => {
                shared.lose(LeaseLoss::Expiring {
                    detail: format!("writes in flight held off the renewal of fence {old_fence} until the safety margin"),
                });
                return false;
            }
        },
    };
    // The holding may have ended (finished, snoozed) while we waited.
    if shared.loss.get().is_some() {
        return false;
    }
    let mut delay = runkeep::backoff::Doubling::uncapped(retry_delay);
    let mut attempts = 0u32;
    loop {
        if shared.ended.is_cancelled() || stop.is_cancelled() {
            return false;
        }
        attempts += 1;
        let sent_at = Instant::now();
        let options = claim_options(shared.holder.clone(), shared.ttl, shared.clock.as_ref());
        let answer = timeout_at(give_up_at, shared.store.claim(&shared.scope, &options)).await;
        match answer {
            Err(_) => {
                shared.lose(LeaseLoss::Expiring {
                    detail: format!(
                        "renewal attempt {attempts} of fence {old_fence} did not answer before the safety margin"
                    ),
                });
                return false;
            }
            Ok(Ok(ClaimOutcome::Acquired(lease))) => {
                let answered_at = Instant::now();
                let new_fence = lease.fence;
                shared.state.send_modify(|s| {
                    s.lease = lease;
                    s.acquired_at = sent_at;
                    s.deadline = sent_at + shared.ttl.as_duration();
                    s.renewals += 1;
                });
                if new_fence <= old_fence {
                    shared.lose(LeaseLoss::RenewalFailed {
                        kind: "contract",
                        message: format!(
                            "the store renewed fence {old_fence} with fence {new_fence}; a renewal must mint a higher fence"
                        ),
                    });
                    return false;
                }
                if new_fence.get() != old_fence.get() + 1 {
                    // A gap: someone ended our holding in between (an
                    // operator's release, a takeover released again), and
                    // this "renewal" is a new claim of a run that is no
                    // longer ours to go on with. Stop the step and give the
                    // new holding back at once.
                    shared.lose(LeaseLoss::Gap {
                        held: old_fence,
                        answered: new_fence,
                    });
                    if let Err(e) = shared.store.release(&shared.scope, new_fence).await {
                        tracing::warn!(run = %shared.scope, fence = %new_fence, error = %e, "could not give back the holding a renewal took after a gap; it stays unclaimable until its lease expires");
                    }
                    return false;
                }
                if answered_at >= deadline {
                    shared.lose(LeaseLoss::Expiring {
                        detail: format!(
                            "the renewal to fence {new_fence} answered after fence {old_fence}'s deadline; the run may have been held by someone else in between"
                        ),
                    });
                    return false;
                }
                tracing::debug!(run = %shared.scope, from = %old_fence, to = %new_fence, "lease renewed");
                return true;
            }
            Ok(Ok(ClaimOutcome::Held(summary))) => {
                shared.lose(LeaseLoss::Superseded {
                    current: summary.fence,
                    holder: Some(summary.holder),
                });
                return false;
            }
            Ok(Ok(ClaimOutcome::Finished(RunStatus::Cancelled))) => {
                let reason = shared
                    .store
                    .lifecycle(&shared.scope)
                    .await
                    .ok()
                    .and_then(|l| l.reason);
                shared.lose(LeaseLoss::Cancelled { reason });
                return false;
            }
            Ok(Ok(ClaimOutcome::Finished(status))) => {
                shared.lose(LeaseLoss::RenewalFailed {
                    kind: "finished",
                    message: format!(
                        "the run was finished ({status}) while fence {old_fence} was held; nothing is left to renew"
                    ),
                });
                return false;
            }
            Ok(Ok(ClaimOutcome::AtLimit(busy))) => {
                // Only a renewal of a lease that already expired is judged
                // against the key: the run was ours no longer.
                shared.lose(LeaseLoss::RenewalFailed {
                    kind: "at_limit",
                    message: format!(
                        "fence {old_fence} expired before its renewal, and concurrency key {:?} is at its limit of {} ({} others held)",
                        busy.key, busy.limit, busy.held
                    ),
                });
                return false;
            }
            Ok(Ok(ClaimOutcome::NotBefore(at))) => {
                shared.lose(LeaseLoss::RenewalFailed {
                    kind: "deferred",
                    message: format!(
                        "the run was released and deferred until {at} while fence {old_fence} was held"
                    ),
                });
                return false;
            }
            Ok(Err(e)) if e.is_retryable() => {
                if Instant::now() + delay.current() >= give_up_at {
                    shared.lose(LeaseLoss::Expiring {
                        detail: format!(
                            "renewal of fence {old_fence} failed {attempts} times and the next retry would land in the safety margin; last error: {e}"
                        ),
                    });
                    return false;
                }
                tracing::debug!(run = %shared.scope, attempts, error = %e, "renewal failed; retrying");
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return false,
                    _ = sleep(delay.next_delay()) => {}
                }
            }
            Ok(Err(e)) => {
                shared.lose(LeaseLoss::RenewalFailed {
                    kind: e.kind(),
                    message: e.to_string(),
                });
                return false;
            }
        }
    }
}
