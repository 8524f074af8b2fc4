//! `PgStore`: the runkeep contract (revision 2) on PostgreSQL, for fleets of
//! workers on many machines sharing one database.
//!
//! # Why it looks like this
//!
//! - **One rule, one place.** Every decision (claims, attempts and
//!   dead-lettering, the fence check, finish, reopen, park answers, the
//!   checkpoint total order, the listing's filters and cursors) is the
//!   core's pure function, applied in Rust to the run's row read *under a
//!   row lock* (`SELECT … FOR UPDATE` on the run's row in `runs`), and the
//!   result is written back in the same transaction. SQL only narrows and
//!   orders candidates (listing, `claim_next`) with conditions that mirror
//!   the core's exactly; the core then re-judges each candidate, so a
//!   prefilter can only cost a row read, never change an answer (the
//!   conformance kit and the differential test against `MemoryStore` prove
//!   the agreement).
//! - **The fence check is atomic with the write.** Every fenced write locks
//!   the run's row, checks the fence against the top holding read under the
//!   lock, and writes in the same transaction; a superseded holder has no
//!   window. Event `seq` is the row's `last_seq + 1 …`, advanced under the
//!   same lock: no gap, no duplicate. `commit_step` and `finish` are one
//!   transaction each (the lease ends in the commit that finishes).
//! - **The database's clock decides.** Claims, expiry, deadlines,
//!   `available_at`, `finished_at` and event timestamps are judged by
//!   `clock_timestamp()` read on the server inside the transaction, after
//!   the row lock is held. [`CheckpointStore::now`] answers the machine
//!   clock corrected by the offset to the server measured on every such
//!   read. Tests may replace the server's clock with [`PgOptions::clock`]
//!   (the conformance kit moves a `ManualClock`); production leaves it
//!   `None`.
//! - **Tenants in every key.** Every table's primary key starts with
//!   `(tenant_id, project_id, session_id, run_id, parent_id)` and every
//!   statement binds all of them (or the listing scope's prefix): a guessed
//!   run id under another tenant addresses another row. Row-level security
//!   is not used: the store connects as one role for all tenants, so RLS
//!   would add a per-transaction `SET` without a second line of defence
//!   (docs/design.md).
//! - **Few round trips.** An operation waits for the server as few times
//!   as the rule allows: `BEGIN` travels with the statements that lock and
//!   read the run's row (and read the clock, and whether the checkpoint it
//!   writes exists), and every write travels with `COMMIT`. So a write is
//!   two round trips (the core judges between them), `claim_next` too, and
//!   no row is created for a fenced write (a fence needs a holding, so the
//!   row exists). The digest is kept from what it holds whenever it can be
//!   (module `pipeline`, and docs/design.md).
//! - **Waiting, not polling.** A change sends `pg_notify` right after its
//!   `COMMIT`, in the same write, in a transaction of its own that does
//!   not wait for a flush, never inside the data transaction (a `NOTIFY`
//!   there serialises commits: module `wake`); the caller does not wait for
//!   it. One dedicated connection per store `LISTEN`s and wakes
//!   [`Watch`]es, with a fallback poll when the listener is reconnecting.
//!
//! Size limits: the core's (checkpoints and documents 64 MiB, events
//! 4 MiB, a finish result 1 MiB) and this store's own
//! [`PgOptions::max_payload_bytes`] (default [`DEFAULT_MAX_PAYLOAD_BYTES`])
//! for any one JSON value it stores, refused with `InvalidInput`, never
//! truncated.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde_json::{Map, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use runkeep::checkpoint::sort_checkpoints;
use runkeep::evidence::{check_document_size, check_json_document};
use runkeep::lease::{check_write_fence, decide_release, stamp_fence};
use runkeep::lifecycle;
use runkeep::listing::{ListQuery, RowKey};
use runkeep::park::{self, ParkState};
use runkeep::watch::Notifier;
use runkeep::{
    AuditRecord, Checkpoint, CheckpointHeader, CheckpointId, CheckpointStore, ClaimNextFilter,
    ClaimOptions, ClaimOutcome, Clock, EnqueueOptions, Error, EventBatch, EvidenceStore, Fence,
    Holder, Lease, LeaseSummary, Lifecycle, ListOptions, ListOrder, ListingScope, MessageSnapshot,
    NewAuditEvent, NewEvent, Outcome, ParkResolution, PersistedEvent, ReadEventsOptions, Result,
    RunDigest, RunId, RunPage, RunRecord, RunRow, RunScope, Step, StepReceipt, SystemClock,
    Timestamp, TopHolding, Watch, WatchTopic,
};

pub mod error;
mod pipeline;
pub mod schema;
mod wake;

pub use error::OUTCOME_UNKNOWN;
use error::{map_commit, map_pg, map_pool};
use pipeline::{Param, Stmt, Tx};
pub use schema::SCHEMA_VERSION;

/// The largest JSON value (or report) this store accepts by default, in
/// bytes of its compact JSON text: 16 MiB. A row this size already costs
/// its size in WAL and in every reader's memory; store larger bodies
/// elsewhere and reference them.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

/// How a [`PgStore`] connects and judges time.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// The PostgreSQL schema holding the tables (created by the migration).
    /// Default `runkeep`.
    pub schema: String,
    /// Most pooled connections. Default 16.
    pub pool_size: usize,
    /// `statement_timeout` of every pooled connection: no statement runs
    /// longer (a lock wait included). Default 30 s.
    pub statement_timeout: Duration,
    /// `lock_timeout`: the longest wait for a run's row lock. Default 10 s.
    pub lock_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: a client that stops mid
    /// transaction (a partitioned worker) loses its locks after this.
    /// Default 60 s.
    pub idle_in_transaction_timeout: Duration,
    /// TCP connect timeout, and the longest wait for a pooled connection.
    /// Default 10 s.
    pub connect_timeout: Duration,
    /// The longest this client waits for the server's reply to any one
    /// statement (`BEGIN` and `COMMIT` included), on its own timer: the
    /// server's `statement_timeout` cannot fire for a statement that never
    /// reached it (a partition that stops forwarding without a reset, where
    /// TCP keepalives still pass). A statement cut by it is `Unavailable`
    /// (nothing committed); a `COMMIT` cut by it is outcome unknown
    /// ([`Error::is_outcome_unknown`]). Keep it above `statement_timeout`
    /// so the server's own timeout answers first. Default 35 s.
    pub reply_timeout: Duration,
    /// Largest JSON value stored (checkpoint, event, document, result), in
    /// bytes. Default [`DEFAULT_MAX_PAYLOAD_BYTES`].
    pub max_payload_bytes: usize,
    /// **Tests only.** Judge every instant by this clock instead of the
    /// server's `clock_timestamp()` (the conformance kit moves a
    /// `ManualClock`). `None` (the default, and the only production
    /// setting): the database's clock decides.
    pub clock: Option<Arc<dyn Clock>>,
    /// The machine clock [`CheckpointStore::now`] starts from before it adds
    /// the measured offset to the server. Never used to judge anything.
    /// Default [`SystemClock`]; a test skews it to show it does not matter.
    pub local_clock: Arc<dyn Clock>,
    /// How often a watch re-reads when no notification came (a lapsed
    /// lease notifies nobody; a reconnecting listener misses some).
    /// Default 5 s.
    pub watch_fallback: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: "runkeep".into(),
            pool_size: 16,
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            reply_timeout: Duration::from_secs(35),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            clock: None,
            local_clock: Arc::new(SystemClock),
            watch_fallback: Duration::from_secs(5),
        }
    }
}

/// The PostgreSQL store. Cheap to share (`Arc<PgStore>`); every call takes
/// a pooled connection for its one transaction.
pub struct PgStore {
    pool: Pool,
    config: tokio_postgres::Config,
    options: PgOptions,
    channel: String,
    /// Server clock minus local clock, in ms, as last measured.
    offset_ms: AtomicI64,
    notifier: Arc<Notifier>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("PgStore")
            .field("schema", &self.options.schema)
            .field("pool_size", &self.options.pool_size)
            .field("test_clock", &self.options.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        if let Some(h) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.abort();
        }
    }
}

/// The columns of a run's row that its operations decide with.
#[derive(Clone, Debug, Default)]
struct RunState {
    top: Option<TopHolding>,
    lifecycle: Lifecycle,
    digest: Option<RunDigest>,
    last_seq: u64,
    last_audit: u64,
    has_record: bool,
    has_messages: bool,
    has_report: bool,
}

impl RunState {
    fn check(&self, scope: &RunScope, operation: &'static str, fence: Option<Fence>) -> Result<()> {
        match fence {
            Some(f) => check_write_fence(&scope.run_id, operation, f, self.top.as_ref()),
            None => Ok(()),
        }
    }

    fn checkpoint_count(&self) -> u64 {
        self.digest.as_ref().map_or(0, |d| d.checkpoint_count)
    }

    /// The run has any state at all (as `MemoryStore` judges it).
    fn exists(&self) -> bool {
        self.checkpoint_count() > 0 || self.top.is_some() || self.last_seq > 0 || self.has_record
    }

    /// Nothing was ever stored (a row a write of nothing left).
    fn is_blank(&self) -> bool {
        !self.exists()
            && !self.has_messages
            && !self.has_report
            && self.last_audit == 0
            && self.lifecycle == Lifecycle::default()
    }
}

/// The five key columns of a run.
struct Key {
    tenant: String,
    project: String,
    session: String,
    run: String,
    parent: String,
}

impl Key {
    fn of(scope: &RunScope) -> Self {
        Self {
            tenant: scope.tenant_id.to_string(),
            project: scope.project_id.to_string(),
            session: scope.session_id.to_string(),
            run: scope.run_id.to_string(),
            parent: scope
                .parent_run_id
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_default(),
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.tenant,
            &self.project,
            &self.session,
            &self.run,
            &self.parent,
        ]
    }

