//! Claims: `claim`, `release`, `lease` and `claim_next`'s candidate search
//! (one `SKIP LOCKED` candidate at a time, judged by the core).

use runkeep::lease::decide_release;
use runkeep::lifecycle;
use runkeep::listing::ListQuery;
use runkeep::{
    ClaimNextFilter, ClaimOptions, ClaimOutcome, Fence, Lease, LeaseSummary, ListingScope, Result,
    RunScope, Timestamp, TopHolding,
};

use crate::db::pipeline::{Stmt, Tx};
use crate::db::row::{save_many_stmt, save_stmt, Key, RunState};
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;
use crate::keys::{self, KeyLock};
use crate::listing::{fill_state, listed_row, After, Listing};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio_postgres::Row;

/// How many runs without a key past the ones asked for `claim_next`'s
/// candidate statement reads (`Listing::slack`), learned from contention
/// on this store.
///
/// The statement reads the first runs in claim order without locking
/// them, then locks the first it can (`SKIP LOCKED`). Another claimer's
/// transaction holds the first runs locked until it commits their claim
/// (a batch holds up to its size), so with several claimers the first
/// runs are often all locked: the statement answers a row of NULLs and
/// the search goes on with the scan, one more statement and round trip
/// (measured with 8 workers draining: nearly every claim). Reading more
/// than the first lets `SKIP LOCKED` pass the locked ones in the same
/// statement; reading them costs when nobody contends. So the slack starts
/// at 0, doubles (at least to [`Self::FIRST`], at most [`Self::MAX`]) each
/// time every run read was locked, and shrinks by one each time a search
/// took what it asked for without the scan.
#[derive(Debug)]
pub(crate) struct HeadSlack {
    /// `PgOptions::claim_slack`: off, the slack stays 0.
    on: bool,
    slack: AtomicI64,
}

impl HeadSlack {
    /// The slack after the first contention.
    pub(crate) const FIRST: i64 = 8;
    /// The most runs past the ones asked for a statement reads.
    pub(crate) const MAX: i64 = 256;

    pub(crate) fn new(on: bool) -> Self {
        Self {
            on,
            slack: AtomicI64::new(0),
        }
    }

    pub(crate) fn get(&self) -> i64 {
        self.slack.load(Ordering::Relaxed)
    }

    /// Every run the statement read was locked by another claimer.
    pub(crate) fn contended(&self) -> i64 {
        if !self.on {
            return 0;
        }
        let grown = |s: i64| (s * 2).clamp(Self::FIRST, Self::MAX);
        let before = self
            .slack
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| Some(grown(s)))
            .unwrap_or(0);
        grown(before)
    }

    /// A search took what it asked for from its first statement.
    pub(crate) fn calm(&self) {
        let _ = self
            .slack
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                (s > 0).then_some(s - 1)
            });
    }
}

/// The core's claim rule on `run` at `now`, with `key_held_by_others`
/// counted under the key's lock (module `keys`; 0 for a run without a
/// key).
pub(crate) fn apply_claim(
    scope: &RunScope,
    run: &mut RunState,
    options: &ClaimOptions,
    now: Timestamp,
    key_held_by_others: u32,
) -> Result<ClaimOutcome> {
    lifecycle::apply_claim(
        &scope.run_id,
        &mut run.top,
        &mut run.lifecycle,
        options,
        now,
        key_held_by_others,
    )
}

pub(crate) async fn claim(
    db: &Db,
    scope: &RunScope,
    options: &ClaimOptions,
) -> Result<ClaimOutcome> {
    // After the row lock, in the same round trip: the key's lock (when the
    // run carries a key), then the instant and the key's other holders,
    // read once the lock is held (module `keys`).
    let fixed = db.fixed_now(options.now);
    let key = Key::of(scope);
    let opening = Opening {
        create: true,
        more: vec![
            keys::lock_stmt(db, &key, false),
            keys::count_stmt(&key, fixed),
        ],
        ..Opening::default()
    };
    db.write_locked("claim", scope, opening, |l| {
        let (now, held) = keys::counted(db, &l.more[1], fixed)?;
        let before = (l.run.top.clone(), l.run.lifecycle.clone());
        let outcome = apply_claim(scope, &mut l.run, options, now, held)?;
        if (l.run.top.clone(), l.run.lifecycle.clone()) == before {
            // Nothing changed.
            return Ok(Verdict::Keep(outcome));
        }
        Ok(Verdict::Write(outcome, Writes::default().save().at(now)))
    })
    .await
}

