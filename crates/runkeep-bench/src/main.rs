//! `runkeep-bench`: what each backend costs, beside what the hardware and
//! the database cost for the same work, in one run.
//!
//! A binary of its own, not a `runkeep` subcommand: the lab does not ship
//! in the product. From the repository root:
//! `cargo run --release -p runkeep-bench -- --quick` (see BENCHMARKS.md).
//!
//! Backends: memory, the directory store in both durabilities, PostgreSQL
//! (a fresh schema, dropped afterwards), and `runkeep serve` in process on
//! a directory root and on PostgreSQL (an [`HttpStore`] client). The
//! operations, through the public `RunStore` contract: claim+release,
//! renew, fenced checkpoints of 4 and 64 KiB, single and batched appends,
//! a step commit, listing pages, a catch-up read, and the drain cycle
//! (`claim_next` → one `commit_step` with an event, a checkpoint and the
//! finish) at 1, 8 and 16 workers. Baselines in the same run: 4 KiB
//! write+fsync and atomic publish for the directory; `SELECT 1`, a
//! single-row UPDATE commit and a plain `FOR UPDATE SKIP LOCKED` loop with
//! the same writes in 2 round trips for PostgreSQL. `--scaling` adds the
//! curves (renew after many checkpoints, listing among many runs, catch-up
//! in a long log, the drain of a deep queue); `--peers` graphile-worker and
//! pg-boss on Node.
//!
//! Every case is measured `--reps` times, all cases in turn (A B C … A B C
//! …), so two cases compared are measured alternately under the same
//! conditions; a figure is the median of its repetitions with their min–max,
//! and a ratio is the median (min–max) of the per-repetition ratios.
//! Nothing is hard-coded: every figure is measured in the run it is printed
//! by, except the reference design's claim+release rate (350/s, measured once),
//! which is named as such.
//!
//! [`HttpStore`]: runkeep_http::client::HttpStore

mod fsbase;
mod output;
mod peers;
mod pg;
mod serve;
mod stats;
mod svg;
mod wake;
mod work;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::process::ExitCode;

use clap::Parser;
use runkeep::{ClaimOptions, MemoryStore, RunScope, RunStore, SessionId};
use runkeep_fs::{Durability, FsOptions, FsRootOptions, FsRootStore};
use runkeep_postgres::{NotifyMode, PgOptions, PgStore};
use serde_json::{json, Value};

use fsbase::FsBase;
use output::{BenchError, BenchResult, Cell, Color, Exit, Style, Table};
use stats::{human_rate, human_us, median, min_max, paired, percentile, Sample};
use work::{Context, Target};

/// The reference design's claim+release rate on the directory store, as
/// measured once on this machine kind (not re-measured here: the reference is not part
/// of this repository).
const REFERENCE_CLAIM_RELEASE: f64 = 350.0;

/// Runs a worker of a batch drain claims (and commits) at once.
const DRAIN_BATCH: usize = 16;

/// Worker counts of the drain cycle.
const WORKERS: [usize; 3] = [1, 8, 16];

/// Connections of each PostgreSQL store (in process and behind the
/// server): enough for the most workers.
const PG_POOL: usize = 16;

/// Measure every runkeep backend beside its physical baselines (and peers):
/// tables, JSON, SVG plots.
#[derive(Parser, Debug)]
#[command(
    name = "runkeep-bench",
    version,
    after_help = "\
Cases are named BACKEND/OPERATION[@WORKERS]: memory/renew, fs-powerloss/checkpoint-4k,
pg/drain@8, pg/base.skip-locked@8, serve-pg/drain@16, graphile-worker/default@8, …
(--list prints them). The bench makes its own stores and removes them afterwards.

Final figures: on a quiet machine, from the repository root,
  cargo run --release -p runkeep-bench -- --scaling --peers \\
      --json-out crates/runkeep-bench/results/bench.json --update-doc BENCHMARKS.md"
)]
pub struct BenchArgs {
    /// Print the report as one JSON document on stdout (the notes stay on
    /// stderr).
    #[arg(long)]
    pub json: bool,

    /// A short smoke run (2 repetitions of 0.2 s, small scaling sizes):
    /// checks every case works; its figures are rough.
    #[arg(long)]
    pub quick: bool,

    /// Only the cases whose name contains one of these (comma-separated or
    /// repeated), e.g. `memory`, `pg/`, `drain@8`, `checkpoint`; `=NAME`
    /// selects exactly that case (`=pg/drain@1`, not `serve-pg/drain@1`).
    #[arg(long, value_delimiter = ',', value_name = "PATTERN")]
    pub only: Vec<String>,

    /// Also the scaling curves (renew after 10 vs N checkpoints, listing at
    /// 1 000 vs N runs, catch-up at 1 000 vs 10·N events, the drain of 1 000
    /// vs N queued runs), on the directory store and PostgreSQL.
    #[arg(long)]
    pub scaling: bool,

    /// Also the peers on PostgreSQL: graphile-worker and pg-boss (default
    /// and batched settings) at 8 and 16 workers. Needs node and npm; they
    /// are installed by `npm ci` into --peers-dir.
    #[arg(long)]
    pub peers: bool,

    /// Write every figure as JSON to FILE, and the plots (SVG) beside it.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,

    /// With --json-out: also replace the generated figures of this Markdown
    /// document (between its `<!-- runkeep bench: figures begin -->` and
    /// `… end -->` lines), e.g. BENCHMARKS.md.
    #[arg(long, value_name = "FILE", requires = "json_out")]
    pub update_doc: Option<PathBuf>,

    /// Instead of the cases: N rounds of a cross-server wake-up (a
    /// long-poll on one in-process `runkeep serve` answered after an event
    /// is appended through another, both over one PostgreSQL schema): its
    /// p50/p99 from the write's start.
    #[arg(long, value_name = "N")]
    pub wake: Option<usize>,

    /// The PostgreSQL server (a fresh schema per run, dropped afterwards).
    #[arg(
        long,
        env = "RUNKEEP_BENCH_PG_URL",
        hide_env_values = true,
        default_value = pg::DEFAULT_URL,
        value_name = "URL"
    )]
    pub pg_url: String,

    /// How the PostgreSQL stores wake watchers: `immediate` (a NOTIFY right
    /// after each commit) or `coalesced` (the NOTIFYs of ~2 ms in one
    /// statement).
    #[arg(long, value_enum, default_value_t = PgNotify::Immediate, value_name = "MODE")]
    pub pg_notify: PgNotify,

    /// Repetitions of every case (default 5; 2 with --quick).
    #[arg(long, value_name = "N")]
    pub reps: Option<usize>,

    /// Seconds of one measurement (default 1; 0.2 with --quick).
    #[arg(long, value_name = "SECONDS")]
    pub seconds: Option<f64>,

    /// Where the directory stores live (a fresh directory inside it,
    /// removed afterwards). Default: the working directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// N of the scaling curves (default 100000; 2000 with --quick).
    #[arg(long, value_name = "N")]
    pub scaling_size: Option<u64>,

    /// Where --peers installs graphile-worker and pg-boss.
    #[arg(long, value_name = "DIR", default_value = peers::DEFAULT_DIR)]
    pub peers_dir: PathBuf,

    /// Print the names of the cases that would run, and stop.
    #[arg(long)]
    pub list: bool,

    /// Also the directory store with its prune grace period off
    /// (`fs-grace0`: `prune_grace` zero, pruning by count alone) beside
    /// `fs` (the default grace period, 5 s), for claim+release, renew and
    /// the drains: what keeping young holding names costs.
    #[arg(long)]
    pub grace_off: bool,

    /// Also the PostgreSQL stores kept to measure an earlier path against
    /// the current one ([`AB_STORES`]: coalesced wake-ups, split step
    /// writes, no claim slack, keyed runs batched one search each). Each
    /// holds a pool of up to 16 connections of its own: with all of them,
    /// a run at 16 workers needs more than PostgreSQL's default
    /// `max_connections` of 100 (a full run on 2026-12-07 lost its 16-worker
    /// and peer cases to `too many clients`). Off, they are measured only
    /// when `--only` names them.
    #[arg(long)]
    pub ab: bool,
}

/// A store `--ab` adds: its name, its schema's suffix, and the option it
/// sets back to an earlier path on `pg`'s options.
type AbStore = (&'static str, &'static str, fn(&mut PgOptions));

/// The stores `--ab` adds.
const AB_STORES: [AbStore; 4] = [
    ("pg-coalesced", "pgc", |o| o.notify = NotifyMode::Coalesced),
    ("pg-split", "pgs", |o| o.merge_step_writes = false),
    ("pg-keyed1", "pgk", |o| o.batch_keyed_runs = false),
    ("pg-noslack", "pgn", |o| o.claim_slack = false),
];

/// True for a backend `--ab` adds.
fn is_ab_store(backend: &str) -> bool {
    AB_STORES.iter().any(|(name, ..)| *name == backend)
}

/// `--pg-notify`: the PostgreSQL stores' `NotifyMode`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum PgNotify {
    /// One NOTIFY right after each commit (the default).
    Immediate,
    /// The NOTIFYs of ~2 ms together, in one statement.
    Coalesced,
}

