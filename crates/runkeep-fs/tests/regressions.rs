//! One named regression test per fixed defect of the reference's disk stores
//! and per weakness of theirs this backend closes, each named for its rule.
//! The cross-process ones live in `race.rs`, the injected-fault ones in
//! `faults.rs` and a checkpoint vanishing mid-enumeration (forced with a
//! pause point) in `vanishing.rs`.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use runkeep::{
    CheckpointId, CheckpointStore, ClaimOutcome, Error, EvidenceStore, Fence, Integrity,
    ListOptions, ListOrder, ListingScope, NewAuditEvent, NewEvent, ParkState, PendingDecision,
    ReadEventsOptions, Timestamp,
};
use serde_json::{json, Map};

fn claims_dir(base: &Path, run: &str) -> std::path::PathBuf {
    base.join(run).join("claims")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

fn age(path: &Path, by: Duration) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - by)
        .unwrap();
}

fn ev(t: &str) -> NewEvent {
    NewEvent::new(t, Map::new())
}

fn listing() -> ListingScope {
    ListingScope::session(tenant(), project(), session())
}

/// A reclaimed run is won once, in one process: eight takers reclaiming one expired holding get one
/// lease, one fence above it.
#[test]
fn concurrent_reclaims_of_one_expired_holding_issue_one_fence_above_it() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = std::sync::Arc::new(open(&base));
    std::fs::create_dir_all(claims_dir(&base, "run_r")).unwrap();
    std::fs::write(
        claims_dir(&base, "run_r").join("7.json"),
        r#"{"holder":"crashed","expiresAt":1000}"#,
    )
    .unwrap();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            std::thread::spawn(move || {
                rt().block_on(store.claim(&scope("run_r"), &opts(&format!("w{i}"), 60_000, 5_000)))
            })
        })
        .collect();
    let fences: Vec<u64> = threads
        .into_iter()
        .filter_map(|t| match t.join().unwrap() {
            Ok(ClaimOutcome::Acquired(l)) => Some(l.fence.get()),
            _ => None,
        })
        .collect();
    assert_eq!(fences, [8]);
}

/// Release appends a tombstone; five claim/release cycles give
/// strictly increasing, unique fences (1, 3, 5, 7, 9) and the tombstones
/// are on disk.
#[test]
fn release_appends_a_tombstone_so_fences_never_rewind() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_cycle");
    let mut fences = Vec::new();
    for i in 0..5 {
        let l = rt
            .block_on(store.claim(&s, &opts("w", 60_000, 1_000 + i)))
            .unwrap()
            .lease()
            .unwrap();
        fences.push(l.fence.get());
        assert!(rt.block_on(store.release(&s, l.fence)).unwrap());
    }
    assert_eq!(fences, [1, 3, 5, 7, 9]);
    let tomb = std::fs::read_to_string(claims_dir(&base, "run_cycle").join("10.json")).unwrap();
    // The reference's tombstone, plus the attempt count contract v2 keeps
    // in every body (the reference ignores the extra key).
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&tomb).unwrap(),
        json!({"holder": "", "expiresAt": 0, "attempts": 0})
    );
    assert!(rt
        .block_on(store.write_checkpoint(&s, &cp("cp_a", 1), Fence::new(9).ok()))
        .unwrap_err()
        .is_fenced_out());
}

