//! Admission is fair (no tenant can shut out all the others): a tenant,
//! or one of its tokens, that takes its share of the server is refused
//! beyond it while the other tenants — and the tenant's own short
//! requests, when what it floods with is long-polls — are served.
//!
//! These run the real `runkeep serve` app (`Server::bind`, its token file,
//! a memory store) over raw sockets: the `TestServer` of `common` serves the
//! bare API router, without the manners under test. Every "held" request is
//! held deterministically: a long-poll waits 30 s for an event that never
//! comes, a tail streams until its client leaves, and a short request whose
//! body never arrives sits in its handler's body extractor; the test waits
//! until `runkeep_http_slots_held` and the refusals received account for
//! every request it sent before it goes on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runkeep::{MemoryStore, RunStore, TenantId};
use runkeep_server::auth::Role;
use runkeep_server::metrics::Metrics;
use runkeep_server::server::{self, Server, ServerConfig};
use runkeep_server::tokens::TokenFile;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any step may take before it counts as hung.
const BOUND: Duration = Duration::from_secs(10);

const A: &str = "acme";
const B: &str = "globex";

/// Tokens of the two tenants.
struct Tokens {
    reader_a: String,
    worker_a: String,
    operator_a: String,
    operator_b: String,
    reader_b: String,
}

struct Running {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    tokens: Tokens,
    _dir: tempfile::TempDir,
}

/// The shares of the tests: small, so a flood is a few dozen requests.
/// The global request limit (16) is what the old, tenant-blind limit was.
fn config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        // The shortest `check` accepts.
        request_timeout: Duration::from_secs(35),
        concurrency_limit: 16,
        tenant_concurrency_limit: 8,
        token_concurrency_limit: 6,
        wait_limit: 64,
        tenant_wait_limit: 12,
        token_wait_limit: 12,
        token_reload_every: Duration::from_secs(60),
        ..ServerConfig::default()
    }
}

async fn start(mut config: ServerConfig) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let file = TokenFile::new(dir.path().join("tokens.json"));
    let make = |tenant: &str, role| {
        file.create(&TenantId::new(tenant).unwrap(), role, None)
            .unwrap()
            .secret()
            .to_string()
    };
    let tokens = Tokens {
        reader_a: make(A, Role::Reader),
        worker_a: make(A, Role::Worker),
        operator_a: make(A, Role::Operator),
        operator_b: make(B, Role::Operator),
        reader_b: make(B, Role::Reader),
    };
    config.tokens = file.path().to_path_buf();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let state = server::state(&config, store).unwrap();
    let metrics = state.metrics.clone();
    let server = Server::bind(config, state).await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));
    Running {
        addr,
        metrics,
        tokens,
        _dir: dir,
    }
}

/// A response: its status and its text (head and body).
#[derive(Debug)]
struct Answer {
    status: u16,
    text: String,
}

fn request(method: &str, path: &str, token: &str, body: Option<&str>) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n"
    );
    match body {
        Some(b) => r.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )),
        None => r.push_str("\r\n"),
    }
    r.into_bytes()
}

async fn read_answer(s: &mut TcpStream, within: Duration) -> Answer {
    let mut buf = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut buf))
        .await
        .expect("answered in time")
        .expect("read the answer");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Answer { status, text }
}

async fn send(addr: SocketAddr, request: Vec<u8>) -> Answer {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request).await.unwrap();
    read_answer(&mut s, BOUND).await
}

/// Sends `request` and reads its answer's head (and, when it has a
/// `Content-Length`, its body): a stream's answer never ends.
async fn send_for_head(addr: SocketAddr, request: Vec<u8>) -> (TcpStream, Answer) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(BOUND, s.read(&mut chunk))
            .await
            .expect("answered in time")
            .expect("read the answer");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if n == 0 || buf.len() >= end + 4 + length {
                let status = text
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("no status line in {text:?}"));
                return (s, Answer { status, text });
            }
        }
        assert!(n > 0, "the connection closed before an answer");
    }
}

