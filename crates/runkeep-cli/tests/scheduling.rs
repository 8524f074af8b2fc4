//! Issue 30 from the command line: `enqueue --priority --concurrency-key
//! --concurrency-limit --retention --dedupe-key --dedupe-window`, `runs
//! --order priority --min-priority` (with its PRIO and KEY columns),
//! `runkeep priority` and `claim`'s at-limit refusal.
//!
//! The multi-command flows run against a `runkeep serve` of a memory store
//! (one process keeps the store between commands), through `--store
//! http://…` with an operator's and a worker's token: the whole path, CLI to
//! HTTP to store.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::runkeep;
use predicates::prelude::*;
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(30);

/// A running `runkeep serve` of a memory store, with an operator's and a
/// worker's token.
struct Serve {
    child: Child,
    addr: SocketAddr,
    operator: String,
    worker: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clean(cmd: &mut Command) -> &mut Command {
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_PROJECT",
        "RUNKEEP_SESSION",
        "RUNKEEP_TOKENS",
        "RUNKEEP_TOKEN",
        "RUNKEEP_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_COLOR", "1")
}

fn create_token(tokens: &Path, role: &str) -> String {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runkeep"));
    clean(&mut cmd)
        .args(["--json", "token", "create", "--role", role, "--tokens"])
        .arg(tokens);
    let out = cmd.output().expect("runkeep token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token"].as_str().unwrap().to_string()
}

fn serve(dir: &Path) -> Serve {
    let tokens = dir.join("tokens.json");
    let operator = create_token(&tokens, "operator");
    let worker = create_token(&tokens, "worker");
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runkeep"));
    clean(&mut cmd)
        .args([
            "--store",
            "memory:",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tokens",
        ])
        .arg(&tokens)
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
    let deadline = Instant::now() + BOUND;
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("runkeep serve printed no address"));
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    Serve {
        child,
        addr,
        operator,
        worker,
    }
}

impl Serve {
    /// `runkeep --store http://… --token TOKEN ARGS…`.
    fn cmd(&self, token: &str, args: &[&str]) -> assert_cmd::Command {
        let mut c = runkeep();
        c.env_remove("RUNKEEP_TOKEN")
            .args([
                "--store",
                &format!("http://{}", self.addr),
                "--token",
                token,
            ])
            .args(args);
        c
    }

