//! One soak worker: drains the soak's runs through the worker runtime, one
//! step at a time, recording what it was told succeeded in an ack log the
//! audit later checks against the store.
//!
//! A *broken* worker (for proving the audit can fail) ignores cancellation
//! and writes around the handle: unfenced store calls and unchecked effects
//! under the fence it took the run with.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runkeep_worker::{
    DrainMode, DrainReport, IdleBackoff, RunHandle, StepOutcome, Worker, WorkerError, WorkerOptions,
};
use runkeep::{
    Checkpoint, CheckpointId, ClaimNextFilter, Error, Fence, Holder, ListingScope, NewEvent,
    ParkResolution, ParkState, RunScope, RunStore, Ttl,
};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::sink::EffectSink;

/// Id of the checkpoint each run is seeded with; its park is the work item.
pub const SEED_CHECKPOINT: &str = "cp_soak_seed";
/// Park request type of a soak work item.
pub const WORK_REQUEST: &str = "soak_work";

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
    /// Worker label (index).
    pub label: String,
    /// Ignore cancellation and write around the handle.
    pub broken: bool,
    /// In-process stand-in for SIGSTOP (memory store only): a step blocks
    /// its thread while this is set.
    pub stall: Option<Arc<Mutex<Option<Duration>>>>,
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

fn run_key(scope: &RunScope) -> String {
    scope.run_id.to_string()
}

type StepError = Box<dyn std::error::Error + Send + Sync>;

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
    let holder = Holder::unique(&format!("soak-{}", cfg.label));
    let mut options = WorkerOptions::new(holder, cfg.ttl);
    options.concurrency = cfg.concurrency;
    options.filter = ClaimNextFilter {
        park: Some(vec![ParkState::Outstanding]),
        ..Default::default()
    };
    options.idle = IdleBackoff {
        min: Duration::from_millis(20),
        max: Duration::from_millis(250),
        jitter: 0.5,
    };
    options.mode = DrainMode::Continuous;
    options.shutdown_grace = Duration::from_secs(2);
    let worker = Worker::new(store, listing, options).map_err(|e| e.to_string())?;
    let cfg = Arc::new(cfg);
    let report = worker
        .drain(shutdown, move |run, _resume| {
            let (cfg, sink, acks) = (cfg.clone(), sink.clone(), acks.clone());
            async move {
                let outcome = if cfg.broken {
                    broken_step(run.clone(), &cfg, &sink, &acks).await
                } else {
                    step(run.clone(), &cfg, &sink, &acks).await
                };
                if let Err(e) = &outcome {
                    acks.log(json!({"k": "refused", "run": run_key(run.scope()), "error": e.to_string(), "fenced_out": is_fenced_out(e.as_ref())}));
                }
                outcome
            }
        })
        .await;
    Ok(report)
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

fn state_step(cp: &Checkpoint) -> u64 {
    cp.state.get("step").and_then(Value::as_u64).unwrap_or(0)
}