/// An empty holding (a crash or full disk mid-write in an older
/// writer) does not wedge the run: the next claim takes the fence above it.
#[test]
fn an_empty_holding_does_not_wedge_the_run() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    std::fs::create_dir_all(claims_dir(&base, "run_e")).unwrap();
    std::fs::write(claims_dir(&base, "run_e").join("4.json"), "").unwrap();
    let rt = rt();
    let l = rt
        .block_on(store.claim(&scope("run_e"), &opts("w", 60_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(l.fence.get(), 5);
    assert_eq!(
        rt.block_on(store.lease(&scope("run_e"), at(1_000)))
            .unwrap()
            .unwrap()
            .fence
            .get(),
        5
    );
}

/// An unreadable holding still shows on the listing row (fence from
/// the name, expired, anonymous), so the run is served as reclaimable work,
/// not as never claimed.
#[test]
fn an_unreadable_holding_lists_as_an_expired_claim() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    rt.block_on(store.write_checkpoint(&scope("run_u"), &cp("cp_a", 1), None))
        .unwrap();
    std::fs::create_dir_all(claims_dir(&base, "run_u")).unwrap();
    std::fs::write(claims_dir(&base, "run_u").join("2.json"), "not json").unwrap();
    let page = rt
        .block_on(store.list_runs(
            &listing(),
            &ListOptions {
                claimed: Some(false),
                now: Some(at(1_000)),
                ..Default::default()
            },
        ))
        .unwrap();
    let claim = page.entries[0].claim.clone().unwrap();
    assert_eq!(
        (claim.fence.get(), claim.holder.as_str(), claim.expired),
        (2, "", true)
    );
}

/// A corrupt top holding body cannot make the write check
/// skip itself: the check compares names.
#[test]
fn a_corrupt_holding_body_does_not_skip_the_write_check() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    std::fs::create_dir_all(claims_dir(&base, "run_c")).unwrap();
    std::fs::write(
        claims_dir(&base, "run_c").join("3.json"),
        r#"{"holder":"w","expiresAt":99999999999}"#,
    )
    .unwrap();
    std::fs::write(claims_dir(&base, "run_c").join("9.json"), "{{{").unwrap();
    let e = rt()
        .block_on(store.write_checkpoint(&scope("run_c"), &cp("cp_a", 1), Fence::new(3).ok()))
        .unwrap_err();
    assert!(
        matches!(e, Error::FencedOut { presented, current, .. } if presented.get() == 3 && current.get() == 9),
        "{e}"
    );
    assert!(!base.join("run_c/checkpoints/cp_a.json").exists());
}

/// Holding names are a pure function of the fence — claims at
/// different instants and expiries only ever create `<fence>.json`.
#[test]
fn holding_names_carry_nothing_but_the_fence() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    // TTLs well above what a claim takes on a loaded machine (a claim that
    // outlasts its TTL is handed back and refused: 10 ms once flaked), each
    // claim long after the previous one expired.
    for (i, h) in ["a", "b", "c"].iter().enumerate() {
        rt.block_on(store.claim(
            &scope("run_n"),
            &opts(h, 2_000 + i as u64, 10_000 * (i as i64 + 1)),
        ))
        .unwrap();
    }
    assert_eq!(
        names(&claims_dir(&base, "run_n")),
        ["1.json", "2.json", "3.json"]
    );
}

/// A 30-minute-old scratch file is swept at the next claim;
/// a fresh one (possibly a live publisher's) is kept. Ageing uses the wall
/// clock, never the injected lease clock.
#[test]
fn old_scratch_files_are_swept_and_fresh_ones_kept() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let c = claims_dir(&base, "run_s");
    std::fs::create_dir_all(&c).unwrap();
    for n in [".tmp-1-1-oldoldol-3", ".tmp-1-2-freshfre-3"] {
        std::fs::write(c.join(n), r#"{"holder":"x","expiresAt":1}"#).unwrap();
    }
    age(&c.join(".tmp-1-1-oldoldol-3"), Duration::from_secs(30 * 60));
    rt().block_on(store.claim(&scope("run_s"), &opts("w", 60_000, 1_000)))
        .unwrap();
    assert_eq!(names(&c), [".tmp-1-2-freshfre-3", "1.json"]);
}

/// A scratch file with a valid live body is never read as a
/// holding, and a completed publish leaves no scratch file behind.
#[test]
fn a_scratch_file_with_a_live_body_is_never_a_holding() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_t");
    for scratch in [false, true] {
        if scratch {
            store.testing().force_scratch_publish();
        }
        let l = rt
            .block_on(store.claim(&s, &opts("real", 60_000, 1_000)))
            .unwrap()
            .lease()
            .unwrap();
        let listed = names(&claims_dir(&base, "run_t"));
        assert!(
            listed
                .iter()
                .all(|n| !n.starts_with(".tmp-") || n.starts_with(".tmp-999-")),
            "a completed publish left a scratch file: {listed:?}"
        );
        std::fs::write(
            claims_dir(&base, "run_t").join(format!(".tmp-999-1-abcdefgh-{}", l.fence.get() + 5)),
            r#"{"holder":"intruder","expiresAt":99999999999999}"#,
        )
        .unwrap();
        let top = rt.block_on(store.lease(&s, at(1_000))).unwrap().unwrap();
        assert_eq!((top.fence, top.holder.as_str()), (l.fence, "real"));
    }
}

