//! The transcript: concurrent appenders across processes (no torn or merged line, unique `seq`), the
//! offset index against full scans, and stale or damaged indexes.

mod common;

use std::time::Duration;

use common::*;
use rand::Rng;
use runkeep::{EvidenceStore, Integrity, NewEvent, ReadEventsOptions};
use serde_json::{json, Map};

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
    let s = scope("run_log");
    match role.as_str() {
        "appender" => {
            let me = env("ME");
            for i in 0..20 {
                let mut p = Map::new();
                p.insert("tag".into(), json!(format!("{me}-{i}")));
                // Large (multi-page) lines: a write the kernel may split.
                p.insert("blob".into(), json!(me.repeat(200_000 + i * 1_000)));
                rt.block_on(store.append_events(&s, &[NewEvent::new("big", p)], None))
                    .unwrap();
            }
            report("done");
        }
        "one" => {
            let r =
                rt.block_on(store.append_events(&s, &[NewEvent::new(env("ME"), Map::new())], None));
            match r {
                Ok(v) => report(format!("appended seq {}", v[0].seq)),
                Err(e) => report(format!(
                    "refused {} retryable={} {}",
                    e.kind(),
                    e.is_retryable(),
                    e.to_string().replace('\n', " ")
                )),
            }
        }
        "reader" => {
            let total: usize = env("TOTAL").parse().unwrap();
            let (mut reads, mut failures, mut partial) = (0, 0, 0);
            let until = std::time::Instant::now() + Duration::from_secs(60);
            while !std::path::Path::new(&env("STOP")).exists() && std::time::Instant::now() < until
            {
                let r = rt.block_on(store.read_events(
                    &s,
                    &ReadEventsOptions {
                        integrity: Integrity::Strict,
                        ..Default::default()
                    },
                ));
                reads += 1;
                match r {
                    // A read that saw some appends but not all of them ran
                    // while the appenders were at work.
                    Ok(b) if b.events.len() > 1 && b.events.len() < total => partial += 1,
                    Ok(_) => {}
                    Err(e) => {
                        failures += 1;
                        report(format!("failure {e}"));
                    }
                }
                if reads == 1 {
                    report("reading");
                }
            }
            report(format!(
                "reads={reads} partial={partial} failures={failures}"
            ));
        }
        other => panic!("unknown role {other}"),
    }
}

/// Three processes append large events to one run while a
/// fourth reads strictly in a loop. No read ever sees a torn or merged
/// record, no two events share a number, every event is whole; and some
/// reads really ran while the appends were landing (else nothing was
/// tested).
#[test]
fn concurrent_large_appends_and_strict_reads_never_tear_or_merge() {
    let (reports, back) = concurrent_appends();
    let tally = reports.last().unwrap();
    eprintln!("strict reader during the appends: {tally}");
    assert!(tally.ends_with("failures=0"), "{reports:?}");
    assert!(
        !tally.contains(" partial=0 "),
        "the race did not happen: no strict read ran while the appends were landing ({tally})"
    );
    let back = back.expect("the final strict read failed");
    assert_eq!(back.events.len(), 61);
    for e in &back.events[1..] {
        let tag = e.payload["tag"].as_str().unwrap();
        let (me, i) = tag.split_once('-').unwrap();
        let i: usize = i.parse().unwrap();
        let blob = e.payload["blob"].as_str().unwrap();
        assert_eq!(blob.len(), 200_000 + i * 1_000, "{tag} damaged");
        assert!(blob.bytes().all(|b| b == me.as_bytes()[0]), "{tag} mixed");
    }
}

