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
//!   the row lock is held. [`CheckpointStore::now`](runkeep::CheckpointStore::now) answers the machine
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
//!   (`docs/design/postgres.md`).
//! - **Few round trips.** An operation waits for the server as few times
//!   as the rule allows: `BEGIN` travels with the statements that lock and
//!   read the run's row (and read the clock, and whether the checkpoint it
//!   writes exists), and every write travels with `COMMIT`. So a write is
//!   two round trips (the core judges between them), `claim_next` too, and
//!   no row is created for a fenced write (a fence needs a holding, so the
//!   row exists). An unfenced document write has nothing to judge: one
//!   upsert, one round trip; `find_pending` and `resume_point` read the
//!   digest and the bodies they may answer in one statement. The digest is
//!   kept from what it holds whenever it can be (modules `tx` and
//!   `pipeline`, and `docs/design/postgres.md`, "Round trips").
//! - **Waiting, not polling.** A change sends `pg_notify` right after its
//!   `COMMIT`, in the same write, in a transaction of its own that does
//!   not wait for a flush, never inside the data transaction (a `NOTIFY`
//!   there serialises commits: module `wake`); the caller does not wait for
//!   it. One dedicated connection per store `LISTEN`s and wakes
//!   [`Watch`](runkeep::Watch)es, with a fallback poll when the listener is reconnecting.
//!   [`PgOptions::notify`] = [`NotifyMode::Coalesced`] sends instead the
//!   notifications of a ~2 ms window together, in one statement on a
//!   connection of the store's own.
//!
//! Size limits: the core's (checkpoints and documents 64 MiB, events
//! 4 MiB, a finish result 1 MiB) and this store's own
//! [`PgOptions::max_payload_bytes`] (default [`DEFAULT_MAX_PAYLOAD_BYTES`])
//! for any one JSON value it stores, refused with `InvalidInput`, never
//! truncated.
//!
//! # Layout
//!
//! Read top-down. `store` holds [`PgStore`] (`{ db }`), its constructors
//! and its trait impls, which only delegate, passing the floor to one
//! module per job: `claims`, `lifecycle`, `checkpoints`, `parks`, `step`
//! (`commit_step`), `events` (events and audit), `documents`, `listing`
//! (`list_runs` and the SQL `claim_next` shares), `keys` (concurrency keys:
//! the key's advisory lock, the count under it, the holdings history) and
//! `dedupe` (`enqueue_once`). Below them the floor,
//! `db`, which imports no job module: `Db` (the pool and what every
//! transaction needs beside it), `db::connect` (the pool and the clock
//! offset), `db::tx` (every write on one run goes through
//! `Db::write_locked`: lock, clock, the core's judgement, writes with
//! `COMMIT`), `db::row` (the run's row to the core's types and back),
//! `db::digest` (the checkpoint upsert that keeps the digest),
//! `db::pipeline` (statements sent together) and `db::wake` (notify and
//! listen). `options` holds [`PgOptions`], `schema` migrates, `error`
//! maps errors.

mod batch;
mod checkpoints;
mod claims;
mod db;
mod dedupe;
mod documents;
pub mod error;
mod events;
mod keys;
mod lifecycle;
mod listing;
mod options;
mod parks;
mod retention;
mod schedules;
pub mod schema;
mod step;
mod store;

pub use db::pooled::role_settings;
pub use db::wake::COALESCE_WINDOW;
pub use error::OUTCOME_UNKNOWN;
pub use options::{NotifyMode, PgOptions, DEFAULT_MAX_PAYLOAD_BYTES};
pub use schema::SCHEMA_VERSION;
pub use store::PgStore;
