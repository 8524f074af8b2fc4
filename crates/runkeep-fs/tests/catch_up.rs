//! Catch-up costs a page: a tolerant `read_events` page stops at its
//! page. What it answers is checked here against the whole log: `last_seq`
//! is the log's (also when a lock-less, index-less writer appended lines the
//! offset index does not cover), `skipped` holds the damaged records of the
//! span the page covered (after the reader's cursor, up to its last event;
//! to the end of the log when the page is not full), and paging from 0 sees
//! every event and every damaged record exactly once. What a page costs is
//! counted by the unit test in `src/transcript.rs`.

mod common;

use std::path::PathBuf;

use common::*;
use rand::Rng;
use runkeep::{EventBatch, EvidenceStore, NewEvent, ReadEventsOptions, RunScope};
use runkeep_fs::FsStore;
use serde_json::{json, Map};

struct Run {
    _dir: tempfile::TempDir,
    store: FsStore,
    rt: tokio::runtime::Runtime,
    s: RunScope,
    log: PathBuf,
    index: PathBuf,
}

impl Run {
    fn new() -> Self {
        let dir = tempdir();
        let base = dir.path().join("runs");
        let store = open(&base);
        let s = scope("run_page");
        std::fs::create_dir_all(base.join("run_page")).unwrap();
        Self {
            log: base.join("run_page/transcript.jsonl"),
            index: base.join("run_page/.runkeep/transcript.idx"),
            _dir: dir,
            store,
            rt: rt(),
            s,
        }
    }

    /// `n` events through the store (indexed).
    fn append(&self, n: usize) {
        let events: Vec<NewEvent> = (0..n)
            .map(|i| {
                let mut p = Map::new();
                p.insert("i".into(), json!(i));
                NewEvent::new("ours", p)
            })
            .collect();
        self.rt
            .block_on(self.store.append_events(&self.s, &events, None))
            .unwrap();
    }

    fn read(&self, since_seq: u64, limit: Option<usize>) -> EventBatch {
        self.rt
            .block_on(self.store.read_events(
                &self.s,
                &ReadEventsOptions {
                    since_seq,
                    limit,
                    ..Default::default()
                },
            ))
            .unwrap()
    }

    fn last_seq(&self) -> u64 {
        self.read(0, None).last_seq
    }

    /// A foreign line with the next `seq` (a lock-less reference writer).
    fn foreign(&self) {
        let seq = self.last_seq() + 1;
        raw_append(
            &self.log,
            format!("{{\"type\":\"foreign\",\"seq\":{seq}}}\n").as_bytes(),
        );
    }

    fn damage(&self) {
        raw_append(&self.log, b"{not json}\n");
    }
}

fn seqs(b: &EventBatch) -> Vec<u64> {
    b.events.iter().map(|e| e.seq).collect()
}

fn positions(b: &EventBatch) -> Vec<u64> {
    b.skipped.iter().map(|s| s.position).collect()
}

/// Pages through the log from 0 in pages of `limit` as a reader catching up
/// does (on until a page comes back short): every page's `last_seq` is the
/// log's; answers (events, damaged positions) in the order seen.
fn page_through(run: &Run, limit: usize) -> (Vec<u64>, Vec<u64>) {
    let want_last = run.last_seq();
    let (mut events, mut damaged) = (Vec::new(), Vec::new());
    let mut since = 0;
    for _ in 0..10_000 {
        let b = run.read(since, Some(limit));
        assert_eq!(b.last_seq, want_last, "page after {since} by {limit}");
        events.extend(seqs(&b));
        damaged.extend(positions(&b));
        if b.events.len() < limit {
            return (events, damaged);
        }
        since = b.events.last().map_or(since, |e| e.seq);
    }
    panic!("paging did not end");
}

type Case = (u64, Option<usize>, Vec<u64>, Vec<u64>);

/// Damaged records before the cursor, inside the page and after it: the
/// page reports those after its cursor up to its last event, and up to the
/// end of the log only when it is not full.
#[test]
fn a_page_reports_the_damaged_records_of_the_span_it_covered() {
    let run = Run::new();
    // Positions: 1-5 seq 1-5, 6 damaged, 7-11 seq 6-10, 12 damaged,
    // 13-17 seq 11-15, 18 damaged (the last line).
    run.append(5);
    run.damage();
    run.append(5);
    run.damage();
    run.append(5);
    run.damage();
    for indexed in [true, false] {
        if !indexed {
            std::fs::remove_file(&run.index).unwrap();
        }
        // (since, limit, events, damaged positions)
        let cases: [Case; 9] = [
            // Damage between the cursor and the page's first event.
            (5, Some(5), (6..=10).collect(), vec![6]),
            // Before the cursor: not this page's.
            (6, Some(3), vec![7, 8, 9], vec![]),
            // Inside the page.
            (8, Some(5), (9..=13).collect(), vec![12]),
            // After the page's last event: the next page's.
            (0, Some(5), (1..=5).collect(), vec![]),
            (10, Some(5), (11..=15).collect(), vec![12]),
            // A page that is not full reaches the end of the log.
            (15, Some(5), vec![], vec![18]),
            (12, Some(5), vec![13, 14, 15], vec![18]),
            (10, None, (11..=15).collect(), vec![12, 18]),
            // A page of nothing covers nothing.
            (0, Some(0), vec![], vec![]),
        ];
        for (since, limit, want_events, want_damaged) in cases {
            let b = run.read(since, limit);
            let what = format!("indexed {indexed}, since {since}, limit {limit:?}");
            assert_eq!(seqs(&b), want_events, "{what}");
            assert_eq!(positions(&b), want_damaged, "{what}");
            assert_eq!(b.last_seq, 15, "{what}");
        }
        let (events, damaged) = page_through(&run, 5);
        assert_eq!(events, (1..=15).collect::<Vec<_>>());
        assert_eq!(damaged, [6, 12, 18]);
    }
}

