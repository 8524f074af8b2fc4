//! The server's manners over real sockets: body limit, slow clients,
//! request timeout, concurrency limit, graceful shutdown, tracing, metrics,
//! readiness.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use runkeep::{MemoryStore, RunStore};
use runkeep_server::auth::StaticTokens;
use runkeep_server::manners::{self, Limits};
use runkeep_server::metrics::Metrics;
use runkeep_server::server::{app, Server, ServerConfig};
use runkeep_server::state::AppState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

/// How long any step of a test may take before it counts as hung.
const BOUND: Duration = Duration::from_secs(10);

/// Handlers that wait until the test opens the gate.
#[derive(Clone)]
struct Gate {
    entered: Arc<AtomicUsize>,
    open: watch::Receiver<bool>,
}

async fn echo(body: Bytes) -> String {
    format!("{} bytes", body.len())
}

async fn gated(State(gate): State<Gate>) -> &'static str {
    gate.entered.fetch_add(1, Ordering::SeqCst);
    let mut open = gate.open.clone();
    let _ = open.wait_for(|o| *o).await;
    "done"
}

async fn stall(_body: Bytes) -> &'static str {
    std::future::pending::<()>().await;
    "never"
}

async fn stream() -> Response {
    let first = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(Bytes::from_static(b"id: 1\ndata: one\n\n"))
    });
    let body = futures_util::StreamExt::chain(first, futures_util::stream::pending());
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(body),
    )
        .into_response()
}

async fn endless() -> Response {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let body = futures_util::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
    Body::from_stream(body).into_response()
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
    open_gate: watch::Sender<bool>,
    entered: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Running {
    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        body_limit: 1024,
        request_timeout: Duration::from_secs(5),
        header_read_timeout: Duration::from_secs(5),
        concurrency_limit: 64,
        shutdown_grace: Duration::from_secs(30),
        ..ServerConfig::default()
    }
}

/// The test routes composed as `server::app` composes the API: admission
/// on the routes that do work, `/healthz` outside it,
/// event streams ended on shutdown, then the manners.
async fn start(config: ServerConfig) -> Running {
    let (open_gate, open) = watch::channel(false);
    let entered = Arc::new(AtomicUsize::new(0));
    let gate = Gate {
        entered: entered.clone(),
        open,
    };
    let metrics = Arc::new(Metrics::new());
    let working = Router::new()
        .route("/echo", post(echo))
        .route("/gate", get(gated).post(gated))
        .route("/stall", get(stall).post(stall))
        .route("/stream", get(stream))
        .route("/endless", get(endless))
        .with_state(gate);
    // No tokens: every request counts against the anonymous tenant.
    let working = manners::admission(
        working,
        config.admission(),
        Arc::new(StaticTokens::new()),
        metrics.clone(),
    );
    let open_routes = Router::new().route("/healthz", get(|| async { "ok" }));
    let streams = CancellationToken::new();
    let router = manners::end_streams_on(working.merge(open_routes), streams.clone());
    let limits = Limits {
        body_limit: config.body_limit,
        request_timeout: config.request_timeout,
    };
    let router = manners::apply(router, limits, metrics.clone());
    let server = Server::bind_router(config, router, streams).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel();
    let done = tokio::spawn(async move {
        server
            .run(async {
                let _ = stopped.await;
            })
            .await
            .map(|_| ())
    });
    Running {
        addr,
        stop: Some(stop),
        done,
        open_gate,
        entered,
        metrics,
    }
}

/// A response as text: status code and everything after the status line.
struct Answer {
    status: u16,
    text: String,
}

/// Reads one response (the connection is closed by the server after it:
/// requests say `Connection: close`).
async fn read_answer(stream: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    tokio::time::timeout(BOUND, stream.read_to_end(&mut buf))
        .await
        .expect("the server answered within the bound")
        .expect("read the answer");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Answer { status, text }
}

async fn send(addr: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    read_answer(&mut s).await
}

fn get_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").into_bytes()
}

