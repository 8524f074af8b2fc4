//! The store operations `runkeep-bench` times, through the public
//! [`RunStore`] contract only (the same calls a worker makes), on any
//! backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runkeep::{
    Checkpoint, CheckpointId, ClaimNextFilter, ClaimOptions, ClaimOutcome, Concurrency,
    EnqueueOptions, Fence, Holder, ListOptions, ListingScope, NewEvent, NextClaim, Outcome,
    Priority, ProjectId, ReadEventsOptions, RunId, RunScope, RunStatus, RunStore, SessionId, Step,
    StepCommit, TenantId, Ttl, WatchTopic,
};
use serde_json::{json, Map, Value};

use crate::stats::{sequential, Sample};

/// An error as text, with what was being done.
pub trait Context<T> {
    /// `what: error`.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Checkpoint ids a run's writes rotate among (so a long measurement keeps
/// the run bounded: writes past the 64th replace a checkpoint).
pub const ROTATE: u64 = 64;

/// Events per batched append.
pub const BATCH: usize = 100;

/// Rows per listing page.
pub const PAGE: usize = 50;

/// Events a catch-up read returns (the tail of the run).
pub const CATCH_UP: u64 = 100;

/// One backend as the bench drives it.
#[derive(Clone, Debug)]
pub struct Target {
    /// The store.
    pub store: Arc<dyn RunStore>,
    /// The tenant every bench run lives in.
    pub tenant: TenantId,
    /// The project every bench run lives in.
    pub project: ProjectId,
    /// Enqueues at once while preparing (not timed).
    pub fill_concurrency: usize,
}

static SESSIONS: AtomicU64 = AtomicU64::new(0);

/// A session id no other measurement of this process uses.
pub fn fresh_session() -> SessionId {
    let n = SESSIONS.fetch_add(1, Ordering::Relaxed);
    SessionId::new(format!("s{n:05}")).expect("a valid session id")
}

impl Target {
    /// The tenant and project the bench uses.
    pub fn ids() -> (TenantId, ProjectId) {
        (
            TenantId::new("bench").expect("a valid tenant id"),
            ProjectId::new("bench").expect("a valid project id"),
        )
    }

    /// A session as a listing scope.
    pub fn listing(&self, session: &SessionId) -> ListingScope {
        ListingScope::session(self.tenant.clone(), self.project.clone(), session.clone())
    }

    /// A run of `session`.
    pub fn run(&self, session: &SessionId, name: &str) -> RunScope {
        RunScope::new(
            self.tenant.clone(),
            self.project.clone(),
            session.clone(),
            RunId::new(name).expect("a valid run id"),
        )
    }

    fn checkpoint(&self, id: &str, state: Map<String, Value>) -> Checkpoint {
        Checkpoint::new(
            CheckpointId::new(id).expect("a valid checkpoint id"),
            self.store.now(),
            state,
        )
    }

    /// A run's first checkpoint: its input (~100 B).
    pub fn input(&self) -> Checkpoint {
        let mut state = Map::new();
        state.insert(
            "input".into(),
            json!({"task": "summarise the ticket", "ticket": 4242}),
        );
        self.checkpoint("cp_input", state)
    }

    /// A step's checkpoint as an agent loop writes it (~300 B of JSON:
    /// iteration, a message, token usage, cost, guard state).
    pub fn step_checkpoint(&self, id: &str) -> Checkpoint {
        let mut state = Map::new();
        state.insert("iteration".into(), json!(1));
        state.insert(
            "messages".into(),
            json!([{"role": "user", "content": "summarise the ticket"}]),
        );
        state.insert(
            "tokenUsage".into(),
            json!({"promptTokens": 812, "completionTokens": 96, "totalTokens": 908, "cachedTokens": 0}),
        );
        state.insert(
            "costInfo".into(),
            json!({"totalCost": 0.0031, "cacheDiscount": 0, "unpricedTokens": 0}),
        );
        state.insert(
            "guardState".into(),
            json!({"iterationCount": 1, "elapsedMs": 1200}),
        );
        self.checkpoint(id, state)
    }

    /// A checkpoint whose JSON is about `bytes` long.
    pub fn sized_checkpoint(&self, id: &str, bytes: usize) -> Checkpoint {
        let mut state = Map::new();
        state.insert("blob".into(), Value::String("x".repeat(bytes)));
        self.checkpoint(id, state)
    }