impl From<PgNotify> for NotifyMode {
    fn from(m: PgNotify) -> Self {
        match m {
            PgNotify::Immediate => NotifyMode::Immediate,
            PgNotify::Coalesced => NotifyMode::Coalesced,
        }
    }
}

/// What the options come to.
#[derive(Clone, Debug)]
struct Settings {
    quick: bool,
    reps: usize,
    budget: Duration,
    listing_runs: usize,
    catch_up_events: u64,
    scaling_size: u64,
    /// Most runs (jobs) provisioned for one drain measurement.
    drain_cap: u64,
}

impl Settings {
    fn of(args: &BenchArgs) -> BenchResult<Self> {
        let quick = args.quick;
        let reps = args.reps.unwrap_or(if quick { 2 } else { 5 });
        let secs = args.seconds.unwrap_or(if quick { 0.2 } else { 1.0 });
        if reps == 0 {
            return Err(BenchError::usage("--reps must be at least 1"));
        }
        if !(secs.is_finite() && secs > 0.0 && secs <= 600.0) {
            return Err(BenchError::usage(
                "--seconds must be a number of seconds above 0 and at most 600",
            ));
        }
        let scaling_size = args
            .scaling_size
            .unwrap_or(if quick { 2000 } else { 100_000 });
        if scaling_size < 2000 {
            return Err(BenchError::usage(
                "--scaling-size must be at least 2000 (the small end of the curves is 1 000)",
            ));
        }
        Ok(Self {
            quick,
            reps,
            budget: Duration::from_secs_f64(secs),
            listing_runs: if quick { 200 } else { 1000 },
            catch_up_events: if quick { 1000 } else { 10_000 },
            scaling_size,
            drain_cap: if quick { 5000 } else { 20_000 },
        })
    }
}

/// The backends, in table order.
const BACKENDS: [&str; 6] = ["memory", "fs", "fs-powerloss", "pg", "serve-fs", "serve-pg"];
/// `--grace-off`: the directory store with `prune_grace` zero, only for the
/// lease cases and the drains; tabled right after `fs`.
const FS_GRACE_OFF: &str = "fs-grace0";

/// The backends cases are made for: [`BACKENDS`], and [`FS_GRACE_OFF`]
/// after `fs` with `--grace-off`.
fn backends(grace_off: bool) -> Vec<&'static str> {
    let mut v = BACKENDS.to_vec();
    if grace_off {
        v.insert(2, FS_GRACE_OFF);
    }
    v
}

/// Where a backend's table goes.
fn table_rank(b: &str) -> usize {
    backends(true)
        .iter()
        .position(|x| *x == b)
        .unwrap_or(BACKENDS.len() + 1)
}

/// What one case does.
#[derive(Clone, Debug)]
enum Kind {
    ClaimRelease,
    Renew,
    Checkpoint(usize),
    Append(usize),
    StepCommit,
    Wake,
    ListFirst,
    ListDeep,
    CatchUp,
    /// The drain cycle by `.0` workers, taking runs `.1`'s way, on a queue
    /// whose runs carry 20 concurrency keys when `.2`.
    Drain(usize, work::DrainWay, bool),
    FsBase(FsBase),
    PgSelect1,
    PgUpdate,
    PgSkipLocked(usize),
    RenewAfter(u64),
    ListAt(u64),
    CatchUpAt(u64),
    DrainQueued(u64, usize),
    /// `claim_next` + release with this many runs queued, mixed so.
    ClaimNextAt(u64, work::QueueMix),
    Peer(&'static str, &'static str, usize),
}

/// What a case prepared once (not timed) and keeps between repetitions.
#[derive(Debug, Default)]
enum Prep {
    #[default]
    None,
    Listing(SessionId, Option<String>),
    Events(RunScope, u64),
    Held(RunScope, ClaimOptions),
    Queue {
        session: SessionId,
        next: u64,
    },
}

/// One case and its results.
#[derive(Debug)]
struct Case {
    /// `backend/op`.
    name: String,
    backend: String,
    op: String,
    workers: usize,
    unit: &'static str,
    what: String,
    group: &'static str,
    kind: Kind,
    prep: Prep,
    /// The last measured rate (provisioning of drains).
    hint: Option<f64>,
    rates: Vec<f64>,
    latencies: Vec<f64>,
    error: Option<String>,
}

impl Case {
    fn new(backend: &str, op: String, unit: &'static str, what: String, kind: Kind) -> Self {
        let workers = match kind {
            Kind::Drain(w, ..)
            | Kind::PgSkipLocked(w)
            | Kind::DrainQueued(_, w)
            | Kind::Peer(_, _, w) => w,
            _ => 1,
        };
        let group = match kind {
            Kind::RenewAfter(_)
            | Kind::ListAt(_)
            | Kind::CatchUpAt(_)
            | Kind::DrainQueued(..)
            | Kind::ClaimNextAt(..) => "scaling",
            Kind::Peer(..) => "peers",
            Kind::FsBase(_) | Kind::PgSelect1 | Kind::PgUpdate | Kind::PgSkipLocked(_) => {
                "baseline"
            }
            _ => "store",
        };
        Self {
            name: format!("{backend}/{op}"),
            backend: backend.to_string(),
            op,
            workers,
            unit,
            what,
            group,
            kind,
            prep: Prep::None,
            hint: None,
            rates: Vec::new(),
            latencies: Vec::new(),
            error: None,
        }
    }
}

