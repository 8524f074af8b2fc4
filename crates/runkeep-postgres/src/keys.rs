//! Concurrency keys ([`runkeep::scheduling::concurrency`]): the key's lock,
//! the count a claim is judged with, the holdings history and its read.
//!
//! # How a claim of a keyed run is judged
//!
//! In the claim's transaction, after the run's row lock: the key's
//! transaction-scoped advisory lock (`pg_advisory_xact_lock` on a hash of
//! the schema, the session and the key), then, in a statement of its own
//! (so its snapshot sees every claim of the key committed before the lock
//! was granted), the claim's instant and the count of the key's *other*
//! open holdings live at that instant (`key_holdings`, `ended_at IS NULL
//! AND expires_at > now`). The core judges with that count
//! (`lifecycle::apply_claim`); the holding is inserted and the run's row
//! saved with `COMMIT`, which releases the lock. Two claimers of two runs
//! of one key therefore count one after the other, and the second sees
//! the first's holding.
//!
//! `claim_next` takes the lock inside its candidate statement, on the row
//! that statement picked and locked ([`candidate_lock_sql`]), and counts
//! in the next statement of the same pipeline ([`count_candidate_stmt`]):
//! still a statement of its own, so its snapshot follows the lock, and a
//! keyed claim costs the round trips of a claim without a key.
//!
//! Only claims take the lock: every other change of a holding (release,
//! finish, failure, snooze, cancel, a finishing step) can only lower the
//! count, so a claimer that counts before it commits counts high and
//! refuses, never admits one too many.
//!
//! No deadlock: a claim waits for at most one key lock while holding
//! nothing a key-lock holder waits for (row locks are taken before the key
//! lock, and `claim_next` takes candidate rows `SKIP LOCKED`); and a
//! transaction judges at most one keyed candidate: a `claim_next` whose
//! keyed candidate is not taken ends its transaction there (releasing the
//! key's lock at once) and goes on in a new one (module `claims`). A
//! search that would still hold a key lock when it meets another keyed
//! candidate only *tries* that one's lock and skips the candidate when it
//! is taken, as it skips a row another claimer has locked. A batch claim
//! (module `batch`) takes many keys' locks in its first statement, each
//! only tried ([`KeyLock::TryEach`]): a transaction that waits for no key
//! lock is in no cycle of waits, and its candidates are judged together
//! with the counts of [`count_many_stmt`].
//!
//! # The history
//!
//! Every save of a keyed run whose top holding changed writes the history
//! ([`holding_stmts`]): a new lease fence ends the run's open holding at
//! the instant (a renewal or a takeover supersedes it) and inserts the new
//! one; a lease that stopped being the top (released, finished, …) ends
//! at the instant, or at its expiry when that came first. What
//! `MemoryStore` does with its `KeyLog`.

use tokio_postgres::Row;

use runkeep::scheduling::concurrency;
use runkeep::{Error, KeyHolding, ListingScope, Result, RunId, RunScope, Timestamp, TopHolding};

use crate::db::pipeline::{Param, Stmt};
use crate::db::row::{fence_of, i64_of, Key, RunState, CLOCK, KEY_COLS, KEY_WHERE};
use crate::db::Db;

/// The hash of a key's advisory lock: the schema (two stores in one
/// database are separate), the session and the key, with separators no id
/// or key can hold. Each part is an SQL expression (a parameter or a
/// column); one rule for [`lock_stmt`] and [`candidate_lock_sql`].
fn key_hash(schema: &str, tenant: &str, project: &str, session: &str, ckey: &str) -> String {
    format!(
        "hashtextextended(concat_ws(chr(1), 'runkeep-key', {schema}::text, {tenant}, {project}, {session}, {ckey}), 0)"
    )
}

/// How a `claim_next` candidate statement treats its candidate's key
/// ([`candidate_lock_sql`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyLock {
    /// Neither locks the key nor names the candidate (the hand-over's
    /// first candidate: its key is locked and counted in a round trip of
    /// its own).
    None,
    /// `pg_advisory_xact_lock`: the transaction holds no other key lock.
    Wait,
    /// `pg_try_advisory_xact_lock`: it does (module doc, "No deadlock").
    Try,
    /// A batch's: each candidate's lock only tried, no candidate named
    /// (a batch counts its candidates with [`count_many_stmt`], which
    /// names them itself).
    TryEach,
}

/// The transaction-local setting a candidate statement names its
/// candidate in, for [`count_candidate_stmt`] (the tenant, project,
/// session, run, parent and key, separated by `chr(1)`).
const CANDIDATE_SETTING: &str = "runkeep.claim_candidate";

