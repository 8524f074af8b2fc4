//! The doctor's checks.
//!
//! | id | category | looks at |
//! |---|---|---|
//! | `store.reachable` | store | the store answers a listing of the scope |
//! | `store.writable` | store | write, read back, claim, release, append and delete in a scratch location |
//! | `store.schema-version` | store | PostgreSQL: the schema's runkeep version is this binary's (missing, older or newer fail) |
//! | `store.autovacuum` | store | PostgreSQL: autovacuum is on for the server and the store's `runs` table (dead row versions slow `claim_next`) |
//! | `store.replication` | store | PostgreSQL: every standby streaming from the server is synchronous and `synchronous_commit` is at least `on` for the store's role and database (else a failover can lose acknowledged claims and steps) |
//! | `store.hard-links` | store | the directory can hard-link (fs; claims are published by link) |
//! | `store.listing-index` | store | a directory store's listings can use the session index within the inotify watch budget |
//! | `store.scratch-leftovers` | integrity | claim scratch files older than the scratch TTL (10 min, `runkeep_fs::Diagnosis::SCRATCH_TTL`) |
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
//! | `runtime.invariants` | runtime | a run has a single open writer, from persisted fenced-out refusal counters |
//!
//! A scan-based check that finds nothing but could not read part of the
//! store is `inconclusive`, never `pass` (see [`unproven`]).
//!
//! Each file holds one job: `store.rs` the checks every backend answers
//! (reachable, writable), `filesystem.rs` a directory store's volume (hard
//! links, the session index), `postgres.rs` a PostgreSQL store's schema
//! and row locks, `integrity.rs` what the directory scan found, `leases.rs`,
//! `queue.rs` and `runtime.rs` their categories. This file holds what
//! every check reads ([`Env`]), the registry (report order) and the
//! helpers they share.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use runkeep::lease::MAX_FENCE;
use runkeep::lifecycle::ATTEMPTS_EXHAUSTED;
use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, Holder, ListOptions, NewEvent, ReadEventsOptions,
    RunRow, RunScope, RunStore, Timestamp, Ttl,
};
use serde_json::{json, Map};

use super::{Check, Outcome, Status};
use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;
use crate::store::{Diagnosis, OpenedStore, StoreAddress};

mod filesystem;
mod integrity;
mod leases;
mod postgres;
mod queue;
mod runtime;
mod store;

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
            store::reachable(&env).await
        }),
        check("store.writable", "store", |env| async move {
            store::writable(&env).await
        }),
        check("store.schema-version", "store", |env| async move {
            postgres::schema_version(&env).await
        }),
        check("store.autovacuum", "store", |env| async move {
            postgres::autovacuum(&env).await
        }),
        check("store.replication", "store", |env| async move {
            postgres::replication(&env).await
        }),
        check("store.hard-links", "store", |env| async move {
            filesystem::hard_links(&env)
        }),
        check("store.listing-index", "store", |env| async move {
            filesystem::listing_index(&env)
        }),
        check("store.scratch-leftovers", "integrity", |env| async move {
            integrity::scratch_leftovers(&env).await
        }),
        check("store.torn-transcripts", "integrity", |env| async move {
            integrity::torn_transcripts(&env).await
        }),
        check("store.damaged-checkpoints", "integrity", |env| async move {
            integrity::damaged_checkpoints(&env).await
        }),
        check("store.damaged-transcripts", "integrity", |env| async move {
            integrity::damaged_transcripts(&env).await
        }),
        check("store.unreadable-paths", "integrity", |env| async move {
            integrity::unreadable_paths(&env).await
        }),
        check("store.oversized-claims", "integrity", |env| async move {
            integrity::oversized_claims(&env).await
        }),
        check("leases.expired-unreclaimed", "leases", |env| async move {
            leases::expired_unreclaimed(&env).await
        }),
        check("store.row-locks", "leases", |env| async move {
            postgres::row_locks(&env).await
        }),
        check("leases.fence-ceiling", "leases", |env| async move {
            leases::fence_ceiling(&env).await
        }),
        check("queue.dead-lettered", "queue", |env| async move {
            queue::dead_lettered(&env).await
        }),
        check("queue.stale-runnable", "queue", |env| async move {
            queue::stale_runnable(&env).await
        }),
        check("runtime.invariants", "runtime", |env| async move {
            runtime::invariants(&env).await
        }),
    ]
}

/// Test-only check that blocks its thread for `ms` (see `SLOW_CHECK_ENV`).
#[cfg(feature = "testing")]
pub fn slow_check(ms: u64) -> Check {
    check("test.slow-check", "custom", move |_env| async move {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        Ok(Outcome::pass(format!("slept {ms} ms")))
    })
}

/// Test-only check that panics or errors (see `FAULTY_CHECK_ENV`).
#[cfg(feature = "testing")]
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

#[cfg(test)]
mod tests {
    use super::*;

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