pub(crate) async fn release(db: &Db, scope: &RunScope, fence: Fence) -> Result<bool> {
    db.write_locked("release", scope, Opening::default(), |l| {
        if !l.found {
            return Ok(Verdict::Keep(false));
        }
        match decide_release(&scope.run_id, l.run.top.as_ref(), fence)? {
            Some(tomb) => {
                l.run.top = Some(TopHolding::Released { fence: tomb });
                Ok(Verdict::Write(
                    true,
                    Writes::default().save().notify(Wake::Changed),
                ))
            }
            None => Ok(Verdict::Keep(false)),
        }
    })
    .await
}

pub(crate) async fn lease(
    db: &Db,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<LeaseSummary>> {
    let c = db.conn("lease").await?;
    Ok(db
        .read_state(&c, scope, &Key::of(scope))
        .await?
        .and_then(|r| r.top.map(|t| t.summary(now))))
}

pub(crate) async fn claim_next(
    db: &Db,
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    options: &ClaimOptions,
) -> Result<Option<(RunScope, Lease)>> {
    let what = "claim_next";
    let mut search = NextSearch::new(db, scope, filter, options)?;
    // The candidate with its key's lock, then the key's count: one round
    // trip, as for a run without a key.
    let mut first = search.judged(&After::None);
    loop {
        let (tx, replies) = db.begin(what, first).await?;
        let mut writes = Vec::new();
        let searched = search
            .search(db, &tx, what, replies, None, &mut writes)
            .await?;
        if search.changed || matches!(searched, Searched::Taken(Some(_))) {
            db.commit(tx, what, writes).await?;
            search.changed = false;
        }
        // Otherwise nothing changed: the transaction rolls back unwaited.
        match searched {
            Searched::Taken(taken) => return Ok(taken),
            // A keyed candidate was judged and not taken: its key's lock
            // goes with this transaction; the search goes on in a new one
            // (module `keys`, "No deadlock").
            Searched::KeyJudged(after) => {
                search.key_locked = false;
                first = search.judged(&after);
            }
            // Only a search given a run to skip answers this.
            Searched::AfterCommit => {
                return Err(runkeep::Error::corrupted(
                    "claim_next: a search without a run to skip answered AfterCommit",
                ))
            }
        }
    }
}

/// How a search inside one transaction ended.
pub(crate) enum Searched {
    /// A run was taken (its writes added), or no candidate is left.
    Taken(Option<(RunScope, Lease)>),
    /// A keyed candidate was judged under its key's lock and not taken (at
    /// its limit, or finished by the claim): the transaction ends there, so
    /// the key's lock is held no longer than one judgement, and the search
    /// goes on after this key.
    KeyJudged(After),
    /// The run `skip` names came up (a hand-over's own run, its lease
    /// lapsed): the transaction ends there, and the claim is made after
    /// its commit, which sees the step.
    AfterCommit,
}

impl NextSearch<'_> {
    /// The key lock of the locked candidate `key` (waited for when this
    /// transaction holds no other, else only tried), then the instant and
    /// the key's other holders, read under it: one more round trip, for a
    /// candidate read by [`Self::first`] (without its key's lock). `None`:
    /// the lock was tried and another claimer holds it (the candidate is
    /// skipped, as a row another claimer has locked is).
    async fn count_key(
        &mut self,
        db: &Db,
        tx: &Tx,
        what: &str,
        key: &Key,
    ) -> Result<Option<(Timestamp, u32)>> {
        let only_try = self.key_locked;
        let rows = db
            .run(
                tx,
                what,
                vec![
                    keys::lock_stmt(db, key, only_try),
                    keys::count_stmt(key, self.fixed),
                ],
            )
            .await?;
        if only_try && !keys::took(&rows[0]) {
            return Ok(None);
        }
        self.key_locked = true;
        keys::counted(db, &rows[1], self.fixed).map(Some)
    }
}