/// Waits (bounded) until process `pid` is stopped.
fn await_stopped(pid: i32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proc_state(pid) != 'T' {
        assert!(
            std::time::Instant::now() < deadline,
            "the first appender never stopped at before-append-write: the interleaving was not forced"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The interleaving the run lock exists for, forced: appender `a` has
/// numbered its event and stops just before its write; appender `b` appends
/// meanwhile; then `a` writes. Answers both reports and the final strict
/// read.
fn forced_append_interleaving(
    envs: &[(&str, String)],
) -> (String, String, runkeep::Result<runkeep::EventBatch>) {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    rt.block_on(store.append_events(
        &scope("run_log"),
        &[NewEvent::new("start", Map::new())],
        None,
    ))
    .unwrap();
    let spawn_one = |me: &str, extra: &[(&str, String)]| {
        let mut e = vec![("BASE", base.display().to_string()), ("ME", me.to_string())];
        e.extend(envs.iter().cloned());
        e.extend(extra.iter().cloned());
        spawn("one", &e)
    };
    let mut a = spawn_one(
        "a",
        &[("RUNKEEP_FS_TEST_PAUSE", "before-append-write".to_string())],
    );
    await_stopped(a.pid());
    // With the lock, b waits for it only this long before it is refused.
    let mut b = spawn_one("b", &[("RUNKEEP_FS_TEST_LOCK_WAIT_MS", "300".to_string())]);
    let rb = b.expect("", Duration::from_secs(60));
    b.finish(Duration::from_secs(30));
    signal(a.pid(), rustix::process::Signal::Cont);
    let ra = a.expect("", Duration::from_secs(60));
    a.finish(Duration::from_secs(30));
    let back = rt.block_on(store.read_events(
        &scope("run_log"),
        &ReadEventsOptions {
            integrity: Integrity::Strict,
            ..Default::default()
        },
    ));
    eprintln!(
        "forced append interleaving {envs:?}: a: {ra}; b: {rb}; final strict read: {:?}",
        back.as_ref()
            .map(|b| b.events.iter().map(|e| e.seq).collect::<Vec<_>>())
            .map_err(|e| e.to_string())
    );
    (ra, rb, back)
}

/// Meta-test: against a store whose run lock is never taken, the forced
/// interleaving gives `a` and `b` the same number, and the final strict
/// read (the check the concurrent-append test ends with) refuses the log.
#[test]
fn the_concurrent_append_test_catches_a_store_without_the_run_lock() {
    let (a, b, back) =
        forced_append_interleaving(&[("RUNKEEP_FS_TEST_MUTATION", "no-run-lock".to_string())]);
    assert_eq!(b, "appended seq 2", "b was not let in while a was stopped");
    assert_eq!(
        a, "appended seq 2",
        "a did not write the number it took before b"
    );
    assert!(back.is_err(), "the broken store went unnoticed: {back:?}");
}

/// The same forced interleaving against the real store: `a` holds the run
/// lock while it is stopped, so `b` is refused (retryable, nothing
/// written) instead of sharing `a`'s number; `a`'s event lands as 2.
#[test]
fn the_run_lock_keeps_a_second_appender_out_of_a_numbered_append() {
    let (a, b, back) = forced_append_interleaving(&[]);
    assert!(
        b.starts_with("refused ") && b.contains("retryable=true"),
        "{b}"
    );
    assert_eq!(a, "appended seq 2");
    let seqs: Vec<u64> = back.unwrap().events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2]);
}

type Outcome = (Vec<String>, runkeep::Result<runkeep::EventBatch>);

fn concurrent_appends() -> Outcome {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    rt.block_on(store.append_events(
        &scope("run_log"),
        &[NewEvent::new("start", Map::new())],
        None,
    ))
    .unwrap();
    let stop = dir.path().join("stop");
    let reader_env = vec![
        ("BASE", base.display().to_string()),
        ("STOP", stop.display().to_string()),
        ("TOTAL", "61".to_string()),
    ];
    let mut reader = spawn("reader", &reader_env);
    // The appenders start only once the reader is reading.
    reader.expect("reading", Duration::from_secs(60));
    let appenders: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|me| {
            let e = vec![("BASE", base.display().to_string()), ("ME", me.to_string())];
            spawn("appender", &e)
        })
        .collect();
    for a in appenders {
        a.finish(Duration::from_secs(120));
    }
    std::fs::write(&stop, "").unwrap();
    let reports = reader.finish(Duration::from_secs(60));
    let back = rt.block_on(store.read_events(
        &scope("run_log"),
        &ReadEventsOptions {
            integrity: Integrity::Strict,
            ..Default::default()
        },
    ));
    (reports, back)
}

