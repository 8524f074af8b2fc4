//! `runkeep soak` end to end: a short soak with chaos reports zero
//! violations on the directory store (real worker processes) and on the
//! memory store (threads standing in for processes), and a deliberately
//! broken worker makes the audit report violations.

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

#[test]
fn a_broken_worker_that_ignores_cancellation_makes_the_audit_fail() {
    let (code, r, _) = soak(
        "memory:",
        &[
            "--runs",
            "6",
            "--steps",
            "15",
            "--workers",
            "3",
            "--concurrency",
            "1",
            "--step-time",
            "20ms",
            "--ttl",
            "300ms",
            "--chaos-every",
            "150ms",
            "--stall-only",
            "--broken-workers",
        ],
    );
    let v = violations(&r);
    assert!(!v.is_empty(), "the audit did not catch broken workers: {r}");
    assert_eq!(code, 1);
}
