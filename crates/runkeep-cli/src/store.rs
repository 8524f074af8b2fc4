//! Store addresses and opening a store.
//!
//! Every command reaches its backend through [`open_store`], so a new backend
//! (PostgreSQL is next) is one more arm here and no change to any command.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use runkeep::{MemoryStore, RunStore, Timestamp};

use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;

/// Where the runs live (`--store` / `RUNKEEP_STORE`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreAddress {
    /// `fs:PATH`: the directory backend.
    Fs(PathBuf),
    /// `memory:`: an empty in-process store (demos, doctor self-test).
    Memory,
    /// `postgres://…`: reserved for the PostgreSQL backend.
    Postgres(String),
}

impl FromStr for StoreAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory:" || s == "memory" {
            return Ok(StoreAddress::Memory);
        }
        if let Some(path) = s.strip_prefix("fs:") {
            if path.is_empty() {
                return Err("`fs:` needs a directory, e.g. fs:./runkeep-data".into());
            }
            return Ok(StoreAddress::Fs(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(StoreAddress::Postgres(s.to_string()));
        }
        Err(format!(
            "{s:?} is not a store address; use fs:PATH, memory: or postgres://… (did you mean fs:{s}?)"
        ))
    }
}

impl fmt::Display for StoreAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreAddress::Fs(p) => write!(f, "fs:{}", p.display()),
            StoreAddress::Memory => f.write_str("memory:"),
            // Never print a password.
            StoreAddress::Postgres(url) => match url.split_once("://").and_then(|(scheme, rest)| {
                rest.split_once('@')
                    .map(|(_, host)| format!("{scheme}://…@{host}"))
            }) {
                Some(redacted) => f.write_str(&redacted),
                None => f.write_str(url),
            },
        }
    }
}

/// How much a write survives (`--durability`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, clap::ValueEnum)]
pub enum DurabilityArg {
    /// Atomic publish: survives a process crash.
    #[default]
    ProcessCrash,
    /// fsync of files and directories: survives power loss.
    PowerLoss,
}

pub use runkeep_fs::Diagnosis;

