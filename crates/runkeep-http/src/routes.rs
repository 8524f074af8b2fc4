//! The operation table: every operation of the API, declared once
//! ([`Operation`], one entry each) with its method, path, role, kind,
//! parameters, request body and answer. The server's router, admission,
//! role checks and auth matrix test, the OpenAPI document
//! ([`crate::openapi`]), [`HttpStore`](crate::HttpStore)'s requests and
//! `operations.json` (what the other languages' clients are checked
//! against) are all derived from it.

use http::Method;
use utoipa::IntoParams;

use crate::openapi::Payload;
use crate::wire::threads::{
    DeleteThreadCheckpointsBody, MaybeThreadCheckpoint, PutThreadCheckpointBody,
    PutThreadWritesBody, ThreadCheckpointList, ThreadCheckpointsDeleted, ThreadDeleted,
};
use crate::wire::{self, *};

/// The response header carrying the store's clock (epoch ms).
pub const NOW_HEADER: &str = "runkeep-now";

/// The path prefix of every tenant route.
pub const TENANT: &str = "/v1/tenants/{tenant}";
/// The path prefix of every per-run route.
pub const RUN: &str = "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/runs/{run}";

/// What a token may do. Ordered: each role can do all the one before it can.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: listings, summaries, checkpoints, events, documents, audit.
    Reader,
    /// Also claims, renews, releases its own lease, writes with its fence.
    Worker,
    /// Also answers parks, releases any lease, reopens, prunes.
    Operator,
}

impl Role {
    /// The lowercase name (`reader`, `worker`, `operator`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Worker => "worker",
            Role::Operator => "operator",
        }
    }
}

/// A role name that is not `reader`, `worker` or `operator`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UnknownRole(pub String);

impl std::fmt::Display for UnknownRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "role {:?} is not one of reader, worker, operator",
            self.0
        )
    }
}

