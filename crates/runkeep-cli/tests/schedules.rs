//! End-to-end tests of recurring schedules (`runkeep schedule …`): the
//! commands over a root store, and three scheduler processes at once over
//! one directory store enqueueing each tick exactly once.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{runkeep, stdout, wait_within};
use predicates::prelude::*;
use serde_json::Value;

fn store(root: &Path) -> String {
    format!("root:{}", root.display())
}

fn json(root: &Path, args: &[&str]) -> Value {
    let out = runkeep()
        .args(["--store", &store(root), "--project", "prj_s", "--json"])
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}) from {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn rk(root: &Path, args: &[&str]) -> assert_cmd::Command {
    let mut c = runkeep();
    c.args(["--store", &store(root), "--project", "prj_s"])
        .args(args);
    c
}

/// The tick (UTC seconds since the epoch) a scheduled run id names.
fn tick_of(run: &str) -> i64 {
    let stamp = run.rsplit('-').next().unwrap();
    let t = chrono_like(stamp);
    assert!(t > 0, "{run} names no tick");
    t
}

/// `YYYYMMDDTHHMMSSZ` to epoch seconds (the proleptic Gregorian calendar).
fn chrono_like(s: &str) -> i64 {
    let n = |a: usize, b: usize| s[a..b].parse::<i64>().unwrap();
    let (y, m, d) = (n(0, 4), n(4, 6), n(6, 8));
    let (hh, mm, ss) = (n(9, 11), n(11, 13), n(13, 15));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + hh * 3600 + mm * 60 + ss
}

#[test]
fn create_list_show_pause_resume_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    rk(
        root,
        &[
            "schedule",
            "create",
            "nightly",
            "--cron",
            "0 3 * * *",
            "--timezone",
            "Europe/Paris",
            "--input",
            r#"{"report":"daily"}"#,
            "--missed",
            "catch-up:5",
        ],
    )
    .assert()
    .success()
    .stdout(predicate::str::contains("created schedule nightly"));
    // The name is taken.
    rk(
        root,
        &["schedule", "create", "nightly", "--cron", "* * * * *"],
    )
    .assert()
    .code(1)
    .stderr(predicate::str::contains("already exists"));
    // Bad input is a usage error (exit 64) and creates nothing.
    rk(root, &["schedule", "create", "bad", "--cron", "61 * * * *"])
        .assert()
        .code(64)
        .stderr(predicate::str::contains("cron expression"));
    rk(
        root,
        &[
            "schedule",
            "create",
            "bad",
            "--cron",
            "* * * * *",
            "--timezone",
            "Mars/Olympus",
        ],
    )
    .assert()
    .code(64);
    rk(
        root,
        &[
            "schedule",
            "create",
            "bad",
            "--cron",
            "* * * * *",
            "--missed",
            "sometimes",
        ],
    )
    .assert()
    .code(64);
    let all = json(root, &["schedule", "list"]);
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nightly"]);
    let s = json(root, &["schedule", "show", "nightly"]);
    assert_eq!(s["timezone"], "Europe/Paris");
    assert_eq!(s["input"]["report"], "daily");
    assert_eq!(
        s["missed"],
        serde_json::json!({"policy": "catchUp", "max": 5})
    );
    assert!(s["nextTick"].is_number());
    rk(root, &["schedule", "pause", "nightly"])
        .assert()
        .success();
    let s = json(root, &["schedule", "show", "nightly"]);
    assert_eq!(s["paused"], true);
    assert!(s["nextTick"].is_null());
    let text = stdout(&mut rk(root, &["schedule", "list"]));
    assert!(text.contains("paused"), "{text}");
    rk(root, &["schedule", "resume", "nightly"])
        .assert()
        .success();
    let s = json(root, &["schedule", "show", "nightly"]);
    assert_eq!(s["paused"], false);
    assert!(s["resumedAt"].is_number());
    rk(root, &["schedule", "delete", "nightly"])
        .assert()
        .success();
    rk(root, &["schedule", "delete", "nightly"])
        .assert()
        .code(1);
    rk(root, &["schedule", "show", "nightly"]).assert().code(1);
}

