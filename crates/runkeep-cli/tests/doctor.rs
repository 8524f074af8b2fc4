//! End-to-end tests of `runkeep doctor`: healthy stores, stores damaged on
//! purpose, timeouts, the error rule and the exit codes.

mod common;

use std::time::{Duration, SystemTime};

use common::{chmod, runkeep, runkeep_unprivileged, share, stdout, Store, COMMAND_TIMEOUT};
use predicates::prelude::*;
use serde_json::Value;

const STATUSES: [&str; 5] = ["pass", "fail", "warn", "inconclusive", "skipped"];

/// Runs the doctor with --json, checks the report's shape and that its exit
/// field is the process's exit code, and returns it.
fn report(cmd: &mut assert_cmd::Command, doctor_args: &[&str]) -> Value {
    let out = cmd
        .arg("--json")
        .arg("doctor")
        .args(doctor_args)
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        doc["exit"].as_i64(),
        out.status.code().map(i64::from),
        "{doc:#}"
    );
    for key in ["version", "timestamp", "checks", "summary", "exit"] {
        assert!(doc.get(key).is_some(), "{key} missing: {doc:#}");
    }
    assert!(doc["timestamp"].as_str().unwrap().ends_with('Z'));
    let checks = doc["checks"].as_array().unwrap();
    for c in checks {
        for key in [
            "id",
            "category",
            "status",
            "message",
            "remediation",
            "durationMs",
        ] {
            assert!(c.get(key).is_some(), "{key} missing in {c}");
        }
        assert!(STATUSES.contains(&c["status"].as_str().unwrap()), "{c}");
    }
    let s = &doc["summary"];
    let sum: u64 = STATUSES.iter().map(|k| s[k].as_u64().unwrap()).sum();
    assert_eq!(
        sum,
        s["total"].as_u64().unwrap(),
        "counts sum to the total: {s}"
    );
    assert_eq!(s["total"].as_u64().unwrap(), checks.len() as u64);
    for k in STATUSES {
        let n = checks.iter().filter(|c| c["status"] == k).count() as u64;
        assert_eq!(s[k].as_u64().unwrap(), n, "{k}");
    }
    doc
}

fn status<'a>(doc: &'a Value, id: &str) -> &'a str {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {doc:#}"))["status"]
        .as_str()
        .unwrap()
}

fn message<'a>(doc: &'a Value, id: &str) -> &'a str {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap()["message"]
        .as_str()
        .unwrap()
}

