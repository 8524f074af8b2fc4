//! Where a run's lifecycle (contract v2) lives on a directory, and how it
//! is read back: the lifecycle record `.runkeep/lifecycle.json` plus the
//! fields the holding bodies carry (`docs/design/directory/lifecycle.md`).
//!
//! - Every holding body this store publishes carries the run's attempt
//!   count (`attempts`), so the count changes atomically with the claim's
//!   hard link, the arbitration itself.
//! - A snooze's tombstone carries `availableAt`: deferral is one link.
//! - A dead-lettering claim publishes a tombstone carrying
//!   `deadLetteredAt`: the dead-letter is decided by the same link that
//!   arbitrates claims, and the record written after it only materializes it.
//! - A finish (and enqueue, reopen) writes the record: status, finish,
//!   limit, deferral, attempts, and `asOfFence`, the top fence the record
//!   accounts for. Holdings above `asOfFence` override the record's
//!   attempts and deferral; holdings at or below it are older than the
//!   record.
//!
//! The reference ignores `.runkeep/` and the extra body keys (to it
//! a body is valid with a string `holder` and a finite numeric
//! `expiresAt`), so it still reads and claims these runs; it does not
//! honour their lifecycle.

use std::path::{Path, PathBuf};

use runkeep::lifecycle::{self, Lifecycle};
use runkeep::{Fence, Result, TopHolding};
use serde::{Deserialize, Serialize};

use crate::claims::{self, Holding, CLAIMS_DIR};
use crate::lock::META_DIR;
use crate::options::Durability;
use crate::sys::{self, Ctx};

/// The lifecycle record inside the run's meta directory.
pub(crate) const LIFECYCLE_FILE: &str = "lifecycle.json";
/// Its format tag.
pub(crate) const LIFECYCLE_FORMAT: &str = "runkeep.lifecycle.v1";

/// The lifecycle record as stored.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    format: String,
    /// The top fence this record accounts for (0: none).
    #[serde(default)]
    pub(crate) as_of_fence: u64,
    #[serde(flatten)]
    pub(crate) lifecycle: Lifecycle,
}

