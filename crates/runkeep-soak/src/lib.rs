//! runkeep's soak engine: proves runkeep's guarantees on a machine while
//! worker processes die. The operator command is `runkeep soak` (the CLI
//! opens the store and starts this engine); this crate is the engine, the
//! correct worker ([`worker`]), the fence-checking effect sink ([`sink`])
//! and the [`audit`].
//!
//! It enqueues R runs of S steps (contract v2: `enqueue`, no park used as a
//! work item), starts W workers, and drives them with chaos: `kill -9` of
//! random workers at random moments (restarted shortly after), and SIGSTOP
//! of a worker past its lease, then SIGCONT. Workers drain through
//! `claim_next`; each step performs a simulated effect through a
//! fence-checking sink and commits its event and checkpoint as one atomic
//! step; the last step's commit also finishes the run. `--poison N` adds N
//! runs whose step crashes the worker every time: the store must
//! dead-letter each after its attempt limit (`--max-attempts`) while every
//! other run completes. Then every worker is stopped and [`audit`] checks
//! the store, the sink and the workers' ack logs.
//!
//! Settings that cannot make progress are refused up front
//! ([`check_progress`]): the lease TTL must be at least [`MIN_TTL`] and at
//! least [`TTL_PER_STEP`] times the step time.
//!
//! Workers are processes ([`Launcher::Processes`]: the CLI re-executes its
//! own binary as `runkeep soak-worker`) or, for a store only one process can
//! see (memory), threads with their own runtime ([`Launcher::Threads`]): a
//! kill drops the runtime without releasing, a stall blocks the thread at
//! its next step.

pub mod audit;
pub mod failover;
pub mod pg;
pub mod server;
pub mod sink;
pub mod worker;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use runkeep::{
    Checkpoint, CheckpointId, EnqueueOptions, ListOptions, ListingScope, RunId, RunScope,
    RunStatus, RunStore, Timestamp, Ttl,
};
use serde::Serialize;
use serde_json::{json, Map};
use tokio_util::sync::CancellationToken;

use audit::{Audit, Expect};
use worker::{WorkFn, WorkerConfig, POISON_KEY, RAISE_KEY, SEED_CHECKPOINT};

/// The shortest lease TTL a soak accepts: a few store round trips (with
/// fsync, on a loaded machine) must fit in the tenth of it the worker keeps
/// as a safety margin and in the third between renewals.
pub const MIN_TTL: Duration = Duration::from_millis(200);

/// The TTL must be at least this many times the step time.
pub const TTL_PER_STEP: u32 = 3;

/// The retry policy of every soak run: a failed attempt (a raising poison
/// run, a step whose store did not answer) is retried soon, so the soak's
/// runs finish within its time.
pub const SOAK_RETRY: runkeep::RetryPolicy = runkeep::RetryPolicy {
    base_ms: 50,
    factor: 2.0,
    cap_ms: 1_000,
};

/// The attempt limit poison runs are enqueued with, by default.
pub const DEFAULT_POISON_MAX_ATTEMPTS: u32 = 3;

/// What a soak does.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// Runs to enqueue (besides the poison runs).
    pub runs: u64,
    /// Steps per run.
    pub steps: u64,
    /// Workers.
    pub workers: usize,
    /// Runs each worker steps at once.
    pub concurrency: usize,
    /// Simulated work per step.
    pub step_time: Duration,
    /// Lease TTL of the workers.
    pub ttl: Ttl,
    /// Mean time between chaos actions.
    pub chaos_every: Duration,
    /// No chaos at all (a baseline).
    pub no_chaos: bool,
    /// Chaos stalls workers only (no kills).
    pub stall_only: bool,
    /// Stop (a timeout, not a violation) after this long.
    pub timeout: Duration,
    /// Poison runs: their step crashes the worker every time.
    pub poison: u64,
    /// Raising poison runs: their step raises (returns an error) every
    /// time; the worker reports each attempt failed.
    pub poison_raise: u64,
    /// The attempt limit the poison runs are enqueued with.
    pub max_attempts: u32,
}

