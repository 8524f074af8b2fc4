//! `runkeep doctor`: health checks with the reference's statuses and exit
//! codes (see the rules below).
//!
//! # Rules
//!
//! - Statuses: `pass` ✓, `fail` ✗, `warn` !, `inconclusive` ?, `skipped` ⊘.
//!   `skipped` means "looked, nothing to check"; `inconclusive` means "did not
//!   answer". They are never merged, and "unknown" is never `pass`.
//! - Checks run concurrently, each on its own thread, so a check stuck in a
//!   blocking call cannot hold the others or the timers. Records are listed in
//!   registration order.
//! - Per-check timeout (`--per-check-timeout`, default 5s): a check that has
//!   not returned is recorded `inconclusive` ("did not return within N ms");
//!   it is not waited for. The wall-clock timeout (`--wall-clock-timeout`,
//!   default 10s) does the same for every check still running.
//! - **A check that errors**: when a check cannot establish what it
//!   reads — the store refused a read, the scan failed — it is `inconclusive`
//!   with the error as its message: nothing was shown to be wrong, and nothing
//!   was shown to be right. A check that *can* tell a finding from an
//!   inability to look reports the finding itself (an unreachable or
//!   unwritable store is `fail`). **A check that panics** is `fail`
//!   ("check panicked: …"): a crash is a defect, not an open question.
//! - Exit code, in this precedence: any `fail` ⇒ 1; no check ran ⇒ 2; any
//!   `inconclusive` ⇒ 69; else 0 (`warn` and `skipped` never move it off 0).
//!   A store that cannot be opened at all exits 78 before any check runs.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::ProgressBar;
use runkeep::Timestamp;
use serde::Serialize;

use crate::context::Ctx;
use crate::duration::parse_duration;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, human_duration, iso_millis, Color, Style};
use crate::store::{OpenMode, PoolDemand, StoreAddress};

mod checks;

pub use checks::Env;

/// Threads running checks are named with this prefix (the panic hook leaves
/// them to the doctor).
pub const CHECK_THREAD_PREFIX: &str = "doctor-check-";

/// Test-only (the `testing` feature): registers a check that blocks this
/// many milliseconds, to exercise the timeout path.
#[cfg(feature = "testing")]
pub const SLOW_CHECK_ENV: &str = "RUNKEEP_DOCTOR_TEST_SLOW_CHECK_MS";
/// Test-only (the `testing` feature): `panic` or `error` registers a check
/// that does that.
#[cfg(feature = "testing")]
pub const FAULTY_CHECK_ENV: &str = "RUNKEEP_DOCTOR_TEST_FAULTY_CHECK";

/// `runkeep doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// How long one check may take before it is recorded inconclusive.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    per_check_timeout: Duration,
    /// How long the whole doctor may take; unfinished checks become inconclusive.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    wall_clock_timeout: Duration,
    /// Only checks of these categories (store, integrity, leases, queue, runtime; comma-separated).
    #[arg(long, value_delimiter = ',')]
    category: Vec<String>,
    /// List every finding (paths, runs), not only the first few.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// queue.stale-runnable: how long a runnable run may wait for a worker
    /// before it is reported.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    stale_after: Duration,
    /// store.row-locks (PostgreSQL): how long a transaction may hold locks
    /// on the store's tables before it is reported.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    lock_age: Duration,
}

/// A check's status.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Looked; all as it should be.
    Pass,
    /// Looked; something is wrong.
    Fail,
    /// Usable, but less than it should be.
    Warn,
    /// Did not answer (timed out, or could not establish what it reads).
    Inconclusive,
    /// Looked; there was nothing to check.
    Skipped,
}

impl Status {
    fn mark(self) -> &'static str {
        match self {
            Status::Pass => "✓",
            Status::Fail => "✗",
            Status::Warn => "!",
            Status::Inconclusive => "?",
            Status::Skipped => "⊘",
        }
    }

    fn color(self) -> Color {
        match self {
            Status::Pass => Color::Green,
            Status::Fail => Color::Red,
            Status::Warn | Status::Inconclusive => Color::Yellow,
            Status::Skipped => Color::Dim,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Warn => "warn",
            Status::Inconclusive => "inconclusive",
            Status::Skipped => "skipped",
        }
    }
}

/// What a check answered.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Status.
    pub status: Status,
    /// What it found.
    pub message: String,
    /// What to do about it.
    pub remediation: Option<String>,
}

