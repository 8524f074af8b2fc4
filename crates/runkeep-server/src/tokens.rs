//! The token store: bearer tokens bound to one tenant and one [`Role`],
//! kept hashed in a JSON file, checked in constant time.
//!
//! # The secret
//!
//! A token is `rk_<id>_<secret>`: `<id>` is 12 characters of `[0-9a-z]`
//! (public: `runkeep token list` shows it, logs and audit name it), and
//! `<secret>` is 32 bytes (256 bits) from the operating system's random
//! source, in hex. The whole string is shown once, when it is created, and
//! never stored.
//!
//! # At rest
//!
//! The file keeps the SHA-256 of the whole token string, never the token.
//! A slow password KDF (bcrypt, argon2) is not needed: those exist to make
//! guessing a *low-entropy* password from its hash expensive. A 256-bit
//! random secret cannot be guessed from its SHA-256 at any cost (a preimage
//! search of 2^256), so a fast hash loses nothing, and it keeps checking a
//! token on every request to about a microsecond instead of the ~100 ms a
//! KDF would add to each one.
//!
//! # Checking
//!
//! [`TokenStore::authenticate`] finds the entry by its public id, hashes
//! the presented token and compares the two digests with
//! [`subtle::ConstantTimeEq`], so the time taken does not depend on how
//! many leading bytes matched. Unknown, malformed and revoked tokens all
//! answer `None`; nothing about the secret is logged.
//!
//! # The file
//!
//! `tokens.json` (or any path): `{"format": "runkeep-tokens/1", "tokens":
//! [...]}` with one [`TokenRecord`] per token, revoked ones kept (with
//! `revokedAt`) so `token list` can still name them. Every change is a
//! read-modify-write under an exclusive `flock` of `<path>.lock` (so two
//! `runkeep token create` processes cannot lose one), written to a fresh
//! temporary file of mode 0600 in the same directory, synced, renamed over
//! the file and the directory synced: a reader sees the old file or the new
//! one, never half of one.
//!
//! # Revocation without a restart
//!
//! A running server's [`TokenStore`] stats the file at most once every
//! [`TokenStore::reload_every`] (default [`DEFAULT_RELOAD_EVERY`], 1 s; zero
//! stats on every request) and reloads it when its identity (device, inode,
//! size, modification time) changed. Every write is a rename, so a change
//! always shows as a new inode. A revoked token therefore stops working at
//! most `reload_every` after `runkeep token revoke` returns. A file that
//! cannot be read or parsed fails closed: every token is refused (and the
//! error logged) until it is fixed.
//!
//! # Who may read it
//!
//! Only its owner: every write leaves it 0600, and [`TokenStore::open`]
//! (a server starting) refuses a file with any group or other permission
//! bit ([`TokenError::Permissions`], naming the file, its mode and `chmod
//! 600`), a file owned by another uid than the server's effective uid
//! ([`TokenError::Owner`]), and a directory another user could replace it
//! in — owned by someone other than this uid or root, or group/other
//! writable without the sticky bit ([`TokenError::Directory`]; see
//! [`TokenFile::check_private`]); a reload that finds any of these (the
//! file replaced by hand) fails closed like an unreadable file. The digests cannot be turned back into tokens,
//! but whoever can change the file can add a token of their own, and
//! whoever can read it learns every tenant, role and label.

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use runkeep::{TenantId, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::auth::{Authenticator, Principal, Role};

/// The `format` tag of the token file.
pub const FORMAT: &str = "runkeep-tokens/1";

/// The prefix of every token (`rk_<id>_<secret>`).
pub const TOKEN_PREFIX: &str = "rk_";

/// How often a running server looks at the token file by default.
pub const DEFAULT_RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Bytes of randomness in a secret (256 bits).
const SECRET_BYTES: usize = 32;

/// Length of a token id.
const ID_LEN: usize = runkeep_http::holder::TOKEN_ID_LEN;

/// A token file problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Reading, locking or writing the file failed.
    #[error("token file {path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a token file this version understands.
    #[error("token file {path} cannot be read: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// No token has this id.
    #[error("no token has id {0:?} (see `runkeep token list`)")]
    UnknownToken(String),
    /// Bad input (a tenant id, a role, a label).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The file can be read or changed by users other than its owner.
    #[error("token file {path} has mode {mode:04o}: users other than its owner can read or change it, and it decides who may call the API; run `chmod 600 {path}` (runkeep creates it 0600)", path = .path.display())]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is owned by another user than the one the server runs as.
    #[error("token file {path} is owned by uid {uid}, not by uid {euid} this process runs as: its owner can change who may call the API; run `chown {euid} {path}` (or run the server as uid {uid})", path = .path.display())]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// This process's effective uid.
        euid: u32,
    },
    /// The file's directory lets another user replace the file (a rename
    /// over it).
    #[error("the directory {dir} of token file {path} {problem}: another user could replace the file (rename another over it) and decide who may call the API; {fix}", dir = .dir.display(), path = .path.display())]
    Directory {
        /// The file.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// What is wrong with the directory.
        problem: String,
        /// How to fix it.
        fix: String,
    },
}