impl Default for SoakOptions {
    fn default() -> Self {
        Self {
            runs: 64,
            steps: 40,
            workers: 4,
            concurrency: 2,
            step_time: Duration::from_millis(80),
            ttl: Ttl::from_millis(1500).unwrap_or_else(|_| unreachable!("1500 ms is a valid TTL")),
            chaos_every: Duration::from_millis(800),
            no_chaos: false,
            stall_only: false,
            timeout: Duration::from_secs(300),
            poison: 0,
            poison_raise: 0,
            max_attempts: DEFAULT_POISON_MAX_ATTEMPTS,
        }
    }
}

/// Settings refused before anything starts: what is wrong, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What is wrong.
    pub message: String,
    /// What to do instead.
    pub hint: Option<String>,
}

/// Refuses settings under which workers cannot make progress.
pub fn check_progress(o: &SoakOptions) -> Result<(), Refusal> {
    if o.runs == 0 || o.steps == 0 || o.workers == 0 || o.concurrency == 0 {
        return Err(Refusal {
            message: "--runs, --steps, --workers and --concurrency must all be at least 1".into(),
            hint: None,
        });
    }
    if o.max_attempts < 1 && o.poison_raise > 0 {
        return Err(Refusal {
            message: "--max-attempts 0 would never let a run be attempted".into(),
            hint: Some(format!("the default is {DEFAULT_POISON_MAX_ATTEMPTS}")),
        });
    }
    if o.max_attempts < 2 && o.poison > 0 {
        return Err(Refusal {
            message: format!(
                "--max-attempts {} leaves a poison run nothing to prove: it must be at least 2 (one crash, then the takeover that dead-letters it)",
                o.max_attempts
            ),
            hint: Some(format!("the default is {DEFAULT_POISON_MAX_ATTEMPTS}")),
        });
    }
    let ttl = o.ttl.as_duration();
    let floor = MIN_TTL.max(o.step_time.saturating_mul(TTL_PER_STEP));
    if ttl < floor {
        return Err(Refusal {
            message: format!(
                "--ttl {}ms cannot make progress with --step-time {}ms: a worker renews every third of its lease and gives it up a tenth before expiry, so every lease would lapse before a step commits (the soak would livelock and report nothing but a timeout)",
                ttl.as_millis(),
                o.step_time.as_millis()
            ),
            hint: Some(format!(
                "use --ttl of at least {}ms: the larger of {}ms and {TTL_PER_STEP} × --step-time",
                floor.as_millis(),
                MIN_TTL.as_millis()
            )),
        });
    }
    Ok(())
}

/// How workers start.
#[derive(Clone)]
pub enum Launcher {
    /// Worker processes: the command line of one, given its configuration
    /// (stdin, stdout and stderr are set by the engine).
    Processes(Arc<dyn Fn(&WorkerConfig) -> Command + Send + Sync>),
    /// Threads with their own runtime running `work` (a store only this
    /// process can see).
    Threads(WorkFn),
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Launcher::Processes(_) => "Launcher::Processes",
            Launcher::Threads(_) => "Launcher::Threads",
        })
    }
}

/// Chaos only a backend can add to the soak's own (kill -9 and SIGSTOP of
/// workers): on PostgreSQL, terminated server connections and partitions.
/// The engine calls [`BackendChaos::strike`] at random chaos moments and
/// counts what each strike answers by its label.
pub trait BackendChaos: Send + Sync {
    /// One action, now (a strike that starts something lasting, such as a
    /// partition, returns once it started). Answers the label to count it
    /// under ("backends terminated"), `None` when there was nothing to hit,
    /// or an error the report lists (not a violation: the chaos failed,
    /// not a guarantee).
    fn strike(&self) -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + '_>>;