impl Record {
    pub(crate) fn new(lifecycle: Lifecycle, as_of_fence: u64) -> Self {
        Self {
            format: LIFECYCLE_FORMAT.into(),
            as_of_fence,
            lifecycle,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

fn record_path(run_dir: &Path) -> PathBuf {
    run_dir.join(META_DIR).join(LIFECYCLE_FILE)
}

/// Reads the lifecycle record; `None` when the run has none. A record that
/// does not parse is refused (`Corrupted`): whether the run is finished
/// cannot be guessed.
pub(crate) fn read_record(run_dir: &Path, ctx: &Ctx) -> Result<Option<Record>> {
    let path = record_path(run_dir);
    let Some(bytes) =
        sys::read_opt(&path).map_err(|e| ctx.io("read the lifecycle record", &path, e))?
    else {
        return Ok(None);
    };
    match serde_json::from_slice::<Record>(&bytes) {
        Ok(r) if r.format == LIFECYCLE_FORMAT => Ok(Some(r)),
        Ok(r) => Err(ctx.corrupted(
            &path,
            format!(
                "the lifecycle record has format {:?}; this build reads {LIFECYCLE_FORMAT}",
                r.format
            ),
        )),
        Err(e) => Err(ctx.corrupted(
            &path,
            format!("the lifecycle record is damaged ({e}); whether the run is finished cannot be known. Restore it, or remove it to make the run active (its finish and attempt limit are then lost)"),
        )),
    }
}

/// A record, written whole to a sidecar (and synced under `PowerLoss`)
/// and waiting to be published by rename.
pub(crate) fn prepare(
    run_dir: &Path,
    record: &Record,
    durability: Durability,
    ctx: &Ctx,
) -> Result<sys::TempFile> {
    let meta = run_dir.join(META_DIR);
    sys::ensure_dir(&meta, durability)
        .map_err(|e| ctx.io("create the run's meta directory", &meta, e))?;
    sys::TempFile::write(&meta, LIFECYCLE_FILE, &record.encode(), durability)
        .map_err(|e| ctx.io("write the lifecycle record", &record_path(run_dir), e))
}

/// Publishes a prepared record (the caller holds the run lock).
pub(crate) fn publish(run_dir: &Path, temp: sys::TempFile, ctx: &Ctx) -> Result<()> {
    temp.publish(LIFECYCLE_FILE)
        .map_err(|e| ctx.io("publish the lifecycle record", &record_path(run_dir), e))
}

/// Writes and publishes a record (the caller holds the run lock).
pub(crate) fn write(
    run_dir: &Path,
    record: &Record,
    durability: Durability,
    ctx: &Ctx,
) -> Result<()> {
    let temp = prepare(run_dir, record, durability, ctx)?;
    publish(run_dir, temp, ctx)
}

/// A run's lease and lifecycle as the contract sees them.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunState {
    /// The top holding, with a finish whose tombstone was never published
    /// read as that tombstone (so the spent fence is refused).
    pub(crate) top: Option<TopHolding>,
    /// The lifecycle.
    pub(crate) lifecycle: Lifecycle,
}

/// The rule (module docs): the record, overridden by the top holding's
/// fields when the holding is newer than the record. `below` answers the
/// attempt count the nearest holding below a fence carries (for a holding
/// written by the reference, which carries none).
pub(crate) fn effective(
    record: Option<&Record>,
    top: Option<&Holding>,
    below: impl FnOnce(Fence, u64) -> Option<u32>,
) -> RunState {
    let mut l = record.map(|r| r.lifecycle.clone()).unwrap_or_default();
    let as_of = record.map_or(0, |r| r.as_of_fence);
    if let Some(h) = top {
        let fence = h.top.fence();
        if fence.get() > as_of {
            l.attempts = h
                .attempts
                .or_else(|| below(fence, as_of))
                .unwrap_or(l.attempts);
            l.available_at = match h.top {
                TopHolding::Released { .. } => h.available_at,
                _ => None,
            };
            if let (TopHolding::Released { fence }, Some(at)) = (&h.top, h.dead_lettered_at) {
                if !l.status.is_finished() {
                    l = lifecycle::exhausted(&l, *fence, l.attempts, at);
                }
            }
        }
    }
    let mut eff = top.map(|h| h.top.clone());
    if let (true, Some(f)) = (l.status.is_finished(), l.finished_fence) {
        let unspent = match &eff {
            None => true,
            Some(TopHolding::Released { .. }) => false,
            Some(t) => t.fence() <= f,
        };
        if unspent {
            // The finish committed (its record) but its tombstone was never
            // published: read as published.
            if let Ok(next) = Fence::new(f.get() + 1) {
                eff = Some(TopHolding::Released { fence: next });
            }
        }
    }
    RunState {
        top: eff,
        lifecycle: l,
    }
}

/// How many holdings below a reference-written top are read to continue
/// the attempt count (every fence check and listing row pays for it while
/// the reference holds the top, so it is kept small).
pub(crate) const ATTEMPTS_LOOKBACK: u64 = 4;

/// The attempt count of the nearest holding below `fence` that carries
/// one and is newer than the record, among the [`ATTEMPTS_LOOKBACK`]
/// holdings below it.
pub(crate) fn last_known_attempts(
    claims_dir: &Path,
    fence: Fence,
    as_of: u64,
    ctx: &Ctx,
) -> Option<u32> {
    let top = fence.get();
    let floor = top.saturating_sub(ATTEMPTS_LOOKBACK + 1).max(as_of);
    let mut f = top;
    while f > floor + 1 {
        f -= 1;
        let fence = Fence::new(f).ok()?;
        if let Ok(Some(h)) = claims::holding_at(claims_dir, fence, ctx) {
            if h.attempts.is_some() {
                return h.attempts;
            }
        }
    }
    None
}

/// Reads the run's state: the top holding first, then the record (a
/// finish publishes its record before its tombstone, so this order never
/// pairs a new tombstone with an old record).
pub(crate) fn read_state(run_dir: &Path, ctx: &Ctx) -> Result<RunState> {
    let claims_dir = run_dir.join(CLAIMS_DIR);
    let top = claims::read_holding(run_dir, ctx)?;
    let record = read_record(run_dir, ctx)?;
    Ok(effective(record.as_ref(), top.as_ref(), |f, as_of| {
        last_known_attempts(&claims_dir, f, as_of, ctx)
    }))
}

/// The run's state given a record already read (the claim path reads the
/// record once under its lock).
pub(crate) fn state_with(
    record: Option<&Record>,
    top: Option<&Holding>,
    claims_dir: &Path,
    ctx: &Ctx,
) -> RunState {
    effective(record, top, |f, as_of| {
        last_known_attempts(claims_dir, f, as_of, ctx)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use runkeep::Timestamp;

    fn f(n: u64) -> Fence {
        Fence::new(n).unwrap()
    }

    fn holding(top: TopHolding, attempts: Option<u32>) -> Holding {
        Holding {
            top,
            attempts,
            available_at: None,
            dead_lettered_at: None,
        }
    }

    #[test]
    fn holdings_newer_than_the_record_carry_attempts_and_deferral() {
        let rec = Record::new(
            Lifecycle {
                attempts: 1,
                max_attempts: Some(4),
                ..Lifecycle::default()
            },
            3,
        );
        // At or below asOfFence: the record speaks.
        let s = effective(
            Some(&rec),
            Some(&holding(TopHolding::Released { fence: f(3) }, Some(9))),
            |_, _| None,
        );
        assert_eq!(s.lifecycle.attempts, 1);
        // Above: the body's count.
        let mut h = holding(TopHolding::Released { fence: f(5) }, Some(2));
        h.available_at = Some(Timestamp::from_millis(70).unwrap());
        let s = effective(Some(&rec), Some(&h), |_, _| None);
        assert_eq!(s.lifecycle.attempts, 2);
        assert_eq!(s.lifecycle.available_at, h.available_at);
        assert_eq!(s.lifecycle.max_attempts, Some(4));
        // A reference body (no count): the nearest one below that has one.
        let s = effective(
            Some(&rec),
            Some(&holding(TopHolding::Unreadable { fence: f(6) }, None)),
            |_, _| Some(7),
        );
        assert_eq!(s.lifecycle.attempts, 7);
    }

    #[test]
    fn a_finish_without_its_tombstone_reads_as_released() {
        let done = Lifecycle {
            status: runkeep::RunStatus::Completed,
            finished_fence: Some(f(4)),
            ..Lifecycle::default()
        };
        let rec = Record::new(done, 5);
        let lease = holding(
            TopHolding::Lease {
                fence: f(4),
                holder: runkeep::Holder::new("w").unwrap(),
                expires_at: Timestamp::from_millis(10_000).unwrap(),
            },
            Some(0),
        );
        let s = effective(Some(&rec), Some(&lease), |_, _| None);
        assert_eq!(s.top, Some(TopHolding::Released { fence: f(5) }));
    }
}
