//! End-to-end tests of the default store, a root of many tenants
//! (`root:PATH`): the default lays runs out by tenant, two tenants never
//! see each other's runs, a listing may cover a project or a tenant, a
//! session stays openable alone (`fs:`), the two address forms refuse each
//! other's directories by name, and the doctor scans per session.

mod common;

use std::path::Path;

use common::{runkeep, stdout};
use predicates::prelude::*;
use serde_json::Value;

fn at(root: &Path) -> String {
    format!("root:{}", root.display())
}

fn json(args: &[&str]) -> Value {
    let out = runkeep().arg("--json").args(args).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}) from {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn scopes(doc: &Value) -> Vec<String> {
    doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}/{}/{}",
                r["tenantId"].as_str().unwrap(),
                r["sessionId"].as_str().unwrap(),
                r["runId"].as_str().unwrap()
            )
        })
        .collect()
}

/// With no `--store`, `seed` writes a root at `./runkeep-data`: the runs
/// of the default scope under `default/default/default/runs/`. Mutation
/// tried: the old default `fs:./runkeep-data` — the runs land directly in
/// `./runkeep-data/run_demo_001` and this test fails.
#[test]
fn the_default_store_is_a_root_laid_out_by_tenant() {
    let cwd = tempfile::tempdir().unwrap();
    runkeep()
        .current_dir(cwd.path())
        .args(["seed"])
        .assert()
        .success();
    let data = cwd.path().join("runkeep-data");
    assert!(data.join(".runkeep-root.json").is_file());
    assert!(data
        .join("default/default/default/runs/run_demo_001/checkpoints")
        .is_dir());
    assert!(!data.join("run_demo_001").exists());
    runkeep()
        .current_dir(cwd.path())
        .args(["--tenant", "other", "seed"])
        .assert()
        .success();
    let out = stdout(
        runkeep()
            .current_dir(cwd.path())
            .args(["--json", "--tenant", "other", "runs"]),
    );
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["entries"].as_array().unwrap().len(), 6);
    assert!(scopes(&doc).iter().all(|s| s.starts_with("other/")));
}

/// Two tenants seeding the same project, session and run ids through one
/// root each list only their own runs, at every width; a tenant-wide
/// listing pages across sessions.
#[test]
fn two_tenants_share_a_root_and_never_see_each_others_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = at(dir.path());
    for (tenant, session) in [("acme", "s1"), ("acme", "s2"), ("globex", "s1")] {
        runkeep()
            .args([
                "--store",
                &store,
                "--tenant",
                tenant,
                "--session",
                session,
                "seed",
            ])
            .assert()
            .success();
    }
    let acme = json(&[
        "--store",
        &store,
        "--tenant",
        "acme",
        "--project",
        "",
        "--session",
        "",
        "runs",
    ]);
    let names = scopes(&acme);
    assert_eq!(names.len(), 12, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("acme/")), "{names:?}");
    // In run-id order, each id once per session (s1 before s2).
    assert_eq!(names[0], "acme/s1/run_demo_001");
    assert_eq!(names[1], "acme/s2/run_demo_001");
    let globex = json(&[
        "--store",
        &store,
        "--tenant",
        "globex",
        "--project",
        "",
        "--session",
        "",
        "runs",
    ]);
    assert_eq!(scopes(&globex).len(), 6);
    assert!(scopes(&globex).iter().all(|n| n.starts_with("globex/s1/")));
    // Pages of 5 over the tenant, walked by cursor: every run once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec![
            "--store",
            &store,
            "--tenant",
            "acme",
            "--project",
            "default",
            "--session",
            "",
            "runs",
            "--limit",
            "5",
        ];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c]);
        }
        let page = json(&args);
        seen.extend(scopes(&page));
        match page["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, names);
    // One session of the root is a plain session directory.
    let runs = dir.path().join("acme/default/s2/runs");
    let alone = json(&[
        "--store",
        &format!("fs:{}", runs.display()),
        "--tenant",
        "acme",
        "--session",
        "s2",
        "runs",
    ]);
    assert_eq!(scopes(&alone).len(), 6);
    assert!(scopes(&alone).iter().all(|n| n.starts_with("acme/s2/")));
}

/// `fs:ROOT` and `root:SESSION` are refused (exit 78) with a message
/// naming the form to use, and change nothing.
#[test]
fn the_address_forms_refuse_each_others_directories() {
    let dir = tempfile::tempdir().unwrap();
    let store = at(dir.path());
    runkeep()
        .args(["--store", &store, "seed"])
        .assert()
        .success();
    runkeep()
        .args(["--store", &format!("fs:{}", dir.path().display()), "runs"])
        .assert()
        .code(78)
        .stderr(predicate::str::contains(format!(
            "root:{}",
            dir.path().display()
        )));
    let session = dir.path().join("default/default/default");
    runkeep()
        .args(["--store", &at(&session), "runs"])
        .assert()
        .code(78)
        .stderr(predicate::str::contains(format!(
            "fs:{}/runs",
            session.display()
        )));
    runkeep()
        .args(["--store", &at(&session.join("runs")), "runs"])
        .assert()
        .code(78)
        .stderr(predicate::str::contains(format!(
            "fs:{}",
            session.join("runs").display()
        )));
    runkeep()
        .args(["--store", &format!("fs:{}", session.display()), "runs"])
        .assert()
        .code(78)
        .stderr(predicate::str::contains(format!(
            "fs:{}/runs",
            session.display()
        )));
    assert!(!session.join(".runkeep-root.json").exists());
    assert!(!session.join("runs/.runkeep-root.json").exists());
    // A reader never creates a root.
    let missing = dir.path().join("nope");
    runkeep()
        .args(["--store", &at(&missing), "runs"])
        .assert()
        .code(78);
    assert!(!missing.exists());
}

/// The doctor on a root scans the sessions of the scope's prefix: a
/// damaged checkpoint in another session of the tenant is found when the
/// session is cleared, not when the doctor looks at one healthy session.
#[test]
fn the_doctor_scans_the_sessions_of_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let store = at(dir.path());
    for session in ["s1", "s2"] {
        runkeep()
            .args(["--store", &store, "--session", session, "seed"])
            .assert()
            .success();
    }
    let cps = dir
        .path()
        .join("default/default/s2/runs/run_demo_001/checkpoints");
    let victim = std::fs::read_dir(&cps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    std::fs::write(&victim, "{ not json").unwrap();
    let status = |args: &[&str]| -> String {
        let doc = json(args);
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "store.damaged-checkpoints")
            .unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        status(&["--store", &store, "--session", "s1", "doctor"]),
        "pass"
    );
    assert_eq!(
        status(&["--store", &store, "--session", "", "doctor"]),
        "fail"
    );
    // The probe left nothing in the root.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("doctor")), "{names:?}");
}

/// A short soak against a root (worker processes killed and stopped while
/// they hold runs of the root's default session) keeps every invariant.
#[test]
fn a_short_soak_on_a_root_keeps_every_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let out = runkeep()
        .args([
            "--store",
            &at(&dir.path().join("root")),
            "--json",
            "soak",
            "--dir",
        ])
        .arg(dir.path().join("soak"))
        .args([
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
        ])
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(r["audit"]["violations"], serde_json::json!([]), "{r:#}");
    assert_eq!(r["audit"]["runs_completed"], 8, "{r:#}");
    assert!(
        r["kills"].as_u64().unwrap() + r["stalls"].as_u64().unwrap() > 0,
        "no chaos happened: {r:#}"
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(dir
        .path()
        .join("root/default/default/default/runs")
        .is_dir());
}
