//! Resident memory of a listing and of a catch-up, each in a fresh process
//! (each costs a page, not the log). Reads `VmRSS` / `VmHWM` from `/proc/self/status`.
//!
//! ```text
//! cargo run --release -p runkeep-fs --example rss -- list <runs-dir>        # index
//! cargo run --release -p runkeep-fs --example rss -- list-walk <runs-dir>   # the walk
//! cargo run --release -p runkeep-fs --example rss -- catch-up <dir> <events> [page]
//! ```
//!
//! `list` pages through every row in both orders, with and without
//! filters, 100 rows a page; `catch-up` writes a run of `<events>` events
//! once (kept in `<dir>`), then in a fresh process reads it from the start
//! in pages of `[page]` (default 1 000) events with `since_seq`, as a
//! reader catching up does. The listing fixtures are the bench's
//! (`benches/listing_scale.rs`, `/tmp/runkeep-bench-listing-v1-<n>/runs`).

use std::path::Path;
use std::time::Instant;

use runkeep::park::ParkState;
use runkeep::{
    CheckpointStore, EvidenceStore, ListOptions, ListOrder, ListingScope, NewEvent, ProjectId,
    ReadEventsOptions, RunId, RunScope, SessionId, TenantId, Timestamp,
};
use runkeep_fs::testing::inline;
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::{json, Map};

fn attribution() -> Attribution {
    Attribution {
        tenant_id: TenantId::new("tnt_bench").unwrap(),
        project_id: ProjectId::new("prj_bench").unwrap(),
        session_id: SessionId::new("ses_bench").unwrap(),
    }
}

/// `(VmRSS, VmHWM)` in KiB.
fn rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn report(what: &str) {
    let (now, peak) = rss();
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_owned()
    };
    println!(
        "{what}: VmRSS {now} KiB, VmHWM {peak} KiB (RssAnon {} KiB, RssFile {} KiB)",
        field("RssAnon:"),
        field("RssFile:")
    );
}

fn open(base: &Path) -> FsStore {
    FsStore::open(
        base,
        FsOptions {
            attribution: Some(attribution()),
            ..Default::default()
        },
    )
    .expect("open the store")
}

fn list(base: &Path, walk: bool) {
    report("start");
    let store = open(base);
    if walk {
        store.testing().disable_index();
    } else {
        let t = Instant::now();
        let built = store.testing().wait_index();
        println!("index: {built:?} in {:?}", t.elapsed());
        report("index built");
    }
    let a = attribution();
    let session = ListingScope::session(a.tenant_id, a.project_id, a.session_id);
    let now = Timestamp::now();
    let mut rows = 0usize;
    let t = Instant::now();
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        for (park, claimed) in [
            (None, None),
            (Some(vec![ParkState::Outstanding]), None),
            (None, Some(false)),
        ] {
            let mut o = ListOptions {
                order,
                park,
                claimed,
                limit: Some(100),
                now: Some(now),
                ..Default::default()
            };
            // Walking every page through the walk would take minutes at
            // 100 000 runs: it lists the first 2 pages.
            let mut pages = 0;
            loop {
                let p = inline(store.list_runs(&session, &o)).expect("list");
                rows += p.entries.len();
                pages += 1;
                match p.cursor {
                    Some(c) if !walk || pages < 2 => o.cursor = Some(c),
                    _ => break,
                }
            }
        }
    }
    println!("listed {rows} rows in {:?}", t.elapsed());
    report("after listing");
    // The index's scratch file: an unlinked file this process holds open.
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            if target.to_string_lossy().ends_with("(deleted)") {
                if let Ok(m) = std::fs::metadata(fd.path()) {
                    println!(
                        "index scratch file: {} KiB on disk ({} KiB allocated)",
                        m.len() / 1024,
                        std::os::unix::fs::MetadataExt::blocks(&m) / 2
                    );
                }
            }
        }
    }
}

fn catch_up(dir: &Path, events: u64, page: usize) {
    let store = open(dir);
    let a = attribution();
    let s = RunScope::new(
        a.tenant_id,
        a.project_id,
        a.session_id,
        RunId::new("run_catch_up").unwrap(),
    );
    let have = inline(store.read_events(
        &s,
        &ReadEventsOptions {
            since_seq: events.saturating_sub(1),
            ..Default::default()
        },
    ))
    .expect("read")
    .last_seq;
    if have < events {
        let batch: Vec<NewEvent> = (0..1_000)
            .map(|i| {
                let mut p = Map::new();
                p.insert("i".into(), json!(i));
                p.insert("text".into(), json!("some event payload of moderate size"));
                NewEvent::new("step", p)
            })
            .collect();
        let t = Instant::now();
        let mut n = have;
        while n < events {
            n = inline(store.append_events(&s, &batch, None))
                .expect("append")
                .last()
                .map_or(n, |e| e.seq);
        }
        println!(
            "wrote {events} events in {:?}; run again to measure in a fresh process",
            t.elapsed()
        );
        return;
    }
    report("start");
    let t = Instant::now();
    let mut since = 0u64;
    let mut read = 0usize;
    loop {
        let b = inline(store.read_events(
            &s,
            &ReadEventsOptions {
                since_seq: since,
                limit: Some(page),
                ..Default::default()
            },
        ))
        .expect("read");
        let Some(last) = b.events.last() else { break };
        since = last.seq;
        read += b.events.len();
    }
    println!(
        "caught up over {read} events in pages of {page} in {:?}",
        t.elapsed()
    );
    report("after catch-up");
}

fn main() {
    // The test seams' counters hold an entry per run they count: not the
    // store's memory.
    runkeep_fs::testing::stop_counting();
    // The store's warnings (an index refused or sweeping) on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("list") => list(Path::new(&args[2]), false),
        Some("list-walk") => list(Path::new(&args[2]), true),
        Some("catch-up") => catch_up(
            Path::new(&args[2]),
            args[3].parse().expect("events"),
            args.get(4).map_or(1_000, |p| p.parse().expect("page")),
        ),
        _ => eprintln!("usage: rss list|list-walk <runs-dir> | catch-up <dir> <events> [page]"),
    }
}
