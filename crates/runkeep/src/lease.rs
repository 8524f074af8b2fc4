//! Fenced leases: the rules every backend shares.
//!
//! A run's holdings are numbered by [`Fence`]: positive, strictly increasing
//! across every holding ever issued, across release and across deletion of
//! whatever recorded them. A release publishes a *tombstone* holding at
//! `fence + 1` (so the next claim after a release gets `fence + 2`, in every
//! store), and a released fence is refused on write like any superseded one.
//!
//! The rules here are pure functions over a run's *top holding* (the highest
//! fence issued, and what it says). Each backend reads its top holding in its
//! own way and applies these rules, atomically with its write.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::acting;
use crate::error::{Error, Result};
use crate::id::{Holder, RunId};
use crate::time::{Timestamp, Ttl};

/// Highest fence ever issued: fifteen decimal digits, so a fence is exact in
/// every number representation (below 2^53) and its file name stays canonical.
pub const MAX_FENCE: u64 = 999_999_999_999_999;

/// The number that orders holdings of one run. `1..=MAX_FENCE`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Fence(u64);

impl Fence {
    /// The first fence a run is ever issued.
    pub const FIRST: Fence = Fence(1);

    /// Validates a fence.
    pub fn new(value: u64) -> Result<Self> {
        if value == 0 {
            return Err(Error::invalid("fence 0 is not a fence; fences start at 1"));
        }
        if value > MAX_FENCE {
            return Err(Error::invalid(format!(
                "fence {value} is above the ceiling {MAX_FENCE}"
            )));
        }
        Ok(Self(value))
    }

    /// The numeric value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The next fence, or an explicit refusal at the ceiling (never a silent
    /// stop: a counter that stops moving fences nobody out).
    pub fn next(self, run: &RunId) -> Result<Self> {
        if self.0 >= MAX_FENCE {
            return Err(Error::Unsupported {
                message: format!(
                    "run {run} has reached the fence ceiling {MAX_FENCE}; no further holding can be issued. Copy its state to a new run id"
                ),
            });
        }
        Ok(Self(self.0 + 1))
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fence({})", self.0)
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<'de> Deserialize<'de> for Fence {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = u64::deserialize(d)?;
        Self::new(v).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Fence {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let v: u64 = s
            .parse()
            .map_err(|_| Error::invalid(format!("fence {s:?} is not a positive whole number")))?;
        Self::new(v)
    }
}

/// A lease handed to the taker.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// Who took it.
    pub holder: Holder,
    /// The fence every write under this lease must present.
    pub fence: Fence,
    /// Absolute expiry instant.
    pub expires_at: Timestamp,
    /// The run's attempt timeout, ms ([`crate::failure`]): a runtime stops
    /// a step that runs longer and reports the attempt failed (`timeout`).
    /// `None`: the run sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
}

/// Options of a claim.
#[derive(Clone, Debug)]
pub struct ClaimOptions {
    /// Who is claiming; unique per process.
    pub holder: Holder,
    /// Lease duration.
    pub ttl: Ttl,
    /// The instant every expiry in this call is judged against; the store's
    /// clock ([`crate::CheckpointStore::now`]) when `None`.
    pub now: Option<Timestamp>,
    /// The attempt limit for this claim (over the run's own limit and
    /// [`crate::lifecycle::DEFAULT_MAX_ATTEMPTS`]).
    pub max_attempts: Option<u32>,
}

impl ClaimOptions {
    /// Claim options judged at the store's clock.
    pub fn new(holder: Holder, ttl: Ttl) -> Self {
        Self {
            holder,
            ttl,
            now: None,
            max_attempts: None,
        }
    }

    /// With an attempt limit.
    pub fn with_max_attempts(mut self, limit: u32) -> Self {
        self.max_attempts = Some(limit);
        self
    }

    /// The instant in force for a store whose clock reads `store_now`.
    pub fn judged_at(&self, store_now: impl FnOnce() -> Timestamp) -> Timestamp {
        self.now.unwrap_or_else(store_now)
    }

