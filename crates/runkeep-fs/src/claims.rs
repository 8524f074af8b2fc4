//! The fenced lease on a filesystem: the fence is the file name.
//!
//! A run's holdings are `claims/<fence>.json`. Taking the run is creating the
//! next number with a hard `link` from a body that is already whole, so the
//! kernel picks exactly one winner per number and no reader ever sees a
//! holding name without its complete body. The body is
//! `{"holder","expiresAt","attempts"}`; a release publishes the tombstone
//! `{"holder":"","expiresAt":0,"attempts"}` at `fence + 1` (a snooze's also
//! carries `availableAt`, a dead-lettering claim's `deadLetteredAt`; see
//! [`crate::run_state`]). The reference reads these bodies as its own: it
//! looks only at `holder` and `expiresAt` (a body with a string `holder`
//! and a finite numeric `expiresAt` is valid to it). Holdings more than 32 below
//! the top are pruned once they are older than the store's grace period
//! ([`crate::FsOptions::prune_grace`], so a reference claimer on its way to
//! a name finds it still there); scratch files older than ten minutes are
//! swept.
//!
//! Names are canonical (`[1-9][0-9]{0,14}.json`) and only regular files are
//! holdings: `007.json`, `0x10.json`, `1e21.json`, a 16-digit name or a
//! directory called `5.json` is not a holding, so nothing foreign can pin the
//! counter; a non-regular entry sitting on the next number is stepped over
//! rather than wedging the run.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use runkeep::backoff;
use runkeep::lease::decide_release;
use runkeep::lifecycle::{self, ClaimPlan};
use runkeep::{
    ClaimOptions, ClaimOutcome, Error, Fence, Holder, Lease, Result, RunScope, Timestamp,
    TopHolding,
};
use serde_json::{Map, Value};

use crate::inner::Inner;
use crate::keys::KeyGuard;
use crate::lock::{Mode, RunLock};
use crate::options::Durability;
use crate::run_state::{self, Record};
use crate::sys::{self, errno, Ctx};
use crate::testing_hooks::{self, Mutation};
use runkeep::LeaseSummary;

/// The claims directory of a run.
pub(crate) const CLAIMS_DIR: &str = "claims";
/// Attempts before a claim answers `Contended`.
pub(crate) const MAX_ATTEMPTS: u32 = 8;
/// Holdings kept below the top (so at most 33 names).
pub(crate) const KEEP_BELOW_TOP: u64 = 32;
/// Age past which a scratch file is swept (wall clock, by mtime).
pub(crate) const SCRATCH_TTL: Duration = Duration::from_secs(10 * 60);
/// Prefix of scratch files.
pub(crate) const SCRATCH_PREFIX: &str = ".tmp-";

/// The fence a directory entry names, if it is a canonical holding name.
pub(crate) fn holding_fence(name: &str) -> Option<Fence> {
    let digits = name.strip_suffix(".json")?;
    let b = digits.as_bytes();
    if b.is_empty() || b.len() > 15 || b[0] == b'0' || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Fence::new(digits.parse().ok()?).ok()
}

/// What a claims directory holds, from one `readdir` (names and `d_type`
/// only; no body is read).
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Regular files with canonical names.
    pub(crate) holdings: Vec<(Fence, String)>,
    /// Canonical names that are not regular files (foreign; never holdings).
    pub(crate) non_regular: Vec<(Fence, String)>,
    /// Scratch files.
    pub(crate) scratch: Vec<String>,
}

impl Scan {
    /// The highest holding.
    pub(crate) fn top(&self) -> Option<&(Fence, String)> {
        self.holdings.iter().max_by_key(|(f, _)| *f)
    }
}

/// Lists a claims directory; `None` when it does not exist.
pub(crate) fn scan(claims_dir: &Path) -> io::Result<Option<Scan>> {
    let Some(items) = sys::list_dir(claims_dir)? else {
        return Ok(None);
    };
    let mut out = Scan::default();
    for i in items {
        if let Some(fence) = holding_fence(&i.name) {
            if i.file_type.is_file() {
                out.holdings.push((fence, i.name));
            } else {
                out.non_regular.push((fence, i.name));
            }
        } else if i.name.starts_with(SCRATCH_PREFIX) {
            out.scratch.push(i.name);
        }
    }
    Ok(Some(out))
}

/// A holding as this store reads it: the holding, and the lifecycle fields
/// its body carries (absent in a body the reference wrote).
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Holding {
    /// The holding.
    pub(crate) top: TopHolding,
    /// The run's attempt count as of this holding.
    pub(crate) attempts: Option<u32>,
    /// A snooze's not-before instant (tombstones only).
    pub(crate) available_at: Option<Timestamp>,
    /// Set on the tombstone of a dead-lettering claim: when.
    pub(crate) dead_lettered_at: Option<Timestamp>,
}

impl Holding {
    fn unreadable(fence: Fence) -> Self {
        Self {
            top: TopHolding::Unreadable { fence },
            attempts: None,
            available_at: None,
            dead_lettered_at: None,
        }
    }
}

fn timestamp_field(m: &Map<String, Value>, key: &str) -> Option<Timestamp> {
    let v = m
        .get(key)?
        .as_f64()
        .filter(|f| f.is_finite() && *f >= 0.0)?;
    Timestamp::from_millis(v.floor().min(runkeep::time::MAX_TIMESTAMP_MS as f64) as i64).ok()
}

