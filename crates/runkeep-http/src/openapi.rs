//! The API's OpenAPI 3.1 document, generated from the operation table
//! ([`Operation`]): each operation's path, method, role, summary,
//! parameters, request body and answer come from its entry
//! ([`OperationSpec`]); the schemas from the wire types' `ToSchema`
//! derives, the parameters from their `IntoParams` derives.
//!
//! The server serves it at `/openapi.json`; it is committed as
//! `crates/runkeep-http/openapi.json`, and the test `tests/openapi.rs`
//! fails when the two disagree and says how to regenerate the file
//! (`RUNKEEP_WRITE_OPENAPI=1 cargo test -p runkeep-http --test openapi`).

use serde_json::{json, Value};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, Parameter, ParameterIn, Paths};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ArrayBuilder, ComponentsBuilder, ContentBuilder, InfoBuilder, ObjectBuilder, OpenApi,
    OpenApiBuilder, Ref, RefOr, Required, ResponseBuilder, Schema,
};
use utoipa::{IntoParams, ToSchema};

use crate::problem::{Problem, ProblemType, PROBLEM_JSON};
use crate::routes::{Operation, OperationSpec, Role, RUN};
use crate::wire::{Array, EventStream, NoBody};

/// How a request body or an answer appears in the document: its media
/// type and schema, and the named schemas it refers to.
pub trait Payload {
    /// False for [`NoBody`]: nothing is sent.
    const PRESENT: bool = true;
    /// The media type and the schema (`None`: no body).
    fn content() -> Option<(&'static str, RefOr<Schema>)>;
    /// Adds the named schemas it refers to (itself included) to `out`.
    fn components(out: &mut Vec<(String, RefOr<Schema>)>);
}

/// A wire type: `application/json`, a reference to its named schema.
impl<T: ToSchema> Payload for T {
    fn content() -> Option<(&'static str, RefOr<Schema>)> {
        Some(("application/json", Ref::from_schema_name(T::name()).into()))
    }

    fn components(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push((T::name().into_owned(), T::schema()));
        T::schemas(out);
    }
}

impl Payload for NoBody {
    const PRESENT: bool = false;

    fn content() -> Option<(&'static str, RefOr<Schema>)> {
        None
    }

    fn components(_: &mut Vec<(String, RefOr<Schema>)>) {}
}

/// A JSON array of a wire type.
impl<T: ToSchema> Payload for Array<T> {
    fn content() -> Option<(&'static str, RefOr<Schema>)> {
        let items = ArrayBuilder::new().items(Ref::from_schema_name(T::name()));
        Some(("application/json", Schema::Array(items.build()).into()))
    }

    fn components(out: &mut Vec<(String, RefOr<Schema>)>) {
        T::components(out);
    }
}

/// `text/event-stream`: its frames ([`EventStream::frame_schema`]).
impl Payload for EventStream {
    fn content() -> Option<(&'static str, RefOr<Schema>)> {
        Some(("text/event-stream", EventStream::frame_schema().into()))
    }

