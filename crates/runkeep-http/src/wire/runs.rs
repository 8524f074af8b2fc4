//! Runs: addresses, listings, status, lifecycle, the run summary, the store's clock and `whoami`.

use super::*;

/// The address of one run.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunAddress {
    /// Tenant.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub tenant_id: String,
    /// Project.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project_id: String,
    /// Session.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session_id: String,
    /// Run.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub run_id: String,
    /// The parent run, for a sub-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent_run_id: Option<String>,
}

impl From<&RunScope> for RunAddress {
    fn from(s: &RunScope) -> Self {
        Self {
            tenant_id: s.tenant_id.to_string(),
            project_id: s.project_id.to_string(),
            session_id: s.session_id.to_string(),
            run_id: s.run_id.to_string(),
            parent_run_id: s.parent_run_id.as_ref().map(ToString::to_string),
        }
    }
}

impl RunAddress {
    /// The core scope (ids validated).
    pub fn to_scope(&self, field: &str) -> Result<RunScope, Problem> {
        let f = |n: &str| format!("{field}.{n}");
        let mut s = RunScope::new(
            TenantId::new(&self.tenant_id).map_err(|e| bad(&f("tenantId"), e))?,
            ProjectId::new(&self.project_id).map_err(|e| bad(&f("projectId"), e))?,
            SessionId::new(&self.session_id).map_err(|e| bad(&f("sessionId"), e))?,
            RunId::new(&self.run_id).map_err(|e| bad(&f("runId"), e))?,
        );
        if let Some(p) = &self.parent_run_id {
            s = s.with_parent(RunId::new(p).map_err(|e| bad(&f("parentRunId"), e))?);
        }
        Ok(s)
    }
}

/// A run's lifecycle status.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStatusBody {
    /// Runnable or running.
    Active,
    /// Finished successfully.
    Completed,
    /// Finished unsuccessfully (or dead-lettered).
    Failed,
    /// Called off.
    Cancelled,
}

impl From<RunStatus> for RunStatusBody {
    fn from(s: RunStatus) -> Self {
        match s {
            RunStatus::Active => Self::Active,
            RunStatus::Completed => Self::Completed,
            RunStatus::Failed => Self::Failed,
            RunStatus::Cancelled => Self::Cancelled,
        }
    }
}

impl From<RunStatusBody> for RunStatus {
    fn from(s: RunStatusBody) -> Self {
        match s {
            RunStatusBody::Active => Self::Active,
            RunStatusBody::Completed => Self::Completed,
            RunStatusBody::Failed => Self::Failed,
            RunStatusBody::Cancelled => Self::Cancelled,
        }
    }
}

/// How a holder ends a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FinishStatusBody {
    /// Done.
    Completed,
    /// Failed, not to be retried.
    Failed,
    /// Called off.
    Cancelled,
}

/// A listing order.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum OrderBody {
    /// By run id (default).
    #[default]
    RunId,
    /// By run start, unrecorded first.
    CreatedAt,
}

impl From<OrderBody> for ListOrder {
    fn from(o: OrderBody) -> Self {
        match o {
            OrderBody::RunId => ListOrder::RunId,
            OrderBody::CreatedAt => ListOrder::CreatedAt,
        }
    }
}

impl From<ListOrder> for OrderBody {
    fn from(o: ListOrder) -> Self {
        match o {
            ListOrder::CreatedAt => OrderBody::CreatedAt,
            _ => OrderBody::RunId,
        }
    }
}

/// A listing order's name in the query (`runId`, `createdAt`,
/// `priority`).
pub fn order_name(o: ListOrder) -> &'static str {
    match o {
        ListOrder::RunId => "runId",
        ListOrder::CreatedAt => "createdAt",
        ListOrder::Priority => "priority",
    }
}

