//! The SQL schema: embedded, versioned migrations, applied under a
//! transaction-level advisory lock.
//!
//! Every table lives in the store's own schema (`PgOptions::schema`); the
//! version applied is recorded in its `runkeep_schema` table, one row per
//! migration. A database whose recorded version is newer than
//! [`SCHEMA_VERSION`] is refused: this binary does not know what the newer
//! one changed.

use runkeep::{Error, Result};
use tokio_postgres::Client;

use crate::error::map_pg;

/// The schema version this binary writes and reads.
pub const SCHEMA_VERSION: i32 = 7;

/// The migrations, in order: `(version, SQL)`. Never edit a released one;
/// add the next.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (1, V1),
    (2, V2),
    (3, V3),
    (4, V4),
    (5, V5),
    (6, V6),
    (7, V7),
];

/// Version 1: runs (the lease row, lifecycle, digest and documents),
/// checkpoints, events and audit records.
///
/// Times are epoch milliseconds (`bigint`), as in the contract's
/// `Timestamp`; identifiers are `text COLLATE "C"` so SQL orders them
/// bytewise, exactly as the core's `RowKey` does.
const V1: &str = r#"
CREATE TABLE runs (
    tenant_id        text COLLATE "C" NOT NULL,
    project_id       text COLLATE "C" NOT NULL,
    session_id       text COLLATE "C" NOT NULL,
    run_id           text COLLATE "C" NOT NULL,
    parent_id        text COLLATE "C" NOT NULL DEFAULT '',
    -- The top holding: NULL never claimed, 1 a lease, 2 a release tombstone.
    top_kind         smallint CHECK (top_kind IN (1, 2)),
    top_fence        bigint,
    holder           text,
    expires_at       bigint,
    -- The lifecycle (NULL: the default, active) and its filter columns.
    lifecycle        jsonb,
    status           text COLLATE "C" NOT NULL DEFAULT 'active',
    available_at     bigint,
    -- The listing digest (NULL: no checkpoints) and its index columns.
    digest           jsonb,
    checkpoint_count bigint NOT NULL DEFAULT 0,
    created_rank     smallint NOT NULL DEFAULT 0,
    created_stamp    bigint NOT NULL DEFAULT 0,
    park_count       integer NOT NULL DEFAULT 0,
    -- Sequence heads, advanced under the row lock.
    last_seq         bigint NOT NULL DEFAULT 0,
    last_audit_seq   bigint NOT NULL DEFAULT 0,
    -- Documents.
    record           jsonb,
    messages         jsonb,
    messages_through bigint,
    report           text,
    PRIMARY KEY (tenant_id, project_id, session_id, run_id, parent_id),
    CHECK ((top_kind IS NULL) = (top_fence IS NULL)),
    CHECK (top_kind IS DISTINCT FROM 1 OR (holder IS NOT NULL AND expires_at IS NOT NULL))
);
-- Listing in both orders, O(page) by keyset (tenant, project or session scope).
CREATE INDEX runs_by_run_id ON runs
    (tenant_id, run_id, parent_id, project_id, session_id) WHERE checkpoint_count > 0;
