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
//! - **Waiting, not polling.** Each change sends `pg_notify` in its own
//!   transaction (delivered at commit, never for a rolled-back change); one
//!   dedicated connection per store `LISTEN`s and wakes [`Watch`]es, with
//!   a fallback poll when the listener is reconnecting.
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
use serde_json::{json, Map, Value};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use runkeep::checkpoint::sort_checkpoints;
use runkeep::evidence::check_document_size;
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
pub mod schema;

pub use error::OUTCOME_UNKNOWN;
use error::{map_commit, map_pg, map_pool};
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
}

const KEY_WHERE: &str =
    "tenant_id = $1 AND project_id = $2 AND session_id = $3 AND run_id = $4 AND parent_id = $5";
const KEY_COLS: &str = "tenant_id, project_id, session_id, run_id, parent_id";
const STATE_COLS: &str = "top_kind, top_fence, holder, expires_at, lifecycle, digest, last_seq, last_audit_seq, record IS NOT NULL, messages IS NOT NULL, report IS NOT NULL";
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

/// Begins a transaction on a pooled connection (a macro so the borrow of
/// the connection stays in the caller).
macro_rules! begin {
    ($store:ident, $conn:ident, $what:expr) => {
        match tokio::time::timeout($store.options.reply_timeout, $conn.transaction()).await {
            Ok(r) => r.map_err(|e| map_pg(&format!("{}: begin", $what), e))?,
            Err(_) => return Err($store.no_reply(&format!("{}: begin", $what))),
        }
    };
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

    async fn exec<C: GenericClient + Sync>(
        &self,
        c: &C,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64> {
        let bound = self.options.reply_timeout;
        let st = tokio::time::timeout(bound, c.prepare_cached(sql))
            .await
            .map_err(|_| self.no_reply(&format!("{what}: prepare")))?
            .map_err(|e| map_pg(&format!("{what}: prepare"), e))?;
        tokio::time::timeout(bound, c.execute(&st, params))
            .await
            .map_err(|_| self.no_reply(what))?
            .map_err(|e| map_pg(what, e))
    }

    /// Commits; a fault or a missing reply while `COMMIT` is in flight
    /// leaves the outcome unknown.
    async fn commit(&self, tx: deadpool_postgres::Transaction<'_>, what: &str) -> Result<()> {
        let what = format!("{what}: commit");
        match tokio::time::timeout(self.options.reply_timeout, tx.commit()).await {
            Ok(r) => r.map_err(|e| map_commit(&what, e)),
            Err(_) => Err(Error::outcome_unknown(
                format!(
                    "PostgreSQL: {what}: COMMIT was sent but no reply came within {} ms (PgOptions::reply_timeout); the change may or may not be stored: read it back before repeating it",
                    self.options.reply_timeout.as_millis()
                ),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )),
        }
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
        let now = match options.now {
            Some(n) => n,
            None => self.judged_now(&c).await?,
        };
        let query = ListQuery::new(scope, &options.judged_at(|| now))?;
        let listing = Listing::of(scope, &query);
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
        let now = self.judged_now(&c).await?;
        let listing = Listing {
            scope,
            order: filter.order,
            statuses: None,
            claimed: Some(false),
            parks: filter.park.is_some(),
            runnable: true,
            now: now.as_millis(),
        };
        let (sql, params) = listing.sql_and_params(&After::None, 1, true);
        self.explain(&c, &sql, &params).await
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

    /// The instant every judgement of this transaction uses: the test
    /// clock, or the server's `clock_timestamp()` (read after the row lock
    /// is held, so it is never older than the state it judges).
    async fn judged_now<C: GenericClient + Sync>(&self, c: &C) -> Result<Timestamp> {
        match &self.options.clock {
            Some(clock) => Ok(clock.now()),
            None => self.server_now(c).await,
        }
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
        let local = self.options.local_clock.now();
        self.offset_ms
            .store(now.as_millis() - local.as_millis(), Ordering::Relaxed);
        Ok(now)
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

    /// Locks the run's row (creating it first when `create`), answering its
    /// state; `None` when absent and not created.
    async fn lock<C: GenericClient + Sync>(
        &self,
        tx: &C,
        scope: &RunScope,
        key: &Key,
        create: bool,
    ) -> Result<Option<RunState>> {
        if create {
            self.exec(tx, "create the run row", &sql_ensure(), &key.params())
                .await?;
        }
        match self
            .row_opt(tx, "lock the run row", &sql_lock(), &key.params())
            .await?
        {
            Some(r) => Ok(Some(state_of(scope, &r)?)),
            None => Ok(None),
        }
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

    async fn save<C: GenericClient + Sync>(&self, tx: &C, key: &Key, run: &RunState) -> Result<()> {
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
        let last_seq = i64_of(run.last_seq);
        let last_audit = i64_of(run.last_audit);
        self.exec(
            tx,
            "save the run row",
            &sql_save(),
            &key.with(&[
                &kind,
                &fence,
                &holder,
                &expires,
                &lifecycle,
                &status,
                &available,
                &digest,
                &count,
                &rank,
                &stamp,
                &parks,
                &last_seq,
                &last_audit,
            ]),
        )
        .await?;
        Ok(())
    }

    async fn notify<C: GenericClient + Sync>(
        &self,
        tx: &C,
        scope: &RunScope,
        events: bool,
    ) -> Result<()> {
        let payload = json!({ "s": scope, "e": events }).to_string();
        self.exec(
            tx,
            "notify",
            "SELECT pg_notify($1, $2)",
            &[&self.channel, &payload],
        )
        .await?;
        Ok(())
    }

    /// Writes `stored` (already stamped) and keeps the digest.
    async fn put_checkpoint<C: GenericClient + Sync>(
        &self,
        tx: &C,
        scope: &RunScope,
        key: &Key,
        run: &mut RunState,
        stored: &Checkpoint,
    ) -> Result<()> {
        let header = stored.header();
        let header_json =
            serde_json::to_value(&header).map_err(|e| Error::backend("encode a header", e))?;
        let body = Value::Object(stored.to_json());
        self.check_json(&format!("checkpoint {}", stored.id), &body)?;
        let id = stored.id.to_string();
        let row = self.row_opt(
            tx,
            "write the checkpoint",
            &format!(
                "INSERT INTO checkpoints ({KEY_COLS}, checkpoint_id, header, body) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT ({KEY_COLS}, checkpoint_id) DO UPDATE SET header = EXCLUDED.header, body = EXCLUDED.body
                 RETURNING (xmax = 0)"
            ),
            &key.with(&[&id, &header_json, &body]),
        )
        .await?
        .ok_or_else(|| Error::corrupted("the checkpoint upsert answered no row"))?;
        let inserted: bool = row.get(0);
        let mut d = run.digest.take().unwrap_or_default();
        if d.checkpoint_count == 0 && !inserted {
            d = RunDigest::default();
        }
        if !d.apply_write(header, !inserted) {
            d = self
                .rebuild_digest(tx, scope, key)
                .await?
                .unwrap_or_default();
        }
        run.digest = Some(d);
        Ok(())
    }

    async fn rebuild_digest<C: GenericClient + Sync>(
        &self,
        tx: &C,
        scope: &RunScope,
        key: &Key,
    ) -> Result<Option<RunDigest>> {
        let rs = self
            .rows(
                tx,
                "read the checkpoint headers",
                &format!("SELECT header FROM checkpoints WHERE {KEY_WHERE}"),
                &key.params(),
            )
            .await?;
        if rs.is_empty() {
            return Ok(None);
        }
        let mut headers = Vec::with_capacity(rs.len());
        for r in rs {
            let h: CheckpointHeader = serde_json::from_value(r.get(0))
                .map_err(|e| corrupted(scope, "a checkpoint header", e))?;
            headers.push(h);
        }
        Ok(Some(RunDigest::from_headers(&headers)))
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

    /// Inserts events under the already-checked fence; advances `last_seq`.
    async fn push_events<C: GenericClient + Sync>(
        &self,
        tx: &C,
        key: &Key,
        run: &mut RunState,
        events: &[NewEvent],
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        if events.is_empty() {
            return Ok(Vec::new());
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
        self.exec(
            tx,
            "append events",
            &format!(
                "INSERT INTO events ({KEY_COLS}, seq, body) SELECT $1, $2, $3, $4, $5, s, b FROM unnest($6::bigint[], $7::jsonb[]) AS t(s, b)"
            ),
            &key.with(&[&seqs, &bodies]),
        )
        .await?;
        Ok(out)
    }

    async fn set_document<C: GenericClient + Sync>(
        &self,
        tx: &C,
        key: &Key,
        column: &str,
        value: &(dyn ToSql + Sync),
    ) -> Result<()> {
        self.exec(
            tx,
            "write a document",
            &format!("UPDATE runs SET {column} = $6 WHERE {KEY_WHERE}"),
            &key.with(&[value]),
        )
        .await?;
        Ok(())
    }

    async fn set_messages<C: GenericClient + Sync>(
        &self,
        tx: &C,
        key: &Key,
        messages: &[Value],
        through: u64,
    ) -> Result<()> {
        let v = Value::Array(messages.to_vec());
        self.check_json("message snapshot", &v)?;
        let through = i64_of(through);
        self.exec(
            tx,
            "write the message snapshot",
            &format!("UPDATE runs SET messages = $6, messages_through = $7 WHERE {KEY_WHERE}"),
            &key.with(&[&v, &through]),
        )
        .await?;
        Ok(())
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

    /// Starts the LISTEN connection once, on the current runtime (none:
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
        let config = self.config.clone();
        let channel = self.channel.clone();
        let notifier = self.notifier.clone();
        *guard = Some(handle.spawn(listen_loop(config, channel, notifier)));
        true
    }
}

/// The dedicated LISTEN connection: wakes the watchers of every change
/// another connection (of this or any process) commits. Reconnects after a
/// fault; watches poll at their fallback interval meanwhile.
async fn listen_loop(config: tokio_postgres::Config, channel: String, notifier: Arc<Notifier>) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(100);
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut conn)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
                    while let Some(m) = messages.next().await {
                        match m {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                if tx.send(n.payload().to_string()).is_err() {
                                    break;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "runkeep-postgres: the LISTEN connection failed; reconnecting");
                                break;
                            }
                        }
                    }
                });
                if let Err(e) = client.batch_execute(&format!("LISTEN {channel}")).await {
                    tracing::warn!(error = %e, "runkeep-postgres: LISTEN failed; reconnecting");
                } else {
                    backoff = Duration::from_millis(100);
                    tracing::debug!(channel, "runkeep-postgres: listening");
                    while let Some(payload) = rx.recv().await {
                        let Ok(v) = serde_json::from_str::<Value>(&payload) else {
                            continue;
                        };
                        let events = v.get("e").and_then(Value::as_bool).unwrap_or(true);
                        if let Some(scope) = v
                            .get("s")
                            .and_then(|s| serde_json::from_value::<RunScope>(s.clone()).ok())
                        {
                            notifier.notify_run(&scope, events);
                        }
                    }
                }
                drop(client);
                driver.abort();
            }
            Err(e) => {
                tracing::warn!(error = %e, "runkeep-postgres: cannot open the LISTEN connection; watches poll meanwhile");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
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
    now: i64,
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
            now: query.now.as_millis(),
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
        let now = if self.runnable || self.claimed.is_some() {
            format!("{}::bigint", push(Box::new(self.now), &mut params))
        } else {
            String::new()
        };
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
            "SELECT {} FROM runs WHERE {} ORDER BY {order_by} LIMIT {limit}{}",
            Self::COLS,
            wh.join(" AND "),
            if lock { " FOR UPDATE SKIP LOCKED" } else { "" }
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
        let mut conn = self.conn("write_checkpoint").await?;
        let tx = begin!(self, conn, "write_checkpoint");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "write_checkpoint", fence)?;
        let mut stored = checkpoint.clone();
        stored.fence = stamp_fence(fence, run.top.as_ref());
        self.put_checkpoint(&tx, scope, &key, &mut run, &stored)
            .await?;
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, false).await?;
        self.commit(tx, "write_checkpoint").await?;
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
        let mut conn = self.conn("delete_checkpoint").await?;
        let tx = begin!(self, conn, "delete_checkpoint");
        let Some(mut run) = self.lock(&tx, scope, &key, false).await? else {
            if let Some(f) = fence {
                check_write_fence(&scope.run_id, "delete_checkpoint", f, None)?;
            }
            return Ok(false);
        };
        run.check(scope, "delete_checkpoint", fence)?;
        let idv = id.to_string();
        let n = self
            .exec(
                &tx,
                "delete a checkpoint",
                &format!("DELETE FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = $6"),
                &key.with(&[&idv]),
            )
            .await?;
        if n > 0 {
            run.digest = self.rebuild_digest(&tx, scope, &key).await?;
            self.save(&tx, &key, &run).await?;
        }
        self.commit(tx, "delete_checkpoint").await?;
        Ok(n > 0)
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
        let not_found = || Error::NotFound {
            what: format!("checkpoint {id} of run {}", scope.run_id),
        };
        let mut conn = self.conn("resolve_park").await?;
        let tx = begin!(self, conn, "resolve_park");
        let Some(mut run) = self
            .lock(&tx, scope, &key, false)
            .await?
            .filter(|r| !r.is_blank())
        else {
            return Err(not_found());
        };
        run.check(scope, "resolve_park", fence)?;
        let Some(current) = self
            .read_checkpoint_in(&tx, scope, &key, id.as_str())
            .await?
        else {
            return Err(not_found());
        };
        let mut updated = current.clone();
        park::resolve(&mut updated, resolution, now)?;
        updated.fence = stamp_fence(fence, run.top.as_ref()).or(current.fence);
        self.put_checkpoint(&tx, scope, &key, &mut run, &updated)
            .await?;
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, false).await?;
        self.commit(tx, "resolve_park").await?;
        Ok(updated)
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let key = Key::of(scope);
        let mut conn = self.conn("prune_checkpoints").await?;
        let tx = begin!(self, conn, "prune_checkpoints");
        let Some(mut run) = self
            .lock(&tx, scope, &key, false)
            .await?
            .filter(|r| !r.is_blank())
        else {
            return Ok(Vec::new());
        };
        run.check(scope, "prune_checkpoints", fence)?;
        let rs = self
            .rows(
                &tx,
                "read checkpoints to prune",
                &format!("SELECT body FROM checkpoints WHERE {KEY_WHERE}"),
                &key.params(),
            )
            .await?;
        let cps = rs
            .into_iter()
            .map(|r| checkpoint_of(scope, r.get(0)))
            .collect::<Result<Vec<_>>>()?;
        let victims = park::prune_victims(&cps, keep_last);
        if !victims.is_empty() {
            let ids: Vec<String> = victims.iter().map(ToString::to_string).collect();
            self.exec(
                &tx,
                "delete pruned checkpoints",
                &format!(
                    "DELETE FROM checkpoints WHERE {KEY_WHERE} AND checkpoint_id = ANY($6::text[])"
                ),
                &key.with(&[&ids]),
            )
            .await?;
            run.digest = self.rebuild_digest(&tx, scope, &key).await?;
            self.save(&tx, &key, &run).await?;
        }
        self.commit(tx, "prune_checkpoints").await?;
        Ok(victims)
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        let c = self.conn("list_runs").await?;
        let now = match options.now {
            Some(n) => n,
            None => self.judged_now(&c).await?,
        };
        let query = ListQuery::new(scope, &options.judged_at(|| now))?;
        let listing = Listing::of(scope, &query);
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
        let mut conn = self.conn("claim").await?;
        let tx = begin!(self, conn, "claim");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        let now = match options.now {
            Some(n) => n,
            None => self.judged_now(&tx).await?,
        };
        let before = (run.top.clone(), run.lifecycle.clone());
        let outcome = Self::apply_claim(scope, &mut run, options, now)?;
        if (run.top.clone(), run.lifecycle.clone()) != before {
            self.save(&tx, &key, &run).await?;
        }
        self.commit(tx, "claim").await?;
        Ok(outcome)
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        let key = Key::of(scope);
        let mut conn = self.conn("release").await?;
        let tx = begin!(self, conn, "release");
        let Some(mut run) = self.lock(&tx, scope, &key, false).await? else {
            return Ok(false);
        };
        match decide_release(&scope.run_id, run.top.as_ref(), fence)? {
            Some(tomb) => {
                run.top = Some(TopHolding::Released { fence: tomb });
                self.save(&tx, &key, &run).await?;
                self.notify(&tx, scope, false).await?;
                self.commit(tx, "release").await?;
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
        let mut conn = self.conn("claim_next").await?;
        let tx = begin!(self, conn, "claim_next");
        let now = match options.now {
            Some(n) => n,
            None => self.judged_now(&tx).await?,
        };
        let query = ListQuery::claim_next(scope, filter, now)?;
        let listing = Listing {
            scope,
            order: filter.order,
            statuses: None,
            claimed: Some(false),
            parks: query.park.is_some(),
            runnable: true,
            now: now.as_millis(),
        };
        let mut after = After::None;
        let mut changed = false;
        loop {
            // One candidate at a time, skipping rows other claimers hold
            // locked: a claimer never blocks on another, and never locks
            // more rows than it judges.
            let (sql, params) = listing.sql_and_params(&after, 1, true);
            let Some(r) = self
                .rows(
                    &tx,
                    "claim_next: find a candidate",
                    &sql,
                    &params_ref(&params),
                )
                .await?
                .into_iter()
                .next()
            else {
                break;
            };
            let (run_scope, mut state, row) = listed_row(scope.tenant_id(), &r, now)?;
            after = After::Row(
                row.key(filter.order),
                run_scope.project_id.to_string(),
                run_scope.session_id.to_string(),
            );
            if !(query.matches(&row) && row.is_claimable(now)) {
                continue;
            }
            let key = Key::of(&run_scope);
            // The full state (sequence heads, documents) under the lock we hold.
            if let Some(full) = self.read_state(&tx, &run_scope, &key).await? {
                state = full;
            }
            let outcome = Self::apply_claim(&run_scope, &mut state, options, now)?;
            match outcome {
                ClaimOutcome::Acquired(lease) => {
                    self.save(&tx, &key, &state).await?;
                    self.commit(tx, "claim_next").await?;
                    return Ok(Some((run_scope, lease)));
                }
                ClaimOutcome::Finished(_) => {
                    // Dead-lettered by this claim: recorded, then the next run.
                    self.save(&tx, &key, &state).await?;
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            self.commit(tx, "claim_next").await?;
        }
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
        let mut conn = self.conn("enqueue").await?;
        let tx = begin!(self, conn, "enqueue");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
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
        self.put_checkpoint(&tx, scope, &key, &mut run, &stored)
            .await?;
        run.lifecycle = Lifecycle {
            max_attempts: options.max_attempts,
            available_at: options.available_at,
            ..Lifecycle::default()
        };
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, false).await?;
        self.commit(tx, "enqueue").await?;
        Ok(stored)
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        outcome.validate(&scope.run_id)?;
        if let Some(r) = &outcome.result {
            self.check_json("finish result", r)?;
        }
        let key = Key::of(scope);
        let mut conn = self.conn("finish").await?;
        let tx = begin!(self, conn, "finish");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        let now = self.judged_now(&tx).await?;
        let l = lifecycle::apply_finish(
            &scope.run_id,
            &mut run.top,
            &mut run.lifecycle,
            outcome,
            fence,
            now,
        )?;
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, false).await?;
        self.commit(tx, "finish").await?;
        Ok(l)
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        let key = Key::of(scope);
        let mut conn = self.conn("snooze").await?;
        let tx = begin!(self, conn, "snooze");
        let Some(mut run) = self.lock(&tx, scope, &key, false).await? else {
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
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, false).await?;
        self.commit(tx, "snooze").await?;
        Ok(true)
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        let key = Key::of(scope);
        let mut conn = self.conn("reopen").await?;
        let tx = begin!(self, conn, "reopen");
        let Some(mut run) = self
            .lock(&tx, scope, &key, false)
            .await?
            .filter(RunState::exists)
        else {
            return Err(Error::NotFound {
                what: format!("run {}", scope.run_id),
            });
        };
        let l = lifecycle::after_reopen(&scope.run_id, &run.lifecycle)?;
        run.lifecycle = l.clone();
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, false).await?;
        self.commit(tx, "reopen").await?;
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
        let mut conn = self.conn("append_events").await?;
        let tx = begin!(self, conn, "append_events");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "append_events", fence)?;
        let now = self.judged_now(&tx).await?;
        let out = self
            .push_events(&tx, &key, &mut run, events, now, fence)
            .await?;
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, true).await?;
        self.commit(tx, "append_events").await?;
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
        check_document_size(
            "run record",
            serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len()),
        )?;
        self.check_json("run record", &v)?;
        let key = Key::of(scope);
        let mut conn = self.conn("write_run_record").await?;
        let tx = begin!(self, conn, "write_run_record");
        let run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "write_run_record", fence)?;
        self.set_document(&tx, &key, "record", &v).await?;
        self.commit(tx, "write_run_record").await
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
        check_document_size(
            "message snapshot",
            serde_json::to_vec(messages).map_or(usize::MAX, |v| v.len()),
        )?;
        let key = Key::of(scope);
        let mut conn = self.conn("write_messages").await?;
        let tx = begin!(self, conn, "write_messages");
        let run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "write_messages", fence)?;
        self.set_messages(&tx, &key, messages, through_event_seq)
            .await?;
        self.commit(tx, "write_messages").await
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
        let mut conn = self.conn("write_report").await?;
        let tx = begin!(self, conn, "write_report");
        let run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "write_report", fence)?;
        let r = report.to_string();
        self.set_document(&tx, &key, "report", &r).await?;
        self.commit(tx, "write_report").await
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
        let mut conn = self.conn("append_audit").await?;
        let tx = begin!(self, conn, "append_audit");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "append_audit", fence)?;
        let now = self.judged_now(&tx).await?;
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
        if !out.is_empty() {
            self.exec(
                &tx,
                "append audit records",
                &format!(
                    "INSERT INTO audit ({KEY_COLS}, seq, body) SELECT $1, $2, $3, $4, $5, s, b FROM unnest($6::bigint[], $7::jsonb[]) AS t(s, b)"
                ),
                &key.with(&[&seqs, &bodies]),
            )
            .await?;
        }
        self.save(&tx, &key, &run).await?;
        self.commit(tx, "append_audit").await?;
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
        let mut conn = self.conn("commit_step").await?;
        let tx = begin!(self, conn, "commit_step");
        let mut run = self.lock(&tx, scope, &key, true).await?.unwrap_or_default();
        run.check(scope, "commit_step", Some(fence))?;
        let now = self.judged_now(&tx).await?;
        // Everything that can refuse is decided before anything is written;
        // a refusal after a write rolls the whole transaction back anyway.
        let finished = step.plan_finish(&scope.run_id, &run.lifecycle, fence, now)?;
        let last_before = run.last_seq;
        let events = self
            .push_events(&tx, &key, &mut run, &step.events, now, Some(fence))
            .await?;
        let checkpoint = match &step.checkpoint {
            Some(cp) => {
                let mut stored = cp.clone();
                stored.fence = Some(fence);
                self.put_checkpoint(&tx, scope, &key, &mut run, &stored)
                    .await?;
                Some(stored)
            }
            None => None,
        };
        if let Some(m) = &step.messages {
            let through = Step::through_seq(m, &events, last_before);
            self.set_messages(&tx, &key, &m.messages, through).await?;
        }
        if let Some(v) = &record {
            self.set_document(&tx, &key, "record", v).await?;
        }
        if let Some(f) = &finished {
            f.apply(&mut run.top, &mut run.lifecycle);
        }
        self.save(&tx, &key, &run).await?;
        self.notify(&tx, scope, !events.is_empty()).await?;
        self.commit(tx, "commit_step").await?;
        Ok(StepReceipt {
            events,
            checkpoint,
            lifecycle: finished.map(|f| f.lifecycle),
        })
    }
}