/// One row of the listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRowBody {
    /// The run's address.
    pub run: RunAddress,
    /// Run start, epoch ms; absent when never recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub run_created_at: Option<i64>,
    /// Number of checkpoints.
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub checkpoint_count: u64,
    /// The latest checkpoint (total order); absent only on a damaged row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub latest_checkpoint_id: Option<String>,
    /// Its `createdAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub latest_checkpoint_at: Option<i64>,
    /// The park by precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ParkSummaryBody>,
    /// The top holding; absent when never claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<LeaseSummaryBody>,
    /// Set when the run's records could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
    /// Lifecycle status.
    pub status: RunStatusBody,
    /// When finished, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub finished_at: Option<i64>,
    /// Takeovers from expired leases so far.
    #[schema(format = Int64, maximum = 4_294_967_295_i64)]
    pub attempts: u32,
    /// Not claimable before, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub available_at: Option<i64>,
    /// Dead-lettered: failed because its holders kept losing it (the store
    /// finished it at its attempt limit), not failed by a worker.
    #[serde(default)]
    pub dead_lettered: bool,
    /// Its priority (higher runs are claimed first); absent when 0.
    #[serde(default, skip_serializing_if = "is_zero_priority")]
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: i32,
    /// Its concurrency key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
}

pub(crate) fn is_zero_priority(p: &i32) -> bool {
    *p == 0
}

impl From<&RunRow> for RunRowBody {
    fn from(r: &RunRow) -> Self {
        Self {
            run: (&r.scope).into(),
            run_created_at: r.run_created_at.map(ms),
            checkpoint_count: r.checkpoint_count,
            latest_checkpoint_id: r.latest_checkpoint_id.as_ref().map(ToString::to_string),
            latest_checkpoint_at: r.latest_checkpoint_at.map(ms),
            park: r.park.as_ref().map(Into::into),
            claim: r.claim.as_ref().map(Into::into),
            damaged: r.damaged.as_deref().map(crate::problem::redact_paths),
            status: r.status.into(),
            finished_at: r.finished_at.map(ms),
            attempts: r.attempts,
            available_at: r.available_at.map(ms),
            dead_lettered: r.dead_lettered,
            priority: r.priority.get(),
            concurrency_key: r.concurrency_key.clone(),
        }
    }
}

impl RunRowBody {
    /// The core row.
    pub fn to_row(&self) -> Result<RunRow, Problem> {
        Ok(RunRow {
            scope: self.run.to_scope("run")?,
            run_created_at: opt_instant("runCreatedAt", self.run_created_at)?,
            checkpoint_count: self.checkpoint_count,
            latest_checkpoint_id: self
                .latest_checkpoint_id
                .as_ref()
                .map(CheckpointId::new)
                .transpose()
                .map_err(|e| bad("latestCheckpointId", e))?,
            latest_checkpoint_at: opt_instant("latestCheckpointAt", self.latest_checkpoint_at)?,
            park: self.park.as_ref().map(|p| p.to_summary()).transpose()?,
            claim: self.claim.as_ref().map(|c| c.to_summary()).transpose()?,
            damaged: self.damaged.clone(),
            status: self.status.into(),
            finished_at: opt_instant("finishedAt", self.finished_at)?,
            attempts: self.attempts,
            available_at: opt_instant("availableAt", self.available_at)?,
            dead_lettered: self.dead_lettered,
            priority: Priority::new(i64::from(self.priority)).map_err(|e| bad("priority", e))?,
            concurrency_key: self.concurrency_key.clone(),
        })
    }
}

/// A page of the listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct RunPageBody {
    /// Rows.
    pub entries: Vec<RunRowBody>,
    /// Present iff more rows remain: pass it back as `cursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

impl From<&RunPage> for RunPageBody {
    fn from(p: &RunPage) -> Self {
        Self {
            entries: p.entries.iter().map(Into::into).collect(),
            cursor: p.cursor.clone(),
        }
    }
}

impl RunPageBody {
    /// The core page.
    pub fn to_page(&self) -> Result<RunPage, Problem> {
        Ok(RunPage {
            entries: self
                .entries
                .iter()
                .map(RunRowBody::to_row)
                .collect::<Result<_, _>>()?,
            cursor: self.cursor.clone(),
        })
    }
}

/// A finish: status, result, reason.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutcomeBody {
    /// Final status.
    pub status: FinishStatusBody,
    /// The run's result, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub reason: Option<String>,
}

