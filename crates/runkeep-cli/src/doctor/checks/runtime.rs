//! The `runtime` checks: invariants evaluated from what the store recorded.

use super::*;

/// `store.run:single-open-writer` (a run has at most one writer whose
/// writes the store accepts: a superseded holder is refused), evaluated
/// from the store's persisted fenced-out refusal counters. Refusals are `warn`, not
/// `fail`: each one is a superseded writer the store *stopped* (nothing it
/// wrote was accepted), and the counters are cumulative, so `fail` would
/// never clear; they still say a second writer was open, which an operator
/// should know about.
pub(super) async fn invariants(env: &Env) -> CliResult<Outcome> {
    const ID: &str = "store.run:single-open-writer";
    let Some(scan) = env.diagnosis().await else {
        return Ok(Outcome::skipped(format!(
            "{ID}: {} keeps no persisted refusal counters; nothing to evaluate",
            env.address
        )));
    };
    let scan = scan?;
    if scan.runs_scanned == 0 {
        return Ok(Outcome::skipped(format!(
            "{ID}: no run directories to evaluate"
        )));
    }
    let refused: Vec<_> = scan
        .fenced_out_refusals
        .iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    if refused.is_empty() {
        let pass = Outcome::pass(format!(
            "1/1 invariant holds — {ID} (0 fenced-out refusals recorded in {} run(s))",
            scan.runs_scanned
        ));
        return Ok(unproven(env, &scan, pass));
    }
    let total: u64 = refused.iter().map(|(_, n)| n).sum();
    Ok(Outcome::warn(format!(
        "{ID}: {total} superseded write(s) refused in {} run(s): {}",
        refused.len(),
        env.list(refused.iter().map(|(run, n)| format!("{} ({n})", run.run_id)))
    ))
    .remedy("a worker kept writing after its lease was taken over (stalled or partitioned); the store refused it. Renew more often than the TTL, or lengthen the TTL"))
}