impl Outcome {
    fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            remediation: None,
        }
    }
    /// `pass`.
    pub fn pass(message: impl Into<String>) -> Self {
        Self::new(Status::Pass, message)
    }
    /// `fail`.
    pub fn fail(message: impl Into<String>) -> Self {
        Self::new(Status::Fail, message)
    }
    /// `warn`.
    pub fn warn(message: impl Into<String>) -> Self {
        Self::new(Status::Warn, message)
    }
    /// `skipped`.
    pub fn skipped(message: impl Into<String>) -> Self {
        Self::new(Status::Skipped, message)
    }
    /// `inconclusive`.
    pub fn inconclusive(message: impl Into<String>) -> Self {
        Self::new(Status::Inconclusive, message)
    }
    /// With a remediation hint.
    pub fn remedy(mut self, text: impl Into<String>) -> Self {
        self.remediation = Some(text.into());
        self
    }
}

/// A check's body: runs on its own thread, inside the runtime.
pub type CheckFn = Box<dyn FnOnce(Arc<Env>) -> BoxFuture<CliResult<Outcome>> + Send>;

/// A boxed, sendable future.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A registered check.
pub struct Check {
    /// Unique id, `category.name`.
    pub id: &'static str,
    /// Category.
    pub category: &'static str,
    /// Body.
    pub run: CheckFn,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Check id.
    pub id: String,
    /// Category.
    pub category: String,
    /// Status.
    pub status: Status,
    /// What it found.
    pub message: String,
    /// What to do.
    pub remediation: Option<String>,
    /// How long it ran (until the timeout for one that did not return).
    pub duration_ms: u64,
}

/// Counts per status; they sum to `total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pass: usize,
    fail: usize,
    inconclusive: usize,
    warn: usize,
    skipped: usize,
    total: usize,
}

impl Summary {
    fn of(records: &[Record]) -> Self {
        let mut s = Summary {
            total: records.len(),
            ..Summary::default()
        };
        for r in records {
            match r.status {
                Status::Pass => s.pass += 1,
                Status::Fail => s.fail += 1,
                Status::Inconclusive => s.inconclusive += 1,
                Status::Warn => s.warn += 1,
                Status::Skipped => s.skipped += 1,
            }
        }
        s
    }

    /// The exit code, in this precedence: any `fail` 1, no check ran 2,
    /// any `inconclusive` 69, else 0.
    fn exit(&self) -> Exit {
        if self.fail > 0 {
            Exit::Failed
        } else if self.total == 0 {
            Exit::NothingChecked
        } else if self.inconclusive > 0 {
            Exit::Unavailable
        } else {
            Exit::Ok
        }
    }
}

/// The report (`--json` prints it as is).
#[derive(Debug, Serialize)]
pub struct Report {
    version: &'static str,
    timestamp: String,
    store: String,
    checks: Vec<Record>,
    summary: Summary,
    exit: u8,
}

/// The `application_name` of the doctor's own PostgreSQL connections.
pub fn doctor_application_name() -> String {
    format!("runkeep-doctor-{}", std::process::id())
}