    fn with<'a>(&'a self, more: &[&'a (dyn ToSql + Sync)]) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut p = self.params();
        p.extend_from_slice(more);
        p
    }

    /// The key as owned parameters `$1`..`$5`, then `more`.
    fn owned(&self, more: Vec<Param>) -> Vec<Param> {
        let mut p: Vec<Param> = vec![
            Box::new(self.tenant.clone()),
            Box::new(self.project.clone()),
            Box::new(self.session.clone()),
            Box::new(self.run.clone()),
            Box::new(self.parent.clone()),
        ];
        p.extend(more);
        p
    }
}

const KEY_WHERE: &str =
    "tenant_id = $1 AND project_id = $2 AND session_id = $3 AND run_id = $4 AND parent_id = $5";
const KEY_COLS: &str = "tenant_id, project_id, session_id, run_id, parent_id";
const STATE_COLS: &str = "top_kind, top_fence, holder, expires_at, lifecycle, digest, last_seq, last_audit_seq, record IS NOT NULL, messages IS NOT NULL, report IS NOT NULL";
/// The server's clock in epoch milliseconds.
const CLOCK: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
const NOW_SQL: &str = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

fn sql_lock() -> String {
    format!("SELECT {STATE_COLS} FROM runs WHERE {KEY_WHERE} FOR UPDATE")
}
fn sql_state() -> String {
    format!("SELECT {STATE_COLS} FROM runs WHERE {KEY_WHERE}")
}
fn sql_ensure() -> String {
    format!("INSERT INTO runs ({KEY_COLS}) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING")
}
/// Read after the lock, in a statement of its own (so its snapshot is taken
/// once the lock is held): the clock (`$6` when the test clock decides,
/// else the server's) and whether checkpoint `$7` exists.
fn sql_after_lock() -> String {
    format!(
        "SELECT coalesce($6::bigint, {CLOCK}), EXISTS (SELECT 1 FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $7::text)"
    )
}
fn sql_headers() -> String {
    format!("SELECT header FROM checkpoints WHERE {KEY_WHERE}")
}
fn sql_save() -> String {
    format!(
        "UPDATE runs SET top_kind = $6, top_fence = $7, holder = $8, expires_at = $9, lifecycle = $10, status = $11, available_at = $12, digest = $13, checkpoint_count = $14, created_rank = $15, created_stamp = $16, park_count = $17, last_seq = $18, last_audit_seq = $19 WHERE {KEY_WHERE}"
    )
}

fn corrupted(scope: &RunScope, what: &str, e: impl std::fmt::Display) -> Error {
    Error::corrupted(format!(
        "run {} in PostgreSQL: {what} does not parse: {e}",
        scope.run_id
    ))
}

fn ts(scope: &RunScope, what: &str, ms: i64) -> Result<Timestamp> {
    Timestamp::from_millis(ms).map_err(|e| corrupted(scope, what, e))
}

fn fence_of(scope: &RunScope, what: &str, v: i64) -> Result<Fence> {
    u64::try_from(v)
        .map_err(|e| corrupted(scope, what, e))
        .and_then(|v| Fence::new(v).map_err(|e| corrupted(scope, what, e)))
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn top_of(scope: &RunScope, row: &Row, base: usize) -> Result<Option<TopHolding>> {
    let kind: Option<i16> = row.get(base);
    let fence: Option<i64> = row.get(base + 1);
    match (kind, fence) {
        (None, _) => Ok(None),
        (Some(1), Some(f)) => {
            let holder: Option<String> = row.get(base + 2);
            let expires: Option<i64> = row.get(base + 3);
            Ok(Some(TopHolding::Lease {
                fence: fence_of(scope, "the lease fence", f)?,
                holder: Holder::new(holder.unwrap_or_default())
                    .map_err(|e| corrupted(scope, "the lease holder", e))?,
                expires_at: ts(scope, "the lease expiry", expires.unwrap_or(0))?,
            }))
        }
        (Some(2), Some(f)) => Ok(Some(TopHolding::Released {
            fence: fence_of(scope, "the tombstone fence", f)?,
        })),
        (k, f) => Err(corrupted(scope, "the top holding", format!("{k:?}/{f:?}"))),
    }
}

fn lifecycle_of(scope: &RunScope, v: Option<Value>) -> Result<Lifecycle> {
    match v {
        None => Ok(Lifecycle::default()),
        Some(v) => serde_json::from_value(v).map_err(|e| corrupted(scope, "the lifecycle", e)),
    }
}

fn digest_of(scope: &RunScope, v: Option<Value>) -> Result<Option<RunDigest>> {
    v.map(|v| serde_json::from_value(v).map_err(|e| corrupted(scope, "the digest", e)))
        .transpose()
}

fn state_of(scope: &RunScope, row: &Row) -> Result<RunState> {
    let last_seq: i64 = row.get(6);
    let last_audit: i64 = row.get(7);
    Ok(RunState {
        top: top_of(scope, row, 0)?,
        lifecycle: lifecycle_of(scope, row.get(4))?,
        digest: digest_of(scope, row.get(5))?,
        last_seq: u64::try_from(last_seq).unwrap_or(0),
        last_audit: u64::try_from(last_audit).unwrap_or(0),
        has_record: row.get(8),
        has_messages: row.get(9),
        has_report: row.get(10),
    })
}

fn checkpoint_of(scope: &RunScope, body: Value) -> Result<Checkpoint> {
    match body {
        Value::Object(obj) => {
            Checkpoint::from_json(obj).map_err(|e| corrupted(scope, "a checkpoint", e))
        }
        other => Err(corrupted(
            scope,
            "a checkpoint",
            format!("not an object: {other}"),
        )),
    }
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// What a transaction reads in the round trip that begins it.
#[derive(Default)]
struct Opening<'a> {
    /// Create the run's row first: writes that may create a run (never a
    /// fenced one: a fence needs a holding, so the row exists).
    create: bool,
    /// Read the instant every judgement uses (after the lock).
    clock: bool,
    /// Whether this checkpoint exists (what the digest needs to know).
    checkpoint: Option<&'a str>,
    /// Statements to run after those, under the lock.
    more: Vec<Stmt>,
}

/// What [`PgStore::open`] read.
struct Opened {
    /// The run's row; `None` when absent.
    state: Option<RunState>,
    /// The judging instant (the test clock's, or the server's read after
    /// the lock); only when asked for.
    now: Option<Timestamp>,
    /// The asked-for checkpoint exists.
    checkpoint_exists: bool,
    /// The rows of [`Opening::more`], in order.
    more: Vec<Vec<Row>>,
}

impl Opened {
    fn now(&self) -> Timestamp {
        self.now.unwrap_or(Timestamp::EPOCH)
    }
}

impl PgStore {
    /// `Unavailable`: a statement got no reply within `reply_timeout`.
    fn no_reply(&self, what: &str) -> Error {
        Error::Unavailable {
            message: format!(
                "PostgreSQL: {what}: no reply within {} ms (PgOptions::reply_timeout; a partition, or an overloaded server); nothing was committed; retry",
                self.options.reply_timeout.as_millis()
            ),
            source: None,
        }
    }

    /// `Unavailable`, outcome unknown: `COMMIT` was sent, no reply came.
    fn commit_unanswered(&self, what: &str) -> Error {
        Error::outcome_unknown(
            format!(
                "PostgreSQL: {what}: commit: COMMIT was sent but no reply came within {} ms (PgOptions::reply_timeout); the change may or may not be stored: read it back before repeating it",
                self.options.reply_timeout.as_millis()
            ),
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )
    }

    /// Prepares `stmts` on `c` (one round trip only for those the
    /// connection has not prepared yet).
    async fn prepare(
        &self,
        c: &deadpool_postgres::Object,
        what: &str,
        stmts: &[Stmt],
    ) -> Result<Vec<tokio_postgres::Statement>> {
        match tokio::time::timeout(self.options.reply_timeout, pipeline::prepare(c, stmts)).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err((i, e))) => Err(map_pg(&format!("{what}: {}: prepare", stmts[i].what), e)),
            Err(_) => Err(self.no_reply(&format!("{what}: prepare"))),
        }
    }

    /// The rows of every statement, or the first statement's error (the
    /// ones after it only fail because the transaction was aborted).
    fn replies(
        what: &str,
        stmts: &[Stmt],
        replies: impl Iterator<Item = pipeline::Reply>,
    ) -> Result<Vec<Vec<Row>>> {
        stmts
            .iter()
            .zip(replies)
            .map(|(s, r)| r.map_err(|e| map_pg(&format!("{what}: {}", s.what), e)))
            .collect()
    }

    /// Begins a transaction with `stmts`: `BEGIN` and the statements in one
    /// round trip. Answers the open transaction and every statement's rows.
    async fn begin(&self, what: &'static str, stmts: Vec<Stmt>) -> Result<(Tx, Vec<Vec<Row>>)> {
        let conn = self.conn(what).await?;
        // Outside the transaction: a failed prepare leaves nothing open.
        let prepared = self.prepare(&conn, what, &stmts).await?;
        let tx = Tx::new(conn, self.options.reply_timeout);
        let sent = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(tx.conn(), true, &stmts, &prepared, false, None),
        )
        .await
        .map_err(|_| self.no_reply(&format!("{what}: begin")))?;
        let mut replies = sent.into_iter();
        if let Some(Err(e)) = replies.next() {
            return Err(map_pg(&format!("{what}: begin"), e));
        }
        let rows = Self::replies(what, &stmts, replies)?;
        Ok((tx, rows))
    }

    /// More statements in the open transaction, in one round trip.
    async fn run(&self, tx: &Tx, what: &str, stmts: Vec<Stmt>) -> Result<Vec<Vec<Row>>> {
        let prepared = self.prepare(tx.conn(), what, &stmts).await?;
        let sent = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(tx.conn(), false, &stmts, &prepared, false, None),
        )
        .await
        .map_err(|_| self.no_reply(what))?;
        Self::replies(what, &stmts, sent.into_iter())
    }

    /// The writes and `COMMIT` in one round trip. A write the server
    /// refuses rolls everything back (its error is answered); a fault while
    /// `COMMIT` is in flight (any connection fault of this round trip: the
    /// writes and `COMMIT` left together) leaves the outcome unknown.
    async fn commit(&self, tx: Tx, what: &str, stmts: Vec<Stmt>) -> Result<()> {
        self.commit_then(tx, what, stmts, None).await
    }

    /// [`Self::commit`], with the change of `scope` notified right after
    /// the `COMMIT` (module `wake`): sent with it, not waited for.
    async fn commit_notify(
        &self,
        tx: Tx,
        what: &str,
        stmts: Vec<Stmt>,
        scope: &RunScope,
        events: bool,
    ) -> Result<()> {
        let notify = Stmt::new(
            "notify",
            wake::NOTIFY_SQL,
            vec![
                Box::new(self.channel.clone()),
                Box::new(wake::payload(scope, events)),
            ],
        );
        self.commit_then(tx, what, stmts, Some(notify)).await
    }

    async fn commit_then(
        &self,
        tx: Tx,
        what: &str,
        mut stmts: Vec<Stmt>,
        then: Option<Stmt>,
    ) -> Result<()> {
        let n = stmts.len();
        stmts.extend(then);
        let mut prepared = self.prepare(tx.conn(), what, &stmts).await?;
        let then = (stmts.len() > n).then(|| (stmts.remove(n), prepared.remove(n)));
        let Ok(sent) = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(
                tx.conn(),
                false,
                &stmts,
                &prepared,
                true,
                then.as_ref().map(|(s, p)| (s, p)),
            ),
        )
        .await
        else {
            // The session's state is unknown: close it.
            tx.end(false);
            return Err(self.commit_unanswered(what));
        };
        tx.end(true);
        let mut replies = sent.into_iter();
        for (s, r) in stmts.iter().zip(replies.by_ref()) {
            if let Err(e) = r {
                let what = format!("{what}: {}", s.what);
                return Err(if e.code().is_some() {
                    // The server refused it: COMMIT answered ROLLBACK.
                    map_pg(&what, e)
                } else {
                    map_commit(&format!("{what} (with COMMIT)"), e)
                });
            }
        }
        match replies.next() {
            Some(Err(e)) => Err(map_commit(&format!("{what}: commit"), e)),
            _ => Ok(()),
        }
    }

    /// Begins a transaction on `scope`'s row: locks it (creating it first
    /// when asked) and reads what `o` asks for, in one round trip.
    async fn open(
        &self,
        what: &'static str,
        scope: &RunScope,
        key: &Key,
        o: Opening<'_>,
    ) -> Result<(Tx, Opened)> {
        let mut stmts = Vec::with_capacity(3 + o.more.len());
        if o.create {
            stmts.push(Stmt::new(
                "create the run row",
                sql_ensure(),
                key.owned(vec![]),
            ));
        }
        stmts.push(Stmt::new("lock the run row", sql_lock(), key.owned(vec![])));
        let test_clock = self.options.clock.as_ref().map(|c| c.now());
        let after = o.clock || o.checkpoint.is_some();
        if after {
            let fixed: Option<i64> = match (o.clock, test_clock) {
                (true, Some(t)) => Some(t.as_millis()),
                (true, None) => None,
                (false, _) => Some(0),
            };
            let id: Option<String> = o.checkpoint.map(str::to_string);
            stmts.push(Stmt::new(
                "read the clock",
                sql_after_lock(),
                key.owned(vec![Box::new(fixed), Box::new(id)]),
            ));
        }
        let n_more = o.more.len();
        stmts.extend(o.more);
        let (tx, rows) = self.begin(what, stmts).await?;
        let mut rows = rows.into_iter();
        if o.create {
            rows.next();
        }
        let state = match rows.next().and_then(|r| r.into_iter().next()) {
            Some(r) => Some(state_of(scope, &r)?),
            None => None,
        };
        let mut opened = Opened {
            state,
            now: None,
            checkpoint_exists: false,
            more: Vec::with_capacity(n_more),
        };
        if after {
            let r = rows
                .next()
                .and_then(|r| r.into_iter().next())
                .ok_or_else(|| Error::corrupted("the clock query answered no row"))?;
            if o.clock {
                let ms: i64 = r.get(0);
                let now = Timestamp::from_millis(ms).map_err(|e| {
                    Error::corrupted(format!("the server clock is out of range: {e}"))
                })?;
                if test_clock.is_none() {
                    self.note_server_now(now);
                }
                opened.now = Some(now);
            }
            opened.checkpoint_exists = r.get(1);
        }
        opened.more.extend(rows);
        Ok((tx, opened))
    }

    async fn rows<C: GenericClient + Sync>(
        &self,
        c: &C,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let bound = self.options.reply_timeout;
        let st = tokio::time::timeout(bound, c.prepare_cached(sql))
            .await
            .map_err(|_| self.no_reply(&format!("{what}: prepare")))?
            .map_err(|e| map_pg(&format!("{what}: prepare"), e))?;
        tokio::time::timeout(bound, c.query(&st, params))
            .await
            .map_err(|_| self.no_reply(what))?
            .map_err(|e| map_pg(what, e))
    }

    async fn row_opt<C: GenericClient + Sync>(
        &self,
        c: &C,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>> {
        Ok(self.rows(c, what, sql, params).await?.into_iter().next())
    }
}