/// The two columns a `claim_next` candidate statement adds on its picked
/// row `c` (the columns of `runs`; `schema` and `tenant` are parameter
/// references): the key's lock, taken after the row lock (`NULL` without
/// a key, or with [`KeyLock::None`]; else whether it was taken: `'true'`,
/// or `'false'` when only tried and another claimer holds it), and the
/// candidate named for [`count_candidate_stmt`].
pub(crate) fn candidate_lock_sql(lock: KeyLock, c: &str, schema: &str, tenant: &str) -> String {
    // `pg_advisory_xact_lock` answers `void` (the empty text), the try
    // a boolean: both read as `'true'` once taken.
    let (f, taken) = match lock {
        KeyLock::None => return "NULL::text, NULL::text".into(),
        KeyLock::Wait => ("pg_advisory_xact_lock", " IS NOT NULL"),
        KeyLock::Try | KeyLock::TryEach => ("pg_try_advisory_xact_lock", ""),
    };
    let hash = key_hash(
        schema,
        &format!("{tenant}::text"),
        &format!("{c}.project_id"),
        &format!("{c}.session_id"),
        &format!("{c}.ckey"),
    );
    let locked =
        format!("CASE WHEN {c}.ckey IS NULL THEN NULL ELSE ({f}({hash})::text{taken})::text END");
    if lock == KeyLock::TryEach {
        return format!("{locked}, NULL::text");
    }
    format!(
        "{locked}, \
         CASE WHEN {c}.run_id IS NULL THEN NULL ELSE set_config('{CANDIDATE_SETTING}', \
           concat_ws(chr(1), {tenant}::text, {c}.project_id, {c}.session_id, {c}.run_id, {c}.parent_id, coalesce({c}.ckey, '')), true) END"
    )
}

/// What a candidate statement's key-lock column answered: `None` when no
/// lock was asked for (no key, or [`KeyLock::None`]), else whether it was
/// taken.
pub(crate) fn candidate_locked(r: &Row, column: usize) -> Option<bool> {
    r.get::<_, Option<String>>(column)
        .map(|t| t.as_str() == "true")
}

/// The statement sent right after a candidate statement that locks the
/// key ([`KeyLock::Wait`] or [`KeyLock::Try`]), in the same round trip: a
/// statement of its own, so its snapshot is taken once the key's lock is
/// held (as [`count_stmt`]'s after [`lock_stmt`]). It reads the claim's
/// instant and how many other runs of the named candidate's key hold it
/// live then, and answers the name it counted for (checked by
/// [`counted_candidate`]). Without a named candidate it counts nothing.
pub(crate) fn count_candidate_stmt(fixed: Option<Timestamp>) -> Stmt {
    let fixed: Option<i64> = fixed.map(Timestamp::as_millis);
    Stmt::new(
        "count the candidate key's holders",
        format!(
            "WITH c AS (SELECT coalesce($1::bigint, {CLOCK}) AS now_ms), \
             k AS (SELECT current_setting('{CANDIDATE_SETTING}', true) AS named), \
             p AS (SELECT named, string_to_array(named, chr(1)) AS a FROM k) \
             SELECT c.now_ms, (SELECT count(*) FROM key_holdings h \
               WHERE h.tenant_id = p.a[1] AND h.project_id = p.a[2] AND h.session_id = p.a[3] \
                 AND h.ckey = p.a[6] AND h.ended_at IS NULL AND h.expires_at > c.now_ms \
                 AND NOT (h.run_id = p.a[4] AND h.parent_id = p.a[5])), p.named \
             FROM c, p"
        ),
        vec![Box::new(fixed)],
    )
}

/// The statement a batch sends after its candidate statement took the
/// key locks of `candidates` (each run's key, and its concurrency key):
/// the instant (read now, under the locks, unless `fixed`), then for each
/// candidate, in order, how many *other* runs hold its key live then. A
/// statement of its own, so its snapshot sees every claim of those keys
/// committed before their locks were granted (module doc).
pub(crate) fn count_many_stmt(candidates: &[(&Key, &str)], fixed: Option<Timestamp>) -> Stmt {
    let fixed: Option<i64> = fixed.map(Timestamp::as_millis);
    let col = |f: fn(&(&Key, &str)) -> String| -> Param {
        Box::new(candidates.iter().map(f).collect::<Vec<String>>())
    };
    Stmt::new(
        "count the candidates' key holders",
        format!(
            "WITH c AS (SELECT coalesce($1::bigint, {CLOCK}) AS now_ms) \
             SELECT c.now_ms, coalesce(array_agg((SELECT count(*) FROM key_holdings h \
               WHERE h.tenant_id = u.t AND h.project_id = u.p AND h.session_id = u.s \
                 AND h.ckey = u.k AND h.ended_at IS NULL AND h.expires_at > c.now_ms \
                 AND NOT (h.run_id = u.r AND h.parent_id = u.pa)) ORDER BY u.i), '{{}}') \
             FROM c LEFT JOIN unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
               WITH ORDINALITY AS u(t, p, s, r, pa, k, i) ON true \
             GROUP BY c.now_ms"
        ),
        vec![
            Box::new(fixed),
            col(|c| c.0.tenant.clone()),
            col(|c| c.0.project.clone()),
            col(|c| c.0.session.clone()),
            col(|c| c.0.run.clone()),
            col(|c| c.0.parent.clone()),
            col(|c| c.1.to_string()),
        ],
    )
}