/// Old holdings are pruned: 80 renewals leave between 2 and 33 holdings,
/// the top at 80 (the spec's test of the holding window, FL-27) on a store
/// that prunes by count alone (`prune_grace` zero). With the default grace
/// period (5 s) the 80 names, all younger than it, are kept.
#[test]
fn eighty_renewals_leave_a_bounded_window_with_the_top_at_80() {
    for (grace, kept) in [
        (Duration::ZERO, 2..=33),
        (runkeep_fs::FsOptions::DEFAULT_PRUNE_GRACE, 80..=80),
    ] {
        let dir = tempdir();
        let base = dir.path().join("runs");
        let store = open_with_grace(&base, grace);
        let rt = rt();
        let t0 = std::time::Instant::now();
        for i in 0..80 {
            rt.block_on(store.claim(&scope("run_w"), &opts("w", 60_000, 1_000 + i)))
                .unwrap();
        }
        let holdings: Vec<u64> = names(&claims_dir(&base, "run_w"))
            .iter()
            .filter_map(|n| n.strip_suffix(".json")?.parse().ok())
            .collect();
        if t0.elapsed() < grace || grace.is_zero() {
            assert!(kept.contains(&holdings.len()), "{grace:?}: {holdings:?}");
        }
        assert_eq!(holdings.iter().max(), Some(&80));
        assert_eq!(
            rt.block_on(store.lease(&scope("run_w"), at(0)))
                .unwrap()
                .unwrap()
                .fence
                .get(),
            80
        );
    }
}

