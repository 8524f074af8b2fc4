//! The API's OpenAPI 3.1 document, generated from the code: the paths from
//! the route table ([`crate::api::route_table`], the same table the router
//! is built from), the schemas from the wire types' `ToSchema` derives, the
//! query parameters from the query structs' `IntoParams` derives.
//!
//! It is served at `/openapi.json` and committed as
//! `crates/runkeep-server/openapi.json`; the test `tests/openapi.rs` fails
//! when the two disagree and says how to regenerate the file
//! (`RUNKEEP_WRITE_OPENAPI=1 cargo test -p runkeep-server --test openapi`).

// A `Problem` is returned straight into a response, once per refused
// request: its size costs nothing measurable, boxing it would cost clarity.
#![allow(clippy::result_large_err)]

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

use crate::api::{self, RouteSpec};
use crate::auth::Role;
use crate::problem::{ProblemType, PROBLEM_JSON};

#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(
    crate::problem::Problem,
    crate::wire::RunAddress,
    crate::wire::LeaseBody,
    crate::wire::LeaseSummaryBody,
    crate::wire::ParkStateBody,
    crate::wire::RunStatusBody,
    crate::wire::FinishStatusBody,
    crate::wire::OrderBody,
    crate::wire::ParkSummaryBody,
    crate::wire::RunRowBody,
    crate::wire::RunPageBody,
    crate::wire::OutcomeBody,
    crate::wire::LifecycleBody,
    crate::wire::PendingBody,
    crate::wire::CheckpointBody,
    crate::wire::NewEventBody,
    crate::wire::EventBody,
    crate::wire::SkippedBody,
    crate::wire::EventBatchBody,
    crate::wire::MessagesKind,
    crate::wire::MessagesBody,
    crate::wire::NewAuditBody,
    crate::wire::AuditBody,
    crate::wire::ClaimBody,
    crate::wire::ClaimAnswer,
    crate::wire::ClaimNextBody,
    crate::wire::Claimed,
    crate::wire::ClaimNextAnswer,
    crate::wire::ReleaseBody,
    crate::wire::Done,
    crate::wire::SnoozeBody,
    crate::wire::FinishBody,
    crate::wire::EnqueueBody,
    crate::wire::WriteCheckpointBody,
    crate::wire::MaybeCheckpoint,
    crate::wire::ResolutionBody,
    crate::wire::ResolveBody,
    crate::wire::PruneBody,
    crate::wire::Pruned,
    crate::wire::AppendEventsBody,
    crate::wire::Appended,
    crate::wire::RecordBody,
    crate::wire::MaybeRecord,
    crate::wire::WriteMessagesBody,
    crate::wire::ReportBody,
    crate::wire::MaybeReport,
    crate::wire::AppendAuditBody,
    crate::wire::AuditList,
    crate::wire::StepMessagesBody,
    crate::wire::StepBody,
    crate::wire::CommitStepBody,
    crate::wire::StepReceiptBody,
    crate::wire::MaybeLease,
    crate::wire::RunSummary,
    crate::wire::Clock,
    crate::wire::WhoAmI,
    crate::wire::Waited,
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