    /// Judge at an injected instant.
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now);
        self
    }

    /// The instant in force, with the machine clock as the store's clock
    /// (prefer [`Self::judged_at`] with the store's own clock).
    pub fn now(&self) -> Timestamp {
        self.now.unwrap_or_else(Timestamp::now)
    }
}

/// What a claim answered.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ClaimOutcome {
    /// The run is yours at this fence (fresh take, reclaim or renewal).
    Acquired(Lease),
    /// Someone else holds the run live. The ordinary queue outcome, not an error.
    Held(LeaseSummary),
    /// The run is finished (by its holder, or just now dead-lettered by this
    /// claim because its attempts reached the limit); nothing to take.
    Finished(crate::lifecycle::RunStatus),
    /// The run is deferred until this instant (`snooze`, `enqueue`).
    NotBefore(Timestamp),
    /// The run's concurrency key is at its limit: this many other runs of
    /// the key are held live ([`crate::scheduling::concurrency`]). Nothing
    /// changed; claim it again once one of them ends.
    AtLimit(crate::scheduling::KeyBusy),
}

impl ClaimOutcome {
    /// The lease, if acquired.
    pub fn lease(self) -> Option<Lease> {
        match self {
            ClaimOutcome::Acquired(l) => Some(l),
            _ => None,
        }
    }
}

/// What a run's top holding is, as a backend read it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum TopHolding {
    /// A live-or-expired lease with a readable body.
    Lease {
        /// Fence.
        fence: Fence,
        /// Holder.
        holder: Holder,
        /// Expiry.
        expires_at: Timestamp,
    },
    /// A release tombstone: nobody holds the run; its fence belongs to nobody.
    Released {
        /// The tombstone's fence (`released fence + 1`).
        fence: Fence,
    },
    /// A holding whose body could not be read (damaged, vanished, not a regular
    /// file). Reads as expired and anonymous: an unreadable value never grants.
    Unreadable {
        /// Fence from the holding's name.
        fence: Fence,
    },
}

impl TopHolding {
    /// Its fence.
    pub fn fence(&self) -> Fence {
        match self {
            TopHolding::Lease { fence, .. }
            | TopHolding::Released { fence }
            | TopHolding::Unreadable { fence } => *fence,
        }
    }

    /// The summary a listing row shows, with `expired` judged at `now`.
    ///
    /// A tombstone and an unreadable holding both show as holder `""`, expiry
    /// 0, expired: the same in every backend (the reference disk store's
    /// shape; the memory store agrees with it here).
    pub fn summary(&self, now: Timestamp) -> LeaseSummary {
        match self {
            TopHolding::Lease {
                fence,
                holder,
                expires_at,
            } => LeaseSummary {
                holder: holder.as_str().to_string(),
                fence: *fence,
                expires_at: *expires_at,
                expired: is_expired(*expires_at, now),
            },
            TopHolding::Released { fence } | TopHolding::Unreadable { fence } => LeaseSummary {
                holder: String::new(),
                fence: *fence,
                expires_at: Timestamp::EPOCH,
                expired: true,
            },
        }
    }

    /// True when the run is held live at `now` (by anyone).
    pub fn is_live(&self, now: Timestamp) -> bool {
        matches!(self, TopHolding::Lease { expires_at, .. } if !is_expired(*expires_at, now))
    }
}

/// Lease summary on a listing row. `expired` is computed once by the store
/// with the page's `now`, so one page never disagrees with itself.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSummary {
    /// Holder; empty for a released or unreadable holding.
    pub holder: String,
    /// The top fence.
    pub fence: Fence,
    /// Expiry; 0 for a released or unreadable holding.
    pub expires_at: Timestamp,
    /// `now >= expires_at`.
    pub expired: bool,
}

/// Live ⇔ `now < expires_at`. The boundary instant counts as expired.
pub fn is_expired(expires_at: Timestamp, now: Timestamp) -> bool {
    now >= expires_at
}

/// What a claim should do, given the top holding.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ClaimDecision {
    /// Publish a holding at this fence.
    Take(Fence),
    /// Someone else holds it live.
    Held(LeaseSummary),
}

