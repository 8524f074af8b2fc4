//! Leases: claims (one run or the next runnable), release, finish, snooze, enqueue, the lease read.

use super::*;

/// A lease handed to its taker.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseBody {
    /// Who took it.
    pub holder: String,
    /// The fence every write under it presents.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// Expiry, epoch ms (store clock).
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub expires_at: i64,
    /// The run's attempt timeout, ms: stop a step that runs longer and
    /// report the attempt failed (kind `timeout`). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub attempt_timeout_ms: Option<u64>,
}

impl From<&Lease> for LeaseBody {
    fn from(l: &Lease) -> Self {
        Self {
            holder: crate::holder::display(l.holder.as_str()).to_string(),
            fence: l.fence.get(),
            expires_at: ms(l.expires_at),
            attempt_timeout_ms: l.attempt_timeout_ms,
        }
    }
}

impl LeaseBody {
    /// The core lease.
    pub fn to_lease(&self) -> Result<Lease, Problem> {
        Ok(Lease {
            holder: Holder::new(&self.holder).map_err(|e| bad("lease.holder", e))?,
            fence: fence("lease.fence", self.fence)?,
            expires_at: instant("lease.expiresAt", self.expires_at)?,
            attempt_timeout_ms: self.attempt_timeout_ms,
        })
    }
}

/// A run's top holding as a listing shows it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSummaryBody {
    /// Holder; empty for a released or unreadable holding.
    pub holder: String,
    /// The top fence.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// Expiry, epoch ms; 0 for a released or unreadable holding.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub expires_at: i64,
    /// Expired at the answer's instant.
    pub expired: bool,
}

impl From<&LeaseSummary> for LeaseSummaryBody {
    fn from(l: &LeaseSummary) -> Self {
        Self {
            holder: crate::holder::display(&l.holder).to_string(),
            fence: l.fence.get(),
            expires_at: ms(l.expires_at),
            expired: l.expired,
        }
    }
}

impl LeaseSummaryBody {
    /// The core summary.
    pub fn to_summary(&self) -> Result<LeaseSummary, Problem> {
        Ok(LeaseSummary {
            holder: self.holder.clone(),
            fence: fence("fence", self.fence)?,
            expires_at: instant("expiresAt", self.expires_at)?,
            expired: self.expired,
        })
    }
}

/// What a claim takes: holder, lease length and attempt limit (never an
/// instant: the store's clock judges every claim).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimBody {
    /// The claiming worker (unique per process); the same holder renews.
    /// Not blank, no control characters, at most 236 bytes (ASCII) and
    /// never containing `~token:`: the server appends ` ~token:<token id>`
    /// to bind the holding to the token, within the store's 256 bytes.
    #[schema(
        pattern = r"^(?![\s\S]*~token:)(?=[\s\S]*\S)(?:[\x20-\x7e]{1,236}|[^\x00-\x1f\x7f-\x9f]{1,59})$"
    )]
    pub holder: String,
    /// Lease length, ms: 1000 ms (1 s) to 31622400000 ms (366 days). The
    /// store takes any positive length, but a lease shorter than a claim
    /// takes on its volume has expired before it is handed back (a
    /// directory store answers 503 `unavailable`), so the document asks
    /// for at least a second.
    #[schema(minimum = 1000, maximum = 31_622_400_000_i64)]
    pub ttl_ms: u64,
    /// Attempt limit for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub max_attempts: Option<u32>,
}

impl ClaimBody {
    /// The core options.
    pub fn to_options(&self) -> Result<runkeep::ClaimOptions, Problem> {
        let mut o = runkeep::ClaimOptions::new(
            Holder::new(&self.holder).map_err(|e| bad("holder", e))?,
            Ttl::from_millis(self.ttl_ms).map_err(|e| bad("ttlMs", e))?,
        );
        o.max_attempts = self.max_attempts;
        Ok(o)
    }