    fn components(out: &mut Vec<(String, RefOr<Schema>)>) {
        crate::wire::EventBody::components(out);
        Problem::components(out);
    }
}

/// `object` with one JSON Schema keyword utoipa has no builder for
/// (`anyOf` beside `properties`, `dependentSchemas`, `oneOf` of raw
/// frames, …), carried as it is. One keyword: utoipa keeps such members in
/// a hash map, whose order would change from run to run with more.
pub fn with_keyword(object: ObjectBuilder, keyword: &str, value: Value) -> Schema {
    let extensions: Extensions = [(keyword.to_string(), value)].into_iter().collect();
    Schema::Object(object.extensions(Some(extensions)).build())
}

/// One operation's parameters, body and answer as the document states
/// them, from its [`OperationSpec`].
pub(crate) struct Contract {
    params: Vec<Parameter>,
    body: Option<(&'static str, RefOr<Schema>)>,
    answer: (&'static str, RefOr<Schema>),
    components: Vec<(String, RefOr<Schema>)>,
}

impl Contract {
    pub(crate) fn of<S: OperationSpec>() -> Self {
        let mut params = S::Path::into_params(|| Some(ParameterIn::Path));
        params.extend(S::Query::into_params(|| Some(ParameterIn::Query)));
        let mut components = Vec::new();
        S::Body::components(&mut components);
        S::Answer::components(&mut components);
        Self {
            params,
            body: S::Body::content(),
            answer: S::Answer::content().unwrap_or_else(|| {
                // An answer is always something; NoBody is for bodies.
                ("application/json", Schema::default().into())
            }),
            components,
        }
    }
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

fn operation(op: Operation, contract: &Contract) -> utoipa::openapi::path::Operation {
    let role = match op.unfenced_role() {
        Some(u) => format!(
            "Needs a `{}` token with a `fence`, an `{}` token without one.",
            op.role(),
            u
        ),
        None => format!("Needs a `{}` token.", op.role()),
    };
    let tag = if op.path().starts_with(RUN) {
        "runs"
    } else {
        "tenant"
    };
    let mut builder = OperationBuilder::new()
        .operation_id(Some(op.name()))
        .tag(tag)
        .summary(Some(op.summary()))
        .description(Some(role))
        .parameters(Some(contract.params.clone()))
        .security(SecurityRequirement::new("bearer", Vec::<String>::new()));
    if let Some((media_type, schema)) = &contract.body {
        builder = builder.request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content(
                    *media_type,
                    ContentBuilder::new().schema(Some(schema.clone())).build(),
                )
                .build(),
        ));
    }
    let (ok_type, ok_schema) = &contract.answer;
    builder = builder.response(
        "200",
        ResponseBuilder::new()
            .description("The answer.")
            .content(
                *ok_type,
                ContentBuilder::new()
                    .schema(Some(ok_schema.clone()))
                    .build(),
            )
            .build(),
    );
    let takes_body = contract.body.is_some();
    use ProblemType::*;
    let mut bad = vec![InvalidInput];
    if takes_body {
        bad.push(MalformedBody);
    }
    builder = builder
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
    let spec = op.spec();
    if op.role() > Role::Reader || op.unfenced_role().is_some() {
        builder = builder.response("403", problem_response(&[Forbidden]));
    }
    if spec.is_tenant_scoped() {
        builder = builder.response("404", problem_response(&[NotFound]));
    }
    if op.method() != http::Method::GET {
        builder = builder.response("409", problem_response(&[FencedOut, Conflict]));
    }
    if takes_body {
        // 408: the body did not arrive within the request timeout.
        builder = builder
            .response("408", problem_response(&[Timeout]))
            .response("413", problem_response(&[PayloadTooLarge]))
            .response("415", problem_response(&[UnsupportedMediaType]));
    }
    if spec.is_tenant_scoped() {
        // What a store cannot do (`Error::Unsupported`: a fence ceiling
        // reached, a volume without the locks a directory store needs).
        builder = builder.response("422", problem_response(&[Unsupported]));
    }
    builder
        .response("500", problem_response(&[Corrupted, Backend]))
        .response(
            "503",
            problem_response(&[Unavailable, Contended, Overloaded]),
        )
        .build()
}

fn method(m: &http::Method) -> HttpMethod {
    match *m {
        http::Method::GET => HttpMethod::Get,
        http::Method::POST => HttpMethod::Post,
        http::Method::PUT => HttpMethod::Put,
        http::Method::DELETE => HttpMethod::Delete,
        http::Method::PATCH => HttpMethod::Patch,
        _ => HttpMethod::Head,
    }
}

/// The document as the table and the derives generate it, before
/// [`tighten`] states what they cannot (id patterns, bounds, closed
/// bodies, reserved keys).
pub fn generated() -> OpenApi {
    let mut paths = Paths::new();
    let mut components = ComponentsBuilder::new();
    let mut schemas = Vec::new();
    Problem::components(&mut schemas);
    for op in Operation::ALL {
        let contract = op.contract();
        paths.add_path_operation(
            op.path(),
            vec![method(&op.method())],
            operation(*op, &contract),
        );
        schemas.extend(contract.components);
    }
    for (name, schema) in schemas {
        components = components.schema(name, schema);
    }
    let mut doc = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("runkeep")
                .version("1")
                .description(Some(
                    "Durable state for long-running agent and workflow runs, over HTTP: fenced leases, checkpoints, event transcripts, parks. Every write carries its fence to the store, which checks it. Errors are RFC 9457 problem details (`application/problem+json`). Every response carries the store's clock in the `runkeep-now` header (epoch ms).",
                ))
                .build(),
        )
        .paths(paths)
        .components(Some(components.build()))
        .build();
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
    let room = runkeep::id::MAX_HOLDER_LEN - crate::holder::TAG.len() - crate::holder::TOKEN_ID_LEN;
    json!({
        "pattern": format!(
            "^(?![\\s\\S]*{})(?=[\\s\\S]*\\S){}$",
            crate::holder::TAG.trim_start(),
            printable_within(room)
        ),
        "description": format!(
            "The claiming worker (unique per process); the same holder renews. Not blank, no control characters, at most {room} bytes (ASCII) and never containing `{}`: the server appends ` ~token:<token id>` to bind the holding to the token, within the store's {} bytes.",
            crate::holder::TAG.trim_start(),
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
    bounded(0, crate::wire::MAX_WAIT_MS)
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
            "maximum": crate::wire::MAX_EVENTS_PAGE,
            "description": format!(
                "At most this many events (default {}, at most {}: 400 above it).",
                crate::wire::DEFAULT_EVENTS_PAGE,
                crate::wire::MAX_EVENTS_PAGE
            ),
        }),
        "limit" if operation == "list_checkpoints" => json!({
            "minimum": 0,
            "maximum": crate::wire::MAX_CHECKPOINTS_PAGE,
            "description": format!(
                "At most this many checkpoints (default {}, at most {}: 400 above it); a page shorter than `limit` is the last.",
                crate::wire::DEFAULT_CHECKPOINTS_PAGE,
                crate::wire::MAX_CHECKPOINTS_PAGE
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_s_path_parameters_are_its_path_s() {
        for op in Operation::ALL {
            let in_path: Vec<&str> = op
                .path()
                .split('/')
                .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            let contract = op.contract();
            let declared: Vec<&str> = contract
                .params
                .iter()
                .filter(|p| p.parameter_in == ParameterIn::Path)
                .map(|p| p.name.as_str())
                .collect();
            assert_eq!(
                declared, in_path,
                "{op}: its `path:` type and its path disagree"
            );
        }
    }
}
