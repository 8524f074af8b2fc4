//! The concurrency-key race: a fleet drains a queue whose runs carry keys
//! with small limits, and the store's own holdings history
//! ([`CheckpointStore::key_holdings`](runkeep::CheckpointStore::key_holdings))
//! must show no key ever held past its limit, while every run completes.
//! And the fairness figure: with one key holding most of the queue at a
//! small limit, how many drain cycles the other keys' runs wait.
//!
//! The stores are any [`RunStore`]s, one per worker or shared: the memory
//! store, a directory, PostgreSQL with one connection pool per worker, or
//! `HttpStore`s spread over several `runkeep serve` processes in front of
//! one store. The backends' tests call these with their own stores; what
//! is checked is the same everywhere.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runkeep::batch::StepCommit;
use runkeep::scheduling::concurrency::max_held_at_once;
use runkeep::{
    ClaimNextFilter, ClaimOptions, Concurrency, EnqueueOptions, Holder, ListOptions, Outcome,
    RunScope, RunStatus, RunStore, Step, Ttl,
};

use crate::support;

/// The drain's shape.
#[derive(Clone, Debug)]
pub struct KeyRace {
    /// Workers draining at once.
    pub workers: usize,
    /// Keys, `key-00` …; key `i` has limit `1 + i % 3`.
    pub keys: usize,
    /// Runs, spread over the keys in blocks of [`Self::block`] runs in
    /// run-id order (so the fleet's next runs share keys: pressure).
    pub runs: usize,
    /// Consecutive runs of one key.
    pub block: usize,
    /// How long a worker keeps a run before finishing it (at most; each
    /// hold is drawn from 0 up to this, so holdings overlap).
    pub hold: Duration,
}

impl KeyRace {
    /// The race: 16 workers, 20 keys with limits 1–3, 2 000 runs.
    pub fn full() -> Self {
        Self {
            workers: 16,
            keys: 20,
            runs: 2_000,
            block: 8,
            hold: Duration::from_millis(10),
        }
    }

    /// The key of run `i` and its limit.
    pub fn key_of(&self, i: usize) -> Concurrency {
        let k = (i / self.block.max(1)) % self.keys;
        Concurrency::new(format!("key-{k:02}"), 1 + (k % 3) as u32).expect("key")
    }
}

/// What the drain found.
#[derive(Debug, Default)]
pub struct KeyRaceReport {
    /// Runs queued.
    pub runs: usize,
    /// Runs listed as completed afterwards.
    pub completed: usize,
    /// Holdings in the keys' histories.
    pub holdings: usize,
    /// Per key: (limit, most held at once in its history).
    pub per_key: BTreeMap<String, (u32, u32)>,
    /// Keys whose history shows more holdings at once than their limit.
    pub over_limit: Vec<String>,
    /// `claim_next` calls made by the fleet.
    pub claim_calls: u64,
    /// Wall time of the drain.
    pub elapsed: Duration,
}

impl KeyRaceReport {
    /// One line for the test log and the closing note.
    pub fn line(&self, label: &str) -> String {
        let at_limit = self
            .per_key
            .values()
            .filter(|(limit, most)| most == limit)
            .count();
        format!(
            "{label}: {} runs, {} completed, {} holdings in {} keys' histories, over-limit keys {} ({at_limit} keys reached their limit), {} claim_next calls, {:.2} s",
            self.runs,
            self.completed,
            self.holdings,
            self.per_key.len(),
            self.over_limit.len(),
            self.claim_calls,
            self.elapsed.as_secs_f64()
        )
    }

    /// Panics unless every run completed and no key was ever held past its
    /// limit, with the limit reached somewhere (the race was on).
    pub fn assert_clean(&self, label: &str) {
        assert!(
            self.over_limit.is_empty(),
            "{label}: keys held past their limit: {:?} (per key (limit, most): {:?})",
            self.over_limit,
            self.per_key
        );
        assert_eq!(self.completed, self.runs, "{label}: runs not completed");
        assert!(
            self.holdings >= self.runs,
            "{label}: {} holdings for {} runs: the history misses holdings",
            self.holdings,
            self.runs
        );
        assert!(
            self.per_key
                .values()
                .any(|(limit, most)| *limit > 1 && most == limit),
            "{label}: no key with a limit above 1 ever reached it: the drain put no pressure on the keys: {:?}",
            self.per_key
        );
    }
}