/// Result alias of this module.
pub type TokenResult<T> = Result<T, TokenError>;

impl From<runkeep_http::routes::UnknownRole> for TokenError {
    fn from(e: runkeep_http::routes::UnknownRole) -> Self {
        TokenError::Invalid(e.to_string())
    }
}

/// One token as the file keeps it: everything but the secret.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRecord {
    /// Public id (`rk_<id>_…`).
    pub id: String,
    /// The only tenant the token can address.
    pub tenant: TenantId,
    /// What it may do there.
    pub role: Role,
    /// A note for people ("ci", "alice's laptop").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was revoked; a revoked token is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Timestamp>,
    /// SHA-256 of the whole token string, lowercase hex.
    pub sha256: String,
}

impl TokenRecord {
    /// True unless revoked.
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBody {
    format: String,
    tokens: Vec<TokenRecord>,
}

/// A token just created: its record and the secret, which exists only here.
pub struct NewToken {
    /// What the file keeps.
    pub record: TokenRecord,
    secret: String,
}

impl NewToken {
    /// The token to hand to the client (`rk_<id>_<secret>`). Shown once:
    /// it is not stored anywhere.
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl fmt::Debug for NewToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewToken")
            .field("record", &self.record)
            .field("secret", &"…")
            .finish()
    }
}

/// What [`TokenFile::revoke`] did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Revoked {
    /// The token was active and is now revoked.
    Now(TokenRecord),
    /// It had been revoked before (nothing changed).
    Already(TokenRecord),
}

/// The token file on disk: create, list, revoke.
#[derive(Clone, Debug)]
pub struct TokenFile {
    path: PathBuf,
}