impl std::error::Error for UnknownRole {}

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, UnknownRole> {
        match s {
            "reader" => Ok(Role::Reader),
            "worker" => Ok(Role::Worker),
            "operator" => Ok(Role::Operator),
            other => Err(UnknownRole(other.to_string())),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `"/v1/tenants/{tenant}"` followed by a literal tail (a `&'static str`).
macro_rules! tenant_path {
    ($tail:literal) => {
        concat!("/v1/tenants/{tenant}", $tail)
    };
}

/// [`RUN`] followed by a literal tail (a `&'static str`).
macro_rules! run_path {
    ($tail:literal) => {
        concat!(
            "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/runs/{run}",
            $tail
        )
    };
}

/// How an operation holds the server's admission slot (`manners`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OperationKind {
    /// A short request: answered without waiting on the store.
    Short,
    /// A long-poll: waits on the server until something changes or its
    /// timeout, then answers.
    LongPoll,
    /// A stream: its body is sent for as long as the client reads it (SSE).
    Stream,
    /// Short, or a long-poll when its body asks to wait (`claim-next`'s
    /// `waitMs` above 0).
    LongPollIfWaiting,
}

/// What one operation takes and answers, as types: implemented by the
/// marker of each operation ([`op`]), all from the one table below.
///
/// [`HttpStore`](crate::HttpStore) sends `Body` and reads `Answer` through
/// it, and the OpenAPI document ([`crate::openapi`]) takes each
/// operation's parameters, request body and answer from it.
///
/// A request with another operation's body, or read as another answer,
/// does not compile. `HttpStore`'s request functions take `&S::Body` and
/// answer `S::Answer`, as `send` does here:
///
/// ```
/// use runkeep_http::{op, wire, OperationSpec};
/// fn send<S: OperationSpec>(_body: &S::Body) -> Option<S::Answer> {
///     None
/// }
/// let _: Option<wire::Done> = send::<op::Release>(&wire::ReleaseBody { fence: Some(1) });
/// ```
///
/// A claim sent with a release's body:
///
/// ```compile_fail,E0308
/// use runkeep_http::{op, wire, OperationSpec};
/// fn send<S: OperationSpec>(_body: &S::Body) -> Option<S::Answer> {
///     None
/// }
/// let _ = send::<op::Claim>(&wire::ReleaseBody { fence: Some(1) });
/// ```
///
/// A release read as a claim's answer:
///
/// ```compile_fail,E0308
/// use runkeep_http::{op, wire, OperationSpec};
/// fn send<S: OperationSpec>(_body: &S::Body) -> Option<S::Answer> {
///     None
/// }
/// let _: Option<wire::ClaimAnswer> = send::<op::Release>(&wire::ReleaseBody { fence: Some(1) });
/// ```
///
/// And a call of an operation the table lacks names a marker that does
/// not exist:
///
/// ```compile_fail,E0433
/// let _ = runkeep_http::op::ArchiveRun;
/// ```
pub trait OperationSpec {
    /// The operation.
    const OP: Operation;
    /// Its path parameters (the `{name}`s of [`Operation::path`]).
    type Path: IntoParams;
    /// Its query parameters.
    type Query: IntoParams;
    /// Its request body ([`NoBody`] when it takes none).
    type Body: Payload + serde::Serialize;
    /// Its answer.
    type Answer: Payload;
}

/// Declares [`Operation`], its markers ([`op`]) and their
/// [`OperationSpec`]s: one entry per operation, in the order the server
/// registers them. The entry's doc comment is the operation's summary (its
/// rustdoc and the OpenAPI `summary`). Every `match` on the enum elsewhere
/// (the server's handlers, its admission kinds, `HttpStore`'s requests go
/// through the markers) is exhaustive, so a new entry is a compile error at
/// each place that must learn of it.
macro_rules! operations {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $name:literal {
            $method:ident $path:expr, $role:ident $(or unfenced $unfenced:ident)?, $kind:ident,
            path: $params:ty, query: $query:ty, body: $body:ty, answer: $answer:ty,
        }
    )*) => {
        /// One operation of the HTTP API: its method, path, role, kind,
        /// parameters, body and answer are declared once, here
        /// ([`Operation::ALL`]).
        ///
        /// # An entry without its handler does not compile
        ///
        /// The server maps each operation to its handler with an
        /// exhaustive `match` (no catch-all arm). Written out for every
        /// operation of the table, such a match compiles:
        ///
        #[doc = operations!(@handler_match "rust" $($variant)*)]
        ///
        /// With one operation left out, as a new entry is before its
        /// handler is written, it does not (E0004, "non-exhaustive
        /// patterns"); nothing waits for start-up to find it. Both examples
        /// are generated from the table, so they stay true as it grows.
        ///
        #[doc = operations!(@handler_match_without_first $($variant)*)]
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
        pub enum Operation {
            $( $(#[doc = $doc])* $variant, )*
        }

        /// One marker type per [`Operation`], naming its types
        /// ([`OperationSpec`]): `op::Claim` is the claim.
        pub mod op {
            $(
                #[doc = concat!("The `", $name, "` operation ([`Operation::", stringify!($variant), "`](super::Operation::", stringify!($variant), ")).")]
                #[derive(Clone, Copy, Debug)]
                pub struct $variant;
            )*
        }

        $(
            impl OperationSpec for op::$variant {
                const OP: Operation = Operation::$variant;
                type Path = $params;
                type Query = $query;
                type Body = $body;
                type Answer = $answer;
            }
        )*

        impl Operation {
            /// Every operation, in the order the server registers them.
            pub const ALL: &'static [Operation] = &[$(Operation::$variant),*];

            /// The operation's name: its OpenAPI `operationId`, the
            /// contract operation it serves, what errors and metrics call
            /// it.
            pub const fn name(self) -> &'static str {
                match self { $(Operation::$variant => $name,)* }
            }

            /// The HTTP method.
            pub fn method(self) -> Method {
                match self { $(Operation::$variant => Method::$method,)* }
            }

            /// The path template (`{name}` parameters).
            pub const fn path(self) -> &'static str {
                match self { $(Operation::$variant => $path,)* }
            }

            /// The least role that may call it.
            pub const fn role(self) -> Role {
                match self { $(Operation::$variant => Role::$role,)* }
            }

            /// When set: the role needed when the body carries no `fence`
            /// (an operator's override).
            pub const fn unfenced_role(self) -> Option<Role> {
                match self { $(Operation::$variant => operations!(@unfenced $($unfenced)?),)* }
            }

            /// How it holds its admission slot.
            pub const fn kind(self) -> OperationKind {
                match self { $(Operation::$variant => OperationKind::$kind,)* }
            }

            /// What it does, in a sentence or three: its doc comment in
            /// the table, and its OpenAPI `summary`.
            pub fn summary(self) -> String {
                match self { $(Operation::$variant => [$($doc),*].map(str::trim).join(" "),)* }
            }

            /// Its parameters, body and answer as the OpenAPI document
            /// states them (from its [`OperationSpec`]).
            pub(crate) fn contract(self) -> crate::openapi::Contract {
                match self { $(Operation::$variant => crate::openapi::Contract::of::<op::$variant>(),)* }
            }
        }
    };
    (@handler_match $fence:literal $($variant:ident)*) => {
        concat!(
            "```", $fence, "\n",
            "use runkeep_http::Operation;\n",
            "fn handler(op: Operation) -> &'static str {\n",
            "    match op {\n",
            $("        Operation::", stringify!($variant), " => \"", stringify!($variant), "\",\n",)*
            "    }\n",
            "}\n",
            "```",
        )
    };
    (@handler_match_without_first $first:ident $($variant:ident)*) => {
        operations!(@handler_match "compile_fail,E0004" $($variant)*)
    };
    (@unfenced) => { None };
    (@unfenced $role:ident) => { Some(Role::$role) };
}