/// The backend behind an opened store, for what only it can do.
#[derive(Clone, Debug)]
pub enum Backend {
    /// In-process.
    Memory,
    /// A directory.
    Fs(Arc<runkeep_fs::FsStore>),
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
    durability: DurabilityArg,
}

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

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
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
        }
    }

    /// The directory store's own scan; `None` for backends without one.
    pub fn diagnose(&self, now: Timestamp) -> Option<CliResult<Diagnosis>> {
        match &self.backend {
            Backend::Memory => None,
            Backend::Fs(fs) => Some(fs.diagnose(now).map_err(CliError::from)),
        }
    }

    /// `claims/N.json` when the run's top holding is a file whose body
    /// cannot be read (directory store only). A listing row shows such a
    /// holding like a release tombstone (holder `""`, expiry 0); this tells
    /// them apart, so an operator sees damage, not "free".
    pub fn unreadable_holding(&self, scope: &runkeep::RunScope) -> Option<String> {
        match &self.backend {
            Backend::Memory => None,
            Backend::Fs(fs) => match fs.top_holding(scope) {
                Ok(Some((runkeep::TopHolding::Unreadable { .. }, path))) => {
                    let file = path.file_name()?.to_string_lossy().into_owned();
                    Some(format!("claims/{file}"))
                }
                _ => None,
            },
        }
    }

    /// The store's directory, for a directory store.
    pub fn base_dir(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Memory => None,
            Backend::Fs(fs) => Some(fs.base_dir()),
        }
    }

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
            }),
            Backend::Fs(fs) => {
                let dir = fs
                    .base_dir()
                    .join(format!(".runkeep-doctor-{}-{suffix}", std::process::id()));
                std::fs::create_dir(&dir).map_err(|e| {
                    CliError::failed(format!("cannot create {}: {e}", dir.display()))
                })?;
                match fs::open(&dir, &parts, self.durability, false) {
                    Ok(store) => Ok(Scratch {
                        store: Arc::new(store),
                        scope,
                        dir: Some(dir),
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

/// Opens the store at `address` for `scope`. With `create`, a missing
/// directory is created (only commands that write new runs pass it); without,
/// a missing directory is a configuration error, so a typo in `--store` does
/// not silently create an empty store.
pub fn open_store(
    address: &StoreAddress,
    scope: &ScopeParts,
    durability: DurabilityArg,
    create: bool,
) -> CliResult<OpenedStore> {
    open_store_as(address, scope, durability, create, false)
}

/// Opens the store at `address` for reading only: nothing in its directory
/// is created, linked or removed, and any write is refused (the commands
/// that only read: `runs`, `show`, `checkpoints`, `events`).
pub fn open_store_read_only(
    address: &StoreAddress,
    scope: &ScopeParts,
    durability: DurabilityArg,
) -> CliResult<OpenedStore> {
    open_store_as(address, scope, durability, false, true)
}

fn open_store_as(
    address: &StoreAddress,
    scope: &ScopeParts,
    durability: DurabilityArg,
    create: bool,
    read_only: bool,
) -> CliResult<OpenedStore> {
    match address {
        StoreAddress::Memory => Ok(OpenedStore {
            address: address.clone(),
            store: Arc::new(MemoryStore::new()),
            backend: Backend::Memory,
            durability,
        }),
        StoreAddress::Fs(path) => {
            check_directory(path, create)?;
            let store = Arc::new(fs::open(path, scope, durability, read_only)?);
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::Fs(store),
                durability,
            })
        }
        StoreAddress::Postgres(_) => Err(CliError::config(format!(
            "store {address}: the PostgreSQL backend is not built into this binary yet"
        ))
        .hint("use --store fs:PATH (the default is fs:./runkeep-data) or --store memory:")),
    }
}

/// Refuses a store directory this process may not list and enter (exit 78):
/// every read would fail with permission denied, one run at a time.
pub fn check_readable(path: &Path) -> CliResult<()> {
    use rustix::fs::{access, Access};
    match access(path, Access::READ_OK | Access::EXEC_OK) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::ACCESS || e == rustix::io::Errno::PERM => {
            Err(CliError::config(format!(
                "cannot read store fs:{}: permission denied (EACCES): this user (uid {}) may not list the directory",
                path.display(),
                rustix::process::getuid().as_raw()
            ))
            .hint("run as the user that owns the store (the workers' user), or grant this user read and search permission on the directory (chmod/chgrp)"))
        }
        Err(e) => Err(CliError::config(format!(
            "cannot reach store fs:{}: {}",
            path.display(),
            std::io::Error::from(e)
        ))),
    }
}

fn check_directory(path: &Path, create: bool) -> CliResult<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => check_readable(path),
        Ok(_) => Err(
            CliError::config(format!("store fs:{} is not a directory", path.display()))
                .hint("point --store (or RUNKEEP_STORE) at a directory"),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            std::fs::create_dir_all(path).map_err(|e| {
                CliError::config(format!(
                    "cannot create store directory {}: {e}",
                    path.display()
                ))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CliError::config(format!(
            "no store at fs:{}: the directory does not exist",
            path.display()
        ))
        .hint("check --store / RUNKEEP_STORE, or create a demo store with `runkeep seed`")),
        Err(e) => Err(CliError::config(format!(
            "cannot reach store fs:{}: {e}",
            path.display()
        ))),
    }
}

/// The directory backend's wiring (the only place that names `runkeep_fs`'s
/// constructor).
mod fs {
    use runkeep_fs::{Attribution, Durability, FsOptions, FsStore};

    use super::*;

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
        let durability = match durability {
            DurabilityArg::ProcessCrash => Durability::ProcessCrash,
            DurabilityArg::PowerLoss => Durability::PowerLoss,
        };
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
                _ => "check --store / RUNKEEP_STORE and this user's permissions on the directory",
            };
            CliError::config(format!("cannot open store fs:{}: {}", path.display(), CliError::from(e).message)).hint(hint)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_passwords_never_print() {
        assert_eq!(
            "memory:".parse::<StoreAddress>().unwrap(),
            StoreAddress::Memory
        );
        assert_eq!(
            "fs:/tmp/x".parse::<StoreAddress>().unwrap(),
            StoreAddress::Fs(PathBuf::from("/tmp/x"))
        );
        assert!("fs:".parse::<StoreAddress>().is_err());
        assert!("./data"
            .parse::<StoreAddress>()
            .unwrap_err()
            .contains("did you mean fs:./data"));
        let pg: StoreAddress = "postgres://u:secret@db:5432/test".parse().unwrap();
        assert_eq!(pg.to_string(), "postgres://…@db:5432/test");
    }
}
