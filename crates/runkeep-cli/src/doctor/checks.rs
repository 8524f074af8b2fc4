//! The doctor's checks.
//!
//! | id | category | looks at |
//! |---|---|---|
//! | `store.reachable` | store | the store answers a listing of the scope |
//! | `store.writable` | store | write, read back, claim, release, append and delete in a scratch location |
//! | `store.schema-version` | store | PostgreSQL: the schema's runkeep version is this binary's (missing, older or newer fail) |
//! | `store.hard-links` | store | the directory can hard-link (fs; claims are published by link) |
//! | `store.scratch-leftovers` | integrity | claim scratch files older than the 10 min scratch TTL |
//! | `store.torn-transcripts` | integrity | transcripts ending in a partial line |
//! | `store.damaged-checkpoints` | integrity | checkpoint files that cannot be read |
//! | `store.damaged-transcripts` | integrity | damage inside transcripts and audit trails: unparsable records before the last, duplicate or out-of-order `seq` |
//! | `store.unreadable-paths` | integrity | run directories (and their parts) this user cannot read |
//! | `store.oversized-claims` | integrity | claims directories pruning did not keep small |
//! | `leases.expired-unreclaimed` | leases | leases past expiry nobody reclaimed or released, and unreadable top holdings |
//! | `store.row-locks` | leases | PostgreSQL: transactions holding locks on the store's tables for longer than `--lock-age` (from `pg_locks` and `pg_stat_activity`) |
//! | `leases.fence-ceiling` | leases | runs whose top holding is at the fence ceiling (wedged) |
//! | `queue.dead-lettered` | queue | runs failed with "attempts exhausted" (their holders kept losing them) |
//! | `queue.stale-runnable` | queue | runnable runs no worker has taken for longer than `--stale-after` |
//!
//! A scan-based check that finds nothing but could not read part of the
//! store is `inconclusive`, never `pass` (see [`unproven`]).
//! | `runtime.invariants` | runtime | `store.run:single-open-writer`, from persisted fenced-out refusal counters |

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use runkeep::lease::MAX_FENCE;
use runkeep::lifecycle::ATTEMPTS_EXHAUSTED;
use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, Holder, ListOptions, NewEvent, ReadEventsOptions,
    RunRow, RunScope, RunStatus, RunStore, Timestamp, Ttl,
};
use serde_json::{json, Map};

use super::{Check, Outcome, Status};
use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;
use crate::store::{Diagnosis, OpenedStore, StoreAddress};

/// What every check can read.
#[derive(Debug)]
pub struct Env {
    address: StoreAddress,
    /// The store, or why it did not open (a directory that exists but cannot
    /// be used, e.g. a volume without hard links: the checks say what fails).
    opened: Result<OpenedStore, CliError>,
    scope: ScopeParts,
    now: Timestamp,
    verbose: bool,
    /// `--stale-after`: how long a runnable run may wait for a worker.
    stale_after: std::time::Duration,
    /// `--lock-age`: how long a transaction may hold locks on a PostgreSQL
    /// store's tables.
    lock_age: std::time::Duration,
    diagnosis: tokio::sync::OnceCell<Option<CliResult<Arc<Diagnosis>>>>,
}

impl Env {
    /// The environment of one doctor run.
    pub fn new(
        address: StoreAddress,
        opened: Result<OpenedStore, CliError>,
        scope: ScopeParts,
        now: Timestamp,
        verbose: bool,
        stale_after: std::time::Duration,
        lock_age: std::time::Duration,
    ) -> Self {
        Self {
            address,
            opened,
            scope,
            now,
            verbose,
            stale_after,
            lock_age,
            diagnosis: tokio::sync::OnceCell::new(),
        }
    }

    /// The store, or the error it did not open with.
    fn store(&self) -> CliResult<&OpenedStore> {
        self.opened.as_ref().map_err(|e| e.clone())
    }

    /// The store's directory (also when the store did not open).
    fn base_dir(&self) -> Option<PathBuf> {
        match (&self.opened, &self.address) {
            (Ok(opened), _) => opened.base_dir().map(Path::to_path_buf),
            (Err(_), address) => address.directory().map(Path::to_path_buf),
        }
    }

    /// The directory store's scan, run once and shared by every check that
    /// needs it; `None` for backends without one.
    async fn diagnosis(&self) -> Option<CliResult<Arc<Diagnosis>>> {
        self.diagnosis
            .get_or_init(|| async {
                match &self.opened {
                    Ok(opened) => opened.diagnose(self.now).map(|r| {
                        r.map(Arc::new)
                            .map_err(|e| e.context("the store's scan failed"))
                    }),
                    Err(e) => self
                        .base_dir()
                        .map(|_| Err(e.clone().context("the store did not open"))),
                }
            })
            .await
            .clone()
    }

    /// `a, b, c and 4 more` (everything with --verbose).
    fn list(&self, items: impl IntoIterator<Item = String>) -> String {
        let items: Vec<String> = items.into_iter().collect();
        let shown = if self.verbose { items.len() } else { 3 };
        let mut text = items
            .iter()
            .take(shown)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if items.len() > shown {
            text.push_str(&format!(
                " and {} more (--verbose lists all)",
                items.len() - shown
            ));
        }
        text
    }

    /// A path as shown: relative to the store's directory.
    fn path(&self, p: &Path) -> String {
        match self.base_dir() {
            Some(base) => p.strip_prefix(&base).unwrap_or(p).display().to_string(),
            None => p.display().to_string(),
        }
    }
}

fn check<F, Fut>(id: &'static str, category: &'static str, body: F) -> Check
where
    F: FnOnce(Arc<Env>) -> Fut + Send + 'static,
    Fut: Future<Output = CliResult<Outcome>> + Send + 'static,
{
    Check {
        id,
        category,
        run: Box::new(move |env| Box::pin(body(env))),
    }
}

