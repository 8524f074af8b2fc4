//! The workload, its recording, and the check of every cut.
//!
//! **Recording.** An `FsStore` opened on the FUSE mount performs every
//! write path of the directory backend (the [`workload`] list). Each call
//! is a [`StepRecord`]: the log position when it started and when it
//! returned `Ok` (its acknowledgement), and what a reader of the live store
//! saw right after it ([`Facets`]: every checkpoint, the strict transcript,
//! the audit trail, run record, messages, report, lifecycle, top holding
//! and listing row of every run).
//!
//! **Cutting.** For every prefix length `k` of the log (`0..=len`) and each
//! [`CrashModel`], the durable view is computed. Each distinct view is
//! materialised once into a fresh directory and read back by a fresh
//! `FsStore`; then every cut with that view is judged:
//!
//! - every call acknowledged at or before `k` is there: each facet equals
//!   what the live store showed after the last acknowledged call, or —
//!   only for the call in flight at `k` — after that call (all or nothing
//!   per facet; never a third value, so never torn);
//! - every read succeeds, the transcript passes the strict read, every
//!   checkpoint parses, no listing row is damaged, and no checkpoint or
//!   snapshot names an event that is not there;
//! - no fence is handed out again: a claim on the recovered store (its
//!   clock 10 days on, so every lease has lapsed; a finished run reopened
//!   first) gets a fence above every acknowledged one, and at least
//!   `f + 2` after an acknowledged release, snooze or finish of `f`; a run
//!   whose acknowledged state is finished answers `Finished` first.
//!
//! Any failure is a [`Loss`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use runkeep::step::{MessagesUpdate, Step};
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimOptions, ClaimOutcome, EnqueueOptions,
    EvidenceStore, Fence, Holder, Integrity, ListOptions, ListingScope, ManualClock,
    MessageSnapshot, NewAuditEvent, NewEvent, Outcome, ParkResolution, PendingDecision, ProjectId,
    ReadEventsOptions, RunId, RunScope, SessionId, TenantId, Timestamp, Ttl,
};
use runkeep_fs::{Attribution, Durability, FsOptions, FsStore};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::fs::Recorder;
use crate::model::{CrashModel, Op, State};

/// The workload's clock starts here (fixed, so runs are reproducible).
const T0: i64 = 1_800_000_000_000;
/// The recovered store's clock: every lease of the workload has lapsed.
const RECOVERY_AT: i64 = T0 + 10 * 24 * 3_600_000;
/// Where the store lives inside the mount (created by the store, so the
/// creation of the whole chain is on the log).
pub const BASE: &str = "runs";

/// One acknowledged call of the workload.
#[derive(Clone, Debug)]
pub struct StepRecord {
    /// What it was (`claim run_a`, `commit_step run_b (finish)`, …).
    pub label: String,
    /// Log length when the call started.
    pub start: usize,
    /// Log length when it returned `Ok`: from this cut on it must survive.
    pub end: usize,
    /// A fence the call acquired (claim, renewal): `(run, fence)`.
    pub acquired: Option<(usize, u64)>,
    /// A fence the call ended (release, snooze, finish): `(run, fence)`.
    pub spent: Option<(usize, u64)>,
}

/// What a reader sees, facet by facet (`run_a/checkpoint/c1`,
/// `run_a/events`, …): a missing key reads as absent.
pub type Facets = BTreeMap<String, String>;

/// A run's scopes and labels.
#[derive(Clone, Debug)]
pub struct Runs {
    scopes: Vec<RunScope>,
}

impl Runs {
    fn label(&self, i: usize) -> String {
        let s = &self.scopes[i];
        match &s.parent_run_id {
            Some(p) => format!("{p}/{}", s.run_id),
            None => s.run_id.to_string(),
        }
    }
}

/// The recording of one workload run.
#[derive(Debug)]
pub struct Recording {
    /// Every mutating operation the filesystem served.
    pub log: Vec<Op>,
    /// The acknowledged calls, in order.
    pub steps: Vec<StepRecord>,
    /// `observed[0]` before the first call, `observed[i]` after call `i`.
    pub observed: Vec<Facets>,
    /// The runs.
    pub runs: Runs,
    /// Whether the store published holdings through `O_TMPFILE` (`false`:
    /// the scratch-name path).
    pub tmpfile_publish: bool,
}

/// One thing a cut lost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Loss {
    /// The crash model.
    pub model: CrashModel,
    /// The cut (number of operations that reached the model).
    pub cut: usize,
    /// `lost` (an acknowledged value is not there), `damaged` (a read
    /// failed), `dangling` (a reference to an event that is not there),
    /// `fence` (a fence handed out again or a finish forgotten).
    pub kind: String,
    /// The facet or run.
    pub what: String,
    /// Expected versus found, shortened.
    pub detail: String,
}

