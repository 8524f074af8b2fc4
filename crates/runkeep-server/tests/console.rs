//! The web console is served by the app: the page at `/` without a token,
//! every file it loads with its content type and cache validators, a strict
//! CSP, nothing fetched from anywhere else; the API is not shadowed. (The
//! demo data `runkeep serve --demo` serves is tested in `runkeep-demo`.)
//! (The browser tests in `console/tests/` drive the page itself.)

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use runkeep::{MemoryStore, RunStore};
use runkeep_server::auth::StaticTokens;
use runkeep_server::console::{self, ASSETS, CSP};
use runkeep_server::metrics::Metrics;
use runkeep_server::server::{app, ServerConfig};
use runkeep_server::state::AppState;
use tower::ServiceExt;

fn the_app() -> Router {
    let state = AppState {
        store: Arc::new(MemoryStore::new()) as Arc<dyn RunStore>,
        auth: Arc::new(StaticTokens::new()),
        metrics: Arc::new(Metrics::new()),
    };
    app(state, &ServerConfig::default())
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn get(app: &Router, path: &str, if_none_match: Option<&str>) -> Answer {
    let mut req = Request::get(path);
    if let Some(tag) = if_none_match {
        req = req.header(header::IF_NONE_MATCH, tag);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

fn header_of(a: &Answer, name: header::HeaderName) -> &str {
    a.headers
        .get(&name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn the_page_is_served_at_the_root_without_a_token_under_a_strict_csp() {
    let app = the_app();
    for path in ["/", "/index.html"] {
        let a = get(&app, path, None).await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        assert_eq!(
            header_of(&a, header::CONTENT_TYPE),
            "text/html; charset=utf-8"
        );
        assert!(a
            .body
            .contains(r#"<script type="module" src="/console/app.js"></script>"#));
        let csp = header_of(&a, header::CONTENT_SECURITY_POLICY);
        assert_eq!(csp, CSP);
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "CSP lacks {directive}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
        assert_eq!(header_of(&a, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(header_of(&a, header::CACHE_CONTROL), "no-cache");
    }
}

/// The `/console/…` files a console file refers to: `src=`/`href=` in the
/// page, `import … from './x.js'` (and `import './x.js'`, `import('./x.js')`)
/// in the modules.
fn referenced(asset: &console::Asset) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let body = asset.body;
    for marker in ["src=\"", "href=\""] {
        for (i, _) in body.match_indices(marker) {
            let rest = &body[i + marker.len()..];
            let end = rest.find('"').unwrap();
            let target = &rest[..end];
            if let Some(name) = target.strip_prefix("/console/") {
                out.insert(name.to_string());
            }
        }
    }
    for marker in ["from './", "import './", "import('./"] {
        for (i, _) in body.match_indices(marker) {
            let rest = &body[i + marker.len()..];
            out.insert(rest[..rest.find('\'').unwrap()].to_string());
        }
    }
    out
}

#[tokio::test]
async fn every_file_the_console_loads_is_served_with_its_content_type_and_revalidates() {
    let app = the_app();
    let mut wanted = BTreeSet::new();
    for asset in ASSETS {
        wanted.extend(referenced(asset));
    }
    assert!(
        wanted.contains("app.js") && wanted.contains("style.css") && wanted.contains("sse.js"),
        "{wanted:?}"
    );
    for name in &wanted {
        let a = get(&app, &format!("/console/{name}"), None).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "{name} is referenced but not served"
        );
        let expected = if name.ends_with(".js") {
            "text/javascript; charset=utf-8"
        } else if name.ends_with(".css") {
            "text/css; charset=utf-8"
        } else {
            panic!("unexpected console file {name}")
        };
        assert_eq!(header_of(&a, header::CONTENT_TYPE), expected, "{name}");
        let tag = header_of(&a, header::ETAG).to_string();
        let again = get(&app, &format!("/console/{name}"), Some(&tag)).await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{name}");
        assert!(again.body.is_empty());
        let stale = get(&app, &format!("/console/{name}"), Some("\"other\"")).await;
        assert_eq!(stale.status, StatusCode::OK);
    }
    // Every embedded file is loaded by the console (no dead file).
    let embedded: BTreeSet<String> = ASSETS
        .iter()
        .filter(|a| a.name != "index.html")
        .map(|a| a.name.to_string())
        .collect();
    assert_eq!(embedded, wanted);
}

#[tokio::test]
async fn no_console_file_names_another_origin() {
    for asset in ASSETS {
        for bad in [
            "http://",
            "https://",
            "url(//",
            "src=\"//",
            "href=\"//",
            "@import",
        ] {
            assert!(
                !asset.body.contains(bad),
                "{} names another origin ({bad}): the console must work with no internet",
                asset.name
            );
        }
        // No inline script or style for the CSP to refuse.
        assert!(!asset.body.contains("<script>"), "{}", asset.name);
        assert!(!asset.body.contains("style=\""), "{}", asset.name);
        // The token never goes in a URL.
        assert!(!asset.body.contains("?token="), "{}", asset.name);
    }
}

#[tokio::test]
async fn the_api_and_its_problems_are_not_shadowed_by_the_console() {
    let app = the_app();
    let a = get(&app, "/console/nope.js", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.body.contains("urn:runkeep:problem:not-found"));
    let a = get(&app, "/no-such-route", None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert!(a.body.contains("urn:runkeep:problem:not-found"));
    let a = get(&app, "/v1/whoami", None).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert!(a.body.contains("urn:runkeep:problem:unauthorized"));
    let a = get(&app, "/healthz", None).await;
    assert_eq!(a.status, StatusCode::OK);
}