#[test]
fn a_healthy_seeded_store_exits_0_and_warns_about_the_lapsed_lease() {
    let store = Store::seeded();
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(doc["exit"], 0, "{doc:#}");
    for id in [
        "store.reachable",
        "store.writable",
        "store.hard-links",
        "store.scratch-leftovers",
        "store.torn-transcripts",
        "store.damaged-checkpoints",
        "store.damaged-transcripts",
        "store.unreadable-paths",
        "store.oversized-claims",
        "leases.fence-ceiling",
        "queue.dead-lettered",
        "runtime.invariants",
    ] {
        assert_eq!(status(&doc, id), "pass", "{id}: {doc:#}");
    }
    // The seeded runs nobody works on: the expired park's (22 min) and the
    // lapsed lease's (15 min) wait past the default 10 min; the park
    // answered just now is not stale, nor the outstanding park (a human's).
    assert_eq!(status(&doc, "queue.stale-runnable"), "warn", "{doc:#}");
    let stale = message(&doc, "queue.stale-runnable");
    assert!(stale.starts_with("2 runnable run(s)"), "{stale}");
    assert!(
        stale.contains("run_demo_003") && stale.contains("run_demo_006"),
        "{stale}"
    );
    assert!(
        !stale.contains("run_demo_005") && !stale.contains("run_demo_002"),
        "{stale}"
    );
    assert_eq!(status(&doc, "leases.expired-unreclaimed"), "warn");
    assert!(
        message(&doc, "leases.expired-unreclaimed").contains("run_demo_006 (worker-b"),
        "{doc:#}"
    );
    assert!(message(&doc, "runtime.invariants").contains("store.run:single-open-writer"));
    // The probe cleaned up after itself: only the seeded runs remain.
    let mut names: Vec<String> = std::fs::read_dir(store.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.retain(|n| !n.starts_with("run_demo_"));
    assert!(
        names.iter().all(|n| !n.contains("doctor")),
        "probe leftovers: {names:?}"
    );
}

#[test]
fn human_report_has_marks_counts_and_the_exit_code() {
    let store = Store::seeded();
    let text = stdout(&mut store.cmd(&["doctor"]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("✓ pass") && l.contains("store.reachable")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("! warn") && l.contains("leases.expired-unreclaimed")),
        "{text}"
    );
    assert!(text.contains("→ their workers likely died"), "{text}");
    assert!(
        text.contains("19 check(s): 13 pass, 0 fail, 2 warn, 0 inconclusive, 4 skipped"),
        "{text}"
    );
    assert!(text.contains("exit 0: healthy"), "{text}");
}

#[test]
fn an_empty_store_skips_what_it_cannot_evaluate_and_never_passes_it() {
    let store = Store::new();
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(doc["exit"], 0);
    assert_eq!(status(&doc, "store.writable"), "pass");
    for id in [
        "store.scratch-leftovers",
        "store.torn-transcripts",
        "store.damaged-checkpoints",
        "store.damaged-transcripts",
        "store.unreadable-paths",
        "store.oversized-claims",
        "leases.expired-unreclaimed",
        "leases.fence-ceiling",
        "queue.dead-lettered",
        "queue.stale-runnable",
        "runtime.invariants",
    ] {
        assert_eq!(status(&doc, id), "skipped", "{id}: {doc:#}");
    }
}

#[test]
fn a_memory_store_skips_the_directory_checks() {
    let doc = report(runkeep().args(["--store", "memory:"]), &[]);
    assert_eq!(doc["exit"], 0);
    assert_eq!(status(&doc, "store.writable"), "pass");
    assert_eq!(status(&doc, "store.hard-links"), "skipped");
    assert_eq!(status(&doc, "runtime.invariants"), "skipped");
}

#[test]
fn an_old_scratch_file_is_a_warning() {
    let store = Store::seeded();
    let claims = store.run_dir("run_demo_004").join("claims");
    assert!(claims.is_dir(), "layout: {}", claims.display());
    let young = claims.join(".tmp-424242-1-abcdefgh-2");
    std::fs::write(&young, "{}").unwrap();
    let fresh = report(&mut store.cmd(&[]), &[]);
    assert_eq!(
        status(&fresh, "store.scratch-leftovers"),
        "pass",
        "a young scratch file may be a live claim"
    );
    let old = claims.join(".tmp-424242-2-abcdefgh-2");
    std::fs::write(&old, "{}").unwrap();
    let file = std::fs::File::options().write(true).open(&old).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(11 * 60))
        .unwrap();
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "store.scratch-leftovers"), "warn", "{doc:#}");
    assert!(
        message(&doc, "store.scratch-leftovers").contains(".tmp-424242-2-abcdefgh-2"),
        "{doc:#}"
    );
    assert_eq!(doc["exit"], 0, "a warning never moves the exit code");
}

#[test]
fn a_torn_transcript_is_a_warning() {
    let store = Store::seeded();
    let transcript = store.run_dir("run_demo_002").join("transcript.jsonl");
    assert!(transcript.exists(), "layout: {}", transcript.display());
    let mut text = std::fs::read_to_string(&transcript).unwrap();
    text.push_str("{\"type\":\"tool_completed\",\"seq\":4,\"toolUse");
    std::fs::write(&transcript, text).unwrap();
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "store.torn-transcripts"), "warn", "{doc:#}");
    assert!(
        message(&doc, "store.torn-transcripts").contains("run_demo_002"),
        "{doc:#}"
    );
}