impl From<&Outcome> for OutcomeBody {
    fn from(o: &Outcome) -> Self {
        Self {
            status: match o.status {
                FinishStatus::Completed => FinishStatusBody::Completed,
                FinishStatus::Failed => FinishStatusBody::Failed,
                FinishStatus::Cancelled => FinishStatusBody::Cancelled,
            },
            result: o.result.clone(),
            reason: o.reason.clone(),
        }
    }
}

impl From<&OutcomeBody> for Outcome {
    fn from(o: &OutcomeBody) -> Self {
        Outcome {
            status: match o.status {
                FinishStatusBody::Completed => FinishStatus::Completed,
                FinishStatusBody::Failed => FinishStatus::Failed,
                FinishStatusBody::Cancelled => FinishStatus::Cancelled,
            },
            result: o.result.clone(),
            reason: o.reason.clone(),
        }
    }
}

/// A run's lifecycle.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleBody {
    /// Status.
    pub status: RunStatusBody,
    /// Finished at, epoch ms (store clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub finished_at: Option<i64>,
    /// The fence the finish spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub finished_fence: Option<u64>,
    /// The finish's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The finish's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Attempts lost so far: takeovers from expired leases and failed
    /// attempts.
    #[schema(format = Int64, maximum = 4_294_967_295_i64)]
    pub attempts: u32,
    /// The run's own attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub max_attempts: Option<u32>,
    /// Not claimable before, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub available_at: Option<i64>,
    /// Dead-lettered: failed by the store at the attempt limit (status
    /// `failed`, reason `attempts exhausted`). Derived, answered only:
    /// the store decides it.
    #[serde(default)]
    pub dead_lettered: bool,
    /// The newest failed attempts (at most 20), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailedAttemptBody>,
    /// The run's own retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicyBody>,
    /// Each attempt's time limit, ms (1 ms to 366 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub attempt_timeout_ms: Option<u64>,
    /// The run must be finished by then, epoch ms (store clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub deadline: Option<i64>,
    /// Its priority; absent when 0.
    #[serde(default, skip_serializing_if = "is_zero_priority")]
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: i32,
    /// Its concurrency key and limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyBody>,
    /// How long it is kept once finished, ms (absent: the store's policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub retention_ms: Option<u64>,
}

/// A run's concurrency key and its limit: at most `limit` runs of the key
/// (within the run's session) held at once.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConcurrencyBody {
    /// The key: 1 to 128 bytes of `[A-Za-z0-9_.:@/-]`.
    #[schema(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9_.:@/-]+$")]
    pub key: String,
    /// At most this many runs of the key held at once.
    #[schema(minimum = 1, maximum = 10_000)]
    pub limit: u32,
}

impl ConcurrencyBody {
    /// The core value, checked.
    pub fn to_concurrency(&self, field: &str) -> Result<Concurrency, Problem> {
        runkeep::scheduling::concurrency::check_key(&self.key)
            .map_err(|e| bad(&format!("{field}.key"), e))?;
        Concurrency::new(self.key.clone(), self.limit)
            .map_err(|e| bad(&format!("{field}.limit"), e))
    }
}

impl From<&Concurrency> for ConcurrencyBody {
    fn from(c: &Concurrency) -> Self {
        Self {
            key: c.key.clone(),
            limit: c.limit,
        }
    }
}

/// One failed attempt of a run.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedAttemptBody {
    /// The attempt count this failure brought the run to.
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub attempt: u32,
    /// The holding that failed.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// When it was recorded, epoch ms (store clock).
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub at: i64,
    /// What failed, in a word.
    pub kind: String,
    /// The error's text.
    pub message: String,
    /// When the run became claimable again, epoch ms; absent when this
    /// failure dead-lettered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub retry_at: Option<i64>,
}

impl From<&FailedAttempt> for FailedAttemptBody {
    fn from(f: &FailedAttempt) -> Self {
        Self {
            attempt: f.attempt,
            fence: f.fence.get(),
            at: ms(f.at),
            kind: f.error.kind.clone(),
            message: f.error.message.clone(),
            retry_at: f.retry_at.map(ms),
        }
    }
}

