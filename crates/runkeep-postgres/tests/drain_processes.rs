//! Eight OS processes drain one queue on PostgreSQL through `claim_next` →
//! `commit_step` → a last `commit_step` carrying the finish, while some of
//! them are SIGKILLed mid-run (after a step's events are committed, before
//! the finishing step) and replaced. Then the tables are read back and the
//! test proves: every run finished exactly once, no two holders wrote under
//! one fence, and no write under a superseded fence was accepted.
//!
//! Two more workers stop at a pause point (after their step 1) until the
//! run was taken over and finished by another worker, then try a step and
//! the finish under their stale fence: zombies, which the store must refuse.
//!
//! The workers are this test binary re-entered ([`WORKER_TEST`] with
//! [`WORKER_ENV`] set); each reports every fence it won (`won run fence
//! expires_at`) on stdout, flushed line by line, so the parent knows every
//! (run, fence) → holder even for a process that was killed.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions,
    Error, EvidenceStore, Holder, ListOptions, ListingScope, NewEvent, Outcome, RunScope,
    RunStatus, Step, Timestamp, Ttl,
};
use runkeep_postgres::PgStore;
use serde_json::{json, Map, Value};

const WORKER_ENV: &str = "RUNKEEP_PG_DRAIN_WORKER";
const WORKER_TEST: &str = "worker_process_entry";
/// Runs enqueued: a drain of 2 000 runs across killed and fresh workers.
const RUNS: usize = 2_000;
const WORKERS: usize = 8;
/// Workers of the first generation that stop at a kill point, and after
/// how many of their runs.
const KILL_AFTER: [usize; 4] = [15, 40, 70, 110];
/// Workers (after those) that pause as zombies, and after how many runs.
const STOP_AFTER: [usize; 2] = [25, 60];
/// Lease TTL: a killed worker's run is taken over this long after its claim.
const TTL_MS: u64 = 1_500;
/// The whole drain must end within this (it takes a few seconds).
const DRAIN_BOUND: Duration = Duration::from_secs(90);

fn tenant_scope() -> ListingScope {
    ListingScope::tenant("tnt_drain".parse().unwrap())
}

fn run(i: usize) -> RunScope {
    RunScope::new(
        "tnt_drain".parse().unwrap(),
        "prj_drain".parse().unwrap(),
        "ses_drain".parse().unwrap(),
        format!("run_{i:05}").parse().unwrap(),
    )
}

fn event(kind: &str, holder: &str, step: u32) -> NewEvent {
    let mut p = Map::new();
    p.insert("holder".into(), json!(holder));
    p.insert("step".into(), json!(step));
    NewEvent::new(kind, p)
}

fn checkpoint(id: &str, holder: &str) -> Checkpoint {
    let mut state = Map::new();
    state.insert("holder".into(), json!(holder));
    Checkpoint::new(
        CheckpointId::new(id).unwrap(),
        Timestamp::from_millis(1_700_000_000_000).unwrap(),
        state,
    )
}

fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@ {line}").unwrap();
    out.flush().unwrap();
}