#[test]
fn a_damaged_checkpoint_fails_with_exit_1() {
    let store = Store::seeded();
    std::fs::write(
        store
            .run_dir("run_demo_003")
            .join("checkpoints")
            .join("cp_1.json"),
        "{\"id\": \"cp_1\", \"createdAt\": ",
    )
    .unwrap();
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "store.damaged-checkpoints"), "fail", "{doc:#}");
    assert!(
        message(&doc, "store.damaged-checkpoints").contains("cp_1.json"),
        "{doc:#}"
    );
    assert_eq!(doc["exit"], 1);
    let text = String::from_utf8(
        store
            .cmd(&["doctor"])
            .assert()
            .code(1)
            .get_output()
            .stdout
            .clone(),
    )
    .unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("✗ fail") && l.contains("store.damaged-checkpoints")),
        "{text}"
    );
    assert!(text.contains("exit 1: a check failed"), "{text}");
}

/// Rewrites a run's transcript with `edit` applied to its lines.
fn edit_transcript(store: &Store, run: &str, edit: impl FnOnce(&mut Vec<String>)) {
    let path = store.run_dir(run).join("transcript.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    edit(&mut lines);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
}

/// A transcript with the same `seq` twice is a finding (it once exited 0).
#[test]
fn a_duplicate_seq_in_a_transcript_fails_naming_the_run_file_and_seq() {
    let store = Store::seeded();
    edit_transcript(&store, "run_demo_002", |lines| {
        assert_eq!(lines.len(), 3, "{lines:?}");
        let again = lines[1].clone(); // seq 2
        lines.push(again);
    });
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "store.damaged-transcripts"), "fail", "{doc:#}");
    let text = message(&doc, "store.damaged-transcripts");
    assert!(
        text.contains("run_demo_002/transcript.jsonl: seq 2 appears twice (lines 2 and 4)"),
        "{text}"
    );
    assert_eq!(doc["exit"], 1);
}

/// A line that is not JSON in the middle of a transcript (valid lines
/// after it) is reported (it once was not at all).
#[test]
fn damage_in_the_middle_of_a_transcript_fails_naming_the_line() {
    let store = Store::seeded();
    edit_transcript(&store, "run_demo_001", |lines| {
        lines.insert(2, "{\"type\":\"tool_comp".to_string());
    });
    edit_transcript(&store, "run_demo_005", |lines| {
        lines.insert(1, "[1, 2, 3]".to_string());
    });
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "store.damaged-transcripts"), "fail", "{doc:#}");
    let text = message(&doc, "store.damaged-transcripts");
    assert!(
        text.contains("run_demo_001/transcript.jsonl: line 3: is not valid JSON"),
        "{text}"
    );
    assert!(
        text.contains("run_demo_005/transcript.jsonl: line 2: is not an event object"),
        "{text}"
    );
    assert_eq!(
        status(&doc, "store.torn-transcripts"),
        "pass",
        "mid-file damage is not a torn tail: {doc:#}"
    );
    assert_eq!(doc["exit"], 1);
    // A torn final record alone stays a warning, not this failure.
    let torn = Store::seeded();
    let path = torn.run_dir("run_demo_002").join("transcript.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"type\":\"tool_completed\",\"seq\":4");
    std::fs::write(&path, text).unwrap();
    let doc = report(&mut torn.cmd(&[]), &[]);
    assert_eq!(status(&doc, "store.damaged-transcripts"), "pass", "{doc:#}");
    assert_eq!(status(&doc, "store.torn-transcripts"), "warn", "{doc:#}");
}

/// A run directory the doctor cannot read (mode 000, the doctor run
/// unprivileged) is never "every checkpoint readable", pass.
#[test]
fn an_unreadable_run_directory_is_never_a_pass() {
    let store = Store::seeded();
    share(store.path());
    let run = store.run_dir("run_demo_003");
    chmod(&run, 0o000);
    let out = runkeep_unprivileged()
        .args(["--store", &store.address(), "--json", "doctor"])
        .output()
        .unwrap();
    chmod(&run, 0o755);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(status(&doc, "store.unreadable-paths"), "fail", "{doc:#}");
    let text = message(&doc, "store.unreadable-paths");
    assert!(
        text.contains("run_demo_003 (permission denied"),
        "names the directory: {text}"
    );
    for id in [
        "store.damaged-checkpoints",
        "store.torn-transcripts",
        "store.damaged-transcripts",
        "runtime.invariants",
    ] {
        assert_eq!(status(&doc, id), "inconclusive", "{id}: {doc:#}");
        assert!(message(&doc, id).contains("run_demo_003"), "{id}: {doc:#}");
    }
    assert_eq!(out.status.code(), Some(1));
}