impl PgStore {
    /// Connects to `url` (a `postgres://` URL or a key=value string),
    /// applies the embedded migrations to `options.schema` (under an
    /// advisory lock: concurrent `connect`s are safe) and checks the
    /// server answers.
    ///
    /// # Errors
    /// `Unsupported` when the schema is at a newer version than this binary
    /// ([`SCHEMA_VERSION`]); `Unavailable` when the server cannot be
    /// reached; `InvalidInput` for a bad URL, schema name or option.
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self> {
        Self::migrate(url, &options).await?;
        let store = Self::open_migrated(url, options)?;
        store.measure_offset().await?;
        store.ensure_listener();
        Ok(store)
    }

    /// Applies the embedded migrations to `options.schema` on a connection
    /// of its own and answers the version now applied (`runkeep migrate`).
    pub async fn migrate(url: &str, options: &PgOptions) -> Result<i32> {
        let config = Self::pg_config(url, options)?;
        let (mut client, conn) = config
            .connect(NoTls)
            .await
            .map_err(|e| map_pg("connect (to migrate)", e))?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "runkeep-postgres: migration connection ended");
            }
        });
        let r = schema::migrate(&mut client, &options.schema).await;
        drop(client);
        let _ = driver.await;
        r
    }

    /// The runkeep schema version recorded in `options.schema` (0 when the
    /// schema has never been migrated), read on a connection of its own
    /// without changing anything: what `runkeep` checks before a read-only
    /// command and what the doctor reports.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached; `InvalidInput` for a
    /// bad URL or schema name.
    pub async fn schema_version(url: &str, options: &PgOptions) -> Result<i32> {
        let config = Self::pg_config(url, options)?;
        let (client, conn) = config
            .connect(NoTls)
            .await
            .map_err(|e| map_pg("connect (to read the schema version)", e))?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "runkeep-postgres: version connection ended");
            }
        });
        let r = schema::current_version(&client, &options.schema).await;
        drop(client);
        let _ = driver.await;
        r
    }

    /// Builds a store on a schema that [`PgStore::migrate`] (or
    /// [`PgStore::connect`]) already brought to [`SCHEMA_VERSION`], without
    /// connecting yet: connections open on first use, on the runtime that
    /// uses them. For callers that must build a store inside a running
    /// runtime without awaiting (test fixtures); everyone else calls
    /// `connect`. Every pooled connection checks the schema version when
    /// it opens and refuses a newer one.
    pub fn open_migrated(url: &str, options: PgOptions) -> Result<Self> {
        schema::validate_schema_name(&options.schema)?;
        if options.pool_size == 0 {
            return Err(Error::invalid("PgOptions::pool_size must be at least 1"));
        }
        let config = Self::pg_config(url, &options)?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let schema_name = options.schema.clone();
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let schema_name = schema_name.clone();
                Box::pin(async move {
                    let found = schema::current_version(client, &schema_name)
                        .await
                        .map_err(|e| deadpool_postgres::HookError::message(e.to_string()))?;
                    schema::refuse_newer(&schema_name, found)
                        .map_err(|e| deadpool_postgres::HookError::message(e.to_string()))?;
                    if found < SCHEMA_VERSION {
                        return Err(deadpool_postgres::HookError::message(format!(
                            "PostgreSQL schema {schema_name:?} is at runkeep schema version {found}, older than {SCHEMA_VERSION}; run `runkeep migrate` (or PgStore::connect) first"
                        )));
                    }
                    Ok(())
                })
            }))
            .build()
            .map_err(|e| Error::invalid(format!("PostgreSQL pool: {e}")))?;
        Ok(Self {
            pool,
            config,
            channel: format!("runkeep_{}", options.schema),
            options,
            offset_ms: AtomicI64::new(0),
            notifier: Arc::new(Notifier::default()),
            listener: Mutex::new(None),
        })
    }

    fn pg_config(url: &str, options: &PgOptions) -> Result<tokio_postgres::Config> {
        schema::validate_schema_name(&options.schema)?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            Error::invalid(format!(
                "PostgreSQL connection string does not parse ({e}); pass postgres://user@host:port/database"
            ))
        })?;
        let ms = |d: Duration| d.as_millis().max(1);
        let extra = format!(
            "-c search_path={} -c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
            options.schema,
            ms(options.statement_timeout),
            ms(options.lock_timeout),
            ms(options.idle_in_transaction_timeout)
        );
        let opts = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {extra}"),
            _ => extra,
        };
        config
            .options(&opts)
            .connect_timeout(options.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("runkeep");
        }
        Ok(config)
    }

    /// The query plan (`EXPLAIN`) of the first page `list_runs` would read
    /// for `scope` and `options`: what an operator (or a test) checks for
    /// index use.
    pub async fn explain_list_runs(
        &self,
        scope: &ListingScope,
        options: &ListOptions,
    ) -> Result<String> {
        let c = self.conn("explain list_runs").await?;
        let fixed = self.fixed_now(options.now);
        let query = ListQuery::new(scope, &options.judged_at(|| fixed.unwrap_or(self.now())))?;
        let mut listing = Listing::of(scope, &query);
        listing.now = fixed.map(Timestamp::as_millis);
        let after = After::of_cursor(query.after.as_ref());
        let fetch = i64::try_from(query.limit + 1).unwrap_or(i64::MAX);
        let (sql, params) = listing.sql_and_params(&after, fetch, false);
        self.explain(&c, &sql, &params).await
    }

    /// The query plan of `claim_next`'s candidate search for `scope` and
    /// `filter` (its first, row-locking step).
    pub async fn explain_claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
    ) -> Result<String> {
        let c = self.conn("explain claim_next").await?;
        let listing = Listing {
            scope,
            order: filter.order,
            statuses: None,
            claimed: Some(false),
            parks: filter.park.is_some(),
            runnable: true,
            now: self.fixed_now(None).map(Timestamp::as_millis),
        };
        let (sql, params) = listing.sql_and_params(&After::None, 1, true);
        self.explain(&c, &sql, &params).await
    }

    /// The instant a statement judges at when it is not the server's
    /// clock: the caller's, else the test clock's.
    fn fixed_now(&self, given: Option<Timestamp>) -> Option<Timestamp> {
        given.or_else(|| self.options.clock.as_ref().map(|c| c.now()))
    }

    /// The instant a listing statement judged at (its last column); the
    /// offset to the server is kept when it was the server's clock.
    fn listed_now(&self, r: &Row, fixed: Option<Timestamp>) -> Result<Timestamp> {
        let ms: i64 = r.get(r.len() - 1);
        let now = Timestamp::from_millis(ms)
            .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
        if fixed.is_none() {
            self.note_server_now(now);
        }
        Ok(now)
    }

    /// The options this store was built with.
    pub fn options(&self) -> &PgOptions {
        &self.options
    }

    /// The pool (for operators' checks and tests: e.g. the doctor).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn conn(&self, what: &str) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::PostCreateHook(h) => Error::Unsupported {
                message: format!("{what}: {h}"),
            },
            other => map_pool(what, other),
        })
    }

    async fn measure_offset(&self) -> Result<()> {
        let c = self.conn("read the server clock").await?;
        self.server_now(&c).await?;
        Ok(())
    }

    async fn server_now<C: GenericClient + Sync>(&self, c: &C) -> Result<Timestamp> {
        let row = self
            .rows(c, "read the server clock", NOW_SQL, &[])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::corrupted("the server clock query answered no row"))?;
        let ms: i64 = row.get(0);
        let now = Timestamp::from_millis(ms)
            .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
        self.note_server_now(now);
        Ok(now)
    }

    /// Keeps the offset [`CheckpointStore::now`] adds to the local clock.
    fn note_server_now(&self, now: Timestamp) {
        let local = self.options.local_clock.now();
        self.offset_ms
            .store(now.as_millis() - local.as_millis(), Ordering::Relaxed);
    }

    fn check_payload(&self, what: &str, bytes: usize) -> Result<()> {
        if bytes > self.options.max_payload_bytes {
            return Err(Error::invalid(format!(
                "{what} is {bytes} bytes of JSON; this PostgreSQL store's limit is {} bytes (PgOptions::max_payload_bytes); store large bodies elsewhere and reference them",
                self.options.max_payload_bytes
            )));
        }
        Ok(())
    }

    fn check_json(&self, what: &str, v: &Value) -> Result<()> {
        let bytes = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
        self.check_payload(what, bytes)
    }

    async fn read_state<C: GenericClient + Sync>(
        &self,
        c: &C,
        scope: &RunScope,
        key: &Key,
    ) -> Result<Option<RunState>> {
        match self
            .row_opt(c, "read the run row", &sql_state(), &key.params())
            .await?
        {
            Some(r) => Ok(Some(state_of(scope, &r)?)),
            None => Ok(None),
        }
    }

    /// The `UPDATE` that writes `run` back to its row.
    fn save_stmt(key: &Key, run: &RunState) -> Result<Stmt> {
        let (kind, fence, holder, expires): (
            Option<i16>,
            Option<i64>,
            Option<String>,
            Option<i64>,
        ) = match &run.top {
            None => (None, None, None, None),
            Some(TopHolding::Lease {
                fence,
                holder,
                expires_at,
            }) => (
                Some(1),
                Some(i64_of(fence.get())),
                Some(holder.as_str().to_string()),
                Some(expires_at.as_millis()),
            ),
            Some(TopHolding::Released { fence } | TopHolding::Unreadable { fence }) => {
                (Some(2), Some(i64_of(fence.get())), None, None)
            }
        };
        let lifecycle = if run.lifecycle == Lifecycle::default() {
            None
        } else {
            Some(
                serde_json::to_value(&run.lifecycle)
                    .map_err(|e| Error::backend("encode the lifecycle", e))?,
            )
        };
        let status = run.lifecycle.status.as_str().to_string();
        let available: Option<i64> = run.lifecycle.available_at.map(Timestamp::as_millis);
        let digest = match &run.digest {
            Some(d) if d.checkpoint_count > 0 => {
                Some(serde_json::to_value(d).map_err(|e| Error::backend("encode the digest", e))?)
            }
            _ => None,
        };
        let d = run.digest.as_ref().filter(|d| d.checkpoint_count > 0);
        let count = i64_of(d.map_or(0, |d| d.checkpoint_count));
        let rank: i16 = i16::from(d.and_then(|d| d.run_created_at).is_some());
        let stamp: i64 = d
            .and_then(|d| d.run_created_at)
            .map_or(0, Timestamp::as_millis);
        let parks: i32 = d.map_or(0, |d| i32::try_from(d.parks.len()).unwrap_or(i32::MAX));
        Ok(Stmt::new(
            "save the run row",
            sql_save(),
            key.owned(vec![
                Box::new(kind),
                Box::new(fence),
                Box::new(holder),
                Box::new(expires),
                Box::new(lifecycle),
                Box::new(status),
                Box::new(available),
                Box::new(digest),
                Box::new(count),
                Box::new(rank),
                Box::new(stamp),
                Box::new(parks),
                Box::new(i64_of(run.last_seq)),
                Box::new(i64_of(run.last_audit)),
            ]),
        ))
    }

    /// The upsert of `stored` (already stamped), keeping `run`'s digest.
    /// `exists`: a checkpoint with its id exists (read under the lock).
    /// The digest is updated by the core's incremental rule, or rebuilt
    /// from the headers it holds when it holds every checkpoint's (a run
    /// with one unstamped checkpoint, as enqueued, taking its first fenced
    /// one); only otherwise are the run's headers read (one more round
    /// trip).
    async fn checkpoint_stmt(
        &self,
        tx: &Tx,
        what: &str,
        scope: &RunScope,
        run: &mut RunState,
        stored: &Checkpoint,
        exists: bool,
    ) -> Result<Stmt> {
        let key = Key::of(scope);
        let header = stored.header();
        let header_json =
            serde_json::to_value(&header).map_err(|e| Error::backend("encode a header", e))?;
        let body = Value::Object(stored.to_json());
        self.check_json(&format!("checkpoint {}", stored.id), &body)?;
        let digest = match next_digest(run.digest.take(), &header, exists) {
            Some(d) => d,
            None => {
                let mut headers = self.read_headers(tx, what, scope, &key).await?;
                headers.retain(|h| h.id != header.id);
                headers.push(header);
                RunDigest::from_headers(&headers)
            }
        };
        run.digest = Some(digest);
        Ok(Stmt::new(
            "write the checkpoint",
            format!(
                "INSERT INTO checkpoints ({KEY_COLS}, checkpoint_id, header, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT ({KEY_COLS}, checkpoint_id) DO UPDATE SET header = EXCLUDED.header, body = EXCLUDED.body"
            ),
            key.owned(vec![
                Box::new(stored.id.to_string()),
                Box::new(header_json),
                Box::new(body),
            ]),
        ))
    }

    /// Every checkpoint header of the run, in the open transaction.
    async fn read_headers(
        &self,
        tx: &Tx,
        what: &str,
        scope: &RunScope,
        key: &Key,
    ) -> Result<Vec<CheckpointHeader>> {
        let rows = self
            .run(
                tx,
                what,
                vec![Stmt::new(
                    "read the checkpoint headers",
                    sql_headers(),
                    key.owned(vec![]),
                )],
            )
            .await?;
        headers_of(scope, rows.into_iter().flatten())
    }

    async fn read_checkpoint_in<C: GenericClient + Sync>(
        &self,
        c: &C,
        scope: &RunScope,
        key: &Key,
        id: &str,
    ) -> Result<Option<Checkpoint>> {
        let id = id.to_string();
        match self
            .row_opt(
                c,
                "read a checkpoint",
                &format!("SELECT body FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
                &key.with(&[&id]),
            )
            .await?
        {
            Some(r) => Ok(Some(checkpoint_of(scope, r.get(0))?)),
            None => Ok(None),
        }
    }

    /// The events as stored under the already-checked fence, advancing
    /// `last_seq`, and the `INSERT` that stores them (none for none).
    fn events_stmt(
        &self,
        key: &Key,
        run: &mut RunState,
        events: &[NewEvent],
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<(Vec<PersistedEvent>, Option<Stmt>)> {
        if events.is_empty() {
            return Ok((Vec::new(), None));
        }
        let mut out = Vec::with_capacity(events.len());
        let mut seqs = Vec::with_capacity(events.len());
        let mut bodies = Vec::with_capacity(events.len());
        for e in events {
            let p = e.persist(run.last_seq + 1, now, fence);
            run.last_seq += 1;
            let body = Value::Object(p.to_json());
            self.check_json(&format!("event of type {}", p.event_type), &body)?;
            seqs.push(i64_of(p.seq));
            bodies.push(body);
            out.push(p);
        }
        let stmt = Stmt::new(
            "append events",
            format!(
                "INSERT INTO events ({KEY_COLS}, seq, body) SELECT $1, $2, $3, $4, $5, s, b FROM unnest($6::bigint[], $7::jsonb[]) AS t(s, b)"
            ),
            key.owned(vec![Box::new(seqs), Box::new(bodies)]),
        );
        Ok((out, Some(stmt)))
    }

    /// Sets one document column (`record` or `report`).
    fn document_stmt(key: &Key, column: &str, value: Param) -> Stmt {
        Stmt::new(
            "write a document",
            format!("UPDATE runs SET {column} = $6 WHERE {KEY_WHERE}"),
            key.owned(vec![value]),
        )
    }

    fn messages_stmt(&self, key: &Key, messages: &[Value], through: u64) -> Result<Stmt> {
        let v = Value::Array(messages.to_vec());
        self.check_json("message snapshot", &v)?;
        Ok(Stmt::new(
            "write the message snapshot",
            format!("UPDATE runs SET messages = $6, messages_through = $7 WHERE {KEY_WHERE}"),
            key.owned(vec![Box::new(v), Box::new(i64_of(through))]),
        ))
    }

    fn apply_claim(
        scope: &RunScope,
        run: &mut RunState,
        options: &ClaimOptions,
        now: Timestamp,
    ) -> Result<ClaimOutcome> {
        lifecycle::apply_claim(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            options,
            now,
        )
    }

    /// Starts the listener connection once, on the current runtime (none:
    /// watches poll).
    fn ensure_listener(&self) -> bool {
        let mut guard = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = guard.as_ref() {
            if !h.is_finished() {
                return true;
            }
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        *guard = Some(handle.spawn(wake::listen_loop(
            self.config.clone(),
            self.channel.clone(),
            self.notifier.clone(),
        )));
        true
    }
}

/// The digest after writing `h` (`replaced`: a checkpoint with its id
/// existed): the core's incremental rule ([`RunDigest::apply_write`]);
/// where it gives up, [`RunDigest::from_headers`] over the headers the
/// digest holds, when it holds every checkpoint's (the latest and the
/// parked ones are all of them: the count says so); else `None`, and the
/// caller reads the headers.
fn next_digest(
    digest: Option<RunDigest>,
    h: &CheckpointHeader,
    replaced: bool,
) -> Option<RunDigest> {
    let mut d = digest.unwrap_or_default();
    if d.checkpoint_count == 0 && replaced {
        // A digest that lost its checkpoints: start over.
        d = RunDigest::default();
    }
    if d.apply_write(h.clone(), replaced) {
        return Some(d);
    }
    let mut known: Vec<CheckpointHeader> = Vec::new();
    for k in d.latest.iter().chain(d.parks.iter()) {
        if !known.iter().any(|x| x.id == k.id) {
            known.push(k.clone());
        }
    }
    if u64::try_from(known.len()).ok() != Some(d.checkpoint_count) {
        return None;
    }
    known.retain(|k| k.id != h.id);
    known.push(h.clone());
    Some(RunDigest::from_headers(&known))
}

fn headers_of(
    scope: &RunScope,
    rows: impl IntoIterator<Item = Row>,
) -> Result<Vec<CheckpointHeader>> {
    rows.into_iter()
        .map(|r| {
            serde_json::from_value(r.get(0)).map_err(|e| corrupted(scope, "a checkpoint header", e))
        })
        .collect()
}

/// The listing's SQL: scope prefix, the filters SQL can judge exactly
/// (status, claimed, "has a park" as a prefilter), keyset continuation and
/// the order (the core's `RowKey`, then project and session).
struct Listing<'a> {
    scope: &'a ListingScope,
    order: ListOrder,
    statuses: Option<Vec<String>>,
    claimed: Option<bool>,
    parks: bool,
    runnable: bool,
    /// The instant the filters use; `None`: the server's clock, read once
    /// by the statement (and answered in its last column).
    now: Option<i64>,
}

impl<'a> Listing<'a> {
    /// The listing a validated query asks for (not restricted to runnable
    /// runs): what `list_runs` and its `EXPLAIN` share.
    fn of(scope: &'a ListingScope, query: &ListQuery) -> Self {
        Listing {
            scope,
            order: query.order,
            statuses: query
                .status
                .as_ref()
                .map(|v| v.iter().map(|s| s.as_str().to_string()).collect()),
            claimed: query.claimed,
            parks: query.park.is_some(),
            runnable: false,
            now: Some(query.now.as_millis()),
        }
    }
}

enum After {
    None,
    /// The user's cursor: strictly after this `RowKey`.
    Cursor(RowKey),
    /// Our own continuation: strictly after this row (key, project, session).
    Row(RowKey, String, String),
}

impl After {
    /// Where a user's cursor continues: strictly after its key, and after
    /// its project and session too when it carries them (the core's
    /// tie-break between runs of one id in different sessions).
    fn of_cursor(key: Option<&RowKey>) -> Self {
        match key {
            None => After::None,
            Some(k) if k.has_tie() => After::Row(k.clone(), k.project.clone(), k.session.clone()),
            Some(k) => After::Cursor(k.clone()),
        }
    }
}

impl Listing<'_> {
    const COLS: &'static str = "project_id, session_id, run_id, parent_id, top_kind, top_fence, holder, expires_at, lifecycle, digest";
    /// The rest of the row's state, read with a candidate `claim_next`
    /// locks (what a claim writes back).
    const STATE_COLS: &'static str =
        "last_seq, last_audit_seq, record IS NOT NULL, messages IS NOT NULL, report IS NOT NULL";

    /// The statement: `COLS` (then `STATE_COLS` when it locks), then the
    /// instant it judged at, in epoch ms (the last column: `now`, or the
    /// server's clock read once at its start).
    fn sql_and_params(
        &self,
        after: &After,
        limit: i64,
        lock: bool,
    ) -> (String, Vec<Box<dyn ToSql + Sync + Send>>) {
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
        let push = |p: Box<dyn ToSql + Sync + Send>,
                    params: &mut Vec<Box<dyn ToSql + Sync + Send>>| {
            params.push(p);
            format!("${}", params.len())
        };
        let clock = format!(
            "WITH clock AS (SELECT coalesce({}::bigint, {CLOCK}) AS now_ms) ",
            push(Box::new(self.now), &mut params)
        );
        let mut wh = vec![format!(
            "tenant_id = {}",
            push(Box::new(self.scope.tenant_id().to_string()), &mut params)
        )];
        if let Some(p) = self.scope.project_id() {
            wh.push(format!(
                "project_id = {}",
                push(Box::new(p.to_string()), &mut params)
            ));
        }
        if let Some(s) = self.scope.session_id() {
            wh.push(format!(
                "session_id = {}",
                push(Box::new(s.to_string()), &mut params)
            ));
        }
        wh.push("checkpoint_count > 0".into());
        let now = "(SELECT now_ms FROM clock)";
        if self.runnable {
            wh.push("status = 'active'".into());
            wh.push(format!("(available_at IS NULL OR available_at <= {now})"));
        }
        if let Some(st) = &self.statuses {
            wh.push(format!(
                "status = ANY({}::text[])",
                push(Box::new(st.clone()), &mut params)
            ));
        }
        // Held live ⇔ a lease whose expiry is after the instant (the core's
        // `is_expired`: the boundary counts as expired).
        match self.claimed {
            Some(true) => wh.push(format!("(top_kind = 1 AND expires_at > {now})")),
            Some(false) => wh.push(format!(
                "(top_kind IS DISTINCT FROM 1 OR expires_at <= {now})"
            )),
            None => {}
        }
        if self.parks {
            wh.push("park_count > 0".into());
        }
        let (key_cols, order_by) = match self.order {
            ListOrder::RunId => (
                "run_id, parent_id",
                "run_id, parent_id, project_id, session_id",
            ),
            ListOrder::CreatedAt => (
                "created_rank, created_stamp, run_id, parent_id",
                "created_rank, created_stamp, run_id, parent_id, project_id, session_id",
            ),
        };
        let key_vals =
            |k: &RowKey, params: &mut Vec<Box<dyn ToSql + Sync + Send>>| -> Vec<String> {
                let mut v = Vec::new();
                if self.order == ListOrder::CreatedAt {
                    v.push(format!(
                        "{}::smallint",
                        push(Box::new(i16::from(k.rank)), params)
                    ));
                    v.push(format!("{}::bigint", push(Box::new(k.stamp), params)));
                }
                v.push(format!(
                    "{}::text",
                    push(Box::new(k.run_id.clone()), params)
                ));
                v.push(format!(
                    "{}::text",
                    push(Box::new(k.parent.clone()), params)
                ));
                v
            };
        match after {
            After::None => {}
            After::Cursor(k) => {
                let vals = key_vals(k, &mut params);
                wh.push(format!("({key_cols}) > ({})", vals.join(", ")));
            }
            After::Row(k, p, s) => {
                let mut vals = key_vals(k, &mut params);
                vals.push(format!("{}::text", push(Box::new(p.clone()), &mut params)));
                vals.push(format!("{}::text", push(Box::new(s.clone()), &mut params)));
                wh.push(format!("({order_by}) > ({})", vals.join(", ")));
            }
        }
        let limit = format!("{}::bigint", push(Box::new(limit), &mut params));
        let sql = format!(
            "{clock}SELECT {}{}, {now} FROM runs WHERE {} ORDER BY {order_by} LIMIT {limit}{}",
            Self::COLS,
            if lock {
                format!(", {}", Self::STATE_COLS)
            } else {
                String::new()
            },
            wh.join(" AND "),
            if lock {
                " FOR UPDATE OF runs SKIP LOCKED"
            } else {
                ""
            }
        );
        (sql, params)
    }
}