    /// The wire form of core options. Refuses an explicit
    /// [`ClaimOptions::now`](runkeep::ClaimOptions::now): over HTTP the
    /// store's clock judges every expiry, and a claim cannot choose it.
    pub fn of(o: &runkeep::ClaimOptions) -> runkeep::Result<Self> {
        if o.now.is_some() {
            return Err(runkeep::Error::invalid(
                "ClaimOptions::now cannot be sent over HTTP: the server judges every claim at its store's clock. Leave it None (use a ManualClock on the backing store to test time in process)",
            ));
        }
        Ok(Self {
            holder: o.holder.to_string(),
            ttl_ms: o.ttl.as_millis(),
            max_attempts: o.max_attempts,
        })
    }
}

/// What a claim answered.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum ClaimAnswer {
    /// The run is yours at this fence.
    Acquired {
        /// The lease.
        lease: LeaseBody,
    },
    /// Someone else holds it live.
    Held {
        /// Their holding.
        lease: LeaseSummaryBody,
    },
    /// The run is finished.
    Finished {
        /// Its status.
        status: RunStatusBody,
    },
    /// Deferred until this instant.
    #[serde(rename_all = "camelCase")]
    NotBefore {
        /// Epoch ms.
        #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
        available_at: i64,
    },
    /// The run's concurrency key is at its limit; nothing changed.
    AtLimit {
        /// The key.
        #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9_.:@/-]+$")]
        key: String,
        /// The limit the run carries.
        #[schema(minimum = 1, maximum = 10_000)]
        limit: u32,
        /// Other runs of the key held live when the claim was judged.
        #[schema(format = Int64, minimum = 0, maximum = 4_294_967_295_i64)]
        held: u32,
    },
}

impl From<&ClaimOutcome> for ClaimAnswer {
    fn from(o: &ClaimOutcome) -> Self {
        match o {
            ClaimOutcome::Acquired(l) => Self::Acquired { lease: l.into() },
            ClaimOutcome::Held(s) => Self::Held { lease: s.into() },
            ClaimOutcome::Finished(s) => Self::Finished {
                status: (*s).into(),
            },
            ClaimOutcome::NotBefore(t) => Self::NotBefore {
                available_at: ms(*t),
            },
            ClaimOutcome::AtLimit(b) => Self::AtLimit {
                key: b.key.clone(),
                limit: b.limit,
                held: b.held,
            },
        }
    }
}

impl ClaimAnswer {
    /// The core outcome.
    pub fn to_outcome(&self) -> Result<ClaimOutcome, Problem> {
        Ok(match self {
            Self::Acquired { lease } => ClaimOutcome::Acquired(lease.to_lease()?),
            Self::Held { lease } => ClaimOutcome::Held(lease.to_summary()?),
            Self::Finished { status } => ClaimOutcome::Finished((*status).into()),
            Self::NotBefore { available_at } => {
                ClaimOutcome::NotBefore(instant("availableAt", *available_at)?)
            }
            Self::AtLimit { key, limit, held } => ClaimOutcome::AtLimit(KeyBusy {
                key: key.clone(),
                limit: *limit,
                held: *held,
            }),
        })
    }

    /// The short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Acquired { .. } => "acquired",
            Self::Held { .. } => "held",
            Self::Finished { .. } => "finished",
            Self::NotBefore { .. } => "not_before",
            Self::AtLimit { .. } => "at_limit",
        }
    }
}

/// `claim_next`: scope narrowing, filter, claim options, optional wait.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimNextBody {
    /// Only this project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project: Option<String>,
    /// Only this session (needs `project`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session: Option<String>,
    /// Only runs whose park is in this set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1)]
    pub park: Option<Vec<ParkStateBody>>,
    /// Which run first.
    #[serde(default)]
    pub order: OrderBody,
    /// The claiming worker (unique per process); the same holder renews.
    /// Not blank, no control characters, at most 236 bytes (ASCII) and
    /// never containing `~token:`: the server appends ` ~token:<token id>`
    /// to bind the holding to the token, within the store's 256 bytes.
    #[schema(
        pattern = r"^(?![\s\S]*~token:)(?=[\s\S]*\S)(?:[\x20-\x7e]{1,236}|[^\x00-\x1f\x7f-\x9f]{1,59})$"
    )]
    pub holder: String,
    /// Lease length, ms: 1000 ms (1 s) to 31622400000 ms (366 days). The
    /// store takes any positive length, but a lease shorter than a claim
    /// takes on its volume has expired before it is handed back (a
    /// directory store answers 503 `unavailable`), so the document asks
    /// for at least a second.
    #[schema(minimum = 1000, maximum = 31_622_400_000_i64)]
    pub ttl_ms: u64,
    /// Attempt limit for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub max_attempts: Option<u32>,
    /// Wait up to this many ms (at most 30 000) for a run to become
    /// runnable when none is; 0 or absent answers at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 30000)]
    pub wait_ms: Option<u64>,
}