    /// Ends every lasting action (heals a partition) before the audit.
    fn heal(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// `None` (the default): struck at a third of the chaos moments, in
    /// place of a worker's kill or stall. `Some(mean)`: struck on a
    /// schedule of its own, every `mean` (jittered ×0.5–1.5), besides the
    /// workers' chaos (the HTTP soak's server restarts: a restart costs
    /// every worker at once, so it is paced apart).
    fn every(&self) -> Option<Duration> {
        None
    }
}

/// Where a soak runs.
#[derive(Clone)]
pub struct Target {
    /// The store (fresh: the soak enqueues its runs there).
    pub store: Arc<dyn RunStore>,
    /// The store's address, for the report.
    pub address: String,
    /// The session scope the runs are enqueued in.
    pub session: ListingScope,
    /// The soak's own directory (effect logs, ack logs, worker logs).
    pub soak_dir: PathBuf,
    /// The backend's own chaos, struck alongside the workers' (`None`: the
    /// workers' chaos only).
    pub backend_chaos: Option<Arc<dyn BackendChaos>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("address", &self.address)
            .field("session", &self.session)
            .field("soak_dir", &self.soak_dir)
            .field("backend_chaos", &self.backend_chaos.is_some())
            .finish_non_exhaustive()
    }
}

/// The soak's report.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// Store address.
    pub store: String,
    /// Runs enqueued (besides the poison runs).
    pub runs: u64,
    /// Poison runs enqueued (both kinds).
    pub poison: u64,
    /// Of those, raising poison runs (`--poison-raise`).
    pub poison_raise: u64,
    /// Their attempt limit.
    pub max_attempts: u32,
    /// Steps per run.
    pub steps: u64,
    /// Workers.
    pub workers: usize,
    /// Seconds from the first worker start to the last run finished.
    pub elapsed_secs: f64,
    /// Step checkpoints committed per second.
    pub steps_per_sec: f64,
    /// `kill -9`s.
    pub kills: u64,
    /// SIGSTOP-past-the-lease stalls.
    pub stalls: u64,
    /// Workers restarted (after a kill, or after exiting on their own).
    pub restarts: u64,
    /// Workers that exited without being killed by the soak (poison runs
    /// crash theirs).
    pub unexpected_exits: u64,
    /// The backend's chaos, by label (e.g. "backends terminated").
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub backend_chaos: BTreeMap<String, u64>,
    /// Backend chaos that failed to strike (not a violation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backend_chaos_errors: Vec<String>,
    /// Over HTTP: how often the server was killed (`kill -9`) and started
    /// again on the same port and backing store (set by the caller that
    /// runs the server; `None` when the workers reach the store directly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_restarts: Option<u64>,
    /// Over HTTP: step commits whose answer was lost (outcome unknown) and
    /// how the worker runtime resolved them, from the workers' logs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_backs: Option<ReadBacks>,
    /// With `--chaos failover`: what the failover did (`None` otherwise;
    /// set by the caller that holds the chaos).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<failover::FailoverRecord>,
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

/// Step commits whose answer was lost, as the workers' runtime logged
/// them (`runkeep_worker`'s `commit_step`: the attempt fenced off by a
/// renewal, then read back by its step id). A count from the logs, not an
/// invariant: the audit proves no step was stored twice or lost.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ReadBacks {
    /// Commits answered outcome unknown.
    pub outcome_unknown: u64,
    /// Of those, read back as stored (answered from the store, not
    /// repeated).
    pub landed: u64,
    /// Of those, read back as not stored (repeated).
    pub not_landed: u64,
}

/// Marks of [`ReadBacks`]: the runtime's own messages, in a worker's log
/// (`RUNKEEP_LOG` at `runkeep_worker=info`) for the first two, in the
/// error of a refused step (the ack log) for the third.
pub const READ_BACK_MARKS: [&str; 3] = [
    "step commit outcome unknown; fencing the attempt off and reading back",
    "the step had landed; not repeated",
    "the read-back shows the step was not stored: repeat it",
];

impl ReadBacks {
    /// Tallies the marks in the worker logs (`w*.stderr`) and the ack logs
    /// (`acks/`) of `soak_dir`.
    pub fn from_worker_logs(soak_dir: &Path) -> Self {
        let mut r = ReadBacks::default();
        let count = |dir: &Path, keep: &dyn Fn(&str) -> bool, mark: &str| -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            entries
                .flatten()
                .filter(|e| keep(&e.file_name().to_string_lossy()))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .map(|text| text.lines().filter(|l| l.contains(mark)).count() as u64)
                .sum()
        };
        let worker_log = |n: &str| n.starts_with('w') && n.ends_with(".stderr");
        r.outcome_unknown = count(soak_dir, &worker_log, READ_BACK_MARKS[0]);
        r.landed = count(soak_dir, &worker_log, READ_BACK_MARKS[1]);
        r.not_landed = count(&soak_dir.join("acks"), &|_| true, READ_BACK_MARKS[2]);
        r
    }
}

