//! The API's OpenAPI 3.1 document, generated from the code: the paths from
//! the route table ([`crate::api::route_table`], the same table the router
//! is built from), the schemas from the wire types' `ToSchema` derives, the
//! query parameters from the query structs' `IntoParams` derives.
//!
//! It is served at `/openapi.json` and committed as
//! `crates/runkeep-server/openapi.json`; the test `tests/openapi.rs` fails
//! when the two disagree and says how to regenerate the file
//! (`RUNKEEP_WRITE_OPENAPI=1 cargo test -p runkeep-server --test openapi`).

use serde_json::{json, Value};
use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, Parameter, ParameterBuilder, ParameterIn, Paths,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ArrayBuilder, ContentBuilder, InfoBuilder, ObjectBuilder, OpenApi, Ref, RefOr, Required,
    ResponseBuilder, Schema, Type,
};
use utoipa::IntoParams;

use crate::api::{self, Operation, RouteSpec};
use crate::auth::Role;
use crate::problem::{ProblemType, PROBLEM_JSON};

#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(
    crate::problem::Problem,
    runkeep_http::wire::RunAddress,
    runkeep_http::wire::LeaseBody,
    runkeep_http::wire::LeaseSummaryBody,
    runkeep_http::wire::ParkStateBody,
    runkeep_http::wire::RunStatusBody,
    runkeep_http::wire::FinishStatusBody,
    runkeep_http::wire::OrderBody,
    runkeep_http::wire::ParkSummaryBody,
    runkeep_http::wire::RunRowBody,
    runkeep_http::wire::RunPageBody,
    runkeep_http::wire::OutcomeBody,
    runkeep_http::wire::LifecycleBody,
    runkeep_http::wire::PendingBody,
    runkeep_http::wire::CheckpointBody,
    runkeep_http::wire::NewEventBody,
    runkeep_http::wire::EventBody,
    runkeep_http::wire::SkippedBody,
    runkeep_http::wire::EventBatchBody,
    runkeep_http::wire::MessagesKind,
    runkeep_http::wire::MessagesBody,
    runkeep_http::wire::NewAuditBody,
    runkeep_http::wire::AuditBody,
    runkeep_http::wire::ClaimBody,
    runkeep_http::wire::ClaimAnswer,
    runkeep_http::wire::ClaimNextBody,
    runkeep_http::wire::Claimed,
    runkeep_http::wire::ClaimNextAnswer,
    runkeep_http::wire::ReleaseBody,
    runkeep_http::wire::Done,
    runkeep_http::wire::SnoozeBody,
    runkeep_http::wire::FinishBody,
    runkeep_http::wire::EnqueueBody,
    runkeep_http::wire::WriteCheckpointBody,
    runkeep_http::wire::MaybeCheckpoint,
    runkeep_http::wire::ResolutionBody,
    runkeep_http::wire::ResolveBody,
    runkeep_http::wire::PruneBody,
    runkeep_http::wire::Pruned,
    runkeep_http::wire::AppendEventsBody,
    runkeep_http::wire::Appended,
    runkeep_http::wire::RecordBody,
    runkeep_http::wire::MaybeRecord,
    runkeep_http::wire::WriteMessagesBody,
    runkeep_http::wire::ReportBody,
    runkeep_http::wire::MaybeReport,
    runkeep_http::wire::AppendAuditBody,
    runkeep_http::wire::AuditList,
    runkeep_http::wire::StepMessagesBody,
    runkeep_http::wire::StepBody,
    runkeep_http::wire::CommitStepBody,
    runkeep_http::wire::StepReceiptBody,
    runkeep_http::wire::NextClaimBody,
    runkeep_http::wire::HandOverBody,
    runkeep_http::wire::HandOverAnswer,
    runkeep_http::wire::MaybeLease,
    runkeep_http::wire::RunSummary,
    runkeep_http::wire::Clock,
    runkeep_http::wire::WhoAmI,
    runkeep_http::wire::Waited,
    runkeep_http::wire::threads::ThreadBlobBody,
    runkeep_http::wire::threads::PutThreadCheckpointBody,
    runkeep_http::wire::threads::ThreadWriteBody,
    runkeep_http::wire::threads::ThreadParkBody,
    runkeep_http::wire::threads::PutThreadWritesBody,
    runkeep_http::wire::threads::StoredThreadWrite,
    runkeep_http::wire::threads::ThreadCheckpointBody,
    runkeep_http::wire::threads::ThreadParkState,
    runkeep_http::wire::threads::MaybeThreadCheckpoint,
    runkeep_http::wire::threads::ThreadCheckpointList,
    runkeep_http::wire::threads::ThreadDeleted,
)))]
struct Schemas;

