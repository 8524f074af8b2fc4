//! [`PgOptions`]: how a store connects, times out, bounds payloads and
//! judges time.

use std::sync::Arc;
use std::time::Duration;

use runkeep::{Clock, SystemClock};

/// The largest JSON value (or report) this store accepts by default, in
/// bytes of its compact JSON text: 16 MiB. A row this size already costs
/// its size in WAL and in every reader's memory; store larger bodies
/// elsewhere and reference them.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

/// How a change wakes the watchers of other connections (`pg_notify`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotifyMode {
    /// Each change sends its own notification right after its `COMMIT`,
    /// on the same connection and in the same write (no round trip of its
    /// own). It has left when the caller has its answer, so a process that
    /// exits right after a change has sent it. The default.
    #[default]
    Immediate,
    /// The notifications of a short window (about
    /// [`COALESCE_WINDOW`](crate::COALESCE_WINDOW), 2 ms) leave together, as
    /// one statement on one connection of the store's own (a background
    /// task): fewer statements for the server under many quick commits, at
    /// the cost of up to that window of extra wake-up latency. A
    /// notification still queued when the process exits is lost; watchers
    /// then wake at their fallback poll.
    Coalesced,
}

/// How a [`PgStore`](crate::PgStore) connects and judges time.
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
    /// ([`Error::is_outcome_unknown`](runkeep::Error::is_outcome_unknown)). Keep it above `statement_timeout`
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
    /// The machine clock [`CheckpointStore::now`](runkeep::CheckpointStore::now) starts from before it adds
    /// the measured offset to the server. Never used to judge anything.
    /// Default [`SystemClock`]; a test skews it to show it does not matter.
    pub local_clock: Arc<dyn Clock>,
    /// How often a watch re-reads when no notification came (a lapsed
    /// lease notifies nobody; a reconnecting listener misses some).
    /// Default 5 s.
    pub watch_fallback: Duration,
    /// How changes notify watchers. Default [`NotifyMode::Immediate`].
    pub notify: NotifyMode,
    /// A connection string straight to PostgreSQL, for when the store's URL
    /// names a connection pooler in **transaction** mode (pgbouncer's
    /// `pool_mode = transaction`). Set, the store keeps nothing in a
    /// pooled session: its statements are unnamed (parsed with each
    /// execution, their parameter types described once on this direct
    /// connection), and it connects here for what needs a session of its
    /// own: `LISTEN`, the coalescing `NOTIFY` task, the migration and the
    /// schema version check. The pooled sessions cannot be given runkeep's
    /// settings at connect (poolers refuse the `options` startup
    /// parameter), so they must come from the role's defaults: the store
    /// checks `search_path`, `statement_timeout`, `lock_timeout` and
    /// `idle_in_transaction_session_timeout` on each new pooled connection
    /// and refuses with the `ALTER ROLE` statements to run when they
    /// differ from these options (docs/design/postgres.md, "Behind a
    /// pooler"). `None` (the default): the URL is PostgreSQL itself.
    pub direct_url: Option<String>,
    /// Send a step's writes (`commit_step`, and with them the next run's
    /// claim in `commit_step_and_claim_next`) as one data-modifying
    /// statement (`WITH … INSERT …, … UPDATE …`) instead of one statement
    /// each: fewer executor starts and protocol messages for the server,
    /// the same rows written, the same fence judged under the same lock.
    /// Default `true`; `false` is the earlier path, kept to measure one
    /// against the other (`runkeep-bench`'s `pg-split` cases).
    pub merge_step_writes: bool,
    /// Let `claim_next`'s candidate statement read past the first runs
    /// when other claimers hold them locked, by a slack learned from
    /// contention (docs/design/postgres.md, "Candidates under
    /// contention"): with many claimers, one statement instead of a second
    /// one and its round trip. Default `true`; `false` is the earlier
    /// path, kept to measure one against the other (`runkeep-bench`'s
    /// `pg-noslack` cases).
    pub claim_slack: bool,
    /// Let a batch claim (`claim_next_batch`) take runs with concurrency
    /// keys from its first statement: up to the batch's size of each
    /// key's runs read at once, their keys' locks only tried, their
    /// holders counted by one more statement for the whole batch
    /// (docs/design/postgres.md, "Batches over concurrency keys"). Default
    /// `true`; `false` is the earlier path (the first keyed candidate and
    /// every run after it claimed one search and round trip each), kept to
    /// measure one against the other (`runkeep-bench`'s `pg-keyed1` cases).
    pub batch_keyed_runs: bool,
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
            notify: NotifyMode::Immediate,
            direct_url: None,
            merge_step_writes: true,
            claim_slack: true,
            batch_keyed_runs: true,
        }
    }
}