fn sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// 64 hex digits (either case) as 32 bytes; `None` otherwise.
fn unhex32(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// Splits `rk_<id>_<secret>` into its id; `None` when it is not shaped so.
fn token_id(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (id.len() == ID_LEN && secret.len() == SECRET_BYTES * 2).then_some(id)
}

impl TokenFile {
    /// The token file at `path` (it need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, action: &'static str) -> impl FnOnce(std::io::Error) -> TokenError + '_ {
        move |source| TokenError::Io {
            path: self.path.clone(),
            action,
            source,
        }
    }

    /// Refuses a token file another user could read, change or replace,
    /// each naming the fix:
    ///
    /// - a file owned by another uid than this process's effective uid
    ///   ([`TokenError::Owner`]);
    /// - a file with any group or other permission bit (`0o077`,
    ///   [`TokenError::Permissions`]);
    /// - a directory owned by another user than this uid or root, or that
    ///   group or other users may write in without the sticky bit
    ///   ([`TokenError::Directory`]): whoever can write in it can rename
    ///   another file over the token file. A sticky directory (`/tmp`,
    ///   mode 1777) is accepted: there only the file's owner (this uid,
    ///   checked above) may rename over it or delete it.
    ///
    /// A missing file passes (no tokens); its directory is still checked.
    pub fn check_private(&self) -> TokenResult<()> {
        let euid = rustix::process::geteuid().as_raw();
        let dir = self.dir();
        let d = std::fs::metadata(dir).map_err(self.io("stat its directory"))?;
        let directory = |problem: String, fix: String| TokenError::Directory {
            path: self.path.clone(),
            dir: dir.to_path_buf(),
            problem,
            fix,
        };
        if d.uid() != euid && d.uid() != 0 {
            return Err(directory(
                format!("is owned by uid {}", d.uid()),
                format!(
                    "keep the token file in a directory owned by uid {euid} (this process) or root, e.g. `mkdir -m 700 DIR` as uid {euid}"
                ),
            ));
        }
        let mode = d.mode() & 0o7777;
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(directory(
                format!("has mode {mode:04o} (group or other users may write in it)"),
                format!(
                    "run `chmod go-w {}` (or `chmod +t {}` to make it sticky), or keep the token file in a directory only its owner can write",
                    dir.display(),
                    dir.display()
                ),
            ));
        }
        match std::fs::metadata(&self.path) {
            Ok(m) if m.uid() != euid => Err(TokenError::Owner {
                path: self.path.clone(),
                uid: m.uid(),
                euid,
            }),
            Ok(m) if m.mode() & 0o077 != 0 => Err(TokenError::Permissions {
                path: self.path.clone(),
                mode: m.mode() & 0o7777,
            }),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.io("stat")(e)),
        }
    }

    /// Every token, revoked ones included, oldest first. A missing file is
    /// no tokens.
    pub fn list(&self) -> TokenResult<Vec<TokenRecord>> {
        self.read()
    }

    fn read(&self) -> TokenResult<Vec<TokenRecord>> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.io("read")(e)),
        };
        parse(&self.path, &text)
    }

    /// A read-modify-write of the token list under the file's exclusive
    /// lock: `change` sees the current tokens and edits them; what it leaves
    /// is written atomically (temporary file of mode 0600, synced, renamed,
    /// directory synced). When `change` fails nothing is written. Another
    /// process's `update` waits for this one, so neither loses the other's
    /// change.
    pub fn update<T>(
        &self,
        change: impl FnOnce(&mut Vec<TokenRecord>) -> TokenResult<T>,
    ) -> TokenResult<T> {
        let _lock = self.lock()?;
        let mut tokens = self.read()?;
        let out = change(&mut tokens)?;
        self.write(&tokens)?;
        Ok(out)
    }

    fn dir(&self) -> &Path {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        }
    }

    fn lock(&self) -> TokenResult<File> {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(PathBuf::from(name))
            .map_err(self.io("open its lock file"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| self.io("lock")(e.into()))?;
        Ok(lock)
    }

    fn write(&self, tokens: &[TokenRecord]) -> TokenResult<()> {
        let body = FileBody {
            format: FORMAT.to_string(),
            tokens: tokens.to_vec(),
        };
        let mut text = serde_json::to_vec_pretty(&body).map_err(|e| TokenError::Corrupt {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        text.push(b'\n');
        // NamedTempFile creates with mode 0600.
        let mut tmp = tempfile::Builder::new()
            .prefix(".runkeep-tokens-")
            .tempfile_in(self.dir())
            .map_err(self.io("create a temporary file"))?;
        tmp.write_all(&text).map_err(self.io("write"))?;
        tmp.as_file().sync_all().map_err(self.io("sync"))?;
        tmp.persist(&self.path)
            .map_err(|e| self.io("rename into place")(e.error))?;
        File::open(self.dir())
            .and_then(|d| d.sync_all())
            .map_err(self.io("sync its directory"))?;
        Ok(())
    }

    /// Creates a token for `tenant` with `role`: a fresh id and 256 random
    /// bits from the OS; the file keeps only the SHA-256.
    pub fn create(
        &self,
        tenant: &TenantId,
        role: Role,
        label: Option<&str>,
    ) -> TokenResult<NewToken> {
        if let Some(l) = label {
            if l.chars().any(char::is_control) || l.len() > 200 {
                return Err(TokenError::Invalid(
                    "a label is at most 200 bytes without control characters".into(),
                ));
            }
        }
        self.update(|tokens| {
            let mut id = runkeep::id::random_suffix(ID_LEN);
            while tokens.iter().any(|t| t.id == id) {
                id = runkeep::id::random_suffix(ID_LEN);
            }
            let mut secret = [0u8; SECRET_BYTES];
            rand::rngs::OsRng.fill_bytes(&mut secret);
            let token = format!("{TOKEN_PREFIX}{id}_{}", hex::encode(secret));
            let record = TokenRecord {
                id,
                tenant: tenant.clone(),
                role,
                label: label.map(str::to_string),
                created_at: Timestamp::now(),
                revoked_at: None,
                sha256: sha256_hex(&token),
            };
            tokens.push(record.clone());
            Ok(NewToken {
                record,
                secret: token,
            })
        })
    }

    /// Revokes the token with `id` (kept in the file, marked revoked).
    pub fn revoke(&self, id: &str) -> TokenResult<Revoked> {
        self.update(|tokens| {
            let t = tokens
                .iter_mut()
                .find(|t| t.id == id)
                .ok_or_else(|| TokenError::UnknownToken(id.to_string()))?;
            if t.revoked_at.is_some() {
                return Ok(Revoked::Already(t.clone()));
            }
            t.revoked_at = Some(Timestamp::now());
            Ok(Revoked::Now(t.clone()))
        })
    }
}

fn parse(path: &Path, text: &[u8]) -> TokenResult<Vec<TokenRecord>> {
    let corrupt = |message: String| TokenError::Corrupt {
        path: path.to_path_buf(),
        message,
    };
    let body: FileBody = serde_json::from_slice(text).map_err(|e| corrupt(e.to_string()))?;
    if body.format != FORMAT {
        return Err(corrupt(format!(
            "format {:?} is not {FORMAT:?} (written by another runkeep version?)",
            body.format
        )));
    }
    for t in &body.tokens {
        if unhex32(&t.sha256).is_none() {
            return Err(corrupt(format!(
                "token {:?} has no valid sha256 (64 hex digits)",
                t.id
            )));
        }
    }
    Ok(body.tokens)
}

/// A token as a running server holds it.
#[derive(Debug)]
struct Entry {
    sha256: [u8; 32],
    principal: Principal,
}

/// The file's identity: a rename always changes the inode.
type Signature = Option<(u64, u64, u64, i64, i64)>;

#[derive(Debug)]
struct Loaded {
    checked_at: Option<Instant>,
    signature: Signature,
    /// Active tokens by id; `None` when the file could not be read (every
    /// token refused: fail closed).
    by_id: Option<Arc<HashMap<String, Entry>>>,
}

/// The [`Authenticator`] over a [`TokenFile`], reloading it when it changes
/// (see the module doc: at most every [`TokenStore::reload_every`]).
#[derive(Debug)]
pub struct TokenStore {
    file: TokenFile,
    reload_every: Duration,
    loaded: Mutex<Loaded>,
}

impl TokenStore {
    /// A store over `file`, looked at again at most every `reload_every`
    /// (zero: on every request). The file is read now: a file that exists
    /// but cannot be read or parsed, or that group or other users may read
    /// or change ([`TokenFile::check_private`]), is an error here (at
    /// start-up), and fails closed later.
    pub fn open(file: TokenFile, reload_every: Duration) -> TokenResult<Self> {
        let store = Self {
            file,
            reload_every,
            loaded: Mutex::new(Loaded {
                checked_at: None,
                signature: None,
                by_id: None,
            }),
        };
        let signature = store.signature();
        let by_id = store.load()?;
        *store.loaded.lock().unwrap_or_else(|p| p.into_inner()) = Loaded {
            checked_at: Some(Instant::now()),
            signature,
            by_id: Some(Arc::new(by_id)),
        };
        Ok(store)
    }

    /// The token file.
    pub fn file(&self) -> &TokenFile {
        &self.file
    }

    /// The longest a revocation takes to reach this server.
    pub fn reload_every(&self) -> Duration {
        self.reload_every
    }

    fn signature(&self) -> Signature {
        std::fs::metadata(self.file.path())
            .ok()
            .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
    }

    fn load(&self) -> TokenResult<HashMap<String, Entry>> {
        self.file.check_private()?;
        let mut by_id = HashMap::new();
        for t in self.file.read()? {
            if !t.is_active() {
                continue;
            }
            let Some(sha256) = unhex32(&t.sha256) else {
                continue; // parse() refused these already
            };
            by_id.insert(
                t.id.clone(),
                Entry {
                    sha256,
                    principal: Principal {
                        tenant: t.tenant,
                        role: t.role,
                        token_id: t.id,
                    },
                },
            );
        }
        Ok(by_id)
    }

    /// The active tokens as of the last look at the file (reloading it if
    /// due and changed); `None` when the file cannot be read.
    fn current(&self) -> Option<Arc<HashMap<String, Entry>>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let due = match loaded.checked_at {
            Some(at) => at.elapsed() >= self.reload_every,
            None => true,
        };
        if due {
            let signature = self.signature();
            if signature != loaded.signature || loaded.by_id.is_none() {
                loaded.by_id = match self.load() {
                    Ok(m) => Some(Arc::new(m)),
                    Err(e) => {
                        tracing::error!(error = %e, "token file unreadable: refusing every token until it is fixed");
                        None
                    }
                };
                loaded.signature = signature;
            }
            loaded.checked_at = Some(Instant::now());
        }
        loaded.by_id.clone()
    }
}

impl Authenticator for TokenStore {
    fn authenticate(&self, secret: &str) -> Option<Principal> {
        let id = token_id(secret)?;
        let tokens = self.current()?;
        let entry = tokens.get(id)?;
        let presented: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        if bool::from(presented.ct_eq(&entry.sha256)) {
            Some(entry.principal.clone())
        } else {
            None
        }
    }

    fn still_valid(&self, principal: &Principal) -> bool {
        self.current()
            .and_then(|tokens| {
                tokens
                    .get(&principal.token_id)
                    .map(|e| e.principal == *principal)
            })
            .unwrap_or(false)
    }

    /// A quarter of [`TokenStore::reload_every`] (between 50 ms and 1 s):
    /// a waiting request sees a revocation at most 1.25 reload intervals
    /// after `runkeep token revoke` returned.
    fn revocation_check_every(&self) -> Option<Duration> {
        Some((self.reload_every / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_token_ids_parse() {
        let bytes = [0xabu8; 32];
        assert_eq!(unhex32(&hex::encode(bytes)), Some(bytes));
        assert_eq!(unhex32("zz"), None);
        let token = format!("rk_{}_{}", "a".repeat(12), "0".repeat(64));
        assert_eq!(token_id(&token), Some("aaaaaaaaaaaa"));
        assert_eq!(token_id("rk_short_00"), None);
        assert_eq!(token_id("Bearer x"), None);
    }

    #[test]
    fn roles_parse_and_print() {
        for r in [Role::Reader, Role::Worker, Role::Operator] {
            assert_eq!(r.as_str().parse::<Role>().unwrap(), r);
        }
        assert!("admin".parse::<Role>().is_err());
    }
}