/// Non-canonical numeric names are not holdings: hex,
/// padded, exponent, leading zeros, zero and a 16-digit name. None of them
/// can pin or jump the counter.
#[test]
fn non_canonical_names_are_not_holdings() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let c = claims_dir(&base, "run_x");
    std::fs::create_dir_all(&c).unwrap();
    for n in [
        "0x10.json",
        " 7.json",
        "1e21.json",
        "007.json",
        "0.json",
        "1000000000000000.json",
        "9999999999999999999.json",
    ] {
        std::fs::write(c.join(n), r#"{"holder":"x","expiresAt":99999999999999}"#).unwrap();
    }
    let rt = rt();
    assert_eq!(
        rt.block_on(store.lease(&scope("run_x"), at(0))).unwrap(),
        None
    );
    let l = rt
        .block_on(store.claim(&scope("run_x"), &opts("w", 60_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(l.fence.get(), 1);
}

/// At the 15-digit ceiling the claim is refused explicitly
/// (never a silent stop that fences nobody out).
#[test]
fn the_fence_ceiling_is_an_explicit_refusal() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    std::fs::create_dir_all(claims_dir(&base, "run_max")).unwrap();
    std::fs::write(
        claims_dir(&base, "run_max").join("999999999999999.json"),
        r#"{"holder":"x","expiresAt":1}"#,
    )
    .unwrap();
    let e = rt()
        .block_on(store.claim(&scope("run_max"), &opts("w", 60_000, 1_000)))
        .unwrap_err();
    assert!(
        matches!(e, Error::Unsupported { .. }) && e.to_string().contains("ceiling"),
        "{e}"
    );
}

/// A superseded holder's late release leaves the new holder
/// and its fence intact.
#[test]
fn a_stale_release_does_not_hand_away_the_new_holders_run() {
    let dir = tempdir();
    let store = open(&dir.path().join("runs"));
    let rt = rt();
    let s = scope("run_h");
    let w1 = rt
        .block_on(store.claim(&s, &opts("w1", 1_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    let w2 = rt
        .block_on(store.claim(&s, &opts("w2", 60_000, 5_000)))
        .unwrap()
        .lease()
        .unwrap();
    assert!(!rt.block_on(store.release(&s, w1.fence)).unwrap());
    let top = rt.block_on(store.lease(&s, at(5_000))).unwrap().unwrap();
    assert_eq!(
        (top.holder.as_str(), top.fence, top.expired),
        ("w2", w2.fence, false)
    );
}

/// A child and a grandchild list with their parents; the
/// grandchild's parent shell directory (holding only `children/`) is not a
/// row of its own.
#[test]
fn sub_runs_list_with_their_parents_and_shells_do_not() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    rt.block_on(store.write_checkpoint(&scope("run_a"), &cp("cp_1", 1), None))
        .unwrap();
    rt.block_on(store.write_checkpoint(&child_scope("run_b", "run_a"), &cp("cp_2", 1), None))
        .unwrap();
    rt.block_on(store.write_checkpoint(&child_scope("run_c", "run_b"), &cp("cp_3", 1), None))
        .unwrap();
    assert!(base.join("run_b/children/run_c").is_dir() && !base.join("run_b/checkpoints").exists());
    let page = rt
        .block_on(store.list_runs(&listing(), &Default::default()))
        .unwrap();
    let rows: Vec<(String, Option<String>)> = page
        .entries
        .iter()
        .map(|r| {
            (
                r.scope.run_id.to_string(),
                r.scope.parent_run_id.as_ref().map(|p| p.to_string()),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("run_a".to_string(), None),
            ("run_b".to_string(), Some("run_a".to_string())),
            ("run_c".to_string(), Some("run_b".to_string()))
        ]
    );
}

/// Listing (and every other read) creates nothing and gives
/// the same answer twice; reads of a run that does not exist create no
/// directory.
#[test]
fn reads_create_nothing_and_answer_the_same_twice() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    rt.block_on(store.write_checkpoint(&scope("run_a"), &cp("cp_1", 1), None))
        .unwrap();
    rt.block_on(store.write_checkpoint(&child_scope("run_k", "run_a"), &cp("cp_2", 1), None))
        .unwrap();
    // A run written by someone else (no digest, no lock file).
    std::fs::create_dir_all(base.join("run_ref/checkpoints")).unwrap();
    std::fs::write(
        base.join("run_ref/checkpoints/cp_r.json"),
        r#"{"id":"cp_r","createdAt":5,"schemaVersion":1}"#,
    )
    .unwrap();
    std::fs::write(
        base.join("run_ref/transcript.jsonl"),
        "{\"type\":\"x\"}\n{\"type\":\"y\"",
    )
    .unwrap();
    let before = tree(&base);
    let ghost = scope("run_ghost");
    let first = rt
        .block_on(store.list_runs(&listing(), &Default::default()))
        .unwrap();
    for s in [scope("run_ref"), ghost.clone()] {
        rt.block_on(store.read_checkpoint(&s, &CheckpointId::new("cp_r").unwrap()))
            .unwrap();
        rt.block_on(store.list_checkpoints(&s)).unwrap();
        rt.block_on(store.read_events(&s, &Default::default()))
            .unwrap();
        rt.block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                since_seq: 1,
                ..Default::default()
            },
        ))
        .unwrap();
        let _ = rt.block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        ));
        rt.block_on(store.read_messages(&s)).unwrap();
        rt.block_on(store.read_report(&s)).unwrap();
        rt.block_on(store.read_run_record(&s)).unwrap();
        rt.block_on(store.read_audit(&s, 0)).unwrap();
        rt.block_on(store.lease(&s, at(0))).unwrap();
        assert!(!rt.block_on(store.release(&s, Fence::FIRST)).unwrap());
    }
    store.diagnose(Timestamp::now()).unwrap();
    let second = rt
        .block_on(store.list_runs(&listing(), &Default::default()))
        .unwrap();
    assert_eq!(first, second);
    assert_eq!(first.entries.len(), 3);
    assert_eq!(tree(&base), before, "a read created or modified something");
    assert!(!base.join("run_ghost").exists());
}