impl ObjectRule for ClaimNextBody {
    fn rule() -> (&'static str, Value) {
        session_needs_project()
    }
}

impl ClaimNextBody {
    /// The claim part, as a [`ClaimBody`].
    pub fn claim(&self) -> ClaimBody {
        ClaimBody {
            holder: self.holder.clone(),
            ttl_ms: self.ttl_ms,
            max_attempts: self.max_attempts,
        }
    }
}

/// `claim-next-batch`: `claim-next`'s body (its wait included: the call
/// waits until at least one run is runnable) and the batch size.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimNextBatchBody {
    /// The most runs to take, 1 to 256.
    #[schema(minimum = 1, maximum = 256)]
    pub max: u32,
    /// What to claim, as `claim-next`'s body.
    pub claim: ClaimNextBody,
}

/// The answer of `claim-next-batch`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimNextBatchAnswer {
    /// The runs taken, in the order `claim-next` would have handed them
    /// out, each under its own lease; empty when none was runnable (within
    /// the wait).
    pub claimed: Vec<Claimed>,
}

/// A run taken by `claim_next`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Claimed {
    /// The run.
    pub run: RunAddress,
    /// Its lease.
    pub lease: LeaseBody,
}

/// The answer of `claim_next`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct ClaimNextAnswer {
    /// The run taken, or `null` when none was runnable (within the wait).
    pub claimed: Option<Claimed>,
}

/// A fence, for release (absent: an operator's release of whoever holds it).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The holding to release; absent releases the current holding
    /// (operator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// Whether a release or snooze took effect.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Done {
    /// True when the holding was the current one and is gone.
    pub done: bool,
}

/// Snooze: release and defer.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnoozeBody {
    /// The holding.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// Not claimable before, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub until: i64,
}

/// Finish: the holding and the outcome.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishBody {
    /// The holding (spent by the finish).
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// How it ended.
    pub outcome: OutcomeBody,
}

/// Enqueue: the first checkpoint and the run's options.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueueBody {
    /// The run's first checkpoint.
    pub checkpoint: CheckpointBody,
    /// Not claimable before, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub available_at: Option<i64>,
    /// The run's own attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub max_attempts: Option<u32>,
    /// The run's own retry policy after a failed attempt (defaults: 1 s,
    /// ×2, 10 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicyBody>,
    /// Each attempt's time limit, ms (a lease's length: 1 ms to 366 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub attempt_timeout_ms: Option<u64>,
    /// The run must be finished by then, epoch ms (store clock): its first
    /// claim at or after it finishes it as failed, reason `deadline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub deadline: Option<i64>,
    /// Its priority: higher runs are claimed first (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: Option<i64>,
    /// Its concurrency key and limit: at most `limit` runs of the key (in
    /// the run's session) held at once; a claim beyond answers `atLimit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyBody>,
    /// How long it is kept once finished, ms (1 ms to 366 days; absent:
    /// the store's retention policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub retention_ms: Option<u64>,
    /// An idempotency key and window: while the window of a first enqueue
    /// with the key is open (and its run exists), this one creates nothing
    /// and answers that run. With it the answer is an `EnqueuedBody`
    /// (`created`, `run`, `checkpoint`); without it, the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe: Option<DedupeBody>,
}