/// A candidate's place in claim order: its key, project and session.
type Listed = (runkeep::listing::RowKey, String, String);

/// A candidate as the core reads it: its place in claim order, scope,
/// state and listing row, and the statement's row.
type Candidate = (Listed, RunScope, RunState, runkeep::RunRow, Row);

/// `claim_next`'s search inside a transaction: one `SKIP LOCKED` candidate
/// at a time, each judged by the core, until one is taken or none is left.
pub(crate) struct NextSearch<'a> {
    filter: &'a ClaimNextFilter,
    options: &'a ClaimOptions,
    scope: &'a ListingScope,
    /// The caller's instant (or the test clock's); `None`: the server's,
    /// read by the first candidate statement.
    fixed: Option<Timestamp>,
    query: ListQuery,
    listing: Listing<'a>,
    /// A run was written without being taken (dead-lettered by its claim):
    /// the transaction must commit even when nothing is taken.
    pub(crate) changed: bool,
    /// The transaction holds a key lock: a later key's is only tried
    /// (module `keys`, "No deadlock").
    key_locked: bool,
    /// `PgOptions::batch_keyed_runs`: [`Self::many`] takes keyed runs.
    batch_keyed: bool,
    /// [`Self::take_many`] passed a keyed candidate whose key's lock
    /// another claimer holds.
    pub(crate) passed_locked: bool,
    /// Where the last candidate statement continued from (what the
    /// fallback continues from).
    last_after: RefCell<After>,
    /// Every head the candidate statement found was locked by another
    /// claimer: this search goes on with the scan (`Listing::scan`).
    scanning: Cell<bool>,
    /// The last candidate statement built locks its candidate's key and is
    /// followed by the key's count ([`Self::judged`]), not [`Self::first`].
    counted: Cell<bool>,
    /// The store's schema (part of a key lock's hash).
    schema: String,
}

impl<'a> NextSearch<'a> {
    /// Checks the filter before anything is sent (the instant does not
    /// change what is valid).
    pub(crate) fn new(
        db: &Db,
        scope: &'a ListingScope,
        filter: &'a ClaimNextFilter,
        options: &'a ClaimOptions,
    ) -> Result<Self> {
        let fixed = db.fixed_now(options.now);
        let query = ListQuery::claim_next(scope, filter, fixed.unwrap_or(db.now()))?;
        let listing = Listing {
            scope,
            order: filter.order,
            statuses: None,
            claimed: Some(false),
            parks: query.park.is_some(),
            runnable: true,
            scan: false,
            min_priority: None,
            slack: db.head_slack.get(),
            per_key: false,
            now: fixed.map(Timestamp::as_millis),
        };
        Ok(Self {
            filter,
            options,
            scope,
            fixed,
            query,
            listing,
            changed: false,
            key_locked: false,
            batch_keyed: db.options.batch_keyed_runs,
            passed_locked: false,
            last_after: RefCell::new(After::None),
            scanning: Cell::new(false),
            counted: Cell::new(false),
            schema: db.options.schema.clone(),
        })
    }

    /// The first candidate's statement, without its key's lock: what a
    /// hand-over sends beside its step's row lock (a keyed candidate is
    /// then locked and counted in a round trip of its own,
    /// [`Self::count_key`]).
    pub(crate) fn first(&self) -> Stmt {
        self.counted.set(false);
        self.candidate(&After::None, KeyLock::None)
    }

