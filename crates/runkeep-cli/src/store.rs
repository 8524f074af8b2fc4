//! Store addresses and opening a store.
//!
//! Every command reaches its backend through [`open_store`], so a new backend
//! is one more arm here and no change to any command.
//!
//! # Directory addresses
//!
//! - `root:PATH` (the default, `root:./runkeep-data`): a root of many
//!   tenants, `PATH/<tenant>/<project>/<session>/runs/`
//!   ([`runkeep_fs::FsRootStore`]). `--tenant`/`--project`/`--session` pick
//!   the directory, so two tenants can never see each other's runs, and a
//!   listing may cover a whole project or tenant.
//! - `fs:PATH`: one session's `runs/` directory ([`runkeep_fs::FsStore`]),
//!   exactly the reference's `baseDir`, for sharing a session with the
//!   reference implementation. The scope flags only label it.
//!
//! `fs:` keeps the meaning it always had (an address written for it still
//! opens the same directory, and a root given to it is refused by name);
//! the root is a new form rather than a new meaning of an old one, so no
//! existing address silently changes what it reads. Each refuses the
//! other's directory, saying which form to use.

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
    /// `fs:PATH`: one session's `runs/` directory.
    Fs(PathBuf),
    /// `root:PATH`: a root of many tenants, projects and sessions.
    Root(PathBuf),
    /// `memory:`: an empty in-process store (demos, doctor self-test).
    Memory,
    /// `postgres://…` or `postgresql://…`: the PostgreSQL backend.
    Postgres(PgAddress),
    /// `http://HOST:PORT` or `https://…`: a `runkeep serve` API, through
    /// [`runkeep_server::client::HttpStore`]; its bearer token comes from
    /// `--token` / `RUNKEEP_TOKEN` (never from the URL, never printed).
    Http(HttpAddress),
}

/// A `runkeep serve` address: the base URL and the bearer token to send
/// (`--token` / `RUNKEEP_TOKEN`, attached by [`with_token`]). The token is
/// secret: `Display` shows the URL only, `Debug` never the token, and
/// every printed line passes through [`redact`].
#[derive(Clone, PartialEq, Eq)]
pub struct HttpAddress {
    url: String,
    token: Option<String>,
}

impl fmt::Debug for HttpAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HttpAddress({}, token {})",
            self.url,
            if self.token.is_some() { "set" } else { "unset" }
        )
    }
}

impl HttpAddress {
    /// `http://HOST:PORT` without a trailing `/`. A URL carrying user
    /// information (`http://user:secret@…`) is refused: the token goes in
    /// `RUNKEEP_TOKEN` or `--token`.
    fn parse(s: &str) -> Result<Self, String> {
        let rest = s.split_once("://").map_or(s, |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or("");
        if let Some(at) = authority.rfind('@') {
            // clap quotes the refused value: register the credentials so
            // the error line redacts them.
            let userinfo = &authority[..at];
            let mut secrets = vec![userinfo.to_string(), percent_decode(userinfo)];
            if let Some((_, password)) = userinfo.split_once(':') {
                secrets.push(password.to_string());
                secrets.push(percent_decode(password));
            }
            secrets.retain(|s| !s.is_empty());
            register_secrets(secrets);
            return Err(
                "an http:// store address carries no credentials; pass the token in RUNKEEP_TOKEN or --token".into(),
            );
        }
        if authority.is_empty() {
            return Err("`http://` needs a host and port, e.g. http://127.0.0.1:7420".into());
        }
        Ok(Self {
            url: s.trim_end_matches('/').to_string(),
            token: None,
        })
    }

    /// The base URL (not secret).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The token, when one was given (secret: hand it to a child process in
    /// its environment, never on its command line).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same server with `token`.
    pub fn with_token(&self, token: &str) -> Self {
        register_secrets(vec![token.to_string()]);
        Self {
            url: self.url.clone(),
            token: Some(token.to_string()),
        }
    }
}

/// Attaches `--token` / `RUNKEEP_TOKEN` to an `http://` address (other
/// stores take no token: a `RUNKEEP_TOKEN` left in the environment does not
/// change what they open).
pub fn with_token(address: &StoreAddress, token: Option<&str>) -> StoreAddress {
    match (address, token) {
        (StoreAddress::Http(h), Some(t)) if !t.is_empty() => StoreAddress::Http(h.with_token(t)),
        _ => address.clone(),
    }
}

/// A PostgreSQL address: the connection URL (it may carry a password, so
/// it is never printed: `Display` redacts it) and the schema named by its
/// `schema=` query parameter, if any (removed from the URL the driver sees).
#[derive(Clone, PartialEq, Eq)]
pub struct PgAddress {
    /// The URL as given (secret: only the driver and child processes'
    /// environment see it).
    original: String,
    /// The URL without `schema=`, for the driver.
    url: String,
    /// `?schema=NAME`, when given.
    schema: Option<String>,
}

impl fmt::Debug for PgAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgAddress({})", redact_url(&self.original))
    }
}