/// Runs the doctor.
pub async fn run(ctx: &Ctx, args: DoctorArgs) -> CliResult<Exit> {
    // A store that cannot be opened at all (no such directory, not a
    // directory, a directory this user cannot read, a backend not built in)
    // exits 78 with no report. A directory
    // that exists but cannot be used is examined: the checks say what fails.
    let address = ctx.global.store.clone();
    // A directory this user may not even list is not examined: every check
    // would only repeat "permission denied". Exit 78, as every command does.
    if let Some(path) = address.directory() {
        if path.is_dir() {
            crate::store::check_readable(&address, path)?;
        }
    }
    // A PostgreSQL store is opened without judging its schema (missing,
    // older or newer is store.schema-version's finding), under an
    // application name of its own so store.row-locks can leave the
    // doctor's own connections out.
    let opened_at = match &address {
        StoreAddress::Postgres(pg) => {
            StoreAddress::Postgres(pg.with_application_name(&doctor_application_name()))
        }
        other => other.clone(),
    };
    let options = ctx.store_options(PoolDemand::Doctor);
    let opened = match &opened_at {
        StoreAddress::Postgres(_) => {
            Ok(
                crate::store::open_store_as(&opened_at, &ctx.scope, &options, OpenMode::Examine)
                    .await?,
            )
        }
        _ => match ctx.open(OpenMode::Existing, &options).await {
            Ok(opened) => Ok(opened),
            Err(e) if address.directory().is_some_and(std::path::Path::is_dir) => Err(e),
            Err(e) => return Err(e),
        },
    };
    let mut now = Timestamp::now();
    if let Ok(opened) = opened
        .as_ref()
        .map_err(|_| ())
        .and_then(|o| o.postgres().map(|_| o).ok_or(()))
    {
        // The database's clock decides: one read judged by the server
        // measures the offset, and every check then judges at the server's
        // instant (a skewed operator machine misreports nothing).
        let probe = runkeep::ListOptions {
            limit: Some(1),
            ..runkeep::ListOptions::default()
        };
        if let Ok(listing) = ctx.scope.listing() {
            if opened.store.list_runs(&listing, &probe).await.is_ok() {
                now = opened.store.now();
            }
        }
    }
    let env = Arc::new(Env::new(
        address.clone(),
        opened,
        ctx.scope.clone(),
        now,
        args.verbose,
        args.stale_after,
        args.lock_age,
    ));
    #[cfg_attr(
        not(feature = "testing"),
        expect(unused_mut, reason = "only the test checks are pushed")
    )]
    let mut registered = checks::registry();
    #[cfg(feature = "testing")]
    if let Some(ms) = std::env::var(SLOW_CHECK_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        registered.push(checks::slow_check(ms));
    }
    #[cfg(feature = "testing")]
    if let Ok(kind) = std::env::var(FAULTY_CHECK_ENV) {
        registered.push(checks::faulty_check(kind));
    }
    let selected: Vec<Check> = registered
        .into_iter()
        .filter(|c| args.category.is_empty() || args.category.iter().any(|k| k == c.category))
        .collect();
    let spinner =
        ProgressBar::new_spinner().with_message(format!("running {} check(s)", selected.len()));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let records = run_checks(
        selected,
        env,
        args.per_check_timeout,
        args.wall_clock_timeout,
    )
    .await?;
    spinner.finish_and_clear();
    let summary = Summary::of(&records);
    let exit = summary.exit();
    let report = Report {
        version: env!("CARGO_PKG_VERSION"),
        timestamp: iso_millis(now),
        store: address.to_string(),
        checks: records,
        summary,
        exit: exit.code(),
    };
    let printed = if ctx.json() {
        emit_json(&report)
    } else {
        emit(&render(&report, &ctx.scope.describe(), &ctx.style))
    };
    match printed {
        // A reader that went away (`runkeep doctor | head -3`) does not turn
        // the verdict into a pass: the exit code is still the report's.
        Err(e) if e.is_closed_pipe() => Ok(exit),
        Err(e) => Err(e),
        Ok(()) => Ok(exit),
    }
}

/// Runs every check concurrently and collects records in registration order.
async fn run_checks(
    checks: Vec<Check>,
    env: Arc<Env>,
    per_check: Duration,
    wall_clock: Duration,
) -> CliResult<Vec<Record>> {
    let runtime = tokio::runtime::Handle::current();
    let start = tokio::time::Instant::now();
    let wall_deadline = start + wall_clock;
    let mut pending = Vec::with_capacity(checks.len());
    for check in checks {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (env, runtime, body) = (env.clone(), runtime.clone(), check.run);
        std::thread::Builder::new()
            .name(format!("{CHECK_THREAD_PREFIX}{}", check.id))
            .spawn(move || {
                let began = Instant::now();
                let result =
                    std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(body(env))));
                let _ = tx.send((result, began.elapsed()));
            })
            .map_err(|e| CliError::internal(format!("cannot start a doctor check thread: {e}")))?;
        pending.push((check.id, check.category, rx));
    }
    let mut records = Vec::with_capacity(pending.len());
    for (id, category, rx) in pending {
        let check_deadline = start + per_check;
        let deadline = check_deadline.min(wall_deadline);
        let (outcome, took) = match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok((Ok(Ok(outcome)), took))) => (outcome, took),
            Ok(Ok((Ok(Err(err)), took))) => (
                Outcome::inconclusive(format!("could not establish: {}", err.message)).remedy(
                    err.hint.unwrap_or_else(|| {
                        "fix what the message names and run the doctor again".into()
                    }),
                ),
                took,
            ),
            Ok(Ok((Err(panic), took))) => (
                Outcome::fail(format!("check panicked: {}", panic_text(&panic)))
                    .remedy("this is a bug in runkeep doctor; please report it"),
                took,
            ),
            Ok(Err(_)) => (
                Outcome::fail("check ended without an answer"),
                start.elapsed(),
            ),
            Err(_) if check_deadline <= wall_deadline => (
                Outcome::inconclusive(format!(
                    "did not return within {} ms",
                    per_check.as_millis()
                ))
                .remedy("the store is slow or stuck; rerun with a longer --per-check-timeout"),
                per_check,
            ),
            Err(_) => (
                Outcome::inconclusive(format!(
                    "the wall-clock timeout of {} ms was reached before it returned",
                    wall_clock.as_millis()
                ))
                .remedy("rerun with a longer --wall-clock-timeout"),
                wall_clock,
            ),
        };
        records.push(Record {
            id: id.to_string(),
            category: category.to_string(),
            status: outcome.status,
            message: crate::store::redact(&outcome.message),
            remediation: outcome.remediation.as_deref().map(crate::store::redact),
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        });
    }
    Ok(records)
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