/// What an answer carries.
enum Body {
    /// A schema by name.
    Named(&'static str),
    /// An array of a schema.
    ArrayOf(&'static str),
    /// Server-Sent Events.
    Events,
}

/// How one operation is documented.
struct Doc {
    summary: &'static str,
    request: Option<&'static str>,
    response: Body,
    query: Vec<Parameter>,
}

fn q<T: IntoParams>() -> Vec<Parameter> {
    T::into_params(|| Some(ParameterIn::Query))
}

fn parent() -> Vec<Parameter> {
    vec![ParameterBuilder::new()
        .name("parent")
        .parameter_in(ParameterIn::Query)
        .required(Required::False)
        .description(Some("The parent run, for a sub-run."))
        .schema(Some(string()))
        .build()]
}

fn string() -> Schema {
    Schema::Object(ObjectBuilder::new().schema_type(Type::String).build())
}

/// The documentation of `op`. An exhaustive match: a route cannot be added
/// undocumented (it does not compile).
fn doc(op: Operation) -> Doc {
    use crate::api::docs::*;
    let d = |summary, request, response, query| Doc {
        summary,
        request,
        response,
        query,
    };
    use Body::*;
    match op {
        Operation::Clock => d("The store's clock.", None, Named("Clock"), vec![]),
        Operation::Whoami => d("The tenant and role of the presented token.", None, Named("WhoAmI"), vec![]),
        Operation::ListRuns => d(
            "One page of the tenant's runs (filters, order, cursor).",
            None,
            Named("RunPageBody"),
            q::<ListQuery>(),
        ),
        Operation::ClaimNext => d(
            "Takes the next runnable run, optionally waiting up to 30 s for one.",
            Some("ClaimNextBody"),
            Named("ClaimNextAnswer"),
            vec![],
        ),
        Operation::WaitRunnable => d(
            "Long-poll: answers when a run under the scope may have become runnable.",
            None,
            Named("Waited"),
            q::<WaitRunnableQuery>(),
        ),
        Operation::RunSummary => d(
            "The run's lease, lifecycle, latest and pending checkpoint and last event seq; 404 when the run does not exist.",
            None,
            Named("RunSummary"),
            parent(),
        ),
        Operation::Claim => d(
            "Claims, renews (same holder) or reclaims the run.",
            Some("ClaimBody"),
            Named("ClaimAnswer"),
            parent(),
        ),
        Operation::Release => d(
            "Releases the holding at `fence`; without a fence (operator) whoever holds it.",
            Some("ReleaseBody"),
            Named("Done"),
            parent(),
        ),
        Operation::Finish => d(
            "Finishes the run held at `fence`, ending the lease.",
            Some("FinishBody"),
            Named("LifecycleBody"),
            parent(),
        ),
        Operation::Snooze => d(
            "Releases the run held at `fence` and defers it until `until`.",
            Some("SnoozeBody"),
            Named("Done"),
            parent(),
        ),
        Operation::Enqueue => d(
            "Creates a runnable run with its first checkpoint.",
            Some("EnqueueBody"),
            Named("CheckpointBody"),
            parent(),
        ),
        Operation::Reopen => d(
            "Makes a finished run active again.",
            None,
            Named("LifecycleBody"),
            parent(),
        ),
        Operation::Lease => d(
            "The run's top holding.",
            None,
            Named("MaybeLease"),
            q::<NowQuery>(),
        ),
        Operation::Lifecycle => d("The run's lifecycle.", None, Named("LifecycleBody"), parent()),
        Operation::CommitStep => d(
            "Writes one step (events, checkpoint, messages, record, finish) under one fence check, all or nothing.",
            Some("CommitStepBody"),
            Named("StepReceiptBody"),
            parent(),
        ),
        Operation::CommitStepAndClaimNext => d(
            "A worker's hand-over: commits one step under `fence` (as `commit_step`), then takes the next runnable run in the tenant (as `claim-next`, without waiting; never this run). A refused step is a problem answer and claims nothing; a claim that failed after the step committed is answered 200 with the receipt and the claim's problem in `nextError`.",
            Some("HandOverBody"),
            Named("HandOverAnswer"),
            parent(),
        ),
        Operation::ListCheckpoints => d(
            "One page of the run's checkpoints in the total order: at most `limit` (default 100, at most 1000; 400 above it), after the checkpoint `after`; a page shorter than `limit` is the last. `fields=summary` (the default) leaves out each `state` (read it with `GET …/checkpoints/by-id/{checkpoint}`); `fields=full` carries them. Charged to the server's answer budget: 503 `overloaded` when it has no room.",
            None,
            ArrayOf("CheckpointBody"),
            q::<ListCheckpointsQuery>(),
        ),
        Operation::WriteCheckpoint => d(
            "Writes a checkpoint (fenced when `fence` is given).",
            Some("WriteCheckpointBody"),
            Named("CheckpointBody"),
            parent(),
        ),
        Operation::LatestCheckpoint => d(
            "The latest checkpoint (total order).",
            None,
            Named("MaybeCheckpoint"),
            parent(),
        ),
        Operation::FindPending => d(
            "The checkpoint whose park is outstanding.",
            None,
            Named("MaybeCheckpoint"),
            q::<NowQuery>(),
        ),
        Operation::ResumePoint => d(
            "The pending checkpoint, else the latest.",
            None,
            Named("MaybeCheckpoint"),
            q::<NowQuery>(),
        ),
        Operation::ReadCheckpoint => d(
            "One checkpoint (`null` when absent). Charged to the server's answer budget: 503 `overloaded` when it has no room.",
            None,
            Named("MaybeCheckpoint"),
            parent(),
        ),
        Operation::DeleteCheckpoint => d(
            "Deletes a checkpoint (`done: false` when absent).",
            None,
            Named("Done"),
            q::<FenceQuery>(),
        ),
        Operation::ResolvePark => d(
            "Answers the park on a checkpoint, exactly once: a second answer is 409 `conflict` carrying the first (`firstAnswer`, `resolvedAt`).",
            Some("ResolveBody"),
            Named("CheckpointBody"),
            parent(),
        ),
        Operation::PruneCheckpoints => d(
            "Deletes all but the newest `keepLast` checkpoints (never an unanswered park).",
            Some("PruneBody"),
            Named("Pruned"),
            parent(),
        ),
        Operation::ReadEvents => d(
            "One page of the transcript after `sinceSeq`: at most `limit` events (default 1000, at most 10 000; 400 above it). `more: true` says events follow the page; the next page starts at `nextSinceSeq`. Streamed; charged to the server's answer budget while in flight (503 `overloaded` when it has no room).",
            None,
            Named("EventBatchBody"),
            q::<ReadQuery>(),
        ),
        Operation::AppendEvents => d(
            "Appends events; the store numbers them.",
            Some("AppendEventsBody"),
            Named("Appended"),
            parent(),
        ),
        Operation::TailEvents => d(
            "The live tail as Server-Sent Events: `event: event`, `id:` the seq, `data:` an EventBody; resumes after `Last-Event-ID`.",
            None,
            Events,
            q::<StreamQuery>(),
        ),
        Operation::WaitEvents => d(
            "Long-poll: answers when the log's last seq is above `sinceSeq`.",
            None,
            Named("Waited"),
            q::<WaitEventsQuery>(),
        ),
        Operation::ReadRunRecord => d("The run record.", None, Named("MaybeRecord"), parent()),
        Operation::WriteRunRecord => d(
            "Replaces the run record.",
            Some("RecordBody"),
            Named("Done"),
            parent(),
        ),
        Operation::ReadMessages => d("The message snapshot.", None, Named("MessagesBody"), parent()),
        Operation::WriteMessages => d(
            "Publishes the message history with the event head it follows.",
            Some("WriteMessagesBody"),
            Named("Done"),
            parent(),
        ),
        Operation::ReadReport => d("The final report.", None, Named("MaybeReport"), parent()),
        Operation::WriteReport => d(
            "Stores the final report.",
            Some("ReportBody"),
            Named("Done"),
            parent(),
        ),
        Operation::ReadAudit => d(
            "The audit trail after `sinceSeq`.",
            None,
            Named("AuditList"),
            q::<AuditQuery>(),
        ),
        Operation::AppendAudit => d(
            "Appends to the audit trail.",
            Some("AppendAuditBody"),
            Named("AuditList"),
            parent(),
        ),
        Operation::PutThreadCheckpoint => d(
            "Writes a thread checkpoint (`ns`, `checkpointId`) with its parent, metadata and the channel values it changed (fenced when `fence` is given).",
            Some("PutThreadCheckpointBody"),
            Named("Done"),
            parent(),
        ),
        Operation::ListThreadCheckpoints => d(
            "The thread's checkpoints, greatest checkpoint id first, with their channel values and pending writes; filtered by namespace, id, `before`, metadata `filter`, `limit`.",
            None,
            Named("ThreadCheckpointList"),
            q::<ListThreadQuery>(),
        ),
        Operation::GetThreadCheckpoint => d(
            "One thread checkpoint of a namespace (by id, or the greatest id) with its channel values and pending writes.",
            None,
            Named("MaybeThreadCheckpoint"),
            q::<GetThreadQuery>(),
        ),
        Operation::PutThreadWrites => d(
            "Stores a task's pending writes on a thread checkpoint: a repeated ordinary write (`idx >= 0`) is ignored, a special one (`idx < 0`) replaces; `park` parks the run there.",
            Some("PutThreadWritesBody"),
            Named("Done"),
            parent(),
        ),
        Operation::DeleteThread => d(
            "Deletes every thread checkpoint and pending write of the run (fenced when `fence` is given).",
            None,
            Named("ThreadDeleted"),
            q::<DeleteThreadQuery>(),
        ),
        Operation::ListThreadsCheckpoints => d(
            "Thread checkpoints across every thread under the scope, greatest checkpoint id first.",
            None,
            Named("ThreadCheckpointList"),
            q::<ListThreadsQuery>(),
        ),
    }
}

fn path_param(name: &str) -> Parameter {
    let what = match name {
        "checkpoint" => "checkpoint id",
        other => other,
    };
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(format!(
            "The {what} id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit."
        )))
        .schema(Some(Schema::Object(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"))
                .build(),
        )))
        .build()
}

fn problem_response(kinds: &[ProblemType]) -> utoipa::openapi::Response {
    problem_response_because(kinds, "")
}

/// A problem response; `why` (when not empty) says when it is answered.
fn problem_response_because(kinds: &[ProblemType], why: &str) -> utoipa::openapi::Response {
    let names: Vec<String> = kinds.iter().map(|k| format!("`{}`", k.uri())).collect();
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" {why}")
    };
    ResponseBuilder::new()
        .description(format!("A problem detail: {}.{why}", names.join(", ")))
        .content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

