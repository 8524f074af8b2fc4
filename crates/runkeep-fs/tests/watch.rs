//! `watch` on a directory (contract v2): a change made by another
//! process wakes a watcher through inotify (the watch thread's trace line
//! proves the wake-up came from inotify, not from the fallback interval);
//! without inotify the watch polls and says so in the log. The wake-up
//! latency is printed (`eprintln!`), never asserted.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use runkeep::watch::WatchTopic;
use runkeep::{CheckpointStore, EvidenceStore, ListingScope, NewEvent};
use serde_json::Map;

fn micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    let store = open(&PathBuf::from(env("BASE")));
    let rt = rt();
    let s = scope(&env("RUN"));
    report("ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let started = micros();
    match role.as_str() {
        "append" => {
            rt.block_on(store.append_events(&s, &[NewEvent::new("x", Map::new())], None))
                .unwrap();
        }
        "checkpoint" => {
            rt.block_on(store.write_checkpoint(&s, &cp("c_new", 1), None))
                .unwrap();
        }
        other => panic!("{other}"),
    }
    report(format!("wrote {started} {}", micros()));
}

/// The trace file of this test process (set once: the environment is
/// shared by the tests running in parallel; lines name the store).
fn trace_file() -> PathBuf {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let path = std::env::temp_dir().join(format!("runkeep-watch-trace-{}", std::process::id()));
    ONCE.call_once(|| std::env::set_var("RUNKEEP_FS_TEST_TRACE", &path));
    path
}

fn woke_lines(trace: &std::path::Path, base: &std::path::Path) -> usize {
    let want = format!("watch-woke {}", base.display());
    std::fs::read_to_string(trace)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&want))
        .count()
}

fn wake_once(role: &str, run: &str, topic_of: impl FnOnce(&runkeep::RunScope) -> WatchTopic) {
    let dir = tempdir();
    let trace = trace_file();
    let base = dir.path().join("runs");
    let store = open(&base);
    let s = scope(run);
    let rt = rt();
    // The run exists for a `Runnable` watch; an `Events` watch waits for
    // a transcript that does not exist yet.
    rt.block_on(store.write_checkpoint(&s, &cp("c0", 1), None))
        .unwrap();
    let mut watch = store.watch(&topic_of(&s));
    assert!(!watch.is_polling(), "inotify works on this volume");
    let mut w = spawn(
        role,
        &[
            ("BASE", base.display().to_string()),
            ("RUN", run.to_string()),
        ],
    );
    w.expect("ready", Duration::from_secs(30));
    let woke_before = woke_lines(&trace, &base);
    let sent = Instant::now();
    w.send("go");
    let woke =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), watch.changed()).await });
    let woke_at = micros();
    assert!(woke.is_ok(), "the watcher was not woken within 30 s");
    let wrote = w.expect("wrote", Duration::from_secs(30));
    let parts: Vec<u128> = wrote
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().unwrap())
        .collect();
    // The inotify thread woke it (a fallback tick would leave no line).
    let deadline = Instant::now() + Duration::from_secs(10);
    while woke_lines(&trace, &base) <= woke_before {
        assert!(
            Instant::now() < deadline,
            "no inotify wake-up was traced: the watcher woke by its interval"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "watch latency ({role}): {} µs from the other process's write call to the wake-up ({} µs after its write returned; {} µs after the go was sent)",
        woke_at.saturating_sub(parts[0]),
        woke_at as i128 - parts[1] as i128,
        sent.elapsed().as_micros()
    );
    w.finish(Duration::from_secs(30));
}

#[test]
fn another_process_appending_events_wakes_an_events_watcher() {
    wake_once("append", "run_watch_events", |s| {
        WatchTopic::Events(s.clone())
    });
}

#[test]
fn another_process_writing_a_checkpoint_wakes_a_runnable_watcher() {
    wake_once("checkpoint", "run_watch_runnable", |_| {
        WatchTopic::Runnable(ListingScope::tenant(tenant()))
    });
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn without_inotify_the_watch_polls_and_says_why() {
    let dir = tempdir();
    let store = open(dir.path());
    store.testing().disable_inotify();
    let out = Captured::default();
    let sink = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let watch = tracing::subscriber::with_default(subscriber, || {
        store.watch(&WatchTopic::Runnable(ListingScope::tenant(tenant())))
    });
    assert!(watch.is_polling());
    assert_eq!(watch.interval(), runkeep::watch::DEFAULT_POLL);
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("cannot use inotify") && log.contains("falling back to polling"),
        "{log}"
    );
}
