//! An opened store: the `RunStore` every command uses, and what only its
//! backend can do (the directory store's scan, the PostgreSQL pool).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use runkeep::{RunStore, Timestamp};

use super::{DurabilityArg, PgAddress, StoreAddress};
use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;

pub use runkeep_fs::Diagnosis;

/// The backend behind an opened store, for what only it can do.
#[derive(Clone, Debug)]
pub enum Backend {
    /// In-process.
    Memory,
    /// One session's directory.
    Fs(Arc<runkeep_fs::FsStore>),
    /// A root of many sessions.
    FsRoot(Arc<runkeep_fs::FsRootStore>),
    /// A PostgreSQL schema.
    Postgres(Arc<runkeep_postgres::PgStore>, Box<PgTarget>),
    /// A `runkeep serve` API (the store behind it is the server's).
    Http,
}

/// What a PostgreSQL store was opened on, for what only it can do (the
/// doctor's checks, the soak's chaos).
#[derive(Clone, Debug)]
pub struct PgTarget {
    /// The address (its `Display` redacts).
    pub address: PgAddress,
    /// The options it was opened with (schema included).
    pub options: runkeep_postgres::PgOptions,
}

/// An opened store.
#[derive(Clone, Debug)]
pub struct OpenedStore {
    /// The address it was opened from.
    pub address: StoreAddress,
    /// The store, as every command uses it.
    pub store: Arc<dyn RunStore>,
    /// Which backend.
    pub backend: Backend,
    /// The durability it was opened with.
    pub(super) durability: DurabilityArg,
    /// The scope it was opened for (what a root's doctor scan covers).
    pub(super) scope: ScopeParts,
}

impl OpenedStore {
    /// A memory store opened around `store` (unit tests that prepare the
    /// store's contents, e.g. on a manual clock, before a command reads it).
    #[cfg(test)]
    pub fn memory_for_tests(store: Arc<dyn RunStore>) -> Self {
        Self {
            address: StoreAddress::Memory,
            store,
            backend: Backend::Memory,
            durability: DurabilityArg::ProcessCrash,
            scope: ScopeParts::parse("default", "default", "default")
                .expect("the default scope is valid"),
        }
    }

    /// The directory store's own scan; `None` for backends without one.
    /// Under a root it covers every session of the scope's prefix
    /// (`--tenant`/`--project`/`--session`, `''` widening it).
    pub fn diagnose(&self, now: Timestamp) -> Option<CliResult<Diagnosis>> {
        match &self.backend {
            Backend::Memory | Backend::Postgres(..) | Backend::Http => None,
            Backend::Fs(fs) => Some(fs.diagnose(now).map_err(CliError::from)),
            Backend::FsRoot(root) => Some(
                self.scope
                    .listing()
                    .and_then(|l| root.diagnose(&l, now).map_err(CliError::from)),
            ),
        }
    }

    /// What the session index needs for the session directories in the
    /// store's scope, summed (one process listing them all holds that many
    /// watches); `None` for backends without one.
    pub fn index_outlook(&self) -> Option<CliResult<runkeep_fs::IndexOutlook>> {
        let sum = |bases: Vec<PathBuf>| {
            let mut total = runkeep_fs::IndexOutlook::default();
            for base in bases {
                let o = runkeep_fs::IndexOutlook::of(&base);
                total.run_dirs += o.run_dirs;
                total.watches += o.watches;
                total.refused = total.refused.or(o.refused);
            }
            total
        };
        match &self.backend {
            Backend::Memory | Backend::Postgres(..) | Backend::Http => None,
            Backend::Fs(fs) => Some(Ok(sum(vec![fs.base_dir().to_path_buf()]))),
            Backend::FsRoot(root) => Some(self.scope.listing().and_then(|l| {
                let sessions = root.sessions(&l).map_err(CliError::from)?;
                Ok(sum(sessions
                    .iter()
                    .map(|(_, s)| s.base_dir().to_path_buf())
                    .collect()))
            })),
        }
    }

    /// True for a store that is one session's directory (`fs:`): it cannot
    /// list a wider scope than that session.
    pub fn is_single_session(&self) -> bool {
        matches!(self.backend, Backend::Fs(_))
    }

    /// `claims/N.json` when the run's top holding is a file whose body
    /// cannot be read (directory store only). A listing row shows such a
    /// holding like a release tombstone (holder `""`, expiry 0); this tells
    /// them apart, so an operator sees damage, not "free".
    pub fn unreadable_holding(&self, scope: &runkeep::RunScope) -> Option<String> {
        match &self.backend {
            Backend::Memory | Backend::Postgres(..) | Backend::Http => None,
            Backend::Fs(fs) => unreadable_holding(fs, scope),
            Backend::FsRoot(root) => match root.session_store(scope) {
                Ok(Some(fs)) => unreadable_holding(&fs, scope),
                _ => None,
            },
        }
    }

    /// The PostgreSQL store and what it was opened on.
    pub fn postgres(&self) -> Option<(&Arc<runkeep_postgres::PgStore>, &PgTarget)> {
        match &self.backend {
            Backend::Postgres(pg, target) => Some((pg, target)),
            _ => None,
        }
    }

    /// The store's directory, for a directory store (a root's own
    /// directory for `root:`).
    pub fn base_dir(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Memory | Backend::Postgres(..) | Backend::Http => None,
            Backend::Fs(fs) => Some(fs.base_dir()),
            Backend::FsRoot(root) => Some(root.root_dir()),
        }
    }
}

fn unreadable_holding(fs: &runkeep_fs::FsStore, scope: &runkeep::RunScope) -> Option<String> {
    match fs.top_holding(scope) {
        Ok(Some((runkeep::TopHolding::Unreadable { .. }, path))) => {
            let file = path.file_name()?.to_string_lossy().into_owned();
            Some(format!("claims/{file}"))
        }
        _ => None,
    }
}