fn operation(spec: &RouteSpec) -> utoipa::openapi::path::Operation {
    let d = doc(spec.op);
    let mut params: Vec<Parameter> = spec
        .path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(path_param)
        .collect();
    params.extend(d.query);
    let role = match spec.unfenced_role {
        Some(u) => format!(
            "Needs a `{}` token with a `fence`, an `{}` token without one.",
            spec.role, u
        ),
        None => format!("Needs a `{}` token.", spec.role),
    };
    let tag = if spec.path.starts_with(api::RUN) {
        "runs"
    } else {
        "tenant"
    };
    let mut op = OperationBuilder::new()
        .operation_id(Some(spec.operation))
        .tag(tag)
        .summary(Some(d.summary))
        .description(Some(role))
        .parameters(Some(params))
        .security(SecurityRequirement::new("bearer", Vec::<String>::new()));
    if let Some(req) = d.request {
        op = op.request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name(req)))
                        .build(),
                )
                .build(),
        ));
    }
    let ok = match d.response {
        Body::Named(n) => ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(n)))
            .build(),
        Body::ArrayOf(n) => ContentBuilder::new()
            .schema(Some(RefOr::T(Schema::Array(
                ArrayBuilder::new().items(Ref::from_schema_name(n)).build(),
            ))))
            .build(),
        Body::Events => ContentBuilder::new().schema(Some(string())).build(),
    };
    let ok_type = match d.response {
        Body::Events => "text/event-stream",
        _ => "application/json",
    };
    op = op.response(
        "200",
        ResponseBuilder::new()
            .description("The answer.")
            .content(ok_type, ok)
            .build(),
    );
    use ProblemType::*;
    let mut bad = vec![InvalidInput];
    if d.request.is_some() {
        bad.push(MalformedBody);
    }
    op = op
        .response("400", problem_response(&bad))
        .response("401", problem_response(&[Unauthorized]))
        .response(
            "414",
            problem_response_because(
                &[InvalidInput],
                "The request target (path and query) is longer than the server accepts.",
            ),
        )
        .response(
            "431",
            problem_response_because(
                &[InvalidInput],
                "The request head (request line and header fields) is larger than the server accepts.",
            ),
        );
    if spec.role > Role::Reader || spec.unfenced_role.is_some() {
        op = op.response("403", problem_response(&[Forbidden]));
    }
    if spec.is_tenant_scoped() {
        op = op.response("404", problem_response(&[NotFound]));
    }
    if spec.method != axum::http::Method::GET {
        op = op.response("409", problem_response(&[FencedOut, Conflict]));
    }
    if d.request.is_some() {
        // 408: the body did not arrive within the request timeout.
        op = op
            .response("408", problem_response(&[Timeout]))
            .response("413", problem_response(&[PayloadTooLarge]))
            .response("415", problem_response(&[UnsupportedMediaType]));
    }
    if spec.is_tenant_scoped() {
        // What a store cannot do (`Error::Unsupported`: a fence ceiling
        // reached, a volume without the locks a directory store needs).
        op = op.response("422", problem_response(&[Unsupported]));
    }
    op.response("500", problem_response(&[Corrupted, Backend]))
        .response(
            "503",
            problem_response(&[Unavailable, Contended, Overloaded]),
        )
        .build()
}