    /// Enqueues `names` in `session` (not timed), `fill_concurrency` at once.
    pub async fn enqueue_all(&self, session: &SessionId, names: Vec<String>) -> Result<(), String> {
        self.enqueue_all_with(session, names, |_| EnqueueOptions::default())
            .await
    }

    /// Enqueues the runs named, run `i` with `options(i)`, in lanes.
    pub async fn enqueue_all_with(
        &self,
        session: &SessionId,
        names: Vec<String>,
        options: impl Fn(usize) -> EnqueueOptions + Send + Sync + 'static,
    ) -> Result<(), String> {
        let options = Arc::new(options);
        let lanes = self.fill_concurrency.max(1);
        let names = Arc::new(names);
        let mut tasks = Vec::new();
        for lane in 0..lanes {
            let (t, names, session) = (self.clone(), names.clone(), session.clone());
            let options = options.clone();
            tasks.push(tokio::spawn(async move {
                let input = t.input();
                for (i, name) in names.iter().enumerate().skip(lane).step_by(lanes) {
                    let scope = t.run(&session, name);
                    t.store
                        .enqueue(&scope, &input, &options(i))
                        .await
                        .ctx("enqueue")?;
                }
                Ok::<(), String>(())
            }));
        }
        for task in tasks {
            task.await.ctx("enqueue task")??;
        }
        Ok(())
    }