/// The schema a PostgreSQL store uses when neither `?schema=` nor
/// `--pg-schema` names one.
pub const DEFAULT_PG_SCHEMA: &str = "runkeep";

impl PgAddress {
    fn parse(s: &str) -> Self {
        let (base, query) = match s.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (s, None),
        };
        let mut schema = None;
        let mut kept = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("schema", v)) => schema = Some(percent_decode(v)),
                _ if pair.is_empty() => {}
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let address = Self {
            original: s.to_string(),
            url,
            schema,
        };
        register_secrets(address.secrets());
        address
    }

    /// The URL the driver connects with (secret).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL exactly as given (secret), to hand to a child process in its
    /// environment (never on its command line, which `ps` shows).
    pub fn original(&self) -> &str {
        &self.original
    }

    /// The schema `?schema=` names.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The same server and database with another `schema=` (the soak's
    /// fresh schema).
    pub fn with_schema(&self, schema: &str) -> Self {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        Self::parse(&format!("{}{sep}schema={schema}", self.url))
    }

    /// The same address with `application_name=NAME` unless one is set.
    pub fn with_application_name(&self, name: &str) -> Self {
        if self.url.contains("application_name=") {
            return self.clone();
        }
        let sep = if self.original.contains('?') {
            '&'
        } else {
            '?'
        };
        Self::parse(&format!("{}{sep}application_name={name}", self.original))
    }

    /// The passwords in the URL: the userinfo's and `password=`'s, as
    /// written and percent-decoded.
    fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        let (base, query) = match self.original.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (self.original.as_str(), None),
        };
        if let Some((_, rest)) = base.split_once("://") {
            if let Some(at) = rest.rfind('@') {
                if let Some((_, password)) = rest[..at].split_once(':') {
                    out.push(password.to_string());
                }
            }
        }
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if let Some(("password", v)) = pair.split_once('=') {
                out.push(v.to_string());
            }
        }
        let decoded: Vec<String> = out.iter().map(|s| percent_decode(s)).collect();
        out.extend(decoded);
        out.retain(|s| !s.is_empty());
        out
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// `scheme://…@host…` with every `password=` value replaced by `…`: the
/// only form of a PostgreSQL URL this binary prints.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://…".into();
    };
    // Everything up to the last `@` is user information (over-redacting a
    // query value holding `@` is safe; printing a password is not).
    let rest = match rest.rfind('@') {
        Some(at) => format!("…@{}", &rest[at + 1..]),
        None => rest.to_string(),
    };
    let rest = match rest.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k == "password" => format!("{k}=…"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => rest,
    };
    format!("{scheme}://{rest}")
}

/// Every password met in a `--store` URL of this process.
static SECRETS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn register_secrets(secrets: Vec<String>) {
    let mut all = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    for s in secrets {
        if !all.contains(&s) {
            all.push(s);
        }
    }
    // Longest first, so a secret containing another is replaced whole.
    all.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every password of a store URL this process parsed replaced
/// by `…`: the last line of defence of every error and report line (a
/// driver message quoting its connection string would otherwise print it).
pub fn redact(text: &str) -> String {
    let all = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = text.to_string();
    for s in all.iter() {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "…");
        }
    }
    out
}

