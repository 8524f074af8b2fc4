//! runkeep and the reference implementation claiming one run in one
//! directory (issue 33): runkeep's pruning must not empty a holding name a
//! slow reference claimer is still aiming at.
//!
//! The reference claims by reading the top holding, then hard-linking
//! `top + 1`, and hands the lease back as soon as the link succeeds: it
//! never looks at the directory after its link (spec §3.4, FL-17). A link
//! proves only that the name was free at that instant. If runkeep moved the
//! run more than the 33-name prune window on while the reference was
//! between its read and its link, and pruned the name, the link succeeds on
//! a fence runkeep already handed out: one fence, two holders. runkeep keeps
//! every name younger than its prune grace period
//! (`FsOptions::prune_grace`), so the late link collides instead.
//!
//! The reference side here is a claimer written from the spec (§3.3 to
//! §3.7: names, body, read, publish through a scratch name, prune after a
//! win, release by tombstone), run in its own OS process, with a pause
//! between its read and its link that the test controls. runkeep claimers
//! are `FsStore`s in other OS processes.
//!
//! - The forced interleaving: the reference claimer reads the top and
//!   waits on a barrier (a line on its stdin) while two runkeep processes
//!   move the run 80 fences on; then it links. With the grace period its
//!   link collides (0 fences issued twice); with the grace period off it
//!   lands on the pruned name (the meta-test: exactly that fence issued
//!   twice).
//! - The randomized race: two runkeep and two reference processes on one
//!   run with a 30 ms ttl, the reference claimers pausing a random time
//!   (up to 400 ms, far below the grace period) before half of their links,
//!   until the run reaches `RUNKEEP_FS_MIXED_RACE_FENCES` fences (default
//!   2 000). Every fence issued twice is attributed, from the shared trace,
//!   to the pruner that emptied its name: a reference claimer's own pruning
//!   (which has no grace period, and which runkeep cannot change) or
//!   runkeep's. runkeep's must be 0 with the grace period and is not
//!   without it; with the grace period and reference claimers that skip
//!   their holding window, no fence at all may be issued twice (which
//!   checks the attribution).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use runkeep::{CheckpointStore, ClaimOptions, ClaimOutcome, Error, Ttl};

/// The run every scenario claims.
const RUN: &str = "run_shared";
/// How far the runkeep processes move the run past the paused reference
/// claimer's target: well over the 33-name window.
const ADVANCE: u64 = 80;
/// The lease ttl of every claimer (the races used 30 ms).
const TTL_MS: u64 = 30;
/// The longest pause of a reference claimer between its read and its link
/// in the randomized race: long enough for runkeep to move the run past
/// the 33-name window, far below the default grace period (5 s).
const MAX_PAUSE_MS: u64 = 400;

/// The reference's claim protocol, written from the spec (not from its
/// code): names (FL-5), body and tombstone (FL-12, FL-13), reading the
/// current holding (FL-14, FL-15), acquire (FL-17), publish (FL-20), release
/// (FL-24) and the holding window (FL-27).
mod reference {
    use std::io;
    use std::path::{Path, PathBuf};

    use serde_json::{json, Value};

    /// What an acquire did.
    #[derive(Debug)]
    pub enum Outcome {
        /// The link of this fence succeeded: the lease is handed back.
        Won(u64),
        /// The run is held live by someone else.
        Held,
        /// Eight lost link races.
        Lost,
    }

    pub struct Claimer {
        claims: PathBuf,
        holder: String,
        ttl_ms: i64,
        attempt: u64,
        trace: Option<PathBuf>,
        prunes: bool,
    }