/// What [`count_many_stmt`] read for `n` candidates: the instant and each
/// one's count, in order.
pub(crate) fn counted_many(
    db: &Db,
    rows: &[Row],
    fixed: Option<Timestamp>,
    n: usize,
) -> Result<(Timestamp, Vec<u32>)> {
    let r = rows
        .first()
        .ok_or_else(|| Error::corrupted("the key count answered no row"))?;
    let ms: i64 = r.get(0);
    let counts: Vec<i64> = r.get(1);
    if counts.len() != n {
        return Err(Error::corrupted(format!(
            "the key count answered {} counts for {n} candidates",
            counts.len()
        )));
    }
    let now = Timestamp::from_millis(ms)
        .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
    if fixed.is_none() {
        db.note_server_now(now);
    }
    Ok((
        now,
        counts
            .into_iter()
            .map(|c| u32::try_from(c).unwrap_or(u32::MAX))
            .collect(),
    ))
}

/// What [`count_candidate_stmt`] read for the candidate `key` of
/// concurrency key `ckey`: the instant and the count. A count for another
/// candidate is a defect of the search, refused.
pub(crate) fn counted_candidate(
    db: &Db,
    rows: &[Row],
    fixed: Option<Timestamp>,
    key: &Key,
    ckey: &str,
) -> Result<(Timestamp, u32)> {
    let named: Option<String> = rows.first().and_then(|r| r.get(2));
    let want = [
        key.tenant.as_str(),
        &key.project,
        &key.session,
        &key.run,
        &key.parent,
        ckey,
    ]
    .join("\u{1}");
    if named.as_deref() != Some(want.as_str()) {
        return Err(Error::corrupted(format!(
            "claim_next counted the holders of another candidate ({named:?}, not {want:?})"
        )));
    }
    counted(db, rows, fixed)
}

/// The statement that takes the key lock of the run `key` names, when it
/// carries a concurrency key (no row otherwise). `only_try` does not wait:
/// its one row says whether the lock was taken.
pub(crate) fn lock_stmt(db: &Db, key: &Key, only_try: bool) -> Stmt {
    let f = if only_try {
        "pg_try_advisory_xact_lock"
    } else {
        "pg_advisory_xact_lock"
    };
    Stmt::new(
        "lock the concurrency key",
        format!(
            "SELECT {f}({})::text FROM runs WHERE {KEY_WHERE} AND ckey IS NOT NULL",
            key_hash("$6", "tenant_id", "project_id", "session_id", "ckey")
        ),
        key.owned(vec![Box::new(db.options.schema.clone())]),
    )
}

/// The statement, after the key lock, that reads the claim's instant (`$6`
/// when the caller's or the test clock decides, else the server's, read
/// now) and how many other runs of the run's key hold it live then.
pub(crate) fn count_stmt(key: &Key, fixed: Option<Timestamp>) -> Stmt {
    let fixed: Option<i64> = fixed.map(Timestamp::as_millis);
    Stmt::new(
        "count the key's holders",
        format!(
            "WITH c AS (SELECT coalesce($6::bigint, {CLOCK}) AS now_ms) \
             SELECT c.now_ms, (SELECT count(*) FROM key_holdings h \
               WHERE h.tenant_id = $1 AND h.project_id = $2 AND h.session_id = $3 \
                 AND h.ckey = (SELECT r.ckey FROM runs r WHERE r.tenant_id = $1 AND r.project_id = $2 AND r.session_id = $3 AND r.run_id = $4 AND r.parent_id = $5) \
                 AND h.ended_at IS NULL AND h.expires_at > c.now_ms \
                 AND NOT (h.run_id = $4 AND h.parent_id = $5)) \
             FROM c"
        ),
        key.owned(vec![Box::new(fixed)]),
    )
}

