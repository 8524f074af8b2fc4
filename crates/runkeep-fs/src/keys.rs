//! Concurrency keys on a directory (`runkeep::scheduling::concurrency`):
//! the key lock, the held set and the key's history.
//!
//! Everything of one key lives in `<base>/.runkeep/keys/<encoded key>/`
//! (a store-level directory the reference never looks at: it lists only
//! `run_*` names):
//!
//! - `lock`: the key lock, a kernel-released `flock` held exclusive from
//!   the count to the log line of every claim of a run carrying the key;
//! - `held/<run>` (`<parent>.<run>` for a sub-run): one entry per run of
//!   the key this store published a holding of that may still be live; the
//!   body is the fence. Written **before** the holding is linked, so a
//!   crash between the link and the log can never hide a live holding from
//!   the count; removed once the holding is seen ended (an end of the
//!   run's own, or the count finding it no longer live);
//! - `log.jsonl`: the key's history, one line per event, appended under the
//!   lock: `{"acquired":{runId,parentRunId?,fence,acquiredAt,expiresAt}}`
//!   and `{"ended":{runId,parentRunId?,fence,at}}`, replayed into a
//!   [`KeyLog`] by [`key_holdings`].
//!
//! The count ([`KeyGuard::held_by_others`]) reads the held set and each
//! entry's real top holding (never the log): it costs the live holdings of
//! the key plus the stale entries it prunes, never every run of the key.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use runkeep::scheduling::concurrency::{KeyHolding, KeyLog};
use runkeep::{Error, Fence, Result, RunId, RunScope, Timestamp, TopHolding};
use serde::{Deserialize, Serialize};

use crate::inner::Inner;
use crate::lock::{Mode, RunLock, META_DIR};
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::{claims, run_state};

/// The keys directory inside the store's own `.runkeep/`.
pub(crate) const KEYS_DIR: &str = "keys";
/// The held set inside a key's directory.
pub(crate) const HELD_DIR: &str = "held";
/// The history inside a key's directory.
pub(crate) const LOG_FILE: &str = "log.jsonl";
/// The lock file inside a key's directory.
pub(crate) const LOCK_FILE: &str = "lock";

/// A key as one path segment: `[A-Za-z0-9_-]` kept, every other byte
/// (`.`, `:`, `@`, `/`) as `%XX`; a result above 200 bytes is cut and ends
/// with an FNV-1a 64 hash of the whole key.
pub(crate) fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > 200 {
        out.truncate(180);
        out.push_str(&format!("~{:016x}", fnv64(key.as_bytes())));
    }
    out
}