/// The documentation of `operation`. Panics for an operation without one,
/// so a route cannot be added undocumented (the OpenAPI test builds every
/// route's).
fn doc(operation: &str) -> Doc {
    use crate::api::docs::*;
    let d = |summary, request, response, query| Doc {
        summary,
        request,
        response,
        query,
    };
    use Body::*;
    match operation {
        "clock" => d("The store's clock.", None, Named("Clock"), vec![]),
        "whoami" => d("The tenant and role of the presented token.", None, Named("WhoAmI"), vec![]),
        "list_runs" => d(
            "One page of the tenant's runs (filters, order, cursor).",
            None,
            Named("RunPageBody"),
            q::<ListQuery>(),
        ),
        "claim_next" => d(
            "Takes the next runnable run, optionally waiting up to 30 s for one.",
            Some("ClaimNextBody"),
            Named("ClaimNextAnswer"),
            vec![],
        ),
        "wait_runnable" => d(
            "Long-poll: answers when a run under the scope may have become runnable.",
            None,
            Named("Waited"),
            q::<WaitRunnableQuery>(),
        ),
        "run_summary" => d(
            "The run's lease, lifecycle, latest and pending checkpoint and last event seq; 404 when the run does not exist.",
            None,
            Named("RunSummary"),
            parent(),
        ),
        "claim" => d(
            "Claims, renews (same holder) or reclaims the run.",
            Some("ClaimBody"),
            Named("ClaimAnswer"),
            parent(),
        ),
        "release" => d(
            "Releases the holding at `fence`; without a fence (operator) whoever holds it.",
            Some("ReleaseBody"),
            Named("Done"),
            parent(),
        ),
        "finish" => d(
            "Finishes the run held at `fence`, ending the lease.",
            Some("FinishBody"),
            Named("LifecycleBody"),
            parent(),
        ),
        "snooze" => d(
            "Releases the run held at `fence` and defers it until `until`.",
            Some("SnoozeBody"),
            Named("Done"),
            parent(),
        ),
        "enqueue" => d(
            "Creates a runnable run with its first checkpoint.",
            Some("EnqueueBody"),
            Named("CheckpointBody"),
            parent(),
        ),
        "reopen" => d(
            "Makes a finished run active again.",
            None,
            Named("LifecycleBody"),
            parent(),
        ),
        "lease" => d(
            "The run's top holding.",
            None,
            Named("MaybeLease"),
            q::<NowQuery>(),
        ),
        "lifecycle" => d("The run's lifecycle.", None, Named("LifecycleBody"), parent()),
        "commit_step" => d(
            "Writes one step (events, checkpoint, messages, record, finish) under one fence check, all or nothing.",
            Some("CommitStepBody"),
            Named("StepReceiptBody"),
            parent(),
        ),
        "list_checkpoints" => d(
            "Every checkpoint of the run in the total order.",
            None,
            ArrayOf("CheckpointBody"),
            parent(),
        ),
        "write_checkpoint" => d(
            "Writes a checkpoint (fenced when `fence` is given).",
            Some("WriteCheckpointBody"),
            Named("CheckpointBody"),
            parent(),
        ),
        "latest_checkpoint" => d(
            "The latest checkpoint (total order).",
            None,
            Named("MaybeCheckpoint"),
            parent(),
        ),
        "find_pending" => d(
            "The checkpoint whose park is outstanding.",
            None,
            Named("MaybeCheckpoint"),
            q::<NowQuery>(),
        ),
        "resume_point" => d(
            "The pending checkpoint, else the latest.",
            None,
            Named("MaybeCheckpoint"),
            q::<NowQuery>(),
        ),
        "read_checkpoint" => d(
            "One checkpoint (`null` when absent).",
            None,
            Named("MaybeCheckpoint"),
            parent(),
        ),
        "delete_checkpoint" => d(
            "Deletes a checkpoint (`done: false` when absent).",
            None,
            Named("Done"),
            q::<FenceQuery>(),
        ),
        "resolve_park" => d(
            "Answers the park on a checkpoint, exactly once: a second answer is 409 `conflict` carrying the first (`firstAnswer`, `resolvedAt`).",
            Some("ResolveBody"),
            Named("CheckpointBody"),
            parent(),
        ),
        "prune_checkpoints" => d(
            "Deletes all but the newest `keepLast` checkpoints (never an unanswered park).",
            Some("PruneBody"),
            Named("Pruned"),
            parent(),
        ),
        "read_events" => d(
            "The transcript after `sinceSeq`.",
            None,
            Named("EventBatchBody"),
            q::<ReadQuery>(),
        ),
        "append_events" => d(
            "Appends events; the store numbers them.",
            Some("AppendEventsBody"),
            Named("Appended"),
            parent(),
        ),
        "tail_events" => d(
            "The live tail as Server-Sent Events: `event: event`, `id:` the seq, `data:` an EventBody; resumes after `Last-Event-ID`.",
            None,
            Events,
            q::<StreamQuery>(),
        ),
        "wait_events" => d(
            "Long-poll: answers when the log's last seq is above `sinceSeq`.",
            None,
            Named("Waited"),
            q::<WaitEventsQuery>(),
        ),
        "read_run_record" => d("The run record.", None, Named("MaybeRecord"), parent()),
        "write_run_record" => d(
            "Replaces the run record.",
            Some("RecordBody"),
            Named("Done"),
            parent(),
        ),
        "read_messages" => d("The message snapshot.", None, Named("MessagesBody"), parent()),
        "write_messages" => d(
            "Publishes the message history with the event head it follows.",
            Some("WriteMessagesBody"),
            Named("Done"),
            parent(),
        ),
        "read_report" => d("The final report.", None, Named("MaybeReport"), parent()),
        "write_report" => d(
            "Stores the final report.",
            Some("ReportBody"),
            Named("Done"),
            parent(),
        ),
        "read_audit" => d(
            "The audit trail after `sinceSeq`.",
            None,
            Named("AuditList"),
            q::<AuditQuery>(),
        ),
        "append_audit" => d(
            "Appends to the audit trail.",
            Some("AppendAuditBody"),
            Named("AuditList"),
            parent(),
        ),
        other => panic!("route {other} has no OpenAPI documentation: add it to openapi::doc"),
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
    let names: Vec<String> = kinds.iter().map(|k| format!("`{}`", k.uri())).collect();
    ResponseBuilder::new()
        .description(format!("A problem detail: {}.", names.join(", ")))
        .content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

fn operation(spec: &RouteSpec) -> utoipa::openapi::path::Operation {
    let d = doc(spec.operation);
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
        .response("401", problem_response(&[Unauthorized]));
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
        op = op
            .response("413", problem_response(&[PayloadTooLarge]))
            .response("415", problem_response(&[UnsupportedMediaType]));
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

/// The API's OpenAPI 3.1 document.
pub fn document() -> OpenApi {
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

/// The document as the committed file holds it: pretty JSON, one trailing
/// newline.
pub fn json() -> String {
    let mut s = document()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    s.push('\n');
    s
}