/// The verdict for one crash model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelReport {
    /// Which.
    pub model: CrashModel,
    /// Cuts judged: every prefix length of the log, `0..=len`.
    pub points_cut: usize,
    /// Distinct durable views among them (each materialised and read once).
    pub distinct_states: usize,
    /// Acknowledged calls required present, summed over the cuts.
    pub acked_writes_checked: usize,
    /// Facet comparisons made, summed over the cuts.
    pub facets_checked: usize,
    /// Fence checks made (one per run per cut).
    pub fence_checks: usize,
    /// Cuts with at least one loss.
    pub cuts_with_losses: usize,
    /// Losses, by kind.
    pub losses_by_kind: BTreeMap<String, usize>,
    /// Total losses.
    pub losses: usize,
    /// The first few, for the message.
    pub examples: Vec<Loss>,
    /// Cuts that fell inside a call (after its first operation, before its
    /// acknowledgement), by the call's kind (`claim`, `commit_step`, …).
    pub cuts_inside: BTreeMap<String, usize>,
    /// Milliseconds to judge every cut.
    pub check_ms: u64,
}

/// The harness's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// The store's durability setting.
    pub durability: String,
    /// `RUNKEEP_FS_TEST_MUTATION`, when set.
    pub mutation: Option<String>,
    /// Operations the filesystem logged during the workload.
    pub ops_logged: usize,
    /// Of which fsyncs of files / of directories.
    pub fsyncs: (usize, usize),
    /// Acknowledged calls of the workload.
    pub acked_calls: usize,
    /// Their labels.
    pub calls: Vec<String>,
    /// Whether holdings went through `O_TMPFILE`.
    pub tmpfile_publish: bool,
    /// Milliseconds to mount, record the workload and unmount.
    pub record_ms: u64,
    /// One verdict per crash model.
    pub models: Vec<ModelReport>,
}

impl Report {
    /// Losses over every model.
    pub fn losses(&self) -> usize {
        self.models.iter().map(|m| m.losses).sum()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "power-loss harness: durability {}, mutation {}, {} operations logged ({} file fsyncs, {} directory fsyncs), {} acknowledged calls, holdings via {}, recorded in {} ms",
            self.durability,
            self.mutation.as_deref().unwrap_or("none"),
            self.ops_logged,
            self.fsyncs.0,
            self.fsyncs.1,
            self.acked_calls,
            if self.tmpfile_publish { "O_TMPFILE" } else { "scratch name + link" },
            self.record_ms,
        )?;
        for m in &self.models {
            writeln!(
                f,
                "  {:?}: points cut {}, distinct durable states {}, acknowledged writes checked {}, facets checked {}, fence checks {}, losses {} (in {} cuts) {:?}, judged in {} ms",
                m.model,
                m.points_cut,
                m.distinct_states,
                m.acked_writes_checked,
                m.facets_checked,
                m.fence_checks,
                m.losses,
                m.cuts_with_losses,
                m.losses_by_kind,
                m.check_ms,
            )?;
            writeln!(f, "    cuts inside a call: {:?}", m.cuts_inside)?;
            for l in &m.examples {
                writeln!(f, "    cut {} {} {}: {}", l.cut, l.kind, l.what, l.detail)?;
            }
        }
        Ok(())
    }
}

fn attribution() -> Attribution {
    Attribution {
        tenant_id: TenantId::new("tnt_pl").expect("id"),
        project_id: ProjectId::new("prj_pl").expect("id"),
        session_id: SessionId::new("ses_pl").expect("id"),
    }
}

fn scope(run: &str) -> RunScope {
    let a = attribution();
    RunScope::new(
        a.tenant_id,
        a.project_id,
        a.session_id,
        RunId::new(run).expect("id"),
    )
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms).expect("timestamp")
}

fn cp(id: &str, created: i64, n: u64) -> Checkpoint {
    let mut state = Map::new();
    state.insert("iteration".into(), json!(n));
    state.insert("throughSeq".into(), json!(0));
    state.insert(
        "notes".into(),
        json!(format!("checkpoint {id} #{n} {}", "x".repeat(200))),
    );
    Checkpoint::new(CheckpointId::new(id).expect("id"), at(created), state)
}

fn cp_through(id: &str, created: i64, n: u64, through: u64) -> Checkpoint {
    let mut c = cp(id, created, n);
    c.state.insert("throughSeq".into(), json!(through));
    c
}

fn ev(kind: &str, n: u64) -> NewEvent {
    let mut p = Map::new();
    p.insert("n".into(), json!(n));
    NewEvent::new(kind, p)
}