impl FailedAttemptBody {
    /// The core record.
    pub fn to_failed_attempt(&self) -> Result<FailedAttempt, Problem> {
        Ok(FailedAttempt {
            attempt: self.attempt,
            fence: fence("failures.fence", self.fence)?,
            at: instant("failures.at", self.at)?,
            error: AttemptError {
                kind: self.kind.clone(),
                message: self.message.clone(),
            },
            retry_at: opt_instant("failures.retryAt", self.retry_at)?,
        })
    }
}

impl From<&Lifecycle> for LifecycleBody {
    fn from(l: &Lifecycle) -> Self {
        Self {
            status: l.status.into(),
            finished_at: l.finished_at.map(ms),
            finished_fence: l.finished_fence.map(Fence::get),
            result: l.result.clone(),
            reason: l.reason.clone(),
            attempts: l.attempts,
            max_attempts: l.max_attempts,
            available_at: l.available_at.map(ms),
            dead_lettered: l.is_dead_lettered(),
            failures: l.failures.iter().map(Into::into).collect(),
            retry: l.retry.map(Into::into),
            attempt_timeout_ms: l.attempt_timeout_ms,
            deadline: l.deadline.map(ms),
            priority: l.priority.get(),
            concurrency: l.concurrency.as_ref().map(Into::into),
            retention_ms: l.retention_ms,
        }
    }
}

impl LifecycleBody {
    /// The core lifecycle.
    pub fn to_lifecycle(&self) -> Result<Lifecycle, Problem> {
        Ok(Lifecycle {
            status: self.status.into(),
            finished_at: opt_instant("finishedAt", self.finished_at)?,
            finished_fence: opt_fence("finishedFence", self.finished_fence)?,
            result: self.result.clone(),
            reason: self.reason.clone(),
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            available_at: opt_instant("availableAt", self.available_at)?,
            failures: self
                .failures
                .iter()
                .map(FailedAttemptBody::to_failed_attempt)
                .collect::<Result<_, _>>()?,
            retry: self.retry.map(Into::into),
            attempt_timeout_ms: self.attempt_timeout_ms,
            deadline: opt_instant("deadline", self.deadline)?,
            priority: Priority::new(i64::from(self.priority)).map_err(|e| bad("priority", e))?,
            concurrency: self
                .concurrency
                .as_ref()
                .map(|c| c.to_concurrency("concurrency"))
                .transpose()?,
            retention_ms: self.retention_ms,
        })
    }
}

/// Everything the console shows of one run, in one call.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// The run.
    pub run: RunAddress,
    /// The top holding, judged at the store's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseSummaryBody>,
    /// The lifecycle.
    pub lifecycle: LifecycleBody,
    /// The latest checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint: Option<CheckpointBody>,
    /// The outstanding park's checkpoint, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<CheckpointBody>,
    /// The event log's last `seq`.
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub last_seq: u64,
    /// The store's clock when this was read, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub now: i64,
}

/// The store's clock.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Clock {
    /// Epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub now: i64,
}

/// Who a token is.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// The token's tenant.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub tenant: String,
    /// Its role: `reader`, `worker` or `operator`.
    #[schema(schema_with = role_name)]
    pub role: String,
    /// Its id (never the secret).
    pub token_id: String,
}

/// The answer of a long-poll wait.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Waited {
    /// True when the store signalled a change before the timeout (it may be
    /// spurious: re-read).
    pub changed: bool,
    /// For an events wait: the log's last `seq` at the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub last_seq: Option<u64>,
}

/// [`WhoAmI::role`]'s schema: a [`Role`](crate::Role)'s name.
fn role_name() -> utoipa::openapi::Schema {
    use crate::Role;
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some("Its role: `reader`, `worker` or `operator`."))
        .enum_values(Some(
            [Role::Reader, Role::Worker, Role::Operator].map(Role::as_str),
        ))
        .build()
        .into()
}