/// A run whose top holding is at the fence ceiling can never be claimed,
/// renewed or released again: the doctor says so, never "claimable".
#[test]
fn a_run_at_the_fence_ceiling_fails_and_is_not_called_claimable() {
    let store = Store::seeded();
    let claims = store.run_dir("run_demo_006").join("claims");
    std::fs::write(
        claims.join("999999999999999.json"),
        r#"{"holder":"worker-b","expiresAt":1000}"#,
    )
    .unwrap();
    // The store itself refuses the next claim.
    store
        .cmd(&["claim", "run_demo_006", "--holder", "ops"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("fence ceiling"));
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "leases.fence-ceiling"), "fail", "{doc:#}");
    let text = message(&doc, "leases.fence-ceiling");
    assert!(
        text.contains("run_demo_006 (claims/999999999999999.json)"),
        "{text}"
    );
    let fix = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "leases.fence-ceiling")
        .unwrap()["remediation"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fix.contains("new run id"), "{fix}");
    assert!(
        !message(&doc, "leases.expired-unreclaimed").contains("run_demo_006"),
        "a wedged run is not claimable: {doc:#}"
    );
    assert_eq!(doc["exit"], 1);
}

/// Garbage in the top holding shows as damage, never as an empty holder
/// "expired 20788d ago" in the doctor or as `free (fence N)` in listings.
#[test]
fn an_unreadable_top_holding_is_named_not_shown_as_free() {
    let store = Store::seeded();
    std::fs::write(
        store.run_dir("run_demo_004").join("claims").join("1.json"),
        "garbage",
    )
    .unwrap();
    let doc = report(&mut store.cmd(&[]), &[]);
    let text = message(&doc, "leases.expired-unreclaimed");
    assert!(
        text.contains("run_demo_004 (unreadable holding claims/1.json"),
        "{text}"
    );
    assert!(!text.contains("(, fence"), "{text}");
    assert!(!text.contains("d ago"), "{text}");
    let runs = stdout(&mut store.cmd(&["runs"]));
    let row = runs
        .lines()
        .find(|l| l.starts_with("run_demo_004"))
        .unwrap();
    assert!(row.contains("unreadable holding claims/1.json"), "{runs}");
    assert!(!row.contains("free"), "{runs}");
    let show = stdout(&mut store.cmd(&["show", "run_demo_004"]));
    assert!(show.contains("unreadable holding claims/1.json"), "{show}");
    // A real release tombstone still reads as free.
    store
        .cmd(&["release", "run_demo_006", "--fence", "1"])
        .assert()
        .success();
    let runs = stdout(&mut store.cmd(&["runs"]));
    let row = runs
        .lines()
        .find(|l| l.starts_with("run_demo_006"))
        .unwrap();
    assert!(row.contains("free (fence 2)"), "{runs}");
}

#[test]
#[cfg_attr(
    not(feature = "testing"),
    ignore = "needs the test seams: --features testing"
)]
fn a_slow_check_times_out_as_inconclusive_and_exits_69() {
    let store = Store::seeded();
    let mut cmd = store.cmd(&["--json", "doctor", "--per-check-timeout", "300ms"]);
    // The check would block for ten minutes; the command is killed after
    // `COMMAND_TIMEOUT` (two), so a doctor that waited for it has no exit
    // code here, and one that did not exits 69 long before.
    cmd.env("RUNKEEP_DOCTOR_TEST_SLOW_CHECK_MS", "600000");
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(69),
        "the doctor waited for the slow check (killed after {COMMAND_TIMEOUT:?}: {}): {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status(&doc, "test.slow-check"), "inconclusive");
    assert!(message(&doc, "test.slow-check").contains("did not return within 300 ms"));
    assert_eq!(doc["summary"]["inconclusive"], 1);
    // The human report points at the ? rows.
    let mut human = store.cmd(&["doctor", "--per-check-timeout", "300ms"]);
    human.env("RUNKEEP_DOCTOR_TEST_SLOW_CHECK_MS", "5000");
    human
        .assert()
        .code(69)
        .stdout(predicate::str::contains("? inconclusive"))
        .stdout(predicate::str::contains(
            "exit 69: some checks did not answer (the ? rows)",
        ));
    // Given time, the same check passes.
    let mut patient = store.cmd(&[]);
    patient.env("RUNKEEP_DOCTOR_TEST_SLOW_CHECK_MS", "200");
    assert_eq!(report(&mut patient, &[])["exit"], 0);
}