/// What [`count_stmt`] read: the instant and the count.
pub(crate) fn counted(db: &Db, rows: &[Row], fixed: Option<Timestamp>) -> Result<(Timestamp, u32)> {
    let r = rows
        .first()
        .ok_or_else(|| Error::corrupted("the key count answered no row"))?;
    let ms: i64 = r.get(0);
    let n: i64 = r.get(1);
    let now = Timestamp::from_millis(ms)
        .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
    if fixed.is_none() {
        db.note_server_now(now);
    }
    Ok((now, u32::try_from(n).unwrap_or(u32::MAX)))
}

/// True when a `only_try` [`lock_stmt`] took the lock (or the run carries
/// no key: nothing to take).
pub(crate) fn took(rows: &[Row]) -> bool {
    rows.first()
        .is_none_or(|r| r.get::<_, Option<String>>(0).as_deref() == Some("true"))
}

/// The statements that bring the key's history up to the run's top
/// holding after a change from `before`, at `at` (`None`: the server's
/// clock, or the test clock, read by the statement).
pub(crate) fn holding_stmts(
    db: &Db,
    key: &Key,
    before: Option<&TopHolding>,
    run: &RunState,
    at: Option<Timestamp>,
) -> Vec<Stmt> {
    let Some(c) = &run.lifecycle.concurrency else {
        return Vec::new();
    };
    let before_fence = match before {
        Some(TopHolding::Lease { fence, .. }) => Some(*fence),
        _ => None,
    };
    let at: Option<i64> = at.or_else(|| db.fixed_now(None)).map(Timestamp::as_millis);
    let end = || {
        Stmt::new(
            "end the key holding",
            format!(
                "UPDATE key_holdings SET ended_at = LEAST(coalesce($6::bigint, {CLOCK}), expires_at) \
                 WHERE {KEY_WHERE} AND ended_at IS NULL"
            ),
            key.owned(vec![Box::new(at)]),
        )
    };
    match &run.top {
        Some(TopHolding::Lease {
            fence, expires_at, ..
        }) if before_fence != Some(*fence) => {
            let params: Vec<Param> = vec![
                Box::new(c.key.clone()),
                Box::new(i64_of(fence.get())),
                Box::new(at),
                Box::new(expires_at.as_millis()),
            ];
            vec![
                end(),
                Stmt::new(
                    "record the key holding",
                    format!(
                        "INSERT INTO key_holdings ({KEY_COLS}, ckey, fence, acquired_at, expires_at) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8::bigint, {CLOCK}), $9)"
                    ),
                    key.owned(params),
                ),
            ]
        }
        Some(TopHolding::Lease { .. }) => Vec::new(),
        _ if before_fence.is_some() => vec![end()],
        _ => Vec::new(),
    }
}

/// `key_holdings(session, key)`: the key's history, oldest first.
pub(crate) async fn key_holdings(
    db: &Db,
    session: &ListingScope,
    key: &str,
) -> Result<Vec<KeyHolding>> {
    concurrency::check_key(key)?;
    let session = concurrency::session_of(session)?;
    let (Some(project), Some(sess)) = (session.project_id(), session.session_id()) else {
        return Ok(Vec::new());
    };
    let c = db.conn("key_holdings").await?;
    let rows = db
        .rows(
            &c,
            "read the key holdings",
            "SELECT run_id, parent_id, fence, acquired_at, expires_at, ended_at FROM key_holdings \
             WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND ckey = $4 ORDER BY id",
            &[
                &session.tenant_id().to_string(),
                &project.to_string(),
                &sess.to_string(),
                &key,
            ],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let run: String = r.get(0);
        let parent: String = r.get(1);
        let run_id: RunId = run
            .parse()
            .map_err(|e| Error::corrupted(format!("a stored run id: {e}")))?;
        let parent_run_id = if parent.is_empty() {
            None
        } else {
            Some(
                parent
                    .parse::<RunId>()
                    .map_err(|e| Error::corrupted(format!("a stored parent id: {e}")))?,
            )
        };
        let scope = RunScope::new(
            session.tenant_id().clone(),
            project.clone(),
            sess.clone(),
            run_id.clone(),
        );
        let stamp = |ms: i64, what: &str| {
            Timestamp::from_millis(ms)
                .map_err(|e| Error::corrupted(format!("run {run_id}: {what}: {e}")))
        };
        let ended: Option<i64> = r.get(5);
        out.push(KeyHolding {
            run_id: run_id.clone(),
            parent_run_id,
            fence: fence_of(&scope, "a key holding's fence", r.get(2))?,
            acquired_at: stamp(r.get(3), "a key holding's start")?,
            expires_at: stamp(r.get(4), "a key holding's expiry")?,
            ended_at: ended.map(|e| stamp(e, "a key holding's end")).transpose()?,
        });
    }
    Ok(out)
}