fn post_request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn assert_problem(answer: &Answer, status: u16, slug: &str) {
    assert_eq!(answer.status, status, "{}", answer.text);
    assert!(
        answer
            .text
            .to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "not problem details: {}",
        answer.text
    );
    assert!(
        answer.text.contains(&format!("problem:{slug}\"")),
        "type is not {slug}: {}",
        answer.text
    );
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413_problem_details_whether_announced_or_chunked() {
    let r = start(config()).await;
    let ok = send(r.addr, &post_request("/echo", &[b'x'; 1000])).await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert!(ok.text.ends_with("1000 bytes"));

    let announced = send(r.addr, &post_request("/echo", &[b'x'; 4096])).await;
    assert_problem(&announced, 413, "payload-too-large");

    // Chunked: no Content-Length to refuse up front; refused when the
    // body passes the limit.
    let mut chunked = b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        chunked.extend_from_slice(b"400\r\n");
        chunked.extend_from_slice(&[b'y'; 0x400]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let streamed = send(r.addr, &chunked).await;
    assert_problem(&streamed, 413, "payload-too-large");
    let text = r.metrics.render();
    assert!(
        text.contains("runkeep_http_rejected_total{reason=\"body_too_large\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_client_that_trickles_its_request_head_is_disconnected_or_closed() {
    let r = start(ServerConfig {
        header_read_timeout: Duration::from_millis(500),
        ..config()
    })
    .await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        .await
        .unwrap();
    // One header line every 200 ms: 50 of them would take 10 s.
    let mut cut_off_after = None;
    for i in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if s.write_all(format!("X-Slow-{i}: y\r\n").as_bytes())
            .await
            .is_err()
        {
            cut_off_after = Some(i);
            break;
        }
        // A closed connection shows as EOF to a reader before a writer
        // notices.
        let mut probe = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut probe)).await
        {
            cut_off_after = Some(i);
            break;
        }
    }
    let i = cut_off_after.expect("the server kept a trickling client for 10 s");
    assert!(i < 20, "cut off only after {i} lines");
}

#[tokio::test]
async fn a_connection_that_says_nothing_is_disconnected_or_closed() {
    let r = start(ServerConfig {
        header_read_timeout: Duration::from_millis(300),
        ..config()
    })
    .await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(BOUND, s.read(&mut buf))
        .await
        .expect("a silent connection was kept open")
        .unwrap_or(0);
    assert_eq!(n, 0, "the server closes without an answer");

    // And an idle kept-alive connection after one answer.
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut all))
        .await
        .expect("an idle kept-alive connection was kept open")
        .unwrap();
    assert!(String::from_utf8_lossy(&all).starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_body_that_never_arrives_gets_408_and_a_store_that_never_answers_503() {
    let r = start(ServerConfig {
        request_timeout: Duration::from_millis(500),
        ..config()
    })
    .await;
    // Announces 100 bytes, sends 10, stalls.
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let slow_body = read_answer(&mut s).await;
    assert_problem(&slow_body, 408, "timeout");

    // The body arrived; the handler (the store) did not answer: a write's
    // outcome is unknown, a read's is just unavailable.
    let write = send(r.addr, &post_request("/stall", b"{}")).await;
    assert_problem(&write, 503, "unavailable");
    assert!(write.text.to_ascii_lowercase().contains("retry-after: 1"));
    assert!(
        write.text.contains("\"outcomeUnknown\":true"),
        "{}",
        write.text
    );
    let read = send(r.addr, &get_request("/stall")).await;
    assert_problem(&read, 503, "unavailable");
    assert!(
        !read.text.contains("\"outcomeUnknown\":true"),
        "{}",
        read.text
    );
}

#[tokio::test]
async fn one_request_over_the_concurrency_limit_is_refused_with_503_and_the_rest_complete() {
    let r = start(ServerConfig {
        concurrency_limit: 2,
        ..config()
    })
    .await;
    let held: Vec<_> = (0..2)
        .map(|_| {
            let addr = r.addr;
            tokio::spawn(async move { send(addr, &get_request("/gate")).await })
        })
        .collect();
    tokio::time::timeout(BOUND, async {
        while r.entered.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("two requests entered the handler");

    let third = send(r.addr, &get_request("/gate")).await;
    assert_problem(&third, 503, "overloaded");
    assert!(third.text.to_ascii_lowercase().contains("retry-after: 1"));
    assert_eq!(r.entered.load(Ordering::SeqCst), 2, "the third got in");
    // Outside the limit: the server can still say it is alive.
    assert_eq!(send(r.addr, &get_request("/healthz")).await.status, 200);

    r.open_gate.send(true).unwrap();
    for h in held {
        let a = h.await.unwrap();
        assert_eq!(a.status, 200, "{}", a.text);
        assert!(a.text.ends_with("done"));
    }
    // The slots are free again.
    assert_eq!(send(r.addr, &get_request("/gate")).await.status, 200);
}

#[tokio::test]
async fn a_graceful_shutdown_finishes_the_request_in_flight_and_refuses_new_connections() {
    let mut r = start(config()).await;
    let addr = r.addr;
    let in_flight = tokio::spawn(async move { send(addr, &get_request("/gate")).await });
    tokio::time::timeout(BOUND, async {
        while r.entered.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the request entered the handler");

    r.shutdown();
    tokio::time::timeout(BOUND, async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("new connections are refused once the shutdown started");
    assert!(
        !r.done.is_finished(),
        "the server stopped with a request in flight"
    );
    assert!(!in_flight.is_finished());

    r.open_gate.send(true).unwrap();
    let answer = tokio::time::timeout(BOUND, in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert!(answer.text.ends_with("done"));
    tokio::time::timeout(BOUND, &mut r.done)
        .await
        .expect("the server stopped after its last request")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_shutdown_ends_event_streams_instead_of_waiting_for_them() {
    let mut r = start(config()).await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(&get_request("/stream")).await.unwrap();
    let mut first = vec![0u8; 512];
    let n = tokio::time::timeout(BOUND, s.read(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).contains("data: one"));

    r.shutdown();
    // The grace is 30 s: only an ended stream lets the server stop sooner.
    tokio::time::timeout(BOUND, &mut r.done)
        .await
        .expect("the server waited on an endless event stream")
        .unwrap()
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&rest).ends_with("0\r\n\r\n"),
        "the stream was not ended cleanly: {:?}",
        String::from_utf8_lossy(&rest)
    );
}

fn memory_state() -> AppState {
    AppState {
        store: Arc::new(MemoryStore::new()) as Arc<dyn RunStore>,
        auth: Arc::new(StaticTokens::new()),
        metrics: Arc::new(Metrics::new()),
    }
}

async fn start_app(state: AppState, config: ServerConfig) -> (SocketAddr, oneshot::Sender<()>) {
    let router = app(state, &config);
    let server = Server::bind_router(config, router, CancellationToken::new())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

#[tokio::test]
async fn healthz_readyz_and_metrics_answer_without_a_token() {
    let (addr, _stop) = start_app(memory_state(), config()).await;
    let health = send(addr, &get_request("/healthz")).await;
    assert_eq!(health.status, 200, "{}", health.text);
    let ready = send(addr, &get_request("/readyz")).await;
    assert_eq!(ready.status, 200, "{}", ready.text);
    assert!(
        ready.text.contains("\"status\":\"ready\""),
        "{}",
        ready.text
    );
    let openapi = send(addr, &get_request("/openapi.json")).await;
    assert_eq!(openapi.status, 200, "{}", openapi.text);
    assert!(
        openapi.text.contains("\"openapi\": \"3.1"),
        "{}",
        &openapi.text[..300.min(openapi.text.len())]
    );
    let metrics = send(addr, &get_request("/metrics")).await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.text.contains(
            "runkeep_http_requests_total{method=\"GET\",route=\"/readyz\",status=\"200\"} 1"
        ),
        "{}",
        metrics.text
    );
}

fn pg_state(url: &str) -> AppState {
    let store =
        runkeep_postgres::PgStore::open_migrated(url, runkeep_postgres::PgOptions::default())
            .unwrap();
    AppState {
        store: Arc::new(store),
        ..memory_state()
    }
}

#[tokio::test]
async fn readyz_is_503_when_the_store_is_down_and_never_names_its_address() {
    // Nothing listens on the port: the store refuses at once.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let url = format!("postgres://runkeep:sesame@127.0.0.1:{port}/nowhere");
    let (addr, _stop) = start_app(pg_state(&url), config()).await;
    let ready = send(addr, &get_request("/readyz")).await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    assert!(ready.text.to_ascii_lowercase().contains("retry-after: 1"));
    assert!(
        ready.text.contains("\"status\":\"unavailable\""),
        "{}",
        ready.text
    );
    assert!(
        ready.text.contains("\"error\":\"unavailable\""),
        "{}",
        ready.text
    );
    for secret in [port.to_string().as_str(), "sesame", "nowhere", "127.0.0.1"] {
        assert!(
            !ready.text.contains(secret),
            "{secret} leaked: {}",
            ready.text
        );
    }
}

#[tokio::test]
async fn readyz_is_503_when_the_store_does_not_answer_in_time() {
    // Accepts connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let url = format!("postgres://runkeep@127.0.0.1:{port}/silent");
    let (addr, _stop) = start_app(
        pg_state(&url),
        ServerConfig {
            readiness_timeout: Duration::from_millis(300),
            ..config()
        },
    )
    .await;
    let ready = send(addr, &get_request("/readyz")).await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    assert!(
        ready.text.contains("\"error\":\"timeout\""),
        "{}",
        ready.text
    );
    held.abort();
}

/// Through the real `Server::bind` (the API's own event tail): a shutdown
/// ends the tail instead of waiting out the 30 s grace on it.
#[tokio::test]
async fn a_shutdown_of_the_real_app_ends_the_apis_event_tail() {
    let tenant = runkeep::TenantId::new("default").unwrap();
    let state = AppState {
        auth: Arc::new(StaticTokens::new().with(
            "reader-secret",
            tenant,
            runkeep_server::auth::Role::Reader,
        )),
        ..memory_state()
    };
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let server = Server::bind(config, state).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut done = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /v1/tenants/default/projects/p/sessions/s/runs/run_tail/events/stream HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer reader-secret\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0u8; 1024];
    let n = tokio::time::timeout(BOUND, s.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let _ = stop.send(());
    let stopped = tokio::time::timeout(BOUND, &mut done)
        .await
        .expect("the server waited on the event tail")
        .unwrap()
        .unwrap();
    assert_eq!(stopped, runkeep_server::server::Stopped::Drained);
}

/// The body limit holds on the API's own routes, as `runkeep serve` builds
/// them: an oversized body is 413 problem details; one under it is served.
#[tokio::test]
async fn the_real_app_applies_the_body_limit_to_api_routes() {
    let tenant = runkeep::TenantId::new("default").unwrap();
    let state = AppState {
        auth: Arc::new(StaticTokens::new().with(
            "worker-secret",
            tenant,
            runkeep_server::auth::Role::Worker,
        )),
        ..memory_state()
    };
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        body_limit: 1024,
        // The shortest `check` accepts: the long-polls' 30 s and 5 s more.
        request_timeout: Duration::from_secs(35),
        ..ServerConfig::default()
    };
    let server = Server::bind(config, state).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));
    let big = format!(
        r#"{{"holder":"w","ttlMs":30000,"pad":"{}"}}"#,
        "x".repeat(4096)
    );
    let mut request = format!(
        "POST /v1/tenants/default/claim-next HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer worker-secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    request.extend_from_slice(big.as_bytes());
    let answer = send(addr, &request).await;
    assert_problem(&answer, 413, "payload-too-large");
    let small = br#"{"holder":"w","ttlMs":30000}"#;
    let mut request = format!(
        "POST /v1/tenants/default/claim-next HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer worker-secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        small.len()
    )
    .into_bytes();
    request.extend_from_slice(small);
    let answer = send(addr, &request).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answer_is_dropped() {
    let r = start(ServerConfig {
        write_timeout: Duration::from_millis(300),
        ..config()
    })
    .await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(&get_request("/endless")).await.unwrap();
    // Read nothing while the server fills the socket buffers and waits
    // (8 x the write timeout: margin for a loaded machine).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // Then drain: an endless answer ends only if the server dropped us.
    let mut buf = vec![0u8; 256 * 1024];
    let ended = tokio::time::timeout(BOUND, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "a client that stopped reading kept its connection"
    );
}
