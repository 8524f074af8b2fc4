//! The dedupe window: an enqueue that carries an idempotency key.
//!
//! [`CheckpointStore::enqueue_once`](crate::CheckpointStore::enqueue_once)
//! with a [`Dedupe`] (a key and a window) creates the run unless a first
//! enqueue with the same key, in the same session, created a run less than
//! `window` ago and that run still exists: then it returns that run
//! ([`Enqueued::created`] false) and changes nothing. After the window a
//! new enqueue with the key creates a new run and starts a new window.
//! A caller-chosen run id keeps working as before: an enqueue of a run id
//! that exists is `Conflict` (with or without a key).
//!
//! Every backend judges [`decide`] under one lock per key (a key lock file
//! on a directory, a row lock on PostgreSQL, the store mutex in memory)
//! held from the read of the key's record to the creation of the run.

use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::id::RunId;
use crate::scope::RunScope;
use crate::time::{Timestamp, Ttl};

/// The longest idempotency key, in bytes.
pub const MAX_KEY_LEN: usize = 256;
/// The longest window: 30 days.
pub const MAX_WINDOW_MS: u64 = 30 * 24 * 3600 * 1000;

/// An enqueue's idempotency key and window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dedupe {
    /// The key: 1 to [`MAX_KEY_LEN`] bytes, any printable text.
    pub key: String,
    /// How long after the first enqueue a second one returns it.
    pub window: Ttl,
}

impl Dedupe {
    /// Refuses an empty, long or unprintable key and a window above
    /// [`MAX_WINDOW_MS`].
    pub fn validate(&self) -> Result<()> {
        if self.key.is_empty() || self.key.len() > MAX_KEY_LEN {
            return Err(Error::invalid(format!(
                "idempotency key is {} bytes long; a key is 1 to {MAX_KEY_LEN} bytes",
                self.key.len()
            )));
        }
        if self.key.chars().any(char::is_control) {
            return Err(Error::invalid(
                "idempotency key contains a control character; use printable text",
            ));
        }
        if self.window.as_millis() > MAX_WINDOW_MS {
            return Err(Error::invalid(format!(
                "dedupe window of {} ms is above the longest, {MAX_WINDOW_MS} ms (30 days)",
                self.window.as_millis()
            )));
        }
        Ok(())
    }
}

/// What a store keeps per idempotency key: the run the window belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DedupeRecord {
    /// The run the first enqueue created.
    pub run_id: RunId,
    /// Its parent, for a sub-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// When that enqueue happened (store clock).
    pub enqueued_at: Timestamp,
    /// The end of the window.
    pub expires_at: Timestamp,
}

impl DedupeRecord {
    /// The record an enqueue of `scope` at `now` with `d` leaves.
    pub fn new(scope: &RunScope, d: &Dedupe, now: Timestamp) -> Self {
        Self {
            run_id: scope.run_id.clone(),
            parent_run_id: scope.parent_run_id.clone(),
            enqueued_at: now,
            expires_at: now.plus(d.window),
        }
    }

    /// The run it names, in `session`'s scope.
    pub fn scope_in(&self, session: &RunScope) -> RunScope {
        let mut s = session.clone();
        s.run_id = self.run_id.clone();
        s.parent_run_id = self.parent_run_id.clone();
        s
    }
}

/// The dedupe rule, judged under the key's lock: with `existing` (the key's
/// record, and whether the run it names still exists), a window still open
/// at `now` returns that run; otherwise a new run is created.
pub fn decide(existing: Option<(&DedupeRecord, bool)>, now: Timestamp) -> Option<DedupeRecord> {
    match existing {
        Some((r, true)) if now < r.expires_at => Some(r.clone()),
        _ => None,
    }
}

/// What [`CheckpointStore::enqueue_once`](crate::CheckpointStore::enqueue_once) answers.
#[derive(Clone, Debug, PartialEq)]
pub struct Enqueued {
    /// The run: the new one, or the one the window belongs to.
    pub run: RunScope,
    /// True when this call created it.
    pub created: bool,
    /// The first checkpoint this call wrote, or the run's latest when it
    /// was not created (`None` if it has none any more).
    pub checkpoint: Option<Checkpoint>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_window_returns_the_run_and_a_closed_or_orphaned_one_does_not() {
        let t = |ms| Timestamp::from_millis(ms).unwrap();
        let r = DedupeRecord {
            run_id: RunId::new("r1").unwrap(),
            parent_run_id: None,
            enqueued_at: t(0),
            expires_at: t(100),
        };
        assert_eq!(decide(Some((&r, true)), t(99)), Some(r.clone()));
        assert_eq!(decide(Some((&r, true)), t(100)), None);
        assert_eq!(decide(Some((&r, false)), t(50)), None);
        assert_eq!(decide(None, t(50)), None);
        let bad = Dedupe {
            key: String::new(),
            window: Ttl::from_millis(10).unwrap(),
        };
        assert!(bad.validate().is_err());
    }
}