operations! {
    /// The store's clock.
    Clock = "clock" {
        GET "/v1/clock", Reader, Short,
        path: NoParams, query: NoParams, body: NoBody, answer: wire::Clock,
    }
    /// The tenant and role of the presented token.
    Whoami = "whoami" {
        GET "/v1/whoami", Reader, Short,
        path: NoParams, query: NoParams, body: NoBody, answer: WhoAmI,
    }
    /// One page of the tenant's runs (filters, order, cursor).
    ListRuns = "list_runs" {
        GET tenant_path!("/runs"), Reader, Short,
        path: TenantPath, query: ListQuery, body: NoBody, answer: RunPageBody,
    }
    /// Takes the next runnable run, optionally waiting up to 30 s for one.
    ClaimNext = "claim_next" {
        POST tenant_path!("/claim-next"), Worker, LongPollIfWaiting,
        path: TenantPath, query: NoParams, body: ClaimNextBody, answer: ClaimNextAnswer,
    }
    /// Takes up to `max` runs (1 to 256) as `claim-next` would, one after
    /// the other, each under its own lease and fence, for a worker's local
    /// queue; with `claim.waitMs`, waits until at least one is runnable.
    ClaimNextBatch = "claim_next_batch" {
        POST tenant_path!("/claim-next-batch"), Worker, LongPollIfWaiting,
        path: TenantPath, query: NoParams, body: ClaimNextBatchBody, answer: ClaimNextBatchAnswer,
    }
    /// Long-poll: answers when a run under the scope may have become
    /// runnable.
    WaitRunnable = "wait_runnable" {
        GET tenant_path!("/runnable/wait"), Reader, LongPoll,
        path: TenantPath, query: WaitRunnableQuery, body: NoBody, answer: Waited,
    }
    /// The run's lease, lifecycle, latest and pending checkpoint and last
    /// event seq; 404 when the run does not exist.
    RunSummary = "run_summary" {
        GET run_path!(""), Reader, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: wire::RunSummary,
    }
    /// Claims, renews (same holder) or reclaims the run.
    Claim = "claim" {
        POST run_path!("/claim"), Worker, Short,
        path: RunPath, query: ParentQuery, body: ClaimBody, answer: ClaimAnswer,
    }
    /// Releases the holding at `fence`; without a fence (operator) whoever
    /// holds it.
    Release = "release" {
        POST run_path!("/release"), Worker or unfenced Operator, Short,
        path: RunPath, query: ParentQuery, body: ReleaseBody, answer: Done,
    }
    /// Finishes the run held at `fence`, ending the lease.
    Finish = "finish" {
        POST run_path!("/finish"), Worker, Short,
        path: RunPath, query: ParentQuery, body: FinishBody, answer: LifecycleBody,
    }
    /// Releases the run held at `fence` and defers it until `until`.
    Snooze = "snooze" {
        POST run_path!("/snooze"), Worker, Short,
        path: RunPath, query: ParentQuery, body: SnoozeBody, answer: Done,
    }
    /// Creates a runnable run with its first checkpoint.
    Enqueue = "enqueue" {
        POST run_path!("/enqueue"), Worker, Short,
        path: EnqueuePath, query: EnqueueQuery, body: EnqueueBody, answer: EnqueueAnswer,
    }
    /// Reports a failed attempt of the holding at `fence` (the step raised,
    /// panicked or timed out): the error is kept in the run's failure
    /// history, the attempt counts toward the limit like a takeover, the
    /// holding ends, and the run is deferred by its retry backoff, or
    /// dead-lettered when this attempt reaches the limit. A cancelled run
    /// answers `cancelled`.
    FailAttempt = "fail_attempt" {
        POST run_path!("/attempts/failed"), Worker, Short,
        path: RunPath, query: ParentQuery, body: FailAttemptBody, answer: LifecycleBody,
    }
    /// Cancels an active run, claimed or not (operator): it is finished as
    /// cancelled with the reason, its holding ends, and the holder's next
    /// write is refused as `cancelled` (its renewal answers finished). No
    /// claim takes it until it is reopened.
    Cancel = "cancel" {
        POST run_path!("/cancel"), Operator, Short,
        path: RunPath, query: ParentQuery, body: CancelBody, answer: LifecycleBody,
    }
    /// Makes a finished run active again.
    Reopen = "reopen" {
        POST run_path!("/reopen"), Operator, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: LifecycleBody,
    }
    /// Sets an active run's priority (operator): later claims of the next
    /// runnable run see it; a holding is not touched. 409 `conflict` on a
    /// finished run; nothing changes on a refusal.
    SetPriority = "set_priority" {
        POST run_path!("/priority"), Operator, Short,
        path: RunPath, query: ParentQuery, body: SetPriorityBody, answer: LifecycleBody,
    }
    /// Every holding of a run carrying the concurrency key `key` in the
    /// session, oldest first: the evidence that the key's limit held.
    KeyHoldings = "key_holdings" {
        GET "/v1/tenants/{tenant}/projects/{project}/sessions/{session}/key-holdings", Reader, Short,
        path: SessionPath, query: KeyHoldingsQuery, body: NoBody, answer: KeyHoldingsBody,
    }

    /// Deletes up to `limit` finished runs of the tenant (or one project or
    /// session) past their retention, each with all its evidence and its
    /// sub-runs (operator); `more` says another batch may find more.
    PruneFinished = "prune_finished" {
        POST tenant_path!("/prune-finished"), Operator, Short,
        path: TenantPath, query: NoParams, body: PruneFinishedBody, answer: PruneReportBody,
    }
    /// The run's top holding.
    Lease = "lease" {
        GET run_path!("/lease"), Reader, Short,
        path: RunPath, query: NowQuery, body: NoBody, answer: MaybeLease,
    }
    /// The run's lifecycle.
    Lifecycle = "lifecycle" {
        GET run_path!("/lifecycle"), Reader, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: LifecycleBody,
    }
    /// Writes one step (events, checkpoint, messages, record, finish) under
    /// one fence check, all or nothing.
    CommitStep = "commit_step" {
        POST run_path!("/steps"), Worker, Short,
        path: RunPath, query: ParentQuery, body: CommitStepBody, answer: StepReceiptBody,
    }
    /// A worker's hand-over: commits one step under `fence` (as
    /// `commit_step`), then takes the next runnable run in the tenant (as
    /// `claim-next`, without waiting; never this run). A refused step is a
    /// problem answer and claims nothing; a claim that failed after the step
    /// committed is answered 200 with the receipt and the claim's problem in
    /// `nextError`.
    CommitStepAndClaimNext = "commit_step_and_claim_next" {
        POST run_path!("/steps/hand-over"), Worker, Short,
        path: RunPath, query: ParentQuery, body: HandOverBody, answer: HandOverAnswer,
    }
    /// A group commit: up to 256 runs' steps (one per run, every run in
    /// the path's tenant), each judged as `steps` judges it under its own
    /// fence. One outcome per step, in the order sent: a refused step (a
    /// stale fence, another token's holding) is refused alone and the
    /// others commit. A batch that is bad as a whole (empty, a run twice,
    /// an invalid step) is a problem answer and writes nothing.
    CommitSteps = "commit_steps" {
        POST tenant_path!("/steps"), Worker, Short,
        path: TenantPath, query: NoParams, body: CommitStepsBody, answer: CommitStepsAnswer,
    }
    /// One page of the run's checkpoints in the total order: at most
    /// `limit` (default 100, at most 1000; 400 above it), after the
    /// checkpoint `after`; a page shorter than `limit` is the last.
    /// `fields=summary` (the default) leaves out each `state` (read it with
    /// `GET …/checkpoints/by-id/{checkpoint}`); `fields=full` carries them.
    /// Charged to the server's answer budget: 503 `overloaded` when it has
    /// no room.
    ListCheckpoints = "list_checkpoints" {
        GET run_path!("/checkpoints"), Reader, Short,
        path: RunPath, query: ListCheckpointsQuery, body: NoBody, answer: Array<CheckpointBody>,
    }
    /// Writes a checkpoint (fenced when `fence` is given).
    WriteCheckpoint = "write_checkpoint" {
        POST run_path!("/checkpoints"), Worker, Short,
        path: RunPath, query: ParentQuery, body: WriteCheckpointBody, answer: CheckpointBody,
    }
    /// The latest checkpoint (total order).
    LatestCheckpoint = "latest_checkpoint" {
        GET run_path!("/checkpoints/latest"), Reader, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: MaybeCheckpoint,
    }
    /// The checkpoint whose park is outstanding.
    FindPending = "find_pending" {
        GET run_path!("/checkpoints/pending"), Reader, Short,
        path: RunPath, query: NowQuery, body: NoBody, answer: MaybeCheckpoint,
    }
    /// The pending checkpoint, else the latest.
    ResumePoint = "resume_point" {
        GET run_path!("/checkpoints/resume-point"), Reader, Short,
        path: RunPath, query: NowQuery, body: NoBody, answer: MaybeCheckpoint,
    }
    /// One checkpoint (`null` when absent). Charged to the server's answer
    /// budget: 503 `overloaded` when it has no room.
    ReadCheckpoint = "read_checkpoint" {
        GET run_path!("/checkpoints/by-id/{checkpoint}"), Reader, Short,
        path: CheckpointPath, query: ParentQuery, body: NoBody, answer: MaybeCheckpoint,
    }
    /// Deletes a checkpoint (`done: false` when absent).
    DeleteCheckpoint = "delete_checkpoint" {
        DELETE run_path!("/checkpoints/by-id/{checkpoint}"), Worker, Short,
        path: CheckpointPath, query: FenceQuery, body: NoBody, answer: Done,
    }
    /// Deletes all but the newest `keepLast` checkpoints (never an
    /// unanswered park).
    PruneCheckpoints = "prune_checkpoints" {
        POST run_path!("/prune"), Worker or unfenced Operator, Short,
        path: RunPath, query: ParentQuery, body: PruneBody, answer: Pruned,
    }
    /// One page of the transcript after `sinceSeq`: at most `limit` events
    /// (default 1000, at most 10 000; 400 above it). `more: true` says
    /// events follow the page; the next page starts at `nextSinceSeq`.
    /// Streamed; charged to the server's answer budget while in flight (503
    /// `overloaded` when it has no room).
    ReadEvents = "read_events" {
        GET run_path!("/events"), Reader, Short,
        path: RunPath, query: ReadQuery, body: NoBody, answer: EventBatchBody,
    }
    /// Appends events; the store numbers them.
    AppendEvents = "append_events" {
        POST run_path!("/events"), Worker, Short,
        path: RunPath, query: ParentQuery, body: AppendEventsBody, answer: Appended,
    }
    /// The live tail as Server-Sent Events: `event: event`, `id:` the seq,
    /// `data:` an EventBody; resumes after `Last-Event-ID`.
    TailEvents = "tail_events" {
        GET run_path!("/events/stream"), Reader, Stream,
        path: RunPath, query: StreamQuery, body: NoBody, answer: EventStream,
    }
    /// Long-poll: answers when the log's last seq is above `sinceSeq`.
    WaitEvents = "wait_events" {
        GET run_path!("/events/wait"), Reader, LongPoll,
        path: RunPath, query: WaitEventsQuery, body: NoBody, answer: Waited,
    }
    /// The run record.
    ReadRunRecord = "read_run_record" {
        GET run_path!("/record"), Reader, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: MaybeRecord,
    }
    /// Replaces the run record.
    WriteRunRecord = "write_run_record" {
        PUT run_path!("/record"), Worker, Short,
        path: RunPath, query: ParentQuery, body: RecordBody, answer: Done,
    }
    /// The message snapshot.
    ReadMessages = "read_messages" {
        GET run_path!("/messages"), Reader, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: MessagesBody,
    }
    /// Publishes the message history with the event head it follows.
    WriteMessages = "write_messages" {
        PUT run_path!("/messages"), Worker, Short,
        path: RunPath, query: ParentQuery, body: WriteMessagesBody, answer: Done,
    }
    /// The final report.
    ReadReport = "read_report" {
        GET run_path!("/report"), Reader, Short,
        path: RunPath, query: ParentQuery, body: NoBody, answer: MaybeReport,
    }
    /// Stores the final report.
    WriteReport = "write_report" {
        PUT run_path!("/report"), Worker, Short,
        path: RunPath, query: ParentQuery, body: ReportBody, answer: Done,
    }
    /// The audit trail after `sinceSeq`.
    ReadAudit = "read_audit" {
        GET run_path!("/audit"), Reader, Short,
        path: RunPath, query: AuditQuery, body: NoBody, answer: AuditList,
    }
    /// Appends to the audit trail.
    AppendAudit = "append_audit" {
        POST run_path!("/audit"), Worker, Short,
        path: RunPath, query: ParentQuery, body: AppendAuditBody, answer: AuditList,
    }
    /// Writes a thread checkpoint (`ns`, `checkpointId`) with its parent,
    /// metadata and the channel values it changed (fenced when `fence` is
    /// given).
    PutThreadCheckpoint = "put_thread_checkpoint" {
        PUT run_path!("/thread/checkpoints"), Worker, Short,
        path: RunPath, query: ParentQuery, body: PutThreadCheckpointBody, answer: Done,
    }
    /// The thread's checkpoints, greatest checkpoint id first, with their
    /// channel values and pending writes; filtered by namespace, id,
    /// `before`, metadata `filter`, `limit`.
    ListThreadCheckpoints = "list_thread_checkpoints" {
        GET run_path!("/thread/checkpoints"), Reader, Short,
        path: RunPath, query: ListThreadQuery, body: NoBody, answer: ThreadCheckpointList,
    }
    /// One thread checkpoint of a namespace (by id, or the greatest id)
    /// with its channel values and pending writes.
    GetThreadCheckpoint = "get_thread_checkpoint" {
        GET run_path!("/thread/checkpoint"), Reader, Short,
        path: RunPath, query: GetThreadQuery, body: NoBody, answer: MaybeThreadCheckpoint,
    }
    /// Stores a task's pending writes on a thread checkpoint: a repeated
    /// ordinary write (`idx >= 0`) is ignored, a special one (`idx < 0`)
    /// replaces; `park` parks the run there.
    PutThreadWrites = "put_thread_writes" {
        POST run_path!("/thread/writes"), Worker, Short,
        path: RunPath, query: ParentQuery, body: PutThreadWritesBody, answer: Done,
    }
    /// Deletes every thread checkpoint and pending write of the run (fenced
    /// when `fence` is given).
    DeleteThread = "delete_thread" {
        DELETE run_path!("/thread"), Worker, Short,
        path: RunPath, query: DeleteThreadQuery, body: NoBody, answer: ThreadDeleted,
    }
    /// Deletes the named thread checkpoints and their pending writes
    /// (LangGraph's `prune` and `delete_for_runs`; fenced when `fence` is
    /// given: a refused delete deletes nothing).
    DeleteThreadCheckpoints = "delete_thread_checkpoints" {
        POST run_path!("/thread/checkpoints/delete"), Worker, Short,
        path: RunPath, query: ParentQuery, body: DeleteThreadCheckpointsBody, answer: ThreadCheckpointsDeleted,
    }
    /// Thread checkpoints across every thread under the scope, greatest
    /// checkpoint id first.
    ListThreadsCheckpoints = "list_threads_checkpoints" {
        GET tenant_path!("/thread-checkpoints"), Reader, Short,
        path: TenantPath, query: ListThreadsQuery, body: NoBody, answer: ThreadCheckpointList,
    }
    /// Answers the park on a checkpoint, exactly once: a second answer is
    /// 409 `conflict` carrying the first (`firstAnswer`, `resolvedAt`).
    ResolvePark = "resolve_park" {
        POST run_path!("/checkpoints/by-id/{checkpoint}/answer"), Worker or unfenced Operator, Short,
        path: CheckpointPath, query: ParentQuery, body: ResolveBody, answer: CheckpointBody,
    }
    /// The tenant's recurring schedules (narrowed by `project` and
    /// `session`), by session then name, each with its next tick and the
    /// run of its last tick.
    ListSchedules = "list_schedules" {
        GET tenant_path!("/schedules"), Reader, Short,
        path: TenantPath, query: ListSchedulesQuery, body: NoBody, answer: ScheduleList,
    }
    /// Creates or replaces a schedule (operator); a replacement keeps the
    /// stored creation time and cursor.
    PutSchedule = "put_schedule" {
        PUT tenant_path!("/projects/{project}/sessions/{session}/schedules/{schedule}"), Operator, Short,
        path: SchedulePath, query: NoParams, body: ScheduleBody, answer: ScheduleBody,
    }
    /// One schedule (`null` when there is none).
    GetSchedule = "get_schedule" {
        GET tenant_path!("/projects/{project}/sessions/{session}/schedules/{schedule}"), Reader, Short,
        path: SchedulePath, query: NoParams, body: NoBody, answer: MaybeSchedule,
    }
    /// Deletes a schedule (`done: false` when absent); its runs stay.
    DeleteSchedule = "delete_schedule" {
        DELETE tenant_path!("/projects/{project}/sessions/{session}/schedules/{schedule}"), Operator, Short,
        path: SchedulePath, query: NoParams, body: NoBody, answer: Done,
    }
    /// Moves a schedule's cursor from `from` to `to`, compare-and-set
    /// (`done: false` when the cursor is no longer `from`): what a
    /// scheduler does after enqueueing a tick's run.
    AdvanceSchedule = "advance_schedule" {
        POST tenant_path!("/projects/{project}/sessions/{session}/schedules/{schedule}/advance"), Worker, Short,
        path: SchedulePath, query: NoParams, body: AdvanceScheduleBody, answer: Done,
    }
}

