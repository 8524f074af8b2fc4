//! The directory backend's wiring (the only place that names `runkeep_fs`'s
//! constructors): `fs:` (one session's `runs/`) and `root:` (many).

use std::path::Path;

use runkeep_fs::{Attribution, Durability, FsOptions, FsRootOptions, FsRootStore, FsStore};

use super::DurabilityArg;
use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;

fn durability_of(durability: DurabilityArg) -> Durability {
    match durability {
        DurabilityArg::ProcessCrash => Durability::ProcessCrash,
        DurabilityArg::PowerLoss => Durability::PowerLoss,
    }
}

/// Refuses `fs:PATH` on a session directory (one that holds `runs/`
/// and no run of its own): its runs are in `PATH/runs`.
pub(super) fn refuse_session_dir(path: &Path) -> CliResult<()> {
    let runs = path.join(runkeep_fs::SESSION_RUNS_DIR);
    let holds_runs = std::fs::symlink_metadata(&runs).is_ok_and(|m| m.is_dir());
    let holds_a_run = std::fs::read_dir(path).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            runkeep_fs::is_listed_run_name(&e.file_name().to_string_lossy())
                && e.file_type().is_ok_and(|t| t.is_dir())
        })
    });
    if holds_runs && !holds_a_run {
        return Err(CliError::config(format!(
            "store fs:{} is a session directory (it holds runs/), not a session's runs/ directory",
            path.display()
        ))
        .hint(format!(
            "use --store fs:{} for this session, or --store root:DIR for a root of many sessions",
            runs.display()
        )));
    }
    Ok(())
}

/// Opens a root of many sessions.
pub(super) fn open_root(
    path: &Path,
    durability: DurabilityArg,
    read_only: bool,
) -> CliResult<FsRootStore> {
    FsRootStore::open(
        path,
        FsRootOptions {
            durability: durability_of(durability),
            read_only,
            ..FsRootOptions::default()
        },
    )
    .map_err(|e| {
        let hint = match e {
            runkeep::Error::InvalidInput { .. } => {
                "a root holds <tenant>/<project>/<session>/runs/; give one session's runs/ directory as fs:PATH, or give the root an empty directory"
            }
            _ => "check --store / RUNKEEP_STORE and this user's permissions on the directory",
        };
        CliError::config(format!(
            "cannot open store root:{}: {}",
            path.display(),
            CliError::from(e).message
        ))
        .hint(hint)
    })
}

/// Opens a directory store. The scope is its attribution when complete
/// (a listing of a wider prefix then has none and is refused by the store).
pub(super) fn open(
    path: &Path,
    scope: &ScopeParts,
    durability: DurabilityArg,
    read_only: bool,
) -> CliResult<FsStore> {
    let attribution = match (&scope.project, &scope.session) {
        (Some(project), Some(session)) => Some(Attribution {
            tenant_id: scope.tenant.clone(),
            project_id: project.clone(),
            session_id: session.clone(),
        }),
        _ => None,
    };
    let durability = durability_of(durability);
    FsStore::open(
        path,
        FsOptions {
            attribution,
            durability,
            read_only,
            ..FsOptions::default()
        },
    ).map_err(|e| {
        let hint = match e {
            runkeep::Error::Unsupported { .. } => {
                "put the store on a filesystem with hard links (ext4, xfs, btrfs, tmpfs); `runkeep doctor` shows what fails"
            }
            runkeep::Error::InvalidInput { .. } => {
                "a root of many sessions is opened with --store root:PATH; fs:PATH takes one session's runs/ directory"
            }
            _ => "check --store / RUNKEEP_STORE and this user's permissions on the directory",
        };
        CliError::config(format!("cannot open store fs:{}: {}", path.display(), CliError::from(e).message)).hint(hint)
    })
}
