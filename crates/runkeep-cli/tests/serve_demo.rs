//! `runkeep serve --demo`: one command that serves the console with demo
//! data and prints its address and a token per role; it refuses a store or
//! token file of the user's rather than ignore them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

mod common;

const BOUND: Duration = Duration::from_secs(20);

fn demo_command() -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runkeep"));
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_PROJECT",
        "RUNKEEP_SESSION",
        "RUNKEEP_TOKENS",
        "RUNKEEP_DEMO_EXTRA_RUNS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_COLOR", "1");
    cmd
}

fn get(addr: &str, path: &str, token: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(BOUND)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn json_body(text: &str) -> Value {
    // Bodies may come chunked: the JSON is the part between the braces.
    let start = text.find(['{', '[']).unwrap();
    let end = text.rfind(['}', ']']).unwrap();
    serde_json::from_str(&text[start..=end]).unwrap()
}

#[test]
fn serve_demo_prints_the_console_and_a_token_per_role_and_serves_the_demo_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = demo_command()
        .current_dir(dir.path())
        .args(["--json", "serve", "--demo", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let demo = loop {
        let line = rx
            .recv_timeout(BOUND)
            .expect("runkeep serve --demo printed no demo line");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["event"] == "demo" {
            break v;
        }
    };
    let console = demo["console"].as_str().unwrap();
    let addr = console
        .strip_prefix("http://")
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    assert_eq!(demo["runs"], 35);
    for role in ["operator", "worker", "reader"] {
        let token = demo["tokens"][role].as_str().unwrap();
        let (status, body) = get(&addr, "/v1/whoami", token);
        assert_eq!(status, 200, "{role}: {body}");
        assert_eq!(json_body(&body)["role"], role);
    }
    let reader = demo["tokens"]["reader"].as_str().unwrap();
    let (status, body) = get(&addr, "/v1/tenants/default/runs?limit=100", reader);
    assert_eq!(status, 200);
    assert_eq!(json_body(&body)["entries"].as_array().unwrap().len(), 35);
    let (status, page) = get(&addr, "/", "");
    assert_eq!(status, 200);
    assert!(page.contains("runkeep console"));
    // Nothing was written where it ran: the store is in memory, the tokens
    // in a temporary directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::Term).unwrap();
    assert!(common::wait_within(&mut child, BOUND, "runkeep serve --demo after SIGTERM").success());
}

#[test]
fn serve_demo_refuses_a_store_or_token_file_of_the_users_and_a_bad_extra_count() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("mine");
    for (args, env, says) in [
        (
            vec![
                "--store".to_string(),
                format!("fs:{}", store.display()),
                "serve".into(),
                "--demo".into(),
            ],
            None,
            "would not use --store",
        ),
        (
            vec![
                "serve".into(),
                "--demo".into(),
                "--tokens".into(),
                dir.path().join("t.json").display().to_string(),
            ],
            None,
            "would not use --tokens",
        ),
        (
            vec!["serve".into(), "--demo".into()],
            Some("lots"),
            "RUNKEEP_DEMO_EXTRA_RUNS",
        ),
    ] {
        let mut cmd = demo_command();
        cmd.current_dir(dir.path())
            .args(&args)
            .args(["--listen", "127.0.0.1:0"]);
        if let Some(v) = env {
            cmd.env("RUNKEEP_DEMO_EXTRA_RUNS", v);
        }
        // Bounded: a demo that does not refuse would serve forever.
        let out = common::output_within(
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped()),
            BOUND,
            "a refused runkeep serve --demo",
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "a refused demo wrote something"
        );
    }
}
