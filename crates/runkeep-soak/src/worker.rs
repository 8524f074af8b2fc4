//! The soak's (correct) worker: drains the soak's runs through the worker
//! runtime — `claim_next` → one atomic commit per step → the last step's
//! commit finishes the run — recording what it was told succeeded in an ack
//! log the audit later checks against the store.
//!
//! A *poison* run (seeded with `"poison": true`) stands for a host bug that
//! crashes the process: the worker that takes it kills itself (SIGKILL, or
//! in a thread worker its crash hook) before committing anything, every
//! time, until the store dead-letters the run at its attempt limit.
//!
//! The deliberately broken workers that prove the audit can fail are not
//! here: they live in this crate's tests, never in an operator binary.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runkeep::{
    Checkpoint, CheckpointId, Error, Fence, Holder, ListingScope, NewEvent, Outcome, RunScope,
    RunStore, Step, Ttl,
};
use runkeep_worker::{
    DrainMode, DrainReport, IdleBackoff, RunHandle, StepOutcome, Worker, WorkerError, WorkerOptions,
};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::sink::EffectSink;

/// Id of the checkpoint each run is enqueued with (step 0).
pub const SEED_CHECKPOINT: &str = "cp_soak_seed";
/// Event type of one committed step.
pub const STEP_EVENT: &str = "soak_step";
/// State key marking a poison run.
pub const POISON_KEY: &str = "poison";

/// The seed checkpoint's key marking a run whose step raises every time
/// (`--poison-raise`): the worker survives, the attempt is reported failed.
pub const RAISE_KEY: &str = "poisonRaise";

/// What a raising poison run's step answers, every time.
pub const RAISED: &str = "poison-raise: this step raises every time";

/// What a worker needs to know.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The soak's own directory (effects, acks).
    pub soak_dir: PathBuf,
    /// Steps per run.
    pub steps: u64,
    /// Lease TTL.
    pub ttl: Ttl,
    /// Simulated work per step.
    pub step_time: Duration,
    /// Runs stepped at once.
    pub concurrency: usize,
    /// Worker label: `w` and the worker's index ([`label`]), counted from 0
    /// in the order the soak started them (restarts included).
    pub label: String,
    /// In-process stand-in for SIGSTOP (thread workers): a step blocks its
    /// thread while this is set.
    pub stall: Option<Arc<Mutex<Option<Duration>>>>,
    /// In-process stand-in for a crash (thread workers): cancelling it drops
    /// the worker's runtime with nothing released. `None`: a process, which
    /// kills itself.
    pub crash: Option<CancellationToken>,
}

/// The label of the `n`th worker the soak starts (restarts included):
/// `w0`, `w1`, … ([`WorkerConfig::index`] reads `n` back).
pub fn label(n: usize) -> String {
    format!("w{n}")
}

/// A worker body: what a worker (process or thread) runs until `shutdown`.
pub type WorkFn = Arc<
    dyn Fn(
            Arc<dyn RunStore>,
            ListingScope,
            WorkerConfig,
            CancellationToken,
        ) -> Pin<Box<dyn Future<Output = Result<DrainReport, String>> + Send>>
        + Send
        + Sync,
>;

/// The correct worker as a [`WorkFn`].
pub fn correct() -> WorkFn {
    Arc::new(|store, listing, cfg, shutdown| Box::pin(work(store, listing, cfg, shutdown)))
}

/// Append-only log of what this worker was told succeeded.
#[derive(Debug)]
pub struct Acks {
    file: Mutex<File>,
}

impl Acks {
    /// A fresh ack log in `dir`.
    pub fn create(dir: &Path, label: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let name = format!(
            "{label}-{}-{}.jsonl",
            std::process::id(),
            runkeep::id::random_suffix(6)
        );
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(dir.join(name))?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// Records one line (best effort: a failure to record an ack only weakens
    /// the audit, it never changes the store).
    pub fn log(&self, v: Value) {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        if let Ok(mut f) = self.file.lock() {
            let _ = f.write_all(&line);
        }
    }
}

/// The ack log's name for a run.
pub fn run_key(scope: &RunScope) -> String {
    scope.run_id.to_string()
}

/// A step's error.
pub type StepError = Box<dyn std::error::Error + Send + Sync>;

/// The worker options every soak worker uses.
pub fn options(cfg: &WorkerConfig) -> WorkerOptions {
    let holder = Holder::unique(&format!("soak-{}", cfg.label));
    let mut options = WorkerOptions::new(holder, cfg.ttl);
    options.concurrency = cfg.concurrency;
    options.idle = IdleBackoff {
        min: Duration::from_millis(20),
        max: Duration::from_millis(250),
        jitter: 0.5,
    };
    options.mode = DrainMode::Continuous;
    options.shutdown_grace = Duration::from_secs(2);
    options
}

impl WorkerConfig {
    /// A worker process's configuration (no in-process stall or crash:
    /// the soak signals the process instead).
    pub fn process(
        soak_dir: PathBuf,
        steps: u64,
        ttl: Ttl,
        step_time: Duration,
        concurrency: usize,
        label: String,
    ) -> Self {
        Self {
            soak_dir,
            steps,
            ttl,
            step_time,
            concurrency,
            label,
            stall: None,
            crash: None,
        }
    }

