//! `commit_step` killed with SIGKILL between each pair of its parts
//! (contract v2; `docs/design/directory/lifecycle.md`). A worker process commits one step (two events, the
//! message snapshot, the run record, a checkpoint naming the last event,
//! and the finish), stopped with SIGSTOP at one pause point; the test
//! checks it is stopped there, kills it, and reads the run back:
//!
//! - exactly the documented prefix of the step landed (events, messages,
//!   run record, checkpoint, finish record, finish tombstone — in that
//!   order), nothing after the kill point;
//! - no checkpoint or message snapshot names an event that is not there;
//! - no sidecar of the step is visible as a record;
//! - killed after the finish record, the finish holds: the fence is
//!   refused, claims answer `Finished`, reopen repairs the tombstone.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use runkeep::step::{MessagesUpdate, Step};
use runkeep::{
    CheckpointId, CheckpointStore, ClaimOutcome, Error, EvidenceStore, Fence, MessageSnapshot,
    NewEvent, Outcome, ReadEventsOptions, RunStatus,
};
use serde_json::{json, Map};

/// The step's pause points, in the order its parts are written.
const POINTS: [&str; 6] = [
    "step-after-check",
    "step-after-events",
    "step-after-messages",
    "step-after-record",
    "step-after-checkpoint",
    "finish-after-record",
];

fn the_step(last_seq_before: u64) -> Step {
    let mut cp = cp("c_step", 2_000);
    cp.state
        .insert("throughSeq".into(), json!(last_seq_before + 2));
    let mut record = Map::new();
    record.insert("phase".into(), json!("done"));
    Step {
        events: vec![
            NewEvent::new("tool_call", Map::new()),
            NewEvent::new("tool_result", Map::new()),
        ],
        checkpoint: Some(cp),
        messages: Some(MessagesUpdate {
            messages: vec![json!({"role": "assistant", "content": "done"})],
            through_event_seq: None,
        }),
        run_record: Some(record),
        finish: Some(Outcome::completed(Some(json!({"answer": 42})))),
    }
}

#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    assert_eq!(role, "step");
    let store = open(&PathBuf::from(env("BASE")));
    let rt = rt();
    let s = scope(&env("RUN"));
    let fence = Fence::new(env("FENCE").parse().unwrap()).unwrap();
    report("ready");
    let r = rt.block_on(store.commit_step(&s, fence, &the_step(1)));
    report(format!("done {}", r.is_ok()));
}

/// What landed, read back.
#[derive(Debug, PartialEq)]
struct Landed {
    events: bool,
    messages: bool,
    record: bool,
    checkpoint: bool,
    finish_record: bool,
    tombstone: bool,
}

impl Landed {
    fn as_prefix(&self) -> usize {
        let parts = [
            self.events,
            self.messages,
            self.record,
            self.checkpoint,
            self.finish_record,
            self.tombstone,
        ];
        let n = parts.iter().take_while(|p| **p).count();
        assert!(
            parts[n..].iter().all(|p| !p),
            "not a prefix of the step's order: {self:?}"
        );
        n
    }
}

fn run_to(point: Option<&str>, run: &str) -> (tempfile::TempDir, Landed) {
    run_with(point, run, None)
}

fn run_with(point: Option<&str>, run: &str, mutation: Option<&str>) -> (tempfile::TempDir, Landed) {
    let dir = tempdir();
    let store = open(dir.path());
    let rt = rt();
    let s = scope(run);
    rt.block_on(store.write_checkpoint(&s, &cp("c0", 1_000), None))
        .unwrap();
    let lease = rt
        .block_on(store.claim(&s, &opts("parent", 600_000, now_ms())))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(store.append_events(&s, &[NewEvent::new("start", Map::new())], Some(lease.fence)))
        .unwrap();
    let mut envs = vec![
        ("BASE", dir.path().display().to_string()),
        ("RUN", run.to_string()),
        ("FENCE", lease.fence.get().to_string()),
    ];
    if let Some(p) = point {
        envs.push(("RUNKEEP_FS_TEST_PAUSE", p.to_string()));
    }
    if let Some(m) = mutation {
        envs.push(("RUNKEEP_FS_TEST_MUTATION", m.to_string()));
    }
    let mut w = spawn("step", &envs);
    w.expect("ready", Duration::from_secs(30));
    match point {
        Some(p) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            while proc_state(w.pid()) != 'T' {
                assert!(
                    Instant::now() < deadline,
                    "the worker never stopped at {p}; reports {:?}",
                    w.reports
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let reports = w.kill9();
            assert!(
                !reports.iter().any(|r| r.starts_with("done")),
                "killed at {p} after it finished: {reports:?}"
            );
        }
        None => {
            let reports = w.finish(Duration::from_secs(30));
            assert!(reports.contains(&"done true".to_string()), "{reports:?}");
        }
    }
    let run_dir = store.run_dir(&s);
    let batch = rt
        .block_on(store.read_events(&s, &ReadEventsOptions::default()))
        .unwrap();
    assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
    let events = match batch.last_seq {
        1 => false,
        3 => true,
        n => panic!("a step's events land all or nothing; the log ends at {n}"),
    };
    let messages = match rt.block_on(store.read_messages(&s)).unwrap() {
        MessageSnapshot::Unavailable => false,
        MessageSnapshot::Available {
            through_event_seq, ..
        } => {
            assert!(
                through_event_seq <= batch.last_seq,
                "the snapshot names event {through_event_seq}, the log ends at {}",
                batch.last_seq
            );
            true
        }
        other => panic!("{other:?}"),
    };
    let record = rt.block_on(store.read_run_record(&s)).unwrap().is_some();
    let checkpoint = match rt
        .block_on(store.read_checkpoint(&s, &CheckpointId::new("c_step").unwrap()))
        .unwrap()
    {
        None => false,
        Some(c) => {
            let through = c.state["throughSeq"].as_u64().unwrap();
            assert!(
                through <= batch.last_seq,
                "the checkpoint names event {through}, the log ends at {}",
                batch.last_seq
            );
            true
        }
    };
    let finish_record = run_dir.join(".runkeep/lifecycle.json").exists();
    let tombstone = run_dir
        .join("claims")
        .join(format!("{}.json", lease.fence.get() + 1))
        .exists();
    // A killed step leaves at most sidecars (`*.tmp`, ignored by every
    // reader, swept by the doctor) next to the records it published.
    let known = [
        ".runkeep",
        "checkpoints",
        "claims",
        "transcript.jsonl",
        "messages.json",
        "run.json",
        "c0.json",
        "c_step.json",
    ];
    for d in [run_dir.clone(), run_dir.join("checkpoints")] {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            assert!(
                known.contains(&n.as_str()) || n.ends_with(".tmp"),
                "unexpected entry {n} in {}",
                d.display()
            );
        }
    }
    // Whatever landed, the run is readable and the fence is either still
    // the holder's (no finish record) or spent (finish record).
    let l = rt.block_on(store.lifecycle(&s)).unwrap();
    assert_eq!(l.status.is_finished(), finish_record);
    let write = rt.block_on(store.write_report(&s, "late", Some(lease.fence)));
    if finish_record {
        assert!(matches!(write, Err(Error::FencedOut { .. })), "{write:?}");
        assert_eq!(
            rt.block_on(store.claim(&s, &opts("next", 1_000, now_ms())))
                .unwrap(),
            ClaimOutcome::Finished(RunStatus::Completed)
        );
    } else {
        write.unwrap();
    }
    (
        dir,
        Landed {
            events,
            messages,
            record,
            checkpoint,
            finish_record,
            tombstone,
        },
    )
}

