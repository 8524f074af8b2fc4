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
use utoipa::openapi::schema::{SchemaType, Type};
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

/// The document as the table and the wire types' derives generate it.
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
    let rules = crate::wire::object_rules();
    for (name, mut schema) in schemas {
        if let Some((_, keyword, value)) = rules.iter().find(|(n, ..)| *n == name) {
            if let RefOr::T(Schema::Object(object)) = &mut schema {
                let extensions = object.extensions.get_or_insert_with(Default::default);
                extensions.insert(keyword.to_string(), value.clone());
            }
        }
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

/// The API's OpenAPI 3.1 document as JSON.
pub fn document() -> Value {
    serde_json::to_value(generated()).expect("the OpenAPI document serializes")
}

/// The document as the committed file holds it: pretty JSON, one trailing
/// newline.
pub fn json() -> String {
    let mut s = serde_json::to_string_pretty(&document()).expect("the OpenAPI document serializes");
    s.push('\n');
    s
}

// ---------------------------------------------------------------------------
// Schemas the wire types' attributes name (`schema_with`).
//
// The rules that make a value acceptable live in the core's constructors
// (`runkeep::id`, `Timestamp`, `Fence`, `Ttl`, …). The wire types state
// them on their fields (`#[schema(…)]`, `#[param(…)]`, `schema_with`), so a
// request the document calls valid is one the server accepts (schemathesis'
// `positive_data_acceptance` holds the two together:
// `scripts/schemathesis.sh`); `tests/openapi.rs` checks every bound and id
// rule of the document against the constants it comes from. Where the
// server's rule cannot be written in JSON Schema exactly (a byte length, a
// state-dependent check) the document states a slightly stricter rule that
// implies it.

/// The id rule of `runkeep::id` as a pattern: 1 to 128 bytes of
/// `[A-Za-z0-9_-]`, starting with a letter or digit.
pub fn id_pattern() -> String {
    format!(
        "^[A-Za-z0-9][A-Za-z0-9_-]{{0,{}}}$",
        runkeep::id::MAX_ID_LEN - 1
    )
}

/// A string that is an id (`runkeep::id`).
pub fn id_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(id_pattern()))
        .min_length(Some(1))
        .max_length(Some(runkeep::id::MAX_ID_LEN))
        .build()
        .into()
}

/// An object whose keys are none of `keys` (`propertyNames`), described.
pub fn object_refusing_keys(description: &str, keys: &[&str]) -> Schema {
    let refused = with_keyword(
        ObjectBuilder::new().schema_type(SchemaType::AnyValue),
        "not",
        json!({ "enum": keys }),
    );
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description))
        .property_names(Some(refused))
        .build()
        .into()
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