/// The worker process: drains until no active run is left.
#[test]
fn worker_process_entry() {
    let Ok(name) = std::env::var(WORKER_ENV) else {
        return;
    };
    let url = std::env::var("PG_URL").unwrap();
    let schema = std::env::var("PG_SCHEMA").unwrap();
    let kill_after: Option<usize> = std::env::var("KILL_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let stop_after: Option<usize> = std::env::var("STOP_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = PgStore::connect(&url, common::options(&schema, None))
            .await
            .expect("worker connects");
        let holder = Holder::new(format!("{name}:{}", std::process::id())).unwrap();
        let h = holder.as_str().to_string();
        let ttl = Ttl::from_millis(TTL_MS).unwrap();
        let deadline = Instant::now() + DRAIN_BOUND;
        let mut done = 0usize;
        report("ready");
        while Instant::now() < deadline {
            // No instant: the database's clock judges the claim.
            let claim = ClaimOptions::new(holder.clone(), ttl);
            let taken = match store
                .claim_next(&tenant_scope(), &ClaimNextFilter::default(), &claim)
                .await
            {
                Ok(t) => t,
                Err(e) if e.is_retryable() => continue,
                Err(e) => panic!("claim_next: {e}"),
            };
            let Some((scope, lease)) = taken else {
                // Empty for now: done when no active run is left (a killed
                // worker's run comes back when its lease expires).
                let active = store
                    .list_runs(
                        &tenant_scope(),
                        &ListOptions {
                            status: Some(vec![RunStatus::Active]),
                            limit: Some(1),
                            ..ListOptions::default()
                        },
                    )
                    .await;
                if matches!(&active, Ok(p) if p.entries.is_empty()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let fence = lease.fence;
            report(&format!(
                "won {} {} {}",
                scope.run_id,
                fence,
                lease.expires_at.as_millis()
            ));
            let first = Step {
                events: vec![event("work", &h, 1)],
                ..Step::default()
            };
            match store.commit_step(&scope, fence, &first).await {
                Ok(_) => {}
                Err(Error::FencedOut { .. }) => {
                    report(&format!("fenced {} {fence}", scope.run_id));
                    continue;
                }
                Err(e) => {
                    report(&format!("error {} {fence} {}", scope.run_id, e.kind()));
                    continue;
                }
            }
            done += 1;
            if kill_after == Some(done) {
                // The kill point: step 1 committed, the finish not yet.
                report(&format!("kill-point {} {fence}", scope.run_id));
                let mut line = String::new();
                let _ = std::io::stdin().read_line(&mut line);
                panic!("the parent should have killed this worker at its kill point");
            }
            if stop_after == Some(done) {
                // The pause point: held here (stale) until the run was taken
                // over and finished, then write on as if nothing happened.
                report(&format!("stop-point {} {fence}", scope.run_id));
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).unwrap();
                let late = Step {
                    events: vec![event("late_work", &h, 3)],
                    ..Step::default()
                };
                match store.commit_step(&scope, fence, &late).await {
                    Err(Error::FencedOut { .. }) => {
                        report(&format!("zombie-refused {} {fence}", scope.run_id))
                    }
                    other => report(&format!(
                        "zombie-landed {} {fence} {:?}",
                        scope.run_id,
                        other.map(|_| ()).map_err(|e| e.kind())
                    )),
                }
            }
            let last = Step {
                events: vec![event("finish_step", &h, 2)],
                checkpoint: Some(checkpoint("cp_done", &h)),
                finish: Some(Outcome::completed(Some(json!({ "holder": h })))),
                ..Step::default()
            };
            match store.commit_step(&scope, fence, &last).await {
                Ok(_) => report(&format!("finished {} {fence}", scope.run_id)),
                Err(Error::FencedOut { .. }) => report(&format!("fenced {} {fence}", scope.run_id)),
                Err(e) => report(&format!("error {} {fence} {}", scope.run_id, e.kind())),
            }
        }
        report("exit");
    });
}

struct Proc {
    child: Child,
    name: String,
}