/// Every check, in report order.
pub fn registry() -> Vec<Check> {
    vec![
        check("store.reachable", "store", |env| async move {
            reachable(&env).await
        }),
        check("store.writable", "store", |env| async move {
            writable(&env).await
        }),
        check("store.schema-version", "store", |env| async move {
            schema_version(&env).await
        }),
        check("store.hard-links", "store", |env| async move {
            hard_links(&env)
        }),
        check("store.listing-index", "store", |env| async move {
            listing_index(&env)
        }),
        check("store.scratch-leftovers", "integrity", |env| async move {
            from_scan(&env, |env, d| {
                if d.scratch_leftovers.is_empty() {
                    return Outcome::pass(format!("no scratch file older than 10 min in {} run(s)", d.runs_scanned));
                }
                Outcome::warn(format!(
                    "{} scratch file(s) older than 10 min: {}",
                    d.scratch_leftovers.len(),
                    env.list(d.scratch_leftovers.iter().map(|p| env.path(p)))
                ))
                .remedy("left by claimers that crashed mid-publish; harmless, swept by the run's next claim, or delete them")
            })
            .await
        }),
        check("store.torn-transcripts", "integrity", |env| async move {
            from_scan(&env, |env, d| {
                if d.torn_transcripts.is_empty() {
                    return Outcome::pass(format!("no torn transcript in {} run(s)", d.runs_scanned));
                }
                Outcome::warn(format!(
                    "{} transcript(s) end in a partial line: {}",
                    d.torn_transcripts.len(),
                    env.list(d.torn_transcripts.iter().map(|p| env.path(p)))
                ))
                .remedy("a writer crashed mid-append; readers skip the partial line and the next append removes it (or, if it is younger than 2 s and may still be in flight from a writer that takes no lock, terminates it)")
            })
            .await
        }),
        check("store.damaged-checkpoints", "integrity", |env| async move {
            from_scan(&env, |env, d| {
                if d.damaged_checkpoints.is_empty() {
                    return Outcome::pass(format!("every checkpoint readable in {} run(s)", d.runs_scanned));
                }
                Outcome::fail(format!(
                    "{} checkpoint(s) cannot be read: {}",
                    d.damaged_checkpoints.len(),
                    env.list(d.damaged_checkpoints.iter().map(|(p, why)| format!("{} ({why})", env.path(p))))
                ))
                .remedy("their runs show as DAMAGED in `runkeep runs`; restore the files from a backup or delete them so the run resumes from an older checkpoint")
            })
            .await
        }),
        check("store.damaged-transcripts", "integrity", |env| async move {
            from_scan(&env, |env, d| {
                if d.damaged_transcripts.is_empty() {
                    return Outcome::pass(format!(
                        "no damage inside a transcript or audit trail in {} run(s)",
                        d.runs_scanned
                    ));
                }
                Outcome::fail(format!(
                    "{} problem(s) inside transcripts: {}",
                    d.damaged_transcripts.len(),
                    env.list(d.damaged_transcripts.iter().map(|(p, why)| format!("{}: {why}", env.path(p))))
                ))
                .remedy("readers skip damaged records silently and strict reads refuse the file, so events are lost or ambiguous; restore the file from a backup, or copy the run's state to a new run id")
            })
            .await
        }),
        check("store.unreadable-paths", "integrity", |env| async move {
            from_scan(&env, |env, d| {
                if d.unreadable.is_empty() {
                    return Outcome::pass(format!(
                        "every run directory readable in {} run(s)",
                        d.runs_scanned
                    ));
                }
                Outcome::fail(format!(
                    "{} path(s) cannot be read by this user (uid {}), so what they hold was not examined: {}",
                    d.unreadable.len(),
                    rustix::process::geteuid().as_raw(),
                    env.list(d.unreadable.iter().map(|(p, why)| format!("{} ({why})", env.path(p))))
                ))
                .remedy("workers running as this user cannot read these runs either; fix the ownership or modes (e.g. chown -R to the store's owner, chmod u+rwX), or run the doctor as the user the workers run as")
            })
            .await
        }),
        check("store.oversized-claims", "integrity", |env| async move {
            from_scan(&env, |env, d| {
                if d.oversized_claims.is_empty() {
                    return Outcome::pass(format!(
                        "every claims directory pruned in {} run(s)",
                        d.runs_scanned
                    ));
                }
                Outcome::warn(format!(
                    "{} claims director(ies) hold more holdings than pruning keeps: {}",
                    d.oversized_claims.len(),
                    env.list(
                        d.oversized_claims
                            .iter()
                            .map(|(p, n)| format!("{} ({n} entries)", env.path(p)))
                    )
                ))
                .remedy(
                    "claims get slower as the directory grows; the next claim of the run prunes it",
                )
            })
            .await
        }),
        check("leases.expired-unreclaimed", "leases", |env| async move {
            expired_unreclaimed(&env).await
        }),
        check("store.row-locks", "leases", |env| async move {
            row_locks(&env).await
        }),
        check("leases.fence-ceiling", "leases", |env| async move {
            fence_ceiling(&env).await
        }),
        check("queue.dead-lettered", "queue", |env| async move {
            dead_lettered(&env).await
        }),
        check("queue.stale-runnable", "queue", |env| async move {
            stale_runnable(&env).await
        }),
        check("runtime.invariants", "runtime", |env| async move {
            invariants(&env).await
        }),
    ]
}

/// Test-only check that blocks its thread for `ms` (see `SLOW_CHECK_ENV`).
pub fn slow_check(ms: u64) -> Check {
    check("test.slow-check", "custom", move |_env| async move {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        Ok(Outcome::pass(format!("slept {ms} ms")))
    })
}

/// Test-only check that panics or errors (see `FAULTY_CHECK_ENV`).
pub fn faulty_check(kind: String) -> Check {
    check("test.faulty-check", "custom", move |_env| async move {
        match kind.as_str() {
            "panic" => panic!("deliberate panic for the doctor's tests"),
            _ => Err(CliError::failed("deliberate error for the doctor's tests")),
        }
    })
}

