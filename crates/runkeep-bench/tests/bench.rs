//! `runkeep-bench` keeps working: a quick run on the memory store prints a
//! figure for every memory operation, and its JSON holds them.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Every operation the bench measures on each backend.
const MEMORY_OPS: [&str; 20] = [
    "claim+release",
    "renew",
    "checkpoint-4k",
    "checkpoint-64k",
    "append-1",
    "append-100",
    "step-commit",
    "wake",
    "list-first-page",
    "list-deep-page",
    "catch-up",
    "drain@1",
    "drain@8",
    "drain@16",
    "batch16@1",
    "batch16.keys20@1",
    "batch16@8",
    "batch16.keys20@8",
    "batch16@16",
    "batch16.keys20@16",
];

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runkeep-bench"));
    // Nothing outside the build's own directory: the bench creates no
    // store directory for memory cases, and writes its JSON where told.
    c.current_dir(env!("CARGO_TARGET_TMPDIR"))
        .env_remove("RUNKEEP_BENCH_PG_URL")
        .env("NO_COLOR", "1");
    c
}

#[test]
fn quick_memory_bench_prints_every_operation() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a scratch directory");
    let json = dir.path().join("bench.json");
    let started = Instant::now();
    let out = bench()
        .args(["--quick", "--only", "memory", "--json-out"])
        .arg(&json)
        .output()
        .expect("runkeep-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "runkeep-bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the quick memory bench took {:?}",
        started.elapsed()
    );
    assert!(stdout.contains("memory"), "{stdout}");
    for op in MEMORY_OPS {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(op))
            .unwrap_or_else(|| panic!("no line for {op} in:\n{stdout}"));
        // A figure, its spread and its unit follow the name.
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() >= 4, "{line}");
        assert!(
            fields[1].chars().next().is_some_and(|c| c.is_ascii_digit()),
            "no figure on: {line}"
        );
        assert!(!line.contains("failed"), "{line}");
    }
    for other in ["fs", "pg", "serve-fs", "serve-pg"] {
        assert!(
            !stdout.lines().any(|l| l.trim() == other),
            "--only memory ran {other}:\n{stdout}"
        );
    }
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON is written"))
            .expect("the JSON parses");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), MEMORY_OPS.len(), "{cases:?}");
    for c in cases {
        assert_eq!(c["backend"], "memory");
        assert_eq!(c["rates"].as_array().map(Vec::len), Some(2), "{c}");
        assert!(c["median"].as_f64().is_some_and(|m| m > 0.0), "{c}");
    }
    // The wake-up latency is a latency: every op was timed.
    let wake = cases
        .iter()
        .find(|c| c["op"] == "wake")
        .expect("a wake case");
    assert!(wake["p50Us"].as_f64().is_some_and(|p| p > 0.0), "{wake}");
    assert_eq!(report["preliminary"], true);
    let plot = dir.path().join("bench-drain.svg");
    let svg = std::fs::read_to_string(&plot).expect("the drain plot is written beside the JSON");
    assert!(svg.starts_with("<svg") && svg.contains("memory (runkeep)"));
}

#[test]
fn list_names_the_cases_and_a_pattern_that_selects_nothing_is_a_usage_error() {
    let out = bench()
        .args(["--list", "--scaling", "--peers"])
        .output()
        .expect("runkeep-bench runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "memory/claim+release",
        "fs-powerloss/checkpoint-64k",
        "fs/base.write+fsync-4k",
        "pg/base.select-1",
        "pg/base.skip-locked@16",
        "serve-pg/drain@8",
        "serve-fs/drain@1",
        "pg/renew.after-100000",
        "pg/drain.queued-100000@8",
        "graphile-worker/default@8",
        "pg-boss/batched@16",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name}\t"))),
            "{name} missing from:\n{text}"
        );
    }
    let out = bench()
        .args(["--only", "no-such-case"])
        .output()
        .expect("runkeep-bench runs");
    assert_eq!(out.status.code(), Some(64));
}
