//! The soak's audit: after the workers are stopped, check every guarantee
//! against the store itself, the effect sink's logs and the workers' ack
//! logs. Every finding is a violation with the run it concerns. A run that
//! simply had not finished when the soak stopped is listed apart
//! (`runs_incomplete`): running out of time breaks no guarantee.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use runkeep::lifecycle::ATTEMPTS_EXHAUSTED;
use runkeep::{Integrity, ReadEventsOptions, RunScope, RunStatus, RunStore};
use serde::Serialize;
use serde_json::Value;

use crate::sink::{EffectSink, SinkEntry};
use crate::worker::{SEED_CHECKPOINT, STEP_EVENT};

/// What the audit found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Audit {
    /// Runs that completed every step with a single-line checkpoint chain
    /// and were finished as completed.
    pub runs_completed: u64,
    /// Runs the store reports finished (any status).
    pub runs_finished: u64,
    /// Attempts lost, summed over every run (the store's attempt counts:
    /// takeovers from expired leases and failed attempts).
    pub attempts: u64,
    /// The most attempts one ordinary (not poison) run lost: the chaos
    /// takes leases at a steady rate, so this grows with the time a run is
    /// held, and a run reaching its limit
    /// ([`runkeep::lifecycle::DEFAULT_MAX_ATTEMPTS`]) is dead-lettered: the
    /// margin the soak had.
    pub most_attempts_one_run: u32,
    /// Runs dead-lettered (finished as failed, attempts exhausted).
    pub runs_dead_lettered: u64,
    /// Poison runs dead-lettered after exactly their attempt limit.
    pub poison_dead_lettered: u64,
    /// Raising poison runs dead-lettered after exactly their attempt
    /// limit, their errors kept.
    pub raise_dead_lettered: u64,
    /// Failed attempts on record, summed over every run (each run keeps
    /// its newest ones).
    pub failed_attempts: u64,
    /// Workers a poison run crashed (from the ack logs).
    pub poison_crashes: u64,
    /// Checkpoints read back.
    pub checkpoints: u64,
    /// Events read back.
    pub events: u64,
    /// Effects admitted by the sink.
    pub effects_accepted: u64,
    /// Effects the sink refused (zombies stopped at the side-effect boundary).
    pub effects_refused: u64,
    /// Effects accepted although a higher fence had been seen: must be 0.
    pub effects_from_superseded_fence: u64,
    /// Steps whose effect ran more than once: the at-least-once window (a
    /// crash between an effect and its record), listed, not a violation.
    pub effects_reexecuted: Vec<ReExecution>,
    /// Fences issued to two holders: must be 0.
    pub fences_issued_twice: u64,
    /// Distinct (run, fence) holdings observed by workers.
    pub fences_observed: u64,
    /// Writes refused with fenced-out / lease lost, as the workers logged them.
    pub fenced_out_refusals: u64,
    /// Steps that failed because the store did not answer (`Unavailable`:
    /// a server that was down, a connection cut), as the workers logged
    /// them; the run was retried. Not a violation: the evidence that the
    /// chaos reached the workers' requests.
    pub unavailable_refusals: u64,
    /// Of those, writes whose answer was lost on the way back (outcome
    /// unknown: the request was in flight when the connection was cut).
    pub outcome_unknown_refusals: u64,
    /// Acknowledged events and checkpoints checked present.
    pub acks_checked: u64,
    /// Of those, missing from the store or different there: acknowledged
    /// writes lost (each also a violation). Must be 0.
    pub acks_lost: u64,
    /// Torn lines in logs of killed processes (their operations never returned).
    pub torn_log_lines: u64,
    /// Runs that had not finished when the soak stopped (a prefix of their
    /// steps committed, not finished; a poison run not dead-lettered yet): the soak ran out of time.
    /// Not a violation of any guarantee.
    pub runs_incomplete: Vec<String>,
    /// Every violation, with its run.
    pub violations: Vec<String>,
}

/// An effect run more than once for one step.
#[derive(Clone, Debug, Serialize)]
pub struct ReExecution {
    /// The run.
    pub run: String,
    /// The step.
    pub step: u64,
    /// How many times it was admitted.
    pub times: u64,
    /// Under which fences.
    pub fences: Vec<u64>,
}