/// Parses a holding body with its lifecycle fields. The holding itself is
/// read exactly as the reference reads it (only `holder` and `expiresAt`
/// decide); a lifecycle field that is malformed is ignored, never fatal.
pub(crate) fn parse_holding(fence: Fence, bytes: &[u8]) -> Holding {
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(bytes) else {
        return Holding::unreadable(fence);
    };
    let (Some(Value::String(holder)), Some(exp)) = (m.get("holder"), m.get("expiresAt")) else {
        return Holding::unreadable(fence);
    };
    let Some(exp) = exp.as_f64().filter(|f| f.is_finite()) else {
        return Holding::unreadable(fence);
    };
    let attempts = m
        .get("attempts")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok());
    if holder.is_empty() && exp == 0.0 {
        return Holding {
            top: TopHolding::Released { fence },
            attempts,
            available_at: timestamp_field(&m, "availableAt"),
            dead_lettered_at: timestamp_field(&m, "deadLetteredAt"),
        };
    }
    let Ok(holder) = Holder::new(holder.clone()) else {
        return Holding::unreadable(fence);
    };
    let ms = exp
        .floor()
        .clamp(0.0, runkeep::time::MAX_TIMESTAMP_MS as f64) as i64;
    Holding {
        top: TopHolding::Lease {
            fence,
            holder,
            expires_at: Timestamp::from_millis(ms).unwrap_or(Timestamp::EPOCH),
        },
        attempts,
        available_at: None,
        dead_lettered_at: None,
    }
}

/// Parses a holding body. Anything but a well-formed body reads as an
/// unreadable holding (expired, anonymous): an unreadable value never grants.
#[cfg(test)]
pub(crate) fn parse_body(fence: Fence, bytes: &[u8]) -> TopHolding {
    parse_holding(fence, bytes).top
}

/// The body of a lease.
pub(crate) fn lease_body(holder: &str, expires_at: i64, attempts: u32) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "holder": holder,
        "expiresAt": expires_at,
        "attempts": attempts,
    }))
    .unwrap_or_default()
}

/// The body of a tombstone (release, snooze, finish, dead-letter).
pub(crate) fn tomb_body(
    attempts: u32,
    available_at: Option<Timestamp>,
    dead_lettered_at: Option<Timestamp>,
) -> Vec<u8> {
    let mut m = Map::new();
    m.insert("holder".into(), Value::from(""));
    m.insert("expiresAt".into(), Value::from(0));
    m.insert("attempts".into(), Value::from(attempts));
    if let Some(at) = available_at {
        m.insert("availableAt".into(), Value::from(at.as_millis()));
    }
    if let Some(at) = dead_lettered_at {
        m.insert("deadLetteredAt".into(), Value::from(at.as_millis()));
    }
    serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
}

/// Reads the top holding named by a scan.
fn holding_of(claims_dir: &Path, scan: &Scan, ctx: &Ctx) -> Result<Option<Holding>> {
    let Some((fence, name)) = scan.top() else {
        return Ok(None);
    };
    let path = claims_dir.join(name);
    match sys::read_opt(&path) {
        Ok(Some(bytes)) => Ok(Some(parse_holding(*fence, &bytes))),
        // Vanished or replaced by a non-file since the listing: the name
        // already told the taker everything it needs.
        Ok(None) => Ok(Some(Holding::unreadable(*fence))),
        Err(e) if e.raw_os_error() == Some(errno::ISDIR) => Ok(Some(Holding::unreadable(*fence))),
        Err(e) => Err(ctx.io("read the holding", &path, e)),
    }
}

/// The run's top holding as it is in `claims/` (no lifecycle applied);
/// `None` when it was never claimed. Reads only.
pub(crate) fn read_holding(run_dir: &Path, ctx: &Ctx) -> Result<Option<Holding>> {
    let dir = run_dir.join(CLAIMS_DIR);
    match scan(&dir).map_err(|e| ctx.io("list the claims directory", &dir, e))? {
        Some(s) => holding_of(&dir, &s, ctx),
        None => Ok(None),
    }
}

/// The run's top holding as the contract sees it (a committed finish
/// whose tombstone is missing reads as that tombstone,
/// [`run_state::effective`]); `None` when it was never claimed. Reads only.
pub(crate) fn read_top(run_dir: &Path, ctx: &Ctx) -> Result<Option<TopHolding>> {
    Ok(run_state::read_state(run_dir, ctx)?.top)
}

/// Why a publish did not happen.
#[derive(Debug)]
pub(crate) enum PublishError {
    /// The name exists: someone else took this fence (the ordinary race signal).
    Exists,
    /// Anything else, already mapped to the public error.
    Failed(Error),
}

/// The refusal for a volume without hard links.
pub(crate) fn no_hard_links(ctx: &Ctx, dir: &Path, code: i32) -> Error {
    let who = if ctx.run.is_empty() {
        ctx.operation.to_string()
    } else {
        format!("{} on run {}", ctx.operation, ctx.run)
    };
    Error::Unsupported {
        message: format!(
            "{who}: this filesystem answered `link` with {} in {}, so it cannot publish a run claim: a claim decides which worker owns a run by exclusively creating a hard link, and a volume without hard-link support cannot make that decision. Refusing rather than degrading to a non-atomic create (under which two workers can both restore the run and both run its tools). Ways out: put the store's base directory on a filesystem with hard-link support, or run a single writer per run (one process per directory, with the in-memory store or your own arbitration)",
            errno::name(code),
            dir.display()
        ),
    }
}

