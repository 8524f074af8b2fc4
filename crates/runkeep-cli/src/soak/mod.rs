//! `runkeep soak`: proves runkeep's guarantees on this machine while worker
//! processes die.
//!
//! It seeds R runs of S steps into a store (by default a fresh directory),
//! starts W worker processes (this binary, `soak-worker`), and drives them
//! with chaos: `kill -9` of random workers at random moments (restarted
//! shortly after), and SIGSTOP of a worker past its lease, then SIGCONT. Each
//! step appends an event, performs a simulated effect through a fence-checking
//! sink, and writes a fenced checkpoint; a run is done when its work item (a
//! park on its seed checkpoint) is answered. Then every worker is stopped and
//! [`audit`] checks the store, the sink and the workers' ack logs. Any
//! violation makes the command exit 1. A soak that merely runs out of time
//! (`--timeout`) with no violation exits 75: it proved nothing wrong, and it
//! did not finish proving anything either.
//!
//! Settings that cannot make progress are refused up front (exit 64): the
//! lease TTL must be at least [`MIN_TTL`] and at least [`TTL_PER_STEP`] times
//! `--step-time`. Workers renew every third of the TTL and give the lease up
//! within a tenth of it; a TTL near the time of a store round trip or of a
//! step loses every lease before the step commits, and the soak livelocks.
//!
//! On the memory store (one process), workers are threads with their own
//! runtime: a kill drops the runtime without releasing, a stall blocks the
//! thread at its next step.

pub mod audit;
pub mod sink;
pub mod worker;

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use rand::Rng;
use runkeep::{
    Checkpoint, CheckpointId, ListOptions, ListingScope, ParkState, PendingDecision, RunId,
    RunScope, RunStore, Timestamp, Ttl,
};
use serde::Serialize;
use serde_json::{json, Map};
use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::duration::{parse_duration, parse_ttl};
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json};
use crate::store::{open_store, StoreAddress};
use audit::Audit;
use worker::{WorkerConfig, SEED_CHECKPOINT, WORK_REQUEST};

/// `runkeep soak` options.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Runs to seed.
    #[arg(long, default_value_t = 64)]
    pub runs: u64,
    /// Steps per run.
    #[arg(long, default_value_t = 40)]
    pub steps: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Runs each worker steps at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Simulated work per step.
    #[arg(long, default_value = "80ms", value_parser = parse_duration)]
    pub step_time: Duration,
    /// Lease TTL of the workers.
    #[arg(long, default_value = "1500ms", value_parser = parse_ttl)]
    pub ttl: Ttl,
    /// Mean time between chaos actions (kill -9 or stall).
    #[arg(long, default_value = "800ms", value_parser = parse_duration)]
    pub chaos_every: Duration,
    /// No chaos at all (a baseline).
    #[arg(long)]
    pub no_chaos: bool,
    /// Give up (and report a violation) after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Where to create the fresh store and the soak's logs (default: a new
    /// temporary directory, removed afterwards unless --keep or a violation).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the soak directory.
    #[arg(long)]
    pub keep: bool,
    /// Run deliberately broken workers (ignore cancellation, write around
    /// the handle) to prove the audit catches them.
    #[arg(long, hide = true)]
    pub broken_workers: bool,
    /// Chaos stalls workers only (no kills); for tests of the stall path.
    #[arg(long, hide = true)]
    pub stall_only: bool,
}

/// `runkeep soak-worker` (internal): one worker process of a soak.
#[derive(Args, Debug, Clone)]
pub struct SoakWorkerArgs {
    /// The soak's directory.
    #[arg(long)]
    pub soak_dir: PathBuf,
    /// Steps per run.
    #[arg(long)]
    pub steps: u64,
    /// Lease TTL.
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Ttl,
    /// Work per step.
    #[arg(long, value_parser = parse_duration)]
    pub step_time: Duration,
    /// Runs stepped at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Label.
    #[arg(long)]
    pub label: String,
    /// Broken mode.
    #[arg(long)]
    pub broken: bool,
}