impl Operation {
    /// The operation named `name` ([`Operation::name`]).
    pub fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL.iter().copied().find(|op| op.name() == name)
    }

    /// The path with each `{name}` parameter replaced by its value in
    /// `params` (ids: no escaping needed, the id rule allows none of what
    /// a path would escape). A parameter missing from `params` is left as
    /// it is, and the server refuses the path.
    pub fn fill(self, params: &[(&str, &str)]) -> String {
        let mut out = String::with_capacity(self.path().len() + 64);
        let mut rest = self.path();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open..];
            let close = after.find('}').unwrap_or(after.len() - 1);
            let name = &after[1..close];
            match params.iter().find(|(k, _)| *k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&after[..=close]),
            }
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The route of this operation.
    pub fn spec(self) -> RouteSpec {
        RouteSpec {
            op: self,
            method: self.method(),
            path: self.path().to_string(),
            role: self.role(),
            unfenced_role: self.unfenced_role(),
            operation: self.name(),
        }
    }
}

/// The table as JSON (`crates/runkeep-http/operations.json`, checked by
/// this crate's tests): one object per operation, in [`Operation::ALL`]'s
/// order, with its `name`, `method`, `path`, `role`, `unfencedRole` and
/// `kind`. What the other languages' clients are checked against.
pub fn operations_json() -> String {
    let ops: Vec<serde_json::Value> = Operation::ALL
        .iter()
        .map(|op| {
            serde_json::json!({
                "name": op.name(),
                "method": op.method().as_str(),
                "path": op.path(),
                "role": op.role(),
                "unfencedRole": op.unfenced_role(),
                "kind": op.kind(),
            })
        })
        .collect();
    let mut out = serde_json::to_string_pretty(&ops).unwrap_or_default();
    out.push('\n');
    out
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One route of the API: an [`Operation`] spelled out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// The operation.
    pub op: Operation,
    /// Method.
    pub method: Method,
    /// Path template (`{name}` parameters).
    pub path: String,
    /// The least role that may call it.
    pub role: Role,
    /// When set: the role needed when the body carries no `fence`.
    pub unfenced_role: Option<Role>,
    /// The OpenAPI operation id and the contract operation it serves
    /// ([`Operation::name`]).
    pub operation: &'static str,
}