fn link_error(ctx: &Ctx, claims_dir: &Path, target: &Path, e: io::Error) -> PublishError {
    match e.raw_os_error() {
        Some(c) if c == errno::EXIST => PublishError::Exists,
        Some(c) if crate::hard_links::is_no_hard_link_errno(c) => {
            PublishError::Failed(no_hard_links(ctx, claims_dir, c))
        }
        _ => PublishError::Failed(ctx.io("publish the holding", target, e)),
    }
}

/// Makes `claims/<fence>.json` appear with `body`, whole, or not at all.
pub(crate) fn publish(
    inner: &Inner,
    claims_dir: &Path,
    fence: Fence,
    body: &[u8],
    ctx: &Ctx,
) -> std::result::Result<(), PublishError> {
    match testing_hooks::mutation() {
        Mutation::PerFenceScratch => {
            return publish_via_scratch(inner, claims_dir, fence, body, ctx, false)
        }
        Mutation::OpenExclusiveThenWrite => {
            return publish_open_exclusive(claims_dir, fence, body, ctx)
        }
        _ => {}
    }
    if inner.tmpfile_enabled() && !testing_hooks::force_scratch() {
        match publish_via_tmpfile(inner, claims_dir, fence, body, ctx) {
            Some(r) => return r,
            None => inner.disable_tmpfile(),
        }
    }
    publish_via_scratch(inner, claims_dir, fence, body, ctx, true)
}

/// `O_TMPFILE` + `linkat`: the body is written to an unnamed file, then
/// linked in. Nothing to collide with, nothing to leak after a crash.
/// `None` when the filesystem (or a missing `/proc`) cannot do it.
fn publish_via_tmpfile(
    inner: &Inner,
    claims_dir: &Path,
    fence: Fence,
    body: &[u8],
    ctx: &Ctx,
) -> Option<std::result::Result<(), PublishError>> {
    use rustix::fs::{openat, Mode as FMode, OFlags, CWD};
    let fd = match openat(
        CWD,
        claims_dir,
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        FMode::from_raw_mode(crate::sys::FILE_MODE),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            let code = e.raw_os_error();
            if [
                errno::OPNOTSUPP,
                errno::NOTSUP,
                errno::ISDIR,
                errno::INVAL,
                errno::NOSYS,
            ]
            .contains(&code)
            {
                return None;
            }
            return Some(Err(PublishError::Failed(scratch_write_error(
                ctx,
                claims_dir,
                io::Error::from(e),
            ))));
        }
    };
    let mut file = fs::File::from(fd);
    if let Err(e) = file.write_all(body) {
        return Some(Err(PublishError::Failed(scratch_write_error(
            ctx, claims_dir, e,
        ))));
    }
    if inner.durability == Durability::PowerLoss {
        if let Err(e) = sys::sync_file(&file, claims_dir) {
            return Some(Err(PublishError::Failed(ctx.io(
                "sync a claim body in",
                claims_dir,
                e,
            ))));
        }
    }
    let target = claims_dir.join(format!("{fence}.json"));
    if let Err(e) = sys::link_unnamed(&file, &target) {
        if e.kind() == io::ErrorKind::NotFound && !Path::new("/proc/self/fd").exists() {
            return None;
        }
        return Some(Err(link_error(ctx, claims_dir, &target, e)));
    }
    if inner.durability == Durability::PowerLoss {
        if let Err(e) = sys::sync_dir(claims_dir) {
            return Some(Err(PublishError::Failed(ctx.io(
                "sync the claims directory",
                claims_dir,
                e,
            ))));
        }
    }
    Some(Ok(()))
}

fn scratch_write_error(ctx: &Ctx, claims_dir: &Path, e: io::Error) -> Error {
    ctx.io(
        "write a claim into the run's claims directory (taking a run writes there; check that this process can create files in it)",
        claims_dir,
        e,
    )
}

/// The scratch-name publish (a holding is never visible before its body
/// is whole): write the body to a per-attempt
/// unique scratch name in the claims directory, `link` it to the fence name,
/// unlink the scratch name.
fn publish_via_scratch(
    inner: &Inner,
    claims_dir: &Path,
    fence: Fence,
    body: &[u8],
    ctx: &Ctx,
    unique: bool,
) -> std::result::Result<(), PublishError> {
    let name = if unique {
        let (pid, n, r) = sys::unique_parts();
        format!("{SCRATCH_PREFIX}{pid}-{n}-{r}-{fence}")
    } else {
        // Mutation only: a scratch name that is a function of the fence.
        format!("{SCRATCH_PREFIX}{fence}")
    };
    let scratch = claims_dir.join(&name);
    let written = sys::create_scratch(&scratch, body, unique);
    let file = match written {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(PublishError::Failed(Error::Backend {
                message: format!(
                    "{} on run {}: the scratch name {} already exists (fence {fence}). Scratch names are unique per attempt, so a collision means two publishes share one, which would let a claim publish a body it did not write; refusing rather than reporting a lost race",
                    ctx.operation,
                    ctx.run,
                    scratch.display()
                ),
                source: Some(Box::new(e)),
            }))
        }
        Err(e) => {
            let _ = fs::remove_file(&scratch);
            return Err(PublishError::Failed(scratch_write_error(ctx, claims_dir, e)));
        }
    };
    let result = (|| {
        if inner.durability == Durability::PowerLoss {
            sys::sync_file(&file, &scratch)
                .map_err(|e| PublishError::Failed(ctx.io("sync a claim body", &scratch, e)))?;
        }
        drop(file);
        testing_hooks::pause_once(testing_hooks::Pause::ScratchBeforeLink);
        let target = claims_dir.join(format!("{fence}.json"));
        sys::hard_link(&scratch, &target).map_err(|e| link_error(ctx, claims_dir, &target, e))?;
        if inner.durability == Durability::PowerLoss {
            sys::sync_dir(claims_dir).map_err(|e| {
                PublishError::Failed(ctx.io("sync the claims directory", claims_dir, e))
            })?;
        }
        Ok(())
    })();
    // The link, if it landed, is an independent name for the same file. A
    // failed unlink leaks a scratch file, which the age sweep reclaims and no
    // reader can mistake for a holding.
    let _ = fs::remove_file(&scratch);
    result
}

