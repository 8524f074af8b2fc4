//! The `integrity` checks: what the directory store's scan found damaged
//! or left behind in the run directories.

use super::*;
use crate::output::human_duration;

/// `store.scratch-leftovers`.
pub(super) async fn scratch_leftovers(env: &Env) -> CliResult<Outcome> {
    let ttl = human_duration(Diagnosis::SCRATCH_TTL);
    from_scan(env, |env, d| {
        if d.scratch_leftovers.is_empty() {
            return Outcome::pass(format!("no scratch file older than {ttl} in {} run(s)", d.runs_scanned));
        }
        Outcome::warn(format!(
            "{} scratch file(s) older than {ttl}: {}",
            d.scratch_leftovers.len(),
            env.list(d.scratch_leftovers.iter().map(|p| env.path(p)))
        ))
        .remedy("left by claimers that crashed mid-publish; harmless, swept by the run's next claim, or delete them")
    })
    .await
}

/// `store.torn-transcripts`.
pub(super) async fn torn_transcripts(env: &Env) -> CliResult<Outcome> {
    from_scan(env, |env, d| {
        if d.torn_transcripts.is_empty() {
            return Outcome::pass(format!("no torn transcript in {} run(s)", d.runs_scanned));
        }
        Outcome::warn(format!(
            "{} transcript(s) end in a partial line: {}",
            d.torn_transcripts.len(),
            env.list(d.torn_transcripts.iter().map(|p| env.path(p)))
        ))
        .remedy(format!("a writer crashed mid-append; readers skip the partial line and the next append removes it (or, if it is younger than {} and may still be in flight from a writer that takes no lock, terminates it)", human_duration(Diagnosis::TORN_GRACE)))
    })
    .await
}

/// `store.damaged-checkpoints`.
pub(super) async fn damaged_checkpoints(env: &Env) -> CliResult<Outcome> {
    from_scan(env, |env, d| {
        if d.damaged_checkpoints.is_empty() {
            return Outcome::pass(format!("every checkpoint readable in {} run(s)", d.runs_scanned));
        }
        Outcome::fail(format!(
            "{} checkpoint(s) cannot be read: {}",
            d.damaged_checkpoints.len(),
            env.list(d.damaged_checkpoints.iter().map(|(p, why)| format!("{} ({why})", env.path(p))))
        ))
        .remedy("their runs show as DAMAGED in `runkeep runs`; restore the files from a backup or delete them so the run resumes from an older checkpoint")
    })
    .await
}

/// `store.damaged-transcripts`.
pub(super) async fn damaged_transcripts(env: &Env) -> CliResult<Outcome> {
    from_scan(env, |env, d| {
        if d.damaged_transcripts.is_empty() {
            return Outcome::pass(format!(
                "no damage inside a transcript or audit trail in {} run(s)",
                d.runs_scanned
            ));
        }
        Outcome::fail(format!(
            "{} problem(s) inside transcripts: {}",
            d.damaged_transcripts.len(),
            env.list(d.damaged_transcripts.iter().map(|(p, why)| format!("{}: {why}", env.path(p))))
        ))
        .remedy("readers skip damaged records silently and strict reads refuse the file, so events are lost or ambiguous; restore the file from a backup, or copy the run's state to a new run id")
    })
    .await
}

/// `store.unreadable-paths`.
pub(super) async fn unreadable_paths(env: &Env) -> CliResult<Outcome> {
    from_scan(env, |env, d| {
        if d.unreadable.is_empty() {
            return Outcome::pass(format!(
                "every run directory readable in {} run(s)",
                d.runs_scanned
            ));
        }
        Outcome::fail(format!(
            "{} path(s) cannot be read by this user (uid {}), so what they hold was not examined: {}",
            d.unreadable.len(),
            rustix::process::geteuid().as_raw(),
            env.list(d.unreadable.iter().map(|(p, why)| format!("{} ({why})", env.path(p))))
        ))
        .remedy("workers running as this user cannot read these runs either; fix the ownership or modes (e.g. chown -R to the store's owner, chmod u+rwX), or run the doctor as the user the workers run as")
    })
    .await
}

/// `store.oversized-claims`.
pub(super) async fn oversized_claims(env: &Env) -> CliResult<Outcome> {
    from_scan(env, |env, d| {
        if d.oversized_claims.is_empty() {
            return Outcome::pass(format!(
                "every claims directory pruned in {} run(s)",
                d.runs_scanned
            ));
        }
        Outcome::warn(format!(
            "{} claims director(ies) hold more holdings than pruning keeps: {}",
            d.oversized_claims.len(),
            env.list(
                d.oversized_claims
                    .iter()
                    .map(|(p, n)| format!("{} ({n} entries)", env.path(p)))
            )
        ))
        .remedy("claims get slower as the directory grows; the next claim or release of the run prunes it (names younger than the prune grace period, 5 s by default, are kept by design and not counted here); if it keeps growing, a process that does not prune is claiming the run")
    })
    .await
}
