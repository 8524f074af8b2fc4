//! Retention at scale on PostgreSQL (`runkeep_conformance::scale`):
//! `RUNKEEP_RETENTION_SCALE_RUNS` finished runs (default 2 000) in a fresh
//! schema.

mod common;

use std::sync::Arc;

use runkeep_conformance::{scale, support};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prunes_finished_runs_at_scale_while_the_queue_drains() {
    let Some(url) = common::url_or_skip("prunes_finished_runs_at_scale_while_the_queue_drains")
    else {
        return;
    };
    let clock = support::store_clock();
    let (store, _guard) = common::store(&url, "retscale", Some(clock.clone())).await;
    let figures = scale::retention_at_scale(Arc::new(store), clock, scale::size(), 1000).await;
    eprintln!("postgres: {figures}");
}

/// The sessions of [`figure_prune_duty_cycle_side_by_side`]'s phases.
fn duty_session(phase: usize) -> runkeep::SessionId {
    runkeep::SessionId::new(format!("ses_duty_{phase}")).expect("session")
}

fn duty_run(phase: usize, name: &str) -> runkeep::RunScope {
    runkeep::RunScope::new(
        support::tenant(),
        support::project(),
        duty_session(phase),
        runkeep::RunId::new(name).expect("run"),
    )
}