/// A damaged checkpoint (`{}`) makes `list_checkpoints`
/// refuse ("not a usable checkpoint") rather than return a short list, and
/// flags its run's listing row — the page and the other runs are unharmed.
#[test]
fn a_damaged_checkpoint_refuses_the_list_and_flags_only_its_row() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    for r in ["run_a", "run_b", "run_c"] {
        rt.block_on(store.write_checkpoint(&scope(r), &cp("cp_ok", 1), None))
            .unwrap();
    }
    std::fs::write(base.join("run_b/checkpoints/cp_broken.json"), "{}").unwrap();
    let e = rt
        .block_on(store.list_checkpoints(&scope("run_b")))
        .unwrap_err();
    assert!(
        e.to_string().contains("not a usable checkpoint")
            && e.to_string().contains("cp_broken.json"),
        "{e}"
    );
    let page = rt
        .block_on(store.list_runs(
            &listing(),
            &ListOptions {
                park: Some(vec![ParkState::Outstanding]),
                ..Default::default()
            },
        ))
        .unwrap();
    // Damage passes every filter: it must not be hidden by one.
    assert_eq!(page.entries.len(), 1);
    assert!(page.entries[0]
        .damaged
        .as_deref()
        .unwrap()
        .contains("cp_broken.json"));
    let all = rt
        .block_on(store.list_runs(&listing(), &Default::default()))
        .unwrap();
    assert_eq!(
        all.entries.iter().filter(|r| r.damaged.is_none()).count(),
        2
    );
}

/// Checkpoints are written stamped `schemaVersion: 1`; a
/// record from a newer schema is refused on read (never partially read).
#[test]
fn records_are_stamped_and_future_versions_refused() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_v");
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), None))
        .unwrap();
    let mut record = Map::new();
    record.insert("status".into(), json!("running"));
    rt.block_on(store.write_run_record(&s, &record, None))
        .unwrap();
    for f in ["checkpoints/cp_a.json", "run.json"] {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(base.join("run_v").join(f)).unwrap()).unwrap();
        assert_eq!(v["schemaVersion"], json!(1), "{f}");
    }
    let path = base.join("run_v/checkpoints/cp_a.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"schemaVersion\":1", "\"schemaVersion\":2");
    std::fs::write(&path, text).unwrap();
    let e = rt
        .block_on(store.read_checkpoint(&s, &CheckpointId::new("cp_a").unwrap()))
        .unwrap_err();
    assert!(
        e.to_string().contains("schema version 2") && e.to_string().contains("upgrade"),
        "{e}"
    );
    let run = std::fs::read_to_string(base.join("run_v/run.json"))
        .unwrap()
        .replace("\"schemaVersion\":1", "\"schemaVersion\":7");
    std::fs::write(base.join("run_v/run.json"), run).unwrap();
    assert!(rt
        .block_on(store.read_run_record(&s))
        .unwrap_err()
        .to_string()
        .contains("schema version 7"));
}

/// Concurrent writers of one record each use their own
/// sidecar, so the published file is always one writer's whole body.
#[test]
fn concurrent_writers_of_one_record_never_publish_a_mixture() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = std::sync::Arc::new(open(&base));
    let threads: Vec<_> = (0..6)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                let rt = rt();
                for i in 0..40 {
                    let mut c = cp("cp_same", i);
                    c.state.insert("writer".into(), json!(w));
                    c.state.insert(
                        "blob".into(),
                        json!(format!("{w}").repeat(20_000 + w * 1000)),
                    );
                    rt.block_on(store.write_checkpoint(&scope("run_m"), &c, None))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let back = rt()
        .block_on(store.read_checkpoint(&scope("run_m"), &CheckpointId::new("cp_same").unwrap()))
        .unwrap()
        .unwrap();
    let w = back.state["writer"].as_u64().unwrap() as usize;
    assert_eq!(
        back.state["blob"],
        json!(format!("{w}").repeat(20_000 + w * 1000))
    );
    assert!(names(&base.join("run_m/checkpoints"))
        .iter()
        .all(|n| !n.ends_with(".tmp")));
}

/// Legacy unsequenced lines take their position,
/// undated lines read timestamp 0, and appends continue after them.
#[test]
fn legacy_lines_are_numbered_by_position_and_appends_continue() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    std::fs::create_dir_all(base.join("run_l")).unwrap();
    std::fs::write(
        base.join("run_l/transcript.jsonl"),
        "{\"type\":\"a\",\"timestamp\":5}\n{\"type\":\"b\",\"timestamp\":6}\n{\"type\":\"c\"}\n",
    )
    .unwrap();
    let rt = rt();
    let s = scope("run_l");
    let more = rt
        .block_on(store.append_events(&s, &[ev("d")], None))
        .unwrap();
    assert_eq!(more[0].seq, 4);
    let back = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        ))
        .unwrap();
    let got: Vec<(u64, &str, i64)> = back
        .events
        .iter()
        .map(|e| (e.seq, e.event_type.as_str(), e.timestamp.as_millis()))
        .collect();
    assert_eq!(&got[..3], [(1, "a", 5), (2, "b", 6), (3, "c", 0)]);
    assert_eq!(got[3].0, 4);
    let since = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                since_seq: 2,
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(
        since.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4]
    );
}

