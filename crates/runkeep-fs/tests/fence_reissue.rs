//! No fence is issued twice: a claimer, a renewer or a releaser stopped
//! between its read of `claims/` and its hard link, while another process
//! moves the run on by more than the prune window, must not be handed the
//! fence its link landed on: the name was issued long ago, pruned, and is
//! free again for the kernel but not for the contract ("a fence above every
//! fence ever issued").
//!
//! Each scenario forces the interleaving: the worker process is stopped
//! with SIGSTOP at the `*-before-link` pause point, the test checks it is
//! stopped, moves the run 80 fences on and waits out the prune grace period
//! (so the worker's target name is pruned: checked), SIGCONTs it, and reads the worker's outcome and the
//! store's trace of links (which proves the stale link was made). Each
//! scenario also runs against the store with its post-link check removed
//! (meta-tests), where the same fence is handed out twice.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use runkeep::{CheckpointStore, ClaimOptions, ClaimOutcome, Timestamp, Ttl};

#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    let base = PathBuf::from(env("BASE"));
    let store = open(&base);
    let rt = rt();
    let s = scope(&env("RUN"));
    let opts = ClaimOptions::new(holder("worker"), Ttl::from_millis(60_000).unwrap());
    let claim = || rt.block_on(store.claim(&s, &opts.clone().at(Timestamp::now())));
    let outcome = |r: runkeep::Result<ClaimOutcome>| match r {
        Ok(ClaimOutcome::Acquired(l)) => format!("acquired {}", l.fence),
        Ok(ClaimOutcome::Held(h)) => format!("held {}", h.fence),
        Ok(other) => format!("unexpected {other:?}"),
        Err(e) => format!("error {}", e.kind()),
    };
    match role.as_str() {
        // Stops before its first link (the test set the pause point).
        "stale-claim" => report(outcome(claim())),
        // Wins, then stops before the link of its renewal.
        "stale-renew" => {
            let first = claim();
            report(format!("won {}", outcome(first)));
            std::env::set_var("RUNKEEP_FS_TEST_PAUSE", "claim-before-link");
            report(outcome(claim()));
        }
        // Wins, then stops before the link of its release's tombstone.
        "stale-release" => {
            let Ok(ClaimOutcome::Acquired(l)) = claim() else {
                panic!("the first claim must win");
            };
            report(format!("won acquired {}", l.fence));
            std::env::set_var("RUNKEEP_FS_TEST_PAUSE", "release-before-link");
            match rt.block_on(store.release(&s, l.fence)) {
                Ok(true) => report(format!("released {}", l.fence)),
                Ok(false) => report("release refused"),
                Err(e) => report(format!("error {}", e.kind())),
            }
        }
        // A claim that takes longer than its ttl (delayed after its link).
        "late-claim" => {
            let opts = ClaimOptions::new(holder("late"), Ttl::from_millis(100).unwrap());
            report(outcome(
                rt.block_on(store.claim(&s, &opts.at(Timestamp::now()))),
            ));
        }
        other => panic!("unknown role {other}"),
    }
}

/// What one forced interleaving produced.
#[derive(Debug)]
struct Scenario {
    /// Fence → who was handed it (a win, or a tombstone reported released).
    handed: BTreeMap<u64, Vec<String>>,
    /// The worker's final report.
    worker: String,
    /// The name the stopped worker was about to link.
    target: u64,
    /// That name was gone (pruned) when the worker was resumed.
    target_pruned: bool,
    /// The worker's trace lines (`linked F`, `refused-after-link F above G`…).
    trace: Vec<String>,
    /// The run's top fence at the end.
    top: u64,
}

impl Scenario {
    fn won_twice(&self) -> Vec<u64> {
        self.handed
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(f, _)| *f)
            .collect()
    }
}

