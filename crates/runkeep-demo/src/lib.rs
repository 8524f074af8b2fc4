//! Demo data for `runkeep serve --demo`: a few dozen runs in every state an
//! operator meets in the console, in two projects.
//!
//! | kind | what the run is |
//! | --- | --- |
//! | parked | waiting on a person: an outstanding park with a readable request (a question, options, the command or plan at stake), due in hours |
//! | park-expired | its park's deadline passed unanswered |
//! | answered | its park was answered (approve) and it waits to be resumed |
//! | claimed | held live by a worker (a 1 h lease), transcript written under its fence |
//! | stuck | claimed by a worker whose lease lapsed 25 minutes ago: a stuck lease to release |
//! | queued | enqueued, never claimed (one of them not before an hour from now) |
//! | completed | finished by its holder, with a result and a report |
//! | failed | finished as failed by its holder |
//! | cancelled | called off by its holder |
//! | dead-lettered | three workers' steps failed in turn (a rate limit, a timeout, malformed JSON): the third failed attempt reached its limit of 3 and dead-lettered it (`attempts exhausted`), its errors kept |
//!
//! Every run has a transcript (events), a checkpoint or more, a run record
//! and an audit entry. Everything goes through the [`RunStore`] contract,
//! so it seeds any store; `runkeep serve --demo` seeds a fresh in-memory
//! one.

use runkeep::{
    AttemptError, Checkpoint, CheckpointId, ClaimOptions, EnqueueOptions, Fence, Holder,
    ListingScope, NewAuditEvent, NewEvent, Outcome, ParkResolution, PendingDecision, ProjectId,
    RetryPolicy, RunId, RunScope, RunStore, SessionId, TenantId, Timestamp, Ttl,
};
use serde_json::{json, Map, Value};

/// The kinds of demo run (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DemoKind {
    /// An outstanding park.
    Parked,
    /// A park past its deadline.
    ParkExpired,
    /// A park answered.
    Answered,
    /// Held live by a worker.
    Claimed,
    /// A lapsed lease nobody reclaimed.
    Stuck,
    /// Enqueued, never claimed.
    Queued,
    /// Finished: completed.
    Completed,
    /// Finished: failed.
    Failed,
    /// Finished: cancelled.
    Cancelled,
    /// Failed with `attempts exhausted`.
    DeadLettered,
}

impl DemoKind {
    /// Its name in the table above.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parked => "parked",
            Self::ParkExpired => "park-expired",
            Self::Answered => "answered",
            Self::Claimed => "claimed",
            Self::Stuck => "stuck",
            Self::Queued => "queued",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::DeadLettered => "dead-lettered",
        }
    }
}

/// One demo run: where it is and what kind it is.
#[derive(Clone, Debug)]
pub struct DemoRun {
    /// Its address.
    pub scope: RunScope,
    /// Its kind.
    pub kind: DemoKind,
}

/// The two projects (and their one session each) the demo writes into.
pub const PROJECTS: [(&str, &str); 2] = [("support-bot", "prod"), ("release-agent", "nightly")];

use DemoKind::*;

/// `(project index, run id, kind)` of every demo run.
const RUNS: &[(usize, &str, DemoKind)] = &[
    (0, "refund-4411", Parked),
    (0, "refund-4420", Parked),
    (0, "account-merge-17", Parked),
    (0, "escalate-9902", Parked),
    (1, "deploy-web-311", Parked),
    (1, "db-migrate-88", Parked),
    (1, "cleanup-build-5", Parked),
    (1, "rotate-keys-2", Parked),
    (0, "refund-4399", ParkExpired),
    (1, "deploy-api-309", ParkExpired),
    (0, "refund-4388", Answered),
    (1, "deploy-web-310", Answered),
    (0, "triage-7781", Claimed),
    (0, "triage-7782", Claimed),
    (0, "summarise-thread-55", Claimed),
    (1, "build-docs-41", Claimed),
    (1, "test-matrix-19", Claimed),
    (0, "triage-7760", Stuck),
    (1, "bench-nightly-7", Stuck),
    (0, "triage-7790", Queued),
    (0, "triage-7791", Queued),
    (1, "changelog-12", Queued),
    (0, "triage-7701", Completed),
    (0, "triage-7702", Completed),
    (0, "refund-4301", Completed),
    (1, "deploy-web-300", Completed),
    (1, "build-docs-40", Completed),
    (1, "test-matrix-18", Completed),
    (0, "triage-7710", Failed),
    (1, "deploy-api-305", Failed),
    (0, "triage-7720", Cancelled),
    (1, "db-migrate-87", Cancelled),
    (0, "enrich-crm-3", DeadLettered),
    (1, "flaky-e2e-6", DeadLettered),
    (1, "flaky-e2e-7", DeadLettered),
];