/// The value of the sample `series` (name and labels) in `/metrics`.
fn sample(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.render();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn held(metrics: &Metrics, budget: &str) -> usize {
    sample(
        metrics,
        &format!("runkeep_http_slots_held{{budget=\"{budget}\"}}"),
    ) as usize
}

fn rejected(metrics: &Metrics, reason: &str) -> usize {
    sample(
        metrics,
        &format!("runkeep_http_rejected_total{{reason=\"{reason}\"}}"),
    ) as usize
}

fn assert_overloaded(a: &Answer) {
    assert_eq!(a.status, 503, "{}", a.text);
    let lower = a.text.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1"), "{}", a.text);
    assert!(
        lower.contains("content-type: application/problem+json"),
        "{}",
        a.text
    );
    assert!(a.text.contains("problem:overloaded\""), "{}", a.text);
}

/// Requests sent to be held: each is a task that answers when the server
/// answers it; `refused` counts those answered 503.
struct Flood {
    tasks: Vec<tokio::task::JoinHandle<Answer>>,
    refused: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl Flood {
    fn new() -> Self {
        Flood {
            tasks: Vec::new(),
            refused: Arc::new(AtomicUsize::new(0)),
            answered: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Sends `request` on its own connection and reads its answer, if one
    /// comes.
    fn send(&mut self, addr: SocketAddr, request: Vec<u8>) {
        let refused = self.refused.clone();
        let answered = self.answered.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&request).await.unwrap();
            let a = read_answer(&mut s, Duration::from_secs(60)).await;
            if a.status == 503 {
                refused.fetch_add(1, Ordering::SeqCst);
            }
            answered.fetch_add(1, Ordering::SeqCst);
            a
        }));
    }

    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// The answers received so far (the refusals), the held ones dropped:
    /// their connections close.
    async fn stop(self) -> Vec<Answer> {
        let mut out = Vec::new();
        for t in self.tasks {
            if t.is_finished() {
                out.push(t.await.unwrap());
            } else {
                t.abort();
            }
        }
        out
    }
}