    /// The candidate after `after` with its key's lock (waited for when
    /// the transaction holds no other key lock, else only tried), then the
    /// count of the key's other holders in a statement of its own (its
    /// snapshot taken once the lock is held; module `keys`): a keyed
    /// candidate costs no more round trips than one without a key.
    pub(crate) fn judged(&self, after: &After) -> Vec<Stmt> {
        self.counted.set(true);
        let lock = if self.key_locked {
            KeyLock::Try
        } else {
            KeyLock::Wait
        };
        vec![
            self.candidate(after, lock),
            keys::count_candidate_stmt(self.fixed),
        ]
    }

    /// The first statements of the transaction a search goes on in after
    /// a keyed judgement ended the last one ([`Searched::KeyJudged`]): it
    /// holds no key lock yet ([`Self::judged`]).
    pub(crate) fn go_on_after(&mut self, after: &After) -> Vec<Stmt> {
        self.key_locked = false;
        self.judged(after)
    }

    /// The candidate after `after` (a new transaction's first statement
    /// when a search goes on after a keyed judgement), skipping rows other claimers hold
    /// locked: a claimer never blocks on another and never locks more rows
    /// than it judges. It carries the whole state a claim writes back, and
    /// the instant it was chosen at.
    fn candidate(&self, after: &After, lock: KeyLock) -> Stmt {
        *self.last_after.borrow_mut() = after.clone();
        let (sql, params) = self
            .listing_with(self.scanning.get())
            .candidate_sql_and_params(after, lock, &self.schema, 1);
        Stmt::new("find a candidate", sql, params)
    }

    /// A batch's first statement: up to `limit` candidates from the top
    /// (of one key's runs, at most its limit), each row locked (`SKIP
    /// LOCKED`), each keyed one's key lock only tried, never waited for
    /// (module `keys`, "No deadlock": a transaction that waits for no key
    /// lock cannot be in a cycle of key-lock waits). [`Self::take_many`]
    /// judges them.
    pub(crate) fn many(&self, limit: usize) -> Stmt {
        self.counted.set(false);
        *self.last_after.borrow_mut() = After::None;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut listing = self.listing_with(false);
        listing.per_key = self.batch_keyed;
        let lock = if self.batch_keyed {
            KeyLock::TryEach
        } else {
            KeyLock::None
        };
        let (sql, params) =
            listing.candidate_sql_and_params(&After::None, lock, &self.schema, limit);
        Stmt::new("find candidates", sql, params)
    }