fn method(m: &axum::http::Method) -> HttpMethod {
    match *m {
        axum::http::Method::GET => HttpMethod::Get,
        axum::http::Method::POST => HttpMethod::Post,
        axum::http::Method::PUT => HttpMethod::Put,
        axum::http::Method::DELETE => HttpMethod::Delete,
        axum::http::Method::PATCH => HttpMethod::Patch,
        _ => HttpMethod::Head,
    }
}

/// The document as the derives and the route table generate it, before
/// [`tighten`] states what they cannot (id patterns, bounds, closed
/// bodies, reserved keys).
pub fn generated() -> OpenApi {
    let mut doc = <Schemas as utoipa::OpenApi>::openapi();
    doc.info = InfoBuilder::new()
        .title("runkeep")
        .version("1")
        .description(Some(
            "Durable state for long-running agent and workflow runs, over HTTP: fenced leases, checkpoints, event transcripts, parks. Every write carries its fence to the store, which checks it. Errors are RFC 9457 problem details (`application/problem+json`). Every response carries the store's clock in the `runkeep-now` header (epoch ms).",
        ))
        .build();
    let mut paths = Paths::new();
    for spec in api::route_table() {
        paths.add_path_operation(&spec.path, vec![method(&spec.method)], operation(&spec));
    }
    doc.paths = paths;
    if let Some(c) = doc.components.as_mut() {
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
    doc
}

/// The API's OpenAPI 3.1 document: [`generated`], tightened ([`tighten`]).
/// A JSON value, because some of what it states (`propertyNames`, `not`)
/// has no place in utoipa's types.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(generated()).expect("the OpenAPI document serializes");
    tighten(&mut doc);
    doc
}