/// What the audit expects of the runs.
#[derive(Clone, Debug)]
pub struct Expect {
    /// Steps per run.
    pub steps: u64,
    /// The poison runs (a subset of the runs audited).
    pub poison: HashSet<RunScope>,
    /// The attempt limit the poison runs were enqueued with.
    pub max_attempts: u32,
}

/// Audits `runs`.
pub async fn audit(
    store: &dyn RunStore,
    runs: &[RunScope],
    expect: &Expect,
    soak_dir: &Path,
) -> Audit {
    let mut a = Audit::default();
    let acks = read_acks(&soak_dir.join("acks"), &mut a);
    for scope in runs {
        if expect.poison.contains(scope) {
            audit_poison(store, scope, expect, &mut a).await;
        } else {
            audit_run(store, scope, expect.steps, &acks, &mut a).await;
        }
    }
    a.poison_crashes = acks.iter().filter(|v| v["k"] == "poison").count() as u64;
    audit_effects(soak_dir, &mut a);
    audit_fences(&acks, &mut a);
    a.fenced_out_refusals = acks
        .iter()
        .filter(|v| v["k"] == "refused" && v["fenced_out"] == true)
        .count() as u64;
    a.unavailable_refusals = acks
        .iter()
        .filter(|v| v["k"] == "refused" && v["unavailable"] == true)
        .count() as u64;
    a.outcome_unknown_refusals = acks
        .iter()
        .filter(|v| v["k"] == "refused" && v["outcome_unknown"] == true)
        .count() as u64;
    a
}

fn read_acks(dir: &Path, a: &mut Audit) -> Vec<Value> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            match serde_json::from_str::<Value>(line) {
                Ok(v) => out.push(v),
                Err(_) => a.torn_log_lines += 1,
            }
        }
    }
    out
}

