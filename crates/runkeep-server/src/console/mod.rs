//! The web console: the page `runkeep serve` answers at `/`.
//!
//! A handful of hand-written files (`crates/runkeep-server/console/`:
//! `index.html`, ES modules, one stylesheet) embedded in the binary with
//! `include_str!`: nothing is built on the user's machine, nothing is
//! fetched from anywhere but this server, so the console works on a
//! machine with no internet.
//!
//! Loading the console needs no token: the page asks for one, keeps it in
//! `sessionStorage` (never in the URL) and sends it as
//! `Authorization: Bearer …` on every `/v1` call it makes; what it offers
//! follows the token's role (`/v1/whoami`). It is a client of the public
//! API and nothing else: every rule (fences, roles, the park's exactly-once
//! answer) is the server's.
//!
//! # Answers
//!
//! - `GET /` (and `/index.html`): the page, `text/html`.
//! - `GET /console/{file}`: [`ASSETS`], with their content type.
//! - Every answer carries a strict Content-Security-Policy ([`CSP`]: only
//!   this origin's scripts, styles and API; no inline script; no frames),
//!   `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`,
//!   and an `ETag` with `Cache-Control: no-cache`: a browser revalidates
//!   each load (a 304 when the binary did not change), so an upgraded
//!   server never runs with a stale script.
//!
//! The demo data `runkeep serve --demo` serves is not here: it is the
//! `runkeep-demo` crate (the CLI seeds it; this library ships none).

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use crate::problem::{Problem, ProblemType};

/// The Content-Security-Policy of every console answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// One embedded file.
#[derive(Debug)]
pub struct Asset {
    /// Its name under `/console/` (`index.html` is served at `/`).
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_str!(concat!("../../console/", $name)),
        }
    };
}

/// Every file of the console, embedded at build time.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("sse.js", "text/javascript; charset=utf-8"),
    asset!("backoff.js", "text/javascript; charset=utf-8"),
    asset!("sse-parser.js", "text/javascript; charset=utf-8"),
    asset!("views.js", "text/javascript; charset=utf-8"),
];

/// The console's routes: `/`, `/index.html` and `/console/{file}`. They
/// need no token (the page asks for one); merge them into the app.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/console/{file}", get(file))
}

fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.body.as_bytes());
                format!("\"{}\"", hex::encode(&digest[..12]))
            })
            .collect()
    })
}

fn serve(index: usize, headers: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    let etag = &etags()[index];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut res = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.body,
        )
            .into_response()
    };
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    res
}

async fn index(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().position(|a| a.name == name) {
        Some(i) => serve(i, &headers),
        None => Problem::new(ProblemType::NotFound, "no such console file")
            .with_instance(format!("/console/{name}"))
            .into_response(),
    }
}
