//! `runkeep soak --over-http` end to end: the workers drive the store
//! through a `runkeep serve` the soak started, the chaos kills that server
//! (`kill -9`) and starts it again on the same port, and the audit (reading
//! the backing store directly) finds every invariant held. On a fresh
//! directory root always; on PostgreSQL when `RUNKEEP_TEST_POSTGRES_URL` is
//! set (`scripts/test.sh` sets it). Also: the refusals around it, and an
//! `http://` store address for ordinary commands.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

/// The flags of a short soak over HTTP: several seconds of work with a
/// server strike every ~0.6 s (jittered 0.3–0.9 s): two in three a restart,
/// down for 100–250 ms (a fifth to half of the 500 ms lease TTL) plus the
/// time it takes to start; one in three a stall (SIGSTOP for 650 ms–1 s).
const SHORT: &[&str] = &[
    "--over-http",
    "--runs",
    "10",
    "--steps",
    "20",
    "--workers",
    "3",
    "--step-time",
    "30ms",
    "--ttl",
    "500ms",
    "--chaos-every",
    "400ms",
    "--server-restart-every",
    "600ms",
    "--timeout",
    "90s",
];

fn soak(store: Option<&str>, extra: &[&str]) -> (i32, Value, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::cargo_bin("runkeep").unwrap();
    cmd.env_remove("RUNKEEP_STORE").env_remove("RUNKEEP_TOKEN");
    if let Some(s) = store {
        // Environment, as an operator with a password in the URL would.
        cmd.env("RUNKEEP_STORE", s);
    }
    cmd.args(["--json", "soak", "--dir"])
        .arg(dir.path())
        .args(extra);
    let out = cmd.timeout(Duration::from_secs(180)).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not a JSON report ({e}):\n{stdout}\n{stderr}"));
    (out.status.code().unwrap_or(-1), report, stderr, dir)
}