    fn json(&self, token: &str, args: &[&str]) -> Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.cmd(token, &full).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?} exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn ids(doc: &Value) -> Vec<String> {
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn enqueue_sets_priority_key_and_retention_in_the_lifecycle() {
    let out = runkeep()
        .args([
            "--store",
            "memory:",
            "--json",
            "enqueue",
            "run_prio",
            "--priority",
            "-5",
            "--concurrency-key",
            "customer:42",
            "--concurrency-limit",
            "3",
            "--retention",
            "30d",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["created"], true);
    assert_eq!(v["lifecycle"]["priority"], -5);
    assert_eq!(v["lifecycle"]["concurrency"]["key"], "customer:42");
    assert_eq!(v["lifecycle"]["concurrency"]["limit"], 3);
    assert_eq!(v["lifecycle"]["retentionMs"], 30u64 * 24 * 3600 * 1000);
    // The human form names the priority and the key.
    runkeep()
        .args([
            "--store",
            "memory:",
            "enqueue",
            "run_prio",
            "--priority",
            "7",
            "--concurrency-key",
            "k",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("priority 7"))
        .stdout(predicate::str::contains(
            "concurrency key k (at most 1 held at once)",
        ));
}

#[test]
fn bad_scheduling_arguments_exit_64_before_the_store_is_touched() {
    for (args, needle) in [
        (vec!["--priority", "2000000"], "out of range"),
        (vec!["--priority", "high"], "not an integer"),
        (vec!["--concurrency-key", "a b"], "contains"),
        (
            vec!["--concurrency-key", "k", "--concurrency-limit", "0"],
            "out of range",
        ),
        (vec!["--concurrency-limit", "2"], "--concurrency-key"),
        (vec!["--dedupe-key", "d"], "--dedupe-window"),
        (
            vec!["--dedupe-key", "d", "--dedupe-window", "31d"],
            "30 days",
        ),
    ] {
        let mut full = vec!["--store", "memory:", "enqueue", "run_bad"];
        full.extend_from_slice(&args);
        let out = runkeep().args(&full).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let out = runkeep()
        .args(["--store", "memory:", "runs", "--min-priority", "1000001"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn priorities_keys_and_dedupe_through_runkeep_serve() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    let (op, w) = (s.operator.clone(), s.worker.clone());
    s.json(&w, &["enqueue", "run_low", "--priority", "-1"]);
    s.json(&w, &["enqueue", "run_mid"]);
    s.json(
        &w,
        &[
            "enqueue",
            "run_a",
            "--priority",
            "4",
            "--concurrency-key",
            "cust/9",
        ],
    );
    s.json(
        &w,
        &[
            "enqueue",
            "run_b",
            "--priority",
            "4",
            "--concurrency-key",
            "cust/9",
        ],
    );

    // The listing in the order workers take them, then filtered.
    let page = s.json(&op, &["runs", "--order", "priority"]);
    assert_eq!(ids(&page), ["run_a", "run_b", "run_mid", "run_low"]);
    let page = s.json(&op, &["runs", "--min-priority", "0"]);
    assert_eq!(ids(&page), ["run_a", "run_b", "run_mid"]);
    // The table shows PRIO and KEY because some row has them.
    s.cmd(&op, &["runs", "--order", "priority"])
        .assert()
        .success()
        .stdout(predicate::str::contains("PRIO"))
        .stdout(predicate::str::contains("KEY"))
        .stdout(predicate::str::contains("cust/9"));

    // One run of the key claimed: the other is at the limit (exit 1).
    s.json(&w, &["claim", "run_a", "--holder", "w1", "--ttl", "5m"]);
    s.cmd(&w, &["claim", "run_b", "--holder", "w2", "--ttl", "5m"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("at its limit: 1 of 1"));

    // A worker cannot set a priority; an operator can.
    s.cmd(&w, &["priority", "run_low", "10"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("operator"));
    // `show` names the priority and the key.
    s.cmd(&op, &["show", "run_a"])
        .assert()
        .success()
        .stdout(predicate::str::contains("priority"))
        .stdout(predicate::str::contains(
            "key cust/9 (at most 1 held at once)",
        ));
    let v = s.json(&op, &["priority", "run_low", "10"]);
    assert_eq!(v["priority"], 10);
    let page = s.json(&op, &["runs", "--order", "priority"]);
    assert_eq!(ids(&page)[0], "run_low");
    s.cmd(&op, &["priority", "run_nope", "1"]).assert().code(1);

    // The dedupe window: the second enqueue names the first run.
    let first = s.json(
        &w,
        &[
            "enqueue",
            "run_d1",
            "--dedupe-key",
            "order 42",
            "--dedupe-window",
            "10m",
        ],
    );
    assert_eq!(first["created"], true);
    s.cmd(
        &w,
        &[
            "enqueue",
            "run_d2",
            "--dedupe-key",
            "order 42",
            "--dedupe-window",
            "10m",
        ],
    )
    .assert()
    .success()
    .stdout(predicate::str::contains("belongs to run run_d1"));
    let page = s.json(&op, &["runs"]);
    assert!(!ids(&page).contains(&"run_d2".to_string()));
}

/// `serve --retain-duty` outside (0, 1] is refused before anything starts,
/// naming the option and what to give.
#[test]
fn serve_refuses_a_prune_duty_cycle_outside_zero_to_one() {
    for bad in ["0", "1.5", "-0.2", "half"] {
        runkeep()
            .args([
                "serve",
                "--retain-finished",
                "1d",
                &format!("--retain-duty={bad}"),
            ])
            .assert()
            // A usage error (EX_USAGE).
            .code(64)
            .stderr(predicate::str::contains("--retain-duty"))
            .stderr(predicate::str::contains("0.25"));
    }
    runkeep()
        .args(["serve", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("--retain-duty"));
}
