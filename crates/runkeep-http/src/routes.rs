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

/// One route of the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Method.
    pub method: Method,
    /// Path template (`{name}` parameters).
    pub path: String,
    /// The least role that may call it.
    pub role: Role,
    /// When set: the role needed when the body carries no `fence`.
    pub unfenced_role: Option<Role>,
    /// The OpenAPI operation id and the contract operation it serves.
    pub operation: &'static str,
}

impl RouteSpec {
    fn new(method: Method, path: String, role: Role, operation: &'static str) -> Self {
        Self {
            method,
            path,
            role,
            unfenced_role: None,
            operation,
        }
    }

    /// True when the path names a tenant (so a foreign tenant answers 404).
    pub fn is_tenant_scoped(&self) -> bool {
        self.path.starts_with("/v1/tenants/")
    }
}

/// Every route of the API with the role it needs, in the order the server
/// registers them. The single list the router, the auth matrix and the
/// OpenAPI document are built from.
pub fn routes() -> Vec<RouteSpec> {
    use Role::*;
    let t = |p: &str| format!("{TENANT}{p}");
    let r = |p: &str| format!("{RUN}{p}");
    let (g, p, put, d) = (Method::GET, Method::POST, Method::PUT, Method::DELETE);
    let route = RouteSpec::new;
    let mut v = vec![
        route(g.clone(), "/v1/clock".into(), Reader, "clock"),
        route(g.clone(), "/v1/whoami".into(), Reader, "whoami"),
        route(g.clone(), t("/runs"), Reader, "list_runs"),
        route(p.clone(), t("/claim-next"), Worker, "claim_next"),
        route(g.clone(), t("/runnable/wait"), Reader, "wait_runnable"),
        route(g.clone(), r(""), Reader, "run_summary"),
        route(p.clone(), r("/claim"), Worker, "claim"),
        route(p.clone(), r("/release"), Worker, "release"),
        route(p.clone(), r("/finish"), Worker, "finish"),
        route(p.clone(), r("/snooze"), Worker, "snooze"),
        route(p.clone(), r("/enqueue"), Worker, "enqueue"),
        route(p.clone(), r("/reopen"), Operator, "reopen"),
        route(g.clone(), r("/lease"), Reader, "lease"),
        route(g.clone(), r("/lifecycle"), Reader, "lifecycle"),
        route(p.clone(), r("/steps"), Worker, "commit_step"),
        route(
            p.clone(),
            r("/steps/hand-over"),
            Worker,
            "commit_step_and_claim_next",
        ),
        route(g.clone(), r("/checkpoints"), Reader, "list_checkpoints"),
        route(p.clone(), r("/checkpoints"), Worker, "write_checkpoint"),
        route(
            g.clone(),
            r("/checkpoints/latest"),
            Reader,
            "latest_checkpoint",
        ),
        route(g.clone(), r("/checkpoints/pending"), Reader, "find_pending"),
        route(
            g.clone(),
            r("/checkpoints/resume-point"),
            Reader,
            "resume_point",
        ),
        route(
            g.clone(),
            r("/checkpoints/by-id/{checkpoint}"),
            Reader,
            "read_checkpoint",
        ),
        route(
            d.clone(),
            r("/checkpoints/by-id/{checkpoint}"),
            Worker,
            "delete_checkpoint",
        ),
        route(p.clone(), r("/prune"), Worker, "prune_checkpoints"),
        route(g.clone(), r("/events"), Reader, "read_events"),
        route(p.clone(), r("/events"), Worker, "append_events"),
        route(g.clone(), r("/events/stream"), Reader, "tail_events"),
        route(g.clone(), r("/events/wait"), Reader, "wait_events"),
        route(g.clone(), r("/record"), Reader, "read_run_record"),
        route(put.clone(), r("/record"), Worker, "write_run_record"),
        route(g.clone(), r("/messages"), Reader, "read_messages"),
        route(put.clone(), r("/messages"), Worker, "write_messages"),
        route(g.clone(), r("/report"), Reader, "read_report"),
        route(put.clone(), r("/report"), Worker, "write_report"),
        route(g.clone(), r("/audit"), Reader, "read_audit"),
        route(p.clone(), r("/audit"), Worker, "append_audit"),
        route(
            put.clone(),
            r("/thread/checkpoints"),
            Worker,
            "put_thread_checkpoint",
        ),
        route(
            g.clone(),
            r("/thread/checkpoints"),
            Reader,
            "list_thread_checkpoints",
        ),
        route(
            g.clone(),
            r("/thread/checkpoint"),
            Reader,
            "get_thread_checkpoint",
        ),
        route(p.clone(), r("/thread/writes"), Worker, "put_thread_writes"),
        route(d.clone(), r("/thread"), Worker, "delete_thread"),
        route(
            g.clone(),
            t("/thread-checkpoints"),
            Reader,
            "list_threads_checkpoints",
        ),
    ];
    // The park answer: worker with its fence, operator without.
    let mut answer = route(
        p,
        r("/checkpoints/by-id/{checkpoint}/answer"),
        Worker,
        "resolve_park",
    );
    answer.unfenced_role = Some(Operator);
    v.push(answer);
    // Releasing another's lease and pruning without a fence are an
    // operator's override.
    for spec in v.iter_mut() {
        if matches!(spec.operation, "release" | "prune_checkpoints") {
            spec.unfenced_role = Some(Operator);
        }
    }
    v
}

/// The unfenced role of `operation` (what its handler enforces when the
/// body carries no fence).
pub fn unfenced_role(operation: &str) -> Role {
    routes()
        .into_iter()
        .find(|s| s.operation == operation)
        .and_then(|s| s.unfenced_role)
        .unwrap_or(Role::Operator)
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
    }

    #[test]
    fn a_fenceless_override_needs_an_operator() {
        for op in ["release", "prune_checkpoints", "resolve_park"] {
            assert_eq!(unfenced_role(op), Role::Operator, "{op}");
        }
    }
}
