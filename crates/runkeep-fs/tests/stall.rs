//! Stall tests (no superseded write can win): a holder process
//! is SIGSTOPped past its lease, another process takes the run over and
//! writes, the first is SIGCONTed and writes. Plus the measured residual
//! window: a holder stopped *inside* its critical section.

mod common;

use std::time::{Duration, Instant};

use common::*;
use runkeep::{
    CheckpointStore, ClaimOptions, ClaimOutcome, EvidenceStore, Fence, NewEvent, ReadEventsOptions,
    Timestamp, Ttl,
};
use rustix::process::Signal;
use serde_json::Map;

/// Entry point of the worker processes the tests below spawn (this binary
/// re-entered with a role in `RUNKEEP_FS_WORKER`); a no-op otherwise.
#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    match role.as_str() {
        "holder" => holder_worker(),
        "taker" => taker_worker(),
        other => panic!("unknown worker role {other}"),
    }
}

fn outcome<T>(r: runkeep::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) if e.is_fenced_out() => "fenced_out".into(),
        Err(e) => format!("error:{}", e.kind()),
    }
}

fn ev(t: &str) -> NewEvent {
    NewEvent::new(t, Map::new())
}

fn holder_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let pause_in = std::env::var("PAUSE_IN").unwrap_or_default();
    let store = open(&base);
    let rt = rt();
    let s = scope("run_stalled");
    let opts = ClaimOptions::new(holder("w1"), Ttl::from_millis(1500).unwrap());
    let lease = rt
        .block_on(store.claim(&s, &opts))
        .unwrap()
        .lease()
        .expect("w1 takes the run");
    let f = Some(lease.fence);
    rt.block_on(store.write_checkpoint(&s, &cp("cp_w1_early", now_ms()), f))
        .unwrap();
    rt.block_on(store.append_events(&s, &[ev("w1_early")], f))
        .unwrap();
    report(format!("ready {}", lease.fence));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // A late checkpoint whose clock says "newest": only the fence can keep
    // it from becoming the resume point.
    let late = cp("cp_w1_late", now_ms() + 3_600_000);
    if pause_in == "checkpoint" {
        std::env::set_var("RUNKEEP_FS_TEST_PAUSE", "after-fence-check");
    }
    let r = rt.block_on(store.write_checkpoint(&s, &late, f));
    std::env::remove_var("RUNKEEP_FS_TEST_PAUSE");
    report(format!("late-checkpoint {}", outcome(r)));
    if pause_in == "append" {
        std::env::set_var("RUNKEEP_FS_TEST_PAUSE", "after-fence-check");
    }
    if pause_in == "append-numbered" {
        std::env::set_var("RUNKEEP_FS_TEST_PAUSE", "before-append-write");
    }
    let r = rt.block_on(store.append_events(&s, &[ev("w1_late")], f));
    std::env::remove_var("RUNKEEP_FS_TEST_PAUSE");
    report(format!("late-append {}", outcome(r)));
    let r = rt.block_on(store.write_report(&s, "w1 thinks it finished", f));
    report(format!("late-report {}", outcome(r)));
    report("done");
}

fn taker_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let store = open(&base);
    let rt = rt();
    let s = scope("run_stalled");
    let opts = ClaimOptions::new(holder("w2"), Ttl::from_millis(60_000).unwrap());
    let started = Instant::now();
    let lease = match rt.block_on(store.claim(&s, &opts)).unwrap() {
        ClaimOutcome::Acquired(l) => l,
        other => panic!("w2 could not take the run: {other:?}"),
    };
    report(format!(
        "took {} in {}ms",
        lease.fence,
        started.elapsed().as_millis()
    ));
    let f = Some(lease.fence);
    // While w1 is stopped *inside* a write it holds the run lock: w2's write
    // is refused (retryable, nothing written) instead of racing it.
    let first = rt.block_on(store.append_events(&s, &[ev("w2")], f));
    let retry = first.as_ref().is_err_and(|e| e.is_retryable());
    if let Err(e) = &first {
        assert!(retry, "w2's first write failed for good: {e}");
    }
    report(format!("first-write {}", outcome(first)));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    if retry {
        rt.block_on(store.append_events(&s, &[ev("w2")], f))
            .unwrap();
    }
    rt.block_on(store.write_checkpoint(&s, &cp("cp_w2", now_ms()), f))
        .unwrap();
    report("wrote");
}

