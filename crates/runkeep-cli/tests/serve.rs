//! `runkeep serve` and `runkeep token`, driven through the real binary:
//! the first start's token, requests with and without it, revocation
//! reaching a running server, SIGTERM with a request in flight.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{runkeep, wait_within};

const BOUND: Duration = Duration::from_secs(20);

/// A running `runkeep serve`.
struct Serve {
    child: Child,
    addr: SocketAddr,
    /// The token printed at the first start, if one was.
    token: Option<String>,
    /// stdout lines after the address line.
    lines: mpsc::Receiver<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> PathBuf {
    assert_cmd::cargo::cargo_bin("runkeep")
}

fn serve(dir: &Path, extra: &[&str]) -> Serve {
    let mut cmd = Command::new(binary());
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_PROJECT",
        "RUNKEEP_SESSION",
        "RUNKEEP_TOKENS",
        "RUNKEEP_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_COLOR", "1")
        .arg("--store")
        .arg(format!("fs:{}", dir.join("data").display()))
        .args(["serve", "--listen", "127.0.0.1:0", "--tokens"])
        .arg(dir.join("tokens.json"))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("start runkeep serve");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut token = None;
    let deadline = Instant::now() + BOUND;
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("runkeep serve printed no address"));
        let trimmed = line.trim();
        if trimmed.starts_with("rk_") {
            assert!(token.is_none(), "two tokens printed");
            token = Some(trimmed.to_string());
        }
        if let Some(rest) = line.split("listening on http://").nth(1) {
            let addr = rest.split_whitespace().next().unwrap();
            break addr.parse().expect("a socket address");
        }
    };
    Serve {
        child,
        addr,
        token,
        lines: rx,
    }
}

/// One HTTP/1.1 exchange: status and the whole answer as text.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(BOUND)).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    request(addr, "GET", path, token, "")
}

fn token_cmd(dir: &Path, args: &[&str]) -> assert_cmd::Command {
    let mut c = runkeep();
    c.env_remove("RUNKEEP_TOKENS")
        .arg("token")
        .args(args)
        .arg("--tokens")
        .arg(dir.join("tokens.json"));
    c
}

fn sigterm(child: &Child) {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, rustix::process::Signal::Term).expect("SIGTERM");
}

#[test]
fn the_first_start_prints_one_operator_token_that_works_and_token_list_never_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path(), &["--token-reload", "1ms"]);
    let token = s.token.clone().expect("the first start printed a token");

    // Open routes, no token.
    assert_eq!(get(s.addr, "/healthz", None).0, 200);
    let (status, ready) = get(s.addr, "/readyz", None);
    assert_eq!(status, 200, "{ready}");
    let (status, metrics) = get(s.addr, "/metrics", None);
    assert_eq!(status, 200);
    assert!(metrics.contains("runkeep_http_requests_total"), "{metrics}");

    // The API: 401 without, 200 with, as the default tenant's operator.
    let (status, body) = get(s.addr, "/v1/whoami", None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = get(s.addr, "/v1/whoami", Some(&token));
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"default\"") && body.contains("operator"),
        "{body}"
    );
    let (status, body) = get(s.addr, "/v1/tenants/default/runs", Some(&token));
    assert_eq!(status, 200, "{body}");

    let file = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!file.contains(&token), "the token file holds the token");
    let listed = common::stdout(&mut token_cmd(dir.path(), &["list"]));
    assert!(
        listed.contains("operator") && listed.contains("active"),
        "{listed}"
    );
    let secret_part = token.rsplit('_').next().unwrap();
    assert!(
        !listed.contains(secret_part),
        "token list printed the secret"
    );
}

#[test]
fn a_revoked_token_is_refused_by_the_running_server_and_a_restart_prints_no_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path(), &["--token-reload", "1ms"]);
    let first = s.token.clone().unwrap();
    // A worker token, created while the server runs, works at once.
    let out = common::stdout(&mut token_cmd(
        dir.path(),
        &[
            "create", "--tenant", "acme", "--role", "worker", "--label", "ci",
        ],
    ));
    let worker = out
        .lines()
        .find(|l| l.starts_with("rk_"))
        .unwrap_or_else(|| panic!("no token in {out:?}"))
        .to_string();
    let (status, body) = get(s.addr, "/v1/whoami", Some(&worker));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("acme") && body.contains("worker"), "{body}");
    // Another tenant's path is not there for it.
    let (status, _) = get(s.addr, "/v1/tenants/default/runs", Some(&worker));
    assert_eq!(status, 404);

    let id = first["rk_".len()..].split('_').next().unwrap().to_string();
    let out = common::stdout(&mut token_cmd(dir.path(), &["revoke", &id]));
    assert!(out.contains("revoked"), "{out}");
    let (status, body) = get(s.addr, "/v1/whoami", Some(&first));
    assert_eq!(status, 401, "the revoked token still works: {body}");
    assert_eq!(get(s.addr, "/v1/whoami", Some(&worker)).0, 200);
    drop(s);

    // Tokens exist (one revoked, one active): no new one is made.
    let again = serve(dir.path(), &[]);
    assert!(again.token.is_none(), "a second start printed a token");
    assert_eq!(get(again.addr, "/v1/whoami", Some(&worker)).0, 200);
    let unknown = token_cmd(dir.path(), &["revoke", "nosuchtoken0"])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&unknown.get_output().stderr).into_owned();
    assert!(err.contains("no token has id"), "{err}");
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_refuses_new_connections_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = serve(dir.path(), &[]);
    let token = s.token.clone().unwrap();
    // A request whose body is only half sent: in flight until we finish it.
    let body = r#"{"holder":"w-inflight","ttlMs":30000}"#;
    let (head, tail) = body.split_at(10);
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.set_read_timeout(Some(BOUND)).unwrap();
    write!(
        slow,
        "POST /v1/tenants/default/claim-next HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{head}",
        body.len()
    )
    .unwrap();
    // Wait until the server is inside it (the metrics request counts itself).
    let deadline = Instant::now() + BOUND;
    loop {
        let (_, m) = get(s.addr, "/metrics", None);
        if m.lines().any(|l| l == "runkeep_http_requests_in_flight 2") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow request never got in: {m}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    sigterm(&s.child);
    let deadline = Instant::now() + BOUND;
    while TcpStream::connect(s.addr).is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "exited with a request in flight"
    );

    slow.write_all(tail.as_bytes()).unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"claimed\""), "{answer}");

    let status = wait_within(&mut s.child, BOUND, "runkeep serve after SIGTERM");
    assert_eq!(status.code(), Some(0));
    let rest: Vec<String> = s.lines.try_iter().collect();
    assert!(
        rest.iter()
            .any(|l| l.contains("stopped; every request in flight was answered")),
        "{rest:?}"
    );
}