/// Mutation only: create the holding exclusively, then write its body (the
/// publish the lease rule forbids: for an instant the name exists and is empty).
fn publish_open_exclusive(
    claims_dir: &Path,
    fence: Fence,
    body: &[u8],
    ctx: &Ctx,
) -> std::result::Result<(), PublishError> {
    let target = claims_dir.join(format!("{fence}.json"));
    let mut f = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(crate::sys::FILE_MODE)
        .open(&target)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(PublishError::Exists),
        Err(e) => return Err(PublishError::Failed(ctx.io("create", &target, e))),
    };
    std::thread::yield_now();
    testing_hooks::pause_once(testing_hooks::Pause::OpenExclusiveBeforeWrite);
    f.write_all(body)
        .map_err(|e| PublishError::Failed(ctx.io("write", &target, e)))
}

/// Holdings unlinked by one claim or release at most. A directory that
/// accumulated a huge backlog (a crashed pruner, an old reference version)
/// is worked down a slice per call instead of making one claim take seconds.
pub(crate) const MAX_PRUNE_PER_CALL: usize = 256;

/// Holdings found younger than the grace period after which one prune stops
/// looking. Names are linked in fence order, so above a young name the
/// names are nearly always young too; a young name far below the top (a
/// late link) costs one probe. Stopping early only keeps names longer: the
/// next prune, one grace period later at most, finds them old.
pub(crate) const YOUNG_PROBES_PER_CALL: usize = 8;

/// When a holding name appeared, as the filesystem stamped it: the inode's
/// change time. Linking the name sets it, and every later change of the
/// inode (another link, the unlink of the scratch name it was linked from)
/// only moves it later, so it is never earlier than the link. The
/// modification time is not used: it is the time the body was written,
/// which a writer stopped between its write and its link leaves arbitrarily
/// far before the name existed (so a name just linked would look old).
/// `None` for a time before 1970 (judged old).
fn appeared_at(meta: &fs::Metadata) -> Option<SystemTime> {
    use std::os::unix::fs::MetadataExt;
    let secs = u64::try_from(meta.ctime()).ok()?;
    let nanos = u32::try_from(meta.ctime_nsec())
        .ok()
        .filter(|n| *n < 1_000_000_000)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// The instant names are aged against: the change time of the top holding
/// `top` (which the caller has just linked, or which superseded its link),
/// so that a name's age is the difference of two timestamps the same clock
/// made, the filesystem's: not the store's clock (an injected test clock may
/// say 1970 or next year), and not this machine's clock, which on a network
/// filesystem may be skewed from the file server's that stamps the names.
/// The machine clock only when the top cannot be read.
fn names_now(claims_dir: &Path, top: Fence) -> SystemTime {
    fs::symlink_metadata(claims_dir.join(format!("{top}.json")))
        .ok()
        .and_then(|m| appeared_at(&m))
        .unwrap_or_else(SystemTime::now)
}

/// True when a name that appeared at `appeared` is still inside the grace
/// period at `now`. A name stamped more than the grace period *after* `now`
/// cannot be judged (the clock was stepped back since): it is judged old,
/// which is the count-only pruning of a store without a grace period,
/// rather than kept for as long as the step.
fn within_grace(appeared: Option<SystemTime>, now: SystemTime, grace: Duration) -> bool {
    let Some(at) = appeared else {
        return false;
    };
    match now.duration_since(at) {
        Ok(age) => age < grace,
        Err(ahead) => ahead.duration() <= grace,
    }
}

/// Housekeeping after a successful acquire (or release) at `top`: unlink
/// holdings more than [`KEEP_BELOW_TOP`] below it that appeared more than
/// `grace` ago ([`crate::FsOptions::prune_grace`]), lowest first and at most
/// [`MAX_PRUNE_PER_CALL`] of them, and scratch files older than
/// [`SCRATCH_TTL`] (wall clock, never the injected lease clock). Runs after
/// the run lock is dropped (it never changes the top, so writers need not
/// wait for it). Failures are swallowed: housekeeping must not fail a claim.
///
/// The grace period is what keeps a name alive for a claimer that read the
/// top, is on its way to linking the next number, and will not check after
/// its link (the reference): the name it aims at appeared after its read,
/// so while its read-to-link time is below `grace` no prune finds that name
/// old, and its link collides instead of re-issuing the fence. Names
/// younger than `grace` are never unlinked, so beyond the 33-name window
/// the directory holds at most the names the run's claims and releases
/// created in the last grace period.
fn prune(claims_dir: &Path, top: Fence, scan: &Scan, grace: Duration) {
    let floor = top.get().saturating_sub(KEEP_BELOW_TOP);
    // Ascending, so that even a crash mid-prune removes only a prefix.
    let mut doomed: Vec<&(Fence, String)> = scan
        .holdings
        .iter()
        .filter(|(f, _)| f.get() < floor)
        .collect();
    doomed.sort_by_key(|(f, _)| *f);
    let now = (!grace.is_zero() && !doomed.is_empty()).then(|| names_now(claims_dir, top));
    let (mut tried, mut young) = (0, 0);
    for (_, name) in doomed {
        if tried == MAX_PRUNE_PER_CALL || young == YOUNG_PROBES_PER_CALL {
            break;
        }
        let path = claims_dir.join(name);
        if let Some(now) = now {
            let Ok(meta) = fs::symlink_metadata(&path) else {
                // Gone already (another pruner).
                tried += 1;
                continue;
            };
            if within_grace(appeared_at(&meta), now, grace) {
                young += 1;
                continue;
            }
        }
        let _ = fs::remove_file(&path);
        tried += 1;
    }
    if scan.scratch.is_empty() {
        return;
    }
    let now = SystemTime::now();
    for name in scan.scratch.iter().take(MAX_PRUNE_PER_CALL) {
        let path = claims_dir.join(name);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let Ok(mtime) = meta.modified() else { continue };
        if now.duration_since(mtime).unwrap_or_default() >= SCRATCH_TTL {
            let _ = fs::remove_file(&path);
        }
    }
}

/// Holdings of `scan` that the next prune would find due: more than
/// [`KEEP_BELOW_TOP`] below the top and older than `grace` (judged as
/// [`prune`] judges them). Read-only; for the doctor.
pub(crate) fn overdue(claims_dir: &Path, scan: &Scan, grace: Duration) -> usize {
    let Some((top, _)) = scan.top() else {
        return 0;
    };
    let floor = top.get().saturating_sub(KEEP_BELOW_TOP);
    let below = scan.holdings.iter().filter(|(f, _)| f.get() < floor);
    if grace.is_zero() {
        return below.count();
    }
    let now = names_now(claims_dir, *top);
    below
        .filter(|(_, name)| {
            fs::symlink_metadata(claims_dir.join(name))
                .is_ok_and(|m| !within_grace(appeared_at(&m), now, grace))
        })
        .count()
}

/// True when the entry at `path` exists and is not a regular file.
fn is_foreign_non_regular(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| !m.is_file())
}