fn pct(v: &mut [std::time::Duration], p: usize) -> std::time::Duration {
    if v.is_empty() {
        return std::time::Duration::ZERO;
    }
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// What a worker measured: `claim_next` + release, and a listing page.
#[derive(Default)]
struct Worked {
    claims: Vec<std::time::Duration>,
    lists: Vec<std::time::Duration>,
}

impl Worked {
    fn line(&mut self) -> String {
        format!(
            "claim p50 {:.2?} p90 {:.2?}, list p50 {:.2?} p90 {:.2?} ({} cycles)",
            pct(&mut self.claims, 50),
            pct(&mut self.claims, 90),
            pct(&mut self.lists, 50),
            pct(&mut self.lists, 90),
            self.claims.len()
        )
    }
}

/// One worker cycle on `phase`'s session: `claim_next` + release (the run
/// stays queued), then the session's first listing page.
async fn duty_cycle_once(store: &runkeep_postgres::PgStore, phase: usize, w: &mut Worked) {
    use runkeep::{CheckpointStore, ClaimNextFilter, ListOptions, ListingScope};
    let listing = ListingScope::session(support::tenant(), support::project(), duty_session(phase));
    let t = std::time::Instant::now();
    let (s, l) = store
        .claim_next(
            &listing,
            &ClaimNextFilter::default(),
            &support::claim_now("w", 60_000),
        )
        .await
        .expect("claim_next")
        .expect("the queue is never empty");
    assert!(store.release(&s, l.fence).await.expect("release"));
    w.claims.push(t.elapsed());
    let t = std::time::Instant::now();
    store
        .list_runs(&listing, &ListOptions::default())
        .await
        .expect("list");
    w.lists.push(t.elapsed());
}

/// A figure (printed; skipped unless `RUNKEEP_RETENTION_DUTY_RUNS` is
/// set): how much a prune slows a worker's `claim_next` + release and its
/// listing page, with the batches back to back and with the periodic
/// prune's duty cycle (`PruneDuty`: a pause after each batch of
/// `took × (1 − d) / d`; without the server's fixed `--retain-pause`),
/// side by side in one process on one schema. Each phase has a session of
/// its own with N finished runs (due) and N/20 queued; the worker cycles
/// alone first (the "before" figures), then while the phase's prune runs.
/// Asserted: every finished run of the phase deleted, its queue kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figure_prune_duty_cycle_side_by_side() {
    use runkeep::scheduling::RetentionPolicy;
    use runkeep::{CheckpointStore, EnqueueOptions, ListingScope, Outcome, Ttl};
    let Some(url) = common::url_or_skip("figure_prune_duty_cycle_side_by_side") else {
        return;
    };
    let Some(n) = std::env::var("RUNKEEP_RETENTION_DUTY_RUNS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        eprintln!(
            "SKIPPED figure_prune_duty_cycle_side_by_side: RUNKEEP_RETENTION_DUTY_RUNS is not set"
        );
        return;
    };
    let batch: usize = std::env::var("RUNKEEP_RETENTION_DUTY_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    // (label, duty): 1.0 is back to back; the last repeats the first (drift).
    let phases: Vec<(&str, f64)> = vec![
        ("back to back", 1.0),
        ("duty 0.5", 0.5),
        ("duty 0.25", 0.25),
        ("back to back (again)", 1.0),
    ];
    let clock = support::store_clock();
    let (store, _guard) = common::store(&url, "retduty", Some(clock.clone())).await;
    let store = Arc::new(store);
    let active = (n / 20).max(50);
    let started = std::time::Instant::now();
    for p in 0..phases.len() {
        let mut i = 0;
        while i < n {
            let mut set = tokio::task::JoinSet::new();
            for j in i..(i + 16).min(n) {
                let store = store.clone();
                set.spawn(async move {
                    let r = duty_run(p, &format!("f{j:07}"));
                    store
                        .enqueue(
                            &r,
                            &support::checkpoint("first", 0),
                            &EnqueueOptions::default(),
                        )
                        .await
                        .expect("enqueue");
                    let l = match store.claim(&r, &support::claim_now("setup", 600_000)).await {
                        Ok(runkeep::ClaimOutcome::Acquired(l)) => l,
                        other => panic!("claim {r}: {other:?}"),
                    };
                    store
                        .finish(&r, l.fence, &Outcome::completed(None))
                        .await
                        .expect("finish");
                });
            }
            while let Some(r) = set.join_next().await {
                r.expect("setup task");
            }
            i += 16;
        }
        for j in 0..active {
            store
                .enqueue(
                    &duty_run(p, &format!("q{j:07}")),
                    &support::checkpoint("first", 0),
                    &EnqueueOptions::default(),
                )
                .await
                .expect("enqueue");
        }
    }
    eprintln!(
        "duty figure: setup of {} phases × ({n} finished + {active} queued) took {:.1?}",
        phases.len(),
        started.elapsed()
    );
    clock.advance(120_000);
    let policy = RetentionPolicy::keep_for(Ttl::from_millis(60_000).expect("ttl"));
    for (p, (label, duty)) in phases.iter().enumerate() {
        let mut before = Worked::default();
        for _ in 0..40 {
            duty_cycle_once(&store, p, &mut before).await;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker = {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut w = Worked::default();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    duty_cycle_once(&store, p, &mut w).await;
                }
                w
            })
        };
        let listing = ListingScope::session(support::tenant(), support::project(), duty_session(p));
        let t = std::time::Instant::now();
        let (mut deleted, mut batches, mut busy) = (0usize, 0usize, std::time::Duration::ZERO);
        loop {
            let b = std::time::Instant::now();
            let report = store
                .prune_finished(&listing, &policy, None, batch)
                .await
                .expect("prune batch");
            let took = b.elapsed();
            busy += took;
            batches += 1;
            deleted += report.deleted.len();
            if !report.more {
                break;
            }
            // The periodic prune's rule (`runkeep serve --retain-duty`).
            let pause = runkeep::scheduling::PruneDuty::new(*duty)
                .expect("duty")
                .pause_after(took);
            tokio::time::sleep(pause).await;
        }
        let wall = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut during = worker.await.expect("worker");
        // After the prune, the worker alone again: what is left once the
        // prune's CPU is gone (its deleted rows are not vacuumed yet).
        let mut after = Worked::default();
        for _ in 0..40 {
            duty_cycle_once(&store, p, &mut after).await;
        }
        let ratio = |d: &[std::time::Duration], b: &[std::time::Duration]| {
            let (mut d, mut b) = (d.to_vec(), b.to_vec());
            pct(&mut d, 50).as_secs_f64() / pct(&mut b, 50).as_secs_f64().max(1e-9)
        };
        eprintln!(
            "duty figure, {label} (batch {batch}): prune {wall:.2?} wall, {busy:.2?} in {batches} batches; claim p50 during/before {:.2}×, list p50 during/before {:.2}×, list p50 after/before {:.2}×\n  before: {}\n  during: {}\n  after:  {}",
            ratio(&during.claims, &before.claims),
            ratio(&during.lists, &before.lists),
            ratio(&after.lists, &before.lists),
            before.line(),
            during.line(),
            after.line(),
        );
        assert_eq!(deleted, n, "{label}: every finished run is deleted");
        // Every page: at 100 000 finished runs the queue (5 000) is more
        // than one page of the listing's largest.
        let (mut left, mut cursor) = (0, None);
        loop {
            let page = store
                .list_runs(
                    &listing,
                    &runkeep::ListOptions {
                        limit: Some(runkeep::listing::MAX_LIMIT),
                        cursor: cursor.take(),
                        ..runkeep::ListOptions::default()
                    },
                )
                .await
                .expect("list");
            left += page.entries.len();
            match page.cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(left, active, "{label}: the queue is kept");
    }
}
