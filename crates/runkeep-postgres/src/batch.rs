//! `claim_next_batch` in one transaction: the runs `claim_next` would take
//! one after the other, claimed with one durable commit.
//!
//! The first statement asks for up to the batch's size of candidates at
//! once (of one key's runs, at most its limit), each row locked (`SKIP
//! LOCKED`) and each keyed candidate's key lock only tried, never waited
//! for (module `keys`, "No deadlock"). When it took key locks, one more
//! statement reads, under them, the instant and each keyed candidate's
//! count of its key's other live holders. The core then judges every
//! candidate in claim order (`NextSearch::take_many`), a keyed one with
//! its key's count plus the runs of that key the batch already took; a
//! keyed candidate whose key lock another claimer holds is passed, as a
//! row another claimer holds locked. A batch of runs without keys is one
//! round trip and the commit; with keys, one more.
//!
//! When the candidates ran out before the batch was full, the search is
//! `claim_next`'s ([`NextSearch`]), run again after each taken run in the
//! same transaction: the taken runs' writes are sent first, so the next
//! candidate statement no longer sees them as claimable (a row this
//! transaction locked is not skipped by `SKIP LOCKED`, but its saved
//! holding makes it no candidate). A keyed candidate judged and not taken
//! ends the transaction, as in `claim_next`: the runs taken so far commit
//! with it, and the batch goes on in a new transaction. A batch that took
//! runs and passed others because another claimer holds their keys
//! answers what it took instead of searching on (that search would wait
//! for the other claimer's key locks). `PgOptions::batch_keyed_runs` off,
//! the first statement takes no key lock and the search begins at the
//! first keyed candidate (the earlier path, kept to measure).

use runkeep::{ClaimNextFilter, ClaimOptions, Lease, ListingScope, Result, RunScope};

use crate::claims::{NextSearch, Searched};
use crate::db::pipeline::{Stmt, Tx};
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
    let mut first = vec![search.many(max)];
    let mut fast = true;
    loop {
        let (tx, mut replies) = db.begin(what, first).await?;
        let mut writes = Vec::new();
        let mut taken_here = 0;
        if std::mem::take(&mut fast) {
            let rows = replies.pop().unwrap_or_default();
            let left = search
                .take_many(db, &tx, what, rows, max, &mut taken, &mut writes)
                .await?;
            taken_here = taken.len();
            // Runs passed because another claimer holds their key: that
            // claimer's batch is taking runs of those keys now, and the
            // search after would wait for it; a batch that took runs
            // answers them instead (as runs other claimers hold locked are
            // passed, a batch is "up to" its size).
            let left = match left {
                Some(_) if search.passed_locked && taken_here > 0 => None,
                left => left,
            };
            match left {
                None => {
                    if taken_here > 0 || search.changed {
                        db.commit(tx, what, writes).await?;
                    }
                    return Ok(taken);
                }
                // Judged by `search`, from the keyed candidate on.
                Some(rows) if !rows.is_empty() => replies = vec![rows],
                // More may follow: the taken runs' saves, then the next
                // candidate from the top.
                Some(_) => replies = saved_then_next(db, &tx, &mut search, &mut writes).await?,
            }
        }
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
                    replies = saved_then_next(db, &tx, &mut search, &mut writes).await?;
                }
                Searched::Taken(None) => break None,
                Searched::KeyJudged(after) => break Some(after),
                // Only a search given a run to skip answers this.
                Searched::AfterCommit => {
                    return Err(runkeep::Error::corrupted(
                        "claim_next_batch: a search without a run to skip answered AfterCommit",
                    ))
                }
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

/// Sends the taken runs' saves (`writes`, emptied), then the next candidate
/// statement (with its key's lock and count) from the top: the taken runs
/// are no candidates once saved. Answers the candidate's replies.
async fn saved_then_next(
    db: &Db,
    tx: &Tx,
    search: &mut NextSearch<'_>,
    writes: &mut Vec<Stmt>,
) -> Result<Vec<Vec<tokio_postgres::Row>>> {
    let next = search.judged(&After::None);
    let n = next.len();
    let mut stmts = std::mem::take(writes);
    stmts.extend(next);
    let mut replies = db.run(tx, "claim_next_batch", stmts).await?;
    Ok(replies.split_off(replies.len() - n))
}