fn wait_stopped(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while proc_state(pid) != 'T' {
        assert!(
            Instant::now() < deadline,
            "worker {pid} never reached its pause point"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn names(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v
}

/// The mover's prune grace period: short, so the scenario can wait it out
/// (the default is 5 s). The stopped worker's delay crosses it: the post-link
/// check is what protects a runkeep claimer delayed past any grace period.
const MOVER_GRACE: Duration = Duration::from_millis(200);

fn run_scenario(role: &str, mutation: Option<&str>) -> Scenario {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let trace = dir.path().join("trace");
    let store = open_with_grace(&base, MOVER_GRACE);
    let rt = rt();
    let s = scope("run_stale");
    let claims = base.join("run_stale").join("claims");
    let mut handed: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    // The test's own process judges on a clock an hour ahead, so the
    // worker's 60 s lease is expired for it, and holds leases for an hour.
    let later = Timestamp::from_millis(now_ms() + 3_600_000).unwrap();
    let mine = ClaimOptions::new(holder("mover"), Ttl::from_millis(3_600_000).unwrap()).at(later);
    let take = |handed: &mut BTreeMap<u64, Vec<String>>| {
        let Ok(ClaimOutcome::Acquired(l)) = rt.block_on(store.claim(&s, &mine)) else {
            panic!("the mover must win");
        };
        handed
            .entry(l.fence.get())
            .or_default()
            .push("mover".into());
        l.fence
    };
    if role == "stale-claim" {
        // Something to read: the worker sees a released top at fence 2.
        let f = take(&mut handed);
        assert!(rt.block_on(store.release(&s, f)).unwrap());
        handed.entry(f.get() + 1).or_default().push("mover".into());
    }
    let mut envs = vec![
        ("BASE", base.display().to_string()),
        ("RUN", "run_stale".to_string()),
        ("RUNKEEP_FS_TEST_TRACE", trace.display().to_string()),
    ];
    if role == "stale-claim" {
        envs.push(("RUNKEEP_FS_TEST_PAUSE", "claim-before-link".into()));
    }
    if let Some(m) = mutation {
        envs.push(("RUNKEEP_FS_TEST_MUTATION", m.into()));
    }
    let mut w = spawn(role, &envs);
    let target = if role == "stale-claim" {
        3
    } else {
        let won = w.expect("won", Duration::from_secs(30));
        let f: u64 = won.rsplit(' ').next().unwrap().parse().unwrap();
        handed.entry(f).or_default().push("worker".into());
        f + 1
    };
    wait_stopped(w.pid());
    // Move the run 80 fences on: claim and release, 40 times.
    for _ in 0..40 {
        let f = take(&mut handed);
        assert!(rt.block_on(store.release(&s, f)).unwrap());
        handed.entry(f.get() + 1).or_default().push("mover".into());
    }
    // Past the grace period, the next claim prunes the old names (the
    // worker's target among them).
    std::thread::sleep(MOVER_GRACE + Duration::from_millis(50));
    let live = take(&mut handed);
    let target_pruned = !names(&claims).contains(&target);
    signal(w.pid(), rustix::process::Signal::Cont);
    let reports = w.finish(Duration::from_secs(60));
    let worker = reports.last().cloned().unwrap_or_default();
    let mut words = worker.split(' ');
    match (
        words.next(),
        words.next().and_then(|f| f.parse::<u64>().ok()),
    ) {
        (Some("acquired"), Some(f)) => handed.entry(f).or_default().push("worker".into()),
        (Some("released"), Some(f)) => handed.entry(f + 1).or_default().push("worker".into()),
        _ => {}
    }
    let trace = std::fs::read_to_string(&trace)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest).to_string())
        .collect();
    let top = names(&claims).last().copied().unwrap_or(0);
    assert!(top >= live.get());
    Scenario {
        handed,
        worker,
        target,
        target_pruned,
        trace,
        top,
    }
}

fn assert_refused(sc: &Scenario, expected_worker: &str) {
    eprintln!("{sc:?}");
    assert!(
        sc.target_pruned,
        "the interleaving did not happen: {} was not pruned: {sc:?}",
        sc.target
    );
    let linked = format!(
        "{} {}",
        if sc.worker.starts_with("release") {
            "tombstone"
        } else {
            "linked"
        },
        sc.target
    );
    assert!(
        sc.trace.contains(&linked),
        "the stopped worker's stale link ({linked}) was never made: {sc:?}"
    );
    assert!(
        sc.trace
            .iter()
            .any(|l| l.starts_with(&format!("refused-after-link {} above", sc.target))),
        "{sc:?}"
    );
    assert_eq!(sc.worker, expected_worker, "{sc:?}");
    assert_eq!(
        sc.won_twice(),
        Vec::<u64>::new(),
        "fences handed out twice: {sc:?}"
    );
}

#[test]
fn a_claimer_stopped_across_the_prune_window_is_not_handed_a_pruned_fence() {
    let sc = run_scenario("stale-claim", None);
    // It retried on the real top and found the mover's live lease.
    assert_refused(&sc, &format!("held {}", sc.top));
}

#[test]
fn a_renewal_stopped_across_the_prune_window_is_not_handed_a_pruned_fence() {
    let sc = run_scenario("stale-renew", None);
    assert_refused(&sc, &format!("held {}", sc.top));
}

#[test]
fn a_release_stopped_across_the_prune_window_does_not_count_its_stale_tombstone() {
    let sc = run_scenario("stale-release", None);
    assert_refused(&sc, "release refused");
}

/// Meta-tests: the same interleavings against the store without its
/// post-link check hand the pruned fence to the stopped worker, which the
/// scenario's tally reports as won twice.
#[test]
fn the_scenarios_catch_a_store_without_the_post_link_check() {
    for role in ["stale-claim", "stale-renew", "stale-release"] {
        let sc = run_scenario(role, Some("no-post-link-check"));
        eprintln!("{role} without the post-link check: {sc:?}");
        assert!(sc.target_pruned, "{role}: {sc:?}");
        assert_eq!(
            sc.won_twice(),
            vec![sc.target],
            "{role}: the broken store should hand {} out twice: {sc:?}",
            sc.target
        );
    }
}

/// Item 4: a claim that outlives its ttl (here delayed 300 ms after its link
/// with a 100 ms ttl) does not hand back the expired lease: it answers a
/// retryable `Unavailable` and releases the win, so the run is free at once.
#[test]
fn a_claim_slower_than_its_ttl_never_returns_an_expired_lease() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open(&base);
    let w = spawn(
        "late-claim",
        &[
            ("BASE", base.display().to_string()),
            ("RUN", "run_late".to_string()),
            ("RUNKEEP_FS_TEST_DELAY", "claim-after-link:300".into()),
        ],
    );
    let reports = w.finish(Duration::from_secs(60));
    assert_eq!(
        reports.last().map(String::as_str),
        Some("error unavailable"),
        "{reports:?}"
    );
    let rt = rt();
    let s = scope("run_late");
    // The expired win was released: fence 1 taken, tombstone at 2.
    assert_eq!(names(&base.join("run_late").join("claims")), vec![1, 2]);
    let got = rt
        .block_on(store.claim(&s, &opts("next", 60_000, now_ms())))
        .unwrap();
    assert!(matches!(got, ClaimOutcome::Acquired(l) if l.fence.get() == 3));
    // The store's own process sees nothing odd either.
    assert!(rt
        .block_on(store.lease(&s, Timestamp::now()))
        .unwrap()
        .is_some());
}