impl FromStr for StoreAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory:" || s == "memory" {
            return Ok(StoreAddress::Memory);
        }
        if let Some(path) = s.strip_prefix("fs:") {
            if path.is_empty() {
                return Err(
                    "`fs:` needs one session's runs/ directory, e.g. fs:./session/runs".into(),
                );
            }
            return Ok(StoreAddress::Fs(PathBuf::from(path)));
        }
        if let Some(path) = s.strip_prefix("root:") {
            if path.is_empty() {
                return Err("`root:` needs a directory, e.g. root:./runkeep-data".into());
            }
            return Ok(StoreAddress::Root(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(StoreAddress::Postgres(PgAddress::parse(s)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return HttpAddress::parse(s).map(StoreAddress::Http);
        }
        // Never echo what might be a connection string with a password
        // (clap quotes the value it refused: register its password so the
        // error line redacts it).
        if s.contains("://") {
            register_secrets(
                PgAddress {
                    original: s.to_string(),
                    url: String::new(),
                    schema: None,
                }
                .secrets(),
            );
        }
        let shown = if s.contains('@') || s.contains("password") {
            "the given address".to_string()
        } else {
            format!("{s:?}")
        };
        Err(format!(
            "{shown} is not a store address; use root:PATH, fs:PATH, memory:, postgres://… or http://HOST:PORT{}",
            if shown.starts_with('"') {
                format!(" (did you mean root:{s}, or fs:{s} for one session's runs/ directory?)")
            } else {
                String::new()
            }
        ))
    }
}

impl fmt::Display for StoreAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreAddress::Fs(p) => write!(f, "fs:{}", p.display()),
            StoreAddress::Root(p) => write!(f, "root:{}", p.display()),
            StoreAddress::Memory => f.write_str("memory:"),
            // Never print a password.
            StoreAddress::Postgres(pg) => f.write_str(&redact_url(&pg.original)),
            // The URL only: the token is never part of it.
            StoreAddress::Http(h) => f.write_str(&h.url),
        }
    }
}

impl StoreAddress {
    /// The directory of a directory store (`fs:` or `root:`).
    pub fn directory(&self) -> Option<&Path> {
        match self {
            StoreAddress::Fs(p) | StoreAddress::Root(p) => Some(p),
            _ => None,
        }
    }
}