    /// The fence a name denotes: `^([0-9]{1,15})\.json$` (the reference's
    /// pattern, leading zeros admitted).
    fn fence_of(name: &str) -> Option<u64> {
        let digits = name.strip_suffix(".json")?;
        if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// Every holding fence in the claims directory (names only).
    pub fn fences(claims: &Path) -> Vec<u64> {
        let Ok(rd) = std::fs::read_dir(claims) else {
            return Vec::new();
        };
        rd.filter_map(|e| fence_of(e.ok()?.file_name().to_str()?))
            .collect()
    }

    /// `currentFence`: the highest holding name, 0 when none.
    pub fn current(claims: &Path) -> u64 {
        fences(claims).into_iter().max().unwrap_or(0)
    }

    impl Claimer {
        pub fn new(run_dir: &Path, holder: &str, ttl_ms: u64, trace: Option<PathBuf>) -> Self {
            Self {
                claims: run_dir.join("claims"),
                holder: holder.to_string(),
                ttl_ms: ttl_ms as i64,
                attempt: 0,
                trace,
                prunes: true,
            }
        }

        /// A claimer that skips the holding window (the attribution
        /// cross-check of the randomized race: no reference pruning).
        pub fn without_pruning(mut self) -> Self {
            self.prunes = false;
            self
        }

        pub fn claims_dir(&self) -> &Path {
            &self.claims
        }

        fn trace(&self, event: String) {
            if let Some(path) = &self.trace {
                super::append_line(path, &format!("{} {event}", std::process::id()));
            }
        }

        /// `readClaim`: the top holding's fence, holder and expiry; an
        /// unreadable or vanished body reads as `("", 0)`.
        fn read_claim(&self) -> io::Result<Option<(u64, String, f64)>> {
            let top = current(&self.claims);
            if top == 0 {
                return Ok(None);
            }
            let body = match std::fs::read(self.claims.join(format!("{top}.json"))) {
                Ok(b) => serde_json::from_slice::<Value>(&b).ok(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            let (holder, expires_at) = body
                .and_then(|v| {
                    let h = v.get("holder")?.as_str()?.to_string();
                    let x = v.get("expiresAt")?.as_f64().filter(|x| x.is_finite())?;
                    Some((h, x))
                })
                .unwrap_or_default();
            Ok(Some((top, holder, expires_at)))
        }

        /// Publish: the body to a fresh scratch name (exclusive create),
        /// linked to `<fence>.json`, the scratch name unlinked whatever
        /// happened. `Ok(false)`: the name exists (a lost race).
        fn publish(&mut self, fence: u64, body: &Value) -> io::Result<bool> {
            self.attempt += 1;
            let random: String = {
                use rand::Rng;
                let mut r = rand::thread_rng();
                (0..8)
                    .map(|_| char::from_digit(r.gen_range(0..36), 36).unwrap())
                    .collect()
            };
            let scratch = self.claims.join(format!(
                ".tmp-{}-{}-{random}-{fence}",
                std::process::id(),
                self.attempt
            ));
            {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&scratch)?;
                f.write_all(&serde_json::to_vec(body).unwrap())?;
            }
            let linked = std::fs::hard_link(&scratch, self.claims.join(format!("{fence}.json")));
            let _ = std::fs::remove_file(&scratch);
            match linked {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            }
        }

        /// The holding window after a win at `max`: every holding below
        /// `max - 32` is unlinked (no age, no bound). Each unlink is traced
        /// before it is tried (`ref-unlink F`) and after it succeeded
        /// (`ref-pruned F`), so a test can tell which names this pruning
        /// emptied, and before what.
        fn prune(&self, max: u64) {
            let floor = max.saturating_sub(32);
            if floor == 0 || !self.prunes {
                return;
            }
            for f in fences(&self.claims) {
                if f < floor {
                    self.trace(format!("ref-unlink {f}"));
                    if std::fs::remove_file(self.claims.join(format!("{f}.json"))).is_ok() {
                        self.trace(format!("ref-pruned {f}"));
                    }
                }
            }
        }

        /// `acquire` at `now_ms`: up to 8 times, read the top, give up if
        /// someone else holds it live, else publish `top + 1`. There is no
        /// check after a successful link: it is the win. `before_link` is
        /// called with the fence about to be linked (the test's pause).
        pub fn acquire(
            &mut self,
            now_ms: i64,
            mut before_link: impl FnMut(u64),
        ) -> io::Result<Outcome> {
            std::fs::create_dir_all(&self.claims)?;
            for _ in 0..8 {
                let held = self.read_claim()?;
                if let Some((_, holder, expires_at)) = &held {
                    if (now_ms as f64) < *expires_at && *holder != self.holder {
                        return Ok(Outcome::Held);
                    }
                }
                let fence = held.map_or(0, |(f, _, _)| f) + 1;
                let body = json!({"holder": self.holder, "expiresAt": now_ms + self.ttl_ms});
                before_link(fence);
                if self.publish(fence, &body)? {
                    self.trace(format!("ref-linked {fence}"));
                    self.prune(fence);
                    return Ok(Outcome::Won(fence));
                }
                self.trace(format!("ref-exists {fence}"));
            }
            Ok(Outcome::Lost)
        }

        /// `release`: only when `fence` is the top, the tombstone at
        /// `fence + 1`; a lost link is swallowed. True when the tombstone's
        /// link succeeded.
        pub fn release(&mut self, fence: u64) -> io::Result<bool> {
            match self.read_claim()? {
                Some((top, _, _)) if top == fence => {}
                _ => return Ok(false),
            }
            let tomb = fence + 1;
            let linked = self.publish(tomb, &json!({"holder": "", "expiresAt": 0}))?;
            if linked {
                self.trace(format!("ref-tomb {tomb}"));
            }
            Ok(linked)
        }
    }
}

/// Appends one line with a single `O_APPEND` write (lines of concurrent
/// processes never interleave; their order is the order of the writes).
fn append_line(path: &Path, line: &str) {
    raw_append(path, format!("{line}\n").as_bytes());
}

#[test]
fn worker_process_entry() {
    let Ok(role) = std::env::var(WORKER_ENV) else {
        return;
    };
    match role.as_str() {
        "ref-paused" => ref_paused_worker(),
        "ref-random" => ref_random_worker(),
        "runkeep" => runkeep_worker(),
        other => panic!("unknown role {other}"),
    }
}

fn trace_path() -> Option<PathBuf> {
    std::env::var("RUNKEEP_FS_TEST_TRACE")
        .ok()
        .map(PathBuf::from)
}

/// A reference claimer stopped between its read and its link: reports
/// `aim F` when it has read the top and is about to link `F`, then waits
/// for a line on its stdin; reports `exists F` for each lost link and
/// `win F` or `held` at the end.
fn ref_paused_worker() {
    let base = PathBuf::from(env("BASE"));
    let mut c = reference::Claimer::new(&base.join(RUN), "ref-paused", TTL_MS, trace_path());
    let mut first = true;
    let mut aimed = Vec::new();
    let outcome = c
        .acquire(now_ms(), |fence| {
            aimed.push(fence);
            if std::mem::take(&mut first) {
                report(format!("aim {fence}"));
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line).unwrap();
            }
        })
        .unwrap();
    let won = match outcome {
        reference::Outcome::Won(f) => Some(f),
        _ => None,
    };
    for f in aimed {
        if Some(f) != won {
            report(format!("exists {f}"));
        }
    }
    match outcome {
        reference::Outcome::Won(f) => report(format!("win {f}")),
        other => report(format!("{other:?}").to_lowercase()),
    }
}

/// A reference claimer in a loop until the run reaches `TARGET`: before
/// half of its links it pauses 1 to `MAX_PAUSE_MS` ms; a win is released at
/// once or left to lapse, in turn.
fn ref_random_worker() {
    let base = PathBuf::from(env("BASE"));
    let me = env("HOLDER");
    let target: u64 = env("TARGET").parse().unwrap();
    let max_pause: u64 = env("MAX_PAUSE_MS").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(env("DEADLINE_S").parse().unwrap());
    let mut c = reference::Claimer::new(&base.join(RUN), &me, TTL_MS, trace_path());
    if std::env::var("NO_REFERENCE_PRUNE").is_ok() {
        c = c.without_pruning();
    }
    let mut rng = rand::thread_rng();
    sleep_until(env("START_AT").parse().unwrap());
    let (mut wins, mut paused, mut n) = (0u64, 0u64, 0u64);
    while reference::current(c.claims_dir()) < target && Instant::now() < deadline {
        let pause = rng.gen_bool(0.5).then(|| rng.gen_range(1..=max_pause));
        let outcome = c
            .acquire(now_ms(), |_| {
                if let Some(ms) = pause {
                    paused += 1;
                    std::thread::sleep(Duration::from_millis(ms));
                }
            })
            .unwrap();
        match outcome {
            reference::Outcome::Won(f) => {
                wins += 1;
                report(format!("win {f}"));
                n += 1;
                if n.is_multiple_of(2) {
                    if c.release(f).unwrap() {
                        report(format!("tomb {}", f + 1));
                    }
                } else {
                    std::thread::sleep(Duration::from_millis(TTL_MS + 1));
                }
            }
            reference::Outcome::Held | reference::Outcome::Lost => {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    report(format!("done wins={wins} paused={paused}"));
}

/// A runkeep claimer (an `FsStore` with the prune grace period of
/// `PRUNE_GRACE_MS`) in a loop until the run reaches `TARGET`: every
/// `LAPSE_EVERY`th win (never when unset) is left to lapse, the others are,
/// in turn, released at once or renewed once then released. Reports
/// `win F` and `released F`.
fn runkeep_worker() {
    let base = PathBuf::from(env("BASE"));
    let me = env("HOLDER");
    let target: u64 = env("TARGET").parse().unwrap();
    let lapse_every: Option<u64> = std::env::var("LAPSE_EVERY")
        .ok()
        .map(|v| v.parse().unwrap());
    let deadline = Instant::now() + Duration::from_secs(env("DEADLINE_S").parse().unwrap());
    let store = open_with_grace(&base, grace_from_env());
    let rt = rt();
    let s = scope(RUN);
    // Every takeover from a lapsed lease is an attempt (contract v2); the
    // race churns them on purpose, so the limit is lifted.
    let opts = ClaimOptions::new(holder(&me), Ttl::from_millis(TTL_MS).unwrap())
        .with_max_attempts(u32::MAX);
    if let Ok(at) = std::env::var("START_AT") {
        sleep_until(at.parse().unwrap());
    }
    let claim = || rt.block_on(store.claim(&s, &opts.clone().at(runkeep::Timestamp::now())));
    let release = |f: runkeep::Fence| {
        if let Ok(true) = rt.block_on(store.release(&s, f)) {
            report(format!("released {f}"));
        }
    };
    let mut n = 0u64;
    while Instant::now() < deadline {
        match claim() {
            Ok(ClaimOutcome::Acquired(l)) => {
                report(format!("win {}", l.fence));
                n += 1;
                if l.fence.get() >= target {
                    release(l.fence);
                    break;
                }
                if lapse_every.is_some_and(|k| n.is_multiple_of(k)) {
                    std::thread::sleep(Duration::from_millis(TTL_MS + 1));
                } else if n.is_multiple_of(2) {
                    release(l.fence);
                } else {
                    match claim() {
                        Ok(ClaimOutcome::Acquired(l2)) => {
                            report(format!("win {}", l2.fence));
                            release(l2.fence);
                        }
                        _ => release(l.fence),
                    }
                }
            }
            Ok(ClaimOutcome::Held(h)) => {
                if h.fence.get() >= target {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(other) => report(format!("err unexpected {other:?}")),
            Err(Error::Contended { .. } | Error::Unavailable { .. }) => {}
            Err(e) => report(format!("err {}", e.to_string().replace('\n', " "))),
        }
    }
    report("done");
}

/// Fence → who was issued it (a lease handed back, or a tombstone whose
/// release counted).
type Issued = BTreeMap<u64, Vec<String>>;

fn record(issued: &mut Issued, who: &str, reports: &[String]) {
    for r in reports {
        let mut w = r.split(' ');
        let (kind, fence) = (w.next(), w.next().and_then(|f| f.parse::<u64>().ok()));
        match (kind, fence) {
            (Some("win" | "tomb"), Some(f)) => issued.entry(f).or_default().push(who.into()),
            // A release's tombstone is an issued fence too.
            (Some("released"), Some(f)) => issued.entry(f + 1).or_default().push(who.into()),
            _ => {}
        }
    }
}

fn issued_twice(issued: &Issued) -> Vec<u64> {
    issued
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(f, _)| *f)
        .collect()
}

fn errors(reports: &[String]) -> Vec<&String> {
    reports.iter().filter(|r| r.starts_with("err")).collect()
}

/// What the forced interleaving produced.
#[derive(Debug)]
struct Forced {
    /// The fence the paused reference claimer read the top for and was
    /// about to link.
    aim: u64,
    /// Its name was gone (pruned) when the reference claimer was let go.
    aim_pruned: bool,
    /// The run's top when the reference claimer was let go.
    top_at_go: u64,
    /// The names in `claims/` when the reference claimer was let go.
    names_at_go: usize,
    /// From the first runkeep claim to the release of the reference
    /// claimer (must stay below the grace period for the scenario to mean
    /// anything).
    advance_took: Duration,
    /// The paused claimer's reports.
    reference: Vec<String>,
    /// Fences issued to more than one caller.
    twice: Vec<u64>,
    issued: Issued,
}

/// The reference claimer reads the top (a released run at fence 2) and
/// stops before linking 3; two runkeep processes with the prune grace
/// period `grace` move the run [`ADVANCE`] fences on; the reference claimer
/// links.
fn forced(grace: Duration) -> Forced {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let claims = base.join(RUN).join("claims");
    let store = open(&base);
    let rt = rt();
    let s = scope(RUN);
    let mut issued = Issued::new();
    // Something to read: a released run, top at fence 2.
    let Ok(ClaimOutcome::Acquired(l)) =
        rt.block_on(store.claim(&s, &opts("first", 60_000, now_ms())))
    else {
        panic!("the first claim must win")
    };
    assert!(rt.block_on(store.release(&s, l.fence)).unwrap());
    issued.entry(1).or_default().push("first".into());
    issued.entry(2).or_default().push("first".into());
    let mut r = spawn("ref-paused", &[("BASE", base.display().to_string())]);
    let aim: u64 = r
        .expect("aim", Duration::from_secs(60))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(aim, 3, "the reference claimer read the released top");
    let target = aim + ADVANCE;
    let started = Instant::now();
    let movers: Vec<_> = (0..2)
        .map(|i| {
            spawn(
                "runkeep",
                &[
                    ("BASE", base.display().to_string()),
                    ("HOLDER", format!("rk-{i}")),
                    ("TARGET", target.to_string()),
                    ("PRUNE_GRACE_MS", grace.as_millis().to_string()),
                    ("DEADLINE_S", "60".into()),
                ],
            )
        })
        .collect();
    for (i, m) in movers.into_iter().enumerate() {
        let reports = m.finish(Duration::from_secs(120));
        assert!(errors(&reports).is_empty(), "{reports:?}");
        record(&mut issued, &format!("rk-{i}"), &reports);
    }
    let names = reference::fences(&claims);
    let top_at_go = names.iter().copied().max().unwrap_or(0);
    assert!(top_at_go >= target, "the run did not advance: {names:?}");
    let aim_pruned = !names.contains(&aim);
    let advance_took = started.elapsed();
    r.send("go");
    let reference = r.finish(Duration::from_secs(60));
    record(&mut issued, "ref-paused", &reference);
    let sc = Forced {
        aim,
        aim_pruned,
        top_at_go,
        names_at_go: names.len(),
        advance_took,
        reference,
        twice: issued_twice(&issued),
        issued,
    };
    eprintln!(
        "forced interleaving, grace {grace:?}: aim {}, pruned {}, top at go {}, {} names, advance took {:?}, reference {:?}, issued twice {:?}",
        sc.aim, sc.aim_pruned, sc.top_at_go, sc.names_at_go, sc.advance_took, sc.reference, sc.twice
    );
    sc
}

/// With the grace period (the default), the name the paused reference
/// claimer aims at is still there after runkeep moved the run 80 fences on,
/// so its link collides; it re-reads and claims above the top. No fence is
/// issued twice.
#[test]
fn a_paused_reference_claimer_collides_instead_of_reissuing_a_pruned_fence() {
    let grace = runkeep_fs::FsOptions::DEFAULT_PRUNE_GRACE;
    let sc = forced(grace);
    assert!(
        sc.advance_took < grace,
        "the advance took longer than the grace period, so the scenario tests nothing: {sc:?}"
    );
    assert!(
        !sc.aim_pruned,
        "the grace period did not keep {}: {sc:?}",
        sc.aim
    );
    assert!(
        sc.reference.contains(&format!("exists {}", sc.aim)),
        "the paused claimer's late link must collide: {sc:?}"
    );
    assert_eq!(sc.twice, Vec::<u64>::new(), "fences issued twice: {sc:?}");
    // The reference claimer then claimed legitimately, above the top.
    let last = sc.reference.last().cloned().unwrap_or_default();
    let won: Option<u64> = last.strip_prefix("win ").and_then(|f| f.parse().ok());
    assert!(
        won.is_some_and(|f| f > sc.top_at_go),
        "the reference claimer should win above the top {} after its collision: {sc:?}",
        sc.top_at_go
    );
}

/// Meta-test: with the grace period off (`prune_grace` zero) the same
/// interleaving prunes the name, the paused claimer's link lands on it, and
/// that fence is issued twice, which the tally sees.
#[test]
fn without_the_grace_period_the_paused_reference_claimer_is_issued_a_fence_twice() {
    let sc = forced(Duration::ZERO);
    assert!(sc.aim_pruned, "the interleaving did not happen: {sc:?}");
    assert_eq!(
        sc.reference.last().cloned(),
        Some(format!("win {}", sc.aim)),
        "{sc:?}"
    );
    assert_eq!(sc.twice, vec![sc.aim], "{sc:?}");
    assert!(
        sc.issued[&sc.aim].iter().any(|w| w.starts_with("rk-")),
        "runkeep issued {} first: {sc:?}",
        sc.aim
    );
}

/// What one randomized race produced.
#[derive(Debug, Default)]
struct Mixed {
    /// The highest fence issued.
    fences: u64,
    /// Fences issued by runkeep processes / by reference processes.
    runkeep_issued: u64,
    reference_issued: u64,
    /// Reference links that collided (`EEXIST`).
    reference_collisions: u64,
    /// Reference claims that paused before their link.
    reference_paused: u64,
    /// Fences issued twice.
    twice: u64,
    /// Of them, those whose name a reference claimer's own pruning emptied
    /// (the reference's window: no grace period there).
    twice_by_reference_prune: u64,
    /// The others: their name was emptied by runkeep's pruning.
    twice_by_runkeep_prune: Vec<u64>,
    /// Names in `claims/` at the end.
    names_left: usize,
    errors: Vec<String>,
    took: Duration,
}

fn fence_of_line(line: &str, kind: &str) -> Option<u64> {
    let mut w = line.split(' ').skip(1);
    (w.next() == Some(kind))
        .then(|| w.next()?.parse().ok())
        .flatten()
}

/// Two runkeep processes (grace `grace`) and two reference claimers (with
/// their holding window when `reference_prunes`) race one run until it
/// reaches `target` fences.
fn mixed_race(grace: Duration, reference_prunes: bool, target: u64) -> Mixed {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let trace = dir.path().join("trace");
    open(&base);
    let start = now_ms() + 1500;
    let started = Instant::now();
    let deadline_s = (60 + target / 20).to_string();
    let common = |holder: String| {
        vec![
            ("BASE", base.display().to_string()),
            ("HOLDER", holder),
            ("TARGET", target.to_string()),
            ("START_AT", start.to_string()),
            ("DEADLINE_S", deadline_s.clone()),
            ("RUNKEEP_FS_TEST_TRACE", trace.display().to_string()),
        ]
    };
    let mut workers = Vec::new();
    for i in 0..2 {
        let mut e = common(format!("rk-{i}"));
        e.push(("PRUNE_GRACE_MS", grace.as_millis().to_string()));
        e.push(("LAPSE_EVERY", "8".into()));
        workers.push((format!("rk-{i}"), spawn("runkeep", &e)));
        let mut e = common(format!("ref-{i}"));
        e.push(("MAX_PAUSE_MS", MAX_PAUSE_MS.to_string()));
        if !reference_prunes {
            e.push(("NO_REFERENCE_PRUNE", "1".into()));
        }
        workers.push((format!("ref-{i}"), spawn("ref-random", &e)));
    }
    let mut issued = Issued::new();
    let mut m = Mixed::default();
    for (who, w) in workers {
        let reports = w.finish(Duration::from_secs(600));
        m.errors
            .extend(errors(&reports).into_iter().map(|e| format!("{who}: {e}")));
        for r in &reports {
            if let Some(p) = r
                .strip_prefix("done wins=")
                .and_then(|r| r.split("paused=").nth(1))
            {
                m.reference_paused += p.parse::<u64>().unwrap_or(0);
            }
        }
        record(&mut issued, &who, &reports);
    }
    m.took = started.elapsed();
    let lines: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    m.reference_collisions = lines
        .iter()
        .filter(|l| fence_of_line(l, "ref-exists").is_some())
        .count() as u64;
    // A fence issued twice with the reference involved was issued a second
    // time by a reference link that landed on an emptied name (the
    // reference does not check after its link; runkeep does). Who emptied
    // it: a reference claimer did if it tried to unlink that name before
    // that link (its `ref-unlink` line comes first) and succeeded (it then
    // traced `ref-pruned` for it); else runkeep's pruning did.
    let mut ref_links: HashMap<u64, usize> = HashMap::new();
    let mut unlinks: HashMap<u64, Vec<(usize, &str)>> = HashMap::new();
    let mut pruned: HashMap<(&str, u64), Vec<usize>> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        let pid = l.split(' ').next().unwrap_or("");
        if let Some(f) = fence_of_line(l, "ref-linked").or_else(|| fence_of_line(l, "ref-tomb")) {
            ref_links.insert(f, i);
        }
        if let Some(f) = fence_of_line(l, "ref-unlink") {
            unlinks.entry(f).or_default().push((i, pid));
        }
        if let Some(f) = fence_of_line(l, "ref-pruned") {
            pruned.entry((pid, f)).or_default().push(i);
        }
    }
    let twice = issued_twice(&issued);
    m.twice = twice.len() as u64;
    for f in twice {
        let by_reference = ref_links.get(&f).is_some_and(|link| {
            unlinks.get(&f).is_some_and(|u| {
                u.iter().any(|(at, pid)| {
                    at < link
                        && pruned
                            .get(&(*pid, f))
                            .is_some_and(|p| p.iter().any(|done| done > at))
                })
            })
        });
        if by_reference {
            m.twice_by_reference_prune += 1;
        } else {
            m.twice_by_runkeep_prune.push(f);
        }
    }
    m.fences = issued.keys().max().copied().unwrap_or(0);
    for holders in issued.values() {
        for h in holders {
            if h.starts_with("rk-") {
                m.runkeep_issued += 1;
            } else {
                m.reference_issued += 1;
            }
        }
    }
    m.names_left = reference::fences(&base.join(RUN).join("claims")).len();
    eprintln!(
        "mixed race, grace {grace:?}, reference pruning {reference_prunes}, target {target}: {m:?}"
    );
    m
}

/// The size of the randomized race: `RUNKEEP_FS_MIXED_RACE_FENCES` (default
/// 2 000, a few seconds a race).
fn race_size() -> u64 {
    std::env::var("RUNKEEP_FS_MIXED_RACE_FENCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// Two runkeep and two reference processes on one run, the reference
/// claimers pausing up to 400 ms before half of their links: with the grace
/// period, no fence is issued twice because runkeep pruned its name; with
/// it off, some are (the meta-test, proving the race reaches the
/// interleaving). Doubles the reference's own pruning causes are reported,
/// not asserted: they are the reference's window, which runkeep cannot
/// close. A third race, with the grace period and reference claimers that
/// do not prune, checks that attribution: no fence at all is issued twice.
#[test]
fn runkeep_and_reference_claimers_racing_one_run() {
    let target = race_size();
    let grace = runkeep_fs::FsOptions::DEFAULT_PRUNE_GRACE;
    let with = mixed_race(grace, true, target);
    let without = mixed_race(Duration::ZERO, true, target);
    let only_runkeep_prunes = mixed_race(grace, false, target);
    for m in [&with, &without, &only_runkeep_prunes] {
        assert!(m.fences >= target, "{m:?}");
        assert!(m.errors.is_empty(), "{m:?}");
        assert!(
            m.reference_paused > 0 && m.reference_issued > 0,
            "the reference claimers took part: {m:?}"
        );
    }
    assert_eq!(
        with.twice_by_runkeep_prune,
        Vec::<u64>::new(),
        "with the grace period, runkeep's pruning let a reference link land on an issued fence: {with:?}"
    );
    assert_eq!(
        only_runkeep_prunes.twice, 0,
        "with the grace period and no reference pruning, a fence was issued twice: {only_runkeep_prunes:?}"
    );
    assert!(
        !without.twice_by_runkeep_prune.is_empty(),
        "without the grace period the race never issued a fence twice through runkeep's pruning, so it did not reach the interleaving: {without:?}"
    );
}

/// `claims/` of a store with the grace period stays bounded under a fast
/// claimer: names younger than the grace period are kept, and once they
/// are older the next claims work them down to the 33-name window (here a
/// 300 ms grace period, so the test need not wait 5 s).
#[test]
fn a_fast_claimer_keeps_one_grace_period_of_names_then_the_window() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let grace = Duration::from_millis(300);
    let store = open_with_grace(&base, grace);
    let rt = rt();
    let s = scope(RUN);
    let claims = base.join(RUN).join("claims");
    let churn = |n: usize| {
        for _ in 0..n {
            let Ok(ClaimOutcome::Acquired(l)) =
                rt.block_on(store.claim(&s, &opts("fast", 60_000, now_ms())))
            else {
                panic!("must win")
            };
            assert!(rt.block_on(store.release(&s, l.fence)).unwrap());
        }
    };
    let t0 = Instant::now();
    churn(100);
    let young = reference::fences(&claims).len();
    if t0.elapsed() < grace {
        // Every name of this burst is younger than the grace period.
        assert_eq!(young, 200, "nothing young is pruned");
    }
    std::thread::sleep(grace + Duration::from_millis(50));
    // Each prune stops after a few young names and removes at most 256 old
    // ones, so a couple of claims work 200 names down.
    churn(2);
    let left = reference::fences(&claims);
    assert!(
        left.len() <= 33 + 4,
        "the aged names were pruned down to the window (plus what the last claims made): {} names",
        left.len()
    );
    assert!(left.len() >= 33, "{left:?}");
}

/// A store that never asks for the grace period keeps the old behaviour
/// exactly: `Duration::ZERO` prunes by count alone, at once.
#[test]
fn a_zero_grace_period_prunes_by_count_alone() {
    let dir = tempdir();
    let base = dir.path().join("runs");
    let store = open_with_grace(&base, Duration::ZERO);
    let rt = rt();
    let s = scope(RUN);
    for _ in 0..50 {
        let Ok(ClaimOutcome::Acquired(l)) =
            rt.block_on(store.claim(&s, &opts("fast", 60_000, now_ms())))
        else {
            panic!("must win")
        };
        assert!(rt.block_on(store.release(&s, l.fence)).unwrap());
    }
    let left = reference::fences(&base.join(RUN).join("claims"));
    assert_eq!(left.len(), 33, "{left:?}");
    assert_eq!(left.iter().max(), Some(&100));
    // The default is not zero: it must be asked for.
    assert_eq!(
        runkeep_fs::FsOptions::default().prune_grace,
        runkeep_fs::FsOptions::DEFAULT_PRUNE_GRACE
    );
    assert!(!runkeep_fs::FsOptions::DEFAULT_PRUNE_GRACE.is_zero());
}
