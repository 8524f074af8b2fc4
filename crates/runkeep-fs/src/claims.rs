//! The fenced lease on a filesystem (spec §3): the fence is the file name.
//!
//! A run's holdings are `claims/<fence>.json`. Taking the run is creating the
//! next number with a hard `link` from a body that is already whole, so the
//! kernel picks exactly one winner per number and no reader ever sees a
//! holding name without its complete body. The body is
//! `{"holder","expiresAt"}`; a release publishes the tombstone
//! `{"holder":"","expiresAt":0}` at `fence + 1`. Holdings more than 32 below
//! the top are pruned; scratch files older than ten minutes are swept.
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

use runkeep::lease::{decide_claim, decide_release, ClaimDecision};
use runkeep::{
    ClaimOptions, ClaimOutcome, Error, Fence, Holder, Lease, Result, RunScope, Timestamp,
    TopHolding,
};
use serde_json::Value;

use crate::lock::{self, Mode, RunLock};
use crate::sys::{self, errno, Ctx};
use crate::testing_hooks::{self, Mutation, Point};
use crate::{Durability, Inner};

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

/// Parses a holding body. Anything but a well-formed body reads as an
/// unreadable holding (expired, anonymous): an unreadable value never grants.
pub(crate) fn parse_body(fence: Fence, bytes: &[u8]) -> TopHolding {
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(bytes) else {
        return TopHolding::Unreadable { fence };
    };
    let (Some(Value::String(holder)), Some(exp)) = (m.get("holder"), m.get("expiresAt")) else {
        return TopHolding::Unreadable { fence };
    };
    let Some(exp) = exp.as_f64().filter(|f| f.is_finite()) else {
        return TopHolding::Unreadable { fence };
    };
    if holder.is_empty() && exp == 0.0 {
        return TopHolding::Released { fence };
    }
    let Ok(holder) = Holder::new(holder.clone()) else {
        return TopHolding::Unreadable { fence };
    };
    let ms = exp
        .floor()
        .clamp(0.0, runkeep::time::MAX_TIMESTAMP_MS as f64) as i64;
    TopHolding::Lease {
        fence,
        holder,
        expires_at: Timestamp::from_millis(ms).unwrap_or(Timestamp::EPOCH),
    }
}

/// The body of a holding.
pub(crate) fn body(holder: &str, expires_at: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "holder": holder, "expiresAt": expires_at }))
        .unwrap_or_default()
}

/// Reads the top holding named by a scan.
fn top_of(claims_dir: &Path, scan: &Scan, ctx: &Ctx) -> Result<Option<TopHolding>> {
    let Some((fence, name)) = scan.top() else {
        return Ok(None);
    };
    let path = claims_dir.join(name);
    match sys::read_opt(&path) {
        Ok(Some(bytes)) => Ok(Some(parse_body(*fence, &bytes))),
        // Vanished or replaced by a non-file since the listing: the name
        // already told the taker everything it needs.
        Ok(None) => Ok(Some(TopHolding::Unreadable { fence: *fence })),
        Err(e) if e.raw_os_error() == Some(errno::ISDIR) => {
            Ok(Some(TopHolding::Unreadable { fence: *fence }))
        }
        Err(e) => Err(ctx.io("read the holding", &path, e)),
    }
}

