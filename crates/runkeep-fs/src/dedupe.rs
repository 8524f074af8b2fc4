//! The dedupe window on a directory (`runkeep::scheduling::dedupe`), and
//! the operator's priority change.
//!
//! One record per idempotency key in `<base>/.runkeep/dedupe/`:
//! `<h>.json` (`h`: the key's FNV-1a 64 in hex, `-<n>` appended when
//! another key already has that name), holding `{"key", "record":
//! DedupeRecord}`, and its lock file `<h>.lock`, a `flock` held exclusive
//! from the read of the record to the creation of the run. The record is
//! written **before** the run: a crash between the two leaves a record
//! naming a run that does not exist, which [`dedupe::decide`] ignores (the
//! next call creates the run); a refused enqueue puts the previous record
//! back.

use std::path::{Path, PathBuf};

use runkeep::lifecycle::{self, EnqueueOptions};
use runkeep::scheduling::dedupe::{self, Dedupe, DedupeRecord, Enqueued};
use runkeep::scheduling::Priority;
use runkeep::{Checkpoint, Error, Lifecycle, Result, RunScope};
use serde::{Deserialize, Serialize};

use crate::inner::Inner;
use crate::lock::{Mode, RunLock, META_DIR};
use crate::run_state::{self, Record};
use crate::sys::{self, Ctx};
use crate::{claims, fenced_write, keys, queue};

/// The dedupe directory inside the store's own `.runkeep/`.
pub(crate) const DEDUPE_DIR: &str = "dedupe";
/// How many names one hash may take before the store refuses.
const PROBES: u32 = 8;

#[derive(Serialize, Deserialize)]
struct Stored {
    key: String,
    record: DedupeRecord,
}

/// The name (without extension) of `key`'s record, probing past other
/// keys with the same hash, and the record found there.
fn slot(dir: &Path, key: &str, ctx: &Ctx) -> Result<(String, Option<DedupeRecord>)> {
    let h = keys::fnv64(key.as_bytes());
    for n in 0..PROBES {
        let name = if n == 0 {
            format!("{h:016x}")
        } else {
            format!("{h:016x}-{n}")
        };
        let path = dir.join(format!("{name}.json"));
        match sys::read_opt(&path).map_err(|e| ctx.io("read the dedupe record", &path, e))? {
            None => return Ok((name, None)),
            Some(bytes) => match serde_json::from_slice::<Stored>(&bytes) {
                Ok(s) if s.key == key => return Ok((name, Some(s.record))),
                Ok(_) => continue,
                // Unreadable: this key's slot, treated as empty.
                Err(_) => return Ok((name, None)),
            },
        }
    }
    Err(Error::Backend {
        message: format!(
            "enqueue_once: {PROBES} idempotency keys share the hash of {key:?} in {}; refusing rather than overwriting another key's window",
            dir.display()
        ),
        source: None,
    })
}

fn write(dir: &Path, name: &str, stored: &Stored, inner: &Inner, ctx: &Ctx) -> Result<()> {
    let bytes = serde_json::to_vec(stored).unwrap_or_default();
    sys::write_atomic(dir, &format!("{name}.json"), &bytes, inner.durability)
        .map_err(|e| ctx.io("write the dedupe record", dir, e))
}

fn dedupe_dir(inner: &Inner) -> PathBuf {
    inner.base().join(META_DIR).join(DEDUPE_DIR)
}

/// `enqueue`, unless `d`'s window is open: then the run it belongs to.
pub(crate) fn enqueue_once(
    inner: &Inner,
    scope: &RunScope,
    checkpoint: &Checkpoint,
    options: &EnqueueOptions,
    d: &Dedupe,
) -> Result<Enqueued> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    d.validate()?;
    checkpoint.validate_for_write(scope)?;
    options.validate(&scope.run_id)?;
    let ctx = Ctx::new(scope, "enqueue_once");
    let dir = dedupe_dir(inner);
    sys::ensure_dir(&dir, inner.durability)
        .map_err(|e| ctx.io("create the dedupe directory", &dir, e))?;
    let (name, _) = slot(&dir, &d.key, &ctx)?;
    let _lock = RunLock::acquire_at(&dir.join(format!("{name}.lock")), Mode::Exclusive, &ctx)?;
    // Read again under the lock (the first read only named the slot).
    let (_, existing) = slot(&dir, &d.key, &ctx)?;
    let now = inner.now();
    let exists = match &existing {
        Some(r) => {
            let run_dir = inner.run_dir(&r.scope_in(scope));
            run_dir.is_dir() && queue::run_exists(&run_dir, &ctx)?
        }
        None => false,
    };
    if let Some(r) = dedupe::decide(existing.as_ref().map(|r| (r, exists)), now) {
        let run = r.scope_in(scope);
        let checkpoint = queue::latest_checkpoint(inner, &run)?;
        return Ok(Enqueued {
            run,
            created: false,
            checkpoint,
        });
    }
    let stored = Stored {
        key: d.key.clone(),
        record: DedupeRecord::new(scope, d, now),
    };
    write(&dir, &name, &stored, inner, &ctx)?;
    match queue::enqueue(inner, scope, checkpoint, options) {
        Ok(cp) => Ok(Enqueued {
            run: scope.clone(),
            created: true,
            checkpoint: Some(cp),
        }),
        Err(e) => {
            // Refused: the window stays as it was.
            let back = match existing {
                Some(record) => write(
                    &dir,
                    &name,
                    &Stored {
                        key: d.key.clone(),
                        record,
                    },
                    inner,
                    &ctx,
                ),
                None => std::fs::remove_file(dir.join(format!("{name}.json")))
                    .or_else(|e| {
                        if sys::is_not_found(&e) {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    })
                    .map_err(|e| ctx.io("remove the dedupe record", &dir, e)),
            };
            if let Err(b) = back {
                tracing::warn!(run = %scope.run_id, "enqueue_once was refused, and the idempotency key's previous record could not be put back: {b}");
            }
            Err(e)
        }
    }
}

/// An operator sets an active run's priority: under the run lock held
/// exclusive (no claim lands in between), the record rewritten with it.
pub(crate) fn set_priority(
    inner: &Inner,
    scope: &RunScope,
    priority: Priority,
) -> Result<Lifecycle> {
    inner.refuse_read_only()?;
    inner.check_scope(scope)?;
    priority.validate()?;
    let ctx = Ctx::new(scope, "set_priority");
    let run_dir = inner.run_dir(scope);
    let not_found = || Error::NotFound {
        what: format!("run {}", scope.run_id),
    };
    if !run_dir.is_dir() || !queue::run_exists(&run_dir, &ctx)? {
        return Err(not_found());
    }
    fenced_write::judged_write(inner, scope, "set_priority", |ctx, run_dir, _| {
        if !queue::run_exists(run_dir, ctx)? {
            return Err(not_found());
        }
        let real = claims::read_holding(run_dir, ctx)?;
        let state = run_state::read_state(run_dir, ctx)?;
        let l = lifecycle::after_set_priority(&scope.run_id, &state.lifecycle, priority)?;
        let as_of = real.as_ref().map_or(0, |h| h.top.fence().get());
        run_state::write(
            run_dir,
            &Record::new(l.clone(), as_of),
            inner.durability,
            ctx,
        )?;
        Ok(l)
    })
}
