//! Appends that fail or die half-way leave no permanent damage: a
//! failed append (events or audit) truncates the log back to its
//! length before the call, a batch is all-or-nothing, and a torn tail left
//! by a dead appender is removed by the next append instead of being sealed
//! into the log — but a fragment a live lock-less (reference) writer may
//! still be writing is never cut.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use runkeep::{
    Error, EventBatch, EvidenceStore, Integrity, NewAuditEvent, NewEvent, ReadEventsOptions,
};
use runkeep_fs::testing::{inject, inject_short_write, FaultPoint};
use runkeep_fs::{Durability, FsOptions, FsStore};
use serde_json::{json, Map};

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

/// Entry point of the worker processes the tests below spawn (this binary
/// re-entered with a role in `RUNKEEP_FS_WORKER`); a no-op otherwise.
#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    let base = std::path::PathBuf::from(env("BASE"));
    let store = open(&base);
    let rt = rt();
    match role.as_str() {
        // Appends one batch; the test has set RUNKEEP_FS_TEST_PAUSE so it
        // stops itself with half the batch written, holding the run lock.
        "appender" => {
            report("ready");
            let n: usize = env("EVENTS").parse().unwrap();
            let events: Vec<NewEvent> = (0..n).map(|i| big("killed", i, 300_000)).collect();
            rt.block_on(store.append_events(&scope("run_torn"), &events, None))
                .unwrap();
            report("appended");
        }
        other => panic!("unknown role {other}"),
    }
}

fn big(tag: &str, i: usize, size: usize) -> NewEvent {
    let mut p = Map::new();
    p.insert("tag".into(), json!(format!("{tag}-{i}")));
    p.insert("blob".into(), json!("x".repeat(size)));
    NewEvent::new("big", p)
}

fn ev(tag: &str) -> NewEvent {
    let mut p = Map::new();
    p.insert("tag".into(), json!(tag));
    NewEvent::new("e", p)
}

fn strict() -> ReadEventsOptions {
    ReadEventsOptions {
        integrity: Integrity::Strict,
        ..Default::default()
    }
}

