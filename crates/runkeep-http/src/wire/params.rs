//! The path and query parameters of every operation: what the server's
//! extractors parse (each query with `deny_unknown_fields`: an unknown
//! parameter is a 400 naming it) and what the OpenAPI document lists for
//! each operation ([`crate::routes::OperationSpec::Path`] and
//! [`crate::routes::OperationSpec::Query`]).
//!
//! A run's `parent` (a sub-run's address) is part of the run address; the
//! server reads it from the query string of every per-run route, so every
//! per-run query here takes it.

use serde::Deserialize;
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::IntoParams;

/// No parameters (an operation whose path names nothing, or whose query
/// takes nothing).
#[derive(Debug, Default)]
pub struct NoParams;

impl IntoParams for NoParams {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        Vec::new()
    }
}

/// The path of a tenant route.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TenantPath {
    /// The tenant id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub tenant: String,
}

/// The path of a per-run route.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunPath {
    /// The tenant id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub tenant: String,
    /// The project id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub project: String,
    /// The session id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub session: String,
    /// The run id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub run: String,
}

/// The path of a route on one checkpoint of a run.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CheckpointPath {
    /// The tenant id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub tenant: String,
    /// The project id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub project: String,
    /// The session id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub session: String,
    /// The run id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub run: String,
    /// The checkpoint id id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub checkpoint: String,
}

/// The path of an enqueue: a per-run path whose run starts with `run_`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EnqueuePath {
    /// The tenant id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub tenant: String,
    /// The project id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub project: String,
    /// The session id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub session: String,
    /// The run id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub run: String,
}

/// The query of a per-run route that takes nothing else: the run's parent.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ParentQuery {
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// The query of an enqueue: the run's parent.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EnqueueQuery {
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// An optional instant.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NowQuery {
    /// Judge at this instant (epoch ms); the store's clock when absent.
    pub now: Option<i64>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// A fence in the query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FenceQuery {
    /// The holding the delete is made under (absent: unfenced).
    pub fence: Option<u64>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// A checkpoint listing's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListCheckpointsQuery {
    /// `summary` (default: each checkpoint without its `state`; read one's
    /// state with `GET …/checkpoints/by-id/{id}`) or `full` (with states).
    pub fields: Option<String>,
    /// At most this many checkpoints (default 100, at most 1000: 400 above
    /// it). A page shorter than `limit` is the last.
    pub limit: Option<usize>,
    /// Start after the checkpoint with this id (the last id of the previous
    /// page); 400 when the run has no such checkpoint.
    pub after: Option<String>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// The audit read's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only records with `seq` above this (default 0).
    pub since_seq: Option<u64>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// An event read's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadQuery {
    /// Only events with `seq` above this (exclusive; default 0).
    pub since_seq: Option<u64>,
    /// `tolerant` (default: skip damaged records and list them) or `strict`.
    pub integrity: Option<String>,
    /// At most this many events (default 1000, at most 10 000: 400 above
    /// it). A page that stopped at its limit with events after it says
    /// `more: true`; the next page starts at its `nextSinceSeq`.
    pub limit: Option<usize>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// The tail's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Start after this `seq` (the `Last-Event-ID` header wins over it).
    pub since_seq: Option<u64>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// The events wait's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitEventsQuery {
    /// Answer as soon as the log's last `seq` is above this.
    pub since_seq: Option<u64>,
    /// Wait at most this long, ms (at most 30 000; default 25 000).
    pub timeout_ms: Option<u64>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// The listing's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this project.
    pub project: Option<String>,
    /// Only this session (needs `project`).
    pub session: Option<String>,
    /// `runId` (default) or `createdAt`.
    pub order: Option<String>,
    /// Park states, comma-separated (`outstanding,expired`).
    pub park: Option<String>,
    /// `true`: only runs held live; `false`: only runs nobody holds.
    pub claimed: Option<bool>,
    /// Statuses, comma-separated (`active,failed`).
    pub status: Option<String>,
    /// Page size (default 100, at most 1000).
    pub limit: Option<usize>,
    /// The cursor of the previous page.
    pub cursor: Option<String>,
    /// Judge expiry at this instant (epoch ms) instead of the store's clock.
    pub now: Option<i64>,
}

/// The runnable wait's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitRunnableQuery {
    /// Only this project.
    pub project: Option<String>,
    /// Only this session (needs `project`).
    pub session: Option<String>,
    /// Wait at most this long, ms (at most 30 000; default 25 000).
    pub timeout_ms: Option<u64>,
}

/// A thread checkpoint to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetThreadQuery {
    /// The namespace (default `""`, the root graph).
    pub ns: Option<String>,
    /// The checkpoint id; absent: the namespace's latest (greatest id).
    pub checkpoint_id: Option<String>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// A listing of a thread's checkpoints.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListThreadQuery {
    /// Only this namespace (absent: every namespace; empty: the root graph).
    pub ns: Option<String>,
    /// Only this checkpoint id.
    pub checkpoint_id: Option<String>,
    /// Only checkpoints whose id is below this one (byte order).
    pub before: Option<String>,
    /// At most this many (newest first).
    pub limit: Option<usize>,
    /// A JSON object: only checkpoints whose metadata has each of its keys
    /// with an equal value (an absent key equals `null`).
    pub filter: Option<String>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}

/// A listing across every thread under a scope.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListThreadsQuery {
    /// Only threads of this project.
    pub project: Option<String>,
    /// Only threads of this session (needs `project`).
    pub session: Option<String>,
    /// Only this namespace (absent: every namespace).
    pub ns: Option<String>,
    /// Only checkpoints whose id is below this one (byte order).
    pub before: Option<String>,
    /// At most this many (newest first).
    pub limit: Option<usize>,
    /// A JSON object of metadata keys to the values they must equal.
    pub filter: Option<String>,
}

/// A thread's deletion.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteThreadQuery {
    /// The holding the delete is made under (absent: unfenced).
    pub fence: Option<u64>,
    /// The parent run, for a sub-run.
    pub parent: Option<String>,
}