/// FNV-1a 64 (file names only; never a security boundary).
pub(crate) fn fnv64(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// The directory of `key` in the store at `base`.
pub(crate) fn key_dir(base: &Path, key: &str) -> PathBuf {
    base.join(META_DIR).join(KEYS_DIR).join(encode_key(key))
}

/// A run's name in the held set.
fn held_name(run: &RunId, parent: Option<&RunId>) -> String {
    match parent {
        Some(p) => format!("{p}.{run}"),
        None => run.to_string(),
    }
}

fn parse_held_name(name: &str) -> Option<(RunId, Option<RunId>)> {
    match name.split_once('.') {
        Some((p, r)) => Some((RunId::new(r).ok()?, Some(RunId::new(p).ok()?))),
        None => Some((RunId::new(name).ok()?, None)),
    }
}

/// A held-set entry: run, parent, and the fence it records.
type HeldEntry = (RunId, Option<RunId>, Option<Fence>);

/// One line of the history.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
enum LogLine {
    Acquired(KeyHolding),
    Ended(Ended),
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Ended {
    run_id: RunId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_run_id: Option<RunId>,
    fence: Fence,
    at: Timestamp,
}

/// The key lock, held: every count, held-set change and log line of the
/// key happens through it.
pub(crate) struct KeyGuard<'a> {
    inner: &'a Inner,
    dir: PathBuf,
    _lock: RunLock,
}

impl<'a> KeyGuard<'a> {
    /// Takes the lock of `key` (exclusive, bounded wait: `Unavailable` past
    /// it, nothing done).
    pub(crate) fn lock(inner: &'a Inner, key: &str, ctx: &Ctx) -> Result<KeyGuard<'a>> {
        let dir = key_dir(inner.base(), key);
        sys::ensure_dir(&dir.join(HELD_DIR), inner.durability)
            .map_err(|e| ctx.io("create the concurrency key's directory", &dir, e))?;
        let lock = RunLock::acquire_at(&dir.join(LOCK_FILE), Mode::Exclusive, ctx)?;
        Ok(KeyGuard {
            inner,
            dir,
            _lock: lock,
        })
    }

    fn held_dir(&self) -> PathBuf {
        self.dir.join(HELD_DIR)
    }

    /// The held set's entries: run, parent, and the fence recorded.
    fn entries(&self, ctx: &Ctx) -> Result<Vec<HeldEntry>> {
        let dir = self.held_dir();
        let items = sys::list_dir(&dir)
            .map_err(|e| ctx.io("list the concurrency key's held set", &dir, e))?
            .unwrap_or_default();
        let mut out = Vec::with_capacity(items.len());
        for i in items {
            if sys::is_transient_name(&i.name) {
                continue;
            }
            let Some((run, parent)) = parse_held_name(&i.name) else {
                continue;
            };
            let fence = sys::read_opt(&dir.join(&i.name))
                .ok()
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.trim().parse::<u64>().ok())
                .and_then(|n| Fence::new(n).ok());
            out.push((run, parent, fence));
        }
        Ok(out)
    }

    fn scope_of(&self, run: &RunId, parent: Option<&RunId>, like: &RunScope) -> RunScope {
        let mut s = like.clone();
        s.run_id = run.clone();
        s.parent_run_id = parent.cloned();
        s
    }

    /// Runs of the key other than `me` held live at `now`: each held-set
    /// entry's real top holding is read; entries no longer live are logged
    /// ended (at `now`, clamped to their expiry on replay) and removed.
    pub(crate) fn held_by_others(&self, me: &RunScope, now: Timestamp, ctx: &Ctx) -> Result<u32> {
        let mut n = 0;
        for (run, parent, fence) in self.entries(ctx)? {
            let scope = self.scope_of(&run, parent.as_ref(), me);
            let live = live_fence(self.inner, &scope, now, ctx)?;
            let mine = run == me.run_id && parent == me.parent_run_id;
            if live.is_some() {
                if !mine {
                    n += 1;
                }
                continue;
            }
            if !mine {
                self.close(&scope, fence, now)?;
            }
        }
        Ok(n)
    }

    /// Records that `scope` is about to be linked at `fence` (before the
    /// link: a crash after it leaves the entry, and the count reads the
    /// run's real holding).
    pub(crate) fn note_taking(&self, scope: &RunScope, fence: Fence) -> Result<()> {
        let name = held_name(&scope.run_id, scope.parent_run_id.as_ref());
        sys::write_atomic(
            &self.held_dir(),
            &name,
            fence.get().to_string().as_bytes(),
            self.inner.durability,
        )
        .map_err(|e| Ctx::new(scope, "claim").io("record the key holding", &self.held_dir(), e))
    }

    /// Forgets a deleted run: its held-set entry and its lines of the
    /// key's history (rewritten atomically without them), so a run later
    /// enqueued under the same id starts with no history.
    pub(crate) fn forget(&self, scope: &RunScope, ctx: &Ctx) -> Result<()> {
        let entry = self
            .held_dir()
            .join(held_name(&scope.run_id, scope.parent_run_id.as_ref()));
        match fs::remove_file(&entry) {
            Err(e) if !sys::is_not_found(&e) => {
                return Err(ctx.io("remove the key holding", &entry, e));
            }
            _ => {}
        }
        let path = self.dir.join(LOG_FILE);
        let Some(bytes) =
            sys::read_opt(&path).map_err(|e| ctx.io("read the key history", &path, e))?
        else {
            return Ok(());
        };
        let names = |run: &RunId, parent: &Option<RunId>| {
            run == &scope.run_id && parent == &scope.parent_run_id
        };
        let mut kept = Vec::with_capacity(bytes.len());
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let drop = match serde_json::from_slice::<LogLine>(line) {
                Ok(LogLine::Acquired(h)) => names(&h.run_id, &h.parent_run_id),
                Ok(LogLine::Ended(e)) => names(&e.run_id, &e.parent_run_id),
                Err(_) => false,
            };
            if !drop {
                kept.extend_from_slice(line);
                kept.push(b'\n');
            }
        }
        if kept.len() == bytes.len() {
            return Ok(());
        }
        sys::write_atomic(&self.dir, LOG_FILE, &kept, self.inner.durability)
            .map_err(|e| ctx.io("rewrite the key history", &path, e))
    }

    /// Logs a holding acquired (after its link).
    pub(crate) fn log_acquired(
        &self,
        scope: &RunScope,
        fence: Fence,
        acquired_at: Timestamp,
        expires_at: Timestamp,
    ) -> Result<()> {
        self.append(
            &LogLine::Acquired(KeyHolding {
                run_id: scope.run_id.clone(),
                parent_run_id: scope.parent_run_id.clone(),
                fence,
                acquired_at,
                expires_at,
                ended_at: None,
            }),
            scope,
        )
    }

    /// After an operation that may have ended `scope`'s holding: when the
    /// held set's entry names a fence that is no longer the run's live
    /// lease, the end is logged at `now` and the entry removed.
    pub(crate) fn note_end(&self, scope: &RunScope, now: Timestamp, ctx: &Ctx) -> Result<()> {
        let path = self
            .held_dir()
            .join(held_name(&scope.run_id, scope.parent_run_id.as_ref()));
        let Some(bytes) =
            sys::read_opt(&path).map_err(|e| ctx.io("read the key holding", &path, e))?
        else {
            return Ok(());
        };
        let fence = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .and_then(|n| Fence::new(n).ok());
        let live = live_fence(self.inner, scope, now, ctx)?;
        if live.is_some() && live == fence {
            return Ok(());
        }
        if live.is_some() {
            // A later holding (linked by a claimer outside this store's
            // key lock, e.g. the reference): keep counting it.
            return Ok(());
        }
        self.close(scope, fence, now)
    }

    /// Logs the end of `scope`'s holding at `fence` and drops its entry.
    fn close(&self, scope: &RunScope, fence: Option<Fence>, now: Timestamp) -> Result<()> {
        if let Some(fence) = fence {
            self.append(
                &LogLine::Ended(Ended {
                    run_id: scope.run_id.clone(),
                    parent_run_id: scope.parent_run_id.clone(),
                    fence,
                    at: now,
                }),
                scope,
            )?;
        }
        let path = self
            .held_dir()
            .join(held_name(&scope.run_id, scope.parent_run_id.as_ref()));
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if sys::is_not_found(&e) => Ok(()),
            Err(e) => Err(Ctx::new(scope, "claim").io("drop the key holding", &path, e)),
        }
    }

    fn append(&self, line: &LogLine, scope: &RunScope) -> Result<()> {
        let path = self.dir.join(LOG_FILE);
        let ctx = Ctx::new(scope, "concurrency key history");
        let mut bytes = serde_json::to_vec(line).map_err(|e| Error::Backend {
            message: format!("encode a key history line: {e}"),
            source: None,
        })?;
        bytes.push(b'\n');
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(sys::FILE_MODE)
            .open(&path)
            .map_err(|e| ctx.io("open the key history", &path, e))?;
        // Whether this append created the file (its directory entry then
        // needs a sync too): asked only when syncs are made.
        let power_loss = self.inner.durability == Durability::PowerLoss;
        let created = power_loss && f.metadata().is_ok_and(|m| m.len() == 0);
        f.write_all(&bytes)
            .map_err(|e| ctx.io("append to the key history", &path, e))?;
        if power_loss {
            sys::sync_file(&f, &path).map_err(|e| ctx.io("sync the key history", &path, e))?;
            if created {
                sys::sync_dir(&self.dir)
                    .map_err(|e| ctx.io("sync the concurrency key's directory", &self.dir, e))?;
            }
        }
        Ok(())
    }
}

