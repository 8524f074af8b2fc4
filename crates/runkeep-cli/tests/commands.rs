//! End-to-end tests of the operator commands: the real binary against a real
//! directory store.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{
    chmod, output_within, runkeep, runkeep_unprivileged, share, stdout, wait_within, Store,
    COMMAND_TIMEOUT,
};
use predicates::prelude::*;
use serde_json::Value;

#[test]
fn usage_errors_exit_64_with_one_error_line_and_never_panic() {
    let store = Store::seeded();
    let cases: &[&[&str]] = &[
        &["bogus"],
        &["claim", "run_demo_001", "--ttl", "0s"],
        &["claim", "run_demo_001", "--ttl", "-5s"],
        &["claim", "run_demo_001", "--ttl", "abc"],
        &["claim", "run_demo_001", "--ttl", "30"],
        &["show", "../x"],
        &["show", "run_a/../../etc"],
        &["events", "run_demo_001", "--since", "-1"],
        &["release", "run_demo_001", "--fence", "0"],
        &["runs", "--limit", "0"],
        &["runs", "--park", "sleeping"],
        &["runs", "--order", "newest"],
        &["runs", "--claimed", "--unclaimed"],
        &["runs", "--cursor", "rk1.forged"],
        &["--project", "", "--session", "s", "runs"],
        &["--tenant", "a/b", "runs"],
        &["prune", "run_demo_001", "--keep", "0"],
        &["park", "resolve", "run_demo_002"],
    ];
    for args in cases {
        store
            .cmd(args)
            .assert()
            .code(64)
            .stderr(predicate::str::starts_with("error:"))
            .stderr(predicate::str::contains("panicked").not())
            .stderr(predicate::str::contains("RUST_BACKTRACE").not());
    }
    // A directory store is one session: a wider listing is refused.
    store
        .cmd(&["--session", "", "runs"])
        .assert()
        .code(64)
        .stderr(predicate::str::contains("one session's runs directory"));
    // No command: the help, on stderr, as a usage error.
    store
        .cmd(&[])
        .assert()
        .code(64)
        .stderr(predicate::str::contains("sage: runkeep"));
    runkeep()
        .args(["--store", "./data", "runs"])
        .assert()
        .code(64)
        .stderr(predicate::str::contains("did you mean root:./data"));
}

#[test]
fn unopenable_stores_exit_78_with_a_hint() {
    // A PostgreSQL server that does not answer (nothing listens on port 1)
    // is unavailable (69), named without its password; schemas missing or
    // newer (78) are tested against a real server in tests/postgres.rs.
    runkeep()
        .args(["--store", "postgres://u:secret@127.0.0.1:1/test", "runs"])
        .assert()
        .code(69)
        .stderr(predicate::str::contains(
            "cannot reach store postgres://…@127.0.0.1:1/test",
        ))
        .stderr(predicate::str::contains("secret").not())
        .stderr(predicate::str::contains("hint:"));
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("fs:{}/nope", dir.path().display());
    runkeep()
        .args(["--store", &missing, "runs"])
        .assert()
        .code(78)
        .stderr(predicate::str::contains("does not exist"));
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    runkeep()
        .args(["--store", &format!("fs:{}", file.display()), "doctor"])
        .assert()
        .code(78)
        .stderr(predicate::str::contains("not a directory"));
}

