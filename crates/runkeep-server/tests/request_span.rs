//! One tracing span per request, never a header. Alone in its binary: the
//! test sets a subscriber for its thread, and tracing caches whether a
//! callsite is enabled per process, so a concurrent test hitting the same
//! callsites without that subscriber could make it miss the span.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use runkeep_server::manners::{self, Limits};
use runkeep_server::metrics::Metrics;
use runkeep_server::server::{Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

async fn echo(body: Bytes) -> String {
    format!("{} bytes", body.len())
}

async fn send(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    text.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Collects what the fmt subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// A current-thread runtime: every task runs on this thread, under the
// subscriber set for it.
#[tokio::test(flavor = "current_thread")]
async fn every_request_gets_one_span_with_method_route_status_and_latency_and_never_the_token() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let metrics = Arc::new(Metrics::new());
    let router = manners::apply(
        Router::new().route("/echo", post(echo)),
        Limits {
            body_limit: 1024,
            request_timeout: Duration::from_secs(5),
        },
        metrics.clone(),
    );
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let server = Server::bind_router(config, router, CancellationToken::new())
        .await
        .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));

    let secret = "rk_abcdefghijkl_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let request = format!(
        "POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {secret}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    assert_eq!(send(addr, request.as_bytes()).await, 200);
    assert_eq!(
        send(
            addr,
            b"GET /nowhere HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .await,
        404
    );

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let answered: Vec<&str> = log.lines().filter(|l| l.contains("answered")).collect();
    assert_eq!(answered.len(), 2, "{log}");
    let echo = answered[0];
    for want in [
        "request{",
        "method=\"POST\"",
        "route=\"/echo\"",
        "status=200",
        "latency_ms=",
    ] {
        assert!(echo.contains(want), "{want} missing from {echo}");
    }
    assert!(answered[1].contains("route=\"unmatched\"") && answered[1].contains("status=404"));
    assert!(!log.contains(secret) && !log.contains("Bearer"), "{log}");

    let text = metrics.render();
    assert!(
        text.contains(
            "runkeep_http_requests_total{method=\"POST\",route=\"/echo\",status=\"200\"} 1"
        ),
        "{text}"
    );
}