/// Every case, in the order of one round.
fn all_cases(s: &Settings, scaling: bool, with_peers: bool, grace_off: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    for b in backends(grace_off) {
        let mut add = |op: &str, unit, what: String, kind| {
            cases.push(Case::new(b, op.to_string(), unit, what, kind));
        };
        add(
            "claim+release",
            "ops/s",
            "claim then release one run (one op = both)".into(),
            Kind::ClaimRelease,
        );
        add(
            "renew",
            "ops/s",
            "the holder renews its lease".into(),
            Kind::Renew,
        );
        if b == FS_GRACE_OFF {
            continue;
        }
        add(
            "checkpoint-4k",
            "ops/s",
            "fenced checkpoint write, 4 KiB of state".into(),
            Kind::Checkpoint(4096),
        );
        add(
            "checkpoint-64k",
            "ops/s",
            "fenced checkpoint write, 64 KiB of state".into(),
            Kind::Checkpoint(65536),
        );
        add(
            "append-1",
            "events/s",
            "fenced append of 1 event per call".into(),
            Kind::Append(1),
        );
        add(
            &format!("append-{}", work::BATCH),
            "events/s",
            format!("fenced append of {} events per call", work::BATCH),
            Kind::Append(work::BATCH),
        );
        add(
            "step-commit",
            "ops/s",
            "commit_step: 1 event + 1 checkpoint, fenced".into(),
            Kind::StepCommit,
        );
        add(
            "wake",
            "wakes/s",
            "wake-up latency: a task watching a run's events, then a fenced append of 1 event; from the append's start until the task woke (p50/p99)".into(),
            Kind::Wake,
        );
        add(
            "list-first-page",
            "pages/s",
            format!(
                "first page of {} rows among {} runs",
                work::PAGE,
                s.listing_runs
            ),
            Kind::ListFirst,
        );
        add(
            "list-deep-page",
            "pages/s",
            format!(
                "last page ({} rows a page) among {} runs, by cursor",
                work::PAGE,
                s.listing_runs
            ),
            Kind::ListDeep,
        );
        add(
            "catch-up",
            "reads/s",
            format!(
                "read the last {} events of a {}-event log",
                work::CATCH_UP,
                s.catch_up_events
            ),
            Kind::CatchUp,
        );
        if b == "fs" {
            add(
                "base.write+fsync-4k",
                "ops/s",
                "bare pwrite of 4 KiB + fsync (no store)".into(),
                Kind::FsBase(FsBase::WriteFsync),
            );
            add(
                "base.publish-4k",
                "ops/s",
                "bare atomic publish: create, write 4 KiB, fsync, rename, fsync dir".into(),
                Kind::FsBase(FsBase::Publish),
            );
            add(
                "base.publish-nosync-4k",
                "ops/s",
                "bare atomic publish without fsync: create, write 4 KiB, rename".into(),
                Kind::FsBase(FsBase::PublishNoSync),
            );
        }
        if b == "pg" {
            add(
                "base.select-1",
                "ops/s",
                "SELECT 1 on one connection (a round trip)".into(),
                Kind::PgSelect1,
            );
            add(
                "base.update-commit",
                "ops/s",
                "single-row UPDATE, autocommit (a round trip + a WAL flush)".into(),
                Kind::PgUpdate,
            );
        }
    }
    // The drains, worker count by worker count, every contender side by
    // side (so compared figures are measured next to each other).
    for w in WORKERS {
        for b in backends(grace_off) {
            cases.push(Case::new(
                b,
                format!("drain@{w}"),
                "cycles/s",
                format!(
                    "claim_next → commit_step(event + checkpoint + finish), {w} worker{}",
                    plural(w)
                ),
                Kind::Drain(w, work::DrainWay::Calls, false),
            ));
            if matches!(b, "fs" | FS_GRACE_OFF | "pg" | "serve-pg") {
                cases.push(Case::new(
                    b,
                    format!("handover@{w}"),
                    "cycles/s",
                    format!(
                        "claim_next, then commit_step_and_claim_next(event + checkpoint + finish) per run, {w} worker{}",
                        plural(w)
                    ),
                    Kind::Drain(w, work::DrainWay::HandOver, false),
                ));
            }
            if matches!(b, "memory" | "pg" | "serve-pg") {
                for keyed in [false, true] {
                    let keys = if keyed { ".keys20" } else { "" };
                    cases.push(Case::new(
                        b,
                        format!("batch{DRAIN_BATCH}{keys}@{w}"),
                        "cycles/s",
                        format!(
                            "claim_next_batch(up to {DRAIN_BATCH}) → one commit_steps of their steps (event + checkpoint + finish each){}, {w} worker{}",
                            if keyed { ", runs spread over 20 concurrency keys of limit 16" } else { "" },
                            plural(w)
                        ),
                        Kind::Drain(w, work::DrainWay::Batch(DRAIN_BATCH), keyed),
                    ));
                }
            }
            if b == "pg" {
                cases.push(Case::new(
                    "pg-coalesced",
                    format!("handover@{w}"),
                    "cycles/s",
                    format!(
                        "as pg/handover@{w}, on a store whose wake-ups are coalesced (NotifyMode::Coalesced: NOTIFY sent after COMMIT by one task, not in the transaction), {w} worker{}",
                        plural(w)
                    ),
                    Kind::Drain(w, work::DrainWay::HandOver, false),
                ));
                cases.push(Case::new(
                    "pg-split",
                    format!("handover@{w}"),
                    "cycles/s",
                    format!(
                        "as pg/handover@{w}, on a store that sends a step's writes one statement each (PgOptions::merge_step_writes off: the path before issue 32), {w} worker{}",
                        plural(w)
                    ),
                    Kind::Drain(w, work::DrainWay::HandOver, false),
                ));
                for keyed in [false, true] {
                    let keys = if keyed { ".keys20" } else { "" };
                    cases.push(Case::new(
                        "pg-keyed1",
                        format!("batch{DRAIN_BATCH}{keys}@{w}"),
                        "cycles/s",
                        format!(
                            "as pg/batch{DRAIN_BATCH}{keys}@{w}, on a store whose batch claims take keyed runs one search each (PgOptions::batch_keyed_runs off: the path before), {w} worker{}",
                            plural(w)
                        ),
                        Kind::Drain(w, work::DrainWay::Batch(DRAIN_BATCH), keyed),
                    ));
                }
                for (op, way) in [
                    ("handover", work::DrainWay::HandOver),
                    ("batch16", work::DrainWay::Batch(DRAIN_BATCH)),
                ] {
                    cases.push(Case::new(
                        "pg-noslack",
                        format!("{op}@{w}"),
                        "cycles/s",
                        format!(
                            "as pg/{op}@{w}, on a store whose candidate statement reads only the first runs (PgOptions::claim_slack off: the path before), {w} worker{}",
                            plural(w)
                        ),
                        Kind::Drain(w, way, false),
                    ));
                }
                cases.push(Case::new(
                    b,
                    format!("base.skip-locked@{w}"),
                    "cycles/s",
                    format!(
                        "plain SKIP LOCKED loop, same writes in 2 round trips, {w} connection{}",
                        plural(w)
                    ),
                    Kind::PgSkipLocked(w),
                ));
            }
        }
        if with_peers && w > 1 {
            for (lib, mode) in peers::PEERS {
                cases.push(Case::new(
                    lib,
                    format!("{mode}@{w}"),
                    "jobs/s",
                    format!("{lib} ({mode} settings): enqueue → take → complete, {w} workers"),
                    Kind::Peer(lib, mode, w),
                ));
            }
        }
    }
    if scaling {
        let n = s.scaling_size;
        for b in ["fs", "pg"] {
            for size in [10, n] {
                cases.push(Case::new(
                    b,
                    format!("renew.after-{size}"),
                    "ops/s",
                    format!("renew a lease on a run of {size} checkpoints"),
                    Kind::RenewAfter(size),
                ));
            }
            for size in [1000, n] {
                cases.push(Case::new(
                    b,
                    format!("list.runs-{size}"),
                    "pages/s",
                    format!("first listing page among {size} runs"),
                    Kind::ListAt(size),
                ));
            }
            for size in [1000, n] {
                for mix in [
                    work::QueueMix::Plain,
                    work::QueueMix::Priority,
                    work::QueueMix::Keys20,
                ] {
                    cases.push(Case::new(
                        b,
                        format!("claim-next.{}-{size}", mix.label()),
                        "ops/s",
                        format!(
                            "claim_next + release with {size} runs queued ({})",
                            match mix {
                                work::QueueMix::Plain => "no priorities, no keys",
                                work::QueueMix::Priority => "priorities -100..100",
                                work::QueueMix::Keys20 =>
                                    "20 keys; the first 95 % of the queue in keys held at their limit",
                            }
                        ),
                        Kind::ClaimNextAt(size, mix),
                    ));
                }
            }
            for size in [1000, 10 * n] {
                cases.push(Case::new(
                    b,
                    format!("catch-up.events-{size}"),
                    "reads/s",
                    format!("read the last {} of {size} events", work::CATCH_UP),
                    Kind::CatchUpAt(size),
                ));
            }
        }
        for size in [1000, n] {
            cases.push(Case::new(
                "pg",
                format!("drain.queued-{size}@8"),
                "cycles/s",
                format!("the drain cycle at 8 workers with {size} runs queued (kept topped up)"),
                Kind::DrainQueued(size, 8),
            ));
        }
    }
    cases
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Everything the measurements use.
struct Env {
    settings: Settings,
    targets: BTreeMap<&'static str, Target>,
    baselines: Option<pg::Baselines>,
    peers: Option<peers::Peers>,
    pg_url: String,
    schema_base: String,
    fs_dir: Option<PathBuf>,
    extra_schemas: std::sync::Mutex<Vec<String>>,
}

impl Env {
    fn target(&self, name: &str) -> Result<&Target, String> {
        self.targets
            .get(name)
            .ok_or_else(|| format!("backend {name} is not open"))
    }
}

/// Drains provisioned for one measurement: the rate seen so far times the
/// budget, with room (a drain stops at its budget, so more is harmless).
fn provision(hint: f64, budget: Duration, workers: usize, cap: u64) -> u64 {
    let n = (hint * budget.as_secs_f64() * 1.5).ceil() as u64 + 2 * workers as u64;
    n.clamp(2 * workers as u64 + 4, cap)
}

async fn measure(env: &Env, case: &mut Case) -> Result<Sample, String> {
    let s = &env.settings;
    let budget = s.budget;
    match case.kind.clone() {
        Kind::ClaimRelease => work::claim_release(env.target(&case.backend)?, budget).await,
        Kind::Renew => work::renew(env.target(&case.backend)?, budget).await,
        Kind::Checkpoint(bytes) => {
            work::checkpoint(env.target(&case.backend)?, bytes, budget).await
        }
        Kind::Append(batch) => work::append(env.target(&case.backend)?, batch, budget).await,
        Kind::StepCommit => work::step_commit(env.target(&case.backend)?, budget).await,
        Kind::Wake => work::wake(env.target(&case.backend)?, budget).await,
        Kind::ListFirst | Kind::ListDeep | Kind::ListAt(_) => {
            let t = env.target(&case.backend)?;
            if matches!(case.prep, Prep::None) {
                let runs = match case.kind {
                    Kind::ListAt(n) => n as usize,
                    _ => s.listing_runs,
                };
                let session = work::listed_session(t, runs).await?;
                // One walk of every page, not timed: a backend's first
                // listing of a session may build what later ones use (the
                // directory store's session index).
                let last = work::last_cursor(t, &session).await?;
                let cursor = match case.kind {
                    Kind::ListDeep => last,
                    _ => None,
                };
                case.prep = Prep::Listing(session, cursor);
            }
            let Prep::Listing(session, cursor) = &case.prep else {
                unreachable!("prepared above")
            };
            work::list_page(t, session, cursor.clone(), budget).await
        }
        Kind::CatchUp | Kind::CatchUpAt(_) => {
            let t = env.target(&case.backend)?;
            if matches!(case.prep, Prep::None) {
                let events = match case.kind {
                    Kind::CatchUpAt(n) => n,
                    _ => s.catch_up_events,
                };
                case.prep = Prep::Events(work::run_with_events(t, events).await?, events);
            }
            let Prep::Events(scope, events) = &case.prep else {
                unreachable!("prepared above")
            };
            work::catch_up(t, scope, *events, budget).await
        }
        Kind::RenewAfter(n) => {
            let t = env.target(&case.backend)?;
            if matches!(case.prep, Prep::None) {
                let (scope, opts, fence) = t.held_run("renew-after").await?;
                work::fill_checkpoints(t, &scope, fence, n).await?;
                case.prep = Prep::Held(scope, opts);
            }
            let Prep::Held(scope, opts) = &case.prep else {
                unreachable!("prepared above")
            };
            work::renew_loop(t, scope, opts, budget).await
        }
        Kind::Drain(w, way, keyed) => {
            let t = env.target(&case.backend)?;
            // A batch drain may take a whole batch per worker at once.
            let (probe, cap) = match way {
                work::DrainWay::Batch(b) => ((w * b) as u64 * 4 + 10, s.drain_cap * 5),
                _ => (4 * w as u64 + 10, s.drain_cap),
            };
            let hint = match case.hint {
                Some(h) => h,
                None => {
                    // A probe (not counted): the rate to provision by.
                    let session = work::fresh_session();
                    work::fill_drain_queue(t, &session, 0, probe, keyed).await?;
                    work::drain(t, &session, w, way, budget, 0).await?.rate()
                }
            };
            let n = provision(hint, budget, w, cap);
            let session = work::fresh_session();
            work::fill_drain_queue(t, &session, 0, n, keyed).await?;
            let sample = work::drain(t, &session, w, way, budget, 0).await?;
            case.hint = Some(sample.rate());
            Ok(sample)
        }
        Kind::ClaimNextAt(size, mix) => {
            let t = env.target(&case.backend)?;
            if matches!(case.prep, Prep::None) {
                let session = work::queued_session(t, size as usize, mix).await?;
                case.prep = Prep::Queue { session, next: 0 };
            }
            let Prep::Queue { session, .. } = &case.prep else {
                unreachable!("prepared above")
            };
            work::claim_next_cycle(t, session, budget).await
        }
        Kind::DrainQueued(depth, w) => {
            let t = env.target(&case.backend)?;
            if matches!(case.prep, Prep::None) {
                let session = work::fresh_session();
                work::fill_drain_queue(t, &session, 0, depth, false).await?;
                case.prep = Prep::Queue {
                    session,
                    next: depth,
                };
            }
            let Prep::Queue { session, next } = &mut case.prep else {
                unreachable!("prepared above")
            };
            let done_before = (*next - depth) as usize;
            let sample =
                work::drain(t, session, w, work::DrainWay::Calls, budget, done_before).await?;
            // Top the queue up to its depth again (not timed).
            let done = sample.units as u64;
            work::fill_drain_queue(t, session, *next, done, false).await?;
            *next += done;
            Ok(sample)
        }
        Kind::FsBase(base) => {
            let dir = env
                .fs_dir
                .as_ref()
                .ok_or("no directory for the fs baselines")?
                .join(format!("base-{}", case.op));
            tokio::task::spawn_blocking(move || fsbase::measure(base, &dir, budget))
                .await
                .ctx("fs baseline")?
        }
        Kind::PgSelect1 => baselines(env)?.select1(budget).await,
        Kind::PgUpdate => baselines(env)?.update_commit(budget).await,
        Kind::PgSkipLocked(w) => {
            let b = baselines(env)?;
            let hint = match case.hint {
                Some(h) => h,
                None => {
                    let queue = b.fill(4 * w as u64 + 10).await?;
                    b.skip_locked(&queue, w, budget).await?.rate()
                }
            };
            let queue = b.fill(provision(hint, budget, w, s.drain_cap * 5)).await?;
            let sample = b.skip_locked(&queue, w, budget).await?;
            case.hint = Some(sample.rate());
            Ok(sample)
        }
        Kind::Peer(lib, mode, w) => {
            let cap = s.drain_cap * 5;
            let hint = match case.hint {
                Some(h) => h,
                None => {
                    // A probe (not counted), grown until the peer takes a
                    // measurable time (some finish a small batch between two
                    // polls of the clock; the defaults of others poll every 2 s).
                    let mut jobs = 4 * w as u64;
                    loop {
                        let probe = peer_once(env, lib, mode, w, jobs).await?;
                        if (probe.units >= 1.0 && probe.secs >= 0.05) || jobs >= cap {
                            break probe.rate();
                        }
                        jobs = (jobs * 10).min(cap);
                    }
                }
            };
            let sample = peer_once(env, lib, mode, w, provision(hint, budget, w, cap)).await?;
            if sample.units < 1.0 {
                return Err(format!(
                    "{lib} {mode}: every job was done before the first look at the clock; give it more time (--seconds)"
                ));
            }
            case.hint = Some(sample.rate());
            Ok(sample)
        }
    }
}

/// One run of a peer on `jobs` jobs, in a schema of its own (dropped
/// after).
async fn peer_once(
    env: &Env,
    lib: &'static str,
    mode: &'static str,
    workers: usize,
    jobs: u64,
) -> Result<Sample, String> {
    let p = env.peers.clone().ok_or("the peers are not installed")?;
    let schema = format!(
        "{}_peer_{}",
        env.schema_base,
        runkeep::id::random_suffix(6).to_lowercase()
    );
    env.extra_schemas
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(schema.clone());
    let (url, sch) = (env.pg_url.clone(), schema.clone());
    let r = tokio::task::spawn_blocking(move || p.measure(&url, lib, mode, workers, jobs, &sch))
        .await
        .ctx("peer")?;
    let _ = pg::drop_schemas(&env.pg_url, &[schema]).await;
    r
}

fn baselines(env: &Env) -> Result<&pg::Baselines, String> {
    env.baselines
        .as_ref()
        .ok_or_else(|| "the PostgreSQL baselines are not set up".to_string())
}

/// Opens what the selected cases need; a backend that cannot be opened is
/// reported and its cases skipped.
async fn open_env(
    args: &BenchArgs,
    settings: Settings,
    cases: &[Case],
    servers: &mut Vec<serve::InProcessServer>,
    skipped: &mut Vec<(String, String)>,
) -> BenchResult<Env> {
    let needs = |backend: &str| cases.iter().any(|c| c.backend == backend);
    let needs_pg = needs("pg")
        || AB_STORES.iter().any(|(b, ..)| needs(b))
        || needs("serve-pg")
        || cases.iter().any(|c| c.group == "peers");
    let needs_fs = needs("fs") || needs(FS_GRACE_OFF) || needs("fs-powerloss") || needs("serve-fs");
    let (tenant, project) = Target::ids();
    let mut env = Env {
        settings,
        targets: BTreeMap::new(),
        baselines: None,
        peers: None,
        pg_url: args.pg_url.clone(),
        schema_base: pg::base_name(),
        fs_dir: None,
        extra_schemas: std::sync::Mutex::new(Vec::new()),
    };
    let target = |store: Arc<dyn RunStore>, fill| Target {
        store,
        tenant: tenant.clone(),
        project: project.clone(),
        fill_concurrency: fill,
    };
    if needs("memory") {
        env.targets
            .insert("memory", target(Arc::new(MemoryStore::new()), 1));
    }
    if needs_fs {
        let parent = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
        let dir = tempfile::Builder::new()
            .prefix(".runkeep-bench-")
            .tempdir_in(&parent)
            .map_err(|e| {
                BenchError::config(format!(
                    "cannot create a directory for the fs stores in {}: {e}",
                    parent.display()
                ))
                .hint("pass --dir DIR on the filesystem to measure")
            })?
            .keep();
        for (name, durability, prune_grace) in [
            (
                "fs",
                Durability::ProcessCrash,
                FsOptions::DEFAULT_PRUNE_GRACE,
            ),
            (FS_GRACE_OFF, Durability::ProcessCrash, Duration::ZERO),
            (
                "fs-powerloss",
                Durability::PowerLoss,
                FsOptions::DEFAULT_PRUNE_GRACE,
            ),
        ] {
            if !needs(name) {
                continue;
            }
            let store = FsRootStore::open(
                dir.join(name),
                FsRootOptions {
                    durability,
                    prune_grace,
                    ..FsRootOptions::default()
                },
            )
            .map_err(|e| BenchError::config(format!("open the {name} store: {e}")))?;
            env.targets.insert(name, target(Arc::new(store), 4));
        }
        if needs("serve-fs") {
            let root = dir.join("serve-fs");
            let server = serve::InProcessServer::start(
                "fs",
                tenant.clone(),
                Box::new(move || {
                    Box::pin(async move {
                        let store = FsRootStore::open(root, FsRootOptions::default())
                            .map_err(|e| format!("open the served fs store: {e}"))?;
                        Ok(Arc::new(store) as Arc<dyn RunStore>)
                    })
                }),
            )
            .map_err(BenchError::failed)?;
            let client = server.client(tenant.clone()).map_err(BenchError::failed)?;
            env.targets.insert("serve-fs", target(Arc::new(client), 8));
            servers.push(server);
        }
        env.fs_dir = Some(dir);
    }
    if needs_pg {
        match pg::connect(&args.pg_url).await {
            Err(e) => {
                let why = format!("PostgreSQL at --pg-url is not reachable ({e})");
                output::warn(&format!("{why}: skipping its cases"));
                for b in ["pg", "serve-pg", "graphile-worker", "pg-boss"]
                    .into_iter()
                    .chain(AB_STORES.map(|(b, ..)| b))
                {
                    skipped.push((b.to_string(), why.clone()));
                }
            }
            Ok(_) => {
                let notify = NotifyMode::from(args.pg_notify);
                let options = move |schema: String| PgOptions {
                    schema,
                    pool_size: PG_POOL,
                    notify,
                    ..PgOptions::default()
                };
                if needs("pg") {
                    let schema = format!("{}_pg", env.schema_base);
                    let store = PgStore::connect(&args.pg_url, options(schema))
                        .await
                        .map_err(|e| BenchError::failed(format!("open the pg store: {e}")))?;
                    env.targets.insert("pg", target(Arc::new(store), 8));
                    env.baselines = Some(
                        pg::Baselines::create(&args.pg_url, &format!("{}_base", env.schema_base))
                            .await
                            .map_err(BenchError::failed)?,
                    );
                }
                // The A/B stores, each in a schema of its own.
                for (name, suffix, earlier) in AB_STORES {
                    if !needs(name) {
                        continue;
                    }
                    let mut o = options(format!("{}_{suffix}", env.schema_base));
                    earlier(&mut o);
                    let store = PgStore::connect(&args.pg_url, o)
                        .await
                        .map_err(|e| BenchError::failed(format!("open the {name} store: {e}")))?;
                    env.targets.insert(name, target(Arc::new(store), 8));
                }
                if needs("serve-pg") {
                    let (url, schema) = (args.pg_url.clone(), format!("{}_serve", env.schema_base));
                    let server = serve::InProcessServer::start(
                        "pg",
                        tenant.clone(),
                        Box::new(move || {
                            Box::pin(async move {
                                let store = PgStore::connect(&url, options(schema))
                                    .await
                                    .map_err(|e| format!("open the served pg store: {e}"))?;
                                Ok(Arc::new(store) as Arc<dyn RunStore>)
                            })
                        }),
                    )
                    .map_err(BenchError::failed)?;
                    let client = server.client(tenant.clone()).map_err(BenchError::failed)?;
                    env.targets.insert("serve-pg", target(Arc::new(client), 8));
                    servers.push(server);
                }
                if cases.iter().any(|c| c.group == "peers") {
                    let dir = args.peers_dir.clone();
                    match tokio::task::spawn_blocking(move || peers::Peers::install(&dir))
                        .await
                        .ctx("install the peers")
                        .and_then(|r| r)
                    {
                        Ok(p) => env.peers = Some(p),
                        Err(e) => {
                            output::warn(&format!("the peers cannot run: {e}"));
                            for b in ["graphile-worker", "pg-boss"] {
                                skipped.push((b.to_string(), e.clone()));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(env)
}

/// Removes what the run made: servers, schemas, directories.
async fn clean_up(env: Env, servers: Vec<serve::InProcessServer>) -> Vec<String> {
    let mut problems = Vec::new();
    let Env {
        targets,
        baselines,
        pg_url,
        schema_base,
        fs_dir,
        extra_schemas,
        ..
    } = env;
    drop(targets);
    drop(baselines);
    let _ = tokio::task::spawn_blocking(move || drop(servers)).await;
    let mut schemas: Vec<String> = ["pg", "pgc", "pgs", "serve", "base"]
        .iter()
        .map(|s| format!("{schema_base}_{s}"))
        .collect();
    schemas.extend(
        extra_schemas
            .into_inner()
            .unwrap_or_else(|p| p.into_inner()),
    );
    if pg::connect(&pg_url).await.is_ok() {
        if let Err(e) = pg::drop_schemas(&pg_url, &schemas).await {
            problems.push(e);
        }
    }
    if let Some(dir) = fs_dir {
        let d = dir.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&d)).await {
            problems.push(format!("could not remove {}: {e}", dir.display()));
        }
    }
    problems
}

/// The bench.
async fn run(args: BenchArgs) -> BenchResult<Exit> {
    if let Some(rounds) = args.wake {
        return wake::run(&args, rounds).await;
    }
    let settings = Settings::of(&args)?;
    let mut cases = all_cases(&settings, args.scaling, args.peers, args.grace_off);
    if !args.ab && args.only.is_empty() {
        cases.retain(|c| !is_ab_store(&c.backend));
    }
    if !args.only.is_empty() {
        cases.retain(|c| {
            args.only.iter().any(|p| match p.strip_prefix('=') {
                Some(exact) => c.name == exact,
                None => c.name.contains(p.as_str()),
            })
        });
        if cases.is_empty() {
            return Err(BenchError::usage(format!(
                "--only {} selects no case",
                args.only.join(",")
            ))
            .hint(
                "list the cases with `runkeep-bench --list` (add --scaling / --peers for theirs)",
            ));
        }
    }
    if args.list {
        let text: String = cases
            .iter()
            .map(|c| format!("{}\t{}\n", c.name, c.what))
            .collect();
        output::emit(&text)?;
        return Ok(Exit::Ok);
    }
    let started_at = runkeep::Timestamp::now();
    let clock = Instant::now();
    let mut servers = Vec::new();
    let mut skipped = Vec::new();
    let env = open_env(&args, settings.clone(), &cases, &mut servers, &mut skipped).await?;
    cases.retain(|c| !skipped.iter().any(|(b, _)| *b == c.backend));
    let pg_info = if env.targets.contains_key("pg") || env.targets.contains_key("serve-pg") {
        pg::server_info(&env.pg_url).await.ok()
    } else {
        None
    };
    let total = cases.len() * settings.reps;
    let rounds = async {
        let mut done = 0;
        for rep in 0..settings.reps {
            for case in cases.iter_mut() {
                done += 1;
                if case.error.is_some() {
                    continue;
                }
                match measure(&env, case).await {
                    Ok(sample) => {
                        output::note(&format!(
                            "[{done}/{total}] rep {}: {} {} {}",
                            rep + 1,
                            case.name,
                            human_rate(sample.rate()),
                            case.unit
                        ));
                        case.rates.push(sample.rate());
                        case.latencies.extend(sample.latencies_us);
                    }
                    Err(e) => {
                        output::warn(&format!("{}: {e}", case.name));
                        case.error = Some(e);
                    }
                }
            }
        }
    };
    // Ctrl-C stops the measurements; what was made is still removed.
    let interrupted = tokio::select! {
        () = rounds => false,
        _ = tokio::signal::ctrl_c() => true,
    };
    if interrupted {
        output::warn("interrupted: removing the bench's stores; the figures so far follow");
    }
    let peers_node = env.peers.as_ref().map(|p| p.node.clone());
    let fs_dir = env.fs_dir.clone();
    let problems = clean_up(env, servers).await;
    for p in &problems {
        output::warn(p);
    }
    let ratios = ratios(&cases, &settings);
    let report = json!({
        "runkeep": env!("CARGO_PKG_VERSION"),
        "command": std::env::args().skip(1).map(|a| output::redact(&a)).collect::<Vec<_>>().join(" "),
        "startedAt": output::iso(started_at),
        "seconds": clock.elapsed().as_secs_f64(),
        "preliminary": settings.quick,
        "settings": {
            "quick": settings.quick,
            "reps": settings.reps,
            "secondsPerMeasurement": settings.budget.as_secs_f64(),
            "listingRuns": settings.listing_runs,
            "catchUpEvents": settings.catch_up_events,
            "scalingSize": args.scaling.then_some(settings.scaling_size),
            "pgPoolSize": PG_POOL,
            "fsDir": fs_dir.as_deref().and_then(Path::parent).map(|p| p.display().to_string()),
        },
        "machine": machine(pg_info, peers_node),
        "cases": cases.iter().map(case_json).collect::<Vec<_>>(),
        "ratios": ratios.iter().map(Ratio::json).collect::<Vec<_>>(),
        "skipped": skipped.iter().map(|(b, why)| json!({"backend": b, "why": why})).collect::<Vec<_>>(),
    });
    if let Some(path) = &args.json_out {
        write_outputs(path, &report, &cases, &ratios, args.update_doc.as_deref())?;
    }
    if args.json {
        output::emit_json(&report)?;
    } else {
        output::emit(&render(
            &Style::stdout(),
            &cases,
            &ratios,
            &skipped,
            &settings,
        ))?;
        if let Some(path) = &args.json_out {
            output::note(&format!(
                "figures written to {} (plots beside it)",
                path.display()
            ));
        }
    }
    if cases.iter().any(|c| c.error.is_some()) {
        return Err(BenchError::failed(
            "some cases failed (see the warnings above)",
        ));
    }
    Ok(Exit::Ok)
}

fn main() -> ExitCode {
    let args = match BenchArgs::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's usage errors exit 64, as runkeep's do (not clap's 2).
            let _ = e.print();
            return ExitCode::from(Exit::Usage.code());
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            BenchError::internal(format!("cannot start the async runtime: {e}")).report();
            return ExitCode::from(Exit::Internal.code());
        }
    };
    let exit = match runtime.block_on(run(args)) {
        Ok(exit) => exit,
        Err(err) => {
            err.report();
            err.exit
        }
    };
    ExitCode::from(exit.code())
}

fn case_json(c: &Case) -> Value {
    let (lo, hi) = min_max(&c.rates);
    json!({
        "name": c.name,
        "backend": c.backend,
        "op": c.op,
        "group": c.group,
        "workers": c.workers,
        "unit": c.unit,
        "what": c.what,
        "median": median(&c.rates),
        "min": lo,
        "max": hi,
        "rates": c.rates,
        "p50Us": percentile(&c.latencies, 50.0),
        "p99Us": percentile(&c.latencies, 99.0),
        "error": c.error,
    })
}

/// The machine, for the record (read where it can be; `unknown` otherwise).
fn machine(pg: Option<Value>, node: Option<String>) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| (kb / 1024.0 / 1024.0 * 10.0).round() / 10.0);
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "memoryGiB": mem_gib,
        "os": std::env::consts::OS,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "loadAverage": read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "postgres": pg,
        "node": node,
        "peerVersions": node.as_ref().map(|_| peers::versions()),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

/// A comparison between two cases (or a case and a reference figure).
#[derive(Debug)]
struct Ratio {
    what: String,
    num: String,
    den: String,
    /// Times rather than rates: `den / num` (how many times longer).
    time: bool,
    values: Vec<f64>,
    target: Option<(bool, f64)>,
    note: &'static str,
}

impl Ratio {
    fn median(&self) -> f64 {
        median(&self.values)
    }

    fn verdict(&self) -> Option<bool> {
        let (at_least, v) = self.target?;
        if self.values.is_empty() {
            return None;
        }
        let m = self.median();
        Some(if at_least { m >= v } else { m <= v })
    }

    fn target_text(&self) -> String {
        match self.target {
            Some((true, v)) => format!("≥ {v}×"),
            Some((false, v)) => format!("≤ {v}×"),
            None => "-".into(),
        }
    }

    fn json(&self) -> Value {
        let (lo, hi) = min_max(&self.values);
        json!({
            "what": self.what,
            "numerator": self.num,
            "denominator": self.den,
            "kind": if self.time { "time" } else { "rate" },
            "median": self.median(),
            "min": lo,
            "max": hi,
            "perRep": self.values,
            "target": self.target_text(),
            "met": self.verdict(),
            "note": self.note,
        })
    }
}

/// The comparisons the targets name (and a few that explain them), for
/// the cases that ran.
fn ratios(cases: &[Case], s: &Settings) -> Vec<Ratio> {
    let find = |name: &str| cases.iter().find(|c| c.name == name && !c.rates.is_empty());
    let mut out = Vec::new();
    let mut pairs = Vec::new();
    let mut pair = |what: String,
                    num: &str,
                    den: &str,
                    time: bool,
                    target: Option<(bool, f64)>,
                    note: &'static str| {
        pairs.push((what, num.to_string(), den.to_string(), time, target, note));
    };
    for w in WORKERS {
        pair(
            format!("pg drain by hand-overs vs SKIP LOCKED loop (same writes, 2 round trips) @{w}"),
            &format!("pg/handover@{w}"),
            &format!("pg/base.skip-locked@{w}"),
            false,
            Some((true, 0.8)),
            "target",
        );
        pair(
            format!("pg drain cycle (claim_next + commit_step) vs SKIP LOCKED loop @{w}"),
            &format!("pg/drain@{w}"),
            &format!("pg/base.skip-locked@{w}"),
            false,
            None,
            "two calls and two commits a run",
        );
    }
    for w in [8, 16] {
        pair(
            format!("pg drain by hand-overs vs graphile-worker default @{w}"),
            &format!("pg/handover@{w}"),
            &format!("graphile-worker/default@{w}"),
            false,
            Some((true, 1.5)),
            "target (runkeep fences every write; graphile-worker does not)",
        );
        pair(
            format!("pg drain cycle (two calls) vs graphile-worker default @{w}"),
            &format!("pg/drain@{w}"),
            &format!("graphile-worker/default@{w}"),
            false,
            None,
            "",
        );
        for (lib, mode) in peers::PEERS.into_iter().skip(1) {
            pair(
                format!("pg drain by hand-overs vs {lib} {mode} @{w}"),
                &format!("pg/handover@{w}"),
                &format!("{lib}/{mode}@{w}"),
                false,
                None,
                "",
            );
        }
    }
    // Issue 32's targets (docs: BENCHMARKS.md, "The targets").
    for w in WORKERS {
        pair(
            format!("issue 32: pg single-run cycle (hand-over drain) vs SKIP LOCKED loop @{w}"),
            &format!("pg/handover@{w}"),
            &format!("pg/base.skip-locked@{w}"),
            false,
            Some((true, 0.6)),
            "issue 32 target",
        );
    }
    for w in [8, 16] {
        pair(
            format!("issue 32: pg hand-over drain vs graphile-worker default @{w}"),
            &format!("pg/handover@{w}"),
            &format!("graphile-worker/default@{w}"),
            false,
            Some((true, 1.2)),
            "issue 32 target",
        );
        pair(
            format!("issue 32: pg batched drain vs graphile-worker batched @{w}"),
            &format!("pg/batch{DRAIN_BATCH}@{w}"),
            &format!("graphile-worker/batched@{w}"),
            false,
            Some((true, 1.0)),
            "issue 32 target",
        );
        pair(
            format!("pg batched drain, 20 concurrency keys vs graphile-worker batched @{w}"),
            &format!("pg/batch{DRAIN_BATCH}.keys20@{w}"),
            &format!("graphile-worker/batched@{w}"),
            false,
            None,
            "graphile-worker has no per-key limits",
        );
        for way in ["handover", &format!("batch{DRAIN_BATCH}")] {
            pair(
                format!("issue 32: serve-pg vs pg in process, {way} @{w}"),
                &format!("serve-pg/{way}@{w}"),
                &format!("pg/{way}@{w}"),
                false,
                Some((true, 0.9)),
                "issue 32 target",
            );
        }
    }
    for w in WORKERS {
        pair(
            format!("pg batched drain vs hand-over drain @{w}"),
            &format!("pg/batch{DRAIN_BATCH}@{w}"),
            &format!("pg/handover@{w}"),
            false,
            None,
            "what batches of 16 give",
        );
        pair(
            format!("pg batched drain, 20 keys vs none @{w}"),
            &format!("pg/batch{DRAIN_BATCH}.keys20@{w}"),
            &format!("pg/batch{DRAIN_BATCH}@{w}"),
            false,
            None,
            "what concurrency keys cost a batched drain",
        );
    }
    for w in WORKERS {
        pair(
            format!("serve-pg drain by hand-overs vs pg in process @{w}"),
            &format!("serve-pg/handover@{w}"),
            &format!("pg/handover@{w}"),
            false,
            (w == 8).then_some((true, 0.85)),
            if w == 8 { "target" } else { "" },
        );
        pair(
            format!("serve-pg drain cycle (two calls) vs pg in process @{w}"),
            &format!("serve-pg/drain@{w}"),
            &format!("pg/drain@{w}"),
            false,
            None,
            "",
        );
    }
    for (op, what) in [
        ("claim+release", "claim+release"),
        ("renew", "renew"),
        ("drain@1", "drain cycle @1"),
        ("drain@8", "drain cycle @8"),
        ("drain@16", "drain cycle @16"),
        ("handover@8", "drain by hand-overs @8"),
    ] {
        pair(
            format!("fs {what}, prune grace 5 s vs off"),
            &format!("fs/{op}"),
            &format!("{FS_GRACE_OFF}/{op}"),
            false,
            None,
            "the cost of keeping young holding names (--grace-off)",
        );
    }
    for w in WORKERS {
        pair(
            format!("pg drain by hand-overs, step writes in one statement vs one each @{w}"),
            &format!("pg/handover@{w}"),
            &format!("pg-split/handover@{w}"),
            false,
            None,
            "issue 32: the step's writes as one data-modifying statement",
        );
    }
    for w in WORKERS {
        for keys in ["", ".keys20"] {
            pair(
                format!("pg batched drain{keys}, keyed runs taken with the batch's first statement vs one search each @{w}"),
                &format!("pg/batch{DRAIN_BATCH}{keys}@{w}"),
                &format!("pg-keyed1/batch{DRAIN_BATCH}{keys}@{w}"),
                false,
                None,
                "issue 32: a batch's keyed runs judged together",
            );
        }
    }
    for w in WORKERS {
        for op in ["handover", "batch16"] {
            pair(
                format!("pg {op} drain, candidates read with a slack vs only the first @{w}"),
                &format!("pg/{op}@{w}"),
                &format!("pg-noslack/{op}@{w}"),
                false,
                None,
                "issue 32: SKIP LOCKED passes the runs other claimers lock in the same statement",
            );
        }
    }
    for w in WORKERS {
        pair(
            format!("pg drain by hand-overs, wake-ups coalesced vs immediate @{w}"),
            &format!("pg-coalesced/handover@{w}"),
            &format!("pg/handover@{w}"),
            false,
            None,
            "NOTIFY outside the data transaction",
        );
    }
    for w in WORKERS {
        pair(
            format!("pg drain by hand-overs vs two calls @{w}"),
            &format!("pg/handover@{w}"),
            &format!("pg/drain@{w}"),
            false,
            None,
            "what one commit a run instead of two gives",
        );
    }
    for w in WORKERS {
        pair(
            format!("serve-fs drain cycle vs fs in process @{w}"),
            &format!("serve-fs/drain@{w}"),
            &format!("fs/drain@{w}"),
            false,
            None,
            "",
        );
    }
    pair(
        "pg drain by hand-overs @1, in SELECT 1 round trips (time)".into(),
        "pg/handover@1",
        "pg/base.select-1",
        true,
        None,
        "how many round trips one run costs",
    );
    pair(
        "pg drain by hand-overs @1, in single-row UPDATE commits (time)".into(),
        "pg/handover@1",
        "pg/base.update-commit",
        true,
        None,
        "how many durable commits one run costs",
    );
    pair(
        "pg drain cycle @1, in SELECT 1 round trips (time)".into(),
        "pg/drain@1",
        "pg/base.select-1",
        true,
        None,
        "how many round trips one cycle costs",
    );
    pair(
        "pg drain cycle @1, in single-row UPDATE commits (time)".into(),
        "pg/drain@1",
        "pg/base.update-commit",
        true,
        None,
        "how many durable commits one cycle costs",
    );
    pair(
        "pg step commit, in single-row UPDATE commits (time)".into(),
        "pg/step-commit",
        "pg/base.update-commit",
        true,
        None,
        "",
    );
    pair(
        "fs-powerloss checkpoint 4k vs bare atomic publish with fsync".into(),
        "fs-powerloss/checkpoint-4k",
        "fs/base.publish-4k",
        false,
        None,
        "share of the disk's floor",
    );
    pair(
        "fs checkpoint 4k vs bare atomic publish without fsync".into(),
        "fs/checkpoint-4k",
        "fs/base.publish-nosync-4k",
        false,
        None,
        "share of the filesystem's floor",
    );
    let mut later = Vec::new();
    for b in ["fs", "fs-powerloss"] {
        if let Some(c) = find(&format!("{b}/claim+release")) {
            later.push(Ratio {
                what: format!(
                    "{b} claim+release vs the reference design ({REFERENCE_CLAIM_RELEASE}/s)"
                ),
                num: c.name.clone(),
                den: format!(
                    "{REFERENCE_CLAIM_RELEASE}/s (the reference design's figure, not re-measured)"
                ),
                time: false,
                values: c
                    .rates
                    .iter()
                    .map(|r| r / REFERENCE_CLAIM_RELEASE)
                    .collect(),
                target: (b == "fs").then_some((true, 20.0)),
                note: if b == "fs" {
                    "target (the default durability)"
                } else {
                    ""
                },
            });
        }
    }
    let n = s.scaling_size;
    for b in ["fs", "pg"] {
        pair(
            format!("{b} renew after {n} vs after 10 checkpoints (time)"),
            &format!("{b}/renew.after-{n}"),
            &format!("{b}/renew.after-10"),
            true,
            Some((false, 1.2)),
            "target",
        );
        pair(
            format!("{b} listing first page at {n} vs 1000 runs (time)"),
            &format!("{b}/list.runs-{n}"),
            &format!("{b}/list.runs-1000"),
            true,
            Some((false, 2.0)),
            "target",
        );
        pair(
            format!("{b} catch-up at {} vs 1000 events (time)", 10 * n),
            &format!("{b}/catch-up.events-{}", 10 * n),
            &format!("{b}/catch-up.events-1000"),
            true,
            (10 * n >= 1_000_000).then_some((false, 2.0)),
            "target at 1 000 000 events",
        );
    }
    for b in ["fs", "pg"] {
        for size in [1000, n] {
            for mix in ["priority", "keys20"] {
                pair(
                    format!("{b} claim_next with {mix} vs plain at {size} queued (time)"),
                    &format!("{b}/claim-next.{mix}-{size}"),
                    &format!("{b}/claim-next.plain-{size}"),
                    true,
                    Some((false, 1.5)),
                    "target",
                );
            }
        }
    }
    pair(
        format!("pg drain @8 with {n} vs 1000 runs queued (rate)"),
        &format!("pg/drain.queued-{n}@8"),
        "pg/drain.queued-1000@8",
        false,
        None,
        "",
    );
    for (what, num, den, time, target, note) in pairs {
        if let (Some(n), Some(d)) = (find(&num), find(&den)) {
            let values = if time {
                paired(&d.rates, &n.rates)
            } else {
                paired(&n.rates, &d.rates)
            };
            out.push(Ratio {
                what,
                num,
                den,
                time,
                values,
                target,
                note,
            });
        }
    }
    out.extend(later);
    out
}

fn spread(values: &[f64], fmt: impl Fn(f64) -> String) -> String {
    let (lo, hi) = min_max(values);
    format!("{}–{}", fmt(lo), fmt(hi))
}

fn ratio_text(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The human report.
fn render(
    style: &Style,
    cases: &[Case],
    ratios: &[Ratio],
    skipped: &[(String, String)],
    s: &Settings,
) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "runkeep-bench{}: {} repetitions of {} s per case, alternating; median (min–max)\n",
        if s.quick {
            " --quick (preliminary: short measurements)"
        } else {
            ""
        },
        s.reps,
        s.budget.as_secs_f64()
    ));
    let mut backends: Vec<&str> = Vec::new();
    for c in cases {
        if !backends.contains(&c.backend.as_str()) {
            backends.push(&c.backend);
        }
    }
    backends.sort_by_key(|b| table_rank(b));
    for b in backends {
        out.push('\n');
        out.push_str(&style.paint(b, Color::Bold));
        out.push('\n');
        let mut table = Table::new(&["case", "median", "min–max", "unit", "p50", "p99"]);
        for c in cases.iter().filter(|c| c.backend == b) {
            if let Some(e) = &c.error {
                table.row(vec![
                    c.op.as_str().into(),
                    Cell::colored("failed", Color::Red),
                    "-".into(),
                    c.unit.into(),
                    "-".into(),
                    Cell::colored(output::truncate(e, 80), Color::Red),
                ]);
                continue;
            }
            let lat = |p| {
                percentile(&c.latencies, p)
                    .map(human_us)
                    .unwrap_or_else(|| "-".into())
            };
            table.row(vec![
                c.op.as_str().into(),
                human_rate(median(&c.rates)).into(),
                spread(&c.rates, human_rate).into(),
                c.unit.into(),
                lat(50.0).into(),
                lat(99.0).into(),
            ]);
        }
        out.push_str(&table.render(style));
    }
    if !ratios.is_empty() {
        out.push('\n');
        out.push_str(&style.paint("ratios (per repetition, paired)", Color::Bold));
        out.push('\n');
        let mut table = Table::new(&["ratio", "median", "min–max", "target", "verdict"]);
        for r in ratios {
            let verdict = match r.verdict() {
                Some(true) => Cell::colored("met", Color::Green),
                Some(false) => Cell::colored("missed", Color::Red),
                None => "-".into(),
            };
            table.row(vec![
                r.what.as_str().into(),
                format!("{}×", ratio_text(r.median())).into(),
                spread(&r.values, ratio_text).into(),
                r.target_text().into(),
                verdict,
            ]);
        }
        out.push_str(&table.render(style));
    }
    for (b, why) in skipped {
        out.push_str(&format!("\nskipped {b}: {why}"));
    }
    if !skipped.is_empty() {
        out.push('\n');
    }
    out
}

/// The JSON report and the plots beside it.
fn write_outputs(
    path: &Path,
    report: &Value,
    cases: &[Case],
    ratios: &[Ratio],
    update_doc: Option<&Path>,
) -> BenchResult<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(d) = dir {
        std::fs::create_dir_all(d)
            .map_err(|e| BenchError::failed(format!("create {}: {e}", d.display())))?;
    }
    let text = serde_json::to_string_pretty(report)
        .map_err(|e| BenchError::internal(format!("encode the report: {e}")))?;
    std::fs::write(path, format!("{text}\n"))
        .map_err(|e| BenchError::failed(format!("write {}: {e}", path.display())))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bench".into());
    let beside = |name: &str| match dir {
        Some(d) => d.join(format!("{stem}-{name}.svg")),
        None => PathBuf::from(format!("{stem}-{name}.svg")),
    };
    let md = match dir {
        Some(d) => d.join(format!("{stem}.md")),
        None => PathBuf::from(format!("{stem}.md")),
    };
    std::fs::write(&md, markdown(report, cases, ratios, &stem))
        .map_err(|e| BenchError::failed(format!("write {}: {e}", md.display())))?;
    if let Some(doc) = update_doc {
        let images = image_prefix(doc, dir.unwrap_or(Path::new(".")), &stem);
        splice(doc, &markdown(report, cases, ratios, &images))?;
    }
    for (name, chart) in charts(cases) {
        let file = beside(&name);
        std::fs::write(&file, svg::render(&chart))
            .map_err(|e| BenchError::failed(format!("write {}: {e}", file.display())))?;
    }
    Ok(())
}

