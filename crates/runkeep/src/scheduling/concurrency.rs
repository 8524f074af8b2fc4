//! Concurrency keys: at most `limit` runs of one key held live at once.
//!
//! # The rule
//!
//! A run may carry a [`Concurrency`] (a key such as a customer, a thread or
//! a project, and a limit), set at enqueue. Keys are counted **within one
//! session** (the queue a fleet drains): two sessions' keys of the same name
//! are separate. A claim that would make the run held live (a fresh take, a
//! reclaim after a release or an expiry, or a renewal of a lease that has
//! already expired) is admitted only when fewer than the run's `limit`
//! other runs of its key are held live at that instant ([`admit`]);
//! otherwise it answers [`ClaimOutcome::AtLimit`](crate::ClaimOutcome) and
//! changes nothing. A renewal of a live lease is always admitted (it adds no
//! holding). Runs of one key that carry different limits are each judged by
//! their own.
//!
//! Every backend judges this **under one lock per key** (a key lock file on
//! a directory, a transaction-scoped advisory lock on PostgreSQL, the store
//! mutex in memory) held from the count to the publication of the holding,
//! so two claimers of two runs of one key cannot both see room for one.
//! `claim_next` skips the runs of keys at their limit without reading them.
//!
//! # The history
//!
//! The store keeps every holding of a keyed run ([`KeyHolding`]: run,
//! fence, acquired, expiry, end), read with
//! [`CheckpointStore::key_holdings`](crate::CheckpointStore::key_holdings).
//! It is the evidence the limit held: [`max_held_at_once`] sweeps it.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::RunId;
use crate::lease::Fence;
use crate::scope::ListingScope;
use crate::time::Timestamp;

/// The longest concurrency key, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// The highest limit a key may carry.
pub const MAX_LIMIT: u32 = 10_000;

/// A run's concurrency key and its limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Concurrency {
    /// The key: 1 to [`MAX_KEY_LEN`] bytes of `[A-Za-z0-9_.:@/-]`.
    pub key: String,
    /// At most this many runs of the key held live at once (1 to
    /// [`MAX_LIMIT`]).
    pub limit: u32,
}

impl Concurrency {
    /// A checked key and limit.
    pub fn new(key: impl Into<String>, limit: u32) -> Result<Self> {
        let c = Self {
            key: key.into(),
            limit,
        };
        c.validate()?;
        Ok(c)
    }

    /// Refuses an empty, long or oddly spelled key and a limit of 0 or
    /// above [`MAX_LIMIT`].
    pub fn validate(&self) -> Result<()> {
        check_key(&self.key)?;
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(Error::invalid(format!(
                "concurrency limit {} of key {:?} is out of range; a limit is 1 to {MAX_LIMIT} runs held at once",
                self.limit, self.key
            )));
        }
        Ok(())
    }
}

/// Refuses a key no run could carry.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(format!(
            "concurrency key {key:?} is {} bytes long; a key is 1 to {MAX_KEY_LEN} bytes",
            key.len()
        )));
    }
    if let Some(bad) = key
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_.:@/-".contains(*c)))
    {
        return Err(Error::invalid(format!(
            "concurrency key {key:?} contains {bad:?}; keys use only [A-Za-z0-9_.:@/-]"
        )));
    }
    Ok(())
}

/// The session a key lives in: `scope` must name one (`InvalidInput`
/// otherwise).
pub fn session_of(scope: &ListingScope) -> Result<ListingScope> {
    match (scope.project_id(), scope.session_id()) {
        (Some(p), Some(s)) => Ok(ListingScope::session(
            scope.tenant_id().clone(),
            p.clone(),
            s.clone(),
        )),
        _ => Err(Error::invalid(format!(
            "concurrency keys are counted per session; scope {scope} names no session"
        ))),
    }
}

/// Why a claim was refused: the key is at its limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyBusy {
    /// The key.
    pub key: String,
    /// The limit the claimed run carries.
    pub limit: u32,
    /// Runs of the key held live when the claim was judged.
    pub held: u32,
}

/// The key rule: a claim of a run carrying `c` is admitted when
/// `held_by_others` (the other runs of the key held live at the claim's
/// instant, counted under the key's lock) is below the limit; `Some` is the
/// refusal.
pub fn admit(c: &Concurrency, held_by_others: u32) -> Option<KeyBusy> {
    (held_by_others >= c.limit).then(|| KeyBusy {
        key: c.key.clone(),
        limit: c.limit,
        held: held_by_others,
    })
}

/// One holding of a keyed run, as the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyHolding {
    /// The run (its session is the key's).
    pub run_id: RunId,
    /// Parent run, for a sub-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// The holding's fence.
    pub fence: Fence,
    /// When it was acquired (the claim's instant).
    pub acquired_at: Timestamp,
    /// When its lease expires (a later holding of the run supersedes it).
    pub expires_at: Timestamp,
    /// When it ended before expiring (released, finished, failed, snoozed,
    /// cancelled, renewed or taken over), if the store saw it end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
}

impl KeyHolding {
    /// The instant the holding stopped counting: its end, or its expiry.
    pub fn until(&self) -> Timestamp {
        match self.ended_at {
            Some(e) if e < self.expires_at => e,
            _ => self.expires_at,
        }
    }
}