fn stall_if_asked(cfg: &WorkerConfig) {
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
fn announce(
    run: &RunHandle,
    sink: &EffectSink,
    acks: &Acks,
) -> Result<(RunScope, String, Fence), StepError> {
    let (scope, holder, fence) = (run.scope().clone(), run.holder().to_string(), run.fence());
    sink.observe(&scope.run_id, fence, &holder)?;
    acks.log(json!({"k": "fence", "run": run_key(&scope), "fence": fence.get(), "holder": holder}));
    Ok((scope, holder, fence))
}

async fn step(
    run: RunHandle,
    cfg: &WorkerConfig,
    sink: &EffectSink,
    acks: &Acks,
) -> Result<StepOutcome, StepError> {
    let (scope, holder, mut logged_fence) = announce(&run, sink, acks)?;
    let store = run.store().clone();
    let Some(latest) = store.latest_checkpoint(&scope).await? else {
        return Ok(StepOutcome::Finished);
    };
    let run_created_at = latest.run_created_at;
    let mut done = state_step(&latest);
    while done < cfg.steps {
        let next = done + 1;
        let nonce = runkeep::id::random_suffix(10);
        if run.fence() != logged_fence {
            logged_fence = run.fence();
            acks.log(json!({"k": "fence", "run": run_key(&scope), "fence": logged_fence.get(), "holder": holder}));
        }
        let mut payload = Map::new();
        payload.insert("step".into(), json!(next));
        payload.insert("nonce".into(), json!(nonce));
        let ev = run
            .append_event(NewEvent::new("step_started", payload))
            .await?;
        acks.log(json!({"k": "event", "run": run_key(&scope), "seq": ev.seq, "nonce": nonce}));
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
        let mut cp = Checkpoint::new(CheckpointId::new(format!("cp_{nonce}"))?, run.now(), state);
        cp.run_created_at = run_created_at;
        let stored = run.write_checkpoint(&cp).await?;
        acks.log(json!({"k": "cp", "run": run_key(&scope), "id": stored.id.to_string(), "step": next, "fence": stored.fence.map(Fence::get)}));
        done = next;
    }
    let mut payload = Map::new();
    payload.insert("steps".into(), json!(cfg.steps));
    let ev = run
        .append_event(NewEvent::new("run_completed", payload))
        .await?;
    acks.log(json!({"k": "event", "run": run_key(&scope), "seq": ev.seq, "nonce": format!("completed-{}", ev.seq)}));
    run.write_report(&format!("completed {} steps\n", cfg.steps))
        .await?;
    match run
        .resolve_park(
            &CheckpointId::new(SEED_CHECKPOINT)?,
            ParkResolution::Answer(json!({"completed": true})),
            run.now(),
        )
        .await
    {
        Ok(_) => {}
        Err(WorkerError::Store(Error::Conflict { .. })) => {}
        Err(e) => return Err(e.into()),
    }
    acks.log(json!({"k": "done", "run": run_key(&scope)}));
    Ok(StepOutcome::Finished)
}

/// The deliberately broken worker: captures the fence once, ignores
/// cancellation (its loop runs in a detached task the drain cannot stop),
/// and writes around the handle.
async fn broken_step(
    run: RunHandle,
    cfg: &WorkerConfig,
    sink: &EffectSink,
    acks: &Acks,
) -> Result<StepOutcome, StepError> {
    let (scope, holder, fence) = announce(&run, sink, acks)?;
    let store = run.store().clone();
    let now = run.now();
    let (cfg, sink) = (cfg.clone(), sink.clone());
    let detached = tokio::spawn(async move {
        let Ok(Some(latest)) = store.latest_checkpoint(&scope).await else {
            return;
        };
        let mut done = state_step(&latest);
        while done < cfg.steps {
            let next = done + 1;
            let nonce = runkeep::id::random_suffix(10);
            let mut payload = Map::new();
            payload.insert("step".into(), json!(next));
            payload.insert("nonce".into(), json!(nonce));
            let _ = store
                .append_events(&scope, &[NewEvent::new("step_started", payload)], None)
                .await;
            let _ = sink.apply(&scope.run_id, fence, next, &holder, false);
            stall_if_asked(&cfg);
            tokio::time::sleep(cfg.step_time).await;
            let mut state = Map::new();
            state.insert("step".into(), json!(next));
            let Ok(id) = CheckpointId::new(format!("cp_{nonce}")) else {
                return;
            };
            let mut cp = Checkpoint::new(id, now, state);
            cp.run_created_at = latest.run_created_at;
            let _ = store.write_checkpoint(&scope, &cp, None).await;
            done = next;
        }
        if let Ok(seed) = CheckpointId::new(SEED_CHECKPOINT) {
            let _ = store
                .resolve_park(
                    &scope,
                    &seed,
                    ParkResolution::Answer(json!({"completed": true})),
                    now,
                    None,
                )
                .await;
        }
    });
    let _ = detached.await;
    Ok(StepOutcome::Finished)
}