/// The offset index answers every `since_seq` exactly as a full scan does,
/// on a log mixing store appends, foreign appends beyond the index's reach
/// (legacy unsequenced lines, explicitly sequenced lines), damaged lines and
/// a torn tail healed by a later append.
#[test]
fn indexed_since_seq_reads_agree_with_full_scans() {
    let mut rng = rand::thread_rng();
    for round in 0..6 {
        let dir = tempdir();
        let base = dir.path().join("runs");
        let store = open(&base);
        let rt = rt();
        let s = scope("run_idx");
        let path = base.join("run_idx/transcript.jsonl");
        std::fs::create_dir_all(base.join("run_idx")).unwrap();
        let mut next_foreign_seq = None::<u64>;
        for step in 0..60 {
            match rng.gen_range(0..10) {
                0 if round > 0 => raw_append(&path, b"{\"type\":\"legacy\"}\n"),
                1 if round > 0 => raw_append(&path, b"{not json}\n"),
                2 if round > 1 => {
                    let last = rt
                        .block_on(store.read_events(&s, &Default::default()))
                        .unwrap()
                        .last_seq;
                    let seq = next_foreign_seq.unwrap_or(last + 1).max(last + 1);
                    raw_append(
                        &path,
                        format!("{{\"type\":\"foreign\",\"seq\":{seq}}}\n").as_bytes(),
                    );
                    next_foreign_seq = Some(seq + 1);
                }
                3 if round > 2 => raw_append(&path, b"{\"type\":\"torn"),
                _ => {
                    let n = rng.gen_range(1..4);
                    let events: Vec<NewEvent> = (0..n)
                        .map(|i| {
                            let mut p = Map::new();
                            p.insert("step".into(), json!(step * 10 + i));
                            NewEvent::new("ours", p)
                        })
                        .collect();
                    rt.block_on(store.append_events(&s, &events, None)).unwrap();
                }
            }
        }
        let indexed: Vec<_> = (0..=80)
            .map(|since| {
                rt.block_on(store.read_events(
                    &s,
                    &ReadEventsOptions {
                        since_seq: since,
                        ..Default::default()
                    },
                ))
                .unwrap()
            })
            .collect();
        // Without the index every read is a full scan.
        std::fs::remove_file(base.join("run_idx/.runkeep/transcript.idx")).unwrap();
        for (since, got) in indexed.iter().enumerate() {
            let full = rt
                .block_on(store.read_events(
                    &s,
                    &ReadEventsOptions {
                        since_seq: since as u64,
                        ..Default::default()
                    },
                ))
                .unwrap();
            assert_eq!(got.events, full.events, "round {round}, since {since}");
            assert_eq!(got.last_seq, full.last_seq, "round {round}, since {since}");
            assert_eq!(got.skipped, full.skipped, "round {round}, since {since}");
        }
    }
}

/// An index that no longer names the transcript (the file was replaced) or
/// whose records are garbage is ignored by readers and rebuilt by the next
/// append; answers stay exact.
#[test]
fn a_stale_or_damaged_index_is_ignored_and_repaired() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let rt = rt();
    let s = scope("run_stale");
    for i in 0..20 {
        let mut p = Map::new();
        p.insert("i".into(), json!(i));
        rt.block_on(store.append_events(&s, &[NewEvent::new("e", p)], None))
            .unwrap();
    }
    let path = base.join("run_stale/transcript.jsonl");
    let idx = base.join("run_stale/.runkeep/transcript.idx");
    let since = |n| {
        rt.block_on(store.read_events(
            &s,
            &ReadEventsOptions {
                since_seq: n,
                ..Default::default()
            },
        ))
        .unwrap()
        .events
        .iter()
        .map(|e| e.seq)
        .collect::<Vec<_>>()
    };
    // Replace the transcript with a shorter one (new inode).
    let text = std::fs::read_to_string(&path).unwrap();
    let first5: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
    std::fs::write(path.with_extension("new"), &first5).unwrap();
    std::fs::rename(path.with_extension("new"), &path).unwrap();
    assert_eq!(since(3), [4, 5]);
    // Garbage records in place (same transcript): verification refuses them.
    let mut bytes = std::fs::read(&idx).unwrap();
    for b in bytes.iter_mut().skip(40) {
        *b = 0x5a;
    }
    std::fs::write(&idx, &bytes).unwrap();
    assert_eq!(since(3), [4, 5]);
    let more = rt
        .block_on(store.append_events(&s, &[NewEvent::new("after", Map::new())], None))
        .unwrap();
    assert_eq!(more[0].seq, 6);
    assert_eq!(since(4), [5, 6]);
}