    /// A fresh run, enqueued and claimed: its scope, claim options and lease
    /// fence.
    pub async fn held_run(&self, label: &str) -> Result<(RunScope, ClaimOptions, Fence), String> {
        let session = fresh_session();
        let scope = self.run(&session, "run_0");
        self.store
            .enqueue(&scope, &self.input(), &EnqueueOptions::default())
            .await
            .ctx("enqueue")?;
        let opts = claim_options(label);
        let fence = acquire(&*self.store, &scope, &opts).await?;
        Ok((scope, opts, fence))
    }
}

/// Claim options with a 10-minute lease (never lapses mid-measurement).
pub fn claim_options(label: &str) -> ClaimOptions {
    ClaimOptions::new(
        Holder::new(format!("bench-{label}")).expect("a valid holder"),
        Ttl::from_millis(600_000).expect("a valid TTL"),
    )
}

/// Claims (or renews) and answers the fence; anything but `Acquired` is an
/// error.
pub async fn acquire(
    store: &dyn RunStore,
    scope: &RunScope,
    opts: &ClaimOptions,
) -> Result<Fence, String> {
    match store.claim(scope, opts).await.ctx("claim")? {
        ClaimOutcome::Acquired(lease) => Ok(lease.fence),
        other => Err(format!("claim of {scope}: not acquired: {other:?}")),
    }
}

/// A tool-result event (~120 B).
pub fn event(n: u64) -> NewEvent {
    let mut payload = Map::new();
    payload.insert("toolCallId".into(), json!(format!("call_{n}")));
    payload.insert("tool".into(), json!("search"));
    payload.insert("result".into(), json!({"hits": 3, "ms": 41}));
    NewEvent::new("tool_result", payload)
}

/// claim → release of one run, one after the other.
pub async fn claim_release(t: &Target, budget: Duration) -> Result<Sample, String> {
    let session = fresh_session();
    let scope = t.run(&session, "run_0");
    t.store
        .enqueue(&scope, &t.input(), &EnqueueOptions::default())
        .await
        .ctx("enqueue")?;
    let opts = claim_options("claim-release");
    sequential(budget, |_| {
        let (store, scope, opts) = (t.store.clone(), scope.clone(), opts.clone());
        async move {
            let fence = acquire(&*store, &scope, &opts).await?;
            if !store.release(&scope, fence).await.ctx("release")? {
                return Err(format!("release of {scope} at {fence:?} released nothing"));
            }
            Ok(1.0)
        }
    })
    .await
}

/// Renewals of a held lease by its holder.
pub async fn renew(t: &Target, budget: Duration) -> Result<Sample, String> {
    let (scope, opts, _) = t.held_run("renew").await?;
    renew_loop(t, &scope, &opts, budget).await
}

/// Renewals of the lease on `scope` held with `opts`.
pub async fn renew_loop(
    t: &Target,
    scope: &RunScope,
    opts: &ClaimOptions,
    budget: Duration,
) -> Result<Sample, String> {
    sequential(budget, |_| {
        let (store, scope, opts) = (t.store.clone(), scope.clone(), opts.clone());
        async move {
            acquire(&*store, &scope, &opts).await?;
            Ok(1.0)
        }
    })
    .await
}

/// Fenced checkpoint writes of about `bytes` each.
pub async fn checkpoint(t: &Target, bytes: usize, budget: Duration) -> Result<Sample, String> {
    let (scope, _, fence) = t.held_run("checkpoint").await?;
    let template = t.sized_checkpoint("cp_0", bytes);
    sequential(budget, |i| {
        let (store, scope) = (t.store.clone(), scope.clone());
        let mut cp = template.clone();
        cp.id = CheckpointId::new(format!("cp_{}", i % ROTATE)).expect("a valid checkpoint id");
        cp.created_at = store.now();
        async move {
            store
                .write_checkpoint(&scope, &cp, Some(fence))
                .await
                .ctx("write_checkpoint")?;
            Ok(1.0)
        }
    })
    .await
}

/// Fenced appends of `batch` events each; counts events.
pub async fn append(t: &Target, batch: usize, budget: Duration) -> Result<Sample, String> {
    let (scope, _, fence) = t.held_run("append").await?;
    let events: Arc<Vec<NewEvent>> = Arc::new((0..batch as u64).map(event).collect());
    sequential(budget, |_| {
        let (store, scope, events) = (t.store.clone(), scope.clone(), events.clone());
        async move {
            let n = store
                .append_events(&scope, &events, Some(fence))
                .await
                .ctx("append_events")?
                .len();
            Ok(n as f64)
        }
    })
    .await
}

/// Wake-up latency: a task waits on a watch of a run's events (the way a
/// tail or an idle worker waits), then one fenced append of 1 event; one
/// op lasts from the append's start until the waiting task has woken. The
/// watch is the store's own: an in-process notifier for memory and fs,
/// PostgreSQL's `LISTEN` connection for pg (the `NOTIFY` goes through the
/// server even in one process), a long-poll of `runkeep serve` for serve-*.
/// A wake-up that never comes counts as the watch's fallback interval.
pub async fn wake(t: &Target, budget: Duration) -> Result<Sample, String> {
    let (scope, _, fence) = t.held_run("wake").await?;
    let topic = WatchTopic::Events(scope.clone());
    sequential(budget, |i| {
        let (store, scope, topic) = (t.store.clone(), scope.clone(), topic.clone());
        async move {
            let mut watch = store.watch(&topic);
            let waiter = tokio::spawn(async move { watch.changed().await });
            store
                .append_events(&scope, &[event(i)], Some(fence))
                .await
                .ctx("append_events")?;
            waiter.await.ctx("the waiting task")?;
            Ok(1.0)
        }
    })
    .await
}

/// `commit_step` with one event and one checkpoint (no finish).
pub async fn step_commit(t: &Target, budget: Duration) -> Result<Sample, String> {
    let (scope, _, fence) = t.held_run("step").await?;
    sequential(budget, |i| {
        let (store, scope) = (t.store.clone(), scope.clone());
        let step = Step {
            events: vec![event(i)],
            checkpoint: Some(t.step_checkpoint(&format!("cp_{}", i % ROTATE))),
            ..Step::default()
        };
        async move {
            store
                .commit_step(&scope, fence, &step)
                .await
                .ctx("commit_step")?;
            Ok(1.0)
        }
    })
    .await
}

/// A session of `runs` enqueued runs, for listings.
pub async fn listed_session(t: &Target, runs: usize) -> Result<SessionId, String> {
    let session = fresh_session();
    t.enqueue_all(&session, (0..runs).map(|i| format!("run_{i:07}")).collect())
        .await?;
    Ok(session)
}

/// The cursor of the last page of `session` (walking every page once).
pub async fn last_cursor(t: &Target, session: &SessionId) -> Result<Option<String>, String> {
    let listing = t.listing(session);
    let (mut previous, mut cursor) = (None, None);
    loop {
        let page = t
            .store
            .list_runs(
                &listing,
                &ListOptions {
                    limit: Some(PAGE),
                    cursor: cursor.clone(),
                    ..ListOptions::default()
                },
            )
            .await
            .ctx("list_runs")?;
        if page.entries.is_empty() {
            return Ok(previous);
        }
        match page.cursor {
            None => return Ok(cursor),
            Some(next) => {
                previous = cursor;
                cursor = Some(next);
            }
        }
    }
}

/// Listing pages of [`PAGE`] rows of `session`, after `cursor`.
pub async fn list_page(
    t: &Target,
    session: &SessionId,
    cursor: Option<String>,
    budget: Duration,
) -> Result<Sample, String> {
    let listing = t.listing(session);
    sequential(budget, |_| {
        let (store, listing) = (t.store.clone(), listing.clone());
        let options = ListOptions {
            limit: Some(PAGE),
            cursor: cursor.clone(),
            ..ListOptions::default()
        };
        async move {
            let page = store.list_runs(&listing, &options).await.ctx("list_runs")?;
            if page.entries.is_empty() {
                return Err("the listing page came back empty".into());
            }
            Ok(1.0)
        }
    })
    .await
}

/// What the queued runs of a `claim_next` scaling case carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueMix {
    /// Nothing: today's plain queue.
    Plain,
    /// Priorities drawn from -100..=100.
    Priority,
    /// 20 concurrency keys (limits 1–3): the first 95 % of the queue (in
    /// run-id order) belongs to keys 0–18, all held at their limit by a
    /// blocker, so every call must pass them by to reach key 19's runs.
    Keys20,
}