/// A listing row from a `Listing::COLS` row, plus its scope and state.
fn listed_row(
    tenant: &runkeep::TenantId,
    r: &Row,
    now: Timestamp,
) -> Result<(RunScope, RunState, RunRow)> {
    let project: String = r.get(0);
    let session: String = r.get(1);
    let run: String = r.get(2);
    let parent: String = r.get(3);
    let mut scope = RunScope::new(
        tenant.clone(),
        project
            .parse()
            .map_err(|e| Error::corrupted(format!("a stored project id: {e}")))?,
        session
            .parse()
            .map_err(|e| Error::corrupted(format!("a stored session id: {e}")))?,
        run.parse()
            .map_err(|e| Error::corrupted(format!("a stored run id: {e}")))?,
    );
    if !parent.is_empty() {
        scope = scope.with_parent(
            parent
                .parse::<RunId>()
                .map_err(|e| Error::corrupted(format!("a stored parent id: {e}")))?,
        );
    }
    let top = top_of(&scope, r, 4);
    let lifecycle = lifecycle_of(&scope, r.get(8));
    let digest = digest_of(&scope, r.get(9));
    let built = (|| -> Result<(RunState, RunRow)> {
        let top = top?;
        let lifecycle = lifecycle?;
        let digest = digest?;
        let row = digest
            .as_ref()
            .and_then(|d| d.row(scope.clone(), top.as_ref(), now))
            .map(|row| row.with_lifecycle(&lifecycle))
            .ok_or_else(|| corrupted(&scope, "the digest", "listed without checkpoints"))?;
        Ok((
            RunState {
                top,
                lifecycle,
                digest,
                ..RunState::default()
            },
            row,
        ))
    })();
    match built {
        Ok((state, row)) => Ok((scope, state, row)),
        Err(e) => {
            let claim: Option<LeaseSummary> =
                top_of(&scope, r, 4).ok().flatten().map(|t| t.summary(now));
            let row = RunRow::damaged(scope.clone(), &e, claim);
            Ok((scope, RunState::default(), row))
        }
    }
}