/// The soak's report.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// Store address.
    pub store: String,
    /// Runs seeded.
    pub runs: u64,
    /// Steps per run.
    pub steps: u64,
    /// Workers.
    pub workers: usize,
    /// Seconds from the first worker start to the last run done.
    pub elapsed_secs: f64,
    /// Step checkpoints committed per second.
    pub steps_per_sec: f64,
    /// `kill -9`s.
    pub kills: u64,
    /// SIGSTOP-past-the-lease stalls.
    pub stalls: u64,
    /// Workers restarted (after a kill, or after exiting on their own).
    pub restarts: u64,
    /// Workers that exited without being killed.
    pub unexpected_exits: u64,
    /// Whether every run finished before the timeout.
    pub finished_in_time: bool,
    /// When it did not: how many runs were left, and the timeout. Not a
    /// violation (see `audit.runs_incomplete` for the runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<String>,
    /// The audit.
    pub audit: Audit,
    /// The soak directory, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_dir: Option<String>,
}

impl SoakReport {
    /// True when every run finished in time and no invariant was violated.
    pub fn clean(&self) -> bool {
        self.audit.violations.is_empty() && self.finished_in_time
    }

    /// 0 clean; 1 a guarantee was violated (whether or not it also timed
    /// out); 75 it ran out of time with no violation.
    pub fn exit(&self) -> Exit {
        if !self.audit.violations.is_empty() {
            Exit::Failed
        } else if !self.finished_in_time {
            Exit::Incomplete
        } else {
            Exit::Ok
        }
    }
}

fn store_given_explicitly() -> bool {
    std::env::var_os("RUNKEEP_STORE").is_some()
        || std::env::args().any(|a| a == "--store" || a.starts_with("--store="))
}

/// The shortest lease TTL a soak accepts: a few store round trips (with
/// fsync, on a loaded machine) must fit in the tenth of it the worker keeps
/// as a safety margin and in the third between renewals.
pub const MIN_TTL: Duration = Duration::from_millis(200);

/// The TTL must be at least this many times `--step-time`.
pub const TTL_PER_STEP: u32 = 3;

/// Refuses settings under which workers cannot make progress.
fn check_progress(args: &SoakArgs) -> CliResult<()> {
    let ttl = args.ttl.as_duration();
    let floor = MIN_TTL.max(args.step_time.saturating_mul(TTL_PER_STEP));
    if ttl < floor {
        return Err(CliError::usage(format!(
            "--ttl {}ms cannot make progress with --step-time {}ms: a worker renews every third of its lease and gives it up a tenth before expiry, so every lease would lapse before a step commits (the soak would livelock and report nothing but a timeout)",
            ttl.as_millis(),
            args.step_time.as_millis()
        ))
        .hint(format!(
            "use --ttl of at least {}ms: the larger of {}ms and {TTL_PER_STEP} × --step-time",
            floor.as_millis(),
            MIN_TTL.as_millis()
        )));
    }
    Ok(())
}

/// `runkeep soak`.
pub async fn run(ctx: &Ctx, args: SoakArgs) -> CliResult<Exit> {
    if args.runs == 0 || args.steps == 0 || args.workers == 0 || args.concurrency == 0 {
        return Err(CliError::usage(
            "--runs, --steps, --workers and --concurrency must all be at least 1",
        ));
    }
    check_progress(&args)?;
    let (dir, _tmp) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| CliError::config(format!("cannot create {}: {e}", d.display())))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("runkeep-soak-")
                .tempdir()
                .map_err(|e| {
                    CliError::config(format!("cannot create a temporary directory: {e}"))
                })?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let address = if store_given_explicitly() {
        ctx.global.store.clone()
    } else {
        StoreAddress::Fs(dir.join("runs"))
    };
    let soak_dir = dir.join("soak");
    std::fs::create_dir_all(&soak_dir)
        .map_err(|e| CliError::config(format!("cannot create {}: {e}", soak_dir.display())))?;
    let opened = open_store(&address, &ctx.scope, ctx.global.durability, true)?;
    let store = opened.store.clone();
    let listing = ctx.scope.listing()?;
    let runs = seed(&store, ctx, args.runs).await?;

    let report = drive(
        ctx,
        &args,
        &address,
        store.clone(),
        listing,
        &runs,
        &soak_dir,
    )
    .await?;
    let mut report = report;
    let keep = args.keep || !report.clean() || args.dir.is_some();
    if keep {
        if let Some(t) = _tmp {
            let path = t.keep();
            report.kept_dir = Some(path.display().to_string());
        } else {
            report.kept_dir = Some(dir.display().to_string());
        }
    }
    let exit = report.exit();
    match print(ctx, &report) {
        // A reader that went away does not change the verdict.
        Err(e) if e.is_closed_pipe() => Ok(exit),
        Err(e) => Err(e),
        Ok(()) => Ok(exit),
    }
}

