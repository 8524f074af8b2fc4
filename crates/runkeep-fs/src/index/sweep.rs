//! Run directories past the watch budget: stamps, and the sweeper that
//! compares them.

use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redb::ReadableDatabase;

use super::common::{dir_of, store_failed, watched_dirs, Refusal};
use super::store::{parse_dir_key, refused, Built, Entry, State, ENTRIES, SWEPT};

/// What an unwatched run directory looked like when it was read: a hash of
/// the identity, mode, mtime and ctime of each directory a watch would
/// cover (or of the error that stat gave). Every writer of a row's files —
/// the reference's atomic writes (sidecar + rename) and claim links, this
/// store's publishes, a sub-run appearing — adds or removes a name in one
/// of them, which moves that directory's mtime and ctime.
///
/// `racy`: a directory's ctime was within [`RACY_NS`] of the instant the
/// stamp was taken, so a later change in the same timestamp tick could
/// leave the stamp equal; such an entry is read again at the next sweep
/// whatever its stamp says, until its stamp is old enough to trust.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Stamp {
    pub(super) hash: u64,
    pub(super) racy: bool,
}

/// How young a directory's ctime makes a stamp untrustworthy.
pub(super) const RACY_NS: i128 = 2_000_000_000;

/// The stamp of the run directory `dir` now (taken before it is read).
pub(super) fn stamp_of(dir: &Path, top_level: bool, racy_ns: i128) -> Stamp {
    use std::hash::{Hash, Hasher};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut racy = false;
    for (path, _) in watched_dirs(dir, top_level) {
        match rustix::fs::lstat(&path) {
            Ok(st) => {
                (
                    st.st_dev,
                    st.st_ino,
                    st.st_mode,
                    st.st_mtime,
                    st.st_mtime_nsec,
                    st.st_ctime,
                    st.st_ctime_nsec,
                )
                    .hash(&mut h);
                let ctime = i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec);
                if ctime + racy_ns > now {
                    racy = true;
                }
            }
            Err(e) => e.raw_os_error().hash(&mut h),
        }
    }
    Stamp {
        hash: h.finish(),
        racy,
    }
}

impl Built {
    /// Swept entries after `after` (at most `n`), with their stamps.
    pub(super) fn swept_batch(
        &self,
        after: Option<&str>,
        n: usize,
    ) -> Result<Vec<(String, Stamp)>, Refusal> {
        let tx = self.db.begin_read().map_err(store_failed)?;
        let swept = tx.open_table(SWEPT).map_err(store_failed)?;
        let entries = tx.open_table(ENTRIES).map_err(store_failed)?;
        let range = match after {
            Some(a) => swept.range::<&str>((Bound::Excluded(a), Bound::Unbounded)),
            None => swept.range::<&str>(..),
        }
        .map_err(store_failed)?;
        let mut out = Vec::new();
        for item in range.take(n) {
            let (k, _) = item.map_err(store_failed)?;
            let key = k.value().to_owned();
            let got = entries.get(key.as_str()).map_err(store_failed)?;
            if let Some(stamp) = got
                .and_then(|v| Entry::decode(v.value()))
                .and_then(|e| e.stamp)
            {
                out.push((key, stamp));
            }
        }
        Ok(out)
    }

    /// Re-reads the swept entries `keys` (their directories changed, or
    /// their stamps were too young to trust).
    pub(super) fn resweep(&mut self, keys: &[String]) -> Result<(), Refusal> {
        self.write(|w| {
            for key in keys {
                let Some(k) = parse_dir_key(key) else {
                    continue;
                };
                w.reload(&k)?;
                if k.0.is_none() {
                    w.rescan_children(&k)?;
                }
            }
            Ok(())
        })
    }

    /// Starts the sweeper thread if entries are swept and none runs.
    pub(super) fn ensure_sweeper(&mut self, state: &Arc<Mutex<State>>, paused: &Arc<AtomicBool>) {
        if self.tally.swept == 0 || self.tally.sweeper {
            return;
        }
        self.tally.sweeper = true;
        let (weak, paused) = (Arc::downgrade(state), paused.clone());
        let spawned = std::thread::Builder::new()
            .name("runkeep-fs-sweep".into())
            .spawn(move || sweeper(&weak, &paused));
        if let Err(e) = spawned {
            tracing::warn!(
                "cannot start the index's sweeper thread ({e}); retried at the next listing"
            );
            self.tally.sweeper = false;
        }
    }
}

/// The least pause between two sweeps.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Swept entries read per lock hold.
pub(super) const SWEEP_BATCH: usize = 1024;

/// The sweeper: while the store lives and entries are swept, a pass over
/// every swept entry's stamp, then a pause of at least [`SWEEP_EVERY`] and
/// four times the pass (so it takes at most a fifth of a core).
pub(super) fn sweeper(state: &Weak<Mutex<State>>, paused: &AtomicBool) {
    let mut pace = SWEEP_EVERY;
    loop {
        std::thread::sleep(pace);
        let Some(state) = state.upgrade() else { return };
        if paused.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        let started = Instant::now();
        if sweep_pass(&state, true).is_none() {
            return;
        }
        pace = SWEEP_EVERY.max(started.elapsed() * 4);
    }
}

/// One pass over every swept entry: stamps are compared without the lock,
/// the changed (or racy) entries re-read with it. `(checked, re-read)`, or
/// `None` when there is no index (or, with `stop_if_idle`, nothing swept:
/// the sweeper then ends, under the lock, so a later swept entry starts a
/// new one).
pub(super) fn sweep_pass(state: &Mutex<State>, stop_if_idle: bool) -> Option<(usize, usize)> {
    let (mut checked, mut reread) = (0, 0);
    let mut after: Option<String> = None;
    loop {
        let (batch, base, racy_ns) = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let State::Built(b) = &mut *st else {
                return None;
            };
            if stop_if_idle && after.is_none() && b.tally.swept == 0 {
                b.tally.sweeper = false;
                return None;
            }
            match b.swept_batch(after.as_deref(), SWEEP_BATCH) {
                Ok(batch) => (batch, b.base.clone(), b.tally.racy_ns),
                Err(Refusal(why)) => {
                    let base = b.base.clone();
                    *st = refused(&base, why);
                    return None;
                }
            }
        };
        let Some((last, _)) = batch.last() else { break };
        after = Some(last.clone());
        checked += batch.len();
        let changed: Vec<String> = batch
            .into_iter()
            .filter(|(key, stamp)| {
                stamp.racy
                    || parse_dir_key(key).is_none_or(|k| {
                        stamp_of(&dir_of(&base, &k), k.0.is_none(), racy_ns).hash != stamp.hash
                    })
            })
            .map(|(key, _)| key)
            .collect();
        if changed.is_empty() {
            continue;
        }
        reread += changed.len();
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        let State::Built(b) = &mut *st else {
            return None;
        };
        // Drain first: the queue stays short whether or not pages are
        // listed (a re-read may drop watches, which queues events).
        match b.sync() {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    "the directory store's index at {} missed events (inotify queue overflow); it is built again at the next listing",
                    base.display()
                );
                *st = State::Unbuilt;
                return None;
            }
            Err(Refusal(why)) => {
                *st = refused(&base, why);
                return None;
            }
        }
        if let Err(Refusal(why)) = b.resweep(&changed) {
            *st = refused(&base, why);
            return None;
        }
    }
    Some((checked, reread))
}
