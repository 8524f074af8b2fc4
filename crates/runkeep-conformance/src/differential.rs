//! The differential property test: random sequences of operations run
//! against a backend and against [`MemoryStore`] (the reference model) side
//! by side, both on [`ManualClock`]s moved together, with every answer and
//! the whole read-back of every run compared after each operation.
//!
//! The operations: claims by several holders (fresh takes, renewals,
//! takeovers, with and without an attempt limit), `claim_next`, batches
//! (`claim_next_batch`; group commits of several runs' steps, some under
//! stale fences, compared step by step), releases,
//! snoozes, checkpoint writes (plain and parked, fenced and unfenced),
//! event appends, step commits (any mix of parts, with or without the
//! finish), finishes, reopens, enqueues, park answers and expiries, and
//! store-clock moves. Fences come from the answers themselves, so a holder
//! keeps presenting its fence after it went stale, exactly as a real worker
//! does.
//!
//! What is compared: each operation's answer (values whole; errors by kind,
//! and for `FencedOut` both fences), then for every run the
//! [`ReadBack`] (checkpoints, transcript, record,
//! messages, report, audit, lifecycle, lease, listing row) and the listing
//! walked in both orders in pages of two. What legitimately differs is
//! normalized away: error messages (each backend words its own) and cursor
//! strings (opaque; only whether a page carries one is compared).
//!
//! The driver is synchronous (it runs its own runtime per case): call it
//! from a plain `#[test]`, not from inside a tokio runtime.
//!
//! ```no_run
//! # // in a backend's tests/differential.rs
//! use std::sync::Arc;
//! use runkeep_conformance::{differential, Fixture};
//!
//! #[test]
//! fn agrees_with_the_reference_model() {
//!     let report = differential::check(
//!         |clock| {
//!             let store = runkeep::MemoryStore::with_clock(Arc::new(clock.clone()));
//!             Fixture::new(Arc::new(store), 3, ()).with_clock(clock)
//!         },
//!         differential::Config::default(),
//!     );
//!     eprintln!("{report:?}");
//! }
//! ```

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestError, TestRunner};
use runkeep::{
    CheckpointId, ClaimNextFilter, ClaimOutcome, Clock, Concurrency, EnqueueOptions, Error, Fence,
    ListOptions, ListOrder, ManualClock, MemoryStore, MessagesUpdate, NextClaim, Outcome,
    ParkResolution, PendingDecision, RunScope, RunStore, Step, Timestamp,
};
use serde_json::{json, Map};

use runkeep::batch::StepCommit;

use crate::support::{self, at, checkpoint, claim_now, event, read_back, run, ReadBack};
use crate::Fixture;

/// How many runs, holders and operations a differential run uses.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Random sequences to run.
    pub cases: u32,
    /// Fewest operations in a sequence.
    pub min_ops: usize,
    /// Most operations in a sequence.
    pub max_ops: usize,
    /// Most shrinking steps on a failure (each re-runs a sequence on fresh
    /// stores).
    pub max_shrink_iters: u32,
}

impl Default for Config {
    /// 64 sequences of 1 to 48 operations (a failure shrinks to the
    /// shortest sequence that still disagrees).
    fn default() -> Self {
        Self {
            cases: 64,
            min_ops: 1,
            max_ops: 48,
            max_shrink_iters: 512,
        }
    }
}

impl Config {
    /// Half of these sequences (rounded up), the rest unchanged: a test
    /// file runs two `#[test]`s of half each, which the test harness runs
    /// side by side on two threads, in about half the time of one.
    pub fn half(self) -> Self {
        Self {
            cases: self.cases.div_ceil(2),
            ..self
        }
    }
}

/// What a passing differential run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Sequences run.
    pub cases: u32,
    /// Operations executed and compared, over every sequence.
    pub operations: u64,
    /// Of those, the operations the reference model accepted (answered
    /// `Ok`), clock moves excluded: the sequences are not all refusals.
    pub accepted: u64,
}

const RUNS: u8 = 3;
const HOLDERS: u8 = 3;