struct Outcome {
    holder_reports: Vec<String>,
    taker_reports: Vec<String>,
    base: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn stall(pause_in: &str) -> Outcome {
    stall_with(pause_in, &[])
}

fn stall_with(pause_in: &str, extra: &[(&str, String)]) -> Outcome {
    let dir = tempdir();
    let base = dir.path().join("runs");
    open(&base);
    let mut env = vec![
        ("BASE", base.display().to_string()),
        ("PAUSE_IN", pause_in.to_string()),
    ];
    env.extend(extra.iter().cloned());
    let mut w1 = spawn("holder", &env);
    assert_eq!(w1.expect("ready", Duration::from_secs(30)), "ready 1");
    if pause_in.is_empty() {
        signal(w1.pid(), Signal::Stop);
    } else {
        // It stops itself inside its critical section (after the fence
        // check, before publishing), holding the run lock.
        w1.send("go");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_state(w1.pid()) != 'T' {
        assert!(Instant::now() < deadline, "w1 never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past w1's 1.5 s lease.
    std::thread::sleep(Duration::from_millis(1700));

    let mut taker = spawn(
        "taker",
        &[
            ("BASE", base.display().to_string()),
            ("RUNKEEP_FS_TEST_LOCK_WAIT_MS", "300".to_string()),
        ],
    );
    taker.expect("first-write", Duration::from_secs(30));
    signal(w1.pid(), Signal::Cont);
    if pause_in.is_empty() {
        w1.send("go");
    }
    let holder_reports = w1.finish(Duration::from_secs(30));
    taker.send("go");
    let taker_reports = taker.finish(Duration::from_secs(30));
    eprintln!("stall({pause_in:?}): holder {holder_reports:?}; taker {taker_reports:?}");

    Outcome {
        holder_reports,
        taker_reports,
        base,
        _dir: dir,
    }
}

/// The stall test: w1 is stopped (between writes) past its lease, w2 takes
/// the run at fence 2 and writes, w1 resumes and writes. Every late write of
/// w1 — checkpoint, event append, report — is refused as fenced out; nothing
/// it wrote after the takeover is in the store, and the resume point is w2's.
#[test]
fn a_holder_stopped_past_its_lease_is_fenced_out_when_it_resumes() {
    let o = stall("");
    assert!(
        o.taker_reports[0].starts_with("took 2"),
        "{:?}",
        o.taker_reports
    );
    for expected in [
        "late-checkpoint fenced_out",
        "late-append fenced_out",
        "late-report fenced_out",
    ] {
        assert!(
            o.holder_reports.iter().any(|r| r == expected),
            "{expected}: {:?}",
            o.holder_reports
        );
    }
    let store = open(&o.base);
    let rt = rt();
    let s = scope("run_stalled");
    let ids: Vec<String> = rt
        .block_on(store.list_checkpoints(&s))
        .unwrap()
        .into_iter()
        .map(|c| c.id.to_string())
        .collect();
    assert_eq!(ids, ["cp_w1_early", "cp_w2"]);
    let latest = rt.block_on(store.latest_checkpoint(&s)).unwrap().unwrap();
    assert_eq!(latest.id.as_str(), "cp_w2");
    assert_eq!(latest.fence, Fence::new(2).ok());
    let events = rt
        .block_on(store.read_events(&s, &ReadEventsOptions::default()))
        .unwrap();
    let types: Vec<&str> = events
        .events
        .iter()
        .map(|e| e.event_type.as_str())
        .collect();
    assert_eq!(types, ["w1_early", "w2"]);
    assert_eq!(rt.block_on(store.read_report(&s)).unwrap(), None);
    // The refusals are counted on disk for the doctor (it reports two
    // writers on one run from them).
    let d = store.diagnose(Timestamp::now()).unwrap();
    assert_eq!(d.fenced_out_refusals, vec![(s.clone(), 3)]);
}

/// The residual window, measured: w1 stops itself *inside* its checkpoint
/// write (fence checked, holding the run lock, not yet renamed). w2's claim
/// waits for the lock only up to the bound, then proceeds, so the run is not
/// wedged; w2's write is refused (retryable, nothing written) while w1 holds
/// the lock. When w1 resumes, its one in-flight checkpoint lands — stamped
/// with fence 1, so it can never become the latest (w2's, at fence 2, stays
/// the resume point although w1's clock is an hour ahead). w1's next writes
/// are refused; w2's retry succeeds.
#[test]
fn a_holder_stopped_inside_its_checkpoint_write_lands_one_write_that_cannot_win() {
    let o = stall("checkpoint");
    let took = &o.taker_reports[0];
    assert!(took.starts_with("took 2"), "{took}");
    assert!(
        o.taker_reports
            .contains(&"first-write error:unavailable".to_string()),
        "w2 wrote while w1 held the run lock: {:?}",
        o.taker_reports
    );
    assert!(o.holder_reports.contains(&"late-checkpoint ok".to_string()));
    assert!(o
        .holder_reports
        .contains(&"late-append fenced_out".to_string()));
    let store = open(&o.base);
    let rt = rt();
    let s = scope("run_stalled");
    let cps = rt.block_on(store.list_checkpoints(&s)).unwrap();
    let late = cps.iter().find(|c| c.id.as_str() == "cp_w1_late").unwrap();
    assert_eq!(late.fence, Fence::new(1).ok());
    let latest = rt.block_on(store.latest_checkpoint(&s)).unwrap().unwrap();
    assert_eq!(latest.id.as_str(), "cp_w2");
    let row = rt
        .block_on(store.list_runs(
            &runkeep::ListingScope::tenant(tenant()),
            &Default::default(),
        ))
        .unwrap();
    assert_eq!(
        row.entries[0]
            .latest_checkpoint_id
            .as_ref()
            .map(|c| c.as_str()),
        Some("cp_w2")
    );
}

/// An append stopped after its first fence check (holding the run lock,
/// before its catch-up work): w2's writes are refused (retryable) until w1
/// resumes, and w1's append re-checks the fence just before its write
/// (a slow writer cannot land after a takeover), so the late batch is refused too — the window is only
/// the last check → write (next test). Sequence numbers stay unique and
/// contiguous: w2's event follows w1's early one.
#[test]
fn a_holder_stopped_inside_its_append_before_the_recheck_is_fenced_out() {
    let o = stall("append");
    assert!(
        o.taker_reports
            .contains(&"first-write error:unavailable".to_string()),
        "w2 wrote while w1 held the run lock: {:?}",
        o.taker_reports
    );
    // Its checkpoint write came first, before it stopped: still its lease.
    assert!(o.holder_reports.contains(&"late-checkpoint ok".to_string()));
    assert!(
        o.holder_reports
            .contains(&"late-append fenced_out".to_string()),
        "{:?}",
        o.holder_reports
    );
    assert!(o
        .holder_reports
        .contains(&"late-report fenced_out".to_string()));
    let store = open(&o.base);
    let rt = rt();
    let s = scope("run_stalled");
    let strict = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                integrity: runkeep::Integrity::Strict,
                ..Default::default()
            },
        ))
        .unwrap();
    let got: Vec<(u64, &str, Option<u64>)> = strict
        .events
        .iter()
        .map(|e| (e.seq, e.event_type.as_str(), e.generation.map(Fence::get)))
        .collect();
    assert_eq!(got, [(1, "w1_early", Some(1)), (2, "w2", Some(2))]);
}

/// The same window at its narrowest: w1 stops after its append has taken its
/// sequence number from the log, just before the write. A second appender
/// that went ahead without the lock would take the same number; refusing it
/// while the lock is held keeps every `seq` unique (the soak found this).
#[test]
fn a_holder_stopped_after_numbering_its_append_never_shares_a_seq() {
    let o = stall("append-numbered");
    assert!(
        o.holder_reports.contains(&"late-append ok".to_string()),
        "{:?}",
        o.holder_reports
    );
    let store = open(&o.base);
    let rt = rt();
    let strict = rt
        .block_on(store.read_events(
            &scope("run_stalled"),
            &ReadEventsOptions {
                integrity: runkeep::Integrity::Strict,
                ..Default::default()
            },
        ))
        .expect("the transcript passes the strict read: no shared seq");
    let seqs: Vec<u64> = strict.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert!(
        o.taker_reports
            .contains(&"first-write error:unavailable".to_string()),
        "{:?}",
        o.taker_reports
    );
}

/// Meta-test: against a store whose writes skip the fence check, the stall
/// scenario lets every late write of w1 through (so the stall test above can
/// fail).
#[test]
fn the_stall_test_catches_a_store_that_does_not_fence_writes() {
    let o = stall_with(
        "",
        &[("RUNKEEP_FS_TEST_MUTATION", "no-write-fence".to_string())],
    );
    assert!(o.holder_reports.contains(&"late-checkpoint ok".to_string()));
    assert!(o.holder_reports.contains(&"late-append ok".to_string()));
}