/// Waits until `expected` requests of `flood` are in flight in the server
/// (between their head and their response head:
/// `runkeep_http_requests_in_flight`, which the old, tenant-blind limit
/// reported too) and the other `sent - expected` answered (refused), then
/// says how many are in flight. Once both hold, nothing moves: the held
/// ones wait for what never comes. When they do not come to hold within
/// the bound (a server that lets more or fewer in), it says what it saw
/// and the test's assertions tell what went wrong.
async fn settle(running: &Running, flood: &Flood, sent: usize, expected: usize) -> usize {
    let in_flight = || sample(&running.metrics, "runkeep_http_requests_in_flight") as usize;
    let _ = tokio::time::timeout(BOUND, async {
        while !(in_flight() == expected && flood.answered() == sent - expected) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    in_flight()
}

fn run_path(tenant: &str, run: &str, rest: &str) -> String {
    format!("/v1/tenants/{tenant}/projects/p/sessions/s/runs/{run}{rest}")
}

/// `n` short reads by tenant B, `parallel` at a time (within B's own
/// share): how many succeeded.
async fn tenant_b_reads(running: &Running, n: usize, parallel: usize) -> (usize, Vec<Answer>) {
    let mut workers = Vec::new();
    for w in 0..parallel {
        let addr = running.addr;
        let token = running.tokens.operator_b.clone();
        workers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut ok = 0;
            for i in (w..n).step_by(parallel) {
                let path = if i % 2 == 0 {
                    format!("/v1/tenants/{B}/runs")
                } else {
                    run_path(B, "run_b", "/events")
                };
                let a = send(addr, request("GET", &path, &token, None)).await;
                if a.status == 200 {
                    ok += 1;
                } else {
                    failures.push(a);
                }
            }
            (ok, failures)
        }));
    }
    let mut ok = 0;
    let mut failures = Vec::new();
    for w in workers {
        let (o, f) = w.await.unwrap();
        ok += o;
        failures.extend(f);
    }
    (ok, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_long_poll_flood_leaves_other_tenants_and_its_own_short_requests_served() {
    let r = start(config()).await;
    // 20 long-polls by one reader token of tenant A: more than the old
    // global limit of 16 that every request shared.
    let sent = 20;
    let mut flood = Flood::new();
    for _ in 0..sent {
        let path = run_path(A, "run_a", "/events/wait?timeoutMs=30000");
        flood.send(r.addr, request("GET", &path, &r.tokens.reader_a, None));
    }
    let waiting = settle(&r, &flood, sent, 12).await;

    // Tenant B: 100 short requests, all served.
    let n = 100;
    let (ok, failures) = tenant_b_reads(&r, n, 4).await;
    println!(
        "under tenant A's flood of {sent} long-polls ({waiting} held, {} refused): tenant B {ok}/{n} short requests succeeded ({:.1} %)",
        flood.refused(),
        100.0 * ok as f64 / n as f64
    );
    assert!(
        failures.is_empty(),
        "tenant B was refused {} times of {n}: {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(ok, n);

    // A's share was 12 of them; the rest were refused at once.
    assert_eq!(waiting, 12, "tenant A's long-polls held (its share: 12)");
    assert_eq!(held(&r.metrics, "waits"), 12);
    assert_eq!(flood.refused(), 8, "tenant A's long-polls over its share");
    assert_eq!(flood.answered(), 8, "only the refusals were answered");
    assert_eq!(held(&r.metrics, "requests"), 0, "waits took request slots");
    assert_eq!(rejected(&r.metrics, "tenant_waits"), 8);

    // Another token of tenant A: its short requests are served (waits do
    // not take request slots)…
    let mut a_short_ok = 0;
    for _ in 0..20 {
        let a = send(
            r.addr,
            request(
                "GET",
                &format!("/v1/tenants/{A}/runs"),
                &r.tokens.worker_a,
                None,
            ),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.text);
        a_short_ok += 1;
    }
    println!("tenant A's other token: {a_short_ok}/20 short requests succeeded");
    // … its long-poll is over the tenant's share.
    let path = run_path(A, "run_a", "/events/wait?timeoutMs=100");
    let a = send(r.addr, request("GET", &path, &r.tokens.worker_a, None)).await;
    assert_overloaded(&a);
    assert!(a.text.contains("tenant acme"), "{}", a.text);
    // And B's own long-poll is served too.
    let path = run_path(B, "run_b", "/events/wait?timeoutMs=50");
    let a = send(r.addr, request("GET", &path, &r.tokens.reader_b, None)).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert!(a.text.contains("\"changed\":false"), "{}", a.text);

    // The flood is still held, all of it: nothing was let go to make room.
    assert_eq!(held(&r.metrics, "waits"), 12);
    let refusals = flood.stop().await;
    assert_eq!(refusals.len(), 8);
    for a in &refusals {
        assert_overloaded(a);
        assert!(a.text.contains("long-polls and event tails"), "{}", a.text);
    }
    // The slots come back when the clients leave.
    tokio::time::timeout(BOUND, async {
        while held(&r.metrics, "waits") > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the wait slots were given back");
    let path = run_path(A, "run_a", "/events/wait?timeoutMs=50");
    let a = send(r.addr, request("GET", &path, &r.tokens.reader_a, None)).await;
    assert_eq!(a.status, 200, "{}", a.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_short_request_flood_is_refused_beyond_its_token_and_tenant_shares() {
    let r = start(config()).await;
    // A short request whose body never comes sits in its handler (the body
    // extractor) holding its slot: 20 of them by one worker token of A.
    let announced = |token: &str| {
        format!(
            "POST {} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
            run_path(A, "run_a", "/events")
        )
        .into_bytes()
    };
    let mut flood = Flood::new();
    for _ in 0..20 {
        flood.send(r.addr, announced(&r.tokens.worker_a));
    }
    let in_handlers = settle(&r, &flood, 20, 6).await;
    // Another token of A.
    for _ in 0..4 {
        flood.send(r.addr, announced(&r.tokens.operator_a));
    }
    let in_handlers_after = settle(&r, &flood, 24, 8).await;
    let read_a = send(
        r.addr,
        request(
            "GET",
            &format!("/v1/tenants/{A}/runs"),
            &r.tokens.reader_a,
            None,
        ),
    )
    .await;

    // Tenant B: 100 short requests, all served.
    let n = 100;
    let (ok, failures) = tenant_b_reads(&r, n, 4).await;
    println!(
        "under tenant A's flood of 24 short requests held in their handlers ({in_handlers_after} held, {} refused) and one more read ({}): tenant B {ok}/{n} short requests succeeded ({:.1} %)",
        flood.refused(),
        read_a.status,
        100.0 * ok as f64 / n as f64
    );
    assert!(
        failures.is_empty(),
        "tenant B was refused {} times of {n}: {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(ok, n);
    assert_eq!(rejected(&r.metrics, "overloaded"), 0);

    // The worker token got its share (6) and no more; the other token of A
    // the rest of the tenant's share (8), then no more.
    assert_eq!(in_handlers, 6, "the worker token's share");
    assert_eq!(in_handlers_after, 8, "the tenant's share");
    assert_eq!(held(&r.metrics, "requests"), 8);
    assert_eq!(flood.refused(), 16);
    assert_eq!(rejected(&r.metrics, "token_share"), 14);
    assert_overloaded(&read_a);
    assert!(
        read_a.text.contains("tenant acme has 8 requests"),
        "{}",
        read_a.text
    );
    assert_eq!(rejected(&r.metrics, "tenant_share"), 3);

    let refusals = flood.stop().await;
    assert_eq!(refusals.len(), 16);
    for a in &refusals {
        assert_overloaded(a);
    }
    tokio::time::timeout(BOUND, async {
        while held(&r.metrics, "requests") > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the request slots were given back");
    let a = send(
        r.addr,
        request(
            "GET",
            &format!("/v1/tenants/{A}/runs"),
            &r.tokens.reader_a,
            None,
        ),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_tails_hold_a_wait_slot_for_as_long_as_they_stream() {
    let r = start(ServerConfig {
        tenant_wait_limit: 3,
        ..config()
    })
    .await;
    let tail = |token: &str| request("GET", &run_path(A, "run_a", "/events/stream"), token, None);
    let mut tails = Vec::new();
    for _ in 0..3 {
        let (s, head) = send_for_head(r.addr, tail(&r.tokens.reader_a)).await;
        assert_eq!(head.status, 200, "{}", head.text);
        assert!(head.text.contains("text/event-stream"), "{}", head.text);
        tails.push(s);
    }
    // The three stream on, past their response heads, holding their
    // slots: a fourth of tenant A is over its share.
    let (_fourth_stream, fourth) = send_for_head(r.addr, tail(&r.tokens.worker_a)).await;
    assert_overloaded(&fourth);
    assert!(fourth.text.contains("tenant acme"), "{}", fourth.text);
    assert_eq!(held(&r.metrics, "waits"), 3);
    assert_eq!(rejected(&r.metrics, "tenant_waits"), 1);
    // Tenant B tails on.
    let tail_b = request(
        "GET",
        &run_path(B, "run_b", "/events/stream"),
        &r.tokens.reader_b,
        None,
    );
    let (s, head) = send_for_head(r.addr, tail_b).await;
    assert_eq!(head.status, 200, "{}", head.text);
    drop(s);

    // One tail leaves: its slot comes back, and another tail gets it.
    drop(tails.pop());
    tokio::time::timeout(BOUND, async {
        while held(&r.metrics, "waits") > 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a closed tail gave its slot back");
    let (_s, head) = send_for_head(r.addr, tail(&r.tokens.worker_a)).await;
    assert_eq!(head.status, 200, "{}", head.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_next_counts_as_a_wait_only_when_its_body_asks_to_wait() {
    let r = start(ServerConfig {
        token_wait_limit: 2,
        ..config()
    })
    .await;
    let claim = |body: &str| {
        request(
            "POST",
            &format!("/v1/tenants/{A}/claim-next"),
            &r.tokens.worker_a,
            Some(body),
        )
    };
    let waiting = r#"{"holder":"w","ttlMs":30000,"waitMs":30000}"#;
    let mut flood = Flood::new();
    for _ in 0..3 {
        flood.send(r.addr, claim(waiting));
    }
    let held_now = settle(&r, &flood, 3, 2).await;
    assert_eq!(held_now, 2, "the token's share of waits");
    assert_eq!(held(&r.metrics, "waits"), 2);
    assert_eq!(flood.refused(), 1);
    assert_eq!(rejected(&r.metrics, "token_waits"), 1);
    // Not waiting, or waiting 0 ms: a short request, served.
    for body in [
        r#"{"holder":"w","ttlMs":30000}"#,
        r#"{"holder":"w","ttlMs":30000,"waitMs":0}"#,
    ] {
        let a = send(r.addr, claim(body)).await;
        assert_eq!(a.status, 200, "{}", a.text);
    }
    // A body that is not JSON is the handler's to refuse, as before.
    let a = send(r.addr, claim("{not json")).await;
    assert_eq!(a.status, 400, "{}", a.text);
    let refusals = flood.stop().await;
    assert_eq!(refusals.len(), 1);
    assert_overloaded(&refusals[0]);
    assert!(
        refusals[0].text.contains("this token"),
        "{}",
        refusals[0].text
    );
}

#[test]
fn a_zero_share_is_refused_with_a_message_naming_it() {
    assert!(ServerConfig::default().check().is_ok());
    type Zero = fn(&mut ServerConfig);
    let zeroed: [(Zero, &str); 6] = [
        (|c| c.concurrency_limit = 0, "a concurrency limit of 0"),
        (
            |c| c.tenant_concurrency_limit = 0,
            "a per-tenant concurrency limit of 0",
        ),
        (
            |c| c.token_concurrency_limit = 0,
            "a per-token concurrency limit of 0",
        ),
        (|c| c.wait_limit = 0, "a wait limit of 0"),
        (|c| c.tenant_wait_limit = 0, "a per-tenant wait limit of 0"),
        (|c| c.token_wait_limit = 0, "a per-token wait limit of 0"),
    ];
    for (zero, message) in zeroed {
        let mut c = ServerConfig::default();
        zero(&mut c);
        let e = c.check().unwrap_err().to_string();
        assert!(e.starts_with(message), "{e}");
        assert!(e.contains("give at least 1"), "{e}");
    }
}