/// Runs a check over the directory scan: skipped without one (other
/// backends) or with no run to look at.
async fn from_scan(
    env: &Env,
    judge: impl FnOnce(&Env, &Diagnosis) -> Outcome,
) -> CliResult<Outcome> {
    let Some(scan) = env.diagnosis().await else {
        return Ok(Outcome::skipped(format!(
            "{} is not a directory store: no files to inspect",
            env.address
        )));
    };
    let scan = scan?;
    if scan.runs_scanned == 0 {
        return Ok(Outcome::skipped("no run directories to inspect"));
    }
    Ok(unproven(env, &scan, judge(env, &scan)))
}

/// A `pass` over a scan that could not read part of the store proves
/// nothing about that part: it becomes `inconclusive`, naming what was not
/// read. Findings (`fail`, `warn`) stand as they are.
fn unproven(env: &Env, scan: &Diagnosis, outcome: Outcome) -> Outcome {
    if outcome.status != Status::Pass || scan.unreadable.is_empty() {
        return outcome;
    }
    Outcome::inconclusive(format!(
        "could not look everywhere: {} path(s) unreadable ({}); in the rest: {}",
        scan.unreadable.len(),
        env.list(scan.unreadable.iter().map(|(p, _)| env.path(p))),
        outcome.message
    ))
    .remedy(
        "see store.unreadable-paths; fix the permissions, or run the doctor as the store's owner",
    )
}

/// Every row of the scope's listing (backends without a directory scan).
async fn listing_rows(env: &Env) -> CliResult<Vec<RunRow>> {
    let listing = env.scope.listing()?;
    let mut options = ListOptions {
        limit: Some(runkeep::listing::MAX_LIMIT),
        now: Some(env.now),
        ..ListOptions::default()
    };
    let mut rows = Vec::new();
    loop {
        let page = env.store()?.store.list_runs(&listing, &options).await?;
        rows.extend(page.entries);
        match page.cursor {
            Some(c) => options.cursor = Some(c),
            None => return Ok(rows),
        }
    }
}

/// `claims/N.json`: a holding's path as seen from its run directory.
fn holding_name(p: &Path) -> String {
    let file = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("claims/{file}")
}

async fn reachable(env: &Env) -> CliResult<Outcome> {
    let opened = match env.store() {
        Ok(opened) => opened,
        Err(e) => {
            return Ok(Outcome::fail(e.message).remedy(
                e.hint
                    .unwrap_or_else(|| "check --store and the directory's permissions".into()),
            ))
        }
    };
    if let Some((_, target)) = opened.postgres() {
        // The server answers before anything is asked of the schema: a
        // missing or foreign schema is store.schema-version's finding.
        match runkeep_postgres::PgStore::schema_version(target.address.url(), &target.options)
            .await
        {
            Ok(v) if v != runkeep_postgres::SCHEMA_VERSION => {
                return Ok(Outcome::pass(format!(
                    "{} answered (schema {} is at version {v}: see store.schema-version)",
                    env.address, target.options.schema
                )))
            }
            Ok(_) => {}
            Err(e) => {
                return Ok(Outcome::fail(format!(
                    "cannot reach {}: {}",
                    env.address,
                    CliError::from(e).message
                ))
                .remedy("check that the server runs and the URL's host, port, user and database; with a password, that it is right"))
            }
        }
    }
    let listing = env.scope.listing()?;
    let options = ListOptions {
        limit: Some(100),
        now: Some(env.now),
        ..ListOptions::default()
    };
    match opened.store.list_runs(&listing, &options).await {
        Ok(page) => Ok(Outcome::pass(format!(
            "{} answered a listing of {listing}: {}{} run(s)",
            env.address,
            page.entries.len(),
            if page.cursor.is_some() { "+" } else { "" }
        ))),
        Err(e) => Ok(Outcome::fail(format!(
            "listing {listing} failed: {}",
            CliError::from(e).message
        ))
        .remedy("check that the store exists and this user can read it")),
    }
}

async fn writable(env: &Env) -> CliResult<Outcome> {
    let scratch = match env.store()?.scratch() {
        Ok(s) => s,
        Err(e) => {
            return Ok(
                Outcome::fail(format!("cannot open a scratch location: {}", e.message))
                    .remedy("check that this user can create directories in the store"),
            )
        }
    };
    let probed = probe(scratch.store.as_ref(), &scratch.scope).await;
    if let Err(e) = scratch.clean_up().await {
        return Ok(Outcome::warn(format!(
            "the probe passed, but its run could not be removed: {}",
            e.message
        ))
        .remedy(format!("delete the probe run {} by hand", scratch.scope)));
    }
    match probed {
        Ok(()) => Ok(Outcome::pass(format!(
            "wrote, read back, claimed, released, appended and deleted a probe run in {}",
            scratch.describe()
        ))),
        Err(e) => Ok(Outcome::fail(format!(
            "probe in {} failed: {}",
            scratch.describe(),
            CliError::from(e).message
        ))
        .remedy("check free space, permissions and that the volume is not read-only")),
    }
}

/// One of everything a worker does, in a scratch location, then cleaned up.
async fn probe(store: &dyn RunStore, scope: &RunScope) -> runkeep::Result<()> {
    let id = CheckpointId::new("cp_doctor_probe")?;
    let nonce = runkeep::id::random_suffix(12);
    let mut state = Map::new();
    state.insert("probe".into(), json!(nonce));
    let written = Checkpoint::new(id.clone(), Timestamp::now(), state);
    store.write_checkpoint(scope, &written, None).await?;
    let back = store.read_checkpoint(scope, &id).await?;
    if back.as_ref().map(|c| &c.state) != Some(&written.state) {
        return Err(runkeep::Error::corrupted(
            "the probe checkpoint read back differently from what was written",
        ));
    }
    let lease = store
        .claim(
            scope,
            &ClaimOptions::new(Holder::unique("runkeep-doctor"), Ttl::from_millis(30_000)?),
        )
        .await?
        .lease()
        .ok_or_else(|| {
            runkeep::Error::corrupted("the probe run was reported held by someone else")
        })?;
    let mut payload = Map::new();
    payload.insert("probe".into(), json!(nonce));
    store
        .append_events(
            scope,
            &[NewEvent::new("doctor_probe", payload)],
            Some(lease.fence),
        )
        .await?;
    let events = store
        .read_events(scope, &ReadEventsOptions::default())
        .await?;
    if events.events.last().and_then(|e| e.payload.get("probe")) != Some(&json!(nonce)) {
        return Err(runkeep::Error::corrupted(
            "the probe event read back differently from what was appended",
        ));
    }
    if !store.release(scope, lease.fence).await? {
        return Err(runkeep::Error::corrupted(
            "the probe lease could not be released",
        ));
    }
    store.delete_checkpoint(scope, &id, None).await?;
    if store.read_checkpoint(scope, &id).await?.is_some() {
        return Err(runkeep::Error::corrupted(
            "the probe checkpoint is still there after delete",
        ));
    }
    Ok(())
}