/// The claim rule: a run held live by a *different* holder is refused; anything
/// else (never claimed, expired, released, unreadable, or our own live lease —
/// a renewal) is taken at the next fence. A renewal always mints a new fence,
/// so a duplicate of the holder cannot keep writing with the number it had.
pub fn decide_claim(
    run: &RunId,
    top: Option<&TopHolding>,
    holder: &Holder,
    now: Timestamp,
) -> Result<ClaimDecision> {
    match top {
        None => Ok(ClaimDecision::Take(Fence::FIRST)),
        Some(top) => {
            if let TopHolding::Lease {
                holder: h,
                expires_at,
                ..
            } = top
            {
                if h != holder && !is_expired(*expires_at, now) {
                    return Ok(ClaimDecision::Held(top.summary(now)));
                }
            }
            Ok(ClaimDecision::Take(top.fence().next(run)?))
        }
    }
}

/// The release rule: only the fence that is currently the top live-or-expired
/// holding releases; anything else is a no-op. Returns the tombstone's fence
/// to publish. Acting for a principal ([`crate::acting`]), the holding must
/// be that principal's, else [`Error::NotYourHolding`].
pub fn decide_release(
    run: &RunId,
    top: Option<&TopHolding>,
    fence: Fence,
) -> Result<Option<Fence>> {
    match top {
        Some(TopHolding::Lease { fence: f, .. }) if *f == fence => {
            acting::check(run, "release", Some(fence), top, acting::current().as_ref())?;
            Ok(Some(fence.next(run)?))
        }
        _ => Ok(None),
    }
}

/// The write rule for a fenced write (checkpoints and every piece of run
/// evidence):
///
/// - a fence below the top is superseded ⇒ [`Error::FencedOut`];
/// - the top is a release tombstone ⇒ [`Error::FencedOut`] (a released fence,
///   and the tombstone's own number, belong to nobody);
/// - a fence above every issued one was never issued ⇒ [`Error::InvalidInput`]
///   (fabricated, or another run's fence passed by mistake);
/// - the write is made for a principal other than the one that claimed the
///   top holding ⇒ [`Error::NotYourHolding`] ([`crate::acting`]: judged here,
///   on the holding the fence was judged on, so nothing lands in between);
/// - otherwise (the top holding's own fence, live or lapsed-but-not-superseded)
///   the write proceeds.
pub fn check_write_fence(
    run: &RunId,
    operation: &'static str,
    presented: Fence,
    top: Option<&TopHolding>,
) -> Result<()> {
    let Some(top) = top else {
        return Err(Error::invalid(format!(
            "{operation} on run {run} presented fence {presented}, but no fence was ever issued for this run"
        )));
    };
    let current = top.fence();
    if presented < current || matches!(top, TopHolding::Released { .. }) && presented == current {
        return Err(Error::FencedOut {
            run: run.to_string(),
            operation,
            presented,
            current,
        });
    }
    if presented > current {
        return Err(Error::invalid(format!(
            "{operation} on run {run} presented fence {presented}, but the highest fence ever issued for this run is {current}; it was never issued"
        )));
    }
    acting::check(
        run,
        operation,
        Some(presented),
        Some(top),
        acting::current().as_ref(),
    )
}

/// The write rule for an unfenced write: always admitted, except acting for
/// a principal while a lease (live or expired) is on top ⇒
/// [`Error::NotYourHolding`] ([`crate::acting`]). Stamped with that
/// holding's fence ([`stamp_fence`]) it would pass for the holder's work.
pub fn check_unfenced_write(
    run: &RunId,
    operation: &'static str,
    top: Option<&TopHolding>,
) -> Result<()> {
    acting::check(run, operation, None, top, acting::current().as_ref())
}

/// [`check_write_fence`] with a fence, [`check_unfenced_write`] without:
/// the rule every write of a run is judged by, on the holding read under
/// the backend's lock or transaction.
pub fn check_write(
    run: &RunId,
    operation: &'static str,
    presented: Option<Fence>,
    top: Option<&TopHolding>,
) -> Result<()> {
    match presented {
        Some(f) => check_write_fence(run, operation, f, top),
        None => check_unfenced_write(run, operation, top),
    }
}

