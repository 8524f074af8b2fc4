//! Cross-process lease races (one winner per fence, a reclaimed run won
//! once, a holding never seen empty or torn), with real OS processes sharing only the directory,
//! and the meta-tests proving these tests fail against a broken publish.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::*;
use runkeep::{CheckpointStore, ClaimOptions, ClaimOutcome, Error, Ttl};

/// Entry point of the worker processes the tests below spawn (this binary
/// re-entered with a role in `RUNKEEP_FS_WORKER`); a no-op otherwise.
#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    match role.as_str() {
        "single-run" => single_run_worker(),
        "batch" => batch_worker(),
        "watch" => watch_worker(),
        "renew" => renew_worker(),
        "claim-once" => claim_once_worker(),
        other => panic!("unknown worker role {other}"),
    }
}

fn body_holder(base: &Path, run: &str, fence: u64) -> String {
    match std::fs::read(base.join(run).join("claims").join(format!("{fence}.json"))) {
        Ok(b) => serde_json::from_slice::<serde_json::Value>(&b)
            .ok()
            .and_then(|v| v["holder"].as_str().map(str::to_string))
            .unwrap_or_else(|| "?unparseable".into()),
        Err(_) => "-".into(),
    }
}

/// Lease TTL of the single-run race (the reproduction used 30 ms).
const RACE_TTL_MS: u64 = 30;
/// The prune grace period of the single-run race's processes: below the
/// delayed claimer's 500 ms, so its delay crosses it (the default 5 s
/// would keep every name it aims at, and the race would no longer reach
/// the post-link check).
const RACE_GRACE_MS: u64 = 200;