/// PostgreSQL: the schema's recorded runkeep version against this
/// binary's. Missing (never migrated) and older fail with "run `runkeep
/// migrate`"; newer fails with "upgrade runkeep". Skipped on other backends.
async fn schema_version(env: &Env) -> CliResult<Outcome> {
    let Some((_, target)) = env.store()?.postgres() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a PostgreSQL store: it has no schema version",
            env.address
        )));
    };
    let schema = &target.options.schema;
    let ours = runkeep_postgres::SCHEMA_VERSION;
    let found = runkeep_postgres::PgStore::schema_version(target.address.url(), &target.options)
        .await
        .map_err(|e| CliError::from(e).context("read the schema version"))?;
    Ok(match found {
        0 => Outcome::fail(format!(
            "schema {schema} holds no runkeep tables (never migrated)"
        ))
        .remedy("run `runkeep migrate` with the same --store (and --pg-schema); every other command refuses the schema until then"),
        v if v < ours => Outcome::fail(format!(
            "schema {schema} is at runkeep schema version {v}, older than {ours}"
        ))
        .remedy("run `runkeep migrate` to bring it to this binary's version"),
        v if v > ours => Outcome::fail(format!(
            "schema {schema} is at runkeep schema version {v}, newer than version {ours} this binary knows"
        ))
        .remedy("upgrade runkeep (a newer binary migrated it); this one refuses to read or write it"),
        v => Outcome::pass(format!(
            "schema {schema} is at runkeep schema version {v}, this binary's"
        )),
    })
}

/// The lock query of store.row-locks: every backend other than the
/// doctor's own holding a lock on one of the store's tables, with how
/// long its transaction has been open. Row locks (`SELECT … FOR UPDATE`,
/// `UPDATE`) show in `pg_locks` as `RowShareLock` / `RowExclusiveLock` on
/// the table, held until the transaction ends; a runkeep write holds them
/// for one short transaction, so an old one is a stuck or partitioned
/// client blocking the runs it locked (claimers skip them, writers wait up
/// to `lock_timeout`).
const ROW_LOCKS_SQL: &str = "
SELECT a.pid,
       coalesce(a.application_name, ''),
       coalesce(host(a.client_addr), 'local'),
       coalesce(a.state, ''),
       floor(extract(epoch FROM (clock_timestamp() - a.xact_start)) * 1000)::bigint,
       string_agg(DISTINCT c.relname || ' ' || l.mode || CASE WHEN l.granted THEN '' ELSE ' (waiting)' END, ', '),
       left(coalesce(a.query, ''), 120)
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE n.nspname = $1
   AND c.relname IN ('runs', 'checkpoints', 'events', 'audit')
   AND l.mode IN ('RowShareLock', 'RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
   AND a.pid <> pg_backend_pid()
   AND a.application_name IS DISTINCT FROM $2
   AND a.xact_start IS NOT NULL
   AND clock_timestamp() - a.xact_start >= make_interval(secs => $3::double precision)
 GROUP BY a.pid, a.application_name, a.client_addr, a.state, a.xact_start, a.query
 ORDER BY a.xact_start";

/// PostgreSQL: transactions that have held locks on the store's tables
/// for longer than `--lock-age` (all tenants: locks are the server's).
async fn row_locks(env: &Env) -> CliResult<Outcome> {
    let Some((pg, target)) = env.store()?.postgres() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a PostgreSQL store: it takes no row locks",
            env.address
        )));
    };
    let schema = &target.options.schema;
    let c = pg.pool().get().await.map_err(|e| {
        CliError::failed(format!("no connection to read pg_locks: {e}"))
            .hint("see store.reachable and store.schema-version")
    })?;
    let me = super::doctor_application_name();
    let age = env.lock_age.as_secs_f64();
    let rows = c
        .query(ROW_LOCKS_SQL, &[schema, &me, &age])
        .await
        .map_err(|e| CliError::failed(format!("read pg_locks and pg_stat_activity: {e}")))?;
    let after = crate::output::human_duration(env.lock_age);
    if rows.is_empty() {
        return Ok(Outcome::pass(format!(
            "no transaction has held locks on schema {schema}'s tables for longer than {after}"
        )));
    }
    let found: Vec<String> = rows
        .iter()
        .map(|r| {
            let pid: i32 = r.get(0);
            let app: String = r.get(1);
            let client: String = r.get(2);
            let state: String = r.get(3);
            let held_ms: i64 = r.get(4);
            let locks: String = r.get(5);
            let query: String = r.get(6);
            format!(
                "pid {pid} ({}{client}, {state}, transaction open {}: {locks}; last query: {})",
                if app.is_empty() {
                    String::new()
                } else {
                    format!("{app} from ")
                },
                crate::output::human_duration(std::time::Duration::from_millis(
                    u64::try_from(held_ms).unwrap_or(0)
                )),
                query.split_whitespace().collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    let first: i32 = rows[0].get(0);
    Ok(Outcome::warn(format!(
        "{} transaction(s) have held locks on schema {schema}'s tables for longer than {after}: {}",
        found.len(),
        env.list(found)
    ))
    .remedy(format!(
        "a client stopped mid-transaction (stuck or partitioned): the runs it locked are skipped by claim_next and their writers wait up to lock_timeout; runkeep's own connections end such a transaction after idle_in_transaction_session_timeout (60 s); end one now with `SELECT pg_terminate_backend({first})` (--lock-age sets the threshold)"
    )))
}

/// Linux errnos that mean "this volume has no hard links" (spec FL-20):
/// EPERM, EXDEV, EMLINK, ENOSYS, EOPNOTSUPP.
const NO_HARD_LINK_ERRNOS: [i32; 5] = [1, 18, 31, 38, 95];

fn hard_links(env: &Env) -> CliResult<Outcome> {
    let Some(base_dir) = env.base_dir() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a directory store: it does not publish claims by hard link",
            env.address
        )));
    };
    let stem = format!(
        ".runkeep-doctor-link-{}-{}",
        std::process::id(),
        runkeep::id::random_suffix(8)
    );
    let source = base_dir.join(format!("{stem}.a"));
    let target = base_dir.join(format!("{stem}.b"));
    if let Err(e) = std::fs::write(&source, b"runkeep doctor hard-link probe\n") {
        return Err(CliError::failed(format!(
            "cannot create a test file in {}: {e}",
            base_dir.display()
        ))
        .hint("see store.writable"));
    }
    let linked = std::fs::hard_link(&source, &target);
    let _ = std::fs::remove_file(&target);
    let _ = std::fs::remove_file(&source);
    match linked {
        Ok(()) => Ok(Outcome::pass(format!("{} supports hard links", env.address))),
        Err(e) if e.raw_os_error().is_some_and(|c| NO_HARD_LINK_ERRNOS.contains(&c)) => Ok(Outcome::fail(format!(
            "{} cannot hard-link ({e}): the directory store cannot publish a run claim there",
            base_dir.display()
        ))
        .remedy("claims need hard-link support to keep a single writer per run; move the store to ext4, xfs, btrfs or tmpfs")),
        Err(e) => Err(CliError::failed(format!("hard-link test in {} failed: {e}", base_dir.display()))),
    }
}

