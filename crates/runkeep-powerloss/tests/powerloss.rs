//! `Durability::PowerLoss`, proven: the workload of every write path runs
//! on the FUSE model filesystem, power is cut after every operation it
//! logged, and every cut is read back (`runkeep_powerloss::harness` says
//! exactly what is checked). Then the meta-tests: the same harness against
//! a store that does not fsync (`ProcessCrash`) and against stores with one
//! fsync removed (`RUNKEEP_FS_TEST_MUTATION`) must report losses.
//!
//! Needs root and `/dev/fuse`; `scripts/test.sh` runs these as root. Run by
//! hand: `cargo test -p runkeep-powerloss --test powerloss -- --include-ignored --nocapture`.

use std::process::{Command, Stdio};

use runkeep_fs::Durability;
use runkeep_powerloss::{CrashModel, Report};

const WORKER_ENV: &str = "RUNKEEP_POWERLOSS_WORKER";
const MODEL_ENV: &str = "RUNKEEP_POWERLOSS_MODEL";
const REPORT_PREFIX: &str = "@@REPORT ";

fn run(durability: Durability) -> Report {
    match runkeep_powerloss::run(durability) {
        Ok(r) => r,
        Err(e) => panic!(
            "the power-loss harness cannot run here: {e}. It needs root and /dev/fuse (no libfuse or fusermount: it mounts with mount(2))"
        ),
    }
}

/// The entry point of a child process: runs the harness under the mutation
/// its environment names and prints the report as one JSON line. (A child,
/// because the mutation is read from the process environment.)
#[test]
fn worker_process_entry() {
    if std::env::var(WORKER_ENV).is_err() {
        return;
    }
    let model = match std::env::var(MODEL_ENV).as_deref() {
        Ok("SyncedOnly") => CrashModel::SyncedOnly,
        Ok("EagerMetadata") => CrashModel::EagerMetadata,
        other => panic!("{MODEL_ENV} must name a crash model, not {other:?}"),
    };
    let report = match runkeep_powerloss::run_models(Durability::PowerLoss, &[model]) {
        Ok(r) => r,
        Err(e) => panic!("the power-loss harness cannot run here: {e}"),
    };
    println!(
        "\n{REPORT_PREFIX}{}",
        serde_json::to_string(&report).expect("a report serialises")
    );
}