impl RouteSpec {
    /// True when the path names a tenant (so a foreign tenant answers 404).
    pub fn is_tenant_scoped(&self) -> bool {
        self.path.starts_with("/v1/tenants/")
    }
}

/// Every route of the API with the role it needs, in the order the server
/// registers them: [`Operation::ALL`] spelled out.
pub fn routes() -> Vec<RouteSpec> {
    Operation::ALL.iter().map(|op| op.spec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_declared_once() {
        let mut ops: Vec<_> = routes().iter().map(|s| s.operation).collect();
        let n = ops.len();
        ops.sort_unstable();
        ops.dedup();
        assert_eq!(ops.len(), n, "an operation id is declared twice");
        let mut routes: Vec<_> = routes()
            .iter()
            .map(|s| format!("{} {}", s.method, s.path))
            .collect();
        routes.sort_unstable();
        routes.dedup();
        assert_eq!(routes.len(), n, "a method and path are declared twice");
    }

    #[test]
    fn the_committed_operations_json_is_the_generated_one() {
        let regenerate = "RUNKEEP_WRITE_OPERATIONS=1 cargo test -p runkeep-http";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("operations.json");
        let generated = operations_json();
        if std::env::var_os("RUNKEEP_WRITE_OPERATIONS").is_some() {
            std::fs::write(&path, &generated).expect("write operations.json");
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e}; regenerate it with: {regenerate}",
                path.display()
            )
        });
        assert!(
            committed == generated,
            "crates/runkeep-http/operations.json is not what Operation::ALL generates; regenerate it with: {regenerate}"
        );
    }

    #[test]
    fn paths_agree_with_the_prefixes_and_fill() {
        for op in Operation::ALL {
            assert!(op.path().starts_with("/v1/"), "{op}");
            assert_eq!(Operation::from_name(op.name()), Some(*op));
        }
        assert!(Operation::RunSummary.path() == RUN);
        assert!(Operation::ListRuns.path().starts_with(TENANT));
        assert_eq!(
            Operation::ReadCheckpoint.fill(&[
                ("tenant", "t"),
                ("project", "p"),
                ("session", "s"),
                ("run", "r"),
                ("checkpoint", "c")
            ]),
            "/v1/tenants/t/projects/p/sessions/s/runs/r/checkpoints/by-id/c"
        );
        assert_eq!(Operation::Clock.fill(&[]), "/v1/clock");
        assert_eq!(
            Operation::ListRuns.fill(&[]),
            "/v1/tenants/{tenant}/runs",
            "a missing parameter is left as it is"
        );
    }

    #[test]
    fn a_fenceless_override_needs_an_operator() {
        let overrides: Vec<_> = Operation::ALL
            .iter()
            .filter(|op| op.unfenced_role().is_some())
            .collect();
        assert_eq!(
            overrides,
            [
                &Operation::Release,
                &Operation::PruneCheckpoints,
                &Operation::ResolvePark
            ]
        );
        for op in overrides {
            assert_eq!(op.unfenced_role(), Some(Role::Operator), "{op}");
        }
    }
}
