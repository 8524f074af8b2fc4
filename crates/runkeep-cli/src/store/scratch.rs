//! The doctor's write probe: a scratch location of the store's own backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use runkeep::RunStore;

use super::{fs, Backend, OpenedStore};
use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;

/// A scratch location to probe writes in without touching real runs: a
/// separate scope in memory; a hidden directory inside the store's directory
/// (same volume; listings only walk `run_*`), removed when dropped.
#[derive(Debug)]
pub struct Scratch {
    /// A store over the scratch location.
    pub store: Arc<dyn RunStore>,
    /// The probe run.
    pub scope: runkeep::RunScope,
    dir: Option<PathBuf>,
    pg: Option<Arc<runkeep_postgres::PgStore>>,
}

impl Scratch {
    /// Where the probe runs, for messages.
    pub fn describe(&self) -> String {
        match &self.dir {
            Some(d) => format!(
                "scratch directory {} (removed afterwards)",
                d.file_name().map_or_else(
                    || d.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                )
            ),
            None => format!("scratch scope {}", self.scope),
        }
    }
}

impl Scratch {
    /// Removes what the probe left behind: the directory (also on drop),
    /// or the probe run's rows in PostgreSQL (a store without a delete of
    /// runs keeps its events otherwise).
    pub async fn clean_up(&self) -> CliResult<()> {
        if let Some(pg) = &self.pg {
            let c = pg.pool().get().await.map_err(|e| {
                CliError::failed(format!("clean up the probe run: no connection: {e}"))
            })?;
            c.execute(
                "DELETE FROM runs WHERE tenant_id = $1 AND project_id = $2 AND session_id = $3 AND run_id = $4",
                &[
                    &self.scope.tenant_id.as_str(),
                    &self.scope.project_id.as_str(),
                    &self.scope.session_id.as_str(),
                    &self.scope.run_id.as_str(),
                ],
            )
            .await
            .map_err(|e| CliError::failed(format!("clean up the probe run: {e}")))?;
        }
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl OpenedStore {
    /// A scratch location of the same backend (doctor's write probe).
    pub fn scratch(&self) -> CliResult<Scratch> {
        let suffix = runkeep::id::random_suffix(8);
        let parts = ScopeParts {
            tenant: runkeep::TenantId::new("runkeep-doctor")?,
            project: Some(runkeep::ProjectId::new("probe")?),
            session: Some(runkeep::SessionId::new(format!("probe-{suffix}"))?),
        };
        let scope = parts.run(&runkeep::RunId::new(format!("run_probe_{suffix}"))?, None)?;
        match &self.backend {
            Backend::Memory => Ok(Scratch {
                store: self.store.clone(),
                scope,
                dir: None,
                pg: None,
            }),
            Backend::Postgres(pg, _) => Ok(Scratch {
                store: self.store.clone(),
                scope,
                dir: None,
                pg: Some(pg.clone()),
            }),
            Backend::Http => Err(CliError::usage(
                "a write probe cannot run through an http:// store: a token serves one tenant, and the probe writes in a scratch tenant of its own",
            )
            .hint("run the doctor where the server runs, against its --store")),
            Backend::Fs(_) | Backend::FsRoot(_) => {
                // A hidden directory (never an id, so never a run, tenant
                // or session) on the store's own volume.
                let dir = self
                    .base_dir()
                    .unwrap_or_else(|| Path::new("."))
                    .join(format!(".runkeep-doctor-{}-{suffix}", std::process::id()));
                std::fs::create_dir(&dir).map_err(|e| {
                    CliError::failed(format!("cannot create {}: {e}", dir.display()))
                })?;
                match fs::open(&dir, &parts, self.durability, false) {
                    Ok(store) => Ok(Scratch {
                        store: Arc::new(store),
                        scope,
                        dir: Some(dir),
                        pg: None,
                    }),
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&dir);
                        Err(e)
                    }
                }
            }
        }
    }
}
