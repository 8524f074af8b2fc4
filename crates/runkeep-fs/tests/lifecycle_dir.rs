//! Contract v2 on a directory: where the lifecycle lives and what the
//! reference (and a crash) can do to it. The conformance kit checks the
//! rules; these tests check the layout decisions of
//! `docs/design/directory/lifecycle.md`.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use runkeep::{
    CheckpointStore, ClaimOptions, ClaimOutcome, EnqueueOptions, Error, EvidenceStore,
    FinishStatus, ListOptions, ListingScope, ManualClock, NewEvent, Outcome, RunStatus, Ttl,
};
use runkeep_fs::{FsOptions, FsStore};
use serde_json::{json, Map, Value};

fn open_on(base: &Path, clock: &ManualClock) -> FsStore {
    FsStore::open(
        base,
        FsOptions {
            attribution: Some(attribution()),
            clock: Some(Arc::new(clock.clone())),
            ..Default::default()
        },
    )
    .unwrap()
}

fn body(store: &FsStore, run: &str, fence: u64) -> Map<String, Value> {
    let p = store
        .run_dir(&scope(run))
        .join("claims")
        .join(format!("{fence}.json"));
    match serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap() {
        Value::Object(m) => m,
        other => panic!("{other}"),
    }
}

fn claim_now(name: &str, ttl: u64) -> ClaimOptions {
    ClaimOptions::new(holder(name), Ttl::from_millis(ttl).unwrap())
}

