//! The operator subcommands (doctor lives in its own module).

use runkeep::{
    EvidenceStore, LeaseSummary, ParkState, ParkSummary, ReadEventsOptions, RunScope, RunStore,
    Timestamp,
};

use crate::error::{CliError, CliResult};
use crate::output::{relative, Cell, Color};
use crate::store::OpenedStore;

pub mod checkpoints;
pub mod events;
pub mod lease;
pub mod lifecycle;
pub mod migrate;
pub mod park;
pub mod prune;
pub mod runs;
pub mod schedule;
pub mod seed;
pub mod serve;
pub mod serve_demo;
pub mod show;
pub mod token;

/// True when the store holds anything for the run: a checkpoint, a lease, an
/// event or a run record. Reads only.
pub async fn run_exists(store: &dyn RunStore, scope: &RunScope) -> CliResult<bool> {
    let exists = async {
        if !store.list_checkpoints(scope).await?.is_empty()
            || store.lease(scope, Timestamp::now()).await?.is_some()
        {
            return Ok(true);
        }
        let head = ReadEventsOptions {
            limit: Some(1),
            ..ReadEventsOptions::default()
        };
        Ok(store.read_events(scope, &head).await?.last_seq > 0
            || store.read_run_record(scope).await?.is_some())
    };
    exists.await.map_err(read_error)
}

/// True when the error (or a source of it) is an OS "permission denied".
pub fn is_permission_denied(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// A store error reading a run, with a hint that fits: a run this user may
/// not read exists, so "unknown run" or "--new" advice would be wrong.
pub fn read_error(err: runkeep::Error) -> CliError {
    let denied = is_permission_denied(&err);
    let e = CliError::from(err);
    if denied {
        return e.hint(format!(
            "the run's files exist but this user (uid {}) may not read them (permission denied on the path above); run as the store's owner (the workers' user), or fix the run directory's ownership or modes",
            rustix::process::getuid().as_raw()
        ));
    }
    e
}

/// Refuses a run the store knows nothing about (a typo must not look like an
/// empty run).
pub async fn require_run(store: &dyn RunStore, scope: &RunScope) -> CliResult<()> {
    if run_exists(store, scope).await? {
        Ok(())
    } else {
        Err(unknown_run(scope))
    }
}

/// The error for a run the store knows nothing about.
pub fn unknown_run(scope: &RunScope) -> CliError {
    CliError::failed(format!("unknown run {}: the store holds nothing for it", scope))
        .hint("list the runs in this scope with `runkeep runs`; check --tenant/--project/--session and --parent")
}

/// A lease for humans, with the colour that tells its state.
pub fn lease_cell(lease: Option<&LeaseSummary>, now: Timestamp) -> Cell {
    match lease {
        None => Cell::colored("-", Color::Dim),
        Some(l) if l.holder.is_empty() => {
            Cell::colored(format!("free (fence {})", l.fence), Color::Dim)
        }
        Some(l) if l.expired => Cell::colored(
            format!(
                "{} · fence {} · expired {}",
                l.holder,
                l.fence,
                relative(l.expires_at, now)
            ),
            Color::Yellow,
        ),
        Some(l) => Cell::colored(
            format!(
                "{} · fence {} · expires {}",
                l.holder,
                l.fence,
                relative(l.expires_at, now)
            ),
            Color::Green,
        ),
    }
}

/// A run's claim for humans: [`lease_cell`], except that a holding whose
/// file cannot be read is named as damage rather than shown as free.
pub fn claim_cell(
    opened: &OpenedStore,
    scope: &RunScope,
    lease: Option<&LeaseSummary>,
    now: Timestamp,
) -> Cell {
    if lease.is_some_and(|l| l.holder.is_empty()) {
        if let Some(file) = opened.unreadable_holding(scope) {
            return Cell::colored(
                format!("unreadable holding {file} (counts as expired)"),
                Color::Red,
            );
        }
    }
    lease_cell(lease, now)
}

/// A park for humans, with the colour that tells its state.
pub fn park_cell(park: Option<&ParkSummary>, now: Timestamp) -> Cell {
    let Some(p) = park else {
        return Cell::colored("-", Color::Dim);
    };
    let (detail, color) = match p.state {
        ParkState::Outstanding => (
            match p.deadline_at {
                Some(d) => format!("due {}", relative(d, now)),
                None => "no deadline".to_string(),
            },
            Color::Blue,
        ),
        ParkState::Expired => (
            format!(
                "deadline {}",
                p.deadline_at.map(|d| relative(d, now)).unwrap_or_default()
            ),
            Color::Red,
        ),
        ParkState::Resolved => (
            format!(
                "answered {}",
                p.resolved_at.map(|d| relative(d, now)).unwrap_or_default()
            ),
            Color::Dim,
        ),
    };
    Cell::colored(
        format!("{} {} ({detail})", p.state.as_str(), p.request_type),
        color,
    )
}

/// The run's last event `seq` (0 when it has none).
pub async fn event_head<S: EvidenceStore + ?Sized>(store: &S, scope: &RunScope) -> CliResult<u64> {
    let head = ReadEventsOptions {
        limit: Some(1),
        ..ReadEventsOptions::default()
    };
    Ok(store.read_events(scope, &head).await?.last_seq)
}