/// Whether a process listing this directory store can use the session
/// index (O(page) per listing) or walks every run (O(runs) per page), and
/// how much of the user's inotify watch budget the index takes.
fn listing_index(env: &Env) -> CliResult<Outcome> {
    let opened = env.store()?;
    let Some(outlook) = opened.index_outlook() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a directory store: it has no session index",
            env.address
        )));
    };
    let o = outlook?;
    verdict_of_index(&o, runkeep_fs::IndexOutlook::watch_limit())
}

/// [`listing_index`]'s verdict on an outlook and a watch limit.
fn verdict_of_index(o: &runkeep_fs::IndexOutlook, limit: Option<u64>) -> CliResult<Outcome> {
    if let Some(why) = &o.refused {
        return Ok(Outcome::warn(format!(
            "listings walk every run directory (O(runs) per page): {why}"
        ))
        .remedy("correct either way; for listings that do not slow down with the store, keep it on a local filesystem"));
    }
    let Some(limit) = limit else {
        return Ok(Outcome::inconclusive(format!(
            "cannot read fs.inotify.max_user_watches; the session index needs {} watches for {} run directories",
            o.watches, o.run_dirs
        )));
    };
    let suggest = (o.watches * 2 + 8192).next_power_of_two();
    let raise = format!(
        "raise the limit, e.g. `sysctl fs.inotify.max_user_watches={suggest}` (and in /etc/sysctl.d/ to keep it); each watch costs about 1 KiB of kernel memory"
    );
    let budget = runkeep_fs::IndexOutlook::budget_of(limit);
    if o.watches > budget {
        let swept = o.run_dirs - o.run_dirs * budget / o.watches;
        return Ok(Outcome::warn(format!(
            "the session index needs {} inotify watches for {} run directories, over its budget of {budget} (half of this user's limit of {limit}): about {swept} run directories are swept by stamp instead of watched, so other processes' changes to them reach a listing within seconds rather than at once, and the sweeper thread takes CPU",
            o.watches, o.run_dirs
        ))
        .remedy(raise));
    }
    Ok(Outcome::pass(format!(
        "the session index needs {} inotify watches for {} run directories, within its budget of {budget} (half of this user's limit of {limit})",
        o.watches, o.run_dirs
    )))
}

async fn expired_unreclaimed(env: &Env) -> CliResult<Outcome> {
    let describe = |run: &str, holder: &str, fence: runkeep::Fence, expires_at: Timestamp| {
        format!(
            "{run} ({holder}, fence {fence}, expired {})",
            crate::output::relative(expires_at, env.now)
        )
    };
    let (expired, scan): (Vec<String>, Option<Arc<Diagnosis>>) = match env.diagnosis().await {
        Some(scan) => {
            let scan = scan?;
            if scan.runs_scanned == 0 {
                return Ok(Outcome::skipped("no run directories to inspect"));
            }
            let mut found: Vec<String> = scan
                .expired_unreclaimed
                .iter()
                .map(|(run, l)| describe(run.run_id.as_str(), &l.holder, l.fence, l.expires_at))
                .collect();
            found.extend(scan.unreadable_holdings.iter().map(|(run, p)| {
                format!(
                    "{} (unreadable holding {}; it counts as expired, the next claim lands above it)",
                    run.run_id,
                    holding_name(p)
                )
            }));
            (found, Some(scan))
        }
        None => {
            // Backends without a scan: walk the listing of the scope.
            let rows = listing_rows(env).await?;
            if rows.is_empty() {
                return Ok(Outcome::skipped(format!(
                    "no runs in {}",
                    env.scope.listing()?
                )));
            }
            let found = rows
                .iter()
                .filter_map(|r| {
                    r.claim
                        .as_ref()
                        .filter(|c| c.expired && !c.holder.is_empty() && c.fence.get() < MAX_FENCE)
                        .map(|c| {
                            describe(r.scope.run_id.as_str(), &c.holder, c.fence, c.expires_at)
                        })
                })
                .collect();
            (found, None)
        }
    };
    let outcome = if expired.is_empty() {
        Outcome::pass("no lease is past expiry unreclaimed")
    } else {
        Outcome::warn(format!("{} lease(s) expired and never reclaimed: {}", expired.len(), env.list(expired)))
            .remedy("their workers likely died; the runs are claimable (`runkeep runs --unclaimed`), release or reclaim them")
    };
    Ok(match scan {
        Some(scan) => unproven(env, &scan, outcome),
        None => outcome,
    })
}

