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

/// What a directory store's own scan found (see `runkeep doctor`).
#[derive(Clone, Debug, Default)]
pub struct DiskReport {
    /// Run directories scanned.
    pub runs_scanned: u64,
    /// Scratch files older than the scratch TTL.
    pub scratch_leftovers: Vec<PathBuf>,
    /// Transcripts ending in a partial line.
    pub torn_transcripts: Vec<PathBuf>,
    /// Checkpoint files that cannot be read, with the reason.
    pub damaged_checkpoints: Vec<(PathBuf, String)>,
    /// Claims directories holding more names than pruning keeps.
    pub oversized_claims: Vec<(PathBuf, usize)>,
    /// Leases past expiry that nobody reclaimed or released.
    pub expired_unreclaimed: Vec<(runkeep::RunScope, runkeep::LeaseSummary)>,
    /// Persisted fenced-out refusal counters, per run.
    pub fenced_out_refusals: Vec<(runkeep::RunScope, u64)>,
}

/// The backend behind an opened store, for what only it can do.
#[derive(Clone, Debug)]
pub enum Backend {
    /// In-process.
    Memory,
    /// A directory.
    Fs {
        /// The base directory.
        base_dir: PathBuf,
    },
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
            Some(d) => d.display().to_string(),
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
    /// The directory store's own scan; `None` for backends without one.
    pub fn diagnose(&self, now: Timestamp) -> Option<CliResult<DiskReport>> {
        match &self.backend {
            Backend::Memory => None,
            Backend::Fs { .. } => Some(fs::diagnose(self, now)),
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
            Backend::Fs { base_dir } => {
                let dir = base_dir.join(format!(".runkeep-doctor-{}-{suffix}", std::process::id()));
                std::fs::create_dir(&dir).map_err(|e| {
                    CliError::failed(format!("cannot create {}: {e}", dir.display()))
                })?;
                match fs::open(&dir, &parts, self.durability) {
                    Ok(store) => Ok(Scratch {
                        store,
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
    match address {
        StoreAddress::Memory => Ok(OpenedStore {
            address: address.clone(),
            store: Arc::new(MemoryStore::new()),
            backend: Backend::Memory,
            durability,
        }),
        StoreAddress::Fs(path) => {
            check_directory(path, create)?;
            let store = fs::open(path, scope, durability)?;
            Ok(OpenedStore {
                address: address.clone(),
                store,
                backend: Backend::Fs {
                    base_dir: path.clone(),
                },
                durability,
            })
        }
        StoreAddress::Postgres(_) => Err(CliError::config(format!(
            "store {address}: the PostgreSQL backend is not built into this binary yet"
        ))
        .hint("use --store fs:PATH (the default is fs:./runkeep-data) or --store memory:")),
    }
}

fn check_directory(path: &Path, create: bool) -> CliResult<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
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

/// The directory backend's wiring (the only place that names `runkeep_fs`).
mod fs {
    use super::*;

    pub(super) fn open(
        path: &Path,
        _scope: &ScopeParts,
        _durability: DurabilityArg,
    ) -> CliResult<Arc<dyn RunStore>> {
        Err(CliError::config(format!(
            "store fs:{}: the directory backend has not landed in this build yet",
            path.display()
        ))
        .hint("use --store memory: for now"))
    }

    pub(super) fn diagnose(_store: &OpenedStore, _now: Timestamp) -> CliResult<DiskReport> {
        Err(CliError::config(
            "the directory backend has not landed in this build yet",
        ))
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