impl EnqueueBody {
    /// The body of an enqueue of `checkpoint` with `options` and `dedupe`.
    pub fn of(checkpoint: &Checkpoint, options: &EnqueueOptions, dedupe: Option<&Dedupe>) -> Self {
        Self {
            checkpoint: checkpoint.into(),
            available_at: options.available_at.map(ms),
            max_attempts: options.max_attempts,
            retry: options.retry.map(Into::into),
            attempt_timeout_ms: options.attempt_timeout.map(Ttl::as_millis),
            deadline: options.deadline.map(ms),
            priority: (!options.priority.is_default()).then(|| i64::from(options.priority.get())),
            concurrency: options.concurrency.as_ref().map(Into::into),
            retention_ms: options.retention.map(Ttl::as_millis),
            dedupe: dedupe.map(Into::into),
        }
    }

    /// The run's options and the idempotency key, checked (a bad value is
    /// `invalid-input` naming its field).
    pub fn to_options(&self) -> Result<(EnqueueOptions, Option<Dedupe>), Problem> {
        let ttl = |field: &str, ms: Option<u64>| {
            ms.map(|ms| Ttl::from_millis(ms).map_err(|e| bad(field, e)))
                .transpose()
        };
        let options = EnqueueOptions {
            available_at: opt_instant("availableAt", self.available_at)?,
            max_attempts: self.max_attempts,
            retry: self.retry.map(Into::into),
            attempt_timeout: ttl("attemptTimeoutMs", self.attempt_timeout_ms)?,
            deadline: opt_instant("deadline", self.deadline)?,
            priority: self
                .priority
                .map(|p| Priority::new(p).map_err(|e| bad("priority", e)))
                .transpose()?
                .unwrap_or_default(),
            concurrency: self
                .concurrency
                .as_ref()
                .map(|c| c.to_concurrency("concurrency"))
                .transpose()?,
            retention: ttl("retentionMs", self.retention_ms)?,
        };
        let dedupe = self
            .dedupe
            .as_ref()
            .map(|d| d.to_dedupe("dedupe"))
            .transpose()?;
        Ok((options, dedupe))
    }
}

/// A lease read.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeLease {
    /// The top holding, `null` when never claimed.
    pub lease: Option<LeaseSummaryBody>,
}

/// A failed attempt's error: what the step raised.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttemptErrorBody {
    /// What failed, in a word (`error`, `panic`, `timeout`, or the error's
    /// class name); 1 to 128 characters.
    #[schema(min_length = 1, max_length = 128, pattern = r"\S")]
    pub kind: String,
    /// The error's text; at most 4 096 characters (clients cut longer text
    /// with a marker).
    #[schema(max_length = 4096)]
    pub message: String,
}

impl From<&AttemptErrorBody> for AttemptError {
    fn from(b: &AttemptErrorBody) -> Self {
        AttemptError {
            kind: b.kind.clone(),
            message: b.message.clone(),
        }
    }
}

impl From<&AttemptError> for AttemptErrorBody {
    fn from(e: &AttemptError) -> Self {
        Self {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }
    }
}

/// Fail an attempt: the holding, the error, and the report's own limit.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailAttemptBody {
    /// The holding whose attempt failed (spent by the report).
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// What the step raised.
    pub error: AttemptErrorBody,
    /// The attempt limit for this report, over the run's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub max_attempts: Option<u32>,
}

/// Cancel: the operator's reason.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why (kept as the run's finish reason); at most 4 096 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub reason: Option<String>,
}

/// How a run is retried after a failed attempt.
#[derive(Clone, Copy, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryPolicyBody {
    /// The first delay, ms (at most 7 days).
    #[schema(maximum = 604_800_000)]
    pub base_ms: u64,
    /// The growth per attempt, 1 to 100.
    #[schema(minimum = 1, maximum = 100)]
    pub factor: f64,
    /// The longest delay, ms (at most 7 days).
    #[schema(maximum = 604_800_000)]
    pub cap_ms: u64,
}

impl From<RetryPolicyBody> for RetryPolicy {
    fn from(b: RetryPolicyBody) -> Self {
        RetryPolicy {
            base_ms: b.base_ms,
            factor: b.factor,
            cap_ms: b.cap_ms,
        }
    }
}

impl From<RetryPolicy> for RetryPolicyBody {
    fn from(p: RetryPolicy) -> Self {
        Self {
            base_ms: p.base_ms,
            factor: p.factor,
            cap_ms: p.cap_ms,
        }
    }
}