/// Applies `--pg-schema` to a PostgreSQL address. Refused (exit 64): a
/// schema for another backend, or one that contradicts the URL's
/// `?schema=`.
pub fn with_pg_schema(address: &StoreAddress, schema: Option<&str>) -> CliResult<StoreAddress> {
    let Some(schema) = schema else {
        return Ok(address.clone());
    };
    match address {
        StoreAddress::Postgres(pg) => match pg.schema() {
            Some(s) if s != schema => Err(CliError::usage(format!(
                "--pg-schema {schema} contradicts the store URL's schema={s}"
            ))
            .hint("name the schema once: in the URL (?schema=NAME) or with --pg-schema")),
            Some(_) => Ok(address.clone()),
            None => Ok(StoreAddress::Postgres(pg.with_schema(schema))),
        },
        other => Err(CliError::usage(format!(
            "--pg-schema {schema} applies to a postgres:// store, not {other}"
        ))
        .hint("drop --pg-schema (or RUNKEEP_PG_SCHEMA), or pass --store postgres://…")),
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
    durability: DurabilityArg,
    /// The scope it was opened for (what a root's doctor scan covers).
    scope: ScopeParts,
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

fn unreadable_holding(fs: &runkeep_fs::FsStore, scope: &runkeep::RunScope) -> Option<String> {
    match fs.top_holding(scope) {
        Ok(Some((runkeep::TopHolding::Unreadable { .. }, path))) => {
            let file = path.file_name()?.to_string_lossy().into_owned();
            Some(format!("claims/{file}"))
        }
        _ => None,
    }
}

/// How a command opens its store.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OpenMode {
    /// The store must exist: a missing directory, or a PostgreSQL schema
    /// that was never migrated, is a configuration error (exit 78), so a
    /// typo in `--store` does not silently create an empty store.
    Existing,
    /// Commands that write new runs (`seed`, `soak`): a missing directory is
    /// created; a PostgreSQL schema is migrated.
    Create,
    /// Reading only: nothing is created, linked or removed, and any write
    /// is refused (a directory opened read-only; a PostgreSQL session with
    /// `default_transaction_read_only`). The commands that only read:
    /// `runs`, `show`, `checkpoints`, `events`.
    ReadOnly,
    /// The doctor: open whatever is there without judging it (a PostgreSQL
    /// schema that is missing or newer is a finding of its checks).
    Examine,
}

/// Opens the store at `address` for `scope`. With `create`, a missing
/// directory is created (only commands that write new runs pass it); without,
/// a missing directory is a configuration error, so a typo in `--store` does
/// not silently create an empty store.
pub async fn open_store(
    address: &StoreAddress,
    scope: &ScopeParts,
    durability: DurabilityArg,
    create: bool,
) -> CliResult<OpenedStore> {
    let mode = if create {
        OpenMode::Create
    } else {
        OpenMode::Existing
    };
    open_store_as(address, scope, durability, mode).await
}

/// Opens the store at `address` for reading only (see [`OpenMode::ReadOnly`]).
pub async fn open_store_read_only(
    address: &StoreAddress,
    scope: &ScopeParts,
    durability: DurabilityArg,
) -> CliResult<OpenedStore> {
    open_store_as(address, scope, durability, OpenMode::ReadOnly).await
}

/// Opens the store at `address` in `mode`.
pub async fn open_store_as(
    address: &StoreAddress,
    scope: &ScopeParts,
    durability: DurabilityArg,
    mode: OpenMode,
) -> CliResult<OpenedStore> {
    match address {
        StoreAddress::Memory => Ok(OpenedStore {
            address: address.clone(),
            store: Arc::new(MemoryStore::new()),
            backend: Backend::Memory,
            durability,
            scope: scope.clone(),
        }),
        StoreAddress::Fs(path) => {
            check_directory(address, path, mode == OpenMode::Create)?;
            fs::refuse_session_dir(path)?;
            let store = Arc::new(fs::open(
                path,
                scope,
                durability,
                mode == OpenMode::ReadOnly,
            )?);
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::Fs(store),
                durability,
                scope: scope.clone(),
            })
        }
        StoreAddress::Root(path) => {
            check_directory(address, path, mode == OpenMode::Create)?;
            let store = Arc::new(fs::open_root(path, durability, mode == OpenMode::ReadOnly)?);
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::FsRoot(store),
                durability,
                scope: scope.clone(),
            })
        }
        StoreAddress::Http(h) => {
            let store = Arc::new(http::open(h, scope).await?);
            Ok(OpenedStore {
                address: address.clone(),
                store,
                backend: Backend::Http,
                durability,
                scope: scope.clone(),
            })
        }
        StoreAddress::Postgres(pg) => {
            let (store, target) = pg::open(pg, mode).await?;
            Ok(OpenedStore {
                address: address.clone(),
                store: store.clone(),
                backend: Backend::Postgres(store, target),
                durability,
                scope: scope.clone(),
            })
        }
    }
}

/// Refuses a store directory this process may not list and enter (exit 78):
/// every read would fail with permission denied, one run at a time.
pub fn check_readable(address: &StoreAddress, path: &Path) -> CliResult<()> {
    use rustix::fs::{access, Access};
    match access(path, Access::READ_OK | Access::EXEC_OK) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::ACCESS || e == rustix::io::Errno::PERM => {
            Err(CliError::config(format!(
                "cannot read store {address}: permission denied (EACCES): this user (uid {}) may not list the directory",
                rustix::process::getuid().as_raw()
            ))
            .hint("run as the user that owns the store (the workers' user), or grant this user read and search permission on the directory (chmod/chgrp)"))
        }
        Err(e) => Err(CliError::config(format!(
            "cannot reach store {address}: {}",
            std::io::Error::from(e)
        ))),
    }
}

fn check_directory(address: &StoreAddress, path: &Path, create: bool) -> CliResult<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => check_readable(address, path),
        Ok(_) => Err(
            CliError::config(format!("store {address} is not a directory"))
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
            "no store at {address}: the directory does not exist"
        ))
        .hint("check --store / RUNKEEP_STORE, or create a demo store with `runkeep seed`")),
        Err(e) => Err(CliError::config(format!(
            "cannot reach store {address}: {e}"
        ))),
    }
}

/// The directory backend's wiring (the only place that names `runkeep_fs`'s
/// constructors).
mod fs {
    use runkeep_fs::{Attribution, Durability, FsOptions, FsRootOptions, FsRootStore, FsStore};