/// Starts a worker judging `model` under `mutation`.
fn spawn_mutated(mutation: &str, model: CrashModel) -> std::process::Child {
    let exe = std::env::current_exe().expect("the test binary");
    Command::new(exe)
        .args([
            "--exact",
            "worker_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, "1")
        .env(MODEL_ENV, format!("{model:?}"))
        .env("RUNKEEP_FS_TEST_MUTATION", mutation)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the test binary as a worker")
}

/// The report a worker printed.
fn report_of(mutation: &str, child: std::process::Child) -> Report {
    let out = child.wait_with_output().expect("wait for the worker");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(REPORT_PREFIX))
        .unwrap_or_else(|| {
            panic!(
                "the worker under {mutation} printed no report; status {}, stdout:\n{stdout}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).expect("the worker's report parses")
}

fn model(r: &Report, m: CrashModel) -> &runkeep_powerloss::ModelReport {
    r.models
        .iter()
        .find(|x| x.model == m)
        .expect("both models judged")
}

#[test]
#[ignore = "needs root and /dev/fuse: run by scripts/test.sh as root"]
fn power_loss_keeps_every_acknowledged_write_at_every_cut() {
    let r = run(Durability::PowerLoss);
    println!("{r}");
    // The workload exercised every write path, with real syncs.
    for path in [
        "write_checkpoint",
        "claim",
        "append_events",
        "commit_step",
        "resolve_park",
        "write_run_record",
        "write_messages",
        "write_report",
        "append_audit",
        "delete_checkpoint",
        "prune_checkpoints",
        "release",
        "enqueue",
        "snooze",
        "finish",
        "reopen",
    ] {
        assert!(
            r.calls.iter().any(|c| c.starts_with(path)),
            "the workload never called {path}: {:?}",
            r.calls
        );
    }
    assert!(r.acked_calls >= 30, "{r}");
    assert!(r.fsyncs.0 > 20 && r.fsyncs.1 > 20, "{r}");
    for m in &r.models {
        // Every operation index is a cut, 0 (nothing reached the disk)
        // included.
        assert_eq!(m.points_cut, r.ops_logged + 1, "{r}");
        assert!(m.distinct_states > 40, "too few distinct states: {r}");
        assert!(m.acked_writes_checked > 0 && m.fence_checks > 0, "{r}");
        // Power was cut inside every kind of write, not only between calls.
        for path in [
            "claim",
            "release",
            "write_checkpoint",
            "append_events",
            "commit_step",
            "finish",
        ] {
            assert!(
                m.cuts_inside.get(path).copied().unwrap_or(0) >= 2,
                "no cut inside {path}: {r}"
            );
        }
    }
    // Every model, the torn one included: a torn batch of several events
    // is cut back whole because its pending record in the offset index is
    // synced before the batch is written (the harness's first run found a
    // torn batch kept in part, "torn-batch", before that sync existed).
    for m in &r.models {
        assert_eq!(
            m.losses, 0,
            "power loss lost or tore acknowledged writes:\n{r}"
        );
    }
}

/// The harness can fail: a store that never fsyncs loses acknowledged
/// writes under both crash models.
#[test]
#[ignore = "needs root and /dev/fuse: run by scripts/test.sh as root"]
fn the_harness_reports_losses_for_a_store_that_does_not_fsync() {
    let r = run(Durability::ProcessCrash);
    println!("{r}");
    assert_eq!(r.fsyncs, (0, 0), "ProcessCrash synced something: {r}");
    for m in &r.models {
        assert!(m.losses > 0, "no loss reported without any fsync: {r}");
    }
}

/// The harness catches each fsync removed on its own (the mutation hooks
/// of `runkeep-fs`), and says what was lost.
#[test]
#[ignore = "needs root and /dev/fuse: run by scripts/test.sh as root"]
fn the_harness_catches_each_skipped_fsync() {
    // (mutation, the model that must see it, the kind of loss it must report)
    let cases = [
        // Every file sync skipped: sidecars are renamed into place before
        // their bytes are on disk, so once the rename is durable a
        // published checkpoint reads back empty.
        ("no-file-fsync", CrashModel::EagerMetadata, "damaged"),
        // Every directory sync skipped: renames and links never made
        // durable, acknowledged writes vanish.
        ("no-dir-fsync", CrashModel::SyncedOnly, "lost"),
        // Only the claims directory unsynced: the acknowledged holding is
        // lost and its fence handed out again.
        ("no-dir-fsync:claims", CrashModel::SyncedOnly, "fence"),
        // Only a holding's body unsynced: the link survives, the body does
        // not; the holding reads as unreadable (anonymous), its holder lost.
        ("no-file-fsync:claims", CrashModel::EagerMetadata, "lost"),
        // Only the checkpoints directory unsynced: an acknowledged
        // checkpoint (and an acknowledged delete) is lost.
        ("no-dir-fsync:checkpoints", CrashModel::SyncedOnly, "lost"),
        // Only the checkpoint and lifecycle sidecars unsynced (they live in
        // .runkeep/): published empty.
        (
            "no-file-fsync:.runkeep",
            CrashModel::EagerMetadata,
            "damaged",
        ),
        // Only the transcript's fdatasync skipped: acknowledged events
        // lost, checkpoints naming them dangle.
        (
            "no-file-fsync:transcript.jsonl",
            CrashModel::SyncedOnly,
            "lost",
        ),
        // Only the run record's sidecar unsynced: run.json published empty.
        (
            "no-file-fsync:run.json",
            CrashModel::EagerMetadata,
            "damaged",
        ),
    ];
    let mut failures = Vec::new();
    // Two workers at a time (the machine has two cores).
    for pair in cases.chunks(2) {
        let children: Vec<_> = pair
            .iter()
            .map(|(mutation, m, _)| spawn_mutated(mutation, *m))
            .collect();
        for ((mutation, m, kind), child) in pair.iter().zip(children) {
            let r = report_of(mutation, child);
            println!("{r}");
            assert_eq!(r.mutation.as_deref(), Some(*mutation));
            let mr = model(&r, *m);
            assert_eq!(mr.points_cut, r.ops_logged + 1, "{r}");
            if mr.losses_by_kind.get(*kind).copied().unwrap_or(0) == 0 {
                failures.push(format!(
                    "{mutation}: no {kind} loss under {m:?}: {:?}",
                    mr.losses_by_kind
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "the harness missed a skipped fsync: {failures:#?}"
    );
}