/// The soak's verdict.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Every run finished in time and no invariant was violated.
    Pass,
    /// A guarantee was violated (whether or not it also timed out).
    Fail,
    /// It ran out of time with no violation.
    Incomplete,
}

impl SoakReport {
    /// The verdict.
    pub fn verdict(&self) -> Verdict {
        if !self.audit.violations.is_empty() {
            Verdict::Fail
        } else if !self.finished_in_time {
            Verdict::Incomplete
        } else {
            Verdict::Pass
        }
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        render(self)
    }
}

/// Enqueues the soak's runs: `runs` ordinary ones, then `poison` poison ones
/// (with their own attempt limit). Returns (all runs, the poison ones).
pub async fn seed(
    store: &dyn RunStore,
    session: &ListingScope,
    o: &SoakOptions,
) -> runkeep::Result<(Vec<RunScope>, HashSet<RunScope>)> {
    let now = Timestamp::now();
    let mut runs = Vec::new();
    let mut poison = HashSet::new();
    for i in 0..o.runs + o.poison + o.poison_raise {
        let is_raising = i >= o.runs + o.poison;
        let is_poison = i >= o.runs;
        let run_id = RunId::new(format!(
            "run_soak{}{i:04}_{}",
            match (is_poison, is_raising) {
                (_, true) => "raise",
                (true, false) => "poison",
                _ => "",
            },
            runkeep::id::random_suffix(6)
        ))?;
        let scope = session_run(session, run_id)?;
        let mut state = Map::new();
        state.insert("step".into(), json!(0));
        if is_raising {
            state.insert(RAISE_KEY.into(), json!(true));
        } else if is_poison {
            state.insert(POISON_KEY.into(), json!(true));
        }
        let cp = Checkpoint::new(CheckpointId::new(SEED_CHECKPOINT)?, now, state)
            .with_run_created_at(now.offset(i as i64));
        let options = EnqueueOptions {
            max_attempts: is_poison.then_some(o.max_attempts),
            retry: Some(SOAK_RETRY),
            ..EnqueueOptions::default()
        };
        store.enqueue(&scope, &cp, &options).await?;
        if is_poison {
            poison.insert(scope.clone());
        }
        runs.push(scope);
    }
    Ok((runs, poison))
}

fn session_run(session: &ListingScope, run_id: RunId) -> runkeep::Result<RunScope> {
    match (session.project_id(), session.session_id()) {
        (Some(project), Some(id)) => Ok(RunScope::new(
            session.tenant_id().clone(),
            project.clone(),
            id.clone(),
            run_id,
        )),
        _ => Err(runkeep::Error::invalid(format!(
            "a soak enqueues its runs in one session; {session:?} is wider (set a project and a session)"
        ))),
    }
}

/// A worker: a process, or a thread with its own runtime.
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
    options: &'a SoakOptions,
    target: &'a Target,
    launcher: &'a Launcher,
    next_label: usize,
    slots: Vec<(String, Slot, Option<Instant>)>,
}

impl Workers<'_> {
    fn config(&self, label: &str) -> WorkerConfig {
        WorkerConfig {
            soak_dir: self.target.soak_dir.clone(),
            steps: self.options.steps,
            ttl: self.options.ttl,
            step_time: self.options.step_time,
            concurrency: self.options.concurrency,
            label: label.to_string(),
            stall: None,
            crash: None,
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let label = worker::label(self.next_label);
        self.next_label += 1;
        let mut cfg = self.config(&label);
        let slot = match self.launcher {
            Launcher::Threads(work) => {
                let stall = Arc::new(Mutex::new(None));
                let stop = CancellationToken::new();
                let crash = CancellationToken::new();
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                cfg.stall = Some(stall.clone());
                cfg.crash = Some(crash.clone());
                let (store, session, stop2) = (
                    self.target.store.clone(),
                    self.target.session.clone(),
                    stop.clone(),
                );
                let work = work.clone();
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
                                _ = work(store, session, cfg, stop2) => {}
                                _ = rx => {}
                                _ = crash.cancelled() => {}
                            }
                        });
                        // Dropping the runtime here abandons every task: no
                        // release, like a killed process.
                    })
                    .map_err(|e| format!("cannot start a worker thread: {e}"))?;
                Slot::Thread {
                    kill: Some(tx),
                    stop,
                    stall,
                    join: Some(join),
                }
            }
            Launcher::Processes(command) => {
                let mut cmd = command(&cfg);
                cmd.stdin(Stdio::null()).stdout(Stdio::null());
                let log =
                    std::fs::File::create(self.target.soak_dir.join(format!("{label}.stderr")))
                        .map_err(|e| format!("cannot create a worker log: {e}"))?;
                cmd.stderr(log);
                let child = cmd
                    .spawn()
                    .map_err(|e| format!("cannot start a worker process: {e}"))?;
                Slot::Process { child }
            }
        };
        self.slots.push((label, slot, None));
        Ok(())
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

