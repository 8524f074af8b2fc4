//! The API's extractors: every rejection is a problem detail, never axum's
//! plain-text answer.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use runkeep::{CheckpointId, ProjectId, RunId, RunScope, SessionId, TenantId};
use serde::de::DeserializeOwned;

use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

/// A JSON body (`application/json`), parsed with the path of the field at
/// fault in the problem (`malformed-body`, `field`: `step.events[0].type`).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Send + 'static, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let charge = req.extensions().get::<super::budget::Charge>().cloned();
        let json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| {
                let v = v.trim().to_ascii_lowercase();
                v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
            })
            .unwrap_or(false);
        if !json {
            return Err(Problem::new(
                ProblemType::UnsupportedMediaType,
                "send the body as JSON with `Content-Type: application/json`",
            ));
        }
        let bytes = match &charge {
            // Charged as the bytes arrive, against the caller's shares.
            Some(charge) => {
                let declared = req
                    .headers()
                    .get(axum::http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok());
                charge.read_body(declared, req.into_body()).await?
            }
            None => Bytes::from_request(req, state).await.map_err(|e| {
                if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    Problem::new(
                        ProblemType::PayloadTooLarge,
                        "the body is larger than this server accepts; nothing was changed",
                    )
                } else {
                    Problem::new(ProblemType::MalformedBody, "the body could not be read")
                }
            })?,
        };
        let values = scan_json(&bytes)?;
        if let Some(charge) = charge {
            charge.parsing(bytes.len(), values).await?;
        }
        if bytes.len() <= INLINE_PARSE_BYTES {
            return parse_scanned(&bytes).map(JsonBody);
        }
        // A large body is scanned and parsed on the blocking pool: parsing
        // megabytes on an async worker thread stalls every request that
        // thread serves (`/healthz` included).
        tokio::task::spawn_blocking(move || parse_scanned(&bytes))
            .await
            .map_err(|_| Problem::new(ProblemType::MalformedBody, "the body could not be parsed"))?
            .map(JsonBody)
    }
}

/// Bodies up to this many bytes are parsed on the async thread.
pub const INLINE_PARSE_BYTES: usize = 64 * 1024;

/// The most JSON values (scalars, arrays and objects; an object member
/// counts once) a request body may hold: the checkpoint limit
/// ([`runkeep::checkpoint::MAX_CHECKPOINT_VALUES`]) plus room for its
/// envelope.
pub const MAX_BODY_VALUES: usize = runkeep::checkpoint::MAX_CHECKPOINT_VALUES + 4096;

/// The deepest nesting of arrays and objects a request body may have.
pub const MAX_BODY_DEPTH: usize = 100;

/// Counts a body's values (the count is returned) and nesting in one pass
/// over its bytes, keeping nothing, and refuses it before it is parsed when either is over its
/// limit: what a parsed body costs in memory grows with its values (32
/// bytes or more each), not with its bytes (`[0,0,…]` is 2 bytes a value).
/// Invalid JSON passes (the parser then names the error).
pub fn scan_json(bytes: &[u8]) -> Result<usize, Problem> {
    let mut values: usize = 1;
    let mut depth: usize = 0;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                values += 1;
                depth += 1;
                if depth > MAX_BODY_DEPTH {
                    return Err(Problem::new(
                        ProblemType::PayloadTooLarge,
                        format!(
                            "the body nests arrays and objects more than {MAX_BODY_DEPTH} deep; nothing was changed"
                        ),
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' => {
                values += 1;
                if values > MAX_BODY_VALUES {
                    return Err(Problem::new(
                        ProblemType::PayloadTooLarge,
                        format!(
                            "the body holds more than {MAX_BODY_VALUES} JSON values; nothing was changed. Store large arrays of numbers as one string (e.g. base64) or elsewhere, referenced from the state"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(values)
}

/// Parses `bytes` as `T`, naming the field at fault; refuses a body over
/// the value or depth limits ([`scan_json`]) before parsing it.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    scan_json(bytes)?;
    parse_scanned(bytes)
}

/// [`parse_json`] of a body [`scan_json`] has already passed.
fn parse_scanned<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // An unknown field is named with its own path (`step.fense`): a
        // misspelled field must not pass as absent.
        let field = match unknown_field(&inner.to_string()) {
            Some(name) if path == "." => name.to_string(),
            Some(name) if path != name && !path.ends_with(&format!(".{name}")) => {
                format!("{path}.{name}")
            }
            _ => path,
        };
        let detail = if inner.is_syntax() || inner.is_eof() {
            format!("the body is not valid JSON: {inner}")
        } else {
            format!("the body is not what this route takes: {inner}")
        };
        let p = Problem::new(
            ProblemType::MalformedBody,
            crate::problem::redact_paths(&detail),
        );
        if field == "." || inner.is_syntax() || inner.is_eof() {
            p
        } else {
            p.with_field(field)
        }
    })?;
    de.end().map_err(|e| {
        Problem::new(
            ProblemType::MalformedBody,
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    Ok(value)
}

/// The name in serde's "unknown field `name`, expected …".
fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.find('`').map(|end| &rest[..end])
}

/// A query string, parsed into `T`; a bad parameter is `invalid-input`
/// naming it.
#[derive(Debug)]
pub struct Q<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Q<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Q(v)),
            Err(e) => {
                let text = e.body_text();
                let detail = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text)
                    .to_string();
                // A required parameter left out is named too.
                let missing = detail
                    .strip_prefix("missing field `")
                    .and_then(|rest| rest.split_once('`'))
                    .map(|(f, _)| f.to_string());
                let field = missing.unwrap_or_else(|| {
                    detail
                        .split_once(':')
                        .map(|(f, _)| f.trim().to_string())
                        .filter(|f| !f.is_empty() && !f.contains(' '))
                        .unwrap_or_else(|| "query".into())
                });
                Err(Problem::invalid(
                    field,
                    format!("bad query parameter: {detail}"),
                ))
            }
        }
    }
}