/// What the listing after a successful link says about it.
enum AfterLink {
    /// Nothing above the linked fence: it is the top, issued for the first
    /// time (a name that was issued before and pruned can only be missing
    /// because the run moved at least 33 fences past it, and the top is never
    /// removed, so something above it would still be listed).
    Top(Scan),
    /// A holding above the linked fence exists: the link landed on a name
    /// pruned long ago (the caller was delayed between its read and its
    /// link), or the lease was superseded before it could be handed back.
    /// Either way it is not the caller's.
    Superseded { above: Fence, scan: Scan },
}

/// The post-link check (a fence number is never issued twice): a hard link proves only that the
/// name did not exist at that instant, not that it was never issued.
/// "A fence above every fence ever issued" is proved by listing the
/// directory after the link and finding nothing above it.
fn after_link(claims_dir: &Path, fence: Fence, ctx: &Ctx) -> Result<AfterLink> {
    let s = scan(claims_dir)
        .map_err(|e| ctx.io("list the claims directory", claims_dir, e))?
        .unwrap_or_default();
    if testing_hooks::skip_post_link_check() {
        return Ok(AfterLink::Top(s));
    }
    match s.top().map(|(f, _)| *f) {
        Some(above) if above > fence => Ok(AfterLink::Superseded { above, scan: s }),
        _ => Ok(AfterLink::Top(s)),
    }
}

