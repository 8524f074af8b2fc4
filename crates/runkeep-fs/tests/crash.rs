//! Crash test: worker processes claim runs, append events (some large),
//! write checkpoints and audit records, release, and are `kill -9`ed at
//! random instants. Afterwards every run reads back, is claimable once its
//! lease has expired, and nothing a worker was told had succeeded is lost.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use runkeep::{
    CheckpointStore, ClaimOptions, ClaimOutcome, EvidenceStore, Integrity, NewAuditEvent, NewEvent,
    ReadEventsOptions, Timestamp, Ttl,
};
use serde_json::{json, Map};

const RUNS: usize = 3;

/// Entry point of the worker processes the tests below spawn (this binary
/// re-entered with a role in `RUNKEEP_FS_WORKER`); a no-op otherwise.
#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    assert_eq!(role, "chaos");
    chaos_worker();
}

fn chaos_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let store = open(&base);
    let rt = rt();
    let pid = std::process::id();
    let me = holder(&format!("chaos-{pid}"));
    let mut rng = rand::thread_rng();
    let mut n = 0u64;
    loop {
        let run = format!("run_crash_{}", rng.gen_range(0..RUNS));
        let s = scope(&run);
        // Kills make takeovers (attempts, contract v2); lift the limit so
        // no run is dead-lettered by the chaos itself.
        let opts = ClaimOptions::new(me.clone(), Ttl::from_millis(200).unwrap())
            .with_max_attempts(u32::MAX);
        let lease = match rt.block_on(store.claim(&s, &opts)) {
            Ok(ClaimOutcome::Acquired(l)) => l,
            Ok(ClaimOutcome::Held(_)) | Err(runkeep::Error::Contended { .. }) => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Ok(other) => {
                report(format!("err claim answered {other:?}"));
                continue;
            }
            Err(e) => {
                report(format!("err claim {e}"));
                continue;
            }
        };
        let f = Some(lease.fence);
        for _ in 0..rng.gen_range(1..6) {
            n += 1;
            let tag = format!("{pid}-{n}");
            let r: Result<(), runkeep::Error> = match rng.gen_range(0..4) {
                0 | 1 => {
                    let big = rng.gen_bool(0.2);
                    let events: Vec<NewEvent> = (0..rng.gen_range(1..4))
                        .map(|i| {
                            let mut p = Map::new();
                            p.insert("tag".into(), json!(format!("{tag}.{i}")));
                            if big {
                                p.insert("blob".into(), json!("x".repeat(300_000)));
                            }
                            NewEvent::new("step", p)
                        })
                        .collect();
                    rt.block_on(store.append_events(&s, &events, f)).map(|evs| {
                        for e in evs {
                            report(format!(
                                "ev {run} {} {}",
                                e.seq,
                                e.payload["tag"].as_str().unwrap()
                            ));
                        }
                    })
                }
                2 => {
                    let id = format!("cp_{pid}_{n}");
                    rt.block_on(store.write_checkpoint(&s, &cp(&id, now_ms()), f))
                        .map(|_| report(format!("cp {run} {id}")))
                }
                _ => rt
                    .block_on(store.append_audit(&s, &[NewAuditEvent::new(&tag, "step", "ok")], f))
                    .map(|recs| report(format!("au {run} {} {tag}", recs[0].seq))),
            };
            match r {
                Ok(()) => {}
                Err(e) if e.is_fenced_out() => break,
                Err(e) => report(format!("err write {e}")),
            }
        }
        if rng.gen_bool(0.5) {
            let _ = rt.block_on(store.release(&s, lease.fence));
        }
    }
}