fn spawn(
    name: &str,
    url: &str,
    schema: &str,
    pause: Option<(&str, usize)>,
    tx: &mpsc::Sender<(String, String)>,
) -> Proc {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([WORKER_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(WORKER_ENV, name)
        .env("PG_URL", url)
        .env("PG_SCHEMA", schema)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some((var, k)) = pause {
        cmd.env(var, k.to_string());
    }
    let mut child = cmd.spawn().expect("spawn a worker process");
    let out = child.stdout.take().unwrap();
    let tx = tx.clone();
    let n = name.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Some(i) = line.find("@@ ") {
                if tx.send((n.clone(), line[i + 3..].to_string())).is_err() {
                    break;
                }
            }
        }
    });
    Proc {
        child,
        name: name.to_string(),
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_drain_2000_runs_through_kills_and_every_run_finishes_exactly_once() {
    let Some(url) = common::url_or_skip("eight_processes_drain") else {
        return;
    };
    let started = Instant::now();
    let (store, guard) = common::store(&url, "drain", None).await;
    let store = std::sync::Arc::new(store);
    // Enqueue on 8 connections at once.
    let mut tasks = Vec::new();
    for part in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in (part..RUNS).step_by(8) {
                store
                    .enqueue(
                        &run(i),
                        &checkpoint("cp_enqueued", "nobody"),
                        &EnqueueOptions::default(),
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let enqueued_in = started.elapsed();

    let (tx, rx) = mpsc::channel::<(String, String)>();
    let mut procs: HashMap<String, Proc> = HashMap::new();
    for w in 0..WORKERS {
        let name = format!("w{w}");
        let pause = match KILL_AFTER.get(w) {
            Some(k) => Some(("KILL_AFTER", *k)),
            None => STOP_AFTER
                .get(w - KILL_AFTER.len())
                .map(|k| ("STOP_AFTER", *k)),
        };
        procs.insert(name.clone(), spawn(&name, &url, &guard.schema, pause, &tx));
    }
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut killed: Vec<(String, String, u64)> = Vec::new(); // (worker, run, fence)
    let mut stopped: Vec<(String, String, u64)> = Vec::new();
    let mut waiting: Vec<(String, String)> = Vec::new(); // zombies not yet let go
    let raw = common::raw_client(&url, &guard.schema).await;
    let mut exited = BTreeSet::new();
    let mut generation = 0usize;
    let deadline = Instant::now() + DRAIN_BOUND;
    while exited.len() < procs.len() {
        assert!(
            Instant::now() < deadline,
            "the drain did not end within {DRAIN_BOUND:?}; exited {exited:?}, last lines {:?}",
            &lines[lines.len().saturating_sub(20)..]
        );
        // Let a zombie go once its run was taken over and finished.
        let mut still = Vec::new();
        for (who, run_id) in waiting.drain(..) {
            let status: Option<String> = raw
                .query_opt("SELECT status FROM runs WHERE run_id = $1", &[&run_id])
                .await
                .unwrap()
                .map(|r| r.get(0));
            if status.as_deref() == Some("completed") {
                let p = procs.get_mut(&who).unwrap();
                let stdin = p.child.stdin.as_mut().unwrap();
                writeln!(stdin, "go").unwrap();
                stdin.flush().unwrap();
            } else {
                still.push((who, run_id));
            }
        }
        waiting = still;
        let Ok((who, line)) = rx.recv_timeout(Duration::from_millis(100)) else {
            continue;
        };
        if let Some(rest) = line.strip_prefix("kill-point ") {
            let mut it = rest.split(' ');
            let run_id = it.next().unwrap().to_string();
            let fence: u64 = it.next().unwrap().parse().unwrap();
            // SIGKILL it at its kill point, and start a replacement.
            let mut p = procs.remove(&who).unwrap();
            p.child.kill().unwrap();
            p.child.wait().unwrap();
            killed.push((p.name.clone(), run_id, fence));
            generation += 1;
            let name = format!("r{generation}");
            procs.insert(name.clone(), spawn(&name, &url, &guard.schema, None, &tx));
        } else if let Some(rest) = line.strip_prefix("stop-point ") {
            let mut it = rest.split(' ');
            let run_id = it.next().unwrap().to_string();
            let fence: u64 = it.next().unwrap().parse().unwrap();
            stopped.push((who.clone(), run_id.clone(), fence));
            waiting.push((who.clone(), run_id));
        } else if line == "exit" {
            exited.insert(who.clone());
        }
        lines.push((who, line));
    }
    for (_, mut p) in procs.drain() {
        let status = p.child.wait().unwrap();
        assert!(status.success(), "worker {} exited with {status}", p.name);
    }
    let drained_in = started.elapsed() - enqueued_in;
    // Lines a dying worker wrote before the kill are all read by now (the
    // reader threads end at EOF); collect any that came after the loop.
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        lines.push(l);
    }

    // Every (run, fence) won, by whom, and when it was issued (expiry − TTL,
    // on the database's clock).
    let mut won: BTreeMap<(String, u64), Vec<(String, i64)>> = BTreeMap::new();
    let mut finished_reports: BTreeMap<String, usize> = BTreeMap::new();
    let mut fenced_reports = 0usize;
    let mut zombies_refused = 0usize;
    let mut zombies_landed = Vec::new();
    let mut holder_of_worker: HashMap<String, String> = HashMap::new();
    for (who, line) in &lines {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts[0] {
            "won" => {
                let fence: u64 = parts[2].parse().unwrap();
                let expires: i64 = parts[3].parse().unwrap();
                won.entry((parts[1].to_string(), fence))
                    .or_default()
                    .push((who.clone(), expires - TTL_MS as i64));
            }
            "finished" => *finished_reports.entry(parts[1].to_string()).or_default() += 1,
            "fenced" => fenced_reports += 1,
            "zombie-refused" => zombies_refused += 1,
            "zombie-landed" => zombies_landed.push(line.clone()),
            _ => {}
        }
        holder_of_worker.entry(who.clone()).or_default();
    }
    // No fence was ever handed to two holders.
    let doubly_won: Vec<_> = won.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(doubly_won.is_empty(), "fences won twice: {doubly_won:?}");

    // Read the tables back.
    let runs = raw
        .query(
            "SELECT run_id, status, lifecycle, top_kind, top_fence FROM runs ORDER BY run_id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(runs.len(), RUNS, "every enqueued run has its row");
    let mut events_by_run: BTreeMap<String, Vec<(i64, Value)>> = BTreeMap::new();
    for r in raw
        .query(
            "SELECT run_id, seq, body FROM events ORDER BY run_id, seq",
            &[],
        )
        .await
        .unwrap()
    {
        events_by_run
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2)));
    }
    let cps: HashMap<String, Value> = raw
        .query(
            "SELECT run_id, body FROM checkpoints WHERE checkpoint_id = 'cp_done'",
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();

    let mut finished = 0usize;
    let mut taken_over = 0usize;
    let mut events_total = 0usize;
    let mut superseded_effects = 0usize;
    let mut foreign_writes = 0usize;
    let mut decreasing = 0usize;
    for r in &runs {
        let run_id: String = r.get(0);
        let status: String = r.get(1);
        let lifecycle: Value = r.get(2);
        assert_eq!(status, "completed", "run {run_id}: {lifecycle}");
        let ff = lifecycle["finished_fence"]
            .as_u64()
            .or_else(|| lifecycle["finishedFence"].as_u64())
            .unwrap_or_else(|| panic!("run {run_id} has no finished fence: {lifecycle}"));
        // The finish spent its fence: the top is a tombstone above it.
        let kind: Option<i16> = r.get(3);
        let top: Option<i64> = r.get(4);
        assert_eq!((kind, top), (Some(2), Some(ff as i64 + 1)), "run {run_id}");
        // The finisher is the one holder that won the finishing fence.
        let winners = won
            .get(&(run_id.clone(), ff))
            .unwrap_or_else(|| panic!("run {run_id}: finished under fence {ff} nobody won"));
        let finisher = &winners[0].0;
        let result_holder = lifecycle["result"]["holder"].as_str().unwrap_or_default();
        assert!(
            result_holder.starts_with(&format!("{finisher}:")),
            "run {run_id}: finished by {result_holder} under fence {ff} won by {finisher}"
        );
        let cp = &cps[&run_id];
        assert_eq!(cp["fence"].as_u64(), Some(ff), "run {run_id}: {cp}");
        let evs = events_by_run.get(&run_id).cloned().unwrap_or_default();
        events_total += evs.len();
        // Exactly one finishing step landed.
        let finish_steps = evs
            .iter()
            .filter(|(_, b)| b["type"] == "finish_step")
            .count();
        assert_eq!(finish_steps, 1, "run {run_id}: {evs:?}");
        let mut fences_seen = BTreeSet::new();
        let mut last_generation = 0u64;
        for (seq, b) in &evs {
            let g = b["generation"].as_u64().expect("every event is fenced");
            fences_seen.insert(g);
            // In seq order (assigned under the row lock), a generation
            // below an earlier one would be a superseded write accepted.
            if g < last_generation {
                decreasing += 1;
            }
            last_generation = last_generation.max(g);
            // The writer is the one holder that won this fence.
            let Some(w) = won.get(&(run_id.clone(), g)) else {
                panic!("run {run_id} seq {seq}: written under fence {g} nobody won");
            };
            let writer = b["holder"].as_str().unwrap_or_default();
            if !writer.starts_with(&format!("{}:", w[0].0)) {
                foreign_writes += 1;
            }
            // No write under `g` landed after a higher fence was issued
            // (both instants are the database's clock, read under the row
            // lock; equal milliseconds cannot be ordered, so only later
            // counts).
            let ts = b["timestamp"].as_i64().unwrap();
            let superseded_at = won
                .range((run_id.clone(), g + 1)..(run_id.clone(), u64::MAX))
                .map(|(_, v)| v[0].1)
                .min();
            if superseded_at.is_some_and(|at| ts > at) {
                superseded_effects += 1;
            }
        }
        if fences_seen.len() > 1 {
            taken_over += 1;
        }
        finished += 1;
    }
    // Every run a worker was killed in was taken over and finished above
    // the killed fence, keeping the killed holder's step.
    for (_, run_id, fence) in &killed {
        let r = runs
            .iter()
            .find(|r| r.get::<_, String>(0) == *run_id)
            .unwrap();
        let lifecycle: Value = r.get(2);
        let ff = lifecycle["finished_fence"]
            .as_u64()
            .or_else(|| lifecycle["finishedFence"].as_u64())
            .unwrap();
        assert!(
            ff > *fence,
            "run {run_id}: killed at {fence}, finished at {ff}"
        );
        assert!(
            lifecycle["attempts"].as_u64().unwrap_or(0) >= 1,
            "run {run_id}: the takeover counts an attempt: {lifecycle}"
        );
        let evs = &events_by_run[run_id];
        assert!(
            evs.iter()
                .any(|(_, b)| b["generation"].as_u64() == Some(*fence)),
            "run {run_id}: the killed holder's committed step is kept"
        );
    }
    let over_reported: Vec<_> = finished_reports.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        over_reported.is_empty(),
        "finished twice: {over_reported:?}"
    );
    assert_eq!(finished, RUNS);
    assert_eq!(killed.len(), KILL_AFTER.len(), "every kill landed mid-run");
    assert_eq!(
        foreign_writes, 0,
        "writes by a holder under another's fence"
    );
    assert_eq!(
        decreasing, 0,
        "events under a superseded fence after a newer one"
    );
    assert_eq!(superseded_effects, 0, "effects from a superseded fence");
    // Each zombie was refused, and its runs show nothing of its late steps.
    for (_, run_id, fence) in &stopped {
        let evs = &events_by_run[run_id];
        assert!(
            !evs.iter().any(|(_, b)| b["type"] == "late_work"),
            "run {run_id}: a zombie's step under fence {fence} landed: {evs:?}"
        );
    }
    assert!(zombies_landed.is_empty(), "{zombies_landed:?}");
    assert_eq!(
        zombies_refused,
        STOP_AFTER.len(),
        "every zombie tried and was refused"
    );
    eprintln!(
        "DRAIN COUNTS: runs {RUNS}, processes {WORKERS} (+{} replacements), finished exactly once {finished}, \
         fences won {}, fences won twice {}, kills mid-run {}, zombies (paused past takeover) refused {zombies_refused}/{}, runs taken over {taken_over}, \
         fenced-out refusals reported {fenced_reports}, events {events_total}, writes under another holder's fence {foreign_writes}, \
         superseded-fence writes accepted {}, enqueue {:?}, drain {:?}",
        generation,
        won.len(),
        doubly_won.len(),
        killed.len(),
        STOP_AFTER.len(),
        decreasing + superseded_effects,
        enqueued_in,
        drained_in
    );
}