fn violations(r: &Value) -> Vec<String> {
    r["audit"]["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// What every soak over HTTP with restarts must show: restarts happened
/// (at least two, each a kill), requests of the workers failed across them
/// (the chaos reached the workers, not an idle server), no invariant
/// broke, every run completed, and no token was ever printed.
fn check_over_http(code: i32, r: &Value, stderr: &str, dir: &tempfile::TempDir, runs: u64) {
    assert_eq!(violations(r), Vec::<String>::new(), "{stderr}\n{r:#}");
    assert_eq!(code, 0, "{stderr}\n{r:#}");
    let restarts = r["server_restarts"]
        .as_u64()
        .expect("a server_restarts count");
    assert!(restarts >= 2, "fewer than 2 server restarts: {r:#}");
    assert_eq!(
        r["backend_chaos"]["server kill -9s"].as_u64(),
        Some(restarts),
        "every restart follows a kill: {r:#}"
    );
    let a = &r["audit"];
    assert!(
        a["unavailable_refusals"].as_u64().unwrap() >= 1,
        "no worker request failed across {restarts} restarts: the chaos never reached the workers: {r:#}"
    );
    // How the runtime resolved lost answers is tallied from its logs: the
    // parts never exceed the whole.
    let rb = &r["read_backs"];
    assert!(
        rb["landed"].as_u64().unwrap() + rb["not_landed"].as_u64().unwrap()
            <= rb["outcome_unknown"].as_u64().unwrap(),
        "{r:#}"
    );
    assert_eq!(a["runs_completed"], runs, "{r:#}");
    assert_eq!(a["runs_finished"], runs, "{r:#}");
    assert_eq!(a["effects_from_superseded_fence"], 0);
    assert_eq!(a["fences_issued_twice"], 0);
    assert!(a["acks_checked"].as_u64().unwrap() >= runs * 20, "{r:#}");
    assert!(
        r["store"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{r:#}"
    );
    // The worker token is never printed: not in the report, not on stderr,
    // not in a worker's or the server's log (only its hash is on disk).
    let mut printed = format!("{r}{stderr}");
    for entry in std::fs::read_dir(dir.path().join("soak")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension()
            .is_some_and(|e| e == "stderr" || e == "stdout")
        {
            printed.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
    assert!(
        !printed.contains("rk_"),
        "a token-shaped string was printed: {printed}"
    );
}

#[test]
fn a_short_soak_over_http_with_server_restarts_keeps_every_invariant_on_a_directory_root() {
    let (code, r, stderr, dir) = soak(None, SHORT);
    check_over_http(code, &r, &stderr, &dir, 10);
    assert!(
        r["store"].as_str().unwrap().contains("over root:"),
        "the default backing is a fresh root: {r:#}"
    );
}

#[test]
fn a_short_soak_over_http_with_server_restarts_keeps_every_invariant_on_postgres() {
    let Ok(url) = std::env::var("RUNKEEP_TEST_POSTGRES_URL") else {
        eprintln!("SKIPPED: RUNKEEP_TEST_POSTGRES_URL is not set (scripts/test.sh sets it to postgres://postgres@127.0.0.1:5432/test)");
        return;
    };
    let (code, r, stderr, dir) = soak(Some(&url), SHORT);
    check_over_http(code, &r, &stderr, &dir, 10);
    assert!(
        r["store"].as_str().unwrap().contains("over postgres"),
        "backed by PostgreSQL: {r:#}"
    );
}

/// `--servers 3`: three `runkeep serve` processes over one PostgreSQL
/// schema, the workers spread over them, one killed (or stalled) at a time
/// in a random order; the audit finds every invariant held, and every
/// server was killed and started again at least once.
#[test]
fn a_short_soak_over_three_servers_killed_at_random_keeps_every_invariant_on_postgres() {
    let Ok(url) = std::env::var("RUNKEEP_TEST_POSTGRES_URL") else {
        eprintln!("SKIPPED: RUNKEEP_TEST_POSTGRES_URL is not set (scripts/test.sh sets it to postgres://postgres@127.0.0.1:5432/test)");
        return;
    };
    // SHORT's three workers, one per server.
    let mut args = SHORT.to_vec();
    args.extend(["--servers", "3"]);
    let (code, r, stderr, dir) = soak(Some(&url), &args);
    check_over_http(code, &r, &stderr, &dir, 10);
    let store = r["store"].as_str().unwrap();
    assert!(
        store.contains("(3 runkeep serve processes over postgres"),
        "three servers over PostgreSQL: {r:#}"
    );
    // Kills go round the servers (a random order each round): with three
    // or more, every server was killed, and a restart starts it again under
    // its next log number.
    let kills = r["backend_chaos"]["server kill -9s"].as_u64().unwrap_or(0);
    assert!(kills >= 3, "fewer kills than servers: {r:#}");
    for i in 0..3 {
        let restarted = dir.path().join("soak").join(format!("server{i}-1.stdout"));
        assert!(
            restarted.exists(),
            "server {i} was never killed and restarted: {r:#}"
        );
    }
    // The workers were spread: the three first workers (w0, w1, w2) each
    // went through a server of their own first (their logs say which; a
    // label misread once put every worker on the first server).
    let mut first = std::collections::BTreeSet::new();
    for w in 0..3 {
        let log =
            std::fs::read_to_string(dir.path().join("soak").join(format!("w{w}.stderr"))).unwrap();
        let url = log
            .lines()
            .find_map(|l| {
                l.split_once(": through ")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| panic!("w{w} did not say its server: {log}"));
        first.insert(url);
    }
    assert_eq!(
        first.len(),
        3,
        "workers not spread over the servers: {first:?}"
    );
}

fn refused(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("runkeep")
        .unwrap()
        .env_remove("RUNKEEP_STORE")
        .env_remove("RUNKEEP_TOKEN")
        .current_dir(dir.path())
        .args(args)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_soak_against_a_server_it_did_not_start_is_refused_with_the_way_to_do_it() {
    let (code, stderr) = refused(&["--store", "http://127.0.0.1:9", "soak", "--runs", "1"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("it did not start"), "{stderr}");
    assert!(stderr.contains("hint: use --over-http"), "{stderr}");

    let (code, stderr) = refused(&["--store", "memory:", "soak", "--over-http"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("memory: lives in one process"), "{stderr}");

    // The restart pace means nothing without a server to restart.
    let (code, stderr) = refused(&["soak", "--server-restart-every", "1s"]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("--over-http"), "{stderr}");
}

#[test]
fn an_http_store_address_carries_no_credentials_and_needs_a_token() {
    let (code, stderr) = refused(&["--store", "http://alice:s3cret@127.0.0.1:9", "runs"]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("RUNKEEP_TOKEN"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");

    let (code, stderr) = refused(&["--store", "http://127.0.0.1:9", "runs"]);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains("needs a bearer token"), "{stderr}");
}

/// Kills the server when the test ends, however it ends.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Ordinary commands over `--store http://…`: a run enqueued through the
/// API is in the backing directory, listed through the API, and the token
/// (from `RUNKEEP_TOKEN`) is printed by neither.
#[test]
fn ordinary_commands_work_over_an_http_store_and_never_print_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let root = format!("root:{}", dir.path().join("root").display());
    let tokens = dir.path().join("tokens.json");
    let out = Command::cargo_bin("runkeep")
        .unwrap()
        .args(["--json", "token", "create", "--role", "worker", "--tokens"])
        .arg(&tokens)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("rk_"), "{created}");

    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("runkeep"))
        .env_remove("RUNKEEP_STORE")
        .args([
            "--store",
            &root,
            "--json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tokens",
        ])
        .arg(&tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Serve(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let listening: Value = serde_json::from_str(&line).unwrap();
    let url = listening["address"].as_str().unwrap().to_string();

    let over_http = |args: &[&str]| {
        Command::cargo_bin("runkeep")
            .unwrap()
            .env_remove("RUNKEEP_STORE")
            .env("RUNKEEP_TOKEN", &token)
            .args(["--store", &url])
            .args(args)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    let out = over_http(&["enqueue", "run_http_1", "--input", "{\"n\":1}"]);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{printed}");
    let out = over_http(&["--json", "runs"]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(listed.contains("run_http_1"), "{listed}");
    assert!(!format!("{printed}{listed}").contains(&token));
    // Through the server into the backing directory.
    let direct = Command::cargo_bin("runkeep")
        .unwrap()
        .env_remove("RUNKEEP_STORE")
        .args(["--store", &root, "--json", "runs"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&direct.stdout).contains("run_http_1"));
    drop(server);
}