fn scope_of(i: usize) -> RunScope {
    support::run(&format!("key-race-{i:05}"))
}

/// Enqueues the runs (on `stores[0]`) and drains them with `spec.workers`
/// workers, worker `w` on `stores[w % stores.len()]`; then reads the
/// histories back.
pub async fn drain_keyed(stores: &[Arc<dyn RunStore>], spec: &KeyRace) -> KeyRaceReport {
    drain_keyed_in_batches(stores, spec, 1).await
}

/// [`drain_keyed`] with each worker claiming up to `batch` runs a call
/// (`claim_next_batch`; 1: `claim_next`), then holding each, and
/// finishing the batch's runs with one group commit (`commit_steps`; 1:
/// `commit_step`).
pub async fn drain_keyed_in_batches(
    stores: &[Arc<dyn RunStore>],
    spec: &KeyRace,
    batch: usize,
) -> KeyRaceReport {
    assert!(!stores.is_empty());
    let first = &stores[0];
    for i in 0..spec.runs {
        first
            .enqueue(
                &scope_of(i),
                &support::checkpoint("start", 0),
                &EnqueueOptions {
                    concurrency: Some(spec.key_of(i)),
                    ..EnqueueOptions::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("enqueue of run {i} failed: {e}"));
    }
    let done = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..spec.workers {
        let store = stores[w % stores.len()].clone();
        let (done, calls, spec) = (done.clone(), calls.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let holder = Holder::new(format!("key-race-worker-{w}")).expect("holder");
            let opts = ClaimOptions::new(holder, Ttl::from_millis(60_000).expect("ttl"));
            let mut seed = w as u64 * 7919 + 1;
            while done.load(Ordering::SeqCst) < spec.runs {
                calls.fetch_add(1, Ordering::Relaxed);
                let (listing, filter) = (support::listing(), ClaimNextFilter::default());
                let taken = if batch == 1 {
                    store
                        .claim_next(&listing, &filter, &opts)
                        .await
                        .map(|got| got.into_iter().collect::<Vec<_>>())
                } else {
                    store
                        .claim_next_batch(&listing, &filter, &opts, batch)
                        .await
                }
                .unwrap_or_else(|e| panic!("claim_next of worker {w} failed: {e}"));
                if taken.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let finish = Step {
                    finish: Some(Outcome::completed(None)),
                    ..Step::default()
                };
                let mut group = Vec::with_capacity(taken.len());
                for (scope, lease) in taken {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let hold = spec.hold.as_micros() as u64;
                    if hold > 0 {
                        tokio::time::sleep(Duration::from_micros((seed >> 33) % hold)).await;
                    }
                    if batch > 1 {
                        group.push(StepCommit {
                            scope,
                            fence: lease.fence,
                            step: finish.clone(),
                        });
                        continue;
                    }
                    store
                        .commit_step(&scope, lease.fence, &finish)
                        .await
                        .unwrap_or_else(|e| panic!("worker {w}'s finish of {scope} failed: {e}"));
                    done.fetch_add(1, Ordering::SeqCst);
                }
                if group.is_empty() {
                    continue;
                }
                // A batch's finishing steps go in one group commit.
                let outcomes = store
                    .commit_steps(&group)
                    .await
                    .unwrap_or_else(|e| panic!("worker {w}'s group commit failed: {e}"));
                for (s, o) in group.iter().zip(outcomes) {
                    o.unwrap_or_else(|e| panic!("worker {w}'s finish of {} failed: {e}", s.scope));
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    let elapsed = started.elapsed();
    let mut report = KeyRaceReport {
        runs: spec.runs,
        claim_calls: calls.load(Ordering::Relaxed),
        elapsed,
        ..KeyRaceReport::default()
    };
    for k in 0..spec.keys {
        let c = spec.key_of(k * spec.block.max(1));
        let history = first
            .key_holdings(&support::listing(), &c.key)
            .await
            .unwrap_or_else(|e| panic!("key_holdings of {} failed: {e}", c.key));
        let (most, _) = max_held_at_once(&history);
        report.holdings += history.len();
        if most > c.limit {
            report.over_limit.push(c.key.clone());
        }
        report.per_key.insert(c.key, (c.limit, most));
    }
    let mut cursor = None;
    loop {
        let page = first
            .list_runs(
                &support::listing(),
                &ListOptions {
                    status: Some(vec![RunStatus::Completed]),
                    limit: Some(1_000),
                    cursor: cursor.take(),
                    ..ListOptions::default()
                },
            )
            .await
            .expect("listing");
        report.completed += page
            .entries
            .iter()
            .filter(|r| {
                r.scope
                    .run_id
                    .as_str()
                    .starts_with("run_conformance_key-race-")
            })
            .count();
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    report
}

/// The fairness figure's shape: one key holds `big_share` of the queue at
/// limit `big_limit`; the other runs are enqueued while the fleet drains.
#[derive(Clone, Debug)]
pub struct Fairness {
    /// Workers.
    pub workers: usize,
    /// Runs of the big key, queued before the drain starts (first in order).
    pub big_runs: usize,
    /// Its limit.
    pub big_limit: u32,
    /// Runs of the other keys (19 keys, limits 1–3), enqueued one by one
    /// during the drain: each after the fleet made a drain cycle of calls
    /// (one per worker) since the previous one, and at least `hold / 2`
    /// later. Arrivals paced in cycles keep the figure a latency: a burst
    /// faster than the fleet claims would measure its throughput instead
    /// (20 runs arriving within two cycles wait about 20 / 6 cycles for the
    /// six free workers on any store), and a slow store or a loaded
    /// machine (longer calls) would see denser arrivals than a fast one.
    pub other_runs: usize,
    /// How long a worker keeps a run.
    pub hold: Duration,
}

/// What the fairness drain measured for the other keys' runs: from each
/// one's enqueue to its claim, in drain cycles (one cycle = one
/// `claim_next` call per worker, counted over the whole fleet): the calls
/// the fleet started after the enqueue returned, up to and including the
/// call that claimed the run, divided by the workers (0 for a run claimed
/// by a call that started before its enqueue returned).
#[derive(Debug, Default)]
pub struct FairnessReport {
    /// Waits in drain cycles, sorted.
    pub cycles: Vec<f64>,
    /// Waits in milliseconds, sorted.
    pub millis: Vec<f64>,
    /// Most big-key runs held at once (from its history).
    pub big_most: u32,
    /// Other keys' runs claimed while big-key runs were still waiting
    /// (none starved behind the big key: all of them, unless the big
    /// queue ran dry first).
    pub claimed_while_big_waited: usize,
}

impl FairnessReport {
    fn pct(v: &[f64], p: f64) -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    }

    /// One line for the log and the closing note.
    pub fn line(&self, label: &str) -> String {
        format!(
            "{label}: {} runs of the other keys waited p50 {:.2} / p99 {:.2} / max {:.2} drain cycles ({:.1} / {:.1} / {:.1} ms), {} of them claimed while big-key runs still waited; the big key was held at most {} at once",
            self.cycles.len(),
            Self::pct(&self.cycles, 0.5),
            Self::pct(&self.cycles, 0.99),
            self.cycles.last().copied().unwrap_or(f64::NAN),
            Self::pct(&self.millis, 0.5),
            Self::pct(&self.millis, 0.99),
            self.millis.last().copied().unwrap_or(f64::NAN),
            self.claimed_while_big_waited,
            self.big_most
        )
    }

    /// The median wait in drain cycles.
    pub fn median_cycles(&self) -> f64 {
        Self::pct(&self.cycles, 0.5)
    }

    /// The largest wait in drain cycles.
    pub fn max_cycles(&self) -> f64 {
        self.cycles.last().copied().unwrap_or(0.0)
    }
}

/// Runs the fairness drain on `stores` (as [`drain_keyed`]).
pub async fn fairness(stores: &[Arc<dyn RunStore>], spec: &Fairness) -> FairnessReport {
    let first = stores[0].clone();
    let big = Concurrency::new("big-customer", spec.big_limit).expect("key");
    for i in 0..spec.big_runs {
        first
            .enqueue(
                &support::run(&format!("fair-big-{i:05}")),
                &support::checkpoint("start", 0),
                &EnqueueOptions {
                    concurrency: Some(big.clone()),
                    ..EnqueueOptions::default()
                },
            )
            .await
            .expect("enqueue");
    }
    let total = spec.big_runs + spec.other_runs;
    let big_claimed = Arc::new(AtomicUsize::new(0));
    let while_big_waited = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    // Run name → (calls started so far, instant) when its enqueue
    // returned, and → (calls started when the call that claimed it
    // started, the instant that call returned). Recorded apart and joined
    // at the end: a worker may claim a run before the enqueuer has
    // recorded its return.
    let enqueued: Arc<Mutex<BTreeMap<String, (u64, Instant)>>> = Arc::default();
    let claimed: Arc<Mutex<BTreeMap<String, (u64, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for w in 0..spec.workers {
        let store = stores[w % stores.len()].clone();
        let (big_claimed, while_big_waited) = (big_claimed.clone(), while_big_waited.clone());
        let (done, calls, claimed, spec) =
            (done.clone(), calls.clone(), claimed.clone(), spec.clone());
        tasks.push(tokio::spawn(async move {
            let holder = Holder::new(format!("fair-worker-{w}")).expect("holder");
            let opts = ClaimOptions::new(holder, Ttl::from_millis(60_000).expect("ttl"));
            while done.load(Ordering::SeqCst) < total {
                let now_calls = calls.fetch_add(1, Ordering::SeqCst) + 1;
                let next = store
                    .claim_next(&support::listing(), &ClaimNextFilter::default(), &opts)
                    .await
                    .expect("claim_next");
                let Some((scope, lease)) = next else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let name = scope.run_id.as_str().to_string();
                if name.contains("fair-big-") {
                    big_claimed.fetch_add(1, Ordering::SeqCst);
                } else if big_claimed.load(Ordering::SeqCst) < spec.big_runs {
                    while_big_waited.fetch_add(1, Ordering::SeqCst);
                }
                if name.contains("fair-other-") {
                    claimed
                        .lock()
                        .expect("lock")
                        .insert(name.clone(), (now_calls, Instant::now()));
                }
                tokio::time::sleep(spec.hold).await;
                store
                    .commit_step(
                        &scope,
                        lease.fence,
                        &Step {
                            finish: Some(Outcome::completed(None)),
                            ..Step::default()
                        },
                    )
                    .await
                    .expect("finish");
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    // The other keys' runs arrive during the drain, one per drain cycle
    // (see `Fairness::other_runs`); each one's wait is counted from the
    // moment its enqueue returned (from then on, any claim_next may take
    // it).
    for i in 0..spec.other_runs {
        if i > 0 {
            let from = calls.load(Ordering::SeqCst);
            let paced = Instant::now();
            tokio::time::sleep(spec.hold / 2).await;
            // Bounded: should the fleet stop calling (it cannot while runs
            // remain), the arrivals go on.
            while calls.load(Ordering::SeqCst) < from + spec.workers as u64
                && paced.elapsed() < Duration::from_secs(10)
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let k = 1 + i % 19;
        let scope = support::run(&format!("fair-other-{i:05}"));
        first
            .enqueue(
                &scope,
                &support::checkpoint("start", 0),
                &EnqueueOptions {
                    concurrency: Some(
                        Concurrency::new(format!("small-{k:02}"), 1 + (k % 3) as u32).expect("key"),
                    ),
                    ..EnqueueOptions::default()
                },
            )
            .await
            .expect("enqueue");
        enqueued.lock().expect("lock").insert(
            scope.run_id.as_str().to_string(),
            (calls.load(Ordering::SeqCst), Instant::now()),
        );
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    let (enqueued, claimed) = (
        std::mem::take(&mut *enqueued.lock().expect("lock")),
        std::mem::take(&mut *claimed.lock().expect("lock")),
    );
    let w: Vec<(f64, f64)> = enqueued
        .iter()
        .filter_map(|(name, (at_calls, at))| {
            let (by_call, got) = claimed.get(name)?;
            Some((
                by_call.saturating_sub(*at_calls) as f64 / spec.workers as f64,
                got.saturating_duration_since(*at).as_secs_f64() * 1e3,
            ))
        })
        .collect();
    let mut report = FairnessReport {
        cycles: w.iter().map(|x| x.0).collect(),
        millis: w.iter().map(|x| x.1).collect(),
        big_most: max_held_at_once(
            &first
                .key_holdings(&support::listing(), &big.key)
                .await
                .expect("key_holdings"),
        )
        .0,
        claimed_while_big_waited: while_big_waited.load(Ordering::SeqCst),
    };
    report.cycles.sort_by(f64::total_cmp);
    report.millis.sort_by(f64::total_cmp);
    report
}
