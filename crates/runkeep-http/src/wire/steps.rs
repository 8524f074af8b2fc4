//! Steps: one step of a run (checkpoint, events, messages, park), committed all or nothing.

use super::*;

/// A message update inside a step.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepMessagesBody {
    /// The conversation as of this step.
    pub messages: Vec<Value>,
    /// The last event it accounts for; absent: the step's last event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub through_event_seq: Option<u64>,
}

/// One step of a run, written all or nothing.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepBody {
    /// Events to append.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<NewEventBody>,
    /// A checkpoint (with `pending` to park here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointBody>,
    /// A new message snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<StepMessagesBody>,
    /// A new run record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub run_record: Option<Object>,
    /// Finish the run with this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<OutcomeBody>,
}

/// `Step::validate`: a step writes something, one of its parts present and
/// not empty.
impl ObjectRule for StepBody {
    fn rule() -> (&'static str, Value) {
        let present = |name: &str| {
            serde_json::json!({
                "required": [name],
                "properties": { name: { "not": { "type": "null" } } },
            })
        };
        (
            "anyOf",
            serde_json::json!([
                { "required": ["events"], "properties": { "events": { "minItems": 1 } } },
                present("checkpoint"),
                present("messages"),
                present("runRecord"),
                present("finish"),
            ]),
        )
    }
}

impl From<&Step> for StepBody {
    fn from(s: &Step) -> Self {
        Self {
            events: s.events.iter().map(Into::into).collect(),
            checkpoint: s.checkpoint.as_ref().map(Into::into),
            messages: s.messages.as_ref().map(|m| StepMessagesBody {
                messages: m.messages.clone(),
                through_event_seq: m.through_event_seq,
            }),
            run_record: s.run_record.clone(),
            finish: s.finish.as_ref().map(Into::into),
        }
    }
}

impl StepBody {
    /// The core step, moving the payloads (a request's step is not copied).
    pub fn into_step(self) -> Result<Step, Problem> {
        Ok(Step {
            events: self
                .events
                .into_iter()
                .map(|e| NewEvent::new(e.event_type, e.payload))
                .collect(),
            checkpoint: self
                .checkpoint
                .map(|c| c.into_checkpoint("step.checkpoint"))
                .transpose()?,
            messages: self.messages.map(|m| MessagesUpdate {
                messages: m.messages,
                through_event_seq: m.through_event_seq,
            }),
            run_record: self.run_record,
            finish: self.finish.as_ref().map(Into::into),
        })
    }

    /// The core step.
    pub fn to_step(&self) -> Result<Step, Problem> {
        Ok(Step {
            events: self.events.iter().map(Into::into).collect(),
            checkpoint: self
                .checkpoint
                .as_ref()
                .map(|c| c.to_checkpoint("step.checkpoint"))
                .transpose()?,
            messages: self.messages.as_ref().map(|m| MessagesUpdate {
                messages: m.messages.clone(),
                through_event_seq: m.through_event_seq,
            }),
            run_record: self.run_record.clone(),
            finish: self.finish.as_ref().map(Into::into),
        })
    }
}

/// A step commit.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitStepBody {
    /// The holding; checked by the store with the whole step.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// The step.
    pub step: StepBody,
}

/// What a committed step wrote.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct StepReceiptBody {
    /// Events as recorded.
    pub events: Vec<EventBody>,
    /// The checkpoint as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointBody>,
    /// The lifecycle, when the step finished the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleBody>,
}

impl From<&StepReceipt> for StepReceiptBody {
    fn from(r: &StepReceipt) -> Self {
        Self {
            events: r.events.iter().map(Into::into).collect(),
            checkpoint: r.checkpoint.as_ref().map(Into::into),
            lifecycle: r.lifecycle.as_ref().map(Into::into),
        }
    }
}

impl StepReceiptBody {
    /// The core receipt.
    pub fn to_receipt(&self) -> Result<StepReceipt, Problem> {
        Ok(StepReceipt {
            events: self
                .events
                .iter()
                .map(EventBody::to_event)
                .collect::<Result<_, _>>()?,
            checkpoint: self
                .checkpoint
                .as_ref()
                .map(|c| c.to_checkpoint("checkpoint"))
                .transpose()?,
            lifecycle: self
                .lifecycle
                .as_ref()
                .map(LifecycleBody::to_lifecycle)
                .transpose()?,
        })
    }
}

/// The next claim of a hand-over: `claim-next`'s body without its wait
/// (the tenant is the step's, from the path).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NextClaimBody {
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
}

impl ObjectRule for NextClaimBody {
    fn rule() -> (&'static str, Value) {
        session_needs_project()
    }
}