/// The largest event seq a request may name (`sinceSeq`, `Last-Event-ID`):
/// 2^53 − 1, the largest integer every JSON client reads exactly, as the
/// OpenAPI document states. Every seq a store issues is far below it.
pub const MAX_SEQ: u64 = (1 << 53) - 1;

/// A seq the request names as `field` (absent: 0), refused above
/// [`MAX_SEQ`] with a 400 naming the field and the maximum.
pub fn seq_param(field: &str, value: Option<u64>) -> Result<u64, Problem> {
    match value {
        Some(v) if v > MAX_SEQ => Err(Problem::invalid(
            field,
            format!("{field} {v} is above the largest seq this API takes, {MAX_SEQ} (2^53 - 1)"),
        )),
        v => Ok(v.unwrap_or(0)),
    }
}

/// Validates one path parameter (or the `parent` query parameter) by its
/// name with the core's id types.
pub fn check_param(name: &str, value: &str) -> Result<(), Problem> {
    let r = match name {
        "tenant" => TenantId::new(value).map(drop),
        "project" => ProjectId::new(value).map(drop),
        "session" => SessionId::new(value).map(drop),
        "run" | "parent" => RunId::new(value).map(drop),
        "checkpoint" => CheckpointId::new(value).map(drop),
        _ => Ok(()),
    };
    r.map_err(|e| Problem::from(e).with_field(name))
}

/// The `parent` query parameter of a per-run route, validated.
pub fn parent_of(query: Option<&str>) -> Result<Option<RunId>, Problem> {
    let Some(q) = query else { return Ok(None) };
    for pair in q.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "parent" {
            let v = percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .map_err(|_| {
                    Problem::invalid("parent", "parent is not valid percent-encoded UTF-8")
                })?;
            return RunId::new(v)
                .map(Some)
                .map_err(|e| Problem::from(e).with_field("parent"));
        }
    }
    Ok(None)
}

/// The run a per-run route addresses: its path ids and `?parent=`,
/// validated (the auth layer has checked them already; this builds the
/// scope).
#[derive(Debug, Clone)]
pub struct RunAddr(pub RunScope);

impl FromRequestParts<AppState> for RunAddr {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| Problem::invalid("path", "the path could not be read"))?;
        let get = |n: &str| {
            params
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
                .ok_or_else(|| Problem::invalid(n, format!("the path has no {n}")))
        };
        let f = |n: &'static str| move |e| Problem::from(e).with_field(n);
        let mut scope = RunScope::new(
            TenantId::new(get("tenant")?).map_err(f("tenant"))?,
            ProjectId::new(get("project")?).map_err(f("project"))?,
            SessionId::new(get("session")?).map_err(f("session"))?,
            RunId::new(get("run")?).map_err(f("run"))?,
        );
        if let Some(p) = parent_of(parts.uri.query())? {
            scope = scope.with_parent(p);
        }
        Ok(RunAddr(scope))
    }
}

/// The checkpoint id in the path.
#[derive(Debug, Clone)]
pub struct CheckpointParam(pub CheckpointId);

impl FromRequestParts<AppState> for CheckpointParam {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        path_id(parts, state, "checkpoint", CheckpointId::new)
            .await
            .map(CheckpointParam)
    }
}

/// The tenant in the path.
#[derive(Debug, Clone)]
pub struct TenantParam(pub TenantId);

impl FromRequestParts<AppState> for TenantParam {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        path_id(parts, state, "tenant", TenantId::new)
            .await
            .map(TenantParam)
    }
}

/// The session a session route addresses (its path's tenant, project and
/// session, validated).
#[derive(Debug, Clone)]
pub struct SessionAddr(pub runkeep::ListingScope);

impl FromRequestParts<AppState> for SessionAddr {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let tenant = path_id(parts, state, "tenant", TenantId::new).await?;
        let project = path_id(parts, state, "project", ProjectId::new).await?;
        let session = path_id(parts, state, "session", SessionId::new).await?;
        Ok(SessionAddr(runkeep::ListingScope::session(
            tenant, project, session,
        )))
    }
}

/// The path parameter `name`, validated by `parse` (an id type's `new`); a
/// refusal is a 400 naming the parameter.
pub(super) async fn path_id<T>(
    parts: &mut Parts,
    state: &AppState,
    name: &'static str,
    parse: fn(String) -> runkeep::Result<T>,
) -> Result<T, Problem> {
    let params = RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(|_| Problem::invalid("path", "the path could not be read"))?;
    let v = params
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
        .ok_or_else(|| Problem::invalid(name, format!("the path has no {name}")))?;
    parse(v).map_err(|e| Problem::from(e).with_field(name))
}