/// The document as the committed file holds it: pretty JSON, one trailing
/// newline.
pub fn json() -> String {
    let mut s = serde_json::to_string_pretty(&document()).expect("the OpenAPI document serializes");
    s.push('\n');
    s
}

// ---------------------------------------------------------------------------
// Tightening: what the derives cannot say.
//
// The wire types are plain `String`s and integers; the rules that make a
// value acceptable live in the core's constructors (`runkeep::id`,
// `Timestamp`, `Fence`, `Ttl`, …). The document states them here, from the
// same constants, so a request the document calls valid is one the server
// accepts (schemathesis' `positive_data_acceptance` holds the two together:
// `scripts/schemathesis.sh`). Where the server's rule cannot be written in
// JSON Schema exactly (a byte length, a state-dependent check) the
// document states a slightly stricter rule that implies it.

/// Largest integer every JSON client reads exactly (2^53 − 1). Sequence
/// numbers and counts are `u64` in the server; every one it issues is far
/// below this, and above it a JavaScript client would silently round.
const JSON_SAFE_MAX: u64 = (1 << 53) - 1;

/// The shortest lease the document admits (ms): [`integer_rule`]'s `ttlMs`.
const MIN_TTL_MS: u64 = 1000;

/// The length of a token id (`rk_<id>_<secret>`, `crate::tokens`).
const TOKEN_ID_LEN: usize = 12;

/// The id rule of `runkeep::id` as a pattern: 1 to 128 bytes of
/// `[A-Za-z0-9_-]`, starting with a letter or digit.
pub fn id_pattern() -> String {
    format!(
        "^[A-Za-z0-9][A-Za-z0-9_-]{{0,{}}}$",
        runkeep::id::MAX_ID_LEN - 1
    )
}

fn id_rule() -> Value {
    json!({
        "pattern": id_pattern(),
        "minLength": 1,
        "maxLength": runkeep::id::MAX_ID_LEN,
    })
}

/// Text of at most `bytes` UTF-8 bytes without control characters: any
/// such text of up to `bytes` ASCII characters, or of up to `bytes / 4`
/// characters of any kind (a JSON Schema length counts characters, the
/// server counts bytes).
fn printable_within(bytes: usize) -> String {
    format!(
        "(?:[\\x20-\\x7e]{{1,{bytes}}}|[^\\x00-\\x1f\\x7f-\\x9f]{{1,{}}})",
        bytes / 4
    )
}

/// A holder over HTTP: `runkeep::Holder`'s rule (not blank, no control
/// character, at most 256 bytes) with room for the tag the server appends
/// (` ~token:<token id>`, `api::ownership`), which a holder may therefore
/// not contain.
fn holder_rule() -> Value {
    let room = runkeep::id::MAX_HOLDER_LEN - api::ownership::TAG.len() - TOKEN_ID_LEN;
    json!({
        "pattern": format!(
            "^(?![\\s\\S]*{})(?=[\\s\\S]*\\S){}$",
            api::ownership::TAG.trim_start(),
            printable_within(room)
        ),
        "description": format!(
            "The claiming worker (unique per process); the same holder renews. Not blank, no control characters, at most {room} bytes (ASCII) and never containing `{}`: the server appends ` ~token:<token id>` to bind the holding to the token, within the store's {} bytes.",
            api::ownership::TAG.trim_start(),
            runkeep::id::MAX_HOLDER_LEN
        ),
    })
}

fn bounded(min: u64, max: u64) -> Value {
    json!({ "minimum": min, "maximum": max })
}

fn instant_rule() -> Value {
    bounded(0, runkeep::time::MAX_TIMESTAMP_MS as u64)
}

fn fence_rule() -> Value {
    bounded(1, runkeep::lease::MAX_FENCE)
}

fn count_rule() -> Value {
    bounded(0, JSON_SAFE_MAX)
}

fn wait_rule() -> Value {
    bounded(0, api::MAX_WAIT_MS)
}

/// `propertyNames` refusing `keys`.
fn not_keys(keys: &[&str]) -> Value {
    json!({ "propertyNames": { "not": { "enum": keys } } })
}

