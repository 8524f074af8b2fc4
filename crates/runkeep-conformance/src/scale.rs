//! Retention at scale: `n` finished runs pruned in bounded batches while a
//! worker keeps claiming and finishing the active queue. Every backend's
//! `tests/retention_scale.rs` runs it at a size from
//! `RUNKEEP_RETENTION_SCALE_RUNS` (default [`DEFAULT_RUNS`]; the figures in
//! `BENCHMARKS.md` are at 100 000).
//!
//! What it checks (no timing is asserted):
//! - every finished run is deleted, and no active run, nor a run the
//!   worker finished during the prune (not yet due), is;
//! - the worker's `claim_next` and the listing keep answering while the
//!   prune runs: after each batch the prune waits until the worker has
//!   taken one more run (a barrier, not a sleep), so claims interleave with
//!   the batches by construction;
//! - every batch deletes at most its limit and `more` is false only at
//!   the end.
//!
//! What it measures, printed as [`Figures`]: setup and prune time, the
//! resident memory the prune added (peak during it, from `VmHWM` after
//! resetting it through `/proc/self/clear_refs`, minus the resident size
//! before), and the median `claim_next` and listing-page latency before
//! and during the prune.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runkeep::scheduling::RetentionPolicy;
use runkeep::{
    ClaimNextFilter, EnqueueOptions, ListOptions, ManualClock, Outcome, RunScope, RunStatus,
    RunStore, Ttl,
};
use tokio::sync::Notify;

use crate::support::*;

/// The default size (CI).
pub const DEFAULT_RUNS: usize = 2_000;
/// The environment variable that sets the size.
pub const SIZE_VAR: &str = "RUNKEEP_RETENTION_SCALE_RUNS";
/// Finished runs are kept this long.
const KEEP_MS: u64 = 60_000;

/// The size asked for ([`SIZE_VAR`], else [`DEFAULT_RUNS`]).
pub fn size() -> usize {
    std::env::var(SIZE_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RUNS)
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Finished runs pruned.
    pub runs: usize,
    /// Active runs in the queue beside them.
    pub active: usize,
    /// Batch size.
    pub batch: usize,
    /// Batches it took.
    pub batches: usize,
    /// Time to create the runs.
    pub setup: Duration,
    /// Time of the whole prune (every batch, and the waits for the worker).
    pub prune: Duration,
    /// Resident memory before the prune, KiB.
    pub rss_before_kib: u64,
    /// Peak resident memory during the prune, KiB (`None`: not measurable).
    pub peak_during_kib: Option<u64>,
    /// Median `claim_next` latency before the prune.
    pub claim_before: Duration,
    /// Median `claim_next` latency during it.
    pub claim_during: Duration,
    /// Median listing page (100 rows) latency before the prune.
    pub list_before: Duration,
    /// Median listing page latency during it.
    pub list_during: Duration,
    /// Runs the worker claimed during the prune.
    pub claimed_during: u64,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} finished runs (+{} active), batch {}: setup {:.1?}, prune {:.1?} in {} batches ({:.0} runs/s); RSS before {} KiB, peak during {}; claim_next p50 {:.2?} before / {:.2?} during ({} claims during); list page p50 {:.2?} before / {:.2?} during",
            self.runs,
            self.active,
            self.batch,
            self.setup,
            self.prune,
            self.batches,
            self.runs as f64 / self.prune.as_secs_f64().max(1e-9),
            self.rss_before_kib,
            self.peak_during_kib
                .map(|k| format!("{k} KiB (+{} KiB)", k.saturating_sub(self.rss_before_kib)))
                .unwrap_or_else(|| "not measurable".into()),
            self.claim_before,
            self.claim_during,
            self.claimed_during,
            self.list_before,
            self.list_during,
        )
    }
}

fn status_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resets the peak resident size (`VmHWM`) to the current one.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn median(mut v: Vec<Duration>) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[v.len() / 2]
}

fn name(i: usize) -> RunScope {
    run(&format!("f{i:07}"))
}

fn queued(i: usize) -> RunScope {
    run(&format!("q{i:07}"))
}