fn tags(b: &EventBatch) -> Vec<(u64, String)> {
    b.events
        .iter()
        .map(|e| {
            (
                e.seq,
                e.payload["tag"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn expect_err<T: std::fmt::Debug>(r: runkeep::Result<T>) -> Error {
    match r {
        Ok(v) => panic!("expected an error, the call resolved: {v:?}"),
        Err(e) => e,
    }
}

fn raw_append(path: &Path, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

/// Sets a file's mtime `secs` seconds into the past.
fn age(path: &Path, secs: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_times(
        std::fs::FileTimes::new().set_modified(SystemTime::now() - Duration::from_secs(secs)),
    )
    .unwrap();
}

/// Every `since_seq` answer of the (indexed) store equals a full scan.
fn assert_index_agrees(store: &FsStore, s: &runkeep::RunScope, run_dir: &Path, upto: u64) {
    let rt = rt();
    let read = |since| {
        rt.block_on(store.read_events(
            s,
            &ReadEventsOptions {
                since_seq: since,
                ..Default::default()
            },
        ))
        .unwrap()
    };
    let indexed: Vec<_> = (0..=upto).map(read).collect();
    let idx = run_dir.join(".runkeep/transcript.idx");
    let saved = std::fs::read(&idx).unwrap();
    std::fs::remove_file(&idx).unwrap();
    for (since, got) in indexed.iter().enumerate() {
        let full = read(since as u64);
        assert_eq!(got.events, full.events, "since {since}");
        assert_eq!(got.last_seq, full.last_seq, "since {since}");
        assert_eq!(got.skipped, full.skipped, "since {since}");
    }
    std::fs::write(&idx, saved).unwrap();
}

/// (a) A disk that fills up in the middle of a large append: the call fails
/// and the transcript and its offset index are byte-identical to before;
/// the next append lands on a clean line and the strict read passes. Same
/// for the audit trail.
#[test]
fn an_append_failing_half_way_leaves_the_log_byte_identical() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_full");
    rt.block_on(store.append_events(&s, &[ev("one"), ev("two")], None))
        .unwrap();
    rt.block_on(store.append_audit(&s, &[NewAuditEvent::new("w", "one", "ok")], None))
        .unwrap();
    let rd = store.run_dir(&s);
    let (t, a, i) = (
        rd.join("transcript.jsonl"),
        rd.join("audit.jsonl"),
        rd.join(".runkeep/transcript.idx"),
    );
    let before = |p: &Path| std::fs::read(p).unwrap();
    let (t0, a0, i0) = (before(&t), before(&a), before(&i));
    let e = {
        let _f = inject_short_write(FaultPoint::Append, &base, ENOSPC, 2);
        let e = expect_err(rt.block_on(store.append_events(&s, &[big("lost", 0, 200_000)], None)));
        let ea = expect_err(rt.block_on(store.append_audit(
            &s,
            &[NewAuditEvent::new("w", "x".repeat(100_000), "ok")],
            None,
        )));
        assert!(ea.to_string().contains("ENOSPC"), "{ea}");
        e
    };
    assert!(e.to_string().contains("ENOSPC"), "{e}");
    assert!(
        std::fs::read(&t).unwrap() == t0,
        "the failed append left {} bytes behind in the transcript",
        std::fs::metadata(&t).unwrap().len() - t0.len() as u64
    );
    assert!(
        std::fs::read(&a).unwrap() == a0,
        "the failed append left bytes in the audit trail"
    );
    assert!(std::fs::read(&i).unwrap() == i0, "the index changed");
    let back = rt.block_on(store.read_events(&s, &strict())).unwrap();
    assert_eq!(tags(&back), [(1, "one".into()), (2, "two".into())]);

    let three = rt
        .block_on(store.append_events(&s, &[ev("three")], None))
        .unwrap();
    assert_eq!(three[0].seq, 3);
    let back = rt
        .block_on(store.read_events(&s, &strict()))
        .expect("the strict read after a failed and a successful append");
    assert_eq!(
        tags(&back),
        [(1, "one".into()), (2, "two".into()), (3, "three".into())]
    );
    rt.block_on(store.append_audit(&s, &[NewAuditEvent::new("w", "two", "ok")], None))
        .unwrap();
    let audit = rt.block_on(store.read_audit(&s, 0)).unwrap();
    assert_eq!(
        audit
            .iter()
            .map(|r| (r.seq, r.what.as_str()))
            .collect::<Vec<_>>(),
        [(1, "one"), (2, "two")]
    );
    assert!(std::fs::read(&a).unwrap().ends_with(b"\n"));
    assert_index_agrees(&store, &s, &rd, 4);
}

/// (b) A batch failing half-way (its first event written whole, the second
/// in part) leaves no prefix of its events: the caller's retry of the same
/// batch lands it once, numbered as if the failure never happened.
#[test]
fn a_batch_failing_half_way_leaves_no_prefix_and_a_retry_does_not_duplicate() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_batch");
    rt.block_on(store.append_events(&s, &[ev("zero")], None))
        .unwrap();
    let t = store.run_dir(&s).join("transcript.jsonl");
    let t0 = std::fs::read(&t).unwrap();
    let batch = [ev("a"), ev("b"), ev("c")];
    {
        let _f = inject_short_write(FaultPoint::Append, &base, EIO, 1);
        expect_err(rt.block_on(store.append_events(&s, &batch, None)));
    }
    let after = std::fs::read(&t).unwrap();
    assert!(
        after == t0,
        "the failed batch left a prefix: {:?}",
        String::from_utf8_lossy(&after[t0.len()..])
    );
    let got = rt.block_on(store.append_events(&s, &batch, None)).unwrap();
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3, 4]);
    let back = rt.block_on(store.read_events(&s, &strict())).unwrap();
    assert_eq!(
        tags(&back),
        [
            (1, "zero".into()),
            (2, "a".into()),
            (3, "b".into()),
            (4, "c".into())
        ]
    );
    assert_index_agrees(&store, &s, &store.run_dir(&s), 5);
}

/// (b) A batch whose write landed but whose fsync failed (`PowerLoss`) is
/// reported failed, so it must not stay in the log either (a caller that
/// could retry would duplicate it).
#[test]
fn a_batch_whose_fsync_failed_is_not_left_in_the_log() {
    let dir = tempdir();
    let base = dir.path().join("runs");
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
    let s = scope("run_sync");
    rt.block_on(store.append_events(&s, &[ev("zero")], None))
        .unwrap();
    let t = store.run_dir(&s).join("transcript.jsonl");
    let t0 = std::fs::read(&t).unwrap();
    let e = {
        let _f = inject(FaultPoint::Fsync, &base, EIO);
        expect_err(rt.block_on(store.append_events(&s, &[ev("a"), ev("b")], None)))
    };
    assert!(e.to_string().contains("fsync failed"), "{e}");
    assert!(
        std::fs::read(&t).unwrap() == t0,
        "a batch reported failed stayed in the transcript"
    );
    let back = rt.block_on(store.read_events(&s, &strict())).unwrap();
    assert_eq!(tags(&back), [(1, "zero".into())]);
}

/// (c) A torn tail whose writer is long gone (mtime well past the grace
/// period; no runkeep appender holds the run lock) is removed by the next
/// append instead of being sealed into the log: the strict read passes
/// afterwards. Same for the audit trail.
#[test]
fn an_old_torn_tail_is_removed_by_the_next_append() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_old");
    rt.block_on(store.append_events(&s, &[ev("one")], None))
        .unwrap();
    rt.block_on(store.append_audit(&s, &[NewAuditEvent::new("w", "one", "ok")], None))
        .unwrap();
    let rd = store.run_dir(&s);
    let (t, a) = (rd.join("transcript.jsonl"), rd.join("audit.jsonl"));
    let (t0, a0) = (std::fs::read(&t).unwrap(), std::fs::read(&a).unwrap());
    raw_append(&t, b"{\"type\":\"tool_completed\",\"seq\":2,\"resu");
    raw_append(&a, b"{\"id\":\"x\",\"runId\":\"run_old\",\"seq\":2,\"wh");
    age(&t, 10);
    age(&a, 10);
    let two = rt
        .block_on(store.append_events(&s, &[ev("two")], None))
        .unwrap();
    assert_eq!(two[0].seq, 2);
    let text = std::fs::read(&t).unwrap();
    assert!(
        text.starts_with(&t0) && !String::from_utf8_lossy(&text).contains("resu"),
        "the fragment was kept: {:?}",
        String::from_utf8_lossy(&text)
    );
    let back = rt
        .block_on(store.read_events(&s, &strict()))
        .expect("the strict read after the torn tail was removed");
    assert_eq!(tags(&back), [(1, "one".into()), (2, "two".into())]);
    assert!(back.skipped.is_empty());
    rt.block_on(store.append_audit(&s, &[NewAuditEvent::new("w", "two", "ok")], None))
        .unwrap();
    let audit = std::fs::read(&a).unwrap();
    assert!(
        audit.starts_with(&a0) && !String::from_utf8_lossy(&audit).contains("\"wh\n"),
        "the audit fragment was kept: {:?}",
        String::from_utf8_lossy(&audit)
    );
    assert_eq!(
        String::from_utf8_lossy(&audit).lines().count(),
        2,
        "{audit:?}"
    );
    assert_index_agrees(&store, &s, &rd, 3);
}

/// Spawns an appender of `events` large events that stops itself half-way
/// through its write (holding the run lock), then SIGKILLs it. Returns the
/// transcript's bytes before the kill (the fragment included).
fn kill_mid_append(base: &Path, events: usize) -> Vec<u8> {
    let t = base.join("run_torn/transcript.jsonl");
    let len0 = std::fs::metadata(&t).unwrap().len();
    let mut w = spawn(
        "appender",
        &[
            ("BASE", base.display().to_string()),
            ("EVENTS", events.to_string()),
            ("RUNKEEP_FS_TEST_PAUSE", "mid-append-write".to_string()),
        ],
    );
    w.expect("ready", Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(20);
    while proc_state(w.pid()) != 'T' {
        assert!(Instant::now() < deadline, "the appender never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let reports = w.kill9();
    assert!(!reports.iter().any(|r| r == "appended"), "{reports:?}");
    let torn = std::fs::read(&t).unwrap();
    assert!(torn.len() as u64 > len0, "the appender wrote nothing");
    assert_ne!(torn.last(), Some(&b'\n'), "no torn tail to test");
    torn
}

/// (c) A real appender process SIGKILLed in the middle of its write (a
/// 3-event batch, half written: one whole line and a fragment) leaves a
/// torn tail that is fresh — but it was written under the run lock by a
/// runkeep appender that is now dead, so the very next append removes the
/// whole unacknowledged batch (not just the fragment: all-or-nothing) and
/// the strict read passes.
#[test]
fn a_torn_tail_of_a_killed_appender_is_removed_by_the_next_append() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_torn");
    rt.block_on(store.append_events(&s, &[ev("one")], None))
        .unwrap();
    let t = store.run_dir(&s).join("transcript.jsonl");
    let t0 = std::fs::read(&t).unwrap();
    for events in [3, 1] {
        let torn = kill_mid_append(&base, events);
        if events == 3 {
            let landed = torn[t0.len()..].iter().filter(|b| **b == b'\n').count();
            assert_eq!(landed, 1, "expected one whole line of the killed batch");
        }
        // Within the grace period of a lock-less writer: only the intent
        // the dead appender recorded lets this append remove the fragment.
        let next = rt
            .block_on(store.append_events(&s, &[ev("two")], None))
            .unwrap();
        assert_eq!(next[0].seq, 2, "{events}-event batch");
        let back = rt
            .block_on(store.read_events(&s, &strict()))
            .unwrap_or_else(|e| panic!("{events}-event batch: strict read: {e}"));
        assert_eq!(tags(&back), [(1, "one".into()), (2, "two".into())]);
        assert_index_agrees(&store, &s, &store.run_dir(&s), 3);
        // Back to one event for the next round.
        std::fs::write(&t, &t0).unwrap();
        std::fs::remove_file(store.run_dir(&s).join(".runkeep/transcript.idx")).unwrap();
    }
}

/// (d) A fragment a lock-less writer (the reference, writing one large line
/// in several chunks) is writing right now is not cut: its bytes stay where
/// they are; the append terminates it and lands on its own line (the
/// heal the reference applies itself), so the writer's line is split but nothing
/// is removed.
#[test]
fn a_fresh_fragment_of_a_lockless_writer_is_not_cut() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_live");
    rt.block_on(store.append_events(&s, &[ev("one")], None))
        .unwrap();
    let t = store.run_dir(&s).join("transcript.jsonl");
    let t0 = std::fs::read(&t).unwrap();
    let chunk1 = format!(
        "{{\"type\":\"ref\",\"seq\":2,\"blob\":\"{}",
        "r".repeat(70_000)
    );
    raw_append(&t, chunk1.as_bytes());
    let got = rt
        .block_on(store.append_events(&s, &[ev("two")], None))
        .unwrap();
    raw_append(&t, b"\"}\n");
    let text = std::fs::read(&t).unwrap();
    let mut expected_prefix = t0.clone();
    expected_prefix.extend_from_slice(chunk1.as_bytes());
    assert!(
        text.starts_with(&expected_prefix),
        "the live writer's first chunk was cut"
    );
    assert_eq!(got[0].seq, 2);
    let back = rt
        .block_on(store.read_events(&s, &Default::default()))
        .unwrap();
    assert!(
        tags(&back).contains(&(2, "two".into())),
        "{:?}",
        tags(&back)
    );
}