/// Runs whose top holding sits at the fence ceiling: `Fence::next` refuses,
/// so no claim, renewal or release can ever be issued for them again.
async fn fence_ceiling(env: &Env) -> CliResult<Outcome> {
    let (wedged, scan): (Vec<String>, Option<Arc<Diagnosis>>) = match env.diagnosis().await {
        Some(scan) => {
            let scan = scan?;
            if scan.runs_scanned == 0 {
                return Ok(Outcome::skipped("no run directories to inspect"));
            }
            let found = scan
                .fence_ceiling
                .iter()
                .map(|(run, p)| format!("{} ({})", run.run_id, holding_name(p)))
                .collect();
            (found, Some(scan))
        }
        None => {
            let rows = listing_rows(env).await?;
            if rows.is_empty() {
                return Ok(Outcome::skipped(format!(
                    "no runs in {}",
                    env.scope.listing()?
                )));
            }
            let found = rows
                .iter()
                .filter(|r| r.claim.as_ref().is_some_and(|c| c.fence.get() >= MAX_FENCE))
                .map(|r| r.scope.run_id.to_string())
                .collect();
            (found, None)
        }
    };
    let outcome = if wedged.is_empty() {
        Outcome::pass(format!("no run is at the fence ceiling {MAX_FENCE}"))
    } else {
        Outcome::fail(format!(
            "{} run(s) at the fence ceiling {MAX_FENCE}, wedged: no claim, renewal or release can be issued for them any more: {}",
            wedged.len(),
            env.list(wedged)
        ))
        .remedy("they are not claimable; copy each run's state to a new run id and point its work there, then archive or delete the old run")
    };
    Ok(match scan {
        Some(scan) => unproven(env, &scan, outcome),
        None => outcome,
    })
}

/// Runs dead-lettered by their attempt limit: status `failed` with the
/// reason [`ATTEMPTS_EXHAUSTED`]. The listing carries the status; the reason
/// is read from each failed run's lifecycle. A run failed by its holder
/// (any other reason) is an outcome, not a finding.
async fn dead_lettered(env: &Env) -> CliResult<Outcome> {
    let rows = listing_rows(env).await?;
    if rows.is_empty() {
        return Ok(Outcome::skipped(format!(
            "no runs in {}",
            env.scope.listing()?
        )));
    }
    let store = &env.store()?.store;
    let mut dead = Vec::new();
    for row in rows
        .iter()
        .filter(|r| r.damaged.is_none() && r.status == RunStatus::Failed)
    {
        let l = store
            .lifecycle(&row.scope)
            .await
            .map_err(|e| CliError::from(e).context(format!("lifecycle of {}", row.scope.run_id)))?;
        if l.reason.as_deref() == Some(ATTEMPTS_EXHAUSTED) {
            dead.push(format!(
                "{} ({} attempt(s){})",
                row.scope.run_id,
                l.attempts,
                l.finished_at
                    .map(|t| format!(", failed {}", crate::output::relative(t, env.now)))
                    .unwrap_or_default()
            ));
        }
    }
    if dead.is_empty() {
        return Ok(Outcome::pass(format!(
            "no dead-lettered run among {} run(s)",
            rows.len()
        )));
    }
    let first = dead[0].split(' ').next().unwrap_or("RUN").to_string();
    Ok(Outcome::warn(format!(
        "{} run(s) dead-lettered (failed: {ATTEMPTS_EXHAUSTED}): {}",
        dead.len(),
        env.list(dead)
    ))
    .remedy(format!(
        "each was lost by one holder after another (a worker that crashes or stalls on it every time); see what it did with `runkeep events {first}`, fix the cause, then `runkeep reopen {first}` makes it runnable again (attempts restart at 0)"
    )))
}

/// When a runnable row became takeable, as far as the row can tell: the
/// latest of its latest checkpoint (an enqueue writes one; a worker that
/// released it wrote its last one before), its not-before instant, the
/// expiry of a lapsed lease, and the answer (or the missed deadline) of its
/// park.
fn runnable_since(row: &RunRow) -> Option<Timestamp> {
    let lapsed = row
        .claim
        .as_ref()
        .filter(|c| c.expired && !c.holder.is_empty())
        .map(|c| c.expires_at);
    let park = row.park.as_ref().and_then(|p| match p.state {
        runkeep::ParkState::Resolved => p.resolved_at,
        runkeep::ParkState::Expired => p.deadline_at,
        runkeep::ParkState::Outstanding => None,
    });
    [row.latest_checkpoint_at, row.available_at, lapsed, park]
        .into_iter()
        .flatten()
        .max()
}

/// Runnable runs that no worker has taken for longer than `--stale-after`:
/// active, not damaged, nobody holding them live, not deferred past now, not
/// waiting on an outstanding park (a human's answer, not a worker), and
/// [`runnable_since`] more than the threshold ago.
async fn stale_runnable(env: &Env) -> CliResult<Outcome> {
    let rows = listing_rows(env).await?;
    if rows.is_empty() {
        return Ok(Outcome::skipped(format!(
            "no runs in {}",
            env.scope.listing()?
        )));
    }
    let threshold = i64::try_from(env.stale_after.as_millis()).unwrap_or(i64::MAX);
    let after = crate::output::human_duration(env.stale_after);
    let runnable: Vec<&RunRow> = rows
        .iter()
        .filter(|r| {
            r.is_claimable(env.now)
                && r.park
                    .as_ref()
                    .is_none_or(|p| p.state != runkeep::ParkState::Outstanding)
        })
        .collect();
    let stale: Vec<String> = runnable
        .iter()
        .filter_map(|r| {
            let since = runnable_since(r)?;
            (env.now.as_millis().saturating_sub(since.as_millis()) > threshold).then(|| {
                format!(
                    "{} (runnable since {})",
                    r.scope.run_id,
                    crate::output::when(since, env.now)
                )
            })
        })
        .collect();
    if stale.is_empty() {
        return Ok(Outcome::pass(format!(
            "no runnable run has waited longer than {after} ({} runnable of {})",
            runnable.len(),
            rows.len()
        )));
    }
    Ok(Outcome::warn(format!(
        "{} runnable run(s) no worker has taken for longer than {after}: {}",
        stale.len(),
        env.list(stale)
    ))
    .remedy("no worker is draining this scope, or every worker is busy: check that workers run against this store and scope, or add workers; `runkeep runs --status active --unclaimed` lists the queue (--stale-after sets the threshold)"))
}