/// Integer properties by name, wherever they appear: every instant, fence
/// and count of the API is named one of these (the OpenAPI test checks
/// that every 64-bit integer of the document got a bound).
fn integer_rule(name: &str) -> Option<Value> {
    Some(match name {
        "createdAt" | "runCreatedAt" | "parkedAt" | "deadlineAt" | "resolvedAt" | "until"
        | "availableAt" | "expiresAt" | "finishedAt" | "latestCheckpointAt" | "timestamp"
        | "now" => instant_rule(),
        "fence" | "finishedFence" | "generation" | "presented" | "current" => fence_rule(),
        "seq" | "lastSeq" | "throughEventSeq" | "sinceSeq" | "nextSinceSeq" | "position"
        | "checkpointCount" | "keepLast" => count_rule(),
        "ttlMs" => merge(
            bounded(MIN_TTL_MS, runkeep::time::MAX_TTL_MS),
            json!({ "description": format!(
                "Lease length, ms: {MIN_TTL_MS} ms (1 s) to {} ms (366 days). The store takes any positive length, but a lease shorter than a claim takes on its volume has expired before it is handed back (a directory store answers 503 `unavailable`), so the document asks for at least a second.",
                runkeep::time::MAX_TTL_MS
            ) }),
        ),
        "waitMs" | "timeoutMs" => wait_rule(),
        // u32 in the server: utoipa says int32, whose range stops at 2^31 − 1.
        "attempts" => json!({ "format": "int64", "minimum": 0, "maximum": u32::MAX }),
        "maxAttempts" => json!({ "format": "int64", "minimum": 1, "maximum": u32::MAX }),
        "status" => bounded(100, 599),
        // A pending write's index: negative for a special channel's slot.
        "idx" => json!({ "minimum": i32::MIN, "maximum": i32::MAX }),
        _ => return None,
    })
}

/// Request bodies the server parses with `deny_unknown_fields`: an unknown
/// member is a 400 naming it, so the document closes them.
pub const CLOSED_SCHEMAS: &[&str] = &[
    "AppendAuditBody",
    "AppendEventsBody",
    "CheckpointBody",
    "ClaimBody",
    "ClaimNextBody",
    "CommitStepBody",
    "EnqueueBody",
    "FinishBody",
    "HandOverBody",
    "NewAuditBody",
    "NewEventBody",
    "NextClaimBody",
    "OutcomeBody",
    "PendingBody",
    "PruneBody",
    "PutThreadCheckpointBody",
    "PutThreadWritesBody",
    "RecordBody",
    "ReleaseBody",
    "ReportBody",
    "ResolveBody",
    "SnoozeBody",
    "StepBody",
    "StepMessagesBody",
    "ThreadBlobBody",
    "ThreadParkBody",
    "ThreadWriteBody",
    "WriteCheckpointBody",
    "WriteMessagesBody",
];

/// Rules for one property of one schema: merged into its schema.
fn property_rules() -> Vec<(&'static str, &'static str, Value)> {
    let id = id_rule;
    let mut reserved_state: Vec<&str> = runkeep::checkpoint::RESERVED_CHECKPOINT_KEYS.to_vec();
    reserved_state.push("runId");
    vec![
        ("CheckpointBody", "id", id()),
        (
            "CheckpointBody",
            "state",
            merge(
                not_keys(&reserved_state),
                json!({ "description": format!(
                    "The host's state, kept as given. It may not use the store's keys ({}); a `runId` key is allowed only when it is the run's own id, so the document leaves it out.",
                    runkeep::checkpoint::RESERVED_CHECKPOINT_KEYS.map(|k| format!("`{k}`")).join(", ")
                ) }),
            ),
        ),
        (
            "PendingBody",
            "request",
            json!({
                "required": ["type"],
                "properties": { "type": { "type": "string", "minLength": 1 } },
            }),
        ),
        (
            "ThreadParkBody",
            "request",
            json!({
                "required": ["type"],
                "properties": { "type": { "type": "string", "minLength": 1 } },
            }),
        ),
        (
            "PutThreadCheckpointBody",
            "thread",
            json!({ "minLength": 1 }),
        ),
        (
            "PutThreadCheckpointBody",
            "checkpointId",
            json!({ "minLength": 1 }),
        ),
        ("PutThreadWritesBody", "thread", json!({ "minLength": 1 })),
        (
            "PutThreadWritesBody",
            "checkpointId",
            json!({ "minLength": 1 }),
        ),
        ("PutThreadWritesBody", "taskId", json!({ "minLength": 1 })),
        ("ClaimBody", "holder", holder_rule()),
        ("ClaimNextBody", "holder", holder_rule()),
        ("ClaimNextBody", "project", id()),
        ("ClaimNextBody", "session", id()),
        ("ClaimNextBody", "park", json!({ "minItems": 1 })),
        ("NextClaimBody", "holder", holder_rule()),
        ("NextClaimBody", "project", id()),
        ("NextClaimBody", "session", id()),
        ("NextClaimBody", "park", json!({ "minItems": 1 })),
        (
            "NewEventBody",
            "type",
            json!({
                "pattern": format!("^{}$", printable_within(128)),
                "description": "The `type` discriminator: 1 to 128 bytes, no control characters.",
            }),
        ),
        (
            "NewEventBody",
            "payload",
            merge(
                not_keys(&runkeep::evidence::RESERVED_EVENT_KEYS),
                json!({ "description": "Every other field (`type`, `seq`, `timestamp`, `generation` are the store's and refused here)." }),
            ),
        ),
        ("NewAuditBody", "who", json!({ "minLength": 1 })),
        ("NewAuditBody", "what", json!({ "minLength": 1 })),
        ("NewAuditBody", "outcome", json!({ "minLength": 1 })),
        ("NewAuditBody", "extra", not_keys(&AUDIT_RESERVED_KEYS)),
        (
            "OutcomeBody",
            "reason",
            json!({ "maxLength": runkeep::lifecycle::MAX_REASON_CHARS }),
        ),
        ("RunAddress", "tenantId", id()),
        ("RunAddress", "projectId", id()),
        ("RunAddress", "sessionId", id()),
        ("RunAddress", "runId", id()),
        ("RunAddress", "parentRunId", id()),
        ("ParkSummaryBody", "checkpointId", id()),
        ("RunRowBody", "latestCheckpointId", id()),
        ("AuditBody", "runId", id()),
        ("Pruned", "deleted", json!({ "items": id() })),
        ("WhoAmI", "tenant", id()),
        (
            "WhoAmI",
            "role",
            json!({ "enum": ["reader", "worker", "operator"] }),
        ),
    ]
}