/// One operation of a sequence.
#[derive(Clone, Debug)]
pub enum Op {
    /// `claim` by a holder, on the store clock.
    Claim {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
        /// Lease in ms.
        ttl: u64,
        /// The claim's attempt limit.
        limit: Option<u32>,
    },
    /// `claim_next` over the session.
    ClaimNext {
        /// Holder index.
        holder: u8,
        /// Lease in ms.
        ttl: u64,
    },
    /// `claim_next_batch` over the session.
    ClaimBatch {
        /// Holder index.
        holder: u8,
        /// Lease in ms.
        ttl: u64,
        /// The batch's size.
        max: u8,
    },
    /// `commit_steps`: one step per listed run (distinct), each under the
    /// holder's fence on its run (a group commit; a run the holder does
    /// not hold is refused alone).
    StepGroup {
        /// Holder index.
        holder: u8,
        /// Run indexes.
        runs: Vec<u8>,
        /// Events in each step.
        events: u8,
        /// A checkpoint index in each step.
        checkpoint: Option<u8>,
        /// A finish in each step (0 completed, 1 failed, 2 cancelled).
        finish: Option<u8>,
    },
    /// `release` under the holder's last fence on the run.
    Release {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
    },
    /// `snooze` under the holder's last fence, until now + `delay`.
    Snooze {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
        /// Deferral in ms.
        delay: i64,
    },
    /// `write_checkpoint`, fenced by a holder or unfenced.
    Write {
        /// Run index.
        run: u8,
        /// Holder index (`None`: unfenced).
        holder: Option<u8>,
        /// Checkpoint index (a repeat replaces).
        id: u8,
        /// `created_at` relative to the store clock.
        created: i64,
        /// 0: plain; 1: parked; 2: parked with a deadline 3 s on.
        park: u8,
    },
    /// `append_events`, fenced by a holder or unfenced.
    Append {
        /// Run index.
        run: u8,
        /// Holder index (`None`: unfenced).
        holder: Option<u8>,
        /// Events in the batch.
        n: u8,
    },
    /// `commit_step` under the holder's fence.
    Step {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
        /// Events in the step.
        events: u8,
        /// A checkpoint (index, parked) in the step.
        checkpoint: Option<(u8, bool)>,
        /// A message snapshot in the step.
        messages: bool,
        /// A run record in the step.
        record: bool,
        /// A finish (0 completed, 1 failed, 2 cancelled).
        finish: Option<u8>,
    },
    /// `commit_step_and_claim_next`: a step under the holder's fence, then
    /// the session's next run for `next` (the hand-over).
    Handover {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
        /// Events in the step.
        events: u8,
        /// A finish (0 completed, 1 failed, 2 cancelled).
        finish: Option<u8>,
        /// The next claim's holder index.
        next: u8,
        /// The next claim's lease in ms.
        ttl: u64,
    },
    /// `finish` under the holder's fence.
    Finish {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
        /// 0 completed, 1 failed, 2 cancelled.
        kind: u8,
    },
    /// `fail_attempt` under the holder's fence, with the report's limit.
    Fail {
        /// Run index.
        run: u8,
        /// Holder index.
        holder: u8,
        /// The report's attempt limit.
        limit: Option<u32>,
    },
    /// `cancel`, with or without a reason.
    Cancel {
        /// Run index.
        run: u8,
        /// With a reason.
        reason: bool,
    },
    /// `reopen`.
    Reopen {
        /// Run index.
        run: u8,
    },
    /// `enqueue`.
    Enqueue {
        /// Run index.
        run: u8,
        /// Not before now + this, in ms.
        delay: Option<i64>,
        /// The run's own limit.
        max_attempts: Option<u32>,
        /// Its concurrency key (`k0` or `k1`) and the key's limit.
        key: Option<(u8, u32)>,
    },
    /// `resolve_park` on a checkpoint.
    Answer {
        /// Run index.
        run: u8,
        /// Checkpoint index.
        id: u8,
        /// Expire instead of answering.
        expire: bool,
        /// Holder index (`None`: unfenced).
        holder: Option<u8>,
    },
    /// Both store clocks move.
    Advance {
        /// Milliseconds.
        ms: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..RUNS;
    let h = 0..HOLDERS;
    let ttl = prop_oneof![Just(1_000u64), Just(5_000), Just(60_000)];
    prop_oneof![
        4 => (r.clone(), h.clone(), ttl.clone(), proptest::option::weighted(0.2, 1u32..4))
            .prop_map(|(run, holder, ttl, limit)| Op::Claim { run, holder, ttl, limit }),
        2 => (h.clone(), ttl.clone()).prop_map(|(holder, ttl)| Op::ClaimNext { holder, ttl }),
        1 => (h.clone(), ttl.clone(), 1u8..4)
            .prop_map(|(holder, ttl, max)| Op::ClaimBatch { holder, ttl, max }),
        2 => (
            h.clone(),
            proptest::sample::subsequence((0..RUNS).collect::<Vec<u8>>(), 1..=RUNS as usize),
            0u8..3,
            proptest::option::of(0u8..4),
            proptest::option::weighted(0.5, 0u8..3)
        )
            .prop_map(|(holder, runs, events, checkpoint, finish)| Op::StepGroup {
                holder,
                runs,
                events,
                checkpoint,
                finish
            }),
        2 => (r.clone(), h.clone()).prop_map(|(run, holder)| Op::Release { run, holder }),
        1 => (r.clone(), h.clone(), 1i64..4_000)
            .prop_map(|(run, holder, delay)| Op::Snooze { run, holder, delay }),
        4 => (r.clone(), proptest::option::of(h.clone()), 0u8..4, -500i64..500, 0u8..3)
            .prop_map(|(run, holder, id, created, park)| Op::Write { run, holder, id, created, park }),
        2 => (r.clone(), proptest::option::of(h.clone()), 1u8..4)
            .prop_map(|(run, holder, n)| Op::Append { run, holder, n }),
        3 => (
            r.clone(),
            h.clone(),
            0u8..3,
            proptest::option::of((0u8..4, any::<bool>())),
            any::<bool>(),
            any::<bool>(),
            proptest::option::weighted(0.25, 0u8..3)
        )
            .prop_map(|(run, holder, events, checkpoint, messages, record, finish)| Op::Step {
                run,
                holder,
                events,
                checkpoint,
                messages,
                record,
                finish
            }),
        2 => (r.clone(), h.clone(), 0u8..3, proptest::option::weighted(0.7, 0u8..3), h.clone(), ttl.clone())
            .prop_map(|(run, holder, events, finish, next, ttl)| Op::Handover {
                run,
                holder,
                events,
                finish,
                next,
                ttl
            }),
        2 => (r.clone(), h.clone(), 0u8..3).prop_map(|(run, holder, kind)| Op::Finish { run, holder, kind }),
        2 => (r.clone(), h.clone(), proptest::option::weighted(0.3, 1u32..4))
            .prop_map(|(run, holder, limit)| Op::Fail { run, holder, limit }),
        1 => (r.clone(), any::<bool>()).prop_map(|(run, reason)| Op::Cancel { run, reason }),
        1 => r.clone().prop_map(|run| Op::Reopen { run }),
        1 => (
            r.clone(),
            proptest::option::of(1i64..3_000),
            proptest::option::of(0u32..4),
            proptest::option::of((0u8..2, 1u32..3)),
        )
            .prop_map(|(run, delay, max_attempts, key)| Op::Enqueue { run, delay, max_attempts, key }),
        2 => (r.clone(), 0u8..4, any::<bool>(), proptest::option::of(h.clone()))
            .prop_map(|(run, id, expire, holder)| Op::Answer { run, id, expire, holder }),
        3 => prop_oneof![Just(1i64), Just(500), Just(999), Just(1_000), Just(2_500), Just(6_000)]
            .prop_map(|ms| Op::Advance { ms }),
    ]
}

fn scope(i: u8) -> RunScope {
    run(&format!("diff{i}"))
}

fn holder_name(i: u8) -> String {
    format!("h{i}")
}

fn outcome(kind: u8) -> Outcome {
    match kind {
        0 => Outcome::completed(Some(json!({"k": "done"}))),
        1 => Outcome::failed("it failed"),
        _ => Outcome::cancelled("called off"),
    }
}

fn cp_id(i: u8) -> String {
    format!("diff_{i}")
}

fn make_checkpoint(id: u8, created: Timestamp, park: u8) -> runkeep::Checkpoint {
    let mut cp = checkpoint(&cp_id(id), 0);
    cp.created_at = created;
    if park > 0 {
        let mut p = PendingDecision::new("tool_review", Map::new(), created);
        if park == 2 {
            p = p.with_deadline(created.offset(3_000));
        }
        cp = cp.with_pending(p);
    }
    cp
}

/// A value compared structurally (`PartialEq`: JSON objects compare
/// without regard to key order, which a backend need not keep).
trait Comparable: std::fmt::Debug + Send {
    fn as_any(&self) -> &dyn Any;
    fn same(&self, other: &dyn Comparable) -> bool;
}

impl<T: PartialEq + std::fmt::Debug + Send + 'static> Comparable for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn same(&self, other: &dyn Comparable) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }
}