impl QueueMix {
    /// The case name's part.
    pub fn label(self) -> &'static str {
        match self {
            QueueMix::Plain => "plain",
            QueueMix::Priority => "priority",
            QueueMix::Keys20 => "keys20",
        }
    }
}

fn key_of(i: usize, size: usize) -> (usize, Concurrency) {
    let k = if i < size * 95 / 100 { i % 19 } else { 19 };
    (
        k,
        Concurrency::new(format!("key-{k:02}"), 1 + (k % 3) as u32).expect("a valid key"),
    )
}

/// A session of `size` queued runs mixed as `mix`, with the keys at their
/// limit held (not timed).
pub async fn queued_session(t: &Target, size: usize, mix: QueueMix) -> Result<SessionId, String> {
    let session = fresh_session();
    let names: Vec<String> = (0..size).map(|i| format!("run_c{i:09}")).collect();
    t.enqueue_all_with(&session, names, move |i| match mix {
        QueueMix::Plain => EnqueueOptions::default(),
        QueueMix::Priority => EnqueueOptions {
            priority: Priority::new(
                (((i as u64).wrapping_mul(2654435761) >> 7) % 201) as i64 - 100,
            )
            .expect("a valid priority"),
            ..EnqueueOptions::default()
        },
        QueueMix::Keys20 => EnqueueOptions {
            concurrency: Some(key_of(i, size).1),
            ..EnqueueOptions::default()
        },
    })
    .await?;
    if mix == QueueMix::Keys20 {
        let blocker = claim_options("key-blocker");
        let mut held = [0u32; 19];
        for i in 0..size * 95 / 100 {
            let (k, c) = key_of(i, size);
            if held[k] < c.limit {
                acquire(
                    &*t.store,
                    &t.run(&session, &format!("run_c{i:09}")),
                    &blocker,
                )
                .await?;
                held[k] += 1;
            }
            if held
                .iter()
                .enumerate()
                .all(|(k, h)| *h == 1 + (k % 3) as u32)
            {
                break;
            }
        }
    }
    Ok(session)
}

/// `claim_next` + release on a queued session: the run a call takes goes
/// back for the next one, so the queue's shape stays as prepared.
pub async fn claim_next_cycle(
    t: &Target,
    session: &SessionId,
    budget: Duration,
) -> Result<Sample, String> {
    let listing = t.listing(session);
    let opts = claim_options("claim-next");
    sequential(budget, |_| {
        let (store, listing, opts) = (t.store.clone(), listing.clone(), opts.clone());
        async move {
            let (scope, lease) = store
                .claim_next(&listing, &ClaimNextFilter::default(), &opts)
                .await
                .ctx("claim_next")?
                .ok_or("claim_next found no run")?;
            if !store.release(&scope, lease.fence).await.ctx("release")? {
                return Err(format!("release of {scope} released nothing"));
            }
            Ok(1.0)
        }
    })
    .await
}

