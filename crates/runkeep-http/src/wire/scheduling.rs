//! The queue's rules beyond the lease on the wire (issue 30): an enqueue's
//! idempotency key and what an enqueue answers, an operator's priority
//! change, and a concurrency key's holdings history
//! ([`runkeep::scheduling`]). The enqueue's own options (priority,
//! concurrency, retention) are fields of [`EnqueueBody`].

use runkeep::scheduling::{concurrency, dedupe, Dedupe, Enqueued, KeyHolding};

use super::*;

/// An enqueue's idempotency key and window: while the window of a first
/// enqueue with `key` (in the same session) is open and its run exists, a
/// second one creates nothing and answers that run.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DedupeBody {
    /// The idempotency key: 1 to 256 bytes of printable text.
    #[schema(min_length = 1, max_length = 256)]
    pub key: String,
    /// How long after the first enqueue with the key a second one returns
    /// its run, ms (1 ms to 30 days).
    #[schema(minimum = 1, maximum = 2_592_000_000_i64)]
    pub window_ms: u64,
}

impl DedupeBody {
    /// The core value, checked; `field` names it in errors (`dedupe.key`,
    /// `dedupe.windowMs`).
    pub fn to_dedupe(&self, field: &str) -> Result<Dedupe, Problem> {
        let window_field = format!("{field}.windowMs");
        if self.window_ms > dedupe::MAX_WINDOW_MS {
            return Err(Problem::invalid(
                &window_field,
                format!(
                    "dedupe window of {} ms is above the longest, {} ms (30 days)",
                    self.window_ms,
                    dedupe::MAX_WINDOW_MS
                ),
            ));
        }
        let window = Ttl::from_millis(self.window_ms).map_err(|e| bad(&window_field, e))?;
        let d = Dedupe {
            key: self.key.clone(),
            window,
        };
        d.validate().map_err(|e| bad(&format!("{field}.key"), e))?;
        Ok(d)
    }
}

impl From<&Dedupe> for DedupeBody {
    fn from(d: &Dedupe) -> Self {
        Self {
            key: d.key.clone(),
            window_ms: d.window.as_millis(),
        }
    }
}

/// What an enqueue that carried `dedupe` answers: the run, whether this
/// enqueue created it, and its checkpoint.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueuedBody {
    /// True when this enqueue created the run; false when the key's window
    /// was open and the run is the one a first enqueue created (nothing
    /// changed).
    pub created: bool,
    /// The run: the path's when created, else the one the key's window
    /// belongs to.
    pub run: RunAddress,
    /// The first checkpoint this enqueue wrote, or the existing run's
    /// latest (`null` when it has none any more).
    pub checkpoint: Option<CheckpointBody>,
}

impl From<&Enqueued> for EnqueuedBody {
    fn from(e: &Enqueued) -> Self {
        Self {
            created: e.created,
            run: (&e.run).into(),
            checkpoint: e.checkpoint.as_ref().map(Into::into),
        }
    }
}

impl EnqueuedBody {
    /// The core answer.
    pub fn to_enqueued(&self) -> Result<Enqueued, Problem> {
        Ok(Enqueued {
            run: self.run.to_scope("run")?,
            created: self.created,
            checkpoint: self
                .checkpoint
                .as_ref()
                .map(|c| c.to_checkpoint("checkpoint"))
                .transpose()?,
        })
    }
}

/// What an enqueue answers (200 either way): without `dedupe`, the
/// checkpoint written (the answer enqueue always gave); with `dedupe`, an
/// [`EnqueuedBody`] saying which run and whether this enqueue created it.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EnqueueAnswer {
    /// An enqueue with `dedupe`.
    Once(EnqueuedBody),
    /// An enqueue without `dedupe`: the run's first checkpoint.
    Written(CheckpointBody),
}

impl EnqueueAnswer {
    /// The core answer for an enqueue of `scope`.
    pub fn to_enqueued(&self, scope: &RunScope) -> Result<Enqueued, Problem> {
        match self {
            Self::Once(e) => e.to_enqueued(),
            Self::Written(cp) => Ok(Enqueued {
                run: scope.clone(),
                created: true,
                checkpoint: Some(cp.to_checkpoint("checkpoint")?),
            }),
        }
    }
}

/// An operator's priority change.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetPriorityBody {
    /// The run's new priority (higher runs are claimed first; default 0).
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: i64,
}

impl SetPriorityBody {
    /// The core value, checked (`priority` names it).
    pub fn to_priority(&self) -> Result<Priority, Problem> {
        Priority::new(self.priority).map_err(|e| bad("priority", e))
    }
}

/// One holding of a run carrying a concurrency key.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyHoldingBody {
    /// The run (in the key's session).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub run_id: String,
    /// Its parent, for a sub-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent_run_id: Option<String>,
    /// The holding's fence.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// Acquired at (the claim's instant), epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub acquired_at: i64,
    /// Its lease's expiry, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub expires_at: i64,
    /// When it ended before expiring (released, finished, renewed, taken
    /// over, …), epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub ended_at: Option<i64>,
}

impl From<&KeyHolding> for KeyHoldingBody {
    fn from(h: &KeyHolding) -> Self {
        Self {
            run_id: h.run_id.to_string(),
            parent_run_id: h.parent_run_id.as_ref().map(ToString::to_string),
            fence: h.fence.get(),
            acquired_at: ms(h.acquired_at),
            expires_at: ms(h.expires_at),
            ended_at: h.ended_at.map(ms),
        }
    }
}

impl KeyHoldingBody {
    /// The core value (ids, fence and instants checked).
    pub fn to_holding(&self) -> Result<KeyHolding, Problem> {
        Ok(KeyHolding {
            run_id: RunId::new(&self.run_id).map_err(|e| bad("runId", e))?,
            parent_run_id: self
                .parent_run_id
                .as_deref()
                .map(RunId::new)
                .transpose()
                .map_err(|e| bad("parentRunId", e))?,
            fence: fence("fence", self.fence)?,
            acquired_at: instant("acquiredAt", self.acquired_at)?,
            expires_at: instant("expiresAt", self.expires_at)?,
            ended_at: opt_instant("endedAt", self.ended_at)?,
        })
    }
}

/// A concurrency key's holdings history, oldest first: every holding of a
/// run carrying the key in the session (holdings of deleted runs are gone
/// with them).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyHoldingsBody {
    /// The key.
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9_.:@/-]+$")]
    pub key: String,
    /// Its holdings, oldest first.
    pub holdings: Vec<KeyHoldingBody>,
}

/// Checks a concurrency key given as `field`.
pub fn concurrency_key(field: &str, key: &str) -> Result<(), Problem> {
    concurrency::check_key(key).map_err(|e| bad(field, e))
}