    use super::*;

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
}

/// `--pg-pool-size`: the pool of a PostgreSQL store opened after it is set
/// (`None`: the command's default).
static PG_POOL_SIZE: std::sync::Mutex<Option<usize>> = std::sync::Mutex::new(None);
/// The command's default pool (`serve`, `soak-worker`); 4 when unset.
static PG_POOL_DEFAULT: std::sync::Mutex<Option<usize>> = std::sync::Mutex::new(None);

/// The pool a command opens a PostgreSQL store with when `--pg-pool-size`
/// is not given: one command needs a few connections.
pub const DEFAULT_PG_POOL_SIZE: usize = 4;

/// `--pg-pool-size N`: at least 1.
pub fn parse_pg_pool_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("the PostgreSQL pool needs at least 1 connection (0 would refuse every operation); pass 1 or more".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of connections (pass 1 or more)")),
    }
}

/// Sets `--pg-pool-size` (given or not) for every PostgreSQL store opened
/// after this call.
pub fn set_pg_pool_size(n: Option<usize>) {
    *PG_POOL_SIZE.lock().unwrap_or_else(|p| p.into_inner()) = n;
}

/// Sets the pool a command that runs `concurrency` operations at once
/// wants when `--pg-pool-size` is not given: `max(4, concurrency)`.
pub fn set_pg_pool_default(concurrency: usize) {
    *PG_POOL_DEFAULT.lock().unwrap_or_else(|p| p.into_inner()) =
        Some(concurrency.max(DEFAULT_PG_POOL_SIZE));
}

/// The pool the next PostgreSQL store opens with.
pub fn pg_pool_size() -> usize {
    let given = *PG_POOL_SIZE.lock().unwrap_or_else(|p| p.into_inner());
    let default = *PG_POOL_DEFAULT.lock().unwrap_or_else(|p| p.into_inner());
    given.or(default).unwrap_or(DEFAULT_PG_POOL_SIZE)
}

/// `events --follow --interval`: the PostgreSQL watch's fallback poll.
static WATCH_FALLBACK: std::sync::Mutex<Option<std::time::Duration>> = std::sync::Mutex::new(None);

/// Sets how often a PostgreSQL store opened after this call re-reads when
/// no notification came (`events --follow --interval`: LISTEN/NOTIFY wakes
/// the follow; the interval only bounds how late a missed notification —
/// a reconnecting listener — is noticed).
pub fn set_pg_watch_fallback(interval: std::time::Duration) {
    *WATCH_FALLBACK.lock().unwrap_or_else(|p| p.into_inner()) = Some(interval);
}

/// `http://` stores: how every command reaches `runkeep serve`.
pub mod http {
    use std::time::Duration;

    use runkeep_server::client::{HttpStore, HttpStoreOptions};

    use super::*;

    /// The longest one request may wait for its answer (long-polls add their
    /// own wait): a server that went away is an error within this, never a
    /// hang. `runkeep soak-worker` lowers it to its lease TTL.
    static REQUEST_TIMEOUT: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);

    /// Sets the request timeout of `http://` stores opened after this call.
    pub fn set_request_timeout(d: Duration) {
        *REQUEST_TIMEOUT.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
    }

    /// The options every command opens an `HttpStore` with.
    pub fn options() -> HttpStoreOptions {
        let mut o = HttpStoreOptions::default();
        if let Some(d) = *REQUEST_TIMEOUT.lock().unwrap_or_else(|p| p.into_inner()) {
            o.request_timeout = d;
            o.connect_timeout = o.connect_timeout.min(d);
        }
        o
    }

    /// An `HttpStore` sending the token for `--tenant`. Nothing is sent
    /// yet: a server that is down (restarting) is met by the first call as
    /// `Unavailable`, which callers retry, and a token for another tenant
    /// is refused by the server on the first call (403). Refused here: no
    /// token (exit 78).
    pub async fn open(address: &HttpAddress, scope: &ScopeParts) -> CliResult<HttpStore> {
        let Some(token) = address.token() else {
            return Err(CliError::config(format!(
                "store {} needs a bearer token",
                address.url()
            ))
            .hint("set RUNKEEP_TOKEN (or pass --token); create one with `runkeep token create --tenant T --role worker` where the server runs"));
        };
        Ok(HttpStore::new(address.url(), options())?.with_token(scope.tenant.clone(), token))
    }
}