async fn seed(store: &Arc<dyn RunStore>, ctx: &Ctx, n: u64) -> CliResult<Vec<RunScope>> {
    let now = Timestamp::now();
    let mut runs = Vec::new();
    for i in 0..n {
        let run_id = RunId::new(format!("run_soak{i:04}_{}", runkeep::id::random_suffix(6)))?;
        let scope = ctx.scope.run(&run_id, None)?;
        let mut state = Map::new();
        state.insert("step".into(), json!(0));
        let cp = Checkpoint::new(CheckpointId::new(SEED_CHECKPOINT)?, now, state)
            .with_run_created_at(now.offset(i as i64))
            .with_pending(PendingDecision::new(WORK_REQUEST, Map::new(), now));
        store
            .write_checkpoint(&scope, &cp, None)
            .await
            .map_err(CliError::from)?;
        runs.push(scope);
    }
    Ok(runs)
}

/// A worker: a process, or (memory store) a thread with its own runtime.
enum Slot {
    Process {
        child: Child,
    },
    Thread {
        kill: Option<tokio::sync::oneshot::Sender<()>>,
        stop: CancellationToken,
        stall: Arc<Mutex<Option<Duration>>>,
        join: Option<std::thread::JoinHandle<()>>,
    },
}

struct Workers<'a> {
    args: &'a SoakArgs,
    address: &'a StoreAddress,
    ctx: &'a Ctx,
    store: Arc<dyn RunStore>,
    listing: ListingScope,
    soak_dir: &'a Path,
    next_label: usize,
    slots: Vec<(String, Slot, Option<Instant>)>,
}