fn render(report: &Report, scope: &str, style: &Style) -> String {
    let mut out = format!(
        "{}\n",
        style.paint(
            &format!("runkeep doctor · {} · {scope}", report.store),
            Color::Bold
        )
    );
    let id_width = report.checks.iter().map(|r| r.id.len()).max().unwrap_or(0);
    let name_width = report
        .checks
        .iter()
        .map(|r| r.status.name().len())
        .max()
        .unwrap_or(0);
    // mark, space, status, two spaces, id, two spaces: where messages start.
    let indent = 2 + name_width + 2 + id_width + 2;
    for r in &report.checks {
        let status = format!("{} {:<name_width$}", r.status.mark(), r.status.name());
        out.push_str(&format!(
            "{}  {:<id_width$}  {}  {}\n",
            style.paint(&status, r.status.color()),
            r.id,
            r.message,
            style.paint(
                &human_duration(Duration::from_millis(r.duration_ms)),
                Color::Dim
            ),
        ));
        if let Some(fix) = r.remediation.as_ref().filter(|_| r.status != Status::Pass) {
            out.push_str(&format!(
                "{}{}\n",
                " ".repeat(indent),
                style.paint(&format!("→ {fix}"), Color::Dim)
            ));
        }
    }
    let s = &report.summary;
    out.push_str(&format!(
        "\n{} check(s): {} pass, {} fail, {} warn, {} inconclusive, {} skipped\n",
        s.total, s.pass, s.fail, s.warn, s.inconclusive, s.skipped
    ));
    let verdict = match report.exit {
        0 => "healthy".to_string(),
        1 => "a check failed (the ✗ rows)".to_string(),
        2 => {
            "no check ran (does --category match any of store, integrity, leases, queue, runtime?)"
                .to_string()
        }
        69 => "some checks did not answer (the ? rows); the report proves nothing about them"
            .to_string(),
        other => format!("code {other}"),
    };
    let color = match report.exit {
        0 => Color::Green,
        1 => Color::Red,
        _ => Color::Yellow,
    };
    out.push_str(&style.paint(&format!("exit {}: {verdict}\n", report.exit), color));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(status: Status) -> Record {
        Record {
            id: "x".into(),
            category: "store".into(),
            status,
            message: String::new(),
            remediation: None,
            duration_ms: 0,
        }
    }

    #[test]
    fn exit_code_precedence_follows_the_spec() {
        use Status::*;
        let code = |s: &[Status]| {
            Summary::of(&s.iter().map(|s| rec(*s)).collect::<Vec<_>>())
                .exit()
                .code()
        };
        assert_eq!(code(&[]), 2);
        assert_eq!(code(&[Pass, Warn, Skipped]), 0);
        assert_eq!(code(&[Pass, Inconclusive]), 69);
        assert_eq!(code(&[Inconclusive, Fail]), 1);
        assert_eq!(code(&[Skipped]), 0);
        let s = Summary::of(&[
            rec(Pass),
            rec(Fail),
            rec(Warn),
            rec(Inconclusive),
            rec(Skipped),
        ]);
        assert_eq!(
            s.pass + s.fail + s.warn + s.inconclusive + s.skipped,
            s.total
        );
    }
}