/// `store.run:single-open-writer` (spec DR-17/18, WK-25), evaluated from the
/// store's persisted fenced-out refusal counters. Refusals are `warn`, not
/// `fail`: each one is a superseded writer the store *stopped* (nothing it
/// wrote was accepted), and the counters are cumulative, so `fail` would
/// never clear; they still say a second writer was open, which an operator
/// should know about.
async fn invariants(env: &Env) -> CliResult<Outcome> {
    const ID: &str = "store.run:single-open-writer";
    let Some(scan) = env.diagnosis().await else {
        return Ok(Outcome::skipped(format!(
            "{ID}: {} keeps no persisted refusal counters; nothing to evaluate",
            env.address
        )));
    };
    let scan = scan?;
    if scan.runs_scanned == 0 {
        return Ok(Outcome::skipped(format!(
            "{ID}: no run directories to evaluate"
        )));
    }
    let refused: Vec<_> = scan
        .fenced_out_refusals
        .iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    if refused.is_empty() {
        let pass = Outcome::pass(format!(
            "1/1 invariant holds — {ID} (0 fenced-out refusals recorded in {} run(s))",
            scan.runs_scanned
        ));
        return Ok(unproven(env, &scan, pass));
    }
    let total: u64 = refused.iter().map(|(_, n)| n).sum();
    Ok(Outcome::warn(format!(
        "{ID}: {total} superseded write(s) refused in {} run(s): {}",
        refused.len(),
        env.list(refused.iter().map(|(run, n)| format!("{} ({n})", run.run_id)))
    ))
    .remedy("a worker kept writing after its lease was taken over (stalled or partitioned); the store refused it. Renew more often than the TTL, or lengthen the TTL"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runkeep::{CheckpointStore, EnqueueOptions, ManualClock, MemoryStore, PendingDecision};

    const T0: i64 = 1_800_000_000_000;
    const MIN: i64 = 60_000;

    struct Fixture {
        store: Arc<MemoryStore>,
        clock: ManualClock,
        parts: ScopeParts,
    }

    impl Fixture {
        fn new() -> Self {
            let clock = ManualClock::new(Timestamp::from_millis(T0).unwrap());
            Self {
                store: Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))),
                clock,
                parts: ScopeParts::parse("t", "p", "s").unwrap(),
            }
        }
        fn scope(&self, run: &str) -> RunScope {
            self.parts.run(&run.parse().unwrap(), None).unwrap()
        }
        async fn enqueue(&self, run: &str, options: EnqueueOptions) {
            let now = self.store.now();
            let cp = Checkpoint::new("cp_enqueued".parse().unwrap(), now, Map::new());
            self.store
                .enqueue(&self.scope(run), &cp, &options)
                .await
                .unwrap();
        }
        async fn claim(&self, run: &str, holder: &str, ttl_ms: u64) -> runkeep::ClaimOutcome {
            let opts = ClaimOptions::new(
                Holder::new(holder).unwrap(),
                Ttl::from_millis(ttl_ms).unwrap(),
            );
            self.store.claim(&self.scope(run), &opts).await.unwrap()
        }
        fn env(&self, stale_after_ms: u64) -> Env {
            Env::new(
                StoreAddress::Memory,
                Ok(OpenedStore::memory_for_tests(self.store.clone())),
                self.parts.clone(),
                self.store.now(),
                true,
                std::time::Duration::from_millis(stale_after_ms),
                std::time::Duration::from_secs(10),
            )
        }
    }

    #[tokio::test]
    async fn dead_lettered_runs_warn_by_name_and_a_holders_failure_does_not() {
        let f = Fixture::new();
        let one = EnqueueOptions {
            max_attempts: Some(1),
            ..EnqueueOptions::default()
        };
        f.enqueue("run_poison", one).await;
        f.enqueue("run_failed", EnqueueOptions::default()).await;
        f.enqueue("run_fine", EnqueueOptions::default()).await;
        assert!(dead_lettered(&f.env(1)).await.unwrap().status == Status::Pass);
        // The poison run's holder is lost once: the takeover dead-letters it.
        f.claim("run_poison", "worker-a", 1000)
            .await
            .lease()
            .unwrap();
        // A run its holder finished as failed is an outcome, not a finding.
        let lease = f
            .claim("run_failed", "worker-a", 60_000)
            .await
            .lease()
            .unwrap();
        f.store
            .finish(
                &f.scope("run_failed"),
                lease.fence,
                &runkeep::Outcome::failed("bad input"),
            )
            .await
            .unwrap();
        f.clock.advance(2000);
        assert!(matches!(
            f.claim("run_poison", "worker-b", 1000).await,
            runkeep::ClaimOutcome::Finished(RunStatus::Failed)
        ));
        let found = dead_lettered(&f.env(1)).await.unwrap();
        assert_eq!(found.status, Status::Warn, "{}", found.message);
        assert!(
            found.message.contains("run_poison (1 attempt(s)"),
            "{}",
            found.message
        );
        assert!(!found.message.contains("run_failed"), "{}", found.message);
        let fix = found.remediation.unwrap();
        assert!(fix.contains("runkeep reopen run_poison"), "{fix}");
        // Reopened, it is no longer dead-lettered.
        f.store.reopen(&f.scope("run_poison")).await.unwrap();
        assert_eq!(dead_lettered(&f.env(1)).await.unwrap().status, Status::Pass);
    }

    #[tokio::test]
    async fn only_runnable_runs_waiting_past_the_threshold_are_stale() {
        let f = Fixture::new();
        f.enqueue("run_old", EnqueueOptions::default()).await;
        // Deferred until 20 min: not runnable at 11 min.
        let later = EnqueueOptions {
            available_at: Some(Timestamp::from_millis(T0 + 20 * MIN).unwrap()),
            ..EnqueueOptions::default()
        };
        f.enqueue("run_deferred", later).await;
        // Deferred until 5 min: runnable since then (6 min at 11 min).
        let soon = EnqueueOptions {
            available_at: Some(Timestamp::from_millis(T0 + 5 * MIN).unwrap()),
            ..EnqueueOptions::default()
        };
        f.enqueue("run_soon", soon).await;
        f.enqueue("run_held", EnqueueOptions::default()).await;
        f.enqueue("run_lapsed", EnqueueOptions::default()).await;
        f.enqueue("run_done", EnqueueOptions::default()).await;
        f.enqueue("run_parked", EnqueueOptions::default()).await;
        f.claim("run_lapsed", "worker-a", (8 * MIN) as u64)
            .await
            .lease()
            .unwrap();
        let done = f
            .claim("run_done", "worker-a", 60_000)
            .await
            .lease()
            .unwrap();
        f.store
            .finish(
                &f.scope("run_done"),
                done.fence,
                &runkeep::Outcome::completed(None),
            )
            .await
            .unwrap();
        let parked = Checkpoint::new("cp_park".parse().unwrap(), f.store.now(), Map::new())
            .with_pending(PendingDecision::new("review", Map::new(), f.store.now()));
        f.store
            .write_checkpoint(&f.scope("run_parked"), &parked, None)
            .await
            .unwrap();
        f.clock.advance(11 * MIN);
        f.claim("run_held", "worker-b", (10 * MIN) as u64)
            .await
            .lease()
            .unwrap();
        f.enqueue("run_new", EnqueueOptions::default()).await;
        let found = stale_runnable(&f.env((10 * MIN) as u64)).await.unwrap();
        assert_eq!(found.status, Status::Warn, "{}", found.message);
        assert!(
            found.message.starts_with("1 runnable run(s)"),
            "{}",
            found.message
        );
        assert!(
            found.message.contains("run_old (runnable since"),
            "{}",
            found.message
        );
        // A lease that lapsed 3 min ago, a run deferred past now or until
        // 6 min ago, a held, finished, parked or new run: none is stale.
        let found = stale_runnable(&f.env((5 * MIN) as u64)).await.unwrap();
        assert!(found.message.contains("run_soon"), "{}", found.message);
        assert!(!found.message.contains("run_lapsed"), "{}", found.message);
        for quiet in [
            "run_deferred",
            "run_held",
            "run_done",
            "run_parked",
            "run_new",
        ] {
            assert!(!found.message.contains(quiet), "{quiet}: {}", found.message);
        }
        let lapsed = stale_runnable(&f.env((2 * MIN) as u64)).await.unwrap();
        assert!(lapsed.message.contains("run_lapsed"), "{}", lapsed.message);
        assert_eq!(
            stale_runnable(&f.env((60 * MIN) as u64))
                .await
                .unwrap()
                .status,
            Status::Pass
        );
    }

    #[test]
    fn the_listing_index_verdict_follows_the_watch_budget() {
        use crate::doctor::Status;
        let o = |watches: u64, refused: Option<&str>| runkeep_fs::IndexOutlook {
            run_dirs: watches / 4,
            watches,
            refused: refused.map(str::to_owned),
        };
        let v = |o: &runkeep_fs::IndexOutlook, limit| verdict_of_index(o, limit).unwrap();
        assert_eq!(v(&o(4_001, None), Some(192_530)).status, Status::Pass);
        assert_eq!(v(&o(96_265, None), Some(192_530)).status, Status::Pass);
        // Over half the limit: the index's budget; some runs are swept.
        let over = v(&o(400_000, None), Some(192_530));
        assert_eq!(over.status, Status::Warn, "{}", over.message);
        assert!(
            over.message
                .contains("about 75934 run directories are swept"),
            "{}",
            over.message
        );
        let remedy = over.remediation.clone().unwrap_or_default();
        assert!(
            remedy.contains("fs.inotify.max_user_watches=1048576"),
            "{remedy}"
        );
        let remote = v(&o(5, Some("on NFS")), Some(192_530));
        assert_eq!(remote.status, Status::Warn);
        assert!(remote.message.contains("on NFS"));
        assert_eq!(v(&o(5, None), None).status, Status::Inconclusive);
    }

    #[test]
    fn the_listing_index_outlook_counts_what_the_index_watches() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        // A run with checkpoints/ and claims/, one bare, one with a sub-run
        // (children/ plus the child's own checkpoints/), and a non-run.
        std::fs::create_dir_all(base.join("run_a/checkpoints")).unwrap();
        std::fs::create_dir_all(base.join("run_a/claims")).unwrap();
        std::fs::create_dir_all(base.join("run_b")).unwrap();
        std::fs::create_dir_all(base.join("run_c/children/run_k/checkpoints")).unwrap();
        std::fs::create_dir_all(base.join("other/checkpoints")).unwrap();
        let o = runkeep_fs::IndexOutlook::of(base);
        assert_eq!(o.run_dirs, 4);
        // base 1 + run_a 3 + run_b 1 + run_c 2 (itself, children/) + run_k 2.
        assert_eq!(o.watches, 9);
        assert_eq!(o.refused, None);
    }

    #[test]
    fn check_ids_are_unique_and_categories_documented() {
        let checks = registry();
        let mut ids: Vec<&str> = checks.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), checks.len(), "a duplicate check id");
        for c in &checks {
            assert!(
                ["store", "integrity", "leases", "queue", "runtime"].contains(&c.category),
                "{}",
                c.id
            );
            assert!(c.id.contains('.'), "{}", c.id);
        }
    }
}
