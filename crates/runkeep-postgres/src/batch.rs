//! `claim_next_batch` in one transaction: the runs `claim_next` would take
//! one after the other, claimed with one durable commit.
//!
//! The search is `claim_next`'s ([`NextSearch`]), run again after each
//! taken run in the same transaction: the taken run's write is sent first,
//! so the next candidate statement no longer sees it as claimable (a row
//! this transaction locked is not skipped by `SKIP LOCKED`, but its saved
//! holding makes it no candidate). A keyed candidate judged and not taken
//! ends the transaction, as in `claim_next` (module `keys`, "No
//! deadlock"): the runs taken so far commit with it, and the batch goes on
//! in a new transaction.

use runkeep::{ClaimNextFilter, ClaimOptions, Lease, ListingScope, Result, RunScope};

use crate::claims::{NextSearch, Searched};
use crate::db::Db;
use crate::listing::After;

pub(crate) async fn claim_next_batch(
    db: &Db,
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    options: &ClaimOptions,
    max: usize,
) -> Result<Vec<(RunScope, Lease)>> {
    let what = "claim_next_batch";
    runkeep::batch::check_size(what, max)?;
    let mut search = NextSearch::new(db, scope, filter, options)?;
    let mut taken = Vec::new();
    let mut first = search.judged(&After::None);
    loop {
        let (tx, mut replies) = db.begin(what, first).await?;
        let mut writes = Vec::new();
        let mut taken_here = 0;
        let went_on = loop {
            let searched = search
                .search(db, &tx, what, replies, None, &mut writes)
                .await?;
            match searched {
                Searched::Taken(Some(run)) => {
                    taken.push(run);
                    taken_here += 1;
                    if taken.len() == max {
                        break None;
                    }
                    // The taken run's save, then the next candidate (with
                    // its key's lock and count) from the top: the taken
                    // runs are no candidates once saved.
                    let next = search.judged(&After::None);
                    let n = next.len();
                    let mut stmts = std::mem::take(&mut writes);
                    stmts.extend(next);
                    replies = db.run(&tx, what, stmts).await?;
                    replies = replies.split_off(replies.len() - n);
                }
                Searched::Taken(None) => break None,
                Searched::KeyJudged(after) => break Some(after),
            }
        };
        if taken_here > 0 || search.changed {
            db.commit(tx, what, writes).await?;
            search.changed = false;
        }
        match went_on {
            None => return Ok(taken),
            Some(after) => first = search.go_on_after(&after),
        }
    }
}
