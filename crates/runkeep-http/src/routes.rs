//! The route table: every route of the API, declared once with the role it
//! needs. The server's router, its auth matrix test and its OpenAPI document
//! are all built from [`routes`], so a route cannot be added without its
//! role check or its documentation.

use http::Method;

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

/// Declares [`Operation`]: one line per operation, in the order the server
/// registers them. Every `match` on the enum elsewhere (the server's
/// handlers, its admission kinds, its OpenAPI documentation, `HttpStore`)
/// is exhaustive, so a new line here is a compile error at each place that
/// must learn of it.
macro_rules! operations {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $name:literal, $method:ident $path:expr, $role:ident,
            unfenced: $unfenced:expr, $kind:ident;
    )*) => {
        /// One operation of the HTTP API: its method, path, role and kind
        /// are declared once, here ([`Operation::ALL`]).
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
        pub enum Operation {
            $( $(#[$doc])* $variant, )*
        }

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
                match self { $(Operation::$variant => $unfenced,)* }
            }

            /// How it holds its admission slot.
            pub const fn kind(self) -> OperationKind {
                match self { $(Operation::$variant => OperationKind::$kind,)* }
            }
        }
    };
}

operations! {
    /// `GET /v1/clock`.
    Clock = "clock", GET "/v1/clock", Reader, unfenced: None, Short;
    /// `GET /v1/whoami`.
    Whoami = "whoami", GET "/v1/whoami", Reader, unfenced: None, Short;
    /// A tenant's runs, a page at a time.
    ListRuns = "list_runs", GET tenant_path!("/runs"), Reader, unfenced: None, Short;
    /// Claims the next runnable run (waiting when asked).
    ClaimNext = "claim_next", POST tenant_path!("/claim-next"), Worker, unfenced: None, LongPollIfWaiting;
    /// Waits for a run to become runnable.
    WaitRunnable = "wait_runnable", GET tenant_path!("/runnable/wait"), Reader, unfenced: None, LongPoll;
    /// A run's summary.
    RunSummary = "run_summary", GET run_path!(""), Reader, unfenced: None, Short;
    /// Claims a run.
    Claim = "claim", POST run_path!("/claim"), Worker, unfenced: None, Short;
    /// Releases a lease (anyone's, for an operator without a fence).
    Release = "release", POST run_path!("/release"), Worker, unfenced: Some(Role::Operator), Short;
    /// Finishes a run.
    Finish = "finish", POST run_path!("/finish"), Worker, unfenced: None, Short;
    /// Snoozes a run.
    Snooze = "snooze", POST run_path!("/snooze"), Worker, unfenced: None, Short;
    /// Enqueues a run.
    Enqueue = "enqueue", POST run_path!("/enqueue"), Worker, unfenced: None, Short;
    /// Reports a failed attempt of the holding at `fence`.
    FailAttempt = "fail_attempt", POST run_path!("/attempts/failed"), Worker, unfenced: None, Short;
    /// Cancels a run (an operator's act).
    Cancel = "cancel", POST run_path!("/cancel"), Operator, unfenced: None, Short;
    /// Reopens a finished run.
    Reopen = "reopen", POST run_path!("/reopen"), Operator, unfenced: None, Short;
    /// A run's lease.
    Lease = "lease", GET run_path!("/lease"), Reader, unfenced: None, Short;
    /// A run's lifecycle.
    Lifecycle = "lifecycle", GET run_path!("/lifecycle"), Reader, unfenced: None, Short;
    /// Commits a step.
    CommitStep = "commit_step", POST run_path!("/steps"), Worker, unfenced: None, Short;
    /// Commits a step and claims the next run.
    CommitStepAndClaimNext = "commit_step_and_claim_next", POST run_path!("/steps/hand-over"), Worker, unfenced: None, Short;
    /// A run's checkpoints.
    ListCheckpoints = "list_checkpoints", GET run_path!("/checkpoints"), Reader, unfenced: None, Short;
    /// Writes a checkpoint.
    WriteCheckpoint = "write_checkpoint", POST run_path!("/checkpoints"), Worker, unfenced: None, Short;
    /// The latest checkpoint.
    LatestCheckpoint = "latest_checkpoint", GET run_path!("/checkpoints/latest"), Reader, unfenced: None, Short;
    /// The pending park.
    FindPending = "find_pending", GET run_path!("/checkpoints/pending"), Reader, unfenced: None, Short;
    /// The resume point.
    ResumePoint = "resume_point", GET run_path!("/checkpoints/resume-point"), Reader, unfenced: None, Short;
    /// One checkpoint.
    ReadCheckpoint = "read_checkpoint", GET run_path!("/checkpoints/by-id/{checkpoint}"), Reader, unfenced: None, Short;
    /// Deletes a checkpoint.
    DeleteCheckpoint = "delete_checkpoint", DELETE run_path!("/checkpoints/by-id/{checkpoint}"), Worker, unfenced: None, Short;
    /// Prunes checkpoints (an operator's override without a fence).
    PruneCheckpoints = "prune_checkpoints", POST run_path!("/prune"), Worker, unfenced: Some(Role::Operator), Short;
    /// A page of events.
    ReadEvents = "read_events", GET run_path!("/events"), Reader, unfenced: None, Short;
    /// Appends events.
    AppendEvents = "append_events", POST run_path!("/events"), Worker, unfenced: None, Short;
    /// The live tail of events (SSE).
    TailEvents = "tail_events", GET run_path!("/events/stream"), Reader, unfenced: None, Stream;
    /// Waits for events past a seq.
    WaitEvents = "wait_events", GET run_path!("/events/wait"), Reader, unfenced: None, LongPoll;
    /// The run record.
    ReadRunRecord = "read_run_record", GET run_path!("/record"), Reader, unfenced: None, Short;
    /// Writes the run record.
    WriteRunRecord = "write_run_record", PUT run_path!("/record"), Worker, unfenced: None, Short;
    /// The messages.
    ReadMessages = "read_messages", GET run_path!("/messages"), Reader, unfenced: None, Short;
    /// Writes the messages.
    WriteMessages = "write_messages", PUT run_path!("/messages"), Worker, unfenced: None, Short;
    /// The report.
    ReadReport = "read_report", GET run_path!("/report"), Reader, unfenced: None, Short;
    /// Writes the report.
    WriteReport = "write_report", PUT run_path!("/report"), Worker, unfenced: None, Short;
    /// The audit trail.
    ReadAudit = "read_audit", GET run_path!("/audit"), Reader, unfenced: None, Short;
    /// Appends to the audit trail.
    AppendAudit = "append_audit", POST run_path!("/audit"), Worker, unfenced: None, Short;
    /// Puts a thread checkpoint.
    PutThreadCheckpoint = "put_thread_checkpoint", PUT run_path!("/thread/checkpoints"), Worker, unfenced: None, Short;
    /// A thread's checkpoints.
    ListThreadCheckpoints = "list_thread_checkpoints", GET run_path!("/thread/checkpoints"), Reader, unfenced: None, Short;
    /// One thread checkpoint.
    GetThreadCheckpoint = "get_thread_checkpoint", GET run_path!("/thread/checkpoint"), Reader, unfenced: None, Short;
    /// Puts a thread's pending writes.
    PutThreadWrites = "put_thread_writes", POST run_path!("/thread/writes"), Worker, unfenced: None, Short;
    /// Deletes a thread.
    DeleteThread = "delete_thread", DELETE run_path!("/thread"), Worker, unfenced: None, Short;
    /// The threads' checkpoints of a tenant.
    ListThreadsCheckpoints = "list_threads_checkpoints", GET tenant_path!("/thread-checkpoints"), Reader, unfenced: None, Short;
    /// Answers a park (an operator's override without a fence).
    ResolvePark = "resolve_park", POST run_path!("/checkpoints/by-id/{checkpoint}/answer"), Worker, unfenced: Some(Role::Operator), Short;
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
