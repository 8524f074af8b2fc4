//! A *slow* holder — not only a stopped one — must not land
//! a write after a takeover. A writer whose fsync takes seconds (a delayed
//! `fsync`, as a saturated disk does) while another process takes the run
//! over is refused when it finally gets to publish: the long work happens
//! before the fence check that counts, and only the check and the one
//! publishing system call run under the run lock.
//!
//! The slow writer is a real process (the test binary re-entered) whose
//! every `fsync` of a file is delayed 3 s (`RUNKEEP_FS_TEST_DELAY=fsync:3000`,
//! store opened with `Durability::PowerLoss`). The test takes the run over
//! while the writer is inside that fsync (it checks the writer reported its
//! claim and then waits into the delay), and asserts the takeover happened
//! before the writer's write returned.

mod common;

use std::time::{Duration, Instant};

use common::*;
use runkeep::{
    CheckpointStore, ClaimOptions, ClaimOutcome, EvidenceStore, NewEvent, RunRecord, Timestamp, Ttl,
};
use runkeep_fs::{Durability, FsOptions, FsStore};

#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    let base = std::path::PathBuf::from(env("BASE"));
    let store = FsStore::open(
        &base,
        FsOptions {
            attribution: Some(attribution()),
            durability: Durability::PowerLoss,
            ..Default::default()
        },
    )
    .unwrap();
    let rt = rt();
    let s = scope("run_slow");
    let opts = ClaimOptions::new(holder("slow"), Ttl::from_millis(60_000).unwrap());
    let Ok(ClaimOutcome::Acquired(l)) = rt.block_on(store.claim(&s, &opts.at(Timestamp::now())))
    else {
        panic!("the slow writer must win its claim");
    };
    report(format!("claimed {}", l.fence));
    let outcome = match role.as_str() {
        "slow-document" => {
            let record: RunRecord = serde_json::from_value(
                serde_json::json!({"runId": "run_slow", "status": "running"}),
            )
            .unwrap();
            rt.block_on(store.write_run_record(&s, &record, Some(l.fence)))
                .map(|_| ())
        }
        "slow-append" => rt
            .block_on(store.append_events(
                &s,
                &[NewEvent::new("step", Default::default())],
                Some(l.fence),
            ))
            .map(|_| ()),
        other => panic!("unknown role {other}"),
    };
    match outcome {
        Ok(()) => report(format!("wrote at {}", now_ms())),
        Err(e) => report(format!("refused {} at {}", e.kind(), now_ms())),
    }
}

/// Runs one slow writer, takes the run over while it is slow, and answers
/// (the writer's outcome, when the takeover was acquired, the new fence).
fn scenario(role: &str, delay: &str, mutation: Option<&str>) -> (String, i64, u64) {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_slow");
    let mut envs = vec![
        ("BASE", base.display().to_string()),
        ("RUNKEEP_FS_TEST_DELAY", delay.to_string()),
    ];
    if let Some(m) = mutation {
        envs.push(("RUNKEEP_FS_TEST_MUTATION", m.to_string()));
    }
    let mut w = spawn(role, &envs);
    w.expect("claimed", Duration::from_secs(60));
    // The writer is now inside its slow write; take the run over with a
    // clock an hour ahead (its 60 s lease is expired for us).
    std::thread::sleep(Duration::from_millis(500));
    let later = Timestamp::from_millis(now_ms() + 3_600_000).unwrap();
    let started = Instant::now();
    let got = rt
        .block_on(store.claim(
            &s,
            &ClaimOptions::new(holder("taker"), Ttl::from_millis(3_600_000).unwrap()).at(later),
        ))
        .unwrap();
    let ClaimOutcome::Acquired(l) = got else {
        panic!("the takeover must win: {got:?}")
    };
    let took_over_at = now_ms();
    eprintln!(
        "takeover acquired fence {} after {:?}",
        l.fence,
        started.elapsed()
    );
    let reports = w.finish(Duration::from_secs(60));
    (
        reports.last().cloned().unwrap_or_default(),
        took_over_at,
        l.fence.get(),
    )
}

fn outcome_time(outcome: &str) -> i64 {
    outcome.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn a_document_write_slowed_by_its_fsync_is_refused_after_a_takeover() {
    let (outcome, took_over_at, fence) = scenario("slow-document", "fsync:3000", None);
    eprintln!("{outcome}");
    assert!(
        outcome_time(&outcome) > took_over_at,
        "the writer finished before the takeover, so the race was not forced: {outcome}"
    );
    assert!(
        outcome.starts_with("refused fenced_out"),
        "a slow document write landed after the takeover at fence {fence}: {outcome}"
    );
}

#[test]
fn an_append_slowed_inside_its_critical_section_is_refused_after_a_takeover() {
    let (outcome, took_over_at, fence) =
        scenario("slow-append", "append-before-recheck:3000", None);
    assert!(outcome_time(&outcome) > took_over_at, "{outcome}");
    assert!(
        outcome.starts_with("refused fenced_out"),
        "a slow append landed after the takeover at fence {fence}: {outcome}"
    );
}

/// Meta-test: without the second fence check just before the write, the
/// same slow append lands after the takeover, and the test above sees it.
#[test]
fn the_slow_append_test_catches_a_store_without_the_recheck() {
    let (outcome, took_over_at, _) = scenario(
        "slow-append",
        "append-before-recheck:3000",
        Some("no-append-recheck"),
    );
    assert!(outcome_time(&outcome) > took_over_at, "{outcome}");
    assert!(outcome.starts_with("wrote"), "{outcome}");
}
