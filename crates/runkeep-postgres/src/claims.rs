//! Claims: `claim`, `release`, `lease` and `claim_next`'s candidate search
//! (one `SKIP LOCKED` candidate at a time, judged by the core).

use runkeep::lease::decide_release;
use runkeep::lifecycle;
use runkeep::listing::ListQuery;
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Fence, Lease, LeaseSummary,
    ListingScope, Result, RunScope, Timestamp, TopHolding,
};

use crate::listing::{fill_state, listed_row, After, Listing};
use crate::pipeline::Stmt;
use crate::row::{Key, RunState};
use crate::store::PgStore;
use crate::tx::{Opening, Verdict, Writes};

impl PgStore {
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
        )
    }
}

pub(crate) async fn claim(
    store: &PgStore,
    scope: &RunScope,
    options: &ClaimOptions,
) -> Result<ClaimOutcome> {
    let opening = Opening {
        create: true,
        clock: options.now.is_none(),
        ..Opening::default()
    };
    store
        .write_locked("claim", scope, opening, |l| {
            let now = options.now.unwrap_or(l.now);
            let before = (l.run.top.clone(), l.run.lifecycle.clone());
            let outcome = PgStore::apply_claim(scope, &mut l.run, options, now)?;
            if (l.run.top.clone(), l.run.lifecycle.clone()) == before {
                // Nothing changed.
                return Ok(Verdict::Keep(outcome));
            }
            Ok(Verdict::Write(outcome, Writes::default().save()))
        })
        .await
}

pub(crate) async fn release(store: &PgStore, scope: &RunScope, fence: Fence) -> Result<bool> {
    store
        .write_locked("release", scope, Opening::default(), |l| {
            if !l.found {
                return Ok(Verdict::Keep(false));
            }
            match decide_release(&scope.run_id, l.run.top.as_ref(), fence)? {
                Some(tomb) => {
                    l.run.top = Some(TopHolding::Released { fence: tomb });
                    Ok(Verdict::Write(true, Writes::default().save().notify(false)))
                }
                None => Ok(Verdict::Keep(false)),
            }
        })
        .await
}

pub(crate) async fn lease(
    store: &PgStore,
    scope: &RunScope,
    now: Timestamp,
) -> Result<Option<LeaseSummary>> {
    let c = store.conn("lease").await?;
    Ok(store
        .read_state(&c, scope, &Key::of(scope))
        .await?
        .and_then(|r| r.top.map(|t| t.summary(now))))
}

pub(crate) async fn claim_next(
    store: &PgStore,
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    options: &ClaimOptions,
) -> Result<Option<(RunScope, Lease)>> {
    let what = "claim_next";
    // The instant: the caller's (or the test clock's), else the
    // server's, read by the candidate statement itstore. The filter is
    // checked before anything is sent (the instant does not change
    // what is valid).
    let fixed = store.fixed_now(options.now);
    let mut query = ListQuery::claim_next(scope, filter, fixed.unwrap_or(store.now()))?;
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
    let (tx, mut replies) = store
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
                let n = store.listed_now(&r, fixed)?;
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
            match PgStore::apply_claim(&run_scope, &mut state, options, now)? {
                ClaimOutcome::Acquired(lease) => {
                    store
                        .commit(tx, what, vec![PgStore::save_stmt(&key, &state)?])
                        .await?;
                    return Ok(Some((run_scope, lease)));
                }
                ClaimOutcome::Finished(_) => {
                    // Dead-lettered by this claim: recorded (with the
                    // next candidate's search), then the next run.
                    next.insert(0, PgStore::save_stmt(&key, &state)?);
                    changed = true;
                }
                _ => {}
            }
        }
        replies = store.run(&tx, what, next).await?;
    }
    if changed {
        store.commit(tx, what, Vec::new()).await?;
    }
    // Otherwise nothing changed: the transaction rolls back unwaited.
    Ok(None)
}