/// The PostgreSQL backend's wiring (the only place that names
/// `runkeep_postgres`'s constructors).
pub mod pg {
    use runkeep_postgres::{PgOptions, PgStore, SCHEMA_VERSION};

    use super::*;

    /// The options every command opens a PostgreSQL store with: the
    /// address's schema (default [`DEFAULT_PG_SCHEMA`]) and the pool of
    /// `--pg-pool-size`, else the command's default ([`pg_pool_size`]).
    pub fn options(address: &PgAddress) -> PgOptions {
        let fallback = *WATCH_FALLBACK.lock().unwrap_or_else(|p| p.into_inner());
        PgOptions {
            watch_fallback: fallback.unwrap_or(PgOptions::default().watch_fallback),
            schema: address.schema().unwrap_or(DEFAULT_PG_SCHEMA).to_string(),
            pool_size: pg_pool_size(),
            ..PgOptions::default()
        }
    }

    /// `store postgres://…@host/db (schema S)`: how messages name it.
    pub fn describe(address: &PgAddress, options: &PgOptions) -> String {
        format!(
            "store {} (schema {})",
            StoreAddress::Postgres(address.clone()),
            options.schema
        )
    }

    /// Maps a store error met while opening: bad URL or schema name 64,
    /// unreachable 69, a newer or older schema 78.
    pub fn open_error(address: &PgAddress, options: &PgOptions, e: runkeep::Error) -> CliError {
        let what = describe(address, options);
        match &e {
            runkeep::Error::Unsupported { .. } => CliError::config(format!(
                "{what}: {}",
                CliError::from(e).message
            ))
            .hint("run `runkeep migrate` with a runkeep at least as new as the one that migrated it, or point --store/--pg-schema at another schema"),
            runkeep::Error::Unavailable { .. } => CliError::from(e)
                .context(format!("cannot reach {what}"))
                .hint("check that the server runs and the URL's host, port, user and database (`runkeep doctor` shows what fails)"),
            runkeep::Error::InvalidInput { .. } => CliError::from(e)
                .context(&what)
                .hint("pass --store postgres://USER@HOST:PORT/DATABASE and a schema of a-z, 0-9 and _ (?schema=NAME or --pg-schema)"),
            _ => CliError::from(e).context(&what),
        }
    }

    /// The schema version check of [`OpenMode::Existing`] and
    /// [`OpenMode::ReadOnly`]: missing or older is exit 78 with "run
    /// `runkeep migrate`", newer is exit 78 with "upgrade".
    pub async fn require_current(address: &PgAddress, options: &PgOptions) -> CliResult<i32> {
        let found = PgStore::schema_version(address.url(), options)
            .await
            .map_err(|e| open_error(address, options, e))?;
        let what = describe(address, options);
        match found {
            0 => Err(CliError::config(format!(
                "{what}: the schema holds no runkeep tables (never migrated)"
            ))
            .hint("run `runkeep migrate` once with the same --store (and --pg-schema) to create them; read commands never migrate")),
            v if v < SCHEMA_VERSION => Err(CliError::config(format!(
                "{what}: the schema is at runkeep schema version {v}, older than {SCHEMA_VERSION}"
            ))
            .hint("run `runkeep migrate` to bring it to this binary's version")),
            v if v > SCHEMA_VERSION => Err(CliError::config(format!(
                "{what}: the schema is at runkeep schema version {v}, newer than version {SCHEMA_VERSION} this binary knows"
            ))
            .hint("upgrade runkeep (a newer binary migrated it), or point --store/--pg-schema at another schema")),
            v => Ok(v),
        }
    }