#[test]
fn a_step_killed_between_any_two_parts_leaves_exactly_a_prefix() {
    for (i, point) in POINTS.iter().enumerate() {
        let (_dir, landed) = run_to(Some(point), &format!("run_kill_{i}"));
        assert_eq!(
            landed.as_prefix(),
            i,
            "killed at {point}: expected the first {i} parts, got {landed:?}"
        );
    }
    let (_dir, landed) = run_to(None, "run_kill_none");
    assert_eq!(landed.as_prefix(), 6, "{landed:?}");
}

/// Killed after its finish record, the run is finished; reopen publishes
/// the tombstone the kill prevented, so the next fence is above it.
#[test]
fn reopen_repairs_a_finish_killed_before_its_tombstone() {
    let (dir, landed) = run_to(Some("finish-after-record"), "run_kill_reopen");
    assert!(landed.finish_record && !landed.tombstone);
    let store = open(dir.path());
    let rt = rt();
    let s = scope("run_kill_reopen");
    rt.block_on(store.reopen(&s)).unwrap();
    let l = rt
        .block_on(store.claim(&s, &opts("again", 60_000, now_ms())))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(l.fence.get(), 3, "above the finish's tombstone at 2");
}

/// A refused step (stale fence) creates nothing at all: not even a sidecar.
#[test]
fn a_refused_step_leaves_the_tree_unchanged() {
    let dir = tempdir();
    let store = open(dir.path());
    let rt = rt();
    let s = scope("run_refused_step");
    rt.block_on(store.write_checkpoint(&s, &cp("c0", 1_000), None))
        .unwrap();
    let old = rt
        .block_on(store.claim(&s, &opts("a", 1_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(store.claim(&s, &opts("b", 60_000, 10_000)))
        .unwrap()
        .lease()
        .unwrap();
    // A first refusal creates the refusal log, so the step's own refusal
    // only appends to it.
    assert!(rt
        .block_on(store.write_report(&s, "x", Some(old.fence)))
        .is_err());
    let before = tree(dir.path());
    let err = rt
        .block_on(store.commit_step(&s, old.fence, &the_step(0)))
        .unwrap_err();
    assert!(matches!(err, Error::FencedOut { .. }), "{err}");
    let mut after = tree(dir.path());
    // The refusal is logged (the doctor's evidence); nothing else changes.
    after.retain(|p, _| !p.ends_with(".runkeep/fenced-out.jsonl"));
    let mut before = before;
    before.retain(|p, _| !p.ends_with(".runkeep/fenced-out.jsonl"));
    assert_eq!(before, after);
}

/// Meta-test: a store that publishes the checkpoint before the events is
/// caught by the same kill (a checkpoint naming events that are not there).
#[test]
fn the_kill_test_catches_a_checkpoint_published_before_its_events() {
    let caught = std::panic::catch_unwind(|| {
        run_with(
            Some("step-after-check"),
            "run_kill_mutant",
            Some("step-checkpoint-first"),
        )
    });
    let msg = match caught {
        Ok((_, landed)) => panic!("the mutant passed: {landed:?}"),
        Err(p) => p.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        msg.contains("the checkpoint names event 3, the log ends at 1"),
        "{msg}"
    );
}