/// One process of the single-run race: claims the run over and over; each
/// win is, in turn, released at once, renewed once and then released, or
/// left to lapse. Every handed-back fence and every successful release is
/// reported, so the parent can count fences handed out twice.
fn single_run_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let run = env("RUN");
    let me = env("HOLDER");
    let target: u64 = env("TARGET").parse().unwrap();
    let store = open_with_grace(&base, grace_from_env());
    let rt = rt();
    let s = scope(&run);
    let ttl_ms: u64 = std::env::var("TTL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RACE_TTL_MS);
    // Contract v2 counts every takeover from an expired lease as an attempt
    // and dead-letters the run at the limit; this race churns takeovers on
    // purpose, so the limit is lifted (the lease is what is under test).
    let opts = ClaimOptions::new(holder(&me), Ttl::from_millis(ttl_ms).unwrap())
        .with_max_attempts(u32::MAX);
    sleep_until(env("START_AT").parse().unwrap());
    let (mut contended, mut errors, mut late, mut n) = (0u64, 0u64, 0u64, 0u64);
    let claim = || rt.block_on(store.claim(&s, &opts.clone().at(runkeep::Timestamp::now())));
    let win = |l: &runkeep::Lease| {
        let body = body_holder(&base, &run, l.fence.get());
        report(format!("win {} {body}", l.fence));
    };
    let release = |f: runkeep::Fence| {
        if let Ok(true) = rt.block_on(store.release(&s, f)) {
            report(format!("released {f}"));
        }
    };
    loop {
        match claim() {
            Ok(ClaimOutcome::Acquired(l)) => {
                win(&l);
                if l.fence.get() >= target {
                    break;
                }
                n += 1;
                match n % 3 {
                    0 => release(l.fence),
                    1 => match claim() {
                        Ok(ClaimOutcome::Acquired(l2)) => {
                            win(&l2);
                            release(l2.fence);
                        }
                        _ => release(l.fence),
                    },
                    _ => std::thread::sleep(Duration::from_millis(ttl_ms + 1)),
                }
            }
            Ok(ClaimOutcome::Held(h)) => {
                if h.fence.get() >= target {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(other) => {
                errors += 1;
                report(format!("err unexpected {other:?}"));
            }
            Err(Error::Contended { .. }) => contended += 1,
            // The claim outlived its ttl; the store released the win.
            Err(Error::Unavailable { .. }) => late += 1,
            Err(e) => {
                errors += 1;
                report(format!("err {}", e.to_string().replace('\n', " ")));
                if errors > 200 {
                    break;
                }
            }
        }
    }
    report(format!(
        "done contended={contended} errors={errors} late={late}"
    ));
}

/// Tally of one single-run race.
#[derive(Debug, Default)]
struct Tally {
    /// The highest fence handed out.
    fences: u64,
    /// Fences handed back (a win, or a release's tombstone reported done)
    /// to more than one caller: the guarantee. Must be 0.
    won_twice: u64,
    /// Fences below the top that no publish ever linked (a skipped number).
    never_linked: u64,
    /// Links that landed on a name the run had moved past and were refused
    /// by the post-link check: proof that the delayed-claimer interleaving
    /// happened.
    refused_after_link: u64,
    /// Handed-back fences whose body named another process.
    wrong_body: u64,
    /// Wins whose body was pruned before the winner read it back.
    unverified: u64,
    errors: u64,
    contended: u64,
    late: u64,
}

/// The race, with `slow` extra variables given to process 0 only (a
/// claimer delayed before every link, across prune windows).
fn single_run_race_with(
    processes: usize,
    target: u64,
    envs: &[(&str, String)],
    slow: &[(&str, String)],
) -> Tally {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let trace = dir.path().join("trace");
    open(&base);
    let start = now_ms() + 1500;
    let workers: Vec<_> = (0..processes)
        .map(|i| {
            let mut e = vec![
                ("BASE", base.display().to_string()),
                ("RUN", "run_contended".to_string()),
                ("HOLDER", format!("proc-{i}")),
                ("TARGET", target.to_string()),
                ("START_AT", start.to_string()),
                ("RUNKEEP_FS_TEST_TRACE", trace.display().to_string()),
                // A prune grace period (200 ms) shorter than process 0's
                // delay before each link (500 ms): its links still land on
                // names pruned while it slept, which is what the post-link
                // check is for (a claimer delayed past any grace period).
                ("PRUNE_GRACE_MS", RACE_GRACE_MS.to_string()),
            ];
            e.extend(envs.iter().cloned());
            if i == 0 {
                e.extend(slow.iter().cloned());
            }
            spawn("single-run", &e)
        })
        .collect();
    let mut handed: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    let mut t = Tally::default();
    for (i, w) in workers.into_iter().enumerate() {
        for r in w.finish(Duration::from_secs(300)) {
            let parts: Vec<&str> = r.splitn(3, ' ').collect();
            match parts[0] {
                "win" => handed
                    .entry(parts[1].parse().unwrap())
                    .or_default()
                    .push((format!("proc-{i}"), parts[2].to_string())),
                // A release's tombstone is an issued fence too.
                "released" => handed
                    .entry(parts[1].parse::<u64>().unwrap() + 1)
                    .or_default()
                    .push((format!("proc-{i}"), "tombstone".into())),
                "err" => t.errors += 1,
                "done" => {
                    let field = |k: &str| {
                        r.split(&format!("{k}="))
                            .nth(1)
                            .and_then(|s| s.split(' ').next())
                            .and_then(|s| s.parse::<u64>().ok())
                            .unwrap_or(0)
                    };
                    t.contended += field("contended");
                    t.late += field("late");
                }
                _ => {}
            }
        }
    }
    let mut linked: BTreeSet<u64> = BTreeSet::new();
    for line in std::fs::read_to_string(&trace).unwrap_or_default().lines() {
        let mut w = line.split(' ').skip(1);
        match (w.next(), w.next().and_then(|f| f.parse::<u64>().ok())) {
            (Some("linked" | "tombstone"), Some(f)) => {
                linked.insert(f);
            }
            (Some("refused-after-link"), Some(_)) => t.refused_after_link += 1,
            _ => {}
        }
    }
    let top = handed.keys().max().copied().unwrap_or(0);
    t.fences = top;
    t.won_twice = handed.values().filter(|v| v.len() > 1).count() as u64;
    t.never_linked = (1..=top).filter(|f| !linked.contains(f)).count() as u64;
    for list in handed.values() {
        for (who, body) in list {
            match body.as_str() {
                "-" => t.unverified += 1,
                "tombstone" => {}
                b if b == who => {}
                _ => t.wrong_body += 1,
            }
        }
    }
    eprintln!(
        "single-run race ({processes} processes, target {target}, {envs:?}, process 0: {slow:?}): {t:?}"
    );
    t
}

/// Process 0 is delayed 500 ms before every link (claim, renewal and
/// release): the others issue well over 33 fences meanwhile, and the names
/// pass the 200 ms prune grace period, so its links regularly land on names
/// pruned while it slept. Its
/// ttl is 2 s, so a delayed win it is legitimately handed stays live (a
/// claim slower than its ttl is never handed back, which would hide the
/// stale link from the tally).
fn slow_claimer() -> Vec<(&'static str, String)> {
    vec![
        (
            "RUNKEEP_FS_TEST_DELAY",
            "claim-before-link:500,release-before-link:500".into(),
        ),
        ("TTL_MS", "2000".into()),
    ]
}

/// One winner per fence at one run, and no fence issued twice by a
/// delayed linker: six processes claim, renew and
/// release one run with a 30 ms ttl; one of them is delayed 500 ms before
/// every link, long enough for the others to move the run past the prune
/// window. No fence is handed to two callers, none is skipped, every
/// holding's body names the process that won it, and the delayed process's
/// stale links were really made and refused (the interleaving happened).
#[test]
fn six_processes_claiming_renewing_releasing_never_hand_a_fence_out_twice() {
    let t = single_run_race_with(6, 2000, &[], &slow_claimer());
    assert!(t.fences >= 2000, "{t:?}");
    assert_eq!(
        (t.won_twice, t.never_linked, t.wrong_body, t.errors),
        (0, 0, 0, 0),
        "{t:?}"
    );
    assert!(
        t.refused_after_link > 0,
        "the delayed claimer never linked a pruned name, so this run did not test the post-link check: {t:?}"
    );
    assert!(
        t.unverified < t.fences / 20,
        "too many bodies pruned before read-back: {t:?}"
    );
}

/// Meta-test for the delayed linker: the same race against a store whose
/// post-link check is removed hands fences out twice, and the race test's
/// tally sees it.
#[test]
fn the_single_run_race_catches_a_store_without_the_post_link_check() {
    let t = single_run_race_with(
        6,
        2000,
        &[("RUNKEEP_FS_TEST_MUTATION", "no-post-link-check".into())],
        &slow_claimer(),
    );
    assert!(
        t.won_twice > 0,
        "the missing post-link check went unnoticed: {t:?}"
    );
}

/// One claim of `run_forced` (60 s ttl), reported with the body of the
/// holding it was handed: `win <fence> <body holder>`, `held <fence>` or
/// `err <message>`.
fn claim_once_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let me = env("HOLDER");
    let store = open(&base);
    let rt = rt();
    let opts = ClaimOptions::new(holder(&me), Ttl::from_millis(60_000).unwrap());
    match rt.block_on(store.claim(&scope("run_forced"), &opts)) {
        Ok(ClaimOutcome::Acquired(l)) => report(format!(
            "win {} {}",
            l.fence,
            body_holder(&base, "run_forced", l.fence.get())
        )),
        Ok(ClaimOutcome::Held(h)) => report(format!("held {}", h.fence)),
        Ok(other) => report(format!("err unexpected {other:?}")),
        Err(e) => report(format!("err {}", e.to_string().replace('\n', " "))),
    }
}

/// Waits (bounded) until process `pid` is stopped.
fn await_stopped(pid: i32, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proc_state(pid) != 'T' {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never stopped at its pause point, so the interleaving was not forced"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The interleaving a shared scratch name breaks, forced: `a` writes its
/// body to its scratch file and stops before the link; `b` claims the same
/// fence (nothing is linked yet), writes its scratch file and stops before
/// its link; then `a` links and `b` links. Answers (`a`'s report, `b`'s
/// report, the scratch files seen while both were stopped).
fn forced_scratch_interleaving(envs: &[(&str, String)]) -> (String, String, Vec<String>) {
    let dir = tempdir();
    let base = dir.path().join("runs");
    open(&base);
    let claims = base.join("run_forced").join("claims");
    let spawn_one = |name: &str| {
        let mut e = vec![
            ("BASE", base.display().to_string()),
            ("HOLDER", name.to_string()),
            ("RUNKEEP_FS_TEST_PAUSE", "scratch-before-link".to_string()),
        ];
        e.extend(envs.iter().cloned());
        spawn("claim-once", &e)
    };
    let mut a = spawn_one("proc-a");
    await_stopped(a.pid(), "process a");
    let mut b = spawn_one("proc-b");
    await_stopped(b.pid(), "process b");
    let scratch: Vec<String> = std::fs::read_dir(&claims)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !scratch.iter().any(|n| n.ends_with(".json")),
        "a holding was linked before both processes wrote their scratch files: {scratch:?}"
    );
    signal(a.pid(), rustix::process::Signal::Cont);
    let ra = a.expect("", Duration::from_secs(30));
    a.finish(Duration::from_secs(30));
    signal(b.pid(), rustix::process::Signal::Cont);
    let rb = b.expect("", Duration::from_secs(30));
    b.finish(Duration::from_secs(30));
    eprintln!("forced scratch interleaving {envs:?}: scratch {scratch:?}; a: {ra}; b: {rb}");
    (ra, rb, scratch)
}

/// Meta-test: with the scratch name made a function of the fence (and not
/// exclusive), the interleaving above makes `a` link `b`'s body and win
/// with it: the check the single-run race applies to every win (the body
/// names its winner, `wrong_body`) sees it. The interleaving is forced
/// with pause points, so this cannot pass or fail by luck.
#[test]
fn the_single_run_race_catches_a_scratch_name_shared_per_fence() {
    let (a, b, scratch) =
        forced_scratch_interleaving(&[("RUNKEEP_FS_TEST_MUTATION", "per-fence-scratch".into())]);
    assert_eq!(
        scratch.len(),
        1,
        "both publishers must share one scratch name: {scratch:?}"
    );
    assert_eq!(
        a, "win 1 proc-b",
        "the shared scratch name went unnoticed: a won fence 1 with its own body"
    );
    assert!(b.starts_with("err "), "{b}");
}

/// The same forced interleaving against the correct scratch publish (a
/// unique name per attempt): `a` publishes its own body, `b`'s link finds
/// the name taken and `b` sees the run held.
#[test]
fn unique_scratch_names_keep_the_forced_interleaving_harmless() {
    let (a, b, scratch) =
        forced_scratch_interleaving(&[("RUNKEEP_FS_TEST_PUBLISH", "scratch".into())]);
    assert_eq!(scratch.len(), 2, "one scratch file each: {scratch:?}");
    assert_eq!(a, "win 1 proc-a");
    assert_eq!(b, "held 1");
}

fn batch_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let runs: usize = env("RUNS").parse().unwrap();
    let me = env("HOLDER");
    let store = open(&base);
    let rt = rt();
    let now = runkeep::Timestamp::from_millis(env("NOW").parse().unwrap()).unwrap();
    let opts = ClaimOptions::new(holder(&me), Ttl::from_millis(60_000).unwrap()).at(now);
    sleep_until(env("START_AT").parse().unwrap());
    for i in 0..runs {
        let run = format!("run_batch_{i:04}");
        match rt.block_on(store.claim(&scope(&run), &opts)) {
            Ok(ClaimOutcome::Acquired(l)) => report(format!(
                "won {run} {} {}",
                l.fence,
                body_holder(&base, &run, l.fence.get())
            )),
            Ok(ClaimOutcome::Held(_)) => {}
            Ok(other) => report(format!("err {run} unexpected {other:?}")),
            Err(e) => report(format!("err {run} {e}")),
        }
    }
    report("done");
}

/// Per run: every `(fence, winner, body holder)` reported.
type Wins = BTreeMap<String, Vec<(u64, String, String)>>;

fn batch_race(seed_expired_at: Option<u64>) -> (Wins, u64) {
    let dir = tempdir();
    let base = dir.path().join("runs");
    open(&base);
    let runs = 300;
    let now = now_ms();
    if let Some(f) = seed_expired_at {
        for i in 0..runs {
            let claims = base.join(format!("run_batch_{i:04}")).join("claims");
            std::fs::create_dir_all(&claims).unwrap();
            std::fs::write(
                claims.join(format!("{f}.json")),
                serde_json::json!({"holder": "crashed", "expiresAt": now - 60_000}).to_string(),
            )
            .unwrap();
        }
    }
    let start = now_ms() + 1500;
    let workers: Vec<_> = (0..6)
        .map(|i| {
            spawn(
                "batch",
                &[
                    ("BASE", base.display().to_string()),
                    ("RUNS", runs.to_string()),
                    ("HOLDER", format!("proc-{i}")),
                    ("NOW", now.to_string()),
                    ("START_AT", start.to_string()),
                ],
            )
        })
        .collect();
    let mut won: Wins = BTreeMap::new();
    let mut errors = 0;
    for (i, w) in workers.into_iter().enumerate() {
        for r in w.finish(Duration::from_secs(60)) {
            let p: Vec<&str> = r.split(' ').collect();
            match p[0] {
                "won" => won.entry(p[1].to_string()).or_default().push((
                    p[2].parse().unwrap(),
                    format!("proc-{i}"),
                    p[3].to_string(),
                )),
                "err" => errors += 1,
                _ => {}
            }
        }
    }
    (won, errors)
}

fn assert_batch(won: &Wins, errors: u64, fence: u64) {
    assert_eq!(errors, 0);
    assert_eq!(won.len(), 300, "runs nobody won: {}", 300 - won.len());
    let mut per_process: BTreeMap<&str, usize> = BTreeMap::new();
    for (run, wins) in won {
        assert_eq!(wins.len(), 1, "{run} won by several: {wins:?}");
        let (f, who, body) = &wins[0];
        assert_eq!(*f, fence, "{run} won at fence {f}");
        assert_eq!(body, who, "{run}: body names {body}, winner {who}");
        *per_process.entry(who).or_default() += 1;
    }
    eprintln!("batch race at fence {fence}: wins per process {per_process:?}");
}

/// Six processes released at one wall-clock barrier claim the
/// same 300 fresh runs in order: every run won exactly once, at fence 1.
#[test]
fn fresh_batch_race_gives_every_run_to_exactly_one_process_at_fence_1() {
    let (won, errors) = batch_race(None);
    assert_batch(&won, errors, 1);
}

/// A reclaimed run is won once, above the expired holding: every run seeded with an expired `claims/7.json`
/// is won exactly once, at fence 8 (anything else means the seed was not
/// read and the test degenerated into the fresh race).
#[test]
fn reclaim_race_reads_the_expired_seed_and_gives_every_run_once_at_fence_8() {
    let (won, errors) = batch_race(Some(7));
    assert_batch(&won, errors, 8);
}

fn watch_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let until: u64 = env("UNTIL").parse().unwrap();
    let claims = base.join("run_watched").join("claims");
    report("ready");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut next = 1u64;
    let (mut whole, mut torn) = (0u64, 0u64);
    while next <= until && std::time::Instant::now() < deadline {
        match std::fs::read(claims.join(format!("{next}.json"))) {
            Ok(bytes) => {
                let ok = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .is_some_and(|v| v["holder"].is_string() && v["expiresAt"].is_number());
                if ok {
                    whole += 1;
                } else {
                    torn += 1;
                    report(format!("torn {next}"));
                }
                next += 1;
            }
            Err(_) => std::hint::spin_loop(),
        }
    }
    report(format!("seen whole={whole} torn={torn} next={next}"));
}