fn acquired(o: ClaimOutcome) -> runkeep::Lease {
    match o {
        ClaimOutcome::Acquired(l) => l,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// Every body this store publishes carries the attempt count, so the
/// count moves with the hard link that arbitrates the claim; the reference
/// still reads the bodies (string `holder`, numeric `expiresAt`).
#[test]
fn holding_bodies_carry_the_attempt_count_and_stay_reference_shaped() {
    let dir = tempdir();
    let clock = ManualClock::new(at(1_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let a = scope("run_bodies");
    rt.block_on(store.write_checkpoint(&a, &cp("c1", 1), None))
        .unwrap();
    let l1 = acquired(
        rt.block_on(store.claim(&a, &claim_now("w1", 1_000)))
            .unwrap(),
    );
    assert_eq!(body(&store, "run_bodies", 1)["attempts"], json!(0));
    clock.advance(5_000);
    let l2 = acquired(
        rt.block_on(store.claim(&a, &claim_now("w2", 60_000)))
            .unwrap(),
    );
    assert_eq!(l2.fence.get(), l1.fence.get() + 1);
    let b = body(&store, "run_bodies", 2);
    assert_eq!(b["attempts"], json!(1), "a takeover counts: {b:?}");
    assert!(b["holder"].is_string() && b["expiresAt"].is_number());
    assert!(rt
        .block_on(store.snooze(&a, l2.fence, at(9_000_000)))
        .unwrap());
    let t = body(&store, "run_bodies", 3);
    assert_eq!(t["holder"], json!(""));
    assert_eq!(t["expiresAt"], json!(0));
    assert_eq!(t["attempts"], json!(1));
    assert_eq!(t["availableAt"], json!(9_000_000));
    // The lifecycle is read back from the bodies alone (no record yet).
    let l = rt.block_on(store.lifecycle(&a)).unwrap();
    assert_eq!(l.attempts, 1);
    assert_eq!(l.available_at, Some(at(9_000_000)));
    assert!(!store.run_dir(&a).join(".runkeep/lifecycle.json").exists());
}

/// A holding the reference wrote (no `attempts`) continues the count from
/// the nearest holding below that carries one.
#[test]
fn a_reference_holding_continues_the_attempt_count() {
    let dir = tempdir();
    let clock = ManualClock::new(at(1_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let a = scope("run_ref");
    rt.block_on(store.write_checkpoint(&a, &cp("c1", 1), None))
        .unwrap();
    acquired(
        rt.block_on(store.claim(&a, &claim_now("w1", 1_000)))
            .unwrap(),
    );
    clock.advance(5_000);
    acquired(
        rt.block_on(store.claim(&a, &claim_now("w2", 1_000)))
            .unwrap(),
    );
    assert_eq!(rt.block_on(store.lifecycle(&a)).unwrap().attempts, 1);
    // The reference takes the run over at fence 3 (its own body shape).
    let claims = store.run_dir(&a).join("claims");
    std::fs::write(
        claims.join("3.json"),
        br#"{"holder":"reference-worker","expiresAt":1000010}"#,
    )
    .unwrap();
    assert_eq!(rt.block_on(store.lifecycle(&a)).unwrap().attempts, 1);
    clock.advance(60_000);
    acquired(
        rt.block_on(store.claim(&a, &claim_now("w3", 60_000)))
            .unwrap(),
    );
    assert_eq!(
        body(&store, "run_ref", 4)["attempts"],
        json!(2),
        "the takeover from the reference's expired lease counts on top of 1"
    );
}

/// The dead-letter is decided by the claim's own link: its tombstone
/// carries `deadLetteredAt`, so the run stays failed even when the record
/// written after the link is lost (a crash between the two).
#[test]
fn a_dead_letter_survives_losing_its_record() {
    let dir = tempdir();
    let clock = ManualClock::new(at(1_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let a = scope("run_poison");
    rt.block_on(store.enqueue(
        &a,
        &cp("c1", 1),
        &EnqueueOptions {
            max_attempts: Some(2),
            ..Default::default()
        },
    ))
    .unwrap();
    acquired(
        rt.block_on(store.claim(&a, &claim_now("w1", 1_000)))
            .unwrap(),
    );
    clock.advance(5_000);
    acquired(
        rt.block_on(store.claim(&a, &claim_now("w2", 1_000)))
            .unwrap(),
    );
    clock.advance(5_000);
    let out = rt
        .block_on(store.claim(&a, &claim_now("w3", 1_000)))
        .unwrap();
    assert_eq!(out, ClaimOutcome::Finished(RunStatus::Failed));
    let t = body(&store, "run_poison", 3);
    assert_eq!(t["holder"], json!(""), "a tombstone, never a lease: {t:?}");
    assert_eq!(t["deadLetteredAt"], json!(1_010_000));
    assert_eq!(t["attempts"], json!(2));
    let record = store.run_dir(&a).join(".runkeep/lifecycle.json");
    assert!(record.exists());
    std::fs::remove_file(&record).unwrap();
    let l = rt.block_on(store.lifecycle(&a)).unwrap();
    assert_eq!(l.status, RunStatus::Failed);
    assert_eq!(
        l.reason.as_deref(),
        Some(runkeep::lifecycle::ATTEMPTS_EXHAUSTED)
    );
    assert_eq!(
        rt.block_on(store.claim(&a, &claim_now("w4", 1_000)))
            .unwrap(),
        ClaimOutcome::Finished(RunStatus::Failed)
    );
    // Reopen overrides the tombstone (its record is newer than it).
    let r = rt.block_on(store.reopen(&a)).unwrap();
    assert_eq!(r.status, RunStatus::Active);
    let l = acquired(
        rt.block_on(store.claim(&a, &claim_now("w5", 1_000)))
            .unwrap(),
    );
    assert_eq!(l.fence.get(), 4);
}

/// A finish whose tombstone never landed (a crash after its record, the
/// commit point): the fence is spent all the same, claims answer
/// `Finished`, the lease reads as released, and reopen publishes the
/// missing tombstone so the next claim is above every fence issued.
#[test]
fn a_finish_without_its_tombstone_still_spends_the_fence() {
    let dir = tempdir();
    let clock = ManualClock::new(at(1_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let a = scope("run_half_finish");
    rt.block_on(store.write_checkpoint(&a, &cp("c1", 1), None))
        .unwrap();
    let l = acquired(
        rt.block_on(store.claim(&a, &claim_now("w1", 600_000)))
            .unwrap(),
    );
    rt.block_on(store.finish(&a, l.fence, &Outcome::completed(Some(json!({"ok": 1})))))
        .unwrap();
    // Undo the tombstone: the state a crash between the two parts leaves.
    let tomb = store.run_dir(&a).join("claims/2.json");
    assert!(tomb.exists());
    std::fs::remove_file(&tomb).unwrap();
    let err = rt
        .block_on(store.write_checkpoint(&a, &cp("c2", 2), Some(l.fence)))
        .unwrap_err();
    assert!(matches!(err, Error::FencedOut { .. }), "{err}");
    let err = rt
        .block_on(store.append_events(&a, &[NewEvent::new("x", Map::new())], Some(l.fence)))
        .unwrap_err();
    assert!(matches!(err, Error::FencedOut { .. }), "{err}");
    assert!(!rt.block_on(store.release(&a, l.fence)).unwrap());
    assert_eq!(
        rt.block_on(store.claim(&a, &claim_now("w2", 1_000)))
            .unwrap(),
        ClaimOutcome::Finished(RunStatus::Completed)
    );
    let summary = rt
        .block_on(store.lease(&a, at(1_000_000)))
        .unwrap()
        .unwrap();
    assert_eq!((summary.fence.get(), summary.holder.as_str()), (2, ""));
    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &ListOptions::default()))
        .unwrap();
    assert_eq!(page.entries[0].status, RunStatus::Completed);
    assert_eq!(page.entries[0].finished_at, Some(at(1_000_000)));
    rt.block_on(store.reopen(&a)).unwrap();
    assert!(tomb.exists(), "reopen publishes the missing tombstone");
    let again = acquired(
        rt.block_on(store.claim(&a, &claim_now("w3", 1_000)))
            .unwrap(),
    );
    assert_eq!(again.fence.get(), 3);
}

/// The finish record sits where the reference never looks, and the run
/// directory stays in the reference's layout.
#[test]
fn the_lifecycle_record_lives_under_the_meta_directory() {
    let dir = tempdir();
    let clock = ManualClock::new(at(1_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let a = scope("run_layout");
    rt.block_on(store.enqueue(&a, &cp("c1", 1), &EnqueueOptions::default()))
        .unwrap();
    let l = acquired(
        rt.block_on(store.claim(&a, &claim_now("w1", 60_000)))
            .unwrap(),
    );
    let done = rt
        .block_on(store.finish(&a, l.fence, &Outcome::failed("no")))
        .unwrap();
    assert_eq!(done.status, RunStatus::Failed);
    let run_dir = store.run_dir(&a);
    let mut top: Vec<String> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, [".runkeep", "checkpoints", "claims"]);
    let rec: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join(".runkeep/lifecycle.json")).unwrap())
            .unwrap();
    assert_eq!(rec["format"], json!("runkeep.lifecycle.v1"));
    assert_eq!(rec["status"], json!("failed"));
    assert_eq!(rec["finishedFence"], json!(1));
    assert_eq!(rec["asOfFence"], json!(2));
    let _ = FinishStatus::Failed;
}

/// The store clock: a store built on a clock judges by it every
/// call that passes no instant — the lease's expiry, the takeover, the
/// listing's `expired`, `finished_at` and event timestamps.
#[test]
fn the_store_clock_judges_every_call_that_passes_no_instant() {
    let dir = tempdir();
    let clock = ManualClock::new(at(5_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let a = scope("run_clock");
    rt.block_on(store.write_checkpoint(&a, &cp("c1", 1), None))
        .unwrap();
    let l = acquired(
        rt.block_on(store.claim(&a, &claim_now("w1", 1_000)))
            .unwrap(),
    );
    assert_eq!(l.expires_at, at(5_001_000));
    assert!(matches!(
        rt.block_on(store.claim(&a, &claim_now("w2", 1_000)))
            .unwrap(),
        ClaimOutcome::Held(_)
    ));
    let ev = rt
        .block_on(store.append_events(&a, &[NewEvent::new("x", Map::new())], Some(l.fence)))
        .unwrap();
    assert_eq!(ev[0].timestamp, at(5_000_000));
    clock.advance(1_000);
    let page = rt
        .block_on(store.list_runs(&ListingScope::tenant(tenant()), &ListOptions::default()))
        .unwrap();
    assert!(page.entries[0].claim.as_ref().unwrap().expired);
    let l2 = acquired(
        rt.block_on(store.claim(&a, &claim_now("w2", 60_000)))
            .unwrap(),
    );
    clock.advance(7);
    let done = rt
        .block_on(store.finish(&a, l2.fence, &Outcome::completed(None)))
        .unwrap();
    assert_eq!(done.finished_at, Some(at(5_001_007)));
    assert_eq!(done.attempts, 1);
}

/// Two processes on one directory each judge by their own store's clock:
/// a clock minutes ahead takes a lease the other still believes live (a
/// directory has no authoritative clock; `docs/design/directory/lifecycle.md`). What stays
/// guaranteed is the fence: the moment the fast clock takes over, the slow
/// one's writes are refused, so two holders never both write.
#[test]
fn a_skewed_clock_can_take_over_early_but_never_shares_the_run() {
    let dir = tempdir();
    let slow_clock = ManualClock::new(at(10_000_000));
    let fast_clock = ManualClock::new(at(10_000_000 + 5 * 60_000));
    let slow = open_on(dir.path(), &slow_clock);
    let fast = open_on(dir.path(), &fast_clock);
    let rt = rt();
    let a = scope("run_skew");
    rt.block_on(slow.write_checkpoint(&a, &cp("c1", 1), None))
        .unwrap();
    let mine = acquired(
        rt.block_on(slow.claim(&a, &claim_now("slow", 60_000)))
            .unwrap(),
    );
    // On its own clock the lease is live: the slow store refuses others.
    assert!(matches!(
        rt.block_on(slow.claim(&a, &claim_now("other", 60_000)))
            .unwrap(),
        ClaimOutcome::Held(_)
    ));
    let theirs = acquired(
        rt.block_on(fast.claim(&a, &claim_now("fast", 60_000)))
            .unwrap(),
    );
    assert!(theirs.fence > mine.fence);
    let err = rt
        .block_on(slow.write_checkpoint(&a, &cp("c2", 2), Some(mine.fence)))
        .unwrap_err();
    assert!(matches!(err, Error::FencedOut { .. }), "{err}");
    rt.block_on(fast.write_checkpoint(&a, &cp("c3", 3), Some(theirs.fence)))
        .unwrap();
}

/// A directory lists (and `claim_next` hands out) only `run_*` runs
/// (the reference layout's listing rule), so enqueueing any other id would leave a run nobody can see or
/// take: refused, naming the fix, with nothing written. (Found when
/// `runkeep enqueue r9` then `runkeep runs` listed nothing.)
#[test]
fn an_enqueue_the_listing_would_never_show_is_refused() {
    let dir = tempdir();
    let clock = ManualClock::new(at(1_000_000));
    let store = open_on(dir.path(), &clock);
    let rt = rt();
    let hidden = scope("r9");
    let err = rt
        .block_on(store.enqueue(&hidden, &cp("c1", 1), &EnqueueOptions::default()))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
    assert!(err.to_string().contains("run_r9"), "{err}");
    assert!(
        !store.run_dir(&hidden).exists(),
        "a refused enqueue wrote its run directory"
    );
    // The same run under a listable id is enqueued, listed and handed out.
    let shown = scope("run_r9");
    rt.block_on(store.enqueue(&shown, &cp("c1", 1), &EnqueueOptions::default()))
        .unwrap();
    let page = rt
        .block_on(store.list_runs(
            &ListingScope::session(
                shown.tenant_id.clone(),
                shown.project_id.clone(),
                shown.session_id.clone(),
            ),
            &ListOptions::default(),
        ))
        .unwrap();
    assert_eq!(page.entries.len(), 1, "{page:?}");
}