    /// Judges the candidates [`Self::many`] answered, in claim order, as
    /// [`Self::search`] judges one, until `taken` holds `max` runs: each
    /// run is claimed (pushed to `taken`, its save to `writes`) or passed.
    /// A keyed run is judged with its key's count, read under the key
    /// locks the statement took by one more statement
    /// ([`keys::count_many_stmt`]; one round trip for the whole batch),
    /// plus the runs of its key this batch already took; a keyed run whose
    /// key lock another claimer holds is passed, as a row another claimer
    /// holds locked. `Ok(None)`: the batch is full or no candidate is
    /// left; `Ok(Some(rows))`: every head was locked by another claimer
    /// (the row of NULLs, for [`Self::search`] to go on with the scan);
    /// `Ok(Some(vec![]))`: every candidate was judged and more may follow
    /// (search again from the top once the taken runs are saved).
    #[allow(
        clippy::too_many_arguments,
        reason = "the search's transaction, the rows, and the batch being filled"
    )]
    pub(crate) async fn take_many(
        &mut self,
        db: &Db,
        tx: &Tx,
        what: &str,
        rows: Vec<Row>,
        max: usize,
        taken: &mut Vec<(RunScope, Lease)>,
        writes: &mut Vec<Stmt>,
    ) -> Result<Option<Vec<Row>>> {
        if rows.is_empty() {
            return Ok(None);
        }
        if rows[0].get::<_, Option<String>>(0).is_none() {
            self.listing.slack = db.head_slack.contended();
            return Ok(Some(rows));
        }
        let mut now = match self.fixed {
            Some(n) => n,
            None => db.listed_now(&rows[0], self.fixed)?,
        };
        let mut listed = self.listed(rows, now)?;
        let mut rest = Vec::new();
        if !self.batch_keyed {
            // The earlier path: from the first keyed candidate on, the
            // rows are [`Self::search`]'s, one candidate at a time.
            if let Some(first) = listed
                .iter()
                .position(|l| l.2.lifecycle.concurrency.is_some())
            {
                rest = listed.split_off(first).into_iter().map(|l| l.4).collect();
            }
        }
        // The keyed candidates whose key lock this statement took, counted
        // under the locks (the instant read there judges the batch): each
        // one's count by position, `None` for the others.
        let locked: Vec<usize> = (0..listed.len())
            .filter(|&i| {
                listed[i].2.lifecycle.concurrency.is_some()
                    && keys::candidate_locked(&listed[i].4, Listing::CANDIDATE_LOCK) == Some(true)
            })
            .collect();
        let mut counts: Vec<Option<u32>> = vec![None; listed.len()];
        if !locked.is_empty() {
            self.key_locked = true;
            let keyed: Vec<(Key, String)> = locked
                .iter()
                .map(|&i| {
                    let c = listed[i].2.lifecycle.concurrency.as_ref();
                    (
                        Key::of(&listed[i].1),
                        c.map(|c| c.key.to_string()).unwrap_or_default(),
                    )
                })
                .collect();
            let named: Vec<(&Key, &str)> = keyed.iter().map(|(k, c)| (k, c.as_str())).collect();
            let replies = db
                .run(tx, what, vec![keys::count_many_stmt(&named, self.fixed)])
                .await?;
            let (at, n) = keys::counted_many(
                db,
                replies.first().map(Vec::as_slice).unwrap_or_default(),
                self.fixed,
                locked.len(),
            )?;
            for (&i, c) in locked.iter().zip(n) {
                counts[i] = Some(c);
            }
            if at != now {
                // Judged at the instant read under the locks: the rows
                // again, as the core reads them then.
                now = at;
                let rows = listed.into_iter().map(|l| l.4).collect();
                listed = self.listed(rows, now)?;
            }
        }
        if self.fixed.is_none() {
            self.query = ListQuery::claim_next(self.scope, self.filter, now)?;
            self.listing.now = Some(now.as_millis());
        }
        let full = self.judge_many(db, listed, now, &counts, max, taken, writes)?;
        if full {
            db.head_slack.calm();
            return Ok(None);
        }
        Ok(Some(rest))
    }

    /// [`Self::take_many`]'s judgement of the candidates in claim order at
    /// `now`, a keyed one with its key's count (`counts`, by position;
    /// `None`: its key's lock is another claimer's) plus the runs of its
    /// key this batch took.
    /// The runs taken or dead-lettered are saved by one statement, after
    /// their keys' history. True when the batch is full.
    #[allow(
        clippy::too_many_arguments,
        reason = "the candidates, their counts, and the batch being filled"
    )]
    fn judge_many(
        &mut self,
        db: &Db,
        listed: Vec<Candidate>,
        now: Timestamp,
        counts: &[Option<u32>],
        max: usize,
        taken: &mut Vec<(RunScope, Lease)>,
        writes: &mut Vec<Stmt>,
    ) -> Result<bool> {
        let mut saves = Vec::new();
        let mut of_key: HashMap<(String, String, String), u32> = HashMap::new();
        for (i, (_, scope, mut state, row, r)) in listed.into_iter().enumerate() {
            if taken.len() == max {
                break;
            }
            if !(self.query.matches(&row) && row.is_claimable(now)) {
                continue;
            }
            fill_state(&mut state, &r);
            let group = state.lifecycle.concurrency.as_ref().map(|c| {
                (
                    scope.project_id.to_string(),
                    scope.session_id.to_string(),
                    c.key.to_string(),
                )
            });
            let held = match (&group, counts[i]) {
                (None, _) => 0,
                (Some(g), Some(count)) => count.saturating_add(of_key.get(g).copied().unwrap_or(0)),
                // Its key's lock is another claimer's: passed, as a row
                // another claimer holds locked.
                (Some(_), None) => {
                    self.passed_locked = true;
                    continue;
                }
            };
            let key = Key::of(&scope);
            let before = state.top.clone();
            let claimed = apply_claim(&scope, &mut state, self.options, now, held)?;
            if matches!(
                claimed,
                ClaimOutcome::Acquired(_) | ClaimOutcome::Finished(_)
            ) {
                // Taken, or dead-lettered by this claim: written with the
                // batch either way (its key's history first).
                writes.extend(keys::holding_stmts(
                    db,
                    &key,
                    before.as_ref(),
                    &state,
                    Some(now),
                ));
                saves.push((key, state));
            }
            match claimed {
                ClaimOutcome::Acquired(lease) => {
                    if let Some(g) = group {
                        *of_key.entry(g).or_default() += 1;
                    }
                    taken.push((scope, lease));
                }
                ClaimOutcome::Finished(_) => self.changed = true,
                _ => {}
            }
        }
        if !saves.is_empty() {
            writes.push(save_many_stmt(&saves)?);
        }
        Ok(taken.len() == max)
    }

    /// A candidate statement's rows as the core reads them at `now`, in
    /// claim order (sorted here, so nothing depends on the statement's).
    fn listed(&self, rows: Vec<Row>, now: Timestamp) -> Result<Vec<Candidate>> {
        let mut listed = Vec::with_capacity(rows.len());
        for r in rows {
            let (scope, state, row) = listed_row(self.scope.tenant_id(), &r, now)?;
            let order = (
                row.claim_key(self.filter.order),
                scope.project_id.to_string(),
                scope.session_id.to_string(),
            );
            listed.push((order, scope, state, row, r));
        }
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }

    fn listing_with(&self, scan: bool) -> Listing<'a> {
        Listing {
            scope: self.scope,
            order: self.listing.order,
            statuses: None,
            claimed: self.listing.claimed,
            parks: self.listing.parks,
            runnable: true,
            scan,
            min_priority: None,
            slack: self.listing.slack,
            per_key: false,
            now: self.listing.now,
        }
    }

    /// Judges candidates, starting with `replies` (the first candidate
    /// statement's), fetching the next one in the open transaction each
    /// time one is not taken. `skip` is never taken (the run a hand-over's
    /// step holds locked: its row as read here predates the step). The
    /// taken run's write is added to `writes`, to commit; a run dead-lettered
    /// on the way is written at once (and [`Self::changed`] set).
    pub(crate) async fn search(
        &mut self,
        db: &Db,
        tx: &Tx,
        what: &str,
        mut replies: Vec<Vec<Row>>,
        skip: Option<&RunScope>,
        writes: &mut Vec<Stmt>,
    ) -> Result<Searched> {
        let mut judged = self.fixed;
        loop {
            // The key's count follows its candidate's statement.
            let count = if self.counted.get() {
                replies.pop()
            } else {
                None
            };
            let Some(r) = replies.pop().and_then(|rows| rows.into_iter().next()) else {
                return Ok(Searched::Taken(None));
            };
            if r.get::<_, Option<String>>(0).is_none() {
                // Every head is locked by another claimer (who may not
                // take it): the runs behind them are candidates too, so
                // the search goes on with the scan.
                if !self.scanning.get() {
                    self.listing.slack = db.head_slack.contended();
                }
                self.scanning.set(true);
                let after = self.last_after.borrow().clone();
                replies = db.run(tx, what, self.judged(&after)).await?;
                continue;
            }
            let key_lock = keys::candidate_locked(&r, Listing::CANDIDATE_LOCK);
            if key_lock == Some(true) {
                self.key_locked = true;
            }
            let now = match judged {
                Some(n) => n,
                None => {
                    let n = db.listed_now(&r, self.fixed)?;
                    self.query = ListQuery::claim_next(self.scope, self.filter, n)?;
                    self.listing.now = Some(n.as_millis());
                    judged = Some(n);
                    n
                }
            };
            let (run_scope, mut state, row) = listed_row(self.scope.tenant_id(), &r, now)?;
            let after = After::Row(
                row.claim_key(self.filter.order),
                run_scope.project_id.to_string(),
                run_scope.session_id.to_string(),
            );
            if key_lock == Some(false) {
                // Only tried, and another claimer holds the key's lock:
                // skipped, as a row another claimer holds locked.
                replies = db.run(tx, what, self.judged(&after)).await?;
                continue;
            }
            if skip == Some(&run_scope) {
                // The hand-over's own run (its lease lapsed): its row as
                // read here predates the step, so it is judged after the
                // step's commit, by a claim of its own.
                return Ok(Searched::AfterCommit);
            }
            let eligible = self.query.matches(&row) && row.is_claimable(now);
            if !eligible && key_lock == Some(true) {
                // Its key was locked for a candidate the core does not
                // take: the transaction ends here (releasing the lock).
                return Ok(Searched::KeyJudged(after));
            }
            let mut next = self.judged(&after);
            if eligible {
                fill_state(&mut state, &r);
                let key = Key::of(&run_scope);
                let ckey = state.lifecycle.concurrency.as_ref().map(|c| c.key.clone());
                let keyed = ckey.is_some();
                let judged = match (&ckey, key_lock, &count) {
                    // Locked by the candidate statement, counted by the
                    // statement after it.
                    (Some(ckey), Some(true), Some(rows)) => {
                        Some(keys::counted_candidate(db, rows, self.fixed, &key, ckey)?)
                    }
                    (Some(_), _, _) => self.count_key(db, tx, what, &key).await?,
                    (None, _, _) => Some((now, 0)),
                };
                if let Some((at, held)) = judged {
                    let before = state.top.clone();
                    match apply_claim(&run_scope, &mut state, self.options, at, held)? {
                        ClaimOutcome::Acquired(lease) => {
                            writes.extend(keys::holding_stmts(
                                db,
                                &key,
                                before.as_ref(),
                                &state,
                                Some(at),
                            ));
                            writes.push(save_stmt(&key, &state)?);
                            if !self.scanning.get() {
                                db.head_slack.calm();
                            }
                            return Ok(Searched::Taken(Some((run_scope, lease))));
                        }
                        ClaimOutcome::Finished(_) if keyed => {
                            // Dead-lettered under its key's lock: recorded
                            // with this transaction's commit.
                            writes.extend(keys::holding_stmts(
                                db,
                                &key,
                                before.as_ref(),
                                &state,
                                Some(at),
                            ));
                            writes.push(save_stmt(&key, &state)?);
                            self.changed = true;
                            return Ok(Searched::KeyJudged(after));
                        }
                        _ if keyed => return Ok(Searched::KeyJudged(after)),
                        ClaimOutcome::Finished(_) => {
                            // Dead-lettered by this claim: recorded (with the
                            // next candidate's search), then the next run.
                            next.insert(0, save_stmt(&key, &state)?);
                            for s in
                                keys::holding_stmts(db, &key, before.as_ref(), &state, Some(at))
                                    .into_iter()
                                    .rev()
                            {
                                next.insert(0, s);
                            }
                            self.changed = true;
                        }
                        _ => {}
                    }
                }
            }
            replies = db.run(tx, what, next).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HeadSlack;

    #[test]
    fn the_slack_doubles_on_contention_within_its_bounds_and_shrinks_by_one_when_calm() {
        let s = HeadSlack::new(true);
        assert_eq!(s.get(), 0, "no slack before any contention");
        s.calm();
        assert_eq!(s.get(), 0, "never below 0");
        assert_eq!(s.contended(), HeadSlack::FIRST);
        assert_eq!(s.contended(), 2 * HeadSlack::FIRST);
        s.calm();
        assert_eq!(s.get(), 2 * HeadSlack::FIRST - 1);
        for _ in 0..20 {
            s.contended();
        }
        assert_eq!(s.get(), HeadSlack::MAX, "never above the bound");
    }

    #[test]
    fn a_slack_turned_off_stays_0() {
        let s = HeadSlack::new(false);
        assert_eq!(s.contended(), 0);
        s.calm();
        assert_eq!(s.get(), 0);
    }
}