/// Records holdings of keyed runs for a backend that keeps the history as a
/// list (the memory store; the directory's key log replays into one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyLog {
    entries: Vec<KeyHolding>,
}

impl KeyLog {
    /// A holding acquired at `acquired_at`: ends the run's previous open
    /// holding there (a renewal or a takeover supersedes it).
    pub fn acquired(
        &mut self,
        run: &RunId,
        parent: Option<&RunId>,
        fence: Fence,
        acquired_at: Timestamp,
        expires_at: Timestamp,
    ) {
        self.ended(run, parent, acquired_at);
        self.entries.push(KeyHolding {
            run_id: run.clone(),
            parent_run_id: parent.cloned(),
            fence,
            acquired_at,
            expires_at,
            ended_at: None,
        });
    }

    /// The run's open holding ended at `at` (released, finished, …).
    pub fn ended(&mut self, run: &RunId, parent: Option<&RunId>, at: Timestamp) {
        if let Some(open) = self.entries.iter_mut().rev().find(|h| {
            &h.run_id == run && h.parent_run_id.as_ref() == parent && h.ended_at.is_none()
        }) {
            if at < open.expires_at {
                open.ended_at = Some(at);
            } else {
                open.ended_at = Some(open.expires_at);
            }
        }
    }

    /// Forgets a deleted run's holdings.
    pub fn forget(&mut self, run: &RunId, parent: Option<&RunId>) {
        self.entries
            .retain(|h| !(&h.run_id == run && h.parent_run_id.as_ref() == parent));
    }

    /// The history, oldest first.
    pub fn entries(&self) -> &[KeyHolding] {
        &self.entries
    }
}

/// The most holdings live at one instant in `history` (half-open
/// intervals `[acquired_at, until)`), and the first instant it was reached.
/// What a race test asserts against a key's limit.
pub fn max_held_at_once(history: &[KeyHolding]) -> (u32, Option<Timestamp>) {
    let mut edges: Vec<(Timestamp, i32)> = Vec::with_capacity(history.len() * 2);
    for h in history {
        if h.until() > h.acquired_at {
            edges.push((h.acquired_at, 1));
            edges.push((h.until(), -1));
        }
    }
    // Ends sort before starts at one instant: intervals are half-open.
    edges.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut best, mut at) = (0i32, 0i32, None);
    for (t, d) in edges {
        now += d;
        if now > best {
            best = now;
            at = Some(t);
        }
    }
    (best.max(0) as u32, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }

    fn run(s: &str) -> RunId {
        RunId::new(s).unwrap()
    }

    #[test]
    fn keys_and_limits_are_checked() {
        assert!(Concurrency::new("customer-42", 2).is_ok());
        assert!(Concurrency::new("", 1).is_err());
        assert!(Concurrency::new("a b", 1).is_err());
        assert!(Concurrency::new("k", 0).is_err());
        assert!(Concurrency::new("k", MAX_LIMIT + 1).is_err());
        assert!(Concurrency::new("x".repeat(MAX_KEY_LEN + 1), 1).is_err());
    }

    #[test]
    fn admit_refuses_at_the_limit() {
        let c = Concurrency::new("k", 2).unwrap();
        assert_eq!(admit(&c, 1), None);
        assert_eq!(
            admit(&c, 2),
            Some(KeyBusy {
                key: "k".into(),
                limit: 2,
                held: 2
            })
        );
    }

    /// Runs other than `run` whose holding in `log` is live at `now`.
    fn held_by_others(log: &KeyLog, run: &RunId, now: Timestamp) -> usize {
        let mut live: Vec<&RunId> = log
            .entries()
            .iter()
            .filter(|h| &h.run_id != run && h.acquired_at <= now && now < h.until())
            .map(|h| &h.run_id)
            .collect();
        live.sort();
        live.dedup();
        live.len()
    }

    #[test]
    fn the_log_counts_live_holdings_of_other_runs_and_the_sweep_finds_overlaps() {
        let mut log = KeyLog::default();
        let f = |n| Fence::new(n).unwrap();
        log.acquired(&run("a"), None, f(1), t(0), t(100));
        log.acquired(&run("b"), None, f(1), t(10), t(100));
        assert_eq!(held_by_others(&log, &run("c"), t(20)), 2);
        assert_eq!(held_by_others(&log, &run("a"), t(20)), 1);
        log.ended(&run("a"), None, t(30));
        assert_eq!(held_by_others(&log, &run("c"), t(40)), 1);
        // A renewal supersedes the open holding.
        log.acquired(&run("b"), None, f(2), t(50), t(150));
        assert_eq!(held_by_others(&log, &run("c"), t(60)), 1);
        // Expired without an end: stops counting at its expiry.
        assert_eq!(held_by_others(&log, &run("c"), t(150)), 0);
        let (most, at) = max_held_at_once(log.entries());
        assert_eq!((most, at), (2, Some(t(10))));
        // Back-to-back holdings (one ends where the next starts) do not overlap.
        let mut seq = KeyLog::default();
        seq.acquired(&run("a"), None, f(1), t(0), t(100));
        seq.ended(&run("a"), None, t(50));
        seq.acquired(&run("b"), None, f(1), t(50), t(100));
        assert_eq!(max_held_at_once(seq.entries()).0, 1);
    }
}