impl NextClaimBody {
    /// The claim part, as a [`ClaimBody`].
    pub fn claim(&self) -> ClaimBody {
        ClaimBody {
            holder: self.holder.clone(),
            ttl_ms: self.ttl_ms,
            max_attempts: self.max_attempts,
        }
    }

    /// The wire form of a core [`NextClaim`](runkeep::NextClaim) whose
    /// scope is in the step's tenant. Refuses
    /// [`ClaimOptions::now`](runkeep::ClaimOptions::now) like
    /// [`ClaimBody::of`].
    pub fn of(next: &runkeep::NextClaim) -> runkeep::Result<Self> {
        let claim = ClaimBody::of(&next.options)?;
        Ok(Self {
            project: next.scope.project_id().map(ToString::to_string),
            session: next.scope.session_id().map(ToString::to_string),
            park: next
                .filter
                .park
                .as_ref()
                .map(|v| v.iter().map(|p| (*p).into()).collect()),
            order: next.filter.order.into(),
            holder: claim.holder,
            ttl_ms: claim.ttl_ms,
            max_attempts: claim.max_attempts,
        })
    }
}

/// One run's step in a group commit.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepCommitBody {
    /// The run (in the path's tenant).
    pub run: RunAddress,
    /// The holding of that run; checked by the store with its step.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// The step.
    pub step: StepBody,
}

/// A group commit: many runs' steps, each judged under its own fence.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitStepsBody {
    /// 1 to 256 steps, at most one per run.
    #[schema(min_items = 1, max_items = 256)]
    pub steps: Vec<StepCommitBody>,
}

impl CommitStepsBody {
    /// The core's batch; every run must be in `tenant` (the path's): a run
    /// in another is answered as the route guard answers a tenant the
    /// token does not hold (404 `not-found`, the whole batch refused).
    pub fn into_commits(self, tenant: &TenantId) -> Result<Vec<runkeep::StepCommit>, Problem> {
        self.steps
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let field = format!("steps[{i}]");
                let scope = s.run.to_scope(&format!("{field}.run"))?;
                if &scope.tenant_id != tenant {
                    // What the route guard answers for a tenant the token
                    // does not hold: nothing there, for this token.
                    return Err(Problem::no_such_run().with_field(format!("{field}.run.tenantId")));
                }
                Ok(runkeep::StepCommit {
                    scope,
                    fence: fence(&format!("{field}.fence"), s.fence)?,
                    step: s.step.into_step().map_err(|p| match p.field.clone() {
                        Some(f) => p.with_field(format!("{field}.step.{f}")),
                        None => p,
                    })?,
                })
            })
            .collect()
    }
}

/// One step's outcome in a group commit: its receipt, or the problem it
/// was refused with (as `steps` would have answered it alone).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct StepOutcomeBody {
    /// The committed step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<StepReceiptBody>,
    /// Why the step was refused; nothing of it was written (with
    /// `outcomeUnknown`, read the run back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

/// The answer of a group commit: one outcome per step, in the order sent.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct CommitStepsAnswer {
    /// The outcomes.
    pub outcomes: Vec<StepOutcomeBody>,
}

/// A worker's hand-over: the step on this run under `fence`, then the next
/// run as `claim-next` would take it.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HandOverBody {
    /// The holding of this run; checked by the store with the whole step.
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: u64,
    /// The step.
    pub step: StepBody,
    /// What to claim after the step.
    pub next: NextClaimBody,
}

/// What a hand-over did. Answered 200 whenever the step committed; a
/// refused step is a problem answer and claimed nothing.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HandOverAnswer {
    /// The committed step.
    pub receipt: StepReceiptBody,
    /// The run taken next; `null` when none was claimable, or when the
    /// claim failed (`nextError`).
    pub next: Option<Claimed>,
    /// The claim's error, when the store claims after committing the step
    /// and that claim failed: the step stands, nothing was claimed, and
    /// `claim-next` may be retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_error: Option<Problem>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(tenant: &str) -> StepCommitBody {
        serde_json::from_value(serde_json::json!({
            "run": {"tenantId": tenant, "projectId": "p", "sessionId": "s", "runId": "r"},
            "fence": 1,
            "step": {"events": [{"type": "t", "payload": {}}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_group_commit_naming_another_tenant_is_no_such_run_for_the_whole_batch() {
        let path: TenantId = "acme".parse().unwrap();
        let body = CommitStepsBody {
            steps: vec![commit("acme"), commit("other")],
        };
        let p = body.into_commits(&path).unwrap_err();
        assert_eq!(p.kind(), Some(crate::problem::ProblemType::NotFound));
        assert_eq!(p.field.as_deref(), Some("steps[1].run.tenantId"));
        let ok = CommitStepsBody {
            steps: vec![commit("acme")],
        };
        assert_eq!(ok.into_commits(&path).unwrap().len(), 1);
    }
}