/// An answer with what may legitimately differ removed: errors by kind
/// (and `FencedOut` by its fences), never by wording.
type Answer = Result<Box<dyn Comparable>, String>;

fn normalize<T: PartialEq + std::fmt::Debug + Send + 'static>(r: runkeep::Result<T>) -> Answer {
    r.map(|v| Box::new(v) as Box<dyn Comparable>)
        .map_err(|e| error_answer(&e))
}

/// An error as compared: its kind, and for `FencedOut` both fences.
fn error_answer(e: &Error) -> String {
    match e {
        Error::FencedOut {
            presented, current, ..
        } => format!("FencedOut {{ presented: {presented}, current: {current} }}"),
        e => kind(e).to_string(),
    }
}

fn same_answer(a: &Answer, b: &Answer) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => x.same(y.as_ref()),
        (Err(x), Err(y)) => x == y,
        _ => false,
    }
}

/// One listing page as compared: its rows and whether it carried a cursor
/// (cursor strings are opaque and may differ).
type Page = Result<(Vec<runkeep::RunRow>, bool), &'static str>;

/// Everything a store says about the sequence's runs.
#[derive(PartialEq, Debug)]
struct Snapshot {
    runs: Vec<ReadBack>,
    pages: Vec<(ListOrder, Page)>,
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::NotFound { .. } => "NotFound",
        Error::InvalidInput { .. } => "InvalidInput",
        Error::FencedOut { .. } => "FencedOut",
        Error::Contended { .. } => "Contended",
        Error::Cancelled { .. } => "Cancelled",
        Error::Conflict { .. } => "Conflict",
        Error::Unsupported { .. } => "Unsupported",
        Error::Corrupted { .. } => "Corrupted",
        Error::Unavailable { .. } => "Unavailable",
        Error::Backend { .. } => "Backend",
        _ => "another error",
    }
}