/// The keys an audit event's extra fields may not use
/// (`runkeep::evidence::NewAuditEvent::validate`).
const AUDIT_RESERVED_KEYS: [&str; 8] = [
    "id",
    "runId",
    "seq",
    "timestamp",
    "who",
    "what",
    "outcome",
    "generation",
];

/// Rules for the parameters of every operation, by name (the path ids
/// already carry the id pattern, [`path_param`]).
fn parameter_rule(operation: &str, name: &str) -> Option<Value> {
    let park_states = "(?:outstanding|expired|resolved)";
    let statuses = "(?:active|completed|failed|cancelled)";
    Some(match name {
        "parent" | "project" | "session" => id_rule(),
        "order" => json!({
            "enum": ["runId", "createdAt"],
            "description": "`runId` (default) or `createdAt` (the server also takes `run-id`/`run_id` and `created-at`/`created_at`).",
        }),
        "park" => json!({ "pattern": format!("^{park_states}(?:,{park_states})*$") }),
        "status" => json!({ "pattern": format!("^{statuses}(?:,{statuses})*$") }),
        "integrity" => json!({ "enum": ["tolerant", "strict"] }),
        "limit" if operation == "list_runs" => json!({
            "minimum": 1,
            "maximum": runkeep::listing::MAX_LIMIT,
            "description": format!(
                "Page size (default {}, at most {}; 0 reads as 1, more as {}).",
                runkeep::listing::DEFAULT_LIMIT,
                runkeep::listing::MAX_LIMIT,
                runkeep::listing::MAX_LIMIT
            ),
        }),
        "limit" if operation == "read_events" => json!({
            "minimum": 0,
            "maximum": runkeep_http::wire::MAX_EVENTS_PAGE,
            "description": format!(
                "At most this many events (default {}, at most {}: 400 above it).",
                runkeep_http::wire::DEFAULT_EVENTS_PAGE,
                runkeep_http::wire::MAX_EVENTS_PAGE
            ),
        }),
        "limit" if operation == "list_checkpoints" => json!({
            "minimum": 0,
            "maximum": runkeep_http::wire::MAX_CHECKPOINTS_PAGE,
            "description": format!(
                "At most this many checkpoints (default {}, at most {}: 400 above it); a page shorter than `limit` is the last.",
                runkeep_http::wire::DEFAULT_CHECKPOINTS_PAGE,
                runkeep_http::wire::MAX_CHECKPOINTS_PAGE
            ),
        }),
        "fields" => json!({ "enum": ["summary", "full"] }),
        "after" => id_rule(),
        "limit" => count_rule(),
        "filter" => metadata_filter_rule(),
        "cursor" => json!({
            "description": "The `cursor` of the previous page, as the server issued it (opaque: bound to the listing's order, filters and scope; any other string is refused).",
        }),
        other => return integer_rule(other),
    })
}

/// A thread listing's `filter`: the server takes any JSON object; the
/// document states the flat objects of strings (no escapes), integers,
/// booleans and nulls, which it certainly parses.
fn metadata_filter_rule() -> Value {
    let s = r#""[^"\\\x00-\x1f]*""#;
    let v = format!(r"(?:{s}|-?(?:0|[1-9][0-9]{{0,15}})|true|false|null)");
    // JSON's whitespace only: `\s` would also admit \v and \f.
    let w = r"[ \t\n\r]*";
    let member = format!(r"{w}{s}{w}:{w}{v}{w}");
    json!({
        "pattern": format!(r"^\{{(?:{member}(?:,{member})*|{w})\}}$"),
        "description": "A JSON object: only checkpoints whose metadata has each of its keys with an equal value (an absent key equals null). The server takes any JSON object; the pattern states flat ones.",
    })
}

/// `a` with `b`'s members (recursively for objects).
fn merge(mut a: Value, b: Value) -> Value {
    merge_into(&mut a, b);
    a
}

fn merge_into(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge_into(slot, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (a, b) => *a = b,
    }
}