#[test]
fn processes_killed_at_random_points_lose_nothing_they_were_told_was_written() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    open(&base);
    let env = [("BASE", base.display().to_string())];
    let mut workers: Vec<Worker> = (0..3).map(|_| spawn("chaos", &env)).collect();
    let mut reports = Vec::new();
    let mut rng = rand::thread_rng();
    let mut kills = 0;
    let end = Instant::now() + Duration::from_secs(6);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..150)));
        let i = rng.gen_range(0..workers.len());
        let w = workers.swap_remove(i);
        reports.extend(w.kill9());
        kills += 1;
        workers.push(spawn("chaos", &env));
    }
    for w in workers {
        reports.extend(w.kill9());
    }
    // Let every lease lapse.
    std::thread::sleep(Duration::from_millis(300));

    let mut events: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    let mut cps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut audit: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    let mut errors = Vec::new();
    for r in &reports {
        let p: Vec<&str> = r.split(' ').collect();
        match p[0] {
            "ev" => {
                let prev = events
                    .entry(p[1].into())
                    .or_default()
                    .insert(p[2].parse().unwrap(), p[3].into());
                assert!(
                    prev.is_none(),
                    "seq {} of {} acknowledged twice",
                    p[2],
                    p[1]
                );
            }
            "cp" => {
                cps.entry(p[1].into()).or_default().insert(p[2].into());
            }
            "au" => {
                let prev = audit
                    .entry(p[1].into())
                    .or_default()
                    .insert(p[2].parse().unwrap(), p[3].into());
                assert!(
                    prev.is_none(),
                    "audit seq {} of {} acknowledged twice",
                    p[2],
                    p[1]
                );
            }
            "err" => errors.push(r.clone()),
            _ => {}
        }
    }
    assert!(errors.is_empty(), "workers reported errors: {errors:?}");

    let store = open(&base);
    let rt = rt();
    let (mut acked_ev, mut acked_cp, mut strict_failures, mut skipped) = (0, 0, 0, 0);
    for i in 0..RUNS {
        let run = format!("run_crash_{i}");
        let s = scope(&run);
        let back = rt
            .block_on(store.read_events(&s, &ReadEventsOptions::default()))
            .unwrap();
        skipped += back.skipped.len();
        let got: BTreeMap<u64, String> = back
            .events
            .iter()
            .map(|e| (e.seq, e.payload["tag"].as_str().unwrap_or("").to_string()))
            .collect();
        assert_eq!(got.len(), back.events.len(), "{run}: a seq appears twice");
        for (seq, tag) in events.get(&run).into_iter().flatten() {
            assert_eq!(
                got.get(seq),
                Some(tag),
                "{run}: acknowledged event {seq} ({tag}) lost"
            );
            acked_ev += 1;
        }
        // The indexed catch-up read agrees with the full read.
        for since in [1, got.len() as u64 / 2, got.len() as u64] {
            let tail = rt
                .block_on(store.read_events(
                    &s,
                    &ReadEventsOptions {
                        since_seq: since,
                        ..Default::default()
                    },
                ))
                .unwrap();
            let want: Vec<u64> = back
                .events
                .iter()
                .map(|e| e.seq)
                .filter(|q| *q > since)
                .collect();
            assert_eq!(
                tail.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
                want,
                "{run} since {since}"
            );
        }
        if rt
            .block_on(store.read_events(
                &s,
                &ReadEventsOptions {
                    integrity: Integrity::Strict,
                    ..Default::default()
                },
            ))
            .is_err()
        {
            strict_failures += 1;
        }
        let ids: BTreeSet<String> = rt
            .block_on(store.list_checkpoints(&s))
            .unwrap()
            .into_iter()
            .map(|c| c.id.to_string())
            .collect();
        for id in cps.get(&run).into_iter().flatten() {
            assert!(ids.contains(id), "{run}: acknowledged checkpoint {id} lost");
            acked_cp += 1;
        }
        let recs = rt.block_on(store.read_audit(&s, 0)).unwrap();
        let recs: BTreeMap<u64, String> = recs.into_iter().map(|r| (r.seq, r.who)).collect();
        for (seq, tag) in audit.get(&run).into_iter().flatten() {
            assert_eq!(
                recs.get(seq),
                Some(tag),
                "{run}: acknowledged audit record {seq} lost"
            );
        }
        let claim = rt
            .block_on(store.claim(
                &s,
                &ClaimOptions::new(holder("survivor"), Ttl::from_millis(60_000).unwrap()),
            ))
            .unwrap();
        assert!(
            matches!(claim, ClaimOutcome::Acquired(_)),
            "{run} not claimable after expiry: {claim:?}"
        );
    }
    let page = rt
        .block_on(store.list_runs(
            &runkeep::ListingScope::tenant(tenant()),
            &Default::default(),
        ))
        .unwrap();
    assert!(page.entries.iter().all(|r| r.damaged.is_none()), "{page:?}");
    let d = store.diagnose(Timestamp::now()).unwrap();
    eprintln!(
        "crash test: {kills} kills; {acked_ev} acknowledged events, {acked_cp} checkpoints verified; \
         {skipped} damaged (torn, unacknowledged) records skipped; {strict_failures}/{RUNS} transcripts fail strict reads; \
         torn now: {:?}",
        d.torn_transcripts
    );
    assert!(
        acked_ev > 50 && acked_cp > 10,
        "too little work to mean anything"
    );
}