/// Claims, renews or reclaims a run: the top holding decides, a lost
/// link race is retried with jittered backoff, and persistent contention
/// is its own `Contended` outcome.
///
/// A lease is handed back only when, after its link, nothing above its
/// fence exists (see [`after_link`]) and its expiry has not passed on the
/// claim's clock plus the time the claim itself took.
pub(crate) fn claim(
    inner: &Inner,
    scope: &RunScope,
    options: &ClaimOptions,
) -> Result<ClaimOutcome> {
    inner.refuse_read_only()?;
    let ctx = Ctx::new(scope, "claim");
    let started = std::time::Instant::now();
    let now = options.judged_at(|| inner.now());
    let run_dir = inner.run_dir(scope);
    let claims_dir = run_dir.join(CLAIMS_DIR);
    inner.check_poison()?;
    sys::ensure_dir(&claims_dir, inner.durability)
        .map_err(|e| ctx.io("create the claims directory", &claims_dir, e))
        .map_err(|e| inner.note(e))?;
    let lock = RunLock::acquire(&run_dir, Mode::Shared, inner.durability, &ctx)?;
    // The record changes only under the exclusive run lock (finish,
    // enqueue, reopen) or by the winner of a dead-lettering link: read once.
    let record = run_state::read_record(&run_dir, &ctx)?;
    // A keyed run: the key lock from the count to the log line of the
    // holding (`crate::keys`), taken after the run lock (the one order).
    let key = record
        .as_ref()
        .and_then(|r| r.lifecycle.concurrency.as_ref());
    if key.is_some() {
        // First without the key lock: a run someone else holds live (or
        // finished, or deferred) is answered at once, so the losers of a
        // race for one run do not queue on its key's lock.
        let s = scan(&claims_dir)
            .map_err(|e| ctx.io("list the claims directory", &claims_dir, e))?
            .unwrap_or_default();
        let holding = holding_of(&claims_dir, &s, &ctx)?;
        let state = run_state::state_with(record.as_ref(), holding.as_ref(), &claims_dir, &ctx);
        match lifecycle::plan_claim(
            &scope.run_id,
            state.top.as_ref(),
            &state.lifecycle,
            &options.holder,
            now,
            options.max_attempts,
            0,
        )? {
            ClaimPlan::Held(summary) => return Ok(ClaimOutcome::Held(summary)),
            ClaimPlan::Finished(status) => return Ok(ClaimOutcome::Finished(status)),
            ClaimPlan::NotBefore(at) => return Ok(ClaimOutcome::NotBefore(at)),
            _ => {}
        }
    }
    let mut guard = match key {
        Some(c) => Some(KeyGuard::lock(inner, &c.key, &ctx)?),
        None => None,
    };
    // The instant the key is judged and the holding starts in its history:
    // the claim's, or the store clock's under the key lock when that is
    // later (a claim that waited for the lock must not start its holding
    // before the end the previous holder logged).
    let key_now = now.max(inner.now());
    let key_held = match &guard {
        Some(g) => {
            let n = g.held_by_others(scope, key_now, &ctx)?;
            testing_hooks::trace(testing_hooks::Trace::KeyCounted(scope.run_id.as_str(), n));
            testing_hooks::pause_once(testing_hooks::Pause::KeyAfterCount);
            if testing_hooks::mutation() == Mutation::KeyCountZero {
                0
            } else {
                n
            }
        }
        None => 0,
    };
    let expires_at = now.plus(options.ttl);
    let mut lost = 0;
    let mut floor: Option<Fence> = None;
    for _ in 0..(MAX_ATTEMPTS + 64) {
        // Read again under the key lock (never the pre-check's read): no
        // other claim of this store can move the run while this one holds
        // the key lock, so the held-set entry written below names the
        // fence this attempt really links, and a later end logs the end of
        // that holding (a stale read here let the churn test find a key
        // held past its limit in the history).
        let s = scan(&claims_dir)
            .map_err(|e| ctx.io("list the claims directory", &claims_dir, e))?
            .unwrap_or_default();
        let holding = holding_of(&claims_dir, &s, &ctx)?;
        let state = run_state::state_with(record.as_ref(), holding.as_ref(), &claims_dir, &ctx);
        let plan = lifecycle::plan_claim(
            &scope.run_id,
            state.top.as_ref(),
            &state.lifecycle,
            &options.holder,
            now,
            options.max_attempts,
            key_held,
        )?;
        // What this attempt publishes: a lease, or (dead-lettering) a
        // tombstone that finishes the run.
        let (mut fence, body, dead) = match plan {
            ClaimPlan::Held(summary) => return Ok(ClaimOutcome::Held(summary)),
            ClaimPlan::Finished(status) => return Ok(ClaimOutcome::Finished(status)),
            ClaimPlan::NotBefore(at) => return Ok(ClaimOutcome::NotBefore(at)),
            ClaimPlan::AtLimit(busy) => return Ok(ClaimOutcome::AtLimit(busy)),
            ClaimPlan::Take { fence, takeover } => {
                let attempts = lifecycle::after_take(&state.lifecycle, takeover).attempts;
                let body = lease_body(options.holder.as_str(), expires_at.as_millis(), attempts);
                (fence, body, None)
            }
            ClaimPlan::Exhausted { fence, attempts } => {
                let body = tomb_body(attempts, None, Some(now));
                (fence, body, Some(Ends::Exhausted(attempts)))
            }
            // A plain tombstone: the record written after the link says
            // why. Should the record never land, the run reads as released
            // and its next claim judges the deadline again.
            ClaimPlan::PastDeadline { fence } => {
                let body = tomb_body(state.lifecycle.attempts, None, None);
                (fence, body, Some(Ends::PastDeadline))
            }
        };
        if let Some(fl) = floor {
            if fence <= fl {
                fence = fl.next(&scope.run_id)?;
            }
        }
        if let (Some(g), None) = (&guard, &dead) {
            // Before the link: a crash after it still leaves the run in
            // the key's held set, so the next count reads its holding.
            if testing_hooks::mutation() != Mutation::HeldAfterLog {
                g.note_taking(scope, fence).map_err(|e| inner.note(e))?;
            }
        }
        testing_hooks::pause_once(testing_hooks::Pause::ClaimBeforeLink);
        testing_hooks::delay(testing_hooks::Delay::ClaimBeforeLink);
        match publish(inner, &claims_dir, fence, &body, &ctx) {
            Ok(()) => {
                testing_hooks::trace(testing_hooks::Trace::Linked(fence));
                match after_link(&claims_dir, fence, &ctx)? {
                    AfterLink::Top(after) => {
                        if let Some(ends) = dead {
                            // Dead-lettered (or past its deadline) by the
                            // link (the commit point); the record
                            // materializes it (written under the shared
                            // lock: only the link's winner writes it, and
                            // record writers with the exclusive lock are
                            // excluded).
                            testing_hooks::pause(testing_hooks::Pause::DeadLetterAfterLink);
                            let l = match ends {
                                Ends::Exhausted(attempts) => {
                                    lifecycle::exhausted(&state.lifecycle, fence, attempts, now)
                                }
                                Ends::PastDeadline => {
                                    lifecycle::past_deadline(&state.lifecycle, fence, now)
                                }
                            };
                            let rec = Record::new(l.clone(), fence.get());
                            run_state::write(&run_dir, &rec, inner.durability, &ctx)
                                .map_err(|e| inner.note(e))?;
                            drop(lock);
                            prune(&claims_dir, fence, &after, inner.prune_grace);
                            tracing::info!(run = %scope.run_id, attempts = l.attempts, reason = ?l.reason, "run finished by a claim");
                            return Ok(ClaimOutcome::Finished(l.status));
                        }
                        if let Some(g) = guard.take() {
                            // The history, still under the key lock; then
                            // the lock goes (a release of an expired win
                            // below takes it again).
                            testing_hooks::pause(testing_hooks::Pause::KeyAfterLink);
                            g.log_acquired(scope, fence, key_now, expires_at)
                                .map_err(|e| inner.note(e))?;
                            if testing_hooks::mutation() == Mutation::HeldAfterLog {
                                g.note_taking(scope, fence).map_err(|e| inner.note(e))?;
                            }
                        }
                        drop(lock);
                        prune(&claims_dir, fence, &after, inner.prune_grace);
                        testing_hooks::delay(testing_hooks::Delay::ClaimAfterLink);
                        let timeout = state.lifecycle.attempt_timeout_ms;
                        return hand_back(
                            inner, scope, options, fence, now, started, timeout, &ctx,
                        );
                    }
                    AfterLink::Superseded { above, scan: after } => {
                        testing_hooks::trace(testing_hooks::Trace::RefusedAfterLink {
                            fence,
                            above,
                        });
                        tracing::debug!(run = %scope.run_id, %fence, %above, "claim linked a fence the run had already moved past; not handed back");
                        // The stale name sits far below the top: the same
                        // bounded prune that keeps the directory small
                        // removes it once it is past the grace period.
                        prune(&claims_dir, above, &after, inner.prune_grace);
                        lost += 1;
                        if lost >= MAX_ATTEMPTS {
                            return Err(Error::Contended {
                                run: scope.run_id.to_string(),
                                attempts: lost,
                            });
                        }
                        continue;
                    }
                }
            }
            Err(PublishError::Exists) => {
                let target = claims_dir.join(format!("{fence}.json"));
                if is_foreign_non_regular(&target) {
                    // A directory (or other non-file) squats on this number.
                    // It is not a holding; step over it instead of wedging.
                    floor = Some(fence);
                    continue;
                }
                lost += 1;
                if lost >= MAX_ATTEMPTS {
                    return Err(Error::Contended {
                        run: scope.run_id.to_string(),
                        attempts: lost,
                    });
                }
                let pause = backoff::doubling(
                    Duration::from_micros(50),
                    Duration::from_micros(50 << 7),
                    lost,
                );
                std::thread::sleep(backoff::jitter(pause, 0.5));
            }
            Err(PublishError::Failed(e)) => return Err(inner.note(e)),
        }
    }
    Err(Error::Contended {
        run: scope.run_id.to_string(),
        attempts: lost,
    })
}