/// The run's top holding; `None` when it was never claimed. Reads only.
pub(crate) fn read_top(run_dir: &Path, ctx: &Ctx) -> Result<Option<TopHolding>> {
    let dir = run_dir.join(CLAIMS_DIR);
    match scan(&dir).map_err(|e| ctx.io("list the claims directory", &dir, e))? {
        Some(s) => top_of(&dir, &s, ctx),
        None => Ok(None),
    }
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
        Some(c) if errno::is_no_hard_link(c) => {
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
        Mutation::None | Mutation::NoWriteFence | Mutation::NoRunLock => {}
        Mutation::PerFenceScratch => {
            return publish_via_scratch(inner, claims_dir, fence, body, ctx, false)
        }
        Mutation::OpenExclusiveThenWrite => {
            return publish_open_exclusive(claims_dir, fence, body, ctx)
        }
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
    use rustix::fs::{linkat, openat, AtFlags, Mode as FMode, OFlags, CWD};
    use std::os::fd::AsRawFd;
    let fd = match openat(
        CWD,
        claims_dir,
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        FMode::from_raw_mode(0o644),
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
    if let Err(e) = testing_hooks::fault(Point::Link, &target) {
        return Some(Err(link_error(ctx, claims_dir, &target, e)));
    }
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    match linkat(
        CWD,
        proc_path.as_str(),
        CWD,
        &target,
        AtFlags::SYMLINK_FOLLOW,
    ) {
        Ok(()) => {}
        Err(e) => {
            if e == rustix::io::Errno::NOENT && !Path::new("/proc/self/fd").exists() {
                return None;
            }
            return Some(Err(link_error(
                ctx,
                claims_dir,
                &target,
                io::Error::from(e),
            )));
        }
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

/// The scratch-name publish (spec FL-20): write the body to a per-attempt
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
    let written = (|| -> io::Result<fs::File> {
        testing_hooks::fault(Point::ScratchCreate, &scratch)?;
        let mut opts = OpenOptions::new();
        opts.write(true)
            .mode(0o644)
            .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32);
        if unique {
            opts.create_new(true);
        } else {
            opts.create(true).truncate(true);
        }
        let mut f = opts.open(&scratch)?;
        f.write_all(body)?;
        Ok(f)
    })();
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
        testing_hooks::pause_once("scratch-before-link");
        let target = claims_dir.join(format!("{fence}.json"));
        testing_hooks::fault(Point::Link, &target)
            .and_then(|()| fs::hard_link(&scratch, &target))
            .map_err(|e| link_error(ctx, claims_dir, &target, e))?;
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
/// publish FL-21 forbids: for an instant the name exists and is empty).
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
        .mode(0o644)
        .open(&target)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(PublishError::Exists),
        Err(e) => return Err(PublishError::Failed(ctx.io("create", &target, e))),
    };
    std::thread::yield_now();
    testing_hooks::pause_once("open-exclusive-before-write");
    f.write_all(body)
        .map_err(|e| PublishError::Failed(ctx.io("write", &target, e)))
}

/// Holdings unlinked by one claim or release at most. A directory that
/// accumulated a huge backlog (a crashed pruner, an old reference version)
/// is worked down a slice per call instead of making one claim take seconds.
pub(crate) const MAX_PRUNE_PER_CALL: usize = 256;

/// Housekeeping after a successful acquire (or release) at `top`: unlink
/// holdings more than [`KEEP_BELOW_TOP`] below it, lowest first and at most
/// [`MAX_PRUNE_PER_CALL`] of them, and scratch files older than
/// [`SCRATCH_TTL`] (wall clock, never the injected lease clock). Runs after
/// the run lock is dropped (it never changes the top, so writers need not
/// wait for it). Failures are swallowed: housekeeping must not fail a claim.
fn prune(claims_dir: &Path, top: Fence, scan: &Scan) {
    let floor = top.get().saturating_sub(KEEP_BELOW_TOP);
    // Ascending, so that even a crash mid-prune removes only a prefix.
    let mut doomed: Vec<&(Fence, String)> = scan
        .holdings
        .iter()
        .filter(|(f, _)| f.get() < floor)
        .collect();
    doomed.sort_by_key(|(f, _)| *f);
    for (_, name) in doomed.into_iter().take(MAX_PRUNE_PER_CALL) {
        let _ = fs::remove_file(claims_dir.join(name));
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

/// The post-link check (issue 8, item 1): a hard link proves only that the
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

/// Claims, renews or reclaims a run (spec FL-17, with a distinct
/// `Contended` outcome and jittered backoff).
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
    let now = options.now();
    let run_dir = inner.run_dir(scope);
    let claims_dir = run_dir.join(CLAIMS_DIR);
    inner.check_poison()?;
    sys::ensure_dir(&claims_dir, inner.durability)
        .map_err(|e| ctx.io("create the claims directory", &claims_dir, e))
        .map_err(|e| inner.note(e))?;
    let lock = RunLock::acquire(&run_dir, Mode::Shared, inner.durability, &ctx)?;
    let expires_at = now.plus(options.ttl);
    let body = body(options.holder.as_str(), expires_at.as_millis());
    let mut lost = 0;
    let mut floor: Option<Fence> = None;
    for _ in 0..(MAX_ATTEMPTS + 64) {
        let s = scan(&claims_dir)
            .map_err(|e| ctx.io("list the claims directory", &claims_dir, e))?
            .unwrap_or_default();
        let top = top_of(&claims_dir, &s, &ctx)?;
        let mut fence = match decide_claim(&scope.run_id, top.as_ref(), &options.holder, now)? {
            ClaimDecision::Held(summary) => return Ok(ClaimOutcome::Held(summary)),
            ClaimDecision::Take(f) => f,
        };
        if let Some(fl) = floor {
            if fence <= fl {
                fence = fl.next(&scope.run_id)?;
            }
        }
        testing_hooks::pause_once("claim-before-link");
        testing_hooks::delay("claim-before-link");
        match publish(inner, &claims_dir, fence, &body, &ctx) {
            Ok(()) => {
                testing_hooks::trace(|| format!("linked {fence}"));
                match after_link(&claims_dir, fence, &ctx)? {
                    AfterLink::Top(after) => {
                        drop(lock);
                        prune(&claims_dir, fence, &after);
                        testing_hooks::delay("claim-after-link");
                        return hand_back(inner, scope, options, fence, started, &ctx);
                    }
                    AfterLink::Superseded { above, scan: after } => {
                        testing_hooks::trace(|| {
                            format!("refused-after-link {fence} above {above}")
                        });
                        tracing::debug!(run = %scope.run_id, %fence, %above, "claim linked a fence the run had already moved past; not handed back");
                        // The stale name sits far below the top: the same
                        // bounded prune that keeps the directory small
                        // removes it.
                        prune(&claims_dir, above, &after);
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
                std::thread::sleep(lock::jitter(Duration::from_micros(50u64 << lost.min(7))));
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
/// (item 4: a claim slowed down by a huge claims directory or a stalled
/// disk must not return a lease someone else may already be taking). An
/// expired win is released at once (a clean release: the next claimer
/// takes it without waiting) and answered as retryable `Unavailable`.
fn hand_back(
    inner: &Inner,
    scope: &RunScope,
    options: &ClaimOptions,
    fence: Fence,
    started: std::time::Instant,
    ctx: &Ctx,
) -> Result<ClaimOutcome> {
    let now = options.now();
    let expires_at = now.plus(options.ttl);
    let took = started.elapsed();
    let took_ms = i64::try_from(took.as_millis()).unwrap_or(i64::MAX);
    let judged_at =
        Timestamp::from_millis(now.as_millis().saturating_add(took_ms)).unwrap_or(expires_at);
    if runkeep::lease::is_expired(expires_at, judged_at) {
        let _ = release(inner, scope, fence);
        return Err(Error::Unavailable {
            message: format!(
                "{} on run {}: the claim took {} ms, longer than its ttl, so the lease at fence {fence} had expired before it could be handed back; it was released again. Retry, with a ttl well above the time a claim takes on this volume (`runkeep doctor` reports the claims directory size)",
                ctx.operation,
                ctx.run,
                took.as_millis()
            ),
            source: None,
        });
    }
    Ok(ClaimOutcome::Acquired(Lease {
        holder: options.holder.clone(),
        fence,
        expires_at,
    }))
}
/// The holding at exactly `fence`, read by name (no directory listing).
fn holding_at(claims_dir: &Path, fence: Fence, ctx: &Ctx) -> Result<Option<TopHolding>> {
    let path = claims_dir.join(format!("{fence}.json"));
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Ok(None),
        Err(e) if sys::is_not_found(&e) => return Ok(None),
        Err(e) => return Err(ctx.io("read the holding", &path, e)),
    }
    match sys::read_opt(&path) {
        Ok(Some(bytes)) => Ok(Some(parse_body(fence, &bytes))),
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
    inner.refuse_read_only()?;
    let ctx = Ctx::new(scope, "release");
    let run_dir = inner.run_dir(scope);
    let claims_dir = run_dir.join(CLAIMS_DIR);
    // Read-only refusal first: no such lease, nothing to do, nothing touched.
    let mine = holding_at(&claims_dir, fence, &ctx)?;
    let Some(tomb) = decide_release(&scope.run_id, mine.as_ref(), fence)? else {
        return Ok(false);
    };
    inner.check_poison()?;
    let lock = RunLock::acquire(&run_dir, Mode::Shared, inner.durability, &ctx)?;
    testing_hooks::pause_once("release-before-link");
    testing_hooks::delay("release-before-link");
    match publish(inner, &claims_dir, tomb, &body("", 0), &ctx) {
        Ok(()) => {
            testing_hooks::trace(|| format!("tombstone {tomb}"));
            let after = after_link(&claims_dir, tomb, &ctx);
            drop(lock);
            match after? {
                AfterLink::Top(after) => {
                    prune(&claims_dir, tomb, &after);
                    Ok(true)
                }
                AfterLink::Superseded { above, scan: after } => {
                    testing_hooks::trace(|| format!("refused-after-link {tomb} above {above}"));
                    prune(&claims_dir, above, &after);
                    Ok(false)
                }
            }
        }
        // Someone already took the next number: nothing left to release.
        Err(PublishError::Exists) => Ok(false),
        Err(PublishError::Failed(e)) => Err(inner.note(e)),
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