/// A torn final record (a writer killed mid-append) is
/// healed only by the next append (under the run lock): the fragment stays a
/// skipped damaged record and the new event starts on its own line. Reads
/// never modify the file. Same for the audit trail.
#[test]
fn a_torn_tail_is_healed_by_the_next_append_and_reads_change_nothing() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_torn");
    rt.block_on(store.append_events(&s, &[ev("one")], None))
        .unwrap();
    rt.block_on(store.append_audit(&s, &[NewAuditEvent::new("w", "one", "ok")], None))
        .unwrap();
    for f in ["transcript.jsonl", "audit.jsonl"] {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(base.join("run_torn").join(f))
            .unwrap()
            .write_all(b"{\"type\":\"tool_completed\",\"resu")
            .unwrap();
    }
    let before = std::fs::read(base.join("run_torn/transcript.jsonl")).unwrap();
    let tolerant = rt
        .block_on(store.read_events(&s, &Default::default()))
        .unwrap();
    assert_eq!(tolerant.events.len(), 1);
    assert_eq!(tolerant.skipped.len(), 1);
    let e = rt
        .block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        ))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("final record is not newline-terminated"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(base.join("run_torn/transcript.jsonl")).unwrap(),
        before,
        "a read healed the file"
    );
    // A new process appends: the fragment is terminated, not merged.
    let store2 = open(&base);
    let three = rt
        .block_on(store2.append_events(&s, &[ev("three")], None))
        .unwrap();
    assert_eq!(three[0].seq, 2);
    let back = rt
        .block_on(store2.read_events(&s, &Default::default()))
        .unwrap();
    assert_eq!(
        back.events
            .iter()
            .map(|e| e.event_type.as_str())
            .collect::<Vec<_>>(),
        ["one", "three"]
    );
    assert_eq!(back.skipped[0].position, 2);
    let e = rt
        .block_on(store2.read_events(
            &s,
            &ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            },
        ))
        .unwrap_err();
    assert!(e.to_string().contains("record 2 is not valid JSON"), "{e}");
    rt.block_on(store2.append_audit(&s, &[NewAuditEvent::new("w", "two", "ok")], None))
        .unwrap();
    let audit = rt.block_on(store2.read_audit(&s, 0)).unwrap();
    assert_eq!(
        audit
            .iter()
            .map(|r| (r.seq, r.what.as_str()))
            .collect::<Vec<_>>(),
        [(1, "one"), (2, "two")]
    );
    // A well-terminated log is left byte-identical by an append's heal step.
    let clean = std::fs::read(base.join("run_torn/transcript.jsonl")).unwrap();
    assert!(clean.ends_with(b"\n"));
}

