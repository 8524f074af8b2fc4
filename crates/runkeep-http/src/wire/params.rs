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
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{IntoParams, PartialSchema, ToSchema};

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
    /// The checkpoint id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
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
    /// The run id (and `parent`): the id rule, starting with `run_` (a
    /// directory store lists and hands out only `run_*` runs, so it refuses
    /// to enqueue others; runkeep's generated run ids all start so).
    #[param(
        min_length = 4,
        max_length = 128,
        pattern = "^run_[A-Za-z0-9_-]{0,124}$"
    )]
    pub run: String,
}

/// The query of a per-run route that takes nothing else: the run's parent.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ParentQuery {
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// The query of an enqueue: the run's parent, which starts with `run_`
/// like the run.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EnqueueQuery {
    /// The run id (and `parent`): the id rule, starting with `run_` (a
    /// directory store lists and hands out only `run_*` runs, so it refuses
    /// to enqueue others; runkeep's generated run ids all start so).
    #[param(
        min_length = 4,
        max_length = 128,
        pattern = "^run_[A-Za-z0-9_-]{0,124}$"
    )]
    pub parent: Option<String>,
}

/// An optional instant.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NowQuery {
    /// Judge at this instant (epoch ms); the store's clock when absent.
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub now: Option<i64>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// A fence in the query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FenceQuery {
    /// The holding the delete is made under (absent: unfenced).
    #[param(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// A checkpoint listing's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListCheckpointsQuery {
    /// `summary` (default: each checkpoint without its `state`; read one's
    /// state with `GET …/checkpoints/by-id/{id}`) or `full` (with states).
    #[param(value_type = Option<CheckpointFields>, inline)]
    pub fields: Option<String>,
    /// At most this many checkpoints (default 100, at most 1000: 400 above
    /// it); a page shorter than `limit` is the last.
    #[param(maximum = 1000)]
    pub limit: Option<usize>,
    /// Start after the checkpoint with this id (the last id of the previous
    /// page); 400 when the run has no such checkpoint.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub after: Option<String>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// The audit read's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only records with `seq` above this (default 0).
    #[param(maximum = 9_007_199_254_740_991_i64)]
    pub since_seq: Option<u64>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// An event read's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadQuery {
    /// Only events with `seq` above this (exclusive; default 0).
    #[param(maximum = 9_007_199_254_740_991_i64)]
    pub since_seq: Option<u64>,
    /// `tolerant` (default: skip damaged records and list them) or `strict`.
    #[param(value_type = Option<IntegrityName>, inline)]
    pub integrity: Option<String>,
    /// At most this many events (default 1000, at most 10000: 400 above it).
    #[param(maximum = 10000)]
    pub limit: Option<usize>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// The tail's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Start after this `seq` (the `Last-Event-ID` header wins over it).
    #[param(maximum = 9_007_199_254_740_991_i64)]
    pub since_seq: Option<u64>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// The events wait's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitEventsQuery {
    /// Answer as soon as the log's last `seq` is above this.
    #[param(maximum = 9_007_199_254_740_991_i64)]
    pub since_seq: Option<u64>,
    /// Wait at most this long, ms (at most 30 000; default 25 000).
    #[param(maximum = 30000)]
    pub timeout_ms: Option<u64>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// The listing's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this project.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project: Option<String>,
    /// Only this session (needs `project`).
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session: Option<String>,
    /// `runId` (default), `createdAt` or `priority` (highest first, then
    /// run id; the server also takes `run-id`/`run_id` and
    /// `created-at`/`created_at`).
    #[param(value_type = Option<OrderName>, inline)]
    pub order: Option<String>,
    /// Only runs whose priority is at least this.
    #[param(minimum = -1_000_000, maximum = 1_000_000)]
    pub min_priority: Option<i64>,
    /// Park states, comma-separated (`outstanding,expired`).
    #[param(pattern = "^(?:outstanding|expired|resolved)(?:,(?:outstanding|expired|resolved))*$")]
    pub park: Option<String>,
    /// `true`: only runs held live; `false`: only runs nobody holds.
    pub claimed: Option<bool>,
    /// Statuses, comma-separated (`active,failed`).
    #[param(
        pattern = "^(?:active|completed|failed|cancelled)(?:,(?:active|completed|failed|cancelled))*$"
    )]
    pub status: Option<String>,
    /// Page size (default 100, at most 1000; 0 reads as 1, more as 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `cursor` of the previous page, as the server issued it (opaque:
    /// bound to the listing's order, filters and scope; any other string is
    /// refused).
    pub cursor: Option<String>,
    /// Judge expiry at this instant (epoch ms) instead of the store's clock.
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub now: Option<i64>,
}