CREATE INDEX runs_by_created_at ON runs
    (tenant_id, created_rank, created_stamp, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0;
-- claim_next: only active runs with checkpoints, in both orders.
CREATE INDEX runs_runnable_by_run_id ON runs
    (tenant_id, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND status = 'active';
CREATE INDEX runs_runnable_by_created_at ON runs
    (tenant_id, created_rank, created_stamp, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND status = 'active';
-- The park filter (listing and claim_next): only runs with a park.
CREATE INDEX runs_parked_by_run_id ON runs
    (tenant_id, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND park_count > 0;
CREATE INDEX runs_parked_by_created_at ON runs
    (tenant_id, created_rank, created_stamp, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND park_count > 0;
-- The doctor's dead-letter and stale-lease questions.
CREATE INDEX runs_by_status ON runs (tenant_id, status) WHERE status <> 'active';

CREATE TABLE checkpoints (
    tenant_id     text COLLATE "C" NOT NULL,
    project_id    text COLLATE "C" NOT NULL,
    session_id    text COLLATE "C" NOT NULL,
    run_id        text COLLATE "C" NOT NULL,
    parent_id     text COLLATE "C" NOT NULL,
    checkpoint_id text COLLATE "C" NOT NULL,
    -- The header the digest is built from (id, times, fence, park).
    header        jsonb NOT NULL,
    -- The checkpoint's flat JSON form (state and header fields).
    body          jsonb NOT NULL,
    PRIMARY KEY (tenant_id, project_id, session_id, run_id, parent_id, checkpoint_id),
    FOREIGN KEY (tenant_id, project_id, session_id, run_id, parent_id)
        REFERENCES runs ON DELETE CASCADE
);

CREATE TABLE events (
    tenant_id  text COLLATE "C" NOT NULL,
    project_id text COLLATE "C" NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    run_id     text COLLATE "C" NOT NULL,
    parent_id  text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL CHECK (seq > 0),
    -- The event's flat JSON line form (payload, type, seq, timestamp, generation).
    body       jsonb NOT NULL,
    PRIMARY KEY (tenant_id, project_id, session_id, run_id, parent_id, seq),
    FOREIGN KEY (tenant_id, project_id, session_id, run_id, parent_id)
        REFERENCES runs ON DELETE CASCADE
);

CREATE TABLE audit (
    tenant_id  text COLLATE "C" NOT NULL,
    project_id text COLLATE "C" NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    run_id     text COLLATE "C" NOT NULL,
    parent_id  text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL CHECK (seq > 0),
    body       jsonb NOT NULL,
    PRIMARY KEY (tenant_id, project_id, session_id, run_id, parent_id, seq),
    FOREIGN KEY (tenant_id, project_id, session_id, run_id, parent_id)
        REFERENCES runs ON DELETE CASCADE
);
"#;

/// Version 2: `runs` pages keep 30 % free, so the updates that touch no
/// indexed column (a claim, a renewal, a release: the holding's columns)
/// can stay on their page as heap-only tuples, adding no entry to any of
/// the table's eight indexes. Measured on the drain by hand-overs with 8
/// and 16 workers: 1.44× and 1.35× the throughput of the same store
/// without it, in one run (`BENCHMARKS.md`). Pages written before the
/// migration keep their fill until rewritten (`VACUUM FULL runs`).
const V2: &str = "ALTER TABLE runs SET (fillfactor = 70);";

/// Version 3 (issue 30): priorities, concurrency keys and the dedupe
/// window.
///
/// - `runs.priority` (the lifecycle's, default 0), `runs.ckey` and
///   `runs.climit` (its concurrency key and limit, NULL when none): copies
///   of the lifecycle's fields that the SQL orders and filters by, written
///   by every save like `status`.
/// - `claim_next`'s indexes lead with `(-priority)`: the highest priority
///   first, then the filter's order (the core's `RunRow::claim_key`), read
///   in index order. `runs_by_priority` serves the listing's priority
///   order. Claims, renewals and releases still change no indexed column
///   (heap-only updates, version 2): the priority changes only by
///   `set_priority`.
/// - `key_holdings`: every holding of a keyed run (the key's history,
///   `CheckpointStore::key_holdings`), in insertion order (`id`); the open
///   ones (`ended_at IS NULL`) are what a claim counts under the key's
///   advisory lock, and what `claim_next` groups to skip saturated keys.
/// - `dedupe`: each idempotency key's window, per session.
///
/// Both go with their run (`ON DELETE CASCADE`): the contract says a
/// deleted run's holdings are gone with it, and a window whose run is
/// gone is closed (`dedupe::decide` answers a new run), so dropping it
/// changes no answer and keeps both tables bounded by the runs they name.
const V3: &str = r#"
ALTER TABLE runs
    ADD COLUMN priority integer NOT NULL DEFAULT 0,
    ADD COLUMN ckey     text COLLATE "C",
    ADD COLUMN climit   integer,
    ADD CONSTRAINT runs_ckey_has_limit CHECK ((ckey IS NULL) = (climit IS NULL));
UPDATE runs SET
    priority = coalesce((lifecycle->>'priority')::integer, 0),
    ckey = lifecycle->'concurrency'->>'key',
    climit = (lifecycle->'concurrency'->>'limit')::integer
WHERE lifecycle ? 'priority' OR lifecycle ? 'concurrency';
DROP INDEX runs_runnable_by_run_id;
DROP INDEX runs_runnable_by_created_at;
CREATE INDEX runs_runnable_by_run_id ON runs
    (tenant_id, (-priority), run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND status = 'active';
CREATE INDEX runs_runnable_by_created_at ON runs
    (tenant_id, (-priority), created_rank, created_stamp, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND status = 'active';
CREATE INDEX runs_by_priority ON runs
    (tenant_id, (-priority), run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0;

CREATE TABLE key_holdings (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id   text COLLATE "C" NOT NULL,
    project_id  text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    run_id      text COLLATE "C" NOT NULL,
    parent_id   text COLLATE "C" NOT NULL,
    ckey        text COLLATE "C" NOT NULL,
    fence       bigint NOT NULL,
    acquired_at bigint NOT NULL,
    expires_at  bigint NOT NULL,
    ended_at    bigint,
    PRIMARY KEY (tenant_id, project_id, session_id, run_id, parent_id, fence),
    FOREIGN KEY (tenant_id, project_id, session_id, run_id, parent_id)
        REFERENCES runs ON DELETE CASCADE
);
-- The history of one key, oldest first.
CREATE INDEX key_holdings_by_key ON key_holdings
    (tenant_id, project_id, session_id, ckey, id);
-- The open holdings: what a claim counts and claim_next groups.
CREATE INDEX key_holdings_open ON key_holdings
    (tenant_id, project_id, session_id, ckey, expires_at) WHERE ended_at IS NULL;

CREATE TABLE dedupe (
    tenant_id   text COLLATE "C" NOT NULL,
    project_id  text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    dkey        text COLLATE "C" NOT NULL,
    run_id      text COLLATE "C" NOT NULL,
    parent_id   text COLLATE "C" NOT NULL,
    enqueued_at bigint NOT NULL,
    expires_at  bigint NOT NULL,
    PRIMARY KEY (tenant_id, project_id, session_id, dkey),
    FOREIGN KEY (tenant_id, project_id, session_id, run_id, parent_id)
        REFERENCES runs ON DELETE CASCADE
);
-- The cascade from a deleted run.
CREATE INDEX dedupe_by_run ON dedupe (tenant_id, project_id, session_id, run_id, parent_id);
"#;

/// Version 4: recurring schedules (crates/runkeep-postgres/src/schedules.rs): the
/// schedule without its cursor as `body`, the cursor (epoch ms) apart.
const V4: &str = r#"
CREATE TABLE schedules (
    tenant_id  text COLLATE "C" NOT NULL,
    project_id text COLLATE "C" NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    name       text COLLATE "C" NOT NULL,
    body       jsonb NOT NULL,
    cursor_at  bigint,
    PRIMARY KEY (tenant_id, project_id, session_id, name)
);
"#;

/// Version 5 (retention, `crate::retention`): the finished top-level runs
/// by finish instant, so a prune batch reads the oldest finishes first
/// without scanning the active queue; and sub-runs by parent, so a batch
/// finds its candidates' sub-runs without a scan.
const V5: &str = r#"
CREATE INDEX runs_finished_by_finished_at ON runs
    (tenant_id, ((lifecycle->>'finishedAt')::bigint))
    WHERE status <> 'active' AND parent_id = '';
CREATE INDEX runs_sub_runs_by_parent ON runs
    (tenant_id, project_id, session_id, parent_id)
    WHERE parent_id <> '';
"#;

/// Version 6 (issue 30): `claim_next` skips the runs of keys at their
/// limit without reading them.
///
/// - `runs.deadline` (the lifecycle's, epoch ms, NULL when none): a copy
///   written by every save, so the keyed runs past their deadline (which
///   stay candidates whatever their key's count) have an index of their
///   own without an expression on `lifecycle` (a claim changes the
///   lifecycle: that would end heap-only updates).
/// - `runs_unkeyed_by_*`: the runnable runs without a key, in claim order;
///   `runs_unkeyed_in_session_by_*` the same per session (a session
///   scope's first unkeyed run is one probe, whatever other sessions
///   queue: in the tenant-wide order a session without unkeyed runs
///   would read every other session's).
/// - `runs_keyed_by_*`: the runnable keyed runs grouped by session, key
///   and limit, then in claim order: the statement enumerates the groups
///   by a skip scan (one probe per group), drops the saturated ones, and
///   reads the first run of each other group.
/// - `runs_keyed_deadline`: the keyed runnable runs with a deadline.
///
/// None of these columns change on a claim, renewal or release.
const V6: &str = r#"
ALTER TABLE runs ADD COLUMN deadline bigint;
UPDATE runs SET deadline = (lifecycle->>'deadline')::bigint WHERE lifecycle ? 'deadline';
CREATE INDEX runs_unkeyed_by_run_id ON runs
    (tenant_id, (-priority), run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NULL;
CREATE INDEX runs_unkeyed_by_created_at ON runs
    (tenant_id, (-priority), created_rank, created_stamp, run_id, parent_id, project_id, session_id)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NULL;
CREATE INDEX runs_unkeyed_in_session_by_run_id ON runs
    (tenant_id, project_id, session_id, (-priority), run_id, parent_id)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NULL;
CREATE INDEX runs_unkeyed_in_session_by_created_at ON runs
    (tenant_id, project_id, session_id, (-priority), created_rank, created_stamp, run_id, parent_id)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NULL;
CREATE INDEX runs_keyed_by_run_id ON runs
    (tenant_id, project_id, session_id, ckey, climit, (-priority), run_id, parent_id)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NOT NULL;
CREATE INDEX runs_keyed_by_created_at ON runs
    (tenant_id, project_id, session_id, ckey, climit, (-priority), created_rank, created_stamp, run_id, parent_id)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NOT NULL;
CREATE INDEX runs_keyed_deadline ON runs (tenant_id, deadline)
    WHERE checkpoint_count > 0 AND status = 'active' AND ckey IS NOT NULL AND deadline IS NOT NULL;
"#;

/// Version 7 (retention): `runs.finished_at`, the lifecycle's finish
/// instant (epoch ms) while the run is finished, NULL while it is active
/// (never finished, or reopened): a copy written by every save, like
/// `deadline`. It replaces version 5's index on the `lifecycle` expression
/// `finishedAt`: an expression index on `lifecycle` made every update that
/// rewrites the lifecycle (a claim counts an attempt) a non-heap-only one,
/// adding an entry to each of the table's indexes. The prune's scan reads
/// `runs_finished_by_finished_at` on the column instead; a claim changes no
/// column of it. Rows written before are backfilled from their lifecycle.
const V7: &str = r#"
ALTER TABLE runs ADD COLUMN finished_at bigint;
UPDATE runs SET finished_at = (lifecycle->>'finishedAt')::bigint
WHERE status <> 'active' AND lifecycle ? 'finishedAt';
DROP INDEX runs_finished_by_finished_at;
CREATE INDEX runs_finished_by_finished_at ON runs (tenant_id, finished_at)
    WHERE finished_at IS NOT NULL AND parent_id = '';
"#;

/// Quotes a validated schema name as an identifier.
pub(crate) fn ident(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Checks a schema name: 1 to 40 of `[a-z0-9_]`, starting with a letter or
/// `_` (so it needs no escaping and the NOTIFY channel name fits).
pub(crate) fn validate_schema_name(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 40
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.as_bytes()[0].is_ascii_digit()
        && !schema.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "PostgreSQL schema name {schema:?} must be 1 to 40 of a-z, 0-9 and _, start with a letter or _, and not start with pg_"
        )))
    }
}

/// Applies every missing migration to `schema`, under a transaction-level
/// advisory lock keyed by the schema name, so two processes migrating at
/// once serialize (the second finds the work done). Refuses a schema at a
/// newer version than [`SCHEMA_VERSION`]. Answers the version now applied.
pub async fn migrate(client: &mut Client, schema: &str) -> Result<i32> {
    validate_schema_name(schema)?;
    let q = ident(schema);
    let tx = client
        .transaction()
        .await
        .map_err(|e| map_pg("migrate: begin", e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('runkeep-migrate:' || $1::text, 0))",
        &[&schema],
    )
    .await
    .map_err(|e| map_pg("migrate: advisory lock", e))?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {q};
         CREATE TABLE IF NOT EXISTS {q}.runkeep_schema (
             version    integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    ))
    .await
    .map_err(|e| map_pg("migrate: create the schema table", e))?;
    let current = current_version_in(&tx, schema).await?;
    refuse_newer(schema, current)?;
    for (version, sql) in MIGRATIONS {
        if *version <= current {
            continue;
        }
        tx.batch_execute(&format!("SET LOCAL search_path TO {q}; {sql}"))
            .await
            .map_err(|e| map_pg(&format!("migrate: apply version {version}"), e))?;
        tx.execute(
            &format!("INSERT INTO {q}.runkeep_schema (version) VALUES ($1)"),
            &[version],
        )
        .await
        .map_err(|e| map_pg("migrate: record the version", e))?;
        tracing::info!(schema, version, "runkeep-postgres: applied migration");
    }
    tx.commit()
        .await
        .map_err(|e| map_pg("migrate: commit", e))?;
    Ok(SCHEMA_VERSION.max(current))
}

async fn current_version_in(tx: &tokio_postgres::Transaction<'_>, schema: &str) -> Result<i32> {
    let row = tx
        .query_one(
            &format!(
                "SELECT coalesce(max(version), 0) FROM {}.runkeep_schema",
                ident(schema)
            ),
            &[],
        )
        .await
        .map_err(|e| map_pg("read the schema version", e))?;
    Ok(row.get(0))
}

/// The version recorded in `schema` (0 when the schema or its version table
/// does not exist).
pub async fn current_version(client: &Client, schema: &str) -> Result<i32> {
    validate_schema_name(schema)?;
    let exists: bool = client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{}.runkeep_schema", ident(schema))],
        )
        .await
        .map_err(|e| map_pg("look for the schema table", e))?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let row = client
        .query_one(
            &format!(
                "SELECT coalesce(max(version), 0) FROM {}.runkeep_schema",
                ident(schema)
            ),
            &[],
        )
        .await
        .map_err(|e| map_pg("read the schema version", e))?;
    Ok(row.get(0))
}

/// Refuses a version this binary cannot use.
pub(crate) fn refuse_newer(schema: &str, found: i32) -> Result<()> {
    if found > SCHEMA_VERSION {
        return Err(Error::Unsupported {
            message: format!(
                "PostgreSQL schema {schema:?} is at runkeep schema version {found}, newer than version {SCHEMA_VERSION} this binary knows; upgrade runkeep (a newer binary migrated it), or point it at another schema"
            ),
        });
    }
    Ok(())
}