/// A run holding `events` events (appended in batches of 1 000, not
/// timed): its scope.
pub async fn run_with_events(t: &Target, events: u64) -> Result<RunScope, String> {
    let (scope, _, fence) = t.held_run("events").await?;
    let batch: Vec<NewEvent> = (0..1000).map(event).collect();
    let mut left = events;
    while left > 0 {
        let n = left.min(1000) as usize;
        t.store
            .append_events(&scope, &batch[..n], Some(fence))
            .await
            .ctx("append_events")?;
        left -= n as u64;
    }
    Ok(scope)
}

/// Catch-up reads: the last [`CATCH_UP`] events of a run of `events`.
pub async fn catch_up(
    t: &Target,
    scope: &RunScope,
    events: u64,
    budget: Duration,
) -> Result<Sample, String> {
    let since = events.saturating_sub(CATCH_UP);
    sequential(budget, |_| {
        let (store, scope) = (t.store.clone(), scope.clone());
        async move {
            let batch = store
                .read_events(
                    &scope,
                    &ReadEventsOptions {
                        since_seq: since,
                        limit: Some(CATCH_UP as usize),
                        ..ReadEventsOptions::default()
                    },
                )
                .await
                .ctx("read_events")?;
            if batch.events.len() as u64 != events - since {
                return Err(format!(
                    "catch-up read {} events, expected {}",
                    batch.events.len(),
                    events - since
                ));
            }
            Ok(1.0)
        }
    })
    .await
}

/// How a drain's workers take runs and commit their steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainWay {
    /// `claim_next`, then `commit_step`: two calls a run.
    Calls,
    /// `claim_next` once, then each run's step with the claim of the next
    /// (`commit_step_and_claim_next`): one call a run.
    HandOver,
    /// `claim_next_batch` of up to this many runs, then one group commit
    /// (`commit_steps`) of all their steps: two calls a batch.
    Batch(usize),
}

/// The concurrency keys of a keyed drain queue: run `i` carries key
/// `i % DRAIN_KEYS`.
pub const DRAIN_KEYS: u64 = 20;

/// Each key's limit in a keyed drain queue: high enough that 16 workers
/// with batches of 16 never all wait on saturated keys (20 × 16 ≥ 256), so
/// the figure is what keys cost, not how long runs wait for a slot.
pub const DRAIN_KEY_LIMIT: u32 = 16;

/// Enqueues runs `first..first + runs` of a drain queue, each with one of
/// [`DRAIN_KEYS`] keys when `keyed`.
pub async fn fill_drain_queue(
    t: &Target,
    session: &SessionId,
    first: u64,
    runs: u64,
    keyed: bool,
) -> Result<(), String> {
    t.enqueue_all_with(
        session,
        (first..first + runs)
            .map(|i| format!("run_q{i:09}"))
            .collect(),
        move |i| EnqueueOptions {
            concurrency: keyed.then(|| {
                let k = (first + i as u64) % DRAIN_KEYS;
                Concurrency::new(format!("key-{k:02}"), DRAIN_KEY_LIMIT).expect("a valid key")
            }),
            ..EnqueueOptions::default()
        },
    )
    .await
}

/// What a drain's worker committed: the run and the fence it presented.
type Committed = Vec<(RunId, Fence)>;