/// The runnable wait's query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitRunnableQuery {
    /// Only this project.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project: Option<String>,
    /// Only this session (needs `project`).
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session: Option<String>,
    /// Wait at most this long, ms (at most 30 000; default 25 000).
    #[param(maximum = 30000)]
    pub timeout_ms: Option<u64>,
}

/// The path of a session route.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// The tenant id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub tenant: String,
    /// The project id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub project: String,
    /// The session id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub session: String,
}

/// A concurrency key's holdings read: the key (in the query, since a key
/// may hold `/`, `:`, `@` and `.`).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct KeyHoldingsQuery {
    /// The concurrency key: 1 to 128 bytes of `[A-Za-z0-9_.:@/-]`.
    #[param(min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9_.:@/-]+$")]
    pub key: String,
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
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
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
    #[param(maximum = 9_007_199_254_740_991_i64)]
    pub limit: Option<usize>,
    /// A JSON object: only checkpoints whose metadata has each of its keys
    /// with an equal value (an absent key equals null). The server takes
    /// any JSON object; the pattern states flat ones.
    #[param(value_type = Option<MetadataFilter>, inline)]
    pub filter: Option<String>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

/// A listing across every thread under a scope.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListThreadsQuery {
    /// Only threads of this project.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project: Option<String>,
    /// Only threads of this session (needs `project`).
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session: Option<String>,
    /// Only this namespace (absent: every namespace).
    pub ns: Option<String>,
    /// Only checkpoints whose id is below this one (byte order).
    pub before: Option<String>,
    /// At most this many (newest first).
    #[param(maximum = 9_007_199_254_740_991_i64)]
    pub limit: Option<usize>,
    /// A JSON object: only checkpoints whose metadata has each of its keys
    /// with an equal value (an absent key equals null). The server takes
    /// any JSON object; the pattern states flat ones.
    #[param(value_type = Option<MetadataFilter>, inline)]
    pub filter: Option<String>,
}

/// A thread's deletion.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteThreadQuery {
    /// The holding the delete is made under (absent: unfenced).
    #[param(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
    /// The parent run, for a sub-run.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub parent: Option<String>,
}

// A checkpoint listing's `fields`, as the document states them (the query
// takes it as text and names a bad one).
// (No doc comment: it would become a description inside the parameter's
// schema.)
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[expect(
    dead_code,
    reason = "a document-only type: its variants are its schema's values"
)]
enum CheckpointFields {
    Summary,
    Full,
}

// An event read's `integrity`, as the document states it.
// (No doc comment: it would become a description inside the parameter's
// schema.)
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[expect(
    dead_code,
    reason = "a document-only type: its variants are its schema's values"
)]
enum IntegrityName {
    Tolerant,
    Strict,
}

// A listing's `order`, as the document states it (the server also takes
// the kebab and snake spellings).
// (No doc comment: it would become a description inside the parameter's
// schema.)
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
#[expect(
    dead_code,
    reason = "a document-only type: its variants are its schema's values"
)]
enum OrderName {
    RunId,
    CreatedAt,
    Priority,
}

/// A thread listing's metadata `filter`: the server takes any JSON object;
/// the document states the flat objects of strings (no escapes), integers,
/// booleans and nulls, which it certainly parses.
struct MetadataFilter;

impl PartialSchema for MetadataFilter {
    fn schema() -> RefOr<Schema> {
        let string = r#""[^"\\\x00-\x1f]*""#;
        let value = format!(r"(?:{string}|-?(?:0|[1-9][0-9]{{0,15}})|true|false|null)");
        // JSON's whitespace only: `\s` would also admit \v and \f.
        let w = r"[ \t\n\r]*";
        let member = format!(r"{w}{string}{w}:{w}{value}{w}");
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(format!(r"^\{{(?:{member}(?:,{member})*|{w})\}}$")))
            .build()
            .into()
    }
}

impl ToSchema for MetadataFilter {}