/// A lock-less writer appended lines after what the index covers (sequenced
/// ones above the index's highest `seq`, a legacy one whose `seq` is its
/// position, damage, a torn final line): `last_seq` is the log's for every
/// page, wherever it stops — before the uncovered lines or among them.
#[test]
fn last_seq_counts_the_lines_a_lock_less_writer_appended_past_the_index() {
    let run = Run::new();
    run.append(30);
    let covered = std::fs::metadata(&run.index).unwrap().len();
    run.foreign();
    run.foreign();
    run.damage();
    raw_append(&run.log, b"{\"type\":\"legacy\"}\n");
    run.foreign();
    raw_append(&run.log, b"{\"type\":\"torn");
    assert_eq!(
        std::fs::metadata(&run.index).unwrap().len(),
        covered,
        "the foreign lines are not indexed"
    );
    // 30 indexed, 31 and 32 foreign, a damaged line at position 33, the
    // legacy line at position 34 (its seq), 35 foreign, the torn line (36).
    let whole = run.read(0, None);
    assert_eq!(whole.last_seq, 35);
    assert_eq!(positions(&whole), [33, 36]);
    for since in [0, 1, 10, 29, 30, 31, 32, 34, 35] {
        for limit in [1, 2, 3, 7] {
            let b = run.read(since, Some(limit));
            assert_eq!(b.last_seq, 35, "since {since}, limit {limit}");
            let want: Vec<u64> = seqs(&whole)
                .into_iter()
                .filter(|s| *s > since)
                .take(limit)
                .collect();
            assert_eq!(seqs(&b), want, "since {since}, limit {limit}");
        }
    }
    let (events, damaged) = page_through(&run, 4);
    assert_eq!(events, seqs(&whole));
    assert_eq!(damaged, [33, 36]);
    // The next append (seq 36: the torn line is sealed, not a number)
    // catches the index up; the answers stay.
    run.append(1);
    assert_eq!(run.read(0, None).last_seq, 36);
    for (since, limit) in [(0, 1), (20, 3), (35, 1), (36, 1)] {
        assert_eq!(run.read(since, Some(limit)).last_seq, 36);
    }
}

/// Random logs mixing the store's appends, foreign sequenced and legacy
/// lines and damage (the foreign ones sometimes past the index's reach):
/// paging from 0 at every page size yields every event and every damaged
/// record exactly once, with the log's `last_seq` on every page; with the
/// index and without it (a scan) the pages are the same.
#[test]
fn paging_from_zero_sees_every_event_and_every_damaged_record_once() {
    let mut rng = rand::thread_rng();
    for round in 0..8 {
        let run = Run::new();
        for _ in 0..40 {
            match rng.gen_range(0..8) {
                0 => run.damage(),
                1 => run.foreign(),
                2 => raw_append(&run.log, b"{\"type\":\"legacy\"}\n"),
                _ => run.append(rng.gen_range(1..4)),
            }
        }
        if round % 2 == 1 {
            // Leave lines past the index's reach, the last one torn.
            run.foreign();
            run.damage();
            raw_append(&run.log, b"{\"type\":\"torn");
        }
        let whole = run.read(0, None);
        let every: Vec<u64> = seqs(&whole);
        assert!(
            every.windows(2).all(|w| w[0] < w[1]),
            "round {round}: the log is monotone"
        );
        let pages: Vec<_> = (1..=9)
            .map(|limit| {
                let (events, damaged) = page_through(&run, limit);
                assert_eq!(events, every, "round {round}, limit {limit}");
                assert_eq!(damaged, positions(&whole), "round {round}, limit {limit}");
                (0..=every.last().copied().unwrap_or(0) + 1)
                    .map(|since| run.read(since, Some(limit)))
                    .collect::<Vec<_>>()
            })
            .collect();
        std::fs::remove_file(&run.index).unwrap();
        for (i, indexed) in pages.iter().enumerate() {
            let limit = i + 1;
            for (since, got) in indexed.iter().enumerate() {
                let scanned = run.read(since as u64, Some(limit));
                assert_eq!(*got, scanned, "round {round}, since {since}, limit {limit}");
            }
        }
    }
}