/// The markers of the generated part of a document (`--update-doc`).
const DOC_BEGIN: &str = "<!-- runkeep bench: figures begin -->";
const DOC_END: &str = "<!-- runkeep bench: figures end -->";

/// The plots' path as seen from `doc`'s directory: `<dir>/<stem>`.
fn image_prefix(doc: &Path, dir: &Path, stem: &str) -> String {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let doc_dir = abs(doc
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new(".")));
    let dir = abs(dir);
    match dir.strip_prefix(&doc_dir) {
        Ok(rel) if rel.as_os_str().is_empty() => stem.to_string(),
        Ok(rel) => format!("{}/{stem}", rel.display()),
        Err(_) => format!("{}/{stem}", dir.display()),
    }
}

/// Replaces what lies between [`DOC_BEGIN`] and [`DOC_END`] in `doc`.
fn splice(doc: &Path, figures: &str) -> BenchResult<()> {
    let text = std::fs::read_to_string(doc)
        .map_err(|e| BenchError::failed(format!("read {}: {e}", doc.display())))?;
    let (Some(b), Some(e)) = (text.find(DOC_BEGIN), text.find(DOC_END)) else {
        return Err(BenchError::failed(format!(
            "{} has no {DOC_BEGIN} … {DOC_END} section to replace",
            doc.display()
        )));
    };
    if e < b {
        return Err(BenchError::failed(format!(
            "{}: {DOC_END} comes before {DOC_BEGIN}",
            doc.display()
        )));
    }
    let updated = format!("{}{DOC_BEGIN}\n\n{figures}\n{}", &text[..b], &text[e..]);
    std::fs::write(doc, updated)
        .map_err(|e| BenchError::failed(format!("write {}: {e}", doc.display())))
}