fn claim_opts(holder: &str, ttl_ms: u64) -> ClaimOptions {
    ClaimOptions::new(
        Holder::new(holder).expect("holder"),
        Ttl::from_millis(ttl_ms).expect("ttl"),
    )
}

fn short(s: &str) -> String {
    if s.len() <= 300 {
        s.to_string()
    } else {
        let mut cut = 300;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    }
}

/// A transcript facet: one event per line.
fn event_lines(events: &[runkeep::PersistedEvent]) -> String {
    events
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// True when transcript facet `got` is `before` plus a proper, non-empty
/// part of what `after` appended.
fn part_of_batch(before: &str, got: &str, after: &str) -> bool {
    let lines = |s: &str| -> Vec<String> {
        if s == "(absent)" {
            Vec::new()
        } else {
            s.lines().map(str::to_string).collect()
        }
    };
    let (b, g, a) = (lines(before), lines(got), lines(after));
    b.len() < g.len() && g.len() < a.len() && g.starts_with(&b) && a.starts_with(&g)
}

/// Reads every facet of every run through `store` (no side effects).
pub async fn facets(store: &FsStore, runs: &Runs) -> Facets {
    let mut out = Facets::new();
    let err = |e: runkeep::Error| format!("ERROR {e}");
    for (i, s) in runs.scopes.iter().enumerate() {
        let r = runs.label(i);
        let mut last_seq = 0;
        match store
            .read_events(
                s,
                &ReadEventsOptions {
                    integrity: Integrity::Strict,
                    ..Default::default()
                },
            )
            .await
        {
            Ok(b) => {
                last_seq = b.last_seq;
                if !b.events.is_empty() {
                    out.insert(format!("{r}/events"), event_lines(&b.events));
                }
            }
            Err(e) => {
                out.insert(format!("{r}/events"), err(e));
                // What the dangling check measures against: the readable part.
                if let Ok(b) = store.read_events(s, &ReadEventsOptions::default()).await {
                    last_seq = b.last_seq;
                }
            }
        }
        match store.list_checkpoints(s).await {
            Ok(cps) => {
                for c in cps {
                    if let Some(t) = c.state.get("throughSeq").and_then(Value::as_u64) {
                        if t > last_seq {
                            out.insert(
                                format!("{r}/dangling/{}", c.id),
                                format!("DANGLING checkpoint names event {t}, the log ends at {last_seq}"),
                            );
                        }
                    }
                    out.insert(format!("{r}/checkpoint/{}", c.id), format!("{c:?}"));
                }
            }
            Err(e) => {
                out.insert(format!("{r}/checkpoints"), err(e));
            }
        }
        match store.read_audit(s, 0).await {
            Ok(a) if a.is_empty() => {}
            Ok(a) => {
                out.insert(format!("{r}/audit"), format!("{a:?}"));
            }
            Err(e) => {
                out.insert(format!("{r}/audit"), err(e));
            }
        }
        match store.read_run_record(s).await {
            Ok(None) => {}
            Ok(Some(rec)) => {
                out.insert(format!("{r}/record"), format!("{rec:?}"));
            }
            Err(e) => {
                out.insert(format!("{r}/record"), err(e));
            }
        }
        match store.read_messages(s).await {
            Ok(MessageSnapshot::Unavailable) => {}
            Ok(m) => {
                if let MessageSnapshot::Available {
                    through_event_seq, ..
                } = &m
                {
                    if *through_event_seq > last_seq {
                        out.insert(
                            format!("{r}/dangling/messages"),
                            format!("DANGLING snapshot names event {through_event_seq}, the log ends at {last_seq}"),
                        );
                    }
                }
                out.insert(format!("{r}/messages"), format!("{m:?}"));
            }
            Err(e) => {
                out.insert(format!("{r}/messages"), err(e));
            }
        }
        match store.read_report(s).await {
            Ok(None) => {}
            Ok(Some(t)) => {
                out.insert(format!("{r}/report"), t);
            }
            Err(e) => {
                out.insert(format!("{r}/report"), err(e));
            }
        }
        match store.lifecycle(s).await {
            Ok(l) if l == runkeep::Lifecycle::default() => {}
            Ok(l) => {
                out.insert(format!("{r}/lifecycle"), format!("{l:?}"));
            }
            Err(e) => {
                out.insert(format!("{r}/lifecycle"), err(e));
            }
        }
        match store.lease(s, at(T0)).await {
            Ok(None) => {}
            Ok(Some(l)) => {
                out.insert(
                    format!("{r}/top"),
                    format!("fence {} holder {:?}", l.fence.get(), l.holder),
                );
            }
            Err(e) => {
                out.insert(format!("{r}/top"), err(e));
            }
        }
    }
    let a = attribution();
    let listing = ListingScope::session(a.tenant_id, a.project_id, a.session_id);
    match store
        .list_runs(
            &listing,
            &ListOptions {
                now: Some(at(T0)),
                limit: Some(100),
                ..Default::default()
            },
        )
        .await
    {
        Ok(page) => {
            for row in page.entries {
                let run = match &row.scope.parent_run_id {
                    Some(p) => format!("{p}/{}", row.scope.run_id),
                    None => row.scope.run_id.to_string(),
                };
                // One facet per part a call can write separately (a step
                // lands its checkpoint before its finish record).
                match &row.damaged {
                    Some(d) => {
                        out.insert(format!("{run}/listing"), format!("ERROR damaged row: {d}"));
                    }
                    None => {
                        out.insert(
                            format!("{run}/listing/latest"),
                            format!(
                                "{:?} of {}",
                                row.latest_checkpoint_id.as_ref().map(|c| c.to_string()),
                                row.checkpoint_count
                            ),
                        );
                        out.insert(format!("{run}/listing/status"), format!("{:?}", row.status));
                    }
                }
            }
        }
        Err(e) => {
            out.insert("listing".into(), err(e));
        }
    }
    out
}

/// Runs the workload on `store` (opened on the mount), recording each call.
struct Rec {
    store: FsStore,
    recorder: Recorder,
    runs: Runs,
    steps: Vec<StepRecord>,
    observed: Vec<Facets>,
}

impl Rec {
    async fn call<T, F>(&mut self, label: String, fut: F) -> T
    where
        F: Future<Output = runkeep::Result<T>>,
    {
        let start = self.recorder.position();
        let out = match fut.await {
            Ok(v) => v,
            Err(e) => panic!("workload call {label} failed on the live mount: {e}"),
        };
        let end = self.recorder.position();
        let seen = facets(&self.store, &self.runs).await;
        let after = self.recorder.position();
        assert_eq!(
            end,
            after,
            "reading the live store after {label} wrote to the filesystem ({} operations)",
            after - end
        );
        for (k, v) in &seen {
            assert!(
                !v.starts_with("ERROR") && !v.starts_with("DANGLING"),
                "the live store after {label}: {k}: {v}"
            );
        }
        self.observed.push(seen);
        self.steps.push(StepRecord {
            label,
            start,
            end,
            acquired: None,
            spent: None,
        });
        out
    }

    fn acquired(&mut self, run: usize, fence: Fence) {
        self.steps.last_mut().expect("a step").acquired = Some((run, fence.get()));
    }

    fn spent(&mut self, run: usize, fence: Fence) {
        self.steps.last_mut().expect("a step").spent = Some((run, fence.get()));
    }

    async fn claim(&mut self, run: usize, holder: &str, ttl_ms: u64) -> Fence {
        let store = self.store.clone();
        let s = self.runs.scopes[run].clone();
        let label = format!("claim {} by {holder}", self.runs.label(run));
        let out = self
            .call(label.clone(), store.claim(&s, &claim_opts(holder, ttl_ms)))
            .await;
        let lease = match out {
            ClaimOutcome::Acquired(l) => l,
            other => panic!("{label}: {other:?}"),
        };
        self.acquired(run, lease.fence);
        lease.fence
    }
}

/// The workload: every write path of the directory backend, on three runs
/// (one a sub-run). Returns its recording once the filesystem is quiet.
pub async fn workload(store: FsStore, recorder: Recorder, clock: ManualClock) -> Recording {
    let a = scope("run_a");
    let b = scope("run_b");
    let c = scope("run_c").with_parent(RunId::new("run_a").expect("id"));
    let runs = Runs {
        scopes: vec![a.clone(), b.clone(), c.clone()],
    };
    let mut rec = Rec {
        observed: vec![facets(&store, &runs).await],
        store: store.clone(),
        recorder,
        runs,
        steps: Vec::new(),
    };
    let st = store.clone();
    let (ra, rb, rc) = (0, 1, 2);

    // run_a: a worker's whole life.
    rec.call(
        "write_checkpoint run_a c0 (unfenced)".into(),
        st.write_checkpoint(&a, &cp("c0", T0, 0), None),
    )
    .await;
    let f1 = rec.claim(ra, "worker_1", 60_000).await;
    rec.call(
        "append_events run_a (2)".into(),
        st.append_events(&a, &[ev("tool_call", 1), ev("tool_result", 2)], Some(f1)),
    )
    .await;
    rec.call(
        "write_checkpoint run_a c1".into(),
        st.write_checkpoint(&a, &cp_through("c1", T0 + 1, 1, 2), Some(f1)),
    )
    .await;
    let f2 = rec.claim(ra, "worker_1", 60_000).await;
    let mut record = Map::new();
    record.insert("phase".into(), json!("thinking"));
    rec.call(
        "commit_step run_a (events, checkpoint, messages, record)".into(),
        st.commit_step(
            &a,
            f2,
            &Step {
                events: vec![ev("tool_call", 3), ev("tool_result", 4)],
                checkpoint: Some(cp_through("c2", T0 + 2, 2, 4)),
                messages: Some(MessagesUpdate {
                    messages: vec![json!({"role": "assistant", "content": "step 2"})],
                    through_event_seq: None,
                }),
                run_record: Some(record),
                finish: None,
            },
        ),
    )
    .await;
    let park = cp_through("p1", T0 + 3, 3, 4).with_pending(PendingDecision::new(
        "approval",
        Map::new(),
        at(T0 + 3),
    ));
    rec.call(
        "write_checkpoint run_a p1 (park)".into(),
        st.write_checkpoint(&a, &park, Some(f2)),
    )
    .await;
    rec.call(
        "resolve_park run_a p1".into(),
        st.resolve_park(
            &a,
            &CheckpointId::new("p1").expect("id"),
            ParkResolution::Answer(json!({"approved": true})),
            at(T0 + 4),
            Some(f2),
        ),
    )
    .await;
    let mut record = Map::new();
    record.insert("phase".into(), json!("reporting"));
    rec.call(
        "write_run_record run_a".into(),
        st.write_run_record(&a, &record, Some(f2)),
    )
    .await;
    rec.call(
        "write_messages run_a".into(),
        st.write_messages(
            &a,
            &[json!({"role": "assistant", "content": "approved"})],
            4,
            Some(f2),
        ),
    )
    .await;
    rec.call(
        "write_report run_a".into(),
        st.write_report(&a, "# Report\n\nall good\n", Some(f2)),
    )
    .await;
    rec.call(
        "append_audit run_a".into(),
        st.append_audit(
            &a,
            &[NewAuditEvent::new("worker_1", "approve", "ok")],
            Some(f2),
        ),
    )
    .await;
    rec.call(
        "delete_checkpoint run_a c0".into(),
        st.delete_checkpoint(&a, &CheckpointId::new("c0").expect("id"), Some(f2)),
    )
    .await;
    rec.call(
        "prune_checkpoints run_a keep 2".into(),
        st.prune_checkpoints(&a, 2, Some(f2)),
    )
    .await;
    let released = rec.call("release run_a".into(), st.release(&a, f2)).await;
    assert!(released, "release run_a");
    rec.spent(ra, f2);
    let f4 = rec.claim(ra, "worker_2", 60_000).await;
    rec.call(
        "commit_step run_a (events, checkpoint, finish)".into(),
        st.commit_step(
            &a,
            f4,
            &Step {
                events: vec![ev("final", 5)],
                checkpoint: Some(cp_through("c3", T0 + 5, 3, 5)),
                messages: None,
                run_record: None,
                finish: Some(Outcome::completed(Some(json!({"answer": 42})))),
            },
        ),
    )
    .await;
    rec.spent(ra, f4);

    // run_a/run_c: a sub-run.
    rec.call(
        "write_checkpoint run_a/run_c c0 (unfenced)".into(),
        st.write_checkpoint(&c, &cp("c0", T0 + 6, 0), None),
    )
    .await;
    let g1 = rec.claim(rc, "worker_3", 60_000).await;
    rec.call(
        "append_events run_a/run_c (1)".into(),
        st.append_events(&c, &[ev("sub_call", 1)], Some(g1)),
    )
    .await;
    rec.call(
        "write_checkpoint run_a/run_c c1".into(),
        st.write_checkpoint(&c, &cp_through("c1", T0 + 7, 1, 1), Some(g1)),
    )
    .await;
    let released = rec
        .call("release run_a/run_c".into(), st.release(&c, g1))
        .await;
    assert!(released, "release run_a/run_c");
    rec.spent(rc, g1);

    // run_b: the queue — enqueue, an expired lease taken over, a snooze,
    // a failed finish, reopen, and a finishing step.
    rec.call(
        "enqueue run_b".into(),
        st.enqueue(
            &b,
            &cp("c0", T0 + 8, 0),
            &EnqueueOptions {
                available_at: None,
                max_attempts: Some(5),
                ..EnqueueOptions::default()
            },
        ),
    )
    .await;
    let h1 = rec.claim(rb, "worker_4", 1_000).await;
    rec.call(
        "append_events run_b (1)".into(),
        st.append_events(&b, &[ev("tool_call", 1)], Some(h1)),
    )
    .await;
    clock.advance(5_000);
    let h2 = rec.claim(rb, "worker_5", 60_000).await;
    let snoozed = rec
        .call(
            "snooze run_b".into(),
            st.snooze(&b, h2, at(T0 + 5_000 + 1_000)),
        )
        .await;
    assert!(snoozed, "snooze run_b");
    rec.spent(rb, h2);
    clock.advance(2_000);
    let h3 = rec.claim(rb, "worker_6", 60_000).await;
    rec.call(
        "finish run_b (failed)".into(),
        st.finish(&b, h3, &Outcome::failed("the tool broke")),
    )
    .await;
    rec.spent(rb, h3);
    rec.call("reopen run_b".into(), st.reopen(&b)).await;
    let h4 = rec.claim(rb, "worker_7", 60_000).await;
    rec.call(
        "commit_step run_b (events, checkpoint, messages, finish)".into(),
        st.commit_step(
            &b,
            h4,
            &Step {
                events: vec![ev("tool_call", 2), ev("tool_result", 3)],
                checkpoint: Some(cp_through("c1", T0 + 9_000, 1, 3)),
                messages: Some(MessagesUpdate {
                    messages: vec![json!({"role": "assistant", "content": "done"})],
                    through_event_seq: None,
                }),
                run_record: None,
                finish: Some(Outcome::completed(None)),
            },
        ),
    )
    .await;
    rec.spent(rb, h4);

    let log = rec.recorder.log();
    Recording {
        steps: rec.steps,
        observed: rec.observed,
        runs: rec.runs,
        // The scratch-name publish creates `claims/.tmp-…` names; the
        // `O_TMPFILE` one creates none.
        tmpfile_publish: !log.iter().any(|op| {
            matches!(op, Op::Create { name, .. } if name.to_string_lossy().starts_with(".tmp-"))
        }),
        log,
    }
}

/// Opens the store on the mount and runs the workload.
pub fn record(mount: &Path, durability: Durability, recorder: Recorder) -> Recording {
    let clock = ManualClock::new(at(T0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let store = FsStore::open(
        mount.join(BASE),
        FsOptions {
            attribution: Some(attribution()),
            durability,
            clock: Some(Arc::new(clock.clone())),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("open the store on the FUSE mount: {e}"));
    rt.block_on(workload(store, recorder, clock))
}

/// What the recovered store answered to the fence check of one run.
#[derive(Clone, Debug)]
enum Reclaim {
    /// The first claim answered `Finished`; after `reopen`, this fence.
    FinishedThen(Result<u64, String>),
    /// Acquired at once.
    Fence(u64),
    /// Anything else.
    Other(String),
}

/// What a materialised view read back as.
#[derive(Debug)]
struct Recovered {
    /// Its facets, read before anything was written.
    seen: Facets,
    /// One claim per run.
    claims: Vec<Reclaim>,
    /// `<run>/events` after one event appended under the recovery claim's
    /// fence (which settles a torn tail), without that event.
    healed: Facets,
}

/// Reads a materialised view back: its facets, then one claim per run,
/// then one append per run and the strict transcript again.
fn recover(dir: &Path, runs: &Runs) -> Recovered {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let store = match FsStore::open(
        dir.join(BASE),
        FsOptions {
            attribution: Some(attribution()),
            durability: Durability::ProcessCrash,
            clock: Some(Arc::new(ManualClock::new(at(RECOVERY_AT)))),
            ..Default::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => {
            let mut f = Facets::new();
            f.insert("open".into(), format!("ERROR {e}"));
            return Recovered {
                seen: f,
                claims: Vec::new(),
                healed: Facets::new(),
            };
        }
    };
    rt.block_on(async {
        let seen = facets(&store, runs).await;
        let mut claims = Vec::new();
        for s in &runs.scopes {
            let o = claim_opts("recovery", 60_000);
            let r = match store.claim(s, &o).await {
                Ok(ClaimOutcome::Acquired(l)) => Reclaim::Fence(l.fence.get()),
                Ok(ClaimOutcome::Finished(_)) => {
                    let then = match store.reopen(s).await {
                        Ok(_) => match store.claim(s, &o).await {
                            Ok(ClaimOutcome::Acquired(l)) => Ok(l.fence.get()),
                            Ok(other) => Err(format!("after reopen: {other:?}")),
                            Err(e) => Err(format!("after reopen: {e}")),
                        },
                        Err(e) => Err(format!("reopen: {e}")),
                    };
                    Reclaim::FinishedThen(then)
                }
                Ok(other) => Reclaim::Other(format!("{other:?}")),
                Err(e) => Reclaim::Other(format!("error {e}")),
            };
            claims.push(r);
        }
        let mut healed = Facets::new();
        for (i, s) in runs.scopes.iter().enumerate() {
            let fence = match &claims[i] {
                Reclaim::Fence(f) | Reclaim::FinishedThen(Ok(f)) => *f,
                _ => continue,
            };
            let key = format!("{}/events", runs.label(i));
            let fence = Fence::new(fence).expect("a fence the store issued");
            if let Err(e) = store
                .append_events(s, &[ev("recovery", 0)], Some(fence))
                .await
            {
                healed.insert(key, format!("ERROR the recovery append: {e}"));
                continue;
            }
            let strict = ReadEventsOptions {
                integrity: Integrity::Strict,
                ..Default::default()
            };
            let v = match store.read_events(s, &strict).await {
                Ok(mut b) => match b.events.pop() {
                    Some(last) if last.event_type == "recovery" && last.seq == b.last_seq => {
                        if b.events.is_empty() {
                            continue;
                        }
                        event_lines(&b.events)
                    }
                    other => format!("ERROR the recovery event is not last: {other:?}"),
                },
                Err(e) => format!("ERROR after the recovery append: {e}"),
            };
            healed.insert(key, v);
        }
        Recovered {
            seen,
            claims,
            healed,
        }
    })
}

/// Judges every cut of `rec` under `model`.
pub fn check(rec: &Recording, model: CrashModel, scratch: &Path) -> ModelReport {
    let n = rec.log.len();
    let mut state = State::default();
    let mut by_view: HashMap<u64, usize> = HashMap::new();
    let mut recovered: Vec<Recovered> = Vec::new();
    let mut report = ModelReport {
        model,
        points_cut: 0,
        distinct_states: 0,
        acked_writes_checked: 0,
        facets_checked: 0,
        fence_checks: 0,
        cuts_with_losses: 0,
        losses_by_kind: BTreeMap::new(),
        losses: 0,
        examples: Vec::new(),
        cuts_inside: BTreeMap::new(),
        check_ms: 0,
    };
    let started = std::time::Instant::now();
    for k in 0..=n {
        if k > 0 {
            state.apply(&rec.log[k - 1]);
        }
        let view = state.durable_view(model);
        let fp = view.fingerprint();
        let idx = *by_view.entry(fp).or_insert_with(|| {
            let dir = scratch.join(format!("{model:?}-{}", recovered.len()));
            std::fs::create_dir(&dir).expect("a scratch directory");
            view.materialise(&dir).expect("materialise a durable view");
            view.carry_index_identity(&dir)
                .expect("carry the index's file identity over");
            let r = recover(&dir, &rec.runs);
            let _ = std::fs::remove_dir_all(&dir);
            recovered.push(r);
            recovered.len() - 1
        });
        let losses = judge(rec, model, k, &recovered[idx], &mut report);
        report.points_cut += 1;
        if !losses.is_empty() {
            report.cuts_with_losses += 1;
        }
        for l in losses {
            *report.losses_by_kind.entry(l.kind.clone()).or_default() += 1;
            report.losses += 1;
            if report.examples.len() < 8 {
                report.examples.push(l);
            }
        }
    }
    report.distinct_states = recovered.len();
    report.check_ms = started.elapsed().as_millis() as u64;
    report
}

fn judge(
    rec: &Recording,
    model: CrashModel,
    k: usize,
    got: &Recovered,
    report: &mut ModelReport,
) -> Vec<Loss> {
    let (seen, claims) = (&got.seen, &got.claims);
    let mut out = Vec::new();
    let loss = |kind: &str, what: &str, detail: String| Loss {
        model,
        cut: k,
        kind: kind.into(),
        what: what.into(),
        detail: short(&detail),
    };
    // Calls acknowledged by cut k, and the one in flight (started, not
    // yet acknowledged) if any.
    let acked = rec.steps.iter().take_while(|s| s.end <= k).count();
    let in_flight = rec.steps.get(acked).filter(|s| s.start < k);
    report.acked_writes_checked += acked;
    if let Some(s) = in_flight {
        let kind = s.label.split(' ').next().unwrap_or_default().to_string();
        *report.cuts_inside.entry(kind).or_default() += 1;
    }
    let before = &rec.observed[acked];
    let after = in_flight.map(|_| &rec.observed[acked + 1]);
    let absent = String::from("(absent)");
    let mut keys: Vec<&String> = before.keys().chain(seen.keys()).collect();
    if let Some(a) = after {
        keys.extend(a.keys());
    }
    keys.sort();
    keys.dedup();
    // The transcript as the recovered store left it after one append (its
    // torn tail, if any, settled), compared like any facet below.
    let mut healed = Vec::new();
    for (i, _) in rec.runs.scopes.iter().enumerate() {
        let key = format!("{}/events", rec.runs.label(i));
        if matches!(
            claims.get(i),
            Some(Reclaim::Fence(_) | Reclaim::FinishedThen(Ok(_)))
        ) {
            healed.push((
                key,
                got.healed.get(&format!("{}/events", rec.runs.label(i))),
            ));
        }
    }
    let pre = keys.into_iter().filter_map(|key| {
        // A torn tail is what a torn append leaves: the strict read before
        // any write may refuse it; the read after the recovery append is
        // what must hold (below).
        if matches!(model, CrashModel::TornWrites | CrashModel::TornWithIndex)
            && key.ends_with("/events")
        {
            return None;
        }
        Some((key.clone(), seen.get(key), ""))
    });
    let post = healed
        .into_iter()
        .map(|(key, v)| (key, v, " (after the recovery append)"));
    for (key, got, when) in pre.collect::<Vec<_>>().into_iter().chain(post) {
        let key = &key;
        report.facets_checked += 1;
        let got = got.unwrap_or(&absent);
        let want = before.get(key).unwrap_or(&absent);
        if got == want || after.is_some_and(|a| a.get(key).unwrap_or(&absent) == got) {
            continue;
        }
        let kind = if got.starts_with("ERROR") {
            "damaged"
        } else if got.starts_with("DANGLING") {
            "dangling"
        } else if key.ends_with("/events")
            && after.is_some_and(|a| part_of_batch(want, got, a.get(key).unwrap_or(&absent)))
        {
            // Every acknowledged event is there, and a part of the batch in
            // flight: all or nothing broken, nothing acknowledged lost.
            "torn-batch"
        } else {
            "lost"
        };
        let last = acked
            .checked_sub(1)
            .map(|i| rec.steps[i].label.as_str())
            .unwrap_or("(nothing yet)");
        out.push(loss(
            kind,
            &format!("{key}{when}"),
            format!("after \"{last}\" expected {want}, found {got}"),
        ));
    }
    // Fences: the claim on the recovered store.
    for (i, _) in rec.runs.scopes.iter().enumerate() {
        report.fence_checks += 1;
        let mut floor = 1;
        let mut finished = false;
        for s in &rec.steps[..acked] {
            if let Some((r, f)) = s.acquired {
                if r == i {
                    floor = floor.max(f + 1);
                }
            }
            if let Some((r, f)) = s.spent {
                if r == i {
                    floor = floor.max(f + 2);
                }
            }
        }
        let key = format!("{}/lifecycle", rec.runs.label(i));
        let finished_in = |f: &Facets| f.get(&key).is_some_and(|l| !l.contains("status: Active"));
        if finished_in(before) && after.is_none_or(finished_in) {
            finished = true;
        }
        let label = rec.runs.label(i);
        match claims.get(i) {
            None => out.push(loss("fence", &label, "the store did not open".into())),
            Some(Reclaim::Fence(f)) => {
                if finished {
                    out.push(loss(
                        "fence",
                        &label,
                        format!("an acknowledged finish was forgotten: the claim took fence {f}"),
                    ));
                }
                if *f < floor {
                    out.push(loss(
                        "fence",
                        &label,
                        format!("fence {f} handed out again (acknowledged fences need ≥ {floor})"),
                    ));
                }
            }
            Some(Reclaim::FinishedThen(Ok(f))) => {
                if *f < floor {
                    out.push(loss(
                        "fence",
                        &label,
                        format!("after reopen, fence {f} handed out again (need ≥ {floor})"),
                    ));
                }
            }
            Some(Reclaim::FinishedThen(Err(e))) => out.push(loss("fence", &label, e.clone())),
            Some(Reclaim::Other(o)) => out.push(loss(
                "fence",
                &label,
                format!("the recovery claim answered {o}"),
            )),
        }
    }
    out
}

/// Summary numbers of a log.
pub fn fsync_counts(log: &[Op]) -> (usize, usize) {
    let files = log.iter().filter(|o| matches!(o, Op::Fsync { .. })).count();
    let dirs = log
        .iter()
        .filter(|o| matches!(o, Op::FsyncDir { .. }))
        .count();
    (files, dirs)
}

/// Where materialised views go: `/dev/shm` (tmpfs: a view is written,
/// read back and removed, never needed on disk) when it is there, else the
/// system temp directory.
pub fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile::tempdir_in(shm).is_ok() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::part_of_batch;

    /// A transcript is "part of a batch" only when it keeps everything
    /// acknowledged and a proper, non-empty part of the call in flight.
    #[test]
    fn part_of_a_batch_is_told_from_a_loss() {
        let (before, after) = ("e1", "e1\ne2\ne3");
        assert!(part_of_batch(before, "e1\ne2", after));
        assert!(part_of_batch("(absent)", "e1", "e1\ne2"));
        // All or nothing is not a part; a lost acknowledged event is not either.
        assert!(!part_of_batch(before, before, after));
        assert!(!part_of_batch(before, after, after));
        assert!(!part_of_batch(before, "e2", after));
        assert!(!part_of_batch(before, "e1\nx2", after));
    }
}