/// Soak runs still active (neither finished nor dead-lettered).
async fn remaining(store: &dyn RunStore, listing: &ListingScope) -> Option<u64> {
    let mut n = 0;
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(
                listing,
                &ListOptions {
                    status: Some(vec![RunStatus::Active]),
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

/// Progress as the soak goes: (runs done, runs in all, a status line).
pub type Progress<'a> = &'a (dyn Fn(u64, u64, &str) + Sync);

/// Runs a soak over `runs` (already enqueued, see [`seed`]; `poison` among
/// them) and audits it. Errors are the engine's own (a worker that cannot
/// be started); violations are in the report.
pub async fn drive(
    options: &SoakOptions,
    target: &Target,
    launcher: &Launcher,
    runs: &[RunScope],
    poison: &HashSet<RunScope>,
    progress: Progress<'_>,
) -> Result<SoakReport, String> {
    let mut workers = Workers {
        options,
        target,
        launcher,
        next_label: 0,
        slots: Vec::new(),
    };
    let started = Instant::now();
    for _ in 0..options.workers {
        workers.spawn()?;
    }
    let (mut kills, mut stalls, mut restarts, mut unexpected) = (0u64, 0u64, 0u64, 0u64);
    let mut next_chaos = started + jitter(options.chaos_every);
    let paced = target
        .backend_chaos
        .as_ref()
        .and_then(|c| c.every().map(|every| (c.clone(), every)))
        .filter(|_| !options.no_chaos && !options.stall_only);
    let mut next_paced = paced.as_ref().map(|(_, every)| started + jitter(*every));
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let mut pending_restarts: Vec<Instant> = Vec::new();
    let mut finished_in_time = false;
    let mut backend_counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut backend_errors: Vec<String> = Vec::new();
    let total = runs.len() as u64;
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
            if let Some(left) = remaining(target.store.as_ref(), &target.session).await {
                progress(
                    total - left.min(total),
                    total,
                    &format!("kills {kills}  stalls {stalls}  restarts {restarts}"),
                );
                if left == 0 {
                    finished_in_time = true;
                    break;
                }
            }
        }
        if now - started > options.timeout {
            break;
        }
        if let (Some((chaos, every)), Some(at)) = (&paced, next_paced) {
            if now >= at {
                match chaos.strike().await {
                    Ok(Some(label)) => *backend_counts.entry(label).or_insert(0) += 1,
                    Ok(None) => {}
                    Err(e) if backend_errors.len() < 10 => backend_errors.push(e),
                    Err(_) => {}
                }
                next_paced = Some(Instant::now() + jitter(*every));
            }
        }
        if !options.no_chaos && now >= next_chaos && !workers.slots.is_empty() {
            next_chaos = now + jitter(options.chaos_every);
            let running: Vec<usize> = (0..workers.slots.len())
                .filter(|&i| workers.slots[i].2.is_none())
                .collect();
            if running.len() >= 2 || (running.len() == 1 && workers.slots.len() > 1) {
                let pick = running[rand::thread_rng().gen_range(0..running.len())];
                let backend = target.backend_chaos.as_ref().filter(|c| {
                    c.every().is_none()
                        && !options.stall_only
                        && rand::thread_rng().gen_bool(1.0 / 3.0)
                });
                if let Some(chaos) = backend {
                    match chaos.strike().await {
                        Ok(Some(label)) => *backend_counts.entry(label).or_insert(0) += 1,
                        Ok(None) => {}
                        Err(e) if backend_errors.len() < 10 => backend_errors.push(e),
                        Err(_) => {}
                    }
                } else if !options.stall_only && rand::thread_rng().gen_bool(0.5) {
                    workers.kill(pick);
                    kills += 1;
                    pending_restarts
                        .push(now + Duration::from_millis(rand::thread_rng().gen_range(50..400)));
                } else {
                    workers.stall(pick, stall_past_ttl(options.ttl.as_duration()));
                    stalls += 1;
                }
            }
        }
    }
    let elapsed = started.elapsed();
    if let Some(chaos) = &target.backend_chaos {
        chaos.heal().await;
    }
    workers.shutdown().await;
    let expect = Expect {
        steps: options.steps,
        poison: poison.clone(),
        max_attempts: options.max_attempts,
    };
    let audit = audit::audit(target.store.as_ref(), runs, &expect, &target.soak_dir).await;
    let timed_out = (!finished_in_time).then(|| {
        format!(
            "{} of {} runs did not finish within --timeout {}",
            audit.runs_incomplete.len(),
            runs.len(),
            human_duration(options.timeout)
        )
    });
    let committed = audit.checkpoints.saturating_sub(runs.len() as u64);
    Ok(SoakReport {
        store: target.address.clone(),
        runs: runs.len() as u64 - poison.len() as u64,
        poison: poison.len() as u64,
        poison_raise: options.poison_raise,
        max_attempts: options.max_attempts,
        steps: options.steps,
        workers: options.workers,
        elapsed_secs: elapsed.as_secs_f64(),
        steps_per_sec: committed as f64 / elapsed.as_secs_f64().max(1e-9),
        kills,
        stalls,
        restarts,
        unexpected_exits: unexpected,
        backend_chaos: backend_counts,
        backend_chaos_errors: backend_errors,
        server_restarts: None,
        read_backs: None,
        failover: None,
        finished_in_time,
        timed_out,
        audit,
        kept_dir: None,
    })
}

fn jitter(mean: Duration) -> Duration {
    runkeep::backoff::scaled(mean, 0.5, 1.5)
}

/// How long a stall (a stopped worker, a stopped server, a partitioned
/// connection) lasts: `ttl + ttl × U(0.3, 1)`, so the lease lapses while
/// the holder is frozen, and the stall ends before two TTLs.
pub(crate) fn stall_past_ttl(ttl: Duration) -> Duration {
    ttl + runkeep::backoff::scaled(ttl, 0.3, 1.0)
}

/// `90s` → `1m30s`, `1s` → `1s`, `1500ms` → `1500ms`.
pub fn human_duration(d: Duration) -> String {
    if d.subsec_millis() != 0 {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

fn render(r: &SoakReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    macro_rules! line {
        () => { out.push('\n') };
        ($($t:tt)*) => {{ let _ = writeln!(out, $($t)*); }};
    }
    let a = &r.audit;
    let verdict = match r.verdict() {
        Verdict::Pass => "PASS: every invariant held".to_string(),
        Verdict::Fail => "FAIL: invariants violated".to_string(),
        Verdict::Incomplete => format!(
            "INCOMPLETE: did not finish in time ({}); no invariant was violated in what ran",
            r.timed_out.as_deref().unwrap_or("timed out")
        ),
    };
    line!("runkeep soak — {verdict}");
    line!();
    let mut rows: Vec<(&str, String)> = vec![
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
    ];
    if !r.backend_chaos.is_empty() || !r.backend_chaos_errors.is_empty() {
        let mut text = r
            .backend_chaos
            .iter()
            .map(|(label, n)| format!("{n} {label}"))
            .collect::<Vec<_>>()
            .join(", ");
        if !r.backend_chaos_errors.is_empty() {
            text.push_str(&format!(
                "; {} strike(s) failed (not a violation): {}",
                r.backend_chaos_errors.len(),
                r.backend_chaos_errors.join("; ")
            ));
        }
        rows.push(("backend chaos", text));
    }
    if let Some(n) = r.server_restarts {
        rows.push((
            "server restarts",
            format!(
                "{n} (runkeep serve killed with kill -9 and started again on the same port and backing store while the workers went on)"
            ),
        ));
        rows.push((
            "across them",
            format!(
                "{} steps failed with the store unavailable and were retried ({} cut in flight: outcome unknown)",
                a.unavailable_refusals, a.outcome_unknown_refusals
            ),
        ));
    }
    if let Some(f) = &r.failover {
        rows.push((
            "failover",
            format!(
                "{} standby promoted in {} ms; at the kill -9 {} worker transaction(s) open on the primary, {} of them commits waiting for the standby",
                f.replication, f.promote_ms, f.open_transactions, f.commits_in_flight
            ),
        ));
    }
    if let Some(rb) = &r.read_backs {
        rows.push((
            "lost answers",
            format!(
                "{} step commits answered outcome unknown; read back: {} had landed (not repeated), {} had not (repeated), {} unresolved (the error stood and the step was not repeated, or the worker was killed first)",
                rb.outcome_unknown,
                rb.landed,
                rb.not_landed,
                rb.outcome_unknown.saturating_sub(rb.landed + rb.not_landed)
            ),
        ));
    }
    rows.extend([
        (
            "runs completed",
            format!(
                "{} / {} (checkpoint chain one line, finished as completed)",
                a.runs_completed, r.runs
            ),
        ),
        (
            "runs finished",
            format!(
                "{} / {} ({} dead-lettered)",
                a.runs_finished,
                r.runs + r.poison,
                a.runs_dead_lettered
            ),
        ),
        (
            "attempts",
            format!(
                "{} lost (takeovers from expired leases and failed attempts; {} failed attempts recorded); at most {} on one run (a run is dead-lettered at {})",
                a.attempts,
                a.failed_attempts,
                a.most_attempts_one_run,
                runkeep::lifecycle::DEFAULT_MAX_ATTEMPTS
            ),
        ),
    ]);
    if r.poison > r.poison_raise {
        rows.push((
            "poison runs",
            format!(
                "{} / {} dead-lettered after {} attempts ({} workers crashed by them)",
                a.poison_dead_lettered,
                r.poison - r.poison_raise,
                r.max_attempts,
                a.poison_crashes
            ),
        ));
    }
    if r.poison_raise > 0 {
        rows.push((
            "raising runs",
            format!(
                "{} / {} dead-lettered after {} attempts with their errors kept ({} failed attempts recorded)",
                a.raise_dead_lettered, r.poison_raise, r.max_attempts, a.failed_attempts
            ),
        ));
    }
    rows.extend([
        (
            "read back",
            format!(
                "{} checkpoints, {} events, {} acknowledged writes checked, {} lost",
                a.checkpoints, a.events, a.acks_checked, a.acks_lost
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
    ]);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        line!("  {k:<width$}  {v}");
    }
    if !a.effects_reexecuted.is_empty() {
        line!();
        line!("re-executed effects (the at-least-once window, not a fencing failure):");
        for e in a.effects_reexecuted.iter().take(20) {
            line!(
                "  {} step {}: {} times under fences {:?}",
                e.run,
                e.step,
                e.times,
                e.fences
            );
        }
    }
    if !a.violations.is_empty() {
        line!();
        line!("violations:");
        for v in a.violations.iter().take(50) {
            line!("  ✗ {v}");
        }
        if a.violations.len() > 50 {
            line!("  … and {} more", a.violations.len() - 50);
        }
    }
    if !a.runs_incomplete.is_empty() {
        line!();
        line!("did not finish in time (not violations):");
        for v in a.runs_incomplete.iter().take(10) {
            line!("  … {v}");
        }
        if a.runs_incomplete.len() > 10 {
            line!("  … and {} more", a.runs_incomplete.len() - 10);
        }
        line!("  → give it a longer --timeout, fewer --runs or --steps, or more --workers");
    }
    if let Some(d) = &r.kept_dir {
        line!();
        line!("soak directory kept at {d}");
    }
    out
}

/// The soak directory's layout: `soak/` (effects, acks, worker logs) under
/// `dir`.
pub fn soak_dir(dir: &Path) -> PathBuf {
    dir.join("soak")
}