/// The drain cycle with `workers` concurrent workers on `session`, each
/// committing one step per run that carries an event, a checkpoint and
/// the finish, taking runs [`DrainWay`]'s way, until the queue is empty or
/// `budget` has passed (a cycle under way then completes; a hand-over's
/// last step then goes alone). Counts runs done; a run's latency is its
/// cycle's (a batch's, for every run of it). After the clock stops, the
/// drain is audited from the store ([`audit_drain`]); `done_before` runs
/// of the session were completed by earlier drains.
pub async fn drain(
    t: &Target,
    session: &SessionId,
    workers: usize,
    way: DrainWay,
    budget: Duration,
    done_before: usize,
) -> Result<Sample, String> {
    let listing = t.listing(session);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let retried = Arc::new(AtomicU64::new(0));
    for w in 0..workers {
        let (t, listing, retried) = (t.clone(), listing.clone(), retried.clone());
        tasks.push(tokio::spawn(async move {
            let opts = claim_options(&drain_worker(w));
            let filter = ClaimNextFilter::default();
            let next = NextClaim {
                scope: listing.clone(),
                filter: filter.clone(),
                options: opts.clone(),
            };
            let step = Step {
                events: vec![event(0)],
                checkpoint: Some(t.step_checkpoint("cp_step")),
                finish: Some(Outcome::completed(Some(json!({"ok": true})))),
                ..Step::default()
            };
            let mut latencies = Vec::new();
            let mut committed: Committed = Vec::new();
            let mut c = Instant::now();
            if let DrainWay::Batch(max) = way {
                while started.elapsed() < budget {
                    c = Instant::now();
                    let runs = match t
                        .store
                        .claim_next_batch(&listing, &filter, &opts, max)
                        .await
                    {
                        Ok(runs) => runs,
                        // Nothing was taken (a keyed claim that waited past
                        // the store's lock timeout): ask again, as a worker
                        // does.
                        Err(e) if e.is_retryable() && !e.is_outcome_unknown() => {
                            retried.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(e) => return Err(format!("claim_next_batch: {e}")),
                    };
                    if runs.is_empty() {
                        break;
                    }
                    let group: Vec<StepCommit> = runs
                        .into_iter()
                        .map(|(scope, lease)| StepCommit {
                            scope,
                            fence: lease.fence,
                            step: step.clone(),
                        })
                        .collect();
                    let outcomes = t.store.commit_steps(&group).await.ctx("commit_steps")?;
                    if outcomes.len() != group.len() {
                        return Err(format!(
                            "commit_steps answered {} outcomes for {} steps",
                            outcomes.len(),
                            group.len()
                        ));
                    }
                    let took = c.elapsed().as_secs_f64() * 1e6;
                    for (outcome, s) in outcomes.into_iter().zip(group) {
                        outcome.ctx("a step of the group commit")?;
                        committed.push((s.scope.run_id, s.fence));
                        latencies.push(took);
                    }
                }
                return Ok::<_, String>((latencies, committed));
            }
            let mut held = None;
            loop {
                let (scope, lease) = match held.take() {
                    Some(h) => h,
                    None if started.elapsed() < budget => {
                        c = Instant::now();
                        match t
                            .store
                            .claim_next(&listing, &filter, &opts)
                            .await
                            .ctx("claim_next")?
                        {
                            Some(h) => h,
                            None => break,
                        }
                    }
                    None => break,
                };
                if way == DrainWay::HandOver && started.elapsed() < budget {
                    let over = t
                        .store
                        .commit_step_and_claim_next(&scope, lease.fence, &step, &next)
                        .await
                        .ctx("commit_step_and_claim_next")?;
                    held = over.next.ctx("the hand-over's claim")?;
                } else {
                    t.store
                        .commit_step(&scope, lease.fence, &step)
                        .await
                        .ctx("commit_step")?;
                }
                committed.push((scope.run_id, lease.fence));
                latencies.push(c.elapsed().as_secs_f64() * 1e6);
                c = Instant::now();
            }
            Ok::<_, String>((latencies, committed))
        }));
    }
    let mut latencies = Vec::new();
    let mut committed = Vec::new();
    for task in tasks {
        let (l, c) = task.await.ctx("drain worker")??;
        latencies.extend(l);
        committed.push(c);
    }
    let secs = started.elapsed().as_secs_f64();
    let retried = retried.load(Ordering::Relaxed);
    if retried > 0 {
        eprintln!("note: {retried} batch claims were refused as retryable (nothing taken) and asked again");
    }
    audit_drain(t, session, &committed, done_before).await?;
    Ok(Sample {
        units: latencies.len() as f64,
        secs,
        latencies_us: latencies,
    })
}

/// The holder name of a drain's worker `w`.
fn drain_worker(w: usize) -> String {
    format!("drain-{w}")
}

/// Checks a drain from the store's own rows, as the soak does: no run was
/// committed twice; every run committed is completed, held by nobody but
/// its committing worker at no fence below the one presented; no run the
/// workers did not commit is completed (but the `done_before` earlier
/// drains completed); and on a sample of
/// [`AUDIT_SAMPLE`] runs, the finish the store recorded carries the fence
/// the committing worker presented. `committed[w]` is worker `w`'s.
pub async fn audit_drain(
    t: &Target,
    session: &SessionId,
    committed: &[Committed],
    done_before: usize,
) -> Result<(), String> {
    let mut by_run = std::collections::HashMap::new();
    for (w, runs) in committed.iter().enumerate() {
        for (run, fence) in runs {
            if let Some((other, _)) = by_run.insert(run.clone(), (w, *fence)) {
                return Err(format!(
                    "drain audit: run {run} was committed by worker {other} and by worker {w}"
                ));
            }
        }
    }
    let listing = t.listing(session);
    let mut cursor = None;
    let (mut completed, mut earlier) = (0usize, 0usize);
    loop {
        let page = t
            .store
            .list_runs(
                &listing,
                &ListOptions {
                    limit: Some(500),
                    cursor: cursor.clone(),
                    ..ListOptions::default()
                },
            )
            .await
            .ctx("drain audit: list_runs")?;
        for row in &page.entries {
            let run = &row.scope.run_id;
            let done = row.status == RunStatus::Completed;
            match (by_run.get(run), done) {
                (Some((w, fence)), true) => {
                    completed += 1;
                    // Finished: nobody holds it, and no holding came after
                    // the committing worker's.
                    let holder = drain_holder(*w);
                    match &row.claim {
                        Some(c) if c.fence >= *fence && (c.holder.is_empty() || c.holder == holder) => {}
                        other => {
                            return Err(format!(
                                "drain audit: run {run} was committed by {holder} at fence {fence}, but its top holding is {other:?}"
                            ))
                        }
                    }
                }
                (Some((w, _)), false) => {
                    return Err(format!(
                        "drain audit: worker {w} committed run {run}, but it is {:?}",
                        row.status
                    ))
                }
                (None, true) => {
                    earlier += 1;
                    if earlier > done_before {
                        return Err(format!(
                            "drain audit: run {run} is completed, but no worker committed it"
                        ));
                    }
                }
                (None, false) => {}
            }
        }
        match page.cursor {
            Some(next) if !page.entries.is_empty() => cursor = Some(next),
            _ => break,
        }
    }
    if earlier != done_before {
        return Err(format!(
            "drain audit: {done_before} runs were completed before this drain, {earlier} found"
        ));
    }
    if completed != by_run.len() {
        return Err(format!(
            "drain audit: {} runs committed, {completed} found completed in the listing",
            by_run.len()
        ));
    }
    // The finish's own fence, on a sample spread over the drain (a read
    // each): the one the committing worker presented.
    let mut runs: Vec<_> = by_run.into_iter().collect();
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    let every = (runs.len() / AUDIT_SAMPLE).max(1);
    for (run, (w, fence)) in runs.into_iter().step_by(every) {
        let scope = RunScope::new(
            t.tenant.clone(),
            t.project.clone(),
            session.clone(),
            run.clone(),
        );
        let l = t
            .store
            .lifecycle(&scope)
            .await
            .ctx("drain audit: lifecycle")?;
        if l.finished_fence != Some(fence) {
            return Err(format!(
                "drain audit: worker {w} finished run {run} at fence {fence}, but the store recorded the finish at {:?}",
                l.finished_fence
            ));
        }
    }
    Ok(())
}

/// Runs of a drain whose finish fence the audit reads back.
const AUDIT_SAMPLE: usize = 200;

/// The holder string of drain worker `w`'s claims.
fn drain_holder(w: usize) -> String {
    claim_options(&drain_worker(w)).holder.as_str().to_string()
}

/// Writes `count` checkpoints into the held run `scope` (not timed), 4 at
/// once.
pub async fn fill_checkpoints(
    t: &Target,
    scope: &RunScope,
    fence: Fence,
    count: u64,
) -> Result<(), String> {
    let lanes = 4u64;
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let (t, scope) = (t.clone(), scope.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = lane;
            while i < count {
                let cp = t.step_checkpoint(&format!("cp_{i:08}"));
                t.store
                    .write_checkpoint(&scope, &cp, Some(fence))
                    .await
                    .ctx("write_checkpoint")?;
                i += lanes;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.ctx("checkpoint task")??;
    }
    Ok(())
}