impl Workers<'_> {
    fn spawn(&mut self) -> CliResult<()> {
        let label = format!("w{}", self.next_label);
        self.next_label += 1;
        let slot = if matches!(self.address, StoreAddress::Memory) {
            let stall = Arc::new(Mutex::new(None));
            let stop = CancellationToken::new();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let cfg = self.config(&label, Some(stall.clone()));
            let (store, listing, stop2) = (self.store.clone(), self.listing.clone(), stop.clone());
            let join = std::thread::Builder::new()
                .name(format!("soak-{label}"))
                .spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async move {
                        tokio::select! {
                            _ = worker::work(store, listing, cfg, stop2) => {}
                            _ = rx => {}
                        }
                    });
                    // Dropping the runtime here abandons every task: no
                    // release, like a killed process.
                })
                .map_err(|e| CliError::internal(format!("cannot start a worker thread: {e}")))?;
            Slot::Thread {
                kill: Some(tx),
                stop,
                stall,
                join: Some(join),
            }
        } else {
            let exe = std::env::current_exe()
                .map_err(|e| CliError::internal(format!("cannot find this binary: {e}")))?;
            let g = &self.ctx.global;
            let mut cmd = Process::new(exe);
            cmd.arg("--store")
                .arg(self.address.to_string())
                .args([
                    "--tenant",
                    &g.tenant,
                    "--project",
                    &g.project,
                    "--session",
                    &g.session,
                ])
                .arg("--durability")
                .arg(match g.durability {
                    crate::store::DurabilityArg::ProcessCrash => "process-crash",
                    crate::store::DurabilityArg::PowerLoss => "power-loss",
                })
                .arg("soak-worker")
                .arg("--soak-dir")
                .arg(self.soak_dir)
                .args(["--steps", &self.args.steps.to_string()])
                .args(["--ttl", &format!("{}ms", self.args.ttl.as_millis())])
                .args([
                    "--step-time",
                    &format!("{}ms", self.args.step_time.as_millis()),
                ])
                .args(["--concurrency", &self.args.concurrency.to_string()])
                .args(["--label", &label])
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            if self.args.broken_workers {
                cmd.arg("--broken");
            }
            let log = std::fs::File::create(self.soak_dir.join(format!("{label}.stderr")))
                .map_err(|e| CliError::config(format!("cannot create a worker log: {e}")))?;
            cmd.stderr(log);
            let child = cmd
                .spawn()
                .map_err(|e| CliError::internal(format!("cannot start a worker process: {e}")))?;
            Slot::Process { child }
        };
        self.slots.push((label, slot, None));
        Ok(())
    }

    fn config(&self, label: &str, stall: Option<Arc<Mutex<Option<Duration>>>>) -> WorkerConfig {
        WorkerConfig {
            soak_dir: self.soak_dir.to_path_buf(),
            steps: self.args.steps,
            ttl: self.args.ttl,
            step_time: self.args.step_time,
            concurrency: self.args.concurrency,
            label: label.to_string(),
            broken: self.args.broken_workers,
            stall,
        }
    }

    /// Kills slot `i` without letting it release anything.
    fn kill(&mut self, i: usize) {
        let (_, slot, _) = self.slots.remove(i);
        match slot {
            Slot::Process { mut child } => {
                let _ = signal(&child, rustix::process::Signal::Cont);
                let _ = child.kill();
                let _ = child.wait();
            }
            Slot::Thread {
                mut kill, mut join, ..
            } => {
                if let Some(k) = kill.take() {
                    let _ = k.send(());
                }
                if let Some(j) = join.take() {
                    let _ = j.join();
                }
            }
        }
    }

    /// Stops slot `i` for `d` (longer than the lease).
    fn stall(&mut self, i: usize, d: Duration) {
        let (_, slot, until) = &mut self.slots[i];
        match slot {
            Slot::Process { child } => {
                let _ = signal(child, rustix::process::Signal::Stop);
                *until = Some(Instant::now() + d);
            }
            Slot::Thread { stall, .. } => {
                if let Ok(mut g) = stall.lock() {
                    *g = Some(d);
                }
            }
        }
    }

    fn resume_due(&mut self, all: bool) {
        for (_, slot, until) in &mut self.slots {
            if let (Slot::Process { child }, Some(t)) = (&*slot, *until) {
                if all || Instant::now() >= t {
                    let _ = signal(child, rustix::process::Signal::Cont);
                    *until = None;
                }
            }
        }
    }

    /// Reaps workers that exited on their own; answers how many.
    fn reap(&mut self) -> u64 {
        let mut gone = 0;
        let mut i = 0;
        while i < self.slots.len() {
            let exited = match &mut self.slots[i].1 {
                Slot::Process { child } => matches!(child.try_wait(), Ok(Some(_))),
                Slot::Thread { join, .. } => join.as_ref().is_some_and(|j| j.is_finished()),
            };
            if exited {
                self.slots.remove(i);
                gone += 1;
            } else {
                i += 1;
            }
        }
        gone
    }

    /// Asks every worker to stop (SIGTERM / cancel), waits a little, kills
    /// what is left.
    async fn shutdown(&mut self) {
        self.resume_due(true);
        for (_, slot, _) in &self.slots {
            match slot {
                Slot::Process { child } => {
                    let _ = signal(child, rustix::process::Signal::Term);
                }
                Slot::Thread { stop, .. } => stop.cancel(),
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !self.slots.is_empty() {
            self.reap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while !self.slots.is_empty() {
            self.kill(0);
        }
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) -> std::io::Result<()> {
    let pid = rustix::process::Pid::from_raw(child.id() as i32)
        .ok_or_else(|| std::io::Error::other("bad pid"))?;
    rustix::process::kill_process(pid, sig).map_err(std::io::Error::from)
}

async fn remaining(store: &Arc<dyn RunStore>, listing: &ListingScope) -> Option<u64> {
    let mut n = 0;
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(
                listing,
                &ListOptions {
                    park: Some(vec![ParkState::Outstanding]),
                    limit: Some(1000),
                    cursor: cursor.clone(),
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        n += page
            .entries
            .iter()
            .filter(|r| r.scope.run_id.as_str().starts_with("run_soak"))
            .count() as u64;
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => return Some(n),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    ctx: &Ctx,
    args: &SoakArgs,
    address: &StoreAddress,
    store: Arc<dyn RunStore>,
    listing: ListingScope,
    runs: &[RunScope],
    soak_dir: &Path,
) -> CliResult<SoakReport> {
    let mut workers = Workers {
        args,
        address,
        ctx,
        store: store.clone(),
        listing: listing.clone(),
        soak_dir,
        next_label: 0,
        slots: Vec::new(),
    };
    let bar = if ctx.json() || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(runs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} soak {bar:30} {pos}/{len} runs done  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let started = Instant::now();
    for _ in 0..args.workers {
        workers.spawn()?;
    }
    let (mut kills, mut stalls, mut restarts, mut unexpected) = (0u64, 0u64, 0u64, 0u64);
    let mut next_chaos = started + jitter(args.chaos_every);
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let mut pending_restarts: Vec<Instant> = Vec::new();
    let mut finished_in_time = false;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = Instant::now();
        workers.resume_due(false);
        let exited = workers.reap();
        if exited > 0 {
            unexpected += exited;
            for _ in 0..exited {
                pending_restarts.push(now);
            }
        }
        while let Some(pos) = pending_restarts.iter().position(|t| *t <= now) {
            pending_restarts.remove(pos);
            workers.spawn()?;
            restarts += 1;
        }
        if now - last_poll >= Duration::from_millis(250) {
            last_poll = now;
            if let Some(left) = remaining(&store, &listing).await {
                bar.set_position(runs.len() as u64 - left.min(runs.len() as u64));
                bar.set_message(format!(
                    "kills {kills}  stalls {stalls}  restarts {restarts}"
                ));
                if left == 0 {
                    finished_in_time = true;
                    break;
                }
            }
        }
        if now - started > args.timeout {
            break;
        }
        if !args.no_chaos && now >= next_chaos && !workers.slots.is_empty() {
            next_chaos = now + jitter(args.chaos_every);
            let running: Vec<usize> = (0..workers.slots.len())
                .filter(|&i| workers.slots[i].2.is_none())
                .collect();
            if running.len() >= 2 || (running.len() == 1 && workers.slots.len() > 1) {
                let pick = running[rand::thread_rng().gen_range(0..running.len())];
                if !args.stall_only && rand::thread_rng().gen_bool(0.5) {
                    workers.kill(pick);
                    kills += 1;
                    pending_restarts
                        .push(now + Duration::from_millis(rand::thread_rng().gen_range(50..400)));
                } else {
                    let ttl = args.ttl.as_duration();
                    let d = ttl + ttl.mul_f64(rand::thread_rng().gen_range(0.3..1.0));
                    workers.stall(pick, d);
                    stalls += 1;
                }
            }
        }
    }
    let elapsed = started.elapsed();
    workers.shutdown().await;
    bar.finish_and_clear();
    let audit = audit::audit(store.as_ref(), runs, args.steps, soak_dir).await;
    let timed_out = (!finished_in_time).then(|| {
        format!(
            "{} of {} runs did not finish within --timeout {}",
            audit.runs_incomplete.len(),
            runs.len(),
            if args.timeout.subsec_millis() == 0 {
                crate::output::human_duration(args.timeout)
            } else {
                format!("{}ms", args.timeout.as_millis())
            }
        )
    });
    let committed = audit.checkpoints.saturating_sub(runs.len() as u64);
    Ok(SoakReport {
        store: address.to_string(),
        runs: runs.len() as u64,
        steps: args.steps,
        workers: args.workers,
        elapsed_secs: elapsed.as_secs_f64(),
        steps_per_sec: committed as f64 / elapsed.as_secs_f64().max(1e-9),
        kills,
        stalls,
        restarts,
        unexpected_exits: unexpected,
        finished_in_time,
        timed_out,
        audit,
        kept_dir: None,
    })
}

fn jitter(mean: Duration) -> Duration {
    mean.mul_f64(rand::thread_rng().gen_range(0.5..1.5))
}

fn print(ctx: &Ctx, r: &SoakReport) -> CliResult<()> {
    use std::fmt::Write as _;
    let mut out = String::new();
    // `println!` would panic on a closed stdout; everything goes through
    // one `emit`, which reports a closed pipe as such.
    macro_rules! println {
        () => { out.push('\n') };
        ($($t:tt)*) => {{ let _ = writeln!(out, $($t)*); }};
    }
    if ctx.json() {
        return emit_json(r);
    }
    let a = &r.audit;
    let verdict = match (a.violations.is_empty(), r.finished_in_time) {
        (true, true) => "PASS: every invariant held".to_string(),
        (false, _) => "FAIL: invariants violated".to_string(),
        (true, false) => format!(
            "INCOMPLETE: did not finish in time ({}); no invariant was violated in what ran",
            r.timed_out.as_deref().unwrap_or("timed out")
        ),
    };
    println!("runkeep soak — {verdict}");
    println!();
    let rows: Vec<(&str, String)> = vec![
        ("store", r.store.clone()),
        (
            "runs × steps",
            format!("{} × {} by {} workers", r.runs, r.steps, r.workers),
        ),
        (
            "elapsed",
            format!("{:.1}s ({:.0} steps/s)", r.elapsed_secs, r.steps_per_sec),
        ),
        (
            "chaos",
            format!(
                "{} kill -9, {} stalls past the lease, {} restarts, {} unexpected exits",
                r.kills, r.stalls, r.restarts, r.unexpected_exits
            ),
        ),
        (
            "runs completed",
            format!(
                "{} / {} (checkpoint chain one line, work item answered)",
                a.runs_completed, r.runs
            ),
        ),
        (
            "read back",
            format!(
                "{} checkpoints, {} events, {} acknowledged writes checked",
                a.checkpoints, a.events, a.acks_checked
            ),
        ),
        (
            "zombies stopped",
            format!(
                "{} fenced-out refusals at the store, {} effects refused at the sink",
                a.fenced_out_refusals, a.effects_refused
            ),
        ),
        (
            "effects",
            format!(
                "{} accepted, {} from a superseded fence",
                a.effects_accepted, a.effects_from_superseded_fence
            ),
        ),
        (
            "at-least-once",
            format!(
                "{} steps re-executed after a crash between effect and record",
                a.effects_reexecuted.len()
            ),
        ),
        (
            "fences",
            format!(
                "{} holdings observed, {} issued twice",
                a.fences_observed, a.fences_issued_twice
            ),
        ),
        (
            "torn log lines",
            format!(
                "{} (writes of killed processes that never returned)",
                a.torn_log_lines
            ),
        ),
        (
            "finished",
            match &r.timed_out {
                None => "every run, within --timeout".to_string(),
                Some(t) => format!("no: {t} (a timeout, not a violation)"),
            },
        ),
        ("violations", a.violations.len().to_string()),
    ];
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("  {k:<width$}  {v}");
    }
    if !a.effects_reexecuted.is_empty() {
        println!();
        println!("re-executed effects (the at-least-once window, not a fencing failure):");
        for e in a.effects_reexecuted.iter().take(20) {
            println!(
                "  {} step {}: {} times under fences {:?}",
                e.run, e.step, e.times, e.fences
            );
        }
    }
    if !a.violations.is_empty() {
        println!();
        println!("violations:");
        for v in a.violations.iter().take(50) {
            println!("  ✗ {v}");
        }
        if a.violations.len() > 50 {
            println!("  … and {} more", a.violations.len() - 50);
        }
    }
    if !a.runs_incomplete.is_empty() {
        println!();
        println!("did not finish in time (not violations):");
        for v in a.runs_incomplete.iter().take(10) {
            println!("  … {v}");
        }
        if a.runs_incomplete.len() > 10 {
            println!("  … and {} more", a.runs_incomplete.len() - 10);
        }
        println!("  → give it a longer --timeout, fewer --runs or --steps, or more --workers");
    }
    if let Some(d) = &r.kept_dir {
        println!();
        println!("soak directory kept at {d}");
    }
    emit(&out)
}

/// `runkeep soak-worker`.
pub async fn run_worker(ctx: &Ctx, args: SoakWorkerArgs) -> CliResult<Exit> {
    let opened = open_store(&ctx.global.store, &ctx.scope, ctx.global.durability, false)?;
    let listing = ctx.scope.listing()?;
    let shutdown = CancellationToken::new();
    runkeep_worker::cancel_on_signal(shutdown.clone());
    let cfg = WorkerConfig {
        soak_dir: args.soak_dir,
        steps: args.steps,
        ttl: args.ttl,
        step_time: args.step_time,
        concurrency: args.concurrency,
        label: args.label,
        broken: args.broken,
        stall: None,
    };
    let report = worker::work(opened.store, listing, cfg, shutdown)
        .await
        .map_err(CliError::failed)?;
    crate::output::note(&format!("{report:?}"));
    Ok(Exit::Ok)
}