/// Three `runkeep schedule run` processes over one directory store and one
/// schedule ticking every second, for about five seconds: every tick from
/// the first after creation to the cursor has exactly one run, created by
/// exactly one of the processes (the others answer "already"), and no run
/// outside those ticks exists.
#[test]
fn three_scheduler_processes_enqueue_each_tick_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    rk(
        root,
        &[
            "schedule",
            "create",
            "tick",
            "--cron",
            "* * * * * *",
            "--missed",
            "catch-up:100",
            "--input",
            r#"{"n":1}"#,
        ],
    )
    .assert()
    .success();
    let created = json(root, &["schedule", "show", "tick"])["createdAt"]
        .as_i64()
        .unwrap();
    let bin = assert_cmd::cargo::cargo_bin("runkeep");
    let mut children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&bin)
                .env_remove("RUNKEEP_STORE")
                .env_remove("RUNKEEP_TENANT")
                .env_remove("RUNKEEP_SESSION")
                .env("NO_COLOR", "1")
                .args(["--store", &store(root), "--project", "prj_s", "--json"])
                .args(["schedule", "run", "--for", "5s", "--poll", "200ms"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs = outputs_of(&mut children, Duration::from_secs(120), "scheduler", true);
    let stored = runs_of(&json(root, &["runs", "--limit", "1000"]));
    let cursor = json(root, &["schedule", "show", "tick"])["cursor"]
        .as_i64()
        .unwrap();
    each_tick_once(&outputs, &stored, created, cursor);
}

/// Waits for each child (at most `within`), asserts it succeeded (and, with
/// `quiet`, printed nothing on stderr), and returns their stdouts.
fn outputs_of(
    children: &mut [std::process::Child],
    within: Duration,
    what: &str,
    quiet: bool,
) -> Vec<String> {
    let mut outputs = Vec::new();
    for (i, child) in children.iter_mut().enumerate() {
        let status = wait_within(child, within, what);
        let mut out = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(status.success(), "{what} {i} failed: {err}");
        assert!(!quiet || err.is_empty(), "{what} {i} warned: {err}");
        outputs.push(out);
    }
    outputs
}

/// The run ids of a `runs --json` page.
fn runs_of(page: &Value) -> BTreeSet<String> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_string())
        .collect()
}

/// Checks the JSON lines of each scheduler (`outputs`) and the runs in the
/// store: every tick after `created` up to `cursor` (epoch ms) has exactly
/// one run, created by exactly one scheduler.
fn each_tick_once(outputs: &[String], stored: &BTreeSet<String>, created: i64, cursor: i64) {
    let mut created_by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (i, out) in outputs.iter().enumerate() {
        for line in out.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(outcome) = v["outcome"].as_str() else {
                continue;
            };
            let run = v["run"].as_str().unwrap().to_string();
            eprintln!("scheduler {i}: {outcome:<8} {run}");
            if outcome == "enqueued" {
                created_by.entry(run.clone()).or_default().push(i);
            }
            seen.insert(run);
        }
    }
    // Exactly one creator per run.
    for (run, by) in &created_by {
        assert_eq!(by.len(), 1, "{run} was created by schedulers {by:?}");
    }
    assert_eq!(
        created_by.keys().collect::<BTreeSet<_>>(),
        seen.iter().collect::<BTreeSet<_>>(),
        "a run some scheduler saw as already enqueued was created by none of them"
    );
    // The runs in the store are exactly those, one per tick, none missing.
    assert_eq!(*stored, created_by.keys().cloned().collect::<BTreeSet<_>>());
    let ticks: Vec<i64> = stored.iter().map(|r| tick_of(r)).collect();
    let first = created / 1000 + 1;
    let cursor = cursor / 1000;
    assert_eq!(
        ticks,
        (first..=cursor).collect::<Vec<_>>(),
        "a tick is missing or extra"
    );
    assert!(
        ticks.len() >= 4,
        "the schedulers ran 5 s but enqueued {} ticks",
        ticks.len()
    );
    eprintln!(
        "{} ticks, {} runs, each created once by one of 3 schedulers (created per scheduler: {:?})",
        ticks.len(),
        stored.len(),
        (0..outputs.len())
            .map(|i| created_by.values().filter(|b| b[0] == i).count())
            .collect::<Vec<_>>()
    );
}