/// Refused at the boundary: input (reserved keys, a foreign
/// `runId`, a park without a type, huge events, a never-issued fence, a
/// foreign scope, forged cursors) changes nothing on disk.
#[test]
fn refused_input_touches_nothing_on_disk() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_in");
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), None))
        .unwrap();
    let before = tree(&base);
    let mut reserved = cp("cp_b", 1);
    reserved.state.insert("fence".into(), json!(9));
    let mut foreign_run = cp("cp_c", 1);
    foreign_run.state.insert("runId".into(), json!("run_other"));
    let untyped = cp("cp_d", 1).with_pending(PendingDecision {
        request: Map::new(),
        parked_at: at(1),
        deadline_at: None,
        resolved_at: None,
        decision: None,
        extra: Map::new(),
    });
    for c in [reserved, foreign_run, untyped] {
        assert!(matches!(
            rt.block_on(store.write_checkpoint(&s, &c, None)),
            Err(Error::InvalidInput { .. })
        ));
    }
    let mut huge = Map::new();
    huge.insert(
        "blob".into(),
        json!("x".repeat(runkeep::evidence::MAX_EVENT_BYTES + 1)),
    );
    let mut seq = Map::new();
    seq.insert("seq".into(), json!(1));
    for e in [
        NewEvent::new("x", huge),
        NewEvent::new("x", seq),
        NewEvent::new("", Map::new()),
    ] {
        assert!(matches!(
            rt.block_on(store.append_events(&s, &[ev("ok"), e], None)),
            Err(Error::InvalidInput { .. })
        ));
    }
    let e = rt
        .block_on(store.write_checkpoint(&scope("run_new"), &cp("cp_a", 1), Fence::new(3).ok()))
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { .. })
            && e.to_string().contains("no fence was ever issued"),
        "{e}"
    );
    let foreign = runkeep::RunScope::new(
        runkeep::TenantId::new("tnt_other").unwrap(),
        project(),
        session(),
        runkeep::RunId::new("run_in").unwrap(),
    );
    let e = rt
        .block_on(store.write_checkpoint(&foreign, &cp("cp_z", 1), None))
        .unwrap_err();
    assert!(e.to_string().contains("this store is bound to"), "{e}");
    assert!(rt
        .block_on(store.claim(&foreign, &opts("w", 1_000, 1)))
        .is_err());
    for c in ["0:0:run_a", "rk1.garbage", "::run_a"] {
        let e = rt
            .block_on(store.list_runs(
                &listing(),
                &ListOptions {
                    cursor: Some(c.into()),
                    ..Default::default()
                },
            ))
            .unwrap_err();
        assert!(
            e.to_string().contains("not a cursor this listing issued"),
            "{e}"
        );
    }
    assert_eq!(tree(&base), before);
}

/// A foreign listing scope answers an empty page; a store opened
/// without attribution refuses to list, but serves per-run operations.
#[test]
fn attribution_binds_listing_and_per_run_operations() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    rt.block_on(store.write_checkpoint(&scope("run_a"), &cp("cp_1", 1), None))
        .unwrap();
    for other in [
        ListingScope::tenant(runkeep::TenantId::new("tnt_x").unwrap()),
        ListingScope::project(tenant(), runkeep::ProjectId::new("prj_x").unwrap()),
        ListingScope::session(
            tenant(),
            project(),
            runkeep::SessionId::new("ses_x").unwrap(),
        ),
    ] {
        assert!(rt
            .block_on(store.list_runs(&other, &Default::default()))
            .unwrap()
            .entries
            .is_empty());
    }
    for narrowed in [
        ListingScope::tenant(tenant()),
        ListingScope::project(tenant(), project()),
        listing(),
    ] {
        assert_eq!(
            rt.block_on(store.list_runs(&narrowed, &Default::default()))
                .unwrap()
                .entries
                .len(),
            1
        );
    }
    let bare = runkeep_fs::FsStore::open(&base, Default::default()).unwrap();
    let e = rt
        .block_on(bare.list_runs(&listing(), &Default::default()))
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { .. }) && e.to_string().contains("without attribution"),
        "{e}"
    );
    assert_eq!(
        rt.block_on(bare.list_checkpoints(&scope("run_a")))
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store.run_dir(&child_scope("run_c", "run_p")),
        base.join("run_p/children/run_c")
    );
    assert_eq!(store.run_dir(&scope("run_a")), base.join("run_a"));
}