/// True when `schema` admits integers.
fn is_integer(schema: &Value) -> bool {
    match &schema["type"] {
        Value::String(t) => t == "integer",
        Value::Array(ts) => ts.iter().any(|t| t == "integer"),
        _ => false,
    }
}

/// Applies [`integer_rule`] to every integer property under `schema`.
fn bound_integers(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                for (name, prop) in props.iter_mut() {
                    if is_integer(prop) {
                        if let Some(rule) = integer_rule(name) {
                            merge_into(prop, rule);
                        }
                    }
                }
            }
            for (_, v) in map.iter_mut() {
                bound_integers(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

/// The step's rule that it writes something (`Step::validate`): one of its
/// parts is present and not empty.
fn step_writes_something() -> Value {
    let present = |name: &str| json!({ "required": [name], "properties": { name: { "not": { "type": "null" } } } });
    json!({
        "anyOf": [
            { "required": ["events"], "properties": { "events": { "minItems": 1 } } },
            present("checkpoint"),
            present("messages"),
            present("runRecord"),
            present("finish"),
        ],
    })
}

/// The run (and parent) of an enqueue: a directory store lists and hands
/// out only runs named `run_*` (the layout it shares with the reference),
/// so it refuses to enqueue any other; the document asks it of every store.
fn enqueued_run_rule() -> Value {
    json!({
        "description": "The run id (and `parent`): the id rule, starting with `run_` (a directory store lists and hands out only `run_*` runs, so it refuses to enqueue others; runkeep's generated run ids all start so).",
        "schema": {
            "pattern": format!("^run_[A-Za-z0-9_-]{{0,{}}}$", runkeep::id::MAX_ID_LEN - 4),
            "minLength": 4,
            "maxLength": runkeep::id::MAX_ID_LEN,
        },
    })
}

/// One frame of the live tail (`text/event-stream`), as a Server-Sent
/// Events reader sees it: `event: event` with the event's `seq` as `id` and
/// an [`EventBody`](runkeep_http::wire::EventBody) as `data`, or, when the log can
/// no longer be read, one `event: problem` frame with a problem detail, and
/// the stream ends.
fn event_frame() -> Value {
    let json_of = |schema: &str| {
        json!({
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": { "$ref": format!("#/components/schemas/{schema}") },
        })
    };
    json!({
        "description": "One Server-Sent Events frame: `event: event`, `id:` the event's `seq`, `data:` an EventBody; or a last `event: problem` frame whose `data` is a problem detail.",
        "oneOf": [
            {
                "type": "object",
                "required": ["event", "id", "data"],
                "properties": {
                    "event": { "const": "event" },
                    "id": { "type": "string", "pattern": "^[1-9][0-9]*$" },
                    "data": json_of("EventBody"),
                },
            },
            {
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": { "const": "problem" },
                    "data": json_of("Problem"),
                },
            },
        ],
    })
}

fn schema_mut<'a>(schemas: &'a mut Value, name: &str) -> &'a mut Value {
    schemas
        .get_mut(name)
        .unwrap_or_else(|| panic!("openapi::tighten: no schema {name}"))
}

/// States in the document what the derives cannot (module section above).
pub fn tighten(doc: &mut Value) {
    let schemas = &mut doc["components"]["schemas"];
    bound_integers(schemas);
    for (schema, property, rule) in property_rules() {
        let slot = schemas
            .pointer_mut(&format!("/{schema}/properties/{property}"))
            .unwrap_or_else(|| {
                panic!("openapi::tighten: {schema}.{property} is not in the document")
            });
        merge_into(slot, rule);
    }
    for name in CLOSED_SCHEMAS {
        schema_mut(schemas, name)["additionalProperties"] = Value::Bool(false);
    }
    merge_into(schema_mut(schemas, "StepBody"), step_writes_something());
    // A listing scope is a prefix of tenant → project → session.
    for name in ["ClaimNextBody", "NextClaimBody"] {
        merge_into(
            schema_mut(schemas, name),
            json!({ "dependentSchemas": { "session": {
                "required": ["project"],
                "properties": { "project": { "type": "string" } },
            } } }),
        );
    }
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for op in item.values_mut() {
            let operation = op["operationId"].as_str().unwrap_or_default().to_string();
            if let Some(stream) = op.pointer_mut("/responses/200/content/text~1event-stream") {
                stream["schema"] = event_frame();
            }
            let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else {
                continue;
            };
            for p in params {
                let name = p["name"].as_str().unwrap_or_default().to_string();
                if operation == "enqueue" && (name == "run" || name == "parent") {
                    merge_into(p, enqueued_run_rule());
                    continue;
                }
                if p["in"] == "path" {
                    continue;
                }
                if let Some(mut rule) = parameter_rule(&operation, &name) {
                    // A parameter's description is the parameter's, not its schema's.
                    if let Some(d) = rule.as_object_mut().and_then(|m| m.remove("description")) {
                        p["description"] = d;
                    }
                    merge_into(&mut p["schema"], rule);
                }
            }
        }
    }
}