fn renew_worker() {
    let base = std::path::PathBuf::from(env("BASE"));
    let until: u64 = env("UNTIL").parse().unwrap();
    let store = open(&base);
    let rt = rt();
    let opts = ClaimOptions::new(holder("renewer"), Ttl::from_millis(60_000).unwrap());
    for _ in 0..until {
        rt.block_on(store.claim(&scope("run_watched"), &opts))
            .unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    report("done");
}

fn publish_window(envs: &[(&str, String)]) -> (u64, u64) {
    let dir = tempdir();
    let base = dir.path().join("runs");
    open(&base);
    std::fs::create_dir_all(base.join("run_watched").join("claims")).unwrap();
    let common = [
        ("BASE", base.display().to_string()),
        ("UNTIL", "120".to_string()),
    ];
    let mut watcher = spawn("watch", &common);
    watcher.expect("ready", Duration::from_secs(30));
    let mut renew_env = common.to_vec();
    renew_env.extend(envs.iter().cloned());
    let renewer = spawn("renew", &renew_env);
    renewer.finish(Duration::from_secs(60));
    let seen = watcher.expect("seen", Duration::from_secs(60));
    watcher.finish(Duration::from_secs(10));
    let n = |k: &str| -> u64 {
        seen.split(&format!("{k}="))
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap()
    };
    eprintln!(
        "publish window {envs:?}: whole={} torn={}",
        n("whole"),
        n("torn")
    );
    (n("whole"), n("torn"))
}

/// A holding is never seen empty or torn: a process spinning on the exact next holding name while
/// another renews 120 times never sees it empty or torn (link publish), with
/// both publish paths (`O_TMPFILE` and scratch name).
#[test]
fn publish_window_watcher_never_sees_an_empty_or_torn_holding() {
    for envs in [
        vec![],
        vec![("RUNKEEP_FS_TEST_PUBLISH", "scratch".to_string())],
    ] {
        let (whole, torn) = publish_window(&envs);
        assert_eq!(torn, 0, "{envs:?}");
        assert!(
            whole > 60,
            "vacuous: only {whole} whole observations ({envs:?})"
        );
    }
}

/// Meta-test: with the holding created exclusively and then written (the
/// publish the lease rule forbids) the watcher sees an empty body. The window is
/// forced open: the renewer stops between the create and the write of its
/// first holding, and is let go only once the watcher has reported the
/// empty body it read.
#[test]
fn the_publish_window_watcher_catches_open_exclusive_then_write() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    open(&base);
    let claims = base.join("run_watched").join("claims");
    std::fs::create_dir_all(&claims).unwrap();
    let common = [
        ("BASE", base.display().to_string()),
        ("UNTIL", "20".to_string()),
    ];
    let mut watcher = spawn("watch", &common);
    watcher.expect("ready", Duration::from_secs(30));
    let mut renew_env = common.to_vec();
    renew_env.push((
        "RUNKEEP_FS_TEST_MUTATION",
        "open-exclusive-then-write".to_string(),
    ));
    renew_env.push((
        "RUNKEEP_FS_TEST_PAUSE",
        "open-exclusive-before-write".to_string(),
    ));
    let renewer = spawn("renew", &renew_env);
    await_stopped(renewer.pid(), "the renewer");
    let body = std::fs::read(claims.join("1.json")).unwrap();
    assert!(body.is_empty(), "the window was not open: {body:?}");
    let torn = watcher.expect("torn", Duration::from_secs(30));
    assert_eq!(torn, "torn 1");
    signal(renewer.pid(), rustix::process::Signal::Cont);
    renewer.finish(Duration::from_secs(60));
    let seen = watcher.expect("seen", Duration::from_secs(60));
    watcher.finish(Duration::from_secs(10));
    assert!(
        !seen.contains(" torn=0 "),
        "the watcher's tally lost the empty body it reported: {seen}"
    );
}

/// One winner in one process: 32 concurrent takers at one instant get
/// exactly one lease and distinct fences.
#[test]
fn thirty_two_concurrent_takers_in_one_process_get_exactly_one_lease() {
    let dir = tempdir();
    let store = std::sync::Arc::new(open(&dir.path().join("runs")));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcomes = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .claim(&scope("run_32"), &opts(&format!("w{i}"), 60_000, 1_000))
                    .await
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let leases: Vec<_> = outcomes
        .into_iter()
        .filter_map(|o| match o {
            Ok(ClaimOutcome::Acquired(l)) => Some(l.fence.get()),
            Ok(ClaimOutcome::Held(_)) | Err(Error::Contended { .. }) => None,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => panic!("{e}"),
        })
        .collect();
    assert_eq!(leases.len(), 1, "leases: {leases:?}");
    let distinct: BTreeSet<_> = leases.iter().collect();
    assert_eq!(distinct.len(), leases.len());
}