async fn audit_run(
    store: &dyn RunStore,
    scope: &RunScope,
    steps: u64,
    acks: &[Value],
    a: &mut Audit,
) {
    let run = scope.run_id.to_string();
    let cps = match store.list_checkpoints(scope).await {
        Ok(c) => c,
        Err(e) => {
            a.violations
                .push(format!("{run}: checkpoints unreadable: {e}"));
            return;
        }
    };
    a.checkpoints += cps.len() as u64;
    let life = match store.lifecycle(scope).await {
        Ok(l) => l,
        Err(e) => {
            a.violations
                .push(format!("{run}: lifecycle unreadable: {e}"));
            return;
        }
    };
    count_lifecycle(&life, a);
    a.most_attempts_one_run = a.most_attempts_one_run.max(life.attempts);
    // The step checkpoints, in the store's total order, must be 1, 2, …,
    // steps: one line, no divergent branch, nothing skipped or repeated.
    // (The seed is step 0.)
    let chain: Vec<u64> = cps
        .iter()
        .filter(|c| c.id.as_str() != SEED_CHECKPOINT)
        .map(|c| {
            c.state
                .get("step")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX)
        })
        .collect();
    let expected: Vec<u64> = (1..=steps).collect();
    // A prefix of 1..=steps is a run still under way; anything else is a
    // divergent branch, a skipped or a repeated step.
    let is_prefix = chain.len() <= expected.len() && chain[..] == expected[..chain.len()];
    let mut complete = true;
    if !cps.iter().any(|c| c.id.as_str() == SEED_CHECKPOINT) {
        complete = false;
        a.violations
            .push(format!("{run}: its seed checkpoint (step 0) is gone"));
    } else if !is_prefix {
        complete = false;
        a.violations.push(format!(
            "{run}: checkpoint chain in the total order is {:?}, expected 1..={steps} in order (a divergent branch or a lost step)",
            abbreviate(&chain)
        ));
    } else {
        match life.status {
            RunStatus::Completed if chain.len() < expected.len() => {
                complete = false;
                a.violations.push(format!(
                    "{run}: finished as completed after only {} of {steps} steps (a lost step)",
                    chain.len()
                ));
            }
            RunStatus::Completed => {}
            RunStatus::Active => {
                complete = false;
                a.runs_incomplete.push(format!(
                    "{run}: {} of {steps} steps committed, not finished yet (attempts {})",
                    chain.len(),
                    life.attempts
                ));
            }
            status => {
                complete = false;
                a.violations.push(format!(
                    "{run}: finished {status} ({}) after {} attempts, though it is not a poison run: every other run must complete",
                    life.reason.as_deref().unwrap_or("no reason"),
                    life.attempts
                ));
            }
        }
    }
    let strict = ReadEventsOptions {
        integrity: Integrity::Strict,
        ..Default::default()
    };
    match store.read_events(scope, &strict).await {
        Ok(batch) => {
            a.events += batch.events.len() as u64;
            let by_seq: HashMap<u64, &runkeep::PersistedEvent> =
                batch.events.iter().map(|e| (e.seq, e)).collect();
            for ack in acks
                .iter()
                .filter(|v| v["k"] == "event" && v["run"] == run.as_str())
            {
                a.acks_checked += 1;
                let seq = ack["seq"].as_u64().unwrap_or(0);
                let nonce = ack["nonce"].as_str().unwrap_or("");
                let present = by_seq
                    .get(&seq)
                    .is_some_and(|e| e.payload.get("nonce").and_then(Value::as_str) == Some(nonce));
                if !present {
                    a.acks_lost += 1;
                    a.violations.push(format!("{run}: acknowledged event seq {seq} (nonce {nonce}) is missing or different"));
                }
            }
            let mut seen_steps = HashSet::new();
            for e in batch.events.iter().filter(|e| e.event_type == STEP_EVENT) {
                if let Some(s) = e.payload.get("step").and_then(Value::as_u64) {
                    seen_steps.insert(s);
                }
            }
            if complete && seen_steps.len() as u64 != steps {
                a.violations.push(format!(
                    "{run}: transcript records {} distinct committed steps, expected {steps}",
                    seen_steps.len()
                ));
            }
        }
        Err(e) => a.violations.push(format!(
            "{run}: transcript fails the strict read (seq not contiguous or damaged): {e}"
        )),
    }
    let ids: HashSet<String> = cps.iter().map(|c| c.id.to_string()).collect();
    for ack in acks
        .iter()
        .filter(|v| v["k"] == "cp" && v["run"] == run.as_str())
    {
        a.acks_checked += 1;
        let id = ack["id"].as_str().unwrap_or("");
        if !ids.contains(id) {
            a.acks_lost += 1;
            a.violations
                .push(format!("{run}: acknowledged checkpoint {id} is missing"));
        }
    }
    if complete {
        a.runs_completed += 1;
    }
}

fn count_lifecycle(life: &runkeep::Lifecycle, a: &mut Audit) {
    a.attempts += u64::from(life.attempts);
    a.failed_attempts += life.failures.len() as u64;
    if life.status.is_finished() {
        a.runs_finished += 1;
    }
    if life.is_dead_lettered() {
        a.runs_dead_lettered += 1;
    }
}

