//! The hijack flood: a second principal attacks the run an honest worker is
//! on, under that run's top fence and the next one, while the honest
//! worker drains the queue. Every run must end completed by its honest
//! worker with no foreign event.
//!
//! The stores are any [`RunStore`]s: in the server's tests and the CLI's,
//! `HttpStore`s holding two worker tokens of one tenant, through one or
//! two servers (in process, or two `runkeep serve` processes) in front of
//! one store. The attacker's acts are the ones that need no setup: a
//! finish (the run ends failed "hijacked") and an event append (type
//! `attack`); the forced interleaving of every fenced act is the server's
//! `tests/hijack.rs`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runkeep::{
    ClaimNextFilter, ClaimOptions, EnqueueOptions, Error, Fence, Holder, NewEvent, Outcome,
    RunScope, RunStatus, RunStore, Step, Ttl,
};
use serde_json::Map;

use crate::support;

/// What the flood found.
#[derive(Debug, Default)]
pub struct HijackReport {
    /// Runs queued.
    pub runs: usize,
    /// Runs the honest worker finished with its own step.
    pub finished: usize,
    /// The honest worker's finishing steps that were refused, with why.
    pub refused: Vec<String>,
    /// Runs that did not end completed (run, status, reason).
    pub hijacked: BTreeSet<String>,
    /// Events in the runs that the honest worker did not write.
    pub foreign_events: usize,
    /// Acts the attacker sent.
    pub sent: u64,
    /// Of those, refused `NotYourHolding` (each aimed at the honest
    /// worker's live holding, at its fence: the attack was on).
    pub not_yours: u64,
    /// Of those, accepted.
    pub accepted: u64,
}

impl HijackReport {
    /// One line for the test log and the closing notes.
    pub fn line(&self, label: &str) -> String {
        format!(
            "{label}: {} runs, honest finished {} (refused {}), hijacked {}, foreign events {}; attacker sent {} acts: {} refused not-your-holding, {} accepted",
            self.runs,
            self.finished,
            self.refused.len(),
            self.hijacked.len(),
            self.foreign_events,
            self.sent,
            self.not_yours,
            self.accepted
        )
    }

    /// Panics unless nothing was hijacked and the attack was on.
    pub fn assert_clean(&self, label: &str) {
        assert!(
            self.sent > self.runs as u64,
            "{label}: the attacker hardly attacked"
        );
        assert!(
            self.hijacked.is_empty(),
            "{label}: hijacked: {:#?}",
            self.hijacked
        );
        assert_eq!(self.foreign_events, 0, "{label}: foreign events");
        assert!(self.refused.is_empty(), "{label}: {:#?}", self.refused);
        assert_eq!(self.finished, self.runs, "{label}");
        assert_eq!(self.accepted, 0, "{label}: acts of the attacker accepted");
    }
}

fn claim_opts(holder: &str) -> ClaimOptions {
    ClaimOptions::new(
        Holder::new(holder).expect("holder"),
        Ttl::from_millis(60_000).expect("ttl"),
    )
}

fn event(kind: &str) -> NewEvent {
    NewEvent::new(kind, Map::new())
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    not_yours: AtomicU64,
    accepted: AtomicU64,
}

/// Floods the run the honest worker is on (the first of `runs` not yet
/// finished: the queue drains in that order) under its top fence and the
/// next one, until `stop`.
async fn flood(
    attacker: Arc<dyn RunStore>,
    runs: Arc<Vec<RunScope>>,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) && i < runs.len() {
        let r = &runs[i];
        let Ok(top) = attacker.lease(r, attacker.now()).await else {
            continue;
        };
        let targets: Vec<Fence> = match top {
            // A tombstone above the first fence: finished (or released);
            // on to the next run.
            Some(l) if l.holder.is_empty() && l.fence.get() > 1 => {
                i += 1;
                continue;
            }
            Some(l) => [Some(l.fence), l.fence.next(&r.run_id).ok()]
                .into_iter()
                .flatten()
                .collect(),
            None => vec![Fence::new(1).expect("fence")],
        };
        for f in targets {
            for result in [
                attacker
                    .finish(r, f, &Outcome::failed("hijacked"))
                    .await
                    .map(drop),
                attacker
                    .append_events(r, &[event("attack")], Some(f))
                    .await
                    .map(drop),
            ] {
                counts.sent.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(()) => {
                        counts.accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Error::NotYourHolding { .. }) => {
                        counts.not_yours.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

/// Drains `expected` runs: claim the next, one finishing step.
async fn drain(honest: Arc<dyn RunStore>, expected: usize, report: &mut HijackReport) {
    let mut idle = 0;
    while report.finished + report.refused.len() < expected && idle < 200 {
        let got = honest
            .claim_next(
                &support::listing(),
                &ClaimNextFilter::default(),
                &claim_opts("honest"),
            )
            .await
            .expect("claim_next");
        let Some((r, lease)) = got else {
            idle += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let step = Step {
            events: vec![event("work")],
            finish: Some(Outcome::completed(None)),
            ..Step::default()
        };
        match honest.commit_step(&r, lease.fence, &step).await {
            Ok(_) => report.finished += 1,
            Err(e) => report.refused.push(format!("{}: {e}", r.run_id)),
        }
    }
}

/// Queues `n` runs through `setup` (the kit's tenant, project and session),
/// drains them with `honest` while each of `attackers` floods, and reads
/// every run back through `setup`.
pub async fn flood_and_drain(
    setup: Arc<dyn RunStore>,
    honest: Arc<dyn RunStore>,
    attackers: Vec<Arc<dyn RunStore>>,
    n: usize,
) -> HijackReport {
    let runs: Vec<RunScope> = (0..n).map(|i| support::run(&format!("h{i:04}"))).collect();
    for r in &runs {
        setup
            .enqueue(
                r,
                &support::checkpoint("start", 0),
                &EnqueueOptions::default(),
            )
            .await
            .expect("enqueue");
    }
    let runs = Arc::new(runs);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let tasks: Vec<_> = attackers
        .into_iter()
        .map(|a| tokio::spawn(flood(a, runs.clone(), stop.clone(), counts.clone())))
        .collect();
    let mut report = HijackReport {
        runs: n,
        ..HijackReport::default()
    };
    drain(honest, n, &mut report).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("attacker task");
    }
    for r in runs.iter() {
        let l = setup.lifecycle(r).await.expect("lifecycle");
        if l.status != RunStatus::Completed {
            report
                .hijacked
                .insert(format!("{} {:?} {:?}", r.run_id, l.status, l.reason));
        }
        let events = setup
            .read_events(r, &Default::default())
            .await
            .expect("events")
            .events;
        report.foreign_events += events.iter().filter(|e| e.event_type != "work").count();
    }
    report.sent = counts.sent.load(Ordering::Relaxed);
    report.not_yours = counts.not_yours.load(Ordering::Relaxed);
    report.accepted = counts.accepted.load(Ordering::Relaxed);
    report
}

/// The size of a flood: `RUNKEEP_HIJACK_RUNS`, else `default`.
pub fn runs_wanted(default: usize) -> usize {
    std::env::var("RUNKEEP_HIJACK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