/// The two stores of one sequence and the fences their answers handed out.
struct Pair {
    subject: Fixture,
    reference: Arc<dyn RunStore>,
    clocks: [ManualClock; 2],
    fences: HashMap<(u8, u8), Fence>,
}

impl Pair {
    fn now(&self) -> Timestamp {
        self.clocks[0].now()
    }

    fn fence(&self, run: u8, holder: u8) -> Fence {
        // A holder that never held the run presents fence 1 (issued or not:
        // both stores see the same input).
        self.fences
            .get(&(run, holder))
            .copied()
            .unwrap_or(Fence::FIRST)
    }

    fn note(&mut self, run: u8, holder: u8, answer: &runkeep::Result<ClaimOutcome>) {
        if let Ok(ClaimOutcome::Acquired(l)) = answer {
            self.fences.insert((run, holder), l.fence);
        }
    }

    /// Runs `op` on both stores; answers both normalized answers.
    async fn apply(&mut self, op: &Op) -> (Answer, Answer) {
        let now = self.now();
        let stores = [self.subject.store.clone(), self.reference.clone()];
        let mut answers = Vec::with_capacity(2);
        for store in &stores {
            let answer = match op {
                Op::Claim {
                    run,
                    holder,
                    ttl,
                    limit,
                } => {
                    let mut opts = claim_now(&holder_name(*holder), *ttl);
                    opts.max_attempts = *limit;
                    let a = store.claim(&scope(*run), &opts).await;
                    // Fences are noted from the reference's answer (the
                    // subject's must be equal, or the comparison fails).
                    if Arc::ptr_eq(store, &self.reference) {
                        self.note(*run, *holder, &a);
                    }
                    normalize(a)
                }
                Op::ClaimNext { holder, ttl } => {
                    let a = store
                        .claim_next(
                            &support::listing(),
                            &ClaimNextFilter::default(),
                            &claim_now(&holder_name(*holder), *ttl),
                        )
                        .await;
                    if Arc::ptr_eq(store, &self.reference) {
                        if let Ok(Some((s, l))) = &a {
                            if let Some(r) = (0..RUNS).find(|i| &scope(*i) == s) {
                                self.fences.insert((r, *holder), l.fence);
                            }
                        }
                    }
                    normalize(a)
                }
                Op::ClaimBatch { holder, ttl, max } => {
                    let a = store
                        .claim_next_batch(
                            &support::listing(),
                            &ClaimNextFilter::default(),
                            &claim_now(&holder_name(*holder), *ttl),
                            usize::from(*max),
                        )
                        .await;
                    if Arc::ptr_eq(store, &self.reference) {
                        for (s, l) in a.iter().flatten() {
                            if let Some(r) = (0..RUNS).find(|i| &scope(*i) == s) {
                                self.fences.insert((r, *holder), l.fence);
                            }
                        }
                    }
                    normalize(a)
                }
                Op::StepGroup {
                    holder,
                    runs,
                    events,
                    checkpoint,
                    finish,
                } => {
                    let group: Vec<StepCommit> = runs
                        .iter()
                        .map(|r| StepCommit {
                            scope: scope(*r),
                            fence: self.fence(*r, *holder),
                            step: Step {
                                events: (0..*events)
                                    .map(|i| event("tool_result", json!({"i": i, "run": r})))
                                    .collect(),
                                checkpoint: checkpoint.map(|id| make_checkpoint(id, now, 0)),
                                finish: finish.map(outcome),
                                ..Step::default()
                            },
                        })
                        .collect();
                    // Each step's outcome compared as an answer of its own.
                    normalize(store.commit_steps(&group).await.map(|outcomes| {
                        outcomes
                            .into_iter()
                            .map(|o| o.map_err(|e| error_answer(&e)))
                            .collect::<Vec<_>>()
                    }))
                }
                Op::Release { run, holder } => {
                    normalize(store.release(&scope(*run), self.fence(*run, *holder)).await)
                }
                Op::Snooze { run, holder, delay } => normalize(
                    store
                        .snooze(&scope(*run), self.fence(*run, *holder), now.offset(*delay))
                        .await,
                ),
                Op::Write {
                    run,
                    holder,
                    id,
                    created,
                    park,
                } => {
                    let cp = make_checkpoint(*id, now.offset(*created), *park);
                    let fence = holder.map(|h| self.fence(*run, h));
                    normalize(store.write_checkpoint(&scope(*run), &cp, fence).await)
                }
                Op::Append { run, holder, n } => {
                    let events: Vec<_> = (0..*n)
                        .map(|i| event("step", json!({"i": i, "at": now.as_millis()})))
                        .collect();
                    let fence = holder.map(|h| self.fence(*run, h));
                    normalize(store.append_events(&scope(*run), &events, fence).await)
                }
                Op::Step {
                    run,
                    holder,
                    events,
                    checkpoint,
                    messages,
                    record,
                    finish,
                } => {
                    let mut rec = Map::new();
                    rec.insert("at".into(), json!(now.as_millis()));
                    let step = Step {
                        events: (0..*events)
                            .map(|i| event("tool_result", json!({"i": i})))
                            .collect(),
                        checkpoint: checkpoint.map(|(id, parked)| {
                            make_checkpoint(id, now, if parked { 2 } else { 0 })
                        }),
                        messages: messages.then(|| MessagesUpdate {
                            messages: vec![json!({"role": "assistant", "at": now.as_millis()})],
                            through_event_seq: None,
                        }),
                        run_record: record.then_some(rec),
                        finish: finish.map(outcome),
                    };
                    normalize(
                        store
                            .commit_step(&scope(*run), self.fence(*run, *holder), &step)
                            .await,
                    )
                }
                Op::Handover {
                    run,
                    holder,
                    events,
                    finish,
                    next,
                    ttl,
                } => {
                    let step = Step {
                        events: (0..*events)
                            .map(|i| event("tool_result", json!({"i": i})))
                            .collect(),
                        finish: finish.map(outcome),
                        ..Step::default()
                    };
                    let claim = NextClaim {
                        scope: support::listing(),
                        filter: ClaimNextFilter::default(),
                        options: claim_now(&holder_name(*next), *ttl),
                    };
                    let a = store
                        .commit_step_and_claim_next(
                            &scope(*run),
                            self.fence(*run, *holder),
                            &step,
                            &claim,
                        )
                        .await
                        .map(|h| (h.receipt, h.next.map_err(|e| error_answer(&e))));
                    if Arc::ptr_eq(store, &self.reference) {
                        if let Ok((_, Ok(Some((s, l))))) = &a {
                            if let Some(r) = (0..RUNS).find(|i| &scope(*i) == s) {
                                self.fences.insert((r, *next), l.fence);
                            }
                        }
                    }
                    normalize(a)
                }
                Op::Finish { run, holder, kind } => normalize(
                    store
                        .finish(&scope(*run), self.fence(*run, *holder), &outcome(*kind))
                        .await,
                ),
                Op::Fail { run, holder, limit } => normalize(
                    store
                        .fail_attempt(
                            &scope(*run),
                            self.fence(*run, *holder),
                            &runkeep::AttemptError::new("error", format!("at {}", now.as_millis())),
                            *limit,
                        )
                        .await,
                ),
                Op::Cancel { run, reason } => normalize(
                    store
                        .cancel(&scope(*run), reason.then_some("called off"))
                        .await,
                ),
                Op::Reopen { run } => normalize(store.reopen(&scope(*run)).await),
                Op::Enqueue {
                    run,
                    delay,
                    max_attempts,
                    key,
                } => normalize(
                    store
                        .enqueue(
                            &scope(*run),
                            &make_checkpoint(0, now, 0),
                            &EnqueueOptions {
                                available_at: delay.map(|d| now.offset(d)),
                                max_attempts: *max_attempts,
                                concurrency: key.map(|(k, limit)| {
                                    Concurrency::new(format!("k{k}"), limit).expect("a valid key")
                                }),
                                ..Default::default()
                            },
                        )
                        .await,
                ),
                Op::Answer {
                    run,
                    id,
                    expire,
                    holder,
                } => {
                    let resolution = if *expire {
                        ParkResolution::Expire
                    } else {
                        ParkResolution::Answer(json!({"approve": true, "at": now.as_millis()}))
                    };
                    let fence = holder.map(|h| self.fence(*run, h));
                    let id =
                        CheckpointId::new(format!("cp_conformance_{}", cp_id(*id))).expect("id");
                    normalize(
                        store
                            .resolve_park(&scope(*run), &id, resolution, now, fence)
                            .await,
                    )
                }
                Op::Advance { ms } => {
                    if Arc::ptr_eq(store, &self.reference) {
                        for c in &self.clocks {
                            c.advance(*ms);
                        }
                    }
                    Ok(Box::new(()) as Box<dyn Comparable>)
                }
            };
            answers.push(answer);
        }
        let reference = answers.pop().expect("two answers");
        let subject = answers.pop().expect("two answers");
        (subject, reference)
    }