/// A poison run must end dead-lettered at exactly its attempt limit, with
/// no step committed; until then it is incomplete, not a violation.
async fn audit_poison(store: &dyn RunStore, scope: &RunScope, expect: &Expect, a: &mut Audit) {
    let run = scope.run_id.to_string();
    let life = match store.lifecycle(scope).await {
        Ok(l) => l,
        Err(e) => {
            a.violations
                .push(format!("{run}: lifecycle unreadable: {e}"));
            return;
        }
    };
    count_lifecycle(&life, a);
    let mut raising = false;
    match store.list_checkpoints(scope).await {
        Ok(cps) => {
            a.checkpoints += cps.len() as u64;
            raising = cps.iter().any(crate::worker::is_raising);
            let stepped = cps
                .iter()
                .filter(|c| c.id.as_str() != SEED_CHECKPOINT)
                .count();
            if stepped > 0 {
                a.violations.push(format!(
                    "{run}: a poison run (its step crashes every worker, or raises every time) has {stepped} step checkpoints"
                ));
            }
        }
        Err(e) => a
            .violations
            .push(format!("{run}: checkpoints unreadable: {e}")),
    }
    let dead = life.is_dead_lettered();
    // A raising run's failures are on record with the step's error (a
    // takeover in between, when chaos killed its worker, counts too).
    let errors_kept = life
        .failures
        .iter()
        .any(|f| f.error.message.contains(crate::worker::RAISED));
    match life.status {
        RunStatus::Active => a.runs_incomplete.push(format!(
            "{run}: poison run not dead-lettered yet ({} of {} attempts)",
            life.attempts, expect.max_attempts
        )),
        _ if raising && dead && life.attempts == expect.max_attempts && errors_kept => {
            a.raise_dead_lettered += 1
        }
        _ if raising && dead && life.attempts == expect.max_attempts => a.violations.push(format!(
            "{run}: raising run dead-lettered without its step's error on record: {:?}",
            life.failures
        )),
        _ if dead && life.attempts == expect.max_attempts => a.poison_dead_lettered += 1,
        _ if dead => a.violations.push(format!(
            "{run}: poison run dead-lettered after {} attempts, its limit is {}",
            life.attempts, expect.max_attempts
        )),
        status => a.violations.push(format!(
            "{run}: poison run finished {status} ({}), expected failed: {ATTEMPTS_EXHAUSTED}",
            life.reason.as_deref().unwrap_or("no reason")
        )),
    }
}

fn abbreviate(chain: &[u64]) -> String {
    if chain.len() <= 40 {
        return format!("{chain:?}");
    }
    format!(
        "{:?} … {:?} ({} checkpoints)",
        &chain[..20],
        &chain[chain.len() - 10..],
        chain.len()
    )
}

fn audit_effects(soak_dir: &Path, a: &mut Audit) {
    let sink = match EffectSink::new(&soak_dir.join("effects")) {
        Ok(s) => s,
        Err(e) => {
            a.violations.push(format!("effect sink unreadable: {e}"));
            return;
        }
    };
    let logs = match sink.logs() {
        Ok(l) => l,
        Err(e) => {
            a.violations.push(format!("effect logs unreadable: {e}"));
            return;
        }
    };
    for (run, entries, torn) in logs {
        a.torn_log_lines += torn as u64;
        let mut highest = 0u64;
        let mut per_step: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for e in entries {
            match e {
                SinkEntry::Observe { fence, .. } => highest = highest.max(fence),
                SinkEntry::Accepted {
                    fence,
                    step,
                    holder,
                    ..
                } => {
                    a.effects_accepted += 1;
                    if fence < highest {
                        a.effects_from_superseded_fence += 1;
                        a.violations.push(format!(
                            "{run}: effect of step {step} accepted from {holder} under fence {fence} after fence {highest} had been seen (a zombie's effect got through)"
                        ));
                    }
                    highest = highest.max(fence);
                    per_step.entry(step).or_default().push(fence);
                }
                SinkEntry::Refused { .. } => a.effects_refused += 1,
            }
        }
        for (step, fences) in per_step {
            if fences.len() > 1 {
                a.effects_reexecuted.push(ReExecution {
                    run: run.clone(),
                    step,
                    times: fences.len() as u64,
                    fences,
                });
            }
        }
    }
}

fn audit_fences(acks: &[Value], a: &mut Audit) {
    let mut holders: HashMap<(String, u64), HashSet<String>> = HashMap::new();
    for v in acks.iter().filter(|v| v["k"] == "fence") {
        let (Some(run), Some(f), Some(h)) =
            (v["run"].as_str(), v["fence"].as_u64(), v["holder"].as_str())
        else {
            continue;
        };
        holders
            .entry((run.to_string(), f))
            .or_default()
            .insert(h.to_string());
    }
    a.fences_observed = holders.len() as u64;
    for ((run, f), hs) in holders {
        if hs.len() > 1 {
            a.fences_issued_twice += 1;
            a.violations.push(format!(
                "{run}: fence {f} was held by {} workers at once: {hs:?}",
                hs.len()
            ));
        }
    }
}
