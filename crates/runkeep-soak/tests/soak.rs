//! The soak engine in process, on the memory store (thread workers): poison
//! runs are dead-lettered at their limit while the others complete, the
//! audit's lifecycle checks are live, and a deliberately broken worker —
//! built only into this test binary, never into the operator's — makes the
//! audit fail.

use std::sync::Arc;
use std::time::Duration;

use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimOptions, EvidenceStore, Holder, ListingScope,
    MemoryStore, NewEvent, Outcome, RunStore, Ttl,
};
use runkeep_soak::audit::{audit, Expect};
use runkeep_soak::sink::EffectSink;
use runkeep_soak::worker::{self, Acks, WorkFn, WorkerConfig, STEP_EVENT};
use runkeep_soak::{drive, seed, Launcher, SoakOptions, SoakReport, Target, Verdict};
use runkeep_worker::{RunHandle, StepOutcome, Worker};
use serde_json::{json, Map};

fn session() -> ListingScope {
    ListingScope::session(
        "tnt_soak".parse().unwrap(),
        "prj_soak".parse().unwrap(),
        "ses_soak".parse().unwrap(),
    )
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn soak(options: SoakOptions, work: WorkFn) -> (SoakReport, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let target = Target {
        store: store.clone(),
        address: "memory:".into(),
        session: session(),
        soak_dir: runkeep_soak::soak_dir(dir.path()),
        backend_chaos: None,
    };
    std::fs::create_dir_all(&target.soak_dir).unwrap();
    runkeep_soak::check_progress(&options).unwrap();
    let (runs, poison) = seed(&*store, &target.session, &options).await.unwrap();
    let report = tokio::time::timeout(
        options.timeout + Duration::from_secs(60),
        drive(
            &options,
            &target,
            &Launcher::Threads(work),
            &runs,
            &poison,
            &|_, _, _| {},
        ),
    )
    .await
    .expect("the soak ends (its own --timeout, then shutdown)")
    .unwrap();
    (report, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_runs_on_thread_workers_are_dead_lettered_at_their_limit_and_the_others_complete() {
    let options = SoakOptions {
        runs: 6,
        steps: 6,
        workers: 3,
        concurrency: 2,
        step_time: ms(10),
        ttl: Ttl::from_millis(300).unwrap(),
        chaos_every: ms(200),
        timeout: Duration::from_secs(120),
        poison: 2,
        max_attempts: 3,
        ..SoakOptions::default()
    };
    let (r, _dir) = soak(options, worker::correct()).await;
    let a = &r.audit;
    assert_eq!(a.violations, Vec::<String>::new(), "{}", r.render());
    assert_eq!(r.verdict(), Verdict::Pass, "{}", r.render());
    assert_eq!(
        (a.runs_completed, a.runs_finished),
        (6, 8),
        "{}",
        r.render()
    );
    assert_eq!(
        (a.poison_dead_lettered, a.runs_dead_lettered),
        (2, 2),
        "{}",
        r.render()
    );
    // Each of the 3 attempts of a poison run ends in a crash — its own
    // poison step or a chaos kill/stall of its worker before it got there
    // (then no poison ack is written) — so the poison step ran at least once
    // per poison run (the dead-lettering above is not chaos alone) and at
    // most once per attempt (a crash never escapes the attempt count). The
    // old `>= 6` assumed no chaos hit a poison attempt: 1 run in 6 failed.
    assert!((2..=6).contains(&a.poison_crashes), "{}", r.render());
    assert!(a.attempts >= 6, "{}", r.render());
    let text = r.render();
    assert!(
        text.contains("2 / 2 dead-lettered after 3 attempts"),
        "{text}"
    );
    assert!(text.contains("8 / 8 (2 dead-lettered)"), "{text}");
}

/// The audit's lifecycle checks can fail: an ordinary run finished as
/// failed, a poison run that completed, and one dead-lettered at the wrong
/// limit are violations; an unfinished poison run is only incomplete.
#[tokio::test]
async fn the_audit_refuses_wrong_lifecycles() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new();
    let options = SoakOptions {
        runs: 2,
        poison: 3,
        steps: 1,
        ..SoakOptions::default()
    };
    let (runs, poison) = seed(&store, &session(), &options).await.unwrap();
    let holder = Holder::new("auditor").unwrap();
    let claim = ClaimOptions::new(holder, Ttl::from_millis(60_000).unwrap());
    let poisoned: Vec<_> = runs
        .iter()
        .filter(|r| poison.contains(r))
        .cloned()
        .collect();
    // An ordinary run failed by its holder, with its one step committed.
    let fence = store
        .claim(&runs[0], &claim)
        .await
        .unwrap()
        .lease()
        .unwrap()
        .fence;
    let mut state = Map::new();
    state.insert("step".into(), json!(1));
    let cp = Checkpoint::new(
        CheckpointId::new("cp_one").unwrap(),
        runkeep::Timestamp::now(),
        state.clone(),
    );
    store
        .commit_step(
            &runs[0],
            fence,
            &runkeep::Step {
                events: vec![NewEvent::new(STEP_EVENT, state)],
                checkpoint: Some(cp),
                finish: Some(Outcome::failed("gave up")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // A poison run that completed.
    let fence = store
        .claim(&poisoned[0], &claim)
        .await
        .unwrap()
        .lease()
        .unwrap()
        .fence;
    store
        .finish(&poisoned[0], fence, &Outcome::completed(None))
        .await
        .unwrap();
    // A poison run dead-lettered at 2 attempts while its limit is 3 (the
    // audit is told 3; the store was given a claim limit of 2).
    for (i, who) in ["a", "b", "c"].iter().enumerate() {
        let at = runkeep::Timestamp::now().offset(10_000_000 * (i as i64 + 1));
        let _ = store
            .claim(
                &poisoned[1],
                &ClaimOptions::new(Holder::new(*who).unwrap(), Ttl::from_millis(1_000).unwrap())
                    .at(at)
                    .with_max_attempts(2),
            )
            .await
            .unwrap();
    }
    assert_eq!(store.lifecycle(&poisoned[1]).await.unwrap().attempts, 2);
    let expect = Expect {
        steps: 1,
        poison: poison.clone(),
        max_attempts: 3,
    };
    let a = audit(&store, &runs, &expect, dir.path()).await;
    let find = |needle: &str| a.violations.iter().any(|v| v.contains(needle));
    assert!(find("finished failed (gave up)"), "{:?}", a.violations);
    assert!(find("poison run finished completed"), "{:?}", a.violations);
    assert!(
        find("poison run dead-lettered after 2 attempts, its limit is 3"),
        "{:?}",
        a.violations
    );
    assert_eq!(a.violations.len(), 3, "{:?}", a.violations);
    assert_eq!(
        a.runs_incomplete.len(),
        2,
        "one ordinary, one poison: {:?}",
        a.runs_incomplete
    );
    assert!(a
        .runs_incomplete
        .iter()
        .any(|r| r.contains("not dead-lettered yet")));
    assert_eq!((a.runs_finished, a.runs_dead_lettered), (3, 1));
}

/// The deliberately broken worker: captures the fence once, ignores
/// cancellation (its loop runs in a detached task the drain cannot stop),
/// and writes around the handle — unfenced store calls and unchecked
/// effects.
fn broken() -> WorkFn {
    Arc::new(|store, listing, cfg, shutdown| {
        Box::pin(async move {
            let sink = EffectSink::new(&cfg.soak_dir.join("effects")).map_err(|e| e.to_string())?;
            let acks = Arc::new(
                Acks::create(&cfg.soak_dir.join("acks"), &cfg.label).map_err(|e| e.to_string())?,
            );
            let worker =
                Worker::new(store, listing, worker::options(&cfg)).map_err(|e| e.to_string())?;
            let cfg = Arc::new(cfg);
            Ok(worker
                .drain(shutdown, move |run, _| {
                    let (cfg, sink, acks) = (cfg.clone(), sink.clone(), acks.clone());
                    async move { broken_step(run, cfg, sink, acks).await }
                })
                .await)
        })
    })
}

async fn broken_step(
    run: RunHandle,
    cfg: Arc<WorkerConfig>,
    sink: EffectSink,
    acks: Arc<Acks>,
) -> Result<StepOutcome, worker::StepError> {
    let (scope, holder, fence) = worker::announce(&run, &sink, &acks)?;
    let store = run.store().clone();
    let now = run.now();
    let detached = tokio::spawn(async move {
        let Ok(Some(latest)) = store.latest_checkpoint(&scope).await else {
            return;
        };
        let mut done = worker::state_step(&latest);
        while done < cfg.steps {
            let next = done + 1;
            let nonce = runkeep::id::random_suffix(10);
            let mut state = Map::new();
            state.insert("step".into(), json!(next));
            state.insert("nonce".into(), json!(nonce));
            let _ = sink.apply(&scope.run_id, fence, next, &holder, false);
            worker::stall_if_asked(&cfg);
            tokio::time::sleep(cfg.step_time).await;
            let _ = store
                .append_events(&scope, &[NewEvent::new(STEP_EVENT, state.clone())], None)
                .await;
            let Ok(id) = CheckpointId::new(format!("cp_{nonce}")) else {
                return;
            };
            let mut cp = Checkpoint::new(id, now, state);
            cp.run_created_at = latest.run_created_at;
            let _ = store.write_checkpoint(&scope, &cp, None).await;
            done = next;
        }
    });
    let _ = detached.await;
    Ok(StepOutcome::Finished)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_worker_that_ignores_cancellation_makes_the_audit_fail() {
    let options = SoakOptions {
        runs: 6,
        steps: 15,
        workers: 3,
        concurrency: 1,
        step_time: ms(20),
        ttl: Ttl::from_millis(300).unwrap(),
        chaos_every: ms(150),
        stall_only: true,
        timeout: Duration::from_secs(120),
        ..SoakOptions::default()
    };
    let (r, _dir) = soak(options, broken()).await;
    assert!(
        !r.audit.violations.is_empty(),
        "the audit did not catch broken workers: {}",
        r.render()
    );
    assert_eq!(r.verdict(), Verdict::Fail);
}

/// A raising run counts only when it was dead-lettered at its limit with
/// its step's error on record: one dead-lettered by failed attempts
/// counts, one dead-lettered by takeovers alone (no error kept) is a
/// violation, one still active is incomplete.
#[tokio::test]
async fn the_audit_wants_a_raising_runs_errors_on_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new();
    let options = SoakOptions {
        runs: 1,
        poison_raise: 3,
        steps: 1,
        max_attempts: 2,
        ..SoakOptions::default()
    };
    let (runs, poison) = seed(&store, &session(), &options).await.unwrap();
    let raising: Vec<_> = runs
        .iter()
        .filter(|r| poison.contains(r))
        .cloned()
        .collect();
    assert_eq!(raising.len(), 3);
    let claim = |who: &str, at: i64| {
        ClaimOptions::new(Holder::new(who).unwrap(), Ttl::from_millis(1_000).unwrap())
            .at(runkeep::Timestamp::now().offset(at))
    };
    // Failed twice with the step's error: dead-lettered, errors kept.
    for n in 0..2 {
        let fence = store
            .claim(&raising[0], &claim("w", 10_000_000 * (n + 1)))
            .await
            .unwrap()
            .lease()
            .unwrap()
            .fence;
        store
            .fail_attempt(
                &raising[0],
                fence,
                &runkeep::AttemptError::new("error", runkeep_soak::worker::RAISED),
                None,
            )
            .await
            .unwrap();
    }
    // Lost twice by takeovers only: dead-lettered with no error.
    for (i, who) in ["a", "b", "c"].iter().enumerate() {
        let _ = store
            .claim(&raising[1], &claim(who, 10_000_000 * (i as i64 + 1)))
            .await
            .unwrap();
    }
    let expect = Expect {
        steps: 1,
        poison: poison.clone(),
        max_attempts: 2,
    };
    let a = audit(&store, &runs, &expect, dir.path()).await;
    assert_eq!(a.raise_dead_lettered, 1, "{a:?}");
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    assert!(
        a.violations[0].contains("without its step's error on record"),
        "{:?}",
        a.violations
    );
    assert!(
        a.runs_incomplete
            .iter()
            .any(|r| r.contains(raising[2].run_id.as_str())),
        "{:?}",
        a.runs_incomplete
    );
}

/// Acknowledged writes the store does not hold are counted as lost (and
/// each is a violation): an acknowledged event whose seq holds another
/// step's nonce (what a failover to a standby that missed the commit
/// leaves, once the step is redone) and an acknowledged checkpoint that is
/// not there. The ones the store holds are not.
#[tokio::test]
async fn acknowledged_writes_the_store_lacks_are_counted_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::new();
    let options = SoakOptions {
        runs: 1,
        steps: 2,
        ..SoakOptions::default()
    };
    let (runs, poison) = seed(&store, &session(), &options).await.unwrap();
    let holder = Holder::new("auditor").unwrap();
    let claim = ClaimOptions::new(holder, Ttl::from_millis(60_000).unwrap());
    let fence = store
        .claim(&runs[0], &claim)
        .await
        .unwrap()
        .lease()
        .unwrap()
        .fence;
    let mut state = Map::new();
    state.insert("step".into(), json!(1));
    state.insert("nonce".into(), json!("redone"));
    let receipt = store
        .commit_step(
            &runs[0],
            fence,
            &runkeep::Step {
                events: vec![NewEvent::new(STEP_EVENT, state.clone())],
                checkpoint: Some(Checkpoint::new(
                    CheckpointId::new("cp_redone").unwrap(),
                    runkeep::Timestamp::now(),
                    state,
                )),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let seq = receipt.events[0].seq;
    let acks = Acks::create(&dir.path().join("acks"), "w0").unwrap();
    let run = worker::run_key(&runs[0]);
    // Held: the redone step's own acknowledgements.
    acks.log(json!({"k": "event", "run": run, "seq": seq, "nonce": "redone"}));
    acks.log(json!({"k": "cp", "run": run, "id": "cp_redone", "step": 1}));
    // Lost: the first holder's acknowledged step, gone with the primary.
    acks.log(json!({"k": "event", "run": run, "seq": seq, "nonce": "acked_then_lost"}));
    acks.log(json!({"k": "cp", "run": run, "id": "cp_acked_then_lost", "step": 1}));
    let expect = Expect {
        steps: 2,
        poison,
        max_attempts: 3,
    };
    let a = audit(&store, &runs, &expect, dir.path()).await;
    assert_eq!(a.acks_checked, 4, "{a:?}");
    assert_eq!(a.acks_lost, 2, "{:?}", a.violations);
    assert_eq!(a.violations.len(), 2, "{:?}", a.violations);
}

/// The CLI spreads workers over several servers by their index: every
/// label the engine makes reads back as its number (a label read as a
/// plain number once put every worker on the first server).
#[test]
fn a_workers_label_reads_back_as_its_index() {
    for n in [0, 1, 2, 3, 7, 10, 123] {
        let cfg = WorkerConfig::process(
            std::path::PathBuf::from("/nonexistent"),
            1,
            Ttl::from_millis(1000).unwrap(),
            ms(10),
            1,
            worker::label(n),
        );
        assert_eq!(cfg.index(), Some(n), "{}", cfg.label);
    }
    let odd = WorkerConfig::process(
        std::path::PathBuf::from("/nonexistent"),
        1,
        Ttl::from_millis(1000).unwrap(),
        ms(10),
        1,
        "seven".into(),
    );
    assert_eq!(odd.index(), None);
}