    /// The worker's index, read back from its [`label`] (`w7` → 7): the
    /// soak spreads workers over several servers by it. `None` for a label
    /// the soak did not make.
    pub fn index(&self) -> Option<usize> {
        self.label.strip_prefix('w')?.parse().ok()
    }

    /// The arguments after the binary's global options that start this
    /// worker as a process: the hidden `soak-worker` subcommand and its
    /// options, read back by the binary into [`WorkerConfig::process`].
    pub fn process_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["soak-worker".into(), "--soak-dir".into()];
        args.push(self.soak_dir.clone().into_os_string());
        for (flag, value) in [
            ("--steps", self.steps.to_string()),
            ("--ttl", format!("{}ms", self.ttl.as_millis())),
            ("--step-time", format!("{}ms", self.step_time.as_millis())),
            ("--concurrency", self.concurrency.to_string()),
            ("--label", self.label.clone()),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        args
    }
}

/// Drains until `shutdown` and reports.
pub async fn work(
    store: Arc<dyn RunStore>,
    listing: ListingScope,
    cfg: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<DrainReport, String> {
    let sink =
        EffectSink::new(&cfg.soak_dir.join("effects")).map_err(|e| format!("effect sink: {e}"))?;
    let acks = Arc::new(
        Acks::create(&cfg.soak_dir.join("acks"), &cfg.label)
            .map_err(|e| format!("ack log: {e}"))?,
    );
    let worker = Worker::new(store, listing, options(&cfg)).map_err(|e| e.to_string())?;
    let cfg = Arc::new(cfg);
    let report = worker
        .drain(shutdown, move |run, resume| {
            let (cfg, sink, acks) = (cfg.clone(), sink.clone(), acks.clone());
            async move {
                let outcome = step(run.clone(), resume, &cfg, &sink, &acks).await;
                if let Err(e) = &outcome {
                    log_refusal(&acks, run.scope(), e.as_ref());
                }
                outcome
            }
        })
        .await;
    Ok(report)
}

/// Logs a refused step (the audit counts the fenced-out ones).
pub fn log_refusal(acks: &Acks, scope: &RunScope, e: &(dyn std::error::Error + 'static)) {
    acks.log(json!({"k": "refused", "run": run_key(scope), "error": e.to_string(), "fenced_out": is_fenced_out(e), "unavailable": is_unavailable(e), "outcome_unknown": is_outcome_unknown(e)}));
}

fn store_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    match e.downcast_ref::<WorkerError>() {
        Some(WorkerError::Store(s)) => Some(s),
        Some(_) => None,
        None => e.downcast_ref::<Error>(),
    }
}

/// True for a store that did not answer (`Unavailable`, outcome unknown
/// included), as opposed to a refusal.
fn is_unavailable(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(store_error(e), Some(Error::Unavailable { .. }))
}

/// How long a step the store did not take waits before it is repeated.
const REPEAT_PAUSE: Duration = Duration::from_millis(50);

/// True for a step commit the store surely did not take: `Unavailable`
/// without outcome unknown (not sent, or read back as absent).
fn is_not_stored(e: &WorkerError) -> bool {
    matches!(e, WorkerError::Store(s @ Error::Unavailable { .. }) if !s.is_outcome_unknown())
}

/// True for a write whose answer was lost (it may or may not be stored).
fn is_outcome_unknown(e: &(dyn std::error::Error + 'static)) -> bool {
    store_error(e).is_some_and(Error::is_outcome_unknown)
}

fn is_fenced_out(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(w) = e.downcast_ref::<WorkerError>() {
        return w.is_fenced_out();
    }
    if let Some(s) = e.downcast_ref::<Error>() {
        return s.is_fenced_out();
    }
    false
}

/// The step a checkpoint records.
pub fn state_step(cp: &Checkpoint) -> u64 {
    cp.state.get("step").and_then(Value::as_u64).unwrap_or(0)
}

/// True for a checkpoint of a poison run.
pub fn is_poison(cp: &Checkpoint) -> bool {
    cp.state.get(POISON_KEY).and_then(Value::as_bool) == Some(true)
}

/// True for a checkpoint of a raising poison run.
pub fn is_raising(cp: &Checkpoint) -> bool {
    cp.state.get(RAISE_KEY).and_then(Value::as_bool) == Some(true)
}

/// Blocks the worker's thread while its stall flag is set (thread workers).
pub fn stall_if_asked(cfg: &WorkerConfig) {
    if let Some(flag) = &cfg.stall {
        let pause = flag.lock().ok().and_then(|mut g| g.take());
        if let Some(d) = pause {
            // Blocks this worker's whole runtime (its lease keeper included),
            // as SIGSTOP would.
            std::thread::sleep(d);
        }
    }
}

/// A worker that just took a run announces its fence to the effect sink (so
/// a zombie is refused even before this worker's first effect) and logs it.
pub fn announce(
    run: &RunHandle,
    sink: &EffectSink,
    acks: &Acks,
) -> Result<(RunScope, String, Fence), StepError> {
    let (scope, holder, fence) = (run.scope().clone(), run.holder().to_string(), run.fence());
    sink.observe(&scope.run_id, fence, &holder)?;
    acks.log(json!({"k": "fence", "run": run_key(&scope), "fence": fence.get(), "holder": holder}));
    Ok((scope, holder, fence))
}

/// The crash a poison run causes: the whole worker dies with nothing
/// released. Never completes.
async fn crash(cfg: &WorkerConfig, acks: &Acks, scope: &RunScope) {
    acks.log(json!({"k": "poison", "run": run_key(scope)}));
    match &cfg.crash {
        Some(hook) => {
            // A thread worker: its runtime is dropped at once, abandoning
            // every task (no release), as a killed process would.
            hook.cancel();
        }
        None => {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::Kill,
            );
        }
    }
    std::future::pending::<()>().await;
}

async fn step(
    run: RunHandle,
    resume: Option<Checkpoint>,
    cfg: &WorkerConfig,
    sink: &EffectSink,
    acks: &Acks,
) -> Result<StepOutcome, StepError> {
    let (scope, holder, mut logged_fence) = announce(&run, sink, acks)?;
    let Some(latest) = resume else {
        return Err(format!("run {} has no checkpoint to resume from", scope.run_id).into());
    };
    if is_poison(&latest) {
        crash(cfg, acks, &scope).await;
        return Err("a crashed worker does not go on".into());
    }
    if is_raising(&latest) {
        acks.log(json!({"k": "raise", "run": run_key(&scope)}));
        return Err(RAISED.into());
    }
    let run_created_at = latest.run_created_at;
    let mut done = state_step(&latest);
    while done < cfg.steps {
        let next = done + 1;
        let nonce = runkeep::id::random_suffix(10);
        if run.fence() != logged_fence {
            logged_fence = run.fence();
            acks.log(json!({"k": "fence", "run": run_key(&scope), "fence": logged_fence.get(), "holder": holder}));
        }
        let tool = run
            .run_tool(&format!("effect-{next}"), "effect", |token| {
                let (sink, holder) = (sink.clone(), holder.clone());
                async move {
                    match sink.apply(&token.scope.run_id, token.fence, next, &holder, true) {
                        Ok(Ok(())) => Ok(format!("applied under fence {}", token.fence)),
                        Ok(Err(r)) => Err(format!(
                            "refused: fence {} is below {}",
                            token.fence, r.highest
                        )),
                        Err(e) => Err(format!("sink failed: {e}")),
                    }
                }
            })
            .await?;
        if tool.tool.is_error {
            return Err(format!("effect of step {next}: {}", tool.tool.result).into());
        }
        stall_if_asked(cfg);
        tokio::select! {
            _ = tokio::time::sleep(cfg.step_time) => {}
            _ = run.lost() => {}
        }
        let mut state = Map::new();
        state.insert("step".into(), json!(next));
        state.insert("nonce".into(), json!(nonce));
        let mut cp = Checkpoint::new(
            CheckpointId::new(format!("cp_{nonce}"))?,
            run.now(),
            state.clone(),
        );
        cp.run_created_at = run_created_at;
        let last = next == cfg.steps;
        // One commit: the step's event, its checkpoint and, for the last
        // step, the finish.
        let step = Step {
            events: vec![NewEvent::new(STEP_EVENT, state)],
            checkpoint: Some(cp),
            finish: last.then(|| Outcome::completed(Some(json!({"steps": cfg.steps})))),
            ..Step::default()
        };
        let receipt = match run.commit_step(&step).await {
            Ok(r) => r,
            // Not stored, for sure (nothing was sent, or the runtime's
            // read-back after a lost answer found it absent): repeat this
            // step in place while the lease holds, as the runtime advises,
            // instead of failing the attempt (which would count toward the
            // run's dead-letter limit). Its effect is in the tool ledger:
            // not run again.
            Err(e) if is_not_stored(&e) && !run.is_lost() => {
                log_refusal(acks, &scope, &e);
                tokio::select! {
                    _ = tokio::time::sleep(REPEAT_PAUSE) => {}
                    _ = run.lost() => {}
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for ev in &receipt.events {
            acks.log(json!({"k": "event", "run": run_key(&scope), "seq": ev.seq, "nonce": nonce}));
        }
        if let Some(stored) = &receipt.checkpoint {
            acks.log(json!({"k": "cp", "run": run_key(&scope), "id": stored.id.to_string(), "step": next, "fence": stored.fence.map(Fence::get)}));
        }
        if last {
            acks.log(json!({"k": "done", "run": run_key(&scope)}));
        }
        done = next;
    }
    Ok(StepOutcome::Finished)
}