#[test]
fn seed_writes_six_runs_once() {
    let store = Store::new();
    let doc = store.json(&["seed"]);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    assert_eq!(
        runs[1],
        serde_json::json!({"runId": "run_demo_002", "kind": "parked"})
    );
    store
        .cmd(&["seed"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("already exists"));
    store
        .cmd(&["seed", "--prefix", "more", "--runs", "2"])
        .assert()
        .success();
    assert_eq!(
        store.json(&["runs"])["entries"].as_array().unwrap().len(),
        8
    );
}

#[test]
fn runs_prints_an_aligned_table() {
    let store = Store::seeded();
    let text = stdout(&mut store.cmd(&["runs"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("RUN "), "{text}");
    assert_eq!(lines.len(), 7, "{text}");
    let park_col = lines[0].find("PARK").unwrap();
    assert_eq!(
        lines[2].find("outstanding tool_review"),
        Some(park_col),
        "{text}"
    );
    assert!(lines[3].contains("expired tool_review"), "{text}");
    assert!(
        lines[4].contains("worker-a · fence 1 · expires in"),
        "{text}"
    );
    assert!(lines[6].contains("worker-b · fence 1 · expired"), "{text}");
    assert!(
        text.contains(" ago)"),
        "created column is ISO + relative: {text}"
    );
    assert!(!text.contains('\x1b'), "no colour off a TTY");
}

#[test]
fn runs_json_filters_order_and_cursor() {
    let store = Store::seeded();
    let ids = |doc: &Value| -> Vec<String> {
        doc["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_string())
            .collect()
    };
    let all = store.json(&["runs"]);
    assert_eq!(ids(&all).len(), 6);
    let row = &all["entries"][1];
    for key in [
        "tenantId",
        "projectId",
        "sessionId",
        "runId",
        "checkpointCount",
        "latestCheckpointId",
        "park",
    ] {
        assert!(row.get(key).is_some(), "{key} missing in {row}");
    }
    assert_eq!(row["park"]["state"], "outstanding");
    assert!(all.get("cursor").is_none());
    assert_eq!(
        ids(&store.json(&["runs", "--park", "outstanding"])),
        ["run_demo_002"]
    );
    assert_eq!(
        ids(&store.json(&["runs", "--park", "outstanding,expired"])),
        ["run_demo_002", "run_demo_003"]
    );
    assert_eq!(ids(&store.json(&["runs", "--claimed"])), ["run_demo_004"]);
    assert!(!ids(&store.json(&["runs", "--unclaimed"])).contains(&"run_demo_004".to_string()));
    let by_created = ids(&store.json(&["runs", "--order", "created-at"]));
    assert_eq!(by_created.len(), 6);
    assert_ne!(
        by_created,
        ids(&all),
        "seeded creation times are not in id order"
    );
    let first = store.json(&["runs", "--limit", "4"]);
    assert_eq!(ids(&first).len(), 4);
    let cursor = first["cursor"]
        .as_str()
        .expect("a cursor while rows remain")
        .to_string();
    let second = store.json(&["runs", "--limit", "4", "--cursor", &cursor]);
    assert_eq!(ids(&second), ["run_demo_005", "run_demo_006"]);
    assert!(second.get("cursor").is_none());
    // A cursor from one order does not continue another.
    store
        .cmd(&["runs", "--order", "created-at", "--cursor", &cursor])
        .assert()
        .code(64);
    // The human page says how to continue.
    let text = stdout(&mut store.cmd(&["runs", "--limit", "4"]));
    assert!(text.contains("more: runkeep runs --cursor rk1."), "{text}");
}

#[test]
fn runs_all_walks_every_page_as_json_lines() {
    let store = Store::new();
    store.cmd(&["seed", "--runs", "25"]).assert().success();
    let text = stdout(&mut store.cmd(&["--json", "runs", "--all", "--limit", "7"]));
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 25);
    assert_eq!(rows[24]["runId"], "run_demo_025");
    let table = stdout(&mut store.cmd(&["runs", "--all", "--limit", "7"]));
    assert_eq!(table.lines().count(), 26);
}

#[test]
fn show_gives_scope_park_lease_and_counts() {
    let store = Store::seeded();
    let text = stdout(&mut store.cmd(&["show", "run_demo_002"]));
    for needle in [
        "run          run_demo_002",
        "scope        default/default/default",
        "checkpoints  2 (latest cp_2",
        "park         outstanding tool_review",
        "events       3",
        "record       present (status parked)",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }
    let doc = store.json(&["show", "run_demo_004"]);
    assert_eq!(doc["scope"]["runId"], "run_demo_004");
    assert_eq!(doc["lease"]["holder"], "worker-a");
    assert_eq!(doc["lease"]["expired"], false);
    assert_eq!(doc["checkpointCount"], 2);
    assert_eq!(doc["latestCheckpoint"]["fence"], 1);
    assert_eq!(doc["events"]["lastSeq"], 2);
    let completed = store.json(&["show", "run_demo_001"]);
    assert!(completed["report"]["bytes"].as_u64().unwrap() > 0);
    store
        .cmd(&["show", "run_nope"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "error: unknown run default/default/default/run_nope",
        ))
        .stderr(predicate::str::contains("hint:"));
}

#[test]
fn checkpoints_lists_the_total_order() {
    let store = Store::seeded();
    let text = stdout(&mut store.cmd(&["checkpoints", "run_demo_003"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("ID "), "{text}");
    assert!(lines[1].starts_with("cp_1 "), "{text}");
    assert!(
        lines[2].contains("expired tool_review (deadline 1h ago)"),
        "{text}"
    );
    let docs = store.json(&["checkpoints", "run_demo_005"]);
    let cps = docs.as_array().unwrap();
    assert_eq!(cps.len(), 2);
    assert_eq!(cps[1]["pending"]["state"], "resolved");
    assert_eq!(cps[1]["pending"]["decision"]["action"], "approve");
    let mut keys: Vec<&str> = cps[0]["stateKeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["iteration", "messages"]);
    let full = store.json(&["checkpoints", "run_demo_005", "--full"]);
    assert_eq!(full[0]["iteration"], 1);
    store
        .cmd(&["checkpoints", "run_nope"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("unknown run"));
}

#[test]
fn events_prints_the_transcript_and_json_lines() {
    let store = Store::seeded();
    let text = stdout(&mut store.cmd(&["events", "run_demo_001"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].trim_start().starts_with("SEQ"), "{text}");
    assert!(lines[1].contains("run_started"), "{text}");
    assert!(lines[4].contains("run_completed"), "{text}");
    let json = stdout(&mut store.cmd(&["--json", "events", "run_demo_004", "--since", "1"]));
    let events: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["seq"], 2);
    assert_eq!(events[0]["type"], "tool_completed");
    assert_eq!(events[0]["generation"], 1, "written under worker-a's fence");
    store.cmd(&["events", "run_nope"]).assert().code(1);
}

#[test]
fn events_follow_tails_new_events_and_exits_0_on_ctrl_c() {
    let store = Store::new();
    std::fs::create_dir_all(store.path()).unwrap();
    let bin = assert_cmd::cargo::cargo_bin("runkeep");
    let mut child = std::process::Command::new(bin)
        .args([
            "--store",
            &store.address(),
            "--json",
            "events",
            "run_demo_001",
            "--follow",
            "--interval",
            "100ms",
        ])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The run does not exist yet: follow waits for it.
    std::thread::sleep(Duration::from_millis(300));
    store.cmd(&["seed", "--runs", "1"]).assert().success();
    // Lines are read on a thread, so a follow that prints nothing fails the
    // test at the deadline instead of blocking it forever.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(serde_json::from_str::<Value>(&line).unwrap()),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "--follow printed {} of 4 events within 10 s: {seen:?}",
                    seen.len()
                );
            }
        }
    }
    assert_eq!(
        seen.iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(30),
        "events --follow after SIGINT",
    );
    assert_eq!(status.code(), Some(0), "Ctrl-C ends --follow cleanly");
}

#[test]
fn claim_renew_held_and_release() {
    // run_demo_005 (its park answered) was never claimed; run_demo_001 is
    // finished by the seed where the store keeps lifecycles.
    let store = Store::seeded();
    let doc = store.json(&["claim", "run_demo_005", "--holder", "alice", "--ttl", "30s"]);
    assert_eq!(doc["outcome"], "acquired");
    assert_eq!(doc["lease"]["holder"], "alice");
    assert_eq!(doc["lease"]["fence"], 1);
    let held = store
        .cmd(&["claim", "run_demo_005", "--holder", "bob", "--ttl", "1m"])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&held.get_output().stderr).to_string();
    assert!(
        err.contains("error: run run_demo_005 is held by alice at fence 1"),
        "{err}"
    );
    assert!(
        err.contains("(in 2") || err.contains("(in 3"),
        "relative expiry: {err}"
    );
    let renewed = stdout(&mut store.cmd(&[
        "claim",
        "run_demo_005",
        "--holder",
        "alice",
        "--ttl",
        "1h30m",
    ]));
    assert!(
        renewed.starts_with("claimed run_demo_005 at fence 2 for alice"),
        "{renewed}"
    );
    assert!(
        renewed.contains("(in 1h 30m)") || renewed.contains("(in 1h 29m)"),
        "{renewed}"
    );
    store
        .cmd(&["release", "run_demo_005", "--fence", "1"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("not the current holding"));
    let released = store.json(&["release", "run_demo_005", "--fence", "2"]);
    assert_eq!(released["released"], true);
    assert_eq!(released["lease"]["holder"], "");
    let bob = store.json(&["claim", "run_demo_005", "--holder", "bob"]);
    assert_eq!(
        bob["lease"]["fence"], 4,
        "release leaves a tombstone at fence 3"
    );
    store
        .cmd(&["claim", "run_ghost", "--holder", "bob"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--new"));
    store
        .cmd(&["claim", "run_ghost", "--holder", "bob", "--new"])
        .assert()
        .success();
    store
        .cmd(&["claim", "run_demo_005", "--holder", " "])
        .assert()
        .code(64);
}

#[test]
fn prune_keeps_the_newest_and_every_unanswered_park() {
    let store = Store::seeded();
    let dry = store.json(&["prune", "run_demo_001", "--keep", "1", "--dry-run"]);
    assert_eq!(dry["deleted"], serde_json::json!(["cp_1", "cp_2"]));
    assert_eq!(
        store.json(&["show", "run_demo_001"])["checkpointCount"],
        3,
        "dry run deletes nothing"
    );
    let text = stdout(&mut store.cmd(&["prune", "run_demo_001", "--keep", "1"]));
    assert!(
        text.starts_with("deleted 2 checkpoint(s) of run_demo_001: cp_1, cp_2; 1 remain"),
        "{text}"
    );
    // cp_2 of run_demo_002 is an outstanding park: only cp_1 may go.
    let parked = store.json(&["prune", "run_demo_002", "--keep", "1"]);
    assert_eq!(parked["deleted"], serde_json::json!(["cp_1"]));
    let again = store.json(&["prune", "run_demo_002", "--keep", "1"]);
    assert_eq!(again["deleted"], serde_json::json!([]));
    // A superseded fence is refused.
    store
        .cmd(&["prune", "run_demo_004", "--keep", "1", "--fence", "1"])
        .assert()
        .success();
    store
        .cmd(&["claim", "run_demo_004", "--holder", "worker-a"])
        .assert()
        .success();
    store
        .cmd(&["prune", "run_demo_004", "--keep", "1", "--fence", "1"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("fenced out"));
}

#[test]
fn park_resolve_answers_exactly_once() {
    let store = Store::seeded();
    let doc = store.json(&[
        "park",
        "resolve",
        "run_demo_002",
        "--decision",
        r#"{"action":"approve"}"#,
    ]);
    assert_eq!(doc["checkpointId"], "cp_2");
    assert_eq!(doc["decision"]["action"], "approve");
    store
        .cmd(&[
            "park",
            "resolve",
            "run_demo_002",
            "--checkpoint",
            "cp_2",
            "--decision",
            "deny",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("already answered"))
        .stderr(predicate::str::contains(
            "hint: a park is answered exactly once",
        ));
    let shown = store.json(&["checkpoints", "run_demo_002"]);
    assert_eq!(
        shown[1]["pending"]["decision"]["action"], "approve",
        "the first answer stands"
    );
    // No outstanding park left.
    store
        .cmd(&["park", "resolve", "run_demo_002", "--decision", "x"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("no outstanding park"));
    // An expired park needs an explicit choice.
    store
        .cmd(&["park", "resolve", "run_demo_003", "--decision", "late"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--checkpoint cp_2"));
    let text = stdout(&mut store.cmd(&["park", "resolve", "run_demo_003", "--expire"]));
    assert!(text.contains("decision: {\"action\":\"pause\""), "{text}");
    // Plain text is stored as a string.
    store
        .cmd(&["seed", "--prefix", "b", "--runs", "2"])
        .assert()
        .success();
    let plain = store.json(&["park", "resolve", "run_b_002", "--decision", "go ahead"]);
    assert_eq!(plain["decision"], "go ahead");
    store
        .cmd(&[
            "park",
            "resolve",
            "run_b_002",
            "--checkpoint",
            "cp_9",
            "--decision",
            "x",
        ])
        .assert()
        .code(1);
}

#[test]
fn a_damaged_checkpoint_flags_its_row_and_hides_no_other() {
    let store = Store::seeded();
    let cp = store
        .run_dir("run_demo_001")
        .join("checkpoints")
        .join("cp_3.json");
    assert!(cp.exists(), "layout: {}", cp.display());
    // Replaced by rename, as a foreign writer would: the run's digest sees
    // the directory change and the listing reads the damaged file.
    let scratch = store.path().join("damaged.tmp");
    std::fs::write(&scratch, "{ not json").unwrap();
    std::fs::rename(&scratch, &cp).unwrap();
    let text = stdout(&mut store.cmd(&["runs"]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("run_demo_001") && l.contains("DAMAGED")),
        "{text}"
    );
    assert_eq!(text.lines().count(), 7, "{text}");
    store
        .cmd(&["checkpoints", "run_demo_001"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("error:"));
}

/// Runs `runkeep ARGS` on a pseudo-terminal (util-linux `script`, essential on
/// Debian) and returns what the terminal showed.
fn on_a_terminal(store: &Store, args: &str, no_color: bool) -> String {
    let bin = assert_cmd::cargo::cargo_bin("runkeep");
    let line = format!("{} --store {} {args}", bin.display(), store.address());
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if no_color {
        cmd.env("NO_COLOR", "1");
    }
    let out = output_within(&mut cmd, COMMAND_TIMEOUT, "util-linux `script`");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let store = Store::seeded();
    let tty = on_a_terminal(&store, "runs", false);
    assert!(tty.contains("\x1b[1mRUN\x1b[0m"), "{tty:?}");
    assert!(tty.contains("\x1b[31mexpired tool_review"), "{tty:?}");
    let plain = on_a_terminal(&store, "runs", true);
    assert!(plain.contains("RUN "), "{plain:?}");
    assert!(!plain.contains('\x1b'), "NO_COLOR: {plain:?}");
    // Off a terminal (the other tests) there is never colour either.
    let piped =
        stdout(
            runkeep()
                .env_remove("NO_COLOR")
                .args(["--store", &store.address(), "runs"]),
        );
    assert!(!piped.contains('\x1b'), "{piped:?}");
}

#[test]
#[cfg_attr(
    not(feature = "testing"),
    ignore = "needs the test seams: --features testing"
)]
fn a_panic_is_an_internal_error_exit_70_without_a_backtrace() {
    runkeep()
        .args(["--store", "memory:", "runs"])
        .env("RUNKEEP_TEST_PANIC", "1")
        .env("RUST_BACKTRACE", "1")
        .assert()
        .code(70)
        .stderr(predicate::str::starts_with(
            "error: internal error: deliberate panic",
        ))
        .stderr(predicate::str::contains("hint: this is a bug in runkeep"))
        .stderr(predicate::str::contains("stack backtrace").not())
        .stderr(predicate::function(|s: &str| s.lines().count() == 2));
}

#[test]
fn parent_addresses_a_sub_run() {
    let store = Store::seeded();
    store
        .cmd(&[
            "claim",
            "run_child",
            "--parent",
            "run_demo_001",
            "--holder",
            "w",
            "--new",
        ])
        .assert()
        .success();
    assert!(store
        .run_dir("run_demo_001")
        .join("children")
        .join("run_child")
        .is_dir());
    let doc = store.json(&["show", "run_child", "--parent", "run_demo_001"]);
    assert_eq!(doc["scope"]["parentRunId"], "run_demo_001");
    assert_eq!(doc["lease"]["holder"], "w");
    store
        .cmd(&["show", "run_child"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("unknown run"));
    store
        .cmd(&["show", "run_child", "--parent", "../x"])
        .assert()
        .code(64);
}

/// Runs the binary with `args`, its stdout the write end of a pipe whose
/// read end is already closed (every write answers EPIPE), stderr captured.
fn with_closed_stdout(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    output_within(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("runkeep"))
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("RUNKEEP_STORE")
            .stdout(writer)
            .stderr(Stdio::piped()),
        COMMAND_TIMEOUT,
        "runkeep with a closed stdout",
    )
}

/// A closed pipe is not a bug. `runkeep runs 2>&1 >/dev/null | true`
/// (stderr a closed pipe) once exited 70 "internal error"; a closed stdout must end a command quietly too. Both exit 0 with nothing
/// printed, except that the doctor and the soak keep their verdict.
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let store = Store::seeded();
    let address = store.address();
    // stderr a closed pipe: the issue's command line, in bash.
    let out = output_within(
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "NO_COLOR=1 {} --store {address} runs 2>&1 >/dev/null | true; exit ${{PIPESTATUS[0]}}",
                assert_cmd::cargo::cargo_bin("runkeep").display()
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        COMMAND_TIMEOUT,
        "runs with stderr a closed pipe",
    );
    assert_eq!(out.status.code(), Some(0), "runs 2>&1 >/dev/null | true");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = wait_within(
        &mut std::process::Command::new(assert_cmd::cargo::cargo_bin("runkeep"))
            .args(["--store", &address, "runs"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(writer)
            .spawn()
            .unwrap(),
        COMMAND_TIMEOUT,
        "runs with stderr a closed pipe",
    );
    assert_eq!(status.code(), Some(0), "stderr a closed pipe");
    // stdout a closed pipe.
    for args in [
        vec!["--store", &address, "runs"],
        vec!["--store", &address, "--json", "runs", "--all"],
        vec!["--store", &address, "events", "run_demo_001"],
        vec!["--store", &address, "show", "run_demo_002"],
        vec!["--store", &address, "doctor"],
        vec![
            "--store",
            "memory:",
            "--json",
            "soak",
            "--runs",
            "1",
            "--steps",
            "1",
            "--workers",
            "1",
            "--no-chaos",
            "--step-time",
            "1ms",
            "--ttl",
            "500ms",
        ],
    ] {
        let out = with_closed_stdout(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("internal error"), "{args:?}: {stderr}");
        assert!(!stderr.contains("error:"), "{args:?}: quiet: {stderr}");
    }
    // The doctor's exit code is its verdict, closed pipe or not.
    std::fs::write(
        store
            .run_dir("run_demo_003")
            .join("checkpoints")
            .join("cp_1.json"),
        "{",
    )
    .unwrap();
    let out = with_closed_stdout(&["--store", &address, "doctor"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fractional duration with a unit (`--ttl 1.5s`) is accepted; it once
/// said `"1.5s" has no unit`.
#[test]
fn a_fractional_duration_with_a_unit_is_accepted() {
    let store = Store::seeded();
    let doc = store.json(&["claim", "run_demo_005", "--holder", "ops", "--ttl", "1.5s"]);
    assert_eq!(doc["outcome"], "acquired", "{doc}");
    let lease = &doc["lease"];
    let expires = lease["expiresAt"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(expires > now - 5_000 && expires <= now + 1_500, "{lease}");
    store
        .cmd(&["claim", "run_demo_002", "--ttl", "30"])
        .assert()
        .code(64)
        .stderr(predicate::str::contains(
            "\"30\" has no unit (did you mean 30s or 30ms?)",
        ));
}

/// A store directory this user cannot read exits 78, as the README
/// promises: the store cannot be opened as configured (it once exited 1).
#[test]
fn a_store_directory_this_user_cannot_read_exits_78() {
    let parent = tempfile::tempdir().unwrap();
    share(parent.path());
    let base = parent.path().join("runs");
    let address = format!("fs:{}", base.display());
    runkeep()
        .args(["--store", &address, "seed"])
        .assert()
        .success();
    chmod(&base, 0o000);
    let runs = runkeep_unprivileged()
        .args(["--store", &address, "runs"])
        .output()
        .unwrap();
    let doctor = runkeep_unprivileged()
        .args(["--store", &address, "doctor"])
        .output()
        .unwrap();
    let show = runkeep_unprivileged()
        .args(["--store", &address, "show", "run_demo_001"])
        .output()
        .unwrap();
    chmod(&base, 0o755);
    for (what, out) in [("runs", runs), ("doctor", doctor), ("show", show)] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{what}: {stderr}");
        assert!(stderr.contains("permission denied"), "{what}: {stderr}");
        assert!(
            stderr.contains(&base.display().to_string()),
            "{what}: {stderr}"
        );
        assert!(stderr.contains("hint:"), "{what}: {stderr}");
    }
}

/// `claim` on a run this user cannot read says what is wrong: the run
/// exists (it once suggested `--new`).
#[test]
fn claim_on_an_unreadable_run_names_the_path_and_the_permission_problem() {
    let store = Store::seeded();
    share(store.path());
    let run = store.run_dir("run_demo_002");
    chmod(&run, 0o000);
    let out = runkeep_unprivileged()
        .args(["--store", &store.address(), "claim", "run_demo_002"])
        .output()
        .unwrap();
    chmod(&run, 0o755);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("--new"), "{stderr}");
    assert!(
        stderr.contains(&run.display().to_string()),
        "names the path: {stderr}"
    );
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(
        stderr.contains("hint: the run's files exist but this user"),
        "{stderr}"
    );
    // A run that really is unknown still points at --new.
    store
        .cmd(&["claim", "run_nope"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--new"));
}

/// `events --follow` warns once per damaged record, not on every poll.
#[test]
fn events_follow_warns_once_per_damaged_record() {
    let store = Store::seeded();
    let path = store.run_dir("run_demo_001").join("transcript.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"type\":\"tool_completed\",\"seq\":5,\"to");
    std::fs::write(&path, text).unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("runkeep"))
        .args([
            "--store",
            &store.address(),
            "events",
            "run_demo_001",
            "--follow",
            "--interval",
            "50ms",
        ])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr_pipe = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr_pipe).lines() {
            let Ok(line) = line else { break };
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    let needle = "skipped damaged transcript record at line 5";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(needle) => break,
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("--follow never warned about the damaged record");
            }
        }
    }
    // Proof that it kept polling after the warning: the file reads it made
    // since (each poll re-reads the transcript), not a wall-clock guess.
    let read_calls = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/io"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("syscr: ")
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let at_warning = read_calls(child.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_calls(child.id()) < at_warning + 20 {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("--follow stopped polling after its first warning: the repeat was never given a chance");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = wait_within(
        &mut child,
        Duration::from_secs(30),
        "events --follow after SIGTERM",
    );
    assert_eq!(status.code(), Some(0));
    let stderr = reader.join().unwrap();
    let warnings = stderr.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(warnings, 1, "once, not on every poll:\n{stderr}");
}