/// The rest of a locked candidate's state (`Listing::STATE_COLS`, after
/// `Listing::COLS`).
fn fill_state(state: &mut RunState, r: &Row) {
    let last_seq: i64 = r.get(10);
    let last_audit: i64 = r.get(11);
    state.last_seq = u64::try_from(last_seq).unwrap_or(0);
    state.last_audit = u64::try_from(last_audit).unwrap_or(0);
    state.has_record = r.get(12);
    state.has_messages = r.get(13);
    state.has_report = r.get(14);
}

impl PgStore {
    async fn explain(
        &self,
        c: &deadpool_postgres::Object,
        sql: &str,
        params: &[Box<dyn ToSql + Sync + Send>],
    ) -> Result<String> {
        let rs = self
            .rows(c, "explain", &format!("EXPLAIN {sql}"), &params_ref(params))
            .await?;
        Ok(rs
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n"))
    }
}

fn params_ref(p: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    p.iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

#[async_trait]
impl CheckpointStore for PgStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        let key = Key::of(scope);
        let what = "write_checkpoint";
        let opening = Opening {
            create: fence.is_none(),
            checkpoint: Some(checkpoint.id.as_str()),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let mut run = o.state.unwrap_or_default();
        run.check(scope, what, fence)?;
        let mut stored = checkpoint.clone();
        stored.fence = stamp_fence(fence, run.top.as_ref());
        let write = self
            .checkpoint_stmt(&tx, what, scope, &mut run, &stored, o.checkpoint_exists)
            .await?;
        let save = Self::save_stmt(&key, &run)?;
        self.commit_notify(tx, what, vec![write, save], scope, false)
            .await?;
        Ok(stored)
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        let c = self.conn("read_checkpoint").await?;
        self.read_checkpoint_in(&c, scope, &Key::of(scope), id.as_str())
            .await
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        let key = Key::of(scope);
        let c = self.conn("list_checkpoints").await?;
        let rs = self
            .rows(
                &c,
                "list checkpoints",
                &format!("SELECT body FROM checkpoints WHERE {KEY_WHERE}"),
                &key.params(),
            )
            .await?;
        let mut cps = rs
            .into_iter()
            .map(|r| checkpoint_of(scope, r.get(0)))
            .collect::<Result<Vec<_>>>()?;
        sort_checkpoints(&mut cps);
        Ok(cps)
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        let key = Key::of(scope);
        let what = "delete_checkpoint";
        let opening = Opening {
            more: vec![Stmt::new(
                "read the checkpoint headers",
                sql_headers(),
                key.owned(vec![]),
            )],
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let Opened { state, more, .. } = o;
        let Some(mut run) = state else {
            if let Some(f) = fence {
                check_write_fence(&scope.run_id, what, f, None)?;
            }
            return Ok(false);
        };
        run.check(scope, what, fence)?;
        let mut headers = headers_of(scope, more.into_iter().flatten())?;
        let before = headers.len();
        headers.retain(|h| h.id != *id);
        if headers.len() == before {
            // Nothing to delete (the transaction rolls back unwaited).
            return Ok(false);
        }
        run.digest = (!headers.is_empty()).then(|| RunDigest::from_headers(&headers));
        let delete = Stmt::new(
            "delete a checkpoint",
            format!("DELETE FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
            key.owned(vec![Box::new(id.to_string())]),
        );
        self.commit(tx, what, vec![delete, Self::save_stmt(&key, &run)?])
            .await?;
        Ok(true)
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let key = Key::of(scope);
        let what = "resolve_park";
        let not_found = || Error::NotFound {
            what: format!("checkpoint {id} of run {}", scope.run_id),
        };
        let opening = Opening {
            more: vec![Stmt::new(
                "read a checkpoint",
                format!("SELECT body FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
                key.owned(vec![Box::new(id.to_string())]),
            )],
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let Opened { state, more, .. } = o;
        let Some(mut run) = state.filter(|r| !r.is_blank()) else {
            return Err(not_found());
        };
        run.check(scope, what, fence)?;
        let Some(body) = more.into_iter().flatten().next() else {
            return Err(not_found());
        };
        let current = checkpoint_of(scope, body.get(0))?;
        let mut updated = current.clone();
        park::resolve(&mut updated, resolution, now)?;
        updated.fence = stamp_fence(fence, run.top.as_ref()).or(current.fence);
        let write = self
            .checkpoint_stmt(&tx, what, scope, &mut run, &updated, true)
            .await?;
        let save = Self::save_stmt(&key, &run)?;
        self.commit_notify(tx, what, vec![write, save], scope, false)
            .await?;
        Ok(updated)
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let key = Key::of(scope);
        let what = "prune_checkpoints";
        let opening = Opening {
            more: vec![Stmt::new(
                "read checkpoints to prune",
                format!("SELECT header, body FROM checkpoints WHERE {KEY_WHERE}"),
                key.owned(vec![]),
            )],
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let Opened { state, more, .. } = o;
        let Some(mut run) = state.filter(|r| !r.is_blank()) else {
            return Ok(Vec::new());
        };
        run.check(scope, what, fence)?;
        let rows: Vec<Row> = more.into_iter().flatten().collect();
        let cps = rows
            .iter()
            .map(|r| checkpoint_of(scope, r.get(1)))
            .collect::<Result<Vec<_>>>()?;
        let victims = park::prune_victims(&cps, keep_last);
        if victims.is_empty() {
            return Ok(victims);
        }
        // The digest of what stays, from the headers read under the lock.
        let headers = headers_of(scope, rows)?;
        let rest: Vec<CheckpointHeader> = headers
            .into_iter()
            .filter(|h| !victims.contains(&h.id))
            .collect();
        run.digest = (!rest.is_empty()).then(|| RunDigest::from_headers(&rest));
        let ids: Vec<String> = victims.iter().map(ToString::to_string).collect();
        let delete = Stmt::new(
            "delete pruned checkpoints",
            format!(
                "DELETE FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = ANY($6::text[])"
            ),
            key.owned(vec![Box::new(ids)]),
        );
        self.commit(tx, what, vec![delete, Self::save_stmt(&key, &run)?])
            .await?;
        Ok(victims)
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        let c = self.conn("list_runs").await?;
        // The instant: the caller's (or the test clock's), else the
        // server's, read by the listing statement itself (one round trip).
        let fixed = self.fixed_now(options.now);
        let mut query = ListQuery::new(scope, &options.judged_at(|| fixed.unwrap_or(self.now())))?;
        let mut listing = Listing::of(scope, &query);
        listing.now = fixed.map(Timestamp::as_millis);
        let mut judged = fixed;
        let fetch = i64::try_from(query.limit + 1).unwrap_or(i64::MAX);
        let mut after = After::of_cursor(query.after.as_ref());
        let mut out: Vec<(RowKey, RunRow)> = Vec::new();
        loop {
            let (sql, params) = listing.sql_and_params(&after, fetch, false);
            let rs = self
                .rows(&c, "list runs", &sql, &params_ref(&params))
                .await?;
            let n = rs.len();
            for r in &rs {
                if judged.is_none() {
                    let now = self.listed_now(r, fixed)?;
                    query = ListQuery::new(scope, &options.judged_at(|| now))?;
                    listing.now = Some(now.as_millis());
                    judged = Some(now);
                }
                let (s, _, row) = listed_row(scope.tenant_id(), r, query.now)?;
                let k = row.key(query.order);
                after = After::Row(
                    k.clone(),
                    s.project_id.to_string(),
                    s.session_id.to_string(),
                );
                if query.is_after_cursor(&k) && query.matches(&row) {
                    out.push((k, row));
                }
                if out.len() > query.limit {
                    break;
                }
            }
            if out.len() > query.limit || i64::try_from(n).unwrap_or(0) < fetch {
                break;
            }
        }
        Ok(query.page_from_sorted(out))
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        let key = Key::of(scope);
        let what = "claim";
        let opening = Opening {
            create: true,
            clock: options.now.is_none(),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let now = options.now.unwrap_or(o.now());
        let mut run = o.state.unwrap_or_default();
        let before = (run.top.clone(), run.lifecycle.clone());
        let outcome = Self::apply_claim(scope, &mut run, options, now)?;
        if (run.top.clone(), run.lifecycle.clone()) != before {
            self.commit(tx, what, vec![Self::save_stmt(&key, &run)?])
                .await?;
        }
        // Otherwise nothing changed: the transaction rolls back unwaited.
        Ok(outcome)
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        let key = Key::of(scope);
        let what = "release";
        let (tx, o) = self.open(what, scope, &key, Opening::default()).await?;
        let Some(mut run) = o.state else {
            return Ok(false);
        };
        match decide_release(&scope.run_id, run.top.as_ref(), fence)? {
            Some(tomb) => {
                run.top = Some(TopHolding::Released { fence: tomb });
                self.commit_notify(tx, what, vec![Self::save_stmt(&key, &run)?], scope, false)
                    .await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        let c = self.conn("lease").await?;
        Ok(self
            .read_state(&c, scope, &Key::of(scope))
            .await?
            .and_then(|r| r.top.map(|t| t.summary(now))))
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        let what = "claim_next";
        // The instant: the caller's (or the test clock's), else the
        // server's, read by the candidate statement itself. The filter is
        // checked before anything is sent (the instant does not change
        // what is valid).
        let fixed = self.fixed_now(options.now);
        let mut query = ListQuery::claim_next(scope, filter, fixed.unwrap_or(self.now()))?;
        let mut listing = Listing {
            scope,
            order: filter.order,
            statuses: None,
            claimed: Some(false),
            parks: query.park.is_some(),
            runnable: true,
            now: fixed.map(Timestamp::as_millis),
        };
        // One candidate at a time, skipping rows other claimers hold
        // locked: a claimer never blocks on another, and never locks more
        // rows than it judges. The candidate carries the whole state the
        // claim writes back, and the instant it was chosen at.
        let candidate = |listing: &Listing<'_>, after: &After| {
            let (sql, params) = listing.sql_and_params(after, 1, true);
            Stmt::new("find a candidate", sql, params)
        };
        let (tx, mut replies) = self
            .begin(what, vec![candidate(&listing, &After::None)])
            .await?;
        let mut judged = fixed;
        let mut changed = false;
        loop {
            let Some(r) = replies.pop().and_then(|rows| rows.into_iter().next()) else {
                break;
            };
            let now = match judged {
                Some(n) => n,
                None => {
                    let n = self.listed_now(&r, fixed)?;
                    query = ListQuery::claim_next(scope, filter, n)?;
                    listing.now = Some(n.as_millis());
                    judged = Some(n);
                    n
                }
            };
            let (run_scope, mut state, row) = listed_row(scope.tenant_id(), &r, now)?;
            let after = After::Row(
                row.key(filter.order),
                run_scope.project_id.to_string(),
                run_scope.session_id.to_string(),
            );
            let mut next = vec![candidate(&listing, &after)];
            if query.matches(&row) && row.is_claimable(now) {
                fill_state(&mut state, &r);
                let key = Key::of(&run_scope);
                match Self::apply_claim(&run_scope, &mut state, options, now)? {
                    ClaimOutcome::Acquired(lease) => {
                        self.commit(tx, what, vec![Self::save_stmt(&key, &state)?])
                            .await?;
                        return Ok(Some((run_scope, lease)));
                    }
                    ClaimOutcome::Finished(_) => {
                        // Dead-lettered by this claim: recorded (with the
                        // next candidate's search), then the next run.
                        next.insert(0, Self::save_stmt(&key, &state)?);
                        changed = true;
                    }
                    _ => {}
                }
            }
            replies = self.run(&tx, what, next).await?;
        }
        if changed {
            self.commit(tx, what, Vec::new()).await?;
        }
        // Otherwise nothing changed: the transaction rolls back unwaited.
        Ok(None)
    }

    fn now(&self) -> Timestamp {
        match &self.options.clock {
            Some(c) => c.now(),
            None => self
                .options
                .local_clock
                .now()
                .offset(self.offset_ms.load(Ordering::Relaxed)),
        }
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        let c = self.conn("lifecycle").await?;
        Ok(self
            .read_state(&c, scope, &Key::of(scope))
            .await?
            .map(|r| r.lifecycle)
            .unwrap_or_default())
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        checkpoint.validate_for_write(scope)?;
        options.validate(&scope.run_id)?;
        let key = Key::of(scope);
        let what = "enqueue";
        let opening = Opening {
            create: true,
            checkpoint: Some(checkpoint.id.as_str()),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let mut run = o.state.unwrap_or_default();
        if run.exists() {
            return Err(Error::Conflict {
                message: format!(
                    "enqueue of run {}: the run already exists; enqueue creates a new run (use another run id, or reopen a finished one)",
                    scope.run_id
                ),
            });
        }
        let mut stored = checkpoint.clone();
        stored.fence = None;
        let write = self
            .checkpoint_stmt(&tx, what, scope, &mut run, &stored, o.checkpoint_exists)
            .await?;
        run.lifecycle = Lifecycle {
            max_attempts: options.max_attempts,
            available_at: options.available_at,
            ..Lifecycle::default()
        };
        let save = Self::save_stmt(&key, &run)?;
        self.commit_notify(tx, what, vec![write, save], scope, false)
            .await?;
        Ok(stored)
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        outcome.validate(&scope.run_id)?;
        if let Some(r) = &outcome.result {
            self.check_json("finish result", r)?;
        }
        let key = Key::of(scope);
        let what = "finish";
        let opening = Opening {
            clock: true,
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let now = o.now();
        let mut run = o.state.unwrap_or_default();
        let l = lifecycle::apply_finish(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            outcome,
            fence,
            now,
        )?;
        self.commit_notify(tx, what, vec![Self::save_stmt(&key, &run)?], scope, false)
            .await?;
        Ok(l)
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        let key = Key::of(scope);
        let what = "snooze";
        let (tx, o) = self.open(what, scope, &key, Opening::default()).await?;
        let Some(mut run) = o.state else {
            return Ok(false);
        };
        if !lifecycle::apply_snooze(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            fence,
            until,
        )? {
            return Ok(false);
        }
        self.commit_notify(tx, what, vec![Self::save_stmt(&key, &run)?], scope, false)
            .await?;
        Ok(true)
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        let key = Key::of(scope);
        let what = "reopen";
        let (tx, o) = self.open(what, scope, &key, Opening::default()).await?;
        let Some(mut run) = o.state.filter(RunState::exists) else {
            return Err(Error::NotFound {
                what: format!("run {}", scope.run_id),
            });
        };
        let l = lifecycle::after_reopen(&scope.run_id, &run.lifecycle)?;
        run.lifecycle = l.clone();
        self.commit_notify(tx, what, vec![Self::save_stmt(&key, &run)?], scope, false)
            .await?;
        Ok(l)
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        // One indexed read: the digest names the latest, the join reads it.
        let key = Key::of(scope);
        let c = self.conn("latest_checkpoint").await?;
        let r = self.row_opt(
            &c,
            "read the latest checkpoint",
            "SELECT c.body FROM runs r JOIN checkpoints c
                   ON (c.tenant_id, c.project_id, c.session_id, c.run_id, c.parent_id)
                    = (r.tenant_id, r.project_id, r.session_id, r.run_id, r.parent_id)
                  AND c.checkpoint_id = r.digest->'latest'->>'id'
                 WHERE r.tenant_id = $1 AND r.project_id = $2 AND r.session_id = $3 AND r.run_id = $4 AND r.parent_id = $5",
            &key.params(),
        )
        .await?;
        r.map(|r| checkpoint_of(scope, r.get(0))).transpose()
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let key = Key::of(scope);
        let c = self.conn("find_pending").await?;
        let Some(run) = self.read_state(&c, scope, &key).await? else {
            return Ok(None);
        };
        let Some(d) = run.digest else { return Ok(None) };
        // The core's rule over the digest's park headers: outstanding at
        // `now`, latest by the total order (park::find_pending's rule).
        let best = d
            .parks
            .iter()
            .filter(|h| {
                h.park
                    .as_ref()
                    .is_some_and(|p| p.state(now) == ParkState::Outstanding)
            })
            .max_by_key(|h| h.order_key(&d.fence_history));
        match best {
            Some(h) => {
                self.read_checkpoint_in(&c, scope, &key, h.id.as_str())
                    .await
            }
            None => Ok(None),
        }
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        if let Some(p) = self.find_pending(scope, now).await? {
            return Ok(Some(p));
        }
        self.latest_checkpoint(scope).await
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        if !self.ensure_listener() {
            return Watch::polling(self.options.watch_fallback);
        }
        self.notifier.subscribe(topic, self.options.watch_fallback)
    }
}

#[async_trait]
impl EvidenceStore for PgStore {
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        for e in events {
            e.validate()?;
        }
        let key = Key::of(scope);
        let what = "append_events";
        let opening = Opening {
            create: fence.is_none(),
            clock: true,
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let now = o.now();
        let mut run = o.state.unwrap_or_default();
        run.check(scope, what, fence)?;
        let (out, insert) = self.events_stmt(&key, &mut run, events, now, fence)?;
        let mut writes: Vec<Stmt> = insert.into_iter().collect();
        writes.push(Self::save_stmt(&key, &run)?);
        self.commit_notify(tx, what, writes, scope, true).await?;
        Ok(out)
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        // One statement, one snapshot: the head and the events agree.
        let key = Key::of(scope);
        let since = i64_of(options.since_seq);
        let limit: Option<i64> = options.limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let c = self.conn("read_events").await?;
        let Some(r) = self.row_opt(
            &c,
            "read events",
            &format!(
                "SELECT last_seq, (SELECT coalesce(jsonb_agg(e.body ORDER BY e.seq), '[]'::jsonb) FROM
                    (SELECT seq, body FROM events WHERE {KEY_WHERE} AND seq > $6 ORDER BY seq LIMIT $7) e)
                 FROM runs WHERE {KEY_WHERE}"
            ),
            &key.with(&[&since, &limit]),
        )
        .await?
        else {
            return Ok(EventBatch::default());
        };
        let last: i64 = r.get(0);
        let arr: Value = r.get(1);
        let mut events = Vec::new();
        if let Value::Array(items) = arr {
            for v in items {
                let seq = v.get("seq").and_then(Value::as_u64).unwrap_or(0);
                let e = PersistedEvent::from_json(object(v), seq)
                    .map_err(|m| corrupted(scope, &format!("event {seq}"), m))?;
                events.push(e);
            }
        }
        Ok(EventBatch {
            events,
            skipped: Vec::new(),
            last_seq: u64::try_from(last).unwrap_or(0),
        })
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        let v =
            serde_json::to_value(record).map_err(|e| Error::invalid(format!("run record: {e}")))?;
        check_json_document("run record", record, record.values())?;
        self.check_json("run record", &v)?;
        let key = Key::of(scope);
        let what = "write_run_record";
        let opening = Opening {
            create: fence.is_none(),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        o.state.unwrap_or_default().check(scope, what, fence)?;
        self.commit(
            tx,
            what,
            vec![Self::document_stmt(&key, "record", Box::new(v))],
        )
        .await
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        let key = Key::of(scope);
        let c = self.conn("read_run_record").await?;
        let r = self
            .row_opt(
                &c,
                "read the run record",
                &format!("SELECT record FROM runs WHERE {KEY_WHERE}"),
                &key.params(),
            )
            .await?;
        match r.and_then(|r| r.get::<_, Option<Value>>(0)) {
            None => Ok(None),
            Some(v) => serde_json::from_value(v)
                .map(Some)
                .map_err(|e| corrupted(scope, "the run record", e)),
        }
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        check_json_document("message snapshot", messages, messages)?;
        let key = Key::of(scope);
        let what = "write_messages";
        let write = self.messages_stmt(&key, messages, through_event_seq)?;
        let opening = Opening {
            create: fence.is_none(),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        o.state.unwrap_or_default().check(scope, what, fence)?;
        self.commit(tx, what, vec![write]).await
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        let key = Key::of(scope);
        let c = self.conn("read_messages").await?;
        let r = self
            .row_opt(
                &c,
                "read the message snapshot",
                &format!("SELECT messages, messages_through FROM runs WHERE {KEY_WHERE}"),
                &key.params(),
            )
            .await?;
        let Some(r) = r else {
            return Ok(MessageSnapshot::Unavailable);
        };
        let messages: Option<Value> = r.get(0);
        let through: Option<i64> = r.get(1);
        match messages {
            None => Ok(MessageSnapshot::Unavailable),
            Some(Value::Array(messages)) => Ok(MessageSnapshot::Available {
                through_event_seq: u64::try_from(through.unwrap_or(0)).unwrap_or(0),
                messages,
            }),
            Some(other) => Err(corrupted(
                scope,
                "the message snapshot",
                format!("not an array: {other}"),
            )),
        }
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        check_document_size("report", report.len())?;
        self.check_payload("report", report.len())?;
        if report.contains('\0') {
            return Err(Error::invalid(
                "report contains a NUL character, which PostgreSQL text cannot store",
            ));
        }
        let key = Key::of(scope);
        let what = "write_report";
        let opening = Opening {
            create: fence.is_none(),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        o.state.unwrap_or_default().check(scope, what, fence)?;
        self.commit(
            tx,
            what,
            vec![Self::document_stmt(
                &key,
                "report",
                Box::new(report.to_string()),
            )],
        )
        .await
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        let key = Key::of(scope);
        let c = self.conn("read_report").await?;
        let r = self
            .row_opt(
                &c,
                "read the report",
                &format!("SELECT report FROM runs WHERE {KEY_WHERE}"),
                &key.params(),
            )
            .await?;
        Ok(r.and_then(|r| r.get(0)))
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        for e in events {
            e.validate()?;
        }
        let key = Key::of(scope);
        let what = "append_audit";
        let opening = Opening {
            create: fence.is_none(),
            clock: true,
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let now = o.now();
        let mut run = o.state.unwrap_or_default();
        run.check(scope, what, fence)?;
        let mut out = Vec::new();
        let mut seqs = Vec::new();
        let mut bodies = Vec::new();
        for e in events {
            let rec = e.record(scope.run_id.as_str(), run.last_audit + 1, now, fence);
            run.last_audit += 1;
            let body = serde_json::to_value(&rec)
                .map_err(|e| Error::invalid(format!("audit event: {e}")))?;
            self.check_json("audit event", &body)?;
            seqs.push(i64_of(rec.seq));
            bodies.push(body);
            out.push(rec);
        }
        let mut writes = Vec::new();
        if !out.is_empty() {
            writes.push(Stmt::new(
                "append audit records",
                format!(
                    "INSERT INTO audit ({KEY_COLS}, seq, body) SELECT $1, $2, $3, $4, $5, s, b FROM unnest($6::bigint[], $7::jsonb[]) AS t(s, b)"
                ),
                key.owned(vec![Box::new(seqs), Box::new(bodies)]),
            ));
        }
        writes.push(Self::save_stmt(&key, &run)?);
        self.commit(tx, what, writes).await?;
        Ok(out)
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        let key = Key::of(scope);
        let since = i64_of(since_seq);
        let c = self.conn("read_audit").await?;
        let rs = self
            .rows(
                &c,
                "read audit records",
                &format!("SELECT body FROM audit WHERE {KEY_WHERE} AND seq > $6 ORDER BY seq"),
                &key.with(&[&since]),
            )
            .await?;
        rs.into_iter()
            .map(|r| {
                serde_json::from_value(r.get(0)).map_err(|e| corrupted(scope, "an audit record", e))
            })
            .collect()
    }

    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        step.validate(scope)?;
        if let Some(r) = step.finish.as_ref().and_then(|o| o.result.as_ref()) {
            self.check_json("finish result", r)?;
        }
        let record = match &step.run_record {
            Some(r) => {
                let v = serde_json::to_value(r)
                    .map_err(|e| Error::invalid(format!("run record: {e}")))?;
                self.check_json("run record", &v)?;
                Some(v)
            }
            None => None,
        };
        let key = Key::of(scope);
        let what = "commit_step";
        // Round trip 1: BEGIN, the row lock, then the clock and whether the
        // checkpoint exists. No row is created: the fence needs a holding.
        let opening = Opening {
            clock: true,
            checkpoint: step.checkpoint.as_ref().map(|c| c.id.as_str()),
            ..Opening::default()
        };
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        let now = o.now();
        let mut run = o.state.unwrap_or_default();
        run.check(scope, what, Some(fence))?;
        // Everything that can refuse is decided before anything is sent.
        let finished = step.plan_finish(&scope.run_id, &run.lifecycle, fence, now)?;
        let last_before = run.last_seq;
        let (events, insert) = self.events_stmt(&key, &mut run, &step.events, now, Some(fence))?;
        let mut writes: Vec<Stmt> = insert.into_iter().collect();
        let checkpoint = match &step.checkpoint {
            Some(cp) => {
                let mut stored = cp.clone();
                stored.fence = Some(fence);
                writes.push(
                    self.checkpoint_stmt(&tx, what, scope, &mut run, &stored, o.checkpoint_exists)
                        .await?,
                );
                Some(stored)
            }
            None => None,
        };
        if let Some(m) = &step.messages {
            let through = Step::through_seq(m, &events, last_before);
            writes.push(self.messages_stmt(&key, &m.messages, through)?);
        }
        if let Some(v) = record {
            writes.push(Self::document_stmt(&key, "record", Box::new(v)));
        }
        if let Some(f) = &finished {
            f.apply(&mut run.top, &mut run.lifecycle);
        }
        writes.push(Self::save_stmt(&key, &run)?);
        // Round trip 2: every write and COMMIT.
        self.commit_notify(tx, what, writes, scope, !events.is_empty())
            .await?;
        Ok(StepReceipt {
            events,
            checkpoint,
            lifecycle: finished.map(|f| f.lifecycle),
        })
    }
}