#[test]
#[cfg_attr(
    not(feature = "testing"),
    ignore = "needs the test seams: --features testing"
)]
fn the_wall_clock_timeout_makes_unfinished_checks_inconclusive() {
    let store = Store::new();
    let mut cmd = store.cmd(&[]);
    cmd.env("RUNKEEP_DOCTOR_TEST_SLOW_CHECK_MS", "5000");
    let doc = report(
        &mut cmd,
        &["--per-check-timeout", "5s", "--wall-clock-timeout", "300ms"],
    );
    assert_eq!(doc["exit"], 69);
    assert!(
        message(&doc, "test.slow-check").contains("wall-clock timeout of 300 ms"),
        "{doc:#}"
    );
    assert_eq!(
        status(&doc, "store.reachable"),
        "pass",
        "finished checks keep their records"
    );
}

#[test]
#[cfg_attr(
    not(feature = "testing"),
    ignore = "needs the test seams: --features testing"
)]
fn a_check_that_errors_is_inconclusive_and_one_that_panics_fails() {
    let store = Store::new();
    let mut erring = store.cmd(&[]);
    erring.env("RUNKEEP_DOCTOR_TEST_FAULTY_CHECK", "error");
    let doc = report(&mut erring, &[]);
    assert_eq!(status(&doc, "test.faulty-check"), "inconclusive");
    assert!(message(&doc, "test.faulty-check").starts_with("could not establish: deliberate error"));
    assert_eq!(doc["exit"], 69);
    let mut panicking = store.cmd(&[]);
    panicking.env("RUNKEEP_DOCTOR_TEST_FAULTY_CHECK", "panic");
    let out = panicking.args(["--json", "doctor"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status(&doc, "test.faulty-check"), "fail");
    assert!(message(&doc, "test.faulty-check").contains("check panicked: deliberate panic"));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked at"),
        "no panic noise on stderr"
    );
}

#[test]
fn a_category_that_matches_nothing_exits_2() {
    let store = Store::new();
    let doc = report(&mut store.cmd(&[]), &["--category", "nothing-here"]);
    assert_eq!(doc["exit"], 2);
    assert_eq!(doc["summary"]["total"], 0);
    let only = report(&mut store.cmd(&[]), &["--category", "store"]);
    assert_eq!(
        only["summary"]["total"], 7,
        "reachable, writable, schema-version, autovacuum and replication (PostgreSQL only), hard-links, listing-index"
    );
}

/// An exFAT volume over FUSE on a loop device: `link` answers EPERM there.
/// Unmounted and detached on drop, pass or fail.
struct ExfatMount {
    dir: tempfile::TempDir,
    loop_device: String,
}

fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl ExfatMount {
    fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = dir.path().join("volume.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(32 << 20))
            .map_err(|e| e.to_string())?;
        let image = image.to_str().unwrap().to_string();
        sh("mkfs.exfat", &[&image])?;
        let loop_device = sh("losetup", &["-f", "--show", &image])?;
        let mount = Self { dir, loop_device };
        std::fs::create_dir(mount.path()).map_err(|e| e.to_string())?;
        sh(
            "mount.exfat-fuse",
            &[&mount.loop_device, mount.path().to_str().unwrap()],
        )?;
        Ok(mount)
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for ExfatMount {
    fn drop(&mut self) {
        let mnt = self.path();
        let _ = sh("umount", &[mnt.to_str().unwrap()])
            .or_else(|_| sh("fusermount", &["-u", mnt.to_str().unwrap()]));
        let _ = sh("losetup", &["-d", &self.loop_device]);
    }
}

#[test]
#[ignore = "needs root, a loop device and exfat-fuse/exfatprogs; scripts/test.sh installs them and runs this as root"]
fn a_volume_without_hard_links_fails_the_hard_link_check() {
    let mount =
        ExfatMount::new().expect("exFAT volume (root, losetup, mkfs.exfat, mount.exfat-fuse)");
    let store = format!("fs:{}", mount.path().display());
    let doc = report(runkeep().args(["--store", &store]), &[]);
    assert_eq!(doc["exit"], 1, "{doc:#}");
    assert_eq!(status(&doc, "store.hard-links"), "fail", "{doc:#}");
    assert!(
        message(&doc, "store.hard-links").contains("cannot hard-link"),
        "{doc:#}"
    );
    assert_eq!(
        status(&doc, "store.reachable"),
        "fail",
        "the store refuses to open: {doc:#}"
    );
    assert!(
        message(&doc, "store.reachable").contains("EPERM"),
        "{doc:#}"
    );
    assert_eq!(
        status(&doc, "store.writable"),
        "inconclusive",
        "nothing to probe: {doc:#}"
    );
}

#[test]
fn a_refused_superseded_write_is_counted_by_the_single_open_writer_check() {
    let store = Store::seeded();
    store
        .cmd(&["claim", "run_demo_005", "--holder", "alice"])
        .assert()
        .success();
    store
        .cmd(&["claim", "run_demo_005", "--holder", "alice"])
        .assert()
        .success();
    // A second process still presenting fence 1: refused, and counted on disk.
    store
        .cmd(&["prune", "run_demo_005", "--keep", "1", "--fence", "1"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("fenced out"));
    let doc = report(&mut store.cmd(&[]), &[]);
    assert_eq!(status(&doc, "runtime.invariants"), "warn", "{doc:#}");
    let text = message(&doc, "runtime.invariants");
    assert!(text.contains("store.run:single-open-writer"), "{text}");
    assert!(text.contains("run_demo_005 (1)"), "{text}");
    assert_eq!(doc["exit"], 0);
}

/// A small tmpfs, unmounted on drop, pass or fail.
struct TmpfsMount {
    dir: tempfile::TempDir,
}

impl TmpfsMount {
    fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        sh(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=8m",
                "tmpfs",
                dir.path().to_str().unwrap(),
            ],
        )?;
        Ok(Self { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn read_only(&self) -> Result<String, String> {
        sh(
            "mount",
            &["-o", "remount,ro", self.path().to_str().unwrap()],
        )
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = sh("umount", &[self.path().to_str().unwrap()]);
    }
}

#[test]
#[ignore = "needs root to mount a tmpfs and remount it read-only; scripts/test.sh runs this as root"]
fn a_read_only_volume_fails_the_write_probe_and_refuses_writes_clearly() {
    let mount = TmpfsMount::new().expect("tmpfs mount (root)");
    let store = format!("fs:{}", mount.path().display());
    runkeep()
        .args(["--store", &store, "seed"])
        .assert()
        .success();
    mount.read_only().expect("remount read-only");
    let doc = report(runkeep().args(["--store", &store]), &[]);
    assert_eq!(doc["exit"], 1, "{doc:#}");
    assert_eq!(
        status(&doc, "store.reachable"),
        "pass",
        "reads still work: {doc:#}"
    );
    assert_eq!(status(&doc, "store.writable"), "fail", "{doc:#}");
    // Reading commands work; writing ones fail with one line naming the run.
    runkeep()
        .args(["--store", &store, "runs"])
        .assert()
        .success();
    runkeep()
        .args([
            "--store",
            &store,
            "claim",
            "run_demo_001",
            "--holder",
            "ops",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::starts_with("error: claim run_demo_001:"))
        .stderr(predicate::function(|s: &str| s.lines().count() <= 2));
}
