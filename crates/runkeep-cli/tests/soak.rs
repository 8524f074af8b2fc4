//! `runkeep soak` end to end: a short soak with chaos reports zero
//! violations on the directory store (real worker processes) and on the
//! memory store (threads standing in for processes), with poison runs
//! dead-lettered. That the audit catches a deliberately broken worker is
//! proved in `runkeep-soak`'s own tests (no broken worker ships in this
//! binary).

use assert_cmd::Command;
use serde_json::Value;

fn soak(store: &str, extra: &[&str]) -> (i32, Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::cargo_bin("runkeep").unwrap();
    if !store.is_empty() {
        cmd.args(["--store", store]);
    }
    cmd.args(["--json", "soak", "--dir"])
        .arg(dir.path())
        .args(extra);
    let out = cmd
        .timeout(std::time::Duration::from_secs(240))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not a JSON report ({e}):\n{stdout}\n{stderr}"));
    (out.status.code().unwrap_or(-1), report, stderr)
}

fn violations(r: &Value) -> Vec<String> {
    r["audit"]["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_short_soak_on_the_directory_store_with_real_processes_keeps_every_invariant() {
    let (code, r, stderr) = soak(
        "",
        &[
            "--runs",
            "8",
            "--steps",
            "12",
            "--workers",
            "3",
            "--step-time",
            "30ms",
            "--ttl",
            "500ms",
            "--chaos-every",
            "150ms",
        ],
    );
    assert_eq!(violations(&r), Vec::<String>::new(), "{stderr}");
    assert_eq!(code, 0);
    assert_eq!(r["audit"]["runs_completed"], 8);
    assert_eq!(r["audit"]["runs_finished"], 8, "finished in the store: {r}");
    let chaos = r["kills"].as_u64().unwrap() + r["stalls"].as_u64().unwrap();
    assert!(chaos > 0, "no chaos happened: {r}");
    assert!(
        r["store"].as_str().unwrap().starts_with("fs:"),
        "the default store is a fresh directory: {}",
        r["store"]
    );
    assert_eq!(r["audit"]["effects_from_superseded_fence"], 0);
    assert_eq!(r["audit"]["fences_issued_twice"], 0);
    assert!(
        r["audit"]["acks_checked"].as_u64().unwrap() >= 8 * 12,
        "{r}"
    );
}

#[test]
fn a_short_soak_on_the_memory_store_keeps_every_invariant_under_chaos() {
    let (code, r, stderr) = soak(
        "memory:",
        &[
            "--runs",
            "8",
            "--steps",
            "10",
            "--workers",
            "3",
            "--step-time",
            "15ms",
            "--ttl",
            "400ms",
            "--chaos-every",
            "100ms",
        ],
    );
    assert_eq!(violations(&r), Vec::<String>::new(), "{stderr}");
    assert_eq!(code, 0);
    assert_eq!(r["audit"]["runs_completed"], 8);
    let chaos = r["kills"].as_u64().unwrap() + r["stalls"].as_u64().unwrap();
    assert!(chaos > 0, "no chaos happened: {r}");
}

/// Contract v2: `--poison N` enqueues N runs whose step kills the worker
/// process every time. Each is dead-lettered by the store after exactly
/// `--max-attempts` takeovers while every other run completes, and the soak
/// still passes (real processes on the directory store).
#[test]
fn poison_runs_are_dead_lettered_after_the_attempt_limit_while_every_other_run_completes() {
    let (code, r, stderr) = soak(
        "",
        &[
            "--runs",
            "6",
            "--steps",
            "8",
            "--workers",
            "3",
            "--step-time",
            "20ms",
            "--ttl",
            "400ms",
            "--chaos-every",
            "300ms",
            "--poison",
            "2",
            "--max-attempts",
            "3",
        ],
    );
    assert_eq!(violations(&r), Vec::<String>::new(), "{stderr}");
    assert_eq!(code, 0, "{r:#}");
    let a = &r["audit"];
    assert_eq!(a["runs_completed"], 6, "{r:#}");
    assert_eq!(a["poison_dead_lettered"], 2, "{r:#}");
    assert_eq!(a["runs_dead_lettered"], 2, "{r:#}");
    assert_eq!(a["runs_finished"], 8, "{r:#}");
    // A poison run is dead-lettered at its third takeover; a chaos kill of
    // the worker holding it is a takeover too, so under chaos a poison run
    // may crash fewer than three workers itself. What must hold: the poison
    // path really ran, and no more crashes than attempts allow.
    let crashes = a["poison_crashes"].as_u64().unwrap();
    assert!(
        (1..=2 * 3).contains(&crashes),
        "poison crashes out of range: {r:#}"
    );
    assert!(
        a["attempts"].as_u64().unwrap() >= 2 * 3,
        "the attempts are the store's counts: {r:#}"
    );
    assert_eq!(r["poison"], 2);
    assert_eq!(r["max_attempts"], 3);
}

/// The operator binary carries no broken worker: the flag that used to
/// start one is gone (the broken workers live in `runkeep-soak`'s tests).
#[test]
fn the_operator_binary_has_no_broken_worker_mode() {
    let dir = tempfile::tempdir().unwrap();
    Command::cargo_bin("runkeep")
        .unwrap()
        .args(["--store", "memory:", "soak", "--broken-workers", "--dir"])
        .arg(dir.path())
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .code(64);
}

/// Settings that cannot make progress are refused before anything starts:
/// `--ttl 1ms` was once accepted and livelocked (0 of 64 runs completed,
/// reported as 129 "violations").
#[test]
fn a_ttl_that_cannot_make_progress_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("runkeep")
        .unwrap()
        .args([
            "--store",
            "memory:",
            "soak",
            "--ttl",
            "1ms",
            "--timeout",
            "5s",
        ])
        .arg("--dir")
        .arg(dir.path())
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("--ttl 1ms cannot make progress"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: use --ttl of at least 240ms"),
        "{stderr}"
    );
    // Refused before anything started: the soak made nothing in its --dir
    // (a started soak creates `soak/` and seeds `runs/` there first).
    let made: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(made.is_empty(), "the refused soak started: {made:?}");
    // The rule also follows --step-time.
    Command::cargo_bin("runkeep")
        .unwrap()
        .args([
            "--store",
            "memory:",
            "soak",
            "--ttl",
            "500ms",
            "--step-time",
            "200ms",
        ])
        .arg("--dir")
        .arg(dir.path())
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .code(64)
        .stderr(predicates::str::contains("at least 600ms"));
}

/// Running out of time is not a guarantee violation. A
/// soak that cannot finish within --timeout reports the unfinished runs
/// apart, no violation, and exits 75 (not 1).
#[test]
fn a_soak_that_runs_out_of_time_is_a_timeout_not_violations() {
    let (code, r, stderr) = soak(
        "memory:",
        &[
            "--runs",
            "4",
            "--steps",
            "500",
            "--workers",
            "1",
            "--concurrency",
            "1",
            "--step-time",
            "20ms",
            "--ttl",
            "500ms",
            "--no-chaos",
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(violations(&r), Vec::<String>::new(), "{r:#}\n{stderr}");
    assert_eq!(r["finished_in_time"], false, "{r:#}");
    let incomplete = r["audit"]["runs_incomplete"].as_array().unwrap();
    assert_eq!(incomplete.len(), 4, "{r:#}");
    assert!(
        r["timed_out"]
            .as_str()
            .unwrap()
            .contains("4 of 4 runs did not finish within --timeout 1s"),
        "{r:#}"
    );
    assert_eq!(code, 75, "a timeout alone exits 75");
}
