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
use crate::db::row::{save_stmt, Key, RunState};
use crate::db::tx::{Opening, Verdict, Wake, Writes};
use crate::db::Db;
use crate::listing::{fill_state, listed_row, After, Listing};
use tokio_postgres::Row;

pub(crate) fn apply_claim(
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
        0, // FIXME(issue 30, PostgreSQL helper): count the key under its lock
    )
}

pub(crate) async fn claim(
    db: &Db,
    scope: &RunScope,
    options: &ClaimOptions,
) -> Result<ClaimOutcome> {
    let opening = Opening {
        create: true,
        clock: options.now.is_none(),
        ..Opening::default()
    };
    db.write_locked("claim", scope, opening, |l| {
        let now = options.now.unwrap_or(l.now);
        let before = (l.run.top.clone(), l.run.lifecycle.clone());
        let outcome = apply_claim(scope, &mut l.run, options, now)?;
        if (l.run.top.clone(), l.run.lifecycle.clone()) == before {
            // Nothing changed.
            return Ok(Verdict::Keep(outcome));
        }
        Ok(Verdict::Write(outcome, Writes::default().save()))
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
    let (tx, replies) = db.begin(what, vec![search.first()]).await?;
    let mut writes = Vec::new();
    let taken = search
        .search(db, &tx, what, replies, None, &mut writes)
        .await?;
    if taken.is_some() || search.changed {
        db.commit(tx, what, writes).await?;
    }
    // Otherwise nothing changed: the transaction rolls back unwaited.
    Ok(taken)
}

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
        })
    }

    /// The first candidate's statement.
    pub(crate) fn first(&self) -> Stmt {
        self.candidate(&After::None)
    }

    /// The candidate after `after`, skipping rows other claimers hold
    /// locked: a claimer never blocks on another and never locks more rows
    /// than it judges. It carries the whole state a claim writes back, and
    /// the instant it was chosen at.
    fn candidate(&self, after: &After) -> Stmt {
        let (sql, params) = self.listing.sql_and_params(after, 1, true);
        Stmt::new("find a candidate", sql, params)
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
    ) -> Result<Option<(RunScope, Lease)>> {
        let mut judged = self.fixed;
        loop {
            let Some(r) = replies.pop().and_then(|rows| rows.into_iter().next()) else {
                return Ok(None);
            };
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
                row.key(self.filter.order),
                run_scope.project_id.to_string(),
                run_scope.session_id.to_string(),
            );
            let mut next = vec![self.candidate(&after)];
            if skip != Some(&run_scope) && self.query.matches(&row) && row.is_claimable(now) {
                fill_state(&mut state, &r);
                let key = Key::of(&run_scope);
                match apply_claim(&run_scope, &mut state, self.options, now)? {
                    ClaimOutcome::Acquired(lease) => {
                        writes.push(save_stmt(&key, &state)?);
                        return Ok(Some((run_scope, lease)));
                    }
                    ClaimOutcome::Finished(_) => {
                        // Dead-lettered by this claim: recorded (with the
                        // next candidate's search), then the next run.
                        next.insert(0, save_stmt(&key, &state)?);
                        self.changed = true;
                    }
                    _ => {}
                }
            }
            replies = db.run(tx, what, next).await?;
        }
    }
}