    /// Everything a store says, for comparison.
    async fn snapshot(&self, store: &Arc<dyn RunStore>) -> Snapshot {
        let now = self.now();
        let mut runs = Vec::new();
        for i in 0..RUNS {
            runs.push(read_back(store, &scope(i), now).await);
        }
        let mut pages = Vec::new();
        for order in [ListOrder::RunId, ListOrder::CreatedAt] {
            let mut cursor = None;
            for _ in 0..=RUNS {
                let page = store
                    .list_runs(
                        &support::listing(),
                        &ListOptions {
                            order,
                            limit: Some(2),
                            cursor: cursor.clone(),
                            now: Some(now),
                            ..Default::default()
                        },
                    )
                    .await;
                match page {
                    Ok(p) => {
                        pages.push((order, Ok((p.entries, p.cursor.is_some()))));
                        match p.cursor {
                            Some(c) => cursor = Some(c),
                            None => break,
                        }
                    }
                    Err(e) => {
                        pages.push((order, Err(kind(&e))));
                        break;
                    }
                }
            }
        }
        Snapshot { runs, pages }
    }
}

/// Runs `config.cases` random sequences against a store built by `make`
/// (on the clock it is given: the fixture's store must judge time by it)
/// and against [`MemoryStore`]; panics with the shortest failing sequence
/// found and where the two disagreed. Answers how many operations ran.
pub fn check(make: impl Fn(ManualClock) -> Fixture, config: Config) -> Report {
    let operations = AtomicU64::new(0);
    let accepted = AtomicU64::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: config.cases,
        max_shrink_iters: config.max_shrink_iters,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the differential test");
    let strategy = proptest::collection::vec(op(), config.min_ops..=config.max_ops);
    let result = runner.run(&strategy, |ops| {
        rt.block_on(async {
            let subject_clock = support::store_clock();
            let reference_clock = support::store_clock();
            let subject = make(subject_clock.clone());
            assert_eq!(
                subject.store.now(),
                at(0),
                "the differential subject's store does not judge time by the clock it was given"
            );
            let reference: Arc<dyn RunStore> =
                Arc::new(MemoryStore::with_clock(Arc::new(reference_clock.clone())));
            let mut pair = Pair {
                subject,
                reference,
                clocks: [subject_clock, reference_clock],
                fences: HashMap::new(),
            };
            for (i, op) in ops.iter().enumerate() {
                operations.fetch_add(1, Ordering::Relaxed);
                let (got, want) = pair.apply(op).await;
                if want.is_ok() && !matches!(op, Op::Advance { .. }) {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
                if !same_answer(&got, &want) {
                    return Err(TestCaseError::fail(format!(
                        "operation {i} ({op:?}) answered differently:\n  backend:   {got:?}\n  reference: {want:?}"
                    )));
                }
                let got = pair.snapshot(&pair.subject.store).await;
                let want = pair.snapshot(&pair.reference).await;
                if got != want {
                    return Err(TestCaseError::fail(format!(
                        "after operation {i} ({op:?}) the read-backs differ:\n{}",
                        first_difference(&got, &want)
                    )));
                }
            }
            Ok(())
        })
    });
    match result {
        Ok(()) => Report {
            cases: config.cases,
            operations: operations.load(Ordering::Relaxed),
            accepted: accepted.load(Ordering::Relaxed),
        },
        Err(TestError::Fail(why, ops)) => panic!(
            "the backend disagrees with the reference model: {why}\nshortest failing sequence ({} operations):\n{ops:#?}",
            ops.len()
        ),
        Err(TestError::Abort(why)) => panic!("the differential test aborted: {why}"),
    }
}

/// Names what differs between two snapshots, with both sides.
fn first_difference(got: &Snapshot, want: &Snapshot) -> String {
    for (i, (g, w)) in got.runs.iter().zip(&want.runs).enumerate() {
        if g == w {
            continue;
        }
        let mut out = format!("  run {}:\n", scope(i as u8).run_id);
        macro_rules! field {
            ($($f:ident),*) => {$(
                if g.$f != w.$f {
                    out.push_str(&format!(
                        "  {}:\n    backend:   {:?}\n    reference: {:?}\n",
                        stringify!($f),
                        g.$f,
                        w.$f
                    ));
                }
            )*};
        }
        field!(
            checkpoints,
            events,
            last_seq,
            record,
            messages,
            report,
            audit,
            lifecycle,
            lease,
            row
        );
        return out;
    }
    format!(
        "  the listing pages:\n    backend:   {:?}\n    reference: {:?}\n",
        got.pages, want.pages
    )
}

/// The sanity run: the reference model against itself.
pub fn memory_fixture(clock: ManualClock) -> Fixture {
    Fixture::new(
        Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))),
        3,
        (),
    )
    .with_clock(clock)
}