#[test]
fn a_sigterm_between_bind_and_the_serve_loop_is_a_graceful_stop() {
    // Forces the interleaving: the server's stdout is a pipe filled to the
    // brim, so after binding its socket it blocks writing the "listening"
    // line, before its serve loop ever runs. The SIGTERM lands there. A
    // handler registered only by the serve loop leaves SIGTERM's default
    // action in that window: the process is killed, not stopped.
    let dir = tempfile::tempdir().unwrap();
    common::stdout(&mut token_cmd(
        dir.path(),
        &["create", "--role", "operator", "--label", "t"],
    ));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (mut out_r, out_w) = std::io::pipe().unwrap();
    let flags = rustix::fs::fcntl_getfl(&out_w).unwrap();
    rustix::fs::fcntl_setfl(&out_w, flags | rustix::fs::OFlags::NONBLOCK).unwrap();
    let mut filled = 0usize;
    let junk = [b'.'; 4096];
    loop {
        match (&out_w).write(&junk) {
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the pipe: {e}"),
        }
    }
    rustix::fs::fcntl_setfl(&out_w, flags).unwrap();

    let mut cmd = Command::new(binary());
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_TOKENS",
        "RUNKEEP_LOG",
    ] {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .env("NO_COLOR", "1")
        .arg("--store")
        .arg(format!("fs:{}", dir.path().join("data").display()))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--tokens",
        ])
        .arg(dir.path().join("tokens.json"))
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start runkeep serve");
    // The command holds our copy of the pipe's write end: close it, or the
    // reader below never sees the end of the server's output.
    drop(cmd);
    let deadline = Instant::now() + BOUND;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "runkeep serve ended before binding"
        );
        assert!(Instant::now() < deadline, "runkeep serve never bound");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Bound, and the listening line is not out: the pipe holds only ours.
    assert_eq!(
        rustix::io::ioctl_fionread(&out_r).unwrap() as usize,
        filled,
        "the server wrote to stdout before the SIGTERM: the interleaving did not happen"
    );
    sigterm(&child);
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        out_r.read_to_end(&mut all).unwrap();
        String::from_utf8_lossy(&all[filled..]).into_owned()
    });
    let status = wait_within(&mut child, BOUND, "runkeep serve after SIGTERM");
    let said = reader.join().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "killed by the SIGTERM instead of stopping: {status:?}, stdout {said:?}"
    );
    assert!(said.contains("listening on http://127.0.0.1:"), "{said}");
    assert!(
        said.contains("stopped; every request in flight was answered"),
        "{said}"
    );
}

#[test]
fn bad_limits_are_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let out = runkeep()
        .env_remove("RUNKEEP_TOKENS")
        .arg("--store")
        .arg(format!("fs:{}", dir.path().join("data").display()))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--request-timeout",
            "10s",
            "--tokens",
        ])
        .arg(dir.path().join("tokens.json"))
        .assert()
        .code(64);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("long-polls"), "{err}");
    assert!(!dir.path().join("tokens.json").exists());
    assert!(!dir.path().join("data").exists());
}

/// Supplements the forced interleaving of the server crate's
/// `two_concurrent_creates_lose_neither_token` (the same `flock`) with real
/// processes: eight `runkeep token create` at once, eight tokens kept.
#[test]
fn concurrent_token_create_processes_lose_none() {
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..8)
        .map(|i| {
            let mut c = Command::new(binary());
            c.env_remove("RUNKEEP_TOKENS")
                .env_remove("RUNKEEP_TENANT")
                .args(["--json", "token", "create", "--role", "reader", "--label"])
                .arg(format!("p{i}"))
                .arg("--tokens")
                .arg(dir.path().join("tokens.json"))
                .stdout(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let mut secrets = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        secrets.push(v["token"].as_str().unwrap().to_string());
    }
    secrets.sort();
    secrets.dedup();
    assert_eq!(secrets.len(), 8);
    let listed = runkeep()
        .env_remove("RUNKEEP_TOKENS")
        .args(["--json", "token", "list", "--tokens"])
        .arg(dir.path().join("tokens.json"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 8, "{v}");
    let text = String::from_utf8_lossy(&listed.stdout).into_owned();
    for s in &secrets {
        assert!(!text.contains(s.as_str()));
    }
    assert!(!text.contains("sha256"), "list shows the hashes: {text}");
}
