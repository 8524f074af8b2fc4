//! The `leases` checks: leases nobody reclaimed, fences at their ceiling.

use super::*;

pub(super) async fn expired_unreclaimed(env: &Env) -> CliResult<Outcome> {
    let describe = |run: &str, holder: &str, fence: runkeep::Fence, expires_at: Timestamp| {
        format!(
            "{run} ({holder}, fence {fence}, expired {})",
            crate::output::relative(expires_at, env.now)
        )
    };
    let (expired, scan): (Vec<String>, Option<Arc<Diagnosis>>) = match env.diagnosis().await {
        Some(scan) => {
            let scan = scan?;
            if scan.runs_scanned == 0 {
                return Ok(Outcome::skipped("no run directories to inspect"));
            }
            let mut found: Vec<String> = scan
                .expired_unreclaimed
                .iter()
                .map(|(run, l)| describe(run.run_id.as_str(), &l.holder, l.fence, l.expires_at))
                .collect();
            found.extend(scan.unreadable_holdings.iter().map(|(run, p)| {
                format!(
                    "{} (unreadable holding {}; it counts as expired, the next claim lands above it)",
                    run.run_id,
                    holding_name(p)
                )
            }));
            (found, Some(scan))
        }
        None => {
            // Backends without a scan: walk the listing of the scope.
            let rows = listing_rows(env).await?;
            if rows.is_empty() {
                return Ok(Outcome::skipped(format!(
                    "no runs in {}",
                    env.scope.listing()?
                )));
            }
            let found = rows
                .iter()
                .filter_map(|r| {
                    r.claim
                        .as_ref()
                        .filter(|c| c.expired && !c.holder.is_empty() && c.fence.get() < MAX_FENCE)
                        .map(|c| {
                            describe(r.scope.run_id.as_str(), &c.holder, c.fence, c.expires_at)
                        })
                })
                .collect();
            (found, None)
        }
    };
    let outcome = if expired.is_empty() {
        Outcome::pass("no lease is past expiry unreclaimed")
    } else {
        Outcome::warn(format!("{} lease(s) expired and never reclaimed: {}", expired.len(), env.list(expired)))
            .remedy("their workers likely died; the runs are claimable (`runkeep runs --unclaimed`), release or reclaim them")
    };
    Ok(match scan {
        Some(scan) => unproven(env, &scan, outcome),
        None => outcome,
    })
}

/// Runs whose top holding sits at the fence ceiling: `Fence::next` refuses,
/// so no claim, renewal or release can ever be issued for them again.
pub(super) async fn fence_ceiling(env: &Env) -> CliResult<Outcome> {
    let (wedged, scan): (Vec<String>, Option<Arc<Diagnosis>>) = match env.diagnosis().await {
        Some(scan) => {
            let scan = scan?;
            if scan.runs_scanned == 0 {
                return Ok(Outcome::skipped("no run directories to inspect"));
            }
            let found = scan
                .fence_ceiling
                .iter()
                .map(|(run, p)| format!("{} ({})", run.run_id, holding_name(p)))
                .collect();
            (found, Some(scan))
        }
        None => {
            let rows = listing_rows(env).await?;
            if rows.is_empty() {
                return Ok(Outcome::skipped(format!(
                    "no runs in {}",
                    env.scope.listing()?
                )));
            }
            let found = rows
                .iter()
                .filter(|r| r.claim.as_ref().is_some_and(|c| c.fence.get() >= MAX_FENCE))
                .map(|r| r.scope.run_id.to_string())
                .collect();
            (found, None)
        }
    };
    let outcome = if wedged.is_empty() {
        Outcome::pass(format!("no run is at the fence ceiling {MAX_FENCE}"))
    } else {
        Outcome::fail(format!(
            "{} run(s) at the fence ceiling {MAX_FENCE}, wedged: no claim, renewal or release can be issued for them any more: {}",
            wedged.len(),
            env.list(wedged)
        ))
        .remedy("they are not claimable; copy each run's state to a new run id and point its work there, then archive or delete the old run")
    };
    Ok(match scan {
        Some(scan) => unproven(env, &scan, outcome),
        None => outcome,
    })
}
