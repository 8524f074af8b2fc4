//! The edges of the connection loop over raw TCP (what reqwest cannot
//! send): pipelined requests, over-long targets and heads, conflicting
//! `Content-Length`s, methods no route takes. Every refusal is RFC 9457
//! problem details, including the ones hyper makes before any service runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runkeep::{MemoryStore, RunStore, TenantId};
use runkeep_server::auth::{Role, StaticTokens};
use runkeep_server::metrics::Metrics;
use runkeep_server::problem::Problem;
use runkeep_server::server::{app, Server, ServerConfig, MAX_HEAD_BYTES, MAX_URI_BYTES};
use runkeep_server::state::AppState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// How long any exchange may take before it counts as hung.
const BOUND: Duration = Duration::from_secs(10);

const TOKEN: &str = "edges-reader";

/// The real app (`server::app`) on the real connection loop.
async fn start() -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let state = AppState {
        store: Arc::new(MemoryStore::new()) as Arc<dyn RunStore>,
        auth: Arc::new(StaticTokens::new().with(
            TOKEN,
            TenantId::new("default").unwrap(),
            Role::Reader,
        )),
        metrics: Arc::new(Metrics::new()),
    };
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let router = app(state, &config);
    let server = Server::bind_router(config, router, CancellationToken::new())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// One parsed response.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The head, header names lower-cased.
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// Asserts a problem-details answer of `status` and returns it.
    fn problem(&self, status: u16) -> Problem {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "not problem details: {self:?}"
        );
        let p: Problem = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not a problem body ({e}): {self:?}"));
        assert_eq!(p.status, status, "{p:?}");
        p
    }
}

/// Writes `request` (any number of requests, in one write) and reads until
/// the server closes the connection; every response in order.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<Answer> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A refusal may close the connection before all of a large request is
    // taken: what matters is the answer.
    let _ = s.write_all(request).await;
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(BOUND, async {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server did not close the connection");
    parse_answers(&bytes)
}

fn parse_answers(mut bytes: &[u8]) -> Vec<Answer> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no head end in {:?}", String::from_utf8_lossy(bytes)))
            + 4;
        let head = String::from_utf8(bytes[..end].to_vec()).unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no content-length in {head:?}"));
        let body = String::from_utf8_lossy(&bytes[end..end + len]).into_owned();
        bytes = &bytes[end + len..];
        out.push(Answer { status, head, body });
    }
    out
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n")
}

#[tokio::test]
async fn pipelined_requests_in_one_write_are_all_answered_in_order() {
    let (addr, _stop) = start().await;
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let three = [
        get("/healthz", ""),
        get("/v1/clock", &auth),
        get("/openapi.json", "Connection: close\r\n"),
    ]
    .concat();
    let answers = exchange(addr, three.as_bytes()).await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0].status, 200);
    assert_eq!(answers[0].body, r#"{"status":"ok"}"#);
    assert_eq!(answers[1].status, 200);
    assert!(
        answers[1].body.starts_with(r#"{"now":"#),
        "{:?}",
        answers[1]
    );
    assert_eq!(answers[2].status, 200);
    assert!(answers[2].body.contains("\"openapi\""), "{:?}", answers[2]);

    // Many more than hyper takes in one turn of its loop (16).
    let mut many = String::new();
    for i in 0..60 {
        many.push_str(&if i % 2 == 0 {
            get("/healthz", "")
        } else {
            get("/v1/clock", &auth)
        });
    }
    many.push_str(&get("/healthz", "Connection: close\r\n"));
    let answers = exchange(addr, many.as_bytes()).await;
    assert_eq!(answers.len(), 61);
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.status, 200, "answer {i}: {a:?}");
        let clock = a.body.starts_with(r#"{"now":"#);
        assert_eq!(
            clock,
            i % 2 == 1 && i < 60,
            "answer {i} out of order: {a:?}"
        );
    }
}