/// The park requests the parked runs carry, in turn: a request type and
/// the human-facing fields the console shows.
fn request(n: usize, run: &str) -> (&'static str, Value) {
    match n % 4 {
        0 => (
            "tool_review",
            json!({
                "question": format!("Run this command for {run}?"),
                "tool": "bash",
                "command": "rm -rf build/ && make release",
                "why": "the release build needs a clean tree",
                "options": ["approve", "reject"],
            }),
        ),
        1 => (
            "plan_approval",
            json!({
                "question": "Approve this plan?",
                "plan": [
                    "Refund the order ($120.00) to the original card",
                    "Email the customer the refund receipt",
                    "Close the ticket",
                ],
                "options": ["approve", "reject"],
            }),
        ),
        2 => (
            "user_question",
            json!({
                "question": "Which region should go first?",
                "options": ["eu-west-1", "us-east-1", "ap-south-1"],
                "context": "the migration takes each region offline for about 4 minutes",
            }),
        ),
        _ => (
            "iteration_checkpoint",
            json!({
                "question": "25 iterations done without finishing. Continue for 25 more?",
                "iterations": 25,
                "spentUsd": 1.84,
                "options": ["approve", "reject"],
            }),
        ),
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn cp(n: u32, at: Timestamp, started: Timestamp, state: Value) -> runkeep::Result<Checkpoint> {
    Ok(
        Checkpoint::new(CheckpointId::new(format!("cp_{n}"))?, at, obj(state))
            .with_run_created_at(started),
    )
}

const MIN: i64 = 60_000;

fn transcript(goal: &str, kind: DemoKind) -> Vec<NewEvent> {
    let mut v = vec![
        NewEvent::new("run_started", obj(json!({ "goal": goal }))),
        NewEvent::new(
            "assistant_message",
            obj(json!({ "text": "Looking at what is there first." })),
        ),
        NewEvent::new(
            "tool_started",
            obj(
                json!({ "toolUseId": "tu_1", "toolName": "read_file", "input": {"path": "README.md"} }),
            ),
        ),
        NewEvent::new(
            "tool_completed",
            obj(json!({ "toolUseId": "tu_1", "toolName": "read_file", "result": "412 lines" })),
        ),
    ];
    match kind {
        Parked | ParkExpired | Answered => v.push(NewEvent::new(
            "run_parked",
            obj(json!({ "reason": "needs a person's decision" })),
        )),
        Completed => v.push(NewEvent::new(
            "run_completed",
            obj(json!({ "stopReason": "end_turn" })),
        )),
        Failed => v.push(NewEvent::new(
            "run_failed",
            obj(json!({ "error": "the upstream API answered 403 three times" })),
        )),
        _ => {}
    }
    v
}

/// Seeds the demo runs into `tenant` of `store` (clock: the store's) and
/// returns them. Refused with `Conflict` when a demo run exists already.
pub async fn seed(store: &dyn RunStore, tenant: &TenantId) -> runkeep::Result<Vec<DemoRun>> {
    let now = store.now();
    let mut scopes = Vec::with_capacity(RUNS.len());
    for (project, run, _) in RUNS {
        let (p, s) = PROJECTS[*project];
        let scope = RunScope::new(
            tenant.clone(),
            ProjectId::new(p)?,
            SessionId::new(s)?,
            RunId::new(*run)?,
        );
        // Nothing is written when a demo run is there already.
        if !store.list_checkpoints(&scope).await?.is_empty()
            || store.lease(&scope, now).await?.is_some()
        {
            return Err(runkeep::Error::Conflict {
                message: format!(
                    "demo run {} exists already in tenant {tenant}; seed the demo into an empty tenant",
                    scope.run_id
                ),
            });
        }
        scopes.push(scope);
    }
    let mut out = Vec::with_capacity(RUNS.len());
    let mut parked = 0usize;
    for (i, ((_, _, kind), scope)) in RUNS.iter().zip(scopes).enumerate() {
        let started = now.offset(-(MIN * (15 + (i as i64 * 37) % 400)));
        seed_one(store, &scope, *kind, started, now, &mut parked).await?;
        out.push(DemoRun { scope, kind: *kind });
    }
    Ok(out)
}

/// Enqueues `n` plain runs (`bulk-000001`, … in project `bulk`, session
/// `load`), each with one checkpoint and one event: the demo at scale.
pub async fn seed_bulk(store: &dyn RunStore, tenant: &TenantId, n: usize) -> runkeep::Result<()> {
    let now = store.now();
    let project = ProjectId::new("bulk")?;
    let session = SessionId::new("load")?;
    for i in 1..=n {
        let scope = RunScope::new(
            tenant.clone(),
            project.clone(),
            session.clone(),
            RunId::new(format!("bulk-{i:06}"))?,
        );
        let at = now.offset(-((n - i) as i64) * 1000);
        store
            .enqueue(
                &scope,
                &cp(1, at, at, json!({ "input": { "n": i } }))?,
                &EnqueueOptions::default(),
            )
            .await?;
        store
            .append_events(
                &scope,
                &[NewEvent::new("run_enqueued", obj(json!({ "n": i })))],
                None,
            )
            .await?;
    }
    Ok(())
}

/// The listing scope of the whole demo (the tenant).
pub fn scope(tenant: &TenantId) -> ListingScope {
    ListingScope::tenant(tenant.clone())
}

async fn claim_at(
    store: &dyn RunStore,
    scope: &RunScope,
    holder: &str,
    ttl_ms: u64,
    at: Timestamp,
) -> runkeep::Result<runkeep::ClaimOutcome> {
    store
        .claim(
            scope,
            &ClaimOptions::new(Holder::new(holder)?, Ttl::from_millis(ttl_ms)?).at(at),
        )
        .await
}

async fn held(
    store: &dyn RunStore,
    scope: &RunScope,
    holder: &str,
    ttl_ms: u64,
    at: Timestamp,
) -> runkeep::Result<Fence> {
    claim_at(store, scope, holder, ttl_ms, at)
        .await?
        .lease()
        .map(|l| l.fence)
        .ok_or_else(|| runkeep::Error::Conflict {
            message: format!("demo run {} is held already", scope.run_id),
        })
}

async fn seed_one(
    store: &dyn RunStore,
    scope: &RunScope,
    kind: DemoKind,
    started: Timestamp,
    now: Timestamp,
    parked: &mut usize,
) -> runkeep::Result<()> {
    let goal = format!("{} ({})", scope.run_id, scope.project_id);
    let first = cp(
        1,
        started,
        started,
        json!({ "input": { "goal": goal }, "iteration": 0 }),
    )?;
    let mut fence: Option<Fence> = None;
    match kind {
        Queued => {
            let available_at =
                (scope.run_id.as_str() == "changelog-12").then(|| now.offset(60 * MIN));
            store
                .enqueue(
                    scope,
                    &first,
                    &EnqueueOptions {
                        available_at,
                        ..EnqueueOptions::default()
                    },
                )
                .await?;
            store
                .append_events(
                    scope,
                    &[NewEvent::new("run_enqueued", obj(json!({ "goal": goal })))],
                    None,
                )
                .await?;
        }
        DeadLettered => {
            store
                .enqueue(
                    scope,
                    &first,
                    &EnqueueOptions {
                        max_attempts: Some(3),
                        // Retried at once, so the demo needs no waiting.
                        retry: Some(RetryPolicy {
                            base_ms: 0,
                            factor: 1.0,
                            cap_ms: 0,
                        }),
                        ..EnqueueOptions::default()
                    },
                )
                .await?;
            store
                .append_events(scope, &transcript(&goal, kind), None)
                .await?;
            // Three workers' steps raise in turn; the third failed attempt
            // reaches the limit and dead-letters the run with its errors.
            for (who, error_kind, message) in [
                (
                    "worker-a",
                    "RateLimitError",
                    "429 Too Many Requests from api.example.com: retry after 20 s",
                ),
                (
                    "worker-b",
                    "TimeoutError",
                    "tool `fetch_invoice` did not answer within 30 s",
                ),
                (
                    "worker-c",
                    "ValueError",
                    "tool `fetch_invoice` returned malformed JSON at line 1 column 318",
                ),
            ] {
                // Claimed at the store's clock, not the seed's `now`: each
                // failure makes the run claimable again at the store's
                // current time (no backoff), which is past `now` by then.
                let fence = held(store, scope, who, 60 * MIN as u64, store.now()).await?;
                store
                    .fail_attempt(scope, fence, &AttemptError::new(error_kind, message), None)
                    .await?;
            }
        }
        _ => {
            if kind == Claimed {
                fence = Some(held(store, scope, "worker-a", 60 * MIN as u64, now).await?);
            }
            store.write_checkpoint(scope, &first, fence).await?;
            let mut second = cp(
                2,
                started.offset(3 * MIN),
                started,
                json!({ "iteration": 4, "messages": 12 }),
            )?;
            if matches!(kind, Parked | ParkExpired | Answered) {
                let (t, req) = request(*parked, scope.run_id.as_str());
                *parked += 1;
                let (at, deadline) = match kind {
                    ParkExpired => (now.offset(-180 * MIN), now.offset(-60 * MIN)),
                    _ => (started.offset(3 * MIN), now.offset(6 * 60 * MIN)),
                };
                second = second
                    .with_pending(PendingDecision::new(t, obj(req), at).with_deadline(deadline));
            }
            store.write_checkpoint(scope, &second, fence).await?;
            store
                .append_events(scope, &transcript(&goal, kind), fence)
                .await?;
            if kind == Answered {
                store
                    .resolve_park(
                        scope,
                        &second.id,
                        ParkResolution::Answer(json!({ "action": "approve", "by": "alice" })),
                        now.offset(-5 * MIN),
                        None,
                    )
                    .await?;
            }
        }
    }
    store
        .write_run_record(
            scope,
            &obj(json!({ "kind": kind.as_str(), "goal": goal })),
            fence,
        )
        .await?;
    store
        .append_audit(
            scope,
            &[NewAuditEvent::new(
                "runkeep serve --demo",
                "seeded demo run",
                "ok",
            )],
            fence,
        )
        .await?;
    let finish = |outcome: Outcome| async move {
        let f = held(store, scope, "worker-b", 10 * MIN as u64, now).await?;
        store.finish(scope, f, &outcome).await
    };
    match kind {
        Stuck => {
            claim_at(
                store,
                scope,
                "worker-b",
                5 * MIN as u64,
                now.offset(-30 * MIN),
            )
            .await?;
        }
        Completed => {
            store
                .write_report(
                    scope,
                    &format!(
                        "# {}\n\nDone in 4 iterations.\n\n- read the ticket\n- checked the account\n- answered the customer\n",
                        scope.run_id
                    ),
                    None,
                )
                .await?;
            finish(Outcome::completed(Some(json!({ "resolved": true })))).await?;
        }
        Failed => {
            finish(Outcome::failed("the upstream API answered 403 three times")).await?;
        }
        Cancelled => {
            finish(Outcome::cancelled("superseded by a newer run")).await?;
        }
        _ => {}
    }
    Ok(())
}