/// Three `runkeep serve --schedules` over one PostgreSQL schema, stopped
/// (SIGTERM) once the cursor is five ticks past creation: each tick has
/// exactly one run, created by exactly one server. Skipped without
/// `RUNKEEP_TEST_POSTGRES_URL`.
#[test]
fn three_servers_over_one_postgres_enqueue_each_tick_exactly_once() {
    let Ok(url) = std::env::var("RUNKEEP_TEST_POSTGRES_URL") else {
        eprintln!("SKIPPED: RUNKEEP_TEST_POSTGRES_URL is not set");
        return;
    };
    let schema = format!(
        "rkcli_sched_{}_{}",
        std::process::id(),
        runkeep::id::random_suffix(4)
    );
    let dir = tempfile::tempdir().unwrap();
    let pg = |args: &[&str]| {
        let mut c = runkeep();
        c.args([
            "--store",
            &url,
            "--pg-schema",
            &schema,
            "--project",
            "prj_s",
        ])
        .args(args);
        c
    };
    let pg_json = |args: &[&str]| -> Value {
        let out = pg(&[&["--json"], args].concat()).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}) from {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    pg(&["migrate"]).assert().success();
    pg(&[
        "schedule",
        "create",
        "tick",
        "--cron",
        "* * * * * *",
        "--missed",
        "catch-up:100",
    ])
    .assert()
    .success();
    let created = pg_json(&["schedule", "show", "tick"])["createdAt"]
        .as_i64()
        .unwrap();
    let bin = assert_cmd::cargo::cargo_bin("runkeep");
    let mut children: Vec<_> = (0..3)
        .map(|i| {
            Command::new(&bin)
                .env_remove("RUNKEEP_STORE")
                .env_remove("RUNKEEP_TENANT")
                .env_remove("RUNKEEP_SESSION")
                .env_remove("RUNKEEP_TOKENS")
                .env("NO_COLOR", "1")
                .args([
                    "--store",
                    &url,
                    "--pg-schema",
                    &schema,
                    "--project",
                    "prj_s",
                    "--json",
                ])
                .args([
                    "serve",
                    "--schedules",
                    "--listen",
                    "127.0.0.1:0",
                    "--tokens",
                ])
                .arg(dir.path().join(format!("tokens{i}.json")))
                .arg("--token-out")
                .arg(dir.path().join(format!("token{i}")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Until the cursor is five ticks past creation (no timed assertion:
    // the schedulers' progress is what is waited for, bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let s = pg_json(&["schedule", "show", "tick"]);
        if s["cursor"].as_i64().is_some_and(|c| c >= created + 5000) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the servers enqueued no 5 ticks in 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for c in &children {
        Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .unwrap();
    }
    let outputs = outputs_of(&mut children, Duration::from_secs(60), "server", false);
    let stored = runs_of(&pg_json(&["runs", "--limit", "1000"]));
    let cursor = pg_json(&["schedule", "show", "tick"])["cursor"]
        .as_i64()
        .unwrap();
    each_tick_once(&outputs, &stored, created, cursor);
    let _ = pg(&["runs"]).output();
    // The schema is the test's own: drop it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            tokio::spawn(conn);
            let _ = client
                .simple_query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await;
        }
    });
}
