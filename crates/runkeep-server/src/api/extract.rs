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

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
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
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                Problem::new(
                    ProblemType::PayloadTooLarge,
                    "the body is larger than this server accepts; nothing was changed",
                )
            } else {
                Problem::new(ProblemType::MalformedBody, "the body could not be read")
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses `bytes` as `T`, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
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
                let field = detail
                    .split_once(':')
                    .map(|(f, _)| f.trim().to_string())
                    .filter(|f| !f.is_empty() && !f.contains(' '))
                    .unwrap_or_else(|| "query".into());
                Err(Problem::invalid(
                    field,
                    format!("bad query parameter: {detail}"),
                ))
            }
        }
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

/// The path parameter `name`, validated by `parse` (an id type's `new`); a
/// refusal is a 400 naming the parameter.
async fn path_id<T>(
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