#[tokio::test]
async fn a_request_target_over_the_limit_is_414_problem_details() {
    let (addr, _stop) = start().await;
    let long = format!("/v1/{}", "a".repeat(MAX_URI_BYTES));
    let answers = exchange(addr, get(&long, "Connection: close\r\n").as_bytes()).await;
    assert_eq!(answers.len(), 1);
    let p = answers[0].problem(414);
    assert!(p.detail.as_deref().unwrap().contains("request target"));
    assert!(
        answers[0].body.len() < 1024,
        "the target is not echoed: {} bytes",
        answers[0].body.len()
    );
    // Just under the limit: routed as usual (no such route).
    let fits = format!("/v1/{}", "a".repeat(MAX_URI_BYTES - 10));
    let answers = exchange(addr, get(&fits, "Connection: close\r\n").as_bytes()).await;
    answers[0].problem(404);
    // Longer than a whole head may be: refused by hyper, still a problem.
    let huge = format!("/v1/{}", "a".repeat(MAX_HEAD_BYTES + 10));
    let answers = exchange(addr, get(&huge, "Connection: close\r\n").as_bytes()).await;
    assert_eq!(answers.len(), 1);
    answers[0].problem(431);
}

#[tokio::test]
async fn a_request_head_over_the_limit_is_431_problem_details() {
    let (addr, _stop) = start().await;
    let big = format!(
        "X-Big: {}\r\nConnection: close\r\n",
        "b".repeat(MAX_HEAD_BYTES)
    );
    let answers = exchange(addr, get("/healthz", &big).as_bytes()).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let p = answers[0].problem(431);
    assert!(p.detail.as_deref().unwrap().contains("request head"));
    assert_eq!(answers[0].header("connection"), Some("close"));
    assert!(answers[0].header("date").is_some(), "{:?}", answers[0]);

    let many: String = (0..150).map(|i| format!("X-{i}: 1\r\n")).collect();
    let answers = exchange(
        addr,
        get("/healthz", &format!("{many}Connection: close\r\n")).as_bytes(),
    )
    .await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    answers[0].problem(431);
}

#[tokio::test]
async fn conflicting_content_lengths_and_malformed_heads_are_400_problem_details() {
    let (addr, _stop) = start().await;
    let twice = "POST /v1/clock HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}";
    let answers = exchange(addr, twice.as_bytes()).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    let p = answers[0].problem(400);
    assert!(p.detail.as_deref().unwrap().contains("Content-Length"));

    for bad in [
        "G@T /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n",
        "POST /v1/clock HTTP/1.1\r\nHost: t\r\nContent-Length: nope\r\n\r\n",
    ] {
        let answers = exchange(addr, bad.as_bytes()).await;
        assert_eq!(answers.len(), 1, "{bad:?}: {answers:?}");
        answers[0].problem(400);
    }
}

#[tokio::test]
async fn trace_connect_and_other_unknown_methods_are_405_problem_details() {
    let (addr, _stop) = start().await;
    for request in [
        "TRACE /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "TRACE /v1/clock HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nConnection: close\r\n\r\n",
        "PROPFIND /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    ] {
        let answers = exchange(addr, request.as_bytes()).await;
        assert_eq!(answers.len(), 1, "{request:?}: {answers:?}");
        answers[0].problem(405);
        let allow = answers[0].header("allow").unwrap_or_default();
        assert!(allow.contains("GET"), "{request:?}: {:?}", answers[0]);
        assert!(!allow.contains("TRACE"), "{allow}");
    }
    // A route of the open routes without that method: a problem too, with
    // the route's own Allow.
    let answers = exchange(
        addr,
        b"POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    let p = answers[0].problem(405);
    assert_eq!(p.instance.as_deref(), Some("/healthz"));
    assert_eq!(answers[0].header("allow"), Some("GET,HEAD"));
}

#[tokio::test]
async fn a_refusal_pipelined_behind_good_requests_comes_after_their_answers() {
    let (addr, _stop) = start().await;
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let mut requests = [get("/healthz", ""), get("/v1/clock", &auth)].concat();
    requests.push_str(
        "POST /v1/clock HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    );
    let answers = exchange(addr, requests.as_bytes()).await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0].body, r#"{"status":"ok"}"#);
    assert!(
        answers[1].body.starts_with(r#"{"now":"#),
        "{:?}",
        answers[1]
    );
    answers[2].problem(400);

    // The answers of the service are never touched, whatever their status.
    let requests = [
        get("/nowhere", ""),
        get("/v1/clock", ""),
        get("/healthz", "Connection: close\r\n"),
    ]
    .concat();
    let answers = exchange(addr, requests.as_bytes()).await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    answers[0].problem(404);
    answers[1].problem(401);
    assert_eq!(answers[2].body, r#"{"status":"ok"}"#);
}