/// Runs the scenario on `store` (built on `clock`) with `n` finished runs
/// and `n / 20` (at least 50) active ones, pruning `batch` at a time.
pub async fn retention_at_scale(
    store: Arc<dyn RunStore>,
    clock: ManualClock,
    n: usize,
    batch: usize,
) -> Figures {
    clock.set(at(0));
    let active = (n / 20).max(50);
    let started = Instant::now();
    // Finished runs, 16 at a time.
    let mut i = 0;
    while i < n {
        let mut set = tokio::task::JoinSet::new();
        for j in i..(i + 16).min(n) {
            let store = store.clone();
            set.spawn(async move {
                let r = name(j);
                store
                    .enqueue(&r, &checkpoint("first", 0), &EnqueueOptions::default())
                    .await
                    .unwrap_or_else(|e| panic!("enqueue {r}: {e}"));
                let l = take(&store, &r, claim_now("setup", 600_000)).await;
                store
                    .finish(&r, l.fence, &Outcome::completed(None))
                    .await
                    .unwrap_or_else(|e| panic!("finish {r}: {e}"));
            });
        }
        while let Some(r) = set.join_next().await {
            r.expect("setup task");
        }
        i += 16;
    }
    for j in 0..active {
        let r = queued(j);
        store
            .enqueue(&r, &checkpoint("first", 0), &EnqueueOptions::default())
            .await
            .unwrap_or_else(|e| panic!("enqueue {r}: {e}"));
    }
    let setup = started.elapsed();
    clock.advance(KEEP_MS as i64);

    // Before: claims (finished at once) and listing pages.
    let sample = 20.min(active / 4);
    let mut claim_before = Vec::new();
    for _ in 0..sample {
        let t = Instant::now();
        let got = next_and_finish(&store).await;
        claim_before.push(t.elapsed());
        assert!(got, "the queue ran dry before the prune");
    }
    let mut list_before = Vec::new();
    for _ in 0..sample {
        let t = Instant::now();
        store
            .list_runs(&listing(), &ListOptions::default())
            .await
            .expect("list");
        list_before.push(t.elapsed());
    }

    // During: a worker claims and finishes, and lists a page, in a loop.
    let stop = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(AtomicU64::new(0));
    let progressed = Arc::new(Notify::new());
    let worker = {
        let (store, stop, claimed, progressed) = (
            store.clone(),
            stop.clone(),
            claimed.clone(),
            progressed.clone(),
        );
        tokio::spawn(async move {
            let mut claims = Vec::new();
            let mut lists = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                if !next_and_finish(&store).await {
                    break;
                }
                claims.push(t.elapsed());
                let t = Instant::now();
                store
                    .list_runs(&listing(), &ListOptions::default())
                    .await
                    .expect("list during the prune");
                lists.push(t.elapsed());
                claimed.fetch_add(1, Ordering::SeqCst);
                progressed.notify_one();
            }
            (claims, lists)
        })
    };
    let rss_before_kib = status_kib("VmRSS:").unwrap_or(0);
    let measurable = reset_peak();
    let policy = RetentionPolicy::keep_for(Ttl::from_millis(KEEP_MS).expect("ttl"));
    let t = Instant::now();
    let mut deleted = 0usize;
    let mut batches = 0usize;
    loop {
        let report = store
            .prune_finished(&listing(), &policy, None, batch)
            .await
            .expect("prune batch");
        batches += 1;
        assert!(
            report.deleted.len() <= batch,
            "a batch of {batch} deleted {}",
            report.deleted.len()
        );
        deleted += report.deleted.len();
        if !report.more {
            break;
        }
        // The barrier: one more claim before the next batch (unless the
        // queue is empty).
        let before = claimed.load(Ordering::SeqCst);
        while claimed.load(Ordering::SeqCst) == before && !worker.is_finished() {
            let _ = tokio::time::timeout(Duration::from_secs(1), progressed.notified()).await;
        }
    }
    let prune = t.elapsed();
    let peak_during_kib = measurable.then(|| status_kib("VmHWM:")).flatten();
    stop.store(true, Ordering::SeqCst);
    let (claims, lists) = worker.await.expect("worker");
    let figures = Figures {
        runs: n,
        active,
        batch,
        batches,
        setup,
        prune,
        rss_before_kib,
        peak_during_kib,
        claim_before: median(claim_before),
        claim_during: median(claims),
        list_before: median(list_before),
        list_during: median(lists),
        claimed_during: claimed.load(Ordering::SeqCst),
    };
    eprintln!("retention at scale: {figures}");
    assert_eq!(
        deleted, n,
        "every finished run past its retention is deleted"
    );
    // Nothing else went: the queue's runs are all there, finished by the
    // worker or still active (every page, not a capped walk).
    let mut rows = Vec::new();
    let mut options = ListOptions {
        limit: Some(runkeep::listing::MAX_LIMIT),
        ..ListOptions::default()
    };
    loop {
        let page = store.list_runs(&listing(), &options).await.expect("list");
        rows.extend(page.entries);
        match page.cursor {
            Some(c) => options.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        rows.len(),
        active,
        "the active queue (and the runs finished during the prune) must survive"
    );
    assert!(rows.iter().all(|r| r.scope.run_id.as_str().contains("_q")));
    assert!(
        rows.iter()
            .filter(|r| r.status == RunStatus::Active)
            .count()
            + rows
                .iter()
                .filter(|r| r.status == RunStatus::Completed)
                .count()
            == active
    );
    figures
}

/// Claims the next run of the queue and finishes it; `false` when the
/// queue is empty.
async fn next_and_finish(store: &Arc<dyn RunStore>) -> bool {
    let Some((s, l)) = store
        .claim_next(
            &listing(),
            &ClaimNextFilter::default(),
            &claim_now("drain", 60_000),
        )
        .await
        .expect("claim_next")
    else {
        return false;
    };
    store
        .finish(&s, l.fence, &Outcome::completed(None))
        .await
        .expect("finish");
    true
}