/// The figures as Markdown (what BENCHMARKS.md quotes): the machine, a
/// table per backend, the ratios, the plots.
fn markdown(report: &Value, cases: &[Case], ratios: &[Ratio], images: &str) -> String {
    let m = &report["machine"];
    let st = &report["settings"];
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let mut out = String::new();
    out.push_str(&format!(
        "Run {} ({} build), `runkeep-bench {}`: {} repetitions of {} s per case, alternating; {:.0} s in all.{}\n\n",
        text(&report["startedAt"]),
        text(&m["build"]),
        text(&report["command"]),
        text(&st["reps"]),
        text(&st["secondsPerMeasurement"]),
        report["seconds"].as_f64().unwrap_or(0.0),
        if report["preliminary"] == true {
            " **Preliminary (`--quick`): short measurements; judge by a full run.**"
        } else {
            ""
        }
    ));
    out.push_str(&format!(
        "- Machine: {} CPUs ({}), {} GiB, Linux {}; load average at the end {}.\n",
        text(&m["cpus"]),
        text(&m["cpu"]),
        text(&m["memoryGiB"]),
        text(&m["kernel"]),
        text(&m["loadAverage"])
    ));
    if let Some(pg) = m["postgres"].as_object() {
        let set = &pg["settings"];
        out.push_str(&format!(
            "- PostgreSQL {} on 127.0.0.1: fsync {}, synchronous_commit {}, wal_sync_method {}, shared_buffers {}, autovacuum {}; pool {} connections per store.\n",
            text(&set["server_version"]),
            text(&set["fsync"]),
            text(&set["synchronous_commit"]),
            text(&set["wal_sync_method"]),
            text(&set["shared_buffers"]),
            text(&set["autovacuum"]),
            text(&st["pgPoolSize"]),
        ));
    }
    if let Some(node) = m["node"].as_str() {
        out.push_str(&format!(
            "- Node {node}; peers {}.\n",
            m["peerVersions"]
                .as_object()
                .map(|o| o
                    .iter()
                    .map(|(k, v)| format!("{k} {}", text(v)))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ));
    }
    let mut backends: Vec<&str> = Vec::new();
    for c in cases {
        if !backends.contains(&c.backend.as_str()) {
            backends.push(&c.backend);
        }
    }
    backends.sort_by_key(|b| table_rank(b));
    for b in backends {
        out.push_str(&format!(
            "\n#### {b}\n\n| case | median | min–max | unit | p50 | p99 | what |\n|---|---:|---:|---|---:|---:|---|\n"
        ));
        for c in cases.iter().filter(|c| c.backend == b) {
            let lat = |p| {
                percentile(&c.latencies, p)
                    .map(human_us)
                    .unwrap_or_else(|| "-".into())
            };
            match &c.error {
                Some(e) => out.push_str(&format!(
                    "| {} | failed | | {} | | | {} |\n",
                    c.op,
                    c.unit,
                    e.replace('|', "/")
                )),
                None => out.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} |\n",
                    c.op,
                    human_rate(median(&c.rates)),
                    spread(&c.rates, human_rate),
                    c.unit,
                    lat(50.0),
                    lat(99.0),
                    c.what
                )),
            }
        }
    }
    let row = |r: &Ratio| {
        format!(
            "| {} | {}× | {} | {} | {} |\n",
            r.what,
            ratio_text(r.median()),
            spread(&r.values, ratio_text),
            r.target_text(),
            match r.verdict() {
                Some(true) => "**met**",
                Some(false) => "**missed**",
                None => "-",
            }
        )
    };
    let header = "| ratio | median | min–max | target | verdict |\n|---|---:|---:|---|---|\n";
    let (targets, others): (Vec<&Ratio>, Vec<&Ratio>) =
        ratios.iter().partition(|r| r.target.is_some());
    if !targets.is_empty() {
        out.push_str(&format!(
            "\n#### The targets (per repetition, paired)\n\n{header}"
        ));
        targets.iter().for_each(|r| out.push_str(&row(r)));
    }
    if !others.is_empty() {
        out.push_str(&format!(
            "\n#### Other ratios (per repetition, paired)\n\n{header}"
        ));
        others.iter().for_each(|r| out.push_str(&row(r)));
    }
    let plots: Vec<String> = charts(cases)
        .into_iter()
        .map(|(name, chart)| format!("![{}]({images}-{name}.svg)", chart.title))
        .collect();
    if !plots.is_empty() {
        out.push_str(&format!("\n{}\n", plots.join("\n")));
    }
    out
}