/// Item 4: a claims directory with a large backlog of old holdings is worked
/// down a bounded slice per claim (the work of one claim does not grow with
/// the backlog), and a release prunes too, so `claims/` ends at 33 names
/// once the names are past the prune grace period (200 ms here, waited out).
#[test]
fn pruning_is_bounded_per_claim_and_a_release_prunes_too() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let grace = Duration::from_millis(200);
    let store = open_with_grace(&base, grace);
    let rt = rt();
    let s = scope("run_backlog");
    let t0 = now_ms();
    let first = rt
        .block_on(store.claim(&s, &opts("a", 60_000, t0)))
        .unwrap();
    assert!(matches!(first, ClaimOutcome::Acquired(_)));
    let claims = base.join("run_backlog").join("claims");
    // A backlog of 5 000 lapsed holdings below the top, as a crashed or
    // old pruner would leave them.
    let body = br#"{"holder":"old","expiresAt":1}"#;
    for f in 2..=5_000u64 {
        std::fs::write(claims.join(format!("{f}.json")), body).unwrap();
    }
    std::fs::remove_file(claims.join("1.json")).unwrap();
    // The backlog is old: older than the grace period.
    std::thread::sleep(grace + Duration::from_millis(50));
    let before = names(&claims).len();
    let got = rt
        .block_on(store.claim(&s, &opts("b", 60_000, t0 + 10)))
        .unwrap();
    let ClaimOutcome::Acquired(l) = got else {
        panic!("{got:?}")
    };
    assert_eq!(l.fence.get(), 5_001);
    let after = names(&claims).len();
    // One claim removes at most 256 holdings (the bound), and at least that
    // many when that many are due.
    assert_eq!(before + 1 - after, 256, "before {before}, after {after}");
    // Claims and releases work the backlog down to the window.
    let mut f = l.fence;
    for i in 0..40 {
        assert!(rt.block_on(store.release(&s, f)).unwrap());
        let ClaimOutcome::Acquired(l) = rt
            .block_on(store.claim(&s, &opts("b", 60_000, t0 + 20 + i)))
            .unwrap()
        else {
            panic!("must win");
        };
        f = l.fence;
    }
    // The names those 40 rounds made are younger than the grace period and
    // kept; past it, one more claim and release prune them too.
    std::thread::sleep(grace + Duration::from_millis(50));
    assert!(rt.block_on(store.release(&s, f)).unwrap());
    let ClaimOutcome::Acquired(l) = rt
        .block_on(store.claim(&s, &opts("b", 60_000, t0 + 100)))
        .unwrap()
    else {
        panic!("must win");
    };
    f = l.fence;
    assert!(rt.block_on(store.release(&s, f)).unwrap());
    let left = names(&claims);
    assert_eq!(left.len(), 33, "{left:?}");
    assert_eq!(*left.last().unwrap(), f.get() + 1);
}