/// Hands back a won lease unless it already expired while the claim ran
/// (a claim slowed down by a huge claims directory or a stalled
/// disk must not return a lease someone else may already be taking). An
/// expired win is released at once (a clean release: the next claimer
/// takes it without waiting) and answered as retryable `Unavailable`.
#[expect(
    clippy::too_many_arguments,
    reason = "the one call site passes what the claim loop already holds; a struct would only rename them"
)]
fn hand_back(
    inner: &Inner,
    scope: &RunScope,
    options: &ClaimOptions,
    fence: Fence,
    now: Timestamp,
    started: std::time::Instant,
    attempt_timeout_ms: Option<u64>,
    ctx: &Ctx,
) -> Result<ClaimOutcome> {
    let expires_at = now.plus(options.ttl);
    let took = started.elapsed();
    let took_ms = i64::try_from(took.as_millis()).unwrap_or(i64::MAX);
    let judged_at =
        Timestamp::from_millis(now.as_millis().saturating_add(took_ms)).unwrap_or(expires_at);
    if runkeep::lease::is_expired(expires_at, judged_at) {
        if let Ok(true) = release(inner, scope, fence) {
            crate::keys::after_end(inner, scope, "claim");
        }
        return Err(Error::Unavailable {
            message: format!(
                "{} on run {}: the claim took {} ms, longer than its ttl, so the lease at fence {fence} had expired before it could be handed back; it was released again. Retry, with a ttl well above the time a claim takes on this volume (`runkeep doctor` reports the claims directory size)",
                ctx.operation,
                ctx.run,
                took.as_millis()
            ),
            source: None,
            outcome_unknown: false,
        });
    }
    Ok(ClaimOutcome::Acquired(Lease {
        holder: options.holder.clone(),
        fence,
        expires_at,
        attempt_timeout_ms,
    }))
}

/// How a claim that finishes the run instead of handing it out ends it.
#[derive(Clone, Copy)]
enum Ends {
    /// Dead-lettered at this attempt count.
    Exhausted(u32),
    /// Past the run's deadline.
    PastDeadline,
}
/// The holding at exactly `fence`, read by name (no directory listing).
pub(crate) fn holding_at(claims_dir: &Path, fence: Fence, ctx: &Ctx) -> Result<Option<Holding>> {
    let path = claims_dir.join(format!("{fence}.json"));
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(None),
        Err(e) if sys::is_not_found(&e) => return Ok(None),
        Err(e) => return Err(ctx.io("read the holding", &path, e)),
    }
    match sys::read_opt(&path) {
        Ok(Some(bytes)) => Ok(Some(parse_holding(fence, &bytes))),
        Ok(None) => Ok(None),
        Err(e) => Err(ctx.io("read the holding", &path, e)),
    }
}