/// The run's live lease fence at `now`, as the contract reads its top.
/// The holding in `claims/` first: a top that is no live lease there (a
/// release's tombstone, an expired lease) is none whatever the lifecycle
/// record says (the record only ever reads a lease as a finish,
/// [`run_state::effective`]), so the record is read only for a live lease.
fn live_fence(inner: &Inner, scope: &RunScope, now: Timestamp, ctx: &Ctx) -> Result<Option<Fence>> {
    let dir = inner.run_dir(scope);
    let holding = match claims::read_holding(&dir, ctx) {
        Ok(h) => h,
        Err(_) if !dir.is_dir() => None,
        Err(e) => return Err(e),
    };
    let live = |top: Option<&TopHolding>| match top {
        Some(TopHolding::Lease {
            fence, expires_at, ..
        }) if !runkeep::lease::is_expired(*expires_at, now) => Some(*fence),
        _ => None,
    };
    let Some(h) = holding.filter(|h| live(Some(&h.top)).is_some()) else {
        return Ok(None);
    };
    let record = match run_state::read_record(&dir, ctx) {
        Ok(r) => r,
        Err(_) if !dir.is_dir() => return Ok(None),
        Err(e) => return Err(e),
    };
    let state = run_state::state_with(
        record.as_ref(),
        Some(&h),
        &dir.join(claims::CLAIMS_DIR),
        ctx,
    );
    Ok(live(state.top.as_ref()))
}