/// The listing orders and pages with the core's rules: created-at order puts
/// unrecorded runs first and a recorded 0 after them; limit-1 walks in both
/// orders visit every row once.
#[test]
fn listing_pages_walk_every_row_once_in_both_orders() {
    let dir = tempdir();
    let store = open(&dir.path().join("runs"));
    let rt = rt();
    for (r, created) in [
        ("run_z", None),
        ("run_a", Some(0)),
        ("run_m", Some(50)),
        ("run_b", Some(10)),
    ] {
        let mut c = cp("cp_1", 1);
        if let Some(t) = created {
            c = c.with_run_created_at(at(t));
        }
        rt.block_on(store.write_checkpoint(&scope(r), &c, None))
            .unwrap();
    }
    rt.block_on(store.write_checkpoint(
        &child_scope("run_c", "run_m"),
        &cp("cp_1", 1).with_run_created_at(at(20)),
        None,
    ))
    .unwrap();
    for (order, want) in [
        (
            ListOrder::RunId,
            vec!["run_a", "run_b", "run_c", "run_m", "run_z"],
        ),
        (
            ListOrder::CreatedAt,
            vec!["run_z", "run_a", "run_b", "run_c", "run_m"],
        ),
    ] {
        let mut seen = Vec::new();
        let mut cursor = None;
        for _ in 0..10 {
            let page = rt
                .block_on(store.list_runs(
                    &listing(),
                    &ListOptions {
                        order,
                        limit: Some(1),
                        cursor: cursor.clone(),
                        ..Default::default()
                    },
                ))
                .unwrap();
            seen.extend(page.entries.iter().map(|r| r.scope.run_id.to_string()));
            match page.cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, want, "{order:?}");
    }
}

/// The doctor's scan finds each kind of trouble and changes nothing.
#[test]
fn diagnose_finds_each_kind_of_trouble_and_changes_nothing() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_sick");
    let l = rt
        .block_on(store.claim(&s, &opts("w1", 1_000, 1_000)))
        .unwrap()
        .lease()
        .unwrap();
    rt.block_on(store.write_checkpoint(&s, &cp("cp_a", 1), Some(l.fence)))
        .unwrap();
    rt.block_on(store.append_events(&s, &[ev("x")], None))
        .unwrap();
    // A takeover, then a zombie write, refused and counted.
    let _ = rt
        .block_on(store.claim(&s, &opts("w2", 60_000, 5_000)))
        .unwrap();
    assert!(rt
        .block_on(store.write_report(&s, "zombie", Some(l.fence)))
        .unwrap_err()
        .is_fenced_out());
    let rd = base.join("run_sick");
    std::fs::write(rd.join("claims/.tmp-1-1-aaaaaaaa-9"), "{}").unwrap();
    age(
        &rd.join("claims/.tmp-1-1-aaaaaaaa-9"),
        Duration::from_secs(3600),
    );
    std::fs::write(rd.join("checkpoints/cp_b.json.1.1.abcdef12.tmp"), "{}").unwrap();
    age(
        &rd.join("checkpoints/cp_b.json.1.1.abcdef12.tmp"),
        Duration::from_secs(3600),
    );
    std::fs::write(rd.join("checkpoints/cp_bad.json"), "{").unwrap();
    {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(rd.join("transcript.jsonl"))
            .unwrap()
            .write_all(b"{\"ty")
            .unwrap();
    }
    let big = base.join("run_big/claims");
    std::fs::create_dir_all(&big).unwrap();
    let holding = |f: u64| {
        std::fs::write(
            big.join(format!("{f}.json")),
            r#"{"holder":"","expiresAt":0}"#,
        )
        .unwrap()
    };
    for f in 1..=39 {
        holding(f);
    }
    // Names that appeared within the prune grace period (5 s by default)
    // before the top are not overdue: a run claimed fast keeps them by
    // design.
    assert_eq!(
        store.diagnose(at(100_000)).unwrap().oversized_claims,
        Vec::new()
    );
    // With a top that appeared more than the grace period (a store with a
    // 200 ms one) after them, those more than 32 below it are.
    let grace = Duration::from_millis(200);
    let store = open_with_grace(&base, grace);
    std::thread::sleep(grace + Duration::from_millis(50));
    holding(40);
    let before = tree(&base);
    let d = store.diagnose(at(100_000)).unwrap();
    assert_eq!(tree(&base), before);
    assert_eq!(d.runs_scanned, 2);
    assert_eq!(d.scratch_leftovers.len(), 2, "{d:?}");
    assert_eq!(d.torn_transcripts, [rd.join("transcript.jsonl")]);
    assert_eq!(d.damaged_checkpoints.len(), 1);
    assert_eq!(d.oversized_claims, [(big.clone(), 40)]);
    assert_eq!(d.expired_unreclaimed.len(), 1, "{d:?}");
    assert_eq!(d.expired_unreclaimed[0].1.holder, "w2");
    assert_eq!(d.fenced_out_refusals, [(s, 1)]);
    assert!(!d.is_clean());
}