/// The fence a write is stamped with: the presented one, or for an unfenced
/// write, the fence in force when it was written (so one total order covers
/// fenced and unfenced writes). `None` for a run never claimed.
pub fn stamp_fence(presented: Option<Fence>, top: Option<&TopHolding>) -> Option<Fence> {
    presented.or_else(|| top.map(TopHolding::fence))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunId {
        RunId::new("run_a").unwrap()
    }
    fn f(n: u64) -> Fence {
        Fence::new(n).unwrap()
    }
    fn h(s: &str) -> Holder {
        Holder::new(s).unwrap()
    }
    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }

    #[test]
    fn fences_are_positive_and_bounded() {
        assert!(Fence::new(0).is_err());
        assert!(Fence::new(MAX_FENCE + 1).is_err());
        let top = Fence::new(MAX_FENCE).unwrap();
        let err = top.next(&run()).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        assert!("007".parse::<Fence>().is_ok());
        assert!("0x10".parse::<Fence>().is_err());
    }

    #[test]
    fn claim_rule() {
        let live = TopHolding::Lease {
            fence: f(4),
            holder: h("w1"),
            expires_at: at(100),
        };
        assert_eq!(
            decide_claim(&run(), None, &h("w1"), at(0)).unwrap(),
            ClaimDecision::Take(f(1))
        );
        assert!(matches!(
            decide_claim(&run(), Some(&live), &h("w2"), at(99)).unwrap(),
            ClaimDecision::Held(_)
        ));
        assert_eq!(
            decide_claim(&run(), Some(&live), &h("w2"), at(100)).unwrap(),
            ClaimDecision::Take(f(5))
        );
        assert_eq!(
            decide_claim(&run(), Some(&live), &h("w1"), at(50)).unwrap(),
            ClaimDecision::Take(f(5))
        );
        let released = TopHolding::Released { fence: f(5) };
        assert_eq!(
            decide_claim(&run(), Some(&released), &h("w2"), at(0)).unwrap(),
            ClaimDecision::Take(f(6))
        );
        let damaged = TopHolding::Unreadable { fence: f(9) };
        assert_eq!(
            decide_claim(&run(), Some(&damaged), &h("w2"), at(0)).unwrap(),
            ClaimDecision::Take(f(10))
        );
    }

    #[test]
    fn write_rule() {
        let live = TopHolding::Lease {
            fence: f(4),
            holder: h("w1"),
            expires_at: at(100),
        };
        check_write_fence(&run(), "w", f(4), Some(&live)).unwrap();
        assert!(check_write_fence(&run(), "w", f(3), Some(&live))
            .unwrap_err()
            .is_fenced_out());
        assert!(matches!(
            check_write_fence(&run(), "w", f(5), Some(&live)).unwrap_err(),
            Error::InvalidInput { .. }
        ));
        assert!(matches!(
            check_write_fence(&run(), "w", f(1), None).unwrap_err(),
            Error::InvalidInput { .. }
        ));
        let released = TopHolding::Released { fence: f(5) };
        assert!(check_write_fence(&run(), "w", f(4), Some(&released))
            .unwrap_err()
            .is_fenced_out());
        assert!(check_write_fence(&run(), "w", f(5), Some(&released))
            .unwrap_err()
            .is_fenced_out());
        let damaged = TopHolding::Unreadable { fence: f(9) };
        assert!(check_write_fence(&run(), "w", f(3), Some(&damaged))
            .unwrap_err()
            .is_fenced_out());
    }

    #[test]
    fn release_rule() {
        let live = TopHolding::Lease {
            fence: f(4),
            holder: h("w1"),
            expires_at: at(100),
        };
        assert_eq!(
            decide_release(&run(), Some(&live), f(4)).unwrap(),
            Some(f(5))
        );
        assert_eq!(decide_release(&run(), Some(&live), f(3)).unwrap(), None);
        assert_eq!(decide_release(&run(), None, f(3)).unwrap(), None);
        assert_eq!(
            decide_release(&run(), Some(&TopHolding::Released { fence: f(5) }), f(5)).unwrap(),
            None
        );
    }
}