/// Runs of `key` held live at `now` by the held set, read without the key
/// lock and changing nothing: what `claim_next` skips a key at its limit
/// by when the session index cannot count it (the walk, a keyed run met
/// outside its stream); the claim itself counts again under the lock.
pub(crate) fn held_now(inner: &Inner, like: &RunScope, key: &str, now: Timestamp) -> u32 {
    let ctx = Ctx::store("claim_next");
    let dir = key_dir(inner.base(), key).join(HELD_DIR);
    let Ok(Some(items)) = sys::list_dir(&dir) else {
        return 0;
    };
    let mut n = 0;
    for i in items {
        if sys::is_transient_name(&i.name) {
            continue;
        }
        let Some((run, parent)) = parse_held_name(&i.name) else {
            continue;
        };
        let mut s = like.clone();
        s.run_id = run;
        s.parent_run_id = parent;
        if matches!(live_fence(inner, &s, now, &ctx), Ok(Some(_))) {
            n += 1;
        }
    }
    n
}

/// The run's concurrency key, from its lifecycle record (`None`: no key,
/// or no record).
pub(crate) fn key_of(run_dir: &Path, ctx: &Ctx) -> Option<String> {
    run_state::read_record(run_dir, ctx)
        .ok()
        .flatten()
        .and_then(|r| r.lifecycle.concurrency.map(|c| c.key))
}

/// After an operation that may have ended the run's holding (release,
/// snooze, finish, failed attempt, cancel, a finishing step): logs the end
/// under the key lock. Best effort: the operation already happened, and a
/// missed end only leaves the holding counted until its expiry.
pub(crate) fn after_end(inner: &Inner, scope: &RunScope, operation: &'static str) {
    let ctx = Ctx::new(scope, operation);
    let Some(key) = key_of(&inner.run_dir(scope), &ctx) else {
        return;
    };
    let now = inner.now();
    let r = KeyGuard::lock(inner, &key, &ctx).and_then(|g| g.note_end(scope, now, &ctx));
    if let Err(e) = r {
        tracing::warn!(run = %scope.run_id, key, "{operation}: the end of the run's key holding could not be logged: {e}");
    }
}

/// Every holding of `key` in the store's session, oldest first (the log
/// replayed; a torn last line is skipped).
pub(crate) fn key_holdings(inner: &Inner, key: &str) -> Result<Vec<KeyHolding>> {
    let dir = key_dir(inner.base(), key);
    let path = dir.join(LOG_FILE);
    let ctx = Ctx::store("key_holdings");
    let Some(bytes) = sys::read_opt(&path).map_err(|e| ctx.io("read the key history", &path, e))?
    else {
        return Ok(Vec::new());
    };
    let mut log = KeyLog::default();
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<LogLine>(line) {
            Ok(LogLine::Acquired(h)) => log.acquired(
                &h.run_id,
                h.parent_run_id.as_ref(),
                h.fence,
                h.acquired_at,
                h.expires_at,
            ),
            Ok(LogLine::Ended(e)) => {
                // Only the end of the holding it names (a later one of the
                // run was logged after it, and superseded it).
                let open = log.entries().iter().rev().find(|h| {
                    h.run_id == e.run_id
                        && h.parent_run_id == e.parent_run_id
                        && h.ended_at.is_none()
                });
                if open.is_some_and(|h| h.fence == e.fence) {
                    log.ended(&e.run_id, e.parent_run_id.as_ref(), e.at);
                }
            }
            Err(_) => continue,
        }
    }
    // Holdings of runs that no longer exist are gone with them.
    let mut gone: Vec<(RunId, Option<RunId>)> = log
        .entries()
        .iter()
        .map(|h| (h.run_id.clone(), h.parent_run_id.clone()))
        .collect();
    gone.sort();
    gone.dedup();
    for (run, parent) in gone {
        let run_dir = match &parent {
            Some(p) => inner
                .base()
                .join(p.as_str())
                .join("children")
                .join(run.as_str()),
            None => inner.base().join(run.as_str()),
        };
        if !run_dir.is_dir() {
            log.forget(&run, parent.as_ref());
        }
    }
    Ok(log.entries().to_vec())
}