fn point(c: &Case, x: f64, invert: bool) -> Option<(f64, f64, f64, f64)> {
    if c.rates.is_empty() {
        return None;
    }
    let f = |r: f64| if invert { 1e6 / r } else { r };
    let (lo, hi) = min_max(&c.rates);
    let (a, b) = (f(lo), f(hi));
    Some((x, f(median(&c.rates)), a.min(b), a.max(b)))
}

/// The plots: throughput against workers (every drain, and the
/// PostgreSQL ones with the peers) and each scaling curve.
fn charts(cases: &[Case]) -> Vec<(String, svg::Chart)> {
    let drain_series = |filter: &dyn Fn(&Case) -> bool| {
        let mut by: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
        for c in cases.iter().filter(|c| filter(c)) {
            let label = match &c.kind {
                Kind::Drain(_, work::DrainWay::Calls, _) => format!("{} (runkeep)", c.backend),
                Kind::Drain(_, work::DrainWay::HandOver, _) => {
                    format!("{} (runkeep, hand-over)", c.backend)
                }
                Kind::Drain(_, work::DrainWay::Batch(_), false) => {
                    format!("{} (runkeep, batches)", c.backend)
                }
                Kind::Drain(_, work::DrainWay::Batch(_), true) => {
                    format!("{} (runkeep, batches, 20 keys)", c.backend)
                }
                Kind::PgSkipLocked(_) => "pg SKIP LOCKED loop".into(),
                Kind::Peer(lib, mode, _) => format!("{lib} {mode}"),
                _ => continue,
            };
            if let Some(p) = point(c, c.workers as f64, false) {
                by.entry(label).or_default().push(p);
            }
        }
        by.into_iter()
            .map(|(label, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                svg::Series { label, points }
            })
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    let all = drain_series(&|c| {
        matches!(
            c.kind,
            Kind::Drain(..) | Kind::PgSkipLocked(_) | Kind::Peer(..)
        )
    });
    if !all.is_empty() {
        out.push((
            "drain".to_string(),
            svg::Chart {
                title: "Drain cycle throughput against workers".into(),
                x_label: "concurrent workers".into(),
                y_label: "cycles (jobs) per second, log scale".into(),
                x_log: false,
                y_log: true,
                series: all,
            },
        ));
    }
    let pg_family = drain_series(&|c| {
        matches!(c.kind, Kind::PgSkipLocked(_) | Kind::Peer(..))
            || (matches!(c.kind, Kind::Drain(..))
                && matches!(
                    c.backend.as_str(),
                    "pg" | "pg-coalesced" | "pg-split" | "pg-noslack" | "pg-keyed1" | "serve-pg"
                ))
    });
    if !pg_family.is_empty() {
        out.push((
            "drain-pg".to_string(),
            svg::Chart {
                title: "PostgreSQL: drain cycle against workers".into(),
                x_label: "concurrent workers".into(),
                y_label: "cycles (jobs) per second, log scale".into(),
                x_log: false,
                y_log: true,
                series: pg_family,
            },
        ));
    }
    let curves: [(&str, &str, &str, bool); 4] = [
        ("renew.after-", "renew", "checkpoints in the run", true),
        ("list.runs-", "listing", "runs in the session", true),
        ("catch-up.events-", "catch-up", "events in the log", true),
        ("drain.queued-", "drain-queued", "runs queued", false),
    ];
    for (prefix, name, x_label, as_time) in curves {
        let mut by: BTreeMap<String, Vec<(f64, f64, f64, f64)>> = BTreeMap::new();
        for c in cases.iter().filter(|c| c.op.starts_with(prefix)) {
            let size: f64 = c.op[prefix.len()..]
                .split('@')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            if let Some(p) = point(c, size, as_time) {
                by.entry(c.backend.clone()).or_default().push(p);
            }
        }
        if by.is_empty() {
            continue;
        }
        let series = by
            .into_iter()
            .map(|(label, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                svg::Series { label, points }
            })
            .collect();
        out.push((
            format!("scaling-{name}"),
            svg::Chart {
                title: format!("Scaling: {name}"),
                x_label: format!("{x_label}, log scale"),
                y_label: if as_time {
                    "µs per operation (1 / median rate), log scale".into()
                } else {
                    "cycles per second at 8 workers".into()
                },
                x_log: true,
                y_log: as_time,
                series,
            },
        ));
    }
    out
}