    /// Opens a PostgreSQL store in `mode`.
    pub(super) async fn open(
        address: &PgAddress,
        mode: OpenMode,
    ) -> CliResult<(Arc<PgStore>, Box<PgTarget>)> {
        let options = options(address);
        let url = match mode {
            // The server refuses every write of a read-only command.
            OpenMode::ReadOnly => read_only_url(address.url()),
            _ => address.url().to_string(),
        };
        let store = match mode {
            OpenMode::Create => PgStore::connect(&url, options.clone())
                .await
                .map_err(|e| open_error(address, &options, e))?,
            OpenMode::Existing | OpenMode::ReadOnly => {
                require_current(address, &options).await?;
                PgStore::open_migrated(&url, options.clone())
                    .map_err(|e| open_error(address, &options, e))?
            }
            OpenMode::Examine => PgStore::open_migrated(&url, options.clone())
                .map_err(|e| open_error(address, &options, e))?,
        };
        Ok((
            Arc::new(store),
            Box::new(PgTarget {
                address: address.clone(),
                options,
            }),
        ))
    }

    /// Applies the embedded migrations (`runkeep migrate`): the version now
    /// applied.
    pub async fn migrate(address: &PgAddress) -> CliResult<(i32, PgOptions)> {
        let options = options(address);
        let v = PgStore::migrate(address.url(), &options)
            .await
            .map_err(|e| open_error(address, &options, e))?;
        Ok((v, options))
    }

    /// `url` with `-c default_transaction_read_only=on` added to its
    /// `options` parameter.
    fn read_only_url(url: &str) -> String {
        const RO: &str = "-c%20default_transaction_read_only%3Don";
        match url.split_once('?') {
            None => format!("{url}?options={RO}"),
            Some((base, query)) => {
                let mut found = false;
                let pairs: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some(("options", v)) => {
                            found = true;
                            format!("options={v}%20{RO}")
                        }
                        _ => pair.to_string(),
                    })
                    .collect();
                let mut q = pairs.join("&");
                if !found {
                    q.push_str(&format!("&options={RO}"));
                }
                format!("{base}?{q}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_of_no_connections_is_refused_with_what_to_pass() {
        assert_eq!(parse_pg_pool_size("1"), Ok(1));
        assert_eq!(parse_pg_pool_size("32"), Ok(32));
        let e = parse_pg_pool_size("0").unwrap_err();
        assert!(e.contains("at least 1 connection"), "{e}");
        assert!(parse_pg_pool_size("-1").is_err());
        assert!(parse_pg_pool_size("many").is_err());
    }

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
        assert_eq!(
            "root:/tmp/x".parse::<StoreAddress>().unwrap(),
            StoreAddress::Root(PathBuf::from("/tmp/x"))
        );
        assert_eq!(
            StoreAddress::Root(PathBuf::from("/tmp/x")).to_string(),
            "root:/tmp/x"
        );
        assert!("root:".parse::<StoreAddress>().is_err());
        let e = "./data".parse::<StoreAddress>().unwrap_err();
        assert!(e.contains("did you mean root:./data"), "{e}");
        assert!(e.contains("fs:./data"), "{e}");
        let pg: StoreAddress = "postgres://u:secret@db:5432/test".parse().unwrap();
        assert_eq!(pg.to_string(), "postgres://…@db:5432/test");
    }

    #[test]
    fn http_addresses_show_the_url_only_and_refuse_credentials() {
        let a: StoreAddress = "http://127.0.0.1:7420/".parse().unwrap();
        let a = with_token(&a, Some("rk_abc_0123456789sekrit"));
        assert_eq!(a.to_string(), "http://127.0.0.1:7420");
        assert!(!format!("{a:?}").contains("sekrit"), "{a:?}");
        let StoreAddress::Http(h) = &a else {
            panic!("not http: {a:?}")
        };
        assert_eq!(h.token(), Some("rk_abc_0123456789sekrit"));
        // Every printed line redacts the token once it was met.
        assert_eq!(redact("token rk_abc_0123456789sekrit here"), "token … here");
        // Other stores take no token.
        let root = with_token(&StoreAddress::Memory, Some("rk_x"));
        assert_eq!(root, StoreAddress::Memory);

        let e = "http://alice:pa55word@h:1"
            .parse::<StoreAddress>()
            .unwrap_err();
        assert!(e.contains("RUNKEEP_TOKEN"), "{e}");
        assert!(!e.contains("pa55word"), "{e}");
        // clap quotes the refused value: its credentials are redacted.
        assert!(!redact("'http://alice:pa55word@h:1'").contains("pa55word"));
        assert!("http://".parse::<StoreAddress>().is_err());
    }
}