/// Releases the run if `fence` is its top holding: publishes the tombstone
/// at `fence + 1`. A stale or unknown fence is a no-op (`false`).
///
/// The releaser names its fence, so the tombstone's own hard link at
/// `fence + 1` answers "did anyone move on": it fails with "exists" when a
/// claimer took the next number. A link that succeeds proves only that the
/// name was free at that instant; a releaser delayed between its read and
/// its link may land on a name pruned long ago. So, as for a claim, the
/// directory is listed after the link and the release counts only when
/// nothing is above the tombstone. The same listing drives the bounded
/// prune (a release keeps `claims/` at 33 names too).
pub(crate) fn release(inner: &Inner, scope: &RunScope, fence: Fence) -> Result<bool> {
    release_with(inner, scope, fence, None, "release")
}

/// [`release`], with the tombstone deferring the run until `available_at`
/// (snooze) when given. The tombstone carries the run's attempt count.
pub(crate) fn release_with(
    inner: &Inner,
    scope: &RunScope,
    fence: Fence,
    available_at: Option<Timestamp>,
    operation: &'static str,
) -> Result<bool> {
    inner.refuse_read_only()?;
    let ctx = Ctx::new(scope, operation);
    let run_dir = inner.run_dir(scope);
    let claims_dir = run_dir.join(CLAIMS_DIR);
    // Read-only refusal first: no such lease, nothing to do, nothing touched.
    let mine = holding_at(&claims_dir, fence, &ctx)?;
    let Some(tomb) = decide_release(&scope.run_id, mine.as_ref().map(|h| &h.top), fence)? else {
        return Ok(false);
    };
    let state = run_state::read_state(&run_dir, &ctx)?;
    if state
        .lifecycle
        .finished_fence
        .is_some_and(|f| state.lifecycle.status.is_finished() && f >= fence)
    {
        // Spent by a finish: nothing left to release.
        return Ok(false);
    }
    let attempts = mine
        .as_ref()
        .and_then(|h| h.attempts)
        .unwrap_or(state.lifecycle.attempts);
    inner.check_poison()?;
    let lock = RunLock::acquire(&run_dir, Mode::Shared, inner.durability, &ctx)?;
    testing_hooks::pause_once(testing_hooks::Pause::ReleaseBeforeLink);
    testing_hooks::delay(testing_hooks::Delay::ReleaseBeforeLink);
    match publish(
        inner,
        &claims_dir,
        tomb,
        &tomb_body(attempts, available_at, None),
        &ctx,
    ) {
        Ok(()) => {
            testing_hooks::trace(testing_hooks::Trace::Tombstone(tomb));
            let after = after_link(&claims_dir, tomb, &ctx);
            drop(lock);
            match after? {
                AfterLink::Top(after) => {
                    prune(&claims_dir, tomb, &after, inner.prune_grace);
                    Ok(true)
                }
                AfterLink::Superseded { above, scan: after } => {
                    testing_hooks::trace(testing_hooks::Trace::RefusedAfterLink {
                        fence: tomb,
                        above,
                    });
                    prune(&claims_dir, above, &after, inner.prune_grace);
                    Ok(false)
                }
            }
        }
        // Someone already took the next number: nothing left to release.
        Err(PublishError::Exists) => Ok(false),
        Err(PublishError::Failed(e)) => Err(inner.note(e)),
    }
}

/// The lease read: the top holding, judged at `now`.
impl Inner {
    pub(crate) fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        self.check_scope(scope)?;
        let ctx = Ctx::new(scope, "lease");
        Ok(read_top(&self.run_dir(scope), &ctx)?.map(|t| t.summary(now)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_names_are_holdings() {
        assert_eq!(holding_fence("1.json"), Some(Fence::FIRST));
        assert_eq!(
            holding_fence("999999999999999.json").map(Fence::get),
            Some(999_999_999_999_999)
        );
        for bad in [
            "0.json",
            "007.json",
            "0x10.json",
            " 7.json",
            "1e21.json",
            "1000000000000000.json",
            "7.json.tmp",
            ".tmp-1-2-abc-7",
            "7",
            "-1.json",
            "+1.json",
            "7.JSON",
            "١.json",
        ] {
            assert_eq!(holding_fence(bad), None, "{bad}");
        }
    }

    #[test]
    fn bodies_parse_strictly_and_never_grant_when_unreadable() {
        let f = Fence::new(3).unwrap();
        assert!(matches!(
            parse_body(f, br#"{"holder":"","expiresAt":0}"#),
            TopHolding::Released { .. }
        ));
        assert!(matches!(
            parse_body(f, br#"{"holder":"w","expiresAt":5}"#),
            TopHolding::Lease { .. }
        ));
        for bad in [
            &b""[..],
            b"{",
            b"null",
            b"[]",
            br#"{"holder":"w"}"#,
            br#"{"holder":"","expiresAt":5}"#,
            br#"{"holder":7,"expiresAt":5}"#,
            br#"{"holder":"w","expiresAt":"5"}"#,
        ] {
            assert!(
                matches!(parse_body(f, bad), TopHolding::Unreadable { .. }),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
